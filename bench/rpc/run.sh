#!/usr/bin/env bash
# JSON-RPC benchmark (issue 5): wf-host's `workflow.start` with wait=true on the
# `echo` workflow, against `wasmtime serve` running a hello-world wasi:http
# component, back to back with the same wrk settings, on 127.0.0.1 only.
#
#   bench/rpc/run.sh                   build what is missing, run, print a table
#
# Settings (environment):
#   THREADS=2 CONNECTIONS=64 DURATION=20s WARMUP=5s   wrk settings, same for both servers
#   ROUNDS=1                 measured rounds; each round runs wf-host then wasmtime
#   WF_PORT=7878 WT_PORT=8081  loopback ports
#   WF_HOST=target/release/wf-host   wf-host binary (built with cargo if missing)
#   WF_CONFIG=bench/rpc/bench.toml   its config (bench/compare.sh points it at another
#                            tree's echo.wasm)
#   WF_STATE=                where wf-host keeps runs: by default a fresh SQLite file in
#                            a temp dir (durable, as `serve` is by default); WF_STATE=:memory:
#                            keeps them in the process, like wasmtime serve keeps nothing
#   WASMTIME=wasmtime        wasmtime binary (48.x)
#   WRK_OUT_DIR=             if set, keep each measured run's full wrk output there
#   RUST_LOG=                wf-host's log filter; by default it logs the echo node's one
#                            line per run to stderr (its log goes to a temp file here);
#                            RUST_LOG=warn measures without it
#
# Needs: wrk, wasmtime 48.x, curl, cargo with the wasm32-wasip2 target.
# Every wrk response is checked (200 and a "succeeded" run / a "hello" body);
# any bad response is reported and makes the script exit non-zero.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/bench/rpc"
cd "$root"

THREADS="${THREADS:-2}"
CONNECTIONS="${CONNECTIONS:-64}"
DURATION="${DURATION:-20s}"
WARMUP="${WARMUP:-5s}"
ROUNDS="${ROUNDS:-1}"
WF_PORT="${WF_PORT:-7878}"
WT_PORT="${WT_PORT:-8081}"
WF_HOST="${WF_HOST:-$root/target/release/wf-host}"
WASMTIME="${WASMTIME:-wasmtime}"
WF_CONFIG="${WF_CONFIG:-$here/bench.toml}"
HELLO="$here/hello-http/target/wasm32-wasip2/release/hello_http.wasm"
BODY='{"jsonrpc":"2.0","id":1,"method":"workflow.start","params":{"workflow":"echo","input":{"hello":"world"},"wait":true}}'

# --- prerequisites -----------------------------------------------------------
missing=0
if ! command -v wrk >/dev/null; then
    echo "wrk is missing: install it with  apt-get install -y wrk  (Debian/Ubuntu; run apt-get update first)" >&2
    missing=1
fi
if ! command -v "$WASMTIME" >/dev/null; then
    echo "wasmtime is missing: install the CLI (48.x, matching wf-host's wasmtime) with" >&2
    echo "    cargo install --locked wasmtime-cli@48.0.8" >&2
    echo "  (about 18 minutes on 2 cores; a build with fewer features does not" >&2
    echo "  compile: \`serve\` needs the default features), or point WASMTIME= at a" >&2
    echo "  wasmtime binary." >&2
    missing=1
fi
if ! command -v curl >/dev/null; then
    echo "curl is missing: apt-get install -y curl" >&2
    missing=1
fi
[ "$missing" = 0 ] || exit 2

wt_version="$("$WASMTIME" --version)"
case "$wt_version" in
    *" 48."*) ;;
    *) echo "warning: expected wasmtime 48.x (wf-host's wasmtime), got: $wt_version" >&2 ;;
esac

# --- builds (no-ops when up to date) ------------------------------------------
if [ ! -x "$WF_HOST" ]; then
    echo "building wf-host (release)..." >&2
    cargo build --release -p wf-host >&2
fi
if [ ! -f "$HELLO" ]; then
    echo "building the hello-http component..." >&2
    (cd "$here/hello-http" && cargo build --release --target wasm32-wasip2 >&2)
fi
if [ "$WF_CONFIG" = "$here/bench.toml" ] && [ ! -f "$root/plugins/echo.wasm" ]; then
    echo "plugins/echo.wasm is missing: ./plugins/build.sh rust" >&2
    exit 2
fi

