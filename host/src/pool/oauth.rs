//! OAuth 2.1 access tokens for HTTP connections, on rmcp's `AuthorizationManager`
//! (discovery of protected-resource and authorization-server metadata, PKCE
//! S256, the `resource` parameter, refresh).
//!
//! - `client-credentials`: unattended; a token is fetched, and fetched again
//!   when it expires or the server rejects it. The client authenticates with
//!   its secret, or (`private_key_jwt`) with an assertion signed by its
//!   private key ([`crate::jwt`]); that token request is the host's own, as
//!   rmcp's builds a second TLS and crypto stack (aws-lc-rs).
//! - `authorization-code`: a user signs in once with `wf-host auth login`
//!   ([`login`]); sessions then refresh unattended, and when refresh is
//!   impossible a call fails naming the command to run.
//!
//! Tokens live in one JSON file (mode 0600), keyed by issuer and resource.
//! Secrets never reach logs, errors or `Debug` output.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use oauth2::TokenResponse;
use rmcp::transport::auth::{
    AuthError, AuthorizationCallback, AuthorizationManager, AuthorizationMetadata,
    ClientCredentialsConfig, CredentialStore, OAuthClientConfig, StoredCredentials,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::{AuthKind, ConnectionConfig, Secret, TokenEndpointAuth};
use crate::jwt::{self, Signer};

/// How long `wf-host auth login` waits for the browser's redirect.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(600);

/// A connection's OAuth settings, normalised (part of the pool fingerprint:
/// the secret only as a hash).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub(crate) struct AuthSettings {
    pub kind: AuthKind,
    pub client_id: Option<String>,
    /// Resolved from `client_secret` or `client_secret_env`.
    pub client_secret: Option<Secret>,
    /// Set when `client_secret_env` names a variable the host does not have.
    pub missing_env: Option<String>,
    pub scopes: Vec<String>,
    pub client_metadata_url: Option<String>,
    pub token_endpoint_auth: TokenEndpointAuth,
    /// `private_key_jwt`: the PEM private key.
    pub private_key: Option<Secret>,
    pub tokens: PathBuf,
}

impl AuthSettings {
    pub(crate) fn from_config(conn: &ConnectionConfig, tokens: &Path) -> Option<AuthSettings> {
        let auth = conn.auth.as_ref()?;
        let from_env = auth.client_secret_env.as_ref().map(|name| {
            std::env::var(name)
                .ok()
                .inspect(|secret| crate::secrets::remember(secret))
                .map(Secret::new)
                .ok_or(name.clone())
        });
        let (client_secret, missing_env) = match from_env {
            Some(Ok(secret)) => (Some(secret), None),
            Some(Err(name)) => (None, Some(name)),
            None => (
                auth.client_secret.as_ref().map(|s| Secret::new(s.expose())),
                None,
            ),
        };
        Some(AuthSettings {
            kind: auth.kind,
            client_id: auth.client_id.clone(),
            client_secret,
            missing_env,
            scopes: auth.scopes.clone(),
            client_metadata_url: auth.client_metadata_url.clone(),
            token_endpoint_auth: auth.token_endpoint_auth,
            private_key: auth.private_key.as_ref().map(|k| Secret::new(k.expose())),
            tokens: tokens.to_owned(),
        })
    }
}

/// Why no token could be had; the message is safe to show anywhere.
#[derive(Debug)]
pub(crate) struct OAuthFailure(pub String);

/// The error code of a call refused for want of scope: the call fails
/// (`unavailable`, naming the scope and what to do), the session stays up.
pub(crate) const SCOPE_REFUSED: i32 = -32043;

/// One session's token source.
pub(crate) struct OAuth {
    connection: Arc<str>,
    settings: AuthSettings,
    resource: String,
    /// `authorization-code`: whether tokens were stored. Without them,
    /// requests go out unauthenticated and a 401 says to sign in.
    signed_in: bool,
    // Held across a token request, so concurrent requests wait for one
    // refresh instead of each starting their own.
    manager: tokio::sync::Mutex<AuthorizationManager>,
    /// Scopes that 403 `insufficient_scope` answers asked for, on top of
    /// the configured ones.
    extra_scopes: Mutex<Vec<String>>,
    /// The token file entry, where `authorization-code` remembers the scopes
    /// refused calls asked for, for the next `wf-host auth login`.
    store: FileStore,
    /// `private_key_jwt`: the host's own token requests.
    assertion: Option<AssertionClient>,
}

