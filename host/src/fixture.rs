//! A fixture MCP server for tests and for `wf-host fixture-server`.
//!
//! The server exposes a fixed set of tools, resources and prompts that make
//! client behaviour observable from the outside:
//!
//! - `echo`, `add`: plain request/response tools with structured content.
//! - `sleep`: honours `notifications/cancelled` and records the cancellation.
//! - `fail`: a tool-level error (`isError: true`).
//! - `crash`: exits the process mid-call, so the transport dies.
//! - `counter`: per-session state, to prove session reuse and isolation.
//! - `register_extra`: changes this session's tool list at runtime and sends
//!   `notifications/tools/list_changed`.
//! - `env`: the server's environment, to prove what a host passed it.
//! - `forget_session` (HTTP): later requests of this session get HTTP 404, as
//!   after a server restart, while requests already running finish.
//! - `call_log`: what this process received, to prove a call did (or did not)
//!   reach the server, and that a cancellation arrived; also the pings and
//!   `tools/list` pages served.
//!
//! Hostile modes, set through the environment (see [`FixtureOptions::with_env`]):
//! slow pings, and a `tools/list` that never stops paginating.
//!
//! Every MCP session (each `initialize`) gets its own [`ServerHandler`]
//! instance holding the per-session state; the state of the whole process (the
//! session numbering and the call log) lives in an [`Arc`] shared by all of
//! them.
//!
//! The server only logs through `tracing`; in stdio mode stdout carries nothing
//! but the protocol.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashSet},
    future::{Future, IntoFuture},
    path::Path,
    sync::{
        Arc, Mutex, MutexGuard, OnceLock, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use axum::response::IntoResponse as _;
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler, ServiceExt as _,
    handler::server::common::schema_for_empty_input,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
        DiscoverRequestMethod, DiscoverResult, GetPromptRequestParams, GetPromptResponse,
        GetPromptResult, Implementation, InitializeRequestParams, InitializeResult, JsonObject,
        ListPromptsResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
        ProgressNotificationParam, Prompt, PromptArgument, PromptMessage,
        ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
        ResourceContents, Role, ServerCapabilities, ServerConfig, Tool,
    },
    service::{RequestContext, ServerInitializeError},
    transport::{
        StreamableHttpServerConfig, StreamableHttpService,
        streamable_http_server::session::local::LocalSessionManager,
    },
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Environment variable that sets the `tools/list` page size (see
/// [`FixtureOptions::with_env`]).
pub const PAGE_SIZE_ENV: &str = "WF_FIXTURE_PAGE_SIZE";

/// Environment variable naming a file to which the server appends every tool
/// call as a JSON line (`{"tool", "arguments", "meta"}`): a witness that
/// outlives the process, for crash tests.
pub const WITNESS_ENV: &str = "WF_FIXTURE_WITNESS";

/// Environment variable that delays every `ping` answer by this many
/// milliseconds (see [`FixtureOptions::ping_delay`]).
pub const PING_DELAY_ENV: &str = "WF_FIXTURE_PING_DELAY_MS";

/// Environment variable that, set to `1`, makes `tools/list` paginate forever
/// (see [`FixtureOptions::endless_pages`]).
pub const ENDLESS_PAGES_ENV: &str = "WF_FIXTURE_ENDLESS_PAGES";

/// Environment variable that, set to `1`, makes every `tools/list` of a session
/// after its first one fail (see [`FixtureOptions::fail_relist`]).
pub const FAIL_RELIST_ENV: &str = "WF_FIXTURE_FAIL_RELIST";
/// `1`: over HTTP, refuse the standalone event stream (`GET` gets 405), so
/// the server can push nothing outside a request.
pub const NO_EVENT_STREAM_ENV: &str = "WF_FIXTURE_NO_EVENT_STREAM";

/// Exit status of the process when the `crash` tool is called.
pub const CRASH_EXIT_CODE: i32 = 3;

/// How long [`serve_http`] waits for open connections to drain after
/// `shutdown` resolves before it returns anyway.
const HTTP_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// SSE `retry` hint sent to HTTP clients.
const SSE_RETRY_HINT: Duration = Duration::from_millis(200);

/// The streamable HTTP header that carries the session id.
const SESSION_ID_HEADER: &str = "mcp-session-id";

/// URI of the plain-text fixture resource.
const GREETING_URI: &str = "fixture://greeting";
/// URI of the JSON fixture resource.
const CONFIG_URI: &str = "fixture://config.json";

/// Options for the fixture server.
#[derive(Debug, Clone, Default)]
pub struct FixtureOptions {
    /// Canned tool responses for this run: tool name -> CallToolResult JSON value. A canned
    /// tool is served instead of (or in addition to) the built-in tool of that name; its input
    /// schema is a permissive object schema unless a built-in of that name exists.
    pub canned: BTreeMap<String, Value>,
    /// Page size for `tools/list`, `resources/list` and `prompts/list`. `None` (the default)
    /// returns every item in one page.
    pub page_size: Option<usize>,
    /// Appends every tool call to this file (see [`WITNESS_ENV`]).
    pub witness: Option<std::path::PathBuf>,
    /// How long every `ping` takes to answer (a slow or wedged server).
    pub ping_delay: Option<Duration>,
    /// `tools/list` returns every tool on the first page and then empty pages,
    /// each with a new `nextCursor`, without end (a hostile server).
    pub endless_pages: bool,
    /// Each session's first `tools/list` works; every later one fails with an
    /// internal error (a server whose catalog refresh keeps failing).
    pub fail_relist: bool,
    /// HTTP: `GET /mcp` gets 405, so there is no standalone event stream.
    pub no_event_stream: bool,
}

impl FixtureOptions {
    /// Reads canned tool responses from a JSON object file mapping tool names to
    /// `CallToolResult` JSON values.
    ///
    /// Every value is checked to be a valid `CallToolResult` so a bad file fails
    /// here rather than on the first call.
    pub fn from_canned_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading canned responses from {}", path.display()))?;
        let canned: BTreeMap<String, Value> = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} must be a JSON object of tool name -> CallToolResult",
                path.display()
            )
        })?;
        let opts = Self {
            canned,
            ..Self::default()
        };
        opts.parse_canned()
            .with_context(|| format!("invalid canned responses in {}", path.display()))?;
        Ok(opts)
    }

    /// Default options with the environment applied (see [`Self::with_env`]).
    pub fn from_env() -> anyhow::Result<Self> {
        Self::default().with_env()
    }

    /// Fills unset options from the environment: `WF_FIXTURE_PAGE_SIZE` sets
    /// [`Self::page_size`] when it is `None`, `WF_FIXTURE_PING_DELAY_MS` sets
    /// [`Self::ping_delay`], `WF_FIXTURE_ENDLESS_PAGES=1` sets
    /// [`Self::endless_pages`] and `WF_FIXTURE_FAIL_RELIST=1` sets
    /// [`Self::fail_relist`].
    pub fn with_env(mut self) -> anyhow::Result<Self> {
        if self.ping_delay.is_none()
            && let Some(raw) = std::env::var_os(PING_DELAY_ENV)
        {
            let raw = raw.to_string_lossy();
            let ms: u64 = raw
                .trim()
                .parse()
                .with_context(|| format!("{PING_DELAY_ENV}={raw:?} is not a number of ms"))?;
            self.ping_delay = Some(Duration::from_millis(ms));
        }
        if std::env::var_os(ENDLESS_PAGES_ENV).is_some_and(|v| v == "1") {
            self.endless_pages = true;
        }
        if std::env::var_os(FAIL_RELIST_ENV).is_some_and(|v| v == "1") {
            self.fail_relist = true;
        }
        if std::env::var_os(NO_EVENT_STREAM_ENV).is_some_and(|v| v == "1") {
            self.no_event_stream = true;
        }
        if self.page_size.is_none()
            && let Some(raw) = std::env::var_os(PAGE_SIZE_ENV)
        {
            let raw = raw.to_string_lossy();
            let size: usize = raw
                .trim()
                .parse()
                .ok()
                .filter(|size| *size > 0)
                .with_context(|| format!("{PAGE_SIZE_ENV}={raw:?} is not a positive integer"))?;
            self.page_size = Some(size);
        }
        if self.witness.is_none() {
            self.witness = std::env::var_os(WITNESS_ENV).map(Into::into);
        }
        Ok(self)
    }

    /// Parses every canned value into a [`CallToolResult`].
    fn parse_canned(&self) -> anyhow::Result<BTreeMap<String, CallToolResult>> {
        self.canned
            .iter()
            .map(|(name, value)| {
                let result = serde_json::from_value(value.clone()).with_context(|| {
                    format!("canned response for tool {name:?} is not a CallToolResult")
                })?;
                Ok((name.clone(), result))
            })
            .collect()
    }
}

