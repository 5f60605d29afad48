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
use crate::api::Start;
use crate::workflow::{RunRecord, Status, StepRecord, WorkflowError};

/// What a client is told to wait between two `tasks/get`.
const POLL_INTERVAL_MS: u64 = 500;
/// The `trigger.kind` of a run started as a task.
const TASK_TRIGGER: &str = "mcp-task";

/// The elicitation that asks a person (through the client) to answer wait
/// step `step` of run `run_id`: approve or reject, with a comment. The
/// answer's content is the signal's payload.
pub(super) fn approval_request(run_id: &str, step: &StepRecord) -> ElicitRequestParams {
    let input = step.input.clone().unwrap_or(Value::Null);
    let signal = step.waited_signal().unwrap_or_default().to_owned();
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
        // Marked as a task's run: only those are tasks (a run started
        // otherwise, by a schedule or over RPC, is not this face's to cancel).
        let mut trigger = json!({"kind": TASK_TRIGGER});
        let caller = self.caller_of(context);
        if let Some(name) = &caller.name {
            trigger["token"] = json!(name);
        }
        let start = Start {
            trigger: Some(trigger),
            ..Start::new(name, input, &parent)
        };
        let run = match self.runs().start(&caller, start).await {
            Ok(run) => run,
            Err(e) => return super::start_error(e).map(Into::into),
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
        self.answer_steps(&run, responses).await
    }

    /// Sends each answer (keyed by a waiting step's id) as that step's
    /// signal; all are checked before any is sent.
    pub(super) async fn answer_steps(
        &self,
        run: &RunRecord,
        responses: &BTreeMap<String, Value>,
    ) -> Result<(), McpError> {
        let task_id = run.run_id.as_str();
        let mut sends = Vec::new();
        for (step_id, response) in responses {
            // An answer to a question an upstream server asked.
            if let Some((step, item)) = super::parse_answer_key(step_id) {
                let answer: ElicitResult =
                    serde_json::from_value(response.clone()).map_err(|e| {
                        McpError::invalid_params(
                            format!("`{step_id}`: not an elicitation result: {e}"),
                            None,
                        )
                    })?;
                match self
                    .workflows
                    .answer(task_id, &step, item, super::answer_of(&answer))
                    .await
                {
                    Ok(_) => {}
                    Err(WorkflowError::NotWaiting { message, .. }) => {
                        tracing::debug!(run = %task_id, step, "answer not taken: {message}");
                    }
                    Err(WorkflowError::InvalidPayload(message)) => {
                        return Err(McpError::invalid_params(message, None));
                    }
                    Err(other) => return Err(McpError::internal_error(other.to_string(), None)),
                }
                continue;
            }
            let Some(step) = run.steps.iter().flatten().find(|s| &s.id == step_id) else {
                return Err(McpError::invalid_params(
                    format!("task `{task_id}` has no step `{step_id}`"),
                    None,
                ));
            };
            let answer: ElicitResult = serde_json::from_value(response.clone()).map_err(|e| {
                McpError::invalid_params(
                    format!("`{step_id}`: not an elicitation result: {e}"),
                    None,
                )
            })?;
            // A step that waits no more was answered already (a retried
            // round, a second poller).
            let Some(signal) = step.waited_signal() else {
                continue;
            };
            let Some(payload) = answer_payload(&answer) else {
                continue;
            };
            let signal = signal.to_owned();
            sends.push((step_id, signal, payload));
        }
        for (step_id, signal, payload) in sends {
            match self.workflows.signal(task_id, &signal, payload).await {
                Ok(_) => {}
                // Answered already: the step has what it waits for.
                Err(WorkflowError::NotWaiting { message, .. }) => {
                    tracing::debug!(run = %task_id, step = %step_id, "answer not taken: {message}");
                }
                Err(WorkflowError::InvalidPayload(message)) => {
                    return Err(McpError::invalid_params(message, None));
                }
                Err(other) => return Err(McpError::internal_error(other.to_string(), None)),
            }
        }
        Ok(())
    }

    /// A run started as a task, of an exposed workflow, with its steps; or
    /// the error for a task this server does not offer.
    async fn offered_run(&self, task_id: &str) -> Result<RunRecord, McpError> {
        let unknown = || McpError::invalid_params(format!("unknown task `{task_id}`"), None);
        let run = self
            .workflows
            .get(task_id, false)
            .await
            .map_err(|_| unknown())?;
        let is_task = run
            .trigger
            .as_ref()
            .is_some_and(|t| t["kind"] == TASK_TRIGGER);
        if !is_task || self.workflows.exposed_workflow(&run.workflow).is_none() {
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
        // The last time anything of the run moved.
        let updated = run.finished_at.clone().unwrap_or_else(|| {
            steps
                .iter()
                .flat_map(|s| [s.started_at.clone(), s.finished_at.clone()])
                .flatten()
                .chain([run.started_at.clone()])
                .max()
                .unwrap_or_default()
        });
        let mut task = Task::new(
            task_id,
            TaskStatus::Working,
            run.started_at.clone(),
            updated,
        )
        .with_poll_interval_ms(POLL_INTERVAL_MS);
        let waiting: Vec<&StepRecord> = steps.iter().filter(|s| s.waits_for_signal()).collect();
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
            Status::Paused => {
                task =
                    task.with_status_message("paused: `workflow.resume` lets it go on".to_owned());
                TaskPayload::Working
            }
            Status::Queued => {
                task = task.with_status_message(format!(
                    "queued: {}",
                    run.queued_reason
                        .as_deref()
                        .unwrap_or("waiting for flow control")
                ));
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
