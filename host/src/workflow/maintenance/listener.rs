//! The listener: turns a shared store's notes into local actions (see the
//! [module doc](super)).

use std::sync::Weak;

use tokio::sync::broadcast::error::RecvError;

use super::super::Workflows;
use crate::store::Note;

pub(super) async fn listener(
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
            Ok(Note::Signal(run_id)) => this.signal_local(&run_id),
            Ok(Note::Ready | Note::Reconnected) | Err(RecvError::Lagged(_)) => {
                this.worker.wake.notify_one();
                this.worker.queue.notify_one();
            }
            // A run ended on some worker: its slot may admit a queued run.
            Ok(Note::Finished(_)) => this.worker.queue.notify_one(),
            Ok(Note::Event) => {}
            Err(RecvError::Closed) => return,
        }
    }
}
