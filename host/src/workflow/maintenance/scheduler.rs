//! The scheduler: fires the ticks of every schedule of the config
//! ([`crate::workflow::schedule`]). Every store, every worker.
//!
//! It sleeps until the next tick of any schedule (at most
//! [`IDLE`], and wakes at once on a reload), then, for each schedule, reads
//! its progress from the store and fires the tick that is due, if any.
//!
//! A tick fires exactly once, whichever workers are alive: its run is
//! started with the idempotency key `schedule:<name>:<tick>`, so of two
//! workers that fire one tick at once, the store keeps one run and the
//! second finds it; the tick is then recorded as fired (a conditional
//! update, which only moves forward). A host that stopped between the two
//! finds the run by its key at the next try. After downtime, the latest
//! missed tick fires once (`catch_up = "one"`, its run's trigger counting
//! the ticks `missed` before it) or is recorded as skipped (`"none"`: ticks
//! from before this worker started fire no run).

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::super::schedule::{CatchUp, Due, Overlap, Schedule};
use super::super::{WorkflowError, Workflows};
use crate::domain::now_ms;
use crate::store::StoreError;

/// Longest sleep between two looks at the schedules.
const IDLE: Duration = Duration::from_secs(30);
/// How soon a failed fire is tried again.
const RECHECK: Duration = Duration::from_secs(1);
/// How often a queued tick looks whether the run it waits for ended (it
/// fires that soon after).
const QUEUE_POLL: Duration = Duration::from_millis(200);

pub(crate) fn start_scheduler(this: &Arc<Workflows>) {
    let weak = Arc::downgrade(this);
    let closing = this.closing.clone();
    let wake = this.schedules_changed.clone();
    this.tasks.spawn(scheduler(weak, closing, wake));
}

async fn scheduler(
    weak: Weak<Workflows>,
    closing: CancellationToken,
    wake: Arc<tokio::sync::Notify>,
) {
    // Ticks at or before this are from before this worker was up.
    let watching_since = now_ms();
    loop {
        let next = match weak.upgrade() {
            Some(this) => this.fire_due(watching_since).await,
            None => return,
        };
        let sleep = Duration::from_millis(u64::try_from(next - now_ms()).unwrap_or(0)).min(IDLE);
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = wake.notified() => {}
            _ = closing.cancelled() => return,
        }
    }
}

/// What firing a due tick did.
enum Fired {
    /// Recorded: a run started (or was found), or the tick was skipped.
    Done,
    /// Not yet: it waits for the last run to end (`queue`).
    Queued,
    /// Not yet: the host is shutting down.
    Later,
}

impl Workflows {
    /// Fires every due tick; returns when (ms since the epoch) to look again.
    async fn fire_due(self: &Arc<Self>, watching_since: i64) -> i64 {
        let now = now_ms();
        let mut next = now + IDLE.as_millis() as i64;
        let recheck = now + RECHECK.as_millis() as i64;
        for schedule in self.loaded().schedules.iter() {
            match self.fire_schedule(schedule, now, watching_since).await {
                Ok(Fired::Done) => {}
                Ok(Fired::Queued) => next = next.min(now + QUEUE_POLL.as_millis() as i64),
                Ok(Fired::Later) => next = next.min(recheck),
                Err(e) => {
                    tracing::warn!(workflow = %schedule.workflow, schedule = %schedule.name,
                        "cannot fire the schedule's tick: {e}");
                    next = next.min(recheck);
                }
            }
            if let Some(at) = schedule.next_after(now) {
                next = next.min(at);
            }
        }
        next
    }

