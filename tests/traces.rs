//! OpenTelemetry traces from a real `wf-host`: an OTLP/HTTP collector runs in
//! the test, the host exports to it, and the spans of a workflow run must
//! form one tree (caller → run → step → call) whose call spans' contexts
//! reached the MCP server in `_meta.traceparent`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;
use serde_json::{Value, json};

use common::serve::Serve;
use common::*;

/// The caller's context, sent as `traceparent`.
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// One exported span, flattened.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    /// Empty for a root span.
    parent: String,
    attributes: BTreeMap<String, String>,
    /// The resource's `service.name`.
    service: String,
    links: Vec<(String, String)>,
    /// The names of its events.
    events: Vec<String>,
}

impl Span {
    fn attr(&self, key: &str) -> &str {
        self.attributes
            .get(key)
            .unwrap_or_else(|| panic!("span `{}` has no `{key}`: {self:#?}", self.name))
    }
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

/// An OTLP/HTTP collector on 127.0.0.1: keeps every span posted to
/// `/v1/traces` (protobuf).
struct Collector {
    /// `http://127.0.0.1:<port>`.
    base: String,
    spans: Arc<Mutex<Vec<Span>>>,
    _server: tokio::task::JoinHandle<()>,
}

impl Collector {
    async fn start() -> Collector {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Collector {
            base,
            spans,
            _server: server,
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until `done` holds for the spans received, and returns them.
    async fn wait_for(&self, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "the collector did not get the spans; it has: {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn receive(State(spans): State<Arc<Mutex<Vec<Span>>>>, body: Bytes) -> Vec<u8> {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf request");
    let mut kept = spans.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .as_ref()
            .map(|r| attributes(&r.attributes))
            .and_then(|a| a.get("service.name").cloned())
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                kept.push(Span {
                    name: span.name,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent: hex::encode(&span.parent_span_id),
                    attributes: attributes(&span.attributes),
                    service: service.clone(),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex::encode(&l.trace_id), hex::encode(&l.span_id)))
                        .collect(),
                    events: span.events.iter().map(|e| e.name.clone()).collect(),
                });
            }
        }
    }
    // An empty ExportTraceServiceResponse.
    Vec::new()
}

/// `first` and `second` each call a fixture tool; `last` logs a line. The
/// fixture appends every call (with its `_meta`) to `witness.jsonl`.
fn config(dir: &Path) -> PathBuf {
    let call = repo_root().join("plugins/call.wasm");
    let probe = guest("probe");
    let witness = dir.join("witness.jsonl");
    let path = dir.join("wf.toml");
    std::fs::write(
        &path,
        format!(
            r#"[connections.fixture]
command = "wf-host"
args = ["fixture-server"]
env = {{ WF_FIXTURE_WITNESS = {witness:?} }}

[[workflows.traced.steps]]
id = "first"
component = {call:?}
allow = ["fixture.echo"]
input = '{{capability: "fixture.echo", arguments: {{text: "one"}}}}'

[[workflows.traced.steps]]
id = "second"
component = {call:?}
needs = ["first"]
allow = ["fixture.add"]
input = '{{capability: "fixture.add", arguments: {{a: 1, b: 2}}}}'

[[workflows.traced.steps]]
id = "last"
component = {probe:?}
needs = ["second"]
input = '{{op: "log", messages: [["info", "hello from last"]]}}'
"#
        ),
    )
    .unwrap();
    path
}

