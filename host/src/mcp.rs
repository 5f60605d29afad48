//! wf-host as an MCP server: every workflow marked `expose = true` is a tool,
//! and its runs are resources, so agents, IDEs and other hosts (another
//! wf-host among them) can discover and run workflows.
//!
//! - `tools/call` starts a run with the arguments as its input, waits for it,
//!   and answers its output as `structuredContent` (when it is an object) plus
//!   a text rendering; a failed or cancelled run is `isError: true` with the
//!   error code and message. The run id is in the result's
//!   `_meta["wf-host/run-id"]`.
//! - With a `progressToken`, each finished step sends `notifications/progress`
//!   (steps finished of the total, the step ids as the message).
//! - `notifications/cancelled` for the call cancels the run.
//! - `wf-host://runs/{run_id}` reads a run record (of an exposed workflow).
//! - When an exposed workflow has a wait step (`wait = "approve"`), the tool
//!   [`SIGNAL_TOOL`] sends a signal to one of its runs, as `workflow.signal`
//!   does: an agent (or a person in an MCP client) approves the run.
//! - A config reload that changes the exposed workflows sends
//!   `notifications/tools/list_changed` to every session.
//!
//! - A client that declares the tasks extension (`io.modelcontextprotocol/tasks`)
//!   gets a task from `tools/call` at once; see [`tasks`].
//! - While a run waits for a signal, a client that declared elicitation is
//!   asked (`elicitation/create`: approve or reject, with a comment), and its
//!   answer is the signal.
//!
//! Served over streamable HTTP at `/mcp` by `wf-host serve` (same listener and
//! token as `/rpc`), and over stdio by `wf-host mcp`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::model::{
    CancelTaskParams, ClientResult, ElicitRequest, GetTaskParams, GetTaskResult, InputRequest,
    InputRequiredResult, ServerNotification, ServerRequest, SubscriptionFilter,
    ToolListChangedNotification, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};

use crate::api::{ApiError, Runs, Start};
use crate::domain::StepStatus;
use crate::tokens::{Caller, RunScope};
use crate::workflow::{RunRecord, Status, WorkflowError, Workflows};

mod tasks;

/// The URI template of run records.
pub const RUN_URI_PREFIX: &str = "wf-host://runs/";
/// The `_meta` key of a tool result that names its run.
pub const RUN_ID_META_KEY: &str = "wf-host/run-id";
/// The tool that sends a signal to a run of an exposed workflow.
pub const SIGNAL_TOOL: &str = "signal";
/// How often a waiting call looks at its run, for progress.
const POLL: Duration = Duration::from_millis(100);

/// The MCP server of one host. Cheap to clone: every session shares the
/// workflows.
#[derive(Clone)]
pub struct WorkflowServer {
    workflows: Arc<Workflows>,
    /// Served over HTTP (`/mcp`), where the router's token check names the
    /// caller of every request; over stdio the client is local.
    over_http: bool,
}

impl WorkflowServer {
    pub fn new(workflows: Arc<Workflows>) -> WorkflowServer {
        WorkflowServer {
            workflows,
            over_http: false,
        }
    }

