//! The claimer: takes runs nobody holds on a shared store, as many as this
//! worker has free step slots (see the [module doc](super)).

use std::sync::Arc;
use std::time::Duration;

use super::super::Workflows;

/// Starts the claimer (`serve`, `mcp`: processes that take work from others).
pub(crate) fn start_claimer(this: &Arc<Workflows>) {
    let weak = Arc::downgrade(this);
    let closing = this.closing.clone();
    this.tasks.spawn(async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            let Some(this) = weak.upgrade() else { return };
            let poll = this.worker.poll();
            let wait = match this.claim().await {
                Ok(()) => {
                    backoff = Duration::from_millis(100);
                    poll
                }
                Err(e) => {
                    tracing::warn!("cannot claim runs: {e}; trying again in {backoff:?}");
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    backoff
                }
            };
            // Not holding the host while waiting: it may be dropped.
            let wake = this.worker.wake.clone();
            drop(this);
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = closing.cancelled() => return,
            }
        }
    });
}

impl Workflows {
    /// Claims as many runs as there are free step slots, and drives them.
    async fn claim(self: &Arc<Self>) -> Result<(), crate::store::StoreError> {
        if self.tasks.is_closed() {
            return Ok(());
        }
        let free = self
            .options
            .max_concurrent_steps
            .saturating_sub(self.busy());
        if free == 0 {
            return Ok(());
        }
        let claimed = self
            .store
            .claim_runs(&self.worker.id, free as u32, self.worker.lease)
            .await?;
        for (run, fence) in claimed {
            tracing::info!(run = %run.run_id, workflow = %run.workflow, epoch = fence.epoch,
                "claimed run");
            if let Err(e) = self.launch_stored(run, true, fence).await {
                tracing::warn!("cannot drive a claimed run: {e}");
            }
        }
        Ok(())
    }
}