/// Serve MCP over stdin/stdout until the client closes stdin.
pub async fn serve_stdio(opts: FixtureOptions) -> anyhow::Result<()> {
    let shared = Shared::new(&opts)?;
    tracing::info!("fixture MCP server on stdio");
    // `stdio_pipes` keeps reads on the IO reactor when the client gave us pipes,
    // and falls back to tokio's blocking stdio otherwise.
    let running = match FixtureServer::new(shared)
        .serve(rmcp::transport::stdio_pipes())
        .await
    {
        Ok(running) => running,
        Err(ServerInitializeError::ConnectionClosed(context)) => {
            // A client that connects and leaves without a handshake is not an error
            // of the fixture.
            tracing::info!(%context, "stdin closed before the MCP handshake");
            return Ok(());
        }
        Err(error) => return Err(error).context("MCP handshake on stdio failed"),
    };
    let reason = running
        .waiting()
        .await
        .context("fixture server task failed")?;
    tracing::info!(?reason, "fixture MCP server on stdio stopped");
    Ok(())
}

/// Serve streamable HTTP MCP at `/mcp` on an already-bound listener until `shutdown` resolves.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    opts: FixtureOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let local_addr = listener
        .local_addr()
        .context("listener has no local address")?;
    let ct = CancellationToken::new();
    let router = http_router(opts, local_addr.ip(), ct.child_token())?;
    tracing::info!(%local_addr, "fixture MCP server on http://{local_addr}/mcp");
    let signal = {
        let ct = ct.clone();
        async move {
            shutdown.await;
            tracing::info!("fixture HTTP server shutting down");
            // Closing the sessions ends their SSE streams, so graceful shutdown
            // does not wait on them.
            ct.cancel();
        }
    };
    let server = axum::serve(listener, router)
        .with_graceful_shutdown(signal)
        .into_future();
    tokio::select! {
        result = server => result.context("fixture HTTP server failed")?,
        () = async {
            ct.cancelled().await;
            tokio::time::sleep(HTTP_SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!("fixture HTTP connections did not close in time; stopping anyway");
        }
    }
    Ok(())
}

/// The fixture's streamable HTTP MCP service at `/mcp`, for a server bound to
/// `ip` (also accepted as `Host`); `ct` closes its sessions. [`serve_http`]
/// serves it; tests may serve it behind TLS or an authorization check.
///
/// # Errors
/// When the options cannot be used (a canned file that does not parse).
pub fn http_router(
    opts: FixtureOptions,
    ip: std::net::IpAddr,
    ct: CancellationToken,
) -> anyhow::Result<axum::Router> {
    let shared = Shared::new(&opts)?;

    // rmcp only accepts loopback `Host` headers by default (DNS-rebinding guard);
    // also accept the address we are actually bound to.
    let mut allowed_hosts = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    if !ip.is_loopback() && !ip.is_unspecified() {
        allowed_hosts.push(ip.to_string());
    }

    // Legacy session mode (the default) gives each `initialize` its own session
    // and so its own handler from the factory below. The factory is also called
    // for other purposes (header validation, stateless requests), which is why
    // session numbers are assigned on `initialize`, not here.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(true)
        // rmcp clients wait max(this hint, their own retry policy) before resuming
        // a broken SSE stream; keep the hint from stretching their policy.
        .with_sse_retry(Some(SSE_RETRY_HINT))
        .with_allowed_hosts(allowed_hosts)
        .with_cancellation_token(ct);
    let forgetful = shared.clone();
    let service: StreamableHttpService<FixtureServer, LocalSessionManager> =
        StreamableHttpService::new(
            move || Ok(FixtureServer::new(shared.clone())),
            Arc::default(),
            config,
        );
    Ok(axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let shared = forgetful.clone();
                async move {
                    // A session `forget_session` dropped: what a restarted server says.
                    if shared.is_forgotten(request.headers()) {
                        return axum::http::StatusCode::NOT_FOUND.into_response();
                    }
                    if shared.no_event_stream && request.method() == axum::http::Method::GET {
                        return axum::http::StatusCode::METHOD_NOT_ALLOWED.into_response();
                    }
                    next.run(request).await
                }
            },
        )))
}

// ---------------------------------------------------------------------------
// Process-wide state
// ---------------------------------------------------------------------------

/// One received tool call, as reported by `call_log`.
#[derive(Debug, Clone)]
struct CallRecord {
    session: u64,
    tool: String,
    arguments: Value,
}

/// One tool call that was cancelled while it ran.
#[derive(Debug, Clone)]
struct CancelRecord {
    session: u64,
    tool: String,
}

#[derive(Debug, Default)]
struct CallLog {
    calls: Vec<CallRecord>,
    cancelled: Vec<CancelRecord>,
}

/// State shared by every session of one server.
#[derive(Debug)]
struct Shared {
    canned: BTreeMap<String, CallToolResult>,
    page_size: Option<usize>,
    ping_delay: Option<Duration>,
    endless_pages: bool,
    fail_relist: bool,
    no_event_stream: bool,
    /// Descriptions `set_description` gave tools, by tool name: every
    /// session of this process lists them.
    descriptions: Mutex<BTreeMap<String, String>>,
    pings_started: AtomicU64,
    pings_answered: AtomicU64,
    tools_list_requests: AtomicU64,
    /// HTTP session ids `forget_session` dropped; their requests get 404.
    forgotten: Mutex<HashSet<String>>,
    /// Number of sessions opened so far; also the last session number handed out.
    sessions: AtomicU64,
    log: Mutex<CallLog>,
    witness: Option<Mutex<std::fs::File>>,
}

