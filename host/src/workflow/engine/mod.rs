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

use super::WorkflowError;
use super::definition::{Definition, Spec, Step};
use super::events::Events;
use super::parking::{Answered, PARK_AFTER, Parked, ParkedOn, Parking, tape_of};
use crate::capability::{CallJournal, JournalEntry, Progress, Wait, truncate_utf8};
use crate::domain::{
    CallRow, Failure, RunStatus, STEP_LOG, StepRow, StepStatus, Transition, now_text,
};
use crate::runtime::{Node, RunError, RunOptions, RunReport, Runtime};
use crate::store::{Fence, Store, StoreError};
use crate::trace;

mod child;
mod compensate;
mod component;
mod journal;
mod sleep;
mod wait;

use child::{child_run, child_step};
pub(crate) use compensate::{compensating, to_compensate_stored};
use component::{Attempt, park_told, run_step};
use journal::{StepJournal, step_journal};
pub(crate) use journal::{StepProgress, answer_signal};
use sleep::sleep_step;
use wait::{take_signal, wait_step};

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
    /// Shared with the other runs of the same definition.
    pub def: Arc<Definition>,
    /// The node of each step id that may still run.
    pub nodes: HashMap<String, Node>,
    /// The run's input, as JSON text: a run keeps it for as long as it
    /// lives (days, for one that waits), and text is a fraction of a tree.
    pub input: String,
    pub store: Arc<dyn Store>,
    pub runtime: Arc<Runtime>,
    /// Step slots shared by every run of the host.
    pub slots: Arc<Semaphore>,
    /// `workflow.cancel`.
    pub cancel: CancellationToken,
    /// `workflow.pause`: while true, no step starts.
    pub pause: tokio::sync::watch::Receiver<bool>,
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
    /// Where the run's child runs start (`run-workflow`); gone once the
    /// host is.
    pub workflows: std::sync::Weak<super::Workflows>,
    /// A run that began compensating: how it will end ([`compensating`]).
    pub compensating: Option<(RunStatus, Failure)>,
    /// Whether the run may let go of its driver while only sleeps are in
    /// flight ([`Ending::Asleep`]): alone, where a waker drives it again.
    pub parks: bool,
}

impl RunCtx {
    /// The run's input.
    pub fn input_value(&self) -> Value {
        serde_json::from_str(&self.input).unwrap_or(Value::Null)
    }
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

    /// How many of this run's steps sleep now.
    fn sleeping(&self) -> usize {
        self.steps.load(Ordering::Acquire) as usize
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
    /// Paused with steps left to run: its running steps have finished, and
    /// it stays `paused` in the store until resumed.
    Paused,
    /// Only sleeps were in flight, long ones: the run let go of its driver
    /// until they wake ([`Transition::RunAsleep`]); the waker drives it
    /// again then.
    Asleep,
}

/// How long a run whose only steps in flight are asleep keeps its driver
/// before it lets go of it.
const PARK_CHECK: Duration = Duration::from_secs(1);
/// The shortest sleep left that a run lets go of its driver for.
const PARK_MIN: Duration = Duration::from_secs(5);

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
    /// A node step found running at start-up: its host stopped while it
    /// ran, or while its node waited. A durable node goes on from its
    /// journal of that attempt.
    interrupted: bool,
    /// When it finished (RFC 3339): compensations run latest first.
    finished_at: Option<String>,
}

impl StepState {
    /// A step that has not run.
    fn pending() -> StepState {
        StepState {
            status: StepStatus::Pending,
            output: None,
            attempts: 0,
            error: None,
            resumed: None,
            interrupted: false,
            finished_at: None,
        }
    }
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
    // The compensations a run began, in the order they run.
    let undo: Vec<String> = rows
        .iter()
        .filter(|r| super::definition::compensated_by(&r.step_id).is_some())
        .map(|r| r.step_id.clone())
        .collect();
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
                    interrupted: r.status == StepStatus::Running && resumed.is_none(),
                    status,
                    output: r.output,
                    attempts: r.attempts,
                    error: r.error,
                    resumed,
                    finished_at: r.finished_at,
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
    if let Some(end) = ctx.compensating.clone() {
        return compensate::run(&ctx, &mut states, end, &undo).await;
    }
    let deadline = ctx
        .def
        .timeout
        .map(|t| Instant::now() + t.saturating_sub(ctx.elapsed));
    let stop_token = CancellationToken::new();
    let mut stop: Option<Stop> = None;
    let mut running = Steps::default();
    let mut pause = ctx.pause.clone();

