#!/usr/bin/env bash
# Rebuilds every guest component from source:
#   plugins/<name>/      -> plugins/<name>.wasm      (example nodes, committed)
#   tests/guests/<name>/ -> tests/guests/<name>.wasm (guests the host's tests use)
#
# Needs the wasm32-wasip2 target: `rustup target add wasm32-wasip2`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}/guests"

if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx wasm32-wasip2; then
    echo "error: the wasm32-wasip2 target is missing; install it with \`rustup target add wasm32-wasip2\`" >&2
    exit 2
fi

build_workspace() {
    local dir="$1"
    shift
    cargo build --quiet --release --target wasm32-wasip2 \
        --manifest-path "$dir/Cargo.toml" --target-dir "$target_dir"
    for name in "$@"; do
        cp "$target_dir/wasm32-wasip2/release/$name.wasm" "$dir/$name.wasm"
        echo "built $(realpath --relative-to="$root" "$dir/$name.wasm") ($(stat -c %s "$dir/$name.wasm") bytes)"
    done
}

build_workspace "$root/plugins" echo call
build_workspace "$root/tests/guests" misbehave
