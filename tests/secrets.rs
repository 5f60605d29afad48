//! Secrets by reference, from a real `wf-host serve`: a planted secret
//! reaches the MCP server that needs it and no byte of what the host writes
//! (the state, the debug log, `/events`, `/metrics`, answers); a workflow's
//! `redact` fields are not journaled; a secret that cannot be had, or a file
//! others may read, refuses the config.

mod common;

use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::serve::Serve;
use common::*;

const PLANTED: &str = "env-secret-0f1e2d3c4b5a";
const IN_FILE: &str = "file-secret-7a6b5c4d3e2f";

fn config(dir: &Path, env_var: &str) -> PathBuf {
    let call = repo_root().join("plugins/call.wasm");
    let secret = dir.join("secret.txt");
    std::fs::write(&secret, format!("{IN_FILE}\n")).unwrap();
    set_mode(&secret, 0o600);
    let path = dir.join("wf.toml");
    std::fs::write(
        &path,
        format!(
            r#"[runtime]
state = "state/state.db"

[connections.fixture]
command = "wf-host"
args = ["fixture-server"]
env = {{ PLANTED = {{ secret = "{env_var}" }}, FROM_FILE = {{ secret_file = "secret.txt" }} }}

[workflows.leak]
component = {call:?}
allow = ["fixture.*"]
redact = ["password"]

[[workflows.chain.steps]]
id = "env"
component = {call:?}
allow = ["fixture.env"]
input = '{{capability: "fixture.env"}}'

# Its input and the error of its call name the secret the first step got.
[[workflows.chain.steps]]
id = "bad"
component = {call:?}
needs = ["env"]
allow = ["fixture.*"]
input = '{{capability: ("fixture.x" + .steps.env.output.structuredContent.env.PLANTED)}}'
"#
        ),
    )
    .unwrap();
    path
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every file under `dir` but `skip`, with its bytes.
fn files(dir: &Path, skip: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path == skip {
            continue;
        }
        if path.is_dir() {
            out.extend(files(&path, skip));
        } else {
            out.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_secret_reaches_its_server_and_never_leaves_the_host() {
    let serve = Serve::start_with_env(
        |dir| config(dir, "WF_TEST_PLANTED"),
        &[],
        &[("WF_TEST_PLANTED", PLANTED), ("RUST_LOG", "debug")],
    );
    // The fixture's `env` tool answers with the server's environment, so the
    // secrets come back in a tool result, as a careless server's might.
    let done = serve
        .rpc(
            "workflow.start",
            json!({"workflow": "leak", "wait": true, "input": {
                "capability": "fixture.env",
                "arguments": {"password": "hunter2-field-value"},
            }}),
            None,
        )
        .await;
    let run = &done["result"];
    assert_eq!(run["status"], "succeeded", "{done}");
    let env = &run["output"]["structuredContent"]["env"];
    // The server had both (it was started with them) and they came back
    // redacted.
    assert_eq!(env["PLANTED"], "[redacted]", "{env}");
    assert_eq!(env["FROM_FILE"], "[redacted]", "{env}");
    let run_id = run["run_id"].as_str().unwrap().to_owned();

    // A step's input and an error message that hold a secret: the second
    // step calls a capability named after what the first one got.
    let failed = serve
        .rpc(
            "workflow.start",
            json!({"workflow": "chain", "wait": true, "input": {}}),
            None,
        )
        .await;
    let failed = &failed["result"];
    assert_eq!(failed["status"], "failed", "{failed}");
    let message = failed["error"]["message"].as_str().unwrap();
    assert!(message.contains("x[redacted]"), "{message}");
    let chain = serve
        .rpc("workflow.get", json!({"run_id": failed["run_id"]}), None)
        .await;
    let bad = &chain["result"]["steps"][1];
    assert_eq!(bad["id"], "bad", "{chain}");
    assert_eq!(bad["input"]["capability"], "fixture.x[redacted]", "{chain}");

    // The workflow's `redact` field is neither in the step's stored input nor
    // in its journaled call.
    let got = serve
        .rpc(
            "workflow.get",
            json!({"run_id": run_id, "calls": true, "logs": true}),
            None,
        )
        .await;
    let step = &got["result"]["steps"][0];
    assert_eq!(
        step["input"]["arguments"]["password"], "[redacted]",
        "{got}"
    );
    assert_eq!(
        step["calls"][0]["arguments"]["password"], "[redacted]",
        "{got}"
    );

    // The failed run's events carry its error.
    let failed_id = failed["run_id"].as_str().unwrap();
    let (status, events) = serve.get(&format!("/runs/{failed_id}/events"), None).await;
    assert_eq!(status, 200);
    assert!(events.contains("x[redacted]"), "{events}");
    let (_, all_events) = serve.get(&format!("/runs/{run_id}/events"), None).await;
    let events = format!("{events}{all_events}");
    let (_, metrics) = serve.get("/metrics", None).await;
    let status = serve.rpc("host.status", json!({}), None).await.to_string();
    let list = serve
        .rpc("workflow.list", json!({}), None)
        .await
        .to_string();
    for (what, text) in [
        ("/events", &events),
        ("/metrics", &metrics),
        ("host.status", &status),
        ("workflow.list", &list),
        ("workflow.get", &format!("{got}{chain}")),
    ] {
        for secret in [PLANTED, IN_FILE] {
            assert!(!text.contains(secret), "{what} shows a secret: {text}");
        }
    }

    // Stopped: then every byte it wrote is on disk.
    let mut serve = serve;
    unsafe { libc::kill(serve.child.id() as i32, libc::SIGTERM) };
    let _ = serve.child.wait();
    // The log's reader sees the pipe close.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let log = serve.log.lock().unwrap().clone();
    let dir = &serve.dir;
    assert!(log.contains("calling fixture.env"), "a debug log: {log}");
    assert!(log.contains(" DEBUG "), "a debug log: {log}");
    // The failed step's error was logged, redacted.
    assert!(log.contains("x[redacted]"), "{log}");
    for secret in [PLANTED, IN_FILE] {
        assert!(!log.contains(secret), "the log shows a secret");
    }
    let written = files(dir.path(), &dir.path().join("secret.txt"));
    assert!(
        written.iter().any(|(p, _)| p.ends_with("state.db")),
        "{:?}",
        written.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    for (path, bytes) in &written {
        for secret in [PLANTED, IN_FILE] {
            if let Some(at) = bytes
                .windows(secret.len())
                .position(|w| w == secret.as_bytes())
            {
                let around = &bytes[at.saturating_sub(300)..(at + 100).min(bytes.len())];
                panic!(
                    "`{}` holds a secret: {}",
                    path.display(),
                    String::from_utf8_lossy(around)
                );
            }
        }
    }
}

/// `wf-host serve` on `config` with `env`: it must refuse to start; its
/// stderr.
fn refused(config: &Path, env: &[(&str, &str)]) -> String {
    let out = Command::new(wf_host_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .env_remove("WF_TEST_PLANTED")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "refused as a usage error");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_secret_that_cannot_be_had_refuses_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "WF_TEST_PLANTED");
    let err = refused(&path, &[]);
    assert!(
        err.contains("`env.PLANTED`") && err.contains("no variable `WF_TEST_PLANTED`"),
        "{err}"
    );
    // systemd credentials come first.
    let creds = dir.path().join("creds");
    std::fs::create_dir(&creds).unwrap();
    std::fs::write(creds.join("WF_TEST_PLANTED"), "short").unwrap();
    set_mode(&creds.join("WF_TEST_PLANTED"), 0o600);
    let err = refused(&path, &[("CREDENTIALS_DIRECTORY", creds.to_str().unwrap())]);
    assert!(err.contains("at least 8"), "{err}");
    set_mode(&dir.path().join("secret.txt"), 0o644);
    let err = refused(&path, &[("WF_TEST_PLANTED", PLANTED)]);
    assert!(
        err.contains("`env.FROM_FILE`") && err.contains("mode 644") && err.contains("chmod 600"),
        "{err}"
    );
    for secret in [PLANTED, IN_FILE] {
        assert!(!err.contains(secret), "{err}");
    }
}
