//! MCP servers built on the official SDKs (tests/interop/): the Python `mcp`
//! package and the TypeScript `@modelcontextprotocol/sdk`, as stdio children of
//! the pool or as HTTP servers on 127.0.0.1 owned by the test.
//!
//! `tests/interop/setup.sh` installs them (tests/run.sh runs it). A missing
//! interpreter or package fails the test with a message saying so: nothing is
//! skipped.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use wf_host::config::ConnectionConfig;
use wf_host::pool::{Pool, PoolConfig};

use super::fixture::{Kind, connection_from_toml};
use super::repo_root;

/// Which SDK a server is built on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sdk {
    /// Python `mcp` 2.x (tests/interop/python).
    Python,
    /// TypeScript `@modelcontextprotocol/sdk` 1.x (tests/interop/node).
    Node,
}

impl Sdk {
    /// The connection id the pool knows the server by.
    pub fn connection(self) -> &'static str {
        match self {
            Sdk::Python => "python",
            Sdk::Node => "node",
        }
    }

    /// The program and arguments that start the server over stdio.
    pub fn command(self) -> (PathBuf, Vec<String>) {
        let dir = repo_root().join("tests/interop");
        let setup = "run tests/interop/setup.sh (tests/run.sh does) to install the interop servers";
        match self {
            Sdk::Python => {
                let python = dir.join("python/.venv/bin/python");
                assert!(python.exists(), "{} is missing: {setup}", python.display());
                let script = dir.join("python/server.py");
                (python, vec![script.display().to_string()])
            }
            Sdk::Node => {
                let sdk = dir.join("node/node_modules/@modelcontextprotocol/sdk/package.json");
                assert!(sdk.exists(), "{} is missing: {setup}", sdk.display());
                let node =
                    which("node").unwrap_or_else(|| panic!("`node` is not on PATH: {setup}"));
                let script = dir.join("node/server.mjs");
                (node, vec![script.display().to_string()])
            }
        }
    }

    /// A stdio connection that starts the server, with `extra` TOML keys.
    pub fn stdio_connection(self, extra: &str) -> ConnectionConfig {
        let (program, args) = self.command();
        let args: Vec<toml::Value> = args.into_iter().map(toml::Value::from).collect();
        connection_from_toml(&format!(
            "command = {}\nargs = {}\n{extra}",
            toml::Value::from(program.display().to_string()),
            toml::Value::from(args),
        ))
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// An SDK server over streamable HTTP on 127.0.0.1, killed and reaped on drop.
pub struct HttpServer {
    sdk: Sdk,
    child: Child,
    pub addr: String,
}

impl HttpServer {
    /// Starts `sdk`'s server on `addr` (`127.0.0.1:0` picks a free port) and
    /// waits until it accepts connections.
    pub fn start(sdk: Sdk, addr: &str) -> HttpServer {
        let port = addr.rsplit_once(':').map_or("0", |(_, port)| port);
        let (program, args) = sdk.command();
        let mut child = Command::new(&program)
            .args(args)
            .args(["--http", port])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        let stderr = child.stderr.take().expect("piped stderr");
        let mut lines = BufReader::new(stderr).lines();
        let mut seen = Vec::new();
        let addr = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the {sdk:?} server exited before listening; its stderr:\n{}",
                    seen.join("\n")
                );
            };
            if let Some(rest) = line.strip_prefix("listening on http://") {
                break rest.trim_end_matches("/mcp").to_owned();
            }
            seen.push(line);
        };
        // Keep draining stderr so the server never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        HttpServer { sdk, child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Waits for the server to exit on its own (after `crash`).
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

    /// Starts the same SDK's server again on the same address.
    pub fn restart(&mut self) {
        self.kill();
        *self = HttpServer::start(self.sdk, &self.addr);
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A pool with the one connection `sdk.connection()`, over `kind`; the HTTP
/// server, when there is one, lives as long as the returned guard.
pub fn interop_pool(sdk: Sdk, kind: Kind) -> (Pool, Option<HttpServer>) {
    interop_pool_with(sdk, kind, "")
}

/// [`interop_pool`] with `extra` TOML keys on the connection.
pub fn interop_pool_with(sdk: Sdk, kind: Kind, extra: &str) -> (Pool, Option<HttpServer>) {
    super::init_tracing();
    let (connection, server) = match kind {
        Kind::Stdio => (sdk.stdio_connection(extra), None),
        Kind::Http => {
            let server = HttpServer::start(sdk, "127.0.0.1:0");
            let url = toml::Value::from(server.url());
            (
                connection_from_toml(&format!("url = {url}\n{extra}")),
                Some(server),
            )
        }
    };
    let pool = Pool::new(PoolConfig {
        connections: BTreeMap::from([(sdk.connection().to_owned(), connection)]),
        ..Default::default()
    });
    (pool, server)
}
