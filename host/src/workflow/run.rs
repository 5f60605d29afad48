//! The run lifecycle: a run is started (stored with its first event, and
//! the starts of the steps that start with it), launched (a task drives it
//! through the engine), and ends there; or it is retried, cancelled, or
//! abandoned when nothing drives it. Every move of a stored run is a
//! [`Transition`] written through the run's events.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::definition::{self, Definition, DefinitionError, Spec};
use super::engine::{self, Ending, RunCtx};
use super::{RunRecord, WorkflowError, Workflows};
use crate::domain::{
    Debounce, Failure, RUN_STARTED, RunRow, RunStatus, StepRow, StepStatus, Transition, now_ms,
    now_text,
};
use crate::runtime::{LoadError, Node};
use crate::store::{Created, Fence, Lease, NewRun, StoreError};
use crate::trace::{self, TraceParent};

/// A run driven by this process.
pub(super) struct Live {
    /// Which launch this is: a retried run gets a new entry, and the old
    /// task must not remove it.
    pub(super) generation: u64,
    pub(super) cancel: CancellationToken,
    /// Becomes [`Done::Ended`] once the run's task has ended; waiters watch it.
    pub(super) done: watch::Receiver<Done>,
    pub(super) progress: engine::StepProgress,
    /// Stops the run here and leaves its state for whoever drives it next:
    /// shutdown past the grace period, or a lease this worker lost.
    pub(super) stop: CancellationToken,
    /// Bumped when a signal is sent to the run (its wait steps look).
    pub(super) signals: watch::Sender<u64>,
    /// `workflow.pause` (true) and `workflow.resume` (false).
    pub(super) pause: watch::Sender<bool>,
}

/// A live run as its waiters see it.
#[derive(Debug)]
pub(super) enum Done {
    Running,
    /// The run's task has ended. With the run as its end stored it, where
    /// that is exact ([`Store::stamps_with_event_time`]); without, a waiter
    /// reads it.
    Ended(Option<Box<RunRecord>>),
}

/// A run [`Workflows::start_triggered`] started, or found.
#[derive(Debug)]
pub struct Started {
    pub run: RunRecord,
    /// Whether it is new (not found by its idempotency key).
    pub new: bool,
}

/// What [`Workflows::launch`] needs to drive a run.
struct Launch {
    def: Arc<Definition>,
    nodes: HashMap<String, Node>,
    run: RunRow,
    /// The run's stored steps.
    rows: Vec<crate::domain::StepRow>,
    /// How long the run has had already (its deadline counts from its start).
    elapsed: Duration,
    fence: Fence,
    span: tracing::Span,
    /// The steps whose first start was stored with the run.
    started: Vec<String>,
    /// A new run: [`Workflows::pauses`] before it was stored. While no pause
    /// has been counted since, none can have missed its driver, and the
    /// driver does not read the run again to see if it starts paused.
    pauses_before: Option<u64>,
}

pub(super) enum NodeError {
    Load(LoadError),
    /// The file's content no longer has the hash the definition names.
    Changed(String),
}

/// Why a run of a paused workflow waits.
pub(super) fn workflow_paused(workflow: &str) -> String {
    format!("workflow `{workflow}` is paused (`workflow.resume` lets its runs in)")
}

/// Why a debounced run waits: the starts that may still join it.
fn debounce_reason(d: &Debounce) -> String {
    let at =
        std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(d.not_before_ms).unwrap_or(0));
    format!(
        "debounce: starts with key {:?} until {} join this run",
        d.key,
        humantime::format_rfc3339_millis(at)
    )
}

/// A run id that is unique across restarts and sorts by creation time (and,
/// within a millisecond, by start order in this process).
fn new_run_id(created_ms: i64) -> String {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & 0xff_ffff;
    let noise = rand::random::<u32>() & 0xff_ffff;
    format!("run-{created_ms:012x}-{seq:06x}-{noise:06x}")
}

impl Workflows {
    pub(super) fn node_for(&self, spec: &definition::StepSpec) -> Result<Node, NodeError> {
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
        self.start_by(workflow, input, idempotency_key, None, &TraceParent::none())
            .await
    }