    async fn fire_schedule(
        self: &Arc<Self>,
        schedule: &Schedule,
        now: i64,
        watching_since: i64,
    ) -> Result<Fired, WorkflowError> {
        let (workflow, name) = (&schedule.workflow, &schedule.name);
        let row = self.store.schedule(workflow, name, now).await?;
        let Some(due) = schedule.due(row.last_tick_ms, now) else {
            return Ok(Fired::Done);
        };
        let skip = async |why: &str| -> Result<Fired, StoreError> {
            tracing::info!(workflow = %workflow, schedule = %name, tick = %super::super::schedule::rfc3339(due.tick_ms),
                "schedule tick skipped: {why}");
            if self
                .store
                .schedule_fired(workflow, name, due.tick_ms, None)
                .await?
            {
                crate::metrics::metrics().schedule_skipped(workflow, name);
            }
            Ok(Fired::Done)
        };
        if self.workflow_paused(workflow) {
            return Ok(skip("the workflow is paused").await?);
        }
        if schedule.catch_up == CatchUp::None
            && due.tick_ms <= watching_since
            && !self.watched_by_another(due.tick_ms).await?
        {
            return Ok(skip("missed while no worker was up (`catch_up = \"none\"`)").await?);
        }
        if schedule.overlap != Overlap::Allow
            && let Some(last) = &row.last_run_id
            && self
                .store
                .run(last)
                .await?
                .is_some_and(|run| !run.status.is_finished())
        {
            return Ok(match schedule.overlap {
                Overlap::Queue => Fired::Queued,
                _ => skip(&format!("run `{last}` of the last tick still runs")).await?,
            });
        }
        self.fire(schedule, due).await
    }

    /// Whether another live worker of a shared store was up at `tick_ms`:
    /// then a tick from before this worker started was not missed (that
    /// worker is firing it, or waits to), and `catch_up = "none"` keeps it.
    async fn watched_by_another(&self, tick_ms: i64) -> Result<bool, WorkflowError> {
        if !self.store.shared() {
            return Ok(false);
        }
        let workers = self.store.workers(self.worker.lease * 3).await?;
        Ok(workers.iter().any(|w| {
            *w.id != *self.worker.id
                && humantime::parse_rfc3339_weak(&w.started_at)
                    .ok()
                    .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
                    .is_some_and(|at| (at.as_millis() as i64) < tick_ms)
        }))
    }

    async fn fire(self: &Arc<Self>, schedule: &Schedule, due: Due) -> Result<Fired, WorkflowError> {
        let (workflow, name) = (&schedule.workflow, &schedule.name);
        let data = schedule.tick_data(due.tick_ms);
        let input = match &schedule.input {
            // Over two fields this config wrote: no need for the engine's
            // guarded evaluation.
            Some(expr) => match expr.eval(&data) {
                Ok(input) => input,
                Err(e) => {
                    tracing::error!(workflow = %workflow, schedule = %name,
                        "the schedule's `input` failed, so the tick starts no run: {e}");
                    self.store
                        .schedule_fired(workflow, name, due.tick_ms, None)
                        .await?;
                    crate::metrics::metrics().schedule_skipped(workflow, name);
                    return Ok(Fired::Done);
                }
            },
            None => data.clone(),
        };
        let trigger = json!({
            "kind": "schedule",
            "name": name,
            "scheduled_at": data["scheduled_at"],
            "missed": due.missed,
        });
        let key = format!("schedule:{name}:{}", due.tick_ms);
        let started = match self
            .start_triggered(
                workflow,
                input,
                Some(key),
                trigger,
                &crate::trace::TraceParent::none(),
            )
            .await
        {
            Ok(started) => started,
            Err(WorkflowError::InvalidInput { message, .. }) => {
                tracing::error!(workflow = %workflow, schedule = %name,
                    "the tick's input is refused, so it starts no run: {message}");
                self.store
                    .schedule_fired(workflow, name, due.tick_ms, None)
                    .await?;
                crate::metrics::metrics().schedule_skipped(workflow, name);
                return Ok(Fired::Done);
            }
            Err(WorkflowError::ShuttingDown) => return Ok(Fired::Later),
            Err(e) => return Err(e),
        };
        if started.new {
            tracing::info!(workflow = %workflow, schedule = %name, run = %started.run.run_id,
                scheduled_at = %data["scheduled_at"], missed = due.missed, "schedule fired");
            crate::metrics::metrics().schedule_fired(workflow, name);
        }
        self.store
            .schedule_fired(workflow, name, due.tick_ms, Some(&started.run.run_id))
            .await?;
        Ok(Fired::Done)
    }
}
