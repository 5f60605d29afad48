//! The MCP runtime pool against real fixture servers: a child process over
//! stdio, and a server process over streamable HTTP on 127.0.0.1. Every
//! behaviour is checked over both transports.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use wf_host::pool::{Pool, PoolError};

use common::fixture::*;

over_both_transports!(
    one_session_serves_200_sequential_and_64_concurrent_calls,
    list_changed_during_a_call_refreshes_the_catalog_on_the_same_session,
    a_timeout_cancels_the_request_and_keeps_the_session,
    resources_and_prompts_go_through_the_pooled_session,
    a_crash_mid_call_fails_every_pending_caller_and_the_next_call_reconnects,
    a_changed_connection_gets_a_new_session,
    a_tool_call_the_server_makes_a_task_is_followed_to_its_result,
    a_task_whose_caller_stops_waiting_is_cancelled_upstream,
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

/// How many calls of `tool` a fixture `call_log` result records.
fn calls_of(call_log: &Value, tool: &str) -> usize {
    call_log["structuredContent"]["calls"]
        .as_array()
        .map_or(0, |calls| {
            calls.iter().filter(|c| c["tool"] == tool).count()
        })
}

/// Waits up to 5 s until the fixture has received `n` calls of `tool`.
async fn wait_for_calls(pool: &Pool, tool: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = call(pool, "call_log", json!({})).await.unwrap();
        if calls_of(&log, tool) >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server got fewer than {n} `{tool}` calls: {log}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
    // The crash must land while all five are running on the server.
    wait_for_calls(&pool, "sleep", 5).await;
    let crashed_at = Instant::now();
    let crash = call(&pool, "crash", json!({})).await.unwrap_err();
    assert!(
        matches!(crash, PoolError::SessionClosed { .. }),
        "{crash:?}"
    );
    for task in pending {
        let (err, failed_at) = task.await.unwrap();
        assert!(matches!(err, PoolError::SessionClosed { .. }), "{err:?}");
        // Well before their 30 s sleeps end (a loaded 2-core machine may
        // take a moment to schedule them).
        assert!(
            failed_at.duration_since(crashed_at) < Duration::from_secs(5),
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
    // The dead session's owner closed cleanly (it once polled rmcp's finished
    // service future again and panicked, which also skipped reaping).
    assert_eq!(stats(&pool).session_panics, 0);
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
    // It went through the replay: refused with a 404, then sent again.
    assert_eq!(stats(&pool).replays, 1);
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_replays_only_the_call_that_got_it_and_fails_the_others_in_flight() {
    let server = HttpFixture::start("127.0.0.1:0");
    let pool = pool_with(http_connection(&server.url()));
    call(&pool, "echo", json!({"text": "warm"})).await.unwrap();

    // Three calls running on the server when the session is forgotten: they
    // may have had effects, so none of them may be sent again.
    let mut pending = Vec::new();
    for _ in 0..3 {
        let pool = pool.clone();
        pending.push(tokio::spawn(async move {
            call(&pool, "sleep", json!({"ms": 3000})).await
        }));
    }
    wait_for_calls(&pool, "sleep", 3).await;
    let forgot = call(&pool, "forget_session", json!({})).await.unwrap();
    assert_eq!(forgot["content"][0]["text"], "forgotten");

    // This call's own request gets the 404: it is replayed on a fresh session.
    let out = call(&pool, "echo", json!({"text": "after"})).await.unwrap();
    assert_eq!(out["content"][0]["text"], "after");
    for task in pending {
        let err = task.await.unwrap().unwrap_err();
        assert!(matches!(err, PoolError::SessionClosed { .. }), "{err:?}");
        assert_eq!(
            wf_host::pool::to_capability_error(err).code(),
            "unavailable"
        );
    }
    assert_eq!(stats(&pool).replays, 1);
    assert_eq!(stats(&pool).sessions_opened, 2);

    let log = call(&pool, "call_log", json!({})).await.unwrap();
    assert_eq!(calls_of(&log, "sleep"), 3, "a sleep was replayed: {log}");
    let after: Vec<_> = log["structuredContent"]["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["arguments"]["text"] == "after")
        .map(|c| c["session"].clone())
        .collect();
    // Refused on session 1 before the server looked at it; run once, on session 2.
    assert_eq!(after, [json!(2)], "{log}");
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_ping_does_not_hold_up_calls() {
    let pool = pool_with(connection_from_toml(
        "command = \"wf-host\"\nargs = [\"fixture-server\"]\nping_interval = \"100ms\"\nenv = { WF_FIXTURE_PING_DELAY_MS = \"4000\" }",
    ));
    call(&pool, "echo", json!({"text": "warm"})).await.unwrap();
    let quick = Duration::from_millis(1000);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let started = Instant::now();
        let log = call(&pool, "call_log", json!({})).await.unwrap();
        let took = started.elapsed();
        assert!(took < quick, "a call waited {took:?} behind a ping");
        let pings = &log["structuredContent"]["pings"];
        if pings["started"].as_u64() > pings["answered"].as_u64() {
            // A 4 s ping is in flight right now; another call still goes through.
            let started = Instant::now();
            let out = call(&pool, "echo", json!({"text": "during"}))
                .await
                .unwrap();
            assert_eq!(out["content"][0]["text"], "during");
            assert!(
                started.elapsed() < quick,
                "a call waited {:?} behind a ping",
                started.elapsed()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no ping reached the server: {log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(stats(&pool).sessions_opened, 1);
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_catalog_refresh_backs_off_and_keeps_the_session() {
    let pool = pool_with(connection_from_toml(
        "command = \"wf-host\"\nargs = [\"fixture-server\"]\nenv = { WF_FIXTURE_FAIL_RELIST = \"1\" }",
    ));
    let out = call(&pool, "register_extra", json!({})).await.unwrap();
    assert_eq!(out["content"][0]["text"], "registered");
    let started = Instant::now();
    // The initial listing, then three failed refreshes: the 2nd and 3rd wait
    // backoffs of at least 125ms and 250ms (full jitter in the upper half).
    let deadline = started + Duration::from_secs(10);
    loop {
        let log = call(&pool, "call_log", json!({})).await.unwrap();
        if log["structuredContent"]["tools_list_requests"].as_u64() >= Some(4) {
            break;
        }
        assert!(Instant::now() < deadline, "no retries: {log}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_millis(375),
        "three refreshes within {:?}: no backoff",
        started.elapsed()
    );
    // A failing refresh is no reason to drop a healthy session.
    call(&pool, "echo", json!({"text": "x"})).await.unwrap();
    assert_eq!(stats(&pool).sessions_opened, 1);
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_pagination_stops_at_the_page_cap() {
    let pool = pool_with(connection_from_toml(
        "command = \"wf-host\"\nargs = [\"fixture-server\"]\nenv = { WF_FIXTURE_ENDLESS_PAGES = \"1\" }",
    ));
    let tools = tokio::time::timeout(Duration::from_secs(15), pool.list_tools("fixture"))
        .await
        .expect("listing a server that paginates for ever ends")
        .unwrap();
    assert!(tools.iter().any(|t| t.name == "echo"), "{tools:?}");
    let log = call(&pool, "call_log", json!({})).await.unwrap();
    assert_eq!(
        log["structuredContent"]["tools_list_requests"],
        wf_host::pool::MAX_CATALOG_PAGES
    );
    pool.shutdown().await;
}

#[test]
fn zero_durations_are_refused_at_load_naming_connection_and_key() {
    for key in [
        "call_timeout",
        "max_call_time",
        "idle_timeout",
        "ping_interval",
    ] {
        let text = format!("[connections.fixture]\ncommand = \"wf-host\"\n{key} = \"0s\"\n");
        let err = wf_host::config::Config::parse(
            &text,
            std::path::Path::new("wf.toml"),
            Default::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "config file `wf.toml`: connection `fixture`: `{key}` must be greater than zero"
            )
        );
    }
}

#[test]
fn a_max_call_time_shorter_than_the_call_timeout_is_refused() {
    let text = "[connections.fixture]\ncommand = \"wf-host\"\ncall_timeout = \"1m\"\nmax_call_time = \"30s\"\n";
    let err =
        wf_host::config::Config::parse(text, std::path::Path::new("wf.toml"), Default::default())
            .unwrap_err();
    assert_eq!(
        err.to_string(),
        "config file `wf.toml`: connection `fixture`: `max_call_time` (30s) is shorter than `call_timeout` (1m)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_ping_interval_built_by_hand_does_not_kill_the_session() {
    let pool = pool_with(connection_from_toml(
        "command = \"wf-host\"\nargs = [\"fixture-server\"]\nping_interval = \"0s\"",
    ));
    for text in ["one", "two"] {
        let out = call(&pool, "echo", json!({"text": text})).await.unwrap();
        assert_eq!(out["content"][0]["text"], text);
    }
    assert_eq!(stats(&pool).sessions_opened, 1);
    pool.shutdown().await;
}

#[test]
fn a_stdio_server_sees_only_the_allowed_environment() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("wf.toml");
    std::fs::write(
        &config,
        r#"[connections.fixture]
command = "wf-host"
args = ["fixture-server"]
env = { FROM_CONFIG = "1" }
inherit_env = ["KEEP_ME", "NOT_IN_THE_HOST"]
"#,
    )
    .unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    let home = dir.path().to_str().unwrap();
    // The host's own environment, secrets included, and nothing else.
    let out = std::process::Command::new(common::wf_host_bin())
        .env_clear()
        .env("PATH", &path)
        .env("HOME", home)
        .env("WF_HOST_TOKEN", "s3cret")
        .env("SOME_SECRET", "x")
        .env("KEEP_ME", "kept")
        .arg("run")
        .arg(common::plugin("call"))
        .arg("--config")
        .arg(&config)
        .args(["--no-cache", "--allow", "fixture.env", "--input"])
        .arg(r#"{"capability": "fixture.env"}"#)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        result["structuredContent"]["env"],
        json!({"FROM_CONFIG": "1", "HOME": home, "KEEP_ME": "kept", "PATH": path}),
    );
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

/// The fixture answers `task_sleep` with a task (the pool declares the tasks
/// extension): the call follows it with `tasks/get` to its result, past the
/// connection's `call_timeout` (each answer restarts it), and the tool ran
/// once.
async fn a_tool_call_the_server_makes_a_task_is_followed_to_its_result(kind: Kind) {
    let (pool, _server) = match kind {
        Kind::Stdio => (
            pool_with(connection_from_toml(
                "command = \"wf-host\"\nargs = [\"fixture-server\"]\ncall_timeout = \"1s\"",
            )),
            None,
        ),
        Kind::Http => {
            let server = HttpFixture::start("127.0.0.1:0");
            let pool = pool_with(connection_from_toml(&format!(
                "url = \"{}\"\ncall_timeout = \"1s\"",
                server.url()
            )));
            (pool, Some(server))
        }
    };
    let result = call(&pool, "task_sleep", json!({"ms": 1800}))
        .await
        .unwrap();
    assert_eq!(
        result["content"][0]["text"], "slept 1800ms as a task",
        "{result}"
    );
    assert_ne!(result["isError"], true);
    let log = call(&pool, "call_log", json!({})).await.unwrap();
    assert_eq!(calls_of(&log, "task_sleep"), 1, "{log}");
    let polls = log["structuredContent"]["task_polls"].as_u64().unwrap();
    assert!(
        polls >= 5,
        "followed with tasks/get every 100 ms: {polls} polls"
    );
    pool.shutdown().await;
}

/// A call whose caller stops waiting (a cancelled run) cancels the task it
/// follows: `tasks/cancel` reaches the server, which records it.
async fn a_task_whose_caller_stops_waiting_is_cancelled_upstream(kind: Kind) {
    let (pool, _server) = fixture_pool(kind);
    let waited = tokio::time::timeout(
        Duration::from_millis(400),
        call(&pool, "task_sleep", json!({"ms": 60_000})),
    )
    .await;
    assert!(waited.is_err(), "the task cannot end in 400 ms");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = call(&pool, "call_log", json!({})).await.unwrap();
        let cancelled = &log["structuredContent"]["cancelled"];
        if cancelled
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["tool"] == "task_sleep"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the task was never cancelled: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pool.shutdown().await;
}
