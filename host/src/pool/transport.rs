//! How a session's transport comes up: spawning a stdio server (its
//! environment, its stderr), or building the HTTP client (custom headers, TLS,
//! OAuth, resumption), then the lifecycle handshake (`server/discover`, or
//! `initialize` for servers of earlier revisions). What runs once the
//! handshake is done is [`super::session`]'s.
//!
//! It may import the pool's other rooms (`session`, `catalog`, `http`,
//! `oauth`); it knows nothing about WebAssembly.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use rmcp::model::ProtocolVersion;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientLifecycleMode, ClientServiceExt};
use tokio::task::JoinSet;

use super::catalog::Dirty;
use super::session::{self, Connected, PoolClient, Session};
use super::{ConnCounters, ProgressRoutes, Settings, Transport};

/// How a session starts: `server/discover` for revision 2026-07-28 (no
/// `initialize`; change notifications come only on `subscriptions/listen`),
/// and an `initialize` at 2025-11-25 when the server answers the probe with a
/// JSON-RPC error, as servers of earlier revisions do. rmcp gives a server that
/// ignores the probe 10s before it falls back.
///
/// A connection's `protocol` pins one: `2025-11-25` is `initialize` alone
/// (for servers that ask mid-call, which a 2026-07-28 session has no
/// back-channel for), `2026-07-28` is `server/discover` with no fallback.
fn lifecycle(protocol: Option<&str>) -> ClientLifecycleMode {
    match protocol {
        Some("2025-11-25") => ClientLifecycleMode::Initialize,
        Some(_) => ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
        None => ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
        },
    }
}

/// Host variables a stdio server gets without asking: the set the official MCP
/// SDKs pass. Everything else (tokens, keys) stays in the host unless the
/// connection lists it in `inherit_env`.
#[cfg(not(windows))]
pub(crate) const DEFAULT_INHERITED_ENV: &[&str] =
    &["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"];
#[cfg(windows)]
pub(crate) const DEFAULT_INHERITED_ENV: &[&str] = &[
    "APPDATA",
    "HOMEDRIVE",
    "HOMEPATH",
    "LOCALAPPDATA",
    "PATH",
    "PROCESSOR_ARCHITECTURE",
    "SYSTEMDRIVE",
    "SYSTEMROOT",
    "TEMP",
    "USERNAME",
    "USERPROFILE",
    "PROGRAMFILES",
];

/// The whole environment of a stdio server: the default set and `inherit` as
/// far as the host has them, then the connection's own `env`, which wins.
fn child_env(
    inherit: &[String],
    env: &std::collections::BTreeMap<String, crate::config::ConfigValue>,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let mut vars: std::collections::BTreeMap<std::ffi::OsString, std::ffi::OsString> =
        DEFAULT_INHERITED_ENV
            .iter()
            .copied()
            .chain(inherit.iter().map(String::as_str))
            .filter_map(|name| Some((name.into(), std::env::var_os(name)?)))
            .collect();
    vars.extend(env.iter().map(|(k, v)| (k.into(), v.expose().into())));
    vars.into_iter().collect()
}

/// Opens a session: spawn or connect, `server/discover` or `initialize`, list
/// the catalog, and start the owner task.
pub(crate) async fn connect(
    settings: &Settings,
    counters: Arc<ConnCounters>,
    progress: Arc<ProgressRoutes>,
    pinned: Option<Arc<BTreeMap<String, String>>>,
) -> Result<Session, String> {
    let pinned_protocol = settings.protocol.as_deref();
    let first = open(
        settings,
        counters.clone(),
        progress.clone(),
        pinned.clone(),
        lifecycle(pinned_protocol),
    );
    match first.await {
        Err(Failed::Handshake(e)) if pinned_protocol.is_none() => {
            // A server of an earlier revision may close the connection on the
            // probe instead of answering it: rmcp servers before 3.x exit on any
            // first request but `initialize`. Start afresh with `initialize`.
            tracing::debug!(connection = %settings.id, "server/discover failed ({e}); connecting again with initialize");
            open(
                settings,
                counters,
                progress,
                pinned,
                ClientLifecycleMode::Initialize,
            )
            .await
            .map_err(Failed::into_detail)
        }
        other => other.map_err(Failed::into_detail),
    }
}

/// Why [`open`] failed.
enum Failed {
    /// The transport was up, the lifecycle handshake failed.
    Handshake(String),
    Other(String),
}

