//! Runs that start on their own and runs that wait for someone: cron
//! schedules, webhooks and signals (approval steps), through real `wf-host
//! serve` processes, on the real clock, with the echo node built from source.
//! The PostgreSQL tests start their own throwaway server.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{Value, json};
use sha2::Sha256;

use common::postgres::TestPostgres;
use common::serve::Serve;
use common::*;

/// Writes `body` as `wf.toml` in `dir`, `{echo}` filled in.
fn write_config(dir: &Path, body: &str) -> PathBuf {
    let text = body.replace("{echo}", &plugin("echo").display().to_string());
    let path = dir.join("wf.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `wf-host serve` on `config`, its state in `state` (a file, or a URL).
fn serve(config: &Path, state: &str, env: &[(&str, &str)]) -> Serve {
    let config = config.to_owned();
    Serve::start_with_env(move |_| config, &["--state", state], env)
}

fn kill(serve: Serve) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(serve.child.id() as i32, libc::SIGKILL) };
    drop(serve);
}

async fn call(serve: &Serve, method: &str, params: Value) -> Value {
    let reply = serve.rpc(method, params, None).await;
    match reply.get("result") {
        Some(result) => result.clone(),
        None => panic!("{method} failed: {reply}"),
    }
}

/// Every run of `workflow`, oldest first, as `workflow.get` shows them.
async fn runs(serve: &Serve, workflow: &str) -> Vec<Value> {
    let listed = call(
        serve,
        "workflow.list",
        json!({"workflow": workflow, "limit": 1000}),
    )
    .await;
    let mut runs = Vec::new();
    for run in listed["runs"].as_array().unwrap().iter().rev() {
        let id = run["run_id"].as_str().unwrap();
        runs.push(call(serve, "workflow.get", json!({"run_id": id})).await);
    }
    runs
}

/// Every tick of an every-second schedule between the first run and the
/// last is accounted for: it started a run, or the next run that did says
/// it stands for it (`missed`, when the scheduler was held up on a busy
/// machine). None is lost silently, none fires twice.
fn every_tick_accounted_for(runs: &[Value]) {
    let mut by_tick: Vec<(u128, u64)> = runs
        .iter()
        .map(|r| {
            (
                epoch_ms(r["trigger"]["scheduled_at"].as_str().unwrap()),
                r["trigger"]["missed"].as_u64().unwrap(),
            )
        })
        .collect();
    by_tick.sort_unstable();
    for pair in by_tick.windows(2) {
        let ((before, _), (after, missed)) = (pair[0], pair[1]);
        assert!(after > before, "a tick fired twice: {by_tick:?}");
        assert_eq!(
            (after - before) / 1000 - 1,
            u128::from(missed),
            "ticks between {before} and {after} lost: {by_tick:?}"
        );
    }
}

/// The runs' ticks, in ms since the epoch, ascending.
fn ticks(runs: &[Value]) -> Vec<u128> {
    let mut ticks: Vec<u128> = runs
        .iter()
        .map(|r| {
            assert_eq!(r["trigger"]["kind"], "schedule", "{r}");
            epoch_ms(r["trigger"]["scheduled_at"].as_str().unwrap())
        })
        .collect();
    ticks.sort_unstable();
    ticks
}