impl OAuth {
    /// Discovers the authorization server of `url` and readies tokens: for
    /// `authorization-code`, the stored ones, if any.
    ///
    /// # Errors
    /// A message for the connect error (never holding a secret).
    pub(crate) async fn start(
        connection: Arc<str>,
        url: &str,
        settings: &AuthSettings,
        http: reqwest::Client,
        tls: &crate::tls::TlsFiles,
    ) -> Result<OAuth, String> {
        if let Some(name) = &settings.missing_env {
            return Err(format!(
                "`auth.client_secret_env`: the host has no variable `{name}`"
            ));
        }
        let (mut manager, key, metadata) = discover(url, http.clone(), settings, None).await?;
        let store = FileStore::new(&settings.tokens, key);
        manager.set_credential_store(store.clone());
        let mut signed_in = true;
        let mut assertion = None;
        match settings.kind {
            AuthKind::ClientCredentials
                if settings.token_endpoint_auth == TokenEndpointAuth::PrivateKeyJwt =>
            {
                // Its own client, which follows no redirect: a redirected
                // token request would carry the assertion to another host.
                let http = super::client::client_without_redirects(tls)?;
                assertion = Some(AssertionClient::new(settings, &metadata, url, http)?);
            }
            AuthKind::ClientCredentials => {
                let config = cc_config(settings, url, &[]);
                manager
                    .configure_client_credentials(&config)
                    .map_err(|e| format!("OAuth: {e}"))?;
            }
            AuthKind::AuthorizationCode => {
                signed_in = manager
                    .initialize_from_store()
                    .await
                    .map_err(|e| format!("OAuth token store: {e}"))?;
                if let (Some(id), Some(secret)) = (&settings.client_id, &settings.client_secret) {
                    manager
                        .configure_client(
                            OAuthClientConfig::new(id.clone(), url.to_owned())
                                .with_client_secret(secret.expose().to_owned()),
                        )
                        .map_err(|e| format!("OAuth: {e}"))?;
                }
            }
        }
        Ok(OAuth {
            connection,
            settings: settings.clone(),
            resource: url.to_owned(),
            signed_in,
            manager: tokio::sync::Mutex::new(manager),
            extra_scopes: Mutex::default(),
            store,
            assertion,
        })
    }

    /// A usable access token: the stored one, refreshed or fetched anew when
    /// it expired. `None` before anyone signed in (authorization code): the
    /// server may not need one for everything.
    pub(crate) async fn token(&self) -> Result<Option<String>, OAuthFailure> {
        if !self.signed_in {
            return Ok(None);
        }
        if let Some(assertion) = &self.assertion {
            return assertion.token(None, &self.scopes()).await.map(Some);
        }
        let manager = self.manager.lock().await;
        match manager.get_access_token().await {
            Ok(token) => Ok(Some(token)),
            Err(AuthError::AuthorizationRequired) => self.fetch(&manager).await.map(Some),
            Err(e) => Err(self.failure(&e)),
        }
    }

    /// A new token after the server answered 401 with `challenge` to a
    /// request that carried `rejected`.
    pub(crate) async fn renew(
        &self,
        rejected: Option<&str>,
        challenge: &str,
    ) -> Result<String, OAuthFailure> {
        let wants = |why: &str| match challenge_scope(challenge) {
            Some(scope) => format!("{why}; the server wants scope `{scope}`"),
            None => why.to_owned(),
        };
        if !self.signed_in && self.settings.kind == AuthKind::AuthorizationCode {
            // The sign-in starts from this challenge (its scope): a person
            // who reads "run `wf-host auth login`" needs to know no more.
            let at = FileStore::challenge_of(&self.settings.tokens, &self.resource);
            if let Err(e) = at.remember(WANTED_CHALLENGE, json!(challenge)).await {
                tracing::warn!(connection = %self.connection, "cannot remember the server's challenge: {e}");
            }
            return Err(OAuthFailure(relogin(
                &self.connection,
                &wants("the server wants OAuth and no one signed in"),
            )));
        }
        if let Some(assertion) = &self.assertion {
            return assertion.token(rejected, &self.scopes()).await;
        }
        let manager = self.manager.lock().await;
        // Another request may have renewed it while we waited.
        if let Ok(token) = manager.get_access_token().await
            && Some(token.as_str()) != rejected
        {
            return Ok(token);
        }
        match self.settings.kind {
            AuthKind::ClientCredentials => self.fetch(&manager).await,
            AuthKind::AuthorizationCode => match manager.refresh_token().await {
                Ok(token) => Ok(token.access_token().secret().to_owned()),
                Err(AuthError::AuthorizationRequired | AuthError::TokenRefreshRejected(_)) => {
                    Err(OAuthFailure(relogin(
                        &self.connection,
                        &wants("the access token was rejected and cannot be refreshed"),
                    )))
                }
                Err(e) => Err(self.failure(&e)),
            },
        }
    }

