//! The HTTP client of streamable-HTTP connections: TLS (rustls with ring, the
//! system's roots plus a connection's `ca_file`, mTLS), keep-alive with one
//! retry of a request a stale pooled connection swallowed, and OAuth bearer
//! tokens (see [`super::oauth`]) with one renewal on 401 and a step-up on 403.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::auth::AuthError;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::{Error as SseError, Sse};

use super::oauth::OAuth;

/// What went wrong with TLS in `error`'s source chain, said for an operator:
/// unknown issuer, name mismatch, expired, or a refused client certificate.
pub(crate) fn explain_tls(error: &(dyn StdError + 'static)) -> Option<String> {
    let mut next: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(describe_rustls(tls));
        }
        // `io::Error::source` skips the error it wraps: step into it instead.
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    None
}

fn describe_rustls(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(cert) => {
            let what = match cert {
                C::UnknownIssuer => {
                    "unknown issuer: no trusted root signed it (set `ca_file` to trust its CA)"
                        .to_owned()
                }
                C::NotValidForName | C::NotValidForNameContext { .. } => {
                    "name mismatch: it is not valid for the host name of `url`".to_owned()
                }
                C::Expired | C::ExpiredContext { .. } => "expired".to_owned(),
                C::NotValidYet | C::NotValidYetContext { .. } => "not valid yet".to_owned(),
                C::Revoked => "revoked".to_owned(),
                other => format!("{other:?}"),
            };
            format!("TLS: the server's certificate was rejected: {what}")
        }
        rustls::Error::AlertReceived(alert) => format!(
            "TLS: the server refused the handshake ({alert:?}); if it requires a client certificate, set `client_cert` and `client_key`"
        ),
        other => format!("TLS: {other}"),
    }
}

/// Whether `error` is a request that a pooled keep-alive connection dropped
/// before any response came back (the server closed it: restart, idle
/// timeout). Such a request can be sent again on a fresh connection.
fn is_stale_connection(error: &reqwest::Error) -> bool {
    if error.is_connect() || error.is_timeout() {
        return false;
    }
    let mut next: Option<&(dyn StdError + 'static)> = error.source();
    while let Some(e) = next {
        if let Some(h) = e.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_canceled())
        {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionAborted
            )
        {
            return true;
        }
        next = e.source();
    }
    false
}

type HttpError = StreamableHttpError<reqwest::Error>;

/// The transport's HTTP client: reqwest plus TLS error explanation, the stale
/// connection retry and OAuth.
#[derive(Clone)]
pub(crate) struct HostClient {
    http: reqwest::Client,
    oauth: Option<Arc<OAuth>>,
    /// The last failure worth telling an operator (TLS, OAuth), for the
    /// connect error: rmcp's own error says only "transport error".
    last_failure: Arc<Mutex<Option<String>>>,
    /// The event streams (`GET`) open now. The standalone one is where the
    /// server pushes `list_changed`; while none is open, the session learns
    /// of changes only by re-listing.
    open_streams: Arc<AtomicUsize>,
    /// Whether the server gave the session an id when it initialised it: then
    /// the transport opens the standalone event stream (`GET`) next.
    stateful: Arc<AtomicBool>,
    /// Set once a `GET` for an event stream has been answered (opened or
    /// refused).
    stream_answered: Arc<tokio::sync::watch::Sender<bool>>,
}

