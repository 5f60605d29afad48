//! `misbehave`: does what its input asks, to test the host's limits.
//!
//! - `{"mode": "loop"}` spins forever;
//! - `{"mode": "grow", "mib": N}` allocates and touches N MiB;
//! - `{"mode": "print", "stdout": "...", "stderr": "..."}` writes to stdio and returns `"printed"`;
//! - `{"mode": "trap"}` panics;
//! - `{"mode": "log", "count": N, "bytes": B}` calls `log` N times with B bytes each;
//! - `{"mode": "output", "bytes": N}` returns a JSON string of N bytes.

use std::io::Write;

use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
#[serde(tag = "mode", rename_all = "lowercase")]
enum Input {
    Loop,
    Grow { mib: usize },
    Print { stdout: String, stderr: String },
    Trap,
    Log { count: usize, bytes: usize },
    Output { bytes: usize },
}

fn run(input: Input) -> Result<Value, wf_sdk::Error> {
    match input {
        Input::Loop => {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        Input::Grow { mib } => {
            let mut chunks = Vec::new();
            for _ in 0..mib {
                chunks.push(vec![1u8; 1 << 20]);
            }
            Ok(json!({ "grew_mib": chunks.len() }))
        }
        Input::Print { stdout, stderr } => {
            print!("{stdout}");
            eprint!("{stderr}");
            std::io::stdout().flush().ok();
            Ok(json!("printed"))
        }
        Input::Trap => panic!("asked to trap"),
        Input::Log { count, bytes } => {
            let message = "x".repeat(bytes);
            for _ in 0..count {
                wf_sdk::log(wf_sdk::Level::Info, &message);
            }
            Ok(json!({ "logged": count }))
        }
        // Two bytes go to the quotes.
        Input::Output { bytes } => Ok(json!("y".repeat(bytes.saturating_sub(2)))),
    }
}

wf_sdk::node!(run);
