//! Webhooks: `[workflows.<name>.webhook]` compiled, and what a delivery to
//! `POST /hooks/<name>` does (the HTTP side is in `rpc`).
//!
//! A delivery is verified before anything else: its signature is an
//! HMAC-SHA256 of the raw body (GitHub's `X-Hub-Signature-256`, a plain
//! header of hex) or of `id.timestamp.body` (Standard Webhooks, with a
//! five-minute window on the timestamp), compared in constant time, with a
//! secret read from the environment or a file when the config loads, never
//! from the config text. Turning verification off takes `verify = "none"`
//! written out. A delivery that names itself (`X-GitHub-Delivery`,
//! `webhook-id`, or `delivery_header`) starts its run with the idempotency key
//! `webhook:<id>`, so a redelivery gets the first run again, as long as the
//! store keeps that run. (The id is not signed in GitHub's scheme, nor in a
//! plain HMAC: a captured delivery replayed under a new id starts a new run.
//! Standard Webhooks signs the id and the time, and refuses a replay after
//! five minutes.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{Map, Value, json};
use sha2::Sha256;

use super::definition::DefinitionError;
use super::expr::Expr;
use super::{WorkflowError, Workflows};
use crate::config::{Config, WebhookConfig};

/// Default largest body of a delivery.
pub const DEFAULT_MAX_INPUT: u64 = 1 << 20;
/// How far a Standard Webhooks timestamp may be from now.
const TOLERANCE: Duration = Duration::from_secs(5 * 60);
/// Longest delivery id kept.
const MAX_DELIVERY_ID: usize = 200;

/// How deliveries are verified.
#[derive(Clone)]
pub enum Verify {
    /// `X-Hub-Signature-256: sha256=<hex>` over the body.
    GitHub(Secret),
    /// `webhook-signature: v1,<base64> …` over `id.timestamp.body`.
    StandardWebhooks(Secret),
    /// `<header>: [sha256=]<hex>` over the body.
    Hmac { header: String, secret: Secret },
    /// `verify = "none"`.
    None,
}

/// A webhook secret: never printed.
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// A compiled webhook of one workflow.
#[derive(Clone)]
pub struct Webhook {
    pub workflow: String,
    pub verify: Verify,
    /// The header that names a delivery, lower-case.
    pub delivery_header: Option<String>,
    pub input: Option<Expr>,
    pub max_input: u64,
}

