//! The MCP runtime pool: one persistent client session per connection, shared by
//! every node, run and RPC request.
//!
//! Sessions are keyed by a fingerprint of the connection's settings. The first
//! callers of a connection wait on one connect (no thundering herd); later ones
//! reuse the live session. A dead session fails its pending operations and is
//! rebuilt on next use. Repeated connect failures back off exponentially with
//! jitter, and meanwhile the breaker fails callers fast.
//!
//! The pool knows nothing about WebAssembly; [`backend`] adapts it to the node
//! capability interface.

mod backend;
mod catalog;
mod client;
mod http;
mod limits;
mod oauth;
pub mod pin;
mod session;
mod transport;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientRequest,
    GetPromptRequestParams, JsonObject, ProgressToken, Prompt, ReadResourceRequestParams, Resource,
    ServerResult, Tool,
};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio::sync::{oneshot, watch};

pub use backend::to_capability_error;
pub use catalog::Catalog;
pub use oauth::login;
pub use session::{OpFn, OpMeta};
// Where these lived before `tls` was their own room; kept for the paths
// callers already use.
pub use crate::tls::{TlsFiles, install_tls_provider, load_tls_files};
use session::{Operation, Session};

use crate::capability::{Answer, CallExtras, Elicitor, Progress, ProgressSink, Question};
use crate::config::ConnectionConfig;
use pin::{PinCheck, Pins};

/// Default per-operation timeout.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a call may take however often its server reports progress.
pub const DEFAULT_MAX_CALL_TIME: Duration = Duration::from_secs(3600);
/// How often one operation follows its connection to a new slot while
/// reloads replace it.
const MAX_REROUTES: u32 = 8;
/// How long a question an upstream server asks waits for its answer, unless
/// the connection says (`elicitation_timeout`); no answer declines it.
pub const DEFAULT_ELICITATION_TIMEOUT: Duration = Duration::from_secs(600);
/// Default cap on catalog entries per kind.
pub const DEFAULT_CATALOG_CAP: usize = 1000;
/// Default interval of the catalog re-list that runs without `list_changed`.
pub const DEFAULT_CATALOG_REFRESH: Duration = Duration::from_secs(300);
pub use catalog::MAX_CATALOG_PAGES;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
const BACKOFF_BASE: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Why a pool operation failed. Messages name the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("connection `{connection}` is not configured")]
    UnknownConnection { connection: String },
    #[error("connection `{connection}`: {detail}")]
    ConnectFailed { connection: String, detail: String },
    #[error(
        "connection `{connection}`: circuit open after {failures} failed connects; retrying in {}ms; last error: {last_error}",
        retry_in.as_millis()
    )]
    CircuitOpen {
        connection: String,
        failures: u32,
        retry_in: Duration,
        last_error: String,
    },
    #[error("connection `{connection}`: session lost: {reason}")]
    SessionClosed { connection: String, reason: String },
    #[error("connection `{connection}`: the server forgot the session (HTTP 404)")]
    Expired { connection: String },
    #[error("connection `{connection}`: `{operation}` timed out after {}ms", after.as_millis())]
    Timeout {
        connection: String,
        operation: &'static str,
        after: Duration,
    },
    /// The call kept reporting progress past the connection's
    /// `max_call_time`.
    #[error("connection `{connection}`: `{operation}` was still running after {}ms, its `max_call_time`, though its server kept reporting progress; the request was cancelled", after.as_millis())]
    TooLong {
        connection: String,
        operation: &'static str,
        after: Duration,
    },
    #[error("connection `{connection}`: server error {code}: {message}")]
    Server {
        connection: String,
        code: i32,
        message: String,
    },
    #[error("the pool is shut down")]
    ShutDown,
    #[error("connection `{connection}` has no tool `{tool}`")]
    NoSuchTool { connection: String, tool: String },
    #[error("arguments for `{connection}.{tool}` do not match its input schema: {problem}")]
    InvalidArguments {
        connection: String,
        tool: String,
        problem: String,
    },
    /// A `wf.lock` exists and this tool's definition is not the pinned one.
    #[error("{}", pin::refusal(connection, tool, *check))]
    NotPinned {
        connection: String,
        tool: String,
        check: PinCheck,
    },
    #[error("the result of `{connection}.{tool}` does not match its output schema: {problem}")]
    InvalidOutput {
        connection: String,
        tool: String,
        problem: String,
    },
    /// No turn under the connection's limits before the request's timeout.
    #[error(
        "connection `{connection}`: no turn within {}ms under {limits} ({queued} more waiting)",
        after.as_millis()
    )]
    Limited {
        connection: String,
        limits: String,
        after: Duration,
        queued: u64,
    },
    #[error("connection `{connection}`: {queued} requests wait for a turn already; try later")]
    QueueFull { connection: String, queued: u64 },
}

/// How the pool is built.
#[derive(Debug, Clone, Default)]
pub struct PoolConfig {
    pub connections: BTreeMap<String, ConnectionConfig>,
    /// What `command = "wf-host"` runs; defaults to this executable.
    pub self_exe: Option<PathBuf>,
    /// Relative `cwd`s resolve against this (the config file's directory).
    pub base_dir: PathBuf,
    /// Catalog entries per kind; defaults to [`DEFAULT_CATALOG_CAP`].
    pub catalog_cap: Option<usize>,
    /// The pinned tool definitions (`wf.lock`); `None` pins nothing.
    pub pins: Option<Arc<Pins>>,
    /// The OAuth token store; defaults to `.wf-host/tokens.json` in `base_dir`.
    pub tokens: Option<PathBuf>,
}

/// A connection's settings, normalised; what the fingerprint hashes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub(crate) struct Settings {
    pub id: Arc<str>,
    pub transport: Transport,
    pub call_timeout: Duration,
    /// The ceiling of a call that keeps reporting progress.
    pub max_call_time: Duration,
    pub idle_timeout: Option<Duration>,
    pub ping_interval: Option<Duration>,
    pub catalog_cap: usize,
    pub catalog_refresh: Duration,
    pub limits: limits::LimitSettings,
    /// How long a question the server asks may wait for its answer;
    /// `None`: `elicitation = "decline"`.
    pub elicitation_timeout: Option<Duration>,
    /// The MCP revision pinned (`protocol`), if any.
    pub protocol: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub(crate) enum Transport {
    Stdio {
        program: PathBuf,
        args: Vec<String>,
        env: BTreeMap<String, crate::config::ConfigValue>,
        /// Host variables passed through besides [`transport::DEFAULT_INHERITED_ENV`].
        inherit_env: Vec<String>,
        cwd: Option<PathBuf>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, crate::config::ConfigValue>,
        tls: TlsFiles,
        auth: Option<oauth::AuthSettings>,
    },
}

