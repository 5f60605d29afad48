//! What durability costs a node, side by side in one process, with the state
//! in a SQLite file and the fixture MCP server as the upstream:
//!
//! 1. **Overhead**: a workflow step whose node makes 10 tool calls, as a
//!    plain node built against `wf:node@0.1.0` (`tests/compat/call-0.1.0.wasm`)
//!    and as a durable node (`tests/guests/durable.wasm`, which also reads
//!    the clock, journaled): median run time of each, and the ratio.
//! 2. **Resume**: the time from a signal to the run's end for a durable node
//!    that waits for it, having made no call before, and having made 100
//!    (each answered again from its journal when it runs again).
//! 3. **Parked**: `PARKED` durable nodes waiting for a signal at once; the
//!    process's resident memory above idle (once the instance slots are
//!    warm), and what each parked node adds (between a fifth and all).
//!
//! `cargo bench -p wf-host --bench durable` (`WF_BENCH_PARKED=n` for another
//! count of parked nodes).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wf_host::config::Config;
use wf_host::host::{Host, HostOptions};
use wf_host::pool::PoolConfig;
use wf_host::runtime::RuntimeConfig;
use wf_host::workflow::{Options, Workflows};

const WARMUP: usize = 5;
const ROUNDS: usize = 40;
const CALLS: usize = 10;
const RESUME_CALLS: usize = 100;
const PARKED: usize = 10_000;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn config(dir: &Path) -> Config {
    let text = format!(
        r#"[connections.fixture]
command = "wf-host"
args = ["fixture-server"]

[[workflows.plain.steps]]
id = "s"
component = "{plain}"
allow = ["fixture.echo"]

[[workflows.durable.steps]]
id = "s"
component = "{durable}"
allow = ["fixture.echo"]
"#,
        plain = root().join("tests/compat/call-0.1.0.wasm").display(),
        durable = root().join("tests/guests/durable.wasm").display(),
    );
    Config::parse(&text, &dir.join("bench.toml"), dir.to_owned()).unwrap()
}

async fn open(dir: &Path) -> Host {
    let config = config(dir);
    Host::open(
        &config,
        HostOptions {
            pool: PoolConfig {
                connections: config.connections.clone(),
                self_exe: Some(env!("CARGO_BIN_EXE_wf-host").into()),
                ..Default::default()
            },
            runtime: RuntimeConfig {
                cache_dir: Some(dir.join("cache")),
                ..Default::default()
            },
            workflows: Options {
                state: dir.join("state.db").display().to_string(),
                max_concurrent_steps: 64,
                ..Options::default()
            },
        },
    )
    .await
    .unwrap()
}

fn echo(n: usize) -> Value {
    json!({"call": "fixture.echo", "arguments": {"text": format!("call {n}")}})
}

/// The input of each node for a run of `calls` calls.
fn inputs(calls: usize) -> (Value, Value) {
    let before: Vec<Value> = (1..calls)
        .map(|n| json!({"capability": "fixture.echo", "arguments": {"text": format!("call {n}")}}))
        .collect();
    let plain =
        json!({"capability": "fixture.echo", "arguments": {"text": "last"}, "before": before});
    let mut actions: Vec<Value> = vec![json!({"clock": true})];
    actions.extend((0..calls).map(echo));
    (plain, json!({ "do": actions }))
}