impl Failed {
    fn into_detail(self) -> String {
        match self {
            Failed::Handshake(e) => format!("initialize failed: {e}"),
            Failed::Other(e) => e,
        }
    }
}

impl From<String> for Failed {
    fn from(detail: String) -> Failed {
        Failed::Other(detail)
    }
}

/// One attempt at a session: spawn or connect, the handshake with
/// `lifecycle`, then [`session::start`].
async fn open(
    settings: &Settings,
    counters: Arc<ConnCounters>,
    progress: Arc<ProgressRoutes>,
    pinned: Option<Arc<BTreeMap<String, String>>>,
    lifecycle: ClientLifecycleMode,
) -> Result<Session, Failed> {
    let dirty = Arc::new(Dirty::default());
    let handler = PoolClient {
        dirty: dirty.clone(),
        progress,
        connection: settings.id.clone(),
    };
    let mut aux = JoinSet::new();
    let (running, pid, streams) = match &settings.transport {
        Transport::Stdio {
            program,
            args,
            env,
            inherit_env,
            cwd,
        } => {
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args)
                .env_clear()
                .envs(child_env(inherit_env, env))
                .kill_on_drop(true);
            if let Some(cwd) = cwd {
                cmd.current_dir(cwd);
            }
            let (transport, stderr) = TokioChildProcess::builder(cmd)
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start `{}`: {e}", program.display()))?;
            let pid = transport.id();
            if let Some(stderr) = stderr {
                let connection = settings.id.clone();
                // Drained so the child never blocks on a full pipe; ends at EOF.
                aux.spawn(drain_stderr(connection, stderr));
            }
            let running = handler
                .serve_with_lifecycle(transport, lifecycle)
                .instrument(upstream_span(&settings.id))
                .await
                .map_err(|e| Failed::Handshake(e.to_string()))?;
            (running, pid, None)
        }
        Transport::Http {
            url,
            headers,
            tls,
            auth,
        } => {
            let mut custom = std::collections::HashMap::new();
            for (name, value) in headers {
                let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|e| format!("header `{name}`: {e}"))?;
                let secret = matches!(value, crate::config::ConfigValue::Secret { .. });
                let mut value = reqwest::header::HeaderValue::from_str(value.expose())
                    .map_err(|e| format!("header `{name}`: {e}"))?;
                // Kept out of the HTTP stack's own debug output.
                value.set_sensitive(secret);
                custom.insert(name, value);
            }
            let mut backoff =
                rmcp::transport::common::client_side_sse::ExponentialBackoff::default();
            // Bounded: with the default, requests on a dead server hang forever.
            // One immediate resume attempt: a server's `retry:` hint (3s for
            // rmcp servers) would otherwise hold a dead server's callers for
            // seconds. A failed resume makes the owner ping, which decides.
            backoff.max_times = Some(1);
            backoff.base_duration = Duration::from_millis(200);
            backoff.max_delay = Some(Duration::from_secs(2));
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(custom)
                // We re-initialise ourselves, so the pool's stats count it.
                .reinit_on_expired_session(false);
            config.retry_config = Arc::new(backoff);
            // Keep-alive is on: a request a stale pooled connection swallows
            // (the server restarted) is sent again on a fresh one, so a
            // restart still shows up as the 404 that re-initialises us.
            let http = super::client::client(tls)?;
            let oauth = match auth {
                Some(auth) => Some(Arc::new(
                    super::oauth::OAuth::start(settings.id.clone(), url, auth, http.clone(), tls)
                        .await?,
                )),
                None => None,
            };
            let client = super::http::HostClient::new(http, oauth);
            let streams = client.open_streams();
            let transport = StreamableHttpClientTransport::with_client(client.clone(), config);
            let running = handler
                .serve_with_lifecycle(transport, lifecycle)
                .instrument(upstream_span(&settings.id))
                .await
                .map_err(|e| match client.last_failure() {
                    // TLS or authorization: asking again the old way cannot help.
                    Some(why) => Failed::Other(why),
                    None => Failed::Handshake(e.to_string()),
                })?;
            client.standalone_stream_tried(STANDALONE_STREAM_WAIT).await;
            (running, None, Some(streams))
        }
    };

    Ok(session::start(
        settings,
        counters,
        pinned,
        Connected {
            running,
            pid,
            streams,
            dirty,
            aux,
        },
    )
    .await?)
}