    /// A token with `scope` added, after a 403 `insufficient_scope`.
    pub(crate) async fn step_up(&self, scope: Option<&str>) -> Result<String, OAuthFailure> {
        let wanted: Vec<String> = scope
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        match self.settings.kind {
            AuthKind::ClientCredentials => {
                {
                    let mut extra = self.extra_scopes.lock().unwrap_or_else(|p| p.into_inner());
                    for s in &wanted {
                        if !extra.contains(s) {
                            extra.push(s.clone());
                        }
                    }
                }
                if let Some(assertion) = &self.assertion {
                    return assertion.fetch(&self.scopes()).await;
                }
                let manager = self.manager.lock().await;
                self.fetch(&manager).await
            }
            AuthKind::AuthorizationCode => {
                // Asked for at the next sign-in, with no config edit.
                if let Err(e) = self.store.remember_scopes(&wanted).await {
                    tracing::warn!(connection = %self.connection, "cannot remember the scope a call asked for: {e}");
                }
                Err(OAuthFailure(self.scope_refusal(scope)))
            }
        }
    }

    /// Whether a person signs in for this connection's tokens.
    pub(crate) fn signs_in(&self) -> bool {
        self.settings.kind == AuthKind::AuthorizationCode
    }

    /// What a call refused for want of `scope` fails with.
    pub(crate) fn scope_refusal(&self, scope: Option<&str>) -> String {
        let scope = scope.unwrap_or("more");
        match self.settings.kind {
            AuthKind::AuthorizationCode => relogin(
                &self.connection,
                &format!(
                    "the server refused this call: it wants scope `{scope}`, which the sign-in did not grant; it is asked for at the next sign-in"
                ),
            ),
            AuthKind::ClientCredentials => format!(
                "the server refused this call: it wants scope `{scope}`, and a token asked with it was refused too (the authorization server may not grant it to this client)"
            ),
        }
    }

    /// Fetches a token with the client's credentials, or says to sign in.
    async fn fetch(&self, manager: &AuthorizationManager) -> Result<String, OAuthFailure> {
        match self.settings.kind {
            AuthKind::ClientCredentials => {
                let config = cc_config(&self.settings, &self.resource, &self.extra_scopes());
                let token = manager
                    .exchange_client_credentials(&config)
                    .await
                    .map_err(|e| self.failure(&e))?;
                tracing::debug!(connection = %self.connection, "fetched an OAuth access token (client credentials)");
                Ok(token.access_token().secret().to_owned())
            }
            AuthKind::AuthorizationCode => Err(OAuthFailure(relogin(
                &self.connection,
                "the OAuth tokens expired and cannot be refreshed",
            ))),
        }
    }

    fn failure(&self, e: &AuthError) -> OAuthFailure {
        OAuthFailure(format!("OAuth: {e}"))
    }

