//! The renewer: keeps this worker's leases (and its heartbeat) fresh, and
//! stops the runs whose lease it lost (see the [module doc](super)).

use std::sync::Weak;
use std::time::Duration;

use super::super::Workflows;

pub(super) async fn renewer(weak: Weak<Workflows>, closing: tokio_util::sync::CancellationToken) {
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
                // Paused on another worker: no new step starts here.
                for run_id in &renewed.paused {
                    this.pause_local(run_id);
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