impl Webhook {
    /// Compiles `[workflows.<workflow>.webhook]`, reading its secret.
    ///
    /// # Errors
    /// A [`DefinitionError`] naming the workflow: an unknown signature
    /// scheme, no secret (or one that cannot be read), a bad jq `input`.
    pub fn compile(
        workflow: &str,
        c: &WebhookConfig,
        config: &Config,
    ) -> Result<Webhook, DefinitionError> {
        let err = |message: String| DefinitionError::Workflow {
            workflow: workflow.to_owned(),
            message: format!("webhook: {message}"),
        };
        let secret = || -> Result<Secret, DefinitionError> {
            let text = match (&c.secret_env, &c.secret_file) {
                (Some(_), Some(_)) => {
                    return Err(err(
                        "sets both `secret_env` and `secret_file`; pick one".into()
                    ));
                }
                (Some(name), None) => std::env::var(name).map_err(|_| {
                    err(format!(
                        "the environment variable `{name}` (`secret_env`) is not set"
                    ))
                })?,
                (None, Some(path)) => {
                    let path = config.resolve(path);
                    std::fs::read_to_string(&path).map_err(|e| {
                        err(format!(
                            "cannot read `secret_file` `{}`: {e}",
                            path.display()
                        ))
                    })?
                }
                (None, None) => {
                    return Err(err(
                        "needs its secret: `secret_env = \"NAME\"` or `secret_file = \"PATH\"` (never in the config itself)"
                            .into(),
                    ));
                }
            };
            let text = text.trim_end_matches(['\r', '\n']);
            if text.is_empty() {
                return Err(err("the secret is empty".into()));
            }
            crate::secrets::remember(text);
            Ok(Secret(text.as_bytes().into()))
        };
        let verify = match (c.verify.as_deref(), c.signature.as_deref()) {
            (Some("none"), None) => {
                if c.secret_env.is_some() || c.secret_file.is_some() {
                    return Err(err("`verify = \"none\"` uses no secret: remove it".into()));
                }
                Verify::None
            }
            (Some("none"), Some(_)) => {
                return Err(err(
                    "sets both `verify = \"none\"` and `signature`; pick one".into(),
                ));
            }
            (Some(other), _) => {
                return Err(err(format!(
                    "`verify = \"{other}\"`: the only value is `none` (verification is on unless it is written out)"
                )));
            }
            (None, Some("github")) => Verify::GitHub(secret()?),
            (None, Some("standard-webhooks")) => {
                let secret = secret()?;
                // `whsec_<base64>`: the key is the decoded part.
                let text = std::str::from_utf8(&secret.0).unwrap_or_default();
                let key = base64::engine::general_purpose::STANDARD
                    .decode(text.strip_prefix("whsec_").unwrap_or(text))
                    .map_err(|_| err("a Standard Webhooks secret is `whsec_` and base64".into()))?;
                Verify::StandardWebhooks(Secret(key.into()))
            }
            (None, Some("hmac-sha256")) => Verify::Hmac {
                header: c
                    .header
                    .as_deref()
                    .unwrap_or("x-signature")
                    .to_ascii_lowercase(),
                secret: secret()?,
            },
            (None, Some(other)) => {
                return Err(err(format!(
                    "`signature = \"{other}\"`: use `github`, `standard-webhooks` or `hmac-sha256`"
                )));
            }
            (None, None) => {
                return Err(err(
                    "needs `signature` (`github`, `standard-webhooks` or `hmac-sha256`), or `verify = \"none\"` to accept unsigned deliveries"
                        .into(),
                ));
            }
        };
        if c.header.is_some() && !matches!(verify, Verify::Hmac { .. }) {
            return Err(err("`header` is for `signature = \"hmac-sha256\"`".into()));
        }
        let delivery_header = c
            .delivery_header
            .as_deref()
            .map(str::to_ascii_lowercase)
            .or_else(|| match verify {
                Verify::GitHub(_) => Some("x-github-delivery".into()),
                Verify::StandardWebhooks(_) => Some("webhook-id".into()),
                _ => None,
            });
        let input = c
            .input
            .as_deref()
            .map(Expr::compile)
            .transpose()
            .map_err(|e| err(format!("`input`: {e}")))?;
        Ok(Webhook {
            workflow: workflow.to_owned(),
            verify,
            delivery_header,
            input,
            max_input: c.max_input.map_or(DEFAULT_MAX_INPUT, |b| b.as_u64()),
        })
    }

    /// Checks a delivery's signature.
    ///
    /// # Errors
    /// What is wrong, for the 401's body: a missing header, a bad
    /// signature, a stale timestamp.
    pub fn verify(&self, headers: &BTreeMap<String, String>, body: &[u8]) -> Result<(), String> {
        let header = |name: &str| {
            headers
                .get(name)
                .map(String::as_str)
                .ok_or_else(|| format!("missing `{name}` header"))
        };
        match &self.verify {
            Verify::None => Ok(()),
            Verify::GitHub(secret) => {
                let given = header("x-hub-signature-256")?;
                let hex_sig = given
                    .strip_prefix("sha256=")
                    .ok_or("`x-hub-signature-256` is not `sha256=<hex>`")?;
                check_hex(secret, &[body], hex_sig)
            }
            Verify::Hmac {
                header: name,
                secret,
            } => {
                let given = header(name)?;
                check_hex(
                    secret,
                    &[body],
                    given.strip_prefix("sha256=").unwrap_or(given),
                )
            }
            Verify::StandardWebhooks(secret) => {
                let id = header("webhook-id")?;
                let timestamp = header("webhook-timestamp")?;
                let signatures = header("webhook-signature")?;
                let seconds: i64 = timestamp
                    .parse()
                    .map_err(|_| "`webhook-timestamp` is not a number of seconds".to_owned())?;
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64);
                let off = seconds.abs_diff(now);
                if off > TOLERANCE.as_secs() {
                    return Err(format!(
                        "`webhook-timestamp` is {off}s from now; at most {}s is accepted",
                        TOLERANCE.as_secs()
                    ));
                }
                let mac = mac(
                    secret,
                    &[id.as_bytes(), b".", timestamp.as_bytes(), b".", body],
                );
                let matched = signatures.split_whitespace().any(|sig| {
                    sig.strip_prefix("v1,")
                        .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
                        .is_some_and(|bytes| mac.clone().verify_slice(&bytes).is_ok())
                });
                if matched {
                    Ok(())
                } else {
                    Err("no `v1` signature in `webhook-signature` matches".into())
                }
            }
        }
    }
}

