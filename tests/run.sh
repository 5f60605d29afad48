#!/usr/bin/env bash
# Runs every test, as on a fresh machine: installs the guest toolchains that are
# missing (pip, npm, apt, cargo install; see plugins/build.sh), rebuilds every
# guest component from source, then runs the Rust test suite, which runs every
# plugin's cases against the fixture MCP server.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./plugins/build.sh --install
./plugins/build.sh
# The official Python MCP SDK, for the interop tests (tests/mcp/).
pip=(python3 -m pip install --quiet --disable-pip-version-check -r tests/mcp/requirements.txt)
"${pip[@]}" || "${pip[@]}" --break-system-packages
cargo test --workspace
