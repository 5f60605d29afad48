//! wf-host as an MCP server: exposed workflows are tools, runs are resources.
//! Real clients over both transports (rmcp in Rust, the official Python SDK
//! from a script), real `wf-host serve` and `wf-host mcp` processes, real
//! nodes calling the fixture MCP server; and wf-host as a client of wf-host.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation,
    ProgressNotificationParam, ReadResourceRequestParams,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Map, Value, json};

use common::serve::Serve;
use common::*;

/// Three steps: `shout` calls `fixture.echo` with the upper-cased text, `copy`
/// passes it on, `count` adds its length; `slow` sleeps upstream; `hidden`
/// is not exposed.
fn config(dir: &Path) -> PathBuf {
    let root = repo_root();
    let call = root.join("plugins/call.wasm");
    let echo = root.join("plugins/echo.wasm");
    let text = format!(
        r#"[connections.fixture]
command = "wf-host"
args = ["fixture-server"]

[workflows.chain]
expose = true
title = "Shout and count"
description = "Upper-cases `text` through the fixture and counts its letters."
input_schema = {{ type = "object", required = ["text"], properties = {{ text = {{ type = "string" }} }} }}
output_schema = {{ type = "object", required = ["text", "letters"], properties = {{ text = {{ type = "string" }}, letters = {{ type = "integer" }} }} }}
output = '{{text: .steps.copy.output.structuredContent.text, letters: .steps.count.output.structuredContent.sum}}'

[[workflows.chain.steps]]
id = "shout"
component = {call:?}
allow = ["fixture.echo"]
input = '{{capability: "fixture.echo", arguments: {{text: (.input.text | ascii_upcase)}}}}'

[[workflows.chain.steps]]
id = "copy"
component = {echo:?}
needs = ["shout"]
input = '.steps.shout.output'

[[workflows.chain.steps]]
id = "count"
component = {call:?}
allow = ["fixture.add"]
needs = ["copy"]
input = '{{capability: "fixture.add", arguments: {{a: (.input.text | length), b: 0}}}}'

[workflows.slow]
expose = true
component = {call:?}
allow = ["fixture.sleep"]
timeout = "60s"

[workflows.hidden]
component = {echo:?}
"#
    );
    let path = dir.join("wf.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `wf-host serve` on [`config`].
fn serve(extra: &[&str]) -> Serve {
    Serve::start(config, extra)
}

/// An rmcp client that keeps the progress notifications it gets.
#[derive(Clone, Default)]
struct Client {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    tools_changed: Arc<std::sync::atomic::AtomicUsize>,
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("wf-host-test", "0"),
        )
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
    }

    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.tools_changed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

async fn http_client(
    url: &str,
    token: Option<&str>,
) -> (RunningService<RoleClient, Client>, Client) {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(token) = token {
        config = config.auth_header(token.to_owned());
    }
    let handler = Client::default();
    let client = handler
        .clone()
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("initialize");
    (client, handler)
}

fn args(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// Lists the tools, runs `chain` with progress, reads its run back.
async fn exercise(client: &RunningService<RoleClient, Client>, handler: &Client) {
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["chain", "slow"], "only exposed workflows are tools");
    let chain = &tools[0];
    assert_eq!(chain.title.as_deref(), Some("Shout and count"));
    assert_eq!(
        chain.description.as_deref(),
        Some("Upper-cases `text` through the fixture and counts its letters.")
    );
    assert_eq!(chain.input_schema["required"], json!(["text"]));
    assert_eq!(
        chain.output_schema.as_ref().unwrap()["required"],
        json!(["text", "letters"])
    );
    // The open object schema of a workflow without input_schema.
    assert_eq!(tools[1].input_schema["type"], "object");

    let result = client
        .call_tool(
            CallToolRequestParams::new("chain").with_arguments(args(json!({"text": "wasm"}))),
        )
        .await
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(
        result.structured_content,
        Some(json!({"text": "WASM", "letters": 4}))
    );
    // Notifications are handled on their own tasks: the last may land just
    // after the result.
    let deadline = Instant::now() + Duration::from_secs(5);
    while handler.progress.lock().unwrap().last().map(|p| p.progress) != Some(3.0)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let progress = handler.progress.lock().unwrap().clone();
    let seen: Vec<(f64, Option<f64>)> = progress.iter().map(|p| (p.progress, p.total)).collect();
    assert_eq!(seen.last(), Some(&(3.0, Some(3.0))), "{progress:?}");
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "progress increases: {progress:?}"
    );
    let steps: Vec<String> = progress.iter().filter_map(|p| p.message.clone()).collect();
    assert!(steps.join(", ").contains("count"), "{steps:?}");

    let run_id = result.meta.as_ref().unwrap().0["wf-host/run-id"]
        .as_str()
        .unwrap()
        .to_owned();
    let read = client
        .read_resource(ReadResourceRequestParams::new(format!(
            "wf-host://runs/{run_id}"
        )))
        .await
        .unwrap();
    let text = serde_json::to_value(&read.contents[0]).unwrap()["text"]
        .as_str()
        .unwrap()
        .to_owned();
    let record: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(record["status"], "succeeded");
    assert_eq!(record["workflow"], "chain");

    // Bad arguments: a tool error the model can read, not a protocol error.
    let bad = client
        .call_tool(CallToolRequestParams::new("chain").with_arguments(args(json!({"txt": 1}))))
        .await
        .unwrap();
    assert_eq!(bad.is_error, Some(true), "{bad:?}");
    // Unexposed workflows cannot be called.
    let hidden = client
        .call_tool(CallToolRequestParams::new("hidden").with_arguments(Map::new()))
        .await
        .unwrap_err();
    assert!(
        hidden.to_string().contains("unknown tool `hidden`"),
        "{hidden}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_over_http_lists_calls_follows_progress_and_reads_runs() {
    let serve = serve(&[]);
    let (client, handler) = http_client(&serve.mcp_url(), None).await;
    exercise(&client, &handler).await;
    client.cancel().await.unwrap();
    let status = serve.rpc("host.status", json!({}), None).await;
    assert_eq!(status["result"]["exposed"], json!(["chain", "slow"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_over_stdio_runs_the_same_workflows() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let mut command = tokio::process::Command::new(wf_host_bin());
    command
        .args(["mcp", "--config"])
        .arg(&config)
        .env("WF_HOST_CACHE_DIR", dir.path().join("cache"));
    let handler = Client::default();
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = handler
        .clone()
        .serve(transport)
        .await
        .expect("initialize over stdio");
    exercise(&client, &handler).await;
    client.cancel().await.unwrap();
    assert!(
        dir.path().join(".wf-host/state.db").exists(),
        "runs are kept in the config's state"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_cancels_its_run() {
    let serve = serve(&[]);
    let (client, _) = http_client(&serve.mcp_url(), None).await;
    let call = {
        let peer = client.peer().clone();
        tokio::spawn(async move {
            peer.call_tool(
                CallToolRequestParams::new("slow").with_arguments(args(json!({
                    "capability": "fixture.sleep",
                    "arguments": {"ms": 30000},
                }))),
            )
            .await
        })
    };
    // Wait for the run to be running, then give up on the call.
    let deadline = Instant::now() + Duration::from_secs(20);
    let run_id = loop {
        let list = serve
            .rpc("workflow.list", json!({"workflow": "slow"}), None)
            .await;
        if let Some(run) = list["result"]["runs"].as_array().and_then(|r| r.first()) {
            break run["run_id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "no run started: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    call.abort();
    let _ = call.await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let run = serve
            .rpc("workflow.get", json!({"run_id": run_id}), None)
            .await;
        if run["result"]["status"] == "cancelled" {
            break;
        }
        assert!(Instant::now() < deadline, "run not cancelled: {run}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_enforced_on_mcp() {
    let serve = serve(&["--token", "s3cret"]);
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}}});
    let response = reqwest::Client::new()
        .post(serve.mcp_url())
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(initialize.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    let (client, handler) = http_client(&serve.mcp_url(), Some("s3cret")).await;
    let tools = client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 2);
    drop(handler);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_client_runs_a_workflow_with_progress() {
    let serve = serve(&[]);
    let script = repo_root().join("tests/mcp/python_client.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(serve.mcp_url())
        .output()
        .expect("python3 runs (tests/run.sh installs the `mcp` package)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python client failed:\n{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(report["tools"], json!(["chain", "slow"]));
    assert_eq!(report["structured"], json!({"text": "SDK", "letters": 3}));
    assert_eq!(report["is_error"], false);
    assert_eq!(
        report["progress"].as_array().unwrap().last(),
        Some(&json!([3.0, 3.0]))
    );
    assert_eq!(report["run_status"], "succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_step_calls_another_hosts_exposed_workflow_through_the_pool() {
    let upstream = serve(&["--token", "t0ken"]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("wf.toml");
    std::fs::write(
        &config,
        format!(
            r#"[connections.upstream]
url = "{url}"
headers = {{ Authorization = "Bearer t0ken" }}

[workflows.relay]
output = '.steps.ask.output.structuredContent'

[[workflows.relay.steps]]
id = "ask"
component = {call:?}
allow = ["upstream.chain"]
input = '{{capability: "upstream.chain", arguments: {{text: .input}}}}'
"#,
            url = upstream.mcp_url(),
            call = repo_root().join("plugins/call.wasm"),
        ),
    )
    .unwrap();
    let out = Command::new(wf_host_bin())
        .args(["run", "--workflow", "relay", "--config"])
        .arg(&config)
        .args(["--input", r#""relay""#])
        .env("WF_HOST_CACHE_DIR", dir.path().join("cache"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let output: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(output, json!({"text": "RELAY", "letters": 5}));
    // The run happened on the upstream host.
    let list = upstream
        .rpc("workflow.list", json!({"workflow": "chain"}), Some("t0ken"))
        .await;
    assert_eq!(
        list["result"]["runs"].as_array().unwrap().len(),
        1,
        "{list}"
    );
    let _ = &upstream.dir;
}

#[test]
fn an_exposed_workflow_without_an_object_input_schema_is_a_load_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("wf.toml");
    std::fs::write(
        &config,
        format!(
            "[workflows.list]\nexpose = true\ncomponent = {:?}\ninput_schema = {{ type = \"array\" }}\n",
            repo_root().join("plugins/echo.wasm")
        ),
    )
    .unwrap();
    let out = Command::new(wf_host_bin())
        .args(["mcp", "--config"])
        .arg(&config)
        .env("WF_HOST_CACHE_DIR", dir.path().join("cache"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("workflow `list`")
            && stderr.contains("`expose = true` needs an `input_schema` of `type = \"object\"`"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_exposes_a_workflow_tells_connected_clients() {
    let serve = serve(&[]);
    let (client, handler) = http_client(&serve.mcp_url(), None).await;
    assert_eq!(client.list_all_tools().await.unwrap().len(), 2);
    let path = serve.dir.path().join("wf.toml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!(
        "\n[workflows.more]\nexpose = true\ncomponent = {:?}\n",
        repo_root().join("plugins/echo.wasm")
    ));
    std::fs::write(&path, &text).unwrap();
    let hup = |serve: &Serve| {
        let pid = i32::try_from(serve.child.id()).unwrap();
        // SAFETY: sending a signal to our own child process.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    };
    hup(&serve);
    let deadline = Instant::now() + Duration::from_secs(10);
    while handler
        .tools_changed
        .load(std::sync::atomic::Ordering::SeqCst)
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "no tools/list_changed after the reload"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["chain", "more", "slow"]);
    let started = serve
        .rpc(
            "workflow.start",
            json!({"workflow": "more", "input": {"a": 1}, "wait": true}),
            None,
        )
        .await;
    assert_eq!(started["result"]["output"], json!({"a": 1}), "{started}");

    // A config that does not load changes nothing.
    std::fs::write(&path, "[workflows.broken]\nexpose = true\n").unwrap();
    hup(&serve);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = serve.rpc("host.status", json!({}), None).await;
    assert_eq!(
        status["result"]["exposed"],
        json!(["chain", "more", "slow"])
    );
    assert_eq!(
        handler
            .tools_changed
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    client.cancel().await.unwrap();
}
