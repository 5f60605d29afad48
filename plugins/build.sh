#!/usr/bin/env bash
# Rebuilds every guest component from source, in every language:
#
#   Rust    plugins/<name>/ (Cargo workspace)  -> plugins/<name>.wasm     committed
#           tests/guests/<name>/               -> tests/guests/<name>.wasm committed
#   Python  plugins/py-<name>/app.py           -> plugins/py-<name>.wasm  not committed (~18 MB)
#   JS      plugins/js-<name>/app.js           -> plugins/js-<name>.wasm  not committed (~1.6 MB)
#   C       plugins/c-<name>/app.c             -> plugins/c-<name>.wasm   committed
#
# Usage:
#   ./plugins/build.sh [rust] [python] [js] [c]   build those languages (default: all)
#   ./plugins/build.sh --install                  install the missing toolchains (root, for apt)
#   ./plugins/build.sh --check                    say which toolchains are there, build nothing
#
# A language whose toolchain is missing is skipped with a message that says what
# to install. With CI=true a missing toolchain is an error instead: CI builds all.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}/guests"

# Pinned toolchain versions (docs/ and .ci/run refer to these).
COMPONENTIZE_PY_VERSION=0.25.1 # pip; jco is pinned in plugins/js-*/package-lock.json
WIT_BINDGEN_VERSION=0.63.0     # cargo install wit-bindgen-cli
WASM_TOOLS_VERSION=1.263.0     # cargo install wasm-tools
CLANG=clang-16                 # apt: clang-16 lld-16 wasi-libc libclang-rt-16-dev-wasm32
APT_C_PACKAGES=(clang-16 lld-16 wasi-libc libclang-rt-16-dev-wasm32)

# How to install each tool: printed when it is missing, run by --install.
install_cmd() {
    case "$1" in
    wasip2) echo "rustup target add wasm32-wasip2" ;;
    componentize-py) echo "python3 -m pip install componentize-py==$COMPONENTIZE_PY_VERSION" ;;
    node) echo "apt-get install -y nodejs npm   # Node.js 18 or newer" ;;
    clang) echo "apt-get install -y ${APT_C_PACKAGES[*]}" ;;
    wit-bindgen) echo "cargo install --locked --no-default-features --features c wit-bindgen-cli@$WIT_BINDGEN_VERSION" ;;
    wasm-tools) echo "cargo install --locked --no-default-features --features component,validate,print wasm-tools@$WASM_TOOLS_VERSION" ;;
    esac
}

# ---- toolchain checks: each returns 0 when the tool is there, else records why not

missing=() # "tool|reason" for each missing tool
need() {   # need TOOL REASON: records a missing tool
    missing+=("$1|$2")
    return 1
}
version_of() { "$@" --version 2>/dev/null | head -n1 | awk '{print $NF}'; }

have_wasip2() {
    [ "$toolchain" = debian ] && return 0
    command -v rustup >/dev/null 2>&1 || return 0 # no rustup: let cargo say what it lacks
    rustup target list --installed | grep -qx wasm32-wasip2 || need wasip2 "the wasm32-wasip2 target is missing"
}
have_componentize_py() {
    command -v componentize-py >/dev/null 2>&1 || { need componentize-py "componentize-py is not installed"; return 1; }
    local v
    v="$(version_of componentize-py)"
    [ "$v" = "$COMPONENTIZE_PY_VERSION" ] || echo "warning: componentize-py $v is installed; this repo is tested with $COMPONENTIZE_PY_VERSION" >&2
}
have_node() {
    { command -v node && command -v npm; } >/dev/null 2>&1 || need node "node and npm are not installed"
}
have_clang() {
    command -v "$CLANG" >/dev/null 2>&1 || { need clang "$CLANG is not installed"; return 1; }
    # Compiles and links a reactor module: needs wasi-libc, lld and the wasm32 builtins.
    echo 'int f(void) { return 0; }' |
        "$CLANG" --target=wasm32-wasi -mexec-model=reactor -x c - -o /dev/null 2>/dev/null ||
        need clang "$CLANG cannot link for wasm32-wasi (wasi-libc, lld-16 or the wasm32 compiler-rt is missing)"
}
have_cargo_tool() { # have_cargo_tool NAME VERSION
    command -v "$1" >/dev/null 2>&1 || { need "$1" "$1 is not installed"; return 1; }
    local v
    v="$(version_of "$1")"
    [ "$v" = "$2" ] || echo "warning: $1 $v is installed; this repo is tested with $2" >&2
}
have_wasm_tools() { have_cargo_tool wasm-tools "$WASM_TOOLS_VERSION"; }
have_c() {
    local ok=0
    have_clang || ok=1
    have_cargo_tool wit-bindgen "$WIT_BINDGEN_VERSION" || ok=1
    have_wasm_tools || ok=1
    return $ok
}

