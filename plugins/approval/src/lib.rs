//! `approval`: a durable node. It tells someone that a request needs
//! approval, waits (durably: its instance is let go meanwhile) for the
//! `approve` signal, then tells them the decision.
//!
//! Input: `{"request": <any>, "notify": "<connection>.<tool>", "signal"?:
//! "approve", "timeout_ms"?: <ms>, "sleep_ms"?: <ms>}`. `notify` is called
//! with `{"text": …}` before and after the wait; with `sleep_ms`, the node
//! first sleeps that long (durably too). Output: `{"asked": <first answer's
//! text>, "asked_at": <ms>, "ticket": <hex>, "decision": <the signal's
//! payload>, "told": <second answer's text>}`. Without a signal within
//! `timeout_ms`, it fails with `timeout`.
//!
//! It reads the clock and a random number before it asks, and puts both in
//! what it asks: the host journals such reads for a durable node, so each
//! time the node runs again (after its waits, or a crash) it reads the same.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use wf_sdk::{capability, durable};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    request: Value,
    notify: String,
    #[serde(default = "approve")]
    signal: String,
    timeout_ms: Option<u64>,
    sleep_ms: Option<u64>,
}

fn approve() -> String {
    "approve".to_owned()
}

fn run(input: Input) -> Result<Value, wf_sdk::Error> {
    let asked_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let ticket = format!("{:016x}", RandomState::new().hash_one("ticket"));
    let text = format!(
        "approval needed for {} (asked at {asked_at}, ticket {ticket})",
        input.request
    );
    let asked = capability::call_tool(&input.notify, &json!({ "text": text }))?.text();
    if let Some(ms) = input.sleep_ms {
        wf_sdk::info!("sleeping {ms} ms before waiting");
        durable::sleep(Duration::from_millis(ms));
    }
    wf_sdk::info!("waiting for signal `{}`", input.signal);
    let decision = match input.timeout_ms {
        Some(ms) => durable::wait_signal_for(&input.signal, Duration::from_millis(ms))?,
        None => durable::wait_signal(&input.signal)?,
    };
    let text = format!("decision for {}: {decision}", input.request);
    let told = capability::call_tool(&input.notify, &json!({ "text": text }))?.text();
    Ok(json!({
        "asked": asked,
        "asked_at": asked_at,
        "ticket": ticket,
        "decision": decision,
        "told": told,
    }))
}

wf_sdk::node!(run);