impl Settings {
    fn from_config(id: &str, c: &ConnectionConfig, pool: &PoolConfig) -> Settings {
        let transport = match (&c.command, &c.url) {
            (Some(command), _) => Transport::Stdio {
                program: if command == "wf-host" {
                    pool.self_exe
                        .clone()
                        .or_else(|| std::env::current_exe().ok())
                        .unwrap_or_else(|| PathBuf::from(command))
                } else {
                    PathBuf::from(command)
                },
                args: c.args.clone(),
                env: c.env.clone(),
                inherit_env: c.inherit_env.clone(),
                cwd: c.cwd.as_ref().map(|d| pool.base_dir.join(d)),
            },
            (None, url) => Transport::Http {
                url: url.clone().unwrap_or_default(),
                headers: c.headers.clone(),
                tls: c.tls_files(&pool.base_dir),
                auth: oauth::AuthSettings::from_config(
                    c,
                    &pool
                        .tokens
                        .clone()
                        .unwrap_or_else(|| pool.base_dir.join(crate::config::DEFAULT_TOKENS)),
                ),
            },
        };
        let is_http = matches!(transport, Transport::Http { .. });
        Settings {
            id: id.into(),
            transport,
            // The config loader refuses zero durations; one that slips through
            // (a hand-built config) means the default, never a panic.
            call_timeout: nonzero(c.call_timeout).unwrap_or(DEFAULT_CALL_TIMEOUT),
            max_call_time: nonzero(c.max_call_time).unwrap_or(DEFAULT_MAX_CALL_TIME),
            idle_timeout: nonzero(c.idle_timeout),
            // stdio death is seen at once through the pipe; HTTP needs a ping.
            ping_interval: nonzero(c.ping_interval).or(is_http.then_some(Duration::from_secs(15))),
            catalog_cap: pool.catalog_cap.unwrap_or(DEFAULT_CATALOG_CAP),
            catalog_refresh: nonzero(c.catalog_refresh).unwrap_or(DEFAULT_CATALOG_REFRESH),
            // The config loader refuses a `rate` that does not parse.
            limits: limits::LimitSettings::new(
                c.max_in_flight,
                c.rate
                    .as_deref()
                    .and_then(|r| crate::config::Rate::parse(r).ok()),
                c.burst,
            ),
            elicitation_timeout: (c.elicitation.as_deref() != Some("decline"))
                .then(|| nonzero(c.elicitation_timeout).unwrap_or(DEFAULT_ELICITATION_TIMEOUT)),
            protocol: c.protocol.clone(),
        }
    }

    /// A hash of the normalised settings: same settings, same session.
    fn fingerprint(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(&Sha256::digest(&json)[..8])
    }

    fn transport_name(&self) -> &'static str {
        match self.transport {
            Transport::Stdio { .. } => "stdio",
            Transport::Http { .. } => "http",
        }
    }
}

fn nonzero(d: Option<Duration>) -> Option<Duration> {
    d.filter(|d| !d.is_zero())
}

/// Per-connection counters, kept across sessions.
#[derive(Debug, Default)]
pub(crate) struct ConnCounters {
    pub sessions_opened: AtomicU64,
    pub calls: AtomicU64,
    pub failures: AtomicU64,
    pub replays: AtomicU64,
    pub session_panics: AtomicU64,
    /// Requests sent to the server and not answered yet.
    pub in_flight: AtomicU64,
    last_error: Mutex<Option<String>>,
    tools: AtomicUsize,
    resources: AtomicUsize,
    prompts: AtomicUsize,
}

impl ConnCounters {
    pub(crate) fn set_last_error(&self, e: &str) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_owned());
    }

    pub(crate) fn set_catalog(&self, c: &Catalog) {
        self.tools.store(c.tools.len(), Ordering::Relaxed);
        self.resources.store(c.resources.len(), Ordering::Relaxed);
        self.prompts.store(c.prompts.len(), Ordering::Relaxed);
    }
}

/// A snapshot of one connection, for status pages and tests.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConnectionStats {
    pub id: String,
    pub transport: &'static str,
    /// `idle` (no session yet), `ready`, `circuit-open` or `closed`.
    pub state: &'static str,
    pub fingerprint: String,
    /// `initialize` handshakes completed, over the pool's life.
    pub sessions_opened: u64,
    pub calls: u64,
    pub failures: u64,
    /// Operations replayed on a fresh session after their own request got
    /// HTTP 404 (the server forgot the session).
    pub replays: u64,
    /// Session owners that panicked (a defect: each is logged as an error;
    /// its callers fail and the next call opens a new session).
    pub session_panics: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub tools: usize,
    pub resources: usize,
    pub prompts: usize,
    /// The server's process id, for stdio connections with a live session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// With a live session: `live` while the server can push `list_changed`
    /// to us (stdio, or an open HTTP event stream), else `polling` (the
    /// catalog is re-listed every `catalog_refresh`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notifications: Option<&'static str>,
    /// Requests waiting for a turn under `max_in_flight` or `rate`.
    pub queued: u64,
    /// Requests sent to the server and not answered yet: a server that
    /// accepts calls and never answers shows here until `call_timeout`.
    pub in_flight: u64,
    /// With a `wf.lock`: the live tools whose definition is not the pinned
    /// one, and why (`changed` or `unpinned`). Calls to them are refused.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drifted: Vec<Drift>,
}

/// A tool that does not match the lock.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Drift {
    pub tool: String,
    /// `changed` or `unpinned`.
    pub reason: &'static str,
}

/// The tools of `catalog` that `pinned` does not vouch for.
fn drift(catalog: &Catalog, pinned: &BTreeMap<String, String>) -> Vec<Drift> {
    catalog
        .tools
        .iter()
        .filter_map(|t| {
            let reason = match pin::check(pinned, &t.name, catalog.digest(&t.name)?) {
                PinCheck::Pinned => return None,
                PinCheck::Changed => "changed",
                PinCheck::Unpinned => "unpinned",
            };
            Some(Drift {
                tool: t.name.to_string(),
                reason,
            })
        })
        .collect()
}

/// Routes `notifications/progress` to the call whose request carried the
/// token (rmcp gives every request one). Per connection, across its sessions.
#[derive(Default)]
pub(crate) struct ProgressRoutes {
    routes: Mutex<Routes>,
    /// The tool calls in flight that a question (`elicitation/create`)
    /// could come from, by a number of their own.
    askers: Mutex<Vec<(u64, Asker)>>,
}

/// A call in flight that may be asked a question.
#[derive(Clone)]
pub(crate) struct Asker {
    tool: String,
    call: TaskFollowing,
    tick: watch::Sender<u64>,
}

impl Asker {
    pub(crate) async fn ask(
        &self,
        request: rmcp::model::ElicitRequestParams,
    ) -> rmcp::model::ElicitResult {
        self.call.ask(&self.tool, request, &self.tick).await
    }
}

/// Unregisters an [`Asker`] when its call ends.
struct AskerGuard {
    routes: Arc<ProgressRoutes>,
    id: u64,
}

impl Drop for AskerGuard {
    fn drop(&mut self) {
        self.routes
            .askers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(id, _)| *id != self.id);
    }
}

#[derive(Default)]
struct Routes {
    by_token: HashMap<ProgressToken, Route>,
    /// Routes of finished calls, oldest first, each with its end: they are
    /// dropped from the front once they have lingered, so a call costs the
    /// same however many calls finished in the last second.
    ended: VecDeque<(Instant, ProgressToken)>,
}

/// Where one call's reports go: a tick that restarts its timeout, and the
/// caller's sink. A finished call's route lingers for [`ROUTE_LINGER`]: rmcp
/// may hand over a report that came just before the answer after it.
struct Route {
    tick: watch::Sender<u64>,
    sink: Option<ProgressSink>,
}

const ROUTE_LINGER: Duration = Duration::from_secs(1);

