//! Cassettes: what real MCP servers answered a case's calls, recorded once
//! (`wf-host test --record`) and replayed after with no server at all.
//!
//! A cassette is JSON Lines beside its case (`<case>.cassette.jsonl`), one
//! call per line in the order the node made them: `{"kind", "name",
//! "arguments", "result"}` (or `"error": {code, message}` instead of
//! `result`). Connection secrets never reach it. A replayed call matches the
//! first unused line of the same kind and name whose arguments are equal
//! (canonical JSON, keys sorted), leaving out the case's `[cassette] ignore`
//! fields.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::CassetteOptions;
use crate::capability::{CapabilityBackend, CapabilityEntry, CapabilityError};

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Entry {
    /// `tool`, `resource` or `prompt`.
    pub kind: String,
    /// `<connection>.<tool>`, `<connection>.<uri>` or `<connection>.<prompt>`.
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

impl Entry {
    fn answer(&self) -> Result<Value, CapabilityError> {
        match &self.error {
            Some(error) => Err(CapabilityError::from_json(error)),
            None => Ok(self.result.clone().unwrap_or(Value::Null)),
        }
    }
}

/// The `{tool, arguments}` of the tool calls among `entries`, as a case's
/// `expect.calls` compares them (the tool's name without its connection).
pub(super) fn tool_calls(entries: &[Entry]) -> Vec<Value> {
    entries
        .iter()
        .filter(|e| e.kind == "tool")
        .map(|e| {
            let tool = e.name.split_once('.').map_or(e.name.as_str(), |(_, t)| t);
            json!({"tool": tool, "arguments": e.arguments})
        })
        .collect()
}

/// Writes `entries` to `path`, one per line.
pub(super) fn write(path: &Path, entries: &[Entry]) -> std::io::Result<()> {
    let mut text = String::new();
    for entry in entries {
        text.push_str(&serde_json::to_string(entry).map_err(std::io::Error::other)?);
        text.push('\n');
    }
    std::fs::write(path, text)
}

/// Passes calls to the real backend and keeps what each answered, secrets
/// replaced by `[redacted]`.
pub(super) struct Recorder {
    inner: Arc<dyn CapabilityBackend>,
    secrets: Vec<String>,
    entries: Mutex<Vec<Entry>>,
}

impl Recorder {
    pub(super) fn new(inner: Arc<dyn CapabilityBackend>, secrets: Vec<String>) -> Recorder {
        Recorder {
            inner,
            secrets,
            entries: Mutex::default(),
        }
    }

    pub(super) fn entries(&self) -> Vec<Entry> {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn keep(
        &self,
        kind: &str,
        name: String,
        arguments: Value,
        answer: &Result<Value, CapabilityError>,
    ) {
        let (result, error) = match answer {
            Ok(value) => (Some(self.redact(value.clone())), None),
            Err(e) => (None, Some(self.redact(e.to_json()))),
        };
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Entry {
                kind: kind.to_owned(),
                name,
                arguments: self.redact(arguments),
                result,
                error,
            });
    }

    fn redact_text(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), "[redacted]");
            }
        }
        text
    }

    fn redact(&self, value: Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.redact_text(&s)),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.redact(v)).collect())
            }
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(k, v)| (self.redact_text(&k), self.redact(v)))
                    .collect(),
            ),
            other => other,
        }
    }
}

#[async_trait]
impl CapabilityBackend for Recorder {
    async fn call_tool(
        &self,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        let given = Value::Object(arguments.clone());
        let answer = self.inner.call_tool(connection, tool, arguments).await;
        self.keep("tool", format!("{connection}.{tool}"), given, &answer);
        answer
    }

    async fn read_resource(&self, connection: &str, uri: &str) -> Result<Value, CapabilityError> {
        let answer = self.inner.read_resource(connection, uri).await;
        self.keep(
            "resource",
            format!("{connection}.{uri}"),
            Value::Null,
            &answer,
        );
        answer
    }

    async fn get_prompt(
        &self,
        connection: &str,
        prompt: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        let given = Value::Object(arguments.clone());
        let answer = self.inner.get_prompt(connection, prompt, arguments).await;
        self.keep("prompt", format!("{connection}.{prompt}"), given, &answer);
        answer
    }

    async fn list(&self) -> Result<Vec<CapabilityEntry>, CapabilityError> {
        self.inner.list().await
    }
}

/// Answers calls from a cassette, and notes the calls it cannot answer.
pub(super) struct Cassette {
    entries: Vec<Entry>,
    ignore: Vec<String>,
    allow_unused: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    used: Vec<bool>,
    /// Every call made, answered or not: `(kind, name, arguments)`.
    made: Vec<(String, String, Value)>,
    /// Why each call the cassette has no line for failed.
    unmatched: Vec<String>,
}