impl Shared {
    fn new(opts: &FixtureOptions) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            canned: opts.parse_canned()?,
            page_size: opts.page_size.filter(|size| *size > 0),
            ping_delay: opts.ping_delay,
            endless_pages: opts.endless_pages,
            fail_relist: opts.fail_relist,
            no_event_stream: opts.no_event_stream,
            descriptions: Mutex::default(),
            pings_started: AtomicU64::new(0),
            pings_answered: AtomicU64::new(0),
            tools_list_requests: AtomicU64::new(0),
            forgotten: Mutex::default(),
            sessions: AtomicU64::new(0),
            log: Mutex::default(),
            witness: opts
                .witness
                .as_ref()
                .map(|path| {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .with_context(|| format!("opening witness file {}", path.display()))
                        .map(Mutex::new)
                })
                .transpose()?,
        }))
    }

    fn open_session(&self) -> u64 {
        let session = self.sessions.fetch_add(1, Ordering::SeqCst) + 1;
        tracing::info!(session, "fixture session opened");
        session
    }

    fn log(&self) -> MutexGuard<'_, CallLog> {
        // A panic elsewhere must not take the call log down with it.
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record_call(&self, session: u64, tool: &str, arguments: Value) {
        self.log().calls.push(CallRecord {
            session,
            tool: tool.to_owned(),
            arguments,
        });
    }

    fn record_cancel(&self, session: u64, tool: &str) {
        self.log().cancelled.push(CancelRecord {
            session,
            tool: tool.to_owned(),
        });
    }

    fn call_log_json(&self) -> Value {
        let log = self.log();
        let calls: Vec<Value> = log
            .calls
            .iter()
            .map(|c| json!({"session": c.session, "tool": c.tool, "arguments": c.arguments}))
            .collect();
        let cancelled: Vec<Value> = log
            .cancelled
            .iter()
            .map(|c| json!({"session": c.session, "tool": c.tool}))
            .collect();
        json!({
            "calls": calls,
            "cancelled": cancelled,
            "sessions": self.sessions.load(Ordering::SeqCst),
            "pings": {
                "started": self.pings_started.load(Ordering::SeqCst),
                "answered": self.pings_answered.load(Ordering::SeqCst),
            },
            "tools_list_requests": self.tools_list_requests.load(Ordering::SeqCst),
        })
    }

    fn forgotten(&self) -> MutexGuard<'_, HashSet<String>> {
        self.forgotten
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a request carries the id of a session `forget_session` dropped.
    fn is_forgotten(&self, headers: &axum::http::HeaderMap) -> bool {
        headers
            .get(SESSION_ID_HEADER)
            .and_then(|id| id.to_str().ok())
            .is_some_and(|id| self.forgotten().contains(id))
    }
}

// ---------------------------------------------------------------------------
// Tool definitions
// ---------------------------------------------------------------------------

/// Arguments of `echo`.
#[derive(Debug, Deserialize, JsonSchema)]
struct EchoArgs {
    /// Text to send back.
    text: String,
}

/// Arguments of `add`.
#[derive(Debug, Deserialize, JsonSchema)]
struct AddArgs {
    /// First addend.
    a: f64,
    /// Second addend.
    b: f64,
}

/// Arguments of `sleep`.
#[derive(Debug, Deserialize, JsonSchema)]
struct SleepArgs {
    /// How long to sleep, in milliseconds.
    ms: u64,
}

/// Arguments of `fail`.
#[derive(Debug, Deserialize, JsonSchema)]
struct FailArgs {
    /// Error message to return (default "fixture failure").
    #[serde(default)]
    message: Option<String>,
}

/// Arguments of `progress`.
#[derive(Debug, Deserialize, JsonSchema)]
struct ProgressArgs {
    /// How many progress reports to send.
    steps: u32,
    /// Milliseconds between reports.
    interval_ms: u64,
}

/// Arguments of `set_description`.
#[derive(Debug, Deserialize, JsonSchema)]
struct SetDescriptionArgs {
    /// The tool whose description changes.
    tool: String,
    description: String,
    /// Send notifications/tools/list_changed (default true).
    #[serde(default)]
    notify: Option<bool>,
}

/// Arguments of `shaped`.
#[derive(Debug, Deserialize, JsonSchema)]
struct ShapedArgs {
    /// Returned as structuredContent {"count": count}; the output schema wants
    /// an integer.
    count: Value,
}

/// Arguments of `extra`.
#[derive(Debug, Deserialize, JsonSchema)]
struct ExtraArgs {
    /// Text to include in the reply.
    #[serde(default)]
    text: Option<String>,
}

/// The built-in tools, in listing order. `extra` is listed only after
/// `register_extra` ran on the session.
fn builtin_tools() -> &'static [Tool] {
    static TOOLS: OnceLock<Vec<Tool>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        vec![
            Tool::new(
                "echo",
                "Returns `text` unchanged, as text and as structuredContent {\"text\": text}.",
                schema_for_empty_input(),
            )
            .with_input_schema::<EchoArgs>(),
            Tool::new(
                "add",
                "Adds two numbers; returns the sum as text and as structuredContent {\"sum\": a+b}.",
                schema_for_empty_input(),
            )
            .with_input_schema::<AddArgs>(),
            Tool::new(
                "sleep",
                "Waits `ms` milliseconds, then returns \"slept <ms>ms\". Stops early when the \
                 call is cancelled and records the cancellation in call_log.",
                schema_for_empty_input(),
            )
            .with_input_schema::<SleepArgs>(),
            Tool::new(
                "fail",
                "Returns a tool error (isError: true) with `message` (default \"fixture failure\").",
                schema_for_empty_input(),
            )
            .with_input_schema::<FailArgs>(),
            Tool::new(
                "crash",
                "Exits the server process immediately without answering.",
                schema_for_empty_input(),
            ),
            Tool::new(
                "counter",
                "Increments this session's counter and returns it as text and as \
                 structuredContent {\"count\": n, \"session\": s}.",
                schema_for_empty_input(),
            ),
            Tool::new(
                "register_extra",
                "Adds the tool `extra` to this session's tool list, sends \
                 notifications/tools/list_changed, then returns \"registered\".",
                schema_for_empty_input(),
            ),
            Tool::new(
                "env",
                "Returns this server's environment as structuredContent {\"env\": {name: value}}.",
                schema_for_empty_input(),
            ),
            Tool::new(
                "forget_session",
                "HTTP only: answers \"forgotten\", then every later request of this session \
                 gets HTTP 404 (requests already running finish).",
                schema_for_empty_input(),
            ),
            Tool::new(
                "progress",
                "Sends `steps` notifications/progress (to the request's progressToken), \
                 `interval_ms` apart, then returns \"done after <steps> steps\".",
                schema_for_empty_input(),
            )
            .with_input_schema::<ProgressArgs>(),
            Tool::new(
                "set_description",
                "Gives `tool` a new description in every session of this server process, \
                 and sends notifications/tools/list_changed unless `notify` is false.",
                schema_for_empty_input(),
            )
            .with_input_schema::<SetDescriptionArgs>(),
            Tool::new(
                "shaped",
                "Returns structuredContent {\"count\": count}; declares an output schema \
                 with an integer `count`, so a non-integer breaks it.",
                schema_for_empty_input(),
            )
            .with_input_schema::<ShapedArgs>()
            .with_raw_output_schema(shaped_output_schema()),
            Tool::new(
                "call_log",
                "Returns every tool call this server process received before this one (all \
                 sessions, call_log excluded), the cancelled calls and the number of sessions.",
                schema_for_empty_input(),
            ),
        ]
    })
}

