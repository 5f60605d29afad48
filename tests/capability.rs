//! The `capability` interface end to end: a real node (tests/guests/probe) calls
//! each WIT function through the pool to a real fixture MCP server process, with
//! grants checked at the host boundary.

mod common;

use std::sync::Arc;

use serde_json::{Map, Value, json};
use wf_host::grants::Grants;
use wf_host::pool::Pool;
use wf_host::runtime::{RunOptions, Runtime, RuntimeConfig};

use common::fixture::*;
use common::*;

struct Harness {
    pool: Pool,
    runtime: Runtime,
    probe: wf_host::runtime::Node,
    _cache: tempfile::TempDir,
}

impl Harness {
    fn new() -> Harness {
        let pool = pool_with(stdio_connection());
        let (runtime, cache) = runtime_with(RuntimeConfig::default(), Arc::new(pool.clone()));
        let probe = runtime.load(&guest("probe")).unwrap();
        Harness {
            pool,
            runtime,
            probe,
            _cache: cache,
        }
    }

    /// Runs the probe with `grants`; returns what the guest saw and the report.
    async fn probe(&self, grants: &[&str], input: Value) -> (Value, wf_host::runtime::RunReport) {
        let opts = RunOptions {
            grants: Arc::new(Grants::new(grants).unwrap()),
            ..Default::default()
        };
        let report = self
            .runtime
            .run(&self.probe, &input.to_string(), opts)
            .await;
        let seen = serde_json::from_str(expect_ok(&report)).unwrap();
        (seen, report)
    }

