//! The RPC methods. Each one parses its params into a struct (naming the param
//! that is wrong), calls the [`Api`] and words its answer or error.

use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::jsonrpc::{self, RpcError, named_params};
use crate::api::{Answer, Api, ApiError, CapabilityError, Start};
use crate::domain::ListQuery;
use crate::tokens::Caller;
use crate::trace::TraceParent;
use crate::workflow::{Status, WorkflowError};

/// Longest `workflow.wait` (and `workflow.start` with `wait`) may block.
const MAX_WAIT: Duration = Duration::from_secs(300);
const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// Calls `method` with `params` for `caller`; a run it starts continues
/// `parent`'s trace.
pub async fn call(
    api: &Api,
    caller: &Caller,
    method: &str,
    params: Value,
    parent: &TraceParent,
) -> Result<Value, RpcError> {
    let runs = api.runs();
    let answer = match method {
        "workflow.start" => {
            let p: StartParams = parse(params, &["workflow", "input", "wait", "idempotency_key"])?;
            let start = Start {
                workflow: &p.workflow,
                input: p.input,
                idempotency_key: p.idempotency_key,
                trigger: None,
                wait: p.wait.then_some(MAX_WAIT),
                parent,
            };
            let record = runs.start(caller, start).await.map_err(api_error)?;
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
            return Ok(out);
        }
        "workflow.get" => {
            let p: GetParams = parse(params, &["run_id", "calls", "logs"])?;
            runs.get(caller, &p.run_id, p.calls, p.logs)
                .await
                .map(|v| json!(v))
        }
        "workflow.wait" => {
            let p: WaitParams = parse(params, &["run_id", "timeout_ms"])?;
            let timeout = p
                .timeout_ms
                .map_or(DEFAULT_WAIT, Duration::from_millis)
                .min(MAX_WAIT);
            runs.wait(caller, &p.run_id, timeout)
                .await
                .map(|v| json!(v))
        }
        "workflow.cancel" => {
            let p: RunParams = parse(params, &["run_id"])?;
            runs.cancel(caller, &p.run_id).await.map(|v| json!(v))
        }
        "workflow.retry" => {
            let p: RunParams = parse(params, &["run_id"])?;
            runs.retry(caller, &p.run_id).await.map(|v| json!(v))
        }
        "workflow.migrate" => {
            let p: RunParams = parse(params, &["run_id"])?;
            runs.migrate(caller, &p.run_id).await.map(|v| json!(v))
        }
        "workflow.pause" | "workflow.resume" => {
            let pause = method == "workflow.pause";
            let p: PauseParams = parse(params, &["run_id"])?;
            match (p.run_id, p.workflow) {
                (Some(run_id), None) if pause => {
                    runs.pause(caller, &run_id).await.map(|v| json!(v))
                }
                (Some(run_id), None) => runs.resume(caller, &run_id).await.map(|v| json!(v)),
                (None, Some(workflow)) => runs
                    .pause_workflow(caller, &workflow, pause)
                    .await
                    .map(|v| json!(v)),
                _ => {
                    return Err(RpcError::invalid_params(
                        "give `run_id` (one run) or `workflow` (the whole workflow), not both",
                    ));
                }
            }
        }
        "workflow.signal" => {
            let p: SignalParams = parse(params, &["run_id", "signal", "payload"])?;
            runs.signal(caller, &p.run_id, &p.signal, p.payload)
                .await
                .map(|v| json!(v))
        }
        "workflow.answer" => {
            let p: AnswerParams =
                parse(params, &["run_id", "step_id", "item", "action", "content"])?;
            let answer = Answer {
                action: p.action,
                content: p.content,
            };
            let item = p.item.unwrap_or(0);
            runs.answer(caller, &p.run_id, &p.step_id, item, answer)
                .await
                .map(|v| json!(v))
        }
        "workflow.waiting" => {
            let p: LimitParams = parse(params, &["limit"])?;
            let limit = p.limit.unwrap_or(100).clamp(1, 1000);
            let steps = runs.waiting(caller, limit).await.map_err(api_error)?;
            return Ok(json!({ "steps": steps }));
        }
        "workflow.list" => {
            let p: ListParams = parse(params, &["workflow", "status", "limit", "cursor"])?;
            let query = ListQuery {
                workflow: p.workflow,
                status: p.status,
                limit: p.limit.unwrap_or(100).clamp(1, 1000),
                cursor: p.cursor,
            };
            let (runs, next) = runs.list(caller, query).await.map_err(api_error)?;
            let mut out = json!({ "runs": runs });
            if let Some(next) = next {
                out["next_cursor"] = json!(next);
            }
            return Ok(out);
        }
        "capability.list" => {
            let _: Empty = parse(params, &[])?;
            let entries = api.capabilities(caller).await.map_err(api_error)?;
            return Ok(json!({ "capabilities": entries }));
        }
        "capability.call" => {
            let p: NamedArgs = parse(params, &["name", "arguments"])?;
            let (connection, tool) = split(&p.name)?;
            api.call_tool(caller, connection, tool, p.arguments).await
        }
        "resource.read" => {
            let p: ResourceParams = parse(params, &["connection", "uri"])?;
            api.read_resource(caller, &p.connection, &p.uri).await
        }
        "prompt.get" => {
            let p: NamedArgs = parse(params, &["name", "arguments"])?;
            let (connection, prompt) = split(&p.name)?;
            api.get_prompt(caller, connection, prompt, p.arguments)
                .await
        }
        "host.status" => {
            let _: Empty = parse(params, &[])?;
            api.status(caller).await
        }
        "host.reload" => {
            let _: Empty = parse(params, &[])?;
            api.reload(caller).await
        }
        "rpc.discover" => return Ok(super::openrpc::document()),
        other => {
            return Err(RpcError::new(
                jsonrpc::METHOD_NOT_FOUND,
                format!("method `{other}` not found; `rpc.discover` lists the methods"),
            ));
        }
    };
    answer.map_err(api_error)
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

/// `workflow.pause` and `workflow.resume`: a run, or a whole workflow.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseParams {
    run_id: Option<String>,
    workflow: Option<String>,
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
    crate::api::split_qualified(name)
        .map_err(|e| RpcError::invalid_params(format!("param `name`: {}", e.message())))
}

