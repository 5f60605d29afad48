//! Run events: every step and run transition, kept in the store's event log
//! (so a stream can resume from any point) and broadcast to live streams.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

use crate::store::{EventRow, Store, now_text};

/// Live events buffered per subscriber; one that falls further behind
/// catches up from the store.
const LIVE_BUFFER: usize = 1024;

/// Where a run's events go.
#[derive(Clone)]
pub(crate) struct Events {
    store: Arc<dyn Store>,
    live: broadcast::Sender<EventRow>,
    /// Held from append to broadcast.
    order: Arc<tokio::sync::Mutex<()>>,
}

impl Events {
    pub(crate) fn new(store: Arc<dyn Store>) -> Events {
        Events {
            store,
            live: broadcast::channel(LIVE_BUFFER).0,
            order: Arc::default(),
        }
    }

    /// Keeps the event, then tells the live streams. An event that cannot be
    /// kept is logged: it is a view of the run, not its state.
    pub(crate) async fn emit(&self, run_id: &str, kind: &str, data: Value) {
        // One event at a time from append to broadcast, so live streams see
        // ids in increasing order (parallel steps emit concurrently) and a
        // stream that skips ids it has seen never skips one it has not.
        let _in_order = self.order.lock().await;
        match self.store.append_event(run_id, kind, &data).await {
            Ok(row) => {
                let _ = self.live.send(row);
            }
            Err(e) => tracing::warn!(run = run_id, kind, "cannot record the event: {e}"),
        }
    }

    /// Tells the live streams only (progress: frequent, and stale at once).
    pub(crate) fn ephemeral(&self, run_id: &str, kind: &str, data: Value) {
        let _ = self.live.send(EventRow {
            id: 0,
            run_id: run_id.to_owned(),
            kind: kind.to_owned(),
            data,
            at: now_text(),
        });
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<EventRow> {
        self.live.subscribe()
    }
}
