//! The MCP runtime pool against real fixture servers: a child process over
//! stdio, and a server process over streamable HTTP on 127.0.0.1. Every
//! behaviour is checked over both transports.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use wf_host::pool::{Pool, PoolError};

use common::fixture::*;

/// Runs one scenario over stdio and over HTTP.
macro_rules! over_both_transports {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn stdio() {
                super::$name(Kind::Stdio).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn http() {
                super::$name(Kind::Http).await
            }
        }
    )*};
}

over_both_transports!(
    one_session_serves_200_sequential_and_64_concurrent_calls,
    list_changed_during_a_call_refreshes_the_catalog_on_the_same_session,
    a_timeout_cancels_the_request_and_keeps_the_session,
    resources_and_prompts_go_through_the_pooled_session,
    a_crash_mid_call_fails_every_pending_caller_and_the_next_call_reconnects,
    a_changed_connection_gets_a_new_session,
);

fn args(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("arguments must be an object"),
    }
}

async fn call(pool: &Pool, tool: &str, arguments: Value) -> Result<Value, PoolError> {
    pool.call_tool("fixture", tool, args(arguments), None).await
}

fn stats(pool: &Pool) -> wf_host::pool::ConnectionStats {
    pool.connection_stats("fixture").expect("configured")
}

async fn one_session_serves_200_sequential_and_64_concurrent_calls(kind: Kind) {
    let (pool, _server) = fixture_pool(kind);
    for i in 0..200 {
        let out = call(&pool, "echo", json!({"text": format!("n{i}")}))
            .await
            .unwrap();
        assert_eq!(out["content"][0]["text"], format!("n{i}"));
    }
    let mut tasks = Vec::new();
    for i in 0..64 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            call(&pool, "add", json!({"a": i, "b": 1})).await
        }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let out = task.await.unwrap().expect("concurrent call");
        assert_eq!(
            out["structuredContent"]["sum"].as_f64(),
            Some(i as f64 + 1.0)
        );
    }

    // One initialize, seen by the pool and by the server's per-session counter.
    assert_eq!(stats(&pool).sessions_opened, 1);
    let counted = call(&pool, "counter", json!({})).await.unwrap();
    assert_eq!(
        counted["structuredContent"],
        json!({"count": 1, "session": 1})
    );
    let log = call(&pool, "call_log", json!({})).await.unwrap();
    assert_eq!(log["structuredContent"]["sessions"], 1);
    assert_eq!(stats(&pool).state, "ready");
    assert_eq!(stats(&pool).calls, 200 + 64 + 2);
    pool.shutdown().await;
}

async fn list_changed_during_a_call_refreshes_the_catalog_on_the_same_session(kind: Kind) {
    let (pool, _server) = fixture_pool(kind);
    let mut catalog = pool.watch_catalog("fixture").await.unwrap();
    assert!(catalog.borrow().tool("extra").is_none());

    let started = Instant::now();
    let out = call(&pool, "register_extra", json!({})).await.unwrap();
    assert_eq!(out["content"][0]["text"], "registered");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "register_extra took {:?}: the notification wedged the receive loop",
        started.elapsed()
    );

    // The refresh may land after the call returns: wait for it, do not assume it.
    tokio::time::timeout(
        Duration::from_secs(5),
        catalog.wait_for(|c| c.tool("extra").is_some()),
    )
    .await
    .expect("catalog gained `extra` within 5s")
    .unwrap();
    assert_eq!(stats(&pool).sessions_opened, 1);
    assert!(stats(&pool).tools >= 9);

    let out = call(&pool, "extra", json!({"text": "hi"})).await.unwrap();
    assert_eq!(out["content"][0]["text"], "extra: hi");
    assert_eq!(stats(&pool).sessions_opened, 1);
    pool.shutdown().await;
}

