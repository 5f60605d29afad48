//! The `wf:node/capability` interface: the WIT-facing dispatch.
//!
//! This module is what a node sees. It decodes the guest's arguments, checks the
//! node's [`Grants`], hands each call to a [`CapabilityBackend`] (the MCP pool in production), and maps every
//! failure to the WIT `error` variant in one place ([`CapabilityError::to_wit`]).
//! It knows nothing about MCP sessions; the backend knows nothing about
//! WebAssembly.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};

mod durable;

use crate::bindings::wf::node::capability as wit;

use crate::grants::Grants;
use crate::trace;
pub use durable::{PENDING, RUN_WORKFLOW, SLEEP, WAIT_SIGNAL, Wait, is_pending};

/// Why a capability call failed. Each case becomes the WIT case of the same name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("denied: {0}")]
    Denied(String),
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    #[error("tool error: {0}")]
    ToolError(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("timeout: {0}")]
    Timeout(String),
}

impl CapabilityError {
    /// The WIT case name: `not-found`, `denied`, …
    pub fn code(&self) -> &'static str {
        match self {
            CapabilityError::NotFound(_) => "not-found",
            CapabilityError::Denied(_) => "denied",
            CapabilityError::InvalidArguments(_) => "invalid-arguments",
            CapabilityError::ToolError(_) => "tool-error",
            CapabilityError::Unavailable(_) => "unavailable",
            CapabilityError::Timeout(_) => "timeout",
        }
    }

    /// `{code, message}`: the error as journals and cassettes keep it.
    pub fn to_json(&self) -> Value {
        serde_json::json!({"code": self.code(), "message": self.message()})
    }

    /// The error [`CapabilityError::to_json`] gave; an unknown code is
    /// `unavailable`.
    pub fn from_json(error: &Value) -> CapabilityError {
        let message = error["message"].as_str().unwrap_or_default().to_owned();
        match error["code"].as_str().unwrap_or_default() {
            "not-found" => CapabilityError::NotFound(message),
            "denied" => CapabilityError::Denied(message),
            "invalid-arguments" => CapabilityError::InvalidArguments(message),
            "tool-error" => CapabilityError::ToolError(message),
            "timeout" => CapabilityError::Timeout(message),
            _ => CapabilityError::Unavailable(message),
        }
    }

    /// The message without the case prefix.
    pub fn message(&self) -> &str {
        match self {
            CapabilityError::NotFound(m)
            | CapabilityError::Denied(m)
            | CapabilityError::InvalidArguments(m)
            | CapabilityError::ToolError(m)
            | CapabilityError::Unavailable(m)
            | CapabilityError::Timeout(m) => m,
        }
    }

    /// The guest-visible form. This is the only place host errors cross into WIT.
    pub(crate) fn to_wit(&self) -> wit::Error {
        let m = self.message().to_owned();
        match self {
            CapabilityError::NotFound(_) => wit::Error::NotFound(m),
            CapabilityError::Denied(_) => wit::Error::Denied(m),
            CapabilityError::InvalidArguments(_) => wit::Error::InvalidArguments(m),
            CapabilityError::ToolError(_) => wit::Error::ToolError(m),
            CapabilityError::Unavailable(_) => wit::Error::Unavailable(m),
            CapabilityError::Timeout(_) => wit::Error::Timeout(m),
        }
    }
}

/// What kind of MCP item a capability is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CapabilityKind {
    Tool,
    Resource,
    Prompt,
}