impl HostClient {
    pub(crate) fn new(http: reqwest::Client, oauth: Option<Arc<OAuth>>) -> HostClient {
        HostClient {
            http,
            oauth,
            last_failure: Arc::default(),
            open_streams: Arc::default(),
            stateful: Arc::default(),
            stream_answered: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// Waits, at most `within`, until the server has answered the session's
    /// first `GET` for its standalone event stream. A server sends requests
    /// that belong to no call of ours (an elicitation a tool asks for without
    /// tying it to the call, `list_changed`) on that stream, and a server is
    /// free to drop them while it is not open: a session is ready for calls
    /// only once it is. Returns at once for a session without an id, which
    /// has no such stream.
    pub(crate) async fn standalone_stream_tried(&self, within: std::time::Duration) {
        if !self.stateful.load(Ordering::Relaxed) {
            return;
        }
        let mut answered = self.stream_answered.subscribe();
        if tokio::time::timeout(within, answered.wait_for(|a| *a))
            .await
            .is_err()
        {
            tracing::debug!(
                "the server has not answered the event stream's GET within {within:?}; going on without it"
            );
        }
    }

    /// Notes what an initialize request's answer says about the session.
    fn note_initialized(
        &self,
        message: &ClientJsonRpcMessage,
        result: &Result<StreamableHttpPostResponse, HttpError>,
    ) {
        let initialize = matches!(
            message,
            ClientJsonRpcMessage::Request(request)
                if matches!(request.request, rmcp::model::ClientRequest::InitializeRequest(_))
        );
        if initialize
            && let Ok(
                StreamableHttpPostResponse::Json(_, Some(_))
                | StreamableHttpPostResponse::Sse(_, Some(_)),
            ) = result
        {
            self.stateful.store(true, Ordering::Relaxed);
        }
    }

    /// The count of open event streams, shared with the session's status.
    pub(crate) fn open_streams(&self) -> Arc<AtomicUsize> {
        self.open_streams.clone()
    }

    /// What every `GET` for an event stream goes through: the server has
    /// answered one (see [`Self::standalone_stream_tried`]), and the stream
    /// it opened is counted open until it ends or is dropped.
    fn opened(
        &self,
        result: Result<BoxStream<'static, Result<Sse, SseError>>, HttpError>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        self.stream_answered.send_replace(true);
        let stream = result?;
        self.open_streams.fetch_add(1, Ordering::Relaxed);
        Ok(Box::pin(Counted {
            stream,
            open: self.open_streams.clone(),
        }))
    }

    pub(crate) fn last_failure(&self) -> Option<String> {
        self.last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn note(&self, what: String) {
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(what);
    }

    fn note_error<T>(&self, result: &Result<T, HttpError>) {
        if let Err(e) = result {
            let explained = match e {
                StreamableHttpError::Client(e) => explain_tls(e),
                StreamableHttpError::Auth(e) => Some(e.to_string()),
                _ => None,
            };
            if let Some(explained) = explained {
                self.note(explained);
            }
        }
    }

    /// Runs `call` with a bearer token when the connection has OAuth: renews
    /// the token once on 401, steps up the scopes once on 403
    /// `insufficient_scope`, and resends once when a stale pooled connection
    /// swallowed the request.
    async fn authorized<T, F, Fut>(
        &self,
        auth_header: Option<String>,
        call: F,
    ) -> Result<T, HttpError>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<T, HttpError>>,
    {
        let resend = |token: Option<String>| {
            let call = &call;
            async move {
                match call(token.clone()).await {
                    Err(StreamableHttpError::Client(e)) if is_stale_connection(&e) => {
                        tracing::debug!(
                            "a pooled connection was closed under the request; sending it again: {e}"
                        );
                        call(token).await
                    }
                    other => other,
                }
            }
        };
        let Some(oauth) = &self.oauth else {
            let result = resend(auth_header).await;
            self.note_error(&result);
            return result;
        };
        let result = async {
            let token = oauth.token().await?;
            match resend(token.clone()).await {
                Err(StreamableHttpError::AuthRequired(challenge)) => {
                    let token = oauth
                        .renew(token.as_deref(), &challenge.www_authenticate_header)
                        .await?;
                    resend(Some(token)).await
                }
                Err(StreamableHttpError::InsufficientScope(e)) => {
                    match oauth.step_up(e.required_scope.as_deref()).await {
                        Ok(token) => resend(Some(token)).await,
                        // It takes a sign-in: this request fails, not the session.
                        Err(_) if oauth.signs_in() => {
                            Err(StreamableHttpError::InsufficientScope(e))
                        }
                        // The token endpoint failed: that is the error.
                        Err(f) => Err(f.into()),
                    }
                }
                other => other,
            }
        }
        .await;
        self.note_error(&result);
        result
    }
}

/// rmcp's limit on one answer (a JSON body, an event), where a call names none.
const DEFAULT_ANSWER_LIMIT: usize = 16 << 20;

/// What a caller is told of an answer over the transport's limit, which
/// fails its own call only: the session goes on.
fn too_large(max_size: usize) -> rmcp::model::ErrorData {
    rmcp::model::ErrorData::new(
        rmcp::model::ErrorCode::INTERNAL_ERROR,
        format!(
            "the server's answer is over {} MiB ({max_size} bytes), the most wf-host takes in one answer; the call failed, the session goes on",
            max_size >> 20
        ),
        None,
    )
}

/// An answer's event stream in which an event over the size limit becomes
/// the error answer to `id` (then the stream ends), instead of a broken
/// stream that would read as a lost session.
fn bounded_answer(
    stream: BoxStream<'static, Result<Sse, SseError>>,
    id: rmcp::model::RequestId,
    max_size: usize,
) -> BoxStream<'static, Result<Sse, SseError>> {
    use futures::StreamExt;
    let mut ended = false;
    Box::pin(stream.filter_map(move |item| {
        let out = match item {
            _ if ended => None,
            // rmcp's limiter error type is private; its message is not.
            Err(e) if e.to_string().contains("exceeded the maximum size") => {
                ended = true;
                tracing::warn!(
                    "an answer of the server was over {max_size} bytes; its call fails: {e}"
                );
                let answer =
                    rmcp::model::ServerJsonRpcMessage::error(too_large(max_size), Some(id.clone()));
                Some(Ok(Sse {
                    event: None,
                    data: serde_json::to_string(&answer).ok(),
                    id: None,
                    retry: None,
                }))
            }
            other => Some(other),
        };
        std::future::ready(out)
    }))
}

/// An answer over the size limit fails its own request with an error that
/// says so (a JSON body whole, an event stream at the event), not the
/// session.
fn bounded(
    message: &ClientJsonRpcMessage,
    result: Result<StreamableHttpPostResponse, HttpError>,
    max_size: usize,
) -> Result<StreamableHttpPostResponse, HttpError> {
    let ClientJsonRpcMessage::Request(request) = message else {
        return result;
    };
    match result {
        Err(StreamableHttpError::ResponseBodyTooLarge { max_size }) => {
            tracing::warn!("an answer of the server was over {max_size} bytes; its call fails");
            Ok(StreamableHttpPostResponse::Json(
                rmcp::model::ServerJsonRpcMessage::error(
                    too_large(max_size),
                    Some(request.id.clone()),
                ),
                None,
            ))
        }
        Ok(StreamableHttpPostResponse::Sse(stream, session)) => {
            Ok(StreamableHttpPostResponse::Sse(
                bounded_answer(stream, request.id.clone(), max_size),
                session,
            ))
        }
        other => other,
    }
}

impl HostClient {
    /// What every POST's answer goes through: what it says of the session,
    /// an answer over the size limit failing its call alone, a scope
    /// refusal failing its request alone.
    fn answered(
        &self,
        message: &ClientJsonRpcMessage,
        result: Result<StreamableHttpPostResponse, HttpError>,
        max_size: usize,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.note_initialized(message, &result);
        let result = bounded(message, result, max_size);
        self.scope_refused(message, result)
    }

    /// A request the server refused for want of scope fails alone: its
    /// caller gets an error answer (naming the scope and what to do), and
    /// the session goes on with the calls it can still make.
    fn scope_refused(
        &self,
        message: &ClientJsonRpcMessage,
        result: Result<StreamableHttpPostResponse, HttpError>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        match (result, message, &self.oauth) {
            (
                Err(StreamableHttpError::InsufficientScope(e)),
                ClientJsonRpcMessage::Request(request),
                Some(oauth),
            ) => {
                let why = oauth.scope_refusal(e.required_scope.as_deref());
                let error = rmcp::model::ErrorData::new(
                    rmcp::model::ErrorCode(super::oauth::SCOPE_REFUSED),
                    why,
                    None,
                );
                Ok(StreamableHttpPostResponse::Json(
                    rmcp::model::ServerJsonRpcMessage::error(error, Some(request.id.clone())),
                    None,
                ))
            }
            (result, _, _) => result,
        }
    }
}

/// A stream that counts itself open until it ends or is dropped.
struct Counted {
    stream: BoxStream<'static, Result<Sse, SseError>>,
    open: Arc<AtomicUsize>,
}

impl futures::Stream for Counted {
    type Item = Result<Sse, SseError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.stream.as_mut().poll_next(cx)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl From<super::oauth::OAuthFailure> for HttpError {
    fn from(e: super::oauth::OAuthFailure) -> Self {
        StreamableHttpError::Auth(AuthError::AuthorizationFailed(e.0))
    }
}

impl StreamableHttpClient for HostClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let result = self
            .authorized(auth_header, |token| {
                self.http.post_message(
                    uri.clone(),
                    message.clone(),
                    session_id.clone(),
                    token,
                    custom_headers.clone(),
                )
            })
            .await;
        self.answered(&message, result, DEFAULT_ANSWER_LIMIT)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let result = self
            .authorized(auth_header, |token| {
                self.http.post_message_with_max_sse_event_size(
                    uri.clone(),
                    message.clone(),
                    session_id.clone(),
                    token,
                    custom_headers.clone(),
                    max_sse_event_size,
                )
            })
            .await;
        self.answered(&message, result, max_sse_event_size)
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let result = self
            .authorized(auth_header, |token| {
                self.http.post_message_with_response_limits(
                    uri.clone(),
                    message.clone(),
                    session_id.clone(),
                    token,
                    custom_headers.clone(),
                    limits,
                )
            })
            .await;
        self.answered(&message, result, limits.max_sse_event_size)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        self.authorized(auth_header, |token| {
            self.http.delete_session(
                uri.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        let stream = self
            .authorized(auth_header, |token| {
                self.http.get_stream(
                    uri.clone(),
                    session_id.clone(),
                    last_event_id.clone(),
                    token,
                    custom_headers.clone(),
                )
            })
            .await;
        self.opened(stream)
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        let stream = self
            .authorized(auth_header, |token| {
                self.http.get_stream_with_max_sse_event_size(
                    uri.clone(),
                    session_id.clone(),
                    last_event_id.clone(),
                    token,
                    custom_headers.clone(),
                    max_sse_event_size,
                )
            })
            .await;
        self.opened(stream)
    }
}
