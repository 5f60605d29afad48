#!/usr/bin/env bash
# Flood benchmark (issue 52): RUNS `workflow.start` requests (no wait) at
# CONNECTIONS concurrent connections, for a workflow that sleeps SLEEP between
# two echo steps, so that every run is asleep at once; into a fresh SQLite file.
# Samples the server's RSS while it runs and prints the peak, then waits until
# every run has ended and counts them by status from the state file.
#
#   bench/flood/run.sh                 build the release binary if missing, run
#
# Settings (environment):
#   RUNS=40000 CONNECTIONS=64 SLEEP=60s PORT=7879 MAX_LIVE_RUNS=4000 RETRY=1
#   WAIT=1 (WAIT=0: measure once every run is asleep, then stop without
#   waiting for them to wake; for runs that sleep for hours)
#   WF_HOST=target/release/wf-host
#
# Needs: python3, curl. Every request is checked: a run id, or a busy refusal
# (-32004 with retry_after_ms), which the client obeys: it sends the same start
# again after retry_after_ms (RETRY=0: it does not); anything else is counted
# as an error and makes
# the script exit non-zero, as does a run that did not succeed.
set -euo pipefail

RUNS="${RUNS:-40000}"
CONNECTIONS="${CONNECTIONS:-64}"
SLEEP="${SLEEP:-60s}"
PORT="${PORT:-7879}"
MAX_LIVE_RUNS="${MAX_LIVE_RUNS:-4000}"
. "$(dirname "${BASH_SOURCE[0]}")/../serve.sh"
cat > "$work/wf.toml" <<TOML
[runtime]
state = "$work/state.db"
keep_runs = 10000000
max_live_runs = $MAX_LIVE_RUNS

[[workflows.flood.steps]]
id = "a"
component = "$root/plugins/echo.wasm"
[[workflows.flood.steps]]
id = "nap"
needs = ["a"]
sleep = "$SLEEP"
[[workflows.flood.steps]]
id = "b"
component = "$root/plugins/echo.wasm"
needs = ["nap"]
TOML
serve

python3 - "$PORT" "$RUNS" "$CONNECTIONS" "$server" "$work/state.db" <<'PY'
import http.client, json, os, sqlite3, sys, threading, time

port, runs, connections, pid, db = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]

def rss_kib():
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0])

base_rss = rss_kib()
peak = [0]
stop = threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], rss_kib())
        time.sleep(0.2)
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()

lock = threading.Lock()
counts = {"accepted": 0, "busy": 0, "error": 0}
latencies = []
next_n = [0]
retries = []
retry = os.environ.get("RETRY", "1") == "1"
def client():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while True:
        with lock:
            if retries:
                n = retries.pop()
            else:
                n = next_n[0]
                if n >= runs:
                    return
                next_n[0] += 1
        body = json.dumps({"jsonrpc": "2.0", "id": n, "method": "workflow.start",
                           "params": {"workflow": "flood", "input": {"n": n}}})
        began = time.perf_counter()
        try:
            conn.request("POST", "/rpc", body, {"content-type": "application/json"})
            reply = json.loads(conn.getresponse().read())
        except Exception as e:
            with lock:
                counts["error"] += 1
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            continue
        took = time.perf_counter() - began
        with lock:
            latencies.append(took)
            busy_wait = None
            if "result" in reply and reply["result"].get("run_id"):
                counts["accepted"] += 1
            elif reply.get("error", {}).get("code") == -32004 and "retry_after_ms" in (reply["error"].get("data") or {}):
                counts["busy"] += 1
                busy_wait = reply["error"]["data"]["retry_after_ms"] / 1000
            else:
                busy_wait = None
            if "result" not in reply and busy_wait is None:
                counts["error"] += 1
                if counts["error"] <= 3:
                    print("unexpected reply:", reply, file=sys.stderr)
        # A busy refusal stored nothing: the same start again, when it says.
        if busy_wait is not None and retry:
            time.sleep(busy_wait)
            with lock:
                retries.append(n)

began = time.time()
threads = [threading.Thread(target=client) for _ in range(connections)]
for t in threads: t.start()
for t in threads: t.join()
sent = time.time() - began
latencies.sort()
p99 = latencies[int(len(latencies) * 0.99)] * 1000 if latencies else 0
print(f"sent {runs} starts in {sent:.1f} s: {counts}; p99 start {p99:.1f} ms")
rss_all_asleep = rss_kib()
print(f"RSS at start {base_rss / 1024:.0f} MiB")

if os.environ.get("WAIT", "1") == "0":
    # Measured with every run asleep, not waited for: let the last ones fall
    # asleep, then count them from the state and stop.
    time.sleep(10)
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    asleep = c.execute("SELECT count(*) FROM runs WHERE status = 'running' AND wake_ms IS NOT NULL").fetchone()[0]
    stop.set()
    print(f"{asleep} runs asleep in the state; RSS now {rss_kib() / 1024:.0f} MiB, peak {peak[0] / 1024:.0f} MiB")
    sys.exit(0 if counts["error"] == 0 and asleep == counts["accepted"] else 1)

# Every run ends: succeeded, or otherwise (counted).
def by_status():
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return dict(c.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
    finally:
        c.close()
while True:
    statuses = by_status()
    if statuses.get("running", 0) + statuses.get("queued", 0) == 0:
        break
    time.sleep(1)
stop.set()
asleep = sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute("SELECT count(*) FROM events WHERE kind = 'run.asleep'").fetchone()[0]
print(f"runs by status: {statuses}; {asleep} let go of their driver while asleep")
print(f"peak RSS {peak[0] / 1024:.0f} MiB; RSS with every run asleep {rss_all_asleep / 1024:.0f} MiB; "
      f"{(peak[0] * 1024) / max(counts['accepted'], 1):.0f} bytes per accepted run at the peak")
ok = counts["error"] == 0 and statuses.get("succeeded", 0) == counts["accepted"]
sys.exit(0 if ok else 1)
PY
