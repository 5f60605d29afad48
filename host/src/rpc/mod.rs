//! JSON-RPC 2.0 over HTTP: start and follow workflows, call capabilities, read
//! host status. Every request goes through the same MCP pool as nodes do.
//!
//! `POST /rpc` takes single requests and batches; `GET /healthz` answers
//! liveness. [`router`] builds the app apart from [`serve`], so tests can drive
//! it in-process.
//!
//! Before anything runs, a request a web page could send behind the user's back
//! is refused: a foreign `Origin`, a non-loopback `Host` on a loopback listener
//! (DNS rebinding), a content type other than `application/json`.

mod events;
mod hooks;
mod jsonrpc;
mod methods;
mod openrpc;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::tokens::{Caller, HostScope};
use crate::trace::TraceParent;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::uri::Authority;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::BytesMut;
use futures::{StreamExt, stream};
use serde_json::Value;

/// What the methods work on: the [`Api`](crate::api::Api) of the server.
pub use crate::api::Api as RpcState;
pub use jsonrpc::RpcError;

/// Default largest request body.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;

/// Most requests in one batch.
pub const MAX_BATCH: usize = 100;

/// How many requests of one batch run at once; the rest wait their turn.
const BATCH_CONCURRENCY: usize = 8;

/// Who may call, and how much they may send.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// Required as `Authorization: Bearer <token>` when set.
    pub token: Option<String>,
    pub max_body: usize,
    /// Origins besides the server's own whose requests are accepted
    /// (`--allow-origin`), e.g. `http://localhost:3000`.
    pub allow_origins: Vec<String>,
    /// Accept any `Host` header. Off (the default), only loopback names are
    /// accepted, which defeats DNS rebinding; `serve` turns it on when it
    /// listens on a non-loopback address, where a token is required anyway.
    pub any_host: bool,
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
    #[error(
        "`{0}` is not an origin like `http://localhost:3000` (scheme, host and optional port, no path)"
    )]
    BadOrigin(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Checks that a non-loopback address comes with a token: `--token`, or
/// named tokens (`named_tokens`).
///
/// # Errors
/// [`ServeError::TokenRequired`].
pub fn check_access(
    addr: SocketAddr,
    access: &Access,
    named_tokens: bool,
) -> Result<(), ServeError> {
    if !addr.ip().is_loopback()
        && access.token.as_deref().is_none_or(str::is_empty)
        && !named_tokens
    {
        return Err(ServeError::TokenRequired(addr));
    }
    Ok(())
}

/// An origin in the form browsers send it: `scheme://host[:port]`, lowercase,
/// without the scheme's default port.
///
/// # Errors
/// [`ServeError::BadOrigin`] for anything with a path, a query, user info or no host.
pub fn normalize_origin(origin: &str) -> Result<String, ServeError> {
    let bad = || ServeError::BadOrigin(origin.to_owned());
    let uri: Uri = origin.parse().map_err(|_| bad())?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(bad());
    };
    let path_ok = uri
        .path_and_query()
        .is_none_or(|pq| matches!(pq.as_str(), "" | "/"));
    if !path_ok || authority.as_str().contains('@') || authority.host().is_empty() {
        return Err(bad());
    }
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    };
    let host = authority.host().to_ascii_lowercase();
    Ok(match authority.port_u16() {
        Some(port) if Some(port) != default_port => format!("{scheme}://{host}:{port}"),
        _ => format!("{scheme}://{host}"),
    })
}

