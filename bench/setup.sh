#!/usr/bin/env bash
# Installs the non-Rust MCP servers used by `cargo bench -p wf-host --bench pool`
# into bench-local directories (both are git-ignored):
#   bench/python-echo-server/.venv         the official `mcp` package (PyPI)
#   bench/node-echo-server/node_modules    @modelcontextprotocol/sdk + zod (npm)
# Needs python3 (>= 3.10, with the venv module) and node (>= 18) with npm.
# Either part is skipped, with a message, when its toolchain is missing; the
# bench then prints "skipped: ..." for that server instead of failing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
status=0

if command -v python3 >/dev/null 2>&1; then
    echo "==> python: venv + mcp in $here/python-echo-server/.venv"
    python3 -m venv "$here/python-echo-server/.venv"
    "$here/python-echo-server/.venv/bin/pip" install --quiet --upgrade pip
    "$here/python-echo-server/.venv/bin/pip" install --quiet -r "$here/python-echo-server/requirements.txt"
    "$here/python-echo-server/.venv/bin/python" -c 'import importlib.metadata as m; print("    mcp", m.version("mcp"))'
else
    echo "==> python3 not found: the Python echo server will be skipped" >&2
    status=1
fi

if command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1; then
    echo "==> node: npm install in $here/node-echo-server"
    (cd "$here/node-echo-server" && npm install --no-audit --no-fund --silent)
    node -e 'console.log("    @modelcontextprotocol/sdk", require(process.argv[1]).version)' \
        "$here/node-echo-server/node_modules/@modelcontextprotocol/sdk/package.json"
else
    echo "==> node/npm not found: the Node echo server will be skipped" >&2
    status=1
fi

exit $status