    /// Who sent a request: over HTTP, as the router's token check found (a
    /// request it did not see gets no scope at all); over stdio (`wf-host
    /// mcp`, a local client), a caller with every scope.
    pub(crate) fn caller_of(&self, context: &RequestContext<RoleServer>) -> Arc<Caller> {
        let found = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Arc<Caller>>().cloned());
        match found {
            Some(caller) => caller,
            None if self.over_http => Caller::nobody(),
            None => Caller::everything(),
        }
    }

    /// Whether an exposed workflow waits for signals: then the
    /// [`SIGNAL_TOOL`] is offered (unless a workflow has its name).
    fn offers_signal(&self) -> bool {
        let exposed = self.workflows.exposed();
        !exposed.iter().any(|w| w.name == SIGNAL_TOOL)
            && exposed.iter().any(|w| {
                self.workflows
                    .definition(&w.name)
                    .is_some_and(|d| d.spec.steps.iter().any(|s| s.waits()))
            })
    }

    fn signal_tool() -> Tool {
        let schema = json!({
            "type": "object",
            "properties": {
                "run_id": {"type": "string", "description": "The run, as a workflow tool's result names it (`_meta[\"wf-host/run-id\"]`)."},
                "signal": {"type": "string", "description": "The signal its wait step waits for, e.g. `approve`."},
                "payload": {"description": "The wait step's output, e.g. `{\"approved\": true, \"comment\": \"…\"}`."}
            },
            "required": ["run_id", "signal"],
            "additionalProperties": false
        });
        let serde_json::Value::Object(schema) = schema else {
            unreachable!("an object literal")
        };
        let mut tool = Tool::new(
            SIGNAL_TOOL,
            "Sends a signal to a waiting run of an exposed workflow (an approval, a reply); its payload becomes the waiting step's output.",
            Arc::new(schema),
        );
        tool.title = Some("Signal a waiting run".into());
        tool
    }

    /// The [`SIGNAL_TOOL`]: `workflow.signal` for runs of exposed workflows.
    async fn signal(
        &self,
        caller: &Caller,
        request: CallToolRequestParams,
    ) -> Result<CallToolResult, McpError> {
        let args = request.arguments.unwrap_or_default();
        let text = |key: &str| args.get(key).and_then(Value::as_str).map(str::to_owned);
        let (Some(run_id), Some(signal)) = (text("run_id"), text("signal")) else {
            return Err(McpError::invalid_params(
                "`run_id` and `signal` are required strings",
                None,
            ));
        };
        let payload = args.get("payload").cloned().unwrap_or(Value::Null);
        // Only runs this face offers: those of exposed workflows.
        let exposed = match self.workflows.get(&run_id, false).await {
            Ok(run) => self.workflows.exposed_workflow(&run.workflow).is_some(),
            Err(_) => false,
        };
        if !exposed {
            return Ok(error_result(
                None,
                format!("unknown-run: no run `{run_id}` of an exposed workflow"),
            ));
        }
        match self.runs().signal(caller, &run_id, &signal, payload).await {
            Ok(sent) => {
                let value = json!(sent);
                let mut result = CallToolResult::success(vec![ContentBlock::text(format!(
                    "signal `{signal}` sent to run `{run_id}` (step `{}`, {})",
                    sent.step, sent.delivery
                ))]);
                result.structured_content = Some(value);
                Ok(result)
            }
            Err(ApiError::Denied(refusal)) => Ok(error_result(None, format!("denied: {refusal}"))),
            Err(ApiError::Workflow(e @ WorkflowError::NotWaiting { .. })) => {
                Ok(error_result(Some(&run_id), format!("not-waiting: {e}")))
            }
            Err(ApiError::Workflow(e @ WorkflowError::InvalidPayload(_))) => {
                Ok(error_result(Some(&run_id), format!("invalid-payload: {e}")))
            }
            Err(e) => Err(McpError::internal_error(e.to_string(), None)),
        }
    }

    fn tools(&self) -> Vec<Tool> {
        let signal = self.offers_signal().then(Self::signal_tool);
        self.workflows
            .exposed()
            .iter()
            .map(|w| {
                let mut tool = Tool::new(
                    w.name.clone(),
                    w.description
                        .clone()
                        .unwrap_or_else(|| format!("Runs the workflow `{}`.", w.name)),
                    w.input_schema.clone(),
                );
                tool.title = w.title.clone();
                tool.output_schema = w.output_schema.clone();
                tool
            })
            .chain(signal)
            .collect()
    }

    /// The runs, as callers may see and move them.
    pub(crate) fn runs(&self) -> Runs<'_> {
        Runs::of(&self.workflows)
    }

    /// Checks that `caller` may `scope` the run `run_id`; a run that does not
    /// exist is left to the call to report.
    async fn may(&self, caller: &Caller, scope: RunScope, run_id: &str) -> Result<(), McpError> {
        self.runs()
            .may(caller, scope, run_id)
            .await
            .map_err(|e| match e {
                ApiError::Denied(refusal) => McpError::invalid_request(refusal, None),
                e => McpError::internal_error(e.to_string(), None),
            })
    }

    /// Runs `name` to the end; `Err` only for protocol errors (no such tool).
    async fn run_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.as_ref();
        let caller = self.caller_of(&context);
        if name == SIGNAL_TOOL && self.offers_signal() {
            return self
                .signal(&caller, request)
                .await
                .map(CallToolResponse::from);
        }
        let Some(exposed) = self.workflows.exposed_workflow(name) else {
            return Err(McpError::invalid_params(
                format!("unknown tool `{name}`"),
                Some(json!({"tool": name})),
            ));
        };
        let run_id = match &request.request_state {
            // A 2026-07-28 client back with the answers it was asked for
            // (`input_required`): the same run, on.
            Some(state) => {
                let run_id = open_state(name, state).ok_or_else(|| {
                    McpError::invalid_params(
                        "`requestState` is not one this server gave for this tool",
                        None,
                    )
                })?;
                // Answers are signals: the token must be allowed to send them.
                if let Err(e) = self.may(&caller, RunScope::Signal, &run_id).await {
                    return Ok(error_result(None, format!("denied: {}", e.message)).into());
                }
                let answered = self
                    .answer_round(name, &run_id, request.input_responses.as_ref())
                    .await?;
                if !answered {
                    return Ok(error_result(
                        Some(&run_id),
                        format!(
                            "cancelled: the question was cancelled; run `{run_id}` still waits: answer it with the `{SIGNAL_TOOL}` tool"
                        ),
                    )
                    .into());
                }
                run_id
            }
            None => {
                let input = Value::Object(request.arguments.unwrap_or_default());
                // A client's trace context in `_meta` is continued by the run.
                let parent = crate::trace::TraceParent::from_meta(&context.meta);
                match self
                    .runs()
                    .start(&caller, Start::new(name, input, &parent))
                    .await
                {
                    Ok(run) => run.run_id,
                    Err(e) => return start_error(e).map(Into::into),
                }
            }
        };
        // 2026-07-28 has no requests from server to client: a question goes
        // back as the call's `input_required` result instead.
        let asks_in_result = context
            .protocol_version()
            .is_some_and(|v| !v.has_initialize());
        let token = context.meta.get_progress_token();
        let mut reported = BTreeSet::new();
        let mut told_waiting = BTreeSet::new();
        // Questions put to the client, polled with the call (so they go out
        // on its stream) and ended with it.
        let elicits = context
            .client_capabilities()
            .is_some_and(|c| takes_form_elicitation(c.elicitation.as_ref()));
        let mut asks: futures::stream::FuturesUnordered<futures::future::BoxFuture<'static, ()>> =
            futures::stream::FuturesUnordered::new();
        let record = loop {
            let record = tokio::select! {
                () = context.ct.cancelled() => {
                    tracing::info!(run = %run_id, "the MCP client cancelled the call; cancelling the run");
                    if let Err(e) = self.workflows.cancel(&run_id).await {
                        tracing::warn!(run = %run_id, "cannot cancel: {e}");
                    }
                    // rmcp sends no response to a cancelled request.
                    return Err(McpError::internal_error("cancelled", None));
                }
                record = self.workflows.wait(&run_id, POLL) => record,
                Some(()) = futures::StreamExt::next(&mut asks), if !asks.is_empty() => continue,
            };
            let record = record.map_err(|e| McpError::internal_error(e.to_string(), None))?;
            if let Some(token) = &token {
                let finished: BTreeSet<String> = record
                    .steps
                    .iter()
                    .flatten()
                    .filter(|s| is_finished(s.status))
                    .map(|s| s.id.clone())
                    .collect();
                if finished.len() > reported.len() {
                    let new: Vec<&str> =
                        finished.difference(&reported).map(String::as_str).collect();
                    let mut note =
                        ProgressNotificationParam::new(token.clone(), finished.len() as f64)
                            .with_total(exposed.steps as f64);
                    note.message = Some(new.join(", "));
                    if let Err(e) = context.peer.notify_progress(note).await {
                        tracing::debug!(run = %run_id, "cannot send progress: {e}");
                    }
                    reported = finished;
                }
            }
            // A step that waits for a signal: say how to send it, and ask
            // the client when it takes questions.
            let waiting: Vec<&crate::workflow::StepRecord> = record
                .steps
                .iter()
                .flatten()
                .filter(|s| s.waits_for_signal())
                .collect();
            // Questions upstream servers ask the run's calls (forms only).
            let questions: Vec<Relayed> = record
                .steps
                .iter()
                .flatten()
                .flat_map(|s| s.questions.iter().map(move |q| (s, q)))
                .filter_map(|(s, q)| {
                    Some(Relayed {
                        params: question_request(&run_id, &s.id, &q.question)?,
                        signal: crate::workflow::answer_signal(&s.id, q.item),
                        asked_at: q.asked_at.clone(),
                        step: s.id.clone(),
                        item: q.item,
                    })
                })
                .collect();
            // A step whose answer is on its way is asked nothing more.
            let answered = if waiting.is_empty() && questions.is_empty() {
                Vec::new()
            } else {
                self.workflows
                    .kept_signals(&run_id)
                    .await
                    .unwrap_or_default()
            };
            let waiting: Vec<&crate::workflow::StepRecord> = waiting
                .into_iter()
                .filter(|s| {
                    let signal = s.waited_signal();
                    !signal.is_some_and(|n| answered.iter().any(|a| a == n))
                })
                .collect();
            let questions: Vec<Relayed> = questions
                .into_iter()
                .filter(|q| !answered.contains(&q.signal))
                .collect();
            if elicits && asks_in_result && !(waiting.is_empty() && questions.is_empty()) {
                let requests = waiting
                    .iter()
                    .map(|s| {
                        let request = ElicitRequest::new(tasks::approval_request(&run_id, s));
                        (s.id.clone(), InputRequest::Elicitation(request))
                    })
                    .chain(questions.into_iter().map(|q| {
                        let request = ElicitRequest::new(q.params);
                        (q.signal, InputRequest::Elicitation(request))
                    }))
                    .collect();
                let state = seal_state(name, &run_id);
                return Ok(InputRequiredResult::new(Some(requests), Some(state)).into());
            }
            if elicits && !asks_in_result {
                for q in questions {
                    // Each question once; a new one on the same step is asked.
                    if told_waiting.insert(format!("{}@{}", q.signal, q.asked_at)) {
                        asks.push(Box::pin(ask_question(
                            context.peer.clone(),
                            self.workflows.clone(),
                            run_id.clone(),
                            q,
                        )));
                    }
                }
            }
            for step in waiting {
                if !told_waiting.insert(step.id.clone()) {
                    continue;
                }
                if elicits && !asks_in_result {
                    asks.push(Box::pin(ask_client(
                        context.peer.clone(),
                        self.workflows.clone(),
                        run_id.clone(),
                        step.clone(),
                    )));
                }
                if let Some(token) = &token {
                    let signal = step.waited_signal().unwrap_or_default();
                    let mut note =
                        ProgressNotificationParam::new(token.clone(), reported.len() as f64)
                            .with_total(exposed.steps as f64);
                    note.message = Some(format!(
                        "step `{}` waits for signal `{signal}`: call the `{SIGNAL_TOOL}` tool with run_id `{run_id}`",
                        step.id
                    ));
                    if let Err(e) = context.peer.notify_progress(note).await {
                        tracing::debug!(run = %run_id, "cannot send progress: {e}");
                    }
                }
            }
            if record.status.is_finished() {
                break record;
            }
            if self.workflows.is_closing() {
                return Ok(error_result(
                    Some(&run_id),
                    format!(
                        "unavailable: the host is shutting down; run `{run_id}` resumes when it restarts"
                    ),
                )
                .into());
            }
        };
        Ok(tool_result(&exposed, record).into())
    }

    /// A round of `input_required` answered: the run's waiting steps get
    /// the answers (keyed by step id) as their signals. Says whether any
    /// answer was more than a `cancel`.
    async fn answer_round(
        &self,
        tool: &str,
        run_id: &str,
        answers: Option<&rmcp::model::InputResponses>,
    ) -> Result<bool, McpError> {
        let run = self
            .workflows
            .get(run_id, false)
            .await
            .ok()
            .filter(|run| run.workflow == tool)
            .ok_or_else(|| {
                McpError::invalid_params(format!("`requestState` names no run of `{tool}`"), None)
            })?;
        let Some(answers) = answers.filter(|a| !a.is_empty()) else {
            return Ok(true);
        };
        let all_cancelled = answers.values().all(|a| a["action"] == "cancel");
        self.answer_steps(&run, answers).await?;
        Ok(!all_cancelled)
    }

    async fn read_run(&self, uri: &str) -> Result<ReadResourceResult, McpError> {
        let not_found = || {
            McpError::resource_not_found(
                format!("resource not found: {uri}"),
                Some(json!({"uri": uri})),
            )
        };
        let run_id = uri.strip_prefix(RUN_URI_PREFIX).ok_or_else(not_found)?;
        let record = match self.workflows.get(run_id, false).await {
            Ok(record) => record,
            Err(WorkflowError::UnknownRun(_)) => return Err(not_found()),
            Err(e) => return Err(McpError::internal_error(e.to_string(), None)),
        };
        // Runs of workflows that are not exposed are not published either.
        if self.workflows.exposed_workflow(&record.workflow).is_none() {
            return Err(not_found());
        }
        let value = serde_json::to_value(&record).unwrap_or_default();
        let value = crate::secrets::redact_json(&value).unwrap_or(value);
        let text = value.to_string();
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(text, uri).with_mime_type("application/json"),
        ]))
    }
}

