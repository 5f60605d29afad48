//! The maintenance loops of the workflow engine, one file each with its
//! interval and why (as River's maintenance services):
//!
//! - [`pruner`]: deletes finished runs past `keep_runs` and `keep_for`, every
//!   minute and after every batch of finished runs. Every store.
//! - [`scheduler`]: fires the ticks of the config's schedules, each once
//!   whichever workers are alive. Every store.
//! - [`admitter`]: admits queued runs of workflows with flow control
//!   (`concurrency`, `rate`) as their limits allow. It wakes when a run of
//!   such a workflow ends or is queued (here, or on another worker: a
//!   [`Note::Finished`](crate::store::Note::Finished)), when a rate window
//!   frees a slot, and on a shared store every [`Worker::poll`] too, in case
//!   a note was missed. Every store.
//!
//! - [`waker`]: drives again, when they wake, the runs that let go of their
//!   drivers to sleep. Alone only.
//!
//! And on a shared store (PostgreSQL), where every `wf-host serve` on one
//! database is a worker and a run is driven by the worker that holds its
//! lease:
//!
//! - [`claimer`] takes runs nobody holds (new, retried, released, or whose
//!   worker stopped renewing), as many as this worker has free step slots.
//!   It wakes on [`Note::Ready`](crate::store::Note::Ready) and when a local
//!   run ends, and polls every [`Worker::poll`] because an expired lease
//!   sends no note.
//! - [`renewer`] extends this worker's leases every `lease / 3`, so a worker
//!   that is alive keeps its runs through two missed renewals. A run whose
//!   lease was lost (this worker was paused or cut off past the lease) is
//!   stopped without writing: another worker has it. It also refreshes the
//!   worker's heartbeat in `workers`.
//! - [`listener`] turns notes into local actions: a cancel asked on any
//!   worker stops the run here; a ready run wakes the claimer.
//!
//! All end when the host shuts down (the renewer only once no run is left,
//! so leases hold through the grace period). Each holds the engine weakly,
//! so it never keeps a dropped engine alive.

mod admitter;
mod claimer;
mod listener;
mod pruner;
mod renewer;
mod scheduler;
mod waker;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::Workflows;
use crate::domain::{WorkerRow, now_text};

pub(crate) use admitter::start_admitter;
pub(crate) use claimer::start_claimer;
pub(crate) use pruner::start_pruner;
pub(crate) use scheduler::start_scheduler;
pub(crate) use waker::{WAKE_AHEAD_MS, start_waker};

/// Default lease of a claimed run.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Who this process is among the workers, and what wakes its claimer.
pub(crate) struct Worker {
    pub id: Arc<str>,
    pub started_at: String,
    pub lease: Duration,
    /// A run can be claimed, or a local run ended (a slot is free).
    pub wake: Arc<Notify>,
    /// A queued run may be admitted: a run of a workflow with flow control
    /// ended or was queued ([`admitter`]).
    pub queue: Arc<Notify>,
}

impl Worker {
    pub(crate) fn new(lease: Duration) -> Worker {
        Worker {
            id: worker_id().into(),
            started_at: now_text(),
            lease,
            wake: Arc::default(),
            queue: Arc::default(),
        }
    }

    /// How often the claimer looks for runs whose lease expired.
    pub(crate) fn poll(&self) -> Duration {
        (self.lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }

    pub(super) fn renew_every(&self) -> Duration {
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
    this.tasks
        .spawn(renewer::renewer(weak.clone(), closing.clone()));
    if let Some(notes) = this.store.listen() {
        this.tasks.spawn(listener::listener(weak, notes, closing));
    }
}

impl Workflows {
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