    /// [`Workflows::start`], continuing the caller's trace (the run's span
    /// is a child of `parent` when it is a valid context) and recording
    /// `trigger` (e.g. the named token that started it) with the run.
    ///
    /// # Errors
    /// As [`Workflows::start`].
    pub async fn start_by(
        self: &Arc<Self>,
        workflow: &str,
        input: Value,
        idempotency_key: Option<String>,
        trigger: Option<Value>,
        parent: &TraceParent,
    ) -> Result<RunRecord, WorkflowError> {
        let started = self
            .start_with(workflow, input, idempotency_key, trigger, parent)
            .await?;
        Ok(started.run)
    }

    /// Starts a run that `trigger` (a schedule's tick, a webhook delivery)
    /// started, recorded with the run; says whether the idempotency key
    /// found a run started before instead.
    ///
    /// # Errors
    /// As [`Workflows::start`].
    pub async fn start_triggered(
        self: &Arc<Self>,
        workflow: &str,
        input: Value,
        idempotency_key: Option<String>,
        trigger: Value,
        parent: &TraceParent,
    ) -> Result<Started, WorkflowError> {
        self.start_with(workflow, input, idempotency_key, Some(trigger), parent)
            .await
    }

    pub(super) async fn start_with(
        self: &Arc<Self>,
        workflow: &str,
        input: Value,
        idempotency_key: Option<String>,
        trigger: Option<Value>,
        parent: &TraceParent,
    ) -> Result<Started, WorkflowError> {
        let started = self
            .start_stored(workflow, input, idempotency_key, trigger, parent)
            .await;
        let refused = match &started {
            Err(WorkflowError::Busy { .. }) => Some("busy"),
            Err(WorkflowError::Store(StoreError::Full(_))) => {
                // Told when there is room again, whether or not a run waits.
                self.wait_for_room(None);
                Some("disk_full")
            }
            Err(WorkflowError::Store(e)) if e.is_unavailable() => Some("state_unavailable"),
            _ => None,
        };
        if let Some(reason) = refused {
            crate::metrics::metrics().start_refused(reason);
        }
        started
    }

