//! Remote-server helpers: a test CA (rcgen), the fixture MCP server behind TLS
//! (optionally requiring a client certificate), and an OAuth 2.1
//! authorization server on loopback in front of the fixture.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_rustls::rustls;
use tokio_util::sync::CancellationToken;

/// A CA made for one test.
pub struct TestCa {
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        TestCa {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `names`; `expired` makes one that ended in 2001.
    pub fn issue(&self, names: &[&str], expired: bool) -> Issued {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Accepts TCP, then the TLS handshake; failed handshakes are skipped.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    accepted: Arc<AtomicUsize>,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            self.accepted.fetch_add(1, Ordering::SeqCst);
            let handshake = self.acceptor.accept(tcp);
            if let Ok(Ok(tls)) = tokio::time::timeout(Duration::from_secs(5), handshake).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// A router served on 127.0.0.1 over HTTPS, stopped on drop.
pub struct TlsServer {
    pub port: u16,
    /// TCP connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl TlsServer {
    /// Serves `router` with `leaf`; with `client_ca`, a client certificate
    /// signed by it is required.
    pub async fn start(router: Router, leaf: &Issued, client_ca: Option<&TestCa>) -> TlsServer {
        use rustls::pki_types::PrivateKeyDer;
        use rustls::pki_types::pem::PemObject;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in certs(&ca.cert_pem) {
                    roots.add(c).unwrap();
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider(),
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
        let mut config = builder
            .with_single_cert(certs(&leaf.cert_pem), key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = tcp.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let listener = TlsListener {
            tcp,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            accepted: accepted.clone(),
        };
        let stop = CancellationToken::new();
        let signal = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async move { signal.cancelled().await })
                .await;
        });
        TlsServer {
            port,
            accepted,
            stop,
        }
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The fixture MCP service (in this process), for wrapping.
pub fn fixture_router(stop: &CancellationToken) -> Router {
    wf_host::fixture::http_router(
        wf_host::fixture::FixtureOptions::default(),
        std::net::Ipv4Addr::LOCALHOST.into(),
        stop.child_token(),
    )
    .unwrap()
}

/// What the authorization server saw at its token endpoint.
#[derive(Debug, Clone)]
pub struct TokenRequest {
    pub grant_type: String,
    /// `client_secret_basic`, `client_secret_post` or `none`.
    pub auth_method: &'static str,
    pub scope: Option<String>,
    pub resource: Option<String>,
    /// For `authorization_code`: the PKCE verifier matched the S256 challenge.
    pub pkce_ok: Option<bool>,
}

struct Grant {
    client_id: String,
    challenge: String,
    scope: Option<String>,
}

/// An OAuth 2.1 authorization server and protected MCP resource on one
/// loopback origin: protected-resource and authorization-server metadata,
/// dynamic registration, an authorize endpoint that approves at once (with a
/// PKCE S256 check at the token endpoint), and the fixture MCP server at
/// `/mcp`, which wants a valid bearer token.
pub struct AuthServer {
    pub base: String,
    pub state: Arc<AuthState>,
    stop: CancellationToken,
}

pub struct AuthState {
    base: String,
    /// Pre-registered clients: id -> secret.
    pub clients: Mutex<HashMap<String, String>>,
    pub token_requests: Mutex<Vec<TokenRequest>>,
    /// Every access and refresh token issued, to look for in logs.
    pub issued: Mutex<Vec<String>>,
    /// Lifetime of new access tokens.
    pub ttl_secs: AtomicU64,
    /// Whether refresh tokens are honoured (false: `invalid_grant`).
    pub refresh_works: AtomicBool,
    /// A scope `tools/call` needs (403 `insufficient_scope` without it).
    pub call_scope: Mutex<Option<String>>,
    codes: Mutex<HashMap<String, Grant>>,
    access: Mutex<HashMap<String, (Instant, Vec<String>)>>,
    refresh: Mutex<HashMap<String, (String, Option<String>)>>,
    counter: AtomicU64,
}

impl AuthState {
    fn next(&self, prefix: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::SeqCst);
        let random: u64 = rand::random();
        format!("{prefix}-{n}-{random:016x}")
    }

    fn issue(&self, scope: Option<String>, refresh_for: Option<&str>) -> Value {
        let access = self.next("at");
        let ttl = self.ttl_secs.load(Ordering::SeqCst);
        let scopes = scope
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        self.access.lock().unwrap().insert(
            access.clone(),
            (Instant::now() + Duration::from_secs(ttl), scopes),
        );
        self.issued.lock().unwrap().push(access.clone());
        let mut body = json!({"access_token": access, "token_type": "Bearer", "expires_in": ttl});
        if let Some(scope) = &scope {
            body["scope"] = json!(scope);
        }
        if let Some(client) = refresh_for {
            let refresh = self.next("rt");
            self.refresh
                .lock()
                .unwrap()
                .insert(refresh.clone(), (client.to_owned(), scope));
            self.issued.lock().unwrap().push(refresh.clone());
            body["refresh_token"] = json!(refresh);
        }
        body
    }

    pub fn grants(&self, grant_type: &str) -> Vec<TokenRequest> {
        self.token_requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.grant_type == grant_type)
            .cloned()
            .collect()
    }
}

impl AuthServer {
    pub async fn start() -> AuthServer {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://127.0.0.1:{}", tcp.local_addr().unwrap().port());
        let state = Arc::new(AuthState {
            base: base.clone(),
            clients: Mutex::default(),
            token_requests: Mutex::default(),
            issued: Mutex::default(),
            ttl_secs: AtomicU64::new(3600),
            refresh_works: AtomicBool::new(true),
            call_scope: Mutex::default(),
            codes: Mutex::default(),
            access: Mutex::default(),
            refresh: Mutex::default(),
            counter: AtomicU64::new(1),
        });
        let stop = CancellationToken::new();
        let guarded = state.clone();
        let mcp = fixture_router(&stop).layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let state = guarded.clone();
                async move {
                    match check_bearer(&state, request).await {
                        Ok(request) => next.run(request).await,
                        Err(refusal) => refusal,
                    }
                }
            },
        ));
        let router = Router::new()
            .route(
                "/.well-known/oauth-protected-resource/mcp",
                get(resource_metadata),
            )
            .route(
                "/.well-known/oauth-protected-resource",
                get(resource_metadata),
            )
            .route(
                "/.well-known/oauth-authorization-server",
                get(server_metadata),
            )
            .route("/register", post(register))
            .route("/authorize", get(authorize))
            .route("/token", post(token))
            .with_state(state.clone())
            .merge(mcp);
        let signal = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(tcp, router)
                .with_graceful_shutdown(async move { signal.cancelled().await })
                .await;
        });
        AuthServer { base, state, stop }
    }

    pub fn mcp_url(&self) -> String {
        format!("{}/mcp", self.base)
    }
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn challenge(state: &AuthState, status: StatusCode, extra: &str) -> Response {
    let header = format!(
        "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"{extra}",
        state.base
    );
    (status, [("www-authenticate", header)]).into_response()
}