fn epoch_ms(text: &str) -> u128 {
    humantime::parse_rfc3339_weak(text)
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A sum of a counter's samples in `/metrics` whose labels include `labels`.
async fn metric(serve: &Serve, name: &str, labels: &str) -> f64 {
    let (status, text) = serve.get("/metrics", None).await;
    assert_eq!(status, 200);
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

const EVERY_SECOND: &str = r#"
[workflows.tick]
component = "{echo}"
[[workflows.tick.schedules]]
name = "each-second"
cron = "*/1 * * * * *"
input = '{at: .scheduled_at, from: .schedule}'
"#;

/// A 6-field schedule fires once a second: one run per tick, each on its
/// own second, its input from the schedule's `input` mapping, its trigger
/// naming the schedule and the tick; the metric counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_six_field_schedule_fires_once_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), EVERY_SECOND);
    let state = dir.path().join("state.db");
    let serve = serve(&config, state.to_str().unwrap(), &[]);
    let began = now_ms();
    tokio::time::sleep(Duration::from_millis(5300)).await;
    let runs = runs(&serve, "tick").await;
    let ticks = ticks(&runs);
    assert!(
        (3..=6).contains(&ticks.len()),
        "{} runs in 5.3 s: {ticks:?}",
        ticks.len()
    );
    every_tick_accounted_for(&runs);
    assert!(
        ticks[0] > began && ticks[0].is_multiple_of(1000),
        "{ticks:?}"
    );
    for run in &runs {
        assert_eq!(run["trigger"]["name"], "each-second");
        assert_eq!(run["input"]["from"], "each-second");
        assert_eq!(run["input"]["at"], run["trigger"]["scheduled_at"]);
    }
    let fired = metric(
        &serve,
        "wf_schedule_fires_total",
        r#"schedule="each-second""#,
    )
    .await;
    assert!(
        fired >= ticks.len() as f64,
        "{fired} fires counted for {} runs",
        ticks.len()
    );
    let status = call(&serve, "host.status", json!({})).await;
    let schedule = &status["schedules"][0];
    assert_eq!(schedule["name"], "each-second");
    assert_eq!(schedule["cron"], "*/1 * * * * *");
    assert!(schedule["next_at"].is_string(), "{status}");
    assert!(schedule["last_run_id"].is_string(), "{status}");
}

/// Down for 5 s, then back: `catch_up = "one"` fires the latest missed tick,
/// once (its trigger counts the ticks it stands for), and none of the
/// others; `"none"` fires none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_downtime_catch_up_one_fires_one_missed_tick_and_none_fires_none() {
    for catch_up in ["one", "none"] {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(
            dir.path(),
            &format!("{EVERY_SECOND}catch_up = \"{catch_up}\"\n"),
        );
        let state = dir.path().join("state.db");
        let state = state.to_str().unwrap();
        let first = serve(&config, state, &[]);
        wait_until("two ticks", Duration::from_secs(10), async || {
            runs(&first, "tick").await.len() >= 2
        })
        .await;
        kill(first);
        let killed = now_ms();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let restarted = now_ms();
        let second = serve(&config, state, &[]);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let runs = runs(&second, "tick").await;
        let before: Vec<&Value> = runs
            .iter()
            .filter(|r| epoch_ms(r["started_at"].as_str().unwrap()) < killed)
            .collect();
        let last_before = ticks(&before.iter().map(|r| (*r).clone()).collect::<Vec<_>>())
            .last()
            .copied()
            .unwrap();
        let after: Vec<Value> = runs
            .iter()
            .filter(|r| epoch_ms(r["trigger"]["scheduled_at"].as_str().unwrap()) > last_before)
            .cloned()
            .collect();
        let after_ticks = ticks(&after);
        assert!(!after_ticks.is_empty(), "no tick fired after the restart");
        let missed: Vec<u64> = after
            .iter()
            .map(|r| r["trigger"]["missed"].as_u64().unwrap())
            .collect();
        let in_downtime = after_ticks
            .iter()
            .filter(|&&t| t > last_before && t <= restarted)
            .count();
        match catch_up {
            "one" => {
                // The first run after the restart catches up: the latest
                // missed tick, standing for the others.
                assert!(missed[0] >= 4, "it stands for the ticks missed: {missed:?}");
                assert!(after_ticks[0] > last_before + 4000, "{after_ticks:?}");
                assert!(
                    in_downtime <= 1,
                    "one missed tick fired, not all: {after_ticks:?}"
                );
                // From there on, every tick is accounted for.
                every_tick_accounted_for(&after);
            }
            _ => {
                assert_eq!(in_downtime, 0, "no missed tick fires: {after_ticks:?}");
                assert!(after_ticks[0] > restarted, "{after_ticks:?}");
            }
        }
        assert_eq!(
            after_ticks.iter().collect::<BTreeSet<_>>().len(),
            after_ticks.len(),
            "no tick fires twice"
        );
    }
}

/// Two PostgreSQL workers, one schedule: every tick fires exactly once
/// (one run per second, never two for one tick), whichever worker fires it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_postgres_workers_fire_each_tick_once() {
    let pg = TestPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), EVERY_SECOND);
    let url = pg.url();
    let a = serve(&config, &url, &[]);
    let b = serve(&config, &url, &[]);
    tokio::time::sleep(Duration::from_millis(5300)).await;
    let runs = runs(&a, "tick").await;
    let ticks = ticks(&runs);
    assert!(ticks.len() >= 4, "{ticks:?}");
    assert_eq!(
        ticks.iter().collect::<BTreeSet<_>>().len(),
        ticks.len(),
        "a tick fired twice: {ticks:?}"
    );
    every_tick_accounted_for(&runs);
    let fired = metric(&a, "wf_schedule_fires_total", "each-second").await
        + metric(&b, "wf_schedule_fires_total", "each-second").await;
    // Runs listed a moment ago; a tick may have fired since.
    assert!(
        (ticks.len() as f64..=ticks.len() as f64 + 1.0).contains(&fired),
        "{fired} fires counted by both workers for {} runs",
        ticks.len()
    );
}

const HOOKS: &str = r#"
[workflows.push]
component = "{echo}"
[workflows.push.webhook]
signature = "github"
secret_env = "PUSH_SECRET"
input = '{ref: .body.ref, event: .headers["x-github-event"], tag: .query.tag}'
max_input = "4 KiB"

[workflows.events]
component = "{echo}"
[workflows.events.webhook]
signature = "standard-webhooks"
secret_env = "EVENTS_SECRET"

[workflows.plain]
component = "{echo}"
[workflows.plain.webhook]
signature = "hmac-sha256"
header = "X-Signature"
secret_file = "plain.secret"
"#;

const PUSH_SECRET: &str = "It's a Secret to Everybody";
/// `whsec_` and base64 of the key.
const EVENTS_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn hmac_hex(key: &[u8], parts: &[&[u8]]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    for part in parts {
        mac.update(part);
    }
    hex::encode(mac.finalize().into_bytes())
}