impl ProgressRoutes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Never blocks: this runs in the notification handler (the sink must
    /// return at once too).
    pub(crate) fn deliver(&self, token: &ProgressToken, progress: Progress) {
        let sink = {
            let routes = self.lock();
            let Some(route) = routes.by_token.get(token) else {
                return;
            };
            route.tick.send_modify(|n| *n += 1);
            route.sink.clone()
        };
        if let Some(sink) = sink {
            sink(progress);
        }
    }

    /// Routes `token` until the guard drops, and a moment after.
    fn register(
        self: &Arc<Self>,
        token: ProgressToken,
        tick: watch::Sender<u64>,
        sink: Option<ProgressSink>,
    ) -> RouteGuard {
        let mut routes = self.lock();
        let now = Instant::now();
        while let Some((ended, _)) = routes.ended.front()
            && now.duration_since(*ended) >= ROUTE_LINGER
        {
            let (_, gone) = routes.ended.pop_front().expect("just seen");
            routes.by_token.remove(&gone);
        }
        routes.by_token.insert(token.clone(), Route { tick, sink });
        RouteGuard {
            routes: self.clone(),
            token,
        }
    }

    /// Lets a question reach `asker` until the guard drops.
    fn register_asker(self: &Arc<Self>, asker: Asker) -> AskerGuard {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        self.askers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, asker));
        AskerGuard {
            routes: self.clone(),
            id,
        }
    }

    /// The call a question asked now comes from: a server at 2025-11-25
    /// sends `elicitation/create` with nothing that names the call, so it
    /// is known only when one call that may be asked is in flight.
    pub(crate) fn sole_asker(&self) -> Result<Asker, usize> {
        let askers = self.askers.lock().unwrap_or_else(|p| p.into_inner());
        match askers.as_slice() {
            [(_, asker)] => Ok(asker.clone()),
            many => Err(many.len()),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_token.len()
    }
}

struct RouteGuard {
    routes: Arc<ProgressRoutes>,
    token: ProgressToken,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        let token = self.token.clone();
        self.routes.lock().ended.push_back((Instant::now(), token));
    }
}

/// Sends `notifications/cancelled` for a request whose caller went away
/// before the answer (timeout, session death, caller gone).
struct CancelOnDrop {
    peer: Option<(rmcp::Peer<rmcp::RoleClient>, rmcp::model::RequestId)>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some((peer, id)) = self.peer.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let params = CancelledNotificationParam::new(
                    Some(id),
                    Some("the caller stopped waiting".into()),
                );
                let _ = peer.notify_cancelled(params).await;
            });
        }
    }
}

/// `tools/call` with its progress reports routed to `tick` and `sink`.
async fn call_tool_routed(
    peer: rmcp::Peer<rmcp::RoleClient>,
    params: CallToolRequestParams,
    routes: Arc<ProgressRoutes>,
    tick: watch::Sender<u64>,
    sink: Option<ProgressSink>,
    tasks: TaskFollowing,
) -> Result<Value, rmcp::ServiceError> {
    let connection = tasks.connection.clone();
    // The same call made before (its step run again after a restart) made
    // a task: follow it rather than call the tool again. A server that no
    // longer knows it gets the call anew.
    if let Some((key, ledger)) = &tasks.ledger
        && let Some(task_id) = ledger.task_of(key).await
    {
        match follow_task(peer.clone(), task_id.clone(), None, tick.clone(), &tasks).await {
            Err(rmcp::ServiceError::McpError(e)) => {
                tracing::info!(connection = %connection, task = %task_id,
                    "the server no longer knows the task; calling again: {}", e.message);
            }
            other => return other,
        }
    }
    let _asker = routes.register_asker(Asker {
        tool: params.name.to_string(),
        call: tasks.clone(),
        tick: tick.clone(),
    });
    // A server at 2026-07-28 asks its questions as the call's answer
    // (`input_required`): each round is the call made again with the
    // answers and the server's state.
    let mut params = params;
    for _round in 0..MAX_INPUT_ROUNDS {
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params.clone()));
        let handle = peer
            .send_request_with_option(request, rmcp::service::PeerRequestOptions::no_options())
            .await?;
        let _route = routes.register(handle.progress_token.clone(), tick.clone(), sink.clone());
        let mut cancel = CancelOnDrop {
            peer: Some((peer.clone(), handle.id.clone())),
        };
        let answer = handle.await_response().await;
        cancel.peer = None;
        let answer = match answer {
            // A server of revision 2025-11-25 whose tool must run as a task
            // (`taskSupport: "required"`): the call again, as one.
            Err(rmcp::ServiceError::McpError(e)) if requires_task(&e) => {
                drop(_route);
                return call_tool_as_task(peer, &params, tick, &tasks).await;
            }
            answer => answer?,
        };
        match answer {
            // The TypeScript SDK says so as a tool error.
            ServerResult::CallToolResult(result)
                if result.is_error == Some(true)
                    && result
                        .content
                        .iter()
                        .any(|c| c.as_text().is_some_and(|t| t.text.contains(REQUIRES_TASK))) =>
            {
                drop(_route);
                return call_tool_as_task(peer, &params, tick, &tasks).await;
            }
            ServerResult::CallToolResult(result) => return to_json(result),
            ServerResult::CreateTaskResult(created) => {
                let task = created.task;
                if let Some((key, ledger)) = &tasks.ledger {
                    ledger.task_started(key, &connection, &task.task_id).await;
                }
                let every = task.poll_interval_ms.map(Duration::from_millis);
                return follow_task(peer, task.task_id, every, tick, &tasks).await;
            }
            ServerResult::InputRequiredResult(asked) => {
                let mut responses = rmcp::model::InputResponses::new();
                for (key, request) in asked.input_requests.unwrap_or_default() {
                    let rmcp::model::InputRequest::Elicitation(request) = request else {
                        return Ok(tool_error(format!(
                            "`{}` asked for {}, which wf-host does not offer",
                            params.name,
                            input_request_method(&request)
                        )));
                    };
                    let answer = tasks.ask(&params.name, request.params, &tick).await;
                    responses.insert(key, serde_json::to_value(answer).unwrap_or_default());
                }
                params.input_responses = (!responses.is_empty()).then_some(responses);
                params.request_state = asked.request_state;
            }
            _ => return Err(rmcp::ServiceError::UnexpectedResponse),
        }
    }
    Ok(tool_error(format!(
        "`{}` still asked for input after {MAX_INPUT_ROUNDS} rounds",
        params.name
    )))
}

/// The most `input_required` rounds one tool call may take.
const MAX_INPUT_ROUNDS: usize = 16;

/// How long a task the pool asks a server for is to be kept (the `ttl` of
/// a 2025-11-25 task-augmented call): as long as a run may wait for it.
const TASK_TTL: Duration = Duration::from_secs(24 * 3600);

/// Whether a server refused a plain `tools/call` because the tool runs only
/// as a task (revision 2025-11-25 tasks, SEP-1686: `taskSupport:
/// "required"`), as a JSON-RPC error. (The TypeScript SDK answers with a
/// tool error instead: "MCP error -32601: Tool x requires task augmentation
/// (taskSupport: 'required')".)
fn requires_task(e: &rmcp::ErrorData) -> bool {
    e.code == rmcp::model::ErrorCode::METHOD_NOT_FOUND && e.message.contains(REQUIRES_TASK)
}

/// What a server says of a tool that runs only as a task.
const REQUIRES_TASK: &str = "requires task augmentation";

