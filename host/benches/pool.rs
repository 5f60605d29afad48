//! The MCP session pool against a fresh client session per call, and a node's
//! tool call through the capability layer against a bare rmcp client.
//!
//! `cargo bench -p wf-host --bench pool` measures, in one process, in
//! interleaved rounds, and prints median and p99 per mode plus the ratios:
//!
//! 1. pooled `Pool::call_tool` vs a fresh rmcp session per call (spawn,
//!    `initialize`, `echo`, close and reap) against `wf-host fixture-server`;
//! 2. the same against a Python (`mcp` on PyPI) and a Node
//!    (`@modelcontextprotocol/sdk`) echo server over stdio, installed by
//!    `bench/setup.sh`; each is skipped with a message when not installed;
//! 3. `Runtime::run` of `plugins/call.wasm` calling `fixture.echo` through the
//!    pool (a), vs a bare rmcp client loop on one persistent session (b), vs
//!    `Pool::call_tool` alone (c). To show where (a)'s time goes it also times
//!    `echo.wasm` with no call (d), the pool's `CapabilityBackend::call_tool`
//!    with its catalog and schema checks (e), `call.wasm` against an in-process
//!    backend that answers at once (f) or from another task (g), and the
//!    backend call as seen from inside (a) (a'), and (a) with the run on a
//!    thread of its own that it never leaves (h).
//! 4. (a) and (b) again against every server, the Python and Node ones
//!    included: what a node adds to a real server's round trip. Here the
//!    bare client speaks the revision the pool negotiates (2026-07-28 where
//!    the server has it), so both sides pay the same per-request work.
//!
//! `WF_BENCH_PART=3` skips parts 1 and 2. For profiling part 3,
//! `WF_BENCH_ONLY=<0..6>` runs one of its modes ((a) is 0) and
//! `WF_BENCH_ROUNDS=N` sets its rounds.
//!
//! `WF_BENCH_RUNTIME=current-thread` runs everything on a current-thread tokio
//! runtime instead of the default multi-thread one; `WF_BENCH_WORKERS=N` sets
//! the multi-thread runtime's workers (by default one per core).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, ProtocolVersion,
};
use rmcp::service::{Peer, RoleClient};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, ServiceExt};
use serde_json::{Map, Value, json};
use wf_host::capability::{CapabilityBackend, CapabilityEntry, CapabilityError};
use wf_host::config::ConnectionConfig;
use wf_host::grants::Grants;
use wf_host::pool::{Pool, PoolConfig};
use wf_host::runtime::{Node, RunError, RunOptions, Runtime, RuntimeConfig};

/// Parts 1 and 2: rounds, pooled samples per round and server.
const ROUNDS: usize = 5;
const POOLED_PER_ROUND: usize = 200;
/// Fresh sessions per round: the wf-host fixture is a small Rust binary; the
/// Python and Node servers cost 0.5–2 s each to start.
const FRESH_FIXTURE_PER_ROUND: usize = 10;
const FRESH_SCRIPT_PER_ROUND: usize = 6;
/// Part 3: rounds and samples per round and mode.
const NODE_ROUNDS: usize = 10;
const NODE_PER_ROUND: usize = 400;
const WARMUP: usize = 200;

const POOLED_GOAL: f64 = 20.0;
/// Part 3: what a node adds to the fixture's round trip, (a) − (b), in µs.
const NODE_GOAL_US: f64 = 50.0;
/// Part 4: (a) / (b) against the Python and Node SDK servers.
const SDK_NODE_GOAL: f64 = 1.1;
/// Part 4: rounds and samples per round, mode and server.
const SERVER_ROUNDS: usize = 10;
const SERVER_PER_ROUND: usize = 100;
/// Generous: a cold Python interpreter importing `mcp` takes seconds on a busy
/// machine.
const FRESH_TIMEOUT: Duration = Duration::from_secs(30);

/// A stdio MCP server with an `echo {text}` tool.
struct Server {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
    fresh_per_round: usize,
}

/// The bench's rmcp client: the same identity and protocol version as the pool's.
#[derive(Clone)]
struct BenchClient;

