//! Tenants and secrets, from a real `wf-host serve`.
//!
//! Secrets by reference: a planted secret reaches the MCP server that needs
//! it and no byte of what the host writes (the state, the debug log,
//! `/events`, `/metrics`, answers); a workflow's `redact` fields are not
//! journaled; a secret that cannot be had, or a file others may read,
//! refuses the config.
//!
//! Named tokens: made by `wf-host token new`, each held to its scopes on
//! `/rpc`, `/mcp`, `/events` and `/metrics`; a refused start stores nothing;
//! a run records the token that started it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

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

# The host's own bookkeeping is not the workflow's to redact.
[workflows.nap]
redact = ["until"]
[[workflows.nap.steps]]
id = "nap"
sleep = "10ms"

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

    // A sleep step's wake time is kept as it is, whatever `redact` names.
    let nap = serve
        .rpc(
            "workflow.start",
            json!({"workflow": "nap", "wait": true, "input": {}}),
            None,
        )
        .await;
    let nap = serve
        .rpc(
            "workflow.get",
            json!({"run_id": nap["result"]["run_id"]}),
            None,
        )
        .await;
    let until = nap["result"]["steps"][0]["input"]["until"]
        .as_str()
        .unwrap();
    assert!(until.starts_with("20"), "{nap}");

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

