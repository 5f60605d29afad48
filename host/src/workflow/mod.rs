//! Workflows and their runs.
//!
//! A workflow is a graph of steps ([`definition`]), each a node with its own
//! grants and limits, wired together with jq ([`expr`]). Starting one creates
//! a run in the [`Store`]; a task owned by [`Workflows`] drives it through the
//! graph ([`engine`]). Runs are durable: when the host starts on a state that
//! holds unfinished runs, it resumes them.

pub mod definition;
mod engine;
mod events;
pub mod expr;
mod flow;
mod maintenance;
mod mcp;
mod mode;
mod parking;
mod run;
pub mod schedule;
pub mod signal;
pub mod webhook;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::capability::Answer;
use crate::domain::ListQuery;
use crate::domain::{
    AttemptWorker, CallRow, Counts, Failure, RunRow, RunStatus, STEP_LOG, StepStatus,
};
use crate::runtime::{LoadError, Node, Runtime};
pub use crate::store::is_postgres_url;
use crate::store::{Note, Store, StoreError};
pub use definition::{Definition, DefinitionError, Spec};
pub(crate) use engine::answer_signal;
pub use flow::WorkflowPause;
pub use maintenance::DEFAULT_LEASE;
pub use mcp::Exposed;
use mode::Mode;
pub(crate) use parking::decode_seed;
pub use run::Started;
use run::{Done, Live, NodeError};

/// The run state a client sees (`status` of `workflow.get`).
pub type Status = RunStatus;

/// Default number of finished runs kept.
pub const DEFAULT_KEEP_RUNS: u64 = 10_000;
/// Default age past which finished runs are pruned.
pub const DEFAULT_KEEP_FOR: Duration = Duration::from_secs(30 * 24 * 3600);
/// Default number of steps that may run at once.
pub const DEFAULT_MAX_CONCURRENT_STEPS: usize = 64;
/// Default number of runs a process drives at once before it refuses
/// starts as busy.
pub const DEFAULT_MAX_LIVE_RUNS: usize = 4_000;
/// When a start refused as busy may try again.
pub const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How the workflow engine is set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// A SQLite file, `:memory:`, or a `postgres://` URL (shared by workers).
    pub state: String,
    pub max_concurrent_steps: usize,
    /// Runs driven at once here; past it, starts are refused as busy.
    pub max_live_runs: usize,
    pub keep_runs: u64,
    pub keep_for: Duration,
    /// How long a worker holds a run of a shared store without renewing.
    pub lease: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            state: ":memory:".into(),
            max_concurrent_steps: DEFAULT_MAX_CONCURRENT_STEPS,
            max_live_runs: DEFAULT_MAX_LIVE_RUNS,
            keep_runs: DEFAULT_KEEP_RUNS,
            keep_for: DEFAULT_KEEP_FOR,
            lease: DEFAULT_LEASE,
        }
    }
}

/// The workflows of one config: definitions and what is exposed.
struct Loaded {
    /// Shared by every run that starts on them.
    definitions: BTreeMap<String, Arc<Definition>>,
    exposed: BTreeMap<String, Arc<Exposed>>,
    schedules: Vec<schedule::Schedule>,
    webhooks: BTreeMap<String, Arc<webhook::Webhook>>,
}

impl Loaded {
    fn from_config(
        config: &crate::config::Config,
        runtime: &Runtime,
    ) -> Result<Loaded, WorkflowError> {
        Ok(Loaded {
            definitions: definition::load_all(config, runtime.limits())?
                .into_iter()
                .map(|(name, def)| (name, Arc::new(def)))
                .collect(),
            exposed: mcp::exposed_workflows(config)?,
            schedules: schedule::load_all(config)?,
            webhooks: webhook::load_all(config)?,
        })
    }
}

/// What a reload changed, by workflow name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Reloaded {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

/// One step as `workflow.get` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepRecord {
    pub id: String,
    pub status: StepStatus,
    pub attempts: u32,
    /// The steps this one waits for, from the definition the run started
    /// with: the edges of the run's graph.
    pub needs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Once the step started: its node's input, or a `for_each` step's items.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Failure>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls: Option<Vec<CallRow>>,
    /// Which worker ran each attempt.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<AttemptWorker>,
    /// With [`Workflows::logs`]: the log records of every attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<Vec<StepLog>>,
    /// While the step runs: the latest progress its capability calls reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<crate::capability::Progress>,
    /// While the step runs: the questions upstream servers asked its calls
    /// that wait for an answer (`workflow.answer`), by item.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub questions: Vec<crate::domain::QuestionRow>,
    /// While the step waits: what for, one entry per waiting item (a step
    /// that is not a `for_each` has one, item 0): `{signal, timeout_at?}`,
    /// `{sleep_until}`, `{child, workflow}` (a child run) or `{task, call,
    /// connection}` (an upstream task). A step waiting for the answer to an
    /// upstream question has its `questions` instead.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<Value>,
    /// A compensation (`<step>.compensate`): the step it undoes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compensates: Option<String>,
}