# Reports the tools a language lacks; with CI=true that is fatal.
skip() { # skip LANGUAGE
    echo "skipping $1 nodes: a toolchain is missing" >&2
    local entry
    for entry in "${missing[@]}"; do
        echo "  - ${entry#*|}; install it with:  $(install_cmd "${entry%%|*}")" >&2
    done
    if [ "${CI:-}" = true ]; then
        echo "error: CI=true builds every language; install the tools above (./plugins/build.sh --install)" >&2
        exit 1
    fi
    skipped+=("$1")
    missing=()
}

report() { # report FILE
    echo "built $(realpath --relative-to="$root" "$1") ($(stat -c %s "$1") bytes)"
}

# ---- Rust

# WF_GUEST_TOOLCHAIN=debian is the fallback for machines where rustup cannot
# download the target: Debian's rustc builds std from source for
# wasm32-unknown-unknown, and wasm-tools wraps the module into a component.
# (Such guests have no WASI stdio; everything else works the same.)
toolchain="${WF_GUEST_TOOLCHAIN:-rustup}"

# The members of the Cargo workspace in DIR: `members = ["a", "b"]` -> a b.
members_of() {
    sed -n 's/^members *= *\[\(.*\)\]/\1/p' "$1/Cargo.toml" | tr -d '" ' | tr ',' ' '
}

build_workspace() {
    local dir="$1" name
    if [ "$toolchain" = debian ]; then
        RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
            CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld-16 \
            cargo build --quiet --release -Zbuild-std=std,panic_abort --target wasm32-unknown-unknown \
            --manifest-path "$dir/Cargo.toml" --target-dir "$target_dir/debian"
    else
        cargo build --quiet --release --target wasm32-wasip2 \
            --manifest-path "$dir/Cargo.toml" --target-dir "$target_dir"
    fi
    for name in $(members_of "$dir"); do
        if [ "$toolchain" = debian ]; then
            wasm-tools component new "$target_dir/debian/wasm32-unknown-unknown/release/${name//-/_}.wasm" -o "$dir/$name.wasm"
        else
            cp "$target_dir/wasm32-wasip2/release/${name//-/_}.wasm" "$dir/$name.wasm"
        fi
        report "$dir/$name.wasm"
    done
}

build_rust() {
    if [ "$toolchain" = debian ]; then
        have_wasm_tools || { skip Rust; return; }
    else
        have_wasip2 || {
            missing[0]+=" (or, without rustup downloads: apt-get install rustc-web cargo-web rust-web-src lld-16, install wasm-tools, and rerun with WF_GUEST_TOOLCHAIN=debian)"
            skip Rust
            return
        }
    fi
    build_workspace "$root/plugins"
    build_workspace "$root/tests/guests"
}

# ---- Python: componentize-py bundles CPython, the app and its imports.

build_python() {
    have_componentize_py || { skip Python; return; }
    local dir name
    for dir in "$root"/plugins/py-*/; do
        [ -f "$dir/app.py" ] || continue
        name="$(basename "$dir")"
        # Run from the node's folder so that only it is on the Python path.
        (cd "$dir" && componentize-py -d "$root/wit" -w node componentize app -o "$root/plugins/$name.wasm" >/dev/null)
        report "$root/plugins/$name.wasm"
    done
}

# ---- JavaScript: jco with the QuickJS backend, sync (no component-model async).

