//! The domain of workflow runs: the states of runs and steps, the moves
//! between them ([`Transition`]) and what each move writes ([`Effects`]), and
//! the rows the API shows. Nothing here knows a database, the engine, MCP or
//! HTTP: the store applies effects, the faces show rows, and both name a
//! status from here.

mod effects;
mod transition;

pub use effects::{Attempts, Effects, Notice, RunSet, RunTo, Stamp, StepSet, Target};
pub use transition::{Carried, Guard, RUN_STARTED, STEP_LOG, Transition};

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A run's state. `Running` until it ends in one of the others; a run of a
/// workflow with flow control (`concurrency`, `rate`) is `Queued` until its
/// limits admit it; `Paused` (`workflow.pause`) starts no step until it is
/// resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Waiting for its workflow's flow control to admit it.
    Queued,
    Running,
    /// Starts no new step (its running steps finish) until resumed.
    Paused,
    Succeeded,
    Failed,
    Cancelled,
}

/// A step's state.
///
/// `pending → running → succeeded | failed | cancelled`, or `pending →
/// skipped | cancelled`, or (a wait step) `pending → waiting → succeeded |
/// failed | cancelled`; `workflow.retry` takes `failed` and `cancelled` back
/// to `pending`. A `running` step found at start-up was interrupted by a crash
/// and runs again as its next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    Pending,
    Running,
    /// A wait step waiting for its signal.
    Waiting,
    Succeeded,
    Failed,
    Skipped,
    Cancelled,
}

macro_rules! text_enum {
    ($ty:ty { $($variant:ident = $text:literal),* $(,)? }) => {
        impl $ty {
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),* }
            }
            /// The status named `text`, as [`Self::as_str`] writes it.
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text => Some(Self::$variant),)*
                    _ => None,
                }
            }
        }
    };
}
text_enum!(RunStatus { Queued = "queued", Running = "running", Paused = "paused", Succeeded = "succeeded", Failed = "failed", Cancelled = "cancelled" });
text_enum!(StepStatus {
    Pending = "pending",
    Running = "running",
    Waiting = "waiting",
    Succeeded = "succeeded",
    Failed = "failed",
    Skipped = "skipped",
    Cancelled = "cancelled",
});

impl RunStatus {
    pub fn is_finished(self) -> bool {
        !matches!(
            self,
            RunStatus::Running | RunStatus::Queued | RunStatus::Paused
        )
    }
}

impl StepStatus {
    /// Whether the step has ended (and will not run again unless retried).
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            StepStatus::Succeeded
                | StepStatus::Failed
                | StepStatus::Skipped
                | StepStatus::Cancelled
        )
    }
}

/// `{code, message}` of a failed run, step or call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub code: String,
    pub message: String,
}

impl Failure {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Failure {
            code: code.into(),
            message: message.into(),
        }
    }
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub run_id: String,
    pub workflow: String,
    pub status: RunStatus,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<Failure>,
    /// The spec the run started with, as JSON.
    pub definition: Arc<Value>,
    pub definition_hash: String,
    pub idempotency_key: Option<String>,
    pub created_ms: i64,
    pub started_at: String,
    pub finished_at: Option<String>,
    /// What started the run when no caller did: a schedule's tick or a
    /// webhook delivery (`{"kind": …}`).
    pub trigger: Option<Value>,
    /// The flow limits the run was started under, when its workflow has
    /// flow control.
    pub flow: Option<Flow>,
    /// While `queued`: why it waits (`concurrency: key "acme" has 2 of 2
    /// running`).
    pub queued_reason: Option<String>,
    /// When flow control admitted it (ms since the epoch).
    pub admitted_ms: Option<i64>,
    /// A run of a workflow with `debounce`, while later starts with its key
    /// may still join it.
    pub debounce: Option<Debounce>,
    /// When the run last let go of its driver to sleep: when it wakes (ms
    /// since the epoch).
    pub wake_ms: Option<i64>,
}

/// A debounced run's wait: starts with the same `key` join it (the last
/// input wins) while it is `queued`; it is not admitted before
/// `not_before_ms`, which each start moves to its own time plus the
/// period, up to `deadline_ms` (the first start plus `max_wait`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debounce {
    pub key: String,
    pub not_before_ms: i64,
    pub deadline_ms: Option<i64>,
}

/// A run's flow limits, its workflow's `concurrency`, `rate` and `priority`
/// evaluated on its input. The store admits a `queued` run to `running`
/// ([`Transition::RunAdmitted`]) only while they allow it, counting every
/// worker's runs of the same workflow and key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flow {
    /// At most `limit` runs with this key run at once.
    pub concurrency: Option<FlowLimit>,
    /// At most `limit` runs with this key are admitted within any
    /// `period_ms` (a sliding window).
    pub rate: Option<FlowLimit>,
    /// Among queued runs, higher first (then oldest first).
    pub priority: i64,
}