/// The calls the fixture received.
fn witness(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("witness.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `workflow.start` with `wait`, sent with `traceparent`; the result.
async fn start_run(serve: &Serve, traceparent: &str) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "workflow.start",
        "params": {"workflow": "traced", "input": null, "wait": true}});
    let reply: Value = http_client()
        .post(format!("{}/rpc", serve.base))
        .header("Content-Type", "application/json")
        .header("traceparent", traceparent)
        .header("tracestate", "caller=1")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(reply["result"]["status"], "succeeded", "{reply}");
    reply["result"].clone()
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// The run's spans are done when the run span and its 3 steps and 2 calls
/// have arrived.
fn whole_run(spans: &[Span]) -> bool {
    named(spans, "run").len() == 1
        && named(spans, "step").len() == 3
        && named(spans, "call").len() == 2
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_is_one_trace_continuing_the_callers() {
    let collector = Collector::start().await;
    let serve = Serve::start_with_env(
        config,
        &["--otlp-endpoint", &collector.base],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let result = start_run(&serve, &traceparent).await;
    let spans = collector.wait_for(whole_run).await;

    for span in &spans {
        assert_eq!(
            span.trace_id, CALLER_TRACE,
            "every span is in the caller's trace: {span:#?}"
        );
        assert_eq!(span.service, "wf-host");
    }
    let run = named(&spans, "run")[0];
    assert_eq!(
        run.parent, CALLER_SPAN,
        "the run continues the caller's span"
    );
    assert_eq!(run.attr("wf.workflow"), "traced");
    assert_eq!(run.attr("wf.run_id"), result["run_id"].as_str().unwrap());
    assert_eq!(run.attr("wf.status"), "succeeded");

    let steps: BTreeMap<&str, &Span> = named(&spans, "step")
        .into_iter()
        .map(|s| (s.attr("wf.step"), s))
        .collect();
    assert_eq!(
        steps.keys().copied().collect::<Vec<_>>(),
        ["first", "last", "second"]
    );
    for step in steps.values() {
        assert_eq!(
            step.parent, run.span_id,
            "a step is a child of the run: {step:#?}"
        );
        assert_eq!(step.attr("wf.attempt"), "1");
        assert_eq!(step.attr("wf.status"), "succeeded");
    }
    assert_eq!(
        steps["last"].events,
        ["hello from last"],
        "node logs are step events"
    );

    let calls = named(&spans, "call");
    let expected = [("first", "echo"), ("second", "add")];
    for (step, tool) in expected {
        let call = calls
            .iter()
            .find(|c| c.attr("wf.tool") == tool)
            .unwrap_or_else(|| panic!("no call span for `{tool}`: {calls:#?}"));
        assert_eq!(
            call.parent, steps[step].span_id,
            "`{tool}` is a child of `{step}`"
        );
        assert_eq!(call.attr("wf.connection"), "fixture");
        assert_eq!(call.attr("wf.outcome"), "ok");
    }

    // The MCP server got each call's own context, and the caller's state.
    let received = witness(serve.dir.path());
    assert_eq!(received.len(), 2, "{received:#?}");
    for line in &received {
        let tool = line["tool"].as_str().unwrap();
        let call = calls.iter().find(|c| c.attr("wf.tool") == tool).unwrap();
        assert_eq!(
            line["meta"]["traceparent"],
            format!("00-{CALLER_TRACE}-{}-01", call.span_id),
            "{line}"
        );
        assert_eq!(line["meta"]["tracestate"], "caller=1", "{line}");
        // The idempotency key still goes along.
        assert!(
            line["meta"]["wf-host/idempotency-key"].is_string(),
            "{line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn run_exports_every_span_before_it_exits() {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    // A batch delay longer than the test: only the flush at exit sends them.
    let output = Command::new(wf_host_bin())
        .args(["run", "--workflow", "traced", "--input", "null", "--config"])
        .arg(&config)
        .env("WF_HOST_CACHE_DIR", dir.path().join("cache"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.base)
        .env("OTEL_SERVICE_NAME", "traces-test")
        .env("OTEL_BSP_SCHEDULE_DELAY", "600000")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SDK_DISABLED")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let spans = collector.spans();
    assert!(whole_run(&spans), "{spans:#?}");
    let run = named(&spans, "run")[0];
    assert_eq!(run.parent, "", "without a caller the run is a trace root");
    assert_eq!(run.service, "traces-test");
    assert!(spans.iter().all(|s| s.trace_id == run.trace_id));
}

#[tokio::test(flavor = "multi_thread")]
async fn without_an_endpoint_nothing_is_exported() {
    let collector = Collector::start().await;
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    // No endpoint at all; then one in the environment but the SDK disabled.
    let endpoint = collector.base.clone();
    let setups: [&[(&str, &str)]; 2] = [
        &[("OTEL_BSP_SCHEDULE_DELAY", "50")],
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SDK_DISABLED", "true"),
        ],
    ];
    for env in setups {
        let serve = Serve::start_with_env(config, &[], env);
        start_run(&serve, &traceparent).await;
        let received = witness(serve.dir.path());
        assert_eq!(received.len(), 2, "{received:#?}");
        for line in &received {
            assert!(line["meta"].get("traceparent").is_none(), "{line}");
            assert!(
                line["meta"]["wf-host/idempotency-key"].is_string(),
                "{line}"
            );
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(collector.spans().is_empty(), "{:#?}", collector.spans());
}

/// `nap` sleeps upstream for `ms` of the input, then `after` echoes.
fn napping_config(dir: &Path) -> PathBuf {
    let call = repo_root().join("plugins/call.wasm");
    let echo = repo_root().join("plugins/echo.wasm");
    let witness = dir.join("witness.jsonl");
    let path = dir.join("wf.toml");
    std::fs::write(
        &path,
        format!(
            r#"[connections.fixture]
command = "wf-host"
args = ["fixture-server"]
env = {{ WF_FIXTURE_WITNESS = {witness:?} }}

[[workflows.napping.steps]]
id = "nap"
component = {call:?}
allow = ["fixture.sleep"]
input = '{{capability: "fixture.sleep", arguments: {{ms: .input.ms}}}}'

[[workflows.napping.steps]]
id = "after"
component = {echo:?}
needs = ["nap"]
"#
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_run_is_a_new_trace_linked_to_its_first_span() {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = napping_config(dir.path());
    let start = || {
        Serve::start_with_env(
            |_| config.clone(),
            &["--otlp-endpoint", &collector.base],
            &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
        )
    };
    let serve = start();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "workflow.start",
        "params": {"workflow": "napping", "input": {"ms": 1000}}});
    let reply: Value = http_client()
        .post(format!("{}/rpc", serve.base))
        .header("Content-Type", "application/json")
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = reply["result"]["run_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while witness(dir.path()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the nap never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // SIGKILL, mid-step: the run's first span never ends.
    drop(serve);

    let serve = start();
    let done = serve
        .rpc(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 30000}),
            None,
        )
        .await;
    assert_eq!(done["result"]["status"], "succeeded", "{done}");
    // The first process kept its run span's context in `run.started`.
    let (status, events) = serve.get(&format!("/runs/{run_id}/events"), None).await;
    assert_eq!(status, 200);
    let first: String = events
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find_map(|e| e["data"]["traceparent"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("run.started has no traceparent: {events}"));
    let parts: Vec<&str> = first.split('-').collect();
    assert_eq!(parts[1], CALLER_TRACE, "{first}");

    let spans = collector
        .wait_for(|spans| {
            spans
                .iter()
                .any(|s| s.name == "run" && s.attributes.contains_key("wf.resumed"))
        })
        .await;
    let run = spans
        .iter()
        .find(|s| s.name == "run" && s.attributes.contains_key("wf.resumed"))
        .unwrap();
    assert_eq!(run.attr("wf.resumed"), "true");
    assert_eq!(run.attr("wf.run_id"), run_id);
    assert_eq!(run.parent, "", "a resumed run starts a new trace");
    assert_ne!(run.trace_id, CALLER_TRACE);
    assert_eq!(
        run.links,
        [(CALLER_TRACE.to_owned(), parts[2].to_owned())],
        "linked to the run's first span"
    );
}