impl ClientHandler for BenchClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("wf-host-bench", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }
}

fn main() {
    let current_thread = std::env::var("WF_BENCH_RUNTIME").is_ok_and(|v| v == "current-thread");
    let workers = std::env::var("WF_BENCH_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let rt = if current_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
    }
    .expect("tokio runtime");
    println!(
        "configuration: tokio {} (enable_all; the bench loop runs in a spawned task, as a request handler does), wf-host {}",
        if current_thread {
            "current-thread".to_owned()
        } else {
            format!("multi-thread, {workers} worker threads")
        },
        wf_host_bin().display()
    );
    println!(
        "  pool: stdio connections with default settings; fresh and bare clients: rmcp TokioChildProcess, protocol 2025-11-25, stderr discarded"
    );
    // The loop runs in a task, not in `block_on` itself: in `wf-host serve`
    // every call comes from a task on a worker thread (an RPC handler, a
    // workflow step), and a `block_on` future on the main thread pays a
    // cross-thread wake-up per answer that no caller there pays.
    // `WF_BENCH_PART=3` runs part 3 alone (for comparing two builds).
    let part3_only = std::env::var("WF_BENCH_PART").is_ok_and(|v| v == "3");
    rt.block_on(async {
        tokio::spawn(async move {
            let servers = servers().await;
            let pool = pool_for(&servers);
            if !part3_only {
                pooled_vs_fresh(&pool, &servers).await;
            }
            node_vs_bare(&pool).await;
            node_vs_bare_per_server(&pool, &servers).await;
            pool.shutdown().await;
        })
        .await
        .unwrap();
    });
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

fn wf_host_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_wf-host"))
}

