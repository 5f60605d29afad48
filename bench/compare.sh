#!/usr/bin/env bash
# The main job's benchmarks for a base commit and for the working tree, side
# by side in one run, as ratios (these machines are noisy: read the ratios).
#
#   bench/compare.sh BASE          e.g. bench/compare.sh main, bench/compare.sh c05eebd
#
# It builds BASE (exported with `git archive` into target/compare/<commit>, in
# target dir target/compare/target seeded from this tree's release build, so
# only the workspace's own crates compile again; the binary is kept by commit),
# builds the working tree, then runs, alternating base and head in each round:
#   rpc      bench/rpc/run.sh: workflow.start (wait) into a SQLite file, beside
#            `wasmtime serve` in the same call (req/s and its ratio to wasmtime)
#   memory   the same with WF_STATE=:memory:
#   workers  `cargo bench --bench workers` (this tree's bench) with
#            WF_BENCH_HOST set to each build: three-step runs/s, SQLite and
#            PostgreSQL with 1-3 workers
# Each build runs its own tree's plugins/echo.wasm.
#
# Settings (environment):
#   BENCHES="rpc memory workers"   which of them to run
#   ROUNDS=2                       rounds; each round runs base then head (the
#                                  order swaps every other round)
#   DURATION=10s WARMUP=3s         wrk settings of the rpc rows
#   BASE_BIN=                      a base binary built already (skips the base build)
#   KEEP=                          a dir to keep every raw output in
#
# Needs what bench/rpc/run.sh and the workers bench need (wrk, wasmtime 48.x,
# PostgreSQL's server binaries).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

base="${1:?usage: bench/compare.sh BASE (a commit, branch or tag)}"
base_sha="$(git rev-parse --verify --short "$base^{commit}")" || {
    echo "bench/compare.sh: \`$base\` is not a commit here" >&2
    exit 2
}
BENCHES="${BENCHES:-rpc memory workers}"
ROUNDS="${ROUNDS:-2}"
export DURATION="${DURATION:-10s}" WARMUP="${WARMUP:-3s}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
out="${KEEP:-$work/out}"
mkdir -p "$out"

# --- builds --------------------------------------------------------------------
# The base builds in a target dir of its own (cargo gives a workspace's own
# crates the same unit hash whatever the workspace's path, so two trees
# sharing one target dir take each other's builds), seeded once with a copy
# of this tree's release dependencies; its binary is kept by commit.
compare="$root/target/compare"
tree="$compare/$base_sha"
if [ -n "${BASE_BIN:-}" ]; then
    cp "$BASE_BIN" "$work/wf-host-base"
    mkdir -p "$tree"
    [ -f "$tree/plugins/echo.wasm" ] || git archive "$base_sha" | tar -x -C "$tree"
elif [ -x "$tree/wf-host" ]; then
    cp "$tree/wf-host" "$work/wf-host-base"
else
    rm -rf "$tree"
    mkdir -p "$tree"
    git archive "$base_sha" | tar -x -C "$tree"
    if [ ! -d "$compare/target/release" ] && [ -d "$root/target/release" ]; then
        echo "seeding target/compare/target with this tree's release build..." >&2
        mkdir -p "$compare/target"
        cp -r "$root/target/release" "$compare/target/release"
    fi
    # Whichever tree built there last, the base's own crates build again.
    rm -rf "$compare/target/release/.fingerprint/wf-host-"* "$compare/target/release/.fingerprint/wf-sdk-"*
    echo "building $base ($base_sha), release..." >&2
    cargo build --release -p wf-host --manifest-path "$tree/Cargo.toml" \
        --target-dir "$compare/target" >&2
    cp "$compare/target/release/wf-host" "$tree/wf-host"
    cp "$tree/wf-host" "$work/wf-host-base"
fi
echo "building the working tree, release..." >&2
cargo build --release -p wf-host >&2
cp "$root/target/release/wf-host" "$work/wf-host-head"
head_desc="$(git describe --always --dirty)"

# Each build runs its own tree's echo node.
printf '[workflows.echo]\ncomponent = "%s"\n' "$tree/plugins/echo.wasm" >"$work/base.toml"
printf '[workflows.echo]\ncomponent = "%s"\n' "$root/plugins/echo.wasm" >"$work/head.toml"

