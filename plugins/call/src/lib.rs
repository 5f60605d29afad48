//! `call`: calls the tool named by `capability` with `arguments` and returns the
//! MCP `CallToolResult` JSON unchanged (`content`, `structuredContent`, `isError`).
//!
//! Input: `{"capability": "<connection>.<tool>", "arguments": {...}}`.

use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    capability: String,
    #[serde(default = "empty_object")]
    arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

fn run(input: Input) -> Result<Value, wf_sdk::Error> {
    wf_sdk::debug!("calling {}", input.capability);
    let result = wf_sdk::capability::call_tool(&input.capability, &input.arguments)?;
    Ok(result.into_json())
}

wf_sdk::node!(run);