impl StepRecord {
    /// The signal the step waits for: a wait step's, or a durable node's
    /// that waits in `wait-signal`.
    pub fn waited_signal(&self) -> Option<&str> {
        if self.status != StepStatus::Waiting {
            return None;
        }
        self.waiting_for.iter().find_map(|w| w["signal"].as_str())
    }

    /// Whether the step waits for a signal ([`StepRecord::waited_signal`]).
    pub fn waits_for_signal(&self) -> bool {
        self.waited_signal().is_some()
    }
}

/// The log records one node attempt wrote (a `step.log` event).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepLog {
    pub item: u32,
    pub attempt: u32,
    pub at: String,
    /// `[{level, message}]`, as the node wrote them.
    pub records: Value,
}

/// What `workflow.get` returns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunRecord {
    pub run_id: String,
    pub workflow: String,
    pub status: Status,
    pub input: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Failure>,
    pub started_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    pub definition_hash: String,
    /// What started the run when no caller did: `{kind: "schedule", name,
    /// scheduled_at, missed}` or `{kind: "webhook", delivery}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Value>,
    /// While `queued`: why the run waits (`concurrency: key "acme" has 2
    /// of 2 running`, `rate: key "acme" used 10 of 10 in 1m`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<StepRecord>>,
}

impl From<RunRow> for RunRecord {
    fn from(r: RunRow) -> Self {
        RunRecord {
            run_id: r.run_id,
            workflow: r.workflow,
            status: r.status,
            input: r.input,
            output: r.output,
            error: r.error,
            started_at: r.started_at,
            finished_at: r.finished_at,
            definition_hash: r.definition_hash,
            trigger: r.trigger,
            queued_reason: r.queued_reason.filter(|_| r.status == RunStatus::Queued),
            steps: None,
        }
    }
}

impl WorkflowError {
    /// [`WorkflowError::UnknownWorkflow`]: `name` is none of `known`, which
    /// it lists closest first.
    pub fn unknown_workflow(name: &str, mut known: Vec<String>) -> WorkflowError {
        let lower = name.to_lowercase();
        let likeness = |k: &String| strsim::jaro_winkler(&lower, &k.to_lowercase());
        known.sort_by(|a, b| likeness(b).total_cmp(&likeness(a)).then_with(|| a.cmp(b)));
        WorkflowError::UnknownWorkflow {
            name: name.to_owned(),
            known,
        }
    }
}

/// What an unknown workflow's error adds: the likely one, and the others.
fn known_hint(name: &str, known: &[String]) -> String {
    const SHOWN: usize = 10;
    let Some(first) = known.first() else {
        return "; no workflows are configured".to_owned();
    };
    let close = strsim::jaro_winkler(&name.to_lowercase(), &first.to_lowercase()) >= 0.8;
    let mut listed = known
        .iter()
        .take(SHOWN)
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if known.len() > SHOWN {
        listed.push_str(&format!(" and {} more", known.len() - SHOWN));
    }
    match close {
        true => format!("; did you mean `{first}`? The workflows are {listed}"),
        false => format!("; the workflows are {listed}"),
    }
}

/// Why a workflow could not be loaded, started or found.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    /// `known`: the configured workflows, the closest to `name` first.
    #[error("unknown workflow `{name}`{}", known_hint(.name, .known))]
    UnknownWorkflow { name: String, known: Vec<String> },
    #[error("unknown run `{0}`")]
    UnknownRun(String),
    #[error("the host is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Definition(#[from] DefinitionError),
    #[error("workflow `{workflow}`, step `{step}`: {source}")]
    Load {
        workflow: String,
        step: String,
        source: LoadError,
    },
    #[error("workflow `{workflow}`: {message}")]
    InvalidInput { workflow: String, message: String },
    #[error("run `{run_id}` is not waiting for this signal: {message}")]
    NotWaiting { run_id: String, message: String },
    #[error("{0}")]
    InvalidPayload(String),
    #[error("run `{run_id}` is {status}; only a failed or cancelled run can be retried")]
    NotRetryable { run_id: String, status: String },
    #[error(
        "run `{run_id}` was compensated (its succeeded steps were undone): start a new run instead of retrying it"
    )]
    Compensated { run_id: String },
    #[error(
        "busy: this host drives {live} runs, its limit (`[runtime] max_live_runs`); try again in {} ms",
        retry_after.as_millis()
    )]
    Busy { live: usize, retry_after: Duration },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl WorkflowError {
    /// Whether the store refused what the caller gave it (a cursor it never
    /// returned), rather than failing itself.
    pub fn is_callers(&self) -> bool {
        matches!(self, WorkflowError::Store(StoreError::BadCursor(_)))
    }
}