# --- servers -------------------------------------------------------------------
work="$(mktemp -d)"
wf_pid=""
wt_pid=""
cleanup() {
    for pid in $wf_pid $wt_pid; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in $wf_pid $wt_pid; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in "$WF_PORT" "$WT_PORT"; do
    port_free "$port" || { echo "127.0.0.1:$port is already in use (set WF_PORT/WT_PORT)" >&2; exit 2; }
done

# Waits (at most 60 s) until "$@" succeeds; fails if process $1 died.
wait_ready() {
    local pid="$1" name="$2"; shift 2
    for _ in $(seq 1 600); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$name exited during startup; its log:" >&2
            cat "$work/$name.log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "$name did not become ready in 60 s; its log:" >&2
    cat "$work/$name.log" >&2
    exit 1
}

rpc_start() {
    curl -sS --max-time 10 -H 'Content-Type: application/json' -d "$BODY" "http://127.0.0.1:$WF_PORT/rpc"
}
rpc_ok() { rpc_start | grep -q '"succeeded"'; }
hello_ok() { [ "$(curl -sS --max-time 10 "http://127.0.0.1:$WT_PORT/")" = hello ]; }

"$WF_HOST" serve --config "$WF_CONFIG" --state "${WF_STATE:-$work/state.db}" \
    --listen "127.0.0.1:$WF_PORT" >"$work/wf-host.log" 2>&1 &
wf_pid=$!
"$WASMTIME" serve -Scli --addr "127.0.0.1:$WT_PORT" "$HELLO" >"$work/wasmtime.log" 2>&1 &
wt_pid=$!
wait_ready "$wf_pid" wf-host rpc_ok
wait_ready "$wt_pid" wasmtime hello_ok

echo "wf-host answers: $(rpc_start)" >&2
echo "wasmtime answers: $(curl -sS "http://127.0.0.1:$WT_PORT/")" >&2

# --- load -------------------------------------------------------------------------
# wrk_run NAME SCRIPT URL DURATION [--latency]: output to $work/NAME.txt; fails on bad responses.
wrk_run() {
    local name="$1" script="$2" url="$3" duration="$4"; shift 4
    wrk -t"$THREADS" -c"$CONNECTIONS" -d"$duration" --timeout 10s "$@" -s "$script" "$url" \
        >"$work/$name.txt" 2>"$work/$name.err"
    local bad
    bad="$(sed -n 's/^bad responses: //p' "$work/$name.txt")"
    if [ "${bad:-x}" != 0 ]; then
        echo "$name: ${bad:-?} bad responses" >&2
        cat "$work/$name.txt" "$work/$name.err" >&2
        return 1
    fi
}

# to_ms VALUE: wrk's "1.23ms" / "456.78us" / "1.02s" in milliseconds.
to_ms() {
    awk -v v="$1" 'BEGIN {
        if (v ~ /us$/) { sub(/us$/, "", v); printf "%.2f", v / 1000 }
        else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.2f", v }
        else if (v ~ /m$/) { sub(/m$/, "", v); printf "%.2f", v * 60000 }
        else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.2f", v * 1000 }
        else { printf "?" }
    }'
}
rps_of() { sed -n 's/^Requests\/sec: *//p' "$work/$1.txt"; }
pct_of() { to_ms "$(awk -v p="$2%" '$1 == p { print $2; exit }' "$work/$1.txt")"; }
errors_of() {
    sed -n 's/^ *Socket errors: *//p; s/^ *Non-2xx or 3xx responses: *\(.*\)/non-2xx \1/p' "$work/$1.txt" | paste -sd' ' -
}

wf_url="http://127.0.0.1:$WF_PORT/rpc"
wt_url="http://127.0.0.1:$WT_PORT/"

echo "warming up ($WARMUP each)..." >&2
wrk_run warm-wf "$here/start.lua" "$wf_url" "$WARMUP"
wrk_run warm-wt "$here/hello.lua" "$wt_url" "$WARMUP"

rows=()
for round in $(seq 1 "$ROUNDS"); do
    echo "round $round/$ROUNDS: wf-host workflow.start, $DURATION..." >&2
    wrk_run "wf-$round" "$here/start.lua" "$wf_url" "$DURATION" --latency
    echo "round $round/$ROUNDS: wasmtime serve, $DURATION..." >&2
    wrk_run "wt-$round" "$here/hello.lua" "$wt_url" "$DURATION" --latency
    if [ -n "${WRK_OUT_DIR:-}" ]; then
        mkdir -p "$WRK_OUT_DIR" && cp "$work/wf-$round.txt" "$work/wt-$round.txt" "$WRK_OUT_DIR/"
    fi
    wf_rps="$(rps_of "wf-$round")"
    wt_rps="$(rps_of "wt-$round")"
    ratio="$(awk -v a="$wf_rps" -v b="$wt_rps" 'BEGIN { printf "%.2f", a / b }')"
    rows+=("| $round | wf-host workflow.start (wait) | $wf_rps | $(pct_of "wf-$round" 50) | $(pct_of "wf-$round" 99) | ${ratio}x |")
    rows+=("| $round | wasmtime serve hello | $wt_rps | $(pct_of "wt-$round" 50) | $(pct_of "wt-$round" 99) | 1.00x |")
    for side in wf wt; do
        errs="$(errors_of "$side-$round")"
        [ -z "$errs" ] || echo "round $round $side: $errs" >&2
    done
done

echo
echo "wrk -t$THREADS -c$CONNECTIONS -d$DURATION --latency, 127.0.0.1, $(nproc) cores shared by wrk and the server"
echo "wf-host state: ${WF_STATE:-a SQLite file (fresh, in a temp dir)}"
echo "$wt_version; $(wrk -v 2>&1 | head -n1 | cut -d' ' -f1-2)"
echo
echo "| round | server | req/s | p50 ms | p99 ms | req/s vs wasmtime |"
echo "| --- | --- | ---: | ---: | ---: | ---: |"
printf '%s\n' "${rows[@]}"
