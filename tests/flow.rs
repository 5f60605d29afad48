//! Flow control of a workflow's runs (`concurrency`, `rate`, `priority`)
//! through a real `wf-host serve`: runs past a key's limit wait `queued`
//! with their reason, are admitted best first as slots free, survive a
//! killed server, can be cancelled while queued, and a key's limit holds
//! across two PostgreSQL workers. Overlaps and windows are measured from the
//! store's own times (`admitted_ms`, `finished_ms`), read straight from it.
//! Debounced starts collapse into one run per key, also across a restart
//! and across two PostgreSQL workers.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::postgres::TestPostgres;
use common::serve::Serve;
use common::*;

/// Every workflow of these tests: each one step that sleeps upstream for
/// `.input.ms` (the fixture's `sleep` tool).
fn config(dir: &Path) -> PathBuf {
    let step = |workflow: &str| {
        format!(
            r#"[[workflows.{workflow}.steps]]
id = "nap"
component = "{call}"
allow = ["fixture.sleep"]
input = '{{capability: "fixture.sleep", arguments: {{ms: (.input.ms // 0)}}}}'
"#,
            call = plugin("call").display(),
        )
    };
    let text = format!(
        r#"[runtime]
lease = "2s"

[connections.fixture]
command = "wf-host"
args = ["fixture-server"]

[workflows.keyed]
concurrency = {{ key = '.k', limit = 2 }}
{keyed}
[workflows.ranked]
concurrency = {{ limit = 1 }}
priority = '.p'
{ranked}
[workflows.paced]
rate = {{ limit = 3, period = "2s" }}
{paced}
[workflows.mixed]
concurrency = {{ key = '.k', limit = 1 }}
rate = {{ limit = 100, period = "1m" }}
{mixed}
[workflows.bounced]
debounce = {{ key = '.k', period = "1s" }}
{bounced}
[workflows.steady]
debounce = {{ period = "700ms", max_wait = "1500ms" }}
{steady}"#,
        bounced = step("bounced"),
        steady = step("steady"),
        mixed = step("mixed"),
        keyed = step("keyed"),
        ranked = step("ranked"),
        paced = step("paced"),
    );
    let path = dir.join("wf.toml");
    std::fs::write(&path, text).unwrap();
    path
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

async fn start(serve: &Serve, workflow: &str, input: Value) -> Value {
    call(
        serve,
        "workflow.start",
        json!({"workflow": workflow, "input": input}),
    )
    .await
}

/// Waits until every run of `ids` has finished; their records.
async fn wait_all(serve: &Serve, ids: &[String], timeout: Duration) -> Vec<Value> {
    let deadline = Instant::now() + timeout;
    let mut records = Vec::new();
    for id in ids {
        let left = deadline.saturating_duration_since(Instant::now());
        let record = call(
            serve,
            "workflow.wait",
            json!({"run_id": id, "timeout_ms": left.as_millis() as u64}),
        )
        .await;
        assert_eq!(record["status"], "succeeded", "run {id}: {record}");
        records.push(record);
    }
    records
}

/// A run as the store keeps it: `(run_id, input, admitted_ms, finished_ms)`.
type Stored = (String, Value, i64, i64);

/// The runs of `workflow` that succeeded, in a SQLite state file, read
/// beside the server (WAL readers do not hold it up).
async fn stored_sqlite(state: &Path, workflow: &str) -> Vec<Stored> {
    let pool = read_only(state).await;
    let rows: Vec<(String, String, Option<i64>, Option<i64>)> = sqlx::query_as(
        "SELECT run_id, input, admitted_ms, finished_ms FROM runs
         WHERE workflow = ? AND status = 'succeeded'",
    )
    .bind(workflow)
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    stored(rows)
}

/// One read-only connection to the SQLite state file `state`.
async fn read_only(state: &Path) -> sqlx::SqlitePool {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(state)
        .read_only(true);
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap()
}

async fn stored_postgres(url: &str, workflow: &str) -> Vec<Stored> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap();
    let rows: Vec<(String, String, Option<i64>, Option<i64>)> = sqlx::query_as(
        "SELECT run_id, input, admitted_ms, finished_ms FROM runs
         WHERE workflow = $1 AND status = 'succeeded'",
    )
    .bind(workflow)
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    stored(rows)
}

