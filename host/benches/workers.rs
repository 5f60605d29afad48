//! Runs per second of a three-step echo workflow with 1, 2 and 3 `wf-host
//! serve` workers on one PostgreSQL, next to one worker on a SQLite file, in
//! one run; and the claim-to-start latency (a run's creation to its first
//! step's start, p50/p99).
//!
//! `cargo bench -p wf-host --bench workers` starts a throwaway PostgreSQL
//! (Debian's `postgresql` package, as the tests do) and real worker processes.
//! Every worker and the load generator share this machine's cores, so read the
//! scaling as a lower bound.

// The tests' throwaway PostgreSQL; the bench uses only part of it.
#[allow(dead_code)]
#[path = "../../tests/common/postgres.rs"]
mod postgres;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

const RUNS: usize = 600;
const CLIENTS: usize = 16;
const IDLE_RUNS: usize = 100;

struct Worker {
    child: Child,
    url: String,
}

impl Worker {
    fn start(config: &Path, state: &str) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wf-host"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .args(["--state", state])
            .env_remove("WF_HOST_TOKEN")
            .env("WF_HOST_CACHE_DIR", config.parent().unwrap().join("cache"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines.next().expect("serve printed its address").unwrap();
            if let Some(rest) = line.strip_prefix("wf-host listening on ") {
                break rest.to_owned();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Worker { child, url }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(dir: &Path) -> PathBuf {
    let echo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/echo.wasm");
    let mut text = String::from("[runtime]\nlease = \"10s\"\n");
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        text += &format!(
            "[[workflows.three.steps]]\nid = \"{id}\"\ncomponent = \"{}\"\n",
            echo.display()
        );
        if i > 0 {
            text += &format!("needs = [\"{}\"]\n", ["a", "b", "c"][i - 1]);
        }
    }
    let path = dir.join("bench.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn rpc(client: &reqwest::Client, url: &str, method: &str, params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let text = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let reply: Value = serde_json::from_str(&text).unwrap();
    match reply.get("result") {
        Some(r) => r.clone(),
        None => panic!("{method}: {reply}"),
    }
}

fn ms(text: &str) -> f64 {
    humantime::parse_rfc3339(text)
        .unwrap()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

struct Result {
    label: String,
    runs_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Claim-to-start with one run at a time (no queue behind other runs).
    idle_p50_ms: f64,
    idle_p99_ms: f64,
}

fn percentiles(mut latencies: Vec<f64>) -> (f64, f64) {
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    (pct(0.50), pct(0.99))
}

/// A run's creation to its first step's start.
fn claim_to_start(run: &Value) -> f64 {
    ms(run["steps"][0]["started_at"].as_str().unwrap()) - ms(run["started_at"].as_str().unwrap())
}

/// `IDLE_RUNS` runs one at a time, through the workers in turn.
async fn idle_latency(client: &reqwest::Client, urls: &[String]) -> Vec<f64> {
    let mut latencies = Vec::new();
    for n in 0..IDLE_RUNS {
        let url = &urls[n % urls.len()];
        let run = rpc(
            client,
            url,
            "workflow.start",
            json!({"workflow": "three", "input": n, "wait": true}),
        )
        .await;
        assert_eq!(run["status"], "succeeded", "{run}");
        let id = run["run_id"].as_str().unwrap();
        latencies.push(claim_to_start(
            &rpc(client, url, "workflow.get", json!({"run_id": id})).await,
        ));
    }
    latencies
}

/// Starts `RUNS` runs through the workers in turn from `CLIENTS` concurrent
/// clients, waits for all, and measures.
async fn measure(label: &str, workers: &[Worker]) -> Result {
    let client = reqwest::Client::new();
    let urls: Vec<String> = workers.iter().map(|w| w.url.clone()).collect();
    // Warm every worker (component compile, pool of instances).
    for url in &urls {
        rpc(
            &client,
            url,
            "workflow.start",
            json!({"workflow": "three", "input": 0, "wait": true}),
        )
        .await;
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let (client, urls) = (client.clone(), urls.clone());
        tasks.spawn(async move {
            let mut ids = Vec::new();
            for n in (c..RUNS).step_by(CLIENTS) {
                let url = &urls[n % urls.len()];
                let r = rpc(
                    &client,
                    url,
                    "workflow.start",
                    json!({"workflow": "three", "input": n}),
                )
                .await;
                ids.push((url.clone(), r["run_id"].as_str().unwrap().to_owned()));
            }
            let mut records = Vec::new();
            for (url, id) in ids {
                let done = rpc(
                    &client,
                    &url,
                    "workflow.wait",
                    json!({"run_id": id, "timeout_ms": 120000}),
                )
                .await;
                assert_eq!(done["status"], "succeeded", "{done}");
                records.push(rpc(&client, &url, "workflow.get", json!({"run_id": id})).await);
            }
            records
        });
    }
    let mut latencies = Vec::new();
    while let Some(records) = tasks.join_next().await {
        for run in records.unwrap() {
            latencies.push(claim_to_start(&run));
        }
    }
    let elapsed = started.elapsed();
    let (p50_ms, p99_ms) = percentiles(latencies);
    let (idle_p50_ms, idle_p99_ms) = percentiles(idle_latency(&client, &urls).await);
    Result {
        label: label.to_owned(),
        runs_per_s: RUNS as f64 / elapsed.as_secs_f64(),
        p50_ms,
        p99_ms,
        idle_p50_ms,
        idle_p99_ms,
    }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    wf_host::pool::install_tls_provider();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let mut results = Vec::new();
    {
        let state = dir.path().join("state.db").display().to_string();
        let workers = vec![Worker::start(&config, &state)];
        results.push(measure("SQLite, 1 worker", &workers).await);
    }
    let pg = postgres::TestPostgres::start();
    for n in 1..=3 {
        let url = pg.another_database();
        let workers: Vec<Worker> = (0..n).map(|_| Worker::start(&config, &url)).collect();
        results.push(
            measure(
                &format!("PostgreSQL, {n} worker{}", if n > 1 { "s" } else { "" }),
                &workers,
            )
            .await,
        );
        drop(workers);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let base = results[1].runs_per_s;
    println!("{RUNS} runs of a three-step echo workflow, {CLIENTS} clients");
    println!(
        "| setup | runs/s | vs PostgreSQL, 1 worker | claim-to-start p50 / p99 under load | one run at a time p50 / p99 |"
    );
    println!("|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {} | {:.0} | {:.2}× | {:.1} / {:.1} ms | {:.1} / {:.1} ms |",
            r.label,
            r.runs_per_s,
            r.runs_per_s / base,
            r.p50_ms,
            r.p99_ms,
            r.idle_p50_ms,
            r.idle_p99_ms
        );
    }
}
