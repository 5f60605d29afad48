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
use futures::StreamExt;

use super::App;
use crate::api::{ApiError, follow};
use crate::domain::EventRow;
use crate::tokens::{Caller, RunScope};
use crate::workflow::WorkflowError;

pub(super) async fn run_events(
    State(app): State<App>,
    Extension(caller): Extension<Arc<Caller>>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    match app
        .state
        .runs()
        .owner(&caller, RunScope::Read, &run_id)
        .await
    {
        Ok(_) => {}
        Err(ApiError::Denied(refusal)) => {
            return (StatusCode::FORBIDDEN, format!("{refusal}\n")).into_response();
        }
        Err(ApiError::Workflow(WorkflowError::UnknownRun(_))) => {
            return (StatusCode::NOT_FOUND, format!("unknown run `{run_id}`\n")).into_response();
        }
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
    let stream = follow(
        app.state.workflows.clone(),
        caller,
        Some(run_id),
        last_event_id(&headers),
    )
    .map(|row| Ok::<_, Infallible>(to_sse(&row)));
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

pub(super) async fn all_events(
    State(app): State<App>,
    Extension(caller): Extension<Arc<Caller>>,
    headers: HeaderMap,
) -> Response {
    let stream = follow(
        app.state.workflows.clone(),
        caller,
        None,
        last_event_id(&headers),
    )
    .map(|row| Ok::<_, Infallible>(to_sse(&row)));
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