async fn post(serve: &Serve, path: &str, headers: &[(&str, String)], body: &str) -> (u16, Value) {
    let mut request = http_client()
        .post(format!("{}{path}", serve.base))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Webhooks: a GitHub-signed delivery starts a run with its mapped input
/// (202 and the run id); a redelivery (same `X-GitHub-Delivery`) gets the
/// same run; a wrong signature, a missing one, a stale Standard Webhooks
/// timestamp each get 401 and start nothing (the store shows no other run);
/// a body over `max_input` gets 413; a page's `Origin` does not matter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_start_verified_runs_and_refuse_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("plain.secret"), "plain-key\n").unwrap();
    let config = write_config(dir.path(), HOOKS);
    let state = dir.path().join("state.db");
    let serve = serve(
        &config,
        state.to_str().unwrap(),
        &[
            ("PUSH_SECRET", PUSH_SECRET),
            ("EVENTS_SECRET", EVENTS_SECRET),
        ],
    );
    let body = r#"{"ref":"refs/heads/main","after":"abc"}"#;
    let signed = format!(
        "sha256={}",
        hmac_hex(PUSH_SECRET.as_bytes(), &[body.as_bytes()])
    );
    let github = |delivery: &str, signature: &str| {
        vec![
            ("X-GitHub-Event", "push".to_owned()),
            ("X-GitHub-Delivery", delivery.to_owned()),
            ("X-Hub-Signature-256", signature.to_owned()),
            // Server to server: no page's origin applies.
            ("Origin", "https://github.com".to_owned()),
        ]
    };
    let (status, reply) = post(&serve, "/hooks/push?tag=v1", &github("d-1", &signed), body).await;
    assert_eq!(status, 202, "{reply}");
    let run_id = reply["run_id"].as_str().unwrap().to_owned();
    let done = call(
        &serve,
        "workflow.wait",
        json!({"run_id": run_id, "timeout_ms": 30000}),
    )
    .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(
        done["output"],
        json!({"ref": "refs/heads/main", "event": "push", "tag": "v1"})
    );
    assert_eq!(
        done["trigger"],
        json!({"kind": "webhook", "delivery": "d-1"})
    );

    let (status, again) = post(&serve, "/hooks/push", &github("d-1", &signed), body).await;
    assert_eq!(
        (status, &again["run_id"]),
        (202, &json!(run_id)),
        "a redelivery is the same run"
    );

    let wrong = format!("sha256={}", hmac_hex(b"not the secret", &[body.as_bytes()]));
    let (status, reply) = post(&serve, "/hooks/push", &github("d-2", &wrong), body).await;
    assert_eq!(status, 401, "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("does not match"),
        "{reply}"
    );
    let (status, reply) = post(
        &serve,
        "/hooks/push",
        &[("X-GitHub-Delivery", "d-3".into())],
        body,
    )
    .await;
    assert_eq!(status, 401, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("missing `x-hub-signature-256`"),
        "{reply}"
    );
    let tampered = body.replace("main", "evil");
    let (status, _) = post(&serve, "/hooks/push", &github("d-4", &signed), &tampered).await;
    assert_eq!(status, 401, "a signature is of the body it came with");
    let big = format!(r#"{{"ref":"{}"}}"#, "x".repeat(5000));
    let big_sig = format!(
        "sha256={}",
        hmac_hex(PUSH_SECRET.as_bytes(), &[big.as_bytes()])
    );
    let (status, _) = post(&serve, "/hooks/push", &github("d-5", &big_sig), &big).await;
    assert_eq!(status, 413);
    let (status, _) = post(&serve, "/hooks/nope", &[], "{}").await;
    assert_eq!(status, 404);

    // Standard Webhooks: signed over `id.timestamp.body`, within 5 minutes.
    let key = base64::engine::general_purpose::STANDARD
        .decode(EVENTS_SECRET.trim_start_matches("whsec_"))
        .unwrap();
    let standard = |id: &str, at: u64| {
        let ts = at.to_string();
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
        mac.update(format!("{id}.{ts}.{body}").as_bytes());
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        vec![
            ("webhook-id", id.to_owned()),
            ("webhook-timestamp", ts),
            ("webhook-signature", format!("v1,bm90IHRoaXMgb25l v1,{sig}")),
        ]
    };
    let now = (now_ms() / 1000) as u64;
    let (status, reply) = post(&serve, "/hooks/events", &standard("msg_1", now), body).await;
    assert_eq!(status, 202, "{reply}");
    let (status, reply) = post(&serve, "/hooks/events", &standard("msg_2", now - 600), body).await;
    assert_eq!(status, 401, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("webhook-timestamp"),
        "{reply}"
    );
    let mut absurd = standard("msg_3", now);
    absurd[1].1 = u64::MAX.to_string();
    let (status, reply) = post(&serve, "/hooks/events", &absurd, body).await;
    assert_eq!(
        status, 401,
        "a timestamp past any clock is refused, not a crash: {reply}"
    );
    let long_id = "x".repeat(300);
    let (status, reply) = post(&serve, "/hooks/push", &github(&long_id, &signed), body).await;
    assert_eq!(status, 400, "{reply}");

    // A plain HMAC in a header of the config's choosing, the secret from a file.
    let plain = hmac_hex(b"plain-key", &[body.as_bytes()]);
    let (status, reply) = post(&serve, "/hooks/plain", &[("X-Signature", plain)], body).await;
    assert_eq!(status, 202, "{reply}");

    // Only the three verified deliveries made runs.
    let mut started = 0;
    for workflow in ["push", "events", "plain"] {
        started += runs(&serve, workflow).await.len();
    }
    assert_eq!(started, 3);
    let refused = metric(&serve, "wf_webhook_requests_total", r#"status="401""#).await;
    assert_eq!(refused, 5.0);
}

/// A webhook without a secret, or with `verify` off but not written out,
/// is refused when the config loads, naming what is missing.
#[test]
fn a_webhook_without_its_secret_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "[workflows.push]\ncomponent = \"{echo}\"\n[workflows.push.webhook]\nsignature = \"github\"\nsecret_env = \"NO_SUCH_SECRET_VAR\"\n",
    );
    let out = std::process::Command::new(wf_host_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env_remove("NO_SUCH_SECRET_VAR")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("workflow `push`: webhook: the environment variable `NO_SUCH_SECRET_VAR` (`secret_env`) is not set"),
        "{stderr}"
    );
    write_config(
        dir.path(),
        "[workflows.push]\ncomponent = \"{echo}\"\n[workflows.push.webhook]\n",
    );
    let out = std::process::Command::new(wf_host_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("or `verify = \"none\"`"), "{stderr}");
}