/// 401 without a live token; 403 `insufficient_scope` for a `tools/call`
/// whose token lacks `call_scope`.
async fn check_bearer(
    state: &AuthState,
    request: axum::extract::Request,
) -> Result<axum::extract::Request, Response> {
    let token = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let scopes = token.and_then(|t| {
        let access = state.access.lock().unwrap();
        access
            .get(&t)
            .filter(|(until, _)| Instant::now() < *until)
            .map(|(_, scopes)| scopes.clone())
    });
    let Some(scopes) = scopes else {
        return Err(challenge(state, StatusCode::UNAUTHORIZED, ""));
    };
    let wanted = state.call_scope.lock().unwrap().clone();
    let Some(wanted) = wanted else {
        return Ok(request);
    };
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let is_call =
        serde_json::from_slice::<Value>(&bytes).is_ok_and(|v| v["method"] == "tools/call");
    if is_call && !scopes.contains(&wanted) {
        return Err(challenge(
            state,
            StatusCode::FORBIDDEN,
            &format!(", error=\"insufficient_scope\", scope=\"{wanted}\""),
        ));
    }
    Ok(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
}

async fn resource_metadata(State(state): State<Arc<AuthState>>) -> Json<Value> {
    Json(json!({
        "resource": format!("{}/mcp", state.base),
        "authorization_servers": [state.base],
        "scopes_supported": ["mcp", "mcp:write"],
    }))
}

async fn server_metadata(State(state): State<Arc<AuthState>>) -> Json<Value> {
    let base = &state.base;
    Json(json!({
        "issuer": base,
        "authorization_endpoint": format!("{base}/authorize"),
        "token_endpoint": format!("{base}/token"),
        "registration_endpoint": format!("{base}/register"),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
    }))
}

async fn register(State(state): State<Arc<AuthState>>, Json(body): Json<Value>) -> Response {
    let id = state.next("client");
    (
        StatusCode::CREATED,
        Json(json!({
            "client_id": id,
            "redirect_uris": body["redirect_uris"],
            "token_endpoint_auth_method": "none",
        })),
    )
        .into_response()
}

async fn authorize(
    State(state): State<Arc<AuthState>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if q.get("code_challenge_method").map(String::as_str) != Some("S256")
        || !q.contains_key("code_challenge")
        || q.get("response_type").map(String::as_str) != Some("code")
    {
        return (StatusCode::BAD_REQUEST, "PKCE S256 is required").into_response();
    }
    let code = state.next("code");
    state.codes.lock().unwrap().insert(
        code.clone(),
        Grant {
            client_id: q["client_id"].clone(),
            challenge: q["code_challenge"].clone(),
            scope: q.get("scope").cloned(),
        },
    );
    let redirect = format!(
        "{}?code={code}&state={}",
        q["redirect_uri"],
        q.get("state").cloned().unwrap_or_default()
    );
    Redirect::to(&redirect).into_response()
}

/// The client's credentials from Basic or the body, and which way they came.
fn client_auth(
    headers: &HeaderMap,
    form: &HashMap<String, String>,
) -> (Option<(String, String)>, &'static str) {
    if let Some(basic) = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
    {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(basic)
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&decoded).into_owned();
        let (id, secret) = text.split_once(':').unwrap_or_default();
        // RFC 6749 2.3.1: both are form-urlencoded inside Basic.
        return (
            Some((url_decode(id), url_decode(secret))),
            "client_secret_basic",
        );
    }
    match (form.get("client_id"), form.get("client_secret")) {
        (Some(id), Some(secret)) => (Some((id.clone(), secret.clone())), "client_secret_post"),
        _ => (None, "none"),
    }
}

