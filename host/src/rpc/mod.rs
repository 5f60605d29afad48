//! JSON-RPC 2.0 over HTTP: start and follow workflows, call capabilities, read
//! host status. Every request goes through the same MCP pool as nodes do.
//!
//! `POST /rpc` takes single requests and batches; `GET /healthz` answers
//! liveness. [`router`] builds the app apart from [`serve`], so tests can drive
//! it in-process.

mod jsonrpc;
mod methods;
mod openrpc;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::future::join_all;
use serde_json::Value;

pub use jsonrpc::RpcError;
pub use methods::RpcState;

/// Default largest request body.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;

/// Who may call, and how much they may send.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// Required as `Authorization: Bearer <token>` when set.
    pub token: Option<String>,
    pub max_body: usize,
}

#[derive(Clone)]
struct App {
    state: RpcState,
    access: Arc<Access>,
}

/// Why the server refused to start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to listen on {0} without a token: only loopback addresses are open without one; pass `--token` (or set WF_HOST_TOKEN), or listen on 127.0.0.1"
    )]
    TokenRequired(SocketAddr),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Checks that a non-loopback address comes with a token.
///
/// # Errors
/// [`ServeError::TokenRequired`].
pub fn check_access(addr: SocketAddr, access: &Access) -> Result<(), ServeError> {
    if !addr.ip().is_loopback() && access.token.as_deref().is_none_or(str::is_empty) {
        return Err(ServeError::TokenRequired(addr));
    }
    Ok(())
}

/// The HTTP app.
pub fn router(state: RpcState, access: Access) -> Router {
    let access = Access {
        max_body: if access.max_body == 0 {
            DEFAULT_MAX_BODY
        } else {
            access.max_body
        },
        ..access
    };
    Router::new()
        .route("/rpc", post(rpc))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(App {
            state,
            access: Arc::new(access),
        })
}

/// Serves `router` on `listener` until `shutdown` resolves, then stops
/// accepting and lets open requests finish.
///
/// # Errors
/// [`ServeError::Io`] when the server fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

fn authorized(headers: &HeaderMap, token: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    constant_time_eq::constant_time_eq(given.trim().as_bytes(), token.as_bytes())
}

async fn rpc(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    if let Some(token) = &app.access.token
        && !authorized(&headers, token)
    {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong bearer token\n",
        )
            .into_response();
    }
    let bytes: Bytes = match axum::body::to_bytes(body, app.access.max_body).await {
        Ok(bytes) => bytes,
        Err(_) => {
            let error = RpcError::new(
                jsonrpc::INVALID_REQUEST,
                format!("request body exceeds {} bytes", app.access.max_body),
            );
            return json_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                jsonrpc::failure(Value::Null, error),
            );
        }
    };
    match handle_body(&app.state, &bytes).await {
        Some(reply) => json_response(StatusCode::OK, reply),
        // Only notifications: nothing to say.
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Answers a raw body: one request, a batch, or garbage. `None` when there is
/// nothing to answer (notifications only).
pub async fn handle_body(state: &RpcState, body: &[u8]) -> Option<Value> {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Some(jsonrpc::failure(
                Value::Null,
                RpcError::new(jsonrpc::PARSE_ERROR, format!("parse error: {e}")),
            ));
        }
    };
    match value {
        Value::Array(items) if items.is_empty() => Some(jsonrpc::failure(
            Value::Null,
            RpcError::new(jsonrpc::INVALID_REQUEST, "an empty batch is not a request"),
        )),
        Value::Array(items) => {
            let replies: Vec<Value> =
                join_all(items.into_iter().map(|item| handle_one(state, item)))
                    .await
                    .into_iter()
                    .flatten()
                    .collect();
            (!replies.is_empty()).then_some(Value::Array(replies))
        }
        single => handle_one(state, single).await,
    }
}

async fn handle_one(state: &RpcState, value: Value) -> Option<Value> {
    let request = match jsonrpc::parse_request(value) {
        Ok(r) => r,
        Err((error, id)) => return Some(jsonrpc::failure(id, error)),
    };
    let result = methods::call(state, &request.method, request.params).await;
    // A notification gets no response, even when it failed.
    let id = request.id?;
    Some(match result {
        Ok(v) => jsonrpc::success(id, v),
        Err(e) => jsonrpc::failure(id, e),
    })
}