const APPROVAL: &str = r#"
[workflows.deploy]
expose = true
output = '{approval: .steps.approve.output, input: .input}'
[[workflows.deploy.steps]]
id = "prepare"
component = "{echo}"
[[workflows.deploy.steps]]
id = "approve"
needs = ["prepare"]
wait = "approve"
timeout = "TIMEOUT"
schema = { type = "object", required = ["approved"], properties = { approved = { type = "boolean" } } }
input = '{release: .steps.prepare.output.release}'
[[workflows.deploy.steps]]
id = "ship"
needs = ["approve"]
if = '.steps.approve.output.approved'
component = "{echo}"

[workflows.slow-start]
[[workflows.slow-start.steps]]
id = "first"
sleep = "1500ms"
[[workflows.slow-start.steps]]
id = "approve"
needs = ["first"]
wait = "approve"
"#;

fn approval_config(dir: &Path, timeout: &str) -> PathBuf {
    write_config(dir, &APPROVAL.replace("TIMEOUT", timeout))
}

/// Waits until step `step` of the run is `waiting`; the run.
async fn until_waiting(serve: &Serve, run_id: &str, step: &str) -> Value {
    let mut got = Value::Null;
    wait_until("the wait step", Duration::from_secs(30), async || {
        got = call(serve, "workflow.get", json!({"run_id": run_id})).await;
        got["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == step && s["status"] == "waiting")
    })
    .await;
    got
}

/// An approval through JSON-RPC: the run waits (step `waiting`, listed by
/// `workflow.waiting`, counted by `host.status`), a payload that breaks the
/// schema is -32602 and the run keeps waiting, the approval resumes it with
/// the payload as the step's output; a signal to a run that no longer waits
/// is -32008 and names why. A wait survives a SIGKILL of the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_through_rpc_resumes_the_run_and_bad_signals_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = approval_config(dir.path(), "1h");
    let state = dir.path().join("state.db");
    let state = state.to_str().unwrap();
    let first = serve(&config, state, &[]);
    let run = call(
        &first,
        "workflow.start",
        json!({"workflow": "deploy", "input": {"release": "1.2"}}),
    )
    .await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let got = until_waiting(&first, &run_id, "approve").await;
    assert_eq!(got["steps"][1]["input"]["signal"], "approve");
    assert_eq!(
        got["steps"][1]["input"]["request"],
        json!({"release": "1.2"})
    );
    let waiting = call(&first, "workflow.waiting", json!({})).await;
    assert_eq!(waiting["steps"][0]["run_id"], json!(run_id), "{waiting}");
    let status = call(&first, "host.status", json!({})).await;
    assert_eq!(status["state"]["runs_waiting_for_signal"], 1, "{status}");
    // The host dies while the run waits; the next one waits on.
    kill(first);
    let serve = serve(&config, state, &[]);
    until_waiting(&serve, &run_id, "approve").await;

    let bad = serve
        .rpc(
            "workflow.signal",
            json!({"run_id": run_id, "signal": "approve", "payload": {"approved": "yes"}}),
            None,
        )
        .await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`/approved`"),
        "{bad}"
    );
    let unknown = serve
        .rpc(
            "workflow.signal",
            json!({"run_id": run_id, "signal": "nope", "payload": {}}),
            None,
        )
        .await;
    assert_eq!(unknown["error"]["code"], -32008, "{unknown}");
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("waits only for `approve`"),
        "{unknown}"
    );

    let sent = call(
        &serve,
        "workflow.signal",
        json!({"run_id": run_id, "signal": "approve", "payload": {"approved": true, "by": "ana"}}),
    )
    .await;
    assert_eq!(sent["delivery"], "waiting", "{sent}");
    assert_eq!(sent["step"], "approve");
    let done = call(
        &serve,
        "workflow.wait",
        json!({"run_id": run_id, "timeout_ms": 30000}),
    )
    .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(
        done["output"]["approval"],
        json!({"approved": true, "by": "ana"})
    );
    let steps = done["steps"].as_array().unwrap();
    assert_eq!(steps[2]["status"], "succeeded", "approved: it ships");

    let late = serve
        .rpc(
            "workflow.signal",
            json!({"run_id": run_id, "signal": "approve", "payload": {"approved": true}}),
            None,
        )
        .await;
    assert_eq!(late["error"]["code"], -32008, "{late}");
    assert!(
        late["error"]["message"]
            .as_str()
            .unwrap()
            .contains("it has finished as `succeeded`"),
        "{late}"
    );
}

/// A signal sent before its step waits is kept, and taken when the step
/// gets there; a second one for the same single step is refused rather than
/// kept forever. A wait step that times out fails `timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_signal_is_kept_and_a_wait_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let config = approval_config(dir.path(), "1s");
    let state = dir.path().join("state.db");
    let serve = serve(&config, state.to_str().unwrap(), &[]);

    let run = call(
        &serve,
        "workflow.start",
        json!({"workflow": "slow-start", "input": {}}),
    )
    .await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let sent = call(
        &serve,
        "workflow.signal",
        json!({"run_id": run_id, "signal": "approve", "payload": {"early": true}}),
    )
    .await;
    assert_eq!(sent["delivery"], "kept", "{sent}");
    let twice = serve
        .rpc(
            "workflow.signal",
            json!({"run_id": run_id, "signal": "approve", "payload": {}}),
            None,
        )
        .await;
    assert_eq!(twice["error"]["code"], -32008, "{twice}");
    let done = call(
        &serve,
        "workflow.wait",
        json!({"run_id": run_id, "timeout_ms": 30000}),
    )
    .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], json!({"early": true}));

    let run = call(
        &serve,
        "workflow.start",
        json!({"workflow": "deploy", "input": {"release": "2"}}),
    )
    .await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let done = call(
        &serve,
        "workflow.wait",
        json!({"run_id": run_id, "timeout_ms": 30000}),
    )
    .await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "timeout", "{done}");
    assert_eq!(done["steps"][1]["error"]["code"], "timeout");
    assert!(
        done["steps"][1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no `approve` signal came within 1s"),
        "{done}"
    );
}

