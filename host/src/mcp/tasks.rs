//! `/mcp` tools as tasks (the `io.modelcontextprotocol/tasks` extension):
//! a client that declares the extension gets a task at once from `tools/call`
//! of a workflow, instead of a response held open for the whole run.
//!
//! The task is the run: its id is the run id, and its state is read from the
//! store at each `tasks/get`, so a task outlives the session, the host (a
//! restart resumes the run) and the worker that started it.
//!
//! | run | task |
//! |---|---|
//! | running | `working`, with how many steps finished |
//! | running, a step waiting for a signal | `input_required`: an elicitation per waiting step (`approved`, `comment`), answered with `tasks/update` |
//! | succeeded, failed | `completed`, with the tool's result (a failed run's has `isError`) |
//! | cancelled | `cancelled` |
//!
//! `tasks/cancel` cancels the run.

use std::collections::BTreeMap;

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CreateTaskResult, DetailedTask, ElicitRequest,
    ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema, GetTaskResult,
    InputRequest, Task, TaskPayload, TaskStatus,
};
use rmcp::service::RequestContext;
use serde_json::{Value, json};

use super::{WorkflowServer, tool_result};
use crate::store::StepStatus;
use crate::workflow::{RunRecord, Status, StepRecord, WorkflowError};

/// What a client is told to wait between two `tasks/get`.
const POLL_INTERVAL_MS: u64 = 500;

/// The elicitation that asks a person (through the client) to answer wait
/// step `step` of run `run_id`: approve or reject, with a comment. The
/// answer's content is the signal's payload.
pub(super) fn approval_request(run_id: &str, step: &StepRecord) -> ElicitRequestParams {
    let input = step.input.clone().unwrap_or(Value::Null);
    let signal = input["signal"].as_str().unwrap_or_default().to_owned();
    let request = &input["request"];
    let what = if request.is_null() {
        String::new()
    } else {
        format!(": {request}")
    };
    let schema = ElicitationSchema::builder()
        .required_bool_property("approved", |b| {
            b.description("Approve (true) or reject (false)")
        })
        .optional_string("comment")
        .build_unchecked();
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: format!(
            "Run `{run_id}`, step `{}` waits for `{signal}`{what}",
            step.id
        ),
        requested_schema: schema,
    }
}

/// The payload an elicitation's answer sends as the step's signal; `None`
/// for `cancel` (the step keeps waiting).
pub(super) fn answer_payload(answer: &ElicitResult) -> Option<Value> {
    match answer.action {
        ElicitationAction::Accept => Some(
            answer
                .content
                .clone()
                .unwrap_or_else(|| json!({"approved": true})),
        ),
        ElicitationAction::Decline => Some(json!({"approved": false})),
        _ => None,
    }
}

impl WorkflowServer {
    /// Starts `request`'s workflow and answers with its task at once.
    pub(super) async fn start_task(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<rmcp::RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.as_ref();
        let input = Value::Object(request.arguments.unwrap_or_default());
        let parent = crate::trace::TraceParent::from_meta(&context.meta);
        let run = match self
            .workflows
            .start_traced(name, input, None, &parent)
            .await
        {
            Ok(run) => run,
            Err(e @ WorkflowError::InvalidInput { .. }) => {
                return Ok(super::error_result(None, format!("invalid-input: {e}")).into());
            }
            Err(e) => return Err(McpError::internal_error(e.to_string(), None)),
        };
        let task = self.detailed(&run.run_id).await?.task;
        Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
    }

    /// `tasks/get`: the run as a task.
    pub(super) async fn get_task_of(&self, task_id: &str) -> Result<GetTaskResult, McpError> {
        Ok(GetTaskResult::new(self.detailed(task_id).await?))
    }

    /// `tasks/cancel`: cancels the run.
    pub(super) async fn cancel_task_of(&self, task_id: &str) -> Result<(), McpError> {
        self.offered_run(task_id).await?;
        self.workflows
            .cancel(task_id)
            .await
            .map(drop)
            .map_err(|e| McpError::internal_error(e.to_string(), None))
    }