fn stored(rows: Vec<(String, String, Option<i64>, Option<i64>)>) -> Vec<Stored> {
    rows.into_iter()
        .map(|(id, input, admitted, finished)| {
            let admitted = admitted.unwrap_or_else(|| panic!("run {id} was never admitted"));
            let finished = finished.unwrap_or_else(|| panic!("run {id} never finished"));
            (
                id,
                serde_json::from_str(&input).unwrap(),
                admitted,
                finished,
            )
        })
        .collect()
}

/// The most runs of `runs` that were running (admitted, not yet finished)
/// at one moment. A run that ends in the millisecond another is admitted
/// counts as gone: the admission waited for that end's commit.
fn most_at_once<'a>(runs: impl Iterator<Item = &'a Stored>) -> usize {
    let mut moments: Vec<(i64, i32)> = Vec::new();
    for (_, _, admitted, finished) in runs {
        moments.push((*admitted, 1));
        moments.push((*finished, -1));
    }
    moments.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, change) in moments {
        now += change;
        most = most.max(now);
    }
    most as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_concurrency_key_holds_runs_past_its_limit_and_lets_other_keys_through() {
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("state.db");
    let serve = Serve::start(config, &["--state", db.to_str().unwrap()]);
    let mut ids = Vec::new();
    let mut queued = Vec::new();
    for _ in 0..8 {
        let run = start(&serve, "keyed", json!({"k": "a", "ms": 300})).await;
        if run["status"] == "queued" {
            queued.push(run.clone());
        }
        ids.push(run["run_id"].as_str().unwrap().to_owned());
    }
    let mut others = Vec::new();
    for _ in 0..2 {
        let run = start(&serve, "keyed", json!({"k": "b", "ms": 300})).await;
        assert_eq!(run["status"], "running", "key b is not held up by a: {run}");
        others.push(run["run_id"].as_str().unwrap().to_owned());
    }
    // Six of the eight (at least: a first one may have ended by now) wait.
    assert!(queued.len() >= 5, "{queued:?}");
    let waiting = call(&serve, "workflow.get", json!({"run_id": ids[7]})).await;
    assert_eq!(waiting["status"], "queued", "{waiting}");
    assert_eq!(
        waiting["queued_reason"], "concurrency: key \"a\" has 2 of 2 running",
        "{waiting}"
    );
    let listed = call(
        &serve,
        "workflow.list",
        json!({"workflow": "keyed", "status": "queued"}),
    )
    .await;
    let listed = listed["runs"].as_array().unwrap();
    assert!(!listed.is_empty());
    assert!(listed.iter().all(|r| r["queued_reason"].is_string()));
    let status = call(&serve, "host.status", json!({})).await;
    assert!(
        status["state"]["runs_queued"].as_u64().unwrap() >= 1,
        "{status}"
    );

    wait_all(&serve, &ids, Duration::from_secs(60)).await;
    wait_all(&serve, &others, Duration::from_secs(10)).await;
    let runs = stored_sqlite(&db, "keyed").await;
    let of = |key: &'static str| runs.iter().filter(move |r| r.1["k"] == key);
    assert_eq!(most_at_once(of("a")), 2, "{runs:?}");
    // Both runs of b ran while a's queue was still long.
    let last_a = of("a").map(|r| r.2).max().unwrap();
    assert!(of("b").all(|r| r.2 < last_a), "{runs:?}");
    // Its queue drained: the gauge says so.
    let (_, metrics) = serve.get("/metrics", None).await;
    assert!(
        metrics.contains("wf_runs_queued{workflow=\"keyed\"} 0"),
        "{metrics}"
    );
}