async fn run(workflows: &std::sync::Arc<Workflows>, workflow: &str, input: Value) -> Duration {
    let start = Instant::now();
    let started = workflows.start(workflow, input, None).await.unwrap();
    let done = workflows
        .wait_run(&started.run_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(done.status.as_str(), "succeeded", "{done:?}");
    start.elapsed()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The process's resident memory, in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn overhead(workflows: &std::sync::Arc<Workflows>) {
    let (plain, durable) = inputs(CALLS);
    for _ in 0..WARMUP {
        run(workflows, "plain", plain.clone()).await;
        run(workflows, "durable", durable.clone()).await;
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    // Interleaved, so both see the same machine.
    for _ in 0..ROUNDS {
        a.push(run(workflows, "plain", plain.clone()).await);
        b.push(run(workflows, "durable", durable.clone()).await);
    }
    let (a, b) = (median(a), median(b));
    println!(
        "overhead   {CALLS} calls: plain 0.1.0 node {:.2} ms, durable node {:.2} ms: {:.2}x",
        ms(a),
        ms(b),
        b.as_secs_f64() / a.as_secs_f64()
    );
}

/// Signal to end of a durable node that made `calls` calls and then waits.
async fn resumed(workflows: &std::sync::Arc<Workflows>, calls: usize) -> Duration {
    let mut actions: Vec<Value> = (0..calls).map(echo).collect();
    actions.push(json!({"signal": "go"}));
    let started = workflows
        .start("durable", json!({ "do": actions }), None)
        .await
        .unwrap();
    // Parked: the run sleeps (holds no step slot) once its node waits.
    let deadline = Instant::now() + Duration::from_secs(30);
    while workflows.waiting() == 0 {
        assert!(Instant::now() < deadline, "the node never waited");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let start = Instant::now();
    workflows
        .signal(&started.run_id, "go", json!(1))
        .await
        .unwrap();
    let done = workflows
        .wait_run(&started.run_id, Duration::from_secs(60))
        .await
        .unwrap();
    let took = start.elapsed();
    assert_eq!(done.status.as_str(), "succeeded", "{done:?}");
    took
}

async fn resume(workflows: &std::sync::Arc<Workflows>) {
    let (mut none, mut many) = (Vec::new(), Vec::new());
    for round in 0..WARMUP + ROUNDS / 2 {
        let a = resumed(workflows, 0).await;
        let b = resumed(workflows, RESUME_CALLS).await;
        if round >= WARMUP {
            none.push(a);
            many.push(b);
        }
    }
    let (none, many) = (median(none), median(many));
    println!(
        "resume     signal to end: a node that made no call {:.2} ms, one that made {RESUME_CALLS} calls {:.2} ms ({:.1} µs a journaled call answered again)",
        ms(none),
        ms(many),
        many.saturating_sub(none).as_secs_f64() * 1e6 / RESUME_CALLS as f64
    );
}

/// Parks `count` more durable nodes; their run ids.
async fn park(workflows: &std::sync::Arc<Workflows>, count: usize) -> Vec<String> {
    let input = json!({"do": [echo(0), {"signal": "go"}]});
    let already = workflows.waiting();
    let mut ids = Vec::with_capacity(count);
    for _ in 0..count {
        ids.push(
            workflows
                .start("durable", input.clone(), None)
                .await
                .unwrap()
                .run_id,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while workflows.waiting() < already + count {
        assert!(
            Instant::now() < deadline,
            "only {} of {count} parked",
            workflows.waiting() - already
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ids
}

async fn parked(workflows: &std::sync::Arc<Workflows>) {
    let count: usize = std::env::var("WF_BENCH_PARKED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(PARKED);
    // The instance slots warm first (64 nodes at once), so that what
    // follows is what parked nodes hold.
    let warm: Vec<_> = (0..64)
        .map(|_| run(workflows, "durable", json!({"do": [echo(0)]})))
        .collect();
    futures::future::join_all(warm).await;
    let idle = rss_mib();
    let start = Instant::now();
    let mut ids = park(workflows, count / 5).await;
    let fifth = rss_mib();
    ids.extend(park(workflows, count - count / 5).await);
    let took = start.elapsed();
    let all = rss_mib();
    let each = (all - fifth) * 1024.0 / (count - count / 5) as f64;
    println!(
        "parked     {count} durable nodes waiting at once (parked in {:.1} s): RSS {:.0} MiB idle, {:.0} MiB with {}, {:.0} MiB with all: {:.0} MiB above idle ({:.1} KiB a parked node)",
        took.as_secs_f64(),
        idle,
        fifth,
        count / 5,
        all,
        all - idle,
        each
    );
    for id in &ids {
        let _ = workflows.cancel(id).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let host = open(dir.path()).await;
    let workflows = host.workflows().clone();
    overhead(&workflows).await;
    resume(&workflows).await;
    parked(&workflows).await;
    host.shutdown(Duration::from_secs(10)).await;
}