/// One limit of a [`Flow`]: its key (`""` for the workflow's one global
/// limit), how many, and (a rate) over how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowLimit {
    pub key: String,
    pub limit: u32,
    /// A rate's window; 0 for a concurrency limit.
    pub period_ms: i64,
}

/// How much of a run's flow limits is used now (the store's `flow_usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowUsage {
    /// Runs of the concurrency key running.
    pub running: u64,
    /// Runs of the rate key admitted within the window.
    pub admitted: u64,
    /// When the oldest admission in the window leaves it (ms since the
    /// epoch): the earliest a rate-limited run can be admitted.
    pub window_frees_ms: Option<i64>,
}

/// A step of a run as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    pub step_id: String,
    pub status: StepStatus,
    pub attempts: u32,
    pub input: Option<Value>,
    pub output: Option<Value>,
    pub error: Option<Failure>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// Which worker ran each attempt, oldest first.
    pub workers: Vec<AttemptWorker>,
}

impl StepRow {
    /// A step that has not run yet, as a new run's steps are stored.
    pub fn pending(step_id: String) -> StepRow {
        StepRow {
            step_id,
            status: StepStatus::Pending,
            attempts: 0,
            input: None,
            output: None,
            error: None,
            started_at: None,
            finished_at: None,
            workers: Vec::new(),
        }
    }
}

/// The worker that ran one attempt of a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptWorker {
    pub attempt: u32,
    pub worker: String,
}

/// A worker of a shared store, as `host.status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerRow {
    pub id: String,
    pub started_at: String,
    pub last_heartbeat: String,
    pub running_steps: u64,
}

/// One capability call made by a step attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallRow {
    #[serde(skip)]
    pub run_id: String,
    #[serde(skip)]
    pub step_id: String,
    pub item: u32,
    pub attempt: u32,
    pub seq: u32,
    pub name: String,
    pub arguments: Value,
    /// `ok` or `error`.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    pub duration_us: u64,
    pub at: String,
    /// What the call answered (its result, or `{"error": {code, message}}`);
    /// not kept when larger than [`MAX_CALL_RESULT`] bytes of JSON.
    #[serde(skip)]
    pub result: Option<Value>,
    /// What a durable node read of its clocks and random seed since its
    /// call before this one (`[{"wall": ns} | {"mono": ns} | {"seed": hex}]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tape: Option<Value>,
}

/// The largest call result kept in the journal, in bytes of JSON.
pub const MAX_CALL_RESULT: usize = 64 * 1024;

/// Counts for `host.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub runs_running: u64,
    /// Runs waiting for their workflow's flow control.
    pub runs_queued: u64,
    /// Runs paused (`workflow.pause`).
    pub runs_paused: u64,
    pub runs_total: u64,
    /// Runs with a wait step waiting for its signal.
    pub runs_waiting_for_signal: u64,
    /// Runs asleep: driven by no process until their wake time (`run.asleep`),
    /// which is still ahead (a run keeps its last wake time once it woke).
    pub runs_asleep: u64,
    /// The newest kept event's id (0 when there is none): a client that
    /// wants only what happens next streams `/events` from it.
    pub last_event_id: i64,
}

/// A schedule's progress, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRow {
    pub workflow: String,
    pub name: String,
    /// The last tick fired, or (before the first) from when ticks count.
    pub last_tick_ms: i64,
    /// The run the last fired tick started.
    pub last_run_id: Option<String>,
}

/// A question a step waits to have answered (the store's `questions`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuestionRow {
    pub step_id: String,
    pub item: u32,
    pub question: Value,
    pub asked_at: String,
}

/// A wait step waiting for its signal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaitingStep {
    pub run_id: String,
    pub workflow: String,
    pub step: String,
    /// `{signal, timeout_at, request}`, as the step stored it.
    pub input: Value,
    pub since: Option<String>,
}

/// A signal sent to a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SignalRow {
    pub signal: String,
    pub payload: Value,
    pub sent_at: String,
    /// The wait step that took it; `None` while it is kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
}

/// One event of a run: `run.started`, `step.started`, `step.log`,
/// `step.finished`, `run.finished` (and `step.progress`, which is not kept).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRow {
    /// Increasing across all runs; `0` for events that are not kept.
    pub id: i64,
    pub run_id: String,
    pub kind: String,
    pub data: Value,
    pub at: String,
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// RFC 3339 with milliseconds, UTC.
pub fn now_text() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// Which runs the store's `list_runs` returns, newest first.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub workflow: Option<String>,
    pub status: Option<RunStatus>,
    pub limit: u32,
    /// From a previous page's `next_cursor`.
    pub cursor: Option<String>,
}