build_js() {
    have_node || { skip JavaScript; return; }
    local dir name
    for dir in "$root"/plugins/js-*/; do
        [ -f "$dir/app.js" ] || continue
        name="$(basename "$dir")"
        # jco is pinned by the node's package-lock.json; `npm ci` installs it
        # into the node's node_modules/ when that is missing or stale.
        if [ ! -f "$dir/node_modules/.package-lock.json" ] ||
            [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
            (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
        fi
        (cd "$dir" && ./node_modules/.bin/jco componentize app.js --wit "$root/wit" -n node \
            --backend qjs --backend-qjs-disable-async -o "$root/plugins/$name.wasm" >/dev/null)
        report "$root/plugins/$name.wasm"
    done
}

# ---- C: wit-bindgen's C bindings, clang for wasm32-wasi (a reactor: no main),
# ---- then wasm-tools wraps the core module into a component with the WASI
# ---- preview1 reactor adapter.

build_c() {
    have_c || { skip C; return; }
    local dir name out log
    for dir in "$root"/plugins/c-*/; do
        [ -f "$dir/app.c" ] || continue
        name="$(basename "$dir")"
        out="$target_dir/$name"
        rm -rf "$out/gen"
        mkdir -p "$out"
        log="$(wit-bindgen c "$root/wit" --world node --out-dir "$out/gen" 2>&1)" || { echo "$log" >&2; return 1; }
        "$CLANG" --target=wasm32-wasi -mexec-model=reactor -Os -s -Wall -Werror -I"$out/gen" \
            -o "$out/$name.core.wasm" "$dir/app.c" "$out/gen/node.c" "$out/gen/node_component_type.o"
        # The adapter's bytes come from the crate pinned in the node's adapter/.
        cargo run --quiet --release --manifest-path "$dir/adapter/Cargo.toml" --target-dir "$target_dir" \
            -- "$out/wasi_snapshot_preview1.reactor.wasm"
        wasm-tools component new "$out/$name.core.wasm" \
            --adapt wasi_snapshot_preview1="$out/wasi_snapshot_preview1.reactor.wasm" -o "$root/plugins/$name.wasm"
        report "$root/plugins/$name.wasm"
    done
}

# ---- --install: installs whatever is missing (apt needs root).

install_missing() {
    local pkgs=()
    command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx wasm32-wasip2 &&
        rustup target add wasm32-wasip2
    if [ "$(version_of componentize-py)" != "$COMPONENTIZE_PY_VERSION" ]; then
        local pip=(python3 -m pip install --quiet --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION")
        # Debian's own python3 refuses global installs unless told otherwise.
        "${pip[@]}" || "${pip[@]}" --break-system-packages
    fi
    have_node || pkgs+=(nodejs npm)
    have_clang || pkgs+=("${APT_C_PACKAGES[@]}")
    if [ ${#pkgs[@]} -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}"
    fi
    # `cargo install` takes minutes; it is skipped when the pinned version is in
    # ~/.cargo/bin already (which persists between CI runs on one machine).
    [ "$(version_of wit-bindgen)" = "$WIT_BINDGEN_VERSION" ] || eval "$(install_cmd wit-bindgen)"
    [ "$(version_of wasm-tools)" = "$WASM_TOOLS_VERSION" ] || eval "$(install_cmd wasm-tools)"
    missing=()
}

skipped=()
languages=()
for arg in "$@"; do
    case "$arg" in
    --install) install_missing; exit 0 ;;
    --check)
        for check in have_wasip2 have_componentize_py have_node have_c; do $check || true; done
        if [ ${#missing[@]} -eq 0 ]; then echo "all toolchains are there"; exit 0; fi
        for entry in "${missing[@]}"; do echo "missing: ${entry#*|}; install it with:  $(install_cmd "${entry%%|*}")"; done
        exit 1
        ;;
    rust | python | js | c) languages+=("$arg") ;;
    -h | --help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument \`$arg\` (expected rust, python, js, c, --install or --check)" >&2; exit 2 ;;
    esac
done
[ ${#languages[@]} -gt 0 ] || languages=(rust python js c)

for language in "${languages[@]}"; do
    "build_$language"
done
if [ ${#skipped[@]} -gt 0 ]; then
    echo "skipped: ${skipped[*]} (see above for what to install)" >&2
fi
