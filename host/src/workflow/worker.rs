//! This process as one worker of a shared store (PostgreSQL).
//!
//! Every `wf-host serve` on one database is a worker. A run is driven by the
//! worker that holds its lease; the others leave it alone. Three loops, each
//! with its interval and why:
//!
//! - the **claimer** takes runs nobody holds (new, retried, released, or
//!   whose worker stopped renewing), as many as this worker has free step
//!   slots. It wakes on [`Note::Ready`] and when a local run ends, and polls
//!   every [`Worker::poll`] because an expired lease sends no note.
//! - the **renewer** extends this worker's leases every `lease / 3`, so a
//!   worker that is alive keeps its runs through two missed renewals. A run
//!   whose lease was lost (this worker was paused or cut off past the lease)
//!   is stopped without writing: another worker has it. It also refreshes the
//!   worker's heartbeat in `workers`.
//! - the **listener** turns notes into local actions: a cancel asked on any
//!   worker stops the run here; a ready run wakes the claimer.
//!
//! All three end when the host shuts down (the renewer only once no run is
//! left, so leases hold through the grace period).

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::broadcast::error::RecvError;

use super::Workflows;
use crate::store::{Note, WorkerRow, now_text};

/// Default lease of a claimed run.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Who this process is among the workers, and what wakes its claimer.
pub(crate) struct Worker {
    pub id: Arc<str>,
    pub started_at: String,
    pub lease: Duration,
    /// A run can be claimed, or a local run ended (a slot is free).
    pub wake: Arc<Notify>,
}

impl Worker {
    pub(crate) fn new(lease: Duration) -> Worker {
        Worker {
            id: worker_id().into(),
            started_at: now_text(),
            lease,
            wake: Arc::default(),
        }
    }

    /// How often the claimer looks for runs whose lease expired.
    pub(crate) fn poll(&self) -> Duration {
        (self.lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }

    fn renew_every(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(50))
    }
}

/// `<host>-<pid>-<random>`: unique across machines, restarts and pid reuse.
fn worker_id() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // within it or truncates.
    let host = if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "host".to_owned()
    };
    format!(
        "{host}-{}-{:06x}",
        std::process::id(),
        rand::random::<u32>() & 0xff_ffff
    )
}

/// Starts the renewer and the listener (every process that drives runs on a
/// shared store needs them).
pub(crate) fn start_upkeep(this: &Arc<Workflows>) {
    let weak = Arc::downgrade(this);
    let closing = this.closing.clone();
    this.tasks.spawn(renewer(weak.clone(), closing.clone()));
    if let Some(notes) = this.store.listen() {
        this.tasks.spawn(listener(weak, notes, closing));
    }
}

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

async fn renewer(weak: Weak<Workflows>, closing: tokio_util::sync::CancellationToken) {
    let Some(every) = weak.upgrade().map(|t| t.worker.renew_every()) else {
        return;
    };
    let mut last_ok = tokio::time::Instant::now();
    loop {
        let Some(this) = weak.upgrade() else { return };
        let held = this.held_runs();
        if closing.is_cancelled() && held.is_empty() {
            return;
        }
        let me = this.worker_row();
        let renewed = async {
            this.store.heartbeat(&me).await?;
            this.store
                .renew(&this.worker.id, &held, this.worker.lease)
                .await
        }
        .await;
        match renewed {
            Ok(renewed) => {
                last_ok = tokio::time::Instant::now();
                for run_id in &renewed.lost {
                    tracing::warn!(run = %run_id, worker = %this.worker.id,
                        "lost the run's lease (this worker was paused or cut off past it); stopping it here without recording anything");
                    this.stop_local(run_id);
                }
                for run_id in &renewed.cancel {
                    this.cancel_local(run_id);
                }
            }
            Err(e) if last_ok.elapsed() >= this.worker.lease => {
                // Past the lease another worker may have the runs: stop them
                // (their writes would be refused anyway).
                tracing::error!(
                    "cannot renew leases for {:?}: {e}; stopping this worker's runs",
                    this.worker.lease
                );
                for run_id in &held {
                    this.stop_local(run_id);
                }
            }
            Err(e) => tracing::warn!("cannot renew leases: {e}"),
        }
        drop(this);
        if closing.is_cancelled() {
            // Shutting down: renew while runs finish, and end soon after the
            // last one.
            let until = tokio::time::Instant::now() + every;
            while tokio::time::Instant::now() < until {
                if weak.upgrade().is_none_or(|t| t.held_runs().is_empty()) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        } else {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = closing.cancelled() => {}
            }
        }
    }
}

async fn listener(
    this: Weak<Workflows>,
    mut notes: tokio::sync::broadcast::Receiver<Note>,
    closing: tokio_util::sync::CancellationToken,
) {
    loop {
        let note = tokio::select! {
            note = notes.recv() => note,
            _ = closing.cancelled() => return,
        };
        let Some(this) = this.upgrade() else { return };
        match note {
            Ok(Note::Cancel(run_id)) => {
                this.cancel_local(&run_id);
            }
            Ok(Note::Ready | Note::Reconnected) | Err(RecvError::Lagged(_)) => {
                this.worker.wake.notify_one();
            }
            Ok(Note::Finished(_) | Note::Event) => {}
            Err(RecvError::Closed) => return,
        }
    }
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
            .saturating_sub(self.running());
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

    /// This worker as `workers` lists it.
    pub(crate) fn worker_row(&self) -> WorkerRow {
        WorkerRow {
            id: self.worker.id.to_string(),
            started_at: self.worker.started_at.clone(),
            last_heartbeat: now_text(),
            running_steps: (self.options.max_concurrent_steps.max(1)
                - self.slots.available_permits()) as u64,
        }
    }
}
