//! Runs per second of a three-step echo workflow with 1, 2 and 3 `wf-host
//! serve` workers on one PostgreSQL, next to one worker on a SQLite file, in
//! one run; and the claim-to-start latency (a run's creation to its first
//! step's start, p50/p99).
//!
//! `cargo bench -p wf-host --bench workers` starts a throwaway PostgreSQL
//! (Debian's `postgresql` package, as the tests do) and real worker processes.
//! Every worker and the load generator share this machine's cores, so read the
//! scaling as a lower bound.
//!
//! On PostgreSQL it also counts the database's work per run, over the whole
//! measurement (the warm-up, the loaded runs and the runs one at a time):
//! statements (`pg_stat_statements`; with the extended protocol each is one
//! round trip, `BEGIN` and `COMMIT` included) and committed transactions
//! (`pg_stat_database`). `WF_BENCH_STATEMENTS=1` prints the statements by
//! calls per run.
//!
//! `WF_BENCH_HOST=<path>` runs the workers from another build of `wf-host`,
//! and `WF_BENCH_ECHO=<path>` gives them another tree's `echo.wasm` (a build
//! runs the node its own tree built; `bench/compare.sh` sets both).
//!
//! `WF_BENCH_CPU=0.3` (a share of one CPU) runs the PostgreSQL rows again
//! with each worker capped to that share (a cgroup's CPU quota), on a CPU of
//! its own apart from the database's (the database on CPU 0, the workers and
//! the load on the others), and reports runs per second per worker-CPU: on
//! a machine with few cores this shows how workers scale when they do not
//! take CPU from the database or from each other. It needs a writable
//! cgroup-v1 `cpu` hierarchy (or refuses, saying so) and `taskset`.

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
    /// The cgroup that caps its CPU, removed when it ends.
    cgroup: Option<PathBuf>,
}

/// Where the workers' CPU caps go (cgroup v1).
const CPU_CGROUPS: &str = "/sys/fs/cgroup/cpu";

impl Worker {
    /// A worker held to `cap` of one CPU, on the CPUs after the first.
    fn capped(config: &Path, state: &str, cap: f64, n: usize) -> Worker {
        let mut worker = Worker::start(config, state);
        let group = PathBuf::from(CPU_CGROUPS).join(format!("wf-bench-{}-{n}", std::process::id()));
        let cpus = others();
        std::fs::create_dir(&group)
            .unwrap_or_else(|e| panic!("WF_BENCH_CPU needs a writable {CPU_CGROUPS}: {e}"));
        // Removed with the worker from here on, whatever fails next.
        worker.cgroup = Some(group.clone());
        let period = 100_000;
        std::fs::write(group.join("cpu.cfs_period_us"), period.to_string()).unwrap();
        std::fs::write(
            group.join("cpu.cfs_quota_us"),
            ((cap * f64::from(period)) as u64).to_string(),
        )
        .unwrap();
        std::fs::write(group.join("cgroup.procs"), worker.child.id().to_string()).unwrap();
        pin(worker.child.id(), &cpus);
        worker
    }

