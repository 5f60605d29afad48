//! Secrets: values a config names by reference instead of writing them out,
//! where they are read from, and the redactor that keeps every secret the
//! host has learnt out of what it writes (the state, logs, traces, events,
//! answers to clients).
//!
//! ```toml
//! [connections.notes]
//! url = "https://notes.example/mcp"
//! headers = { Authorization = { secret = "NOTES_TOKEN", prefix = "Bearer " } }
//!
//! [connections.files]
//! command = "files-server"
//! env = { API_KEY = { secret_file = "secrets/files.key" } }
//! ```
//!
//! `{ secret = "NAME" }` is read from the systemd credential `NAME`
//! (`$CREDENTIALS_DIRECTORY/NAME`) when the host has one, else from the
//! host's variable `NAME`. `{ secret_file = "path" }` is read from a file
//! (relative to the config) that only its owner may read.
//!
//! The redactor only grows: a secret a reload dropped is still redacted, as
//! the records it went into may still be read. With no secret known it costs
//! one atomic load.

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, RwLock};

use aho_corasick::AhoCorasick;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a secret becomes wherever it would have been written.
pub const REDACTED: &str = "[redacted]";
/// Shorter secrets are refused: they would match ordinary text, and
/// redacting it would garble records without protecting anything.
pub const MIN_SECRET_LEN: usize = 8;
/// The largest secret file read.
const MAX_SECRET_FILE: u64 = 64 * 1024;

/// A secret value: never shown by `Debug`; serialised (for the pool
/// fingerprint) as a hash salted per process, so the fingerprint in
/// `host.status` cannot be used to guess it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: impl Into<String>) -> Secret {
        Secret(secret.into())
    }

    /// The secret itself, for the one request or child that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use sha2::Digest;
        static SALT: LazyLock<[u8; 16]> = LazyLock::new(rand::random);
        let mut hash = sha2::Sha256::new();
        hash.update(*SALT);
        hash.update(self.0.as_bytes());
        s.serialize_str(&hex::encode(hash.finalize()))
    }
}

/// Where a secret comes from, as the config names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    /// A systemd credential of this name, else the host variable.
    pub secret: Option<String>,
    /// A file only its owner may read; relative to the config.
    pub secret_file: Option<PathBuf>,
    /// Text put before the secret (`"Bearer "`); not itself secret.
    #[serde(default)]
    pub prefix: String,
}

/// A config value that is either written out or a secret by reference.
/// `Debug` shows neither: an inline value may be a secret too (an inline
/// `client_secret`, a `Bearer` header).
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum ConfigValue {
    Plain(String),
    /// `value` is the prefix and the secret, once resolved.
    Secret {
        from: SecretRef,
        value: Option<Secret>,
    },
}

impl std::fmt::Debug for ConfigValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigValue::Plain(_) => f.write_str("Plain([hidden])"),
            ConfigValue::Secret { from, .. } => {
                f.debug_struct("Secret").field("from", from).finish()
            }
        }
    }
}

impl ConfigValue {
    /// The value to use: plain text, or the prefix and the secret (empty
    /// for a reference not yet resolved, which a loaded config never has).
    pub fn expose(&self) -> &str {
        match self {
            ConfigValue::Plain(text) => text,
            ConfigValue::Secret { value, .. } => value.as_ref().map_or("", Secret::expose),
        }
    }

    /// Reads a referenced secret (files relative to `base_dir`) and
    /// remembers it for redaction. `what` names the value in messages.
    ///
    /// # Errors
    /// Why the secret cannot be had, naming `what`.
    pub fn resolve(&mut self, base_dir: &Path, what: &str) -> Result<(), String> {
        let ConfigValue::Secret { from, value } = self else {
            return Ok(());
        };
        let secret = match (&from.secret, &from.secret_file) {
            (Some(name), None) => read_named(name),
            (None, Some(file)) => read_file(&base_dir.join(file)),
            (Some(_), Some(_)) => Err("sets both `secret` and `secret_file`; pick one".to_owned()),
            (None, None) => Err("needs `secret = \"NAME\"` or `secret_file = \"path\"`".to_owned()),
        }
        .map_err(|e| format!("{what}: {e}"))?;
        remember(&secret);
        *value = Some(Secret(format!("{}{secret}", from.prefix)));
        Ok(())
    }
}