/// An approval through `/mcp`: the `signal` tool is offered next to the
/// exposed workflow that waits, and resumes its run; a rejection flows
/// through as the step's output, so the step that needs approval is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_through_mcp_resumes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = approval_config(dir.path(), "1h");
    let state = dir.path().join("state.db");
    let serve = serve(&config, state.to_str().unwrap(), &[]);
    let run = call(
        &serve,
        "workflow.start",
        json!({"workflow": "deploy", "input": {"release": "3"}}),
    )
    .await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    until_waiting(&serve, &run_id, "approve").await;

    let transport = StreamableHttpClientTransport::from_uri(serve.mcp_url());
    let client = ().serve(transport).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert!(
        names.contains(&"signal") && names.contains(&"deploy"),
        "{names:?}"
    );
    let args = json!({"run_id": run_id, "signal": "approve", "payload": {"approved": false, "comment": "not today"}});
    let result = client
        .call_tool(
            CallToolRequestParams::new("signal").with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(
        result.structured_content.as_ref().unwrap()["step"],
        "approve"
    );
    client.cancel().await.unwrap();

    let done = call(
        &serve,
        "workflow.wait",
        json!({"run_id": run_id, "timeout_ms": 30000}),
    )
    .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"]["approval"]["comment"], "not today");
    assert_eq!(
        done["steps"][2]["status"], "skipped",
        "rejected: nothing ships"
    );
}

/// Two PostgreSQL workers: a signal sent through either reaches the run,
/// whichever worker drives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_through_any_postgres_worker_reaches_the_run() {
    let pg = TestPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let config = approval_config(dir.path(), "1h");
    let url = pg.url();
    let a = serve(&config, &url, &[]);
    let b = serve(&config, &url, &[]);
    let mut ids = Vec::new();
    for i in 0..4 {
        let via = if i % 2 == 0 { &a } else { &b };
        let run = call(
            via,
            "workflow.start",
            json!({"workflow": "deploy", "input": {"release": i}}),
        )
        .await;
        ids.push(run["run_id"].as_str().unwrap().to_owned());
    }
    for (i, id) in ids.iter().enumerate() {
        until_waiting(&a, id, "approve").await;
        // Each through the other worker than the one that started it.
        let via = if i % 2 == 0 { &b } else { &a };
        call(
            via,
            "workflow.signal",
            json!({"run_id": id, "signal": "approve", "payload": {"approved": true}}),
        )
        .await;
    }
    for id in &ids {
        let started = Instant::now();
        let done = call(
            &a,
            "workflow.wait",
            json!({"run_id": id, "timeout_ms": 30000}),
        )
        .await;
        assert_eq!(done["status"], "succeeded", "{done}");
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "the note was not heard: polled"
        );
    }
}

/// A run of 2.5 s on a schedule that ticks every second: with `skip`, no
/// two runs of the schedule overlap and the ticks in between start nothing
/// (counted as skipped); with `queue`, the tick that came while a run ran
/// fires as soon as it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_ticks_are_skipped_or_queued() {
    for overlap in ["skip", "queue"] {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(
            dir.path(),
            &format!(
                r#"
[[workflows.slow.steps]]
id = "nap"
sleep = "2500ms"
[[workflows.slow.schedules]]
cron = "* * * * * *"
overlap = "{overlap}"
"#
            ),
        );
        let state = dir.path().join("state.db");
        let serve = serve(&config, state.to_str().unwrap(), &[]);
        tokio::time::sleep(Duration::from_millis(6500)).await;
        let runs = runs(&serve, "slow").await;
        assert!(
            (2..=3).contains(&runs.len()),
            "{overlap}: {} runs",
            runs.len()
        );
        let mut finished_before = None;
        for run in &runs {
            let started = epoch_ms(run["started_at"].as_str().unwrap());
            if let Some(previous_end) = finished_before {
                assert!(
                    started >= previous_end,
                    "{overlap}: a run started before the last one ended: {runs:?}"
                );
                if overlap == "queue" {
                    assert!(
                        started - previous_end < 1000,
                        "queue: the queued tick fired {} ms after the run ended",
                        started - previous_end
                    );
                }
            }
            finished_before = run["finished_at"].as_str().map(epoch_ms);
        }
        let skipped = metric(&serve, "wf_schedule_skips_total", "").await;
        match overlap {
            "skip" => assert!(skipped >= 2.0, "skip: {skipped} ticks skipped"),
            _ => assert_eq!(skipped, 0.0, "queue: ticks are queued, not skipped"),
        }
    }
}