/// A request rmcp has no type for (the 2025-11-25 tasks), as JSON.
async fn raw_request(
    peer: &rmcp::Peer<rmcp::RoleClient>,
    method: &str,
    params: Value,
) -> Result<Value, rmcp::ServiceError> {
    let request =
        ClientRequest::CustomRequest(rmcp::model::CustomRequest::new(method, Some(params)));
    to_json(peer.send_request(request).await?)
}

/// `tools/call` as a task, the 2025-11-25 way: the call carries `task:
/// {ttl}`, the server answers with the task it made (`{task: {taskId,
/// pollInterval}}`), which is kept in the call's ledger and followed as a
/// task of the extension is ([`follow_task`]).
async fn call_tool_as_task(
    peer: rmcp::Peer<rmcp::RoleClient>,
    params: &CallToolRequestParams,
    tick: watch::Sender<u64>,
    tasks: &TaskFollowing,
) -> Result<Value, rmcp::ServiceError> {
    let mut request =
        serde_json::to_value(params).map_err(|_| rmcp::ServiceError::UnexpectedResponse)?;
    request["task"] = serde_json::json!({ "ttl": TASK_TTL.as_millis() as u64 });
    let created = raw_request(&peer, "tools/call", request).await?;
    let task = &created["task"];
    let Some(task_id) = task["taskId"].as_str().map(str::to_owned) else {
        // Not a task after all: the call's own result.
        return Ok(created);
    };
    tracing::debug!(connection = %tasks.connection, tool = %params.name, task = %task_id,
        "the tool runs as a task (2025-11-25)");
    if let Some((key, ledger)) = &tasks.ledger {
        ledger.task_started(key, &tasks.connection, &task_id).await;
    }
    let every = task["pollInterval"].as_u64().map(Duration::from_millis);
    follow_task(peer, task_id, every, tick, tasks).await
}

fn input_request_method(request: &rmcp::model::InputRequest) -> &'static str {
    match request {
        rmcp::model::InputRequest::CreateMessage(_) => "`sampling/createMessage`",
        rmcp::model::InputRequest::ListRoots(_) => "`roots/list`",
        _ => "`elicitation/create`",
    }
}

/// A `CallToolResult` that reports `text` as a tool error.
fn tool_error(text: String) -> Value {
    serde_json::json!({"content": [{"type": "text", "text": text}], "isError": true})
}

/// What the pool adds to a call's tick to keep it alive itself (following
/// its task, waiting for a person's answer), as opposed to the server's
/// progress reports, which add 1: a call kept alive so is bounded by its
/// task's lifetime or its question's `elicitation_timeout`, not by
/// `max_call_time`.
pub(crate) const KEEP_ALIVE_TICK: u64 = 1 << 32;

/// Shortest and longest wait between two `tasks/get` of a task.
const TASK_POLL_MIN: Duration = Duration::from_millis(50);
const TASK_POLL_MAX: Duration = Duration::from_secs(5);

/// A tool call the server made a task: polls `tasks/get` at the server's
/// `pollInterval` until the task ends, each answer restarting the call's
/// timeout (`tick`), as progress does. Both forms of tasks: the extension's
/// (2026-07-28), whose `tasks/get` carries the result of a completed task,
/// and revision 2025-11-25's, whose result comes from `tasks/result`; a
/// 2025-11-25 task that asks for input is answered there too (its
/// `elicitation/create` reaches the pool while `tasks/result` waits, and the
/// call's asker answers it). A task that ends `failed` or `cancelled` is a
/// tool error; an extension task that asks for input is cancelled (the pool
/// answers no input round of a task yet), as is the task of a call whose
/// caller stopped waiting.
async fn follow_task(
    peer: rmcp::Peer<rmcp::RoleClient>,
    task_id: String,
    mut every: Option<Duration>,
    tick: watch::Sender<u64>,
    tasks: &TaskFollowing,
) -> Result<Value, rmcp::ServiceError> {
    let mut guard = CancelTaskOnDrop {
        peer: Some((peer.clone(), task_id.clone())),
        keep: tasks.keep.clone(),
        ledger: tasks.ledger.as_ref().map(|(_, ledger)| ledger.clone()),
    };
    let id = serde_json::json!({ "taskId": task_id });
    // A task followed again (after a restart, or by a parked step) is asked
    // about at once: its call's timeout runs from now.
    let mut first = every.is_none();
    loop {
        if !std::mem::take(&mut first) {
            // Without the server's interval: often enough that the call's
            // timeout, which each answer restarts, never runs out.
            let fallback = (tasks.timeout / 4).min(Duration::from_secs(1));
            tokio::time::sleep(
                every
                    .unwrap_or(fallback)
                    .clamp(TASK_POLL_MIN, TASK_POLL_MAX),
            )
            .await;
        }
        let got = raw_request(&peer, "tasks/get", id.clone()).await?;
        tick.send_modify(|n| *n += KEEP_ALIVE_TICK);
        every = ["pollIntervalMs", "pollInterval"]
            .iter()
            .find_map(|k| got[*k].as_u64())
            .map(Duration::from_millis)
            .or(every);
        let ended = match got["status"].as_str().unwrap_or_default() {
            "completed" => match got.get("result") {
                Some(result) => result.clone(),
                None => task_result(&peer, &id, &tick, tasks).await?,
            },
            "input_required" if got.get("inputRequests").is_none() => {
                task_result(&peer, &id, &tick, tasks).await?
            }
            "input_required" => {
                // Left to the guard to cancel.
                return Ok(tool_error(format!(
                    "the server's task `{task_id}` asks for input, which wf-host does not answer; it was cancelled"
                )));
            }
            "failed" => tool_error(format!(
                "the server's task `{task_id}` failed: {}",
                got.get("error")
                    .or(got.get("statusMessage"))
                    .unwrap_or(&Value::Null)
            )),
            "cancelled" => tool_error(format!("the server cancelled its task `{task_id}`")),
            _ => continue,
        };
        guard.peer = None;
        return Ok(ended);
    }
}

/// `tasks/result` of a 2025-11-25 task: it answers once the task has ended,
/// and meanwhile the questions the task asks reach the pool (and the call's
/// asker restarts the call's timeout while a person answers). The wait
/// restarts the call's timeout too, as polling does.
async fn task_result(
    peer: &rmcp::Peer<rmcp::RoleClient>,
    id: &Value,
    tick: &watch::Sender<u64>,
    tasks: &TaskFollowing,
) -> Result<Value, rmcp::ServiceError> {
    let result = keeping_alive(
        tick,
        tasks.timeout / 4,
        raw_request(peer, "tasks/result", id.clone()),
    )
    .await?;
    let mut result = result;
    if let Some(meta) = result.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.remove("io.modelcontextprotocol/related-task");
        if meta.is_empty() {
            result.as_object_mut().map(|r| r.remove("_meta"));
        }
    }
    Ok(result)
}

/// What a tool call needs to follow the task a server makes of it, and to
/// answer the questions it asks.
#[derive(Clone)]
struct TaskFollowing {
    /// The call's idempotency key and where its task is kept.
    ledger: Option<(String, Arc<dyn crate::capability::TaskLedger>)>,
    connection: Arc<str>,
    /// [`Pool::keep_tasks_on_stop`] was called.
    keep: Arc<std::sync::atomic::AtomicBool>,
    /// Who answers the call's questions, and how long one may wait for its
    /// answer; `None`: every question is declined.
    elicit: Option<(Arc<dyn Elicitor>, Duration)>,
    /// The call's timeout, restarted while a question waits for its answer.
    timeout: Duration,
}

