//! Alone or shared: the one place that knows how this process shares its
//! store with other workers, and what follows from it.
//!
//! - **Alone** (SQLite, `:memory:`): this process is the store's only worker.
//!   It drives every run it starts, resumes the unfinished ones at start, and
//!   ends a run nobody drives itself.
//! - **Shared** (PostgreSQL): this process is one worker of several. A run is
//!   driven by the worker that holds its lease; runs nobody holds are
//!   claimed ([`super::maintenance`]), and a run another worker holds is
//!   asked to cancel through the store.

use std::sync::Arc;
use std::time::Duration;

use super::{WorkflowError, Workflows};
use crate::domain::{Failure, RunRow, RunStatus, Transition, WorkerRow};
use crate::store::{CancelRequest, Fence, Store, StoreError};

/// How this process shares its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Alone,
    Shared,
}

impl Mode {
    pub(crate) fn of(store: &dyn Store) -> Mode {
        if store.shared() {
            Mode::Shared
        } else {
            Mode::Alone
        }
    }

    /// At open: shared, this worker is listed among the workers (before
    /// anything is served, so a `host.status` right after start-up sees it)
    /// and keeps its leases and hears the others' notes
    /// ([`super::maintenance`]); alone, there is nobody to tell.
    pub(crate) async fn join(self, wf: &Arc<Workflows>) -> Result<(), WorkflowError> {
        if self == Mode::Shared {
            wf.store.heartbeat(&wf.worker_row()).await?;
            super::maintenance::start_upkeep(wf);
        }
        Ok(())
    }

    /// The fence a run this worker starts is driven under: a shared store's
    /// first lease is epoch 1; alone there are no leases (epoch 0).
    pub(crate) fn first_fence(self, worker: &Arc<str>) -> Fence {
        Fence {
            worker: worker.clone(),
            epoch: match self {
                Mode::Alone => 0,
                Mode::Shared => 1,
            },
        }
    }

    /// Whether this worker drives a run it starts: alone always; shared
    /// while it has a free slot (otherwise any worker claims it).
    pub(crate) fn takes_new_run(self, running: usize, slots: usize) -> bool {
        match self {
            Mode::Alone => true,
            Mode::Shared => running < slots,
        }
    }

    /// Whether a run whose task stopped on `e` is paused for whoever drives
    /// it next (another worker holds it now, or the store is away), rather
    /// than failed.
    pub(crate) fn pauses_on(self, e: &StoreError) -> bool {
        matches!(e, StoreError::Full(_)) || (self == Mode::Shared && e.is_unavailable())
    }

    /// At start: alone, drives every run the state holds as `running` (the
    /// last process stopped or crashed while they ran) and says how many;
    /// shared, starts claiming runs (an unfinished run is resumed by
    /// whichever worker claims it once its lease has expired).
    pub(crate) async fn resume(self, wf: &Arc<Workflows>) -> Result<usize, WorkflowError> {
        match self {
            Mode::Shared => {
                super::maintenance::start_claimer(wf);
                Ok(0)
            }
            Mode::Alone => {
                // Not those asleep past the waker's first look: it drives them.
                let runs = wf
                    .store
                    .unfinished_runs(crate::domain::now_ms() + super::maintenance::WAKE_AHEAD_MS)
                    .await?;
                let count = runs.len();
                for run in runs {
                    tracing::info!(run = %run.run_id, workflow = %run.workflow, "resuming run");
                    let fence = Mode::Alone.first_fence(&wf.worker.id);
                    wf.launch_stored(run, true, fence).await?;
                }
                Ok(count)
            }
        }
    }

    /// A retried run, reopened in the store: alone, drive it; shared, it
    /// was reopened unclaimed, so whichever worker has a free slot takes it.
    /// A run reopened `queued` waits for the admitter either way.
    pub(crate) async fn reopened(
        self,
        wf: &Arc<Workflows>,
        run: RunRow,
    ) -> Result<(), WorkflowError> {
        if run.status == RunStatus::Queued {
            // Under flow control: the admitter lets it in (here or on any
            // worker) once its limits allow.
            wf.worker.queue.notify_one();
            return Ok(());
        }
        match self {
            Mode::Shared => {
                wf.worker.wake.notify_one();
                Ok(())
            }
            Mode::Alone => {
                let fence = Mode::Alone.first_fence(&wf.worker.id);
                wf.launch_stored(run, false, fence).await
            }
        }
    }