impl<'de> Deserialize<'de> for ConfigValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ConfigValue;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string, or a secret like { secret = \"NAME\" }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ConfigValue, E> {
                Ok(ConfigValue::Plain(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<ConfigValue, A::Error> {
                let from =
                    SecretRef::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(ConfigValue::Secret { from, value: None })
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl Serialize for ConfigValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ConfigValue::Plain(text) => s.serialize_str(text),
            ConfigValue::Secret { value, .. } => value.serialize(s),
        }
    }
}

impl From<&str> for ConfigValue {
    fn from(text: &str) -> ConfigValue {
        ConfigValue::Plain(text.to_owned())
    }
}

/// `NAME` from `$CREDENTIALS_DIRECTORY`, else from the environment.
fn read_named(name: &str) -> Result<String, String> {
    let valid = !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@'));
    if !valid {
        return Err(format!(
            "secret name `{name}` is not a credential or variable name (letters, digits, `_`, `-`, `.`, `@`)"
        ));
    }
    if let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY") {
        let path = Path::new(&dir).join(name);
        if path.exists() {
            return read_file(&path);
        }
    }
    match std::env::var(name) {
        Ok(value) => checked(value, &format!("the variable `{name}`")),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(format!("the variable `{name}` is not valid UTF-8"))
        }
        Err(std::env::VarError::NotPresent) => Err(format!(
            "secret `{name}` is not set: the host has no variable `{name}`{}",
            if std::env::var_os("CREDENTIALS_DIRECTORY").is_some() {
                format!(" and no credential `{name}` in $CREDENTIALS_DIRECTORY")
            } else {
                String::new()
            }
        )),
    }
}

/// A secret file: only its owner may read it, and one trailing newline is
/// not part of the secret.
fn read_file(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read `{shown}`: {e}"))?;
    if !meta.is_file() {
        return Err(format!("`{shown}` is not a file"));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "`{shown}` may be read by others (mode {mode:o}); `chmod 600` it"
            ));
        }
    }
    if meta.len() > MAX_SECRET_FILE {
        return Err(format!(
            "`{shown}` is {} bytes; a secret file is at most {MAX_SECRET_FILE}",
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read `{shown}`: {e}"))?;
    let text = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text)
        .to_owned();
    checked(text, &format!("`{shown}`"))
}

fn checked(value: String, source: &str) -> Result<String, String> {
    if value.len() < MIN_SECRET_LEN {
        return Err(format!(
            "{source} holds {} bytes; a secret must have at least {MIN_SECRET_LEN} to be told apart from ordinary text",
            value.len()
        ));
    }
    Ok(value)
}

/// The secrets known so far, a matcher for all of them, and what each
/// match becomes (built once, not per replacement).
struct Known {
    values: Vec<String>,
    matcher: AhoCorasick,
    with: Vec<&'static str>,
}

impl Known {
    /// `text` with every secret replaced; `None` when it holds none.
    fn replace(&self, text: &str) -> Option<String> {
        self.matcher
            .is_match(text)
            .then(|| self.matcher.replace_all(text, &self.with))
    }
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static KNOWN: RwLock<Option<Arc<Known>>> = RwLock::new(None);

/// Adds `secret` to what is redacted from now on. Values shorter than
/// [`MIN_SECRET_LEN`] are not: they would match ordinary text.
pub fn remember(secret: &str) {
    if secret.len() < MIN_SECRET_LEN {
        return;
    }
    let mut known = KNOWN.write().unwrap_or_else(|p| p.into_inner());
    let mut values = known.as_ref().map(|k| k.values.clone()).unwrap_or_default();
    if values.iter().any(|v| v == secret) {
        return;
    }
    values.push(secret.to_owned());
    // As a log line may show it: escaped for JSON, or by `{:?}`.
    for escaped in [
        serde_json::to_string(secret).unwrap_or_default(),
        format!("{secret:?}"),
    ] {
        let inner = escaped
            .strip_prefix('"')
            .and_then(|e| e.strip_suffix('"'))
            .unwrap_or_default();
        if inner != secret && !inner.is_empty() && !values.iter().any(|v| v == inner) {
            values.push(inner.to_owned());
        }
    }
    // Longest first, so a secret that contains another goes whole.
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    let matcher = match aho_corasick::AhoCorasick::builder()
        .match_kind(aho_corasick::MatchKind::LeftmostLongest)
        .build(&values)
    {
        Ok(matcher) => matcher,
        Err(e) => {
            // The secrets known before stay redacted. Logged once the lock
            // is let go: the log writer takes it too.
            drop(known);
            tracing::error!("cannot add a secret to the redactor: {e}");
            return;
        }
    };
    let with = vec![REDACTED; values.len()];
    *known = Some(Arc::new(Known {
        values,
        matcher,
        with,
    }));
    ACTIVE.store(true, Ordering::Release);
}

/// Whether any secret is known: when not, nothing needs redacting.
pub fn any() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Every secret known, longest first.
pub fn known() -> Vec<String> {
    current().map(|k| k.values.clone()).unwrap_or_default()
}

fn current() -> Option<Arc<Known>> {
    if !ACTIVE.load(Ordering::Acquire) {
        return None;
    }
    KNOWN.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// `text` with every known secret replaced by [`REDACTED`].
pub fn redact(text: &str) -> Cow<'_, str> {
    match current().and_then(|k| k.replace(text)) {
        Some(clean) => Cow::Owned(clean),
        None => Cow::Borrowed(text),
    }
}

/// `value` with every known secret in its strings (and keys) replaced; `None`
/// when there was nothing to replace.
pub fn redact_json(value: &Value) -> Option<Value> {
    let known = current()?;
    fn walk(v: &Value, m: &Known) -> Option<Value> {
        let replace = |s: &str| m.replace(s);
        match v {
            Value::String(s) => replace(s).map(Value::String),
            Value::Array(items) => {
                let changed: Vec<Option<Value>> = items.iter().map(|i| walk(i, m)).collect();
                changed.iter().any(Option::is_some).then(|| {
                    Value::Array(
                        changed
                            .into_iter()
                            .zip(items)
                            .map(|(c, i)| c.unwrap_or_else(|| i.clone()))
                            .collect(),
                    )
                })
            }
            Value::Object(map) => {
                let mut any = false;
                let out = map
                    .iter()
                    .map(|(k, v)| {
                        let key = replace(k);
                        let value = walk(v, m);
                        any |= key.is_some() || value.is_some();
                        (
                            key.unwrap_or_else(|| k.clone()),
                            value.unwrap_or_else(|| v.clone()),
                        )
                    })
                    .collect();
                any.then_some(Value::Object(out))
            }
            _ => None,
        }
    }
    walk(value, &known)
}

/// `value` with known secrets replaced, and the values of fields named in
/// `fields` (at any depth) too.
pub fn redact_value(value: Value, fields: &[String]) -> Value {
    let mut out = redact_json(&value).unwrap_or(value);
    if !fields.is_empty() {
        redact_fields(&mut out, fields);
    }
    out
}

fn redact_fields(value: &mut Value, fields: &[String]) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if fields.iter().any(|f| f == key) {
                    *v = Value::String(REDACTED.to_owned());
                } else {
                    redact_fields(v, fields);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| redact_fields(i, fields)),
        _ => {}
    }
}

