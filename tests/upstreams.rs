//! Misbehaving upstream servers cannot exhaust the host: one that accepts
//! calls and never answers, one that reports progress without end, one that
//! floods notifications, one that answers with more than a transport takes.
//! Each is bounded, shows on its connection in the pool's stats (what
//! `host.status` lists), and a second connection (the fixture) goes on
//! answering meanwhile. The hostile server is `tests/upstreams/hostile.py`,
//! a real process over stdio and over streamable HTTP.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use wf_host::pool::{Pool, PoolConfig, PoolError};

use common::fixture::*;
use common::*;

over_both_transports!(
    a_server_that_never_answers_is_bounded_and_shown_in_flight,
    endless_progress_stops_at_max_call_time,
    a_notification_flood_holds_up_no_other_call,
);

/// `hostile.py http 0`, killed and reaped on drop.
struct HostileHttp {
    child: Child,
    url: String,
}

impl HostileHttp {
    fn start() -> HostileHttp {
        let mut child = Command::new("python3")
            .arg(repo_root().join("tests/upstreams/hostile.py"))
            .args(["http", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs the hostile server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the hostile server said {line:?}"));
        HostileHttp {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for HostileHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pool with `hostile` (over `kind`, with `settings` added to its
/// connection) and the stdio fixture as `fixture`.
fn pools(kind: Kind, settings: &str) -> (Pool, Option<HostileHttp>) {
    init_tracing();
    let (hostile, server) = match kind {
        Kind::Stdio => (
            format!(
                "command = \"python3\"\nargs = [{:?}, \"stdio\"]\n{settings}",
                repo_root().join("tests/upstreams/hostile.py").display()
            ),
            None,
        ),
        Kind::Http => {
            let server = HostileHttp::start();
            (format!("url = {:?}\n{settings}", server.url), Some(server))
        }
    };
    let pool = Pool::new(PoolConfig {
        connections: BTreeMap::from([
            ("hostile".to_owned(), connection_from_toml(&hostile)),
            ("fixture".to_owned(), stdio_connection()),
        ]),
        self_exe: Some(wf_host_bin()),
        ..Default::default()
    });
    (pool, server)
}

fn args(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("arguments must be an object"),
    }
}

async fn hostile(pool: &Pool, tool: &str, arguments: Value) -> Result<Value, PoolError> {
    pool.call_tool("hostile", tool, args(arguments), None).await
}

/// The fixture answers an echo within a second, `n` times over `for_at_least`.
async fn others_answer(pool: &Pool, for_at_least: Duration) {
    let until = Instant::now() + for_at_least;
    while Instant::now() < until {
        let began = Instant::now();
        let out = pool
            .call_tool("fixture", "echo", args(json!({"text": "here"})), None)
            .await
            .unwrap();
        assert_eq!(out["content"][0]["text"], "here");
        assert!(
            began.elapsed() < Duration::from_secs(1),
            "the other connection took {:?}",
            began.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn a_server_that_never_answers_is_bounded_and_shown_in_flight(kind: Kind) {
    let (pool, _server) = pools(kind, "call_timeout = \"2s\"");
    assert_eq!(
        hostile(&pool, "ok", json!({})).await.unwrap()["content"][0]["text"],
        "ok"
    );
    let began = Instant::now();
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { hostile(&pool, "silent", json!({})).await })
        })
        .collect();
    // While they wait, they show, and the other connection answers.
    let deadline = Instant::now() + Duration::from_secs(1);
    while pool.connection_stats("hostile").unwrap().in_flight < 5 {
        assert!(
            Instant::now() < deadline,
            "the calls never showed in flight"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    others_answer(&pool, Duration::from_millis(1000)).await;
    for call in calls {
        let err = call.await.unwrap().unwrap_err();
        assert!(matches!(err, PoolError::Timeout { .. }), "{err:?}");
    }
    assert!(
        began.elapsed() < Duration::from_secs(6),
        "{:?}",
        began.elapsed()
    );
    let stats = pool.connection_stats("hostile").unwrap();
    assert_eq!((stats.in_flight, stats.failures), (0, 5), "{stats:?}");
    assert!(
        stats
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("timed out"),
        "{stats:?}"
    );
    // The session goes on.
    assert_eq!(
        hostile(&pool, "ok", json!({})).await.unwrap()["content"][0]["text"],
        "ok"
    );
    assert_eq!(pool.connection_stats("hostile").unwrap().sessions_opened, 1);
    pool.shutdown().await;
}

async fn endless_progress_stops_at_max_call_time(kind: Kind) {
    let (pool, _server) = pools(kind, "call_timeout = \"1s\"\nmax_call_time = \"3s\"");
    let began = Instant::now();
    let call = {
        let pool = pool.clone();
        tokio::spawn(async move {
            hostile(
                &pool,
                "endless",
                json!({"kind": "progress", "interval_ms": 50}),
            )
            .await
        })
    };
    others_answer(&pool, Duration::from_millis(1500)).await;
    let err = call.await.unwrap().unwrap_err();
    let took = began.elapsed();
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(8),
        "{took:?}"
    );
    assert!(
        matches!(err, PoolError::TooLong { after, .. } if after == Duration::from_secs(3)),
        "{err:?}"
    );
    assert!(err.to_string().contains("max_call_time"), "{err}");
    let stats = pool.connection_stats("hostile").unwrap();
    assert_eq!((stats.in_flight, stats.failures), (0, 1), "{stats:?}");
    assert!(
        stats
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("max_call_time"),
        "{stats:?}"
    );
    pool.shutdown().await;
}

/// This process's resident memory, in MiB.
fn rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024
}

async fn a_notification_flood_holds_up_no_other_call(kind: Kind) {
    let (pool, _server) = pools(kind, "");
    assert_eq!(
        hostile(&pool, "ok", json!({})).await.unwrap()["content"][0]["text"],
        "ok"
    );
    let before = rss_mib();
    let flood = {
        let pool = pool.clone();
        tokio::spawn(async move {
            hostile(&pool, "flood", json!({"kind": "both", "count": 100_000})).await
        })
    };
    // Every call of the other connection answers within a second meanwhile.
    let began = Instant::now();
    while !flood.is_finished() {
        others_answer(&pool, Duration::from_millis(100)).await;
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "the flood never ended"
        );
    }
    let out = flood.await.unwrap().unwrap();
    assert_eq!(out["content"][0]["text"], "flooded 100000", "{out}");
    let grew = rss_mib().saturating_sub(before);
    assert!(grew < 100, "the flood cost {grew} MiB");
    assert_eq!(
        hostile(&pool, "ok", json!({})).await.unwrap()["content"][0]["text"],
        "ok"
    );
    pool.shutdown().await;
}

/// An answer over 16 MiB (rmcp's limit on one message) fails its own call
/// over HTTP with an error that says so, as a JSON body and as an event of
/// the call's stream, and the session goes on; over stdio the message is
/// dropped and the call ends at its `call_timeout`. Memory stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_limit_fails_its_call_and_not_the_session() {
    for sse in [false, true] {
        let (pool, _server) = pools(Kind::Http, "");
        let err = hostile(&pool, "huge", json!({"mb": 20, "sse": sse}))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("over 16 MiB") && err.to_string().contains("session goes on"),
            "sse {sse}: {err}"
        );
        assert_eq!(
            hostile(&pool, "ok", json!({})).await.unwrap()["content"][0]["text"],
            "ok"
        );
        let stats = pool.connection_stats("hostile").unwrap();
        assert_eq!(stats.sessions_opened, 1, "sse {sse}: {stats:?}");
        pool.shutdown().await;
    }
    let (pool, _server) = pools(Kind::Stdio, "call_timeout = \"2s\"");
    let before = rss_mib();
    let err = hostile(&pool, "huge", json!({"mb": 20})).await.unwrap_err();
    assert!(matches!(err, PoolError::Timeout { .. }), "{err:?}");
    assert!(rss_mib().saturating_sub(before) < 200, "stdio");
    assert_eq!(
        hostile(&pool, "ok", json!({})).await.unwrap()["content"][0]["text"],
        "ok"
    );
    pool.shutdown().await;
}
