//! Workflows and their runs, kept in memory.
//!
//! A workflow is a configured component with its grants and limits. Starting one
//! creates a run: a task owned by the [`Workflows`] tracker, with its own
//! cancellation token. Run records are bounded: past the limit the oldest
//! finished runs are evicted (running ones never are).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::grants::Grants;
use crate::runtime::{Limits, LoadError, Node, RunError, RunOptions, Runtime};

/// Default number of run records kept.
pub const DEFAULT_MAX_RUNS: usize = 1000;

/// A run's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl Status {
    pub fn is_finished(self) -> bool {
        self != Status::Running
    }
}

/// `{code, message}` of a failed run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunFailure {
    pub code: String,
    pub message: String,
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
    pub error: Option<RunFailure>,
    pub started_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// Why a workflow could not be started or found.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    #[error("unknown workflow `{0}`")]
    UnknownWorkflow(String),
    #[error("unknown run `{0}`")]
    UnknownRun(String),
    #[error("the host is shutting down")]
    ShuttingDown,
    #[error("workflow `{workflow}`: {source}")]
    Load { workflow: String, source: LoadError },
    #[error("workflow `{workflow}`: {message}")]
    Config { workflow: String, message: String },
}

/// A loaded workflow.
struct Workflow {
    node: Node,
    grants: Arc<Grants>,
    limits: Limits,
}

struct RunEntry {
    record: RunRecord,
    cancel: CancellationToken,
    // Flips to true once the run has finished; waiters watch it.
    done: watch::Receiver<bool>,
}

#[derive(Default)]
struct Store {
    runs: HashMap<String, RunEntry>,
    /// Run ids, oldest first.
    order: VecDeque<String>,
    /// (workflow, idempotency key) → run id.
    idempotency: HashMap<(String, String), String>,
}

/// The configured workflows and every run of them.
pub struct Workflows {
    runtime: Arc<Runtime>,
    workflows: BTreeMap<String, Workflow>,
    store: Mutex<Store>,
    max_runs: usize,
    /// Owns every run task; shutdown waits on it.
    tasks: TaskTracker,
    /// Cancels every run at once (shutdown past the grace period).
    cancel_all: CancellationToken,
    /// Cancelled when shutdown begins, so long-polling waits return at once
    /// instead of holding their HTTP requests (and the shutdown) open.
    stopping: CancellationToken,
    next_id: AtomicU64,
}

impl Workflows {
    /// Loads every `[workflows.*]` component from `config`.
    ///
    /// # Errors
    /// A [`WorkflowError`] naming the first workflow that cannot load.
    pub fn load(
        config: &Config,
        runtime: Arc<Runtime>,
        max_runs: usize,
    ) -> Result<Self, WorkflowError> {
        let mut workflows = BTreeMap::new();
        let defaults = runtime.limits();
        for (name, w) in &config.workflows {
            let node = runtime
                .load(&config.resolve(&w.component))
                .map_err(|source| WorkflowError::Load {
                    workflow: name.clone(),
                    source,
                })?;
            let grants = Grants::new(&w.allow).map_err(|e| WorkflowError::Config {
                workflow: name.clone(),
                message: e.to_string(),
            })?;
            let limits = Limits {
                timeout: w.timeout.unwrap_or(defaults.timeout),
                max_memory: w.max_memory.map_or(defaults.max_memory, |m| m.as_u64()),
            };
            workflows.insert(
                name.clone(),
                Workflow {
                    node,
                    grants: Arc::new(grants),
                    limits,
                },
            );
        }
        Ok(Workflows {
            runtime,
            workflows,
            store: Mutex::default(),
            max_runs: max_runs.max(1),
            tasks: TaskTracker::new(),
            cancel_all: CancellationToken::new(),
            stopping: CancellationToken::new(),
            next_id: AtomicU64::new(1),
        })
    }

