//! The RPC methods. Each one parses its params into a struct (naming the param
//! that is wrong), then calls the workflows or the shared pool.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::jsonrpc::{self, RpcError, named_params};
use crate::capability::{CapabilityBackend, CapabilityError};
use crate::domain::ListQuery;
use crate::pool::Pool;
use crate::reload::{Reloader, RpcGrants, RpcTokens};
use crate::tokens::{Caller, HostScope, RunScope};
use crate::trace::TraceParent;
use crate::workflow::{Status, WorkflowError, Workflows};

/// What the methods work on.
#[derive(Clone)]
pub struct RpcState {
    pub workflows: Arc<Workflows>,
    pub pool: Pool,
    /// What RPC clients may call and list (`[rpc] allow`), checked before
    /// anything reaches the pool; a reload replaces them.
    pub grants: RpcGrants,
    /// The named tokens (`[[rpc.tokens]]`); a reload replaces them.
    pub tokens: RpcTokens,
    /// The config file `host.reload` reloads, if the server has one.
    pub config: Option<Arc<Reloader>>,
}

impl RpcState {
    fn check(&self, caller: &Caller, qualified: &str) -> Result<(), RpcError> {
        if let Some(refusal) = caller.call_refusal(qualified) {
            return Err(capability_error(CapabilityError::Denied(refusal)));
        }
        let grants = self.grants.load();
        if grants.allows(qualified) {
            return Ok(());
        }
        let granted = match grants.patterns() {
            [] => "nothing".to_owned(),
            patterns => patterns
                .iter()
                .map(|p| format!("`{p}`"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        Err(capability_error(CapabilityError::Denied(format!(
            "`{qualified}` is not granted to RPC clients (`[rpc] allow` grants {granted}); add it to `[rpc] allow` in the config"
        ))))
    }
}

/// Pages of runs `workflow.list` reads for a token that sees only some
/// workflows, to fill one answer.
const MAX_FILTERED_PAGES: usize = 20;

/// Longest `workflow.wait` (and `workflow.start` with `wait`) may block.
const MAX_WAIT: Duration = Duration::from_secs(300);
const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// A refusal of `caller`'s token.
fn denied(message: String) -> RpcError {
    RpcError::new(jsonrpc::DENIED, message)
}

/// Checks that `caller` may `scope` the run `run_id` (by its workflow).
async fn may_run(
    state: &RpcState,
    caller: &Caller,
    run_id: &str,
    scope: RunScope,
) -> Result<(), RpcError> {
    if caller.is_unlimited() {
        return Ok(());
    }
    let workflow = state
        .workflows
        .workflow_of(run_id)
        .await
        .map_err(workflow_error)?;
    match caller.refusal(scope, &workflow) {
        Some(refusal) => Err(denied(refusal)),
        None => Ok(()),
    }
}

fn may_host(caller: &Caller, scope: HostScope) -> Result<(), RpcError> {
    match caller.host_refusal(scope) {
        Some(refusal) => Err(denied(refusal)),
        None => Ok(()),
    }
}

/// Calls `method` with `params` for `caller`; a run it starts continues
/// `parent`'s trace.
pub async fn call(
    state: &RpcState,
    caller: &Caller,
    method: &str,
    params: Value,
    parent: &TraceParent,
) -> Result<Value, RpcError> {
    match method {
        "workflow.start" => workflow_start(state, caller, params, parent).await,
        "workflow.get" => {
            let p: GetParams = parse(params, &["run_id", "calls", "logs"])?;
            may_run(state, caller, &p.run_id, RunScope::Read).await?;
            let mut record = state
                .workflows
                .get(&p.run_id, p.calls)
                .await
                .map_err(workflow_error)?;
            if p.logs {
                let mut logs = state
                    .workflows
                    .logs(&p.run_id)
                    .await
                    .map_err(workflow_error)?;
                for step in record.steps.iter_mut().flatten() {
                    step.logs = Some(logs.remove(&step.id).unwrap_or_default());
                }
            }
            Ok(json!(record))
        }
        "workflow.wait" => {
            let p: WaitParams = parse(params, &["run_id", "timeout_ms"])?;
            may_run(state, caller, &p.run_id, RunScope::Read).await?;
            let timeout = p
                .timeout_ms
                .map_or(DEFAULT_WAIT, Duration::from_millis)
                .min(MAX_WAIT);
            Ok(json!(
                state
                    .workflows
                    .wait(&p.run_id, timeout)
                    .await
                    .map_err(workflow_error)?
            ))
        }
        "workflow.cancel" => {
            let p: RunParams = parse(params, &["run_id"])?;
            may_run(state, caller, &p.run_id, RunScope::Cancel).await?;
            Ok(json!(
                state
                    .workflows
                    .cancel(&p.run_id)
                    .await
                    .map_err(workflow_error)?
            ))
        }
        "workflow.retry" => {
            let p: RunParams = parse(params, &["run_id"])?;
            may_run(state, caller, &p.run_id, RunScope::Cancel).await?;
            Ok(json!(
                state
                    .workflows
                    .retry(&p.run_id)
                    .await
                    .map_err(workflow_error)?
            ))
        }
        "workflow.signal" => {
            let p: SignalParams = parse(params, &["run_id", "signal", "payload"])?;
            may_run(state, caller, &p.run_id, RunScope::Signal).await?;
            Ok(json!(
                state
                    .workflows
                    .signal(&p.run_id, &p.signal, p.payload)
                    .await
                    .map_err(workflow_error)?
            ))
        }
        "workflow.answer" => {
            let p: AnswerParams =
                parse(params, &["run_id", "step_id", "item", "action", "content"])?;
            may_run(state, caller, &p.run_id, RunScope::Signal).await?;
            let answer = crate::capability::Answer {
                action: p.action,
                content: p.content,
            };
            Ok(json!(
                state
                    .workflows
                    .answer(&p.run_id, &p.step_id, p.item.unwrap_or(0), answer)
                    .await
                    .map_err(workflow_error)?
            ))
        }
        "workflow.waiting" => {
            let p: LimitParams = parse(params, &["limit"])?;
            let mut steps = state
                .workflows
                .waiting_steps(p.limit.unwrap_or(100).clamp(1, 1000))
                .await
                .map_err(workflow_error)?;
            steps.retain(|s| caller.may(RunScope::Read, &s.workflow));
            Ok(json!({ "steps": steps }))
        }
        "workflow.list" => {
            let p: ListParams = parse(params, &["workflow", "status", "limit", "cursor"])?;
            if let Some(refusal) = p
                .workflow
                .as_deref()
                .and_then(|w| caller.refusal(RunScope::Read, w))
            {
                return Err(denied(refusal));
            }
            let mut query = ListQuery {
                workflow: p.workflow,
                status: p.status,
                limit: p.limit.unwrap_or(100).clamp(1, 1000),
                cursor: p.cursor,
            };
            let (mut runs, mut next) =
                state.workflows.list(&query).await.map_err(workflow_error)?;
            if !caller.is_unlimited() {
                // The runs of other workflows are left out; further pages
                // fill the answer, a bounded number of them.
                let limit = query.limit as usize;
                runs.retain(|r| caller.may(RunScope::Read, &r.workflow));
                for _ in 0..MAX_FILTERED_PAGES {
                    let Some(cursor) = next.take().filter(|_| runs.len() < limit) else {
                        break;
                    };
                    query.cursor = Some(cursor);
                    // No more than would fill the answer: the cursor then
                    // follows the last run read.
                    query.limit = u32::try_from(limit - runs.len()).unwrap_or(1);
                    let (more, after) =
                        state.workflows.list(&query).await.map_err(workflow_error)?;
                    runs.extend(
                        more.into_iter()
                            .filter(|r| caller.may(RunScope::Read, &r.workflow)),
                    );
                    next = after;
                }
            }
            let mut out = json!({ "runs": runs });
            if let Some(next) = next {
                out["next_cursor"] = json!(next);
            }
            Ok(out)
        }
        "capability.list" => {
            let _: Empty = parse(params, &[])?;
            let mut entries = state.pool.list().await.map_err(capability_error)?;
            let grants = state.grants.load();
            entries.retain(|e| grants.allows(&e.name) && caller.may_call(&e.name));
            Ok(json!({ "capabilities": entries }))
        }
        "capability.call" => {
            let p: NamedArgs = parse(params, &["name", "arguments"])?;
            let (connection, tool) = split(&p.name)?;
            state.check(caller, &p.name)?;
            let result =
                CapabilityBackend::call_tool(&state.pool, connection, tool, p.arguments).await;
            crate::capability::with_tool_hint(&state.pool, &state.grants.load(), connection, result)
                .await
                .map_err(capability_error)
        }
        "resource.read" => {
            let p: ResourceParams = parse(params, &["connection", "uri"])?;
            // Resources are granted as `<connection>.<uri>`, as for nodes.
            state.check(caller, &format!("{}.{}", p.connection, p.uri))?;
            CapabilityBackend::read_resource(&state.pool, &p.connection, &p.uri)
                .await
                .map_err(capability_error)
        }
        "prompt.get" => {
            let p: NamedArgs = parse(params, &["name", "arguments"])?;
            let (connection, prompt) = split(&p.name)?;
            state.check(caller, &p.name)?;
            CapabilityBackend::get_prompt(&state.pool, connection, prompt, p.arguments)
                .await
                .map_err(capability_error)
        }
        "host.status" => {
            let _: Empty = parse(params, &[])?;
            may_host(caller, HostScope::Console)?;
            let store = state
                .workflows
                .state_status()
                .await
                .map_err(workflow_error)?;
            let (worker, workers) = state
                .workflows
                .worker_status()
                .await
                .map_err(workflow_error)?;
            let schedules = state
                .workflows
                .schedules_status()
                .await
                .map_err(workflow_error)?;
            Ok(json!({
                "worker": worker,
                "workers": workers,
                "connections": state.pool.stats(),
                "workflows": state.workflows.names(),
                "schedules": schedules,
                "webhooks": state.workflows.webhooks(),
                "runs_waiting_here": state.workflows.waiting(),
                "exposed": state.workflows.exposed().iter().map(|w| w.name.clone()).collect::<Vec<_>>(),
                "state": store,
                "config": state.config.as_ref().map(|c| c.status()),
            }))
        }
        "host.reload" => {
            let _: Empty = parse(params, &[])?;
            may_host(caller, HostScope::Reload)?;
            let Some(reloader) = &state.config else {
                return Err(RpcError::new(
                    jsonrpc::CONFIG_INVALID,
                    "this server was started without a config file: there is nothing to reload",
                ));
            };
            match reloader.reload("host.reload").await {
                Ok(report) => Ok(json!(report)),
                Err(e) => Err(RpcError::new(jsonrpc::CONFIG_INVALID, e.to_string())),
            }
        }
        "rpc.discover" => Ok(super::openrpc::document()),
        other => Err(RpcError::new(
            jsonrpc::METHOD_NOT_FOUND,
            format!("method `{other}` not found; `rpc.discover` lists the methods"),
        )),
    }
}

async fn workflow_start(
    state: &RpcState,
    caller: &Caller,
    params: Value,
    parent: &TraceParent,
) -> Result<Value, RpcError> {
    let p: StartParams = parse(params, &["workflow", "input", "wait", "idempotency_key"])?;
    if let Some(refusal) = caller.refusal(RunScope::Start, &p.workflow) {
        return Err(denied(refusal));
    }
    // A named token is recorded with the run it starts.
    let record = state
        .workflows
        .start_by(
            &p.workflow,
            p.input,
            p.idempotency_key,
            caller.trigger(),
            parent,
        )
        .await
        .map_err(workflow_error)?;
    let record = if p.wait {
        state
            .workflows
            .wait_run(&record.run_id, MAX_WAIT)
            .await
            .map_err(workflow_error)?
    } else {
        record
    };
    let mut out = json!({ "run_id": record.run_id, "status": record.status });
    if let Some(reason) = record.queued_reason {
        out["queued_reason"] = json!(reason);
    }
    if let Some(output) = record.output {
        out["output"] = output;
    }
    if let Some(error) = record.error {
        out["error"] = json!(error);
    }
    Ok(out)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartParams {
    workflow: String,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    wait: bool,
    idempotency_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunParams {
    run_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitParams {
    limit: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalParams {
    run_id: String,
    signal: String,
    #[serde(default)]
    payload: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerParams {
    run_id: String,
    step_id: String,
    item: Option<u32>,
    action: String,
    content: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitParams {
    run_id: String,
    timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    workflow: Option<String>,
    status: Option<Status>,
    limit: Option<u32>,
    cursor: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GetParams {
    run_id: String,
    #[serde(default)]
    calls: bool,
    #[serde(default)]
    logs: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NamedArgs {
    name: String,
    #[serde(default)]
    arguments: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceParams {
    connection: String,
    uri: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

/// Parses params, naming the offending param on error.
fn parse<T: DeserializeOwned>(params: Value, names: &[&str]) -> Result<T, RpcError> {
    let map = named_params(params, names)?;
    serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." {
            RpcError::invalid_params(inner)
        } else {
            RpcError::invalid_params(format!("param `{path}`: {inner}"))
        }
    })
}

fn split(name: &str) -> Result<(&str, &str), RpcError> {
    crate::capability::split_qualified(name)
        .map_err(|e| RpcError::invalid_params(format!("param `name`: {}", e.message())))
}

fn workflow_error(e: WorkflowError) -> RpcError {
    let code = match &e {
        WorkflowError::UnknownWorkflow(_) => jsonrpc::UNKNOWN_WORKFLOW,
        WorkflowError::UnknownRun(_) => jsonrpc::UNKNOWN_RUN,
        WorkflowError::ShuttingDown => jsonrpc::SHUTTING_DOWN,
        WorkflowError::NotWaiting { .. } => jsonrpc::NOT_WAITING,
        WorkflowError::InvalidInput { .. }
        | WorkflowError::InvalidPayload(_)
        | WorkflowError::NotRetryable { .. } => jsonrpc::INVALID_PARAMS,
        WorkflowError::Store(_) if e.is_callers() => jsonrpc::INVALID_PARAMS,
        WorkflowError::Load { .. } | WorkflowError::Definition(_) | WorkflowError::Store(_) => {
            jsonrpc::INTERNAL_ERROR
        }
    };
    RpcError::new(code, e.to_string())
}

fn capability_error(e: CapabilityError) -> RpcError {
    let code = match &e {
        CapabilityError::NotFound(_) => jsonrpc::NOT_FOUND,
        CapabilityError::Denied(_) => jsonrpc::DENIED,
        CapabilityError::InvalidArguments(_) => jsonrpc::INVALID_PARAMS,
        CapabilityError::ToolError(_) | CapabilityError::Unavailable(_) => jsonrpc::UNAVAILABLE,
        CapabilityError::Timeout(_) => jsonrpc::TIMEOUT,
    };
    RpcError {
        code,
        message: e.message().to_owned(),
        data: Some(json!({ "kind": e.code() })),
    }
}