/// Resolves once the session's transport is gone.
async fn peer_closed(peer: &rmcp::Peer<RoleServer>) {
    while !peer.is_transport_closed() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Whether a client's elicitation capability takes form questions: `form`,
/// or neither mode named (which means form).
fn takes_form_elicitation(e: Option<&rmcp::model::ElicitationCapability>) -> bool {
    e.is_some_and(|e| e.form.is_some() || e.url.is_none())
}

/// The key that seals `requestState`: random, this process's.
fn state_key() -> &'static [u8; 32] {
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    KEY.get_or_init(rand::random)
}

/// `requestState` for a round of `tool` on run `run_id`: the run id and an
/// HMAC of both, so a client can only come back to the run it was asked
/// about.
fn seal_state(tool: &str, run_id: &str) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(state_key()).expect("any key length");
    mac.update(format!("{tool}\n{run_id}").as_bytes());
    format!("{run_id}.{}", hex::encode(mac.finalize().into_bytes()))
}

/// The run a sealed `requestState` of `tool` names, if it is one.
fn open_state(tool: &str, state: &str) -> Option<String> {
    use hmac::Mac;
    let (run_id, tag) = state.rsplit_once('.')?;
    let tag = hex::decode(tag).ok()?;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(state_key()).expect("any key length");
    mac.update(format!("{tool}\n{run_id}").as_bytes());
    mac.verify_slice(&tag).ok()?;
    Some(run_id.to_owned())
}

