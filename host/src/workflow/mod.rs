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
mod worker;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::runtime::{LoadError, Node, Runtime};
use crate::store::memory::MemoryStore;
use crate::store::postgres::PgStore;
use crate::store::sqlite::SqliteStore;
use crate::store::{
    AttemptWorker, CallRow, CancelRequest, Counts, Created, Failure, Fence, Lease, ListQuery,
    NewRun, Note, RunRow, RunStatus, STEP_LOG, StepRow, StepStatus, Store, StoreError, now_ms,
    now_text,
};
use crate::trace::{self, TraceParent};
pub use definition::{Definition, DefinitionError, Spec};
use engine::{Ending, RunCtx};
pub use worker::DEFAULT_LEASE;

/// The run state a client sees (`status` of `workflow.get`).
pub type Status = RunStatus;

/// Default number of finished runs kept.
pub const DEFAULT_KEEP_RUNS: u64 = 10_000;
/// Most runs that finish between two prunes. Deleting a finished run with
/// its steps and events took the SQLite writer about 60 µs here; one prune
/// of 1,250 runs (an eighth of the default `keep_runs`) held every other
/// write for 75 ms, the p99 of a JSON-RPC load.
const PRUNE_BATCH: u64 = 64;
/// Default age past which finished runs are pruned.
pub const DEFAULT_KEEP_FOR: Duration = Duration::from_secs(30 * 24 * 3600);
/// Default number of steps that may run at once.
pub const DEFAULT_MAX_CONCURRENT_STEPS: usize = 64;
/// How often finished runs are pruned in the background.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// How the workflow engine is set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// A SQLite file, `:memory:`, or a `postgres://` URL (shared by workers).
    pub state: String,
    pub max_concurrent_steps: usize,
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
            keep_runs: DEFAULT_KEEP_RUNS,
            keep_for: DEFAULT_KEEP_FOR,
            lease: DEFAULT_LEASE,
        }
    }
}

/// The workflows of one config: definitions and what is exposed.
struct Loaded {
    definitions: BTreeMap<String, Definition>,
    exposed: BTreeMap<String, Arc<Exposed>>,
}

impl Loaded {
    fn from_config(
        config: &crate::config::Config,
        runtime: &Runtime,
    ) -> Result<Loaded, WorkflowError> {
        Ok(Loaded {
            definitions: definition::load_all(config, runtime.limits())?,
            exposed: exposed_workflows(config)?,
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

fn same_exposed(a: &BTreeMap<String, Arc<Exposed>>, b: &BTreeMap<String, Arc<Exposed>>) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((na, ea), (nb, eb))| {
            na == nb
                && ea.title == eb.title
                && ea.description == eb.description
                && ea.input_schema == eb.input_schema
                && ea.output_schema == eb.output_schema
        })
}

/// A workflow offered as an MCP tool (`expose = true`).
#[derive(Debug)]
pub struct Exposed {
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    /// The input schema (an object schema), or an open object schema.
    pub input_schema: Arc<Map<String, Value>>,
    pub output_schema: Option<Arc<Map<String, Value>>>,
    output_validator: Option<Arc<jsonschema::Validator>>,
    /// How many steps a run has, for progress.
    pub steps: usize,
}

impl Exposed {
    /// `Some(problem)` when `output` breaks the declared output schema.
    pub fn check_output(&self, output: &Value) -> Option<String> {
        let error = self.output_validator.as_ref()?.iter_errors(output).next()?;
        let path = error.instance_path().to_string();
        Some(if path.is_empty() {
            error.to_string()
        } else {
            format!("`{path}`: {error}")
        })
    }
}

/// The `expose = true` workflows of `config`, checked: MCP tool arguments and
/// structured results are JSON objects, so their schemas must describe objects.
fn exposed_workflows(
    config: &crate::config::Config,
) -> Result<BTreeMap<String, Arc<Exposed>>, WorkflowError> {
    let mut exposed = BTreeMap::new();
    for (name, w) in config.workflows.iter().filter(|(_, w)| w.expose) {
        let invalid = |message: String| {
            WorkflowError::Definition(DefinitionError::Workflow {
                workflow: name.clone(),
                message,
            })
        };
        let object_schema = |key: &str, schema: &Value| match schema {
            Value::Object(map) if map.get("type").is_none_or(|t| t == "object") => {
                Ok(Arc::new(map.clone()))
            }
            _ => Err(invalid(format!(
                "`expose = true` needs an `{key}` of `type = \"object\"`: MCP tool arguments and structured results are objects"
            ))),
        };
        let input_schema = match &w.input_schema {
            Some(schema) => object_schema("input_schema", schema)?,
            None => Arc::new(
                json!({"type": "object"})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            ),
        };
        let (output_schema, output_validator) = match &w.output_schema {
            Some(schema) => {
                let validator = jsonschema::validator_for(schema).map_err(|e| {
                    invalid(format!("`output_schema` is not a valid JSON Schema: {e}"))
                })?;
                (
                    Some(object_schema("output_schema", schema)?),
                    Some(Arc::new(validator)),
                )
            }
            None => (None, None),
        };
        let steps = w.steps.len().max(1);
        exposed.insert(
            name.clone(),
            Arc::new(Exposed {
                name: name.clone(),
                title: w.title.clone(),
                description: w.description.clone(),
                input_schema,
                output_schema,
                output_validator,
                steps,
            }),
        );
    }
    Ok(exposed)
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
            steps: None,
        }
    }
}