fn url_decode(s: &str) -> String {
    let mut out = Vec::new();
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("00");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn oauth_error(status: StatusCode, error: &str) -> Response {
    (status, Json(json!({"error": error}))).into_response()
}

async fn token(
    State(state): State<Arc<AuthState>>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    let grant_type = form.get("grant_type").cloned().unwrap_or_default();
    let (client, auth_method) = client_auth(&headers, &form);
    let mut record = TokenRequest {
        grant_type: grant_type.clone(),
        auth_method,
        scope: form.get("scope").cloned(),
        resource: form.get("resource").cloned(),
        pkce_ok: None,
    };
    let response = match grant_type.as_str() {
        "client_credentials" => {
            let known = client
                .as_ref()
                .is_some_and(|(id, secret)| state.clients.lock().unwrap().get(id) == Some(secret));
            if known {
                Json(state.issue(form.get("scope").cloned(), None)).into_response()
            } else {
                oauth_error(StatusCode::UNAUTHORIZED, "invalid_client")
            }
        }
        "authorization_code" => {
            let grant = form
                .get("code")
                .and_then(|c| state.codes.lock().unwrap().remove(c));
            match (grant, form.get("code_verifier")) {
                (Some(grant), Some(verifier)) => {
                    let computed = base64::engine::general_purpose::URL_SAFE_NO_PAD
                        .encode(Sha256::digest(verifier.as_bytes()));
                    let ok = computed == grant.challenge;
                    record.pkce_ok = Some(ok);
                    if ok {
                        Json(state.issue(grant.scope, Some(&grant.client_id))).into_response()
                    } else {
                        oauth_error(StatusCode::BAD_REQUEST, "invalid_grant")
                    }
                }
                _ => oauth_error(StatusCode::BAD_REQUEST, "invalid_grant"),
            }
        }
        "refresh_token" => {
            let known = form
                .get("refresh_token")
                .and_then(|r| state.refresh.lock().unwrap().get(r).cloned());
            match known {
                Some((client, scope)) if state.refresh_works.load(Ordering::SeqCst) => {
                    Json(state.issue(scope, Some(&client))).into_response()
                }
                _ => oauth_error(StatusCode::BAD_REQUEST, "invalid_grant"),
            }
        }
        _ => oauth_error(StatusCode::BAD_REQUEST, "unsupported_grant_type"),
    };
    state.token_requests.lock().unwrap().push(record);
    response
}
