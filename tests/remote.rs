//! Remote MCP servers: TLS (a CA made in the test, `ca_file`, certificate
//! errors, mTLS) and OAuth 2.1 (client credentials, authorization code with
//! PKCE through `wf-host auth login`, refresh, re-login) against the real
//! fixture MCP server behind a real TLS listener or authorization server.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use wf_host::config::Config;
use wf_host::pool::{Pool, PoolConfig, PoolError};

use common::remote::{AuthServer, TestCa, TlsServer, fixture_router};
use common::{plugin, wf_host_bin};

/// A directory holding `wf.toml` with `body`, plus whatever files a test puts there.
struct ConfigDir {
    dir: tempfile::TempDir,
}

impl ConfigDir {
    fn new() -> ConfigDir {
        ConfigDir {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn file(&self, name: &str, contents: &str) -> &Self {
        std::fs::write(self.dir.path().join(name), contents).unwrap();
        self
    }

    fn config(&self, body: &str) -> PathBuf {
        let path = self.dir.path().join("wf.toml");
        std::fs::write(&path, body).unwrap();
        path
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A pool built from the config file as `wf-host` builds it.
fn pool_from(path: &Path) -> Pool {
    common::init_tracing();
    let config = Config::load(path).expect("config loads");
    Pool::new(PoolConfig {
        connections: config.connections.clone(),
        self_exe: Some(wf_host_bin()),
        base_dir: config.base_dir.clone(),
        tokens: Some(config.tokens_path()),
        ..Default::default()
    })
}

async fn echo(pool: &Pool, text: &str) -> Result<Value, PoolError> {
    let mut args = Map::new();
    args.insert("text".into(), json!(text));
    pool.call_tool("remote", "echo", args, None).await
}

fn connect_detail(err: &PoolError) -> String {
    match err {
        PoolError::ConnectFailed { detail, .. } => detail.clone(),
        other => panic!("expected a connect failure, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------

/// The fixture over HTTPS with a certificate for `localhost` from `ca`.
async fn https_fixture(
    ca: &TestCa,
    names: &[&str],
    expired: bool,
) -> (TlsServer, CancellationToken) {
    let stop = CancellationToken::new();
    let leaf = ca.issue(names, expired);
    (
        TlsServer::start(fixture_router(&stop), &leaf, None).await,
        stop,
    )
}

/// `wf-host run plugins/call.wasm` calling `remote.echo` with `config`.
async fn run_call_node(config: PathBuf) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        Command::new(wf_host_bin())
            .arg("run")
            .arg(plugin("call"))
            .arg("--config")
            .arg(&config)
            .args(["--allow", "remote.*", "--input"])
            .arg(r#"{"capability": "remote.echo", "arguments": {"text": "over tls"}}"#)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_trusted_through_ca_file_serves_a_wasm_node() {
    let ca = TestCa::new("wf-host test CA");
    let (server, _stop) = https_fixture(&ca, &["localhost"], false).await;
    let dir = ConfigDir::new();
    dir.file("ca.pem", &ca.cert_pem);
    let url = format!("url = \"https://localhost:{}/mcp\"", server.port);
    let out = run_call_node(dir.config(&format!(
        "[connections.remote]\n{url}\nca_file = \"ca.pem\"\n"
    )))
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    let output: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(output["content"][0]["text"], "over tls", "{output}");

    // Without `ca_file` the node gets `unavailable`; the operator's log says why.
    let out = run_call_node(dir.config(&format!("[connections.remote]\n{url}\n"))).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains("unavailable"), "{stderr}");
    assert!(stderr.contains("unknown issuer"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ca_file_the_error_names_the_unknown_issuer() {
    let ca = TestCa::new("wf-host test CA");
    let (server, _stop) = https_fixture(&ca, &["localhost"], false).await;
    let dir = ConfigDir::new();
    let pool = pool_from(&dir.config(&format!(
        "[connections.remote]\nurl = \"https://localhost:{}/mcp\"\n",
        server.port
    )));
    let err = echo(&pool, "x").await.unwrap_err();
    let detail = connect_detail(&err);
    assert!(detail.contains("unknown issuer"), "{detail}");
    let seen = wf_host::pool::to_capability_error(err);
    assert_eq!(seen.code(), "unavailable");
    // The node is told which check failed, and nothing about the host.
    assert!(seen.message().contains("unknown issuer"), "{seen}");
    assert!(!seen.message().contains("localhost"), "{seen}");
    let status = pool.connection_stats("remote").unwrap();
    assert!(
        status
            .last_error
            .unwrap_or_default()
            .contains("unknown issuer"),
        "host.status shows the cause"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_is_a_name_mismatch() {
    let ca = TestCa::new("wf-host test CA");
    let (server, _stop) = https_fixture(&ca, &["other.example"], false).await;
    let dir = ConfigDir::new();
    dir.file("ca.pem", &ca.cert_pem);
    let pool = pool_from(&dir.config(&format!(
        "[connections.remote]\nurl = \"https://localhost:{}/mcp\"\nca_file = \"ca.pem\"\n",
        server.port
    )));
    let detail = connect_detail(&echo(&pool, "x").await.unwrap_err());
    assert!(detail.contains("name mismatch"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_named_expired() {
    let ca = TestCa::new("wf-host test CA");
    let (server, _stop) = https_fixture(&ca, &["localhost"], true).await;
    let dir = ConfigDir::new();
    dir.file("ca.pem", &ca.cert_pem);
    let pool = pool_from(&dir.config(&format!(
        "[connections.remote]\nurl = \"https://localhost:{}/mcp\"\nca_file = \"ca.pem\"\n",
        server.port
    )));
    let detail = connect_detail(&echo(&pool, "x").await.unwrap_err());
    assert!(detail.contains("expired"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_required_by_the_server_works_with_client_cert_and_fails_without() {
    let ca = TestCa::new("wf-host test CA");
    let clients = TestCa::new("wf-host client CA");
    let stop = CancellationToken::new();
    let server = TlsServer::start(
        fixture_router(&stop),
        &ca.issue(&["localhost"], false),
        Some(&clients),
    )
    .await;
    let client = clients.issue(&["wf-host"], false);
    let dir = ConfigDir::new();
    dir.file("ca.pem", &ca.cert_pem)
        .file("client.pem", &client.cert_pem)
        .file("client.key", &client.key_pem);
    let with_cert = pool_from(&dir.config(&format!(
        "[connections.remote]\nurl = \"https://localhost:{}/mcp\"\nca_file = \"ca.pem\"\nclient_cert = \"client.pem\"\nclient_key = \"client.key\"\n",
        server.port
    )));
    let out = echo(&with_cert, "mutual").await.unwrap();
    assert_eq!(out["content"][0]["text"], "mutual");
    with_cert.shutdown().await;

    let without = pool_from(&dir.config(&format!(
        "[connections.remote]\nurl = \"https://localhost:{}/mcp\"\nca_file = \"ca.pem\"\n",
        server.port
    )));
    let detail = connect_detail(&echo(&without, "x").await.unwrap_err());
    assert!(detail.contains("client certificate"), "{detail}");
}

#[test]
fn a_missing_or_bad_tls_file_fails_at_load_naming_the_connection_and_key() {
    let dir = ConfigDir::new();
    let err = Config::load(&dir.config(
        "[connections.remote]\nurl = \"https://localhost:1/mcp\"\nca_file = \"nope.pem\"\n",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("connection `remote`")
            && err.contains("`ca_file`")
            && err.contains("nope.pem"),
        "{err}"
    );
    dir.file("key.pem", "not a key");
    dir.file("cert.pem", &TestCa::new("x").issue(&["a"], false).cert_pem);
    let err = Config::load(&dir.config(
        "[connections.remote]\nurl = \"https://localhost:1/mcp\"\nclient_cert = \"cert.pem\"\nclient_key = \"key.pem\"\n",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("connection `remote`") && err.contains("`client_key`"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_reuses_connections_across_calls() {
    let ca = TestCa::new("wf-host test CA");
    let (server, _stop) = https_fixture(&ca, &["localhost"], false).await;
    let dir = ConfigDir::new();
    dir.file("ca.pem", &ca.cert_pem);
    let pool = pool_from(&dir.config(&format!(
        "[connections.remote]\nurl = \"https://localhost:{}/mcp\"\nca_file = \"ca.pem\"\n",
        server.port
    )));
    echo(&pool, "warm").await.unwrap();
    let before = server.accepted.load(Ordering::SeqCst);
    for i in 0..10 {
        echo(&pool, &format!("call {i}")).await.unwrap();
    }
    let after = server.accepted.load(Ordering::SeqCst);
    assert!(
        after - before <= 1,
        "10 sequential calls opened {} new connections",
        after - before
    );
}

// ---------------------------------------------------------------------------
// OAuth
// ---------------------------------------------------------------------------

const SECRET: &str = "s3cr3t-client-value-that-must-not-leak";

/// A client-credentials connection; the secret inline, or from the
/// `REMOTE_TEST_SECRET` variable of a child process with `from_env`.
fn cc_config(dir: &ConfigDir, server: &AuthServer, extra: &str, from_env: bool) -> PathBuf {
    let secret = if from_env {
        "client_secret_env = \"REMOTE_TEST_SECRET\"".to_owned()
    } else {
        format!("client_secret = {SECRET:?}")
    };
    server
        .state
        .clients
        .lock()
        .unwrap()
        .insert("wf-host".into(), SECRET.into());
    dir.config(&format!(
        "[connections.remote]\nurl = \"{}\"\n[connections.remote.auth]\nkind = \"client-credentials\"\nclient_id = \"wf-host\"\n{secret}\n{extra}",
        server.mcp_url()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_credentials_with_basic_auth_by_default() {
    let server = AuthServer::start().await;
    let dir = ConfigDir::new();
    let pool = pool_from(&cc_config(&dir, &server, "", false));
    let out = echo(&pool, "authorized").await.unwrap();
    assert_eq!(out["content"][0]["text"], "authorized");
    let grants = server.state.grants("client_credentials");
    assert_eq!(grants.len(), 1, "{grants:?}");
    assert_eq!(grants[0].auth_method, "client_secret_basic");
    assert_eq!(
        grants[0].resource.as_deref(),
        Some(server.mcp_url().as_str())
    );
    // Secrets stay out of status and Debug output.
    let status = serde_json::to_string(&pool.stats()).unwrap();
    assert!(!status.contains(SECRET), "{status}");
    let config = Config::load(&dir.path().join("wf.toml")).unwrap();
    let inline = format!("{:?}", config.connections["remote"]);
    assert!(!inline.contains(SECRET), "{inline}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_credentials_with_post_sends_the_secret_in_the_body() {
    let server = AuthServer::start().await;
    let dir = ConfigDir::new();
    let pool = pool_from(&cc_config(
        &dir,
        &server,
        "token_endpoint_auth = \"client_secret_post\"\nscopes = [\"mcp\"]\n",
        false,
    ));
    echo(&pool, "posted").await.unwrap();
    let grants = server.state.grants("client_credentials");
    assert_eq!(grants[0].auth_method, "client_secret_post", "{grants:?}");
    assert_eq!(grants[0].scope.as_deref(), Some("mcp"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_credentials_step_up_on_insufficient_scope() {
    let server = AuthServer::start().await;
    *server.state.call_scope.lock().unwrap() = Some("mcp:write".into());
    let dir = ConfigDir::new();
    let pool = pool_from(&cc_config(&dir, &server, "scopes = [\"mcp\"]\n", false));
    let out = echo(&pool, "stepped up").await.unwrap();
    assert_eq!(out["content"][0]["text"], "stepped up");
    let grants = server.state.grants("client_credentials");
    assert_eq!(grants.len(), 2, "{grants:?}");
    assert_eq!(grants[1].scope.as_deref(), Some("mcp mcp:write"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_client_credentials_token_is_fetched_again() {
    let server = AuthServer::start().await;
    server.state.ttl_secs.store(2, Ordering::SeqCst);
    let dir = ConfigDir::new();
    let pool = pool_from(&cc_config(&dir, &server, "", false));
    echo(&pool, "one").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    echo(&pool, "two").await.unwrap();
    assert!(server.state.grants("client_credentials").len() >= 2);
}

/// Runs `wf-host auth login remote`, follows the printed URL like a browser
/// would, and returns the exit status and stderr.
async fn login(config: &Path, extra_env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(wf_host_bin())
        .args(["auth", "login", "remote", "--config"])
        .arg(config)
        .envs(extra_env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let first = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let url = first.trim_end();
    assert!(
        url.starts_with("http://127.0.0.1:"),
        "first line: {first:?}"
    );
    assert!(url.contains("code_challenge_method=S256"), "{url}");
    // The browser: the authorization server redirects to the loopback listener.
    let answer = common::http_client().get(url).send().await.unwrap();
    assert!(answer.status().is_success(), "{:?}", answer.status());
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    (status, stderr.join().unwrap())
}

fn code_config(dir: &ConfigDir, server: &AuthServer) -> PathBuf {
    dir.config(&format!(
        "[connections.remote]\nurl = \"{}\"\n[connections.remote.auth]\nkind = \"authorization-code\"\nscopes = [\"mcp\"]\n",
        server.mcp_url()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_login_runs_the_code_flow_with_pkce_and_stores_tokens_privately() {
    let server = AuthServer::start().await;
    let dir = ConfigDir::new();
    let config = code_config(&dir, &server);
    let (status, stderr) = login(&config, &[]).await;
    assert!(status.success(), "stderr: {stderr}");
    let codes = server.state.grants("authorization_code");
    assert_eq!(codes.len(), 1, "{codes:?}");
    assert_eq!(codes[0].pkce_ok, Some(true));
    assert_eq!(
        codes[0].resource.as_deref(),
        Some(server.mcp_url().as_str())
    );

    let tokens = dir.path().join(".wf-host/tokens.json");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&tokens).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "tokens.json mode {mode:o}");
    }
    let stored: BTreeMap<String, Value> =
        serde_json::from_slice(&std::fs::read(&tokens).unwrap()).unwrap();
    let key = format!("{} {}", server.base, server.mcp_url());
    assert!(
        stored.contains_key(&key),
        "keyed by issuer and resource: {stored:?}"
    );

    // A run uses the stored tokens.
    let pool = pool_from(&config);
    let out = echo(&pool, "signed in").await.unwrap();
    assert_eq!(out["content"][0]["text"], "signed in");
}

/// A call the server refuses with 403 `insufficient_scope` fails alone,
/// naming the scope and the command; the session serves on; the next
/// `auth login`, with the config unchanged, asks for the scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_refused_for_scope_fails_alone_and_the_next_login_asks_for_it() {
    let server = AuthServer::start().await;
    // Not in the server's `scopes_supported`: no sign-in asks for it unasked.
    *server.state.call_scope.lock().unwrap() = Some("mcp:admin".into());
    let dir = ConfigDir::new();
    let config = code_config(&dir, &server);
    let (status, stderr) = login(&config, &[]).await;
    assert!(status.success(), "stderr: {stderr}");
    let pool = pool_from(&config);
    let refused = echo(&pool, "refused").await.unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains("wants scope `mcp:admin`")
            && message.contains("run `wf-host auth login remote`"),
        "{message}"
    );
    // The same session lists, and was never rebuilt.
    assert!(!pool.list_tools("remote").await.unwrap().is_empty());
    assert_eq!(pool.stats()[0].sessions_opened, 1, "{:?}", pool.stats());
    pool.shutdown().await;

    let (status, stderr) = login(&config, &[]).await;
    assert!(status.success(), "stderr: {stderr}");
    let pool = pool_from(&config);
    let out = echo(&pool, "granted").await.unwrap();
    assert_eq!(out["content"][0]["text"], "granted");
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_access_token_is_refreshed_unattended() {
    let server = AuthServer::start().await;
    server.state.ttl_secs.store(2, Ordering::SeqCst);
    let dir = ConfigDir::new();
    let config = code_config(&dir, &server);
    let (status, stderr) = login(&config, &[]).await;
    assert!(status.success(), "stderr: {stderr}");
    let pool = pool_from(&config);
    echo(&pool, "before").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let out = echo(&pool, "after").await.unwrap();
    assert_eq!(out["content"][0]["text"], "after");
    assert!(!server.state.grants("refresh_token").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_refresh_is_impossible_the_call_says_to_run_auth_login() {
    let relogin = "run `wf-host auth login remote`";
    let server = AuthServer::start().await;
    server.state.ttl_secs.store(2, Ordering::SeqCst);
    let dir = ConfigDir::new();
    let config = code_config(&dir, &server);
    let (status, stderr) = login(&config, &[]).await;
    assert!(status.success(), "stderr: {stderr}");
    // Mid-session: the token expires and the server refuses the refresh.
    let pool = pool_from(&config);
    echo(&pool, "fresh").await.unwrap();
    server.state.refresh_works.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let err = echo(&pool, "x").await.unwrap_err();
    assert!(err.to_string().contains(relogin), "{err}");
    let seen = wf_host::pool::to_capability_error(err);
    assert_eq!(seen.code(), "unavailable");
    assert!(
        seen.message().contains("wf-host auth login remote"),
        "{seen}"
    );
    // The next session cannot get in either, and says the same.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = echo(&pool, "x").await.unwrap_err();
    assert!(err.to_string().contains(relogin), "{err}");
    assert!(
        pool.connection_stats("remote")
            .unwrap()
            .last_error
            .unwrap_or_default()
            .contains(relogin),
        "host.status says what to do"
    );

    // Before any login, the server's 401 gets the same advice.
    let fresh = ConfigDir::new();
    let pool = pool_from(&code_config(&fresh, &server));
    let err = echo(&pool, "x").await.unwrap_err();
    assert!(err.to_string().contains(relogin), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_login_refuses_what_it_cannot_sign_in_to() {
    let server = AuthServer::start().await;
    let dir = ConfigDir::new();
    let config = cc_config(&dir, &server, "", false);
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            Command::new(wf_host_bin())
                .args(["auth", "login"])
                .args(args)
                .output()
                .unwrap()
        })
    };
    let config = config.display().to_string();
    let out = run(vec!["nope".into(), "--config".into(), config.clone()])
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("connection `nope` is not configured"),
        "{stderr}"
    );
    let out = run(vec!["remote".into(), "--config".into(), config])
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("needs no login"), "{stderr}");
    assert!(out.stdout.is_empty(), "no URL printed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_appear_in_no_log_line() {
    let server = AuthServer::start().await;
    let dir = ConfigDir::new();
    let config = cc_config(&dir, &server, "", true);
    let run = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(wf_host_bin())
                .arg("run")
                .arg(plugin("call"))
                .arg("--config")
                .arg(&config)
                .args(["--allow", "remote.*", "--input"])
                .arg(r#"{"capability": "remote.echo", "arguments": {"text": "quiet"}}"#)
                .env("RUST_LOG", "debug")
                .env("REMOTE_TEST_SECRET", SECRET)
                .output()
                .unwrap()
        })
    }
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "stderr: {stderr}");
    // The code flow too, with its refresh token.
    let code_dir = ConfigDir::new();
    let (status, login_log) =
        login(&code_config(&code_dir, &server), &[("RUST_LOG", "debug")]).await;
    assert!(status.success(), "stderr: {login_log}");

    let issued = server.state.issued.lock().unwrap().clone();
    assert!(issued.len() >= 3, "{issued:?}");
    for (name, log) in [("run", &stderr), ("login", &login_log)] {
        assert!(log.lines().count() > 10, "{name} logged at debug: {log}");
        for line in log.lines() {
            assert!(
                !line.contains(SECRET),
                "{name} logged the client secret: {line}"
            );
            for token in &issued {
                assert!(
                    !line.contains(token.as_str()),
                    "{name} logged a token: {line}"
                );
            }
        }
    }
}

/// A TCP proxy to `upstream` that, when `drop_next` is set, closes the next
/// connection that sends a second request's bytes, without forwarding them:
/// what a server that closed an idle keep-alive connection looks like.
async fn dropping_proxy(
    upstream: std::net::SocketAddr,
    drop_next: std::sync::Arc<std::sync::atomic::AtomicBool>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (drop_next, dropped) = (drop_next.clone(), dropped.clone());
            tokio::spawn(async move {
                let server = tokio::net::TcpStream::connect(upstream).await.unwrap();
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let back = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                });
                let mut buf = vec![0u8; 64 * 1024];
                let mut forwarded = false;
                loop {
                    let n = match client_read.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if forwarded && drop_next.swap(false, Ordering::SeqCst) {
                        dropped.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    forwarded = true;
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                // Closing both halves: the client sees EOF with no answer.
                back.abort();
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_a_reused_connection_drops_unanswered_is_sent_again() {
    let stop = CancellationToken::new();
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = tcp.local_addr().unwrap();
    let router = fixture_router(&stop);
    tokio::spawn(async move { axum::serve(tcp, router).await });
    let drop_next = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let port = dropping_proxy(upstream, drop_next.clone(), dropped.clone()).await;

    let dir = ConfigDir::new();
    let pool = pool_from(&dir.config(&format!(
        "[connections.remote]\nurl = \"http://127.0.0.1:{port}/mcp\"\n"
    )));
    echo(&pool, "warm").await.unwrap();
    drop_next.store(true, Ordering::SeqCst);
    let out = echo(&pool, "again").await.unwrap();
    assert_eq!(out["content"][0]["text"], "again");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the proxy dropped a request"
    );
    let stats = pool.connection_stats("remote").unwrap();
    assert_eq!(stats.sessions_opened, 1, "the same session carried on");
    assert_eq!(stats.failures, 0);
}
