//! Durable state: runs, their steps, and a journal of every capability call.
//!
//! The engine talks to a [`Store`]; all SQL lives in the backends. SQLite
//! ([`sqlite::SqliteStore`]) is the embedded default; `:memory:` keeps nothing
//! past the process.

pub mod sqlite;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A run's state. `Running` until it ends in one of the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

/// A step's state.
///
/// `pending → running → succeeded | failed | cancelled`, or `pending →
/// skipped | cancelled`; `workflow.retry` takes `failed` and `cancelled` back
/// to `pending`. A `running` step found at start-up was interrupted by a crash
/// and runs again as its next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    Pending,
    Running,
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
            fn parse(text: &str) -> Result<Self, StoreError> {
                match text {
                    $($text => Ok(Self::$variant),)*
                    other => Err(StoreError::Corrupt(format!("unknown status `{other}`"))),
                }
            }
        }
    };
}
text_enum!(RunStatus { Running = "running", Succeeded = "succeeded", Failed = "failed", Cancelled = "cancelled" });
text_enum!(StepStatus {
    Pending = "pending",
    Running = "running",
    Succeeded = "succeeded",
    Failed = "failed",
    Skipped = "skipped",
    Cancelled = "cancelled",
});

impl RunStatus {
    pub fn is_finished(self) -> bool {
        self != RunStatus::Running
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
    pub definition: Value,
    pub definition_hash: String,
    pub idempotency_key: Option<String>,
    pub created_ms: i64,
    pub started_at: String,
    pub finished_at: Option<String>,
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
}

/// A run to create, with its steps all `pending`.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub run: RunRow,
    /// Step ids in definition order.
    pub steps: Vec<String>,
}

/// What [`Store::create_run`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    New,
    /// The idempotency key was used before: this is that run.
    Existing(Box<RunRow>),
}

/// Which runs [`Store::list_runs`] returns, newest first.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub workflow: Option<String>,
    pub status: Option<RunStatus>,
    pub limit: u32,
    /// From a previous page's `next_cursor`.
    pub cursor: Option<String>,
}

/// Counts for `host.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub runs_running: u64,
    pub runs_total: u64,
    /// The newest kept event's id (0 when there is none): a client that
    /// wants only what happens next streams `/events` from it.
    pub last_event_id: i64,
}

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state file `{path}` cannot be used: {message}")]
    Open { path: String, message: String },
    #[error("state store: {0}")]
    Db(#[from] sqlx::Error),
    #[error("state store holds bad data: {0}")]
    Corrupt(String),
    #[error("cursor `{0}` is not one this server returned")]
    BadCursor(String),
}

/// Where runs are kept. Every write is committed before it returns: the
/// engine acts on a transition only after it is stored.
#[async_trait]
pub trait Store: Send + Sync {
    /// `sqlite`, …
    fn backend(&self) -> &'static str;
    /// The file, or `:memory:`.
    fn location(&self) -> String;

    /// Inserts a run and its pending steps, or finds the run that used the
    /// same idempotency key.
    async fn create_run(&self, run: &NewRun) -> Result<Created, StoreError>;
    async fn run(&self, run_id: &str) -> Result<Option<RunRow>, StoreError>;
    /// Steps in definition order.
    async fn steps(&self, run_id: &str) -> Result<Vec<StepRow>, StoreError>;
    async fn calls(&self, run_id: &str, step_id: &str) -> Result<Vec<CallRow>, StoreError>;
    /// A page of runs, newest first, and the cursor of the next page.
    async fn list_runs(
        &self,
        query: &ListQuery,
    ) -> Result<(Vec<RunRow>, Option<String>), StoreError>;
    /// Runs still `running`: what a start-up resumes.
    async fn unfinished_runs(&self) -> Result<Vec<RunRow>, StoreError>;

    /// Marks a step `running` in `attempt` with its input.
    async fn step_started(
        &self,
        run_id: &str,
        step_id: &str,
        attempt: u32,
        input: Option<&Value>,
    ) -> Result<(), StoreError>;
    /// Records that a step retries, as `attempt`.
    async fn step_attempt(
        &self,
        run_id: &str,
        step_id: &str,
        attempt: u32,
    ) -> Result<(), StoreError>;
    /// Records how a step ended.
    async fn step_finished(
        &self,
        run_id: &str,
        step_id: &str,
        status: StepStatus,
        output: Option<&Value>,
        error: Option<&Failure>,
    ) -> Result<(), StoreError>;
    /// Records how a run ended.
    async fn run_finished(
        &self,
        run_id: &str,
        status: RunStatus,
        output: Option<&Value>,
        error: Option<&Failure>,
    ) -> Result<(), StoreError>;
    /// `workflow.retry`: a failed or cancelled run goes back to `running`
    /// and its failed or cancelled steps to `pending`. False when the run is
    /// not failed or cancelled.
    async fn reopen_run(&self, run_id: &str) -> Result<bool, StoreError>;
    async fn record_call(&self, call: &CallRow) -> Result<(), StoreError>;
    /// Ends a run that nothing drives any more (its task failed, or it is
    /// cancelled while not running here): the run gets `status` and
    /// `failure`, its pending and running steps become `cancelled`. Does
    /// nothing to a finished run.
    async fn abandon_run(
        &self,
        run_id: &str,
        status: RunStatus,
        failure: &Failure,
    ) -> Result<(), StoreError>;
    async fn counts(&self) -> Result<Counts, StoreError>;
    /// Appends an event of `run_id` to the event log; returns it with its id.
    async fn append_event(
        &self,
        run_id: &str,
        kind: &str,
        data: &Value,
    ) -> Result<EventRow, StoreError>;
    /// Up to `limit` events with an id past `after`, oldest first; of one run,
    /// or of all runs.
    async fn events(
        &self,
        run_id: Option<&str>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<EventRow>, StoreError>;
    /// Deletes finished runs past the newest `keep_runs`, and those finished
    /// before `finished_before_ms`. Returns how many went.
    async fn prune(&self, keep_runs: u64, finished_before_ms: i64) -> Result<u64, StoreError>;
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
