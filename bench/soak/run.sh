#!/usr/bin/env bash
# Soak benchmark (issue 52): RUNS three-step runs (three echo steps) started
# at a steady RATE per second through `workflow.start` (no wait), into a fresh
# SQLite file with the default pruning (10,000 finished runs kept). Every
# MARK starts it reports the server's RSS, its open files, the state's size on
# disk (database and WAL) and the p99 start latency of the last MARK starts;
# at the end, the growth of each between the first mark and the last.
#
#   bench/soak/run.sh                  build the release binary if missing, run
#
# Settings (environment):
#   RUNS=1000000 RATE=400 MARK=100000 CONNECTIONS=8 PORT=7880
#   WF_HOST=target/release/wf-host
#
# Needs: python3, curl. Every request is checked; an error or a busy refusal
# is counted and makes the script exit non-zero, as does a run that did not
# succeed (each finished run is counted by its `run.finished` status in
# `wf_runs_total`).
set -euo pipefail

RUNS="${RUNS:-1000000}"
RATE="${RATE:-400}"
MARK="${MARK:-100000}"
CONNECTIONS="${CONNECTIONS:-8}"
PORT="${PORT:-7880}"
. "$(dirname "${BASH_SOURCE[0]}")/../serve.sh"
cat > "$work/wf.toml" <<TOML
[runtime]
state = "$work/state.db"

[[workflows.soak.steps]]
id = "a"
component = "$root/plugins/echo.wasm"
[[workflows.soak.steps]]
id = "b"
needs = ["a"]
component = "$root/plugins/echo.wasm"
[[workflows.soak.steps]]
id = "c"
needs = ["b"]
component = "$root/plugins/echo.wasm"
TOML
serve

python3 - "$PORT" "$RUNS" "$RATE" "$MARK" "$CONNECTIONS" "$server" "$work/state.db" <<'PY'
import http.client, json, os, sys, threading, time

port, runs, rate, mark, connections, pid, db = (int(sys.argv[1]), int(sys.argv[2]),
    float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7])

def rss_mib():
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]) / 1024

def open_files():
    return len(os.listdir(f"/proc/{pid}/fd"))

def state_mib():
    size = 0
    for suffix in ("", "-wal", "-shm"):
        try:
            size += os.path.getsize(db + suffix)
        except FileNotFoundError:
            pass
    return size / 2**20

def finished():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    by = {}
    for line in text.splitlines():
        if line.startswith("wf_runs_total{"):
            status = line.split('status="')[1].split('"')[0]
            by[status] = by.get(status, 0) + int(float(line.rsplit(" ", 1)[1]))
    return by

lock = threading.Lock()
counts = {"accepted": 0, "error": 0}
latencies = []  # of the starts since the last mark
rows = []
next_n = [0]
began = time.monotonic()

def report(n):
    with lock:
        window = sorted(latencies)
        latencies.clear()
    p99 = window[int(len(window) * 0.99)] * 1000 if window else 0
    row = {"starts": n, "s": time.monotonic() - began, "rss": rss_mib(),
           "fds": open_files(), "state": state_mib(), "p99": p99,
           "done": sum(finished().values())}
    rows.append(row)
    print(f"{row['starts']:>9} starts {row['s']:>7.0f} s  RSS {row['rss']:6.1f} MiB  "
          f"open files {row['fds']:4}  state {row['state']:7.1f} MiB  "
          f"p99 start {row['p99']:6.2f} ms  finished {row['done']}", flush=True)

def client(i):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while True:
        with lock:
            n = next_n[0]
            if n >= runs:
                return
            next_n[0] += 1
        # Paced: start n is due at n / rate seconds.
        due = began + n / rate
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        body = json.dumps({"jsonrpc": "2.0", "id": n, "method": "workflow.start",
                           "params": {"workflow": "soak", "input": {"n": n}}})
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/rpc", body, {"content-type": "application/json"})
            reply = json.loads(conn.getresponse().read())
        except Exception as e:
            with lock:
                counts["error"] += 1
            print("request failed:", e, file=sys.stderr)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            continue
        took = time.perf_counter() - t0
        with lock:
            latencies.append(took)
            if "result" in reply and reply["result"].get("run_id"):
                counts["accepted"] += 1
            else:
                counts["error"] += 1
                if counts["error"] <= 3:
                    print("unexpected reply:", reply, file=sys.stderr)
        if (n + 1) % mark == 0:
            threading.Thread(target=report, args=(n + 1,)).start()

threads = [threading.Thread(target=client, args=(i,)) for i in range(connections)]
for t in threads: t.start()
for t in threads: t.join()
sent = time.monotonic() - began
print(f"sent {runs} starts in {sent:.0f} s ({runs / sent:.0f}/s): {counts}", flush=True)
while True:
    by = finished()
    if sum(by.values()) >= counts["accepted"]:
        break
    time.sleep(1)
time.sleep(1)
print(f"finished: {by}")
if len(rows) >= 2:
    first, last = rows[0], rows[-1]
    growth = lambda k: (last[k] - first[k]) / first[k] * 100 if first[k] else float("nan")
    print(f"from {first['starts']} to {last['starts']} starts: RSS {growth('rss'):+.1f} %, "
          f"open files {growth('fds'):+.1f} %, state {growth('state'):+.1f} %, "
          f"p99 start {growth('p99'):+.1f} %")
ok = counts["error"] == 0 and by.get("succeeded", 0) == counts["accepted"] and len(by) == 1
sys.exit(0 if ok else 1)
PY
