//! Run events as Server-Sent Events from a real `wf-host serve`: every event
//! of a run in order, live and replayed, and a reconnect that misses nothing.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use common::serve::Serve;
use common::*;

/// `nap` sleeps upstream for a moment, so the stream is open while the run
/// goes; `copy` and `done` follow it.
fn config(dir: &Path) -> PathBuf {
    let call = repo_root().join("plugins/call.wasm");
    let echo = repo_root().join("plugins/echo.wasm");
    let path = dir.join("wf.toml");
    std::fs::write(
        &path,
        format!(
            r#"[connections.fixture]
command = "wf-host"
args = ["fixture-server"]

[[workflows.three.steps]]
id = "nap"
component = {call:?}
allow = ["fixture.sleep"]
input = '{{capability: "fixture.sleep", arguments: {{ms: 300}}}}'

[[workflows.three.steps]]
id = "copy"
component = {echo:?}
needs = ["nap"]

[[workflows.three.steps]]
id = "done"
component = {echo:?}
needs = ["copy"]
"#
        ),
    )
    .unwrap();
    path
}

/// One parsed SSE event: (id, kind, data).
type Sse = (Option<i64>, String, Value);

fn parse(text: &str) -> Vec<Sse> {
    text.split("\n\n")
        .filter_map(|block| {
            let (mut id, mut kind, mut data) = (None, None, None);
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("event:") {
                    kind = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data = serde_json::from_str(v.trim()).ok();
                }
            }
            Some((id, kind?, data?))
        })
        .collect()
}

async fn stream(serve: &Serve, path: &str, last: Option<i64>) -> Vec<Sse> {
    let mut request = reqwest::Client::new().get(format!("{}{path}", serve.base));
    if let Some(last) = last {
        request = request.header("Last-Event-ID", last.to_string());
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let text = tokio::time::timeout(Duration::from_secs(30), response.text())
        .await
        .expect("the run's stream closes after run.finished")
        .unwrap();
    parse(&text)
}

/// The kinds and steps, without logs and progress.
fn outline(events: &[Sse]) -> Vec<String> {
    events
        .iter()
        .filter(|(_, kind, _)| kind != "step.log" && kind != "step.progress")
        .map(|(_, kind, data)| match data["data"]["step"].as_str() {
            Some(step) => format!("{kind} {step}"),
            None => kind.clone(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_sees_every_event_in_order_and_a_reconnect_misses_nothing() {
    let serve = Serve::start(config, &[]);
    let started = serve
        .rpc(
            "workflow.start",
            json!({"workflow": "three", "input": {"n": 1}}),
            None,
        )
        .await;
    let run_id = started["result"]["run_id"].as_str().unwrap().to_owned();
    // Opened while the run goes: what was kept, then live to the end.
    let live = stream(&serve, &format!("/runs/{run_id}/events"), None).await;
    assert_eq!(
        outline(&live),
        [
            "run.started",
            "step.started nap",
            "step.finished nap",
            "step.started copy",
            "step.finished copy",
            "step.started done",
            "step.finished done",
            "run.finished",
        ]
    );
    assert!(live.iter().all(|(_, _, d)| d["run_id"] == run_id.as_str()));
    assert_eq!(live.last().unwrap().2["data"]["status"], "succeeded");
    let ids: Vec<i64> = live.iter().filter_map(|(id, _, _)| *id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert!(
        live.iter()
            .any(|(_, kind, d)| kind == "step.log" && d["data"]["step"] == "copy"),
        "node logs are events too"
    );
    // A step's log sits between its start and its end.
    for (i, (_, kind, d)) in live.iter().enumerate() {
        if kind != "step.log" {
            continue;
        }
        let step = d["data"]["step"].as_str().unwrap();
        let at = |what: &str| {
            live.iter()
                .position(|(_, k, d)| k == what && d["data"]["step"] == step)
                .unwrap()
        };
        assert!(
            at("step.started") < i && i < at("step.finished"),
            "{step}'s log at {i}: {:?}",
            live.iter().map(|(_, k, _)| k).collect::<Vec<_>>()
        );
    }

    // After the run: the same events replayed, then the stream closes.
    let replay = stream(&serve, &format!("/runs/{run_id}/events"), None).await;
    assert_eq!(replay, live);
    // A reconnect after the third event gets exactly the rest.
    let third = live[2].0.unwrap();
    let rest = stream(&serve, &format!("/runs/{run_id}/events"), Some(third)).await;
    assert_eq!(rest, live[3..]);

    // `/events` carries every run's kept events, from the start.
    let mut response = reqwest::Client::new()
        .get(format!("{}/events", serve.base))
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    while !text.contains("event: run.finished") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), response.chunk())
            .await
            .expect("events arrive")
            .unwrap()
            .expect("the stream stays open");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let all = parse(&text);
    assert_eq!(all[..live.len()], live[..]);
    // An unknown run is a 404, not an empty stream.
    let (code, _) = serve.get("/runs/nope/events", None).await;
    assert_eq!(code, 404);
}