/// A log writer that redacts known secrets from what it is given. The
/// formatter hands it one whole record per `write`.
pub struct Redacting<W>(pub W);

impl<W: Write> Write for Redacting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match current() {
            Some(k) if k.matcher.is_match(buf) => {
                self.0
                    .write_all(&k.matcher.replace_all_bytes(buf, &k.with))?;
            }
            _ => self.0.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// A `MakeWriter` whose writers redact: wraps the log output.
pub struct RedactingMakeWriter<M>(pub M);

impl<'a, M: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for RedactingMakeWriter<M>
{
    type Writer = Redacting<M::Writer>;
    fn make_writer(&'a self) -> Self::Writer {
        Redacting(self.0.make_writer())
    }
    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        Redacting(self.0.make_writer_for(meta))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn known_secrets_are_replaced_in_text_json_and_fields() {
        remember("unit-test-secret-0123");
        remember("short");
        assert_eq!(redact("a unit-test-secret-0123 b"), "a [redacted] b");
        assert_eq!(redact("short"), "short");
        let v = json!({"k": ["x unit-test-secret-0123"], "password": "p", "n": 1});
        assert_eq!(
            redact_value(v, &["password".to_owned()]),
            json!({"k": ["x [redacted]"], "password": "[redacted]", "n": 1})
        );
        assert!(redact_json(&json!({"a": "clean"})).is_none());
    }

    #[test]
    fn a_secret_file_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        std::fs::write(&path, "a-long-enough-secret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_file(&path).unwrap_err();
        assert!(
            err.contains("mode 644") && err.contains("chmod 600"),
            "{err}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_file(&path).unwrap(), "a-long-enough-secret");
    }
}