    /// Scopes refused calls asked for since (client credentials).
    fn extra_scopes(&self) -> Vec<String> {
        self.extra_scopes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every scope a client-credentials token request asks for.
    fn scopes(&self) -> Vec<String> {
        merge_scopes(&self.settings.scopes, &self.extra_scopes())
    }
}

/// The configured scopes, then the others wanted, once each.
fn merge_scopes(configured: &[String], extra: &[String]) -> Vec<String> {
    let mut scopes = configured.to_vec();
    scopes.extend(extra.iter().filter(|s| !configured.contains(s)).cloned());
    scopes
}

/// The largest token endpoint answer read.
const TOKEN_ANSWER_LIMIT: usize = 64 * 1024;
/// How long a token request may take, answer included.
const TOKEN_TIMEOUT: Duration = Duration::from_secs(30);

/// `private_key_jwt` token requests (RFC 7523 section 2.2, as SEP-1046 has
/// them): `client_credentials` with a signed assertion and no `client_id`,
/// and the token kept in memory until it nears its expiry.
struct AssertionClient {
    http: reqwest::Client,
    client_id: String,
    signer: Signer,
    token_endpoint: String,
    /// The authorization server's issuer identifier: the assertion's `aud`.
    audience: String,
    resource: String,
    /// The token and when to stop using it; held across a token request so
    /// that concurrent callers wait for one.
    cached: tokio::sync::Mutex<Option<(String, Option<Instant>)>>,
}

impl AssertionClient {
    fn new(
        settings: &AuthSettings,
        metadata: &AuthorizationMetadata,
        resource: &str,
        http: reqwest::Client,
    ) -> Result<AssertionClient, String> {
        let key = settings
            .private_key
            .as_ref()
            .ok_or("`auth.private_key` is not set")?;
        let signer =
            Signer::from_pem(key.expose()).map_err(|e| format!("`auth.private_key`: {e}"))?;
        let listed = |field: &str| {
            metadata
                .additional_fields
                .get(field)
                .and_then(serde_json::Value::as_array)
                .map(|values| {
                    values
                        .iter()
                        .filter_map(serde_json::Value::as_str)
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
        };
        if let Some(methods) = listed("token_endpoint_auth_methods_supported")
            && !methods.iter().any(|m| m == "private_key_jwt")
        {
            return Err(format!(
                "OAuth: the authorization server does not take `private_key_jwt` (it takes {})",
                methods.join(", ")
            ));
        }
        if let Some(algs) = listed("token_endpoint_auth_signing_alg_values_supported")
            && !algs.iter().any(|a| a == signer.alg())
        {
            return Err(format!(
                "OAuth: the authorization server does not take {} client assertions (it takes {}); `auth.private_key` needs another kind of key",
                signer.alg(),
                algs.join(", ")
            ));
        }
        let audience = metadata
            .issuer
            .clone()
            .ok_or("OAuth: the authorization server's metadata names no `issuer`, which a client assertion is addressed to")?;
        let endpoint = reqwest::Url::parse(&metadata.token_endpoint)
            .map_err(|e| format!("OAuth: the token endpoint is not a URL: {e}"))?;
        let loopback = |u: &reqwest::Url| {
            u.host_str().is_some_and(|host| {
                host == "localhost"
                    || host
                        .trim_matches(['[', ']'])
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            })
        };
        let resource_url = reqwest::Url::parse(resource).map_err(|e| format!("OAuth: {e}"))?;
        if endpoint.scheme() != "https"
            && !(endpoint.scheme() == "http" && loopback(&endpoint) && loopback(&resource_url))
        {
            return Err(format!(
                "OAuth: the token endpoint `{endpoint}` is not https (plain http is taken only when it and the MCP server are both on loopback)"
            ));
        }
        Ok(AssertionClient {
            http,
            client_id: settings.client_id.clone().unwrap_or_default(),
            signer,
            token_endpoint: metadata.token_endpoint.clone(),
            audience,
            resource: resource.to_owned(),
            cached: tokio::sync::Mutex::new(None),
        })
    }

    /// The kept token, unless it is `rejected` or near its expiry; else a
    /// new one.
    async fn token(
        &self,
        rejected: Option<&str>,
        scopes: &[String],
    ) -> Result<String, OAuthFailure> {
        let mut cached = self.cached.lock().await;
        if let Some((token, until)) = cached.as_ref()
            && Some(token.as_str()) != rejected
            && until.is_none_or(|until| Instant::now() < until)
        {
            return Ok(token.clone());
        }
        let (token, until) = self.request(scopes).await?;
        *cached = Some((token.clone(), until));
        Ok(token)
    }

    /// A new token, whatever is kept (after a refusal for scope).
    async fn fetch(&self, scopes: &[String]) -> Result<String, OAuthFailure> {
        let mut cached = self.cached.lock().await;
        let (token, until) = self.request(scopes).await?;
        *cached = Some((token.clone(), until));
        Ok(token)
    }

    async fn request(&self, scopes: &[String]) -> Result<(String, Option<Instant>), OAuthFailure> {
        let failed = |why: String| OAuthFailure(format!("OAuth (private_key_jwt): {why}"));
        let assertion = self
            .signer
            .assertion(&self.client_id, &self.audience)
            .map_err(failed)?;
        // No `client_id`: the assertion's subject names the client
        // (RFC 7523 section 3).
        let form = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("grant_type", "client_credentials")
                .append_pair("client_assertion_type", jwt::ASSERTION_TYPE)
                .append_pair("client_assertion", &assertion)
                .append_pair("resource", &self.resource);
            if !scopes.is_empty() {
                form.append_pair("scope", &scopes.join(" "));
            }
            form.finish()
        };
        let asked = Instant::now();
        let mut answer = self
            .http
            .post(&self.token_endpoint)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(form)
            .timeout(TOKEN_TIMEOUT)
            .send()
            .await
            .map_err(|e| failed(format!("the token request failed: {e}")))?;
        let status = answer.status();
        if status.is_redirection() {
            return Err(failed(format!(
                "the token endpoint answered {status}, a redirect, which a token request does not follow"
            )));
        }
        let mut body = Vec::new();
        while let Some(chunk) = answer
            .chunk()
            .await
            .map_err(|e| failed(format!("the token answer broke off: {e}")))?
        {
            if body.len() + chunk.len() > TOKEN_ANSWER_LIMIT {
                return Err(failed(format!(
                    "the token answer is over {} KiB",
                    TOKEN_ANSWER_LIMIT / 1024
                )));
            }
            body.extend_from_slice(&chunk);
        }
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let text = |field: &str| json.get(field).and_then(serde_json::Value::as_str);
        if !status.is_success() {
            let why = match (text("error"), text("error_description")) {
                (Some(error), Some(description)) => format!("{error}: {description}"),
                (Some(error), None) => error.to_owned(),
                _ => format!("HTTP {status}"),
            };
            return Err(failed(format!(
                "the authorization server refused the client assertion ({why})"
            )));
        }
        let token = text("access_token")
            .filter(|t| !t.is_empty())
            .ok_or_else(|| failed("the token answer holds no `access_token`".to_owned()))?;
        if text("token_type").is_some_and(|t| !t.eq_ignore_ascii_case("bearer")) {
            return Err(failed(format!(
                "the token is of type `{}`, not Bearer",
                text("token_type").unwrap_or_default()
            )));
        }
        // Renewed before it expires: at half its life, or a minute before.
        // (Not added to the redactor, like every access token: it never
        // reaches a log, and the redactor only grows.)
        let until = json
            .get("expires_in")
            .and_then(serde_json::Value::as_u64)
            .and_then(|secs| {
                let life = Duration::from_secs(secs);
                asked.checked_add(life.saturating_sub((life / 2).min(Duration::from_secs(60))))
            });
        tracing::debug!(client_id = %self.client_id, alg = self.signer.alg(), "fetched an OAuth access token (private_key_jwt)");
        Ok((token.to_owned(), until))
    }
}

/// The `scope` parameter of a `WWW-Authenticate: Bearer …` challenge.
fn challenge_scope(challenge: &str) -> Option<&str> {
    let mut rest = challenge;
    while let Some(at) = rest.find("scope=\"") {
        let before = rest[..at].chars().next_back();
        let value = &rest[at + "scope=\"".len()..];
        if before.is_none_or(|c| c == ' ' || c == ',') {
            return value.split_once('"').map(|(scope, _)| scope);
        }
        rest = value;
    }
    None
}

/// The `WWW-Authenticate` of a 401 the server answers a request without a
/// token with (a `ping`), if it does.
async fn challenge_of_probe(http: &reqwest::Client, url: &str) -> Option<String> {
    let probe = json!({"jsonrpc": "2.0", "id": "wf-host-sign-in", "method": "ping"});
    let response = http
        .post(url)
        .header(
            reqwest::header::ACCEPT,
            "application/json, text/event-stream",
        )
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(probe.to_string())
        .timeout(std::time::Duration::from_secs(30))
        .send()
        .await
        .inspect_err(|e| tracing::debug!("no challenge from {url}: {e}"))
        .ok()?;
    if response.status() != reqwest::StatusCode::UNAUTHORIZED {
        return None;
    }
    let challenge = response
        .headers()
        .get(reqwest::header::WWW_AUTHENTICATE)?
        .to_str()
        .ok()?
        .to_owned();
    tracing::debug!("the server's challenge before sign-in: {challenge}");
    Some(challenge)
}

fn relogin(connection: &str, why: &str) -> String {
    format!("{why}; run `wf-host auth login {connection}`")
}

fn cc_config(settings: &AuthSettings, resource: &str, extra: &[String]) -> ClientCredentialsConfig {
    let scopes = merge_scopes(&settings.scopes, extra);
    ClientCredentialsConfig::ClientSecret {
        client_id: settings.client_id.clone().unwrap_or_default(),
        client_secret: settings
            .client_secret
            .as_ref()
            .map(|s| s.expose().to_owned())
            .unwrap_or_default(),
        scopes,
        resource: Some(resource.to_owned()),
    }
}

/// A manager for `url` with its discovered metadata, the token store key
/// (issuer and resource), and the metadata.
async fn discover(
    url: &str,
    http: reqwest::Client,
    settings: &AuthSettings,
    challenge: Option<&str>,
) -> Result<(AuthorizationManager, String, AuthorizationMetadata), String> {
    crate::tls::install_tls_provider();
    let mut manager = AuthorizationManager::new(url)
        .await
        .map_err(|e| format!("OAuth: {e}"))?;
    manager
        .with_client(http)
        .map_err(|e| format!("OAuth: {e}"))?;
    let resolution = manager
        .resolve_metadata_from_challenge(challenge)
        .await
        .map_err(|e| format!("OAuth discovery failed: {e}"))?;
    let mut metadata: AuthorizationMetadata = resolution.metadata;
    if settings.client_secret.is_some() {
        // rmcp picks Basic or the request body from what the server
        // advertises; we use the configured method, so advertise just that.
        metadata.additional_fields.insert(
            "token_endpoint_auth_methods_supported".into(),
            json!([settings.token_endpoint_auth.as_str()]),
        );
    }
    let issuer = metadata
        .issuer
        .clone()
        .unwrap_or_else(|| metadata.token_endpoint.clone());
    manager.set_metadata(metadata.clone());
    Ok((manager, format!("{issuer} {url}"), metadata))
}

/// The token file: `{ "<issuer> <resource>": credentials }`, mode 0600. An
/// entry also keeps (as `wf_host_wanted_scopes`) the scopes refused calls
/// asked for, which outlive its credentials.
#[derive(Clone)]
struct FileStore {
    path: PathBuf,
    key: String,
}

/// The field of an entry that keeps the scopes refused calls asked for.
const WANTED_SCOPES: &str = "wf_host_wanted_scopes";
/// The field of a resource's challenge entry: the `WWW-Authenticate` of the
/// last 401 before anyone signed in.
const WANTED_CHALLENGE: &str = "wf_host_challenge";

/// Serialises read-modify-write of token files within this process.
static FILE_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

type TokenFile = BTreeMap<String, serde_json::Value>;

impl FileStore {
    fn new(path: &Path, key: String) -> FileStore {
        FileStore {
            path: path.to_owned(),
            key,
        }
    }

