//! The scheduler: drives one run through its graph.
//!
//! A step starts as soon as its needs have finished; independent steps run in
//! parallel, each node run holding one of the host's step slots. Every
//! transition is written to the store before the scheduler acts on it, so a
//! step's output is durable before any step that needs it starts, and a crash
//! leaves a state that [`drive`] can pick up again: finished steps are kept,
//! an interrupted step runs again as its next attempt.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::definition::{Definition, Spec, Step};
use super::events::Events;
use super::parking::{Answered, PARK_AFTER, Parked, Parking};
use crate::capability::{CallJournal, JournalEntry, Progress, truncate_utf8};
use crate::domain::{
    CallRow, Failure, RunStatus, STEP_LOG, StepRow, StepStatus, Transition, now_text,
};
use crate::runtime::{Node, RunError, RunOptions, RunReport, Runtime};
use crate::store::{Fence, Store, StoreError};
use crate::trace;

/// Records a step attempt's capability calls in the store.
struct StepJournal {
    store: Arc<dyn Store>,
    run_id: String,
    step_id: String,
    item: u32,
    attempt: u32,
    prefix: String,
    progress: StepProgress,
    events: Events,
    fence: Fence,
    /// Bumped when a signal (an answer too) is sent to the run.
    signals: tokio::sync::watch::Receiver<u64>,
    /// The workflow's `redact` fields.
    redact: Arc<Spec>,
    /// This node run's calls, for a step that parks ([`super::parking`]).
    parking: Arc<Parking>,
}

/// The signal that answers the question step `step_id` (item `item`) was
/// asked: `workflow.answer` sends it.
pub(crate) fn answer_signal(step_id: &str, item: u32) -> String {
    format!("answer:{step_id}/{item}")
}

/// Puts the questions a step's calls are asked to whoever answers the run:
/// the question is kept in the store (`workflow.get`, the console) and sent
/// as a `step.question` event, and the answer comes as a signal
/// ([`answer_signal`]).
struct StepElicitor {
    store: Arc<dyn Store>,
    run_id: String,
    step_id: String,
    item: u32,
    events: Events,
    signals: tokio::sync::watch::Receiver<u64>,
}

impl StepElicitor {
    async fn take_answer(&self, signal: &str) -> Option<crate::capability::Answer> {
        match self
            .store
            .take_signal(&self.run_id, signal, &self.step_id)
            .await
        {
            Ok(Some(payload)) => Some(
                serde_json::from_value(payload)
                    .unwrap_or_else(|_| crate::capability::Answer::decline()),
            ),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(run = %self.run_id, step = %self.step_id,
                    "cannot look for the answer to a question: {e}");
                None
            }
        }
    }
}

#[async_trait::async_trait]
impl crate::capability::Elicitor for StepElicitor {
    async fn ask(
        &self,
        question: crate::capability::Question,
        within: Duration,
    ) -> crate::capability::Answer {
        use crate::capability::Answer;
        let signal = answer_signal(&self.step_id, self.item);
        // An answer left from an earlier question (sent as it timed out)
        // is not this one's.
        let _ = self.take_answer(&signal).await;
        // Kept in the store: what an upstream asks holds no known secret.
        let asked = serde_json::to_value(&question).unwrap_or_default();
        let asked = crate::secrets::redact_json(&asked).unwrap_or(asked);
        if let Err(e) = self
            .store
            .put_question(&self.run_id, &self.step_id, self.item, Some(&asked))
            .await
        {
            tracing::warn!(run = %self.run_id, step = %self.step_id,
                "cannot keep the question; declined: {e}");
            return Answer::decline();
        }
        tracing::info!(run = %self.run_id, step = %self.step_id, connection = %question.connection,
            tool = %question.tool, "the server asks a question; waiting for `workflow.answer`");
        self.events
            .emit(
                &self.run_id,
                "step.question",
                json!({"step": self.step_id, "item": self.item, "question": asked}),
            )
            .await;
        let deadline = Instant::now() + within;
        let mut sent = self.signals.clone();
        let answer = loop {
            sent.borrow_and_update();
            if let Some(answer) = self.take_answer(&signal).await {
                break answer;
            }
            tokio::select! {
                Ok(()) = sent.changed() => {}
                _ = tokio::time::sleep(SIGNAL_POLL_SHARED) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    // An answer sent just before the deadline still counts.
                    if let Some(answer) = self.take_answer(&signal).await {
                        break answer;
                    }
                    tracing::info!(run = %self.run_id, step = %self.step_id,
                        "no answer within {}; declined", humantime::format_duration(within));
                    break Answer::decline();
                }
            }
        };
        if let Err(e) = self
            .store
            .put_question(&self.run_id, &self.step_id, self.item, None)
            .await
        {
            tracing::warn!(run = %self.run_id, step = %self.step_id, "cannot forget the question: {e}");
        }
        self.events
            .emit(
                &self.run_id,
                "step.answered",
                json!({"step": self.step_id, "item": self.item, "action": answer.action}),
            )
            .await;
        answer
    }
}

/// The upstream tasks of a run's calls, kept in the store.
struct RunTasks {
    store: Arc<dyn Store>,
    run_id: String,
    parking: Arc<Parking>,
}

#[async_trait::async_trait]
impl crate::capability::TaskLedger for RunTasks {
    async fn task_of(&self, key: &str) -> Option<String> {
        match self.store.task_of(key).await {
            Ok(task) => task,
            Err(e) => {
                tracing::warn!(run = %self.run_id, "cannot look up the call's upstream task: {e}");
                None
            }
        }
    }

    async fn task_started(&self, key: &str, connection: &str, task_id: &str) {
        if let Err(e) = self
            .store
            .record_task(&self.run_id, key, connection, task_id)
            .await
        {
            tracing::warn!(run = %self.run_id, "cannot keep the call's upstream task: {e}");
        }
        self.parking.task_started(key, connection, task_id);
    }

    fn keeps_task(&self) -> bool {
        self.parking.keeps_task()
    }
}

/// The latest progress a running step's calls reported, by step id.
pub(crate) type StepProgress = Arc<std::sync::Mutex<HashMap<String, Progress>>>;

#[async_trait::async_trait]
impl CallJournal for StepJournal {
    fn key_prefix(&self) -> &str {
        &self.prefix
    }

