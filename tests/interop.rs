//! The pool's scenarios against MCP servers built on the official SDKs, not on
//! rmcp like the client and the fixture: a protocol bug shared by both rmcp
//! sides would go unseen in tests/pool.rs. Each scenario runs against the
//! Python `mcp` 2.x server and the TypeScript SDK server (tests/interop/), over
//! stdio and over streamable HTTP on 127.0.0.1.
//!
//! The Python server speaks revision 2026-07-28 (`server/discover`, change
//! notifications only on `subscriptions/listen`); the TypeScript SDK 1.x does
//! not know it, so the pool falls back to `initialize` at 2025-11-25.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use wf_host::grants::Grants;
use wf_host::pool::{Pool, PoolError};
use wf_host::runtime::{RunOptions, RuntimeConfig};

use common::fixture::{Kind, process_gone, wait_gone};
use common::interop::*;

/// Runs each scenario against both SDK servers over both transports, as tests
/// named `<scenario>::<sdk>_<transport>`.
macro_rules! against_every_sdk_and_transport {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn python_stdio() {
                super::$name(Sdk::Python, Kind::Stdio).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn python_http() {
                super::$name(Sdk::Python, Kind::Http).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn node_stdio() {
                super::$name(Sdk::Node, Kind::Stdio).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn node_http() {
                super::$name(Sdk::Node, Kind::Http).await
            }
        }
    )*};
}

against_every_sdk_and_transport!(
    one_session_serves_sequential_and_concurrent_calls,
    list_changed_refreshes_the_catalog_on_the_same_session,
    a_crash_mid_call_fails_every_pending_caller_and_the_next_call_reconnects,
    a_timeout_cancels_the_request_upstream_and_keeps_the_session,
    resources_and_prompts_go_through_the_pooled_session,
    a_wasm_node_calls_the_tool_through_the_pool,
    health_pings_keep_a_quiet_session_open,
);

fn args(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("arguments must be an object"),
    }
}

async fn call(pool: &Pool, sdk: Sdk, tool: &str, arguments: Value) -> Result<Value, PoolError> {
    pool.call_tool(sdk.connection(), tool, args(arguments), None)
        .await
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text content: {result}"))
}

fn stats(pool: &Pool, sdk: Sdk) -> wf_host::pool::ConnectionStats {
    pool.connection_stats(sdk.connection()).expect("configured")
}

/// The server's own record of what it received: `{"calls": [...], "cancelled":
/// [...]}` (see tests/interop/*/server.*).
async fn call_log(pool: &Pool, sdk: Sdk) -> Value {
    let log = call(pool, sdk, "call_log", json!({})).await.unwrap();
    serde_json::from_str(text(&log)).unwrap_or_else(|e| panic!("call_log is not JSON ({e}): {log}"))
}

fn calls_of(log: &Value, tool: &str) -> Vec<Value> {
    log["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .filter(|c| c["tool"] == tool)
        .cloned()
        .collect()
}

/// Waits up to 5 s until the server has received `n` calls of `tool`.
async fn wait_for_calls(pool: &Pool, sdk: Sdk, tool: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = call_log(pool, sdk).await;
        if calls_of(&log, tool).len() >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server got fewer than {n} `{tool}` calls: {log}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The revision the session negotiated, as the server saw it: the Python SDK
/// records it per call; the TypeScript SDK 1.x only speaks `initialize`.
fn assert_negotiated(sdk: Sdk, log: &Value) {
    if sdk == Sdk::Python {
        let calls = log["calls"].as_array().expect("calls");
        assert!(!calls.is_empty(), "{log}");
        for c in calls {
            assert_eq!(c["protocol"], "2026-07-28", "{log}");
        }
    }
}

async fn one_session_serves_sequential_and_concurrent_calls(sdk: Sdk, kind: Kind) {
    let (pool, _server) = interop_pool(sdk, kind);
    for i in 0..50 {
        let out = call(&pool, sdk, "echo", json!({"text": format!("n{i}")}))
            .await
            .unwrap();
        assert_eq!(text(&out), format!("n{i}"));
    }
    let mut tasks = Vec::new();
    for i in 0..64 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            call(&pool, sdk, "add", json!({"a": i, "b": 1})).await
        }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let out = task.await.unwrap().expect("concurrent call");
        assert_eq!(text(&out), (i + 1).to_string());
    }

    assert_eq!(stats(&pool, sdk).sessions_opened, 1);
    assert_eq!(stats(&pool, sdk).state, "ready");
    assert_eq!(stats(&pool, sdk).calls, 50 + 64);
    let log = call_log(&pool, sdk).await;
    assert_eq!(calls_of(&log, "echo").len(), 50, "{log}");
    assert_eq!(calls_of(&log, "add").len(), 64, "{log}");
    assert_negotiated(sdk, &log);
    if sdk == Sdk::Node {
        // One initialize, seen by the server: every call on its session 1.
        assert_eq!(log["sessions"], 1, "{log}");
        assert!(
            log["calls"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["session"] == 1)
        );
    }
    pool.shutdown().await;
}

