//! A wf-host node: calls the `echo` tool with the text it gets.
//!
//! Input: `{"text": "hi"}`. Output: `{"echoed": "hi"}`.

use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Input {
    text: String,
}

#[derive(Serialize)]
struct Output {
    echoed: String,
}

fn run(input: Input) -> Result<Output, wf_sdk::Error> {
    wf_sdk::info!("echoing {} bytes", input.text.len());
    // `?` turns a failed call (denied, unavailable, ...) into the node's error.
    let result = wf_sdk::capability::call_tool(
        "fixture.echo",
        &serde_json::json!({ "text": input.text }),
    )?;
    Ok(Output {
        echoed: result.text(),
    })
}

wf_sdk::node!(run);