/// One capability, as listed to nodes and RPC clients.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CapabilityEntry {
    /// `<connection>.<name>`; for resources `<connection>.<uri>`.
    pub name: String,
    pub kind: CapabilityKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Tool input schema, prompt arguments, or resource `{uri, mimeType}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
}

/// Where capability calls go. The MCP pool implements it; so does [`NoBackend`].
///
/// Results are MCP result JSON (`CallToolResult`, `ReadResourceResult`,
/// `GetPromptResult`). A tool result with `isError: true` is returned as `Ok`;
/// the dispatch turns it into `tool-error`.
#[async_trait]
pub trait CapabilityBackend: Send + Sync + 'static {
    /// Calls the tool `tool` on `connection`.
    async fn call_tool(
        &self,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError>;

    /// Reads `uri` from `connection`.
    async fn read_resource(&self, connection: &str, uri: &str) -> Result<Value, CapabilityError>;

    /// Renders the prompt `prompt` on `connection`.
    async fn get_prompt(
        &self,
        connection: &str,
        prompt: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError>;

    /// Every capability of every connection.
    async fn list(&self) -> Result<Vec<CapabilityEntry>, CapabilityError>;

    /// The capabilities of the connections `wanted` accepts. A backend should
    /// not even open a connection that `wanted` rejects; this default lists
    /// everything and filters.
    async fn list_connections(
        &self,
        wanted: &(dyn for<'c> Fn(&'c str) -> bool + Send + Sync),
    ) -> Result<Vec<CapabilityEntry>, CapabilityError> {
        let mut entries = self.list().await?;
        entries.retain(|e| e.name.split_once('.').is_some_and(|(c, _)| wanted(c)));
        Ok(entries)
    }
    /// [`CapabilityBackend::call_tool`] with request `_meta` (e.g. an
    /// idempotency key) and a sink for the server's progress reports.
    /// Backends that cannot send or report them ignore them.
    async fn call_tool_with(
        &self,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
        extras: CallExtras,
    ) -> Result<Value, CapabilityError> {
        let _ = extras;
        self.call_tool(connection, tool, arguments).await
    }
}

/// What a tool call carries besides its arguments.
#[derive(Clone, Default)]
pub struct CallExtras {
    /// Request `_meta` entries (sent when not empty).
    pub meta: Map<String, Value>,
    /// Gets each `notifications/progress` of the call. It runs on the
    /// session's task, so it must return at once.
    pub progress: Option<ProgressSink>,
    /// The call's idempotency key and where the upstream task it makes is
    /// kept: a call made again with the same key (its step run again after
    /// a restart) follows that task instead of calling the tool again.
    pub tasks: Option<(String, Arc<dyn TaskLedger>)>,
    /// Who answers a question the server asks during the call
    /// (elicitation). Without one, every question is declined.
    pub elicit: Option<Arc<dyn Elicitor>>,
}

/// A question an upstream server asks during a tool call (elicitation).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Question {
    pub connection: String,
    pub tool: String,
    /// `form`: answer with `content` matching `requested_schema`; `url`: a
    /// person completes it at `url` (never opened by the host).
    pub mode: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// The answer to a [`Question`]: `accept` (with `content` for a form),
/// `decline` or `cancel`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Answer {
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
}

impl Answer {
    pub fn decline() -> Answer {
        Answer {
            action: "decline".into(),
            content: None,
        }
    }
}

/// Fills the fields `content` leaves out with the `default` the requested
/// schema gives them (SEP-1034): a form left blank means its defaults.
pub fn apply_defaults(requested_schema: &Value, content: &mut Value) {
    let (Some(properties), Value::Object(content)) = (
        requested_schema
            .get("properties")
            .and_then(Value::as_object),
        content,
    ) else {
        return;
    };
    for (name, property) in properties {
        if let Some(default) = property.get("default")
            && !content.contains_key(name)
        {
            content.insert(name.clone(), default.clone());
        }
    }
}

/// Answers the questions servers ask during a run's calls.
#[async_trait]
pub trait Elicitor: Send + Sync {
    /// Asks `question` and waits (at most `within`) for its answer; no
    /// answer in time declines.
    async fn ask(&self, question: Question, within: std::time::Duration) -> Answer;
}

/// Where the upstream tasks of a run's calls are kept (the tasks
/// extension), by idempotency key.
#[async_trait]
pub trait TaskLedger: Send + Sync {
    /// The task a call with `key` made before, if any.
    async fn task_of(&self, key: &str) -> Option<String>;
    /// Keeps the task a call with `key` made on `connection`.
    async fn task_started(&self, key: &str, connection: &str, task_id: &str);
    /// Whether a call dropped before its task ended leaves the task running
    /// upstream: its step let go of its node while the task works, and
    /// follows the task on without it.
    fn keeps_task(&self) -> bool {
        false
    }
}

/// Where a call's progress reports go.
pub type ProgressSink = Arc<dyn Fn(Progress) + Send + Sync>;

/// One `notifications/progress` of a running call.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Progress {
    pub progress: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The `_meta` key of the idempotency key sent with every `tools/call` of a
/// workflow step: `<run_id>/<step_id>/<item>/<call_seq>`, the same on every
/// attempt, so servers can deduplicate.
pub const IDEMPOTENCY_META_KEY: &str = "wf-host/idempotency-key";

/// One capability call, as a journal records it.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalEntry {
    /// From 1, in the order the node made its calls.
    pub seq: u32,
    /// `<connection>.<name>`, or `<connection>.<uri>` for a resource.
    pub name: String,
    pub arguments: Value,
    /// `None` when the call succeeded.
    pub error_code: Option<&'static str>,
    pub duration: std::time::Duration,
    /// What the call answered: its result, or `{"error": {code, message}}`.
    pub result: Value,
}

/// A call answered without being made again ([`CallJournal::replayed`]).
#[derive(Debug, Clone)]
pub struct Replayed {
    pub result: Result<Value, CapabilityError>,
    /// Not in the journal yet (the call the node waited on): record it, as
    /// taking `duration`.
    pub record: Option<std::time::Duration>,
}

/// Where a run's capability calls are recorded (a workflow step attempt's
/// journal), and the prefix of their idempotency keys.
#[async_trait]
pub trait CallJournal: Send + Sync {
    /// `<run_id>/<step_id>/<item>`: a tool call's idempotency key is this plus
    /// `/<seq>`.
    fn key_prefix(&self) -> &str;
    /// Records a finished call. Called before the node sees the result.
    async fn record(&self, entry: JournalEntry);
    /// A call is about to be made (its arguments as the journal keeps them).
    fn calling(&self, seq: u32, name: &str, arguments: &Value) {
        let _ = (seq, name, arguments);
    }
    /// The answer this call already has, when the node runs again after it
    /// let go of its instance (see the engine's parking): the node's earlier
    /// calls, and the call it waited on, are answered without being made
    /// again. `None`: make the call.
    fn replayed(&self, seq: u32, name: &str, arguments: &Value) -> Option<Replayed> {
        let _ = (seq, name, arguments);
        None
    }
    /// The latest progress a running call reported. Must return at once.
    fn progress(&self, progress: Progress) {
        let _ = progress;
    }
    /// Where the upstream tasks of these calls are kept, if anywhere.
    fn tasks(&self) -> Option<Arc<dyn TaskLedger>> {
        None
    }
    /// Who answers the questions servers ask during these calls.
    fn elicitor(&self) -> Option<Arc<dyn Elicitor>> {
        None
    }
    /// The node waits (`wf:node/durable`) at its call `seq`: let go of it
    /// until `wait` is over, then run it again, answering this call with
    /// what the wait gave (a wait whose entry is `recorded` already, a
    /// sleep, is answered from the journal). Says whether it will: the node
    /// is then stopped, and its wait never returns.
    fn park(&self, seq: u32, name: &str, arguments: &Value, wait: Wait) -> Parks {
        let _ = (seq, name, arguments, wait);
        Parks::Unsupported
    }
    /// Where a durable node's reads of clocks and randomness are journaled,
    /// if anywhere.
    fn tape(&self) -> Option<Arc<dyn Tape>> {
        None
    }
}

/// A durable node's reads of the clocks and of its random seed, journaled
/// with its calls, so that its run after a wait or a crash reads what the
/// run before it read. Each read gives the journal's next value of its kind
/// while there is one, else `live` (which is then journaled).
pub trait Tape: Send + Sync {
    /// The wall clock, since the Unix epoch.
    fn wall(&self, live: std::time::Duration) -> std::time::Duration;
    /// The monotonic clock, in nanoseconds; never less than a value it
    /// gave before, also across runs.
    fn monotonic(&self, live: u64) -> u64;
    /// The seed of the node run's random numbers (both WASI generators and
    /// the insecure seed derive from it).
    fn seed(&self, live: [u8; 32]) -> [u8; 32];
}

/// Whether a journal lets go of a node that waits ([`CallJournal::park`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parks {
    /// The node is stopped and runs again when the wait is over.
    Yes,
    /// Not here (no workflow step): the node waits in place, or not at all.
    Unsupported,
    /// The node's journal is past its limit: it cannot be answered again.
    TooBig(String),
}

/// The backend used when no MCP connection is configured: every call is
/// `unavailable`, and the list is empty.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoBackend;

const NO_CONNECTIONS: &str =
    "no MCP connection is configured; add a [connections.<id>] table to the config";

#[async_trait]
impl CapabilityBackend for NoBackend {
    async fn call_tool(
        &self,
        _: &str,
        _: &str,
        _: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        Err(CapabilityError::Unavailable(NO_CONNECTIONS.into()))
    }
    async fn read_resource(&self, _: &str, _: &str) -> Result<Value, CapabilityError> {
        Err(CapabilityError::Unavailable(NO_CONNECTIONS.into()))
    }
    async fn get_prompt(
        &self,
        _: &str,
        _: &str,
        _: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        Err(CapabilityError::Unavailable(NO_CONNECTIONS.into()))
    }
    async fn list(&self) -> Result<Vec<CapabilityEntry>, CapabilityError> {
        Ok(Vec::new())
    }
}

/// A not-found error of a call on `connection` gets the tools there that
/// `grants` allow appended, so a typo is easy to fix without showing what was
/// not granted. Other results pass through.
pub async fn with_tool_hint(
    backend: &dyn CapabilityBackend,
    grants: &Grants,
    connection: &str,
    result: Result<Value, CapabilityError>,
) -> Result<Value, CapabilityError> {
    match result {
        Err(CapabilityError::NotFound(message)) => Err(CapabilityError::NotFound(
            granted_tools_hint(backend, grants, message, connection).await,
        )),
        other => other,
    }
}

async fn granted_tools_hint(
    backend: &dyn CapabilityBackend,
    grants: &Grants,
    message: String,
    connection: &str,
) -> String {
    const SHOWN: usize = 50;
    let Ok(entries) = backend.list_connections(&|c| c == connection).await else {
        return message;
    };
    let mut granted: Vec<_> = entries
        .iter()
        .filter(|e| e.kind == CapabilityKind::Tool && grants.allows(&e.name))
        .filter_map(|e| e.name.split_once('.').map(|(_, tool)| tool))
        .collect();
    if granted.is_empty() {
        return message;
    }
    granted.sort_unstable();
    let more = granted.len().saturating_sub(SHOWN);
    granted.truncate(SHOWN);
    let mut message = format!("{message}; granted tools on it: {}", granted.join(", "));
    if more > 0 {
        message.push_str(&format!(" and {more} more"));
    }
    message
}

/// Splits `<connection>.<name>` at the first dot. Connection ids contain no dot;
/// names may.
pub fn split_qualified(name: &str) -> Result<(&str, &str), CapabilityError> {
    match name.split_once('.') {
        Some((conn, item)) if !conn.is_empty() && !item.is_empty() => Ok((conn, item)),
        _ => Err(CapabilityError::InvalidArguments(format!(
            "`{name}` is not a qualified capability name; expected `<connection>.<name>`, e.g. `fixture.echo`"
        ))),
    }
}

/// Parses a guest's JSON arguments: an object, or empty text for `{}`.
pub fn parse_arguments(text: &str) -> Result<Map<String, Value>, CapabilityError> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(CapabilityError::InvalidArguments(format!(
            "arguments must be a JSON object, got {}",
            json_type_name(&other)
        ))),
        Err(e) => Err(CapabilityError::InvalidArguments(format!(
            "arguments are not valid JSON: {e}"
        ))),
    }
}

fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A `CallToolResult` with `isError: true` becomes `tool-error` carrying its text.
pub fn tool_result_to_outcome(result: Value) -> Result<Value, CapabilityError> {
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let text = result
            .get("content")
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(|c| c.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default();
        return Err(CapabilityError::ToolError(text));
    }
    Ok(result)
}

/// One `log` call from a node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LogRecord {
    pub level: &'static str,
    /// The node's text, cut to [`MAX_LOG_RECORD_BYTES`]; a cut record ends with
    /// `… [N more bytes truncated]`.
    pub message: String,
}

/// How many log records a run keeps.
pub const MAX_LOG_RECORDS: usize = 1000;
/// The longest message a log record keeps, in bytes.
pub const MAX_LOG_RECORD_BYTES: usize = 8 << 10;
/// How many message bytes a run's log records hold in all. Records past it are
/// counted, not kept, and do not reach `tracing` either.
pub const MAX_LOG_BYTES: usize = 1 << 20;

/// A run's log records, bounded in count, per record and in total.
#[derive(Debug, Default)]
pub struct LogBuffer {
    records: Vec<LogRecord>,
    bytes: usize,
    dropped: u64,
    dropped_bytes: u64,
}

impl LogBuffer {
    /// Keeps `message` (cut to [`MAX_LOG_RECORD_BYTES`]) if the run's budget
    /// allows, and returns what was kept, or `None` if the record was dropped.
    fn push(&mut self, level: &'static str, message: &str) -> Option<&LogRecord> {
        let kept = truncate_utf8(message.to_owned(), MAX_LOG_RECORD_BYTES);
        if self.records.len() >= MAX_LOG_RECORDS || self.bytes + kept.len() > MAX_LOG_BYTES {
            self.dropped += 1;
            self.dropped_bytes += message.len() as u64;
            return None;
        }
        self.bytes += kept.len();
        self.records.push(LogRecord {
            level,
            message: kept,
        });
        self.records.last()
    }

    /// The kept records; if any were dropped, a last `warn` record says how many.
    pub fn into_records(mut self) -> Vec<LogRecord> {
        if self.dropped > 0 {
            self.records.push(LogRecord {
                level: "warn",
                message: format!(
                    "[{} more log records ({} bytes) dropped: a run keeps at most {MAX_LOG_RECORDS} records and {MAX_LOG_BYTES} bytes]",
                    self.dropped, self.dropped_bytes
                ),
            });
        }
        self.records
    }
}

/// The length of `value` as compact JSON text (what `to_string` gives),
/// counted without building the text.
pub(crate) fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` into a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Cuts `text` to at most `cap` bytes at a character boundary, and says how
/// many bytes went: `… [N more bytes truncated]`.
pub(crate) fn truncate_utf8(mut text: String, cap: usize) -> String {
    if text.len() <= cap {
        return text;
    }
    let cut = text.floor_char_boundary(cap);
    let dropped = text.len() - cut;
    text.truncate(cut);
    text.push_str(&format!("… [{dropped} more bytes truncated]"));
    text
}