    loop {
        let paused = *pause.borrow_and_update();
        if stop.is_none() && !paused {
            launch_ready(&ctx, &mut states, &mut running, &stop_token).await?;
        }
        if running.is_empty() {
            break;
        }
        // Only sleeps and waits for signals in flight: the run may let go
        // of its driver.
        let parkable = ctx.parks
            && stop.is_none()
            && !paused
            && states
                .iter()
                .filter(|(_, s)| matches!(s.status, StepStatus::Running | StepStatus::Waiting))
                .all(|(id, _)| {
                    ctx.def
                        .step(id)
                        .is_some_and(|s| s.spec.sleeps() || s.spec.waits())
                });
        tokio::select! {
            // Resumed while steps ran: what is ready starts now.
            _ = pause.changed(), if paused => {}
            () = tokio::time::sleep(PARK_CHECK), if parkable => {
                if park(&ctx, running.len()).await? {
                    // Dropping the sleeps: their wake times are stored.
                    return Ok(Ending::Asleep);
                }
            }
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
    if stop.is_none() && *ctx.pause.borrow() && states.values().any(|s| !s.status.is_finished()) {
        tracing::info!(run = %ctx.run_id, "run paused: its running steps have finished");
        return Ok(Ending::Paused);
    }
    finish(&ctx, &mut states, stop).await
}

/// Lets go of the run's driver while its `in_flight` steps, all sleeps and
/// waits for signals, wait (each past writing what it waits for) for at
/// least [`PARK_MIN`]: stores the earliest wake time, a sleep's end or a
/// wait's timeout ([`Transition::RunAsleep`]; [`UNTIL_SIGNALLED_MS`] when
/// only signals can end them: a signal drives the run again). Whether it
/// did.
async fn park(ctx: &RunCtx, in_flight: usize) -> Result<bool, StoreError> {
    if ctx.asleep.sleeping() != in_flight {
        return Ok(false);
    }
    let rows = ctx.store.steps(&ctx.run_id).await?;
    let waiting: Vec<_> = rows
        .iter()
        .filter(|r| matches!(r.status, StepStatus::Running | StepStatus::Waiting))
        .collect();
    if waiting.len() != in_flight {
        return Ok(false);
    }
    let wake_ms = waiting
        .iter()
        .map(|r| {
            let input = r.input.as_ref();
            let at = input
                .and_then(|i| i.get("until").or_else(|| i.get("timeout_at")))
                .and_then(Value::as_str);
            match at {
                Some(at) => humantime::parse_rfc3339_weak(at)
                    .ok()
                    .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|at| at.as_millis() as i64),
                // A wait with no timeout: only its signal ends it.
                None if input.is_some_and(|i| i.get("signal").is_some()) => {
                    Some(UNTIL_SIGNALLED_MS)
                }
                None => None,
            }
        })
        .collect::<Option<Vec<i64>>>()
        .and_then(|times| times.into_iter().min());
    let Some(wake_ms) = wake_ms else {
        return Ok(false);
    };
    if wake_ms - crate::domain::now_ms() < PARK_MIN.as_millis() as i64 {
        return Ok(false);
    }
    apply(ctx, &[Transition::RunAsleep { wake_ms }]).await?;
    tracing::debug!(run = %ctx.run_id, wake_ms, "run asleep: its driver lets go until then");
    Ok(true)
}

/// The wake time of a run asleep on waits that only a signal ends (the end
/// of year 9999): the waker never reaches it; a signal drives the run.
pub(crate) const UNTIL_SIGNALLED_MS: i64 = 253_402_300_799_000;

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