/// The output schema of `shaped`.
fn shaped_output_schema() -> Arc<JsonObject> {
    let Value::Object(schema) = json!({
        "type": "object",
        "properties": {"count": {"type": "integer"}},
        "required": ["count"],
    }) else {
        unreachable!("an object literal")
    };
    Arc::new(schema)
}

/// The tool `register_extra` adds.
fn extra_tool() -> &'static Tool {
    static TOOL: OnceLock<Tool> = OnceLock::new();
    TOOL.get_or_init(|| {
        Tool::new(
            "extra",
            "Registered at runtime by register_extra; returns \"extra: <text>\".",
            schema_for_empty_input(),
        )
        .with_input_schema::<ExtraArgs>()
    })
}

/// Schema of a canned tool that has no built-in of the same name: any object.
fn permissive_schema() -> Arc<JsonObject> {
    let mut schema = JsonObject::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("additionalProperties".into(), json!(true));
    Arc::new(schema)
}

fn text_result(text: impl Into<String>, structured: Value) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(structured);
    result
}

/// Decodes tool arguments. Per MCP 2025-11-25 (SEP-1303), invalid input is a
/// tool execution error the model can read, not a protocol error.
fn parse_args<T: for<'de> Deserialize<'de>>(
    tool: &str,
    arguments: &Option<JsonObject>,
) -> Result<T, CallToolResult> {
    let value = Value::Object(arguments.clone().unwrap_or_default());
    serde_json::from_value(value).map_err(|error| {
        CallToolResult::error(vec![ContentBlock::text(format!(
            "invalid arguments for {tool}: {error}"
        ))])
    })
}

/// A number as JSON, integral when it is a whole number that fits exactly, so
/// `add {a: 2, b: 3}` yields `5` rather than `5.0`.
fn number_json(n: f64) -> Value {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if n.fract() == 0.0 && n.abs() <= EXACT {
        // Exact: whole and within the f64 integer range.
        json!(n as i64)
    } else {
        json!(n)
    }
}

/// Splits `items` into the page starting at `cursor`.
fn paginate<T>(
    mut items: Vec<T>,
    page_size: Option<usize>,
    cursor: Option<&str>,
) -> Result<(Vec<T>, Option<String>), McpError> {
    let start = match cursor {
        None => 0,
        Some(cursor) => cursor
            .parse::<usize>()
            .ok()
            .filter(|start| *start <= items.len())
            .ok_or_else(|| McpError::invalid_params(format!("invalid cursor {cursor:?}"), None))?,
    };
    let mut page = items.split_off(start);
    let next = match page_size {
        Some(size) if page.len() > size => {
            page.truncate(size);
            Some((start + size).to_string())
        }
        _ => None,
    };
    Ok((page, next))
}

// ---------------------------------------------------------------------------
// The handler: one instance per session
// ---------------------------------------------------------------------------

/// The fixture's [`ServerHandler`]; one instance per MCP session.
#[derive(Debug)]
struct FixtureServer {
    shared: Arc<Shared>,
    /// This session's number, assigned on `initialize` (or on first use for a
    /// client that skips the handshake).
    session: OnceLock<u64>,
    counter: AtomicU64,
    extra_registered: AtomicBool,
    /// `tools/list` requests this session got.
    tools_lists: AtomicU64,
}

impl FixtureServer {
    fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            session: OnceLock::new(),
            counter: AtomicU64::new(0),
            extra_registered: AtomicBool::new(false),
            tools_lists: AtomicU64::new(0),
        }
    }

    fn session(&self) -> u64 {
        *self.session.get_or_init(|| self.shared.open_session())
    }

    /// This session's tools, in listing order.
    fn tools(&self) -> Vec<Tool> {
        let extra = self.extra_registered.load(Ordering::SeqCst);
        let mut tools: Vec<Tool> = builtin_tools().to_vec();
        if extra {
            tools.push(extra_tool().clone());
        }
        let descriptions = self
            .shared
            .descriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for tool in &mut tools {
            if let Some(description) = descriptions.get(tool.name.as_ref()) {
                tool.description = Some(Cow::Owned(description.clone()));
            }
        }
        for name in self.shared.canned.keys() {
            if tools.iter().any(|tool| tool.name == name.as_str()) {
                continue;
            }
            if name == "extra" {
                // A canned `extra` is always listed, with the built-in schema.
                tools.push(extra_tool().clone());
                continue;
            }
            tools.push(Tool::new(
                Cow::Owned(name.clone()),
                "Canned fixture tool: returns a fixed result.",
                permissive_schema(),
            ));
        }
        tools
    }

    async fn run_tool(
        &self,
        session: u64,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let name = request.name.as_ref();
        if let Some(canned) = self.shared.canned.get(name) {
            return Ok(canned.clone());
        }
        let args = &request.arguments;
        match name {
            "echo" => Ok(match parse_args::<EchoArgs>(name, args) {
                Ok(EchoArgs { text }) => text_result(text.clone(), json!({"text": text})),
                Err(invalid) => invalid,
            }),
            "add" => Ok(match parse_args::<AddArgs>(name, args) {
                Ok(AddArgs { a, b }) => {
                    let sum = number_json(a + b);
                    text_result(sum.to_string(), json!({"sum": sum}))
                }
                Err(invalid) => invalid,
            }),
            "sleep" => {
                let ms = match parse_args::<SleepArgs>(name, args) {
                    Ok(SleepArgs { ms }) => ms,
                    Err(invalid) => return Ok(invalid),
                };
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(ms)) => {
                        Ok(CallToolResult::success(vec![ContentBlock::text(format!("slept {ms}ms"))]))
                    }
                    () = context.ct.cancelled() => {
                        tracing::info!(session, ms, "sleep cancelled");
                        self.shared.record_cancel(session, name);
                        // rmcp drops the response to a cancelled request; this is
                        // only seen if the cancellation came from shutdown.
                        Ok(CallToolResult::error(vec![ContentBlock::text("sleep cancelled")]))
                    }
                }
            }
            "fail" => Ok(match parse_args::<FailArgs>(name, args) {
                Ok(FailArgs { message }) => CallToolResult::error(vec![ContentBlock::text(
                    message.unwrap_or_else(|| "fixture failure".to_owned()),
                )]),
                Err(invalid) => invalid,
            }),
            "crash" => {
                tracing::warn!(session, "crash tool called: exiting");
                // Exit without answering: the client must see the transport die.
                std::process::exit(CRASH_EXIT_CODE);
            }
            "counter" => {
                let count = self.counter.fetch_add(1, Ordering::SeqCst) + 1;
                Ok(text_result(
                    count.to_string(),
                    json!({"count": count, "session": session}),
                ))
            }
            "register_extra" => {
                self.extra_registered.store(true, Ordering::SeqCst);
                // Awaiting the send means the notification is on the wire before
                // our result is produced, so the client sees it first.
                if let Err(error) = context.peer.notify_tool_list_changed().await {
                    tracing::warn!(session, %error, "could not send tools/list_changed");
                }
                Ok(CallToolResult::success(vec![ContentBlock::text(
                    "registered",
                )]))
            }
            "extra" if self.extra_registered.load(Ordering::SeqCst) => {
                Ok(match parse_args::<ExtraArgs>(name, args) {
                    Ok(ExtraArgs { text }) => CallToolResult::success(vec![ContentBlock::text(
                        format!("extra: {}", text.unwrap_or_default()),
                    )]),
                    Err(invalid) => invalid,
                })
            }
            "env" => {
                let env: BTreeMap<String, String> = std::env::vars_os()
                    .map(|(k, v)| {
                        (
                            k.to_string_lossy().into_owned(),
                            v.to_string_lossy().into_owned(),
                        )
                    })
                    .collect();
                let names: Vec<&String> = env.keys().collect();
                Ok(text_result(json!(names).to_string(), json!({"env": env})))
            }
            "forget_session" => {
                let id = context
                    .extensions
                    .get::<axum::http::request::Parts>()
                    .and_then(|parts| parts.headers.get(SESSION_ID_HEADER))
                    .and_then(|id| id.to_str().ok());
                let Some(id) = id else {
                    return Ok(CallToolResult::error(vec![ContentBlock::text(
                        "forget_session needs an HTTP session",
                    )]));
                };
                tracing::info!(session, id, "forgetting the session");
                self.shared.forgotten().insert(id.to_owned());
                Ok(CallToolResult::success(vec![ContentBlock::text(
                    "forgotten",
                )]))
            }
            "progress" => {
                let ProgressArgs { steps, interval_ms } = match parse_args(name, args) {
                    Ok(args) => args,
                    Err(invalid) => return Ok(invalid),
                };
                let token = context.meta.get_progress_token();
                for step in 1..=steps {
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(interval_ms)) => {}
                        () = context.ct.cancelled() => {
                            self.shared.record_cancel(session, name);
                            return Ok(CallToolResult::error(vec![ContentBlock::text("progress cancelled")]));
                        }
                    }
                    if let Some(token) = &token {
                        let mut note =
                            ProgressNotificationParam::new(token.clone(), f64::from(step))
                                .with_total(f64::from(steps));
                        note.message = Some(format!("step {step} of {steps}"));
                        if let Err(error) = context.peer.notify_progress(note).await {
                            tracing::warn!(session, %error, "could not send progress");
                        }
                    }
                }
                Ok(text_result(
                    format!("done after {steps} steps"),
                    json!({"steps": steps}),
                ))
            }
            "set_description" => {
                let SetDescriptionArgs {
                    tool,
                    description,
                    notify,
                } = match parse_args(name, args) {
                    Ok(args) => args,
                    Err(invalid) => return Ok(invalid),
                };
                self.shared
                    .descriptions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(tool, description);
                if notify.unwrap_or(true)
                    && let Err(error) = context.peer.notify_tool_list_changed().await
                {
                    tracing::warn!(session, %error, "could not send tools/list_changed");
                }
                Ok(CallToolResult::success(vec![ContentBlock::text(
                    "described",
                )]))
            }
            "shaped" => Ok(match parse_args::<ShapedArgs>(name, args) {
                Ok(ShapedArgs { count }) => text_result(count.to_string(), json!({"count": count})),
                Err(invalid) => invalid,
            }),
            "call_log" => {
                let log = self.shared.call_log_json();
                Ok(text_result(log.to_string(), log))
            }
            _ => Err(McpError::invalid_params(
                format!("unknown tool: {name}"),
                Some(json!({"tool": name})),
            )),
        }
    }
}