# --- runs ----------------------------------------------------------------------
# results: lines "bench<TAB>row<TAB>side<TAB>value" (value: req/s or runs/s)
results="$work/results.tsv"
: >"$results"

rpc_once() { # rpc_once NAME SIDE ROUND [WF_STATE]
    local name="$1" side="$2" round="$3" state="${4:-}"
    local log="$out/$name-$side-$round.txt"
    WF_HOST="$work/wf-host-$side" WF_CONFIG="$work/$side.toml" WF_STATE="$state" ROUNDS=1 \
        bench/rpc/run.sh >"$log" 2>"$log.err" || {
        echo "bench/rpc/run.sh failed for $side:" >&2
        cat "$log" "$log.err" >&2
        exit 1
    }
    # | 1 | wf-host workflow.start (wait) | 3106.00 | 19.88 | 38.83 | 0.36x |
    awk -F'|' -v b="$name" -v s="$side" '
        $3 ~ /wf-host/ { gsub(/ /, "", $4); gsub(/ /, "", $7); sub(/x$/, "", $7);
                         print b "\treq/s\t" s "\t" $4; print b "\tvs wasmtime serve\t" s "\t" $7 }
        $3 ~ /wasmtime/ { gsub(/ /, "", $4); print b "\twasmtime serve req/s\t" s "\t" $4 }
    ' "$log" >>"$results"
}

workers_once() { # workers_once SIDE ROUND
    local side="$1" round="$2"
    local log="$out/workers-$side-$round.txt"
    local echo="$root/plugins/echo.wasm"
    [ "$side" = base ] && echo="$tree/plugins/echo.wasm"
    WF_BENCH_HOST="$work/wf-host-$side" WF_BENCH_ECHO="$echo" cargo bench -q -p wf-host --bench workers \
        >"$log" 2>"$log.err" || {
        echo "the workers bench failed for $side:" >&2
        cat "$log" "$log.err" >&2
        exit 1
    }
    # | SQLite, 1 worker | 1259 | 2.14× | ...
    awk -F'|' -v s="$side" '
        $2 ~ /worker/ { gsub(/^ +| +$/, "", $2); gsub(/ /, "", $3); print "workers\t" $2 " runs/s\t" s "\t" $3 }
    ' "$log" >>"$results"
}

for round in $(seq 1 "$ROUNDS"); do
    sides="base head"
    [ $((round % 2)) = 0 ] && sides="head base"
    for side in $sides; do
        for bench in $BENCHES; do
            echo "round $round/$ROUNDS: $bench, $side..." >&2
            case "$bench" in
                rpc) rpc_once rpc "$side" "$round" ;;
                memory) rpc_once memory "$side" "$round" :memory: ;;
                workers) workers_once "$side" "$round" ;;
                *) echo "unknown bench \`$bench\` (rpc, memory, workers)" >&2; exit 2 ;;
            esac
        done
    done
done

# --- table ----------------------------------------------------------------------
echo
echo "base: $base ($base_sha); head: the working tree ($head_desc); $ROUNDS rounds, $(nproc) cores"
echo "rpc/memory: wrk -c64 -d$DURATION, workflow.start (wait) on echo; workers: three-step runs"
echo
echo "| bench | row | base (mean) | head (mean) | head / base | per round (base → head) |"
echo "| --- | --- | ---: | ---: | ---: | --- |"
awk -F'\t' '
    { key = $1 "\t" $2; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
      sum[key, $3] += $4; cnt[key, $3]++; vals[key, $3] = vals[key, $3] (vals[key, $3] == "" ? "" : " ") $4 }
    END {
        for (i = 1; i <= n; i++) {
            k = order[i]; split(k, parts, "\t")
            b = cnt[k, "base"] ? sum[k, "base"] / cnt[k, "base"] : 0
            h = cnt[k, "head"] ? sum[k, "head"] / cnt[k, "head"] : 0
            printf "| %s | %s | %.2f | %.2f | %s | %s → %s |\n", parts[1], parts[2], b, h,
                (b > 0 ? sprintf("%.2f×", h / b) : "?"), vals[k, "base"], vals[k, "head"]
        }
    }
' "$results"
