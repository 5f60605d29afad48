#!/usr/bin/env bash
# Installs the MCP servers of tests/interop.rs, built on the official SDKs, into
# their own directories (both are git-ignored):
#   tests/interop/python/.venv          the `mcp` package, pinned in requirements.txt
#   tests/interop/node/node_modules     @modelcontextprotocol/sdk, pinned in package-lock.json
# Needs python3 (>= 3.10, with the venv module) and node (>= 18) with npm. A
# missing one is an error, never a skip: the tests need both servers. A part
# that is already installed at the pinned versions is not installed again.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

fail() {
    echo "tests/interop/setup.sh: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || fail "python3 is not installed (apt-get install -y python3 python3-venv)"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    fail "python3 $(python3 -c 'import platform; print(platform.python_version())') is too old: mcp 2.x needs 3.10 or newer"
venv="$here/python/.venv"
stamp="$venv/.requirements"
if ! cmp -s "$here/python/requirements.txt" "$stamp" 2>/dev/null; then
    echo "==> interop: python venv with $(grep '^mcp==' "$here/python/requirements.txt")"
    python3 -m venv "$venv" || fail "python3 cannot create a venv (apt-get install -y python3-venv)"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/python/requirements.txt"
    cp "$here/python/requirements.txt" "$stamp"
fi

{ command -v node && command -v npm; } >/dev/null 2>&1 || fail "node and npm are not installed (apt-get install -y nodejs npm)"
modules="$here/node/node_modules"
if ! cmp -s "$here/node/package-lock.json" "$modules/.package-lock.json.installed" 2>/dev/null; then
    echo "==> interop: npm ci in tests/interop/node"
    (cd "$here/node" && npm ci --no-audit --no-fund --silent)
    cp "$here/node/package-lock.json" "$modules/.package-lock.json.installed"
fi
