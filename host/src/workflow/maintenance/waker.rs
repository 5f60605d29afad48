//! The waker: drives again the runs that let go of their drivers to sleep
//! ([`Transition::RunAsleep`](crate::domain::Transition::RunAsleep)) when
//! they wake. It reads the runs due within the next [`WAKE_AHEAD_MS`] from
//! the store's index, a page at a time, in wake order: memory holds those,
//! never every sleeping run. Alone only (a shared store's sleeping runs
//! keep their drivers, see `engine::drive`).

use std::sync::Arc;
use std::time::Duration;

use super::super::Workflows;
use super::super::mode::Mode;
use crate::domain::{RunStatus, now_ms};

/// How far ahead the waker reads: a run asleep past this at start is left
/// to it, not resumed at once.
pub(crate) const WAKE_AHEAD_MS: i64 = 2000;
/// Runs read at a time.
const PAGE: u32 = 1000;

/// Starts the waker (alone, once the unfinished runs are resumed).
pub(crate) fn start_waker(this: &Arc<Workflows>) {
    if this.mode != Mode::Alone {
        return;
    }
    let weak = Arc::downgrade(this);
    let closing = this.closing.clone();
    this.tasks.spawn(async move {
        // Every run asleep until before this (wake time, run id) has been
        // driven again. A run falls asleep only well past the horizon of
        // any read so far, so it is never behind the cursor.
        let mut cursor: (i64, String) = (i64::MIN, String::new());
        loop {
            let Some(this) = weak.upgrade() else { return };
            let horizon = now_ms() + WAKE_AHEAD_MS;
            let due = match this
                .store
                .asleep_runs((cursor.0, &cursor.1), horizon, PAGE)
                .await
            {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!("cannot read the sleeping runs: {e}");
                    Vec::new()
                }
            };
            let full = due.len() == PAGE as usize;
            for (run_id, wake_ms) in due {
                let left = u64::try_from(wake_ms - now_ms()).unwrap_or(0);
                if left > 0 {
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(left)) => {}
                        () = closing.cancelled() => return,
                    }
                }
                if let Err(e) = this.drive_again(&run_id).await {
                    tracing::warn!(run = %run_id, "cannot read a waking run: {e}");
                }
                cursor = (wake_ms, run_id);
            }
            if full {
                continue;
            }
            drop(this);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(WAKE_AHEAD_MS as u64 / 2)) => {}
                () = closing.cancelled() => return,
            }
        }
    });
}

impl Workflows {
    /// Alone: drives `run_id` again (a run that woke, or that waited for
    /// room on a full disk) if it is still `running` with no driver here.
    ///
    /// # Errors
    /// The run could not be read.
    pub(in crate::workflow) async fn drive_again(
        self: &Arc<Self>,
        run_id: &str,
    ) -> Result<(), crate::store::StoreError> {
        let Some(run) = self
            .store
            .run(run_id)
            .await?
            .filter(|run| run.status == RunStatus::Running)
        else {
            return Ok(());
        };
        if self.with_live(run_id, |_| ()).is_some() {
            return Ok(());
        }
        tracing::debug!(run = %run_id, "driving the run again");
        let fence = Mode::Alone.first_fence(&self.worker.id);
        if let Err(e) = self.launch_stored(run, true, fence).await {
            tracing::warn!(run = %run_id, "cannot drive the run again: {e}");
        }
        Ok(())
    }
}
