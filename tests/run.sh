#!/usr/bin/env bash
# Runs every test, as on a fresh machine: installs the guest toolchains that are
# missing (pip, npm, apt, cargo install; see plugins/build.sh), rebuilds every
# guest component from source, installs the official-SDK MCP servers that
# tests/interop.rs runs (tests/interop/setup.sh), PostgreSQL for the store and
# worker tests (apt) and the headless Chromium that tests/console.rs drives
# (tests/console-setup.sh), then runs the Rust test suite, which runs every
# plugin's cases against the fixture MCP server.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./plugins/build.sh --install
# PostgreSQL, whose server tests/common/postgres.rs starts for the shared-store
# tests (tests/store.rs): any version Debian installs under /usr/lib/postgresql.
if ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql
fi
# curl, jq and openssl: the triggers guide (docs/triggers.md), which the doc
# check follows, and the conformance suite's person (tests/conformance/person.sh,
# curl as its browser) use them as a reader would.
missing=""
for tool in curl jq openssl; do
    command -v "$tool" >/dev/null || missing="$missing $tool"
done
if [ -n "$missing" ]; then
    apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
fi
./plugins/build.sh
./tests/interop/setup.sh
./tests/console-setup.sh
# The MCP conformance suite (tests/conformance.rs), pinned by its lock file.
(cd tests/conformance && npm ci --no-audit --no-fund)
cargo test --workspace