/// The fixture, plus the Python and Node servers when installed and working.
async fn servers() -> Vec<Server> {
    let bench = repo_root().join("bench");
    let mut servers = vec![Server {
        name: "fixture",
        program: wf_host_bin(),
        args: vec!["fixture-server".into()],
        fresh_per_round: FRESH_FIXTURE_PER_ROUND,
    }];

    let python = std::env::var_os("WF_BENCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| bench.join("python-echo-server/.venv/bin/python"));
    let python_server = Server {
        name: "python",
        program: python.clone(),
        args: vec![path_arg(&bench.join("python-echo-server/server.py"))],
        fresh_per_round: FRESH_SCRIPT_PER_ROUND,
    };
    let python_hint = "run bench/setup.sh (python3 -m venv bench/python-echo-server/.venv && \
        bench/python-echo-server/.venv/bin/pip install -r bench/python-echo-server/requirements.txt)";
    if !python.exists() {
        println!(
            "skipped: python echo server: {} not found; {python_hint}",
            python.display()
        );
    } else if let Some(server) = probe(python_server, python_hint).await {
        servers.push(server);
    }

    let node_dir = bench.join("node-echo-server");
    let node = std::env::var_os("WF_BENCH_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("node"));
    let node_hint =
        "run bench/setup.sh (needs node >= 18 and npm: cd bench/node-echo-server && npm install)";
    if !node_dir
        .join("node_modules/@modelcontextprotocol/sdk")
        .exists()
    {
        println!(
            "skipped: node echo server: {}/node_modules/@modelcontextprotocol/sdk not installed; {node_hint}",
            node_dir.display()
        );
    } else if let Some(server) = probe(
        Server {
            name: "node",
            program: node,
            args: vec![path_arg(&node_dir.join("server.mjs"))],
            fresh_per_round: FRESH_SCRIPT_PER_ROUND,
        },
        node_hint,
    )
    .await
    {
        servers.push(server);
    }
    servers
}

fn path_arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// One fresh session, to find out whether the server works at all.
async fn probe(server: Server, hint: &str) -> Option<Server> {
    match fresh_call(&server).await {
        Ok(_) => Some(server),
        Err(e) => {
            println!(
                "skipped: {} echo server ({} {}): {e}; {hint}",
                server.name,
                server.program.display(),
                server.args.join(" ")
            );
            None
        }
    }
}

fn pool_for(servers: &[Server]) -> Pool {
    let connections: BTreeMap<String, ConnectionConfig> = servers
        .iter()
        .map(|s| {
            let command = if s.name == "fixture" {
                "wf-host".to_owned()
            } else {
                path_arg(&s.program)
            };
            let config = serde_json::from_value(json!({ "command": command, "args": s.args }))
                .expect("valid connection");
            (s.name.to_owned(), config)
        })
        .collect();
    Pool::new(PoolConfig {
        connections,
        self_exe: Some(wf_host_bin()),
        ..Default::default()
    })
}

fn hi() -> Map<String, Value> {
    let mut args = Map::new();
    args.insert("text".into(), Value::String("hi".into()));
    args
}

fn echo_params() -> CallToolRequestParams {
    CallToolRequestParams::new("echo").with_arguments(hi())
}

/// Whether a `CallToolResult` (as JSON) is the echo of `hi`.
fn is_echo(result: &Value) -> bool {
    result["content"][0]["text"] == "hi" && result["isError"] != true
}

/// A fresh client session: spawn, `initialize`, `echo`, close (the child is
/// reaped when `cancel` returns). Returns (time to the result, total time).
async fn fresh_call(server: &Server) -> Result<(Duration, Duration), String> {
    let start = Instant::now();
    let session = async {
        let mut cmd = tokio::process::Command::new(&server.program);
        cmd.args(&server.args).kill_on_drop(true);
        let (transport, _) = TokioChildProcess::builder(cmd)
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start: {e}"))?;
        let running = BenchClient
            .serve(transport)
            .await
            .map_err(|e| format!("initialize failed: {e}"))?;
        let result = running
            .peer()
            .call_tool(echo_params())
            .await
            .map_err(|e| format!("echo failed: {e}"))?;
        let to_result = start.elapsed();
        running
            .cancel()
            .await
            .map_err(|e| format!("close failed: {e}"))?;
        let total = start.elapsed();
        let result = serde_json::to_value(result).unwrap_or_default();
        if !is_echo(&result) {
            return Err(format!("unexpected echo result: {result}"));
        }
        Ok((to_result, total))
    };
    tokio::time::timeout(FRESH_TIMEOUT, session)
        .await
        .map_err(|_| format!("no answer within {}s", FRESH_TIMEOUT.as_secs()))?
}

/// Panics unless a run of `call.wasm` (`what`) answered the echo of `hi`.
fn assert_call_echo(result: Result<String, RunError>, what: &str) {
    let output = result.unwrap_or_else(|e| panic!("{what} failed: {e}"));
    let output: Value = serde_json::from_str(&output).expect("call.wasm output is JSON");
    assert!(is_echo(&output), "{what} output: {output}");
}

/// One `echo` on a bare client's session to `server`, timed and checked.
async fn bare_echo(peer: &Peer<RoleClient>, server: &str) -> Duration {
    let start = Instant::now();
    let result = peer.call_tool(echo_params()).await;
    let elapsed = start.elapsed();
    let result = serde_json::to_value(result.expect("bare echo")).unwrap_or_default();
    assert!(is_echo(&result), "bare echo on {server}: {result}");
    elapsed
}

async fn pooled_call(pool: &Pool, connection: &str) -> Duration {
    let start = Instant::now();
    let result = pool.call_tool(connection, "echo", hi(), None).await;
    let elapsed = start.elapsed();
    let result = result.unwrap_or_else(|e| panic!("pooled echo on `{connection}`: {e}"));
    assert!(is_echo(&result), "pooled echo on `{connection}`: {result}");
    elapsed
}

/// Parts 1 and 2.
async fn pooled_vs_fresh(pool: &Pool, servers: &[Server]) {
    for server in servers {
        for _ in 0..WARMUP {
            pooled_call(pool, server.name).await;
        }
    }
    let mut pooled: Vec<Vec<Duration>> = vec![Vec::new(); servers.len()];
    let mut fresh_result: Vec<Vec<Duration>> = vec![Vec::new(); servers.len()];
    let mut fresh_total: Vec<Vec<Duration>> = vec![Vec::new(); servers.len()];
    // Interleave rounds so drift on a noisy machine hits every mode alike.
    for _ in 0..ROUNDS {
        for (i, server) in servers.iter().enumerate() {
            for _ in 0..POOLED_PER_ROUND {
                pooled[i].push(pooled_call(pool, server.name).await);
            }
            for _ in 0..server.fresh_per_round {
                let (to_result, total) = fresh_call(server)
                    .await
                    .unwrap_or_else(|e| panic!("fresh session to {}: {e}", server.name));
                fresh_result[i].push(to_result);
                fresh_total[i].push(total);
            }
        }
    }

    println!();
    println!(
        "1+2. echo {{\"text\":\"hi\"}} over stdio: warm pool vs a fresh rmcp session per call ({ROUNDS} interleaved rounds)"
    );
    for (i, server) in servers.iter().enumerate() {
        let command = server
            .args
            .iter()
            .fold(server.program.display().to_string(), |cmd, a| cmd + " " + a);
        println!("  [{}] {command}", server.name);
        let p = Stats::of(&mut pooled[i]);
        let r = Stats::of(&mut fresh_result[i]);
        let t = Stats::of(&mut fresh_total[i]);
        p.print("pooled Pool::call_tool");
        r.print("fresh: spawn+init+echo");
        t.print("fresh: ... + close/reap");
        let ratio = t.median_us / p.median_us;
        println!(
            "    ratio fresh (incl. close) / pooled, median: {ratio:.0}x   (to result only: {:.0}x)   goal >= {POOLED_GOAL:.0}x: {}",
            r.median_us / p.median_us,
            verdict(ratio >= POOLED_GOAL)
        );
        if let Some(stats) = pool.connection_stats(server.name) {
            println!(
                "    pool: sessions_opened {} calls {} failures {}",
                stats.sessions_opened, stats.calls, stats.failures
            );
        }
    }
}

/// Answers `call_tool` in process, as the fixture's `echo` would: the node's
/// capability path without any I/O. With `hop`, the answer comes from another
/// task through a oneshot, so the host call is pending once, as a pooled one is.
struct InstantBackend {
    hop: bool,
}

#[async_trait::async_trait]
impl CapabilityBackend for InstantBackend {
    async fn call_tool(
        &self,
        _: &str,
        _: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        let result =
            json!({ "content": [{ "type": "text", "text": arguments["text"] }], "isError": false });
        if !self.hop {
            return Ok(result);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _ = tx.send(result);
        });
        rx.await
            .map_err(|_| CapabilityError::Unavailable("hop dropped".into()))
    }
    async fn read_resource(&self, _: &str, _: &str) -> Result<Value, CapabilityError> {
        Err(CapabilityError::Unavailable("instant backend".into()))
    }
    async fn get_prompt(
        &self,
        _: &str,
        _: &str,
        _: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        Err(CapabilityError::Unavailable("instant backend".into()))
    }
    async fn list(&self) -> Result<Vec<CapabilityEntry>, CapabilityError> {
        Ok(Vec::new())
    }
}

/// The pool, timing each `call_tool` as the node's host call sees it.
struct TimedBackend {
    pool: Pool,
    inside: std::sync::Mutex<Vec<Duration>>,
}

#[async_trait::async_trait]
impl CapabilityBackend for TimedBackend {
    async fn call_tool(
        &self,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        let start = Instant::now();
        let result = CapabilityBackend::call_tool(&self.pool, connection, tool, arguments).await;
        let elapsed = start.elapsed();
        self.inside.lock().unwrap().push(elapsed);
        result
    }
    async fn read_resource(&self, connection: &str, uri: &str) -> Result<Value, CapabilityError> {
        CapabilityBackend::read_resource(&self.pool, connection, uri).await
    }
    async fn get_prompt(
        &self,
        connection: &str,
        prompt: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        CapabilityBackend::get_prompt(&self.pool, connection, prompt, arguments).await
    }
    async fn list(&self) -> Result<Vec<CapabilityEntry>, CapabilityError> {
        CapabilityBackend::list(&self.pool).await
    }
}

/// Part 3.
async fn node_vs_bare(pool: &Pool) {
    let call_wasm = repo_root().join("plugins/call.wasm");
    let echo_wasm = repo_root().join("plugins/echo.wasm");
    let timed = Arc::new(TimedBackend {
        pool: pool.clone(),
        inside: std::sync::Mutex::default(),
    });
    let runtime = Arc::new(
        Runtime::new(RuntimeConfig::default(), timed.clone())
            .expect("runtime with the pool as backend"),
    );
    let node = runtime
        .load(&call_wasm)
        .unwrap_or_else(|e| panic!("{e}; build the guests with ./plugins/build.sh"));
    let echo_node = runtime
        .load(&echo_wasm)
        .unwrap_or_else(|e| panic!("{e}; build the guests with ./plugins/build.sh"));
    let instant = Runtime::new(
        RuntimeConfig::default(),
        Arc::new(InstantBackend { hop: false }),
    )
    .expect("runtime with an in-process backend");
    let instant_node = instant.load(&call_wasm).expect("call.wasm");
    let hop = Runtime::new(
        RuntimeConfig::default(),
        Arc::new(InstantBackend { hop: true }),
    )
    .expect("runtime with an in-process backend");
    let hop_node = hop.load(&call_wasm).expect("call.wasm");
    let input = r#"{"capability":"fixture.echo","arguments":{"text":"hi"}}"#;
    // Runs are deny-by-default; grant exactly the one tool, as a workflow would.
    let options = RunOptions {
        grants: Arc::new(Grants::new(["fixture.echo"]).expect("valid grant")),
        ..Default::default()
    };

    let mut cmd = tokio::process::Command::new(wf_host_bin());
    cmd.arg("fixture-server").kill_on_drop(true);
    let (transport, _) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the fixture");
    let bare = BenchClient.serve(transport).await.expect("initialize");
    // A cloned `Peer`: the plain `call_tool`, as the pool uses.
    let peer = bare.peer().clone();

    let run_node = || async {
        let start = Instant::now();
        let report = runtime.run(&node, input, options.clone()).await;
        let elapsed = start.elapsed();
        assert_call_echo(report.result, "call.wasm");
        elapsed
    };
    // (h): (a) with the run on a thread of its own, a current-thread tokio
    // runtime, so it resumes where its instance is warm after the wait;
    // the pool stays on the bench's runtime. Includes the hop there and back.
    let pinned = RunThread::start();
    let run_pinned = || {
        let (runtime, node, options) = (runtime.clone(), node.clone(), options.clone());
        let handle = pinned.handle.clone();
        async move {
            let start = Instant::now();
            let report = handle
                .spawn(async move { runtime.run(&node, input, options).await })
                .await
                .expect("the pinned run");
            let elapsed = start.elapsed();
            assert_call_echo(report.result, "call.wasm (pinned)");
            elapsed
        }
    };
    let run_echo = || async {
        let start = Instant::now();
        let report = runtime.run(&echo_node, input, options.clone()).await;
        let elapsed = start.elapsed();
        let output = report
            .result
            .unwrap_or_else(|e| panic!("echo.wasm failed: {e}"));
        assert_eq!(output, input, "echo.wasm output");
        elapsed
    };
    let run_in_process = async |runtime: &Runtime, node: &Node| {
        let start = Instant::now();
        let report = runtime.run(node, input, options.clone()).await;
        let elapsed = start.elapsed();
        assert_call_echo(report.result, "call.wasm (instant backend)");
        elapsed
    };
    let run_backend = || async {
        let start = Instant::now();
        let result = CapabilityBackend::call_tool(pool, "fixture", "echo", hi()).await;
        let elapsed = start.elapsed();
        let result = result.unwrap_or_else(|e| panic!("backend echo: {e}"));
        assert!(is_echo(&result), "backend echo: {result}");
        elapsed
    };
    let run_bare = || bare_echo(&peer, "fixture");

    for _ in 0..WARMUP {
        run_node().await;
        run_bare().await;
        pooled_call(pool, "fixture").await;
        run_echo().await;
        run_backend().await;
        run_in_process(&instant, &instant_node).await;
        run_in_process(&hop, &hop_node).await;
        run_pinned().await;
    }
    timed.inside.lock().unwrap().clear();
    let names = [
        "(a) Runtime::run call.wasm via pool",
        "(b) bare rmcp peer.call_tool",
        "(c) Pool::call_tool alone",
        "(d) Runtime::run echo.wasm, no call",
        "(e) CapabilityBackend::call_tool",
        "(f) Runtime::run call.wasm, no I/O",
        "(g) (f), answer from another task",
        "(h) (a), run pinned to its thread",
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    // For profiling: `WF_BENCH_ONLY=<mode index>` runs one mode, and
    // `WF_BENCH_ROUNDS` sets the rounds.
    let only: Option<usize> = std::env::var("WF_BENCH_ONLY")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|m| *m < names.len());
    let rounds = std::env::var("WF_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(NODE_ROUNDS);
    for round in 0..rounds {
        // Rotate the order so no mode always runs first in a round.
        for k in 0..names.len() {
            let mode = (round + k) % names.len();
            if only.is_some_and(|m| m != mode) {
                continue;
            }
            for _ in 0..NODE_PER_ROUND {
                let d = match mode {
                    0 => run_node().await,
                    1 => run_bare().await,
                    2 => pooled_call(pool, "fixture").await,
                    3 => run_echo().await,
                    4 => run_backend().await,
                    5 => run_in_process(&instant, &instant_node).await,
                    6 => run_in_process(&hop, &hop_node).await,
                    _ => run_pinned().await,
                };
                samples[mode].push(d);
            }
        }
    }
    let _ = bare.cancel().await;

    println!();
    println!(
        "3. fixture.echo from a node vs a bare client ({rounds} interleaved rounds x {NODE_PER_ROUND})"
    );
    if let Some(mode) = only {
        Stats::of(&mut samples[mode]).print(names[mode]);
        return;
    }
    let stats: Vec<Stats> = samples.iter_mut().map(|s| Stats::of(s)).collect();
    for (name, s) in names.iter().zip(&stats) {
        s.print(name);
    }
    drop(pinned);
    let inside = Stats::of(&mut timed.inside.lock().unwrap());
    inside.print("(a') the backend call inside (a)");
    let added = stats[0].median_us - stats[1].median_us;
    println!(
        "    (a) - (b), medians: {added:+.1} µs   goal <= {NODE_GOAL_US:.0} µs: {}   ratio (a) / (b): {:.2}x",
        verdict(added <= NODE_GOAL_US),
        stats[0].median_us / stats[1].median_us
    );
    println!(
        "    ratio (c) / (b), median: {:.2}x",
        stats[2].median_us / stats[1].median_us
    );
    println!(
        "    (h) - (b), the run pinned to its thread, medians: {:+.1} µs",
        stats[7].median_us - stats[1].median_us
    );
    let [a, b, c, d, e, f, g] = [0, 1, 2, 3, 4, 5, 6].map(|i| stats[i].median_us);
    println!("    split of (a), medians:");
    println!("      bare rmcp call (b)                                   {b:>8.1} µs");
    println!(
        "      pool: owner task, oneshot reply (c - b)              {:>+8.1} µs",
        c - b
    );
    println!(
        "      backend: catalog lookup, schema check (e - c)        {:>+8.1} µs",
        e - c
    );
    println!("      instantiate + run echo.wasm (d)                      {d:>+8.1} µs");
    println!(
        "      call.wasm's host call and JSON, no I/O (f - d)       {:>+8.1} µs",
        f - d
    );
    println!(
        "      rest: waiting on a pending host call (a - e - f)     {:>+8.1} µs",
        a - e - f
    );
    println!(
        "        of which the backend call is slower inside a run (a' - e): {:+.1} µs; an in-process cross-task answer costs (g - f): {:+.1} µs",
        inside.median_us - e,
        g - f
    );
}

/// A thread that runs a current-thread tokio runtime until dropped.
struct RunThread {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunThread {
    fn start() -> RunThread {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the run thread's runtime");
            handle_tx.send(rt.handle().clone()).expect("bench waits");
            let _ = rt.block_on(stopped);
        });
        let handle = handle_rx.recv().expect("the run thread started");
        RunThread {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for RunThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Part 4: (a) and (b) of part 3 against every server, the SDK servers
/// included: a node's `<server>.echo` through the pool against a bare rmcp
/// client on one persistent session to a server of its own, interleaved.
async fn node_vs_bare_per_server(pool: &Pool, servers: &[Server]) {
    let runtime = Runtime::new(RuntimeConfig::default(), Arc::new(pool.clone()))
        .expect("runtime with the pool as backend");
    let node = runtime
        .load(&repo_root().join("plugins/call.wasm"))
        .unwrap_or_else(|e| panic!("{e}; build the guests with ./plugins/build.sh"));
    println!();
    println!(
        "4. echo from a node vs a bare client, per server ({SERVER_ROUNDS} interleaved rounds x {SERVER_PER_ROUND})"
    );
    for server in servers {
        let capability = format!("{}.echo", server.name);
        let input = json!({"capability": capability, "arguments": {"text": "hi"}}).to_string();
        let options = RunOptions {
            grants: Arc::new(Grants::new([capability.as_str()]).expect("valid grant")),
            ..Default::default()
        };
        let mut cmd = tokio::process::Command::new(&server.program);
        cmd.args(&server.args).kill_on_drop(true);
        let (transport, _) = TokioChildProcess::builder(cmd)
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn the {} server: {e}", server.name));
        // At the revision the pool negotiates: a server of 2026-07-28 does
        // more per request (self-contained request metadata).
        let bare = BenchClient
            .serve_with_lifecycle(
                transport,
                ClientLifecycleMode::Auto {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                    legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("initialize the {} server: {e}", server.name));
        let peer = bare.peer().clone();
        let revision = peer
            .peer_info()
            .map(|info| info.protocol_version.to_string())
            .unwrap_or_default();
        let run_node = || async {
            let start = Instant::now();
            let report = runtime.run(&node, &input, options.clone()).await;
            let elapsed = start.elapsed();
            assert_call_echo(report.result, &format!("call.wasm -> {capability}"));
            elapsed
        };
        let run_bare = || bare_echo(&peer, server.name);
        for _ in 0..WARMUP {
            run_node().await;
            run_bare().await;
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for round in 0..SERVER_ROUNDS {
            for k in 0..2 {
                for _ in 0..SERVER_PER_ROUND {
                    if (round + k) % 2 == 0 {
                        a.push(run_node().await);
                    } else {
                        b.push(run_bare().await);
                    }
                }
            }
        }
        let _ = bare.cancel().await;
        let (a, b) = (Stats::of(&mut a), Stats::of(&mut b));
        println!("  [{}] protocol {revision}", server.name);
        a.print("(a) Runtime::run call.wasm via pool");
        b.print("(b) bare rmcp peer.call_tool");
        let (added, ratio) = (a.median_us - b.median_us, a.median_us / b.median_us);
        let goal = if server.name == "fixture" {
            format!(
                "goal (a) - (b) <= {NODE_GOAL_US:.0} µs: {}",
                verdict(added <= NODE_GOAL_US)
            )
        } else {
            format!(
                "goal (a) / (b) <= {SDK_NODE_GOAL}x: {}",
                verdict(ratio <= SDK_NODE_GOAL)
            )
        };
        println!("    (a) - (b): {added:+.1} µs   (a) / (b): {ratio:.2}x   {goal}");
    }
}

struct Stats {
    n: usize,
    median_us: f64,
    p99_us: f64,
}

impl Stats {
    fn of(samples: &mut [Duration]) -> Stats {
        samples.sort();
        let n = samples.len();
        Stats {
            n,
            median_us: us(samples[n / 2]),
            p99_us: us(samples[(n * 99 / 100).min(n - 1)]),
        }
    }

    fn print(&self, name: &str) {
        println!(
            "    {name:<36} n={:<5} median {:>12}   p99 {:>12}",
            self.n,
            human(self.median_us),
            human(self.p99_us)
        );
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn human(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}