    /// How many are in flight.
    fn len(&self) -> usize {
        usize::from(self.inline.is_some()) + self.spawned.len()
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
            context(&ctx.input_value(), states, None)
        } else {
            context(&ctx.input_value(), states, Some(&step.spec.needs))
        };
        let state = states.get_mut(id).expect("every step has a state");
        state.status = StepStatus::Running;
        let first_attempt = state.attempts + 1;
        let recorded = first_attempt == 1 && ctx.started.contains(id);
        let resumed = state.resumed.take();
        let continues = std::mem::take(&mut state.interrupted).then_some(state.attempts);
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
                continues,
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
///
/// A move the store could not take because it was unreachable (a database
/// restarting, a lost connection) is written again once it is back, while
/// this worker still holds the run: the step's outcome in it is kept, and
/// the step is not run again for want of a write. A full disk is left to
/// its own recovery (the run stops and is relaunched when there is room),
/// and a lease another worker took ends the run here.
async fn apply(ctx: &RunCtx, moves: &[Transition<'_>]) -> Result<String, StoreError> {
    until_written(&ctx.shutdown, &ctx.run_id, "the run's move", || {
        ctx.events
            .apply_redacting(&ctx.run_id, moves, Some(&ctx.fence), &ctx.def.spec.redact)
    })
    .await
}

/// Makes `write` of run `run_id`, and makes it again (every 100 ms to 2 s)
/// while the store is unreachable, until it is back or the process stops
/// (`shutdown`). A full disk and a lost lease are returned at once. A write
/// tried again that then fails otherwise (refused: the one lost with the
/// connection may have committed after all) returns the first error: what
/// the store holds decides, as after a crash.
pub(super) async fn until_written<T, F>(
    shutdown: &CancellationToken,
    run_id: &str,
    what: &str,
    mut write: impl FnMut() -> F,
) -> Result<T, StoreError>
where
    F: Future<Output = Result<T, StoreError>>,
{
    let mut pause = STORE_RETRY_FIRST;
    let mut away: Option<StoreError> = None;
    loop {
        match (write().await, away.take()) {
            (Err(e), _) if e.is_away() && !shutdown.is_cancelled() => {
                tracing::warn!(run = %run_id,
                    "the state is unreachable; writing {what} again in {pause:?}: {e}");
                tokio::select! {
                    _ = shutdown.cancelled() => return Err(e),
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(STORE_RETRY_MAX);
                away = Some(e);
            }
            (Err(_), Some(away)) => return Err(away),
            (result, _) => return result,
        }
    }
}

/// The first and the longest pause between two tries of a move the store
/// was unreachable for.
const STORE_RETRY_FIRST: Duration = Duration::from_millis(100);
const STORE_RETRY_MAX: Duration = Duration::from_secs(2);

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
    state.finished_at = Some(now_text());
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
    ctx: &Arc<RunCtx>,
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
    let (output, error) = (states[id].output.clone(), states[id].error.clone());
    let step = Transition::StepFinished {
        step_id: id,
        status,
        output: output.as_ref(),
        error: error.as_ref(),
        log: log.as_ref(),
    };
    conclude(ctx, states, end, Some(step)).await.map(Some)
}

/// Ends a run whose steps have all finished (after `step`'s end, in the
/// same write, when given); a run that fails or is cancelled first undoes
/// its succeeded steps that have a compensation.
async fn conclude(
    ctx: &Arc<RunCtx>,
    states: &mut HashMap<String, StepState>,
    end: (RunStatus, Option<Value>, Option<Failure>),
    step: Option<Transition<'_>>,
) -> Result<Ending, StoreError> {
    let undo = match end.0 {
        RunStatus::Failed | RunStatus::Cancelled => compensate::to_compensate(ctx, states),
        _ => Vec::new(),
    };
    if undo.is_empty() {
        return end_run(ctx, end, step).await;
    }
    let (status, _, error) = end;
    let error = error.unwrap_or_else(|| Failure::new("failed", "the run failed"));
    compensate::begin(ctx, states, (status, error), undo, step).await
}

/// Settles the steps that never ran and records how the run ended.
async fn finish(
    ctx: &Arc<RunCtx>,
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
    conclude(ctx, states, end, None).await
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
        let data = context(&ctx.input_value(), states, None);
        return jq("output-mapping", move || expr.eval(&data)).await;
    }
    let output_of = |id: &String| states[id].output.clone().unwrap_or(Value::Null);
    Ok(match ctx.def.leaves.as_slice() {
        [one] => output_of(one),
        many => Value::Object(many.iter().map(|id| (id.clone(), output_of(id))).collect()),
    })
}

/// How often a waiting step looks for its signal in the store, besides
/// when it hears of one: on a shared store, a note from another worker may
/// be missed; alone, every signal is heard, and the look is a safety net.
const SIGNAL_POLL_SHARED: Duration = Duration::from_secs(5);
const SIGNAL_POLL_ALONE: Duration = Duration::from_secs(60);

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