#[test]
fn a_private_key_for_client_assertions_is_checked_when_the_config_loads() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("client.pem");
    let path = dir.path().join("wf.toml");
    let write = |auth: &str| {
        std::fs::write(
            &path,
            format!(
                "[connections.api]\nurl = \"https://127.0.0.1:1/mcp\"\n[connections.api.auth]\nkind = \"client-credentials\"\nclient_id = \"wf\"\n{auth}\n"
            ),
        )
        .unwrap();
    };
    // Not a key: refused without being quoted.
    std::fs::write(&key, "hunter2-hunter2-hunter2\n").unwrap();
    set_mode(&key, 0o600);
    write(
        "token_endpoint_auth = \"private_key_jwt\"\nprivate_key = { secret_file = \"client.pem\" }",
    );
    let err = refused(&path, &[]);
    assert!(
        err.contains("`private_key`") && err.contains("PKCS#8 PEM"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    // A key is never written into the config itself.
    write(
        "token_endpoint_auth = \"private_key_jwt\"\nprivate_key = \"-----BEGIN PRIVATE KEY-----\"",
    );
    let err = refused(&path, &[]);
    assert!(err.contains("never the key itself"), "{err}");
    // A key with no use, and a secret beside a key.
    write("private_key = { secret_file = \"client.pem\" }\nclient_secret = { secret = \"X\" }");
    let err = refused(&path, &[("X", PLANTED)]);
    assert!(
        err.contains("is for `token_endpoint_auth = \"private_key_jwt\"`"),
        "{err}"
    );
    write("token_endpoint_auth = \"private_key_jwt\"\nclient_secret_env = \"X\"");
    let err = refused(&path, &[("X", PLANTED)]);
    assert!(err.contains("drop the client secret"), "{err}");
    // A real key loads: `pin` goes past the config, to fail only for want
    // of the server.
    let pem = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .output()
        .unwrap();
    assert!(pem.status.success());
    std::fs::write(&key, &pem.stdout).unwrap();
    write(
        "token_endpoint_auth = \"private_key_jwt\"\nprivate_key = { secret_file = \"client.pem\" }",
    );
    let out = Command::new(wf_host_bin())
        .args(["pin", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("OAuth discovery failed"), "{err}");
}

/// `wf-host token new NAME`: the token (stdout's first line) and the
/// `[[rpc.tokens]]` entry it printed, name and hash only.
fn new_token(name: &str) -> (String, String) {
    let out = Command::new(wf_host_bin())
        .args(["token", "new", name])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let token = text.lines().next().unwrap().to_owned();
    let hash = text
        .lines()
        .find(|l| l.starts_with("hash = "))
        .unwrap()
        .to_owned();
    // Shown once, and the config holds its hash only.
    assert_eq!(text.matches(&token).count(), 1, "{text}");
    (token, format!("[[rpc.tokens]]\nname = {name:?}\n{hash}\n"))
}

async fn rpc(serve: &Serve, token: &str, method: &str, params: Value) -> Value {
    serve.rpc(method, params, Some(token)).await
}

fn denied(reply: &Value, says: &str) {
    assert_eq!(reply["error"]["code"], -32003, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains(says), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_token_is_held_to_its_scopes_everywhere() {
    let echo = repo_root().join("plugins/echo.wasm");
    let (ci, ci_entry) = new_token("ci");
    let (ops, ops_entry) = new_token("ops");
    let serve = Serve::start(
        |dir| {
            let path = dir.join("wf.toml");
            std::fs::write(
                &path,
                format!(
                    r#"[connections.fixture]
command = "wf-host"
args = ["fixture-server"]

[workflows.deploy]
component = {echo:?}
expose = true

[workflows.billing]
component = {echo:?}
expose = true

{ci_entry}start = ["deploy"]

{ops_entry}start = ["*"]
cancel = ["*"]
capabilities = ["fixture.echo"]
console = true
metrics = true
"#
                ),
            )
            .unwrap();
            path
        },
        &[],
    );
    // No token, or a wrong one: nothing.
    let (status, _) = serve.get("/metrics", None).await;
    assert_eq!(status, 401);
    let (status, _) = serve.get("/metrics", Some("wfh_wrong")).await;
    assert_eq!(status, 401);

    // A start outside the token's scope is refused and stores nothing.
    let refused = rpc(
        &serve,
        &ci,
        "workflow.start",
        json!({"workflow": "billing", "input": 1, "wait": true}),
    )
    .await;
    denied(
        &refused,
        "token `ci` may not start runs of workflow `billing`",
    );
    let all = rpc(&serve, &ops, "workflow.list", json!({})).await;
    assert_eq!(all["result"]["runs"], json!([]), "{all}");

    // Within it: the run records the token.
    let mine = rpc(
        &serve,
        &ci,
        "workflow.start",
        json!({"workflow": "deploy", "input": 1, "wait": true}),
    )
    .await;
    assert_eq!(mine["result"]["status"], "succeeded", "{mine}");
    let mine_id = mine["result"]["run_id"].as_str().unwrap().to_owned();
    let theirs = rpc(
        &serve,
        &ops,
        "workflow.start",
        json!({"workflow": "billing", "input": 2, "wait": true}),
    )
    .await;
    let theirs_id = theirs["result"]["run_id"].as_str().unwrap().to_owned();
    let got = rpc(&serve, &ops, "workflow.get", json!({"run_id": mine_id})).await;
    assert_eq!(
        got["result"]["trigger"],
        json!({"kind": "token", "name": "ci"}),
        "{got}"
    );

    // A token sees only the runs its scopes allow.
    denied(
        &rpc(&serve, &ci, "workflow.get", json!({"run_id": theirs_id})).await,
        "may not read runs of workflow `billing`",
    );
    let listed = rpc(&serve, &ci, "workflow.list", json!({})).await;
    let ids: Vec<&str> = listed["result"]["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [mine_id.as_str()], "{listed}");
    denied(
        &rpc(&serve, &ci, "workflow.list", json!({"workflow": "billing"})).await,
        "may not read",
    );
    let (status, _) = serve
        .get(&format!("/runs/{theirs_id}/events"), Some(&ci))
        .await;
    assert_eq!(status, 403);
    let (status, events) = serve
        .get(&format!("/runs/{mine_id}/events"), Some(&ci))
        .await;
    assert_eq!(status, 200);
    assert!(events.contains("run.finished"), "{events}");

    // Cancel, capabilities, the console's status, metrics, reload.
    denied(
        &rpc(&serve, &ci, "workflow.cancel", json!({"run_id": mine_id})).await,
        "may not cancel",
    );
    let call = json!({"name": "fixture.echo", "arguments": {"text": "hi"}});
    denied(
        &rpc(&serve, &ci, "capability.call", call.clone()).await,
        "token `ci` may not call `fixture.echo`",
    );
    let called = rpc(&serve, &ops, "capability.call", call).await;
    assert!(called["result"].is_object(), "{called}");
    denied(
        &rpc(&serve, &ci, "host.status", json!({})).await,
        "lacks the `console` scope",
    );
    assert!(rpc(&serve, &ops, "host.status", json!({})).await["result"].is_object());
    denied(
        &rpc(&serve, &ops, "host.reload", json!({})).await,
        "lacks the `reload` scope",
    );
    let (status, body) = serve.get("/metrics", Some(&ci)).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("`metrics` scope"), "{body}");
    let (status, _) = serve.get("/metrics", Some(&ops)).await;
    assert_eq!(status, 200);

    // `/mcp`: the tools are the workflows the token may start.
    let mut config = StreamableHttpClientTransportConfig::with_uri(serve.mcp_url());
    config = config.auth_header(ci.clone());
    let client =
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .expect("initialize");
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["deploy"]);
    let result = client
        .call_tool(CallToolRequestParams::new("billing"))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(true), "{result:?}");
    let text = serde_json::to_string(&result.content).unwrap();
    assert!(
        text.contains("may not start runs of workflow `billing`"),
        "{text}"
    );
    client.cancel().await.unwrap();

    // Still: only the two runs that were allowed.
    let all = rpc(&serve, &ops, "workflow.list", json!({})).await;
    assert_eq!(all["result"]["runs"].as_array().unwrap().len(), 2, "{all}");
}

#[test]
fn a_token_entry_with_the_token_itself_refuses_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wf.toml");
    std::fs::write(
        &path,
        "[[rpc.tokens]]\nname = \"ci\"\nhash = \"the-token-itself\"\n",
    )
    .unwrap();
    let out = Command::new(wf_host_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("[[rpc.tokens]] `ci`: `hash` is not `sha256:`"),
        "{err}"
    );
}
