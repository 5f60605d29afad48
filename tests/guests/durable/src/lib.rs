//! A durable node that does what its input lists, in order, and answers what
//! each gave: `{"do": [<action>, ...]}`, each action one of
//!
//! - `{"call": "<connection>.<tool>", "arguments": {...}}`: the tool's text;
//! - `{"together": [{"call": ..., "arguments": ...}, ...]}`: calls at once
//!   (`call-tools`), each one's text or `{"error": code}`;
//! - `{"sleep_ms": n}`;
//! - `{"signal": "<name>", "timeout_ms"?: n}`: the payload;
//! - `{"workflow": "<name>", "input": <any>}`: the child's output, or
//!   `{"error": code, "message": ...}`;
//! - `{"clock": true}`: the wall clock, in ms.
//!
//! Any error other than a child's fails the node with its code.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use wf_sdk::{capability, durable};

#[derive(Deserialize)]
struct Input {
    #[serde(rename = "do")]
    actions: Vec<Value>,
}

fn act(action: &Value) -> Result<Value, wf_sdk::Error> {
    if let Some(name) = action["call"].as_str() {
        return Ok(json!(capability::call_tool(name, &action["arguments"])?.text()));
    }
    if let Some(calls) = action["together"].as_array() {
        let calls: Vec<(&str, Value)> = calls
            .iter()
            .map(|c| (c["call"].as_str().unwrap_or_default(), c["arguments"].clone()))
            .collect();
        let results = capability::call_tools(&calls)
            .into_iter()
            .map(|r| match r {
                Ok(result) => json!(result.text()),
                Err(e) => json!({"error": wf_sdk::capability_error_parts(&e).0}),
            })
            .collect();
        return Ok(Value::Array(results));
    }
    if let Some(ms) = action["sleep_ms"].as_u64() {
        durable::sleep(Duration::from_millis(ms));
        return Ok(Value::Null);
    }
    if let Some(name) = action["signal"].as_str() {
        return match action["timeout_ms"].as_u64() {
            Some(ms) => durable::wait_signal_for(name, Duration::from_millis(ms)),
            None => durable::wait_signal(name),
        };
    }
    if let Some(name) = action["workflow"].as_str() {
        return Ok(match durable::run_workflow(name, &action["input"]) {
            Ok(output) => output,
            Err(e) => json!({"error": e.code, "message": e.message}),
        });
    }
    if action["clock"] == json!(true) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        return Ok(json!(now));
    }
    Err(wf_sdk::Error::invalid_input(format!("unknown action {action}")))
}

fn run(input: Input) -> Result<Value, wf_sdk::Error> {
    let done: Result<Vec<Value>, _> = input.actions.iter().map(act).collect();
    Ok(Value::Array(done?))
}

wf_sdk::node!(run);
