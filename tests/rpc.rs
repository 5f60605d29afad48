//! The JSON-RPC endpoint: in-process through the router, and over a real socket
//! against `wf-host serve` with the fixture MCP server as a real child process.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tower::ServiceExt;
use wf_host::grants::Grants;
use wf_host::host::{Host, HostOptions};
use wf_host::pool::PoolConfig;
use wf_host::rpc::{Access, RpcState, handle_body, router};
use wf_host::runtime::RuntimeConfig;

use common::*;

/// A config with the fixture connection, three workflows and `extra` TOML.
fn write_config_with(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
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
{extra}
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
        Server::start_with(extra, "", &[])
    }

    /// With `config` appended to the config file and `env` set.
    fn start_with(extra: &[&str], config: &str, env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config_with(dir.path(), config);
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
            .envs(env.iter().copied())
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
        // Then where its console is, and where it keeps its state.
        let console = lines.next().unwrap().unwrap();
        assert_eq!(
            console,
            format!("console: {}", url.trim_end_matches("rpc")),
            "the console's address comes next"
        );
        let state = lines.next().unwrap().unwrap();
        assert!(state.starts_with("state: "), "{state}");
        std::thread::spawn(move || for _ in lines {});
        Server {
            child,
            url,
            _dir: dir,
        }
    }

    async fn post(&self, body: impl Into<String>, token: Option<&str>) -> (StatusCode, String) {
        let client = common::http_client();
        let mut req = client
            .post(&self.url)
            .header("Content-Type", "application/json")
            .body(body.into());
        if let Some(token) = token {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        let resp = req.send().await.unwrap();
        let status = StatusCode::from_u16(resp.status().as_u16()).unwrap();
        (status, resp.text().await.unwrap())
    }

    async fn call(&self, method: &str, params: Value) -> Value {
        let reply = self.reply(method, params).await;
        match reply.get("result") {
            Some(result) => result.clone(),
            None => panic!("{method} failed: {reply}"),
        }
    }

    /// The whole JSON-RPC reply, result or error.
    async fn reply(&self, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let (status, text) = self.post(body.to_string(), None).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        serde_json::from_str(&text).unwrap()
    }

    /// `host:port` of the listener.
    fn addr(&self) -> &str {
        self.url
            .strip_prefix("http://")
            .and_then(|rest| rest.strip_suffix("/rpc"))
            .unwrap()
    }

    /// The tools the fixture server has been called with so far.
    async fn upstream_calls(&self) -> Vec<Value> {
        let log = self
            .call("capability.call", json!({"name": "fixture.call_log"}))
            .await;
        log["structuredContent"]["calls"]
            .as_array()
            .unwrap()
            .clone()
    }
}