/// Asks the client (`elicitation/create`) to answer wait step `step` of
/// `run_id`, and sends its answer as the step's signal. Ends with the
/// answer, or when the client or the session goes away.
async fn ask_client(
    peer: rmcp::Peer<RoleServer>,
    workflows: Arc<Workflows>,
    run_id: String,
    step: crate::workflow::StepRecord,
) {
    let params = tasks::approval_request(&run_id, &step);
    let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
    let answer = match peer.send_request(request).await {
        Ok(ClientResult::ElicitResult(answer)) => answer,
        Ok(other) => {
            tracing::warn!(run = %run_id, "the client answered an elicitation with {other:?}");
            return;
        }
        Err(e) => {
            tracing::debug!(run = %run_id, "the client did not answer the elicitation: {e}");
            return;
        }
    };
    let Some(payload) = tasks::answer_payload(&answer) else {
        return;
    };
    let signal = step.waited_signal().unwrap_or_default();
    if let Err(e) = workflows.signal(&run_id, signal, payload).await {
        tracing::warn!(run = %run_id, step = %step.id, "the client's answer is not taken: {e}");
    }
}

/// The elicitation that relays a form question an upstream server asked
/// step `step_id` of `run_id`; `None` for a URL question or a schema MCP
/// clients cannot render.
fn question_request(
    run_id: &str,
    step_id: &str,
    question: &Value,
) -> Option<rmcp::model::ElicitRequestParams> {
    if question["mode"] != "form" {
        return None;
    }
    let schema = serde_json::from_value(question["requested_schema"].clone()).ok()?;
    Some(rmcp::model::ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: format!(
            "Run `{run_id}`, step `{step_id}`: `{}.{}` asks: {}",
            question["connection"].as_str().unwrap_or_default(),
            question["tool"].as_str().unwrap_or_default(),
            question["message"].as_str().unwrap_or_default()
        ),
        requested_schema: schema,
    })
}

