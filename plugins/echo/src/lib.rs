//! `echo`: returns its input unchanged, byte for byte, and logs one line.

use serde_json::value::RawValue;

fn run(input: Box<RawValue>) -> Result<Box<RawValue>, wf_sdk::Error> {
    wf_sdk::info!("echo: {} bytes", input.get().len());
    Ok(input)
}

wf_sdk::node!(run);