/// Behind `--token`, a signed webhook needs no bearer token (GitHub cannot
/// send one: its signature is what lets it in), while one with `verify =
/// "none"` takes the token like every other caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_token_only_unsigned_webhooks_need_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "{HOOKS}\n[workflows.open]\ncomponent = \"{{echo}}\"\n[workflows.open.webhook]\nverify = \"none\"\n"
        ),
    );
    std::fs::write(dir.path().join("plain.secret"), "plain-key").unwrap();
    let config2 = config.clone();
    let serve = Serve::start_with_env(
        move |_| config2,
        &["--state", ":memory:", "--token", "hook-test-token"],
        &[
            ("PUSH_SECRET", PUSH_SECRET),
            ("EVENTS_SECRET", EVENTS_SECRET),
        ],
    );
    let body = r#"{"ref":"refs/heads/x"}"#;
    let plain = hmac_hex(b"plain-key", &[body.as_bytes()]);
    let (status, reply) = post(&serve, "/hooks/plain", &[("X-Signature", plain)], body).await;
    assert_eq!(status, 202, "a signed delivery needs no token: {reply}");
    let (status, reply) = post(&serve, "/hooks/open", &[], body).await;
    assert_eq!(status, 401, "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("bearer token"),
        "{reply}"
    );
    let bearer = vec![("Authorization", "Bearer hook-test-token".to_owned())];
    let (status, reply) = post(&serve, "/hooks/open", &bearer, body).await;
    assert_eq!(status, 202, "{reply}");
    // An unsigned webhook is as closed to a foreign page as `/rpc` is.
    let from_page = vec![
        ("Authorization", "Bearer hook-test-token".to_owned()),
        ("Origin", "https://evil.example".to_owned()),
    ];
    let (status, reply) = post(&serve, "/hooks/open", &from_page, body).await;
    assert_eq!(status, 403, "{reply}");
    // The hooks path reaches nothing else, and other routes keep their checks.
    for path in ["/hooks/open/more", "/hooks/", "/hooks/open%2F..%2Frpc"] {
        let (status, _) = post(&serve, path, &bearer, body).await;
        assert_eq!(status, 404, "{path}");
    }
    let page = vec![("Origin", "https://evil.example".to_owned())];
    let (status, _) = post(&serve, "/rpc", &page, body).await;
    assert_eq!(status, 403, "/rpc still refuses a foreign page");
}

/// An MCP client that answers elicitations: it approves every question,
/// with a comment, and counts them.
#[derive(Clone, Default)]
struct Approver {
    asked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    tasks: bool,
    /// Speaks 2026-07-28 (no `initialize`; questions come back as results).
    modern: bool,
}

impl rmcp::ClientHandler for Approver {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let builder = rmcp::model::ClientCapabilities::builder();
        let capabilities = if self.tasks {
            builder.enable_tasks().build()
        } else {
            builder.enable_elicitation().build()
        };
        let mut config = rmcp::model::ClientConfig::new(
            capabilities,
            rmcp::model::Implementation::new("approver", "1"),
        );
        config.protocol_version = if self.modern {
            rmcp::model::ProtocolVersion::V_2026_07_28
        } else {
            rmcp::model::ProtocolVersion::V_2025_11_25
        };
        config
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        if let rmcp::model::ElicitRequestParams::FormElicitationParams { message, .. } = request {
            self.asked.lock().unwrap().push(message);
        }
        Ok(
            rmcp::model::ElicitResult::new(rmcp::model::ElicitationAction::Accept)
                .with_content(json!({"approved": true, "comment": "asked and approved"})),
        )
    }
}