impl TaskFollowing {
    /// Asks the call's elicitor `request`, keeping the call alive (its
    /// timeout restarted) while a person answers.
    async fn ask(
        &self,
        tool: &str,
        request: rmcp::model::ElicitRequestParams,
        tick: &watch::Sender<u64>,
    ) -> rmcp::model::ElicitResult {
        let Some((elicitor, within)) = &self.elicit else {
            tracing::info!(connection = %self.connection, tool,
                "the server asked a question; declined (`elicitation = \"decline\"` or no run to ask)");
            return to_elicit_result(Answer::decline());
        };
        let question = question_of(&self.connection, tool, request);
        let answer = keeping_alive(tick, self.timeout / 4, elicitor.ask(question, *within)).await;
        to_elicit_result(answer)
    }
}

/// Runs `fut`, restarting the call's timeout every `every` meanwhile.
async fn keeping_alive<T>(
    tick: &watch::Sender<u64>,
    every: Duration,
    fut: impl Future<Output = T>,
) -> T {
    let every = every.max(Duration::from_millis(1));
    let ticking = async {
        loop {
            tokio::time::sleep(every).await;
            tick.send_modify(|n| *n += KEEP_ALIVE_TICK);
        }
    };
    tokio::select! {
        out = fut => out,
        () = ticking => unreachable!("ticks forever"),
    }
}

/// The host's view of a server's elicitation request.
fn question_of(
    connection: &str,
    tool: &str,
    request: rmcp::model::ElicitRequestParams,
) -> Question {
    use rmcp::model::ElicitRequestParams as P;
    let (mode, message, requested_schema, url) = match request {
        P::FormElicitationParams {
            message,
            requested_schema,
            ..
        } => (
            "form",
            message,
            serde_json::to_value(requested_schema).ok(),
            None,
        ),
        P::UrlElicitationParams { message, url, .. } => ("url", message, None, Some(url)),
        other => (
            "unknown",
            format!("a question of a kind wf-host does not know: {other:?}"),
            None,
            None,
        ),
    };
    Question {
        connection: connection.to_owned(),
        tool: tool.to_owned(),
        mode: mode.to_owned(),
        message: crate::capability::truncate_utf8(message, MAX_QUESTION_MESSAGE),
        requested_schema,
        url,
    }
}

/// The longest question message kept, in bytes.
const MAX_QUESTION_MESSAGE: usize = 4096;

fn to_elicit_result(answer: Answer) -> rmcp::model::ElicitResult {
    use rmcp::model::ElicitationAction;
    let action = match answer.action.as_str() {
        "accept" => ElicitationAction::Accept,
        "cancel" => ElicitationAction::Cancel,
        _ => ElicitationAction::Decline,
    };
    let mut result = rmcp::model::ElicitResult::new(action);
    if answer.action == "accept" {
        result.content = answer.content;
    }
    result
}

/// Cancels a task (`tasks/cancel`) whose call ended before it did, unless
/// the host is stopping (the next start follows it again) or the call's
/// step let go of its node to follow the task without it
/// ([`crate::capability::TaskLedger::keeps_task`]).
struct CancelTaskOnDrop {
    peer: Option<(rmcp::Peer<rmcp::RoleClient>, String)>,
    keep: Arc<std::sync::atomic::AtomicBool>,
    ledger: Option<Arc<dyn crate::capability::TaskLedger>>,
}

impl Drop for CancelTaskOnDrop {
    fn drop(&mut self) {
        let Some((peer, task_id)) = self.peer.take() else {
            return;
        };
        if self.keep.load(Ordering::Acquire) || self.ledger.as_ref().is_some_and(|l| l.keeps_task())
        {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let params = rmcp::model::CancelTaskParams::new(task_id);
                let _ = peer.cancel_task(params).await;
            });
        }
    }
}

/// One configured connection and its (at most one) live session.
struct Slot {
    settings: Settings,
    fingerprint: String,
    counters: Arc<ConnCounters>,
    /// This connection's pinned digests, when a lock exists.
    pinned: Option<Arc<BTreeMap<String, String>>>,
    progress: Arc<ProgressRoutes>,
    /// `max_in_flight` and `rate`, across sessions.
    limits: limits::Limits,
    // A tokio mutex, held across connect: concurrent first callers queue here
    // and then all reuse the one session it produced.
    state: tokio::sync::Mutex<SlotState>,
    /// A reload replaced or removed this connection: no new session opens
    /// here, and operations go to the slot now in the pool.
    retired: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct SlotState {
    session: Option<Session>,
    failures: u32,
    retry_at: Option<Instant>,
    last_connect_error: Option<String>,
}

impl Slot {
    fn new(settings: Settings, pins: Option<&Pins>) -> Arc<Slot> {
        Slot::with_counters(settings, pins, Arc::default())
    }

    fn with_counters(
        settings: Settings,
        pins: Option<&Pins>,
        counters: Arc<ConnCounters>,
    ) -> Arc<Slot> {
        Arc::new(Slot {
            fingerprint: settings.fingerprint(),
            pinned: pins.map(|p| Arc::new(p.connection(&settings.id))),
            limits: limits::Limits::new(settings.limits),
            settings,
            counters,
            progress: Arc::default(),
            state: tokio::sync::Mutex::new(SlotState::default()),
            retired: Default::default(),
        })
    }

