//! Following the events of a run, or of every run a caller may read: the
//! kept events past a given id first, then the live ones, with nothing
//! missed in between and nothing shown twice. A face words each event (SSE
//! for `/events`).

use std::future::Future;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::broadcast::error::RecvError;

use crate::domain::EventRow;
use crate::tokens::{Caller, RunScope};
use crate::workflow::Workflows;

/// Kept events read per query while catching up.
const PAGE: u32 = 500;

/// The kept events past `after`, then the live ones, of `run` or of all
/// runs (those of the workflows `caller` may read). A run's stream ends
/// after its `run.finished`; a stream ends when the host closes.
pub fn follow(
    workflows: Arc<Workflows>,
    caller: Arc<Caller>,
    run: Option<String>,
    after: i64,
) -> impl Stream<Item = EventRow> {
    async_stream(move |tx| async move {
        // Of all runs, a token sees those of the workflows it may read.
        let mut visible = Visible::new(&workflows, &caller, run.is_none());
        // Subscribed before reading the log: an event kept meanwhile is in
        // one or the other (or both, and then skipped by id).
        let mut live = workflows.subscribe();
        let closing = workflows.closing_token();
        let mut last = after;
        let ours = |row: &EventRow| run.as_deref().is_none_or(|r| r == row.run_id);
        let ends = |row: &EventRow| run.is_some() && row.kind == "run.finished";
        'catch_up: loop {
            loop {
                let Ok(page) = workflows.events(run.as_deref(), last, PAGE).await else {
                    return;
                };
                let full = page.len() == PAGE as usize;
                for row in page {
                    last = row.id;
                    if !visible.shows(&row).await {
                        continue;
                    }
                    if tx.send(row.clone()).await.is_err() {
                        return;
                    }
                    if ends(&row) {
                        return;
                    }
                }
                if !full {
                    break;
                }
            }
            loop {
                let row = tokio::select! {
                    row = live.recv() => row,
                    () = closing.cancelled() => return,
                    () = tx.closed() => return,
                };
                match row {
                    Ok(row) if !ours(&row) => {}
                    Ok(row) if row.id == 0 => {
                        if visible.shows(&row).await && tx.send(row.clone()).await.is_err() {
                            return;
                        }
                    }
                    Ok(row) if row.id <= last => {}
                    // Every kept event is broadcast in id order, so a gap in
                    // the stream of all runs means this one missed some:
                    // read them from the log.
                    Ok(row) if row.id > last + 1 && run.is_none() => continue 'catch_up,
                    Ok(row) => {
                        last = row.id;
                        if !visible.shows(&row).await {
                            continue;
                        }
                        if tx.send(row.clone()).await.is_err() || ends(&row) {
                            return;
                        }
                    }
                    Err(RecvError::Lagged(_)) => continue 'catch_up,
                    Err(RecvError::Closed) => return,
                }
            }
        }
    })
}

/// A stream fed by `body` through a small channel; `body` ends when the
/// client goes away (the sender's `closed` resolves).
fn async_stream<F, Fut>(body: F) -> impl Stream<Item = EventRow>
where
    F: FnOnce(tokio::sync::mpsc::Sender<EventRow>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(body(tx));
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|row| (row, rx)) },
    )
}

/// Which runs' events a stream of all runs shows its caller: those of the
/// workflows its token may read (every one, for an unlimited caller or a
/// run's own stream, checked before it opened).
struct Visible<'a> {
    workflows: &'a Workflows,
    caller: &'a Caller,
    check: bool,
    /// Run id → shown; cleared when it grows past a bound.
    seen: std::collections::HashMap<String, bool>,
}

impl<'a> Visible<'a> {
    fn new(workflows: &'a Workflows, caller: &'a Caller, all_runs: bool) -> Visible<'a> {
        Visible {
            workflows,
            caller,
            check: all_runs && !caller.is_unlimited(),
            seen: std::collections::HashMap::new(),
        }
    }

    async fn shows(&mut self, row: &EventRow) -> bool {
        if !self.check {
            return true;
        }
        if let Some(&shown) = self.seen.get(&row.run_id) {
            return shown;
        }
        let workflow = match row.data.get("workflow").and_then(|w| w.as_str()) {
            Some(w) if row.kind == crate::domain::RUN_STARTED => Some(w.to_owned()),
            _ => self.workflows.workflow_of(&row.run_id).await.ok(),
        };
        let shown = workflow.is_some_and(|w| self.caller.may(RunScope::Read, &w));
        if self.seen.len() >= 10_000 {
            self.seen.clear();
        }
        self.seen.insert(row.run_id.clone(), shown);
        shown
    }
}
