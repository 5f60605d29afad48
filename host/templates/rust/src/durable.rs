//! A durable wf-host node: asks for approval, waits for the `approve`
//! signal, then tells the decision.
//!
//! Input: `{"request": "the release"}`. Output: `{"decision": <the signal's
//! payload>, "told": "<what echo answered>"}`. While it waits, the host lets
//! go of the node; when the signal comes, the node runs again from the start
//! and its first call is answered from the run's journal, not made again.

use serde::Deserialize;
use serde_json::{Value, json};
use wf_sdk::{capability, durable};

#[derive(Deserialize)]
struct Input {
    request: String,
}

fn run(input: Input) -> Result<Value, wf_sdk::Error> {
    let ask = json!({ "text": format!("please approve {}", input.request) });
    capability::call_tool("fixture.echo", &ask)?;
    wf_sdk::info!("waiting for the `approve` signal");
    // `wait_signal_for(name, Duration)` waits at most that long (`timeout`).
    let decision = durable::wait_signal("approve")?;
    let tell = json!({ "text": format!("{}: {decision}", input.request) });
    let told = capability::call_tool("fixture.echo", &tell)?.text();
    Ok(json!({ "decision": decision, "told": told }))
}

wf_sdk::node!(run);
