//! `wf-host serve` as a real child process on a free port.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use super::wf_host_bin;

/// A `wf-host serve` child, killed and reaped on drop.
pub struct Serve {
    pub child: Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    pub dir: tempfile::TempDir,
    /// Everything the child wrote to stderr (its log), so far.
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Serve {
    /// Writes the config with `config(dir)` (it returns the file) in a fresh
    /// temp dir and serves it with `extra` arguments.
    pub fn start(config: impl FnOnce(&Path) -> PathBuf, extra: &[&str]) -> Serve {
        Serve::start_with_env(config, extra, &[])
    }

    /// [`Serve::start`] with `env` set for the child. The OpenTelemetry
    /// variables of the test's own environment are not passed on.
    pub fn start_with_env(
        config: impl FnOnce(&Path) -> PathBuf,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Serve {
        // The test's own HTTP clients (reqwest, rmcp) need it.
        wf_host::pool::install_tls_provider();
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let mut child = Command::new(wf_host_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .args(extra)
            .env("WF_HOST_CACHE_DIR", dir.path().join("cache"))
            .env_remove("WF_HOST_TOKEN")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_SDK_DISABLED")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let base = loop {
            let line = lines.next().expect("serve printed its address").unwrap();
            log.lock().unwrap().push_str(&format!("{line}\n"));
            if let Some(rest) = line.strip_prefix("wf-host listening on ") {
                break rest.trim_end_matches("/rpc").to_owned();
            }
        };
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                kept.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        Serve {
            child,
            base,
            dir,
            log,
        }
    }

    pub fn mcp_url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// One JSON-RPC call to `/rpc`; the whole response.
    pub async fn rpc(&self, method: &str, params: Value, token: Option<&str>) -> Value {
        let mut request = reqwest::Client::new()
            .post(format!("{}/rpc", self.base))
            .header("Content-Type", "application/json")
            .body(
                json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string(),
            );
        if let Some(token) = token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let text = request.send().await.unwrap().text().await.unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// `GET <path>`: the status and the body.
    pub async fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        let mut request = reqwest::Client::new().get(format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