/// Why a workflow could not be loaded, started or found.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    #[error("unknown workflow `{0}`")]
    UnknownWorkflow(String),
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
    #[error("run `{run_id}` is {status}; only a failed or cancelled run can be retried")]
    NotRetryable { run_id: String, status: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A run driven by this process.
struct Live {
    /// Which launch this is: a retried run gets a new entry, and the old
    /// task must not remove it.
    generation: u64,
    cancel: CancellationToken,
    /// Becomes [`Done::Ended`] once the run's task has ended; waiters watch it.
    done: watch::Receiver<Done>,
    progress: engine::StepProgress,
    /// Stops the run here and leaves its state for whoever drives it next:
    /// shutdown past the grace period, or a lease this worker lost.
    stop: CancellationToken,
}

/// A live run as its waiters see it.
#[derive(Debug)]
enum Done {
    Running,
    /// The run's task has ended. With the run as its end stored it, where
    /// that is exact ([`Store::stamps_with_event_time`]); without, a waiter
    /// reads it.
    Ended(Option<Box<RunRecord>>),
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
    /// This process among the workers of the store.
    worker: worker::Worker,
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
        let store: Arc<dyn Store> = if is_postgres_url(&options.state) {
            Arc::new(PgStore::open(&options.state).await?)
        } else if options.state == ":memory:" {
            Arc::new(MemoryStore::new())
        } else {
            Arc::new(SqliteStore::open(&options.state).await?)
        };
        let closing = CancellationToken::new();
        let events = events::Events::new(store.clone());
        let this = Arc::new(Workflows {
            runtime,
            loaded: std::sync::RwLock::new(Arc::new(loaded)),
            exposed_changes: watch::channel(0).0,
            events: events.clone(),
            store,
            nodes: Mutex::default(),
            slots: Arc::new(Semaphore::new(options.max_concurrent_steps.max(1))),
            live: Mutex::default(),
            tasks: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            worker: worker::Worker::new(options.lease),
            options,
            closing: closing.clone(),
            finished_since_prune: Default::default(),
            generations: Default::default(),
        });
        this.load_nodes(&this.loaded())?;
        if this.store.shared() {
            // Listed among the workers before anything is served: a
            // `host.status` right after start-up sees this worker.
            this.store.heartbeat(&this.worker_row()).await?;
            worker::start_upkeep(&this);
        }
        if this.store.feeds_from_log() {
            this.tasks.spawn(events.tail(closing));
        }
        Ok(this)
    }

    /// Loads (and so checks) the component of every step of `loaded`.
    fn load_nodes(&self, loaded: &Loaded) -> Result<(), WorkflowError> {
        for def in loaded.definitions.values() {
            for step in &def.steps {
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
        let exposed_changed = !same_exposed(&before.exposed, &next.exposed);
        *slot = Arc::new(next);
        drop(slot);
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
        let mut count = 0;
        if self.store.shared() {
            worker::start_claimer(self);
        } else {
            let runs = self.store.unfinished_runs().await?;
            count = runs.len();
            for run in runs {
                tracing::info!(run = %run.run_id, workflow = %run.workflow, "resuming run");
                let fence = self.local_fence();
                self.launch_stored(run, true, fence).await?;
            }
        }
        let this = Arc::downgrade(self);
        let stop = self.closing.clone();
        self.tasks.spawn(async move {
            loop {
                if let Some(this) = this.upgrade() {
                    this.prune().await;
                }
                tokio::select! {
                    _ = tokio::time::sleep(PRUNE_EVERY) => {}
                    _ = stop.cancelled() => return,
                }
            }
        });
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

    /// The configured workflow names.
    pub fn names(&self) -> Vec<String> {
        self.loaded().definitions.keys().cloned().collect()
    }

    /// The definition of `workflow`.
    pub fn definition(&self, workflow: &str) -> Option<Definition> {
        self.loaded().definitions.get(workflow).cloned()
    }

    /// The state's backend, location and counts, for `host.status`.
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn state_status(&self) -> Result<Value, WorkflowError> {
        let Counts {
            runs_running,
            runs_total,
            last_event_id,
        } = self.store.counts().await?;
        Ok(json!({
            "backend": self.store.backend(),
            "path": self.store.location(),
            "runs_running": runs_running,
            "runs_total": runs_total,
            "last_event_id": last_event_id,
        }))
    }

    /// This worker (`{id, started_at}`) and, on a shared store, every worker
    /// seen within three leases, for `host.status`.
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn worker_status(&self) -> Result<(Value, Value), WorkflowError> {
        let me = json!({"id": &*self.worker.id, "started_at": self.worker.started_at});
        let workers = if self.store.shared() {
            self.store.workers(self.worker.lease * 3).await?
        } else {
            vec![self.worker_row()]
        };
        Ok((me, json!(workers)))
    }

    /// The fence of a run on a store with one worker.
    fn local_fence(&self) -> Fence {
        Fence {
            worker: self.worker.id.clone(),
            epoch: 0,
        }
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
        if let Some(live) = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(run_id)
        {
            live.stop.cancel();
        }
    }

    /// Cancels a run if this process drives it.
    pub(crate) fn cancel_local(&self, run_id: &str) -> bool {
        match self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(run_id)
        {
            Some(live) => {
                live.cancel.cancel();
                true
            }
            None => false,
        }
    }

    fn node_for(&self, spec: &definition::StepSpec) -> Result<Node, NodeError> {
        if let Some(node) = self
            .nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&spec.component_hash)
        {
            return Ok(node.clone());
        }
        let bytes = crate::runtime::read_component(&spec.component).map_err(NodeError::Load)?;
        let hash = definition::content_hash(&bytes);
        if hash != spec.component_hash {
            return Err(NodeError::Changed(hash));
        }
        let node = self
            .runtime
            .load_bytes(&crate::runtime::node_name(&spec.component), &bytes)
            .map_err(NodeError::Load)?;
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(hash, node.clone());
        Ok(node)
    }

    /// Starts `workflow` on `input`. With an idempotency key already used for
    /// this workflow, returns that run instead of starting another.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownWorkflow`], [`WorkflowError::InvalidInput`] when
    /// the input breaks `input_schema`, [`WorkflowError::ShuttingDown`].
    pub async fn start(
        self: &Arc<Self>,
        workflow: &str,
        input: Value,
        idempotency_key: Option<String>,
    ) -> Result<RunRecord, WorkflowError> {
        self.start_traced(workflow, input, idempotency_key, &TraceParent::none())
            .await
    }

    /// [`Workflows::start`], continuing the caller's trace: the run's span
    /// is a child of `parent` when it is a valid context.
    ///
    /// # Errors
    /// As [`Workflows::start`].
    pub async fn start_traced(
        self: &Arc<Self>,
        workflow: &str,
        input: Value,
        idempotency_key: Option<String>,
        parent: &TraceParent,
    ) -> Result<RunRecord, WorkflowError> {
        let def = self
            .definition(workflow)
            .ok_or_else(|| WorkflowError::UnknownWorkflow(workflow.to_owned()))?;
        if self.tasks.is_closed() {
            return Err(WorkflowError::ShuttingDown);
        }
        def.check_input(&input)
            .map_err(|message| WorkflowError::InvalidInput {
                workflow: workflow.to_owned(),
                message,
            })?;
        // The nodes first: a run is stored only when it can run.
        let nodes = self.nodes_of(&def).map_err(|f| {
            WorkflowError::Definition(DefinitionError::Workflow {
                workflow: workflow.to_owned(),
                message: f.message,
            })
        })?;
        let created_ms = now_ms();
        let run = RunRow {
            run_id: new_run_id(created_ms),
            workflow: workflow.to_owned(),
            status: RunStatus::Running,
            input,
            output: None,
            error: None,
            definition: def.spec_json.clone(),
            definition_hash: def.hash.clone(),
            idempotency_key,
            created_ms,
            started_at: now_text(),
            finished_at: None,
        };
        let new = NewRun {
            steps: def.spec.steps.iter().map(|s| s.id.clone()).collect(),
            run: run.clone(),
        };
        // On a shared store this worker takes the run itself while it has a
        // free slot; otherwise any worker claims it.
        let lease = (!self.store.shared() || self.running() < self.options.max_concurrent_steps)
            .then(|| Lease {
                worker: self.worker.id.clone(),
                duration: self.worker.lease,
            });
        let started = |span: &tracing::Span| {
            let mut data = json!({"workflow": workflow, "input": run.input});
            // Kept with the run, so a resumed or retried run can link to it.
            if let Some(traceparent) = trace::traceparent(span) {
                data["traceparent"] = Value::String(traceparent);
            }
            data
        };
        // The fence this worker drives the run under, when it takes it.
        let fence = lease.as_ref().map(|_| {
            if self.store.shared() {
                Fence {
                    worker: self.worker.id.clone(),
                    epoch: 1,
                }
            } else {
                self.local_fence()
            }
        });
        // The steps that start with the run start in its write: one write
        // fewer before the first node runs.
        let first_steps: Vec<&str> = match fence {
            Some(_) => def
                .steps
                .iter()
                .filter(|s| s.starts_with_run())
                .map(|s| s.spec.id.as_str())
                .collect(),
            None => Vec::new(),
        };
        let starts: Vec<_> = first_steps
            .iter()
            .map(|id| engine::start_of(id, 1, &run.input))
            .collect();
        let starts: Vec<_> = starts
            .iter()
            .map(|(write, data)| (*write, "step.started", data))
            .collect();
        let mut first_started = Vec::new();
        let span = if run.idempotency_key.is_none() {
            // Nothing to find: the run's span first, so that its first event
            // is stored with it, in one write.
            let span = trace::run_span(workflow, &run.run_id, parent);
            let then = fence.as_ref().map(|fence| (fence, starts.as_slice()));
            let (created, then_stored) = self
                .events
                .create_run(&new, lease.as_ref(), "run.started", started(&span), then)
                .await?;
            if let Created::Existing(existing) = created {
                return Ok((*existing).into());
            }
            if then_stored {
                first_started = first_steps.iter().map(|&id| id.to_owned()).collect();
            }
            span
        } else {
            // The key may find the run it started before: no span for a run
            // that this start does not make.
            if let Created::Existing(existing) = self.store.create_run(&new, lease.as_ref()).await?
            {
                return Ok((*existing).into());
            }
            let span = trace::run_span(workflow, &run.run_id, parent);
            self.events
                .emit(&run.run_id, "run.started", started(&span))
                .await;
            span
        };
        if let Some(fence) = fence {
            // Every step of a new run is pending: no need to read them back.
            let rows = new.steps.into_iter().map(StepRow::pending).collect();
            self.launch(Launch {
                def,
                nodes,
                run: run.clone(),
                rows,
                elapsed: Duration::ZERO,
                fence,
                span,
                started: first_started,
            });
        }
        Ok(run.into())
    }

    /// The nodes of every step of `def`, checked against the hashes it
    /// started with.
    fn nodes_of(&self, def: &Definition) -> Result<HashMap<String, Node>, Failure> {
        def.steps
            .iter()
            .map(|step| {
                let node = self.node_for(&step.spec).map_err(|e| match e {
                    NodeError::Changed(now) => Failure::new(
                        "definition-changed",
                        format!(
                            "step `{}`: component `{}` changed since the run started (sha256 {} then, {now} now)",
                            step.spec.id,
                            step.spec.component.display(),
                            step.spec.component_hash
                        ),
                    ),
                    NodeError::Load(e) => Failure::new(
                        "definition-changed",
                        format!("step `{}`: {e}", step.spec.id),
                    ),
                })?;
                Ok((step.spec.id.clone(), node))
            })
            .collect()
    }

    /// Drives a stored run (resume or retry) on the definition it started with.
    async fn launch_stored(
        self: &Arc<Self>,
        run: RunRow,
        resumed: bool,
        fence: Fence,
    ) -> Result<(), WorkflowError> {
        let rows = self.store.steps(&run.run_id).await?;
        let prepared = Spec::deserialize(&*run.definition)
            .map_err(|e| {
                Failure::new(
                    "definition-changed",
                    format!("the stored definition cannot be read: {e}"),
                )
            })
            .and_then(|spec| {
                Definition::compile(&run.workflow, spec)
                    .map_err(|e| Failure::new("definition-changed", e.to_string()))
            })
            .and_then(|def| {
                // Only the steps that will run need their code unchanged.
                let mut needed = def.clone();
                needed.steps.retain(|s| {
                    rows.iter().any(|r| {
                        r.step_id == s.spec.id
                            && !matches!(r.status, StepStatus::Succeeded | StepStatus::Skipped)
                    })
                });
                let nodes = self.nodes_of(&needed)?;
                Ok((def, nodes))
            });
        match prepared {
            Ok((def, nodes)) => {
                // A resumed run's deadline counts from its start; a retried
                // run (finished, then reopened) gets a whole new one.
                let elapsed = if resumed {
                    Duration::from_millis(u64::try_from(now_ms() - run.created_ms).unwrap_or(0))
                } else {
                    Duration::ZERO
                };
                let span = self.continued_span(&run, resumed).await;
                self.launch(Launch {
                    def,
                    nodes,
                    run,
                    rows,
                    elapsed,
                    fence,
                    span,
                    started: Vec::new(),
                });
                Ok(())
            }
            Err(failure) => {
                tracing::warn!(run = %run.run_id, "cannot continue run: {}", failure.message);
                self.abandon(&run.run_id, RunStatus::Failed, &failure)
                    .await?;
                Ok(())
            }
        }
    }

    /// The span of a run continued in a later launch (resumed after a
    /// restart, or retried): the root of a new trace, linked to the run's
    /// first span when its `run.started` event kept that span's context.
    async fn continued_span(&self, run: &RunRow, resumed: bool) -> tracing::Span {
        let span = trace::run_span(&run.workflow, &run.run_id, &TraceParent::none());
        if span.is_disabled() {
            return span;
        }
        span.record("wf.resumed", resumed);
        let first = self.store.events(Some(&run.run_id), 0, 1).await;
        if let Ok(Some(event)) = first.map(|events| events.into_iter().next())
            && event.kind == "run.started"
            && let Some(traceparent) = event.data["traceparent"].as_str()
        {
            trace::link(&span, traceparent);
        }
        span
    }

    fn launch(self: &Arc<Self>, launch: Launch) {
        use std::sync::atomic::Ordering;
        let Launch {
            def,
            nodes,
            run,
            rows,
            elapsed,
            fence,
            span,
            started,
        } = launch;
        let cancel = CancellationToken::new();
        let stop = self.shutdown.child_token();
        let (done_tx, done_rx) = watch::channel(Done::Running);
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let progress = engine::StepProgress::default();
        self.live.lock().unwrap_or_else(|e| e.into_inner()).insert(
            run.run_id.clone(),
            Live {
                generation,
                cancel: cancel.clone(),
                done: done_rx,
                progress: progress.clone(),
                stop: stop.clone(),
            },
        );
        let ctx = Arc::new(RunCtx {
            run_id: run.run_id.clone(),
            def,
            nodes,
            input: run.input,
            store: self.store.clone(),
            runtime: self.runtime.clone(),
            slots: self.slots.clone(),
            cancel,
            shutdown: stop,
            elapsed,
            progress,
            events: self.events.clone(),
            fence,
            span,
            started,
        });
        // What waiters get when the run ends here: the run as it started
        // (its input taken from `ctx` only when someone waits), with what its
        // end wrote. A read would give the same.
        let started = self.store.stamps_with_event_time().then(|| {
            RunRecord::from(RunRow {
                input: Value::Null,
                ..run
            })
        });
        let this = self.clone();
        self.tasks.spawn(async move {
            let run_id = ctx.run_id.clone();
            let workflow = ctx.def.name.clone();
            let span = ctx.span.clone();
            let run_ctx = ctx.clone();
            let ending = engine::drive(ctx, rows).await;
            let paused = match &ending {
                // Another worker holds the run now, or the store is away:
                // whoever drives it next picks it up where it stands.
                Err(e) if this.store.shared() && e.is_unavailable() => {
                    tracing::warn!(run = %run_id, "run paused here: {e}");
                    true
                }
                _ => false,
            };
            if let (Err(e), false) = (&ending, paused) {
                // Nothing drives the run any more: say so in the state rather
                // than leave it `running`.
                tracing::error!(run = %run_id, "run stopped: {e}");
                trace::record_status(&span, "failed", false, Some(&e.to_string()));
                let failure = Failure::new(
                    "state",
                    format!("the run's state could not be recorded: {e}"),
                );
                if let Err(e) = this
                    .abandon(&run_id, RunStatus::Failed, &failure)
                    .await
                {
                    tracing::error!(run = %run_id, "cannot mark the run failed either: {e}");
                }
            }
            {
                let mut live = this.live.lock().unwrap_or_else(|e| e.into_inner());
                if live.get(&run_id).is_some_and(|l| l.generation == generation) {
                    live.remove(&run_id);
                }
            }
            let mut ended = None;
            match ending {
                Ok(Ending::Finished(finished)) => {
                    let status = finished.status;
                    tracing::debug!(run = %run_id, ?status, "run finished");
                    crate::metrics::metrics().run_finished(&workflow, status.as_str());
                    // Every waiter holds a receiver; the live entry's is gone.
                    ended = started.filter(|_| done_tx.receiver_count() > 0).map(|run| {
                        Box::new(RunRecord {
                            status,
                            input: run_ctx.input.clone(),
                            output: finished.output,
                            error: finished.error,
                            finished_at: Some(finished.at),
                            ..run
                        })
                    });
                    // Before waiters hear of it: a client that lists runs
                    // after its wait sees at most `keep_runs` finished ones.
                    this.after_finish().await;
                }
                Ok(Ending::Interrupted) if this.store.shared() => {
                    if this.shutdown.is_cancelled() {
                        // Let another worker take it at once.
                        match this.store.release_runs(&this.worker.id, std::slice::from_ref(&run_id)).await {
                            Ok(()) => tracing::info!(run = %run_id, "run interrupted by shutdown; released for another worker"),
                            Err(e) => tracing::warn!(run = %run_id, "run interrupted by shutdown; cannot release it ({e}), another worker takes it when its lease expires"),
                        }
                    } else {
                        tracing::warn!(run = %run_id, "run stopped here: this worker lost its lease");
                    }
                }
                Ok(Ending::Interrupted) => {
                    trace::record_status(&span, "interrupted", false, None);
                    tracing::info!(run = %run_id, "run interrupted by shutdown; it resumes at the next start");
                }
                Err(_) => {}
            }
            let _ = done_tx.send(Done::Ended(ended));
            // A slot is free.
            this.worker.wake.notify_one();
        });
    }

    /// Prunes when enough runs have finished since the last time: an eighth
    /// of `keep_runs`, and at most [`PRUNE_BATCH`], so that a prune is a
    /// short write (every write of the store waits behind it).
    async fn after_finish(&self) {
        use std::sync::atomic::Ordering;
        let n = self.finished_since_prune.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= (self.options.keep_runs / 8).clamp(1, PRUNE_BATCH) {
            self.prune().await;
        }
    }

    async fn prune(&self) {
        use std::sync::atomic::Ordering;
        self.finished_since_prune.store(0, Ordering::Relaxed);
        let before =
            now_ms() - i64::try_from(self.options.keep_for.as_millis()).unwrap_or(i64::MAX);
        match self.store.prune(self.options.keep_runs, before).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!("pruned {n} finished runs"),
            Err(e) => tracing::warn!("cannot prune finished runs: {e}"),
        }
    }

    /// The run as stored, or [`WorkflowError::UnknownRun`].
    async fn stored_run(&self, run_id: &str) -> Result<RunRow, WorkflowError> {
        self.store
            .run(run_id)
            .await?
            .ok_or_else(|| WorkflowError::UnknownRun(run_id.to_owned()))
    }

    /// The record of `run_id` with its steps, and their calls when `calls`.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`], [`WorkflowError::Store`].
    pub async fn get(&self, run_id: &str, calls: bool) -> Result<RunRecord, WorkflowError> {
        let run = self.stored_run(run_id).await?;
        let progress: HashMap<String, crate::capability::Progress> = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(run_id)
            .map(|l| l.progress.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .unwrap_or_default();
        // The graph of the definition the run started with, not today's.
        let mut needs: HashMap<String, Vec<String>> = Spec::deserialize(&*run.definition)
            .map(|spec| spec.steps.into_iter().map(|s| (s.id, s.needs)).collect())
            .unwrap_or_default();
        let mut steps = Vec::new();
        for row in self.store.steps(run_id).await? {
            let calls = if calls {
                Some(self.store.calls(run_id, &row.step_id).await?)
            } else {
                None
            };
            steps.push(StepRecord {
                status: row.status,
                attempts: row.attempts,
                needs: needs.remove(&row.step_id).unwrap_or_default(),
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
                id: row.step_id,
            });
        }
        let mut record = RunRecord::from(run);
        record.steps = Some(steps);
        Ok(record)
    }

    /// The log records of `run_id`'s node attempts, by step, oldest first
    /// (read from its `step.log` events).
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn logs(&self, run_id: &str) -> Result<HashMap<String, Vec<StepLog>>, WorkflowError> {
        const PAGE: u32 = 500;
        let mut logs: HashMap<String, Vec<StepLog>> = HashMap::new();
        let mut after = 0;
        loop {
            let page = self.store.events(Some(run_id), after, PAGE).await?;
            let full = page.len() == PAGE as usize;
            for mut event in page {
                after = event.id;
                if event.kind != STEP_LOG {
                    continue;
                }
                let number = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
                let (Some(step), Some(item), Some(attempt)) = (
                    event.data["step"].as_str().map(str::to_owned),
                    number(&event.data["item"]),
                    number(&event.data["attempt"]),
                ) else {
                    continue;
                };
                logs.entry(step).or_default().push(StepLog {
                    item,
                    attempt,
                    at: event.at,
                    records: event.data["records"].take(),
                });
            }
            if !full {
                return Ok(logs);
            }
        }
    }

    /// Ends a run nothing drives (see [`Store::abandon_run`]), and says so on
    /// the event log if it was still running.
    async fn abandon(
        &self,
        run_id: &str,
        status: RunStatus,
        failure: &Failure,
    ) -> Result<(), StoreError> {
        let was_running = self
            .store
            .run(run_id)
            .await?
            .is_some_and(|r| r.status == RunStatus::Running);
        self.store.abandon_run(run_id, status, failure).await?;
        if was_running {
            let data = json!({"status": status, "error": failure});
            self.events.emit(run_id, "run.finished", data).await;
        }
        Ok(())
    }

    /// Live events of every run, as they are kept. A subscriber that falls
    /// behind gets `Lagged` and should catch up with [`Workflows::events`].
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<crate::store::EventRow> {
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
    ) -> Result<Vec<crate::store::EventRow>, WorkflowError> {
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
        let done = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(run_id)
            .map(|l| l.done.clone());
        if let Some(mut done) = done {
            tokio::select! {
                _ = tokio::time::timeout(timeout, done.wait_for(|d| matches!(d, Done::Ended(_)))) => {}
                _ = self.closing.cancelled() => {}
            }
            // The run as its end stored it: no read, unless its steps are
            // wanted too.
            if let (false, Done::Ended(Some(run))) = (steps, &*done.borrow()) {
                return Ok(RunRecord::clone(run));
            }
            return read().await;
        }
        let Some(mut notes) = self.store.listen() else {
            return read().await;
        };
        // Driven by another worker (or by nobody yet): its end comes as a
        // note; the poll covers a note missed while the listener reconnected.
        let deadline = tokio::time::Instant::now() + timeout;
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

    /// Cancels `run_id` (its running nodes are interrupted and in-flight
    /// upstream calls cancelled) and waits briefly for it to stop.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`], [`WorkflowError::Store`].
    pub async fn cancel(&self, run_id: &str) -> Result<RunRecord, WorkflowError> {
        let token = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(run_id)
            .map(|l| l.cancel.clone());
        match token {
            Some(token) => {
                token.cancel();
                self.wait(run_id, Duration::from_secs(5)).await
            }
            None if self.store.shared() => {
                let failure = Failure::new("cancelled", "the run was cancelled");
                match self.store.request_cancel(run_id, &failure).await? {
                    CancelRequest::NotRunning => {}
                    CancelRequest::Ended => {
                        let data = json!({"status": RunStatus::Cancelled, "error": failure});
                        self.events.emit(run_id, "run.finished", data).await;
                    }
                    CancelRequest::Signalled => {
                        return self.wait(run_id, Duration::from_secs(5)).await;
                    }
                }
                self.get(run_id, false).await
            }
            None => {
                // Running in the state but driven by nobody (its task failed):
                // record the cancel there.
                let failure = Failure::new("cancelled", "the run was cancelled");
                self.abandon(run_id, RunStatus::Cancelled, &failure).await?;
                self.get(run_id, false).await
            }
        }
    }

    /// Starts a failed or cancelled run again from its failed or cancelled
    /// steps, keeping the outputs of the steps that succeeded. Same run id.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`], [`WorkflowError::NotRetryable`],
    /// [`WorkflowError::ShuttingDown`], [`WorkflowError::Store`].
    pub async fn retry(self: &Arc<Self>, run_id: &str) -> Result<RunRecord, WorkflowError> {
        if self.tasks.is_closed() {
            return Err(WorkflowError::ShuttingDown);
        }
        let run = self.stored_run(run_id).await?;
        if !self.store.reopen_run(run_id).await? {
            return Err(WorkflowError::NotRetryable {
                run_id: run_id.to_owned(),
                status: run.status.as_str().to_owned(),
            });
        }
        let run = self.stored_run(run_id).await?;
        let data = json!({"workflow": run.workflow, "retry": true});
        self.events.emit(run_id, "run.started", data).await;
        if self.store.shared() {
            // Reopened unclaimed: whichever worker has a free slot takes it.
            self.worker.wake.notify_one();
        } else {
            let fence = self.local_fence();
            self.launch_stored(run, false, fence).await?;
        }
        self.get(run_id, false).await
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

/// What [`Workflows::launch`] needs to drive a run.
struct Launch {
    def: Definition,
    nodes: HashMap<String, Node>,
    run: RunRow,
    /// The run's stored steps.
    rows: Vec<crate::store::StepRow>,
    /// How long the run has had already (its deadline counts from its start).
    elapsed: Duration,
    fence: Fence,
    span: tracing::Span,
    /// The steps whose first start was stored with the run.
    started: Vec<String>,
}

enum NodeError {
    Load(LoadError),
    /// The file's content no longer has the hash the definition names.
    Changed(String),
}

/// Whether `state` names a PostgreSQL database rather than a SQLite file.
pub fn is_postgres_url(state: &str) -> bool {
    state.starts_with("postgres://") || state.starts_with("postgresql://")
}

/// A run id that is unique across restarts and sorts by creation time (and,
/// within a millisecond, by start order in this process).
fn new_run_id(created_ms: i64) -> String {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & 0xff_ffff;
    let noise = rand::random::<u32>() & 0xff_ffff;
    format!("run-{created_ms:012x}-{seq:06x}-{noise:06x}")
}