/// Per-run state behind the `capability` imports.
pub struct CapabilityCtx {
    pub(crate) backend: Arc<dyn CapabilityBackend>,
    pub(crate) grants: Arc<Grants>,
    pub(crate) run_id: Arc<str>,
    pub(crate) node: Arc<str>,
    pub(crate) logs: Arc<std::sync::Mutex<LogBuffer>>,
    pub(crate) journal: Option<Arc<dyn CallJournal>>,
    /// Capability calls made so far by this run.
    pub(crate) calls: std::sync::atomic::AtomicU32,
    /// The parent of each call's span (see [`crate::trace`]).
    pub(crate) span: tracing::Span,
}

impl CapabilityCtx {
    /// Grants are checked here, at the host boundary, before anything reaches
    /// the backend: a denied call causes no upstream traffic.
    fn check(&self, qualified: &str) -> Result<(), CapabilityError> {
        if self.grants.allows(qualified) {
            Ok(())
        } else {
            Err(CapabilityError::Denied(self.grants.denial(qualified)))
        }
    }

    async fn call_tool(&self, name: &str, arguments: &str) -> Result<Value, CapabilityError> {
        let (connection, tool) = name.split_once('.').unwrap_or(("", name));
        let span = trace::call_span(&self.span, "tool", connection, tool);
        let call_span = &span;
        let result = self
            .journaled(name, Some(arguments), |key| async move {
                let (connection, tool) = split_qualified(name)?;
                self.check(name)?;
                let arguments = parse_arguments(arguments)?;
                let mut extras = CallExtras::default();
                if let (Some(key), Some(journal)) = (key, &self.journal) {
                    if let Some(ledger) = journal.tasks() {
                        extras.tasks = Some((key.clone(), ledger));
                    }
                    extras.elicit = journal.elicitor();
                    extras
                        .meta
                        .insert(IDEMPOTENCY_META_KEY.into(), Value::String(key));
                    let journal = journal.clone();
                    extras.progress = Some(Arc::new(move |p| journal.progress(p)));
                }
                trace::inject(call_span, &mut extras.meta);
                let outcome = if extras.meta.is_empty()
                    && extras.progress.is_none()
                    && extras.tasks.is_none()
                    && extras.elicit.is_none()
                {
                    self.backend.call_tool(connection, tool, arguments).await
                } else {
                    self.backend
                        .call_tool_with(connection, tool, arguments, extras)
                        .await
                };
                with_tool_hint(&*self.backend, &self.grants, connection, outcome)
                    .await
                    .and_then(tool_result_to_outcome)
            })
            .await;
        trace::record_outcome(
            &span,
            result.as_ref().err().map(|e| (e.code(), e.message())),
        );
        result
    }