    fn progress(&self, progress: Progress) {
        self.events.ephemeral(
            &self.run_id,
            "step.progress",
            json!({"step": self.step_id, "item": self.item, "progress": progress}),
        );
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.step_id.clone(), progress);
    }

    fn elicitor(&self) -> Option<Arc<dyn crate::capability::Elicitor>> {
        Some(Arc::new(StepElicitor {
            store: self.store.clone(),
            run_id: self.run_id.clone(),
            step_id: self.step_id.clone(),
            item: self.item,
            events: self.events.clone(),
            signals: self.signals.clone(),
        }))
    }

    fn tasks(&self) -> Option<Arc<dyn crate::capability::TaskLedger>> {
        Some(Arc::new(RunTasks {
            store: self.store.clone(),
            run_id: self.run_id.clone(),
            parking: self.parking.clone(),
        }))
    }

    fn calling(&self, seq: u32, name: &str, arguments: &Value) {
        self.parking.calling(seq, name, arguments);
    }

    fn replayed(
        &self,
        seq: u32,
        name: &str,
        arguments: &Value,
    ) -> Option<crate::capability::Replayed> {
        self.parking.replayed(seq, name, arguments)
    }

    async fn record(&self, entry: JournalEntry) {
        self.parking.recorded(&entry);
        if entry.seq > MAX_JOURNALED_CALLS {
            if entry.seq == MAX_JOURNALED_CALLS + 1 {
                tracing::warn!(run = %self.run_id, step = %self.step_id,
                    "more than {MAX_JOURNALED_CALLS} capability calls; later ones are not journaled");
            }
            return;
        }
        // Known secrets and the workflow's `redact` fields are never journaled.
        let mut arguments = crate::secrets::redact_value(entry.arguments, &self.redact.redact);
        let result = crate::secrets::redact_value(entry.result, &self.redact.redact);
        let text = arguments.to_string();
        if text.len() > MAX_JOURNALED_ARGUMENTS {
            arguments = Value::String(truncate_utf8(text, MAX_JOURNALED_ARGUMENTS));
        }
        let row = CallRow {
            run_id: self.run_id.clone(),
            step_id: self.step_id.clone(),
            item: self.item,
            attempt: self.attempt,
            seq: entry.seq,
            name: crate::secrets::redact(&entry.name).into_owned(),
            arguments,
            outcome: if entry.error_code.is_some() {
                "error"
            } else {
                "ok"
            }
            .into(),
            error_code: entry.error_code.map(str::to_owned),
            duration_us: entry.duration.as_micros() as u64,
            at: now_text(),
            result: (crate::capability::json_len(&result) <= crate::domain::MAX_CALL_RESULT)
                .then_some(result),
        };
        if let Err(e) = self.store.record_call(&row, &self.fence).await {
            tracing::warn!(run = %self.run_id, step = %self.step_id, "cannot journal a call: {e}");
        }
    }
}

/// How long one jq evaluation may take. Expressions come from the config,
/// but the data they walk comes from nodes and upstream servers.
const JQ_TIMEOUT: Duration = Duration::from_secs(10);
/// Most items a `for_each` may produce.
pub const MAX_ITEMS: usize = 10_000;
/// Interrupted attempts (the host crashed or was killed while the step ran)
/// allowed beyond the step's own retry budget before the step fails `crashed`.
const CRASH_ALLOWANCE: u32 = 20;
/// Journal rows kept per node run; later calls still run, unrecorded.
const MAX_JOURNALED_CALLS: u32 = 1000;
/// Largest arguments kept in the journal, in bytes of JSON.
const MAX_JOURNALED_ARGUMENTS: usize = 4096;

/// Runs a jq evaluation on its own thread, so a slow expression never holds
/// an async worker, and gives up on it after [`JQ_TIMEOUT`]. (jq has no way
/// to be interrupted: a runaway evaluation's thread is left to finish, and
/// dies with the process.)
pub(super) async fn jq<T: Send + 'static>(
    code: &'static str,
    eval: impl FnOnce() -> Result<T, super::expr::EvalError> + Send + 'static,
) -> Result<T, Failure> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("wf-jq".into())
        .spawn(move || {
            let _ = tx.send(eval());
        });
    if let Err(e) = spawned {
        return Err(Failure::new(
            code,
            format!("cannot start a jq evaluation: {e}"),
        ));
    }
    match tokio::time::timeout(JQ_TIMEOUT, rx).await {
        Ok(Ok(Ok(value))) => Ok(value),
        Ok(Ok(Err(e))) => Err(Failure::new(code, e.to_string())),
        Ok(Err(_)) => Err(Failure::new(code, "the jq evaluation panicked")),
        Err(_) => Err(Failure::new(
            code,
            format!(
                "a jq expression did not finish within {}",
                humantime::format_duration(JQ_TIMEOUT)
            ),
        )),
    }
}

/// What a run needs while it is driven.
pub(crate) struct RunCtx {
    pub run_id: String,
    pub def: Definition,
    /// The node of each step id that may still run.
    pub nodes: HashMap<String, Node>,
    pub input: Value,
    pub store: Arc<dyn Store>,
    pub runtime: Arc<Runtime>,
    /// Step slots shared by every run of the host.
    pub slots: Arc<Semaphore>,
    /// `workflow.cancel`.
    pub cancel: CancellationToken,
    /// The process is stopping: stop, and leave the stored state as it is so
    /// the next start resumes the run.
    pub shutdown: CancellationToken,
    /// How long the run has already had (its deadline counts from its start,
    /// across restarts).
    pub elapsed: Duration,
    /// What `workflow.get` shows of the running steps' progress.
    pub progress: StepProgress,
    pub events: Events,
    /// This worker's hold on the run: every write of the run carries it.
    pub fence: Fence,
    /// The run's root span: every step span is its child.
    pub span: tracing::Span,
    /// The steps whose first attempt's start was stored with the run
    /// ([`Step::starts_with_run`]): they start without another write.
    pub started: Vec<String>,
    /// Whether the run sleeps (see [`Asleep`]).
    pub asleep: Asleep,
    /// Bumped when a signal is sent to the run: its wait steps look for it.
    pub signals: tokio::sync::watch::Receiver<u64>,
}

/// Which runs of this process sleep: a run with a sleep step in flight does
/// not count against the runs a worker takes on (it holds no step slot;
/// node runs stay bounded by the slots). Each run counts once, however many
/// of its steps sleep.
#[derive(Clone, Default)]
pub(crate) struct Asleep {
    /// This run's sleeping steps.
    steps: Arc<AtomicU32>,
    /// Runs of this process with a sleeping step.
    pub runs: Arc<std::sync::atomic::AtomicUsize>,
    /// Woken when a run falls asleep: the claimer may take on another.
    pub wake: Arc<tokio::sync::Notify>,
}

impl Asleep {
    /// A run of this process, counting into `runs`.
    pub(crate) fn of_run(
        runs: Arc<std::sync::atomic::AtomicUsize>,
        wake: Arc<tokio::sync::Notify>,
    ) -> Asleep {
        Asleep {
            steps: Arc::default(),
            runs,
            wake,
        }
    }

    /// A step of the run sleeps until the guard drops.
    fn enter(&self) -> AsleepGuard {
        if self.steps.fetch_add(1, Ordering::AcqRel) == 0 {
            self.runs.fetch_add(1, Ordering::AcqRel);
            self.wake.notify_one();
        }
        AsleepGuard(self.clone())
    }
}

struct AsleepGuard(Asleep);