/// A client that takes tasks gets the run as a task at once (its id is the
/// run id): `tasks/get` shows it working, then `input_required` with an
/// elicitation for the waiting step; `tasks/update` answers it and the task
/// completes with the tool's result. `tasks/cancel` cancels another run.
/// A client without tasks that takes elicitations is asked, on the call it
/// keeps open, and its answer resumes the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_clients_get_runs_as_tasks_and_answer_approvals() {
    use rmcp::model::{
        CancelTaskParams, GetTaskParams, InputRequest, TaskPayload, TaskStatus, UpdateTaskParams,
    };
    let dir = tempfile::tempdir().unwrap();
    let config = approval_config(dir.path(), "1h");
    let state = dir.path().join("state.db");
    let serve = serve(&config, state.to_str().unwrap(), &[]);

    let tasks = Approver {
        tasks: true,
        ..Approver::default()
    };
    let client = tasks
        .serve(StreamableHttpClientTransport::from_uri(serve.mcp_url()))
        .await
        .unwrap();
    let args = json!({"release": "9"});
    let deploy =
        CallToolRequestParams::new("deploy").with_arguments(args.as_object().unwrap().clone());
    let created = match client.call_tool_once(deploy.clone()).await.unwrap() {
        rmcp::model::CallToolResponse::Task(created) => created.task,
        other => panic!("not a task: {other:?}"),
    };
    let task_id = created.task_id.clone();
    let run = call(&serve, "workflow.get", json!({"run_id": task_id})).await;
    assert_eq!(run["workflow"], "deploy", "the task is the run");
    let get = async |id: &str| client.get_task(GetTaskParams::new(id)).await.unwrap().task;
    let mut detailed = get(&task_id).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while detailed.status() != TaskStatus::InputRequired {
        assert!(
            Instant::now() < deadline,
            "never asked for input: {detailed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        detailed = get(&task_id).await;
    }
    let TaskPayload::InputRequired { input_requests } = &detailed.payload else {
        unreachable!("status input_required")
    };
    assert!(
        matches!(
            input_requests.get("approve"),
            Some(InputRequest::Elicitation(_))
        ),
        "{input_requests:?}"
    );
    let answer = json!({"action": "accept", "content": {"approved": true, "comment": "via task"}});
    client
        .update_task(UpdateTaskParams::new(
            task_id.clone(),
            [("approve".to_owned(), answer)].into_iter().collect(),
        ))
        .await
        .unwrap();
    while !detailed.status().is_terminal() {
        assert!(Instant::now() < deadline, "never completed: {detailed:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        detailed = get(&task_id).await;
    }
    let TaskPayload::Completed { result } = &detailed.payload else {
        panic!("not completed: {detailed:?}");
    };
    assert_eq!(
        result["structuredContent"]["approval"],
        json!({"approved": true, "comment": "via task"}),
        "{result:?}"
    );

    let other = match client.call_tool_once(deploy.clone()).await.unwrap() {
        rmcp::model::CallToolResponse::Task(created) => created.task.task_id,
        other => panic!("not a task: {other:?}"),
    };
    client
        .cancel_task(CancelTaskParams::new(other.clone()))
        .await
        .unwrap();
    let mut cancelled = get(&other).await;
    while cancelled.status() != TaskStatus::Cancelled {
        assert!(Instant::now() < deadline, "never cancelled: {cancelled:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancelled = get(&other).await;
    }
    let run = call(&serve, "workflow.get", json!({"run_id": other})).await;
    assert_eq!(run["status"], "cancelled");
    // Only runs started as tasks are tasks: one started over RPC is not
    // this face's to read or cancel.
    let by_rpc = call(
        &serve,
        "workflow.start",
        json!({"workflow": "deploy", "input": {"release": "x"}}),
    )
    .await;
    let by_rpc = by_rpc["run_id"].as_str().unwrap().to_owned();
    let refused = client
        .cancel_task(CancelTaskParams::new(by_rpc.clone()))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    let got = call(&serve, "workflow.get", json!({"run_id": by_rpc})).await;
    assert_eq!(got["status"], "running");
    // A round's state is sealed: one made up names no run.
    let mut forged = deploy.clone();
    forged.request_state = Some(format!("{by_rpc}.00"));
    let refused = client.call_tool_once(forged).await;
    assert!(refused.is_err(), "{refused:?}");
    client.cancel().await.unwrap();

    // Without tasks, with elicitation: asked while the call is open.
    let approver = Approver::default();
    let asked = approver.asked.clone();
    let client = approver
        .serve(StreamableHttpClientTransport::from_uri(serve.mcp_url()))
        .await
        .unwrap();
    let result = client.call_tool(deploy.clone()).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(
        result.structured_content.as_ref().unwrap()["approval"],
        json!({"approved": true, "comment": "asked and approved"})
    );
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(
        asked[0].contains("step `approve` waits for `approve`"),
        "{asked:?}"
    );
    client.cancel().await.unwrap();

    // A 2026-07-28 client: the question comes back as the call's
    // `input_required` result, and the call made again with the answer (and
    // the state it was given) resumes the same run.
    use rmcp::service::{ClientLifecycleMode, ClientServiceExt};
    let modern = Approver {
        modern: true,
        ..Approver::default()
    };
    let asked = modern.asked.clone();
    let client = modern
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_uri(serve.mcp_url()),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .unwrap();
    let before = runs(&serve, "deploy").await.len();
    let result = client.call_tool(deploy).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(
        result.structured_content.as_ref().unwrap()["approval"],
        json!({"approved": true, "comment": "asked and approved"})
    );
    assert_eq!(asked.lock().unwrap().len(), 1);
    assert_eq!(
        runs(&serve, "deploy").await.len(),
        before + 1,
        "one run for the call and its rounds"
    );
    client.cancel().await.unwrap();
}

/// The official Python SDK's client, with an elicitation callback, calls a
/// workflow that waits for approval: it is asked (in the protocol revision
/// it speaks), approves, and gets the run's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_approves_a_waiting_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = approval_config(dir.path(), "1h");
    let state = dir.path().join("state.db");
    let serve = serve(&config, state.to_str().unwrap(), &[]);
    let script = repo_root().join("tests/mcp/python_approver.py");
    // The venv tests/interop/setup.sh makes with the pinned `mcp` package.
    let python = repo_root().join("tests/interop/python/.venv/bin/python");
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(serve.mcp_url())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("the python client finished")
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run tests/interop/setup.sh (tests/run.sh does)",
                python.display()
            )
        });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python client failed:\n{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(report["is_error"], false, "{report}");
    assert_eq!(
        report["structured"]["approval"],
        json!({"approved": true, "comment": "from python"}),
        "{report}"
    );
    let asked = report["asked"].as_array().unwrap();
    assert_eq!(asked.len(), 1, "{report}");
    assert!(asked[0].as_str().unwrap().contains("waits for `approve`"));
    let run_id = report["run_id"].as_str().unwrap();
    let run = call(&serve, "workflow.get", json!({"run_id": run_id})).await;
    assert_eq!(run["steps"][2]["status"], "succeeded", "approved: it ships");
}

