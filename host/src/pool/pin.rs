//! Tool pinning: `wf.lock` holds a digest of every tool definition as it was
//! reviewed, and while it exists a tool whose definition changed since (a
//! "rug pull") or that was never pinned is refused before anything is sent.
//!
//! ```toml
//! # wf.lock: written by `wf-host pin`; review changes before committing them.
//! version = 1
//!
//! [connections.fixture]
//! echo = "sha256:3f1c…"
//! ```
//!
//! A digest covers the parts of a definition a model or a node relies on:
//! the name, title, description, input and output schemas and annotations,
//! as canonical JSON (object keys sorted, no whitespace).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rmcp::model::Tool;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The lock file's name, beside the config file.
pub const LOCK_FILE: &str = "wf.lock";
const VERSION: u32 = 1;

/// The pinned digests, by connection and tool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pins {
    version: u32,
    #[serde(default)]
    pub connections: BTreeMap<String, BTreeMap<String, String>>,
}

/// Why a lock file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("cannot read `{path}`: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{path}` is not a valid lock file: {message}; re-create it with `wf-host pin`")]
    Parse { path: PathBuf, message: String },
    #[error("cannot write `{path}`: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// How a tool's live definition compares with the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinCheck {
    Pinned,
    /// Pinned, but its definition changed since.
    Changed,
    /// Not in the lock at all.
    Unpinned,
}

impl Pins {
    /// An empty lock, to be filled with [`Pins::pin`].
    pub fn new() -> Pins {
        Pins {
            version: VERSION,
            connections: BTreeMap::new(),
        }
    }

    /// Reads `path`; `Ok(None)` when there is no lock file (nothing is pinned).
    ///
    /// # Errors
    /// A [`PinError`] naming the file when it exists but cannot be used.
    pub fn load(path: &Path) -> Result<Option<Pins>, PinError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(PinError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let parse = |message: String| PinError::Parse {
            path: path.to_owned(),
            message,
        };
        let pins: Pins = toml::from_str(&text).map_err(|e| parse(e.to_string()))?;
        if pins.version != VERSION {
            return Err(parse(format!(
                "version {} is not supported (this wf-host writes version {VERSION})",
                pins.version
            )));
        }
        Ok(Some(pins))
    }

    /// Writes the lock to `path` (through a temporary file, so a reader never
    /// sees half a lock).
    ///
    /// # Errors
    /// [`PinError::Write`].
    pub fn save(&self, path: &Path) -> Result<(), PinError> {
        let write = |source| PinError::Write {
            path: path.to_owned(),
            source,
        };
        let body = toml::to_string(self).map_err(|e| write(std::io::Error::other(e)))?;
        let text = format!(
            "# Tool definitions pinned by `wf-host pin`. While this file exists, a tool\n\
             # whose definition differs from its digest here is refused. Review changes\n\
             # to this file like code.\n{body}"
        );
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        let mut tmp =
            tempfile::NamedTempFile::new_in(dir.unwrap_or(Path::new("."))).map_err(write)?;
        std::io::Write::write_all(&mut tmp, text.as_bytes()).map_err(write)?;
        tmp.persist(path).map_err(|e| write(e.error))?;
        Ok(())
    }

    /// Records the digest of every tool of `connection`, replacing what was
    /// pinned for it.
    pub fn pin(&mut self, connection: &str, tools: &[Tool]) {
        let digests = tools
            .iter()
            .map(|t| (t.name.to_string(), digest(t)))
            .collect();
        self.connections.insert(connection.to_owned(), digests);
    }

    /// The digests pinned for `connection` (empty when it has none).
    pub fn connection(&self, connection: &str) -> BTreeMap<String, String> {
        self.connections
            .get(connection)
            .cloned()
            .unwrap_or_default()
    }
}

/// Compares a tool's live digest with the pinned ones of its connection.
pub fn check(pinned: &BTreeMap<String, String>, tool: &str, live: &str) -> PinCheck {
    match pinned.get(tool) {
        Some(d) if d == live => PinCheck::Pinned,
        Some(_) => PinCheck::Changed,
        None => PinCheck::Unpinned,
    }
}

/// The message of a refused call; it says what to do.
pub fn refusal(connection: &str, tool: &str, check: PinCheck) -> String {
    match check {
        PinCheck::Changed => format!(
            "the definition of `{connection}.{tool}` changed since it was pinned in {LOCK_FILE}; \
             review the change, then re-run `wf-host pin`"
        ),
        _ => format!(
            "`{connection}.{tool}` is not pinned in {LOCK_FILE}; review it, then re-run `wf-host pin`"
        ),
    }
}

/// `sha256:<hex>` of the canonical JSON of the pinned parts of `tool`.
pub fn digest(tool: &Tool) -> String {
    let subject = json!({
        "name": tool.name,
        "title": tool.title,
        "description": tool.description,
        "inputSchema": *tool.input_schema,
        "outputSchema": tool.output_schema.as_deref(),
        "annotations": tool.annotations,
    });
    let mut text = String::new();
    canonical(&subject, &mut text);
    format!("sha256:{}", hex::encode(Sha256::digest(text.as_bytes())))
}

/// Writes `value` with object keys sorted and no whitespace, whatever the
/// order the server sent them in.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            out.push('{');
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Where the lock of the config in `base_dir` lives.
pub fn lock_path(base_dir: &Path) -> PathBuf {
    base_dir.join(LOCK_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    fn tool(description: &str, schema: Value) -> Tool {
        let Value::Object(schema) = schema else {
            panic!("object")
        };
        Tool::new("echo", description.to_owned(), std::sync::Arc::new(schema))
    }

    #[test]
    fn the_digest_ignores_key_order_and_sees_every_pinned_part() {
        let a = tool(
            "d",
            json!({"type": "object", "properties": {"a": {}, "b": {}}}),
        );
        let b = tool(
            "d",
            json!({"properties": {"b": {}, "a": {}}, "type": "object"}),
        );
        assert_eq!(digest(&a), digest(&b));
        assert_ne!(digest(&a), digest(&tool("d2", json!({"type": "object"}))));
        let mut titled = a.clone();
        titled.title = Some("Echo".into());
        assert_ne!(digest(&a), digest(&titled));
        let mut shaped = a.clone();
        shaped.output_schema = Some(std::sync::Arc::new(Map::new()));
        assert_ne!(digest(&a), digest(&shaped));
    }

    #[test]
    fn a_lock_round_trips_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = lock_path(dir.path());
        assert_eq!(Pins::load(&path).unwrap(), None);
        let mut pins = Pins::new();
        pins.pin("fixture", &[tool("d", json!({"type": "object"}))]);
        pins.save(&path).unwrap();
        assert_eq!(Pins::load(&path).unwrap(), Some(pins.clone()));
        let live = digest(&tool("d", json!({"type": "object"})));
        let pinned = pins.connection("fixture");
        assert_eq!(check(&pinned, "echo", &live), PinCheck::Pinned);
        assert_eq!(check(&pinned, "echo", "sha256:00"), PinCheck::Changed);
        assert_eq!(check(&pinned, "add", &live), PinCheck::Unpinned);
        std::fs::write(&path, "version = 9\n").unwrap();
        let e = Pins::load(&path).unwrap_err().to_string();
        assert!(e.contains("wf.lock") && e.contains("version 9"), "{e}");
    }
}