impl Drop for AsleepGuard {
    fn drop(&mut self) {
        if self.0.steps.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.runs.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// How driving a run ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ending {
    Finished(Finished),
    /// Stopped by shutdown; the run stays `running` in the store.
    Interrupted,
}

/// What a run's end wrote: with the run as it started, the run as stored now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Finished {
    pub status: RunStatus,
    pub output: Option<Value>,
    pub error: Option<Failure>,
    /// The time of its `run.finished` event: its `finished_at` where the
    /// store stamps writes with their event's time
    /// ([`crate::store::Store::stamps_with_event_time`]).
    pub at: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Cancelled,
    Timeout,
    Shutdown,
}

/// How a step ended, before it is stored.
enum Outcome {
    Succeeded(Value),
    Skipped,
    Failed(Failure),
    /// Its node was stopped by a cancel, the run deadline or shutdown.
    Interrupted,
    /// The store could not record the step (it is away, or this worker lost
    /// the run's lease): the step is not settled here.
    Lost(StoreError),
}

impl Outcome {
    /// Records the outcome on the step's span.
    fn trace(&self, span: &tracing::Span) {
        match self {
            Outcome::Succeeded(_) => trace::record_status(span, "succeeded", true, None),
            Outcome::Skipped => trace::record_status(span, "skipped", true, None),
            Outcome::Failed(f) => trace::record_status(span, "failed", false, Some(&f.message)),
            Outcome::Interrupted => trace::record_status(span, "interrupted", false, None),
            Outcome::Lost(e) => trace::record_status(span, "lost", false, Some(&e.to_string())),
        }
    }
}

struct StepState {
    status: StepStatus,
    output: Option<Value>,
    attempts: u32,
    error: Option<Failure>,
    /// A sleep step found sleeping, or a wait step found waiting, at
    /// start-up: its input as its start stored it (when it wakes; what it
    /// waits for and until when).
    resumed: Option<Value>,
}

/// Drives a run until every step has finished or it is stopped.
///
/// `rows` is the run's stored steps: all `pending` for a new run; for a resumed
/// or retried run, finished steps keep their outputs and are never re-run.
///
/// # Errors
/// A [`StoreError`]: the run's state could not be recorded, so it stops; the
/// caller marks it failed.
pub(crate) async fn drive(ctx: Arc<RunCtx>, rows: Vec<StepRow>) -> Result<Ending, StoreError> {
    let mut crashed = Vec::new();
    let mut states: HashMap<String, StepState> = rows
        .into_iter()
        .map(|r| {
            // A sleep step left `running` sleeps on until the time its start
            // stored, and a wait step left `waiting` waits on: they were not
            // interrupted, only their host was.
            let spec = ctx.def.step(&r.step_id).map(|s| &s.spec);
            let resumed = match r.status {
                StepStatus::Running if spec.is_some_and(|s| s.sleeps()) => r.input.clone(),
                StepStatus::Waiting if spec.is_some_and(|s| s.waits()) => r.input.clone(),
                _ => None,
            };
            // A step left `running` was interrupted by a crash: it runs again,
            // unless it has been interrupted too often (it may be what kills
            // the host).
            let status = if resumed.is_some() || r.status == StepStatus::Waiting {
                StepStatus::Pending
            } else if r.status == StepStatus::Running {
                let budget = ctx
                    .def
                    .step(&r.step_id)
                    .map_or(1, |s| s.spec.retry.max_attempts)
                    + CRASH_ALLOWANCE;
                if r.attempts >= budget {
                    crashed.push(r.step_id.clone());
                }
                StepStatus::Pending
            } else {
                r.status
            };
            (
                r.step_id,
                StepState {
                    status,
                    output: r.output,
                    attempts: r.attempts,
                    error: r.error,
                    resumed,
                },
            )
        })
        .collect();
    for id in crashed {
        let attempts = states[&id].attempts;
        let error = Failure::new(
            "crashed",
            format!("the host stopped {attempts} times while this step ran; not trying again"),
        );
        settle(&ctx, &mut states, &id, StepStatus::Failed, Some(error)).await?;
    }
    let deadline = ctx
        .def
        .timeout
        .map(|t| Instant::now() + t.saturating_sub(ctx.elapsed));
    let stop_token = CancellationToken::new();
    let mut stop: Option<Stop> = None;
    let mut running = Steps::default();

    loop {
        if stop.is_none() {
            launch_ready(&ctx, &mut states, &mut running, &stop_token).await?;
        }
        if running.is_empty() {
            break;
        }
        tokio::select! {
            joined = running.next() => {
                let Some(joined) = joined else { continue };
                let (id, outcome, log) = match joined {
                    Ok(done) => done,
                    Err(e) => {
                        // A panic in a step is a host bug; fail the run loudly
                        // rather than hang it.
                        tracing::error!(run = %ctx.run_id, "a step task failed: {e}");
                        return Err(StoreError::Corrupt(format!("a step task failed: {e}")));
                    }
                };
                if let Some(ending) = record(&ctx, &mut states, &id, outcome, stop, log).await? {
                    return Ok(ending);
                }
            }
            _ = ctx.cancel.cancelled(), if stop.is_none() => {
                stop = Some(Stop::Cancelled);
                stop_token.cancel();
            }
            _ = sleep_until(deadline), if stop.is_none() && deadline.is_some() => {
                stop = Some(Stop::Timeout);
                stop_token.cancel();
            }
            _ = ctx.shutdown.cancelled(), if stop.is_none() => {
                stop = Some(Stop::Shutdown);
                stop_token.cancel();
            }
        }
    }
    if stop == Some(Stop::Shutdown) {
        return Ok(Ending::Interrupted);
    }
    finish(&ctx, &mut states, stop).await
}

/// A step that ended: its id, how, and its last attempt's `step.log` event.
type StepDone = (String, Outcome, Option<Value>);

/// The steps of a run in flight. One runs on the run's own task, so a chain
/// of steps never spawns a task nor hands its result across tasks; each step
/// that starts while another runs gets a task of its own, so parallel steps
/// still use every core. Dropping it cancels them all.
#[derive(Default)]
struct Steps {
    inline: Option<BoxFuture<'static, std::thread::Result<StepDone>>>,
    spawned: JoinSet<StepDone>,
}

impl Steps {
    fn start(&mut self, step: impl Future<Output = StepDone> + Send + 'static) {
        if self.inline.is_none() {
            // As a spawned task would, a panic ends this step, not the run's task.
            self.inline = Some(AssertUnwindSafe(step).catch_unwind().boxed());
        } else {
            self.spawned.spawn(step);
        }
    }

    fn is_empty(&self) -> bool {
        self.inline.is_none() && self.spawned.is_empty()
    }

