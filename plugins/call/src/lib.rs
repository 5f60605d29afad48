//! `call`: calls the tool named by `capability` with `arguments` and returns the
//! MCP `CallToolResult` JSON unchanged (`content`, `structuredContent`, `isError`).
//!
//! Input: `{"capability": "<connection>.<tool>", "arguments": {...}}`, and
//! optionally `"before": [{"capability": ..., "arguments": ...}, ...]`: calls
//! made first, in order. With `before`, the output is `{"before": [<their
//! results>], "result": <the last call's result>}`.

use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    capability: String,
    #[serde(default = "empty_object")]
    arguments: Value,
    #[serde(default)]
    before: Vec<Call>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    capability: String,
    #[serde(default = "empty_object")]
    arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

fn run(input: Input) -> Result<Value, wf_sdk::Error> {
    let mut before = Vec::new();
    for call in &input.before {
        wf_sdk::debug!("calling {} first", call.capability);
        let result = wf_sdk::capability::call_tool(&call.capability, &call.arguments)?;
        before.push(result.into_json());
    }
    wf_sdk::debug!("calling {}", input.capability);
    let result = wf_sdk::capability::call_tool(&input.capability, &input.arguments)?.into_json();
    if input.before.is_empty() {
        return Ok(result);
    }
    Ok(json!({"before": before, "result": result}))
}

wf_sdk::node!(run);
