//! `GET /metrics` of a real `wf-host serve`: Prometheus text whose counters
//! match the runs and calls made.

mod common;

use std::path::{Path, PathBuf};

use serde_json::json;

use common::serve::Serve;
use common::*;

fn config(dir: &Path) -> PathBuf {
    let call = repo_root().join("plugins/call.wasm");
    let path = dir.join("wf.toml");
    std::fs::write(
        &path,
        format!(
            r#"[connections.fixture]
command = "wf-host"
args = ["fixture-server"]

[workflows.greet]
output = '.steps.say.output.structuredContent'

[[workflows.greet.steps]]
id = "say"
component = {call:?}
allow = ["fixture.echo"]

[[workflows.doze.steps]]
id = "z"
sleep = "30s"

[[workflows.greet.steps]]
id = "again"
component = {call:?}
allow = ["fixture.echo"]
needs = ["say"]
input = '{{capability: "fixture.echo", arguments: {{text: "again"}}}}'
"#
        ),
    )
    .unwrap();
    path
}

/// The value of the sample `name` whose labels are `labels`.
fn sample(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(buckets) => buckets.last().map_or(0.0, |b| b.count),
            prometheus_parse::Value::Summary(_) => f64::NAN,
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_as_prometheus_text_and_count_what_ran() {
    let serve = Serve::start(config, &["--token", "m3trics"]);
    let token = Some("m3trics");
    for (input, ok) in [
        (
            json!({"capability": "fixture.echo", "arguments": {"text": "a"}}),
            true,
        ),
        (
            json!({"capability": "fixture.echo", "arguments": {"text": "b"}}),
            true,
        ),
        // Not granted: the first step fails `denied`, the second never runs.
        (
            json!({"capability": "fixture.add", "arguments": {"a": 1, "b": 2}}),
            false,
        ),
    ] {
        let run = serve
            .rpc(
                "workflow.start",
                json!({"workflow": "greet", "input": input, "wait": true}),
                token,
            )
            .await;
        let status = &run["result"]["status"];
        assert_eq!(status, if ok { "succeeded" } else { "failed" }, "{run}");
    }
    assert_eq!(
        serve.get("/metrics", None).await.0,
        401,
        "the token applies"
    );
    let (code, text) = serve.get("/metrics", token).await;
    assert_eq!(code, 200);
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text");
    let runs = |status| {
        sample(
            &scrape,
            "wf_runs_total",
            &[("workflow", "greet"), ("status", status)],
        )
    };
    assert_eq!(runs("succeeded"), Some(2.0), "{text}");
    assert_eq!(runs("failed"), Some(1.0), "{text}");
    assert_eq!(sample(&scrape, "wf_runs_running", &[]), Some(0.0));
    // Four echo calls reached the server; the denied call never left the node.
    let calls = |outcome| {
        sample(
            &scrape,
            "wf_capability_calls_total",
            &[("connection", "fixture"), ("outcome", outcome)],
        )
    };
    assert_eq!(calls("ok"), Some(4.0), "{text}");
    assert_eq!(
        sample(
            &scrape,
            "wf_capability_call_duration_seconds_count",
            &[("connection", "fixture")]
        ),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &scrape,
            "wf_pool_sessions_opened_total",
            &[("connection", "fixture")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &scrape,
            "wf_pool_connection_up",
            &[("connection", "fixture")]
        ),
        Some(1.0)
    );
    // say ran three times, again twice.
    let steps = |step| {
        sample(
            &scrape,
            "wf_step_duration_seconds_count",
            &[("workflow", "greet"), ("step", step)],
        )
    };
    assert_eq!(steps("say"), Some(3.0), "{text}");
    assert_eq!(steps("again"), Some(2.0), "{text}");
}

/// `wf_runs_waiting` counts the runs that sleep, among `wf_runs_running`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_run_is_counted_as_waiting() {
    let serve = Serve::start(config, &[]);
    let started = serve
        .rpc(
            "workflow.start",
            json!({"workflow": "doze", "input": {}}),
            None,
        )
        .await;
    let run_id = started["result"]["run_id"].as_str().unwrap().to_owned();
    let gauges = async || {
        let (code, text) = serve.get("/metrics", None).await;
        assert_eq!(code, 200);
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
            .expect("Prometheus text");
        (
            sample(&scrape, "wf_runs_running", &[]),
            sample(&scrape, "wf_runs_waiting", &[]),
        )
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while gauges().await != (Some(1.0), Some(1.0)) {
        assert!(std::time::Instant::now() < deadline, "{:?}", gauges().await);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let cancelled = serve
        .rpc("workflow.cancel", json!({"run_id": run_id}), None)
        .await;
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    assert_eq!(gauges().await, (Some(0.0), Some(0.0)));
}