/// The span of a session's receive loop (rmcp runs it under the span in
/// force when it starts): what rmcp logs of a server (a message over its
/// size limit, a broken event stream) names the connection. At error level
/// so it shows whatever the log level.
fn upstream_span(connection: &str) -> tracing::Span {
    tracing::error_span!("upstream", connection = %connection)
}

/// How long a new HTTP session waits for its standalone event stream before
/// it takes calls; a server that neither opens nor refuses it by then is
/// used without it.
const STANDALONE_STREAM_WAIT: Duration = Duration::from_secs(2);

/// Longest stderr line of a server that is logged; the rest of it is skipped.
const STDERR_LINE_MAX: usize = 8 * 1024;
/// stderr lines logged per server per second; the excess is counted, not logged.
const STDERR_LINES_PER_SEC: u32 = 100;

/// Logs a server's stderr, a bounded line at a time and at a bounded rate, so
/// a chatty or hostile server costs the host neither memory nor log volume.
async fn drain_stderr(connection: Arc<str>, stderr: tokio::process::ChildStderr) {
    let mut lines = BoundedLines::new(tokio::io::BufReader::new(stderr), STDERR_LINE_MAX);
    let mut window = tokio::time::Instant::now();
    let (mut logged, mut dropped) = (0u32, 0u64);
    while let Ok(Some((line, truncated))) = lines.next_line().await {
        if window.elapsed() >= Duration::from_secs(1) {
            if dropped > 0 {
                tracing::debug!(target: "wf_host::upstream", connection = %connection, "({dropped} stderr lines not logged: over {STDERR_LINES_PER_SEC}/s)");
            }
            window = tokio::time::Instant::now();
            (logged, dropped) = (0, 0);
        }
        if logged >= STDERR_LINES_PER_SEC {
            dropped += 1;
            continue;
        }
        logged += 1;
        let marker = if truncated { " [truncated]" } else { "" };
        tracing::debug!(target: "wf_host::upstream", connection = %connection, "{line}{marker}");
    }
}

/// Splits a byte stream into lines, holding at most `max` bytes of any line:
/// a longer one is cut at `max` and flagged, and its rest is read and dropped.
struct BoundedLines<R> {
    reader: R,
    max: usize,
    line: Vec<u8>,
}

impl<R: tokio::io::AsyncBufRead + Unpin> BoundedLines<R> {
    fn new(reader: R, max: usize) -> Self {
        BoundedLines {
            reader,
            max,
            line: Vec::new(),
        }
    }

    /// The next line (lossy UTF-8, without its line ending) and whether it was
    /// cut; `None` at end of input.
    async fn next_line(&mut self) -> std::io::Result<Option<(String, bool)>> {
        use tokio::io::AsyncBufReadExt;
        self.line.clear();
        let mut truncated = false;
        loop {
            let chunk = self.reader.fill_buf().await?;
            if chunk.is_empty() {
                if self.line.is_empty() && !truncated {
                    return Ok(None);
                }
                break;
            }
            let (part, used, ended) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (&chunk[..i], i + 1, true),
                None => (chunk, chunk.len(), false),
            };
            let room = self.max - self.line.len();
            if part.len() > room {
                truncated = true;
            }
            self.line.extend_from_slice(&part[..part.len().min(room)]);
            self.reader.consume(used);
            if ended {
                break;
            }
        }
        if self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        Ok(Some((
            String::from_utf8_lossy(&self.line).into_owned(),
            truncated,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_huge_stderr_line_is_cut_and_the_next_line_is_whole() {
        let mut input = vec![b'x'; 1024 * 1024];
        input.extend_from_slice(b"\nnext line\r\nlast");
        let mut lines = BoundedLines::new(&input[..], STDERR_LINE_MAX);
        let (first, truncated) = lines.next_line().await.unwrap().unwrap();
        assert_eq!(first.len(), STDERR_LINE_MAX);
        assert!(truncated);
        assert!(
            lines.line.capacity() < 2 * STDERR_LINE_MAX,
            "buffered {}",
            lines.line.capacity()
        );
        assert_eq!(
            lines.next_line().await.unwrap(),
            Some(("next line".to_owned(), false))
        );
        assert_eq!(
            lines.next_line().await.unwrap(),
            Some(("last".to_owned(), false))
        );
        assert_eq!(lines.next_line().await.unwrap(), None);
    }
}