    /// The live session, connecting if there is none.
    async fn session(&self) -> Result<Session, PoolError> {
        let mut state = self.state.lock().await;
        if let Some(session) = &state.session {
            if session.is_alive() {
                return Ok(session.clone());
            }
            // Dead: its owner is already failing its callers and closing.
            state.session = None;
        }
        let connection = self.settings.id.to_string();
        if self.retired.load(Ordering::Acquire) {
            return Err(PoolError::SessionClosed {
                connection,
                reason: "the connection was changed or removed by a reload".into(),
            });
        }
        if let Some(retry_at) = state.retry_at {
            let now = Instant::now();
            if now < retry_at {
                return Err(PoolError::CircuitOpen {
                    connection,
                    failures: state.failures,
                    retry_in: retry_at - now,
                    last_error: state.last_connect_error.clone().unwrap_or_default(),
                });
            }
        }
        let connect = transport::connect(
            &self.settings,
            self.counters.clone(),
            self.progress.clone(),
            self.pinned.clone(),
        );
        let outcome = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!(
                "connect timed out after {}s",
                CONNECT_TIMEOUT.as_secs()
            )),
        };
        match outcome {
            Ok(session) if self.retired.load(Ordering::Acquire) => {
                // Retired while it connected: it closes, and the operation
                // goes to the connection's new slot.
                session.drain();
                Err(PoolError::SessionClosed {
                    connection,
                    reason: "the connection was changed or removed by a reload".into(),
                })
            }
            Ok(session) => {
                state.failures = 0;
                state.retry_at = None;
                state.session = Some(session.clone());
                tracing::info!(connection = %connection, pid = ?session.pid(), "session opened");
                Ok(session)
            }
            Err(detail) => {
                state.failures += 1;
                let delay = backoff(state.failures);
                state.retry_at = Some(Instant::now() + delay);
                state.last_connect_error = Some(detail.clone());
                self.counters.failures.fetch_add(1, Ordering::Relaxed);
                self.counters.set_last_error(&detail);
                tracing::warn!(connection = %connection, failures = state.failures, retry_in_ms = delay.as_millis() as u64, "connect failed: {detail}");
                Err(PoolError::ConnectFailed { connection, detail })
            }
        }
    }

    fn stats(&self) -> ConnectionStats {
        let c = &self.counters;
        let mut catalog = None;
        let mut notifications = None;
        let (state, pid) = match self.state.try_lock() {
            Ok(s) => match &s.session {
                Some(session) if session.is_alive() => {
                    catalog = Some(session.current_catalog());
                    notifications = Some(session.notifications());
                    ("ready", session.pid())
                }
                _ if s.retry_at.is_some_and(|t| Instant::now() < t) => ("circuit-open", None),
                Some(_) => ("closed", None),
                None => ("idle", None),
            },
            // Someone holds the lock across a connect.
            Err(_) => ("connecting", None),
        };
        ConnectionStats {
            id: self.settings.id.to_string(),
            transport: self.settings.transport_name(),
            state,
            fingerprint: self.fingerprint.clone(),
            sessions_opened: c.sessions_opened.load(Ordering::Relaxed),
            calls: c.calls.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
            replays: c.replays.load(Ordering::Relaxed),
            session_panics: c.session_panics.load(Ordering::Relaxed),
            in_flight: c.in_flight.load(Ordering::Relaxed),
            queued: self.limits.queued(),
            last_error: c
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            // The live catalog when there is one; else the last session's sizes.
            tools: catalog
                .as_ref()
                .map_or(c.tools.load(Ordering::Relaxed), |c| c.tools.len()),
            resources: catalog
                .as_ref()
                .map_or(c.resources.load(Ordering::Relaxed), |c| c.resources.len()),
            prompts: catalog
                .as_ref()
                .map_or(c.prompts.load(Ordering::Relaxed), |c| c.prompts.len()),
            pid,
            notifications,
            drifted: match (&catalog, &self.pinned) {
                (Some(catalog), Some(pinned)) => drift(catalog, pinned),
                _ => Vec::new(),
            },
        }
    }

    /// Drops `session` from the slot if it is still the current one, so the next
    /// caller connects afresh.
    async fn evict(&self, session: &Session) {
        let mut state = self.state.lock().await;
        if state.session.as_ref().is_some_and(|s| s.same(session)) {
            state.session = None;
        }
    }

    async fn take_session(&self) -> Option<Session> {
        self.state.lock().await.session.take()
    }
}

/// Exponential backoff with full jitter in the upper half: `[d/2, d]`.
fn backoff(failures: u32) -> Duration {
    let exp = BACKOFF_BASE.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    let capped = exp.min(BACKOFF_MAX);
    let half = capped / 2;
    half + half.mul_f64(rand::random::<f64>())
}

/// A tool's schema and the validator compiled from it.
type CompiledSchema = (Arc<JsonObject>, Arc<jsonschema::Validator>);

/// The shared pool. Cheap to clone; all clones share the sessions.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    config: PoolConfig,
    slots: Mutex<BTreeMap<String, Arc<Slot>>>,
    /// Sessions replaced by a settings change, draining; kept so shutdown can
    /// reap them too.
    retired: Mutex<Vec<Session>>,
    shut_down: std::sync::atomic::AtomicBool,
    /// The host is stopping: a call dropped now leaves its upstream task
    /// running, for the next start to follow.
    keep_tasks: Arc<std::sync::atomic::AtomicBool>,
    /// Compiled schemas by (connection, tool, `input`/`output`), with the
    /// schema they were compiled from: a refreshed catalog brings a new `Arc`
    /// and a recompile.
    validators: Mutex<HashMap<(String, String, &'static str), CompiledSchema>>,
}

impl Pool {
    /// A pool for `config.connections`. Nothing connects until first use.
    pub fn new(config: PoolConfig) -> Pool {
        // reqwest has rustls without a built-in provider: ring is installed
        // for the whole process (see `crate::tls`).
        crate::tls::install_tls_provider();
        let slots = config
            .connections
            .iter()
            .map(|(id, c)| {
                let settings = Settings::from_config(id, c, &config);
                (id.clone(), Slot::new(settings, config.pins.as_deref()))
            })
            .collect();
        Pool {
            inner: Arc::new(PoolInner {
                config,
                slots: Mutex::new(slots),
                retired: Mutex::default(),
                shut_down: Default::default(),
                keep_tasks: Arc::default(),
                validators: Mutex::default(),
            }),
        }
    }