    /// The next step to end; `Err` when one panicked (a host bug), as a
    /// spawned task's panic is reported. `None` when none is in flight.
    async fn next(&mut self) -> Option<Result<StepDone, String>> {
        std::future::poll_fn(|cx| {
            if let Some(step) = &mut self.inline
                && let Poll::Ready(ended) = step.poll_unpin(cx)
            {
                self.inline = None;
                return Poll::Ready(Some(ended.map_err(|panic| panic_message(&*panic))));
            }
            match self.spawned.poll_join_next(cx) {
                Poll::Ready(Some(joined)) => Poll::Ready(Some(joined.map_err(|e| e.to_string()))),
                Poll::Ready(None) if self.inline.is_none() => Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

/// What a panic said, when it said it as text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic");
    format!("panicked: {text}")
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Starts every pending step whose needs have finished; settles those that
/// cannot run (a need failed: cancelled; a need skipped: skipped).
async fn launch_ready(
    ctx: &Arc<RunCtx>,
    states: &mut HashMap<String, StepState>,
    running: &mut Steps,
    stop_token: &CancellationToken,
) -> Result<(), StoreError> {
    // Steps are in an order where needs come first, so one pass settles chains.
    for step in &ctx.def.steps {
        let id = &step.spec.id;
        if states[id].status != StepStatus::Pending {
            continue;
        }
        let needs: Vec<(&String, StepStatus)> = step
            .spec
            .needs
            .iter()
            .map(|n| (n, states[n].status))
            .collect();
        if !needs.iter().all(|(_, s)| s.is_finished()) {
            continue;
        }
        if let Some((need, _)) = needs
            .iter()
            .find(|(_, s)| matches!(s, StepStatus::Failed | StepStatus::Cancelled))
        {
            let error = Failure::new(
                "need-failed",
                format!("not run: step `{need}` did not succeed"),
            );
            settle(ctx, states, id, StepStatus::Cancelled, Some(error)).await?;
            continue;
        }
        if needs.iter().any(|(_, s)| *s == StepStatus::Skipped) {
            settle(ctx, states, id, StepStatus::Skipped, None).await?;
            continue;
        }
        // jq sees every finished step; a step without expressions needs only
        // its needs' outputs (and a long chain stays linear).
        let has_jq = step.input.is_some()
            || step.condition.is_some()
            || step.for_each.is_some()
            || step.until.is_some();
        let data = if has_jq {
            context(&ctx.input, states, None)
        } else {
            context(&ctx.input, states, Some(&step.spec.needs))
        };
        let state = states.get_mut(id).expect("every step has a state");
        state.status = StepStatus::Running;
        let first_attempt = state.attempts + 1;
        let recorded = first_attempt == 1 && ctx.started.contains(id);
        let resumed = state.resumed.take();
        let ctx = ctx.clone();
        let step = step.clone();
        let stop = stop_token.clone();
        let id = id.clone();
        let span = trace::step_span(&ctx.span, &id, first_attempt);
        running.start(async move {
            let started = Instant::now();
            let mut log = None;
            let attempt = Attempt {
                first: first_attempt,
                recorded,
            };
            let outcome = match resumed {
                Some(input) if step.spec.waits() => {
                    wait_step(&ctx, &step, Arc::new(data), attempt, Some(input), &stop).await
                }
                Some(input) => {
                    let until = input["until"].as_str().map(str::to_owned);
                    sleep_step(&ctx, &step, Arc::new(data), attempt, until, &stop).await
                }
                None => run_step(&ctx, &step, data, attempt, &stop, &span, &mut log).await,
            };
            crate::metrics::metrics().step_finished(&ctx.def.name, &id, started.elapsed());
            outcome.trace(&span);
            (id, outcome, log)
        });
    }
    Ok(())
}

/// `{input, steps: {<id>: {output}}}` over the steps that have finished
/// (only those in `only`, when given).
fn context(input: &Value, states: &HashMap<String, StepState>, only: Option<&[String]>) -> Value {
    let steps: Map<String, Value> = states
        .iter()
        .filter(|(id, _)| only.is_none_or(|only| only.contains(id)))
        .filter(|(_, s)| matches!(s.status, StepStatus::Succeeded | StepStatus::Skipped))
        .map(|(id, s)| {
            (
                id.clone(),
                json!({ "output": s.output.clone().unwrap_or(Value::Null) }),
            )
        })
        .collect();
    json!({ "input": input, "steps": steps })
}

/// Writes `moves` of the run (with their events) under its fence: the one
/// way the engine moves a run or a step. Each move is a [`Transition`] that
/// knows its event and the states it may start from; the store refuses a
/// move whose guard does not hold.
async fn apply(ctx: &RunCtx, moves: &[Transition<'_>]) -> Result<String, StoreError> {
    ctx.events
        .apply_redacting(&ctx.run_id, moves, Some(&ctx.fence), &ctx.def.spec.redact)
        .await
}

/// Moves a step to a finished `status`: stored first, then the scheduler's
/// view, so nothing acts on a transition that is not durable. `log` is the
/// `step.log` event of its last attempt, stored with it.
async fn transition(
    ctx: &RunCtx,
    states: &mut HashMap<String, StepState>,
    id: &str,
    status: StepStatus,
    output: Option<Value>,
    error: Option<Failure>,
    log: Option<Value>,
) -> Result<(), StoreError> {
    let write = Transition::StepFinished {
        step_id: id,
        status,
        output: output.as_ref(),
        error: error.as_ref(),
        log: log.as_ref(),
    };
    apply(ctx, &[write]).await?;
    set_finished(states, id, status, output, error);
    Ok(())
}

/// The scheduler's view of a step that finished.
fn set_finished(
    states: &mut HashMap<String, StepState>,
    id: &str,
    status: StepStatus,
    output: Option<Value>,
    error: Option<Failure>,
) {
    let state = states.get_mut(id).expect("every step has a state");
    state.status = status;
    state.output = output;
    state.error = error;
}

/// Settles a step without running it (it can no longer run, or is not to):
/// a [`transition`] with no output and no log.
async fn settle(
    ctx: &RunCtx,
    states: &mut HashMap<String, StepState>,
    id: &str,
    status: StepStatus,
    error: Option<Failure>,
) -> Result<(), StoreError> {
    transition(ctx, states, id, status, None, error, None).await
}

/// Stores how a step ended and updates the scheduler's view. When it was
/// the run's last step to end, the run's end goes in the same write, and is
/// what this returns.
async fn record(
    ctx: &RunCtx,
    states: &mut HashMap<String, StepState>,
    id: &str,
    outcome: Outcome,
    stop: Option<Stop>,
    log: Option<Value>,
) -> Result<Option<Ending>, StoreError> {
    // The log goes with the step's transition; where there is none, alone.
    let alone = async |log: Option<Value>| {
        if let Some(log) = log {
            ctx.events.emit(&ctx.run_id, STEP_LOG, log).await;
        }
    };
    let (status, output, error) = match outcome {
        Outcome::Lost(e) => {
            alone(log).await;
            return Err(e);
        }
        Outcome::Succeeded(output) => (StepStatus::Succeeded, Some(output), None),
        Outcome::Skipped => (StepStatus::Skipped, None, None),
        Outcome::Failed(f) => (StepStatus::Failed, None, Some(f)),
        Outcome::Interrupted if stop == Some(Stop::Shutdown) => {
            alone(log).await;
            // Left `running` in the store: the next start runs it again.
            states.get_mut(id).expect("every step has a state").status = StepStatus::Running;
            return Ok(None);
        }
        Outcome::Interrupted => {
            let f = match stop {
                Some(Stop::Timeout) => {
                    Failure::new("timeout", "stopped: the run reached its time limit")
                }
                _ => Failure::new("cancelled", "the run was cancelled"),
            };
            (StepStatus::Cancelled, None, Some(f))
        }
    };
    let last = states
        .iter()
        .all(|(other, state)| other == id || state.status.is_finished());
    if !last {
        transition(ctx, states, id, status, output, error, log).await?;
        return Ok(None);
    }
    // Nothing runs after this step, so the run's end is worked out from the
    // scheduler's view with this step in it, before either is stored; the
    // two are then stored together (one write, where the store can). A
    // crash before that write leaves the step to run again, as it would
    // between two writes.
    set_finished(states, id, status, output, error);
    let end = run_end(ctx, states, stop).await;
    let state = &states[id];
    let step = Transition::StepFinished {
        step_id: id,
        status,
        output: state.output.as_ref(),
        error: state.error.as_ref(),
        log: log.as_ref(),
    };
    end_run(ctx, end, Some(step)).await.map(Some)
}

/// Settles the steps that never ran and records how the run ended.
async fn finish(
    ctx: &RunCtx,
    states: &mut HashMap<String, StepState>,
    stop: Option<Stop>,
) -> Result<Ending, StoreError> {
    for step in &ctx.def.steps {
        let id = &step.spec.id;
        if states[id].status == StepStatus::Pending {
            let error = match stop {
                Some(Stop::Timeout) => {
                    Failure::new("timeout", "not run: the run reached its time limit")
                }
                _ => Failure::new("cancelled", "not run: the run was cancelled"),
            };
            settle(ctx, states, id, StepStatus::Cancelled, Some(error)).await?;
        }
    }
    let end = run_end(ctx, states, stop).await;
    end_run(ctx, end, None).await
}

/// How a run whose steps have all finished ends: its status, output and
/// error.
async fn run_end(
    ctx: &RunCtx,
    states: &HashMap<String, StepState>,
    stop: Option<Stop>,
) -> (RunStatus, Option<Value>, Option<Failure>) {
    let single = ctx.def.steps.len() == 1;
    let failed_step = ctx
        .def
        .steps
        .iter()
        .find(|s| states[&s.spec.id].status == StepStatus::Failed);
    match (stop, failed_step) {
        (Some(Stop::Cancelled), _) => (
            RunStatus::Cancelled,
            None,
            Some(Failure::new("cancelled", "the run was cancelled")),
        ),
        (Some(Stop::Timeout), _) => {
            let limit = ctx.def.timeout.unwrap_or_default();
            (
                RunStatus::Failed,
                None,
                Some(Failure::new(
                    "timeout",
                    format!(
                        "the run exceeded its time limit of {}",
                        humantime::format_duration(limit)
                    ),
                )),
            )
        }
        (_, Some(step)) => {
            let f = states[&step.spec.id]
                .error
                .clone()
                .unwrap_or_else(|| Failure::new("failed", "the step failed"));
            let f = if single {
                f
            } else {
                Failure::new(f.code, format!("step `{}`: {}", step.spec.id, f.message))
            };
            (RunStatus::Failed, None, Some(f))
        }
        (_, None) => match run_output(ctx, states).await {
            Ok(output) => (RunStatus::Succeeded, Some(output), None),
            Err(f) => (RunStatus::Failed, None, Some(f)),
        },
    }
}

/// Stores the run's end (after `step`'s, in the same write, when given) and
/// traces it.
async fn end_run(
    ctx: &RunCtx,
    (status, output, error): (RunStatus, Option<Value>, Option<Failure>),
    step: Option<Transition<'_>>,
) -> Result<Ending, StoreError> {
    let write = Transition::RunFinished {
        status,
        output: output.as_ref(),
        error: error.as_ref(),
    };
    let at = match step {
        Some(step) => apply(ctx, &[step, write]).await?,
        None => apply(ctx, &[write]).await?,
    };
    trace::record_status(
        &ctx.span,
        status.as_str(),
        status == RunStatus::Succeeded,
        error.as_ref().map(|e| e.message.as_str()),
    );
    Ok(Ending::Finished(Finished {
        status,
        output,
        error,
        at,
    }))
}

/// Marks a step `running` in `attempt` with its input, with its event.
async fn step_started(
    ctx: &RunCtx,
    id: &str,
    attempt: u32,
    input: &Value,
) -> Result<(), StoreError> {
    apply(ctx, &[start_of(id, attempt, input)]).await.map(drop)
}

/// The transition that marks a step `running` in `attempt` with its input.
pub(crate) fn start_of<'a>(id: &'a str, attempt: u32, input: &'a Value) -> Transition<'a> {
    Transition::StepStarted {
        step_id: id,
        attempt,
        input: Some(input),
    }
}

/// The `output` mapping, or the output of the one step nothing needs (an
/// object keyed by id when there are several).
async fn run_output(ctx: &RunCtx, states: &HashMap<String, StepState>) -> Result<Value, Failure> {
    if let Some(expr) = ctx.def.output.clone() {
        let data = context(&ctx.input, states, None);
        return jq("output-mapping", move || expr.eval(&data)).await;
    }
    let output_of = |id: &String| states[id].output.clone().unwrap_or(Value::Null);
    Ok(match ctx.def.leaves.as_slice() {
        [one] => output_of(one),
        many => Value::Object(many.iter().map(|id| (id.clone(), output_of(id))).collect()),
    })
}

/// The first attempt a step's launch makes, and whether its start is
/// stored already (with the run).
#[derive(Clone, Copy)]
struct Attempt {
    first: u32,
    recorded: bool,
}

/// Runs one step: its condition, its input mapping, then its node once (or
/// once per `for_each` item), with retries.
async fn run_step(
    ctx: &Arc<RunCtx>,
    step: &Step,
    data: Value,
    attempt: Attempt,
    stop: &CancellationToken,
    span: &tracing::Span,
    log: &mut Option<Value>,
) -> Outcome {
    let id = &step.spec.id;
    let data = Arc::new(data);
    if let Some(cond) = step.condition.clone() {
        let d = data.clone();
        match jq("condition", move || cond.eval_bool(&d)).await {
            Ok(true) => {}
            Ok(false) => return Outcome::Skipped,
            Err(f) => return Outcome::Failed(f),
        }
    }
    if step.spec.sleeps() {
        return sleep_step(ctx, step, data, attempt, None, stop).await;
    }
    if step.spec.waits() {
        return wait_step(ctx, step, data, attempt, None, stop).await;
    }
    // The attempt counter is the step's, shared by its items: every node run
    // (a first try or a retry) takes the next number, so the journal never
    // mixes two runs of the node.
    let first_attempt = attempt.first;
    let attempts = AtomicU32::new(first_attempt);
    let Some(each) = step.for_each.clone() else {
        let input = match step_input(step, &data, None).await {
            Ok(input) => input,
            Err(f) => return Outcome::Failed(f),
        };
        if !attempt.recorded
            && let Err(e) = step_started(ctx, id, first_attempt, &input).await
        {
            return store_failure(e);
        }
        return match run_item(ctx, step, None, &input, &attempts, stop, span, Some(log)).await {
            Ok(output) => Outcome::Succeeded(output),
            Err(outcome) => outcome,
        };
    };
    let d = data.clone();
    let items = match jq("input-mapping", move || each.eval_array(&d)).await {
        Ok(items) if items.len() > MAX_ITEMS => {
            return Outcome::Failed(Failure::new(
                "input-mapping",
                format!(
                    "`for_each` produced {} items; the limit is {MAX_ITEMS}",
                    items.len()
                ),
            ));
        }
        Ok(items) => items,
        Err(f) => return Outcome::Failed(f),
    };
    // The step's recorded input is its items; each item's input is mapped
    // only when the item runs.
    let all = Value::Array(items);
    if let Err(e) = step_started(ctx, id, first_attempt, &all).await {
        return store_failure(e);
    }
    let Value::Array(items) = all else {
        unreachable!("built as an array above")
    };
    // Each item is its own task, so items run on every core; at most
    // `concurrency` at once, outputs kept in item order. The first failure
    // stops the rest.
    let attempts = Arc::new(attempts);
    let step = Arc::new(step.clone());
    let count = items.len();
    let mut pending = items.into_iter().enumerate();
    let mut outputs: Vec<Option<Value>> = vec![None; count];
    let mut running: JoinSet<(usize, Result<Value, Outcome>)> = JoinSet::new();
    let mut failed: Option<Outcome> = None;
    loop {
        while failed.is_none() && running.len() < step.spec.concurrency {
            let Some((index, item)) = pending.next() else {
                break;
            };
            let (ctx, step, data) = (ctx.clone(), step.clone(), data.clone());
            let (attempts, stop, span) = (attempts.clone(), stop.clone(), span.clone());
            running.spawn(async move {
                let mut item_data = (*data).clone();
                item_data["item"] = item;
                item_data["index"] = json!(index);
                let result = match step_input(&step, &item_data, Some(index)).await {
                    Ok(input) => {
                        run_item(
                            &ctx,
                            &step,
                            Some(index),
                            &input,
                            &attempts,
                            &stop,
                            &span,
                            None,
                        )
                        .await
                    }
                    Err(f) => Err(Outcome::Failed(f)),
                };
                (index, result)
            });
        }
        let Some(joined) = running.join_next().await else {
            break;
        };
        match joined {
            Ok((index, Ok(output))) => outputs[index] = Some(output),
            Ok((_, Err(outcome))) => {
                if failed.is_none() {
                    failed = Some(outcome);
                    // Dropping a node run mid-flight cancels it (and its
                    // upstream call).
                    running.abort_all();
                }
            }
            Err(e) if e.is_cancelled() => {}
            Err(e) => {
                failed.get_or_insert(Outcome::Failed(Failure::new(
                    "trap",
                    format!("a for_each item's task failed: {e}"),
                )));
                running.abort_all();
            }
        }
    }
    let outputs = match failed {
        Some(outcome) => Err(outcome),
        None => Ok(outputs
            .into_iter()
            .map(|o| o.unwrap_or(Value::Null))
            .collect()),
    };
    match outputs {
        Ok(outputs) => Outcome::Succeeded(Value::Array(outputs)),
        Err(outcome) => outcome,
    }
}

/// A durable sleep (`sleep` or `until`). Its wake time is stored as the
/// step's input (`{"until": <RFC 3339>}`) when it starts, so a host that
/// restarts (or another worker that takes the run over) sleeps only what is
/// left (`resumed`). It runs no node and holds no step slot. Its output is
/// what its input would be (its needs' outputs, or its `input` mapping):
/// data passes through it.
async fn sleep_step(
    ctx: &RunCtx,
    step: &Step,
    data: Arc<Value>,
    attempt: Attempt,
    resumed: Option<String>,
    stop: &CancellationToken,
) -> Outcome {
    let output = match step_input(step, &data, None).await {
        Ok(output) => output,
        Err(f) => return Outcome::Failed(f),
    };
    let until = match resumed {
        Some(until) => until,
        None => {
            let until = match wake_time(step, &data).await {
                Ok(until) => humantime::format_rfc3339_millis(until).to_string(),
                Err(f) => return Outcome::Failed(f),
            };
            let input = json!({ "until": until });
            // The host's own bookkeeping: never the workflow's `redact`
            // fields (its wake time must survive a restart).
            let start = start_of(&step.spec.id, attempt.first, &input);
            if !attempt.recorded
                && let Err(e) = ctx
                    .events
                    .apply(&ctx.run_id, &[start], Some(&ctx.fence))
                    .await
            {
                return store_failure(e);
            }
            until
        }
    };
    let left = humantime::parse_rfc3339_weak(&until)
        .ok()
        .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
        .unwrap_or_default();
    let _asleep = ctx.asleep.enter();
    tokio::select! {
        _ = tokio::time::sleep(left) => Outcome::Succeeded(output),
        _ = stop.cancelled() => Outcome::Interrupted,
    }
}

/// How often a waiting step looks for its signal in the store, besides
/// when it hears of one: on a shared store, a note from another worker may
/// be missed; alone, every signal is heard, and the look is a safety net.
const SIGNAL_POLL_SHARED: Duration = Duration::from_secs(5);
const SIGNAL_POLL_ALONE: Duration = Duration::from_secs(60);

/// A wait step (`wait`): waits, holding no step slot, for a signal of its
/// name ([`crate::store::Store::take_signal`]; one sent before the step
/// started was kept for it), and gives its payload as output. What it waits
/// for and until when is stored as its input (`{signal, timeout_at,
/// request}`, `request` being what its input would be), so a host that
/// restarts (or another worker) waits on for what is left (`resumed`).
async fn wait_step(
    ctx: &RunCtx,
    step: &Step,
    data: Arc<Value>,
    attempt: Attempt,
    resumed: Option<Value>,
    stop: &CancellationToken,
) -> Outcome {
    let signal = step.spec.wait.as_deref().unwrap_or_default();
    let timeout_at = match resumed {
        Some(input) => input["timeout_at"].as_str().map(str::to_owned),
        None => {
            let request = match step_input(step, &data, None).await {
                Ok(request) => request,
                Err(f) => return Outcome::Failed(f),
            };
            let timeout_at = step.spec.wait_timeout_ms.map(|ms| {
                humantime::format_rfc3339_millis(
                    std::time::SystemTime::now() + Duration::from_millis(ms),
                )
                .to_string()
            });
            let input = json!({"signal": signal, "timeout_at": timeout_at, "request": request});
            let write = Transition::StepWaits {
                step_id: &step.spec.id,
                attempt: attempt.first,
                input: Some(&input),
            };
            if let Err(e) = apply(ctx, &[write]).await {
                return store_failure(e);
            }
            timeout_at
        }
    };
    let deadline = timeout_at.as_deref().map(|at| {
        let left = humantime::parse_rfc3339_weak(at)
            .ok()
            .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
            .unwrap_or_default();
        Instant::now() + left
    });
    let _asleep = ctx.asleep.enter();
    let mut sent = ctx.signals.clone();
    let poll = if ctx.store.shared() {
        SIGNAL_POLL_SHARED
    } else {
        SIGNAL_POLL_ALONE
    };
    loop {
        // Seen before looking, so a signal sent while looking wakes the wait.
        sent.borrow_and_update();
        match ctx
            .store
            .take_signal(&ctx.run_id, signal, &step.spec.id)
            .await
        {
            Ok(Some(payload)) => return Outcome::Succeeded(payload),
            Ok(None) => {}
            Err(e) if e.is_unavailable() => {
                tracing::warn!(run = %ctx.run_id, step = %step.spec.id,
                    "cannot look for the step's signal: {e}");
            }
            Err(e) => return store_failure(e),
        }
        tokio::select! {
            Ok(()) = sent.changed() => {}
            _ = tokio::time::sleep(poll) => {}
            _ = sleep_until(deadline), if deadline.is_some() => {
                // A signal sent just before the deadline still counts.
                if let Ok(Some(payload)) = ctx
                    .store
                    .take_signal(&ctx.run_id, signal, &step.spec.id)
                    .await
                {
                    return Outcome::Succeeded(payload);
                }
                let limit = step.spec.wait_timeout_ms.unwrap_or_default();
                return Outcome::Failed(Failure::new(
                    "timeout",
                    format!(
                        "no `{signal}` signal came within {}",
                        humantime::format_duration(Duration::from_millis(limit))
                    ),
                ));
            }
            _ = stop.cancelled() => return Outcome::Interrupted,
        }
    }
}

/// When a sleep step that starts now wakes: `sleep` from now, or the time
/// its `until` gives.
async fn wake_time(step: &Step, data: &Arc<Value>) -> Result<std::time::SystemTime, Failure> {
    if let Some(ms) = step.spec.sleep_ms {
        return Ok(std::time::SystemTime::now() + Duration::from_millis(ms));
    }
    let Some(expr) = step.until.clone() else {
        return Err(Failure::new(
            "until",
            "a sleep step has no `sleep` or `until`",
        ));
    };
    let d = data.clone();
    let value = jq("until", move || expr.eval(&d)).await?;
    value
        .as_str()
        .and_then(|text| humantime::parse_rfc3339_weak(text).ok())
        .ok_or_else(|| {
            Failure::new(
                "until",
                format!("`until` gave {value}, not an RFC 3339 time in UTC (such as `2026-12-24T18:00:00Z`)"),
            )
        })
}

/// A step whose state cannot be written: failed `state`, unless the store is
/// away or the run is no longer this worker's, which settle nothing here.
fn store_failure(e: StoreError) -> Outcome {
    if e.is_unavailable() {
        Outcome::Lost(e)
    } else {
        Outcome::Failed(Failure::new("state", e.to_string()))
    }
}

/// The step's input: its mapping, or by default the item (under `for_each`),
/// the workflow input (no needs), the need's output (one need), or an object
/// of the needs' outputs by id.
async fn step_input(step: &Step, data: &Value, item: Option<usize>) -> Result<Value, Failure> {
    if let Some(expr) = step.input.clone() {
        let data = data.clone();
        return jq("input-mapping", move || expr.eval(&data)).await;
    }
    if item.is_some() {
        return Ok(data["item"].clone());
    }
    let output_of = |id: &str| data["steps"][id]["output"].clone();
    Ok(match step.spec.needs.as_slice() {
        [] => data["input"].clone(),
        [one] => output_of(one),
        many => Value::Object(many.iter().map(|id| (id.clone(), output_of(id))).collect()),
    })
}

/// The journal of a node run of `step` (item `item`) in `attempt`, given
/// `answers` when the run before it parked.
fn step_journal(
    ctx: &RunCtx,
    step: &Step,
    item: u32,
    attempt: u32,
    answers: Vec<Answered>,
) -> StepJournal {
    let prefix = format!("{}/{}/{item}", ctx.run_id, step.spec.id);
    StepJournal {
        store: ctx.store.clone(),
        run_id: ctx.run_id.clone(),
        step_id: step.spec.id.clone(),
        item,
        attempt,
        parking: Arc::new(Parking::new(prefix.clone(), answers)),
        prefix,
        progress: ctx.progress.clone(),
        events: ctx.events.clone(),
        fence: ctx.fence.clone(),
        signals: ctx.signals.clone(),
        redact: ctx.def.spec.clone(),
    }
}

/// A parked step ([`super::parking`]): its node run was stopped while its
/// call waited on an upstream task; the step follows that task itself,
/// holding no instance and no step slot, and gives back the answers the next
/// run of the node gets. The call is made again with its idempotency key,
/// which finds the task kept under it, so the pool follows the task (it
/// calls the tool again only when the server no longer knows the task).
/// A stop drops the call, which cancels the task upstream (not on a host
/// shutdown: the next start follows it).
async fn follow_parked(
    ctx: &RunCtx,
    step: &Step,
    journal: &StepJournal,
    parked: Parked,
    stop: &CancellationToken,
) -> Result<Vec<Answered>, Outcome> {
    use crate::capability::{
        CallExtras, IDEMPOTENCY_META_KEY, split_qualified, tool_result_to_outcome,
    };
    tracing::info!(run = %ctx.run_id, step = %step.spec.id, item = journal.item,
        connection = %parked.connection, task = %parked.task_id,
        "the step's call waits on an upstream task; its node is let go until the task ends");
    ctx.events
        .emit(
            &ctx.run_id,
            "step.parked",
            json!({"step": step.spec.id, "item": journal.item, "call": parked.name,
                   "connection": parked.connection, "task": parked.task_id}),
        )
        .await;
    journal.progress(Progress {
        progress: 0.0,
        total: None,
        message: Some(format!(
            "waiting for task `{}` of `{}`",
            parked.task_id, parked.name
        )),
    });
    let _asleep = ctx.asleep.enter();
    // The follow's own ledger: it keeps no task when dropped.
    let follower = Arc::new(step_journal(
        ctx,
        step,
        journal.item,
        journal.attempt,
        Vec::new(),
    ));
    let follow = async {
        let (connection, tool) = split_qualified(&parked.name)?;
        let Value::Object(arguments) = parked.arguments.clone() else {
            return Err(crate::capability::CapabilityError::InvalidArguments(
                "arguments must be a JSON object".into(),
            ));
        };
        let mut extras = CallExtras::default();
        extras.meta.insert(
            IDEMPOTENCY_META_KEY.into(),
            Value::String(parked.key.clone()),
        );
        extras.tasks = follower.tasks().map(|ledger| (parked.key.clone(), ledger));
        extras.elicit = follower.elicitor();
        let follower = follower.clone();
        extras.progress = Some(Arc::new(move |p: Progress| follower.progress(p)));
        ctx.runtime
            .backend()
            .call_tool_with(connection, tool, arguments, extras)
            .await
            .and_then(tool_result_to_outcome)
    };
    let result = tokio::select! {
        result = follow => result,
        _ = stop.cancelled() => return Err(Outcome::Interrupted),
    };
    tracing::info!(run = %ctx.run_id, step = %step.spec.id, item = journal.item,
        task = %parked.task_id, ok = result.is_ok(), "the upstream task ended; the node runs again");
    Ok(parked.answers(result))
}

/// Runs the node on one input, retrying as the step's policy says.
///
/// An attempt's log records become a `step.log` event. With `deferred`, the
/// last attempt's is left there, to be stored with the step's transition (one
/// write fewer); earlier attempts' are emitted before their retry.
#[allow(clippy::too_many_arguments)]
async fn run_item(
    ctx: &RunCtx,
    step: &Step,
    item: Option<usize>,
    input: &Value,
    attempts: &AtomicU32,
    stop: &CancellationToken,
    span: &tracing::Span,
    mut deferred: Option<&mut Option<Value>>,
) -> Result<Value, Outcome> {
    let node = &ctx.nodes[&step.spec.id];
    let text = input.to_string();
    let mut tries = 0u32;
    let mut attempt = attempts.load(Ordering::Relaxed);
    // The answers a run of the node after a parked one is given.
    let mut answers: Vec<Answered> = Vec::new();
    loop {
        // A run after a parked one goes on with the same attempt.
        if answers.is_empty() {
            tries += 1;
        }
        let item_no = item.unwrap_or(0) as u32;
        let journal = Arc::new(step_journal(
            ctx,
            step,
            item_no,
            attempt,
            std::mem::take(&mut answers),
        ));
        let ran = {
            let permit = tokio::select! {
                permit = ctx.slots.acquire() => permit,
                _ = stop.cancelled() => return Err(Outcome::Interrupted),
            };
            let _permit = permit.expect("the step slots are never closed");
            let run_id = match item {
                Some(i) => format!("{}/{}/{i}", ctx.run_id, step.spec.id),
                None => format!("{}/{}", ctx.run_id, step.spec.id),
            };
            let cancel = stop.child_token();
            let opts = RunOptions {
                run_id,
                limits: Some(step.limits),
                cancel: cancel.clone(),
                grants: step.grants.clone(),
                journal: Some(journal.clone()),
                span: span.clone(),
            };
            let run = ctx.runtime.run(node, &text, opts);
            tokio::pin!(run);
            tokio::select! {
                report = &mut run => (report, None),
                parked = journal.parking.parks(PARK_AFTER) => {
                    // Stopped like a cancel; its call's task is kept.
                    cancel.cancel();
                    (run.await, Some(parked))
                }
            }
        };
        let report = match ran {
            // Parked (not stopped by the run's own cancel or deadline): its
            // logs are what the next run logs again.
            (
                RunReport {
                    result: Err(RunError::Cancelled),
                    ..
                },
                Some(parked),
            ) if !stop.is_cancelled() => {
                answers = follow_parked(ctx, step, &journal, parked, stop).await?;
                continue;
            }
            (report, _) => report,
        };
        if !report.logs.is_empty() {
            let data = json!({"step": step.spec.id, "item": item_no, "attempt": attempt, "records": report.logs});
            match deferred.as_deref_mut() {
                Some(slot) => *slot = Some(data),
                None => ctx.events.emit(&ctx.run_id, STEP_LOG, data).await,
            }
        }
        let result = report.result;
        let failure = match result {
            Ok(output) => {
                return serde_json::from_str(&output)
                    .map_err(|e| Outcome::Failed(Failure::new("invalid-output", e.to_string())));
            }
            Err(RunError::Cancelled) => return Err(Outcome::Interrupted),
            Err(e) => Failure::new(
                e.code(),
                match &e {
                    RunError::Node { message, .. } => message.clone(),
                    other => other.to_string(),
                },
            ),
        };
        if !step.spec.retry.retries(&failure.code, tries) {
            return Err(Outcome::Failed(failure));
        }
        // Retrying: this attempt's log comes before the next one starts.
        if let Some(data) = deferred.as_deref_mut().and_then(Option::take) {
            ctx.events.emit(&ctx.run_id, STEP_LOG, data).await;
        }
        let delay: Duration = step.spec.retry.delay(tries);
        tracing::info!(
            run = %ctx.run_id, step = %step.spec.id, attempt, code = %failure.code,
            "step attempt failed; retrying in {delay:?}"
        );
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.cancelled() => return Err(Outcome::Interrupted),
        }
        attempt = attempts.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(target: trace::TARGET, parent: span, code = %failure.code, attempt, "retry");
        span.record("wf.attempt", attempt);
        let write = Transition::StepAttempt {
            step_id: &step.spec.id,
            attempt,
        };
        apply(ctx, &[write]).await.map_err(store_failure)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(id: &str) -> StepDone {
        (id.to_owned(), Outcome::Skipped, None)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_first_step_runs_on_the_run_task_and_the_others_on_their_own() {
        // A run is a spawned task; the test's own body is not one.
        tokio::spawn(first_step_inline()).await.unwrap();
    }

    async fn first_step_inline() {
        let run_task = tokio::task::id();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut steps = Steps::default();
        for id in ["a", "b", "c"] {
            let tx = tx.clone();
            steps.start(async move {
                tx.send((id, tokio::task::id())).unwrap();
                tokio::task::yield_now().await;
                done(id)
            });
        }
        let mut ended = Vec::new();
        while let Some(next) = steps.next().await {
            let Ok((id, _, _)) = next else {
                panic!("a step failed");
            };
            ended.push(id);
        }
        ended.sort();
        assert_eq!(ended, ["a", "b", "c"]);
        assert!(steps.is_empty());
        drop(tx);
        let mut tasks = HashMap::new();
        while let Some((id, task)) = rx.recv().await {
            tasks.insert(id, task);
        }
        assert_eq!(
            tasks["a"], run_task,
            "the first step is polled by the run's task"
        );
        assert_ne!(tasks["b"], run_task, "a second step gets a task of its own");
        assert_ne!(tasks["c"], run_task);
        assert_ne!(tasks["b"], tasks["c"]);
    }

    #[tokio::test]
    async fn a_step_that_panics_is_reported_and_the_next_one_runs_inline() {
        let mut steps = Steps::default();
        steps.start(async { panic!("a host bug") });
        let Some(Err(err)) = steps.next().await else {
            panic!("the panic is not reported as one");
        };
        assert_eq!(err, "panicked: a host bug");
        assert!(steps.is_empty(), "the panicked step is gone");
        steps.start(async { done("next") });
        let Some(Ok((id, _, _))) = steps.next().await else {
            panic!("the next step did not end");
        };
        assert_eq!(id, "next");
        assert!(steps.next().await.is_none());
    }
}