    async fn read_resource(&self, connection: &str, uri: &str) -> Result<Value, CapabilityError> {
        let span = trace::call_span(&self.span, "resource", connection, uri);
        let name = format!("{connection}.{uri}");
        let result = self
            .journaled(&name, None, |_| async {
                self.check(&name)?;
                self.backend.read_resource(connection, uri).await
            })
            .await;
        trace::record_outcome(
            &span,
            result.as_ref().err().map(|e| (e.code(), e.message())),
        );
        result
    }

    async fn get_prompt(&self, name: &str, arguments: &str) -> Result<Value, CapabilityError> {
        let (connection, prompt) = name.split_once('.').unwrap_or(("", name));
        let span = trace::call_span(&self.span, "prompt", connection, prompt);
        let result = self
            .journaled(name, Some(arguments), |_| async move {
                let (connection, prompt) = split_qualified(name)?;
                self.check(name)?;
                let arguments = parse_arguments(arguments)?;
                self.backend.get_prompt(connection, prompt, arguments).await
            })
            .await;
        trace::record_outcome(
            &span,
            result.as_ref().err().map(|e| (e.code(), e.message())),
        );
        result
    }

    /// Journals entry `seq` (a call, or a wait) with `result`.
    async fn record_entry(
        &self,
        seq: u32,
        name: &str,
        arguments: Value,
        result: &Result<Value, CapabilityError>,
        duration: std::time::Duration,
    ) {
        let Some(journal) = &self.journal else {
            return;
        };
        journal
            .record(JournalEntry {
                seq,
                name: name.to_owned(),
                arguments,
                error_code: result.as_ref().err().map(CapabilityError::code),
                duration,
                result: match result {
                    Ok(value) => value.clone(),
                    Err(e) => serde_json::json!({"error": e.to_json()}),
                },
            })
            .await;
    }

