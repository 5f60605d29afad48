//! Server-Sent Events of runs: `GET /runs/{run_id}/events` and `GET /events`.
//!
//! A stream first replays the kept events past `Last-Event-ID` (all of them
//! without it), then follows live ones, so a reconnecting client misses
//! nothing. A run's stream ends after its `run.finished`. Event ids are the
//! event log's; `step.progress` events are live only and carry no id.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use tokio::sync::broadcast::error::RecvError;

use super::App;
use crate::domain::EventRow;
use crate::tokens::{Caller, RunScope};
use crate::workflow::{WorkflowError, Workflows};

/// Kept events read per query while catching up.
const PAGE: u32 = 500;

pub(super) async fn run_events(
    State(app): State<App>,
    Extension(caller): Extension<Arc<Caller>>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    match app.state.workflows.workflow_of(&run_id).await {
        Ok(workflow) => {
            if let Some(refusal) = caller.refusal(RunScope::Read, &workflow) {
                return (StatusCode::FORBIDDEN, format!("{refusal}\n")).into_response();
            }
        }
        Err(WorkflowError::UnknownRun(_)) => {
            return (StatusCode::NOT_FOUND, format!("unknown run `{run_id}`\n")).into_response();
        }
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
    let stream = events(
        app.state.workflows.clone(),
        caller,
        Some(run_id),
        last_event_id(&headers),
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

pub(super) async fn all_events(
    State(app): State<App>,
    Extension(caller): Extension<Arc<Caller>>,
    headers: HeaderMap,
) -> Response {
    let stream = events(
        app.state.workflows.clone(),
        caller,
        None,
        last_event_id(&headers),
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

fn last_event_id(headers: &HeaderMap) -> i64 {
    headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn to_sse(row: &EventRow) -> Event {
    let data = serde_json::json!({
        "run_id": row.run_id, "kind": row.kind, "at": row.at, "data": row.data,
    });
    // Events are redacted as they are written; this catches those written
    // before a reload named the secret.
    let data = crate::secrets::redact_json(&data).unwrap_or(data);
    let event = Event::default()
        .event(row.kind.as_str())
        .data(data.to_string());
    if row.id > 0 {
        event.id(row.id.to_string())
    } else {
        event
    }
}

/// The kept events past `after`, then the live ones, of `run` or of all runs.
fn events(
    workflows: Arc<Workflows>,
    caller: Arc<Caller>,
    run: Option<String>,
    after: i64,
) -> impl Stream<Item = Result<Event, Infallible>> {
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
                    if tx.send(to_sse(&row)).await.is_err() {
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
                        if visible.shows(&row).await && tx.send(to_sse(&row)).await.is_err() {
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
                        if tx.send(to_sse(&row)).await.is_err() || ends(&row) {
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
fn async_stream<F, Fut>(body: F) -> impl Stream<Item = Result<Event, Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Event>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(body(tx));
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|event| (Ok(event), rx))
    })
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
