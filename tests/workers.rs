//! Several `wf-host serve` workers sharing one PostgreSQL: claims, leases,
//! fencing, wake-ups and cancels across workers. Every test starts its own
//! throwaway PostgreSQL server (Debian's `postgresql` package).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use common::postgres::TestPostgres;
use common::serve::Serve;
use common::*;

/// The config every worker of a test shares: the fixture connection (whose
/// calls all land in one witness file, each with the calling worker's pid),
/// the workflows, and a short lease so a dead worker's runs move on quickly.
fn config(dir: &Path, lease: &str) -> PathBuf {
    let text = format!(
        r#"[runtime]
lease = "{lease}"

[rpc]
allow = ["fixture.call_log"]

[connections.fixture]
command = "wf-host"
args = ["fixture-server"]
env = {{ WF_FIXTURE_WITNESS = "{witness}" }}

[[workflows.three.steps]]
id = "a"
component = "{call}"
allow = ["fixture.echo"]
input = '{{capability: "fixture.echo", arguments: {{text: "a-\(.input.n)"}}}}'
[[workflows.three.steps]]
id = "b"
component = "{call}"
allow = ["fixture.sleep"]
needs = ["a"]
input = '{{capability: "fixture.sleep", arguments: {{ms: 150}}}}'
[[workflows.three.steps]]
id = "c"
component = "{call}"
allow = ["fixture.echo"]
needs = ["b"]
input = '{{capability: "fixture.echo", arguments: {{text: "c-\(.input.n)"}}}}'

[[workflows.nap.steps]]
id = "sleep"
component = "{call}"
allow = ["fixture.sleep"]
input = '{{capability: "fixture.sleep", arguments: {{ms: .input.ms}}}}'

[[workflows.doze.steps]]
id = "z"
sleep = "3s"

[[workflows.slow.steps]]
id = "first"
component = "{call}"
allow = ["fixture.sleep"]
input = '{{capability: "fixture.sleep", arguments: {{ms: .input.ms}}}}'
[[workflows.slow.steps]]
id = "second"
component = "{call}"
allow = ["fixture.echo"]
needs = ["first"]
input = '{{capability: "fixture.echo", arguments: {{text: "second"}}}}'

[[workflows.patient.steps]]
id = "lead"
component = "{durable}"
allow = ["fixture.echo"]
"#,
        witness = dir.join("witness.jsonl").display(),
        call = plugin("call").display(),
        durable = guest("durable").display(),
    );
    let path = dir.join("wf.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A fresh database and two workers on it, sharing a config with `lease`
/// (and its witness file) in the returned dir.
fn two_workers(lease: &str) -> (TestPostgres, tempfile::TempDir, Serve, Serve) {
    let pg = TestPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), lease);
    let url = pg.url();
    let a = worker(&config, &url);
    let b = worker(&config, &url);
    (pg, dir, a, b)
}

/// Starts the `nap` workflow (one upstream sleep of `ms`) through `serve`;
/// the run's id.
async fn start_nap(serve: &Serve, ms: u64) -> String {
    let started = call(
        serve,
        "workflow.start",
        json!({"workflow": "nap", "input": {"ms": ms}}),
    )
    .await;
    started["run_id"].as_str().unwrap().to_owned()
}

/// A dedicated PostgreSQL, one worker with `lease`, and a run of `nap`
/// (one upstream sleep of `ms`) inside its call.
async fn nap_in_its_call(lease: &str, ms: u64) -> (TestPostgres, tempfile::TempDir, Serve, String) {
    let pg = TestPostgres::dedicated();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), lease);
    let a = worker(&config, &pg.url());
    let run_id = start_nap(&a, ms).await;
    wait_until("the sleep upstream", Duration::from_secs(20), || {
        read_witness(dir.path())
            .iter()
            .any(|c| c["tool"] == "sleep")
    })
    .await;
    (pg, dir, a, run_id)
}

/// A worker on `url`, serving `config` from the shared temp dir.
fn worker(config: &Path, url: &str) -> Serve {
    let config = config.to_owned();
    Serve::start(move |_| config, &["--state", url])
}

