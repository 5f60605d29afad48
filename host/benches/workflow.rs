//! Per-step overhead of the workflow engine: chains of 1, 10 and 50 `echo`
//! steps, each run started over JSON-RPC (in process, `wait: true`), with the
//! state in a SQLite file (durable) and in `:memory:`, side by side.
//!
//! `cargo bench -p wf-host --bench workflow` prints, per chain and state, the
//! median run time, µs per step, and the durable / in-memory ratio.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wf_host::config::Config;
use wf_host::host::{Host, HostOptions};
use wf_host::rpc::{RpcState, handle_body};
use wf_host::runtime::RuntimeConfig;
use wf_host::workflow::Options;

const CHAINS: [usize; 3] = [1, 10, 50];
const WARMUP: usize = 5;
const ROUNDS: usize = 8;
const PER_ROUND: usize = 10;

fn config(dir: &Path) -> Config {
    let echo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/echo.wasm");
    let mut text = String::new();
    for n in CHAINS {
        for i in 0..n {
            let _ = writeln!(
                text,
                "[[workflows.chain{n}.steps]]\nid = \"s{i}\"\ncomponent = \"{}\"",
                echo.display()
            );
            if i > 0 {
                let _ = writeln!(text, "needs = [\"s{}\"]", i - 1);
            }
        }
    }
    Config::parse(&text, &dir.join("bench.toml"), dir.to_owned()).unwrap()
}

/// The host with its state at `location`, and the RPC state over it. The
/// config has no connections: the pool stays empty.
async fn state(dir: &Path, location: String) -> (RpcState, Host) {
    let config = config(dir);
    let host = Host::open(
        &config,
        HostOptions {
            runtime: RuntimeConfig {
                cache_dir: Some(dir.join("cache")),
                ..Default::default()
            },
            workflows: Options {
                state: location,
                ..Options::default()
            },
            ..HostOptions::default()
        },
    )
    .await
    .unwrap();
    let state = RpcState {
        tokens: wf_host::reload::RpcTokens::new(Default::default()),
        workflows: host.workflows().clone(),
        pool: host.pool().clone(),
        grants: wf_host::reload::RpcGrants::new(wf_host::grants::Grants::none()),
        config: None,
    };
    (state, host)
}

async fn run_once(state: &RpcState, chain: usize) -> Duration {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "workflow.start",
        "params": {"workflow": format!("chain{chain}"), "input": {"k": 1}, "wait": true}});
    let start = Instant::now();
    let reply: Value = handle_body(state, body.to_string().as_bytes())
        .await
        .unwrap();
    let took = start.elapsed();
    assert_eq!(reply["result"]["status"], "succeeded", "{reply}");
    took
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let mut modes = vec![
            (
                "sqlite",
                state(dir.path(), dir.path().join("state.db").display().to_string()).await,
            ),
            ("memory", state(dir.path(), ":memory:".into()).await),
        ];
        if let Ok(only) = std::env::var("WF_BENCH_STATE") {
            modes.retain(|(name, _)| *name == only);
        }
        let mut samples: Vec<Vec<Vec<Duration>>> = vec![vec![Vec::new(); modes.len()]; CHAINS.len()];
        for (_, (state, _)) in &modes {
            for chain in CHAINS {
                for _ in 0..WARMUP {
                    run_once(state, chain).await;
                }
            }
        }
        // Interleave rounds so drift on a noisy machine hits every mode alike.
        for _ in 0..ROUNDS {
            for (c, chain) in CHAINS.iter().enumerate() {
                for (m, (_, (state, _))) in modes.iter().enumerate() {
                    for _ in 0..PER_ROUND {
                        samples[c][m].push(run_once(state, *chain).await);
                    }
                }
            }
        }
        println!(
            "workflow.start (wait) of an echo chain, {} runs per chain and state",
            ROUNDS * PER_ROUND
        );
        for (c, chain) in CHAINS.iter().enumerate() {
            let mut medians = Vec::new();
            for (m, (name, _)) in modes.iter().enumerate() {
                let s = &mut samples[c][m];
                s.sort();
                let median = s[s.len() / 2];
                medians.push(median);
                println!(
                    "  {chain:>2} steps  {name:<7} run median {:>9.1} µs   per step {:>7.1} µs   p99 {:>9.1} µs",
                    us(median),
                    us(median) / *chain as f64,
                    us(s[s.len() * 99 / 100]),
                );
            }
            if let [sqlite, memory] = medians[..] {
                println!(
                    "  {chain:>2} steps  ratio sqlite / memory (median): {:.2}x",
                    sqlite.as_secs_f64() / memory.as_secs_f64()
                );
            }
        }
        for (_, (_, host)) in modes {
            host.shutdown(Duration::from_secs(5)).await;
        }
    });
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