/// Sends `request` (a whole HTTP/1.1 request) to `addr` over a fresh
/// connection; the status and the body of the response.
async fn raw_http(addr: &str, request: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A POST of `body` to /rpc with `headers` (each `Name: value`), closing after.
fn raw_post(headers: &[&str], body: &str) -> String {
    let mut request = String::from("POST /rpc HTTP/1.1\r\n");
    for h in headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    request
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
    // Cancel only once the sleep has reached the MCP server.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .upstream_calls()
        .await
        .iter()
        .any(|c| c["tool"] == "sleep")
    {
        assert!(
            Instant::now() < deadline,
            "the sleep never reached upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    let (status, text) = server.post(body, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Refused in JSON, as every other refusal is.
    let refused: Value = serde_json::from_str(&text).unwrap();
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("missing or wrong bearer token"),
        "{refused}"
    );
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
    let resp = common::http_client().get(url).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

/// In-process state: the pool and workflows without a socket.
async fn state() -> (RpcState, tempfile::TempDir) {
    state_with("").await
}

/// [`state`] with `extra` TOML appended to the config.
async fn state_with(extra: &str) -> (RpcState, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = wf_host::config::Config::load(&write_config_with(dir.path(), extra)).unwrap();
    let host = Host::open(
        &config,
        HostOptions {
            pool: PoolConfig {
                connections: config.connections.clone(),
                self_exe: Some(wf_host_bin()),
                ..Default::default()
            },
            runtime: RuntimeConfig {
                cache_dir: Some(dir.path().join("cache")),
                ..Default::default()
            },
            workflows: wf_host::workflow::Options {
                keep_runs: 10,
                ..Default::default()
            },
        },
    )
    .await
    .unwrap();
    (
        RpcState {
            tokens: wf_host::reload::RpcTokens::new(Default::default()),
            workflows: host.workflows().clone(),
            pool: host.pool().clone(),
            grants: wf_host::reload::RpcGrants::new(Grants::new(config.rpc_allow()).unwrap()),
            config: None,
        },
        dir,
    )
}

async fn answer(state: &RpcState, body: &str) -> Option<Value> {
    handle_body(state, body.as_bytes()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflow_get_gives_each_steps_needs_and_input_and_asked_its_logs() {
    let echo = repo_root().join("plugins/echo.wasm");
    let (state, _dir) = state_with(&format!(
        r#"
[[workflows.pair.steps]]
id = "first"
component = {echo:?}

[[workflows.pair.steps]]
id = "second"
component = {echo:?}
needs = ["first"]
input = '{{copied: .steps.first.output}}'
"#
    ))
    .await;
    let call = |method: &str, params: Value| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let state = state.clone();
        async move {
            let reply = answer(&state, &body.to_string()).await.unwrap();
            reply
                .get("result")
                .cloned()
                .unwrap_or_else(|| panic!("{reply}"))
        }
    };
    let started = call(
        "workflow.start",
        json!({"workflow": "pair", "input": {"x": 1}, "wait": true}),
    )
    .await;
    assert_eq!(started["status"], "succeeded", "{started}");
    let run_id = started["run_id"].clone();

    let got = call("workflow.get", json!({"run_id": run_id})).await;
    let steps = got["steps"].as_array().unwrap();
    assert_eq!(steps[0]["id"], "first");
    assert_eq!(steps[0]["needs"], json!([]));
    assert_eq!(steps[0]["input"], json!({"x": 1}));
    assert_eq!(steps[1]["needs"], json!(["first"]));
    assert_eq!(steps[1]["input"], json!({"copied": {"x": 1}}));
    assert!(steps.iter().all(|s| s.get("logs").is_none()), "{got}");

    let got = call("workflow.get", json!({"run_id": run_id, "logs": true})).await;
    for step in got["steps"].as_array().unwrap() {
        let logs = step["logs"].as_array().unwrap();
        assert_eq!(logs.len(), 1, "{step}");
        assert_eq!(logs[0]["attempt"], 1);
        assert_eq!(logs[0]["item"], 0);
        assert!(logs[0]["at"].as_str().unwrap().ends_with('Z'));
        let records = logs[0]["records"].as_array().unwrap();
        assert_eq!(records[0]["level"], "info", "{step}");
        assert!(
            records[0]["message"]
                .as_str()
                .unwrap()
                .starts_with("echo: ")
        );
    }

    // The newest event's id: run.finished, after two steps' started, log
    // and finished events and run.started.
    let status = call("host.status", json!({})).await;
    assert_eq!(status["state"]["last_event_id"], 8, "{status}");
}

/// A workflow name that is not configured is refused with the configured
/// ones, in the message and in the error's data, the closest first; one
/// that is near a configured name says which it likely meant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_workflow_names_the_closest_one() {
    let (state, _dir) = state().await;
    let got = answer(
        &state,
        r#"{"jsonrpc":"2.0","id":1,"method":"workflow.start","params":{"workflow":"Echoo"}}"#,
    )
    .await
    .unwrap();
    let error = &got["error"];
    assert_eq!(error["code"], -32001, "{got}");
    assert_eq!(error["data"]["workflows"][0], "echo", "{got}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "unknown workflow `Echoo`; did you mean `echo`? The workflows are `echo`, "
        ),
        "{message}"
    );
    let known = error["data"]["workflows"].as_array().unwrap();
    assert!(
        known.len() > 1 && known.iter().any(|k| k == "call"),
        "{got}"
    );
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
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": "unknown workflow `nope`; the workflows are `spin`, `call`, `echo`", "data": {"workflows": ["spin", "call", "echo"]}}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"workflow.get","params":["run-0"]}"#,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32002, "message": "unknown run `run-0`"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"workflow.get","params":["a",true,false,"d"]}"#,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "expected at most 3 positional params (run_id, calls, logs), got 4"}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"capability.call","params":{"name":"nowhere.echo"}}"#,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32003, "message": "`nowhere.echo` is not granted to RPC clients (`[rpc] allow` grants `fixture.*`); add it to `[rpc] allow` in the config", "data": {"kind": "denied"}}}),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"capability.call","params":{"name":"fixture.nope"}}"#,
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32006, "message": "connection `fixture` has no tool `nope`; granted tools on it: add, ask, call_log, counter, crash, echo, env, fail, forget_session, progress, register_extra, set_description, shaped, sleep, task_sleep", "data": {"kind": "not-found"}}}),
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
async fn rpc_discover_lists_exactly_the_methods_that_answer() {
    let (state, _dir) = state().await;
    let doc = answer(
        &state,
        r#"{"jsonrpc":"2.0","id":1,"method":"rpc.discover"}"#,
    )
    .await
    .unwrap();
    let mut listed: Vec<String> = doc["result"]["methods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    let mut expected = [
        "capability.call",
        "capability.list",
        "host.reload",
        "host.status",
        "prompt.get",
        "resource.read",
        "rpc.discover",
        "workflow.answer",
        "workflow.cancel",
        "workflow.get",
        "workflow.list",
        "workflow.migrate",
        "workflow.pause",
        "workflow.resume",
        "workflow.retry",
        "workflow.signal",
        "workflow.start",
        "workflow.wait",
        "workflow.waiting",
    ];
    expected.sort();
    assert_eq!(listed, expected);
    for name in &listed {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": name});
        let reply = answer(&state, &body.to_string()).await.unwrap();
        assert_ne!(
            reply["error"]["code"], -32601,
            "{name} is listed but not answered"
        );
    }
    state.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_answers_in_process_and_refuses_big_bodies() {
    let (state, _dir) = state().await;
    let app = router(
        state.clone(),
        Access {
            max_body: 1024,
            ..Access::default()
        },
    )
    .unwrap();
    let post = |body: String| {
        Request::post("/rpc")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    };
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
        let body: Vec<u8> = match i % 5 {
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
            // Batches past the limit: one error, nothing run.
            4 => {
                let n = rng.random_range(101..400);
                let item = json!({"jsonrpc": "2.0", "id": 1, "method": "workflow.start", "params": {"workflow": "echo"}});
                let reply = handle_body(&state, Value::Array(vec![item; n]).to_string().as_bytes())
                    .await
                    .unwrap();
                assert_valid_response(&reply);
                assert_eq!(reply["error"]["code"], -32600, "{reply}");
                continue;
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
    assert!(
        state
            .workflows
            .list(&wf_host::store::ListQuery {
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap()
            .0
            .is_empty(),
        "an oversized batch started a run"
    );

    // Hostile headers through the router: each request would call `echo` with
    // its own number; only the accepted ones may reach the MCP server.
    let app = router(
        state.clone(),
        Access {
            allow_origins: vec!["http://allowed.example".into()],
            ..Access::default()
        },
    )
    .unwrap();
    let content_types = [
        None,
        Some("application/json"),
        Some("application/json; charset=utf-8"),
        Some("APPLICATION/JSON"),
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/jsonx"),
        Some(""),
    ];
    let hosts = [
        None,
        Some("127.0.0.1:7878"),
        Some("localhost:7878"),
        Some("[::1]:7878"),
        Some("127.0.0.2"),
        Some("evil.example:7878"),
        Some("localhost.evil.example"),
        Some("[::2]:7878"),
    ];
    let origins = [
        None,
        Some("http://evil.example"),
        Some("http://evil.example:7878"),
        Some("null"),
        Some("http://127.0.0.1:7878"),
        Some("http://localhost:7878"),
        Some("https://127.0.0.1:7878"),
        Some("http://allowed.example"),
        Some("http://allowed.example/x"),
    ];
    let mut expected_calls = Vec::new();
    for i in 0..400 {
        let content_type = content_types[rng.random_range(0..content_types.len())];
        let host = hosts[rng.random_range(0..hosts.len())];
        let origin = origins[rng.random_range(0..origins.len())];
        let mut headers = Vec::new();
        headers.extend(content_type.map(|v| ("content-type", v)));
        headers.extend(host.map(|v| ("host", v)));
        headers.extend(origin.map(|v| ("origin", v)));
        let body = json!({"jsonrpc": "2.0", "id": i, "method": "capability.call", "params": {"name": "fixture.echo", "arguments": {"text": i.to_string()}}});
        let (status, reply) = through(&app, &headers, &body.to_string()).await;
        assert_valid_response(&reply);
        let host_ok = host.is_none_or(|h| {
            [
                "127.0.0.1:7878",
                "localhost:7878",
                "[::1]:7878",
                "127.0.0.2",
            ]
            .contains(&h)
        });
        let origin_ok = origin.is_none_or(|o| {
            o == "http://allowed.example" || host.is_some_and(|h| o == format!("http://{h}"))
        });
        let json_ok = matches!(
            content_type,
            Some("application/json" | "application/json; charset=utf-8" | "APPLICATION/JSON")
        );
        let want = if !host_ok || !origin_ok {
            StatusCode::FORBIDDEN
        } else if !json_ok {
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        } else {
            expected_calls.push(json!(i.to_string()));
            StatusCode::OK
        };
        assert_eq!(status, want, "{headers:?}: {reply}");
    }
    let log = answer(
        &state,
        r#"{"jsonrpc":"2.0","id":1,"method":"capability.call","params":{"name":"fixture.call_log"}}"#,
    )
    .await
    .unwrap();
    let called: Vec<Value> = log["result"]["structuredContent"]["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["tool"] == "echo")
        .map(|c| c["arguments"]["text"].clone())
        .collect();
    assert_eq!(
        called, expected_calls,
        "only accepted requests may reach upstream"
    );
    assert!(!expected_calls.is_empty());
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

/// The refusal body for `message`.
fn refusal(message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": message}})
}

const ECHO_PWNED: &str = r#"{"jsonrpc":"2.0","id":1,"method":"capability.call","params":{"name":"fixture.echo","arguments":{"text":"pwned"}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_origin_simple_request_is_refused_and_calls_nothing() {
    let server = Server::start(&["--allow-origin", "http://localhost:3000"]);
    let host = format!("Host: {}", server.addr());
    // The reproduction: a "simple" request a web page may send without preflight.
    let (status, body) = raw_http(
        server.addr(),
        &raw_post(
            &[
                &host,
                "Content-Type: text/plain",
                "Origin: http://evil.example",
            ],
            ECHO_PWNED,
        ),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        refusal(
            "refused: cross-origin request from `Origin: http://evil.example`; only the server's own origin or one allowed with `--allow-origin` may call"
        )
    );
    // A JSON content type from that origin does not help.
    let (status, _) = raw_http(
        server.addr(),
        &raw_post(
            &[
                &host,
                "Content-Type: application/json",
                "Origin: http://evil.example",
            ],
            ECHO_PWNED,
        ),
    )
    .await;
    assert_eq!(status, 403);
    // Nor does a form post from the server's own origin: not JSON.
    let own = format!("Origin: http://{}", server.addr());
    let (status, body) = raw_http(
        server.addr(),
        &raw_post(
            &[
                &host,
                "Content-Type: application/x-www-form-urlencoded",
                &own,
            ],
            ECHO_PWNED,
        ),
    )
    .await;
    assert_eq!(status, 415, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        refusal(
            "unsupported content type `application/x-www-form-urlencoded`; send `Content-Type: application/json`"
        )
    );
    assert!(
        server.upstream_calls().await.is_empty(),
        "a refused request reached the MCP server"
    );

    // The server's own origin, and an --allow-origin one, are served.
    for origin in [own.as_str(), "Origin: http://localhost:3000"] {
        let (status, body) = raw_http(
            server.addr(),
            &raw_post(
                &[&host, "Content-Type: application/json", origin],
                ECHO_PWNED,
            ),
        )
        .await;
        assert_eq!(status, 200, "{origin}: {body}");
        let reply: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(reply["result"]["content"][0]["text"], "pwned", "{reply}");
    }
    assert_eq!(server.upstream_calls().await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_request_on_loopback_is_refused() {
    let server = Server::start(&[]);
    let port = server.addr().rsplit_once(':').unwrap().1.to_owned();
    // After DNS rebinding, the page's origin and the Host header agree.
    let host = format!("Host: evil.example:{port}");
    let origin = format!("Origin: http://evil.example:{port}");
    for headers in [
        vec![
            host.as_str(),
            "Content-Type: application/json",
            origin.as_str(),
        ],
        vec![host.as_str(), "Content-Type: application/json"],
    ] {
        let (status, body) = raw_http(server.addr(), &raw_post(&headers, ECHO_PWNED)).await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap(),
            refusal(&format!(
                "refused: `Host: evil.example:{port}` is not a loopback name; this server listens on loopback and answers only `localhost`, `127.0.0.1` or `[::1]` (DNS rebinding protection)"
            ))
        );
    }
    // Loopback names are fine.
    let localhost = format!("Host: localhost:{port}");
    let (status, body) = raw_http(
        server.addr(),
        &raw_post(
            &[&localhost, "Content-Type: application/json"],
            r#"{"jsonrpc":"2.0","id":1,"method":"host.status"}"#,
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(server.upstream_calls().await.is_empty());
}

/// Sends `body` through the router with `headers`; the status and the JSON body.
async fn through(app: &axum::Router, headers: &[(&str, &str)], body: &str) -> (StatusCode, Value) {
    let mut request = Request::post("/rpc");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let resp = app
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

const STATUS: &str = r#"{"jsonrpc":"2.0","id":1,"method":"host.status"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_origin_allowed_origin_and_plain_clients_are_accepted() {
    let (state, _dir) = state().await;
    let app = router(
        state.clone(),
        Access {
            allow_origins: vec!["http://LOCALHOST:3000/".into()],
            ..Access::default()
        },
    )
    .unwrap();
    let json = ("content-type", "application/json");
    let accepted: &[&[(&str, &str)]] = &[
        // A plain client: no Origin, no Host.
        &[json],
        &[("content-type", "application/json; charset=utf-8")],
        &[("content-type", "Application/JSON")],
        &[
            json,
            ("host", "127.0.0.1:7878"),
            ("origin", "http://127.0.0.1:7878"),
        ],
        &[
            json,
            ("host", "localhost:7878"),
            ("origin", "http://localhost:7878"),
        ],
        &[
            json,
            ("host", "[::1]:7878"),
            ("origin", "http://[::1]:7878"),
        ],
        &[
            json,
            ("host", "127.0.0.1"),
            ("origin", "http://127.0.0.1:80"),
        ],
        &[
            json,
            ("host", "127.0.0.1:7878"),
            ("origin", "http://localhost:3000"),
        ],
    ];
    for headers in accepted {
        let (status, body) = through(&app, headers, STATUS).await;
        assert_eq!(status, StatusCode::OK, "{headers:?}: {body}");
        assert!(body["result"]["connections"].is_array(), "{body}");
    }
    let refused: &[(&[(&str, &str)], StatusCode)] = &[
        (
            &[("content-type", "text/plain")],
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (&[], StatusCode::UNSUPPORTED_MEDIA_TYPE),
        (
            &[("content-type", "application/jsonx")],
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (&[json, ("origin", "null")], StatusCode::FORBIDDEN),
        // The own origin needs the same scheme, host and port.
        (
            &[
                json,
                ("host", "127.0.0.1:7878"),
                ("origin", "https://127.0.0.1:7878"),
            ],
            StatusCode::FORBIDDEN,
        ),
        (
            &[
                json,
                ("host", "127.0.0.1:7878"),
                ("origin", "http://localhost:7878"),
            ],
            StatusCode::FORBIDDEN,
        ),
        (
            &[json, ("host", "localhost.evil.example")],
            StatusCode::FORBIDDEN,
        ),
        (
            &[json, ("host", "127.0.0.1.evil.example:7878")],
            StatusCode::FORBIDDEN,
        ),
    ];
    for (headers, expected) in refused {
        let (status, body) = through(&app, headers, STATUS).await;
        assert_eq!(status, *expected, "{headers:?}: {body}");
        assert_eq!(body["error"]["code"], -32600, "{body}");
        assert_eq!(body["id"], Value::Null, "{body}");
    }
    let (_, body) = through(&app, &[], STATUS).await;
    assert_eq!(
        body,
        refusal("missing content type; send `Content-Type: application/json`")
    );
    // On a non-loopback listener any Host goes (a token guards it instead).
    let public = router(
        state.clone(),
        Access {
            any_host: true,
            ..Access::default()
        },
    )
    .unwrap();
    let (status, _) = through(&public, &[json, ("host", "wf.example.com")], STATUS).await;
    assert_eq!(status, StatusCode::OK);
    assert!(matches!(
        router(
            state.clone(),
            Access {
                allow_origins: vec!["http://x.example/path".into()],
                ..Access::default()
            }
        ),
        Err(wf_host::rpc::ServeError::BadOrigin(_))
    ));
    state.pool.shutdown().await;
}

#[test]
fn a_bad_allow_origin_is_a_usage_error() {
    let out = Command::new(wf_host_bin())
        .args(["serve", "--allow-origin", "localhost:3000/x"])
        .env_remove("WF_HOST_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`localhost:3000/x` is not an origin like `http://localhost:3000`"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_grants_deny_what_they_exclude_before_it_goes_upstream() {
    let (state, _dir) = state_with(
        r#"
[rpc]
allow = ["fixture.echo", "fixture.call_log"]
"#,
    )
    .await;
    let echo = answer(
        &state,
        r#"{"jsonrpc":"2.0","id":1,"method":"capability.call","params":{"name":"fixture.echo","arguments":{"text":"ok"}}}"#,
    )
    .await
    .unwrap();
    assert_eq!(echo["result"]["content"][0]["text"], "ok", "{echo}");
    let denied = |name: &str| json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32003, "message": format!("`{name}` is not granted to RPC clients (`[rpc] allow` grants `fixture.echo`, `fixture.call_log`); add it to `[rpc] allow` in the config"), "data": {"kind": "denied"}}});
    let cases = [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"capability.call","params":{"name":"fixture.add","arguments":{"a":1,"b":2}}}"#,
            "fixture.add",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"resource.read","params":{"connection":"fixture","uri":"fixture://greeting"}}"#,
            "fixture.fixture://greeting",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"prompt.get","params":{"name":"fixture.greet","arguments":{"name":"Ada"}}}"#,
            "fixture.greet",
        ),
        // An unknown tool is denied too: its name says nothing about the server.
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"capability.call","params":{"name":"fixture.nope"}}"#,
            "fixture.nope",
        ),
    ];
    for (body, name) in cases {
        assert_eq!(answer(&state, body).await, Some(denied(name)), "{body}");
    }
    let list = answer(
        &state,
        r#"{"jsonrpc":"2.0","id":1,"method":"capability.list"}"#,
    )
    .await
    .unwrap();
    let names: Vec<&str> = list["result"]["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fixture.echo", "fixture.call_log"], "{list}");
    let log = answer(
        &state,
        r#"{"jsonrpc":"2.0","id":1,"method":"capability.call","params":{"name":"fixture.call_log"}}"#,
    )
    .await
    .unwrap();
    let tools: Vec<&str> = log["result"]["structuredContent"]["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tool"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["echo"], "a denied call went upstream: {log}");
    state.pool.shutdown().await;
}

#[test]
fn an_invalid_rpc_grant_is_refused_at_load() {
    let e = wf_host::config::Config::parse(
        "[rpc]\nallow = [\"echo\"]\n",
        std::path::Path::new("wf.toml"),
        Default::default(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "config file `wf.toml`: [rpc] allow: invalid grant `echo`: expected `<connection>.<name>`, e.g. `fixture.echo` or `fixture.*`"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_limit_is_one_error_and_others_keep_their_order() {
    let (state, _dir) = state().await;
    let request = |i: usize| json!({"jsonrpc": "2.0", "id": i, "method": "workflow.get", "params": [format!("run-{i}")]});
    let over: Vec<Value> = (0..101).map(request).collect();
    assert_eq!(
        handle_body(&state, Value::Array(over).to_string().as_bytes()).await,
        Some(
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "batch of 101 requests exceeds the limit of 100"}})
        )
    );
    let full: Vec<Value> = (0..100).map(request).collect();
    let replies = handle_body(&state, Value::Array(full).to_string().as_bytes())
        .await
        .unwrap();
    let ids: Vec<u64> = replies
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, (0..100).collect::<Vec<_>>());
    state.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_runs_at_most_eight_requests_at_once() {
    let (state, _dir) = state().await;
    let started = answer(
        &state,
        r#"{"jsonrpc":"2.0","id":1,"method":"workflow.start","params":{"workflow":"spin","input":{"mode":"loop"}}}"#,
    )
    .await
    .unwrap();
    let run_id = started["result"]["run_id"].as_str().unwrap().to_owned();
    // Nine waits of 400 ms on a run that never ends: two rounds when at most
    // eight run at once, one round when all run together.
    let waits: Vec<Value> = (0..9)
        .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "workflow.wait", "params": {"run_id": run_id, "timeout_ms": 400}}))
        .collect();
    let begun = Instant::now();
    let replies = handle_body(&state, Value::Array(waits).to_string().as_bytes())
        .await
        .unwrap();
    let elapsed = begun.elapsed();
    assert_eq!(replies.as_array().unwrap().len(), 9);
    assert!(
        replies
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["result"]["status"] == "running"),
        "{replies}"
    );
    assert!(
        elapsed >= Duration::from_millis(800),
        "nine waits finished in {elapsed:?}: they ran all at once"
    );
    state.workflows.cancel(&run_id).await.unwrap();
    state.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_cannot_be_read_is_400_and_only_an_oversized_one_is_413() {
    let (state, _dir) = state().await;
    let app = router(
        state.clone(),
        Access {
            max_body: 1024,
            ..Access::default()
        },
    )
    .unwrap();
    // The client goes away halfway through the body.
    let chunks: Vec<Result<&'static str, std::io::Error>> = vec![
        Ok(r#"{"jsonrpc":"2.0","#),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        )),
    ];
    let resp = app
        .clone()
        .oneshot(
            Request::post("/rpc")
                .header("content-type", "application/json")
                .body(Body::from_stream(futures::stream::iter(chunks)))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = serde_json::from_slice(
        &axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        body,
        refusal("cannot read the request body: connection reset by peer")
    );
    // A declared length past the limit is refused before reading.
    let (status, body) = through(
        &app,
        &[
            ("content-type", "application/json"),
            ("content-length", "4096"),
        ],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body, refusal("request body exceeds 1024 bytes"));
    state.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_chunking_over_a_socket_is_400() {
    let server = Server::start(&[]);
    let host = format!("Host: {}", server.addr());
    let request = format!(
        "POST /rpc HTTP/1.1\r\n{host}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"
    );
    let (status, body) = raw_http(server.addr(), &request).await;
    assert_eq!(status, 400, "{body}");
    let reply: Value = serde_json::from_str(&body).unwrap();
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("cannot read the request body: "),
        "{reply}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_open_waits_at_once_and_the_grace_is_for_runs() {
    let mut server = Server::start(&["--grace", "300ms"]);
    let spin = json!({"workflow": "spin", "input": {"mode": "loop"}});
    let first = server.call("workflow.start", spin.clone()).await;
    let first_id = first["run_id"].as_str().unwrap().to_owned();
    // One batch: a long wait on the first run, and a start that waits on a second.
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "workflow.wait", "params": {"run_id": first_id, "timeout_ms": 120000}},
        {"jsonrpc": "2.0", "id": 2, "method": "workflow.start", "params": {"workflow": "spin", "input": {"mode": "loop"}, "wait": true}},
    ]);
    let url = server.url.clone();
    let pending = tokio::spawn(async move {
        common::http_client()
            .post(url)
            .header("Content-Type", "application/json")
            .body(batch.to_string())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    // The batch is being served once its second run exists; its wait began first.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server
        .call("workflow.list", json!({"status": "running"}))
        .await["runs"]
        .as_array()
        .unwrap()
        .len()
        < 2
    {
        assert!(Instant::now() < deadline, "the batch never started its run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let signalled = Instant::now();
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let text = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("open waits held the shutdown")
        .unwrap();
    let replies: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(replies[0]["result"]["run_id"], first_id, "{replies}");
    assert_eq!(replies[0]["result"]["status"], "running", "{replies}");
    assert_eq!(replies[1]["result"]["status"], "running", "{replies}");
    let exit = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(5),
            "wf-host serve did not stop within the grace period"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(exit.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_timeout_is_32005_over_rpc() {
    let (state, _dir) = state_with(
        r#"
[connections.slow]
command = "wf-host"
args = ["fixture-server"]
call_timeout = "300ms"
"#,
    )
    .await;
    let reply = answer(
        &state,
        r#"{"jsonrpc":"2.0","id":1,"method":"capability.call","params":{"name":"slow.sleep","arguments":{"ms":30000}}}"#,
    )
    .await
    .unwrap();
    assert_eq!(reply["error"]["code"], -32005, "{reply}");
    assert_eq!(reply["error"]["data"]["kind"], "timeout", "{reply}");
    state.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_only_notifications_is_204() {
    let (state, _dir) = state().await;
    let app = router(state.clone(), Access::default()).unwrap();
    let resp = app
        .oneshot(
            Request::post("/rpc")
                .header("content-type", "application/json")
                .body(Body::from(
                    r#"[{"jsonrpc":"2.0","method":"host.status"},{"jsonrpc":"2.0","method":"nope"}]"#,
                ))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert!(
        axum::body::to_bytes(resp.into_body(), 1024)
            .await
            .unwrap()
            .is_empty()
    );
    state.pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_max_runs_and_max_body_flags_apply() {
    let server = Server::start(&["--max-runs", "2", "--max-body", "2KiB"]);
    let mut ids = Vec::new();
    for i in 0..3 {
        let out = server
            .call(
                "workflow.start",
                json!({"workflow": "echo", "input": i, "wait": true}),
            )
            .await;
        ids.push(out["run_id"].as_str().unwrap().to_owned());
    }
    let gone = server.reply("workflow.get", json!([ids[0]])).await;
    assert_eq!(gone["error"]["code"], -32002, "{gone}");
    let kept = server.call("workflow.get", json!([ids[2]])).await;
    assert_eq!(kept["output"], 2);

    let padded = |n: usize| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "rpc.discover", "params": {"pad": "x".repeat(n)}})
            .to_string()
    };
    let (status, _) = server.post(padded(1500), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, text) = server.post(padded(3000), None).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        refusal("request body exceeds 2048 bytes")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wf_host_token_variable_is_honoured() {
    let server = Server::start_with(&[], "", &[("WF_HOST_TOKEN", "from-env")]);
    assert_eq!(server.post(STATUS, None).await.0, StatusCode::UNAUTHORIZED);
    let (status, text) = server.post(STATUS, Some("from-env")).await;
    assert_eq!(status, StatusCode::OK, "{text}");
}