    /// The sequence number of the node's next call or wait.
    fn next_seq(&self) -> u32 {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1
    }

    /// Runs `call`, and when this run has a journal, records it there (denied
    /// and malformed calls too) with its sequence number. `call` gets the
    /// call's idempotency key, `<journal prefix>/<seq>`, when there is one.
    async fn journaled<F, Fut>(
        &self,
        name: &str,
        arguments: Option<&str>,
        call: F,
    ) -> Result<Value, CapabilityError>
    where
        F: FnOnce(Option<String>) -> Fut,
        Fut: Future<Output = Result<Value, CapabilityError>>,
    {
        let Some(journal) = &self.journal else {
            return call(None).await;
        };
        let seq = self.next_seq();
        let started = std::time::Instant::now();
        let arguments = arguments.map_or(Value::Null, |text| {
            serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
        });
        let (result, duration) = match journal.replayed(seq, name, &arguments) {
            Some(Replayed {
                result,
                record: None,
            }) => return result,
            Some(Replayed {
                result,
                record: Some(duration),
            }) => (result, duration),
            None => {
                journal.calling(seq, name, &arguments);
                let result = call(Some(format!("{}/{seq}", journal.key_prefix()))).await;
                (result, started.elapsed())
            }
        };
        self.record_entry(seq, name, arguments, &result, duration)
            .await;
        result
    }