/// The configured workflows and every run of them.
pub struct Workflows {
    runtime: Arc<Runtime>,
    /// What the config defines now; a reload swaps it. Runs keep the
    /// definition they started with.
    loaded: std::sync::RwLock<Arc<Loaded>>,
    /// Bumped when a reload changes the exposed workflows.
    exposed_changes: watch::Sender<u64>,
    events: events::Events,
    store: Arc<dyn Store>,
    /// Loaded components by content hash.
    nodes: Mutex<HashMap<String, Node>>,
    /// Step slots shared by every run (`max_concurrent_steps`).
    slots: Arc<Semaphore>,
    live: Mutex<HashMap<String, Live>>,
    options: Options,
    /// Owns every run task; shutdown waits on it.
    tasks: TaskTracker,
    /// Stops every run at once, leaving them to be resumed (shutdown past the
    /// grace period).
    shutdown: CancellationToken,
    /// Ends `workflow.wait` long-polls when shutdown begins.
    closing: CancellationToken,
    /// Finished runs since the last prune.
    finished_since_prune: std::sync::atomic::AtomicU64,
    generations: std::sync::atomic::AtomicU64,
    /// Runs paused by this process, counted after each pause's write and
    /// before it looks for the run's driver: a driver launched with no pause
    /// counted since its run was stored knows without a read that no pause
    /// here missed it.
    pauses: std::sync::atomic::AtomicU64,
    /// This process among the workers of the store.
    worker: maintenance::Worker,
    /// Whether it is the store's only worker.
    mode: Mode,
    /// Runs of this process that sleep ([`engine::Asleep`]).
    asleep: Arc<std::sync::atomic::AtomicUsize>,
    /// Wakes the scheduler: a reload changed the schedules.
    schedules_changed: Arc<tokio::sync::Notify>,
    /// Held by the admission pass ([`flow`]): one at a time here.
    admitting: tokio::sync::Mutex<()>,
    /// The workflows paused as a whole, as this process last read them
    /// (exact alone; on a shared store, read again every admission pass).
    paused_workflows: Mutex<std::collections::BTreeSet<String>>,
    /// Runs whose driver stopped because the state's disk was full, and
    /// whether a task is waiting for room to drive them again.
    stalled: Mutex<(std::collections::BTreeSet<String>, bool)>,
    /// Runs being driven again now ([`Workflows::drive_again`]): the waker
    /// and a signal may wake the same run at once; one drives it.
    waking: Mutex<std::collections::BTreeSet<String>>,
    /// Bumped after every admission pass that admitted a run: a waiter on
    /// a queued run looks again.
    admissions: watch::Sender<u64>,
}

impl Workflows {
    /// Loads every `[workflows.*]` of `config` (definitions and components)
    /// and opens the state.
    ///
    /// # Errors
    /// A [`WorkflowError`] naming the workflow, the step and the problem.
    pub async fn open(
        config: &crate::config::Config,
        runtime: Arc<Runtime>,
        options: Options,
    ) -> Result<Arc<Self>, WorkflowError> {
        let loaded = Loaded::from_config(config, &runtime)?;
        let store = crate::store::open(&options.state).await?;
        let closing = CancellationToken::new();
        let events = events::Events::new(store.clone());
        let this = Arc::new(Workflows {
            runtime,
            loaded: std::sync::RwLock::new(Arc::new(loaded)),
            exposed_changes: watch::channel(0).0,
            events: events.clone(),
            store: store.clone(),
            nodes: Mutex::default(),
            slots: Arc::new(Semaphore::new(options.max_concurrent_steps.max(1))),
            live: Mutex::default(),
            tasks: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            worker: maintenance::Worker::new(options.lease),
            mode: Mode::of(&*store),
            asleep: Arc::default(),
            schedules_changed: Arc::default(),
            admitting: tokio::sync::Mutex::default(),
            paused_workflows: Mutex::default(),
            stalled: Mutex::default(),
            waking: Mutex::default(),
            admissions: watch::channel(0).0,
            options,
            closing: closing.clone(),
            finished_since_prune: Default::default(),
            generations: Default::default(),
            pauses: Default::default(),
        });
        this.load_nodes(&this.loaded())?;
        this.mode.join(&this).await?;
        if this.store.feeds_from_log() {
            this.tasks.spawn(events.tail(closing));
        }
        Ok(this)
    }

