//! The admitter: runs the admission pass of flow control (see the
//! [module doc](super)) whenever room may have been made for a queued run.

use std::sync::Arc;
use std::time::Duration;

use super::super::Workflows;
use crate::domain::now_ms;

/// Starts the admitter (every store, once the unfinished runs are resumed).
pub(crate) fn start_admitter(this: &Arc<Workflows>) {
    let weak = Arc::downgrade(this);
    let closing = this.closing.clone();
    this.tasks.spawn(async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            let Some(this) = weak.upgrade() else { return };
            // Shared, a poll covers notes missed (another worker's run
            // ended); alone every end is this process's own and wakes it.
            let poll = this.mode.admit_poll(&this.worker);
            let wait = match this.admit().await {
                Ok(pass) => {
                    backoff = Duration::from_millis(100);
                    // A rate window that frees a slot sends no note.
                    let window = pass.next_window_ms.map(|at| {
                        Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0) + 1)
                    });
                    match (window, poll) {
                        (Some(w), Some(p)) => Some(w.min(p)),
                        (w, p) => w.or(p),
                    }
                }
                Err(e) => {
                    tracing::warn!("cannot admit queued runs: {e}; trying again in {backoff:?}");
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    Some(backoff)
                }
            };
            // Not holding the host while waiting: it may be dropped.
            let queue = this.worker.queue.clone();
            drop(this);
            let timer = async {
                match wait {
                    Some(wait) => tokio::time::sleep(wait).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = queue.notified() => {}
                () = timer => {}
                _ = closing.cancelled() => return,
            }
        }
    });
}