    /// Only connections the grants could reach are listed (and so opened).
    async fn list(&self) -> Result<Vec<CapabilityEntry>, CapabilityError> {
        let grants = self.grants.clone();
        let mut entries = self
            .backend
            .list_connections(&move |c| grants.may_reach_connection(c))
            .await?;
        entries.retain(|e| self.grants.allows(&e.name));
        Ok(entries)
    }

    /// Keeps the record and returns the text to log, or `None` when the run's
    /// log budget is spent (the first such drop is logged once).
    fn record_log(&self, level: &'static str, message: &str) -> Option<String> {
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        match logs.push(level, message) {
            Some(kept) => Some(kept.message.clone()),
            None => {
                if logs.dropped == 1 {
                    tracing::warn!(target: "wf_host::node", run = %self.run_id, node = %self.node,
                        "log limit reached ({MAX_LOG_RECORDS} records or {MAX_LOG_BYTES} bytes); dropping this run's further log records");
                }
                None
            }
        }
    }
}

fn wit_result(result: Result<Value, CapabilityError>) -> Result<String, wit::Error> {
    result.map(|v| v.to_string()).map_err(|e| e.to_wit())
}

/// Most calls one `call-tools` makes at once.
pub const MAX_CALLS_AT_ONCE: usize = 64;