    fn read(&self) -> Result<TokenFile, AuthError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                AuthError::CredentialStoreError(format!(
                    "token store `{}` is damaged: {e}",
                    self.path.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TokenFile::new()),
            Err(e) => Err(AuthError::CredentialStoreError(format!(
                "cannot read token store `{}`: {e}",
                self.path.display()
            ))),
        }
    }

    fn write(&self, file: &TokenFile) -> Result<(), AuthError> {
        let failed = |e: &dyn std::fmt::Display| {
            AuthError::CredentialStoreError(format!(
                "cannot write token store `{}`: {e}",
                self.path.display()
            ))
        };
        let bytes = serde_json::to_vec_pretty(file).map_err(|e| failed(&e))?;
        write_private(&self.path, &bytes).map_err(|e| failed(&e))
    }

    fn update(&self, change: impl FnOnce(&mut TokenFile)) -> Result<(), AuthError> {
        let mut file = self.read()?;
        change(&mut file);
        self.write(&file)
    }

    /// The entry that keeps a resource's last challenge (it is known before
    /// the authorization server, which the credentials' key names).
    fn challenge_of(path: &Path, resource: &str) -> FileStore {
        FileStore::new(path, format!("challenge {resource}"))
    }

    /// Sets `field` of this entry.
    async fn remember(&self, field: &str, value: serde_json::Value) -> Result<(), AuthError> {
        let _guard = FILE_LOCK.lock().await;
        self.update(|file| {
            file.entry(self.key.clone()).or_insert_with(|| json!({}))[field] = value;
        })
    }

