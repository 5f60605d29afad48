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
        /// Holds `run_id` in `waking` while it is driven again.
        struct Waking<'a>(&'a Workflows, &'a str);
        impl Drop for Waking<'_> {
            fn drop(&mut self) {
                self.0
                    .waking
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(self.1);
            }
        }
        if !self
            .waking
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(run_id.to_owned())
        {
            return Ok(());
        }
        let _waking = Waking(self, run_id);
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

    /// Alone: drives `run_id` again now if it is asleep (nothing drives it
    /// here) while one of its waiting steps has a signal kept for it: the
    /// signal was sent to the run asleep, or as it fell asleep.
    pub(in crate::workflow) async fn wake_for_signal(self: &Arc<Self>, run_id: &str) {
        if self.mode != Mode::Alone || self.with_live(run_id, |_| ()).is_some() {
            return;
        }
        let looked = async {
            let kept: std::collections::BTreeSet<String> = self
                .store
                .signals(run_id)
                .await?
                .into_iter()
                .filter(|s| s.step_id.is_none())
                .map(|s| s.signal)
                .collect();
            if kept.is_empty() {
                return Ok(false);
            }
            let steps = self.store.steps(run_id).await?;
            Ok::<_, crate::store::StoreError>(steps.iter().any(|s| {
                s.status == crate::domain::StepStatus::Waiting
                    && s.input
                        .as_ref()
                        .and_then(|i| i["signal"].as_str())
                        .is_some_and(|name| kept.contains(name))
            }))
        };
        match looked.await {
            Ok(true) => {
                if let Err(e) = self.drive_again(run_id).await {
                    tracing::warn!(run = %run_id, "cannot drive the signalled run again: {e}");
                }
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(run = %run_id, "cannot look at the signalled run: {e}"),
        }
    }
}
