//! `sandbox`: tries what the README says a node cannot do (files, environment,
//! sockets) and what it can (clocks, random), and reports each outcome as data.
//!
//! Input: `{"connect": "127.0.0.1:PORT"}`, an address to try a TCP connection to.
//! Output: `{"files": {...}, "env": [...], "args": [...], "tcp": ..., "dns": ...,
//! "wall_clock_secs": N, "monotonic_ok": bool, "random": N, "runs_in_this_instance": N}`.

use std::hash::BuildHasher;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
struct Input {
    connect: String,
}

/// Counts the runs this instance has seen: 1 on every run if no state carries over.
static RUNS: AtomicU64 = AtomicU64::new(0);

fn outcome<T>(result: std::io::Result<T>) -> Value {
    match result {
        Ok(_) => json!("ok"),
        Err(e) => json!({ "err": e.to_string() }),
    }
}

fn run(input: Input) -> Result<Value, wf_sdk::Error> {
    let runs = RUNS.fetch_add(1, Ordering::SeqCst) + 1;
    let files = json!({
        "read_dir_root": outcome(std::fs::read_dir("/")),
        "read_dir_cwd": outcome(std::fs::read_dir(".")),
        "read_passwd": outcome(std::fs::read("/etc/passwd")),
        "create": outcome(std::fs::File::create("created-by-node")),
    });
    let env: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
    let args: Vec<String> = std::env::args().collect();
    let tcp = outcome(TcpStream::connect(&input.connect));
    let dns = outcome(("localhost", 80).to_socket_addrs());

    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let start = Instant::now();
    let monotonic_ok = Instant::now() >= start;
    // Seeded from the host's random source in every fresh instance.
    let random = std::collections::hash_map::RandomState::new().hash_one(0u8);

    Ok(json!({
        "files": files,
        "env": env,
        "args": args,
        "tcp": tcp,
        "dns": dns,
        "wall_clock_secs": wall,
        "monotonic_ok": monotonic_ok,
        "random": random,
        "runs_in_this_instance": runs,
    }))
}

wf_sdk::node!(run);