    /// The configured connection ids.
    pub fn connections(&self) -> Vec<String> {
        self.slots().keys().cloned().collect()
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Slot>>> {
        self.inner.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn slot(&self, connection: &str) -> Result<Arc<Slot>, PoolError> {
        if self.inner.shut_down.load(Ordering::Acquire) {
            return Err(PoolError::ShutDown);
        }
        self.slots()
            .get(connection)
            .cloned()
            .ok_or_else(|| PoolError::UnknownConnection {
                connection: connection.to_owned(),
            })
    }

    /// Replaces the connection settings. Connections whose fingerprint changed
    /// get a new session on next use; their old session finishes its in-flight
    /// operations and closes. Unchanged connections keep their session.
    pub fn update(&self, connections: BTreeMap<String, ConnectionConfig>) {
        let mut slots = self.slots();
        let mut next = BTreeMap::new();
        for (id, c) in &connections {
            let settings = Settings::from_config(id, c, &self.inner.config);
            let fingerprint = settings.fingerprint();
            match slots.remove(id) {
                Some(slot) if slot.fingerprint == fingerprint => {
                    next.insert(id.clone(), slot);
                }
                Some(old) => {
                    // Same connection, new settings: counters carry over.
                    let counters = old.counters.clone();
                    self.retire(old);
                    let pins = self.inner.config.pins.as_deref();
                    next.insert(id.clone(), Slot::with_counters(settings, pins, counters));
                }
                None => {
                    let pins = self.inner.config.pins.as_deref();
                    next.insert(id.clone(), Slot::new(settings, pins));
                }
            }
        }
        for (_, old) in std::mem::take(&mut *slots) {
            self.retire(old);
        }
        *slots = next;
    }

    fn retire(&self, slot: Arc<Slot>) {
        // Set first: a connect under way finds it and drains what it made.
        slot.retired.store(true, Ordering::Release);
        if let Ok(mut state) = slot.state.try_lock()
            && let Some(session) = state.session.take()
        {
            session.drain();
            self.inner
                .retired
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(session);
        }
    }

    /// Runs `run` on `connection`'s session: the one way anything reaches an
    /// upstream. `operation` labels spans and status only.
    ///
    /// # Errors
    /// A [`PoolError`]; an HTTP session the server forgot is re-initialised and
    /// the operation replayed once before giving up.
    pub async fn execute(
        &self,
        connection: &str,
        operation: &'static str,
        timeout: Option<Duration>,
        run: OpFn,
    ) -> Result<Value, PoolError> {
        let slot = self.slot(connection)?;
        self.execute_on(&slot, operation, timeout, run, None, |_| Ok(()))
            .await
    }

    /// [`Pool::execute`] on `slot`, after `check` accepted the catalog of the
    /// session that will carry the operation: a refused operation sends
    /// nothing. `progress` restarts the timeout on every report.
    async fn execute_on(
        &self,
        slot: &Arc<Slot>,
        operation: &'static str,
        timeout: Option<Duration>,
        run: OpFn,
        progress: Option<watch::Receiver<u64>>,
        mut check: impl FnMut(&Catalog) -> Result<(), PoolError>,
    ) -> Result<Value, PoolError> {
        let mut slot = slot.clone();
        let id = slot.settings.id.clone();
        let connection = &*id;
        let timeout = timeout.unwrap_or(slot.settings.call_timeout);
        // A turn under the connection's limits first, within the request's
        // timeout; the request then gets its whole timeout (it is the window
        // progress reports restart). The wait counts against the run's own
        // time limit, which covers both.
        let _turn = slot.limits.turn(connection, timeout).await?;
        let mut replayed = false;
        let mut reroutes = 0;
        loop {
            // A reload replaced this connection's settings since the caller
            // looked it up (or while its session connected): the operation
            // goes to the slot in the pool now. Bounded, for reloads that
            // never stop.
            if slot.retired.load(Ordering::Acquire)
                && reroutes < MAX_REROUTES
                && let Ok(fresh) = self.slot(connection)
                && !Arc::ptr_eq(&fresh, &slot)
            {
                slot = fresh;
                reroutes += 1;
                continue;
            }
            let session = match slot.session().await {
                Err(PoolError::SessionClosed { .. })
                    if slot.retired.load(Ordering::Acquire) && reroutes < MAX_REROUTES =>
                {
                    reroutes += 1;
                    continue;
                }
                other => other?,
            };
            check(&session.current_catalog())?;
            let (reply, answer) = oneshot::channel();
            let op = Operation {
                meta: OpMeta {
                    operation,
                    connection: slot.settings.id.clone(),
                    seq: session::next_seq(),
                    submitted_at: Instant::now(),
                },
                run: run.clone(),
                timeout,
                progress: progress.clone(),
                reply,
            };
            let result = match session.submit(op) {
                Ok(()) => answer.await.unwrap_or_else(|_| {
                    Err(PoolError::SessionClosed {
                        connection: connection.to_owned(),
                        reason: "the session ended before answering".into(),
                    })
                }),
                // The session died between lookup and submit: the operation never
                // left the host, so a fresh session may take it.
                Err(reason) if !replayed => {
                    replayed = true;
                    tracing::debug!(connection, reason, "session gone before submit; retrying");
                    slot.evict(&session).await;
                    continue;
                }
                Err(reason) => Err(PoolError::SessionClosed {
                    connection: connection.to_owned(),
                    reason,
                }),
            };
            match result {
                // This very request was refused unprocessed by a server that
                // forgot us: replay it once. (The session's other in-flight
                // operations fail `SessionClosed`: they may have run.)
                Err(PoolError::Expired { .. }) if !replayed => {
                    replayed = true;
                    slot.counters.replays.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(connection, "server forgot the session; re-initialising");
                    // Its owner may not have noticed yet; never hand it out again.
                    slot.evict(&session).await;
                }
                other => return other,
            }
        }
    }

    /// From now on, a call dropped before its upstream task ended (its run
    /// stopped by a host shutdown) leaves the task running, for the next
    /// start to follow again; call this before stopping the runs.
    pub fn keep_tasks_on_stop(&self) {
        self.inner.keep_tasks.store(true, Ordering::Release);
    }

    /// Calls `tool` with `arguments`; the `CallToolResult` as JSON.
    ///
    /// # Errors
    /// A [`PoolError`]. A tool answering `isError` is `Ok`.
    pub async fn call_tool(
        &self,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
        timeout: Option<Duration>,
    ) -> Result<Value, PoolError> {
        self.call_tool_with(connection, tool, arguments, CallExtras::default(), timeout)
            .await
    }

    /// [`Pool::call_tool`] with request `_meta` (sent when not empty) and a
    /// progress sink. Before anything is sent, the tool is looked up in the
    /// live catalog of the session that will carry the call, checked against
    /// the lock (`wf.lock`) and its input schema; a `structuredContent` is
    /// checked against its output schema. The call carries a
    /// `progressToken`, and every progress report restarts its timeout.
    ///
    /// # Errors
    /// A [`PoolError`]. A tool answering `isError` is `Ok`.
    pub async fn call_tool_with(
        &self,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
        extras: CallExtras,
        timeout: Option<Duration>,
    ) -> Result<Value, PoolError> {
        let started = Instant::now();
        let result = self
            .call_tool_checked(connection, tool, arguments, extras, timeout)
            .await;
        let outcome = match &result {
            Ok(v) if v.get("isError").and_then(Value::as_bool) == Some(true) => "tool_error",
            Ok(_) => "ok",
            Err(PoolError::Timeout { .. } | PoolError::TooLong { .. }) => "timeout",
            Err(PoolError::Server { .. } | PoolError::InvalidOutput { .. }) => "server_error",
            Err(
                PoolError::NoSuchTool { .. }
                | PoolError::InvalidArguments { .. }
                | PoolError::NotPinned { .. }
                | PoolError::UnknownConnection { .. },
            ) => "refused",
            Err(_) => "unavailable",
        };
        crate::metrics::metrics().call_finished(connection, outcome, started.elapsed());
        result
    }

    async fn call_tool_checked(
        &self,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
        extras: CallExtras,
        timeout: Option<Duration>,
    ) -> Result<Value, PoolError> {
        let slot = self.slot(connection)?;
        let arguments = Value::Object(arguments);
        // The definition the call was checked against, for its output schema.
        let mut definition: Option<Tool> = None;
        let check = |catalog: &Catalog| {
            let Some(found) = catalog.tool(tool) else {
                return Err(PoolError::NoSuchTool {
                    connection: connection.to_owned(),
                    tool: tool.to_owned(),
                });
            };
            if let (Some(pinned), Some(live)) = (&slot.pinned, catalog.digest(tool)) {
                let check = pin::check(pinned, tool, live);
                if check != PinCheck::Pinned {
                    return Err(PoolError::NotPinned {
                        connection: connection.to_owned(),
                        tool: tool.to_owned(),
                        check,
                    });
                }
            }
            if let Some(problem) = self.check_arguments(connection, found, &arguments) {
                return Err(PoolError::InvalidArguments {
                    connection: connection.to_owned(),
                    tool: tool.to_owned(),
                    problem,
                });
            }
            definition = Some(found.clone());
            Ok(())
        };
        let Value::Object(arguments) = &arguments else {
            unreachable!("built as an object above")
        };
        let mut params =
            CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments.clone());
        if !extras.meta.is_empty() {
            params.meta = Some(rmcp::model::RequestMetaObject(rmcp::model::MetaObject(
                extras.meta,
            )));
        }
        let params = Arc::new(params);
        // rmcp gives the request its `progressToken`; reports for it come here.
        let (tick, progress) = watch::channel(0);
        let routes = slot.progress.clone();
        let sink = extras.progress;
        let tasks = TaskFollowing {
            ledger: extras.tasks,
            connection: slot.settings.id.clone(),
            keep: self.inner.keep_tasks.clone(),
            elicit: extras.elicit.zip(slot.settings.elicitation_timeout),
            timeout: timeout.unwrap_or(slot.settings.call_timeout),
        };
        let run: OpFn = Arc::new(move |peer| {
            let (routes, tick, sink) = (routes.clone(), tick.clone(), sink.clone());
            call_tool_routed(peer, (*params).clone(), routes, tick, sink, tasks.clone()).boxed()
        });
        let result = self
            .execute_on(&slot, "call_tool", timeout, run, Some(progress), check)
            .await?;
        if let Some(problem) = definition
            .as_ref()
            .and_then(|d| self.check_output(connection, d, &result))
        {
            return Err(PoolError::InvalidOutput {
                connection: connection.to_owned(),
                tool: tool.to_owned(),
                problem,
            });
        }
        Ok(result)
    }

    /// Reads `uri`; the `ReadResourceResult` as JSON.
    ///
    /// # Errors
    /// A [`PoolError`].
    pub async fn read_resource(&self, connection: &str, uri: &str) -> Result<Value, PoolError> {
        let uri: Arc<str> = uri.into();
        let run: OpFn = Arc::new(move |peer| {
            let params = ReadResourceRequestParams::new(uri.to_string());
            async move { to_json(peer.read_resource(params).await?) }.boxed()
        });
        self.execute(connection, "read_resource", None, run).await
    }

    /// Renders `prompt`; the `GetPromptResult` as JSON.
    ///
    /// # Errors
    /// A [`PoolError`].
    pub async fn get_prompt(
        &self,
        connection: &str,
        prompt: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, PoolError> {
        let prompt: Arc<str> = prompt.into();
        let arguments = Arc::new(arguments);
        let run: OpFn = Arc::new(move |peer| {
            let params = GetPromptRequestParams::new(prompt.to_string())
                .with_arguments((*arguments).clone());
            async move { to_json(peer.get_prompt(params).await?) }.boxed()
        });
        self.execute(connection, "get_prompt", None, run).await
    }

    /// The connection's live catalog, connecting first if needed.
    ///
    /// # Errors
    /// A [`PoolError`] when the connection cannot be established.
    pub async fn catalog(&self, connection: &str) -> Result<Arc<Catalog>, PoolError> {
        let slot = self.slot(connection)?;
        let session = slot.session().await?;
        let catalog = session.catalog().borrow().clone();
        Ok(catalog)
    }

    /// A receiver that sees every catalog refresh of the current session.
    ///
    /// # Errors
    /// As [`Pool::catalog`].
    pub async fn watch_catalog(
        &self,
        connection: &str,
    ) -> Result<watch::Receiver<Arc<Catalog>>, PoolError> {
        let slot = self.slot(connection)?;
        Ok(slot.session().await?.catalog())
    }

    /// The tools of `connection`, from the live catalog.
    ///
    /// # Errors
    /// As [`Pool::catalog`].
    pub async fn list_tools(&self, connection: &str) -> Result<Vec<Tool>, PoolError> {
        Ok(self.catalog(connection).await?.tools.clone())
    }

    /// The resources of `connection`, from the live catalog.
    ///
    /// # Errors
    /// As [`Pool::catalog`].
    pub async fn list_resources(&self, connection: &str) -> Result<Vec<Resource>, PoolError> {
        Ok(self.catalog(connection).await?.resources.clone())
    }

    /// The prompts of `connection`, from the live catalog.
    ///
    /// # Errors
    /// As [`Pool::catalog`].
    pub async fn list_prompts(&self, connection: &str) -> Result<Vec<Prompt>, PoolError> {
        Ok(self.catalog(connection).await?.prompts.clone())
    }

    /// Checks `arguments` against `tool`'s input schema. `Some(problem)` names the
    /// first failing field. A schema the server got wrong is logged and skipped,
    /// so it cannot block every call.
    pub fn check_arguments(
        &self,
        connection: &str,
        tool: &Tool,
        arguments: &Value,
    ) -> Option<String> {
        self.validate(connection, tool, "input", &tool.input_schema, arguments)
    }

    /// Checks the `structuredContent` of a successful `result` against `tool`'s
    /// output schema, as [`Pool::check_arguments`] does for input.
    pub fn check_output(&self, connection: &str, tool: &Tool, result: &Value) -> Option<String> {
        let schema = tool.output_schema.as_ref()?;
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            return None;
        }
        match result.get("structuredContent") {
            Some(structured) => self.validate(connection, tool, "output", schema, structured),
            None => Some("the tool declares an output schema but sent no structuredContent".into()),
        }
    }

    fn validate(
        &self,
        connection: &str,
        tool: &Tool,
        kind: &'static str,
        schema: &Arc<JsonObject>,
        value: &Value,
    ) -> Option<String> {
        let key = (connection.to_owned(), tool.name.to_string(), kind);
        let cached = self
            .inner
            .validators
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .filter(|(compiled_from, _)| Arc::ptr_eq(compiled_from, schema))
            .map(|(_, v)| v.clone());
        let validator = match cached {
            Some(v) => v,
            None => match jsonschema::validator_for(&Value::Object((**schema).clone())) {
                Ok(v) => {
                    let v = Arc::new(v);
                    self.inner
                        .validators
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key, (schema.clone(), v.clone()));
                    v
                }
                Err(e) => {
                    tracing::warn!(connection, tool = %tool.name, "unusable {kind} schema, not validating: {e}");
                    return None;
                }
            },
        };
        let error = validator.iter_errors(value).next()?;
        let path = error.instance_path().to_string();
        Some(if path.is_empty() {
            format!("{error}")
        } else {
            format!("`{path}`: {error}")
        })
    }