fn api_error(e: ApiError) -> RpcError {
    match e {
        ApiError::Denied(message) => RpcError::new(jsonrpc::DENIED, message),
        ApiError::Workflow(e) => workflow_error(e),
        ApiError::Capability(e) => capability_error(e),
        ApiError::Config(message) => RpcError::new(jsonrpc::CONFIG_INVALID, message),
    }
}

/// When a caller refused because the state cannot be written may try again.
const RETRY_AFTER_MS: u64 = 5000;

fn workflow_error(e: WorkflowError) -> RpcError {
    if let WorkflowError::UnknownWorkflow { known, .. } = &e {
        return RpcError {
            code: jsonrpc::UNKNOWN_WORKFLOW,
            data: Some(json!({ "workflows": known })),
            message: e.to_string(),
        };
    }
    if let WorkflowError::Busy { retry_after, .. } = &e {
        return RpcError {
            code: jsonrpc::UNAVAILABLE,
            data: Some(json!({ "retry_after_ms": retry_after.as_millis() as u64 })),
            message: e.to_string(),
        };
    }
    // The store cannot write now (its disk is full, or it is away): a busy
    // refusal, with when to try again.
    if let WorkflowError::Store(store) = &e
        && store.is_unavailable()
    {
        return RpcError {
            code: jsonrpc::UNAVAILABLE,
            data: Some(json!({ "retry_after_ms": RETRY_AFTER_MS })),
            message: e.to_string(),
        };
    }
    let code = match &e {
        WorkflowError::UnknownWorkflow { .. } => jsonrpc::UNKNOWN_WORKFLOW,
        WorkflowError::UnknownRun(_) => jsonrpc::UNKNOWN_RUN,
        WorkflowError::ShuttingDown => jsonrpc::SHUTTING_DOWN,
        WorkflowError::Busy { .. } => jsonrpc::UNAVAILABLE,
        WorkflowError::NotWaiting { .. } => jsonrpc::NOT_WAITING,
        WorkflowError::InvalidInput { .. }
        | WorkflowError::InvalidPayload(_)
        | WorkflowError::NotRetryable { .. }
        | WorkflowError::Compensated { .. } => jsonrpc::INVALID_PARAMS,
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