    /// The configured workflow names.
    pub fn names(&self) -> Vec<String> {
        self.workflows.keys().cloned().collect()
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts `workflow` on `input`. With an idempotency key already used for this
    /// workflow, returns that run instead of starting another.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownWorkflow`], or [`WorkflowError::ShuttingDown`].
    pub fn start(
        self: &Arc<Self>,
        workflow: &str,
        input: Value,
        idempotency_key: Option<String>,
    ) -> Result<RunRecord, WorkflowError> {
        let wf = self
            .workflows
            .get(workflow)
            .ok_or_else(|| WorkflowError::UnknownWorkflow(workflow.to_owned()))?;
        if self.tasks.is_closed() {
            return Err(WorkflowError::ShuttingDown);
        }
        let mut store = self.store();
        if let Some(key) = &idempotency_key
            && let Some(id) = store.idempotency.get(&(workflow.to_owned(), key.clone()))
            && let Some(entry) = store.runs.get(id)
        {
            return Ok(entry.record.clone());
        }
        let run_id = format!(
            "run-{}-{}",
            std::process::id(),
            self.next_id.fetch_add(1, Ordering::Relaxed)
        );
        let record = RunRecord {
            run_id: run_id.clone(),
            workflow: workflow.to_owned(),
            status: Status::Running,
            input: input.clone(),
            output: None,
            error: None,
            started_at: now(),
            finished_at: None,
        };
        let cancel = self.cancel_all.child_token();
        let (done_tx, done_rx) = watch::channel(false);
        store.runs.insert(
            run_id.clone(),
            RunEntry {
                record: record.clone(),
                cancel: cancel.clone(),
                done: done_rx,
            },
        );
        store.order.push_back(run_id.clone());
        if let Some(key) = idempotency_key {
            store
                .idempotency
                .insert((workflow.to_owned(), key), run_id.clone());
        }
        self.evict(&mut store);
        drop(store);

        let this = self.clone();
        let node = wf.node.clone();
        let opts = RunOptions {
            run_id: run_id.clone(),
            limits: Some(wf.limits),
            cancel,
            grants: wf.grants.clone(),
        };
        self.tasks.spawn(async move {
            let report = this.runtime.run(&node, &input.to_string(), opts).await;
            let (status, output, error) = match report.result {
                Ok(text) => (Status::Succeeded, serde_json::from_str(&text).ok(), None),
                Err(RunError::Cancelled) => (
                    Status::Cancelled,
                    None,
                    Some(RunFailure {
                        code: "cancelled".into(),
                        message: "the run was cancelled".into(),
                    }),
                ),
                Err(e) => (
                    Status::Failed,
                    None,
                    Some(RunFailure {
                        code: e.code().to_owned(),
                        message: match &e {
                            RunError::Node { message, .. } => message.clone(),
                            other => other.to_string(),
                        },
                    }),
                ),
            };
            if let Some(entry) = this.store().runs.get_mut(&run_id) {
                entry.record.status = status;
                entry.record.output = output;
                entry.record.error = error;
                entry.record.finished_at = Some(now());
            }
            let _ = done_tx.send(true);
        });
        Ok(record)
    }

    /// Drops the oldest finished runs past the limit.
    fn evict(&self, store: &mut Store) {
        let mut excess = store.runs.len().saturating_sub(self.max_runs);
        let mut i = 0;
        while excess > 0 && i < store.order.len() {
            let id = &store.order[i];
            let finished = store
                .runs
                .get(id)
                .is_none_or(|e| e.record.status.is_finished());
            if finished {
                let id = store.order.remove(i).expect("index in range");
                store.runs.remove(&id);
                store.idempotency.retain(|_, v| *v != id);
                excess -= 1;
            } else {
                i += 1;
            }
        }
    }

    /// The record of `run_id`.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`].
    pub fn get(&self, run_id: &str) -> Result<RunRecord, WorkflowError> {
        self.store()
            .runs
            .get(run_id)
            .map(|e| e.record.clone())
            .ok_or_else(|| WorkflowError::UnknownRun(run_id.to_owned()))
    }

    /// Waits until `run_id` has finished, `timeout` passes or shutdown begins;
    /// returns the record either way.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`].
    pub async fn wait(&self, run_id: &str, timeout: Duration) -> Result<RunRecord, WorkflowError> {
        let mut done = self
            .store()
            .runs
            .get(run_id)
            .map(|e| e.done.clone())
            .ok_or_else(|| WorkflowError::UnknownRun(run_id.to_owned()))?;
        tokio::select! {
            _ = tokio::time::timeout(timeout, done.wait_for(|d| *d)) => {}
            () = self.stopping.cancelled() => {}
        }
        self.get(run_id)
    }

    /// Cancels `run_id` (its guest is interrupted and an in-flight upstream call
    /// is cancelled) and waits briefly for it to stop.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`].
    pub async fn cancel(&self, run_id: &str) -> Result<RunRecord, WorkflowError> {
        let token = self
            .store()
            .runs
            .get(run_id)
            .map(|e| e.cancel.clone())
            .ok_or_else(|| WorkflowError::UnknownRun(run_id.to_owned()))?;
        token.cancel();
        self.wait(run_id, Duration::from_secs(5)).await
    }

    /// Runs, newest first, optionally only those with `status`.
    pub fn list(&self, status: Option<Status>, limit: usize) -> Vec<RunRecord> {
        let store = self.store();
        store
            .order
            .iter()
            .rev()
            .filter_map(|id| store.runs.get(id))
            .filter(|e| status.is_none_or(|s| e.record.status == s))
            .take(limit)
            .map(|e| e.record.clone())
            .collect()
    }

    /// Stops new runs, ends open waits, lets running ones finish for up to
    /// `grace`, then cancels the rest and waits for them.
    pub async fn shutdown(&self, grace: Duration) {
        self.tasks.close();
        self.stopping.cancel();
        if tokio::time::timeout(grace, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("runs still going after the grace period; cancelling them");
            self.cancel_all.cancel();
            self.tasks.wait().await;
        }
    }
}

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}