/// A question an upstream server asked a step's call, as relayed to the
/// `/mcp` client.
struct Relayed {
    params: rmcp::model::ElicitRequestParams,
    /// `answer:<step>/<item>`: the key of its answer in an
    /// `input_required` round.
    signal: String,
    asked_at: String,
    step: String,
    item: u32,
}

/// Asks the client (`elicitation/create`) the question `q` and gives its
/// answer to `workflow.answer`.
async fn ask_question(
    peer: rmcp::Peer<RoleServer>,
    workflows: Arc<Workflows>,
    run_id: String,
    q: Relayed,
) {
    let Relayed {
        params,
        step: step_id,
        item,
        ..
    } = q;
    let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
    let answer = match peer.send_request(request).await {
        Ok(ClientResult::ElicitResult(answer)) => answer,
        Ok(other) => {
            tracing::warn!(run = %run_id, "the client answered an elicitation with {other:?}");
            return;
        }
        Err(e) => {
            tracing::debug!(run = %run_id, "the client did not answer the elicitation: {e}");
            return;
        }
    };
    if let Err(e) = workflows
        .answer(&run_id, &step_id, item, answer_of(&answer))
        .await
    {
        tracing::warn!(run = %run_id, step = %step_id, "the client's answer is not taken: {e}");
    }
}