    /// Loads (and so checks) the component of every step of `loaded`.
    fn load_nodes(&self, loaded: &Loaded) -> Result<(), WorkflowError> {
        for def in loaded.definitions.values() {
            for step in def.steps.iter().filter(|s| s.spec.runs_node()) {
                self.node_for(&step.spec).map_err(|e| match e {
                    NodeError::Load(source) => WorkflowError::Load {
                        workflow: def.name.clone(),
                        step: step.spec.id.clone(),
                        source,
                    },
                    NodeError::Changed(now) => WorkflowError::Definition(DefinitionError::Step {
                        workflow: def.name.clone(),
                        step: step.spec.id.clone(),
                        message: format!(
                            "component `{}` changed while loading (now {now})",
                            step.spec.component.display()
                        ),
                    }),
                })?;
            }
        }
        Ok(())
    }

    fn loaded(&self) -> Arc<Loaded> {
        self.loaded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the workflows with those of `config`, all or nothing: a
    /// config that does not load changes nothing. Running runs go on with the
    /// definition they started with. Says which workflows were added,
    /// removed or changed.
    ///
    /// # Errors
    /// As [`Workflows::open`].
    pub fn reload(&self, config: &crate::config::Config) -> Result<Reloaded, WorkflowError> {
        let next = Loaded::from_config(config, &self.runtime)?;
        self.load_nodes(&next)?;
        let mut slot = self.loaded.write().unwrap_or_else(|e| e.into_inner());
        let before = slot.clone();
        let names = |l: &Loaded| -> BTreeSet<String> { l.definitions.keys().cloned().collect() };
        let report = Reloaded {
            added: names(&next).difference(&names(&before)).cloned().collect(),
            removed: names(&before).difference(&names(&next)).cloned().collect(),
            changed: next
                .definitions
                .iter()
                .filter(|(name, d)| {
                    before
                        .definitions
                        .get(*name)
                        .is_some_and(|b| b.hash != d.hash)
                })
                .map(|(name, _)| name.clone())
                .collect(),
        };
        let exposed_changed = !mcp::same_exposed(&before.exposed, &next.exposed);
        *slot = Arc::new(next);
        drop(slot);
        self.schedules_changed.notify_one();
        if exposed_changed {
            self.exposed_changes.send_modify(|n| *n += 1);
        }
        Ok(report)
    }

    /// Changes whenever a reload changes the exposed workflows.
    pub fn watch_exposed(&self) -> watch::Receiver<u64> {
        self.exposed_changes.subscribe()
    }

    /// Starts driving every run the state holds as `running` (the last
    /// process stopped or crashed while they ran), and the background pruner.
    /// Returns how many runs were resumed.
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    /// On a shared store, starts claiming runs instead: an unfinished run is
    /// resumed by whichever worker claims it once its lease has expired.
    pub async fn resume(self: &Arc<Self>) -> Result<usize, WorkflowError> {
        self.read_paused_workflows().await?;
        let count = self.mode.resume(self).await?;
        // After the resumed runs are driven: a pass counts them as running.
        maintenance::start_admitter(self);
        maintenance::start_pruner(self);
        maintenance::start_scheduler(self);
        maintenance::start_waker(self);
        Ok(count)
    }

    /// The workflows offered as MCP tools.
    pub fn exposed(&self) -> Vec<Arc<Exposed>> {
        self.loaded().exposed.values().cloned().collect()
    }

    /// The exposed workflow `name`, if it is one.
    pub fn exposed_workflow(&self, name: &str) -> Option<Arc<Exposed>> {
        self.loaded().exposed.get(name).cloned()
    }

    /// Whether shutdown has begun (waits return at once from then on).
    pub fn is_closing(&self) -> bool {
        self.closing.is_cancelled()
    }

    /// Cancelled when shutdown begins: long-lived streams end on it.
    pub fn closing_token(&self) -> CancellationToken {
        self.closing.clone()
    }

    /// How many runs are executing in this process now.
    pub fn running(&self) -> usize {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// How many of the runs executing in this process wait (a durable
    /// sleep) and hold no step slot.
    pub fn waiting(&self) -> usize {
        use std::sync::atomic::Ordering;
        self.asleep.load(Ordering::Acquire)
    }

    /// How many runs count against the runs this process takes on: those
    /// that execute and do not sleep (a sleeping run holds no step slot).
    fn busy(&self) -> usize {
        self.running().saturating_sub(self.waiting())
    }

    /// The configured workflow names.
    pub fn names(&self) -> Vec<String> {
        self.loaded().definitions.keys().cloned().collect()
    }

    /// How many unfinished runs each workflow has on each definition:
    /// `(workflow, definition_hash, runs)`.
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn live_definitions(&self) -> Result<Vec<(String, String, u64)>, WorkflowError> {
        Ok(self.store.live_definitions().await?)
    }

    /// Per workflow, the definition in force (`current`, its hash) and the
    /// definitions its unfinished runs are on (`live: [{hash, runs}]`),
    /// also of workflows no longer configured.
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn definitions_status(&self) -> Result<Value, WorkflowError> {
        let mut out = serde_json::Map::new();
        for (name, def) in &self.loaded().definitions {
            out.insert(name.clone(), json!({"current": def.hash, "live": []}));
        }
        for (workflow, hash, runs) in self.live_definitions().await? {
            let entry = out
                .entry(workflow)
                .or_insert_with(|| json!({"current": null, "live": []}));
            if let Some(live) = entry["live"].as_array_mut() {
                live.push(json!({"hash": hash, "runs": runs}));
            }
        }
        Ok(Value::Object(out))
    }

    /// The `input_schema` of each workflow that has one, by name.
    pub fn input_schemas(&self) -> BTreeMap<String, Value> {
        self.loaded()
            .definitions
            .iter()
            .filter_map(|(name, def)| Some((name.clone(), def.spec.input_schema.clone()?)))
            .collect()
    }

    /// The definition of `workflow`.
    pub fn definition(&self, workflow: &str) -> Option<Arc<Definition>> {
        self.loaded().definitions.get(workflow).cloned()
    }

    /// The state's backend, location and counts, for `host.status`.
    ///
    /// Where the state is: its backend and its path or URL (without a
    /// password).
    /// Why the host is degraded, while it is: the state's disk is full
    /// (reads are answered; starts and runs' progress wait for room).
    pub fn degraded(&self) -> Option<String> {
        self.store.degraded()
    }

    pub fn state_location(&self) -> (&'static str, String) {
        (self.store.backend(), self.store.location())
    }

    /// How loaded this process is, for `host.status`: the runs it drives
    /// and its limit (`busy` at the limit: new starts are refused), the
    /// starts it refused by reason and its failed writes to the state by
    /// kind, since it started.
    pub fn load_status(&self) -> Value {
        let live = self.running();
        let metrics = crate::metrics::metrics();
        json!({
            "live_runs": live,
            "max_live_runs": self.options.max_live_runs,
            "busy": live >= self.options.max_live_runs,
            "refused": metrics.refusals(),
            "store_errors": metrics.store_errors(),
        })
    }

    /// The state's counts of runs (every worker's).
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn counts(&self) -> Result<Counts, WorkflowError> {
        Ok(self.store.counts().await?)
    }

    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn state_status(&self) -> Result<Value, WorkflowError> {
        let Counts {
            runs_running,
            runs_queued,
            runs_paused,
            runs_total,
            runs_waiting_for_signal,
            runs_asleep,
            last_event_id,
        } = self.store.counts().await?;
        Ok(json!({
            "backend": self.store.backend(),
            "path": self.store.location(),
            "degraded": self.degraded(),
            "runs_running": runs_running,
            "runs_queued": runs_queued,
            "runs_paused": runs_paused,
            "runs_total": runs_total,
            "runs_waiting_for_signal": runs_waiting_for_signal,
            "runs_asleep": runs_asleep,
            "last_event_id": last_event_id,
        }))
    }

    /// Every schedule of the config, with its next tick and what its last
    /// fired tick started, for `host.status` and the console.
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn schedules_status(&self) -> Result<Vec<Value>, WorkflowError> {
        let rows = self.store.schedules().await?;
        let now = crate::domain::now_ms();
        Ok(self
            .loaded()
            .schedules
            .iter()
            .map(|s| {
                let row = rows
                    .iter()
                    .find(|r| r.workflow == s.workflow && r.name == s.name);
                let fired = row.filter(|r| r.last_run_id.is_some());
                json!({
                    "workflow": s.workflow,
                    "name": s.name,
                    "cron": s.pattern,
                    "timezone": s.timezone.name(),
                    "overlap": s.overlap,
                    "catch_up": s.catch_up,
                    "next_at": s.next_after(now).map(schedule::rfc3339),
                    "last_tick_at": fired.map(|r| schedule::rfc3339(r.last_tick_ms)),
                    "last_run_id": fired.and_then(|r| r.last_run_id.clone()),
                })
            })
            .collect())
    }

    /// The workflows with a webhook (`POST /hooks/<name>`).
    pub fn webhooks(&self) -> Vec<String> {
        self.loaded().webhooks.keys().cloned().collect()
    }

    /// This worker (`{id, started_at}`) and, on a shared store, every worker
    /// seen within three leases, for `host.status`.
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn worker_status(&self) -> Result<(Value, Value), WorkflowError> {
        let me = json!({"id": &*self.worker.id, "started_at": self.worker.started_at});
        let workers = self.mode.workers(self).await?;
        Ok((me, json!(workers)))
    }

    /// The runs this process drives now.
    pub(crate) fn held_runs(&self) -> Vec<String> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Stops a run here without recording anything (its lease is lost).
    pub(crate) fn stop_local(&self, run_id: &str) {
        self.with_live(run_id, |live| live.stop.cancel());
    }

    /// Pauses a run if this process drives it (its steps running finish).
    pub(crate) fn pause_local(&self, run_id: &str) {
        self.with_live(run_id, |live| live.pause.send_replace(true));
    }

    /// Cancels a run if this process drives it.
    pub(crate) fn cancel_local(&self, run_id: &str) -> bool {
        self.with_live(run_id, |live| live.cancel.cancel())
            .is_some()
    }

    /// `f` of the run's live entry, when this process drives `run_id`.
    fn with_live<T>(&self, run_id: &str, f: impl FnOnce(&Live) -> T) -> Option<T> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(run_id)
            .map(f)
    }

    /// The run as stored, or [`WorkflowError::UnknownRun`].
    async fn stored_run(&self, run_id: &str) -> Result<RunRow, WorkflowError> {
        self.store
            .run(run_id)
            .await?
            .ok_or_else(|| WorkflowError::UnknownRun(run_id.to_owned()))
    }

    /// The workflow of the run `run_id` (what a token's scopes are about).
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`], [`WorkflowError::Store`].
    pub async fn workflow_of(&self, run_id: &str) -> Result<String, WorkflowError> {
        Ok(self.stored_run(run_id).await?.workflow)
    }

    /// The record of `run_id` with its steps, and their calls when `calls`.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`], [`WorkflowError::Store`].
    pub async fn get(&self, run_id: &str, calls: bool) -> Result<RunRecord, WorkflowError> {
        let run = self.stored_run(run_id).await?;
        let progress: HashMap<String, crate::capability::Progress> = self
            .with_live(run_id, |l| {
                l.progress.lock().unwrap_or_else(|e| e.into_inner()).clone()
            })
            .unwrap_or_default();
        // The graph of the definition the run started with, not today's.
        let mut needs: HashMap<String, Vec<String>> = Spec::deserialize(&*run.definition)
            .map(|spec| spec.steps.into_iter().map(|s| (s.id, s.needs)).collect())
            .unwrap_or_default();
        let mut questions = if run.status == RunStatus::Running {
            self.store.questions(run_id).await?
        } else {
            Vec::new()
        };
        let rows = self.store.steps(run_id).await?;
        // What its parked steps wait for, from the events that say so.
        let mut parked =
            if !run.status.is_finished() && rows.iter().any(|r| r.status == StepStatus::Running) {
                self.parked_steps(run_id).await?
            } else {
                HashMap::new()
            };
        let mut steps = Vec::new();
        for row in rows {
            let asked: Vec<_> = if row.status == StepStatus::Running {
                questions
                    .extract_if(.., |q| q.step_id == row.step_id)
                    .collect()
            } else {
                Vec::new()
            };
            let calls = if calls {
                Some(self.store.calls(run_id, &row.step_id).await?)
            } else {
                None
            };
            let waiting_for: Vec<Value> = match row.status {
                // A wait step: its signal, and until when.
                StepStatus::Waiting => {
                    let input = row.input.as_ref().unwrap_or(&Value::Null);
                    vec![
                        json!({"item": 0, "signal": input["signal"], "timeout_at": input["timeout_at"]}),
                    ]
                }
                // A step its upstream asked a question waits for the answer
                // (its `questions`); a parked one, for what it parked on.
                StepStatus::Running if asked.is_empty() => parked
                    .remove(&row.step_id)
                    .map(|items| items.into_values().collect())
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            steps.push(StepRecord {
                // A step that waits while its node is let go, or for the
                // answer to a question its upstream asked, is stored
                // `running`: after a restart its node runs again (and waits,
                // or is asked, again).
                status: if asked.is_empty() && waiting_for.is_empty() {
                    row.status
                } else {
                    StepStatus::Waiting
                },
                attempts: row.attempts,
                // A compensation is drawn after the step it undoes.
                needs: match definition::compensated_by(&row.step_id) {
                    Some(undone) => vec![undone.to_owned()],
                    None => needs.remove(&row.step_id).unwrap_or_default(),
                },
                compensates: definition::compensated_by(&row.step_id).map(str::to_owned),
                started_at: row.started_at,
                finished_at: row.finished_at,
                input: row.input,
                output: row.output,
                error: row.error,
                calls,
                workers: row.workers,
                logs: None,
                progress: (row.status == StepStatus::Running)
                    .then(|| progress.get(&row.step_id).cloned())
                    .flatten(),
                questions: asked,
                waiting_for,
                id: row.step_id,
            });
        }
        let mut record = RunRecord::from(run);
        record.steps = Some(steps);
        Ok(record)
    }

    /// What the parked items of `run_id`'s steps wait for, by step and
    /// item: each item's last `step.parked` event that no later
    /// `step.resumed`, `step.started` or `step.finished` of it (or of its
    /// step) ended.
    async fn parked_steps(
        &self,
        run_id: &str,
    ) -> Result<HashMap<String, BTreeMap<u64, Value>>, WorkflowError> {
        let mut parked: HashMap<String, BTreeMap<u64, Value>> = HashMap::new();
        self.each_event(run_id, |event| {
            let Value::Object(mut data) = event.data else {
                return;
            };
            let Some(Value::String(step)) = data.remove("step") else {
                return;
            };
            let item = data.get("item").and_then(Value::as_u64);
            match event.kind.as_str() {
                "step.parked" => {
                    let item = item.unwrap_or(0);
                    data.insert("item".into(), json!(item));
                    parked
                        .entry(step)
                        .or_default()
                        .insert(item, Value::Object(data));
                }
                "step.resumed" => {
                    if let Some(items) = parked.get_mut(&step) {
                        items.remove(&item.unwrap_or(0));
                    }
                }
                "step.started" | "step.finished" => {
                    parked.remove(&step);
                }
                _ => {}
            }
        })
        .await?;
        Ok(parked)
    }

    /// The log records of `run_id`'s node attempts, by step, oldest first
    /// (read from its `step.log` events).
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn logs(&self, run_id: &str) -> Result<HashMap<String, Vec<StepLog>>, WorkflowError> {
        let mut logs: HashMap<String, Vec<StepLog>> = HashMap::new();
        self.each_event(run_id, |mut event| {
            if event.kind != STEP_LOG {
                return;
            }
            let number = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
            let (Some(step), Some(item), Some(attempt)) = (
                event.data["step"].as_str().map(str::to_owned),
                number(&event.data["item"]),
                number(&event.data["attempt"]),
            ) else {
                return;
            };
            logs.entry(step).or_default().push(StepLog {
                item,
                attempt,
                at: event.at,
                records: event.data["records"].take(),
            });
        })
        .await?;
        Ok(logs)
    }

    /// Every kept event of `run_id`, oldest first, read a page at a time.
    async fn each_event(
        &self,
        run_id: &str,
        mut each: impl FnMut(crate::domain::EventRow),
    ) -> Result<(), WorkflowError> {
        const PAGE: u32 = 500;
        let mut after = 0;
        loop {
            let page = self.store.events(Some(run_id), after, PAGE).await?;
            let full = page.len() == PAGE as usize;
            for event in page {
                after = event.id;
                each(event);
            }
            if !full {
                return Ok(());
            }
        }
    }

    /// Live events of every run, as they are kept. A subscriber that falls
    /// behind gets `Lagged` and should catch up with [`Workflows::events`].
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<crate::domain::EventRow> {
        self.events.subscribe()
    }

    /// Kept events past `after` (an event id), oldest first: of `run_id`, or
    /// of every run.
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn events(
        &self,
        run_id: Option<&str>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<crate::domain::EventRow>, WorkflowError> {
        Ok(self.store.events(run_id, after, limit).await?)
    }

    /// Waits until `run_id` has finished, `timeout` passes or shutdown
    /// begins; returns the record either way.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`], [`WorkflowError::Store`].
    pub async fn wait(&self, run_id: &str, timeout: Duration) -> Result<RunRecord, WorkflowError> {
        self.wait_then(run_id, timeout, true).await
    }

    /// [`Workflows::wait`], returning the run without its steps (one read of
    /// the store instead of two, for a caller that shows only the run).
    ///
    /// # Errors
    /// As [`Workflows::wait`].
    pub async fn wait_run(
        &self,
        run_id: &str,
        timeout: Duration,
    ) -> Result<RunRecord, WorkflowError> {
        self.wait_then(run_id, timeout, false).await
    }

    async fn wait_then(
        &self,
        run_id: &str,
        timeout: Duration,
        steps: bool,
    ) -> Result<RunRecord, WorkflowError> {
        let read = async || {
            if steps {
                return self.get(run_id, false).await;
            }
            Ok(RunRecord::from(self.stored_run(run_id).await?))
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let done = match self.store.listen() {
            Some(_) => self.live_done(run_id),
            None => match self.admitted_here(run_id, deadline).await? {
                Some(done) => done,
                None => return read().await,
            },
        };
        if let Some(mut done) = done {
            loop {
                let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
                tokio::select! {
                    _ = tokio::time::timeout(timeout, done.wait_for(|d| matches!(d, Done::Ended(_)))) => {}
                    _ = self.closing.cancelled() => {}
                }
                // The run as its end stored it: no read, unless its steps are
                // wanted too.
                if let (false, Done::Ended(Some(run))) = (steps, &*done.borrow()) {
                    return Ok(RunRecord::clone(run));
                }
                let record = read().await?;
                let now = tokio::time::Instant::now();
                if record.status.is_finished() || now >= deadline || self.closing.is_cancelled() {
                    return Ok(record);
                }
                // Its driver ended and the run goes on (resumed, or moved to
                // another definition: driven anew) or is paused (no driver
                // until resumed): the next driver's end, or a look a second on.
                done = match self.live_done(run_id) {
                    Some(next) => next,
                    None => {
                        tokio::select! {
                            _ = tokio::time::sleep((deadline - now).min(Duration::from_secs(1))) => {}
                            _ = self.closing.cancelled() => {}
                        }
                        match self.live_done(run_id) {
                            Some(next) => next,
                            None => {
                                let (tx, rx) = watch::channel(Done::Ended(None));
                                drop(tx);
                                rx
                            }
                        }
                    }
                };
            }
        }
        let Some(mut notes) = self.store.listen() else {
            return read().await;
        };
        // Driven by another worker (or by nobody yet): its end comes as a
        // note; the poll covers a note missed while the listener reconnected.
        loop {
            let record = read().await?;
            let now = tokio::time::Instant::now();
            if record.status.is_finished() || now >= deadline || self.closing.is_cancelled() {
                return Ok(record);
            }
            let poll = (deadline - now).min(Duration::from_secs(1));
            let finished = async {
                loop {
                    match notes.recv().await {
                        Ok(Note::Finished(id)) if id == run_id => return,
                        Ok(Note::Reconnected) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            };
            tokio::select! {
                () = finished => {}
                _ = tokio::time::sleep(poll) => {}
                _ = self.closing.cancelled() => {}
            }
        }
    }

    /// The live run's end, when this process drives `run_id`.
    fn live_done(&self, run_id: &str) -> Option<watch::Receiver<Done>> {
        self.with_live(run_id, |l| l.done.clone())
    }

    /// Alone: waits, up to `deadline`, for a queued run to be admitted and
    /// driven here; then its end ([`Workflows::live_done`]), or `None` when
    /// it is neither queued nor driven here. `None` past the deadline (or
    /// at shutdown), the run still queued.
    async fn admitted_here(
        &self,
        run_id: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Option<Option<watch::Receiver<Done>>>, WorkflowError> {
        let mut admissions = self.admissions.subscribe();
        loop {
            if let Some(done) = self.live_done(run_id) {
                return Ok(Some(Some(done)));
            }
            let run = self.stored_run(run_id).await?;
            // Admitted but not driven yet: the pass that admitted it is
            // launching it, and bumps `admissions` once it has.
            let admitting = run.status == RunStatus::Running && run.admitted_ms.is_some();
            if run.status != RunStatus::Queued && !admitting {
                if run.status.is_finished() {
                    return Ok(Some(None));
                }
                // Unfinished with no driver here (asleep, paused): the
                // caller looks again until one drives it or it ends.
                let (tx, ended) = watch::channel(Done::Ended(None));
                drop(tx);
                return Ok(Some(Some(ended)));
            }
            if tokio::time::Instant::now() >= deadline || self.closing.is_cancelled() {
                return Ok(None);
            }
            let poll = if admitting {
                Duration::from_millis(50)
            } else {
                Duration::from_secs(1)
            };
            tokio::select! {
                _ = admissions.changed() => {}
                _ = tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + poll)) => {}
                _ = self.closing.cancelled() => {}
            }
        }
    }

    /// A page of runs, newest first, and the cursor of the next page.
    ///
    /// # Errors
    /// [`WorkflowError::Store`] (a bad cursor among them).
    pub async fn list(
        &self,
        query: &ListQuery,
    ) -> Result<(Vec<RunRecord>, Option<String>), WorkflowError> {
        let (runs, next) = self.store.list_runs(query).await?;
        Ok((runs.into_iter().map(RunRecord::from).collect(), next))
    }

    /// Stops new runs and ends waits, lets running runs go on for up to
    /// `grace`, then stops the rest. Stopped runs stay `running` in the state
    /// and resume at the next start.
    pub async fn shutdown(&self, grace: Duration) {
        self.tasks.close();
        self.closing.cancel();
        if tokio::time::timeout(grace, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "runs still going after the grace period; stopping them (they resume at the next start)"
            );
            self.shutdown.cancel();
            self.tasks.wait().await;
        }
    }
}
