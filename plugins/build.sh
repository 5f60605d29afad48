#!/usr/bin/env bash
# Rebuilds every guest component from source:
#   plugins/<name>/      -> plugins/<name>.wasm      (example nodes, committed)
#   tests/guests/<name>/ -> tests/guests/<name>.wasm (guests the host's tests use)
#
# Needs the wasm32-wasip2 target: `rustup target add wasm32-wasip2`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}/guests"

# WF_GUEST_TOOLCHAIN=debian is the fallback for machines where rustup cannot
# download the target: Debian's rustc builds std from source for
# wasm32-unknown-unknown, and wasm-tools wraps the module into a component.
# (Such guests have no WASI stdio; everything else works the same.)
toolchain="${WF_GUEST_TOOLCHAIN:-rustup}"
if [ "$toolchain" = rustup ]; then
    if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx wasm32-wasip2; then
        echo "error: the wasm32-wasip2 target is missing; install it with \`rustup target add wasm32-wasip2\`" >&2
        echo "       (or, without rustup downloads: apt-get install rustc-web cargo-web rust-web-src lld-16," >&2
        echo "        cargo install wasm-tools, and rerun with WF_GUEST_TOOLCHAIN=debian)" >&2
        exit 2
    fi
fi

build_workspace() {
    local dir="$1"
    shift
    if [ "$toolchain" = debian ]; then
        RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
            CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld-16 \
            cargo build --quiet --release -Zbuild-std=std,panic_abort --target wasm32-unknown-unknown \
            --manifest-path "$dir/Cargo.toml" --target-dir "$target_dir/debian"
    else
        cargo build --quiet --release --target wasm32-wasip2 \
            --manifest-path "$dir/Cargo.toml" --target-dir "$target_dir"
    fi
    for name in "$@"; do
        if [ "$toolchain" = debian ]; then
            wasm-tools component new "$target_dir/debian/wasm32-unknown-unknown/release/$name.wasm" -o "$dir/$name.wasm"
        else
            cp "$target_dir/wasm32-wasip2/release/$name.wasm" "$dir/$name.wasm"
        fi
        echo "built $(realpath --relative-to="$root" "$dir/$name.wasm") ($(stat -c %s "$dir/$name.wasm") bytes)"
    done
}

build_workspace "$root/plugins" echo call
build_workspace "$root/tests/guests" misbehave
