//! What the pool checks about upstream tools, against real fixture servers:
//! pinned definitions (`wf.lock`), output schemas, progress that keeps a long
//! call alive, and a catalog that stays current when the server cannot push.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};
use wf_host::capability::{CallExtras, CapabilityBackend, CapabilityError, Progress};
use wf_host::pool::pin::Pins;
use wf_host::pool::{Pool, PoolConfig, PoolError};

use common::fixture::*;
use common::*;

fn args(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// The tools the fixture was called with, from its own log.
async fn upstream_tools(pool: &Pool) -> Vec<String> {
    let log = pool
        .call_tool("fixture", "call_log", Map::new(), None)
        .await
        .unwrap();
    log["structuredContent"]["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tool"].as_str().unwrap().to_owned())
        .collect()
}

/// `wf-host pin --config <dir>/wf.toml`; its stdout.
fn pin(dir: &Path) -> String {
    let out = Command::new(wf_host_bin())
        .args(["pin", "--config"])
        .arg(dir.join("wf.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pin failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A pool on `url` as `fixture`, with the pins of `dir/wf.lock`.
fn pinned_pool(dir: &Path, url: &str) -> Pool {
    init_tracing();
    let pins = Pins::load(&dir.join("wf.lock")).unwrap().expect("a lock");
    Pool::new(PoolConfig {
        connections: BTreeMap::from([("fixture".to_owned(), http_connection(url))]),
        pins: Some(Arc::new(pins)),
        ..Default::default()
    })
}

/// Waits until the catalog of `fixture` has a version past `version`.
async fn next_catalog(pool: &Pool, version: u64) -> Arc<wf_host::pool::Catalog> {
    let mut catalog = pool.watch_catalog("fixture").await.unwrap();
    let seen = tokio::time::timeout(
        Duration::from_secs(5),
        catalog.wait_for(|c| c.version > version),
    )
    .await
    .expect("the catalog was refreshed within 5s")
    .unwrap();
    seen.clone()
}

async fn echo(pool: &Pool) -> Result<Value, CapabilityError> {
    CapabilityBackend::call_tool(pool, "fixture", "echo", args(json!({"text": "hi"}))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_definition_is_refused_before_anything_is_sent_until_re_pinned() {
    let server = HttpFixture::start("127.0.0.1:0");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("wf.toml"),
        format!("[connections.fixture]\nurl = {:?}\n", server.url()),
    )
    .unwrap();
    let printed = pin(dir.path());
    assert!(printed.starts_with("wrote "), "{printed}");
    let lock = std::fs::read_to_string(dir.path().join("wf.lock")).unwrap();
    assert!(
        lock.contains("[connections.fixture]") && lock.contains("echo = \"sha256:"),
        "{lock}"
    );

    let pool = pinned_pool(dir.path(), &server.url());
    assert_eq!(
        echo(&pool).await.unwrap()["structuredContent"]["text"],
        "hi"
    );
    let status = pool.connection_stats("fixture").unwrap();
    assert!(status.drifted.is_empty(), "{status:?}");

    // The server changes echo's description and says so.
    let before = pool.catalog("fixture").await.unwrap().version;
    pool.call_tool(
        "fixture",
        "set_description",
        args(json!({"tool": "echo", "description": "Now also emails your notes away."})),
        None,
    )
    .await
    .unwrap();
    next_catalog(&pool, before).await;
    let err = echo(&pool).await.unwrap_err();
    assert!(
        matches!(&err, CapabilityError::Denied(m)
            if m.contains("`fixture.echo` changed since it was pinned in wf.lock")
                && m.contains("re-run `wf-host pin`")),
        "{err:?}"
    );
    let status = pool.connection_stats("fixture").unwrap();
    assert_eq!(
        serde_json::to_value(&status.drifted).unwrap(),
        json!([{"tool": "echo", "reason": "changed"}])
    );
    // Only the first echo reached the server.
    let calls = upstream_tools(&pool).await;
    assert_eq!(calls, ["echo", "set_description"]);

    // A tool the lock never saw is refused too.
    pool.call_tool("fixture", "register_extra", Map::new(), None)
        .await
        .unwrap();
    let version = pool.catalog("fixture").await.unwrap().version;
    if pool
        .catalog("fixture")
        .await
        .unwrap()
        .tool("extra")
        .is_none()
    {
        next_catalog(&pool, version).await;
    }
    let err = CapabilityBackend::call_tool(&pool, "fixture", "extra", Map::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CapabilityError::Denied(m) if m.contains("`fixture.extra` is not pinned")),
        "{err:?}"
    );
    pool.shutdown().await;

    // Reviewed and re-pinned: the new definition is the pinned one.
    let printed = pin(dir.path());
    assert!(printed.starts_with("wrote "), "{printed}");
    let pool = pinned_pool(dir.path(), &server.url());
    assert_eq!(
        echo(&pool).await.unwrap()["structuredContent"]["text"],
        "hi"
    );
    assert!(pin(dir.path()).starts_with("unchanged:"));
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_run_from_the_cli_is_denied_a_drifted_tool() {
    let server = HttpFixture::start("127.0.0.1:0");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("wf.toml");
    std::fs::write(
        &config,
        format!("[connections.fixture]\nurl = {:?}\n", server.url()),
    )
    .unwrap();
    pin(dir.path());
    let run = || {
        Command::new(wf_host_bin())
            .args(["run", "--allow", "fixture.*", "--config"])
            .arg(&config)
            .arg(plugin("call"))
            .args([
                "--input",
                r#"{"capability": "fixture.echo", "arguments": {"text": "hi"}}"#,
            ])
            .env("WF_HOST_CACHE_DIR", dir.path().join("cache"))
            .output()
            .unwrap()
    };
    let out = run();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pool = pool_with(http_connection(&server.url()));
    pool.call_tool(
        "fixture",
        "set_description",
        args(json!({"tool": "echo", "description": "changed", "notify": false})),
        None,
    )
    .await
    .unwrap();
    pool.shutdown().await;
    let out = run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("denied") && stderr.contains("changed since it was pinned"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_that_breaks_the_output_schema_is_a_tool_error_naming_the_field() {
    let pool = pool_with(stdio_connection());
    let shaped = |count: Value| {
        CapabilityBackend::call_tool(&pool, "fixture", "shaped", args(json!({"count": count})))
    };
    assert_eq!(
        shaped(json!(3)).await.unwrap()["structuredContent"],
        json!({"count": 3})
    );
    let err = shaped(json!("three")).await.unwrap_err();
    assert!(
        matches!(&err, CapabilityError::ToolError(m)
            if m.contains("output schema") && m.contains("`/count`")),
        "{err:?}"
    );
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_keeps_a_call_alive_past_its_timeout_and_a_silent_call_times_out() {
    let pool = pool_with(connection_from_toml(
        r#"command = "wf-host"
args = ["fixture-server"]
call_timeout = "400ms""#,
    ));
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink = seen.clone();
    let extras = CallExtras {
        progress: Some(Arc::new(move |p| sink.lock().unwrap().push(p))),
        ..Default::default()
    };
    // Six reports 150 ms apart: 900 ms in all, never 400 ms of silence.
    let result = CapabilityBackend::call_tool_with(
        &pool,
        "fixture",
        "progress",
        args(json!({"steps": 6, "interval_ms": 150})),
        extras,
    )
    .await
    .unwrap();
    assert_eq!(result["structuredContent"], json!({"steps": 6}));
    // Notifications are handled on their own tasks: the last may land just
    // after the result.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while seen.lock().unwrap().last().map(|p| p.progress) != Some(6.0)
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 5, "{seen:?}");
    assert_eq!(
        seen.last().unwrap(),
        &Progress {
            progress: 6.0,
            total: Some(6.0),
            message: Some("step 6 of 6".into())
        }
    );
    // As long, but silent: the timeout ends it and cancels it upstream.
    let err = pool
        .call_tool("fixture", "sleep", args(json!({"ms": 900})), None)
        .await
        .unwrap_err();
    assert!(matches!(err, PoolError::Timeout { .. }), "{err:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let log = pool
            .call_tool("fixture", "call_log", Map::new(), None)
            .await
            .unwrap();
        if saw_cancelled(&log, "sleep") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no cancel upstream: {log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_event_stream_the_catalog_is_polled_and_status_says_so() {
    let server = HttpFixture::start_with_env("127.0.0.1:0", &[("WF_FIXTURE_NO_EVENT_STREAM", "1")]);
    let pool = pool_with(connection_from_toml(&format!(
        "url = {:?}\ncatalog_refresh = \"300ms\"",
        server.url()
    )));
    let catalog = pool.catalog("fixture").await.unwrap();
    // Give a refused stream time to be refused.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = pool.connection_stats("fixture").unwrap();
    assert_eq!(status.notifications, Some("polling"), "{status:?}");
    // A change the server does not announce is seen at the next re-list.
    pool.call_tool(
        "fixture",
        "set_description",
        args(json!({"tool": "add", "description": "Adds, quietly.", "notify": false})),
        None,
    )
    .await
    .unwrap();
    let fresh = next_catalog(&pool, catalog.version).await;
    assert_eq!(
        fresh.tool("add").unwrap().description.as_deref(),
        Some("Adds, quietly.")
    );
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_event_stream_status_says_live_and_an_unchanged_re_list_publishes_nothing() {
    let server = HttpFixture::start("127.0.0.1:0");
    let pool = pool_with(connection_from_toml(&format!(
        "url = {:?}\ncatalog_refresh = \"200ms\"",
        server.url()
    )));
    let catalog = pool.catalog("fixture").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while pool.connection_stats("fixture").unwrap().notifications != Some("live") {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            pool.connection_stats("fixture")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Several re-lists later, nothing changed, so no new version.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let log = pool
        .call_tool("fixture", "call_log", Map::new(), None)
        .await
        .unwrap();
    assert!(
        log["structuredContent"]["tools_list_requests"]
            .as_u64()
            .unwrap()
            >= 3,
        "{log}"
    );
    assert_eq!(
        pool.catalog("fixture").await.unwrap().version,
        catalog.version
    );
    pool.shutdown().await;

    let stdio = pool_with(stdio_connection());
    stdio.catalog("fixture").await.unwrap();
    assert_eq!(
        stdio.connection_stats("fixture").unwrap().notifications,
        Some("live")
    );
    stdio.shutdown().await;
}
