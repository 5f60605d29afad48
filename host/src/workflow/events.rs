//! Run events: every step and run transition, kept in the store's event log
//! (so a stream can resume from any point) and broadcast to live streams.
//!
//! On a shared store the live streams of every worker show every worker's
//! events: they are broadcast from the store's log ([`Events::tail`]), in id
//! order, rather than as they are emitted here. So are a SQLite store's
//! ([`Store::feeds_from_log`]): appends that wait on I/O then run side by side.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use serde_json::Value;
use tokio::sync::broadcast;

use crate::domain::{Carried, EventRow, Failure, RUN_STARTED, Transition, now_text};
use crate::store::{
    CancelRequest, Created, Fence, FirstTransitions, Lease, NewRun, Store, StoreError,
};

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
    /// Broadcast by [`Events::tail`] from the store, not by `emit`.
    from_log: bool,
    /// Other workers append to the store too.
    shared: bool,
    /// Wakes the tail when this process appended an event.
    appended: Arc<tokio::sync::Notify>,
    /// The newest id this process appended.
    newest: Arc<AtomicI64>,
}

impl Events {
    pub(crate) fn new(store: Arc<dyn Store>) -> Events {
        Events {
            live: broadcast::channel(LIVE_BUFFER).0,
            order: Arc::default(),
            from_log: store.feeds_from_log(),
            shared: store.shared(),
            appended: Arc::default(),
            newest: Arc::default(),
            store,
        }
    }

    /// Keeps the event, then tells the live streams. An event that cannot be
    /// kept is logged: it is a view of the run, not its state.
    pub(crate) async fn emit(&self, run_id: &str, kind: &str, data: Value) {
        let data = crate::secrets::redact_json(&data).unwrap_or(data);
        let append = async {
            Ok((
                (),
                vec![self.store.append_event(run_id, kind, &data).await?],
            ))
        };
        if let Err(e) = self.publish(append).await {
            tracing::warn!(run = run_id, kind, "cannot record the event: {e}");
        }
    }

    /// Stores a new run, its `run.started` event (`data`) and the
    /// transitions of `then` together ([`Store::create_run_with_event`]),
    /// then tells the live streams. Returns what was created, and whether
    /// `then` was stored.
    pub(crate) async fn create_run(
        &self,
        new: &NewRun,
        lease: Option<&Lease>,
        data: Value,
        then: Option<FirstTransitions<'_>>,
        redact: &[String],
    ) -> Result<(Created, bool), StoreError> {
        // The event shows the run's input; the run keeps it as given (a
        // resumed run needs it).
        let data = crate::secrets::redact_value(data, redact);
        let scrubs = then.and_then(|(_, moves)| scrub(moves, redact));
        let scrubbed: Vec<Transition<'_>>;
        let then = match (&scrubs, then) {
            (Some(scrubs), Some((fence, moves))) => {
                scrubbed = with_scrubs(moves, scrubs);
                Some((fence, &scrubbed[..]))
            }
            _ => then,
        };
        self.publish(async {
            let written = self
                .store
                .create_run_with_event(new, lease, Some((RUN_STARTED, &data)), then)
                .await?;
            Ok(((written.created, written.then_stored), written.events))
        })
        .await
    }