async fn list_changed_refreshes_the_catalog_on_the_same_session(sdk: Sdk, kind: Kind) {
    let (pool, _server) = interop_pool(sdk, kind);
    let mut catalog = pool.watch_catalog(sdk.connection()).await.unwrap();
    assert!(catalog.borrow().tool("extra").is_none());

    let out = call(&pool, sdk, "register_extra", json!({})).await.unwrap();
    assert_eq!(text(&out), "registered");
    // The refresh may land after the call returns: wait for it, do not assume it.
    tokio::time::timeout(
        Duration::from_secs(5),
        catalog.wait_for(|c| c.tool("extra").is_some()),
    )
    .await
    .expect("the catalog gained `extra` within 5s")
    .unwrap();
    assert_eq!(stats(&pool, sdk).sessions_opened, 1);
    // The stream that carried the change is open: a GET stream (TypeScript over
    // HTTP), subscriptions/listen (Python), or stdio itself.
    assert_eq!(stats(&pool, sdk).notifications, Some("live"));

    let out = call(&pool, sdk, "extra", json!({"text": "hi"}))
        .await
        .unwrap();
    assert_eq!(text(&out), "extra: hi");
    assert_eq!(stats(&pool, sdk).sessions_opened, 1);
    assert_negotiated(sdk, &call_log(&pool, sdk).await);
    pool.shutdown().await;
}

async fn a_crash_mid_call_fails_every_pending_caller_and_the_next_call_reconnects(
    sdk: Sdk,
    kind: Kind,
) {
    let (pool, mut server) = interop_pool(sdk, kind);
    call(&pool, sdk, "echo", json!({"text": "warm"}))
        .await
        .unwrap();
    let first_pid = stats(&pool, sdk).pid;

    let mut pending = Vec::new();
    for _ in 0..3 {
        let pool = pool.clone();
        pending.push(tokio::spawn(async move {
            let err = call(&pool, sdk, "sleep", json!({"ms": 30000}))
                .await
                .unwrap_err();
            (err, Instant::now())
        }));
    }
    // The crash must land while all three are running on the server.
    wait_for_calls(&pool, sdk, "sleep", 3).await;
    let crashed_at = Instant::now();
    let crash = call(&pool, sdk, "crash", json!({})).await.unwrap_err();
    assert!(
        matches!(crash, PoolError::SessionClosed { .. }),
        "{crash:?}"
    );
    for task in pending {
        let (err, failed_at) = task.await.unwrap();
        assert!(matches!(err, PoolError::SessionClosed { .. }), "{err:?}");
        assert!(
            failed_at.duration_since(crashed_at) < Duration::from_secs(2),
            "a pending caller waited {:?}",
            failed_at.duration_since(crashed_at)
        );
        assert_eq!(
            wf_host::pool::to_capability_error(err).code(),
            "unavailable"
        );
    }

    if let Some(server) = &mut server {
        assert!(
            server.wait_exit(Duration::from_secs(5)),
            "the server did not exit on crash"
        );
        server.restart();
    }
    let out = call(&pool, sdk, "echo", json!({"text": "back"}))
        .await
        .unwrap();
    assert_eq!(text(&out), "back");
    assert_eq!(stats(&pool, sdk).sessions_opened, 2);
    if let Some(first_pid) = first_pid {
        wait_gone(first_pid).await;
        let second_pid = stats(&pool, sdk).pid.expect("a stdio session has a pid");
        assert_ne!(first_pid, second_pid);
        pool.shutdown().await;
        assert!(
            process_gone(second_pid),
            "shutdown left {second_pid} behind"
        );
    } else {
        pool.shutdown().await;
    }
}