impl ServerHandler for FixtureServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_resources()
            .enable_prompts()
            .build();
        let mut info = ServerConfig::new(capabilities).with_instructions(
            "wf-host fixture server: deterministic tools, resources and prompts for tests.",
        );
        info.server_info = Implementation::new("wf-fixture", env!("CARGO_PKG_VERSION"));
        info
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        let session = self.session();
        tracing::debug!(session, client = ?request.client_info, "initialize");
        // What the default `initialize` does.
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    /// The fixture is a server of revision 2025-11-25, with `initialize` and
    /// sessions, which the pool's tests of HTTP sessions (404, replay) and
    /// per-session counters rely on: it refuses the 2026-07-28 probe as servers
    /// of earlier revisions do, and the client falls back to `initialize`.
    /// tests/interop.rs covers 2026-07-28 against the Python SDK.
    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        Err(McpError::method_not_found::<DiscoverRequestMethod>())
    }

    async fn ping(&self, context: RequestContext<RoleServer>) -> Result<(), McpError> {
        self.shared.pings_started.fetch_add(1, Ordering::SeqCst);
        if let Some(delay) = self.shared.ping_delay {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = context.ct.cancelled() => return Ok(()),
            }
        }
        self.shared.pings_answered.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.shared
            .tools_list_requests
            .fetch_add(1, Ordering::SeqCst);
        if self.tools_lists.fetch_add(1, Ordering::SeqCst) > 0 && self.shared.fail_relist {
            return Err(McpError::internal_error(
                format!("tools/list fails after the first ({FAIL_RELIST_ENV})"),
                None,
            ));
        }
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        if self.shared.endless_pages {
            // Page n+1 after page n, for ever; only the first one has tools.
            let (tools, page) = match cursor.and_then(|c| c.strip_prefix("endless-")) {
                None => (self.tools(), 1u64),
                Some(n) => (Vec::new(), n.parse::<u64>().unwrap_or(0) + 1),
            };
            return Ok(ListToolsResult {
                next_cursor: Some(format!("endless-{page}")),
                ..ListToolsResult::with_all_items(tools)
            });
        }
        let (tools, next_cursor) = paginate(self.tools(), self.shared.page_size, cursor)?;
        Ok(ListToolsResult {
            next_cursor,
            ..ListToolsResult::with_all_items(tools)
        })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let session = self.session();
        let name = request.name.to_string();
        tracing::debug!(session, tool = %name, "tools/call");
        // call_log reports the calls before it, not itself.
        if name != "call_log" {
            let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
            if let Some(witness) = &self.shared.witness {
                use std::io::Write as _;
                // `ppid`: which host process made the call (several hosts
                // may share one witness file).
                // SAFETY: getppid has no preconditions.
                let ppid = unsafe { libc::getppid() };
                let line = json!({"tool": name, "arguments": arguments, "meta": context.meta, "ppid": ppid});
                let mut file = witness.lock().unwrap_or_else(PoisonError::into_inner);
                // One write per line, so lines from concurrent calls never interleave.
                let _ = file.write_all(format!("{line}\n").as_bytes());
            }
            self.shared.record_call(session, &name, arguments);
        }
        self.run_tool(session, request, context)
            .await
            .map(CallToolResponse::from)
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let resources = vec![
            Resource::new(GREETING_URI, "greeting")
                .with_description("A plain-text greeting.")
                .with_mime_type("text/plain"),
            Resource::new(CONFIG_URI, "config.json")
                .with_description("A small JSON document.")
                .with_mime_type("application/json"),
        ];
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        let (resources, next_cursor) = paginate(resources, self.shared.page_size, cursor)?;
        Ok(ListResourcesResult {
            next_cursor,
            ..ListResourcesResult::with_all_items(resources)
        })
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let contents = match request.uri.as_str() {
            GREETING_URI => ResourceContents::text("hello from the fixture", GREETING_URI),
            CONFIG_URI => ResourceContents::text(json!({"answer": 42}).to_string(), CONFIG_URI)
                .with_mime_type("application/json"),
            uri => {
                // rmcp turns -32002 into -32602 for 2026-07-28 peers.
                return Err(McpError::resource_not_found(
                    format!("resource not found: {uri}"),
                    Some(json!({"uri": uri})),
                ));
            }
        };
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let prompts = vec![Prompt::new(
            "greet",
            Some("Asks the model to greet someone."),
            Some(vec![
                PromptArgument::new("name")
                    .with_description("Who to greet.")
                    .with_required(true),
            ]),
        )];
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        let (prompts, next_cursor) = paginate(prompts, self.shared.page_size, cursor)?;
        Ok(ListPromptsResult {
            next_cursor,
            ..ListPromptsResult::with_all_items(prompts)
        })
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        if request.name != "greet" {
            return Err(McpError::invalid_params(
                format!("unknown prompt: {}", request.name),
                Some(json!({"prompt": request.name})),
            ));
        }
        let name = request
            .arguments
            .as_ref()
            .and_then(|args| args.get("name"))
            .ok_or_else(|| {
                McpError::invalid_params("prompt greet: missing required argument `name`", None)
            })?
            .as_str()
            .ok_or_else(|| {
                McpError::invalid_params("prompt greet: argument `name` must be a string", None)
            })?;
        Ok(GetPromptResult::new(vec![PromptMessage::new_text(
            Role::User,
            format!("Say hello to {name}."),
        )])
        .with_description("Greet someone.")
        .into())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use rmcp::{
        ClientHandler, RoleClient,
        model::{CallToolRequest, ClientRequest, ErrorCode, PingRequest, ServerResult},
        service::{NotificationContext, PeerRequestOptions, RunningService, ServiceError},
        transport::StreamableHttpClientTransport,
    };
    use tokio::sync::Notify;

    use super::*;

    /// A client that counts `notifications/tools/list_changed`.
    #[derive(Clone, Default)]
    struct TestClient {
        list_changed: Arc<AtomicUsize>,
        notify: Arc<Notify>,
    }

    impl ClientHandler for TestClient {
        async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
            self.list_changed.fetch_add(1, Ordering::SeqCst);
            self.notify.notify_one();
        }
    }

    /// Starts one in-process session over a duplex pipe.
    async fn connect<C: ClientHandler>(
        shared: &Arc<Shared>,
        client: C,
    ) -> RunningService<RoleClient, C> {
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let server = FixtureServer::new(shared.clone());
        tokio::spawn(async move {
            match server.serve(server_io).await {
                Ok(running) => {
                    let _ = running.waiting().await;
                }
                Err(error) => panic!("fixture server failed to start: {error}"),
            }
        });
        client.serve(client_io).await.expect("client handshake")
    }

    fn shared(opts: FixtureOptions) -> Arc<Shared> {
        Shared::new(&opts).expect("valid options")
    }

    fn args(value: Value) -> JsonObject {
        match value {
            Value::Object(map) => map,
            other => panic!("arguments must be an object, got {other}"),
        }
    }

    async fn call(
        client: &RunningService<RoleClient, impl ClientHandler>,
        tool: &'static str,
        arguments: Value,
    ) -> CallToolResult {
        client
            .call_tool(CallToolRequestParams::new(tool).with_arguments(args(arguments)))
            .await
            .unwrap_or_else(|error| panic!("{tool} failed: {error}"))
    }

    fn text_of(result: &CallToolResult) -> &str {
        result
            .content
            .first()
            .and_then(|c| c.as_text())
            .map(|t| t.text.as_str())
            .expect("text content")
    }

    async fn call_log(client: &RunningService<RoleClient, impl ClientHandler>) -> Value {
        call(client, "call_log", json!({}))
            .await
            .structured_content
            .expect("call_log structured content")
    }

    #[tokio::test]
    async fn fixture_echo_add_fail() {
        let shared = shared(FixtureOptions::default());
        let client = connect(&shared, ()).await;

        let echo = call(&client, "echo", json!({"text": "hi there"})).await;
        assert_eq!(text_of(&echo), "hi there");
        assert_eq!(echo.structured_content, Some(json!({"text": "hi there"})));
        assert_ne!(echo.is_error, Some(true));

        let add = call(&client, "add", json!({"a": 2, "b": 3})).await;
        assert_eq!(text_of(&add), "5");
        assert_eq!(add.structured_content, Some(json!({"sum": 5})));
        let add = call(&client, "add", json!({"a": 0.5, "b": 0.25})).await;
        assert_eq!(add.structured_content, Some(json!({"sum": 0.75})));

        let fail = call(&client, "fail", json!({})).await;
        assert_eq!(fail.is_error, Some(true));
        assert_eq!(text_of(&fail), "fixture failure");
        let fail = call(&client, "fail", json!({"message": "boom"})).await;
        assert_eq!(fail.is_error, Some(true));
        assert_eq!(text_of(&fail), "boom");

        // Bad arguments are a tool error, an unknown tool a protocol error.
        let bad = call(&client, "echo", json!({"nope": 1})).await;
        assert_eq!(bad.is_error, Some(true));
        let unknown = client
            .call_tool(CallToolRequestParams::new("nope"))
            .await
            .expect_err("unknown tool must fail");
        match unknown {
            ServiceError::McpError(error) => assert_eq!(error.code, ErrorCode::INVALID_PARAMS),
            other => panic!("unexpected error: {other}"),
        }
        client.cancel().await.expect("client shutdown");
    }

    #[tokio::test]
    async fn fixture_capabilities_and_schemas() {
        let shared = shared(FixtureOptions::default());
        let client = connect(&shared, ()).await;
        let info = client.peer_info().expect("server info");
        assert_eq!(
            info.capabilities
                .tools
                .as_ref()
                .and_then(|t| t.list_changed),
            Some(true)
        );
        assert!(info.capabilities.resources.is_some());
        assert!(info.capabilities.prompts.is_some());

        // ping works on a handshake (legacy lifecycle) session.
        let pong = client
            .send_request(ClientRequest::PingRequest(PingRequest::default()))
            .await
            .expect("ping");
        assert!(matches!(pong, ServerResult::EmptyResult(_)), "{pong:?}");

        let tools = client.list_all_tools().await.expect("tools/list");
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "echo",
                "add",
                "sleep",
                "fail",
                "crash",
                "counter",
                "register_extra",
                "env",
                "forget_session",
                "progress",
                "set_description",
                "shaped",
                "call_log"
            ]
        );
        for tool in &tools {
            assert!(
                tool.description.is_some(),
                "{} has no description",
                tool.name
            );
            assert_eq!(tool.input_schema.get("type"), Some(&json!("object")));
        }
        let echo = &tools[0];
        assert_eq!(
            echo.input_schema.get("required"),
            Some(&json!(["text"])),
            "{:?}",
            echo.input_schema
        );
        client.cancel().await.expect("client shutdown");
    }

    #[tokio::test]
    async fn fixture_counter_is_per_session() {
        let shared = shared(FixtureOptions::default());
        let first = connect(&shared, ()).await;
        let second = connect(&shared, ()).await;

        let a1 = call(&first, "counter", json!({})).await;
        let a2 = call(&first, "counter", json!({})).await;
        let b1 = call(&second, "counter", json!({})).await;
        assert_eq!(text_of(&a2), "2");
        let session_a = a1.structured_content.as_ref().unwrap()["session"].clone();
        let session_b = b1.structured_content.as_ref().unwrap()["session"].clone();
        assert_ne!(session_a, session_b);
        assert_eq!(
            a2.structured_content,
            Some(json!({"count": 2, "session": session_a}))
        );
        assert_eq!(
            b1.structured_content,
            Some(json!({"count": 1, "session": session_b}))
        );
        // Sessions are numbered 1, 2, ... in handshake order.
        assert_eq!(session_a, json!(1));
        assert_eq!(session_b, json!(2));
        assert_eq!(call_log(&second).await["sessions"], json!(2));
        first.cancel().await.expect("client shutdown");
        second.cancel().await.expect("client shutdown");
    }

    #[tokio::test]
    async fn fixture_register_extra_notifies_and_lists() {
        let shared = shared(FixtureOptions::default());
        let handler = TestClient::default();
        let client = connect(&shared, handler.clone()).await;
        let other = connect(&shared, ()).await;

        let before = client.list_all_tools().await.expect("tools/list");
        assert!(!before.iter().any(|t| t.name == "extra"));
        // Not callable before registration.
        assert!(
            client
                .call_tool(CallToolRequestParams::new("extra"))
                .await
                .is_err()
        );

        let registered = call(&client, "register_extra", json!({})).await;
        assert_eq!(text_of(&registered), "registered");
        tokio::time::timeout(Duration::from_secs(5), handler.notify.notified())
            .await
            .expect("tools/list_changed notification");
        assert_eq!(handler.list_changed.load(Ordering::SeqCst), 1);

        let after = client.list_all_tools().await.expect("tools/list");
        assert_eq!(after.last().map(|t| t.name.as_ref()), Some("extra"));
        let extra = call(&client, "extra", json!({"text": "x"})).await;
        assert_eq!(text_of(&extra), "extra: x");

        // Other sessions are unaffected.
        let other_tools = other.list_all_tools().await.expect("tools/list");
        assert!(!other_tools.iter().any(|t| t.name == "extra"));
        client.cancel().await.expect("client shutdown");
        other.cancel().await.expect("client shutdown");
    }

    #[tokio::test]
    async fn fixture_tools_list_paginates() {
        let shared = shared(FixtureOptions {
            page_size: Some(2),
            ..FixtureOptions::default()
        });
        let client = connect(&shared, ()).await;

        let first = client.list_tools(None).await.expect("first page");
        assert_eq!(first.tools.len(), 2);
        let cursor = first.next_cursor.clone().expect("nextCursor on first page");
        let second = client
            .list_tools(Some(
                PaginatedRequestParams::default().with_cursor(Some(cursor)),
            ))
            .await
            .expect("second page");
        assert_eq!(second.tools.len(), 2);
        assert_ne!(first.tools[0].name, second.tools[0].name);

        let all = client.list_all_tools().await.expect("all pages");
        assert_eq!(all.len(), builtin_tools().len());
        assert_eq!(all.last().map(|t| t.name.as_ref()), Some("call_log"));

        let bad = client
            .list_tools(Some(
                PaginatedRequestParams::default().with_cursor(Some("garbage".into())),
            ))
            .await;
        assert!(bad.is_err());
        client.cancel().await.expect("client shutdown");
    }

    #[test]
    fn fixture_paginate_edges() {
        let items = vec![1, 2, 3, 4, 5];
        assert_eq!(
            paginate(items.clone(), None, None).unwrap(),
            (items.clone(), None)
        );
        assert_eq!(
            paginate(items.clone(), Some(2), None).unwrap(),
            (vec![1, 2], Some("2".into()))
        );
        assert_eq!(
            paginate(items.clone(), Some(2), Some("4")).unwrap(),
            (vec![5], None)
        );
        assert_eq!(
            paginate(items.clone(), Some(5), None).unwrap(),
            (items.clone(), None)
        );
        assert!(paginate(items.clone(), Some(2), Some("6")).is_err());
        assert!(paginate(items, Some(2), Some("-1")).is_err());
    }

    #[tokio::test]
    async fn fixture_resources_and_prompts() {
        let shared = shared(FixtureOptions::default());
        let client = connect(&shared, ()).await;

        let resources = client.list_all_resources().await.expect("resources/list");
        let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
        assert_eq!(uris, [GREETING_URI, CONFIG_URI]);

        let greeting = client
            .read_resource(ReadResourceRequestParams::new(GREETING_URI))
            .await
            .expect("read greeting");
        match &greeting.contents[..] {
            [
                ResourceContents::TextResourceContents {
                    text, mime_type, ..
                },
            ] => {
                assert_eq!(text, "hello from the fixture");
                assert_eq!(mime_type.as_deref(), Some("text/plain"));
            }
            other => panic!("unexpected contents {other:?}"),
        }
        let config = client
            .read_resource(ReadResourceRequestParams::new(CONFIG_URI))
            .await
            .expect("read config");
        match &config.contents[..] {
            [
                ResourceContents::TextResourceContents {
                    text, mime_type, ..
                },
            ] => {
                assert_eq!(
                    serde_json::from_str::<Value>(text).unwrap(),
                    json!({"answer": 42})
                );
                assert_eq!(mime_type.as_deref(), Some("application/json"));
            }
            other => panic!("unexpected contents {other:?}"),
        }
        match client
            .read_resource(ReadResourceRequestParams::new("fixture://nope"))
            .await
        {
            Err(ServiceError::McpError(error)) => {
                assert_eq!(error.code, ErrorCode::RESOURCE_NOT_FOUND)
            }
            other => panic!("unexpected result {other:?}"),
        }

        let prompts = client.list_all_prompts().await.expect("prompts/list");
        assert_eq!(prompts.len(), 1);
        assert_eq!(prompts[0].name, "greet");
        let mut params = GetPromptRequestParams::new("greet");
        params.arguments = Some(args(json!({"name": "Ada"})));
        let prompt = client.get_prompt(params).await.expect("prompts/get");
        assert_eq!(prompt.messages.len(), 1);
        assert_eq!(prompt.messages[0].role, Role::User);
        assert_eq!(
            prompt.messages[0]
                .content
                .as_text()
                .map(|t| t.text.as_str()),
            Some("Say hello to Ada.")
        );
        match client
            .get_prompt(GetPromptRequestParams::new("greet"))
            .await
        {
            Err(ServiceError::McpError(error)) => {
                assert_eq!(error.code, ErrorCode::INVALID_PARAMS)
            }
            other => panic!("unexpected result {other:?}"),
        }
        client.cancel().await.expect("client shutdown");
    }

    #[tokio::test]
    async fn fixture_call_log_records_calls() {
        let shared = shared(FixtureOptions::default());
        let first = connect(&shared, ()).await;
        let second = connect(&shared, ()).await;

        call(&first, "echo", json!({"text": "one"})).await;
        call(&second, "add", json!({"a": 1, "b": 2})).await;
        // call_log itself is not recorded.
        call_log(&first).await;
        let log = call_log(&second).await;
        assert_eq!(
            log["calls"],
            json!([
                {"session": 1, "tool": "echo", "arguments": {"text": "one"}},
                {"session": 2, "tool": "add", "arguments": {"a": 1, "b": 2}},
            ])
        );
        assert_eq!(log["cancelled"], json!([]));
        assert_eq!(log["sessions"], json!(2));
        first.cancel().await.expect("client shutdown");
        second.cancel().await.expect("client shutdown");
    }

    /// Polls `call_log` until `cancelled` has `want` entries.
    async fn wait_for_cancelled(
        client: &RunningService<RoleClient, impl ClientHandler>,
        want: usize,
    ) -> Value {
        for _ in 0..100 {
            let log = call_log(client).await;
            if log["cancelled"].as_array().map(Vec::len) == Some(want) {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("cancellation never reached the server");
    }

    #[tokio::test]
    async fn fixture_sleep_honours_cancellation() {
        let shared = shared(FixtureOptions::default());
        let client = connect(&shared, ()).await;

        let slept = call(&client, "sleep", json!({"ms": 10})).await;
        assert_eq!(text_of(&slept), "slept 10ms");

        // Explicit notifications/cancelled through the request handle.
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new("sleep").with_arguments(args(json!({"ms": 60_000}))),
        ));
        let handle = client
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
            .expect("send sleep");
        // Let the server start the call before cancelling it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        handle
            .cancel(Some("test".into()))
            .await
            .expect("send cancel");
        let log = wait_for_cancelled(&client, 1).await;
        assert_eq!(log["cancelled"], json!([{"session": 1, "tool": "sleep"}]));

        // Dropping the call future (a timeout) also cancels it.
        let abandoned = tokio::time::timeout(
            Duration::from_millis(50),
            client.call_tool(
                CallToolRequestParams::new("sleep").with_arguments(args(json!({"ms": 60_000}))),
            ),
        )
        .await;
        assert!(abandoned.is_err(), "sleep should not have finished");
        wait_for_cancelled(&client, 2).await;
        client.cancel().await.expect("client shutdown");
    }

    #[tokio::test]
    async fn fixture_canned_responses() {
        let mut canned = BTreeMap::new();
        canned.insert(
            "echo".to_owned(),
            json!({"content": [{"type": "text", "text": "canned echo"}]}),
        );
        canned.insert(
            "lookup".to_owned(),
            json!({
                "content": [{"type": "text", "text": "found"}],
                "structuredContent": {"id": 7},
            }),
        );
        let shared = shared(FixtureOptions {
            canned,
            ..FixtureOptions::default()
        });
        let client = connect(&shared, ()).await;

        let tools = client.list_all_tools().await.expect("tools/list");
        let echo = tools.iter().find(|t| t.name == "echo").expect("echo");
        // A canned built-in keeps the built-in schema.
        assert_eq!(echo.input_schema.get("required"), Some(&json!(["text"])));
        let lookup = tools.iter().find(|t| t.name == "lookup").expect("lookup");
        assert_eq!(
            lookup.input_schema.get("additionalProperties"),
            Some(&json!(true))
        );
        assert_eq!(
            tools.iter().filter(|t| t.name == "echo").count(),
            1,
            "canned built-in listed twice"
        );

        let result = call(&client, "echo", json!({"text": "ignored"})).await;
        assert_eq!(text_of(&result), "canned echo");
        let result = call(&client, "lookup", json!({"anything": [1, 2]})).await;
        assert_eq!(text_of(&result), "found");
        assert_eq!(result.structured_content, Some(json!({"id": 7})));

        let log = call_log(&client).await;
        assert_eq!(log["calls"][1]["tool"], json!("lookup"));
        assert_eq!(log["calls"][1]["arguments"], json!({"anything": [1, 2]}));
        client.cancel().await.expect("client shutdown");
    }

    #[test]
    fn fixture_options_from_canned_file() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.json");
        std::fs::write(
            &good,
            r#"{"weather": {"content": [{"type": "text", "text": "sunny"}], "isError": false}}"#,
        )
        .unwrap();
        let opts = FixtureOptions::from_canned_file(&good).expect("good file");
        assert_eq!(opts.canned.len(), 1);
        assert_eq!(opts.page_size, None);

        let not_object = dir.path().join("array.json");
        std::fs::write(&not_object, "[1, 2]").unwrap();
        assert!(FixtureOptions::from_canned_file(&not_object).is_err());

        let not_result = dir.path().join("bad.json");
        std::fs::write(&not_result, r#"{"weather": {"nonsense": 1}}"#).unwrap();
        let error = FixtureOptions::from_canned_file(&not_result).unwrap_err();
        assert!(format!("{error:#}").contains("weather"), "{error:#}");

        assert!(FixtureOptions::from_canned_file(&dir.path().join("missing.json")).is_err());
    }

    #[tokio::test]
    async fn fixture_over_http() {
        crate::pool::install_tls_provider();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(
            listener,
            FixtureOptions::default(),
            async move {
                let _ = stop_rx.await;
            },
        ));

        let uri = format!("http://{addr}/mcp");
        let handler = TestClient::default();
        let first = handler
            .clone()
            .serve(StreamableHttpClientTransport::from_uri(uri.clone()))
            .await
            .expect("first HTTP session");
        let second =
            ().serve(StreamableHttpClientTransport::from_uri(uri))
                .await
                .expect("second HTTP session");

        let echo = call(&first, "echo", json!({"text": "over http"})).await;
        assert_eq!(text_of(&echo), "over http");
        assert_eq!(echo.structured_content, Some(json!({"text": "over http"})));

        call(&first, "counter", json!({})).await;
        let a2 = call(&first, "counter", json!({})).await;
        let b1 = call(&second, "counter", json!({})).await;
        assert_eq!(
            a2.structured_content,
            Some(json!({"count": 2, "session": 1}))
        );
        assert_eq!(
            b1.structured_content,
            Some(json!({"count": 1, "session": 2}))
        );

        // list_changed also reaches an HTTP client.
        let registered = call(&first, "register_extra", json!({})).await;
        assert_eq!(text_of(&registered), "registered");
        tokio::time::timeout(Duration::from_secs(5), handler.notify.notified())
            .await
            .expect("tools/list_changed over HTTP");
        let tools = first.list_all_tools().await.expect("tools/list");
        assert!(tools.iter().any(|t| t.name == "extra"));

        let log = call_log(&second).await;
        assert_eq!(log["sessions"], json!(2));

        first.cancel().await.expect("client shutdown");
        second.cancel().await.expect("client shutdown");
        stop_tx.send(()).expect("server still running");
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("server stops after shutdown")
            .expect("server task")
            .expect("server result");
    }

    #[test]
    fn fixture_number_json() {
        assert_eq!(number_json(5.0), json!(5));
        assert_eq!(number_json(-3.0), json!(-3));
        assert_eq!(number_json(0.75), json!(0.75));
        assert_eq!(number_json(1e300), json!(1e300));
    }
}