/// The step and item an `answer:<step>/<item>` key names.
pub(crate) fn parse_answer_key(key: &str) -> Option<(String, u32)> {
    let (step, item) = key.strip_prefix("answer:")?.rsplit_once('/')?;
    Some((step.to_owned(), item.parse().ok()?))
}

/// An MCP client's elicitation result as a [`crate::workflow::Answer`].
pub(crate) fn answer_of(answer: &rmcp::model::ElicitResult) -> crate::workflow::Answer {
    let action = match answer.action {
        rmcp::model::ElicitationAction::Accept => "accept",
        rmcp::model::ElicitationAction::Cancel => "cancel",
        _ => "decline",
    };
    crate::workflow::Answer {
        action: action.to_owned(),
        content: (action == "accept")
            .then(|| answer.content.clone())
            .flatten(),
    }
}

fn is_finished(status: StepStatus) -> bool {
    status.is_finished()
}

fn error_result(run_id: Option<&str>, text: String) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    if let Some(run_id) = run_id {
        result.meta = Some(run_meta(run_id));
    }
    result
}

fn run_meta(run_id: &str) -> rmcp::model::MetaObject {
    let mut meta = rmcp::model::MetaObject::default();
    meta.0.insert(RUN_ID_META_KEY.into(), json!(run_id));
    meta
}