    /// `tasks/update`: each answer (keyed by the waiting step's id) is sent
    /// as that step's signal.
    pub(super) async fn update_task_of(
        &self,
        task_id: &str,
        responses: &BTreeMap<String, Value>,
    ) -> Result<(), McpError> {
        let run = self.offered_run(task_id).await?;
        for (step_id, response) in responses {
            let Some(step) = run
                .steps
                .iter()
                .flatten()
                .find(|s| &s.id == step_id && s.status == StepStatus::Waiting)
            else {
                return Err(McpError::invalid_params(
                    format!("no step `{step_id}` of task `{task_id}` waits for input"),
                    None,
                ));
            };
            let answer: ElicitResult = serde_json::from_value(response.clone()).map_err(|e| {
                McpError::invalid_params(
                    format!("`{step_id}`: not an elicitation result: {e}"),
                    None,
                )
            })?;
            let Some(payload) = answer_payload(&answer) else {
                continue;
            };
            let signal = step
                .input
                .as_ref()
                .and_then(|i| i["signal"].as_str())
                .unwrap_or_default();
            self.workflows
                .signal(task_id, signal, payload)
                .await
                .map_err(|e| match e {
                    WorkflowError::InvalidPayload(message) => {
                        McpError::invalid_params(message, None)
                    }
                    other => McpError::invalid_request(other.to_string(), None),
                })?;
        }
        Ok(())
    }

    /// A run of an exposed workflow, with its steps, or the error for a task
    /// this server does not offer.
    async fn offered_run(&self, task_id: &str) -> Result<RunRecord, McpError> {
        let unknown = || McpError::invalid_params(format!("unknown task `{task_id}`"), None);
        let run = self
            .workflows
            .get(task_id, false)
            .await
            .map_err(|_| unknown())?;
        if self.workflows.exposed_workflow(&run.workflow).is_none() {
            return Err(unknown());
        }
        Ok(run)
    }

    async fn detailed(&self, task_id: &str) -> Result<DetailedTask, McpError> {
        let run = self.offered_run(task_id).await?;
        let exposed = self
            .workflows
            .exposed_workflow(&run.workflow)
            .ok_or_else(|| McpError::invalid_params(format!("unknown task `{task_id}`"), None))?;
        let steps = run.steps.clone().unwrap_or_default();
        let finished = steps.iter().filter(|s| s.status.is_finished()).count();
        let updated = run
            .finished_at
            .clone()
            .unwrap_or_else(crate::store::now_text);
        let mut task = Task::new(
            task_id,
            TaskStatus::Working,
            run.started_at.clone(),
            updated,
        )
        .with_poll_interval_ms(POLL_INTERVAL_MS);
        let waiting: Vec<&StepRecord> = steps
            .iter()
            .filter(|s| s.status == StepStatus::Waiting)
            .collect();
        let payload = match run.status {
            Status::Running if !waiting.is_empty() => {
                task = task.with_status_message(format!(
                    "waiting for {}",
                    waiting
                        .iter()
                        .map(|s| format!("step `{}`", s.id))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                TaskPayload::InputRequired {
                    input_requests: waiting
                        .iter()
                        .map(|s| {
                            let request = ElicitRequest::new(approval_request(task_id, s));
                            (s.id.clone(), InputRequest::Elicitation(request))
                        })
                        .collect(),
                }
            }
            Status::Running => {
                task = task
                    .with_status_message(format!("{finished} of {} steps finished", exposed.steps));
                TaskPayload::Working
            }
            Status::Cancelled => TaskPayload::Cancelled,
            Status::Succeeded | Status::Failed => {
                let result = tool_result(&exposed, run);
                let Ok(Value::Object(result)) = serde_json::to_value(result) else {
                    return Err(McpError::internal_error("a tool result is an object", None));
                };
                TaskPayload::Completed { result }
            }
        };
        Ok(DetailedTask::new(task, payload))
    }
}
