//! The JSON-RPC endpoint: in-process through the router, and over a real socket
//! against `wf-host serve` with the fixture MCP server as a real child process.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tower::ServiceExt;
use wf_host::pool::{Pool, PoolConfig};
use wf_host::rpc::{Access, RpcState, handle_body, router};
use wf_host::runtime::{Runtime, RuntimeConfig};
use wf_host::workflow::Workflows;

use common::*;

/// A config with the fixture connection and three workflows.
fn write_config(dir: &std::path::Path) -> std::path::PathBuf {
    let root = repo_root();
    let config = format!(
        r#"[connections.fixture]
command = "wf-host"
args = ["fixture-server"]

[workflows.echo]
component = "{echo}"

[workflows.call]
component = "{call}"
allow = ["fixture.*"]

[workflows.spin]
component = "{misbehave}"
timeout = "60s"
"#,
        echo = root.join("plugins/echo.wasm").display(),
        call = root.join("plugins/call.wasm").display(),
        misbehave = root.join("tests/guests/misbehave.wasm").display(),
    );
    let path = dir.join("wf.toml");
    std::fs::write(&path, config).unwrap();
    path
}

/// `wf-host serve` on a free loopback port, killed and reaped on drop.
struct Server {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(dir.path());
        let mut child = Command::new(wf_host_bin())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--config",
                config.to_str().unwrap(),
            ])
            .args(extra)
            .env("WF_HOST_CACHE_DIR", dir.path().join("cache"))
            .env_remove("WF_HOST_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines.next().expect("server printed its address").unwrap();
            if let Some(rest) = line.strip_prefix("wf-host listening on ") {
                break rest.to_owned();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Server {
            child,
            url,
            _dir: dir,
        }
    }

    async fn post(&self, body: impl Into<String>, token: Option<&str>) -> (StatusCode, String) {
        let client = reqwest::Client::new();
        let mut req = client.post(&self.url).body(body.into());
        if let Some(token) = token {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        let resp = req.send().await.unwrap();
        let status = StatusCode::from_u16(resp.status().as_u16()).unwrap();
        (status, resp.text().await.unwrap())
    }

    async fn call(&self, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let (status, text) = self.post(body.to_string(), None).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let reply: Value = serde_json::from_str(&text).unwrap();
        match reply.get("result") {
            Some(result) => result.clone(),
            None => panic!("{method} failed: {reply}"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_and_workflows_share_one_mcp_session() {
    let server = Server::start(&[]);
    for text in ["a", "b"] {
        let out = server
            .call(
                "capability.call",
                json!({"name": "fixture.echo", "arguments": {"text": text}}),
            )
            .await;
        assert_eq!(out["content"][0]["text"], text);
    }
    for text in ["c", "d"] {
        let out = server
            .call(
                "workflow.start",
                json!({"workflow": "call", "wait": true, "input": {"capability": "fixture.echo", "arguments": {"text": text}}}),
            )
            .await;
        assert_eq!(out["status"], "succeeded", "{out}");
        assert_eq!(out["output"]["content"][0]["text"], text);
    }
    let resource = server
        .call(
            "resource.read",
            json!({"connection": "fixture", "uri": "fixture://greeting"}),
        )
        .await;
    assert_eq!(resource["contents"][0]["text"], "hello from the fixture");
    let prompt = server
        .call(
            "prompt.get",
            json!({"name": "fixture.greet", "arguments": {"name": "Ada"}}),
        )
        .await;
    assert_eq!(
        prompt["messages"][0]["content"]["text"],
        "Say hello to Ada."
    );

    let status = server.call("host.status", json!({})).await;
    let fixture = &status["connections"][0];
    assert_eq!(fixture["id"], "fixture");
    assert_eq!(fixture["sessions_opened"], 1, "{status}");
    assert_eq!(fixture["state"], "ready");
    // The server's own per-session counter agrees: one session did everything.
    let counted = server
        .call("capability.call", json!({"name": "fixture.counter"}))
        .await;
    assert_eq!(
        counted["structuredContent"],
        json!({"count": 1, "session": 1})
    );
    let counted = server
        .call(
            "workflow.start",
            json!({"workflow": "call", "wait": true, "input": {"capability": "fixture.counter"}}),
        )
        .await;
    assert_eq!(
        counted["output"]["structuredContent"],
        json!({"count": 2, "session": 1})
    );
    let log = server
        .call("capability.call", json!({"name": "fixture.call_log"}))
        .await;
    assert_eq!(log["structuredContent"]["sessions"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_without_waiting_then_wait_then_get() {
    let server = Server::start(&[]);
    let started = server
        .call(
            "workflow.start",
            json!({"workflow": "echo", "input": {"x": 1}}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    assert!(
        started["status"] == "running" || started["status"] == "succeeded",
        "{started}"
    );
    let waited = server
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 10000}),
        )
        .await;
    assert_eq!(waited["status"], "succeeded");
    assert_eq!(waited["output"], json!({"x": 1}));
    let got = server.call("workflow.get", json!([run_id])).await;
    assert_eq!(got, waited);
    assert_eq!(got["workflow"], "echo");
    assert_eq!(got["input"], json!({"x": 1}));
    assert!(got["started_at"].as_str().unwrap().ends_with('Z'));
    assert!(got["finished_at"].is_string());

    let list = server
        .call("workflow.list", json!({"status": "succeeded"}))
        .await;
    assert_eq!(list["runs"][0]["run_id"], run_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_looping_node_and_an_upstream_sleep() {
    let server = Server::start(&[]);
    let started = server
        .call(
            "workflow.start",
            json!({"workflow": "spin", "input": {"mode": "loop"}}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waited = server
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 100}),
        )
        .await;
    assert_eq!(waited["status"], "running");
    let cancelled = server
        .call("workflow.cancel", json!({"run_id": run_id}))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["error"]["code"], "cancelled");

    let started = server
        .call(
            "workflow.start",
            json!({"workflow": "call", "input": {"capability": "fixture.sleep", "arguments": {"ms": 60000}}}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let begun = Instant::now();
    let cancelled = server
        .call("workflow.cancel", json!({"run_id": run_id}))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert!(begun.elapsed() < Duration::from_secs(3));
    // The cancellation reached the MCP server as notifications/cancelled.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = server
            .call("capability.call", json!({"name": "fixture.call_log"}))
            .await;
        if common::fixture::saw_cancelled(&log, "sleep") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sleep was never cancelled upstream: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_returns_the_same_run() {
    let server = Server::start(&[]);
    let first = server
        .call(
            "workflow.start",
            json!({"workflow": "echo", "input": 1, "idempotency_key": "k1", "wait": true}),
        )
        .await;
    let again = server
        .call(
            "workflow.start",
            json!({"workflow": "echo", "input": 2, "idempotency_key": "k1", "wait": true}),
        )
        .await;
    assert_eq!(first["run_id"], again["run_id"]);
    assert_eq!(again["output"], 1);
    let other = server
        .call(
            "workflow.start",
            json!({"workflow": "echo", "input": 3, "idempotency_key": "k2"}),
        )
        .await;
    assert_ne!(other["run_id"], first["run_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_enforced() {
    let server = Server::start(&["--token", "s3cret"]);
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"host.status"}"#;
    assert_eq!(server.post(body, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        server.post(body, Some("wrong")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (status, text) = server.post(body, Some("s3cret")).await;
    assert_eq!(status, StatusCode::OK, "{text}");
}

#[test]
fn a_public_address_without_a_token_is_refused() {
    let out = Command::new(wf_host_bin())
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env_remove("WF_HOST_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: refusing to listen on 0.0.0.0:0 without a token: only loopback addresses are open without one; pass `--token` (or set WF_HOST_TOKEN), or listen on 127.0.0.1\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers() {
    let server = Server::start(&[]);
    let url = server.url.replace("/rpc", "/healthz");
    let resp = reqwest::get(url).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

/// In-process state: the pool and workflows without a socket.
async fn state() -> (RpcState, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = wf_host::config::Config::load(&write_config(dir.path())).unwrap();
    let pool = Pool::new(PoolConfig {
        connections: config.connections.clone(),
        self_exe: Some(wf_host_bin()),
        ..Default::default()
    });
    let runtime = Runtime::new(
        RuntimeConfig {
            cache_dir: Some(dir.path().join("cache")),
            ..Default::default()
        },
        Arc::new(pool.clone()),
    )
    .unwrap();
    let options = wf_host::workflow::Options {
        keep_runs: 10,
        ..Default::default()
    };
    let workflows = Workflows::open(&config, Arc::new(runtime), options)
        .await
        .unwrap();
    (
        RpcState {
            workflows,
            pool,
        },
        dir,
    )
}

async fn answer(state: &RpcState, body: &str) -> Option<Value> {
    handle_body(state, body.as_bytes()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_code_is_spec_exact() {
    let (state, _dir) = state().await;
    let cases = [
        (
            "{",
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "parse error: EOF while parsing an object at line 1 column 1"}}),
        ),
        (
            "[]",
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "an empty batch is not a request"}}),
        ),
        (
            "42",
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "a request must be a JSON object"}}),
        ),
        (
            r#"{"jsonrpc":"1.0","id":7,"method":"host.status"}"#,
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32600, "message": "`jsonrpc` must be exactly \"2.0\""}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":7}"#,
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32600, "message": "`method` is missing"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"host.status","params":3}"#,
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32600, "message": "`params` must be an object or an array"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":{},"method":"host.status"}"#,
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "`id` must be a string, a number or null"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":"a","method":"nope"}"#,
            json!({"jsonrpc": "2.0", "id": "a", "error": {"code": -32601, "message": "method `nope` not found; `rpc.discover` lists the methods"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"workflow.get"}"#,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "missing field `run_id`"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"workflow.wait","params":{"run_id":"x","timeout_ms":"soon"}}"#,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "param `timeout_ms`: invalid type: string \"soon\", expected u64"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"workflow.start","params":{"workflow":"nope"}}"#,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": "unknown workflow `nope`"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"workflow.get","params":["run-0"]}"#,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32002, "message": "unknown run `run-0`"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"workflow.get","params":["a","b"]}"#,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "expected at most 1 positional params (run_id), got 2"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"capability.call","params":{"name":"nowhere.echo"}}"#,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32006, "message": "no connection `nowhere`", "data": {"kind": "not-found"}}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"capability.call","params":{"name":"fixture.echo","arguments":{"text":1}}}"#,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "arguments for `fixture.echo` do not match its input schema: `/text`: 1 is not of type \"string\"", "data": {"kind": "invalid-arguments"}}}),
        ),
    ];
    for (body, expected) in cases {
        assert_eq!(answer(&state, body).await, Some(expected), "body: {body}");
    }
    // Notifications get no response, alone or in a batch.
    assert_eq!(
        answer(&state, r#"{"jsonrpc":"2.0","method":"host.status"}"#).await,
        None
    );
    assert_eq!(
        answer(&state, r#"{"jsonrpc":"2.0","method":"nope"}"#).await,
        None
    );
    let batch = answer(
        &state,
        r#"[{"jsonrpc":"2.0","method":"host.status"},{"jsonrpc":"2.0","id":1,"method":"rpc.discover"},{"foo":1},{"jsonrpc":"2.0","id":2,"method":"nope"}]"#,
    )
    .await
    .unwrap();
    let batch = batch.as_array().unwrap();
    assert_eq!(batch.len(), 3);
    assert_eq!(batch[0]["result"]["openrpc"], "1.3.2");
    assert_eq!(batch[1]["error"]["code"], -32600);
    assert_eq!(batch[2]["error"]["code"], -32601);
    state.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_answers_in_process_and_refuses_big_bodies() {
    let (state, _dir) = state().await;
    let app = router(
        state.clone(),
        Access {
            token: None,
            max_body: 1024,
        },
    );
    let post = |body: String| Request::post("/rpc").body(Body::from(body)).unwrap();
    let resp = app
        .clone()
        .oneshot(post(r#"{"jsonrpc":"2.0","id":1,"method":"workflow.start","params":{"workflow":"echo","input":"hi","wait":true}}"#.into()))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = serde_json::from_slice(
        &axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(body["result"]["output"], "hi");

    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"host.status","params":{{"pad":"{}"}}}}"#,
        "x".repeat(4096)
    );
    let resp = app.clone().oneshot(post(big)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = serde_json::from_slice(
        &axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        body,
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "request body exceeds 1024 bytes"}})
    );

    let resp = app
        .clone()
        .oneshot(post(r#"{"jsonrpc":"2.0","method":"host.status"}"#.into()))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    // Still serving after all that.
    let resp = app
        .oneshot(post(
            r#"{"jsonrpc":"2.0","id":9,"method":"rpc.discover"}"#.into(),
        ))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    state.pool.shutdown().await;
}

/// Checks that `reply` is a valid JSON-RPC response object.
fn assert_valid_response(reply: &Value) {
    let obj = reply
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {reply}"));
    assert_eq!(obj.get("jsonrpc"), Some(&json!("2.0")), "{reply}");
    assert!(obj.contains_key("id"), "{reply}");
    match (obj.get("result"), obj.get("error")) {
        (Some(_), None) => {}
        (None, Some(error)) => {
            assert!(error["code"].is_i64(), "{reply}");
            assert!(error["message"].is_string(), "{reply}");
        }
        _ => panic!("exactly one of result/error: {reply}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_malformed_bodies_get_valid_errors() {
    let (state, _dir) = state().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let methods = [
        "workflow.start",
        "workflow.get",
        "workflow.wait",
        "workflow.list",
        "capability.list",
        "host.status",
        "rpc.discover",
        "nope",
        "",
    ];
    let values = [
        json!(null),
        json!(1),
        json!(-1.5),
        json!("s"),
        json!([]),
        json!({}),
        json!([1, "x"]),
        json!({"run_id": 3}),
        json!(true),
    ];
    for i in 0..3000 {
        let body: Vec<u8> = match i % 4 {
            // Random bytes.
            0 => (0..rng.random_range(0..64)).map(|_| rng.random()).collect(),
            // A valid request, truncated.
            1 => {
                let full = json!({"jsonrpc": "2.0", "id": i, "method": methods[i % methods.len()], "params": {"run_id": "r"}}).to_string();
                full.as_bytes()[..rng.random_range(0..full.len())].to_vec()
            }
            // Well-formed JSON with wrong shapes.
            2 => {
                let mut obj = serde_json::Map::new();
                for key in ["jsonrpc", "id", "method", "params"] {
                    if rng.random_bool(0.7) {
                        obj.insert(
                            key.into(),
                            values[rng.random_range(0..values.len())].clone(),
                        );
                    }
                }
                if rng.random_bool(0.5) {
                    obj.insert("jsonrpc".into(), json!("2.0"));
                }
                if rng.random_bool(0.5) {
                    obj.insert(
                        "method".into(),
                        json!(methods[rng.random_range(0..methods.len())]),
                    );
                }
                obj.insert("id".into(), json!(i));
                Value::Object(obj).to_string().into_bytes()
            }
            // Batches mixing all of the above.
            _ => {
                let items: Vec<Value> = (0..rng.random_range(1..5))
                    .map(|j| match j % 3 {
                        0 => values[rng.random_range(0..values.len())].clone(),
                        1 => json!({"jsonrpc": "2.0", "id": j, "method": methods[rng.random_range(0..methods.len())], "params": values[rng.random_range(4..8)]}),
                        _ => json!({"jsonrpc": "2.0", "method": "host.status"}),
                    })
                    .collect();
                Value::Array(items).to_string().into_bytes()
            }
        };
        match handle_body(&state, &body).await {
            None => {}
            Some(Value::Array(replies)) => replies.iter().for_each(assert_valid_response),
            Some(reply) => assert_valid_response(&reply),
        }
    }
    state.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_finished_runs_are_evicted_past_the_limit() {
    let (state, _dir) = state().await; // keeps 10 runs
    let mut ids = Vec::new();
    for i in 0..15 {
        let body = json!({"jsonrpc": "2.0", "id": i, "method": "workflow.start", "params": {"workflow": "echo", "input": i, "wait": true}});
        let reply = answer(&state, &body.to_string()).await.unwrap();
        assert_eq!(reply["result"]["status"], "succeeded", "{reply}");
        ids.push(reply["result"]["run_id"].as_str().unwrap().to_owned());
    }
    let list = answer(
        &state,
        r#"{"jsonrpc":"2.0","id":1,"method":"workflow.list","params":{"limit":100}}"#,
    )
    .await
    .unwrap();
    let kept: Vec<_> = list["result"]["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_owned())
        .collect();
    let newest_first: Vec<_> = ids[5..].iter().rev().cloned().collect();
    assert_eq!(kept, newest_first);
    let gone = answer(
        &state,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "workflow.get", "params": [ids[0]]})
            .to_string(),
    )
    .await
    .unwrap();
    assert_eq!(gone["error"]["code"], -32002);
    state.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cancels_runs_after_the_grace_period_and_reaps_the_mcp_server() {
    let mut server = Server::start(&["--grace", "300ms"]);
    server
        .call(
            "capability.call",
            json!({"name": "fixture.echo", "arguments": {"text": "x"}}),
        )
        .await;
    let status = server.call("host.status", json!({})).await;
    let fixture_pid = status["connections"][0]["pid"].as_u64().unwrap() as u32;
    server
        .call(
            "workflow.start",
            json!({"workflow": "spin", "input": {"mode": "loop"}}),
        )
        .await;

    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "wf-host serve did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(exit.code(), Some(0));
    assert!(
        common::fixture::process_gone(fixture_pid),
        "the fixture server {fixture_pid} outlived the host"
    );
}