/// The official TypeScript SDK's client, declaring elicitation, calls a
/// workflow that waits for approval: it gets `elicitation/create` on the
/// open call, approves, and gets the run's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_typescript_client_approves_a_waiting_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = approval_config(dir.path(), "1h");
    let state = dir.path().join("state.db");
    let serve = serve(&config, state.to_str().unwrap(), &[]);
    // The SDK that tests/interop/setup.sh installs, pinned by its lock file.
    let script = repo_root().join("tests/interop/node/approver.mjs");
    let out = tokio::process::Command::new("node")
        .arg(&script)
        .arg(serve.mcp_url())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("the node client finished")
        .unwrap_or_else(|e| panic!("node: {e}; run tests/interop/setup.sh (tests/run.sh does)"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "node client failed:\n{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(report["is_error"], false, "{report}");
    assert_eq!(
        report["structured"]["approval"],
        json!({"approved": true, "comment": "from node"}),
        "{report}"
    );
    assert_eq!(report["asked"].as_array().unwrap().len(), 1, "{report}");
}

/// An exposed workflow whose step calls the fixture's `ask` (a question
/// the upstream server asks mid-call).
const ASKING: &str = r#"
[connections.fixture]
command = "wf-host"
args = ["fixture-server"]

[workflows.asks]
expose = true
component = "{call}"
allow = ["fixture.ask"]
"#;

/// The official Python client (2026-07-28 `input_required` rounds) and
/// TypeScript client (`elicitation/create` on the open call) call a
/// workflow whose step's upstream call asks a question: the question is
/// relayed to them, their answer goes back upstream, and the tool's result
/// carries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_from_upstream_is_relayed_to_the_official_mcp_clients() {
    let dir = tempfile::tempdir().unwrap();
    let text = ASKING.replace("{call}", &plugin("call").display().to_string());
    let config = write_config(dir.path(), &text);
    let state = dir.path().join("state.db");
    let serve = serve(&config, state.to_str().unwrap(), &[]);
    let arguments =
        json!({"capability": "fixture.ask", "arguments": {"message": "Which colour?"}}).to_string();
    let python = repo_root().join("tests/interop/python/.venv/bin/python");
    let clients = [
        (
            python,
            repo_root().join("tests/mcp/python_approver.py"),
            "from python",
        ),
        (
            "node".into(),
            repo_root().join("tests/interop/node/approver.mjs"),
            "from node",
        ),
    ];
    for (program, script, said) in clients {
        let out = tokio::process::Command::new(&program)
            .arg(&script)
            .arg(serve.mcp_url())
            .arg("asks")
            .arg(&arguments)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(60), out)
            .await
            .expect("the client finished")
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; run tests/interop/setup.sh (tests/run.sh does)",
                    program.display()
                )
            });
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{} failed:\n{stderr}",
            script.display()
        );
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
        assert_eq!(report["is_error"], false, "{report}");
        let asked = report["asked"].as_array().unwrap();
        assert_eq!(asked.len(), 1, "asked once: {report}");
        assert!(
            asked[0]
                .as_str()
                .unwrap()
                .ends_with("`fixture.ask` asks: Which colour?"),
            "{report}"
        );
        // The workflow's output is the call's result: the tool got the answer.
        assert!(
            report["text"]
                .to_string()
                .contains(&format!("answer: {said}")),
            "{report}"
        );
    }
}

/// `workflow.pause {workflow}`: while a workflow is paused, its schedule's
/// ticks are skipped (and counted), a start waits `queued` saying why, it
/// stays so across a restart, `host.status` and `/metrics` show the pause;
/// `workflow.resume {workflow}` lets the queued run in and ticks fire
/// again. A call naming both a run and a workflow is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_workflow_skips_its_ticks_and_queues_its_starts_until_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), EVERY_SECOND);
    let state = dir.path().join("state.db");
    let server = serve(&config, state.to_str().unwrap(), &[]);
    let paused = call(&server, "workflow.pause", json!({"workflow": "tick"})).await;
    assert_eq!(
        paused,
        json!({"workflow": "tick", "paused": true, "changed": true})
    );
    let again = call(&server, "workflow.pause", json!({"workflow": "tick"})).await;
    assert_eq!(again["changed"], false);
    let before = runs(&server, "tick").await.len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // A tick that was firing as the pause came may have made one more run.
    assert!(runs(&server, "tick").await.len() <= before + 1);
    let skipped = metric(&server, "wf_schedule_skips_total", "workflow=\"tick\"").await;
    assert!(skipped >= 1.0, "{skipped} ticks skipped");
    assert_eq!(
        metric(&server, "wf_workflow_paused", "workflow=\"tick\"").await,
        1.0
    );
    let started = call(
        &server,
        "workflow.start",
        json!({"workflow": "tick", "input": {"by": "hand"}}),
    )
    .await;
    assert_eq!(started["status"], "queued", "{started}");
    assert!(
        started["queued_reason"]
            .as_str()
            .unwrap()
            .starts_with("workflow `tick` is paused"),
        "{started}"
    );
    let both = server
        .rpc(
            "workflow.pause",
            json!({"workflow": "tick", "run_id": started["run_id"]}),
            None,
        )
        .await;
    assert_eq!(both["error"]["code"], -32602, "{both}");
    let unknown = server
        .rpc("workflow.pause", json!({"workflow": "tock"}), None)
        .await;
    assert_eq!(unknown["error"]["code"], -32001, "{unknown}");

    // Still paused after a restart.
    kill(server);
    let server = serve(&config, state.to_str().unwrap(), &[]);
    let status = call(&server, "host.status", json!({})).await;
    assert_eq!(status["paused_workflows"], json!(["tick"]), "{status}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let run_id = started["run_id"].as_str().unwrap();
    let still = call(&server, "workflow.get", json!({"run_id": run_id})).await;
    assert_eq!(still["status"], "queued", "{still}");

    let resumed = call(&server, "workflow.resume", json!({"workflow": "tick"})).await;
    assert_eq!(resumed["paused"], false);
    let done = call(
        &server,
        "workflow.wait",
        json!({"run_id": run_id, "timeout_ms": 30000}),
    )
    .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], json!({"by": "hand"}));
    let resumed_at = runs(&server, "tick").await.len();
    wait_until(
        "a tick after the resume",
        Duration::from_secs(10),
        async || runs(&server, "tick").await.len() > resumed_at,
    )
    .await;
    let status = call(&server, "host.status", json!({})).await;
    assert_eq!(status["paused_workflows"], json!([]), "{status}");
}