fn mac(secret: &Secret, parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(&secret.0).expect("HMAC takes any key length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// Compares the HMAC of `parts` with `given` (hex) in constant time.
fn check_hex(secret: &Secret, parts: &[&[u8]], given: &str) -> Result<(), String> {
    let bytes = hex::decode(given.trim()).map_err(|_| "the signature is not hex".to_owned())?;
    mac(secret, parts)
        .verify_slice(&bytes)
        .map_err(|_| "the signature does not match the body".to_owned())
}

/// Compiles the webhook of every workflow of `config` that has one.
///
/// # Errors
/// The first [`DefinitionError`].
pub fn load_all(config: &Config) -> Result<BTreeMap<String, Arc<Webhook>>, DefinitionError> {
    config
        .workflows
        .iter()
        .filter_map(|(name, w)| w.webhook.as_ref().map(|c| (name, c)))
        .map(|(name, c)| Ok((name.clone(), Arc::new(Webhook::compile(name, c, config)?))))
        .collect()
}

/// A delivery to `POST /hooks/<workflow>`.
pub struct Delivery<'a> {
    /// Lower-case names; a repeated header keeps its first value.
    pub headers: &'a BTreeMap<String, String>,
    pub query: Map<String, Value>,
    pub body: &'a [u8],
}

/// Why a delivery started no run.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("no webhook for workflow `{0}`")]
    NotFound(String),
    #[error("the delivery is not verified: {0}")]
    Unverified(String),
    #[error("the body is {size} bytes; this webhook takes at most {max}")]
    TooLarge { size: usize, max: u64 },
    #[error("{0}")]
    Input(String),
    #[error("the delivery id in `{0}` is longer than {MAX_DELIVERY_ID} bytes")]
    DeliveryId(String),
    #[error(transparent)]
    Workflow(#[from] WorkflowError),
}

impl Workflows {
    /// The webhook of `workflow`, if it has one.
    pub fn webhook(&self, workflow: &str) -> Option<Arc<Webhook>> {
        self.loaded().webhooks.get(workflow).cloned()
    }

    /// Verifies a delivery and starts its run (or finds the run a delivery
    /// with the same id started). Returns the run's id.
    ///
    /// # Errors
    /// A [`HookError`]; no run is started.
    pub async fn deliver(
        self: &Arc<Self>,
        workflow: &str,
        d: Delivery<'_>,
    ) -> Result<String, HookError> {
        let hook = self
            .webhook(workflow)
            .ok_or_else(|| HookError::NotFound(workflow.to_owned()))?;
        if d.body.len() as u64 > hook.max_input {
            return Err(HookError::TooLarge {
                size: d.body.len(),
                max: hook.max_input,
            });
        }
        hook.verify(d.headers, d.body)
            .map_err(HookError::Unverified)?;
        let body = match serde_json::from_slice::<Value>(d.body) {
            Ok(json) => json,
            Err(_) => Value::String(String::from_utf8_lossy(d.body).into_owned()),
        };
        let data = json!({"body": body, "headers": d.headers, "query": d.query});
        let input = match hook.input.clone() {
            Some(expr) => super::engine::jq("input-mapping", move || expr.eval(&data))
                .await
                .map_err(|f| HookError::Input(format!("the webhook's `input`: {}", f.message)))?,
            None => data["body"].clone(),
        };
        let delivery = match hook.delivery_header.as_ref() {
            Some(h) => match d.headers.get(h) {
                Some(id) if id.len() > MAX_DELIVERY_ID => {
                    return Err(HookError::DeliveryId(h.clone()));
                }
                Some(id) if !id.is_empty() => Some(id.clone()),
                _ => None,
            },
            None => None,
        };
        let trigger = json!({"kind": "webhook", "delivery": delivery});
        let key = delivery.as_ref().map(|id| format!("webhook:{id}"));
        let started = self
            .start_with(
                workflow,
                input,
                key,
                Some(trigger),
                &crate::trace::TraceParent::none(),
            )
            .await?;
        Ok(started.run.run_id)
    }
}