    /// `field` of this entry.
    async fn recall(&self, field: &str) -> Result<Option<serde_json::Value>, AuthError> {
        let _guard = FILE_LOCK.lock().await;
        Ok(self
            .read()?
            .get(&self.key)
            .and_then(|e| e.get(field))
            .cloned())
    }

    /// The scopes refused calls asked for.
    async fn wanted_scopes(&self) -> Result<Vec<String>, AuthError> {
        Ok(self
            .recall(WANTED_SCOPES)
            .await?
            .and_then(|w| serde_json::from_value(w).ok())
            .unwrap_or_default())
    }

    /// Adds `scopes` to those the next sign-in asks for.
    async fn remember_scopes(&self, scopes: &[String]) -> Result<(), AuthError> {
        if scopes.is_empty() {
            return Ok(());
        }
        let _guard = FILE_LOCK.lock().await;
        self.update(|file| {
            let entry = file.entry(self.key.clone()).or_insert_with(|| json!({}));
            let mut wanted: Vec<String> = entry
                .get(WANTED_SCOPES)
                .and_then(|w| serde_json::from_value(w.clone()).ok())
                .unwrap_or_default();
            for scope in scopes {
                if !wanted.contains(scope) {
                    wanted.push(scope.clone());
                }
            }
            entry[WANTED_SCOPES] = json!(wanted);
        })
    }
}

#[async_trait]
impl CredentialStore for FileStore {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let _guard = FILE_LOCK.lock().await;
        match self.read()?.remove(&self.key) {
            // An entry with remembered scopes only holds no credentials.
            Some(entry) if entry.get("client_id").is_some() => {
                serde_json::from_value(entry).map(Some).map_err(|e| {
                    AuthError::CredentialStoreError(format!(
                        "token store `{}` is damaged: {e}",
                        self.path.display()
                    ))
                })
            }
            _ => Ok(None),
        }
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let _guard = FILE_LOCK.lock().await;
        let mut entry = serde_json::to_value(credentials)
            .map_err(|e| AuthError::CredentialStoreError(e.to_string()))?;
        self.update(|file| {
            if let Some(wanted) = file.get(&self.key).and_then(|e| e.get(WANTED_SCOPES)) {
                entry[WANTED_SCOPES] = wanted.clone();
            }
            file.insert(self.key.clone(), entry);
        })
    }