/// The HTTP app.
///
/// # Errors
/// [`ServeError::BadOrigin`] when an allowed origin is not an origin.
pub fn router(state: RpcState, access: Access) -> Result<Router, ServeError> {
    let access = Access {
        max_body: if access.max_body == 0 {
            DEFAULT_MAX_BODY
        } else {
            access.max_body
        },
        allow_origins: access
            .allow_origins
            .iter()
            .map(|o| normalize_origin(o))
            .collect::<Result<_, _>>()?,
        ..access
    };
    let app = App {
        state,
        access: Arc::new(access),
    };
    // Everything but `/healthz` wants the token, when there is one.
    let guarded = Router::new()
        .route("/rpc", post(rpc))
        .nest_service(
            "/mcp",
            crate::mcp::http_service(app.state.workflows.clone()),
        )
        .route("/metrics", get(metrics))
        .route("/runs/{run_id}/events", get(events::run_events))
        .route("/events", get(events::all_events))
        .with_state(app.clone())
        .layer(middleware::from_fn_with_state(app.clone(), bearer_token));
    // Webhooks come from other servers, never from a page: they skip the
    // Origin and Host checks, and are authenticated by their signatures.
    let hooks = Router::new()
        .route("/hooks/{workflow}", post(hooks::deliver))
        .with_state(app.clone());
    Ok(Router::new()
        .route("/healthz", get(healthz).with_state(app.clone()))
        .merge(guarded)
        .merge(crate::console::router())
        .layer(middleware::from_fn_with_state(app, same_origin))
        .merge(hooks))
}
/// `ok`, or `503 degraded: <why>` while the state cannot be written (its
/// disk is full): the host still answers reads.
async fn healthz(State(app): State<App>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match app.state.workflows.degraded() {
        None => "ok\n".into_response(),
        Some(why) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("degraded: {why}\n"),
        )
            .into_response(),
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then stops
/// accepting and lets open requests finish.
///
/// Every connection has `TCP_NODELAY`: with Nagle's algorithm on, a response
/// written in two pieces waits for the client's delayed ACK (40 ms on Linux)
/// before its second piece goes out.
///
/// # Errors
/// [`ServeError::Io`] when the server fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|stream| {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY on a connection: {e}");
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

/// The bearer token of a request.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Refuses what a web page could send behind the user's back, before anything
/// else runs: on loopback, a `Host` that is not a loopback name (DNS
/// rebinding); anywhere, an `Origin` that is neither the server's own nor
/// allowed with `--allow-origin` (a cross-site request).
async fn same_origin(
    State(app): State<App>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    if let Some((status, message)) =
        origin_refusal(&app.access, request.headers(), request.uri().authority())
    {
        return refuse(status, message);
    }
    next.run(request).await
}

/// Why [`same_origin`] refuses a request with `headers` (and the URI's
/// `authority`, when the request has no `Host`), if it does.
fn origin_refusal(
    access: &Access,
    headers: &HeaderMap,
    authority: Option<&Authority>,
) -> Option<(StatusCode, String)> {
    let host = headers
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .or_else(|| authority.map(|a| a.to_string()));
    if !access.any_host
        && let Some(host) = &host
        && !is_loopback_name(host)
    {
        return Some((
            StatusCode::FORBIDDEN,
            format!(
                "refused: `Host: {host}` is not a loopback name; this server listens on loopback and answers only `localhost`, `127.0.0.1` or `[::1]` (DNS rebinding protection)"
            ),
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
        let normalized = normalize_origin(&origin).ok();
        let own = host.and_then(|h| normalize_origin(&format!("http://{h}")).ok());
        let allowed = normalized.is_some_and(|o| {
            own.as_deref() == Some(o.as_str()) || access.allow_origins.contains(&o)
        });
        if !allowed {
            return Some((
                StatusCode::FORBIDDEN,
                format!(
                    "refused: cross-origin request from `Origin: {origin}`; only the server's own origin or one allowed with `--allow-origin` may call"
                ),
            ));
        }
    }
    None
}

/// `localhost`, or a loopback address (`127.0.0.0/8`, `[::1]`), with an
/// optional port.
fn is_loopback_name(host: &str) -> bool {
    let Ok(authority) = host.parse::<Authority>() else {
        return false;
    };
    let name = authority.host();
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    name.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// Whether `content_type` is `application/json`, parameters aside.
fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

fn refuse(status: StatusCode, message: String) -> Response {
    json_response(
        status,
        jsonrpc::failure(
            Value::Null,
            RpcError::new(jsonrpc::INVALID_REQUEST, message),
        ),
    )
}

/// `GET /metrics`: Prometheus text.
async fn metrics(State(app): State<App>, Extension(caller): Extension<Arc<Caller>>) -> Response {
    if let Some(refusal) = caller.host_refusal(HostScope::Metrics) {
        return forbidden(refusal);
    }
    let connections: Vec<(String, bool, u64)> = app
        .state
        .pool
        .stats()
        .into_iter()
        .map(|c| (c.id, c.state == "ready", c.queued))
        .collect();
    let workflows = &app.state.workflows;
    let live = workflows.live_definitions().await.unwrap_or_else(|e| {
        tracing::warn!("cannot count the runs per definition for /metrics: {e}");
        Vec::new()
    });
    let asleep = match workflows.counts().await {
        Ok(counts) => Some(counts.runs_asleep),
        Err(e) => {
            tracing::warn!("cannot count the runs asleep for /metrics: {e}");
            None
        }
    };
    let text = crate::metrics::metrics().render(
        &connections,
        workflows.running(),
        workflows.waiting(),
        &live,
        workflows.degraded().is_some(),
        asleep,
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The bearer token rule of every route but `/healthz`: the `--token` (every
/// scope), a named token (its scopes), or, with neither configured, anyone
/// (a loopback server). The caller goes with the request.
async fn bearer_token(
    State(app): State<App>,
    mut request: axum::extract::Request,
    next: Next,
) -> Response {
    let Some(caller) = identify(&app, request.headers()) else {
        let mut refused = refuse(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token: send `Authorization: Bearer <token>`".into(),
        );
        refused.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return refused;
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Who sent a request: `None` when a token is needed and it has none (or a
/// wrong one).
fn identify(app: &App, headers: &HeaderMap) -> Option<Arc<Caller>> {
    let tokens = app.state.tokens.load();
    if app.access.token.is_none() && tokens.is_empty() {
        return Some(Caller::everything());
    }
    let given = bearer(headers)?;
    match &app.access.token {
        Some(token) if constant_time_eq::constant_time_eq(given.as_bytes(), token.as_bytes()) => {
            Some(Caller::everything())
        }
        _ => tokens.identify(given),
    }
}

/// A 403 for a token that lacks a scope.
fn forbidden(message: String) -> Response {
    refuse(StatusCode::FORBIDDEN, message)
}

async fn rpc(
    State(app): State<App>,
    Extension(caller): Extension<Arc<Caller>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match headers.get(header::CONTENT_TYPE) {
        Some(ct) if ct.to_str().is_ok_and(is_json) => {}
        Some(ct) => {
            return refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "unsupported content type `{}`; send `Content-Type: application/json`",
                    String::from_utf8_lossy(ct.as_bytes())
                ),
            );
        }
        None => {
            return refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "missing content type; send `Content-Type: application/json`".to_owned(),
            );
        }
    }
    let bytes = match read_body(&headers, body, app.access.max_body).await {
        Ok(bytes) => bytes,
        Err(BodyError::TooLarge) => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body exceeds {} bytes", app.access.max_body),
            );
        }
        Err(BodyError::Read(e)) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {e}"),
            );
        }
    };
    let parent = TraceParent::from_headers(&headers);
    match handle_body_as(&app.state, &caller, &bytes, &parent).await {
        Some(reply) => json_response(StatusCode::OK, reply),
        // Only notifications: nothing to say.
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

enum BodyError {
    TooLarge,
    Read(axum::Error),
}

/// Reads at most `max` bytes; a declared or actual length past it is
/// `TooLarge`, any other failure (client gone, bad chunking) is `Read`.
async fn read_body(headers: &HeaderMap, body: Body, max: usize) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(BodyError::TooLarge);
    }
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(BodyError::Read)?;
        if buf.len() + chunk.len() > max {
            return Err(BodyError::TooLarge);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// A JSON answer. Known secrets never leave in one, whatever a run or an
/// upstream server put in it.
fn json_response(status: StatusCode, body: Value) -> Response {
    let body = crate::secrets::redact_json(&body).unwrap_or(body);
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
    handle_body_traced(state, body, &TraceParent::none()).await
}

/// [`handle_body_as`] for a caller with every scope.
pub async fn handle_body_traced(
    state: &RpcState,
    body: &[u8],
    parent: &TraceParent,
) -> Option<Value> {
    handle_body_as(state, &Caller::everything(), body, parent).await
}

/// [`handle_body`] for `caller` (what its token may do), for a request that
/// came with a trace context: the runs it starts continue that trace.
pub async fn handle_body_as(
    state: &RpcState,
    caller: &Caller,
    body: &[u8],
    parent: &TraceParent,
) -> Option<Value> {
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
        Value::Array(items) if items.len() > MAX_BATCH => Some(jsonrpc::failure(
            Value::Null,
            RpcError::new(
                jsonrpc::INVALID_REQUEST,
                format!(
                    "batch of {} requests exceeds the limit of {MAX_BATCH}",
                    items.len()
                ),
            ),
        )),
        Value::Array(items) => {
            // A few at a time, replies in request order.
            let replies: Vec<Value> = stream::iter(items)
                .map(|item| handle_one(state, caller, item, parent))
                .buffered(BATCH_CONCURRENCY)
                .filter_map(|reply| async move { reply })
                .collect()
                .await;
            (!replies.is_empty()).then_some(Value::Array(replies))
        }
        single => handle_one(state, caller, single, parent).await,
    }
}

async fn handle_one(
    state: &RpcState,
    caller: &Caller,
    value: Value,
    parent: &TraceParent,
) -> Option<Value> {
    let request = match jsonrpc::parse_request(value) {
        Ok(r) => r,
        Err((error, id)) => return Some(jsonrpc::failure(id, error)),
    };
    // Boxed: the method's future is the largest of every method's, and
    // axum's layers and the batch's stream would each move it whole.
    let result = Box::pin(methods::call(
        state,
        caller,
        &request.method,
        request.params,
        parent,
    ))
    .await;
    // A notification gets no response, even when it failed.
    let id = request.id?;
    Some(match result {
        Ok(v) => jsonrpc::success(id, v),
        Err(e) => jsonrpc::failure(id, e),
    })
}