    fn start(config: &Path, state: &str) -> Worker {
        // WF_BENCH_HOST: another build's binary, to compare two in one session.
        let bin = std::env::var_os("WF_BENCH_HOST")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_wf-host").into());
        let mut child = Command::new(bin)
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
        Worker {
            child,
            url,
            cgroup: None,
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(group) = &self.cgroup {
            let _ = std::fs::remove_dir(group);
        }
    }
}

/// The CPUs after the first, as `taskset` takes them (counted once, before
/// this process is pinned to them).
fn others() -> String {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cpus = *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    assert!(cpus >= 2, "WF_BENCH_CPU needs 2 CPUs or more");
    format!("1-{}", cpus - 1)
}

/// Every thread of `pid` (and of what it starts later) on `cpus`.
fn pin(pid: u32, cpus: &str) {
    let status = Command::new("taskset")
        .args(["-a", "-c", "-p", cpus, &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("run taskset");
    assert!(status.success(), "taskset {cpus} {pid} failed");
}

fn config(dir: &Path) -> PathBuf {
    let echo = std::env::var_os("WF_BENCH_ECHO").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/echo.wasm"),
        PathBuf::from,
    );
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
    /// PostgreSQL: statements per run, and the runs measured (the
    /// transactions are counted once the workers have gone: a backend's
    /// counts reach the statistics at the latest when it exits).
    statements: Option<(f64, f64)>,
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
async fn measure(label: &str, workers: &[Worker], db: Option<&postgres::TestPostgres>) -> Result {
    if let Some(db) = db {
        db.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
        db.psql("SELECT pg_stat_statements_reset()");
    }
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
    let runs = (urls.len() + RUNS + IDLE_RUNS) as f64;
    let statements = db.map(|db| {
        let statements: f64 = db
            .psql(
                "SELECT sum(calls) FROM pg_stat_statements
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND query NOT LIKE '%pg_stat%'",
            )
            .parse()
            .unwrap();
        if std::env::var_os("WF_BENCH_STATEMENTS").is_some() {
            eprintln!("{label}: statements per run (calls, execution time)");
            let top = db.psql(&format!(
                "SELECT round(calls / {runs}, 2) || ' calls, ' || round((total_exec_time / {runs} * 1000)::numeric, 1) || ' µs: ' || regexp_replace(left(query, 140), '\\s+', ' ', 'g')
                 FROM pg_stat_statements
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                 ORDER BY calls DESC LIMIT 25"
            ));
            eprintln!("{top}");
        }
        (statements / runs, runs)
    });
    Result {
        label: label.to_owned(),
        runs_per_s: RUNS as f64 / elapsed.as_secs_f64(),
        statements,
        p50_ms,
        p99_ms,
        idle_p50_ms,
        idle_p99_ms,
    }
}

/// Transactions committed in the bench's database so far.
fn commits(db: &postgres::TestPostgres) -> u64 {
    db.psql("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        .parse()
        .unwrap()
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
        results.push(measure("SQLite, 1 worker", &workers, None).await);
    }
    let pg = postgres::TestPostgres::start();
    for n in 1..=3 {
        let db = pg.another();
        let workers: Vec<Worker> = (0..n).map(|_| Worker::start(&config, &db.url())).collect();
        // After the workers' start: their migrations are not the load.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = commits(&db);
        let mut result = measure(
            &format!("PostgreSQL, {n} worker{}", if n > 1 { "s" } else { "" }),
            &workers,
            Some(&db),
        )
        .await;
        drop(workers);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        if let Some((statements, runs)) = result.statements {
            result.statements = Some((statements, (commits(&db) - before) as f64 / runs));
        }
        results.push(result);
    }
    let capped = std::env::var("WF_BENCH_CPU")
        .ok()
        .map(|cap| match cap.parse::<f64>() {
            Ok(cap) if (0.01..=1.0).contains(&cap) => cap,
            _ => panic!("WF_BENCH_CPU is a share of one CPU from 0.01 to 1, e.g. 0.3"),
        });
    let mut per_cpu = Vec::new();
    if let Some(cap) = capped {
        // The database on CPU 0 (its backends inherit it), the workers and
        // this load on the others.
        let cpus = others();
        pin(pg.server_pid().expect("the server runs"), "0");
        pin(std::process::id(), &cpus);
        for n in 1..=3 {
            let db = pg.another();
            let workers: Vec<Worker> = (0..n)
                .map(|i| Worker::capped(&config, &db.url(), cap, i))
                .collect();
            let result = measure(&format!("PostgreSQL, {n} × {cap} CPU"), &workers, None).await;
            per_cpu.push((n, result.runs_per_s, result.runs_per_s / (n as f64 * cap)));
        }
    }
    let base = results[1].runs_per_s;
    println!("{RUNS} runs of a three-step echo workflow, {CLIENTS} clients");
    println!(
        "| setup | runs/s | vs PostgreSQL, 1 worker | statements / transactions per run | claim-to-start p50 / p99 under load | one run at a time p50 / p99 |"
    );
    println!("|---|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {} | {:.0} | {:.2}× | {} | {:.1} / {:.1} ms | {:.1} / {:.1} ms |",
            r.label,
            r.runs_per_s,
            r.runs_per_s / base,
            r.statements
                .map_or("".to_owned(), |(s, t)| format!("{s:.1} / {t:.1}")),
            r.p50_ms,
            r.p99_ms,
            r.idle_p50_ms,
            r.idle_p99_ms
        );
    }
    if let Some(cap) = capped {
        println!();
        println!("Each worker capped to {cap} CPU, the database on a CPU of its own:");
        println!("| workers | runs/s | runs/s per worker-CPU | vs 1 worker |");
        println!("|---|---|---|---|");
        let base = per_cpu[0].1;
        for (n, runs, per) in &per_cpu {
            println!("| {n} | {runs:.0} | {per:.0} | {:.2}× |", runs / base);
        }
    }
}