    /// The one way a stored run moves: `moves` of one run, in order, with
    /// their events, committed together ([`Store::transitions`]), then told
    /// to the live streams. Unlike [`Events::emit`], a failure is the
    /// write's and is returned.
    ///
    /// Returns the time (`at`) of the last move's event.
    pub(crate) async fn apply(
        &self,
        run_id: &str,
        moves: &[Transition<'_>],
        fence: Option<&Fence>,
    ) -> Result<String, StoreError> {
        self.apply_redacting(run_id, moves, fence, &[]).await
    }

    /// [`Events::apply`] for a workflow whose `redact` names `fields`: their
    /// values in step inputs are not written.
    pub(crate) async fn apply_redacting(
        &self,
        run_id: &str,
        moves: &[Transition<'_>],
        fence: Option<&Fence>,
        redact: &[String],
    ) -> Result<String, StoreError> {
        let scrubs = scrub(moves, redact);
        let scrubbed: Vec<Transition<'_>>;
        let moves = match &scrubs {
            Some(scrubs) => {
                scrubbed = with_scrubs(moves, scrubs);
                &scrubbed[..]
            }
            None => moves,
        };
        self.publish(async {
            let rows = self.store.transitions(run_id, moves, fence).await?;
            Ok((own_time(&rows), rows))
        })
        .await
    }

    /// `workflow.cancel` of a run this worker does not drive
    /// ([`Store::request_cancel`]), then the live streams are told of the
    /// run's end when it ended here.
    pub(crate) async fn request_cancel(
        &self,
        run_id: &str,
        end: Transition<'_>,
    ) -> Result<CancelRequest, StoreError> {
        self.publish(async {
            let request = self.store.request_cancel(run_id, end).await?;
            let events = match &request {
                CancelRequest::Ended(events) => events.clone(),
                _ => Vec::new(),
            };
            Ok((request, events))
        })
        .await
    }

    /// Runs `write`, a store write that appends the events it returns, then
    /// tells the live streams of them. Where the store orders appends, the
    /// tail broadcasts them from its log. Otherwise one write at a time from
    /// append to broadcast, so live streams see ids in increasing order
    /// (parallel steps emit concurrently) and a stream that skips ids it has
    /// seen never skips one it has not.
    async fn publish<T>(
        &self,
        write: impl Future<Output = Result<(T, Vec<EventRow>), StoreError>>,
    ) -> Result<T, StoreError> {
        let write = async {
            let written = write.await;
            if let Err(e) = &written {
                crate::metrics::metrics().store_error(e.failure_kind());
            }
            written
        };
        if self.from_log {
            let (value, rows) = write.await?;
            if let Some(newest) = rows.iter().map(|r| r.id).max() {
                self.appended(newest);
            }
            return Ok(value);
        }
        let _in_order = self.order.lock().await;
        let (value, rows) = write.await?;
        for row in rows {
            let _ = self.live.send(row);
        }
        Ok(value)
    }

    /// Wakes the tail for the events up to `id`.
    fn appended(&self, id: i64) {
        self.newest.fetch_max(id, Ordering::Relaxed);
        self.appended.notify_one();
    }

    /// Tells the live streams only (progress: frequent, and stale at once).
    pub(crate) fn ephemeral(&self, run_id: &str, kind: &str, data: Value) {
        let data = crate::secrets::redact_json(&data).unwrap_or(data);
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

    /// Broadcasts the shared store's new events, every worker's, in id
    /// order, until `closing`. Woken by the store's notes and by local
    /// appends; polls every second for a note missed while reconnecting.
    pub(crate) async fn tail(self, closing: tokio_util::sync::CancellationToken) {
        const PAGE: u32 = 1000;
        let mut notes = self.store.listen();
        let mut last = loop {
            match self.store.last_event_id().await {
                Ok(id) => break id,
                Err(e) => {
                    tracing::warn!("cannot read the event log: {e}");
                    tokio::select! {
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                        _ = closing.cancelled() => return,
                    }
                }
            }
        };
        loop {
            // Nobody listens: nothing to read. A stream that starts later
            // reads the log up to then itself, and subscribes first, so it
            // misses nothing. (On a shared store other workers' events would
            // be skipped unseen; their ids are not known here.)
            if !self.shared && self.live.receiver_count() == 0 {
                last = last.max(self.newest.load(Ordering::Relaxed));
            } else {
                match self.store.events(None, last, PAGE).await {
                    Ok(rows) => {
                        let full = rows.len() == PAGE as usize;
                        for row in rows {
                            last = row.id;
                            let _ = self.live.send(row);
                        }
                        if full {
                            continue;
                        }
                    }
                    Err(e) => tracing::warn!("cannot read the event log: {e}"),
                }
            }
            let note = async {
                match notes.as_mut() {
                    Some(notes) => {
                        let _ = notes.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = note => {}
                _ = self.appended.notified() => {}
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                _ = closing.cancelled() => return,
            }
        }
    }
}

/// The time of a transition's own event: the last one it appended.
fn own_time(rows: &[EventRow]) -> String {
    rows.last().map(|r| r.at.clone()).unwrap_or_default()
}

/// A move's values with known secrets replaced (`None`: unchanged).
#[derive(Default)]
struct Scrub {
    input: Option<Value>,
    output: Option<Value>,
    error: Option<Failure>,
    log: Option<Value>,
}

/// The scrubbed values of `moves`, or `None` when no move carries a known
/// secret or, in a step's input, a field of `redact` (always, when neither
/// is configured). They are replaced before they are written: in the store,
/// the events and the streams.
fn scrub(moves: &[Transition<'_>], redact: &[String]) -> Option<Vec<Scrub>> {
    if !crate::secrets::any() && redact.is_empty() {
        return None;
    }
    let value = |v: Option<&Value>| v.and_then(crate::secrets::redact_json);
    let input = |v: Option<&Value>| {
        let v = v?;
        let out = crate::secrets::redact_value(v.clone(), redact);
        (out != *v).then_some(out)
    };
    // A wait step's input is the host's (`signal`, `timeout_at`) but for
    // its `request`: the fields are redacted there only.
    let waits = |v: Option<&Value>| {
        let v = v?;
        let mut out = crate::secrets::redact_value(v.clone(), &[]);
        if let Some(request) = out.get_mut("request") {
            *request = crate::secrets::redact_value(request.take(), redact);
        }
        (out != *v).then_some(out)
    };
    let failure = |f: Option<&Failure>| {
        let f = f?;
        match crate::secrets::redact(&f.message) {
            std::borrow::Cow::Borrowed(_) => None,
            std::borrow::Cow::Owned(message) => Some(Failure::new(f.code.clone(), message)),
        }
    };
    let scrubs: Vec<Scrub> = moves
        .iter()
        .map(|m| {
            let carried = m.carried();
            Scrub {
                input: match m {
                    Transition::StepWaits { .. } => waits(carried.input),
                    _ => input(carried.input),
                },
                output: value(carried.output),
                error: failure(carried.error),
                log: value(carried.log),
            }
        })
        .collect();
    let changed =
        |s: &Scrub| s.input.is_some() || s.output.is_some() || s.error.is_some() || s.log.is_some();
    scrubs.iter().any(changed).then_some(scrubs)
}

/// `moves` with the values `scrubs` replaced.
fn with_scrubs<'s>(moves: &[Transition<'s>], scrubs: &'s [Scrub]) -> Vec<Transition<'s>> {
    moves
        .iter()
        .zip(scrubs)
        .map(|(m, s)| {
            m.with_carried(Carried {
                input: s.input.as_ref(),
                output: s.output.as_ref(),
                error: s.error.as_ref(),
                log: s.log.as_ref(),
            })
        })
        .collect()
}