/// A run held back by its full concurrency key does not hold back runs of
/// other keys that share a `rate` with it (the rate is not full).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_key_holds_back_only_its_own_runs() {
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("state.db");
    let serve = Serve::start(config, &["--state", db.to_str().unwrap()]);
    let a1 = start(&serve, "mixed", json!({"k": "a", "ms": 1500})).await;
    let a2 = start(&serve, "mixed", json!({"k": "a", "ms": 0})).await;
    assert_eq!(a2["status"], "queued", "{a2}");
    let b1 = start(&serve, "mixed", json!({"k": "b", "ms": 0})).await;
    let ids: Vec<String> = [&a1, &a2, &b1]
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_owned())
        .collect();
    wait_all(&serve, &ids, Duration::from_secs(30)).await;
    let runs = stored_sqlite(&db, "mixed").await;
    let of = |id: &str| runs.iter().find(|r| r.0 == id).unwrap().clone();
    let (a1, b1) = (of(&ids[0]), of(&ids[2]));
    // b was let in while a's first run still held a's slot.
    assert!(b1.2 < a1.3, "b admitted at {}, a1 ended at {}", b1.2, a1.3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_higher_priority_run_queued_later_is_admitted_first() {
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("state.db");
    let serve = Serve::start(config, &["--state", db.to_str().unwrap()]);
    let first = start(&serve, "ranked", json!({"p": 0, "ms": 800})).await;
    assert_eq!(first["status"], "running", "{first}");
    let mut ids = vec![first["run_id"].as_str().unwrap().to_owned()];
    for (p, name) in [(0, "low-1"), (0, "low-2"), (10, "high")] {
        let run = start(&serve, "ranked", json!({"p": p, "ms": 50, "name": name})).await;
        assert_eq!(run["status"], "queued", "{run}");
        let run = call(&serve, "workflow.get", json!({"run_id": run["run_id"]})).await;
        assert_eq!(run["queued_reason"], "concurrency: has 1 of 1 running");
        ids.push(run["run_id"].as_str().unwrap().to_owned());
    }
    wait_all(&serve, &ids, Duration::from_secs(30)).await;
    let mut runs = stored_sqlite(&db, "ranked").await;
    runs.sort_by_key(|r| r.2);
    let order: Vec<&str> = runs
        .iter()
        .skip(1)
        .map(|r| r.1["name"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["high", "low-1", "low-2"]);
    assert_eq!(most_at_once(runs.iter()), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_admits_its_limit_per_window() {
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("state.db");
    let serve = Serve::start(config, &["--state", db.to_str().unwrap()]);
    let mut ids = Vec::new();
    for i in 0..9 {
        let run = start(&serve, "paced", json!({"i": i})).await;
        ids.push(run["run_id"].as_str().unwrap().to_owned());
        if i == 8 {
            assert_eq!(run["status"], "queued", "{run}");
            let run = call(&serve, "workflow.get", json!({"run_id": run["run_id"]})).await;
            assert_eq!(run["queued_reason"], "rate: used 3 of 3 in 2s", "{run}");
        }
    }
    wait_all(&serve, &ids, Duration::from_secs(30)).await;
    let mut admitted: Vec<i64> = stored_sqlite(&db, "paced")
        .await
        .iter()
        .map(|r| r.2)
        .collect();
    admitted.sort();
    // The store admits a fourth run only once the first has left the
    // window: exact, whatever the machine's load.
    for i in 3..admitted.len() {
        assert!(
            admitted[i] - admitted[i - 3] >= 2000,
            "runs {} and {i} were admitted {} ms apart: {admitted:?}",
            i - 3,
            admitted[i] - admitted[i - 3]
        );
    }
    // So nine runs took at least three windows.
    assert!(admitted[8] - admitted[0] >= 4000, "{admitted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_run_can_be_cancelled_and_start_waits_through_the_queue() {
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("state.db");
    let serve = Serve::start(config, &["--state", db.to_str().unwrap()]);
    let first = start(&serve, "ranked", json!({"ms": 600})).await;
    let queued = start(&serve, "ranked", json!({"ms": 10})).await;
    assert_eq!(queued["status"], "queued", "{queued}");
    let cancelled = call(
        &serve,
        "workflow.cancel",
        json!({"run_id": queued["run_id"]}),
    )
    .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    // A priority that is not an integer refuses the start, as a bad input.
    let refused = serve
        .rpc(
            "workflow.start",
            json!({"workflow": "ranked", "input": {"p": "gold"}}),
            None,
        )
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("`priority`"), "{message}");
    let step = &cancelled["steps"][0];
    assert_eq!(step["status"], "cancelled", "{cancelled}");
    assert!(step["started_at"].is_null(), "it never ran: {cancelled}");
    // A start that waits goes through the queue behind the first run.
    let waited = call(
        &serve,
        "workflow.start",
        json!({"workflow": "ranked", "input": {"ms": 10}, "wait": true}),
    )
    .await;
    assert_eq!(waited["status"], "succeeded", "{waited}");
    let first = call(&serve, "workflow.get", json!({"run_id": first["run_id"]})).await;
    assert_eq!(first["status"], "succeeded", "{first}");
    let runs = stored_sqlite(&db, "ranked").await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(most_at_once(runs.iter()), 1, "{runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_run_goes_back_to_the_queue() {
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("state.db");
    let serve = Serve::start(config, &["--state", db.to_str().unwrap()]);
    let first = start(&serve, "ranked", json!({"ms": 1000})).await;
    let cancelled = call(
        &serve,
        "workflow.cancel",
        json!({"run_id": first["run_id"]}),
    )
    .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let holder = start(&serve, "ranked", json!({"ms": 800})).await;
    assert_eq!(holder["status"], "running", "{holder}");
    let retried = call(&serve, "workflow.retry", json!({"run_id": first["run_id"]})).await;
    assert_eq!(retried["status"], "queued", "{retried}");
    let ids = [holder, first].map(|r| r["run_id"].as_str().unwrap().to_owned());
    wait_all(&serve, &ids, Duration::from_secs(30)).await;
    let runs = stored_sqlite(&db, "ranked").await;
    assert_eq!(most_at_once(runs.iter()), 1, "{runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_run_survives_a_killed_server_and_runs_after_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("state.db");
    let args = ["--state", db.to_str().unwrap()];
    let mut serve = Serve::start(config, &args);
    let first = start(&serve, "ranked", json!({"ms": 1500})).await;
    let queued = start(&serve, "ranked", json!({"ms": 10})).await;
    assert_eq!(queued["status"], "queued", "{queued}");
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
    let serve = Serve::start(config, &args);
    let ids = [first, queued].map(|r| r["run_id"].as_str().unwrap().to_owned());
    wait_all(&serve, &ids, Duration::from_secs(30)).await;
    let runs = stored_sqlite(&db, "ranked").await;
    assert_eq!(most_at_once(runs.iter()), 1, "{runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_concurrency_key_holds_across_two_postgres_workers() {
    let pg = TestPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let url = pg.url();
    let worker = || {
        let config = config.clone();
        Serve::start(move |_| config, &["--state", &url])
    };
    let (a, b) = (worker(), worker());
    let mut ids = Vec::new();
    for i in 0..16 {
        let serve = if i % 2 == 0 { &a } else { &b };
        let run = start(serve, "keyed", json!({"k": "one", "ms": 250})).await;
        ids.push(run["run_id"].as_str().unwrap().to_owned());
    }
    // Runs queued through either worker show, with their reason, on the
    // other (eight waves of 250 ms: the last ones still wait).
    let mut seen = Vec::new();
    for id in &ids[12..] {
        seen.push(call(&b, "workflow.get", json!({"run_id": id})).await);
    }
    assert!(
        seen.iter().any(|r| r["status"] == "queued"
            && r["queued_reason"] == "concurrency: key \"one\" has 2 of 2 running"),
        "{seen:?}"
    );
    wait_all(&a, &ids, Duration::from_secs(90)).await;
    let runs = stored_postgres(&pg.url(), "keyed").await;
    assert_eq!(runs.len(), 16);
    assert_eq!(most_at_once(runs.iter()), 2, "{runs:?}");
    let status = call(&a, "host.status", json!({})).await;
    assert_eq!(status["state"]["runs_queued"], 0, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_held_by_a_killed_worker_frees_once_another_worker_ends_its_run() {
    let pg = TestPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let url = pg.url();
    let worker = || {
        let config = config.clone();
        Serve::start(move |_| config, &["--state", &url])
    };
    // `a` alone claims the first run (its lease is 2 s) and starts its step.
    let mut a = worker();
    let first = start(&a, "ranked", json!({"ms": 1500})).await;
    let queued = start(&a, "ranked", json!({"ms": 10})).await;
    assert_eq!(queued["status"], "queued", "{queued}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let run = call(&a, "workflow.get", json!({"run_id": first["run_id"]})).await;
        if run["steps"][0]["status"] == "running" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first run never started: {run}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = worker();
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    // `b` claims the first run once its lease expires, runs its step again,
    // and the run's end lets the queued one in.
    let ids = [first, queued].map(|r| r["run_id"].as_str().unwrap().to_owned());
    let records = wait_all(&b, &ids, Duration::from_secs(60)).await;
    let first = call(&b, "workflow.get", json!({"run_id": ids[0]})).await;
    assert_eq!(first["steps"][0]["attempts"], 2, "{first}");
    assert_eq!(records.len(), 2);
    let runs = stored_postgres(&pg.url(), "ranked").await;
    assert_eq!(most_at_once(runs.iter()), 1, "{runs:?}");
}

/// The run ids of `replies` (workflow.start results), in order.
fn ids_of(replies: &[Value]) -> Vec<String> {
    replies
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_owned())
        .collect()
}

/// The `run.debounced` events of `run_id`.
async fn joins_of(serve: &Serve, run_id: &str) -> usize {
    let (status, body) = serve
        .get(&format!("/runs/{run_id}/events?after=0"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    body.matches("event: run.debounced").count()
}

/// Five starts with one debounce key within its period make one run,
/// with the last start's input, begun a period after that last start;
/// two keys make two runs. Every start answers with its run's id; the
/// run waits `queued`, saying why and until when.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_starts_with_one_debounce_key_make_one_run_with_the_last_input() {
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("state.db");
    let serve = Serve::start(config, &["--state", db.to_str().unwrap()]);
    let mut a = Vec::new();
    let mut b = Vec::new();
    // When each key's last start was sent: the server's time of it is no
    // earlier. (Key `b` starts last at n = 2, well before `a` does.)
    let (mut last_a, mut last_b) = (0, 0);
    for n in 1..=5 {
        last_a = domain_now_ms();
        a.push(start(&serve, "bounced", json!({"k": "a", "n": n})).await);
        if n <= 2 {
            last_b = domain_now_ms();
            b.push(start(&serve, "bounced", json!({"k": "b", "n": n})).await);
        }
    }
    let (a, b) = (ids_of(&a), ids_of(&b));
    assert!(a.iter().all(|id| id == &a[0]), "{a:?}");
    assert!(b.iter().all(|id| id == &b[0]), "{b:?}");
    assert_ne!(a[0], b[0]);
    let waiting = call(&serve, "workflow.get", json!({"run_id": a[0]})).await;
    assert_eq!(waiting["status"], "queued", "{waiting}");
    assert!(
        waiting["queued_reason"]
            .as_str()
            .unwrap()
            .starts_with("debounce: starts with key \"a\" until "),
        "{waiting}"
    );
    let done = wait_all(
        &serve,
        &[a[0].clone(), b[0].clone()],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(done[0]["input"], json!({"k": "a", "n": 5}));
    assert_eq!(done[1]["input"], json!({"k": "b", "n": 2}));
    assert_eq!(joins_of(&serve, &a[0]).await, 4);
    let runs = stored_sqlite(&db, "bounced").await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    for (id, _, admitted, _) in &runs {
        let last_start = if *id == a[0] { last_a } else { last_b };
        assert!(
            *admitted >= last_start + 1000 - 50,
            "run {id} began {} ms after its key's last start, within the period",
            admitted - last_start
        );
    }
    // The next start with key `a` makes a new run.
    let later = start(&serve, "bounced", json!({"k": "a", "n": 6})).await;
    assert_ne!(later["run_id"], a[0]);
}

fn domain_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A steady stream of starts, closer together than the period, still makes
/// a run every `max_wait`; a debounced run survives a killed server, and a
/// start after the restart still joins it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_wait_runs_a_steady_stream_and_a_debounced_run_survives_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("state.db");
    let args = ["--state", db.to_str().unwrap()];
    let mut serve = Serve::start(config, &args);
    let began = Instant::now();
    let mut replies = Vec::new();
    while began.elapsed() < Duration::from_millis(3200) {
        replies.push(start(&serve, "steady", json!({"n": replies.len()})).await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut ids = ids_of(&replies);
    ids.dedup();
    assert!(
        (2..=4).contains(&ids.len()),
        "{} starts over 3.2 s made {} runs: {ids:?}",
        replies.len(),
        ids.len()
    );
    wait_all(&serve, &ids, Duration::from_secs(30)).await;
    // Each run but the last began at its first start plus `max_wait`
    // (1.5 s), though starts kept coming closer than the period.
    let pool = read_only(&db).await;
    let waits: Vec<(String, i64)> = sqlx::query_as(
        "SELECT run_id, admitted_ms - created_ms FROM runs WHERE workflow = 'steady'
         ORDER BY created_ms",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert_eq!(waits.len(), ids.len(), "{waits:?}");
    for (id, waited) in &waits[..waits.len() - 1] {
        assert!(
            // Not before `max_wait`, and well before the stream ended
            // (3.2 s, plus the period: when it would begin without it).
            (1450..3500).contains(waited),
            "run {id} began {waited} ms after its first start: {waits:?}"
        );
    }

    // Killed while a debounced run waits; a start after the restart joins it.
    let first = start(&serve, "bounced", json!({"k": "z", "n": 1})).await;
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
    let serve = Serve::start(config, &args);
    let second = start(&serve, "bounced", json!({"k": "z", "n": 2})).await;
    assert_eq!(second["run_id"], first["run_id"], "{second}");
    let id = first["run_id"].as_str().unwrap().to_owned();
    let done = wait_all(&serve, &[id], Duration::from_secs(30)).await;
    assert_eq!(done[0]["input"], json!({"k": "z", "n": 2}));
}

/// Starts with one key made through two PostgreSQL workers, alternately,
/// collapse into one run, which one of them drives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_debounce_key_holds_across_two_postgres_workers() {
    let pg = TestPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let url = pg.url();
    let worker = || {
        let config = config.clone();
        Serve::start(move |_| config, &["--state", &url])
    };
    let (a, b) = (worker(), worker());
    let mut replies = Vec::new();
    for n in 0..8 {
        let serve = if n % 2 == 0 { &a } else { &b };
        replies.push(start(serve, "bounced", json!({"k": "shared", "n": n})).await);
    }
    let ids = ids_of(&replies);
    assert!(ids.iter().all(|id| id == &ids[0]), "{ids:?}");
    let done = wait_all(&b, &ids[..1], Duration::from_secs(30)).await;
    assert_eq!(done[0]["input"], json!({"k": "shared", "n": 7}));
    let runs = stored_postgres(&pg.url(), "bounced").await;
    assert_eq!(runs.len(), 1, "{runs:?}");
}