    /// `workflow.cancel` of a run this process does not drive. Alone, it is
    /// running in the state but driven by nobody (its task failed): it ends
    /// here. Shared, the store ends it when nobody holds it, or tells its
    /// worker. Returns whether to wait for another worker to stop it.
    pub(crate) async fn cancel_undriven(
        self,
        wf: &Arc<Workflows>,
        run_id: &str,
    ) -> Result<bool, WorkflowError> {
        let failure = Failure::new("cancelled", "the run was cancelled");
        // Its succeeded steps that have a compensation are undone first:
        // it runs again, unclaimed, to do that.
        let undo = match wf.store.run(run_id).await? {
            Some(run) if !run.status.is_finished() => {
                let rows = wf.store.steps(run_id).await?;
                super::engine::to_compensate_stored(&run, &rows)
            }
            _ => Vec::new(),
        };
        let ids = serde_json::json!(undo);
        let end = match undo.is_empty() {
            true => Transition::RunAbandoned {
                status: RunStatus::Cancelled,
                error: &failure,
            },
            false => Transition::RunCancelCompensating {
                error: &failure,
                steps: &ids,
            },
        };
        match (self, wf.events.request_cancel(run_id, end).await?) {
            (_, CancelRequest::Signalled) => Ok(true),
            (Mode::Alone, CancelRequest::Ended(_)) if !undo.is_empty() => {
                // Nobody else drives it: this process does.
                if let Some(run) = wf.store.run(run_id).await? {
                    Mode::Alone.reopened(wf, run).await?;
                }
                Ok(true)
            }
            _ => {
                // It may have held (or waited for) a slot of its flow control.
                wf.worker.queue.notify_one();
                Ok(!undo.is_empty())
            }
        }
    }

    /// How often the admitter looks at the queue without being woken:
    /// shared, as often as the claimer (another worker's note may be
    /// missed); alone, never (every run ends here and wakes it).
    pub(crate) fn admit_poll(self, worker: &super::maintenance::Worker) -> Option<Duration> {
        match self {
            Mode::Shared => Some(worker.poll()),
            Mode::Alone => None,
        }
    }

    /// A queued run the store just admitted. Alone, drive it. Shared, it is
    /// `running` and unclaimed, and the store told every worker: this one's
    /// claimer looks at once.
    pub(crate) async fn admitted(self, wf: &Arc<Workflows>, run: RunRow) {
        match self {
            Mode::Shared => wf.worker.wake.notify_one(),
            Mode::Alone => {
                let run_id = run.run_id.clone();
                let fence = Mode::Alone.first_fence(&wf.worker.id);
                // Not a resume: its deadline counts from now, its admission.
                if let Err(e) = wf.launch_stored(run, false, fence).await {
                    tracing::warn!(run = %run_id, "cannot drive an admitted run: {e}");
                }
            }
        }
    }

    /// The workers `host.status` lists: alone, this one; shared, every
    /// worker seen within three leases.
    pub(crate) async fn workers(self, wf: &Workflows) -> Result<Vec<WorkerRow>, WorkflowError> {
        Ok(match self {
            Mode::Alone => vec![wf.worker_row()],
            Mode::Shared => wf.store.workers(wf.worker.lease * 3).await?,
        })
    }

    /// A run this process stopped without finishing it. Alone, it stays
    /// `running` and resumes at the next start. Shared: at shutdown it is
    /// released so another worker takes it at once; otherwise this worker
    /// lost its lease, and the run is another's already.
    /// A run this worker drove was paused and its driver ended: shared, its
    /// lease goes (whoever drives it after `workflow.resume` claims it);
    /// alone, nothing holds it.
    pub(crate) async fn let_go(self, wf: &Workflows, run_id: &str) {
        if self == Mode::Shared
            && let Err(e) = wf
                .store
                .release_runs(&wf.worker.id, std::slice::from_ref(&run_id.to_owned()))
                .await
        {
            tracing::warn!(run = %run_id, "cannot release the paused run ({e}); another worker takes it when its lease expires");
        }
    }

    pub(crate) async fn interrupted(self, wf: &Workflows, run_id: &str, span: &tracing::Span) {
        match self {
            Mode::Alone => {
                crate::trace::record_status(span, "interrupted", false, None);
                tracing::info!(run = %run_id, "run interrupted by shutdown; it resumes at the next start");
            }
            Mode::Shared if wf.shutdown.is_cancelled() => {
                match wf
                    .store
                    .release_runs(&wf.worker.id, std::slice::from_ref(&run_id.to_owned()))
                    .await
                {
                    Ok(()) => {
                        tracing::info!(run = %run_id, "run interrupted by shutdown; released for another worker")
                    }
                    Err(e) => {
                        tracing::warn!(run = %run_id, "run interrupted by shutdown; cannot release it ({e}), another worker takes it when its lease expires")
                    }
                }
            }
            Mode::Shared => {
                tracing::warn!(run = %run_id, "run stopped here: this worker lost its lease");
            }
        }
    }
}
