# Sourced by the bench scripts (bench/flood, bench/soak): builds the release
# binary if it is missing, makes a work dir removed at exit, and `serve`
# starts `wf-host serve` on "$work/wf.toml" (which the script writes) on
# 127.0.0.1:$PORT, its log in "$work/serve.log", its pid in $server, and
# waits until it answers /healthz. The server is killed at exit.
#
# Settings (environment): WF_HOST=target/release/wf-host

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
WF_HOST="${WF_HOST:-$root/target/release/wf-host}"
if [ ! -x "$WF_HOST" ]; then
    cargo build --release -p wf-host
fi
work="$(mktemp -d)"
server=""
trap 'if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi; rm -rf "$work"' EXIT

serve() {
    RUST_LOG=warn "$WF_HOST" serve --config "$work/wf.toml" --listen "127.0.0.1:$PORT" 2> "$work/serve.log" &
    server=$!
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null && return
        sleep 0.1
    done
    echo "wf-host serve did not answer on port $PORT; its log:" >&2
    cat "$work/serve.log" >&2
    exit 1
}