    /// The calls the fixture received, straight from the fixture.
    async fn upstream_calls(&self) -> Vec<Value> {
        let log = self
            .pool
            .call_tool("fixture", "call_log", Map::new(), None)
            .await
            .unwrap();
        log["structuredContent"]["calls"]
            .as_array()
            .unwrap()
            .clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_tool_returns_the_call_tool_result() {
    let h = Harness::new();
    let (seen, _) = h
        .probe(
            &["fixture.echo"],
            json!({"op": "call-tool", "name": "fixture.echo", "arguments": {"text": "hi"}}),
        )
        .await;
    assert_eq!(
        seen,
        json!({"ok": {"content": [{"type": "text", "text": "hi"}], "structuredContent": {"text": "hi"}, "isError": false}})
    );
    assert_eq!(
        h.upstream_calls().await,
        vec![json!({"session": 1, "tool": "echo", "arguments": {"text": "hi"}})]
    );
    h.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_answering_is_error_is_a_tool_error_with_its_text() {
    let h = Harness::new();
    let (seen, _) = h
        .probe(
            &["fixture.*"],
            json!({"op": "call-tool", "name": "fixture.fail", "arguments": {"message": "disk full"}}),
        )
        .await;
    assert_eq!(
        seen,
        json!({"err": {"code": "tool-error", "message": "disk full"}})
    );
    h.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_resource_returns_the_contents() {
    let h = Harness::new();
    let (seen, _) = h
        .probe(
            &["fixture.fixture://*"],
            json!({"op": "read-resource", "connection": "fixture", "uri": "fixture://config.json"}),
        )
        .await;
    assert_eq!(seen["ok"]["contents"][0]["uri"], "fixture://config.json");
    let text = seen["ok"]["contents"][0]["text"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(text).unwrap(),
        json!({"answer": 42})
    );

    let (seen, _) = h
        .probe(
            &["fixture.fixture://*"],
            json!({"op": "read-resource", "connection": "fixture", "uri": "fixture://missing"}),
        )
        .await;
    assert_eq!(seen["err"]["code"], "not-found", "{seen}");
    h.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_prompt_renders_the_prompt() {
    let h = Harness::new();
    let (seen, _) = h
        .probe(
            &["fixture.greet"],
            json!({"op": "get-prompt", "name": "fixture.greet", "arguments": {"name": "Ada"}}),
        )
        .await;
    assert_eq!(seen["ok"]["messages"][0]["role"], "user");
    assert_eq!(
        seen["ok"]["messages"][0]["content"]["text"],
        "Say hello to Ada."
    );
    h.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_only_granted_capabilities_with_schemas() {
    let h = Harness::new();
    let (seen, _) = h
        .probe(
            &[
                "fixture.echo",
                "fixture.greet",
                "fixture.fixture://greeting",
            ],
            json!({"op": "list"}),
        )
        .await;
    let items = seen["ok"].as_array().unwrap();
    let names: Vec<_> = items.iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "fixture.echo",
            "fixture.fixture://greeting",
            "fixture.greet"
        ]
    );
    let echo = &items[0];
    assert_eq!(echo["kind"], "tool");
    assert!(echo["description"].as_str().is_some_and(|d| !d.is_empty()));
    assert_eq!(echo["schema"]["properties"]["text"]["type"], "string");
    assert_eq!(items[1]["kind"], "resource");
    assert_eq!(items[2]["kind"], "prompt");
    assert_eq!(items[2]["schema"][0]["name"], "name");

    let (seen, _) = h.probe(&[], json!({"op": "list"})).await;
    assert_eq!(seen, json!({"ok": []}));
    h.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_records_are_kept_with_the_run() {
    let h = Harness::new();
    let (seen, report) = h
        .probe(
            &[],
            json!({"op": "log", "messages": [["info", "hello"], ["error", "bad thing"]]}),
        )
        .await;
    assert_eq!(seen, json!({"ok": 2}));
    let logs: Vec<_> = report
        .logs
        .iter()
        .map(|l| (l.level, l.message.as_str()))
        .collect();
    assert_eq!(logs, [("info", "hello"), ("error", "bad thing")]);
    h.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_is_named_and_never_reaches_the_upstream() {
    let h = Harness::new();
    let (seen, _) = h
        .probe(
            &["fixture.echo"],
            json!({"op": "call-tool", "name": "fixture.add", "arguments": {"a": 1, "b": 2}}),
        )
        .await;
    assert_eq!(
        seen,
        json!({"err": {"code": "denied", "message": "`fixture.add` is not granted to this node (its grants are `fixture.echo`); allow it with the grant `fixture.add` or `fixture.*`"}})
    );
    let (seen, _) = h
        .probe(
            &[],
            json!({"op": "read-resource", "connection": "fixture", "uri": "fixture://greeting"}),
        )
        .await;
    assert_eq!(seen["err"]["code"], "denied");
    let (seen, _) = h
        .probe(
            &["fixture.echo"],
            json!({"op": "get-prompt", "name": "fixture.greet", "arguments": {"name": "x"}}),
        )
        .await;
    assert_eq!(seen["err"]["code"], "denied");
    assert_eq!(h.upstream_calls().await, Vec::<Value>::new());
    h.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_invalid_arguments_never_reach_the_upstream() {
    let h = Harness::new();
    let (seen, _) = h
        .probe(
            &["fixture.*"],
            json!({"op": "call-tool", "name": "fixture.echo", "arguments": {"text": 5}}),
        )
        .await;
    assert_eq!(seen["err"]["code"], "invalid-arguments");
    let message = seen["err"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("arguments for `fixture.echo` do not match its input schema: `/text`: 5 is not of type \"string\""),
        "{message}"
    );
    let (seen, _) = h
        .probe(
            &["fixture.*"],
            json!({"op": "call-tool", "name": "fixture.add", "arguments": {"a": 1}}),
        )
        .await;
    assert_eq!(seen["err"]["code"], "invalid-arguments");
    assert!(
        seen["err"]["message"]
            .as_str()
            .unwrap()
            .contains("\"b\" is a required property"),
        "{seen}"
    );
    assert_eq!(h.upstream_calls().await, Vec::<Value>::new());
    h.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_that_are_not_json_objects_are_invalid_arguments() {
    let h = Harness::new();
    let (seen, _) = h
        .probe(
            &["fixture.*"],
            json!({"op": "call-tool-raw", "name": "fixture.echo", "arguments_text": "{nope"}),
        )
        .await;
    assert_eq!(seen["err"]["code"], "invalid-arguments");
    assert!(
        seen["err"]["message"]
            .as_str()
            .unwrap()
            .starts_with("arguments are not valid JSON: key must be a string at line 1 column 2"),
        "{seen}"
    );
    let (seen, _) = h
        .probe(
            &["fixture.*"],
            json!({"op": "call-tool-raw", "name": "fixture.echo", "arguments_text": "[1]"}),
        )
        .await;
    assert_eq!(
        seen,
        json!({"err": {"code": "invalid-arguments", "message": "arguments must be a JSON object, got an array"}})
    );
    h.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tools_and_connections_are_not_found() {
    let h = Harness::new();
    let (seen, _) = h
        .probe(
            &["*.*"],
            json!({"op": "call-tool", "name": "fixture.nope", "arguments": {}}),
        )
        .await;
    assert_eq!(seen["err"]["code"], "not-found");
    assert!(
        seen["err"]["message"].as_str().unwrap().starts_with(
            "connection `fixture` has no tool `nope`; granted tools on it: add, ask, call_log"
        ),
        "{seen}"
    );
    let (seen, _) = h
        .probe(
            &["*.*"],
            json!({"op": "call-tool", "name": "elsewhere.echo", "arguments": {}}),
        )
        .await;
    assert_eq!(
        seen,
        json!({"err": {"code": "not-found", "message": "no connection `elsewhere`"}})
    );
    let (seen, _) = h
        .probe(
            &["*.*"],
            json!({"op": "call-tool", "name": "unqualified", "arguments": {}}),
        )
        .await;
    assert_eq!(seen["err"]["code"], "invalid-arguments");
    h.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_visible_errors_leak_no_host_paths() {
    let pool = pool_with(connection_from_toml(
        "command = \"/opt/secret-dir/mcp-server\"\nenv = { API_KEY = \"sk-secret\" }",
    ));
    let (runtime, _cache) = runtime_with(RuntimeConfig::default(), Arc::new(pool.clone()));
    let probe = runtime.load(&guest("probe")).unwrap();
    let opts = RunOptions {
        grants: Arc::new(Grants::new(["fixture.*"]).unwrap()),
        ..Default::default()
    };
    let input = json!({"op": "call-tool", "name": "fixture.echo", "arguments": {"text": "x"}});
    let report = runtime.run(&probe, &input.to_string(), opts).await;
    let seen: Value = serde_json::from_str(expect_ok(&report)).unwrap();
    assert_eq!(
        seen,
        json!({"err": {"code": "unavailable", "message": "connection `fixture` could not be established"}})
    );
    // The operator still sees the detail.
    let stats = pool.connection_stats("fixture").unwrap();
    assert!(
        stats
            .last_error
            .unwrap()
            .contains("/opt/secret-dir/mcp-server")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_found_tool_names_only_granted_tools() {
    let h = Harness::new();
    let (seen, _) = h
        .probe(
            &["fixture.ech*", "fixture.add"],
            json!({"op": "call-tool", "name": "fixture.echoo", "arguments": {}}),
        )
        .await;
    assert_eq!(
        seen,
        json!({"err": {"code": "not-found", "message": "connection `fixture` has no tool `echoo`; granted tools on it: add, echo"}})
    );
    h.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_segment_uris_are_denied_whatever_the_grants() {
    let h = Harness::new();
    // The plain URI under the granted prefix is allowed and reaches the server.
    let (seen, _) = h
        .probe(
            &["fixture.fixture://*"],
            json!({"op": "read-resource", "connection": "fixture", "uri": "fixture://config.json"}),
        )
        .await;
    assert!(seen.get("ok").is_some(), "{seen}");
    for uri in [
        "fixture://public/../config.json",
        "fixture://public/%2e%2e/config.json",
        "fixture://public/%2E%2e%2fconfig.json",
        "fixture://public/.%2E/config.json",
    ] {
        let (seen, _) = h
            .probe(
                &["fixture.fixture://public/*"],
                json!({"op": "read-resource", "connection": "fixture", "uri": uri}),
            )
            .await;
        assert_eq!(
            seen,
            json!({"err": {"code": "denied", "message": format!("`fixture.{uri}` has a `.` or `..` path segment (possibly percent-encoded), which no grant allows; name the resource by its plain path")}}),
            "{uri}"
        );
    }
    h.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_opens_only_the_connections_the_grants_can_reach() {
    init_tracing();
    let pool = Pool::new(wf_host::pool::PoolConfig {
        connections: std::collections::BTreeMap::from([
            ("fixture".to_owned(), stdio_connection()),
            ("other".to_owned(), stdio_connection()),
        ]),
        self_exe: Some(wf_host_bin()),
        ..Default::default()
    });
    let (runtime, _cache) = runtime_with(RuntimeConfig::default(), Arc::new(pool.clone()));
    let probe = runtime.load(&guest("probe")).unwrap();
    let opts = RunOptions {
        grants: Arc::new(Grants::new(["fixture.echo"]).unwrap()),
        ..Default::default()
    };
    let report = runtime
        .run(&probe, &json!({"op": "list"}).to_string(), opts)
        .await;
    let seen: Value = serde_json::from_str(expect_ok(&report)).unwrap();
    let names: Vec<_> = seen["ok"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fixture.echo"]);
    let opened = |c: &str| pool.connection_stats(c).unwrap().sessions_opened;
    assert_eq!((opened("fixture"), opened("other")), (1, 0));
    pool.shutdown().await;
}