    async fn clear(&self) -> Result<(), AuthError> {
        let _guard = FILE_LOCK.lock().await;
        self.update(
            |file| match file.get(&self.key).and_then(|e| e.get(WANTED_SCOPES)) {
                Some(wanted) => {
                    let kept = json!({ WANTED_SCOPES: wanted });
                    file.insert(self.key.clone(), kept);
                }
                None => {
                    file.remove(&self.key);
                }
            },
        )
    }
}

/// Writes `bytes` to `path` atomically, readable by the owner only.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    // A temp file is created with mode 0600.
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// `wf-host auth login`: the authorization-code flow for `connection`, once.
/// Calls `show_url` with the authorization URL, waits for the redirect on a
/// loopback listener, exchanges the code and stores the tokens in `tokens`.
///
/// # Errors
/// A message naming what failed (never a secret).
pub async fn login(
    connection: &str,
    conn: &ConnectionConfig,
    base_dir: &Path,
    tokens: &Path,
    show_url: impl FnOnce(&str),
) -> Result<(), String> {
    let Some(url) = &conn.url else {
        return Err(format!(
            "connection `{connection}` is not an HTTP connection (`url`)"
        ));
    };
    let settings = AuthSettings::from_config(conn, tokens).ok_or_else(|| {
        format!("connection `{connection}` has no `[connections.{connection}.auth]`")
    })?;
    if settings.kind != AuthKind::AuthorizationCode {
        return Err(format!(
            "connection `{connection}` uses `kind = \"client-credentials\"`, which needs no login"
        ));
    }
    if let Some(name) = &settings.missing_env {
        return Err(format!(
            "connection `{connection}`: `auth.client_secret_env`: the host has no variable `{name}`"
        ));
    }
    let http = super::client::client(&conn.tls_files(base_dir))
        .map_err(|e| format!("connection `{connection}`: {e}"))?;
    let challenge = FileStore::challenge_of(tokens, url)
        .recall(WANTED_CHALLENGE)
        .await
        .map_err(|e| format!("connection `{connection}`: {e}"))?;
    // Signing in before any call: the server's challenge (and the scope it
    // names) from one request without a token, as a call would get it.
    let challenge = match challenge.as_ref().and_then(serde_json::Value::as_str) {
        Some(challenge) => Some(challenge.to_owned()),
        None => challenge_of_probe(&http, url).await,
    };
    let (mut manager, key, metadata) = discover(url, http, &settings, challenge.as_deref())
        .await
        .map_err(|e| format!("connection `{connection}`: {e}"))?;
    // Whether the authorization server takes a client metadata document's
    // URL as a client id (SEP-991).
    let cimd = metadata
        .additional_fields
        .get("client_id_metadata_document_supported")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    let store = FileStore::new(tokens, key);
    let remembered = store
        .wanted_scopes()
        .await
        .map_err(|e| format!("connection `{connection}`: {e}"))?;
    manager.set_credential_store(store);
    // The scopes the server named (its challenge, else its resource
    // metadata's `scopes_supported`), the configured ones, and those refused
    // calls asked for since.
    let mut wanted = manager.select_initial_scopes(&[]).await;
    for scope in settings.scopes.iter().chain(&remembered) {
        if !wanted.contains(scope) {
            wanted.push(scope.clone());
        }
    }

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| format!("cannot listen for the redirect on 127.0.0.1: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("cannot listen for the redirect: {e}"))?
        .port();
    let redirect = format!("http://127.0.0.1:{port}/callback");
    let scopes: Vec<&str> = wanted.iter().map(String::as_str).collect();
    let oauth_error = |e: AuthError| format!("connection `{connection}`: OAuth: {e}");
    match (&settings.client_id, &settings.client_metadata_url) {
        (Some(id), _) => {
            let mut client =
                OAuthClientConfig::new(id.clone(), redirect.clone()).with_scopes(wanted.clone());
            if let Some(secret) = &settings.client_secret {
                client = client.with_client_secret(secret.expose().to_owned());
            }
            manager.configure_client(client).map_err(oauth_error)?;
        }
        // SEP-991: the document's URL is the client id, no registration.
        (None, Some(document)) if cimd => {
            let client = OAuthClientConfig::new(document.clone(), redirect.clone())
                .with_scopes(wanted.clone());
            manager.configure_client(client).map_err(oauth_error)?;
        }
        (None, _) => {
            manager
                .register_client("wf-host", &redirect, &scopes)
                .await
                .map_err(oauth_error)?;
        }
    }
    let authorize = manager
        .get_authorization_url(&scopes)
        .await
        .map_err(oauth_error)?;
    show_url(&authorize);

    let callback = tokio::time::timeout(LOGIN_TIMEOUT, accept_redirect(&listener, port))
        .await
        .map_err(|_| format!("no redirect came back within {}s", LOGIN_TIMEOUT.as_secs()))??;
    manager
        .exchange_code_for_token_with_issuer(
            &callback.code,
            &callback.csrf_token,
            callback.issuer.as_deref(),
        )
        .await
        .map_err(oauth_error)?;
    Ok(())
}

/// Answers the one redirect to `/callback` and returns its parameters.
async fn accept_redirect(
    listener: &tokio::net::TcpListener,
    port: u16,
) -> Result<AuthorizationCallback, String> {
    loop {
        let (mut stream, _) = listener
            .accept()
            .await
            .map_err(|e| format!("accepting the redirect: {e}"))?;
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 64 * 1024 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        let text = String::from_utf8_lossy(&request);
        let target = text
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("GET "))
            .and_then(|rest| rest.split(' ').next())
            .unwrap_or_default()
            .to_owned();
        if !target.starts_with("/callback") {
            let _ = stream
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
            continue;
        }
        let parsed =
            AuthorizationCallback::from_redirect_url(&format!("http://127.0.0.1:{port}{target}"));
        let (status, body) = match &parsed {
            Ok(_) => ("200 OK", "Signed in. You can close this window."),
            Err(_) => ("400 Bad Request", "The sign-in did not complete."),
        };
        let response = format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
        return parsed.map_err(|e| format!("the redirect carried no authorization code: {e}"));
    }
}