impl Cassette {
    pub(super) fn load(path: &Path, options: &CassetteOptions) -> Result<Cassette, String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let entry: Entry =
                serde_json::from_str(line).map_err(|e| format!("line {}: {e}", n + 1))?;
            if !matches!(entry.kind.as_str(), "tool" | "resource" | "prompt") {
                return Err(format!(
                    "line {}: `kind` is tool, resource or prompt, not {:?}",
                    n + 1,
                    entry.kind
                ));
            }
            entries.push(entry);
        }
        Ok(Cassette {
            state: Mutex::new(State {
                used: vec![false; entries.len()],
                ..State::default()
            }),
            entries,
            ignore: options.ignore.clone(),
            allow_unused: options.allow_unused,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `arguments` without the ignored fields.
    fn matched_part(&self, arguments: &Value) -> Value {
        let mut value = arguments.clone();
        for pointer in &self.ignore {
            let (parent, key) = pointer.rsplit_once('/').unwrap_or(("", pointer));
            let key = key.replace("~1", "/").replace("~0", "~");
            let target = if parent.is_empty() {
                Some(&mut value)
            } else {
                value.pointer_mut(parent)
            };
            if let Some(Value::Object(map)) = target {
                map.remove(&key);
            }
        }
        if value.as_object().is_some_and(Map::is_empty) {
            Value::Null
        } else {
            value
        }
    }

    fn answer(&self, kind: &str, name: String, arguments: Value) -> Result<Value, CapabilityError> {
        let mut state = self.lock();
        state
            .made
            .push((kind.to_owned(), name.clone(), arguments.clone()));
        let wanted = self.matched_part(&arguments);
        let found = self.entries.iter().enumerate().find(|(i, e)| {
            !state.used[*i]
                && e.kind == kind
                && e.name == name
                && self.matched_part(&e.arguments) == wanted
        });
        if let Some((i, entry)) = found {
            state.used[i] = true;
            return entry.answer();
        }
        // The closest line: an unused one with the same name, else any.
        let closest = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == kind && e.name == name)
            .min_by_key(|(i, _)| state.used[*i]);
        let why = match closest {
            Some((_, e)) => format!(
                "the cassette has no {kind} call `{name}` with arguments {arguments}; its `{name}` call has {}:\n{}",
                e.arguments,
                super::indent(&diff(&arguments, &e.arguments), "  ")
            ),
            None => format!("the cassette has no {kind} call `{name}` (arguments {arguments})"),
        };
        state.unmatched.push(why);
        Err(CapabilityError::Unavailable(format!(
            "`{name}` is not in the cassette (record it again with `wf-host test --record`)"
        )))
    }

    /// The tool calls made, as [`tool_calls`] gives them.
    pub(super) fn calls(&self) -> Vec<Value> {
        let made: Vec<Entry> = self
            .lock()
            .made
            .iter()
            .map(|(kind, name, arguments)| Entry {
                kind: kind.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
                result: None,
                error: None,
            })
            .collect();
        tool_calls(&made)
    }

    /// Calls the cassette could not answer, and (unless `allow_unused`) its
    /// lines no call used.
    pub(super) fn failures(&self, path: &Path) -> Vec<String> {
        let state = self.lock();
        let mut failures = state.unmatched.clone();
        if !self.allow_unused {
            for (entry, _) in self
                .entries
                .iter()
                .zip(&state.used)
                .filter(|(_, used)| !**used)
            {
                failures.push(format!(
                    "{} holds a {} call `{}` {} that the node did not make (`[cassette] allow_unused = true` allows it)",
                    path.display(),
                    entry.kind,
                    entry.name,
                    entry.arguments
                ));
            }
        }
        failures
    }
}

/// How `got` differs from what the cassette `has`.
fn diff(got: &Value, has: &Value) -> String {
    crate::diff::strict(
        got,
        has,
        [
            "made",
            "cassette",
            "missing from the call",
            "not in the cassette",
        ],
        "only in ignored fields",
    )
}

#[async_trait]
impl CapabilityBackend for Cassette {
    async fn call_tool(
        &self,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        self.answer(
            "tool",
            format!("{connection}.{tool}"),
            Value::Object(arguments),
        )
    }

    async fn read_resource(&self, connection: &str, uri: &str) -> Result<Value, CapabilityError> {
        self.answer("resource", format!("{connection}.{uri}"), Value::Null)
    }

    async fn get_prompt(
        &self,
        connection: &str,
        prompt: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        self.answer(
            "prompt",
            format!("{connection}.{prompt}"),
            Value::Object(arguments),
        )
    }

    async fn list(&self) -> Result<Vec<CapabilityEntry>, CapabilityError> {
        Err(CapabilityError::Unavailable(
            "a cassette does not record capability lists".to_owned(),
        ))
    }
}
