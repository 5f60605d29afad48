//! The pruner: deletes finished runs (with their steps, calls and events)
//! past the newest `keep_runs` and older than `keep_for`. It runs every
//! [`PRUNE_EVERY`] and after every batch of finished runs (at most
//! [`PRUNE_BATCH`]), so that one prune is a short write: every other write
//! of the store waits behind it.

use std::sync::Arc;
use std::time::Duration;

use super::super::Workflows;
use crate::domain::now_ms;

/// How often finished runs are pruned in the background.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// Most runs that finish between two prunes. Deleting a finished run with
/// its steps and events took the SQLite writer about 60 µs here; one prune
/// of 1,250 runs (an eighth of the default `keep_runs`) held every other
/// write for 75 ms, the p99 of a JSON-RPC load.
const PRUNE_BATCH: u64 = 64;

/// Starts the background pruner; it ends when the host shuts down.
pub(crate) fn start_pruner(this: &Arc<Workflows>) {
    let weak = Arc::downgrade(this);
    let stop = this.closing.clone();
    this.tasks.spawn(async move {
        loop {
            if let Some(this) = weak.upgrade() {
                this.prune().await;
            }
            tokio::select! {
                _ = tokio::time::sleep(PRUNE_EVERY) => {}
                _ = stop.cancelled() => return,
            }
        }
    });
}

impl Workflows {
    /// Prunes when enough runs have finished since the last time: an eighth
    /// of `keep_runs`, and at most [`PRUNE_BATCH`], so that a prune is a
    /// short write (every write of the store waits behind it).
    pub(crate) async fn after_finish(&self) {
        use std::sync::atomic::Ordering;
        let n = self.finished_since_prune.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= (self.options.keep_runs / 8).clamp(1, PRUNE_BATCH) {
            self.prune().await;
        }
    }

    pub(crate) async fn prune(&self) {
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
}