    /// A snapshot per connection.
    pub fn stats(&self) -> Vec<ConnectionStats> {
        self.slots().values().map(|s| s.stats()).collect()
    }

    /// One connection's snapshot.
    pub fn connection_stats(&self, connection: &str) -> Option<ConnectionStats> {
        self.slots().get(connection).map(|s| s.stats())
    }

    /// Closes every session and waits until each child process is reaped. Later
    /// operations fail with [`PoolError::ShutDown`].
    pub async fn shutdown(&self) {
        self.inner.shut_down.store(true, Ordering::Release);
        let slots: Vec<_> = self.slots().values().cloned().collect();
        let mut sessions: Vec<Session> =
            std::mem::take(&mut *self.inner.retired.lock().unwrap_or_else(|p| p.into_inner()));
        for slot in slots {
            if let Some(session) = slot.take_session().await {
                sessions.push(session);
            }
        }
        futures::future::join_all(sessions.iter().map(|s| s.close())).await;
    }
}

fn to_json(value: impl serde::Serialize) -> Result<Value, rmcp::ServiceError> {
    Ok(serde_json::to_value(value).unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(n: i64) -> ProgressToken {
        ProgressToken(rmcp::model::NumberOrString::Number(n))
    }

    #[test]
    fn a_finished_route_lingers_then_goes_and_a_live_one_stays() {
        let routes = Arc::new(ProgressRoutes::default());
        let (tick, ticks) = watch::channel(0);
        let live = routes.register(token(1), tick, None);
        let finished: Vec<_> = (2..=4)
            .map(|n| routes.register(token(n), watch::channel(0).0, None))
            .collect();
        drop(finished);
        assert_eq!(routes.len(), 4, "finished routes linger");

        std::thread::sleep(ROUTE_LINGER + Duration::from_millis(50));
        let next = routes.register(token(5), watch::channel(0).0, None);
        assert_eq!(
            routes.len(),
            2,
            "the lingered routes are gone; the live ones stay"
        );

        routes.deliver(
            &token(1),
            Progress {
                progress: 1.0,
                total: None,
                message: None,
            },
        );
        assert!(
            ticks.has_changed().unwrap(),
            "the live route still delivers"
        );
        drop((live, next));
    }
}