async fn a_timeout_cancels_the_request_upstream_and_keeps_the_session(sdk: Sdk, kind: Kind) {
    let (pool, _server) = interop_pool(sdk, kind);
    // Connected first: the timeout covers the call, not the server's start.
    call(&pool, sdk, "echo", json!({"text": "warm"}))
        .await
        .unwrap();
    let started = Instant::now();
    let err = pool
        .call_tool(
            sdk.connection(),
            "sleep",
            args(json!({"ms": 5000})),
            Some(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, PoolError::Timeout { after, .. } if after == Duration::from_millis(300)),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    // The same session still works, and the server saw notifications/cancelled.
    let out = call(&pool, sdk, "echo", json!({"text": "still here"}))
        .await
        .unwrap();
    assert_eq!(text(&out), "still here");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = call_log(&pool, sdk).await;
        if log["cancelled"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["tool"] == "sleep"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server never saw notifications/cancelled: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(stats(&pool, sdk).sessions_opened, 1);
    pool.shutdown().await;
}

async fn resources_and_prompts_go_through_the_pooled_session(sdk: Sdk, kind: Kind) {
    let (pool, _server) = interop_pool(sdk, kind);
    let connection = sdk.connection();
    let greeting = match sdk {
        Sdk::Python => "hello from python",
        Sdk::Node => "hello from node",
    };
    let resources = pool.list_resources(connection).await.unwrap();
    assert!(
        resources.iter().any(|r| r.uri == "interop://greeting"),
        "{resources:?}"
    );
    let resource = pool
        .read_resource(connection, "interop://greeting")
        .await
        .unwrap();
    assert_eq!(resource["contents"][0]["text"], greeting, "{resource}");
    assert_eq!(resource["contents"][0]["uri"], "interop://greeting");

    let prompts = pool.list_prompts(connection).await.unwrap();
    assert!(prompts.iter().any(|p| p.name == "greet"), "{prompts:?}");
    let prompt = pool
        .get_prompt(connection, "greet", args(json!({"name": "Ada"})))
        .await
        .unwrap();
    assert_eq!(prompt["messages"][0]["role"], "user", "{prompt}");
    assert_eq!(
        prompt["messages"][0]["content"]["text"],
        "Say hello to Ada."
    );

    let missing = pool
        .read_resource(connection, "interop://nope")
        .await
        .unwrap_err();
    assert!(matches!(missing, PoolError::Server { .. }), "{missing:?}");
    assert_eq!(stats(&pool, sdk).sessions_opened, 1);
    pool.shutdown().await;
}

async fn a_wasm_node_calls_the_tool_through_the_pool(sdk: Sdk, kind: Kind) {
    let (pool, _server) = interop_pool(sdk, kind);
    let (runtime, _cache) = common::runtime_with(RuntimeConfig::default(), Arc::new(pool.clone()));
    let node = runtime.load(&common::plugin("call")).unwrap();
    let capability = format!("{}.echo", sdk.connection());
    let opts = RunOptions {
        grants: Arc::new(Grants::new([capability.as_str()]).unwrap()),
        ..Default::default()
    };
    for i in 0..3 {
        let input =
            json!({"capability": capability, "arguments": {"text": format!("from wasm {i}")}});
        let report = runtime.run(&node, &input.to_string(), opts.clone()).await;
        let out: Value = serde_json::from_str(common::expect_ok(&report)).unwrap();
        assert_eq!(out["content"][0]["text"], format!("from wasm {i}"), "{out}");
        // `isError` is optional: the TypeScript SDK leaves it out on success.
        assert_ne!(out["isError"], true, "{out}");
    }
    // Three runs, one session.
    assert_eq!(stats(&pool, sdk).sessions_opened, 1);
    let log = call_log(&pool, sdk).await;
    assert_eq!(calls_of(&log, "echo").len(), 3, "{log}");
    assert_negotiated(sdk, &log);
    pool.shutdown().await;
}

async fn health_pings_keep_a_quiet_session_open(sdk: Sdk, kind: Kind) {
    let (pool, _server) = interop_pool_with(sdk, kind, "ping_interval = \"100ms\"");
    let out = call(&pool, sdk, "echo", json!({"text": "before"}))
        .await
        .unwrap();
    assert_eq!(text(&out), "before");
    // About ten health pings while nothing else happens.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let out = call(&pool, sdk, "echo", json!({"text": "after"}))
        .await
        .unwrap();
    assert_eq!(text(&out), "after");
    let stats = stats(&pool, sdk);
    assert_eq!(
        stats.sessions_opened, 1,
        "a ping closed the session: {stats:?}"
    );
    assert_eq!(stats.last_error, None);
    pool.shutdown().await;
}

/// A Python-SDK tool that asks with `ctx.elicit` inside the call (the way of
/// servers written before 2026-07-28) fails on a 2026-07-28 session, which
/// has no back-channel for it, and the error a node sees names the setting
/// that fixes it; the same server with its connection pinned to
/// `protocol = "2025-11-25"` asks, and gets the pool's answer (declined, as
/// its `elicitation` says). A `protocol` the pool does not speak is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_asks_mid_call_works_pinned_to_2025_11_25() {
    let newest = Sdk::Python.stdio_connection("elicitation = \"decline\"");
    let pinned =
        Sdk::Python.stdio_connection("elicitation = \"decline\"\nprotocol = \"2025-11-25\"");
    let pool = Pool::new(wf_host::pool::PoolConfig {
        connections: [("py".to_owned(), newest), ("old".to_owned(), pinned)].into(),
        ..Default::default()
    });
    let err = pool
        .call_tool("py", "ask_mid_call", args(json!({})), None)
        .await
        .unwrap_err();
    let seen = wf_host::pool::to_capability_error(err);
    assert!(seen.message().contains("no back-channel"), "{seen}");
    assert!(
        seen.message()
            .contains("`protocol = \"2025-11-25\"` in `[connections.py]`"),
        "{seen}"
    );
    let out = pool
        .call_tool("old", "ask_mid_call", args(json!({})), None)
        .await
        .unwrap();
    assert_eq!(text(&out), "declined");
    let log = pool
        .call_tool("old", "call_log", args(json!({})), None)
        .await
        .unwrap();
    let log: Value = serde_json::from_str(text(&log)).unwrap();
    assert_eq!(
        calls_of(&log, "ask_mid_call")[0]["protocol"],
        "2025-11-25",
        "{log}"
    );
    pool.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("wf.toml");
    std::fs::write(
        &config,
        "[connections.x]\ncommand = \"wf-host\"\nprotocol = \"2024-11-05\"\n",
    )
    .unwrap();
    let e = wf_host::config::Config::load(&config)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`protocol` is one of \"2026-07-28\", \"2025-11-25\", not \"2024-11-05\""),
        "{e}"
    );
}

