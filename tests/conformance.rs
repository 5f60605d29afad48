//! The MCP conformance suite's client scenarios (npm
//! `@modelcontextprotocol/conformance`, pinned in `tests/conformance/`)
//! against `wf-host conformance-client`. `tests/run.sh` installs the suite
//! with `npm ci`.

mod common;

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use common::{repo_root, wf_host_bin};

fn suite() -> PathBuf {
    let bin = repo_root().join("tests/conformance/node_modules/.bin/conformance");
    assert!(
        bin.exists(),
        "{} is missing: run `npm ci` in tests/conformance (tests/run.sh does)",
        bin.display()
    );
    bin
}

/// Runs one client scenario; panics with the suite's report unless every
/// check passed (warnings allowed).
fn scenario(name: &str) {
    let results = tempfile::tempdir().unwrap();
    let out = Command::new(suite())
        .args(["client", "--scenario", name, "--command"])
        .arg(format!("{} conformance-client", wf_host_bin().display()))
        .arg("--output-dir")
        .arg(results.path())
        .current_dir(results.path())
        .env_remove("MCP_CONFORMANCE_CONTEXT")
        .output()
        .expect("run the conformance suite (node)");
    let report = format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut checks = Vec::new();
    for entry in walk(results.path()) {
        if entry.file_name().is_some_and(|n| n == "checks.json") {
            let parsed: Value = serde_json::from_slice(&std::fs::read(&entry).unwrap()).unwrap();
            checks.extend(parsed.as_array().cloned().unwrap_or_default());
        }
    }
    assert!(
        !checks.is_empty(),
        "no checks recorded for {name}\n{report}"
    );
    let failed: Vec<_> = checks.iter().filter(|c| c["status"] == "FAILURE").collect();
    assert!(
        failed.is_empty() && out.status.success(),
        "{name}: failed checks {failed:#?}\n{report}"
    );
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                files.extend(walk(&path));
            } else {
                files.push(path);
            }
        }
    }
    files
}

macro_rules! scenarios {
    ($($test:ident => $name:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            scenario($name);
        }
    )*};
}

scenarios! {
    initialize => "initialize",
    tools_call => "tools_call",
    sse_retry => "sse-retry",
    elicitation_client_defaults => "elicitation-sep1034-client-defaults",
    auth_client_credentials_basic => "auth/client-credentials-basic",
    auth_metadata_default => "auth/metadata-default",
    auth_token_endpoint_auth_basic => "auth/token-endpoint-auth-basic",
    auth_scope_step_up => "auth/scope-step-up",
}
