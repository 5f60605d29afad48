//! `probe`: calls one `capability` function as its input says, and returns the
//! outcome as data (`{"ok": …}` or `{"err": {"code", "message"}}`), so tests can
//! assert on exactly what the guest saw.
//!
//! Input: `{"op": "call-tool", "name", "arguments"}`, `{"op": "call-tool-raw",
//! "name", "arguments_text"}`, `{"op": "read-resource", "connection", "uri"}`,
//! `{"op": "get-prompt", "name", "arguments"}`, `{"op": "list"}` or
//! `{"op": "log", "messages": [[level, text], …]}`.

use serde::Deserialize;
use serde_json::{Value, json};
use wf_sdk::bindings::wf::node::capability as raw;
use wf_sdk::{CapabilityError, Kind, Level, capability, capability_error_parts};

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
enum Input {
    CallTool { name: String, arguments: Value },
    CallToolRaw { name: String, arguments_text: String },
    ReadResource { connection: String, uri: String },
    GetPrompt { name: String, arguments: Value },
    List,
    Log { messages: Vec<(String, String)> },
}

fn report(result: Result<Value, CapabilityError>) -> Value {
    match result {
        Ok(v) => json!({ "ok": v }),
        Err(e) => {
            let (code, message) = capability_error_parts(&e);
            json!({ "err": { "code": code, "message": message } })
        }
    }
}

fn run(input: Input) -> Result<Value, wf_sdk::Error> {
    Ok(match input {
        Input::CallTool { name, arguments } => {
            report(capability::call_tool(&name, &arguments).map(|r| r.into_json()))
        }
        Input::CallToolRaw {
            name,
            arguments_text,
        } => report(
            raw::call_tool(&name, &arguments_text)
                .map(|text| serde_json::from_str(&text).unwrap_or(Value::Null)),
        ),
        Input::ReadResource { connection, uri } => report(capability::read_resource(&connection, &uri)),
        Input::GetPrompt { name, arguments } => report(capability::get_prompt(&name, &arguments)),
        Input::List => report(capability::list().map(|items| {
            items
                .into_iter()
                .map(|c| {
                    json!({
                        "name": c.name,
                        "kind": match c.kind {
                            Kind::Tool => "tool",
                            Kind::Resource => "resource",
                            Kind::Prompt => "prompt",
                        },
                        "description": c.description,
                        "schema": c.schema.and_then(|s| serde_json::from_str::<Value>(&s).ok()),
                    })
                })
                .collect()
        })),
        Input::Log { messages } => {
            for (level, text) in &messages {
                let level = match level.as_str() {
                    "trace" => Level::Trace,
                    "debug" => Level::Debug,
                    "warn" => Level::Warn,
                    "error" => Level::Error,
                    _ => Level::Info,
                };
                wf_sdk::log(level, text);
            }
            json!({ "ok": messages.len() })
        }
    })
}

wf_sdk::node!(run);