/// A server that exits on the 2026-07-28 probe instead of answering it (rmcp
/// servers before 3.x do) is connected to again, with `initialize` alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_exits_on_the_discover_probe_gets_initialize_alone() {
    let (python, _) = Sdk::Python.command();
    let script = common::repo_root().join("tests/interop/python/initialize_first.py");
    let witness = tempfile::NamedTempFile::new().unwrap();
    let connection = common::fixture::connection_from_toml(&format!(
        "command = {}\nargs = [{}]\nenv = {{ WF_INTEROP_WITNESS = {} }}",
        toml::Value::from(python.display().to_string()),
        toml::Value::from(script.display().to_string()),
        toml::Value::from(witness.path().display().to_string()),
    ));
    common::init_tracing();
    let pool = Pool::new(wf_host::pool::PoolConfig {
        connections: [("old".to_owned(), connection)].into(),
        ..Default::default()
    });
    let out = pool
        .call_tool("old", "echo", args(json!({"text": "hi"})), None)
        .await
        .unwrap();
    assert_eq!(text(&out), "hi");
    assert_eq!(pool.connection_stats("old").unwrap().sessions_opened, 1);
    // The first process got the probe and exited; the second, `initialize`.
    let firsts = std::fs::read_to_string(witness.path()).unwrap();
    assert_eq!(firsts, "server/discover\ninitialize\n");
    pool.shutdown().await;
}

/// The server restarts between two calls. A 2025-11-25 server (TypeScript)
/// forgets the session: its 404 makes the pool initialise again and replay the
/// call. A 2026-07-28 server (Python) has no sessions to forget, so nothing is
/// replayed. Either way the call works and runs once.
async fn a_restarted_http_server_is_reached_again(sdk: Sdk) {
    let (pool, server) = interop_pool(sdk, Kind::Http);
    let mut server = server.expect("an HTTP server");
    let out = call(&pool, sdk, "echo", json!({"text": "one"}))
        .await
        .unwrap();
    assert_eq!(text(&out), "one");
    server.restart();
    let out = call(&pool, sdk, "echo", json!({"text": "two"}))
        .await
        .unwrap();
    assert_eq!(text(&out), "two");
    let stats = stats(&pool, sdk);
    match sdk {
        Sdk::Node => {
            assert_eq!((stats.sessions_opened, stats.replays), (2, 1), "{stats:?}");
        }
        Sdk::Python => {
            // Nothing to replay. The session itself may have been rebuilt: a
            // catalog refresh or ping that hit the restart fails the health check.
            assert_eq!(stats.replays, 0, "{stats:?}");
            assert!(stats.sessions_opened <= 2, "{stats:?}");
        }
    }
    // The restarted server got the call exactly once.
    let log = call_log(&pool, sdk).await;
    assert_eq!(calls_of(&log, "echo").len(), 1, "{log}");
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_http_server_is_reached_again_python() {
    a_restarted_http_server_is_reached_again(Sdk::Python).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_http_server_is_reached_again_node() {
    a_restarted_http_server_is_reached_again(Sdk::Node).await
}