async fn a_timeout_cancels_the_request_and_keeps_the_session(kind: Kind) {
    let (pool, _server) = fixture_pool(kind);
    let started = Instant::now();
    let err = pool
        .call_tool(
            "fixture",
            "sleep",
            args(json!({"ms": 5000})),
            Some(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, PoolError::Timeout { after, .. } if after == Duration::from_millis(200)),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    // The same session still works, and the server saw the cancellation.
    let out = call(&pool, "echo", json!({"text": "still here"}))
        .await
        .unwrap();
    assert_eq!(out["content"][0]["text"], "still here");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = call(&pool, "call_log", json!({})).await.unwrap();
        if saw_cancelled(&log, "sleep") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "server never saw notifications/cancelled: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(stats(&pool).sessions_opened, 1);
    pool.shutdown().await;
}

async fn resources_and_prompts_go_through_the_pooled_session(kind: Kind) {
    let (pool, _server) = fixture_pool(kind);
    let resource = pool
        .read_resource("fixture", "fixture://greeting")
        .await
        .unwrap();
    assert_eq!(resource["contents"][0]["text"], "hello from the fixture");
    let prompt = pool
        .get_prompt("fixture", "greet", args(json!({"name": "Ada"})))
        .await
        .unwrap();
    assert_eq!(
        prompt["messages"][0]["content"]["text"],
        "Say hello to Ada."
    );
    let resources = pool.list_resources("fixture").await.unwrap();
    assert!(resources.iter().any(|r| r.uri == "fixture://config.json"));
    let prompts = pool.list_prompts("fixture").await.unwrap();
    assert!(prompts.iter().any(|p| p.name == "greet"));

    let missing = pool
        .read_resource("fixture", "fixture://nope")
        .await
        .unwrap_err();
    assert!(matches!(missing, PoolError::Server { .. }), "{missing:?}");
    assert_eq!(stats(&pool).sessions_opened, 1);
    let counted = call(&pool, "counter", json!({})).await.unwrap();
    assert_eq!(counted["structuredContent"]["session"], 1);
    pool.shutdown().await;
}

async fn a_crash_mid_call_fails_every_pending_caller_and_the_next_call_reconnects(kind: Kind) {
    let (pool, mut server) = fixture_pool(kind);
    call(&pool, "echo", json!({"text": "warm"})).await.unwrap();
    let first_pid = match &server {
        Some(server) => server.pid(),
        None => stats(&pool).pid.expect("stdio session has a pid"),
    };

    // Several callers waiting on slow calls, then one that kills the server.
    let mut pending = Vec::new();
    for _ in 0..5 {
        let pool = pool.clone();
        pending.push(tokio::spawn(async move {
            let err = call(&pool, "sleep", json!({"ms": 30000}))
                .await
                .unwrap_err();
            (err, Instant::now())
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let crashed_at = Instant::now();
    let crash = call(&pool, "crash", json!({})).await.unwrap_err();
    assert!(
        matches!(crash, PoolError::SessionClosed { .. }),
        "{crash:?}"
    );
    for task in pending {
        let (err, failed_at) = task.await.unwrap();
        assert!(matches!(err, PoolError::SessionClosed { .. }), "{err:?}");
        assert!(
            failed_at.duration_since(crashed_at) < Duration::from_secs(1),
            "a pending caller waited {:?}",
            failed_at.duration_since(crashed_at)
        );
        let capability = wf_host::pool::to_capability_error(err);
        assert_eq!(capability.code(), "unavailable");
    }

    if let Some(server) = &mut server {
        assert!(
            server.wait_exit(Duration::from_secs(5)),
            "server did not exit on crash"
        );
        let addr = server.addr.clone();
        *server = HttpFixture::start(&addr);
    }
    // The dead session was evicted; the next call reconnects and succeeds.
    let out = call(&pool, "echo", json!({"text": "back"})).await.unwrap();
    assert_eq!(out["content"][0]["text"], "back");
    assert_eq!(stats(&pool).sessions_opened, 2);

    if kind == Kind::Stdio {
        wait_gone(first_pid).await;
        let second_pid = stats(&pool).pid.unwrap();
        assert_ne!(first_pid, second_pid);
        pool.shutdown().await;
        assert!(
            process_gone(second_pid),
            "shutdown left child {second_pid} behind"
        );
    } else {
        pool.shutdown().await;
    }
}

async fn a_changed_connection_gets_a_new_session(kind: Kind) {
    let (pool, server) = fixture_pool(kind);
    call(&pool, "counter", json!({})).await.unwrap();
    let before = stats(&pool);
    let old_pid = before.pid;
    let changed = match &server {
        None => connection_from_toml(
            "command = \"wf-host\"\nargs = [\"fixture-server\"]\nenv = { CHANGED = \"1\" }",
        ),
        Some(server) => connection_from_toml(&format!(
            "url = {:?}\nheaders = {{ X-Changed = \"1\" }}",
            server.url()
        )),
    };
    pool.update([("fixture".to_owned(), changed)].into());
    let after_update = stats(&pool);
    assert_ne!(before.fingerprint, after_update.fingerprint);
    let counted = call(&pool, "counter", json!({})).await.unwrap();
    // A fresh session: its own counter starts again.
    assert_eq!(counted["structuredContent"]["count"], 1);
    assert_eq!(stats(&pool).sessions_opened, 2);
    if kind == Kind::Http {
        // The same server process saw a second initialize.
        assert_eq!(counted["structuredContent"]["session"], 2);
    }
    if let Some(old_pid) = old_pid {
        // The old session drained and its child was reaped.
        wait_gone(old_pid).await;
        assert_ne!(stats(&pool).pid, Some(old_pid));
    }
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_callers_share_one_connect() {
    let pool = pool_with(stdio_connection());
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            call(&pool, "counter", json!({})).await
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(stats(&pool).sessions_opened, 1);
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_follows_pagination() {
    let pool = pool_with(connection_from_toml(
        "command = \"wf-host\"\nargs = [\"fixture-server\"]\nenv = { WF_FIXTURE_PAGE_SIZE = \"2\" }",
    ));
    let tools = pool.list_tools("fixture").await.unwrap();
    let names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
    for expected in [
        "echo",
        "add",
        "sleep",
        "fail",
        "crash",
        "counter",
        "register_extra",
        "call_log",
    ] {
        assert!(
            names.contains(&expected.to_owned()),
            "missing {expected} in {names:?}"
        );
    }
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_command_names_the_connection_and_opens_the_breaker() {
    let pool = pool_with(connection_from_toml(
        "command = \"/nonexistent/mcp-server\"",
    ));
    let err = call(&pool, "echo", json!({})).await.unwrap_err();
    match &err {
        PoolError::ConnectFailed { connection, detail } => {
            assert_eq!(connection, "fixture");
            assert!(
                detail.contains("cannot start `/nonexistent/mcp-server`"),
                "{detail}"
            );
        }
        other => panic!("expected ConnectFailed, got {other:?}"),
    }
    assert!(
        err.to_string()
            .starts_with("connection `fixture`: cannot start"),
        "{err}"
    );

    // Fails fast while the breaker is open, and says so.
    let started = Instant::now();
    let err = call(&pool, "echo", json!({})).await.unwrap_err();
    assert!(
        matches!(err, PoolError::CircuitOpen { failures: 1, .. }),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(50));
    assert_eq!(stats(&pool).state, "circuit-open");
    // The guest sees no paths.
    let guest = wf_host::pool::to_capability_error(err);
    assert_eq!(guest.code(), "unavailable");
    assert!(!guest.message().contains("/nonexistent"), "{guest}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_port_backs_off_exponentially() {
    // Bind and drop a listener to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pool = pool_with(http_connection(&format!("http://127.0.0.1:{port}/mcp")));
    let err = call(&pool, "echo", json!({})).await.unwrap_err();
    assert!(matches!(err, PoolError::ConnectFailed { .. }), "{err:?}");
    let mut retry_ins = Vec::new();
    for failures in 1..=3u32 {
        // Wait out the cool-down, then fail again: each wait is longer.
        let err = loop {
            match call(&pool, "echo", json!({})).await.unwrap_err() {
                PoolError::CircuitOpen {
                    retry_in,
                    failures: f,
                    ..
                } => {
                    assert_eq!(f, failures);
                    retry_ins.push(retry_in);
                    tokio::time::sleep(retry_in + Duration::from_millis(5)).await;
                }
                other => break other,
            }
        };
        assert!(matches!(err, PoolError::ConnectFailed { .. }), "{err:?}");
    }
    // Jitter keeps each delay within [d/2, d] of a doubling d.
    assert!(retry_ins.len() >= 3, "{retry_ins:?}");
    assert!(retry_ins[0] <= Duration::from_millis(250));
    assert!(
        retry_ins.last().unwrap() > &Duration::from_millis(400),
        "{retry_ins:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_that_forgets_the_session_is_reinitialised_transparently() {
    let mut server = HttpFixture::start("127.0.0.1:0");
    let pool = pool_with(http_connection(&server.url()));
    call(&pool, "echo", json!({"text": "one"})).await.unwrap();
    // Restart the server on the same port: it no longer knows our session id.
    let addr = server.addr.clone();
    server.kill();
    let _server = HttpFixture::start(&addr);
    let out = call(&pool, "echo", json!({"text": "two"})).await.unwrap();
    assert_eq!(out["content"][0]["text"], "two");
    assert_eq!(stats(&pool).sessions_opened, 2);
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_closes_and_reopens_on_demand() {
    let pool = pool_with(connection_from_toml(
        "command = \"wf-host\"\nargs = [\"fixture-server\"]\nidle_timeout = \"200ms\"",
    ));
    call(&pool, "echo", json!({"text": "x"})).await.unwrap();
    let pid = stats(&pool).pid.unwrap();
    wait_gone(pid).await;
    call(&pool, "echo", json!({"text": "y"})).await.unwrap();
    assert_eq!(stats(&pool).sessions_opened, 2);
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_reaps_the_child_and_refuses_new_work() {
    let pool = pool_with(stdio_connection());
    call(&pool, "echo", json!({"text": "x"})).await.unwrap();
    let pid = stats(&pool).pid.unwrap();
    assert!(!process_gone(pid));
    pool.shutdown().await;
    assert!(process_gone(pid), "child {pid} outlived shutdown");
    let err = call(&pool, "echo", json!({})).await.unwrap_err();
    assert_eq!(err, PoolError::ShutDown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_connection_is_named() {
    let pool = pool_with(stdio_connection());
    let err = pool
        .call_tool("nope", "echo", Map::new(), None)
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "connection `nope` is not configured");
    let _ = Arc::new(pool);
}
