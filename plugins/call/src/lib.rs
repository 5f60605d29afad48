//! `call`: calls the tool named by `capability` with `arguments` and returns the
//! MCP `CallToolResult` JSON unchanged (`content`, `structuredContent`, `isError`).
//!
//! Input: `{"capability": "<connection>.<tool>", "arguments": {...}}`, and
//! optionally `"before": [{"capability": ..., "arguments": ...}, ...]`: calls
//! made first, in order. With `before`, the output is `{"before": [<their
//! results>], "result": <the last call's result>}`.
//!
//! Or `{"together": [{"capability": ..., "arguments": ...}, ...]}`: calls made
//! at once (`call-tools`), whose output is `{"together": [<each result, or
//! {"error": {"code", "message"}}>]}` in the order given.

use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    capability: Option<String>,
    #[serde(default = "empty_object")]
    arguments: Value,
    #[serde(default)]
    before: Vec<Call>,
    #[serde(default)]
    together: Vec<Call>,
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
    if !input.together.is_empty() {
        return Ok(json!({"together": together(&input.together)}));
    }
    let Some(capability) = &input.capability else {
        return Err(wf_sdk::Error::invalid_input(
            "give `capability` (one call) or `together` (calls made at once)",
        ));
    };
    let mut before = Vec::new();
    for call in &input.before {
        wf_sdk::debug!("calling {} first", call.capability);
        let result = wf_sdk::capability::call_tool(&call.capability, &call.arguments)?;
        before.push(result.into_json());
    }
    wf_sdk::debug!("calling {capability}");
    let result = wf_sdk::capability::call_tool(capability, &input.arguments)?.into_json();
    if input.before.is_empty() {
        return Ok(result);
    }
    Ok(json!({"before": before, "result": result}))
}

/// Makes `calls` at once; each one's result, or its error.
fn together(calls: &[Call]) -> Vec<Value> {
    wf_sdk::debug!("calling {} tools at once", calls.len());
    let calls: Vec<(&str, Value)> = calls
        .iter()
        .map(|c| (c.capability.as_str(), c.arguments.clone()))
        .collect();
    wf_sdk::capability::call_tools(&calls)
        .into_iter()
        .map(|result| match result {
            Ok(result) => result.into_json(),
            Err(e) => {
                let (code, message) = wf_sdk::capability_error_parts(&e);
                json!({"error": {"code": code, "message": message}})
            }
        })
        .collect()
}

wf_sdk::node!(run);
