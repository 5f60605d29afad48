//! `flaky`: fails until the fixture's per-session counter reaches a number, to
//! test retries. Nodes keep no state between runs; the MCP session does.
//!
//! Input `{"fail_until": N, "code": "unavailable", "value": …}`: calls
//! `fixture.counter`; while the count is below N it fails with `code`, then
//! returns `{"count": count, "value": value}`. Each attempt logs its count.

use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    fail_until: u64,
    #[serde(default = "unavailable")]
    code: String,
    #[serde(default)]
    value: Value,
}

fn unavailable() -> String {
    "unavailable".into()
}

fn run(input: Input) -> Result<Value, wf_sdk::Error> {
    let result = wf_sdk::capability::call_tool("fixture.counter", &json!({}))?;
    let count = result.into_json()["structuredContent"]["count"]
        .as_u64()
        .ok_or_else(|| wf_sdk::Error::new("bad-counter", "counter returned no count"))?;
    wf_sdk::info!("count {count}");
    if count < input.fail_until {
        return Err(wf_sdk::Error::new(
            input.code,
            format!("attempt with count {count} fails on purpose"),
        ));
    }
    Ok(json!({ "count": count, "value": input.value }))
}

wf_sdk::node!(run);