fn read_witness(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("witness.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn result(reply: Value) -> Value {
    match reply.get("result") {
        Some(result) => result.clone(),
        None => panic!("call failed: {reply}"),
    }
}

async fn call(serve: &Serve, method: &str, params: Value) -> Value {
    result(serve.rpc(method, params, None).await)
}

fn signal(serve: &Serve, sig: i32) {
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(serve.child.id() as i32, sig) }, 0);
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Milliseconds since the epoch of an RFC 3339 time.
fn epoch_ms(text: &str) -> u128 {
    humantime::parse_rfc3339(text)
        .unwrap()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_share_600_runs_and_a_killed_workers_steps_run_elsewhere() {
    let pg = TestPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "2s");
    let url = pg.url();
    let mut workers: Vec<Option<Serve>> = (0..3).map(|_| Some(worker(&config, &url))).collect();
    let pids: Vec<u32> = workers
        .iter()
        .map(|w| w.as_ref().unwrap().child.id())
        .collect();

    // 600 runs, started through all three in turn; worker 1 is killed a third
    // of the way in.
    const RUNS: usize = 600;
    let mut run_ids = Vec::new();
    for n in 0..RUNS {
        if n == RUNS / 3 {
            let killed = workers[1].take().unwrap();
            let mut killed = killed;
            signal(&killed, libc::SIGKILL);
            let _ = killed.child.wait();
        }
        let through = workers[n % 3]
            .as_ref()
            .or(workers[(n + 1) % 3].as_ref())
            .unwrap();
        let started = call(
            through,
            "workflow.start",
            json!({"workflow": "three", "input": {"n": n}}),
        )
        .await;
        run_ids.push(started["run_id"].as_str().unwrap().to_owned());
    }
    let live: Vec<&Serve> = workers.iter().flatten().collect();
    let mut outcome = BTreeMap::new();
    for (i, run_id) in run_ids.iter().enumerate() {
        let done = call(
            live[i % 2],
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 60000}),
        )
        .await;
        *outcome
            .entry(done["status"].as_str().unwrap().to_owned())
            .or_insert(0) += 1;
    }
    assert_eq!(outcome, BTreeMap::from([("succeeded".to_owned(), RUNS)]));

    // Who ran what: every step names the worker of each attempt.
    let mut ids = BTreeMap::new();
    for w in &live {
        let status = call(w, "host.status", json!({})).await;
        ids.insert(
            w.child.id(),
            status["worker"]["id"].as_str().unwrap().to_owned(),
        );
    }
    let mut finished_by: BTreeMap<String, usize> = BTreeMap::new();
    let mut reran = 0;
    for run_id in &run_ids {
        let run = call(live[0], "workflow.get", json!({"run_id": run_id})).await;
        for step in run["steps"].as_array().unwrap() {
            let attempts = step["workers"].as_array().unwrap();
            let last = attempts.last().unwrap()["worker"].as_str().unwrap();
            *finished_by.entry(last.to_owned()).or_insert(0) += 1;
            if attempts.len() > 1 {
                reran += 1;
                let first = attempts[0]["worker"].as_str().unwrap();
                assert!(
                    first.contains(&format!("-{}-", pids[1])),
                    "only the killed worker's steps run twice: {step}"
                );
                assert_ne!(first, last);
            }
        }
    }
    for (pid, id) in &ids {
        assert!(
            finished_by.get(id).copied().unwrap_or(0) >= 50,
            "worker {pid} finished few steps: {finished_by:?}"
        );
    }
    let killed_finished = finished_by
        .iter()
        .filter(|(id, _)| id.contains(&format!("-{}-", pids[1])))
        .map(|(_, n)| n)
        .sum::<usize>();
    assert!(killed_finished > 0, "the killed worker had done some work");
    eprintln!("steps finished by worker: {finished_by:?}; steps re-run after the kill: {reran}");

    assert!(
        reran > 0,
        "the killed worker's running steps ran again elsewhere"
    );

    // The witness: no step's call was made twice by live workers. A step's
    // calls carry the same idempotency key on every attempt.
    let mut by_step: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for c in read_witness(dir.path()) {
        let key = c["meta"]["wf-host/idempotency-key"]
            .as_str()
            .unwrap()
            .to_owned();
        by_step
            .entry(key)
            .or_default()
            .push(c["ppid"].as_i64().unwrap());
    }
    assert_eq!(by_step.len(), RUNS * 3, "every step called upstream");
    for (step, callers) in &by_step {
        let live_calls = callers.iter().filter(|p| **p != i64::from(pids[1])).count();
        assert!(
            live_calls <= 1,
            "step {step} was run by live workers {live_calls} times: {callers:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_past_its_lease_does_not_commit_its_stale_result() {
    let (_pg, dir, a, b) = two_workers("1s");
    let run_id = start_nap(&a, 3000).await;
    let a_pid = i64::from(a.child.id());
    wait_until("A's call upstream", Duration::from_secs(20), || {
        read_witness(dir.path()).iter().any(|c| c["ppid"] == a_pid)
    })
    .await;
    // A stops (its upstream call goes on in its fixture child); B takes the
    // run over once A's lease expires.
    signal(&a, libc::SIGSTOP);
    let b_pid = i64::from(b.child.id());
    wait_until("B's attempt upstream", Duration::from_secs(20), || {
        read_witness(dir.path()).iter().any(|c| c["ppid"] == b_pid)
    })
    .await;
    // A wakes with its result while B's attempt still runs.
    signal(&a, libc::SIGCONT);
    let done = call(
        &b,
        "workflow.wait",
        json!({"run_id": run_id, "timeout_ms": 30000}),
    )
    .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    // Let A try to write what it had.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let run = call(&b, "workflow.get", json!({"run_id": run_id, "calls": true})).await;
    let step = &run["steps"][0];
    let workers = step["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2, "{step}");
    assert!(
        workers[0]["worker"]
            .as_str()
            .unwrap()
            .contains(&format!("-{a_pid}-"))
    );
    assert!(
        workers[1]["worker"]
            .as_str()
            .unwrap()
            .contains(&format!("-{b_pid}-"))
    );
    assert_eq!(step["attempts"], 2, "{step}");
    // A's call of attempt 1 finished after A lost the lease: not journaled.
    let calls = step["calls"].as_array().unwrap();
    assert!(
        calls.iter().all(|c| c["attempt"] == 2),
        "a stale attempt was recorded: {calls:?}"
    );
    // One step.finished and one run.finished, both B's.
    let (code, body) = b.get(&format!("/runs/{run_id}/events"), None).await;
    assert_eq!(code, 200);
    let kinds: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "step.finished").count(),
        1,
        "{body}"
    );
    assert_eq!(kinds.iter().filter(|k| **k == "run.finished").count(), 1);
    // A is alive and serving.
    let status = call(&a, "host.status", json!({})).await;
    assert!(
        status["worker"]["id"]
            .as_str()
            .unwrap()
            .contains(&format!("-{a_pid}-"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_on_one_worker_returns_promptly_when_another_finishes_the_run() {
    let (_pg, _dir, a, b) = two_workers("30s");
    for _ in 0..3 {
        let run_id = start_nap(&a, 700).await;
        let done = call(
            &b,
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 20000}),
        )
        .await;
        let returned = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        assert_eq!(done["status"], "succeeded", "{done}");
        let run = call(&b, "workflow.get", json!({"run_id": run_id})).await;
        let by = run["steps"][0]["workers"][0]["worker"].as_str().unwrap();
        assert!(
            by.contains(&format!("-{}-", a.child.id())),
            "A ran it: {run}"
        );
        let late = returned - epoch_ms(done["finished_at"].as_str().unwrap());
        assert!(
            late <= 100,
            "B's wait returned {late} ms after the run finished"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_through_one_worker_stops_a_step_running_on_another() {
    let (_pg, dir, a, b) = two_workers("30s");
    let run_id = start_nap(&a, 60000).await;
    wait_until("the sleep upstream", Duration::from_secs(20), || {
        read_witness(dir.path())
            .iter()
            .any(|c| c["tool"] == "sleep")
    })
    .await;
    let asked = Instant::now();
    let cancelled = call(&b, "workflow.cancel", json!({"run_id": run_id})).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert!(asked.elapsed() < Duration::from_secs(5));
    let run = call(&a, "workflow.get", json!({"run_id": run_id})).await;
    assert_eq!(run["steps"][0]["status"], "cancelled", "{run}");
    // The upstream call on A's connection was cancelled too.
    let mut seen = false;
    for _ in 0..100 {
        let log = call(
            &a,
            "capability.call",
            json!({"name": "fixture.call_log", "arguments": {}}),
        )
        .await;
        let text = log.to_string();
        if text.contains("cancelled") && text.contains("sleep") {
            let log: Value =
                serde_json::from_str(log["content"][0]["text"].as_str().unwrap_or("{}"))
                    .unwrap_or(log.clone());
            let cancelled = log["cancelled"].as_array().cloned().unwrap_or_default();
            if cancelled.iter().any(|c| c["tool"] == "sleep") {
                seen = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen, "A's upstream sleep was not cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_gracefully_hands_its_runs_over_at_once() {
    let pg = TestPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    // A lease far longer than the test: only the release can move the run.
    let config = config(dir.path(), "60s");
    let url = pg.url();
    let a_config = config.clone();
    let mut a = Serve::start(move |_| a_config, &["--state", &url, "--grace", "200ms"]);
    let b = worker(&config, &url);
    let run_id = start_nap(&a, 60000).await;
    let a_pid = i64::from(a.child.id());
    wait_until("A's sleep upstream", Duration::from_secs(20), || {
        read_witness(dir.path()).iter().any(|c| c["ppid"] == a_pid)
    })
    .await;
    let stopped = Instant::now();
    signal(&a, libc::SIGTERM);
    assert!(a.child.wait().unwrap().success());
    let b_pid = i64::from(b.child.id());
    wait_until("B's attempt upstream", Duration::from_secs(20), || {
        read_witness(dir.path()).iter().any(|c| c["ppid"] == b_pid)
    })
    .await;
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "B took the run only after {:?}",
        stopped.elapsed()
    );
    let run = call(&b, "workflow.get", json!({"run_id": run_id})).await;
    assert_eq!(run["status"], "running", "{run}");
    assert_eq!(run["steps"][0]["attempts"], 2, "{run}");
    let cancelled = call(&b, "workflow.cancel", json!({"run_id": run_id})).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_retried_through_any_worker_is_claimed_and_runs_again() {
    let (_pg, dir, a, b) = two_workers("30s");
    let run_id = start_nap(&a, 60000).await;
    let sleeps = || {
        read_witness(dir.path())
            .iter()
            .filter(|c| c["tool"] == "sleep")
            .count()
    };
    wait_until("the first sleep upstream", Duration::from_secs(20), || {
        sleeps() == 1
    })
    .await;
    let cancelled = call(&a, "workflow.cancel", json!({"run_id": run_id})).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    // Retried through the other worker: reopened unclaimed, then claimed by
    // whichever worker has a free slot.
    let retried = call(&b, "workflow.retry", json!({"run_id": run_id})).await;
    assert_eq!(retried["status"], "running", "{retried}");
    wait_until(
        "the retried sleep upstream",
        Duration::from_secs(20),
        || sleeps() == 2,
    )
    .await;
    let run = call(&a, "workflow.get", json!({"run_id": run_id})).await;
    assert_eq!(run["status"], "running", "{run}");
    assert_eq!(run["steps"][0]["status"], "running", "{run}");
    assert_eq!(run["steps"][0]["attempts"], 2, "{run}");
    let cancelled = call(&a, "workflow.cancel", json!({"run_id": run_id})).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_status_lists_every_live_worker() {
    let (_pg, _dir, a, b) = two_workers("30s");
    let status = call(&a, "host.status", json!({})).await;
    assert_eq!(status["state"]["backend"], "postgres", "{status}");
    let me = status["worker"]["id"].as_str().unwrap();
    assert!(me.contains(&format!("-{}-", a.child.id())), "{status}");
    let listed: BTreeSet<String> = status["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(listed.contains(me), "{status}");
    let b_id = call(&b, "host.status", json!({})).await["worker"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(listed.contains(&b_id), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_goes_away_pauses_runs_and_fails_none() {
    let (pg, _dir, a, run_id) = nap_in_its_call("1s", 1500).await;
    // The database is away while the step's call ends and well past the lease.
    pg.stop();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let away = a.rpc("workflow.get", json!({"run_id": run_id}), None).await;
    assert!(away.get("error").is_some(), "{away}");
    pg.restart();
    let deadline = Instant::now() + Duration::from_secs(40);
    let done = loop {
        let reply = a
            .rpc(
                "workflow.wait",
                json!({"run_id": run_id, "timeout_ms": 5000}),
                None,
            )
            .await;
        if let Some(run) = reply.get("result")
            && run["status"] != "running"
        {
            break run.clone();
        }
        assert!(Instant::now() < deadline, "the run never finished: {reply}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(done["status"], "succeeded", "{done}");
    let run = call(&a, "workflow.get", json!({"run_id": run_id})).await;
    assert_eq!(run["steps"][0]["status"], "succeeded", "{run}");
    assert!(run["steps"][0]["attempts"].as_u64().unwrap() >= 2, "{run}");
}

/// A database away for less than the lease while a step's call ends: the
/// step's outcome is written once it is back, and the call is not made
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_away_for_less_than_the_lease_keeps_the_steps_outcome() {
    let (pg, dir, a, run_id) = nap_in_its_call("20s", 1000).await;
    // Away from before the call ends until well after, and longer than a
    // write waits for a connection (5 s) twice: the journal's, the step's.
    pg.stop();
    tokio::time::sleep(Duration::from_secs(12)).await;
    pg.restart();
    let done = call(
        &a,
        "workflow.wait",
        json!({"run_id": run_id, "timeout_ms": 40000}),
    )
    .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let run = call(&a, "workflow.get", json!({"run_id": run_id, "calls": true})).await;
    assert_eq!(run["steps"][0]["attempts"], 1, "{run}");
    // The call ended while the database was away: journaled all the same.
    let calls = run["steps"][0]["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{run}");
    assert_eq!(calls[0]["name"], "fixture.sleep", "{run}");
    let sleeps = read_witness(dir.path())
        .iter()
        .filter(|c| c["tool"] == "sleep")
        .count();
    assert_eq!(sleeps, 1, "the call was made again");
}

/// A database that refuses writes (read-only here; a full disk is the same
/// to wf-host): starts are refused as busy with when to try again, naming
/// the cause; `/healthz`, `host.status` and `/metrics` say the host is
/// degraded; reads are answered; the run in flight keeps its step's outcome
/// and finishes once the database takes writes again, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_refuses_writes_degrades_the_host_and_loses_no_run() {
    let (pg, dir, a, run_id) = nap_in_its_call("30s", 1500).await;
    pg.psql("ALTER SYSTEM SET default_transaction_read_only = on");
    pg.psql("SELECT pg_reload_conf()");

    let refused = a
        .rpc(
            "workflow.start",
            json!({"workflow": "nap", "input": {"ms": 1}}),
            None,
        )
        .await;
    let error = &refused["error"];
    assert_eq!(error["code"], -32004, "{refused}");
    assert!(
        error["data"]["retry_after_ms"].as_u64().unwrap() > 0,
        "{refused}"
    );
    assert!(
        error["message"].as_str().unwrap().contains("read-only"),
        "{refused}"
    );
    let (code, body) = a.get("/healthz", None).await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.starts_with("degraded: ") && body.contains("read-only"),
        "{body}"
    );
    let status = call(&a, "host.status", json!({})).await;
    assert!(
        status["state"]["degraded"]
            .as_str()
            .is_some_and(|d| d.contains("read-only")),
        "{status}"
    );
    assert!(
        status["load"]["refused"]["state_unavailable"]
            .as_u64()
            .unwrap()
            >= 1,
        "{status}"
    );
    assert!(
        status["load"]["store_errors"]["unavailable"]
            .as_u64()
            .unwrap()
            >= 1,
        "{status}"
    );
    let (_, metrics) = a.get("/metrics", None).await;
    assert!(
        metrics.lines().any(|l| l
            .starts_with("wf_starts_refused_total{reason=\"state_unavailable\"}")
            && !l.ends_with(" 0")),
        "{metrics}"
    );
    // Reads are answered.
    let got = call(&a, "workflow.get", json!({"run_id": run_id})).await;
    assert_eq!(got["status"], "running", "{got}");

    // The step's call ends while writes are refused; then they are taken.
    tokio::time::sleep(Duration::from_secs(3)).await;
    pg.psql("ALTER SYSTEM RESET default_transaction_read_only");
    pg.psql("SELECT pg_reload_conf()");
    let done = call(
        &a,
        "workflow.wait",
        json!({"run_id": run_id, "timeout_ms": 20000}),
    )
    .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let run = call(&a, "workflow.get", json!({"run_id": run_id})).await;
    assert_eq!(run["steps"][0]["attempts"], 1, "{run}");
    let sleeps = read_witness(dir.path())
        .iter()
        .filter(|c| c["tool"] == "sleep")
        .count();
    assert_eq!(sleeps, 1, "the call was made again");
    let (code, body) = a.get("/healthz", None).await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let next = start_nap(&a, 1).await;
    let done = call(
        &a,
        "workflow.wait",
        json!({"run_id": next, "timeout_ms": 20000}),
    )
    .await;
    assert_eq!(done["status"], "succeeded", "{done}");
}

#[test]
fn a_database_that_is_down_at_start_exits_2_naming_it_without_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "30s");
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://wf:s3cret-pw@127.0.0.1:{port}/wf");
    let started = Instant::now();
    let out = Command::new(wf_host_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env("WF_HOST_STATE", &url)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("127.0.0.1:{port}/wf")), "{stderr}");
    assert!(!stderr.contains("s3cret-pw"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// A durable sleep on a worker that dies wakes on another worker, on time:
/// once the dead worker's lease expires the other claims the run and sleeps
/// only what is left of the wake time the first one stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_run_of_a_killed_worker_wakes_on_another_on_time() {
    let (_pg, _dir, a, b) = two_workers("1s");
    let started = call(
        &a,
        "workflow.start",
        json!({"workflow": "doze", "input": {"n": 1}}),
    )
    .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    let until = loop {
        let got = call(&b, "workflow.get", json!({"run_id": run_id})).await;
        if let Some(until) = got["steps"][0]["input"]["until"].as_str() {
            break until.to_owned();
        }
        assert!(Instant::now() < deadline, "the sleep never started: {got}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    signal(&a, libc::SIGKILL);
    let done = call(
        &b,
        "workflow.wait",
        json!({"run_id": run_id, "timeout_ms": 30000}),
    )
    .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], json!({"n": 1}));
    let got = call(&b, "workflow.get", json!({"run_id": run_id})).await;
    let z = &got["steps"][0];
    assert_eq!(z["input"]["until"], json!(until), "the wake time is kept");
    assert_eq!(z["attempts"], 1, "{z}");
    let (until, woke) = (
        epoch_ms(&until),
        epoch_ms(z["finished_at"].as_str().unwrap()),
    );
    assert!(woke >= until, "woke {} ms early", until - woke);
    assert!(
        woke - until < 1500,
        "woke {} ms late: it slept anew on the other worker",
        woke - until
    );
}

/// A durable node parked on one worker (waiting for a signal) is taken over
/// by the other when the first is killed: the other goes on from the
/// journal in the shared store (the call made before the wait is not made
/// again), waits for the signal, and finishes the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_node_parked_on_a_killed_worker_goes_on_on_another() {
    let (_pg, dir, a, b) = two_workers("1s");
    let input = json!({"do": [
        {"call": "fixture.echo", "arguments": {"text": "before"}},
        {"signal": "go"},
        {"call": "fixture.echo", "arguments": {"text": "after"}},
    ]});
    let started = call(
        &a,
        "workflow.start",
        json!({"workflow": "patient", "input": input}),
    )
    .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    // The worker whose node waits says so (progress is that worker's own).
    let waits_on = async |serve: &Serve| {
        let got = call(serve, "workflow.get", json!({"run_id": run_id})).await;
        got["steps"][0]["progress"]["message"] == "waiting for signal `go`"
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (parked, other) = loop {
        if waits_on(&a).await {
            break (a, b);
        }
        if waits_on(&b).await {
            break (b, a);
        }
        assert!(Instant::now() < deadline, "the node never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The worker that does not drive the run sees the step wait too, and
    // for what, from the shared store.
    let seen = call(&other, "workflow.get", json!({"run_id": run_id})).await;
    let step = &seen["steps"][0];
    assert_eq!(step["status"], "waiting", "{seen}");
    assert_eq!(
        step["waiting_for"],
        json!([{"item": 0, "signal": "go", "timeout_at": null}])
    );
    signal(&parked, libc::SIGKILL);
    // The other worker claims the run once the lease runs out, and its node
    // waits again, answered from the journal up to there.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !waits_on(&other).await {
        assert!(
            Instant::now() < deadline,
            "the other worker's node never waited"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    call(
        &other,
        "workflow.signal",
        json!({"run_id": run_id, "signal": "go", "payload": 7}),
    )
    .await;
    let done = call(
        &other,
        "workflow.wait",
        json!({"run_id": run_id, "timeout_ms": 30000}),
    )
    .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], json!(["before", 7, "after"]));
    let texts: Vec<Value> = read_witness(dir.path())
        .iter()
        .map(|c| c["arguments"]["text"].clone())
        .collect();
    assert_eq!(texts, [json!("before"), json!("after")], "each call once");
    drop(parked);
}

/// A run paused through the worker that does not drive it: the driving
/// worker hears of it at its next lease renewal, lets its running step
/// finish and starts no other; `host.status` on either counts it paused.
/// Resumed (through either), it finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_paused_on_one_worker_stops_on_the_worker_that_drives_it() {
    let (_pg, _dir, a, b) = two_workers("1s");
    let started = call(
        &a,
        "workflow.start",
        json!({"workflow": "slow", "input": {"ms": 3000}}),
    )
    .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    let worker_of =
        async |serve: &Serve| call(serve, "host.status", json!({})).await["worker"]["id"].clone();
    let (id_a, id_b) = (worker_of(&a).await, worker_of(&b).await);
    let deadline = Instant::now() + Duration::from_secs(30);
    let driver = loop {
        let got = call(&a, "workflow.get", json!({"run_id": run_id})).await;
        let worker = got["steps"][0]["workers"][0]["worker"].clone();
        if !worker.is_null() {
            break worker;
        }
        assert!(
            Instant::now() < deadline,
            "the first step never started: {got}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let other = if driver == id_a { &b } else { &a };
    assert!(driver == id_a || driver == id_b, "{driver}");
    let paused = call(other, "workflow.pause", json!({"run_id": run_id})).await;
    assert_eq!(paused["status"], "paused", "{paused}");
    // Past the first step's end: it finished, and the second did not start.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let got = call(other, "workflow.get", json!({"run_id": run_id})).await;
    assert_eq!(got["status"], "paused", "{got}");
    assert_eq!(got["steps"][0]["status"], "succeeded", "{got}");
    assert_eq!(got["steps"][1]["status"], "pending", "{got}");
    let status = call(&a, "host.status", json!({})).await;
    assert_eq!(status["state"]["runs_paused"], 1, "{status}");
    call(other, "workflow.resume", json!({"run_id": run_id})).await;
    let done = call(
        other,
        "workflow.wait",
        json!({"run_id": run_id, "timeout_ms": 30000}),
    )
    .await;
    assert_eq!(done["status"], "succeeded", "{done}");
}

/// Sleeping runs do not fill a worker up: with one step slot, a worker
/// whose run sleeps claims the next, so four runs that each sleep 2 s
/// finish in about 2 s, not one after the other in 8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_runs_sleep_takes_on_more() {
    let pg = TestPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wf.toml");
    std::fs::write(
        &path,
        r#"[runtime]
max_concurrent_steps = 1

[[workflows.doze.steps]]
id = "z"
sleep = "2s"
"#,
    )
    .unwrap();
    let serve = worker(&path, &pg.url());
    let begun = Instant::now();
    let mut ids = Vec::new();
    for n in 0..4 {
        let started = call(
            &serve,
            "workflow.start",
            json!({"workflow": "doze", "input": {"n": n}}),
        )
        .await;
        ids.push(started["run_id"].as_str().unwrap().to_owned());
    }
    for (n, run_id) in ids.iter().enumerate() {
        let done = call(
            &serve,
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 30000}),
        )
        .await;
        assert_eq!(done["status"], "succeeded", "{done}");
        assert_eq!(done["output"], json!({"n": n}));
    }
    let all = begun.elapsed();
    assert!(
        all < Duration::from_secs(6),
        "four 2 s sleeps took {all:?}: a sleeping run kept the worker's only slot"
    );
}

/// Versions on PostgreSQL workers: a run waiting for a signal across a
/// reload that changes a later step's mapping finishes with the mapping it
/// started with, and a run started after the reload with the new one, with
/// both workers killed and started again in between; `host.status` on
/// either worker counts the live runs on each definition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_run_keeps_its_definition_across_a_reload_and_restarts_on_two_workers() {
    let pg = TestPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wf.toml");
    let version = |last: &str| {
        format!(
            "[runtime]\nlease = \"2s\"\n\n[[workflows.w.steps]]\nid = \"a\"\ncomponent = {echo:?}\n\n[[workflows.w.steps]]\nid = \"gate\"\nneeds = [\"a\"]\nwait = \"go\"\n\n[[workflows.w.steps]]\nid = \"b\"\nneeds = [\"gate\"]\ncomponent = {echo:?}\ninput = '{last}'\n",
            echo = plugin("echo").display().to_string(),
        )
    };
    std::fs::write(&path, version("{v: 1}")).unwrap();
    let url = pg.url();
    let (a, b) = (worker(&path, &url), worker(&path, &url));
    let waiting = async |serve: &Serve, run_id: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = call(serve, "workflow.get", json!({"run_id": run_id})).await;
            if got["steps"][1]["status"] == "waiting" {
                return got["definition_hash"].as_str().unwrap().to_owned();
            }
            assert!(Instant::now() < deadline, "never waited: {got}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let start = async |serve: &Serve| {
        let started = call(
            serve,
            "workflow.start",
            json!({"workflow": "w", "input": {}}),
        )
        .await;
        started["run_id"].as_str().unwrap().to_owned()
    };
    let old_run = start(&a).await;
    let first = waiting(&b, &old_run).await;

    std::fs::write(&path, version("{v: 2}")).unwrap();
    for serve in [&a, &b] {
        call(serve, "host.reload", json!({})).await;
    }
    let new_run = start(&b).await;
    let second = waiting(&a, &new_run).await;
    assert_ne!(first, second);
    for serve in [&a, &b] {
        let status = call(serve, "host.status", json!({})).await;
        let defs = &status["definitions"]["w"];
        assert_eq!(defs["current"], second, "{status}");
        let mut live: Vec<(String, u64)> = defs["live"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["hash"].as_str().unwrap().to_owned(),
                    l["runs"].as_u64().unwrap(),
                )
            })
            .collect();
        live.sort();
        let mut expected = vec![(first.clone(), 1), (second.clone(), 1)];
        expected.sort();
        assert_eq!(live, expected, "{status}");
    }

    // Both workers killed, and started again on the new config.
    for serve in [a, b] {
        signal(&serve, libc::SIGKILL);
        drop(serve);
    }
    let (a, b) = (worker(&path, &url), worker(&path, &url));
    for (serve, run_id) in [(&a, &old_run), (&b, &new_run)] {
        call(
            serve,
            "workflow.signal",
            json!({"run_id": run_id, "signal": "go", "payload": {}}),
        )
        .await;
    }
    for (run_id, v) in [(&old_run, 1), (&new_run, 2)] {
        let done = call(
            &b,
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 60000}),
        )
        .await;
        assert_eq!(done["status"], "succeeded", "{done}");
        assert_eq!(done["output"], json!({"v": v}), "run {run_id}: {done}");
    }
    drop(a);
}

/// Chaos on PostgreSQL: under a steady load through two workers, 20 times at
/// random a worker is SIGKILLed and started again, or the database is
/// stopped at once and started again. Every run ends once and succeeded, one
/// per key, and a step's call is made again only by another process (after
/// a kill), at most once per attempt the step was given: an outage shorter
/// than the lease repeats nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_worker_kills_and_database_restarts_lose_no_run() {
    let mut rng = common::chaos::seeded_rng();
    let pg = TestPostgres::dedicated();
    let dir = tempfile::tempdir().unwrap();
    // Longer than any outage here (up to 1.5 s and a restart): a worker
    // keeps its runs across one, and writes what they did once it is back.
    let config = config(dir.path(), "5s");
    let url = pg.url();
    let mut workers = [worker(&config, &url), worker(&config, &url)];
    let load = common::chaos::Load::start(
        "three",
        workers.iter().map(|w| format!("{}/rpc", w.base)).collect(),
    );
    let (mut kills, mut restarts) = (0, 0);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(rng.u64(300..1500))).await;
        if rng.u8(..5) == 0 {
            restarts += 1;
            tokio::task::block_in_place(|| pg.stop());
            tokio::time::sleep(Duration::from_millis(rng.u64(100..1500))).await;
            tokio::task::block_in_place(|| pg.restart());
        } else {
            kills += 1;
            let i = rng.usize(..2);
            signal(&workers[i], libc::SIGKILL);
            let _ = workers[i].child.wait();
            let (config, url) = (config.clone(), url.clone());
            workers[i] = tokio::task::spawn_blocking(move || worker(&config, &url))
                .await
                .unwrap();
            load.set(i, format!("{}/rpc", workers[i].base));
        }
    }
    let accepted = load.finish(&format!("{}/rpc", workers[0].base)).await;

    let mut attempts = BTreeMap::new();
    for (i, (n, run_id)) in accepted.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(90);
        let done = loop {
            let reply = workers[i % 2]
                .rpc(
                    "workflow.wait",
                    json!({"run_id": run_id, "timeout_ms": 10000}),
                    None,
                )
                .await;
            if let Some(run) = reply.get("result")
                && run["status"] != "running"
            {
                break run.clone();
            }
            assert!(Instant::now() < deadline, "run {n} never ended: {reply}");
        };
        assert_eq!(done["status"], "succeeded", "run {n}: {done}");
        let run = call(&workers[0], "workflow.get", json!({"run_id": run_id})).await;
        for step in run["steps"].as_array().unwrap() {
            assert_eq!(step["status"], "succeeded", "run {n}: {run}");
            attempts.insert(
                format!("{run_id}/{}", step["id"].as_str().unwrap()),
                step["attempts"].as_u64().unwrap(),
            );
        }
    }
    let keys: BTreeSet<_> = accepted.iter().map(|(n, _)| *n).collect();
    let runs: BTreeSet<_> = accepted.iter().map(|(_, r)| r.clone()).collect();
    assert_eq!(keys.len(), runs.len(), "two keys share a run");
    let counts = pg.psql(
        "select count(*), count(distinct idempotency_key), (select count(*) from events where kind = 'run.finished') from runs",
    );
    assert_eq!(
        counts.trim(),
        format!("{0}|{0}|{0}", keys.len()),
        "runs, keys and run.finished events in the database"
    );

    let repeated = common::chaos::assert_calls_repeat_only_across_processes(
        &read_witness(dir.path()),
        &attempts,
        |_| false,
    );
    eprintln!(
        "{} runs, {kills} worker kills, {restarts} database restarts, {repeated} calls made again",
        accepted.len()
    );
}