impl CapabilityCtx {
    /// `calls` made at once, each as [`CapabilityCtx::call_tool`] makes it;
    /// their results in the order of `calls`. Their sequence numbers (and
    /// so their idempotency keys and journal order) follow that order too:
    /// each call takes its number when first polled, and `join_all` polls
    /// them first in order.
    async fn call_tools(&self, calls: &[(String, String)]) -> Vec<Result<Value, CapabilityError>> {
        if calls.len() > MAX_CALLS_AT_ONCE {
            let refusal = CapabilityError::InvalidArguments(format!(
                "call-tools takes at most {MAX_CALLS_AT_ONCE} calls at once, not {}; none was made",
                calls.len()
            ));
            return vec![Err(refusal); calls.len()];
        }
        futures::future::join_all(
            calls
                .iter()
                .map(|(name, arguments)| CapabilityCtx::call_tool(self, name, arguments)),
        )
        .await
    }
}

impl wit::Host for CapabilityCtx {
    async fn call_tools(
        &mut self,
        calls: Vec<wit::ToolCall>,
    ) -> wasmtime::Result<Vec<Result<String, wit::Error>>> {
        let calls: Vec<(String, String)> =
            calls.into_iter().map(|c| (c.name, c.arguments)).collect();
        let results = CapabilityCtx::call_tools(self, &calls).await;
        tracing::debug!(run = %self.run_id, node = %self.node, calls = calls.len(),
            failed = results.iter().filter(|r| r.is_err()).count(), "call-tools");
        Ok(results.into_iter().map(wit_result).collect())
    }

    async fn call_tool(
        &mut self,
        name: String,
        arguments: String,
    ) -> wasmtime::Result<Result<String, wit::Error>> {
        let result = CapabilityCtx::call_tool(self, &name, &arguments).await;
        tracing::debug!(run = %self.run_id, node = %self.node, capability = %name, ok = result.is_ok(), "call-tool");
        Ok(wit_result(result))
    }

    async fn read_resource(
        &mut self,
        connection: String,
        uri: String,
    ) -> wasmtime::Result<Result<String, wit::Error>> {
        let result = CapabilityCtx::read_resource(self, &connection, &uri).await;
        tracing::debug!(run = %self.run_id, node = %self.node, %connection, %uri, ok = result.is_ok(), "read-resource");
        Ok(wit_result(result))
    }

    async fn get_prompt(
        &mut self,
        name: String,
        arguments: String,
    ) -> wasmtime::Result<Result<String, wit::Error>> {
        let result = CapabilityCtx::get_prompt(self, &name, &arguments).await;
        tracing::debug!(run = %self.run_id, node = %self.node, prompt = %name, ok = result.is_ok(), "get-prompt");
        Ok(wit_result(result))
    }

    async fn list_capabilities(
        &mut self,
    ) -> wasmtime::Result<Result<Vec<wit::CapabilityInfo>, wit::Error>> {
        let entries = match CapabilityCtx::list(self).await {
            Ok(entries) => entries,
            Err(e) => return Ok(Err(e.to_wit())),
        };
        Ok(Ok(entries
            .into_iter()
            .map(|e| wit::CapabilityInfo {
                name: e.name,
                kind: match e.kind {
                    CapabilityKind::Tool => wit::Kind::Tool,
                    CapabilityKind::Resource => wit::Kind::Resource,
                    CapabilityKind::Prompt => wit::Kind::Prompt,
                },
                description: e.description,
                schema: e.schema.map(|s| s.to_string()),
            })
            .collect()))
    }

