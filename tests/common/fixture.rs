//! Real fixture MCP servers for tests: a stdio child spawned by the pool, or an
//! HTTP server child on 127.0.0.1 owned by the test.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use wf_host::config::ConnectionConfig;
use wf_host::pool::{Pool, PoolConfig};

use super::wf_host_bin;

/// Runs each named scenario (an `async fn(Kind)`) as two tests: over stdio
/// and over HTTP.
#[macro_export]
macro_rules! over_both_transports {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn stdio() {
                super::$name(Kind::Stdio).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn http() {
                super::$name(Kind::Http).await
            }
        }
    )*};
}

/// Which transport a test runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Stdio,
    Http,
}

/// A fixture server over HTTP, killed and reaped on drop.
pub struct HttpFixture {
    child: Child,
    pub addr: String,
}

impl HttpFixture {
    /// Starts `wf-host fixture-server --http` on `addr` (port 0 picks one).
    pub fn start(addr: &str) -> HttpFixture {
        HttpFixture::start_with_env(addr, &[])
    }

    /// [`HttpFixture::start`] with extra environment (`WF_FIXTURE_*` options).
    pub fn start_with_env(addr: &str, env: &[(&str, &str)]) -> HttpFixture {
        let mut child = Command::new(wf_host_bin())
            .args(["fixture-server", "--http", addr])
            .env_remove("WF_FIXTURE_PAGE_SIZE")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fixture server");
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("fixture printed its address")
                .expect("read stderr");
            if let Some(rest) = line.strip_prefix("fixture MCP server listening on http://") {
                break rest.trim_end_matches("/mcp").to_owned();
            }
        };
        // Keep draining stderr so the server never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        HttpFixture { child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the server to exit on its own (e.g. after `crash`).
    pub fn wait_exit(&mut self, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A connection to a fixture over stdio, spawned by the pool.
pub fn stdio_connection() -> ConnectionConfig {
    connection_from_toml(
        r#"command = "wf-host"
args = ["fixture-server"]"#,
    )
}

pub fn http_connection(url: &str) -> ConnectionConfig {
    connection_from_toml(&format!("url = {url:?}"))
}

pub fn connection_from_toml(body: &str) -> ConnectionConfig {
    toml::from_str(body).expect("valid connection")
}

/// A pool with the one connection `fixture`.
pub fn pool_with(connection: ConnectionConfig) -> Pool {
    super::init_tracing();
    Pool::new(PoolConfig {
        connections: BTreeMap::from([("fixture".to_owned(), connection)]),
        self_exe: Some(wf_host_bin()),
        ..Default::default()
    })
}

/// A fixture of `kind` and a pool connected to it as `fixture`.
pub fn fixture_pool(kind: Kind) -> (Pool, Option<HttpFixture>) {
    match kind {
        Kind::Stdio => (pool_with(stdio_connection()), None),
        Kind::Http => {
            let server = HttpFixture::start("127.0.0.1:0");
            (pool_with(http_connection(&server.url())), Some(server))
        }
    }
}

/// Whether `pid` is gone: reaped, not a zombie.
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state is the field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('X'))
            .unwrap_or(false),
    }
}

/// Whether `pid` is a zombie (exited, never reaped).
pub fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Whether the fixture's `call_log` result records a cancelled call of `tool`.
pub fn saw_cancelled(call_log: &serde_json::Value, tool: &str) -> bool {
    call_log["structuredContent"]["cancelled"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["tool"] == tool))
}

/// Waits up to 5 s for `pid` to be gone (exited and reaped).
pub async fn wait_gone(pid: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !process_gone(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} still there after 5s (zombie: {})",
            is_zombie(pid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
