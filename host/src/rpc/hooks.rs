//! `POST /hooks/{workflow}`: a webhook delivery starts a run
//! ([`crate::workflow::webhook`] verifies it and maps its input).
//!
//! `202 {"run_id"}` when a run started (or a delivery with the same id had
//! started it); `401` when the signature is missing or wrong, `404` when the
//! workflow has no webhook, `413` past the webhook's `max_input`, `400` when
//! its input is refused. The path serves nothing else: no other endpoint is
//! reachable through it.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::{App, BodyError, identify, origin_refusal, read_body};
use crate::tokens::RunScope;
use crate::workflow::WorkflowError;
use crate::workflow::webhook::{Delivery, HookError, Verify};

/// Longest query string read.
const MAX_QUERY: usize = 4096;
/// How long a delivery's body may take to arrive: it is read before it can
/// be verified, so a slow sender must not hold the connection.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

pub(super) async fn deliver(
    State(app): State<App>,
    Path(workflow): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (status, reply) = handle(&app, &workflow, query, &headers, body).await;
    // Only configured workflows get a label: a scan of random paths must
    // not grow the metrics without bound.
    if app.state.workflows.webhook(&workflow).is_some() {
        crate::metrics::metrics().webhook_request(&workflow, status.as_u16());
    }
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        reply.to_string(),
    )
        .into_response();
    // Busy (the state cannot be written now): when to deliver again.
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
    }
    response
}

async fn handle(
    app: &App,
    workflow: &str,
    query: Option<String>,
    headers: &HeaderMap,
    body: Body,
) -> (StatusCode, Value) {
    let error = |status: StatusCode, message: String| (status, json!({"error": message}));
    let workflows = &app.state.workflows;
    let Some(hook) = workflows.webhook(workflow) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("no webhook for workflow `{workflow}`"),
        );
    };
    // Unsigned deliveries are accepted only as `/rpc` would accept their
    // sender: from no foreign page, with the token when there is one.
    if matches!(hook.verify, Verify::None) {
        if let Some((status, message)) = origin_refusal(&app.access, headers, None) {
            return error(status, message);
        }
        let Some(caller) = identify(app, headers) else {
            return error(
                StatusCode::UNAUTHORIZED,
                "this webhook verifies no signature (`verify = \"none\"`), so it takes a bearer token of the server".into(),
            );
        };
        if let Some(refusal) = caller.refusal(RunScope::Start, workflow) {
            return error(StatusCode::FORBIDDEN, refusal);
        }
    }
    let max = usize::try_from(hook.max_input).unwrap_or(usize::MAX);
    let read = tokio::time::timeout(BODY_TIMEOUT, read_body(headers, body, max)).await;
    let Ok(read) = read else {
        return error(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body did not arrive within {}s", BODY_TIMEOUT.as_secs()),
        );
    };
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(BodyError::TooLarge) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body exceeds this webhook's `max_input` of {max} bytes"),
            );
        }
        Err(BodyError::Read(e)) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {e}"),
            );
        }
    };
    let mut lower = BTreeMap::new();
    for (name, value) in headers {
        if let Ok(value) = value.to_str() {
            lower
                .entry(name.as_str().to_ascii_lowercase())
                .or_insert_with(|| value.to_owned());
        }
    }
    // Never handed on: the token, and the cookies of whoever sent it.
    lower.remove("authorization");
    lower.remove("cookie");
    let query = parse_query(query.as_deref().unwrap_or_default());
    let delivery = Delivery {
        headers: &lower,
        query,
        body: &bytes,
    };
    match workflows.deliver(workflow, delivery).await {
        Ok(run_id) => (StatusCode::ACCEPTED, json!({"run_id": run_id})),
        Err(e) => {
            let status = match &e {
                HookError::NotFound(_) => StatusCode::NOT_FOUND,
                HookError::Unverified(_) => StatusCode::UNAUTHORIZED,
                HookError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                HookError::Input(_)
                | HookError::DeliveryId(_)
                | HookError::Workflow(WorkflowError::InvalidInput { .. }) => {
                    StatusCode::BAD_REQUEST
                }
                HookError::Workflow(WorkflowError::ShuttingDown) => StatusCode::SERVICE_UNAVAILABLE,
                HookError::Workflow(WorkflowError::Store(e)) if e.is_unavailable() => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                HookError::Workflow(WorkflowError::Busy { .. }) => StatusCode::SERVICE_UNAVAILABLE,
                HookError::Workflow(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            if status.is_server_error() {
                tracing::warn!(workflow, "webhook delivery failed: {e}");
            }
            error(status, e.to_string())
        }
    }
}

/// `a=1&b=x` as `{"a": "1", "b": "x"}` (a repeated name keeps its first
/// value).
fn parse_query(query: &str) -> Map<String, Value> {
    let mut map = Map::new();
    if query.len() > MAX_QUERY {
        return map;
    }
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        map.entry(name.into_owned())
            .or_insert_with(|| Value::String(value.into_owned()));
    }
    map
}
