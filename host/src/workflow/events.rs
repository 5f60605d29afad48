//! Run events: every step and run transition, kept in the store's event log
//! (so a stream can resume from any point) and broadcast to live streams.
//!
//! The engine never waits for an event to be written: [`Events::emit`]
//! queues it for one writer task, which appends what has queued up in one
//! write, in order, and only then tells the live streams (so every event a
//! stream sees has its id). Shutdown flushes the queue. A crash can lose the
//! events of its last moments; the run's state is written by the engine
//! itself and loses nothing.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::store::{EventRow, NewEvent, Store, now_text};

/// Live events buffered per subscriber; one that falls further behind
/// catches up from the store.
const LIVE_BUFFER: usize = 1024;
/// Most events appended in one write.
const BATCH: usize = 256;

enum Queued {
    Event(NewEvent),
    /// Answered once everything queued before it is written.
    Flush(oneshot::Sender<()>),
}

/// Where a run's events go.
#[derive(Clone)]
pub(crate) struct Events {
    queue: mpsc::UnboundedSender<Queued>,
    live: broadcast::Sender<EventRow>,
}

impl Events {
    /// Starts the writer; it ends when the last `Events` clone is dropped.
    pub(crate) fn new(store: Arc<dyn Store>) -> Events {
        let (queue, rx) = mpsc::unbounded_channel();
        let live = broadcast::channel(LIVE_BUFFER).0;
        tokio::spawn(write(store, rx, live.clone()));
        Events { queue, live }
    }

    /// Queues the event for the log and the live streams.
    pub(crate) fn emit(&self, run_id: &str, kind: &str, data: Value) {
        let _ = self.queue.send(Queued::Event(NewEvent {
            run_id: run_id.to_owned(),
            kind: kind.to_owned(),
            data,
            at: now_text(),
        }));
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

    /// Waits until every event emitted so far is written.
    pub(crate) async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.queue.send(Queued::Flush(done)).is_ok() {
            let _ = written.await;
        }
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<EventRow> {
        self.live.subscribe()
    }
}

/// The writer: appends what has queued up in one write, then broadcasts it.
/// An event that cannot be kept is logged: it is a view of the run, not its
/// state.
async fn write(
    store: Arc<dyn Store>,
    mut queue: mpsc::UnboundedReceiver<Queued>,
    live: broadcast::Sender<EventRow>,
) {
    let mut batch = Vec::new();
    let mut flushes = Vec::new();
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        while let Some(item) = next.take() {
            match item {
                Queued::Event(e) => batch.push(e),
                Queued::Flush(done) => flushes.push(done),
            }
            if batch.len() < BATCH {
                next = queue.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            match store.append_events(&batch).await {
                Ok(rows) => {
                    for row in rows {
                        let _ = live.send(row);
                    }
                }
                Err(e) => tracing::warn!(events = batch.len(), "cannot record run events: {e}"),
            }
            batch.clear();
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}