    async fn log(&mut self, level: wit::Level, message: String) -> wasmtime::Result<()> {
        let (run, node) = (&*self.run_id, &*self.node);
        let name = match level {
            wit::Level::Trace => "trace",
            wit::Level::Debug => "debug",
            wit::Level::Info => "info",
            wit::Level::Warn => "warn",
            wit::Level::Error => "error",
        };
        let message = crate::secrets::redact(&message);
        let Some(message) = self.record_log(name, &message) else {
            return Ok(());
        };
        // A workflow step's logs are events of its span. The span is given,
        // never entered: a task spawned inside an entered span (a pool
        // session opened by the call) would hold it open.
        let parent = if self.span.is_none() {
            tracing::Span::current()
        } else {
            self.span.clone()
        };
        match level {
            wit::Level::Trace => {
                tracing::trace!(target: "wf_host::node", parent: &parent, run, node, "{message}")
            }
            wit::Level::Debug => {
                tracing::debug!(target: "wf_host::node", parent: &parent, run, node, "{message}")
            }
            wit::Level::Info => {
                tracing::info!(target: "wf_host::node", parent: &parent, run, node, "{message}")
            }
            wit::Level::Warn => {
                tracing::warn!(target: "wf_host::node", parent: &parent, run, node, "{message}")
            }
            wit::Level::Error => {
                tracing::error!(target: "wf_host::node", parent: &parent, run, node, "{message}")
            }
        }
        Ok(())
    }
}

/// Nodes built against `wf:node@0.1.0` get the same dispatch: its
/// functions are the current ones without `call-tools`, its types the same
/// shapes.
mod v0_1_0 {
    use super::{CapabilityCtx, wit};
    use crate::bindings::v0_1_0::wf::node::capability as old;

    fn error(e: wit::Error) -> old::Error {
        match e {
            wit::Error::NotFound(m) => old::Error::NotFound(m),
            wit::Error::Denied(m) => old::Error::Denied(m),
            wit::Error::InvalidArguments(m) => old::Error::InvalidArguments(m),
            wit::Error::ToolError(m) => old::Error::ToolError(m),
            wit::Error::Unavailable(m) => old::Error::Unavailable(m),
            wit::Error::Timeout(m) => old::Error::Timeout(m),
        }
    }

    impl old::Host for CapabilityCtx {
        async fn call_tool(
            &mut self,
            name: String,
            arguments: String,
        ) -> wasmtime::Result<Result<String, old::Error>> {
            Ok(wit::Host::call_tool(self, name, arguments)
                .await?
                .map_err(error))
        }

        async fn read_resource(
            &mut self,
            connection: String,
            uri: String,
        ) -> wasmtime::Result<Result<String, old::Error>> {
            Ok(wit::Host::read_resource(self, connection, uri)
                .await?
                .map_err(error))
        }

        async fn get_prompt(
            &mut self,
            name: String,
            arguments: String,
        ) -> wasmtime::Result<Result<String, old::Error>> {
            Ok(wit::Host::get_prompt(self, name, arguments)
                .await?
                .map_err(error))
        }

        async fn list_capabilities(
            &mut self,
        ) -> wasmtime::Result<Result<Vec<old::CapabilityInfo>, old::Error>> {
            let listed = wit::Host::list_capabilities(self).await?;
            Ok(listed.map_err(error).map(|entries| {
                entries
                    .into_iter()
                    .map(|e| old::CapabilityInfo {
                        name: e.name,
                        kind: match e.kind {
                            wit::Kind::Tool => old::Kind::Tool,
                            wit::Kind::Resource => old::Kind::Resource,
                            wit::Kind::Prompt => old::Kind::Prompt,
                        },
                        description: e.description,
                        schema: e.schema,
                    })
                    .collect()
            }))
        }

        async fn log(&mut self, level: old::Level, message: String) -> wasmtime::Result<()> {
            let level = match level {
                old::Level::Trace => wit::Level::Trace,
                old::Level::Debug => wit::Level::Debug,
                old::Level::Info => wit::Level::Info,
                old::Level::Warn => wit::Level::Warn,
                old::Level::Error => wit::Level::Error,
            };
            wit::Host::log(self, level, message).await
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn json_len_is_the_length_of_the_compact_text() {
        for value in [
            json!(null),
            json!("héllo \"quoted\" \u{1}"),
            json!({"a": [1, 2.5, -3], "b": {"c": true}, "é": "x".repeat(10_000)}),
        ] {
            assert_eq!(super::json_len(&value), value.to_string().len(), "{value}");
        }
    }

    #[test]
    fn apply_defaults_fills_only_what_is_left_out() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "John Doe"},
            "age": {"type": "integer", "default": 30},
            "note": {"type": "string"}
        }});
        let mut content = json!({"age": 41});
        super::apply_defaults(&schema, &mut content);
        assert_eq!(content, json!({"name": "John Doe", "age": 41}));
        // Not an object: left alone.
        let mut text = json!("x");
        super::apply_defaults(&schema, &mut text);
        assert_eq!(text, json!("x"));
    }
}