/// A finished run as a tool result.
fn tool_result(exposed: &crate::workflow::Exposed, record: RunRecord) -> CallToolResult {
    // Known secrets never leave in an answer, whatever a run holds (one
    // stored before a reload named the secret, too).
    let record = redacted(record);
    let run_id = record.run_id.as_str();
    if record.status != Status::Succeeded {
        let (code, message) = record
            .error
            .as_ref()
            .map(|f| (f.code.as_str(), f.message.as_str()))
            .unwrap_or(("failed", "the run did not succeed"));
        return error_result(
            Some(run_id),
            format!(
                "run `{run_id}` {}: {code}: {message}",
                record.status.as_str()
            ),
        );
    }
    let output = record.output.unwrap_or(Value::Null);
    if let Some(problem) = exposed.check_output(&output) {
        return error_result(
            Some(run_id),
            format!(
                "run `{run_id}`: the output does not match the workflow's output_schema: {problem}"
            ),
        );
    }
    let text = match &output {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    if output.is_object() {
        result.structured_content = Some(output);
    }
    result.meta = Some(run_meta(run_id));
    result
}

impl ServerHandler for WorkflowServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_resources()
            .enable_tasks()
            .build();
        let mut info = ServerConfig::new(capabilities).with_instructions(
            "wf-host: each tool runs a workflow to the end and returns its output. \
             Runs are resources at wf-host://runs/{run_id}.",
        );
        info.server_info = Implementation::new("wf-host", env!("CARGO_PKG_VERSION"));
        info
    }

    /// Tells this client when a config reload changes the tools, until the
    /// session or the host ends.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let mut changes = self.workflows.watch_exposed();
        let closing = self.workflows.closing_token();
        let peer = context.peer;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() || peer.notify_tool_list_changed().await.is_err() {
                            return;
                        }
                    }
                    () = closing.cancelled() => return,
                    () = peer_closed(&peer) => return,
                }
            }
        });
    }

    /// 2026-07-28 clients hear of tool changes on `subscriptions/listen`.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        (requested.tools_list_changed == Some(true))
            .then(|| SubscriptionFilter::builder().tools_list_changed().build())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let mut changes = self.workflows.watch_exposed();
        let closing = self.workflows.closing_token();
        loop {
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    let notification = ServerNotification::ToolListChangedNotification(
                        ToolListChangedNotification::default(),
                    );
                    if context.sink().send(notification).await.is_err() {
                        return Ok(());
                    }
                }
                () = closing.cancelled() => return Ok(()),
                () = context.cancelled() => return Ok(()),
            }
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        // A token sees the workflows it may start.
        let caller = self.caller_of(&context);
        let mut tools = self.tools();
        tools.retain(|t| {
            (t.name == SIGNAL_TOOL && self.offers_signal()) || caller.may(RunScope::Start, &t.name)
        });
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // A client that takes tasks gets one for a workflow, at once.
        let takes_tasks = context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        let is_workflow = !(request.name == SIGNAL_TOOL && self.offers_signal())
            && self.workflows.exposed_workflow(&request.name).is_some();
        // A token's `start` scope is checked where the run starts.
        // A round of `input_required` (`requestState`) goes on its call.
        if takes_tasks && is_workflow && request.request_state.is_none() {
            return self.start_task(request, &context).await;
        }
        self.run_tool(request, context).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        self.may(&self.caller_of(&context), RunScope::Read, &request.task_id)
            .await?;
        self.get_task_of(&request.task_id).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.may(
            &self.caller_of(&context),
            RunScope::Signal,
            &request.task_id,
        )
        .await?;
        self.update_task_of(&request.task_id, &request.input_responses)
            .await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.may(
            &self.caller_of(&context),
            RunScope::Cancel,
            &request.task_id,
        )
        .await?;
        self.cancel_task_of(&request.task_id).await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::default())
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let mut template = ResourceTemplate::new(format!("{RUN_URI_PREFIX}{{run_id}}"), "run");
        template.description =
            Some("A run of an exposed workflow: status, input, output, error and steps.".into());
        template.mime_type = Some("application/json".into());
        Ok(ListResourceTemplatesResult::with_all_items(vec![template]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        if let Some(run_id) = request.uri.strip_prefix(RUN_URI_PREFIX) {
            self.may(&self.caller_of(&context), RunScope::Read, run_id)
                .await?;
        }
        self.read_run(&request.uri).await.map(Into::into)
    }
}

/// A workflow that did not start, as the tool call's answer: bad arguments
/// and a refused token are a tool execution error the model can read.
fn start_error(e: ApiError) -> Result<CallToolResult, McpError> {
    match e {
        ApiError::Denied(refusal) => Ok(error_result(None, format!("denied: {refusal}"))),
        ApiError::Workflow(e @ WorkflowError::InvalidInput { .. }) => {
            Ok(error_result(None, format!("invalid-input: {e}")))
        }
        e => Err(McpError::internal_error(e.to_string(), None)),
    }
}

/// `record`'s output and error with every known secret replaced.
fn redacted(mut record: RunRecord) -> RunRecord {
    if let Some(output) = &record.output
        && let Some(clean) = crate::secrets::redact_json(output)
    {
        record.output = Some(clean);
    }
    if let Some(error) = &mut record.error {
        error.message = crate::secrets::redact(&error.message).into_owned();
    }
    record
}

/// The streamable-HTTP service for `/mcp`. Sessions end when the workflows
/// begin to shut down. Host and origin checks are the router's.
pub fn http_service(
    workflows: Arc<Workflows>,
) -> StreamableHttpService<WorkflowServer, LocalSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(true)
        .disable_allowed_hosts()
        .with_cancellation_token(workflows.closing_token());
    let server = WorkflowServer {
        over_http: true,
        ..WorkflowServer::new(workflows)
    };
    StreamableHttpService::new(move || Ok(server.clone()), Arc::default(), config)
}