    async fn start_stored(
        self: &Arc<Self>,
        workflow: &str,
        input: Value,
        idempotency_key: Option<String>,
        trigger: Option<Value>,
        parent: &TraceParent,
    ) -> Result<Started, WorkflowError> {
        let def = self
            .definition(workflow)
            .ok_or_else(|| WorkflowError::unknown_workflow(workflow, self.names()))?;
        if self.tasks.is_closed() {
            return Err(WorkflowError::ShuttingDown);
        }
        // Past the runs it may drive, a new start is refused (nothing is
        // stored); a parent's child run is part of a run already going.
        let child = trigger.as_ref().is_some_and(|t| t["kind"] == "parent");
        let live = self.running();
        if live >= self.options.max_live_runs && !child {
            return Err(WorkflowError::Busy {
                live,
                retry_after: super::BUSY_RETRY_AFTER,
            });
        }
        def.check_input(&input)
            .map_err(|message| WorkflowError::InvalidInput {
                workflow: workflow.to_owned(),
                message,
            })?;
        // Flow control: the run's keys and priority, from its input. A key
        // that cannot be computed refuses the start, as a bad input does.
        let flow = def
            .flow
            .as_ref()
            .map(|flow| flow.of(&input))
            .transpose()
            .map_err(|message| WorkflowError::InvalidInput {
                workflow: workflow.to_owned(),
                message,
            })?;
        // Debounce: its key, from the input, and its time.
        let debounce = def
            .debounce_key
            .as_ref()
            .zip(def.spec.debounce.as_ref())
            .map(|(key, spec)| -> Result<Debounce, WorkflowError> {
                let key = super::flow::key_of("debounce.key", key.as_ref(), &input).map_err(
                    |message| WorkflowError::InvalidInput {
                        workflow: workflow.to_owned(),
                        message,
                    },
                )?;
                let now = now_ms();
                let ms = |ms: u64| i64::try_from(ms).unwrap_or(i64::MAX);
                Ok(Debounce {
                    key,
                    not_before_ms: now.saturating_add(ms(spec.period_ms)),
                    deadline_ms: spec.max_wait_ms.map(|m| now.saturating_add(ms(m))),
                })
            })
            .transpose()?;
        // A workflow paused as a whole: its new runs wait, queued.
        let paused = self.workflow_paused(workflow);
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
            // Under flow control, queued until the admission pass below;
            // debounced, until its time.
            status: if flow.is_some() || debounce.is_some() || paused {
                RunStatus::Queued
            } else {
                RunStatus::Running
            },
            input,
            output: None,
            error: None,
            definition: def.spec_json.clone(),
            definition_hash: def.hash.clone(),
            idempotency_key,
            created_ms,
            started_at: now_text(),
            finished_at: None,
            trigger,
            flow,
            queued_reason: match &debounce {
                Some(d) => Some(debounce_reason(d)),
                None => paused.then(|| workflow_paused(workflow)),
            },
            admitted_ms: None,
            debounce,
            wake_ms: None,
        };
        let new = NewRun {
            steps: def.spec.steps.iter().map(|s| s.id.clone()).collect(),
            run: run.clone(),
        };
        // On a shared store this worker takes the run itself while it has a
        // free slot; otherwise any worker claims it.
        // A queued run is held by nobody until it is admitted.
        let lease = (run.status == RunStatus::Running
            && self
                .mode
                .takes_new_run(self.busy(), self.options.max_concurrent_steps))
        .then(|| Lease {
            worker: self.worker.id.clone(),
            duration: self.worker.lease,
        });
        let started = |span: &tracing::Span| {
            let mut data = json!({"workflow": workflow, "input": run.input});
            if let Some(trigger) = &run.trigger {
                data["trigger"] = trigger.clone();
            }
            // Kept with the run, so a resumed or retried run can link to it.
            if let Some(traceparent) = trace::traceparent(span) {
                data["traceparent"] = Value::String(traceparent);
            }
            data
        };
        // The fence this worker drives the run under, when it takes it.
        let fence = lease
            .as_ref()
            .map(|_| self.mode.first_fence(&self.worker.id));
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
        let mut first_started = Vec::new();
        let pauses_before = self.pauses.load(std::sync::atomic::Ordering::SeqCst);
        let span = if run.idempotency_key.is_none() {
            // Nothing to find: the run's span first, so that its first event
            // is stored with it, in one write.
            let span = trace::run_span(workflow, &run.run_id, parent);
            let then = fence.as_ref().map(|fence| (fence, starts.as_slice()));
            let created = self
                .events
                .create_run(&new, lease.as_ref(), started(&span), then, &def.spec.redact)
                .await;
            let (created, then_stored) = match created {
                Err(StoreError::Refused(_)) if run.debounce.is_some() => {
                    return self.start_again(run, parent).await;
                }
                other => other?,
            };
            if let Created::Existing(found) = created {
                return self.join_debounced(found, run, parent).await;
            }
            if then_stored {
                first_started = first_steps.iter().map(|&id| id.to_owned()).collect();
            }
            span
        } else {
            // The key may find the run it started before: no span for a run
            // that this start does not make.
            match self.store.create_run(&new, lease.as_ref()).await {
                Err(StoreError::Refused(_)) if run.debounce.is_some() => {
                    return self.start_again(run, parent).await;
                }
                Err(e) => {
                    crate::metrics::metrics().store_error(e.failure_kind());
                    return Err(e.into());
                }
                Ok(Created::Existing(found)) => {
                    return self.join_debounced(found, run, parent).await;
                }
                Ok(Created::New) => {}
            }
            let span = trace::run_span(workflow, &run.run_id, parent);
            self.events
                .emit(&run.run_id, RUN_STARTED, started(&span))
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
                pauses_before: Some(pauses_before),
            });
        }
        if run.status == RunStatus::Queued {
            // Admitted now if its limits allow (and then driven, alone);
            // else it waits, with its reason, for the admitter.
            match self.admit().await {
                // A rate window to wait for: no run's end will say when it
                // frees, so the admitter's own pass sets its timer.
                Ok(pass) if pass.next_window_ms.is_some() => self.worker.queue.notify_one(),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(run = %run.run_id, "cannot admit queued runs now: {e}");
                    self.worker.queue.notify_one();
                }
            }
            let run = self.stored_run(&run.run_id).await?;
            return Ok(Started {
                run: run.into(),
                new: true,
            });
        }
        Ok(Started {
            run: run.into(),
            new: true,
        })
    }

    /// A start whose insert found `found`: the run its idempotency key
    /// started before, or a queued run with its debounce key, which it
    /// joins (the run takes this start's input and time).
    async fn join_debounced(
        self: &Arc<Self>,
        found: Box<RunRow>,
        mine: RunRow,
        parent: &TraceParent,
    ) -> Result<Started, WorkflowError> {
        let same_key =
            mine.idempotency_key.is_some() && found.idempotency_key == mine.idempotency_key;
        let joins = match (&mine.debounce, &found.debounce) {
            (Some(m), Some(f)) => {
                !same_key
                    && m.key == f.key
                    && found.status == RunStatus::Queued
                    && found.run_id != mine.run_id
            }
            _ => false,
        };
        let (Some(debounce), true) = (&mine.debounce, joins) else {
            return Ok(Started {
                run: (*found).into(),
                new: false,
            });
        };
        let at = found
            .debounce
            .as_ref()
            .and_then(|f| f.deadline_ms)
            .map_or(debounce.not_before_ms, |d| d.min(debounce.not_before_ms));
        let reason = debounce_reason(&Debounce {
            not_before_ms: at,
            ..debounce.clone()
        });
        let joined = Transition::RunDebounced {
            input: &mine.input,
            not_before_ms: debounce.not_before_ms,
            reason: &reason,
        };
        match self.events.apply(&found.run_id, &[joined], None).await {
            Ok(_) => {}
            // It was admitted since: this start makes a run of its own.
            Err(StoreError::Refused(_)) => return self.start_again(mine, parent).await,
            Err(e) => return Err(e.into()),
        }
        tracing::debug!(run = %found.run_id, key = %debounce.key, "start joined a debounced run");
        // The admitter waits for the run's new time.
        self.worker.queue.notify_one();
        let run = self.stored_run(&found.run_id).await?;
        Ok(Started {
            run: run.into(),
            new: false,
        })
    }

    /// Starts `run`'s workflow again with its input: the debounced run it
    /// was to join has begun in the meantime.
    async fn start_again(
        self: &Arc<Self>,
        run: RunRow,
        parent: &TraceParent,
    ) -> Result<Started, WorkflowError> {
        Box::pin(self.start_with(
            &run.workflow,
            run.input,
            run.idempotency_key,
            run.trigger,
            parent,
        ))
        .await
    }

    /// The nodes of every step of `def`, checked against the hashes it
    /// started with.
    pub(super) fn nodes_of(&self, def: &Definition) -> Result<HashMap<String, Node>, Failure> {
        def.steps
            .iter()
            .chain(def.compensations.values())
            .filter(|step| step.spec.runs_node())
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
    pub(super) async fn launch_stored(
        self: &Arc<Self>,
        run: RunRow,
        resumed: bool,
        fence: Fence,
    ) -> Result<(), WorkflowError> {
        let rows = self.store.steps(&run.run_id).await?;
        // The definition in force, compiled already, when the run is on it.
        let current = self
            .definition(&run.workflow)
            .filter(|d| d.hash == run.definition_hash);
        let compiled = match current {
            Some(def) => Ok(def),
            None => Spec::deserialize(&*run.definition)
                .map_err(|e| {
                    Failure::new(
                        "definition-changed",
                        format!("the stored definition cannot be read: {e}"),
                    )
                })
                .and_then(|spec| {
                    Definition::compile(&run.workflow, spec)
                        .map(Arc::new)
                        .map_err(|e| Failure::new("definition-changed", e.to_string()))
                }),
        };
        let prepared = compiled.and_then(|def| {
            // Only the steps that will run need their code unchanged.
            let mut needed = Definition::clone(&def);
            needed.steps.retain(|s| {
                rows.iter().any(|r| {
                    r.step_id == s.spec.id
                        && !matches!(r.status, StepStatus::Succeeded | StepStatus::Skipped)
                })
            });
            // A compensation may run until its own row has finished.
            needed.compensations.retain(|id, _| {
                !rows
                    .iter()
                    .any(|r| &r.step_id == id && r.status.is_finished())
            });
            let nodes = self.nodes_of(&needed)?;
            Ok((def, nodes))
        });
        match prepared {
            Ok((def, nodes)) => {
                // A resumed run's deadline counts from its start; a retried
                // run (finished, then reopened) gets a whole new one.
                // A run that was queued counts from its admission.
                let elapsed = if resumed {
                    let from = run.admitted_ms.unwrap_or(run.created_ms);
                    Duration::from_millis(u64::try_from(now_ms() - from).unwrap_or(0))
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
                    pauses_before: None,
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
            pauses_before,
        } = launch;
        let cancel = CancellationToken::new();
        let stop = self.shutdown.child_token();
        let (done_tx, done_rx) = watch::channel(Done::Running);
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let progress = engine::StepProgress::default();
        let (signals_tx, signals) = watch::channel(0);
        let (pause_tx, pause) = watch::channel(false);
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        // One driver per run in this process, whatever asked for another.
        if live.contains_key(&run.run_id) {
            tracing::debug!(run = %run.run_id, "already driven here; not launched again");
            return;
        }
        live.insert(
            run.run_id.clone(),
            Live {
                generation,
                cancel: cancel.clone(),
                done: done_rx,
                progress: progress.clone(),
                stop: stop.clone(),
                signals: signals_tx,
                pause: pause_tx.clone(),
            },
        );
        let pause_tx_for_task = pause_tx;
        drop(live);
        // A pause made here before the run was in `live` was counted before
        // it looked there (see `pause_run`); without one, no read.
        let maybe_paused =
            pauses_before.is_none_or(|before| self.pauses.load(Ordering::SeqCst) != before);
        let ctx = Arc::new(RunCtx {
            compensating: engine::compensating(&run),
            parks: self.mode == super::mode::Mode::Alone,
            run_id: run.run_id.clone(),
            def,
            nodes,
            input: run.input.to_string(),
            store: self.store.clone(),
            runtime: self.runtime.clone(),
            slots: self.slots.clone(),
            cancel,
            pause,
            shutdown: stop,
            elapsed,
            progress,
            events: self.events.clone(),
            fence,
            span,
            started,
            asleep: engine::Asleep::of_run(self.asleep.clone(), self.worker.wake.clone()),
            signals,
            workflows: Arc::downgrade(self),
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
        let pause = pause_tx_for_task;
        self.tasks.spawn(async move {
            // Paused before this driver was in `live` (where a pause finds
            // it): it starts paused. (A pause by another worker is heard at
            // the next lease renewal, as for a run driven already.)
            if maybe_paused
                && let Ok(Some(run)) = this.store.run(&ctx.run_id).await
                && run.status == RunStatus::Paused
            {
                pause.send_replace(true);
            }
            let run_id = ctx.run_id.clone();
            let workflow = ctx.def.name.clone();
            let flow = ctx.def.flow.is_some();
            let span = ctx.span.clone();
            let run_ctx = ctx.clone();
            // Boxed: the driver's future is large, and the task's would be
            // copied whole when it is spawned and again when it ends.
            let ending = Box::pin(engine::drive(ctx, rows)).await;
            let paused = match &ending {
                // Another worker holds the run now, or the store is away:
                // whoever drives it next picks it up where it stands.
                Err(e) if this.mode.pauses_on(e) => {
                    tracing::warn!(run = %run_id, "run paused here: {e}");
                    if matches!(e, StoreError::Full(_)) && this.mode == super::mode::Mode::Alone {
                        // Alone, nobody else picks it up: driven again here
                        // once the state can be written.
                        this.wait_for_room(Some(&run_id));
                    }
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
                if let Err(e) = this.abandon(&run_id, RunStatus::Failed, &failure).await {
                    tracing::error!(run = %run_id, "cannot mark the run failed either: {e}");
                }
            }
            {
                let mut live = this.live.lock().unwrap_or_else(|e| e.into_inner());
                if live
                    .get(&run_id)
                    .is_some_and(|l| l.generation == generation)
                {
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
                            input: run_ctx.input_value(),
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
                Ok(Ending::Interrupted) => this.mode.interrupted(&this, &run_id, &span).await,
                Ok(Ending::Asleep) => {
                    trace::record_status(&span, "asleep", true, None);
                    // A signal sent as it fell asleep: taken now.
                    this.wake_for_signal(&run_id).await;
                }
                Ok(Ending::Paused) => {
                    trace::record_status(&span, "paused", false, None);
                    this.mode.let_go(&this, &run_id).await;
                    // Resumed between its last step and here: it runs on.
                    if let Ok(Some(run)) = this.store.run(&run_id).await
                        && run.status != RunStatus::Paused
                        && !run.status.is_finished()
                        && let Err(e) = this.mode.reopened(&this, run).await
                    {
                        tracing::warn!(run = %run_id, "cannot go on with the resumed run: {e}");
                    }
                }
                Err(_) => {}
            }
            let _ = done_tx.send(Done::Ended(ended));
            // A slot is free.
            this.worker.wake.notify_one();
            if flow {
                // And a slot of its workflow's flow control.
                this.worker.queue.notify_one();
            }
        });
    }

    /// The state's disk is full: keeps `run_id` (whose driver stopped on
    /// it), to be driven again once the state can be written. A task probes
    /// that with a write that needs room, backing off to 5 s; when it
    /// commits, the store is no longer degraded and every run kept so is
    /// driven again.
    pub(super) fn wait_for_room(self: &Arc<Self>, run_id: Option<&str>) {
        {
            let mut stalled = self.stalled.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(run_id) = run_id {
                stalled.0.insert(run_id.to_owned());
            }
            if std::mem::replace(&mut stalled.1, true) {
                return;
            }
        }
        let weak = Arc::downgrade(self);
        let closing = self.closing.clone();
        self.tasks.spawn(async move {
            let mut wait = Duration::from_millis(250);
            loop {
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = closing.cancelled() => return,
                }
                let Some(this) = weak.upgrade() else { return };
                if this.store.probe_write().await.is_err() {
                    wait = (wait * 2).min(Duration::from_secs(5));
                    continue;
                }
                let runs =
                    std::mem::take(&mut this.stalled.lock().unwrap_or_else(|e| e.into_inner()).0);
                tracing::info!(
                    runs = runs.len(),
                    "the state can be written again: driving its stalled runs"
                );
                for run_id in runs {
                    if let Err(e) = this.drive_again(&run_id).await {
                        tracing::warn!(run = %run_id, "cannot read the stalled run: {e}");
                        this.stalled
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                            .insert(run_id);
                    }
                }
                // Runs that stalled meanwhile (or again): wait for room,
                // longer each time.
                let mut stalled = this.stalled.lock().unwrap_or_else(|e| e.into_inner());
                if stalled.0.is_empty() {
                    stalled.1 = false;
                    return;
                }
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        });
    }

    /// Ends a run nothing drives ([`Transition::RunAbandoned`]), with its
    /// `run.finished` event; a run that is not running is left as it is.
    pub(super) async fn abandon(
        &self,
        run_id: &str,
        status: RunStatus,
        failure: &Failure,
    ) -> Result<(), StoreError> {
        let abandon = Transition::RunAbandoned {
            status,
            error: failure,
        };
        let ended = match self.events.apply(run_id, &[abandon], None).await {
            Ok(_) | Err(StoreError::Refused(_)) => Ok(()),
            Err(e) => Err(e),
        };
        // It may have held (or waited for) a slot of its flow control.
        self.worker.queue.notify_one();
        ended
    }

    /// Cancels `run_id` (its running nodes are interrupted and in-flight
    /// upstream calls cancelled) and waits briefly for it to stop.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`], [`WorkflowError::Store`].
    pub async fn cancel(self: &Arc<Self>, run_id: &str) -> Result<RunRecord, WorkflowError> {
        let token = self.with_live(run_id, |l| l.cancel.clone());
        match token {
            Some(token) => {
                token.cancel();
                self.wait(run_id, Duration::from_secs(5)).await
            }
            None => {
                if self.mode.cancel_undriven(self, run_id).await? {
                    // Another worker drives it, and was told.
                    return self.wait(run_id, Duration::from_secs(5)).await;
                }
                self.get(run_id, false).await
            }
        }
    }

    /// Pauses `run_id`: it starts no new step; steps already running finish
    /// and are recorded, sleeps keep their wake time. It stays `paused`,
    /// across restarts, until [`Workflows::resume_run`].
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`], [`WorkflowError::NotWaiting`] for a
    /// run that is not running, [`WorkflowError::Store`].
    pub async fn pause_run(&self, run_id: &str) -> Result<RunRecord, WorkflowError> {
        self.run_move(
            run_id,
            Transition::RunPaused,
            "only a running run can be paused",
        )
        .await?;
        // Counted before looking for the driver: a driver launched since the
        // count was read sees it (see `launch`).
        self.pauses
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // Driven here: no new step starts. (Driven by another worker: it
        // hears of it at its next lease renewal.)
        self.pause_local(run_id);
        tracing::info!(run = %run_id, "run paused");
        self.get(run_id, false).await
    }

    /// Makes run move `transition` of `run_id` (pause, resume), or refuses
    /// with the run's status and `only` when its guard does not hold.
    async fn run_move(
        &self,
        run_id: &str,
        transition: Transition<'_>,
        only: &str,
    ) -> Result<(), WorkflowError> {
        let run = self.stored_run(run_id).await?;
        match self.events.apply(run_id, &[transition], None).await {
            Ok(_) => Ok(()),
            Err(StoreError::Refused(_)) => Err(WorkflowError::NotWaiting {
                run_id: run_id.to_owned(),
                message: format!("it is {}; {only}", run.status.as_str()),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Resumes a paused run where it stopped.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`], [`WorkflowError::NotWaiting`] for a
    /// run that is not paused, [`WorkflowError::ShuttingDown`],
    /// [`WorkflowError::Store`].
    pub async fn resume_run(self: &Arc<Self>, run_id: &str) -> Result<RunRecord, WorkflowError> {
        if self.tasks.is_closed() {
            return Err(WorkflowError::ShuttingDown);
        }
        self.run_move(
            run_id,
            Transition::RunResumed,
            "only a paused run can be resumed",
        )
        .await?;
        tracing::info!(run = %run_id, "run resumed");
        // Still driven here (its steps were running): its driver ends once
        // they have, and goes on from there as the store says (queued again
        // under flow control); a driver is never un-paused in place.
        if self.with_live(run_id, |_| ()).is_none() {
            let run = self.stored_run(run_id).await?;
            self.mode.reopened(self, run).await?;
        }
        self.get(run_id, false).await
    }

    /// Moves an unfinished run to the definition of its workflow in force
    /// (after a reload changed it): its steps to come run as that one says.
    /// Refused, with the reason, when a step that has run (or waits) no
    /// longer exists there or is defined differently, or when a step's node
    /// is running now (pause the run, or migrate it while it waits). A run
    /// driven here is stopped and driven again on the new definition.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`], [`WorkflowError::NotWaiting`] (not
    /// migratable, and why), [`WorkflowError::Store`].
    pub async fn migrate(self: &Arc<Self>, run_id: &str) -> Result<RunRecord, WorkflowError> {
        if self.tasks.is_closed() {
            return Err(WorkflowError::ShuttingDown);
        }
        let run = self.stored_run(run_id).await?;
        let Some(current) = self.definition(&run.workflow) else {
            return Err(not_migrated(
                run_id,
                format!("its workflow `{}` is no longer configured", run.workflow),
            ));
        };
        // Checked before its driver here is stopped (a running node would
        // be cut short), and again after (a step may have moved meanwhile).
        self.migratable(run_id, &current).await?;
        let done = self.with_live(run_id, |live| {
            live.stop.cancel();
            live.done.clone()
        });
        if let Some(mut done) = done {
            let ended = done.wait_for(|d| matches!(d, Done::Ended(_)));
            if tokio::time::timeout(Duration::from_secs(30), ended)
                .await
                .is_err()
            {
                tracing::warn!(run = %run_id, "the run's driver did not stop within 30 s; migrating it anyway");
            }
        }
        let checked = self.migratable(run_id, &current).await;
        let applied = match checked {
            Ok(()) => {
                let migrate = Transition::RunMigrated {
                    definition: &current.spec_json,
                    hash: &current.hash,
                };
                match self.events.apply(run_id, &[migrate], None).await {
                    Ok(_) => {
                        tracing::info!(run = %run_id, from = %run.definition_hash, to = %current.hash, "run migrated");
                        Ok(())
                    }
                    Err(StoreError::Refused(_)) => {
                        Err(not_migrated(run_id, "it finished meanwhile".into()))
                    }
                    Err(e) => Err(e.into()),
                }
            }
            Err(e) => Err(e),
        };
        // Driven again (on whichever definition it is on now), unless it
        // is paused or has finished.
        let run = self.stored_run(run_id).await?;
        if !run.status.is_finished() && run.status != RunStatus::Paused {
            self.mode.reopened(self, run).await?;
        }
        applied?;
        self.get(run_id, false).await
    }

    /// Whether run `run_id` may go on with `current`, the definition of its
    /// workflow in force: every step it has run, or waits in, is the same
    /// there, the steps are the same ones, and no node runs now.
    async fn migratable(&self, run_id: &str, current: &Definition) -> Result<(), WorkflowError> {
        let refuse = |message: String| Err(not_migrated(run_id, message));
        let run = self.stored_run(run_id).await?;
        if run.status.is_finished() {
            return refuse(format!(
                "it has finished as `{}`; only an unfinished run can be migrated",
                run.status.as_str()
            ));
        }
        if current.hash == run.definition_hash {
            return refuse(format!(
                "it runs on the definition of `{}` in force already ({})",
                run.workflow,
                &current.hash[..12.min(current.hash.len())]
            ));
        }
        let step_of = |spec: &Value, id: &str| -> Option<Value> {
            spec["steps"]
                .as_array()?
                .iter()
                .find(|s| s["id"] == id)
                .cloned()
        };
        let record = self.get(run_id, false).await?;
        let steps: Vec<&super::StepRecord> = record.steps.iter().flatten().collect();
        if steps
            .iter()
            .any(|s| definition::compensated_by(&s.id).is_some())
        {
            return refuse(
                "it is undoing its steps (compensating); it ends on the definition it has".into(),
            );
        }
        let ids: std::collections::BTreeSet<&str> = steps.iter().map(|s| s.id.as_str()).collect();
        let new_ids: std::collections::BTreeSet<&str> =
            current.steps.iter().map(|s| s.spec.id.as_str()).collect();
        if ids != new_ids {
            let added: Vec<_> = new_ids.difference(&ids).collect();
            let removed: Vec<_> = ids.difference(&new_ids).collect();
            return refuse(format!(
                "the definition in force has other steps (adds {added:?}, removes {removed:?}); a run moves only between definitions of the same steps"
            ));
        }
        for step in steps {
            if step.status == StepStatus::Pending {
                continue;
            }
            let old = step_of(&run.definition, &step.id);
            let sleeps = old
                .as_ref()
                .is_some_and(|s| !s["sleep"].is_null() || !s["until"].is_null());
            let for_each = old.as_ref().is_some_and(|s| !s["for_each"].is_null());
            if for_each && !step.status.is_finished() {
                return refuse(format!(
                    "step `{}` runs its items now (`for_each`); migrate the run when it has finished",
                    step.id
                ));
            }
            if step.status == StepStatus::Running && !sleeps {
                return refuse(format!(
                    "step `{}` is running its node; migrate the run while it waits, or pause it and let its steps finish",
                    step.id
                ));
            }
            let new = step_of(&current.spec_json, &step.id);
            if new != old {
                let diff = crate::diff::strict(
                    new.as_ref().unwrap_or(&Value::Null),
                    old.as_ref().unwrap_or(&Value::Null),
                    [
                        "in force",
                        "run's",
                        "missing in force",
                        "missing from the run's",
                    ],
                    "",
                );
                return refuse(format!(
                    "step `{}` ({}) is defined differently in the definition in force: {}",
                    step.id,
                    step.status.as_str(),
                    diff.trim().replace('\n', " ")
                ));
            }
        }
        Ok(())
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
        // Its undone steps would not run again.
        if run.status.is_finished()
            && self
                .store
                .steps(run_id)
                .await?
                .iter()
                .any(|s| definition::compensated_by(&s.step_id).is_some())
        {
            return Err(WorkflowError::Compensated {
                run_id: run_id.to_owned(),
            });
        }
        // A run under flow control goes back to the queue; the admitter
        // drives it from there, whenever it admits it (maybe before the
        // read below).
        let queued = run.flow.is_some();
        let reopen = Transition::RunReopened {
            workflow: &run.workflow,
        };
        match self.events.apply(run_id, &[reopen], None).await {
            Ok(_) => {}
            Err(StoreError::Refused(_)) => {
                return Err(WorkflowError::NotRetryable {
                    run_id: run_id.to_owned(),
                    status: run.status.as_str().to_owned(),
                });
            }
            Err(e) => return Err(e.into()),
        }
        let mut run = self.stored_run(run_id).await?;
        if queued {
            run.status = RunStatus::Queued;
        }
        self.mode.reopened(self, run).await?;
        self.get(run_id, false).await
    }
}

/// A migration refused, and why.
fn not_migrated(run_id: &str, message: String) -> WorkflowError {
    WorkflowError::NotWaiting {
        run_id: run_id.to_owned(),
        message,
    }
}
