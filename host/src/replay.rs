//! `wf-host replay`: a stored run's steps run again with new builds of their
//! components, each capability call answered from the run's journal instead
//! of upstream. It tells an author, before deploying a changed node while
//! runs are in flight, whether the new build makes the same calls and gives
//! the same output.
//!
//! Calls are matched in order, on name and arguments. A call denied by the
//! step's grants never reaches a backend and is not compared (it is denied
//! again, as before). A durable node's waits (`wf:sleep`,
//! `wf:wait-signal`, `wf:run-workflow`) are answered from the journal the
//! same way, in their turn, and its clock reads and random seed are read
//! again from it: a replay of a run that waited for days takes no longer
//! than its node's compute.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::capability::{
    CallJournal, CapabilityBackend, CapabilityEntry, CapabilityError, JournalEntry, Replayed, Tape,
};
use crate::domain::{CallRow, StepStatus};
use crate::runtime::{RunError, RunOptions, Runtime, RuntimeConfig};
use crate::store::Store;
use crate::workflow::{Definition, Spec};

/// One call as the journal has it, or as the new build made it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Call {
    pub name: String,
    pub arguments: Value,
}

/// How one replayed step compares with the stored run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The same calls, and the same output (when the step had succeeded).
    Same { calls: usize },
    /// The calls differ; `seq` is the first one that does (from 1).
    DifferentCalls {
        seq: usize,
        expected: Option<Call>,
        got: Option<Call>,
        /// The new build's own error, when it failed instead of making
        /// the call (`{code, message}`).
        #[serde(skip_serializing_if = "Option::is_none")]
        failed: Option<Value>,
    },
    /// The same calls, another output (or an error where it had succeeded).
    DifferentOutput { expected: Value, got: Value },
}

/// A step's replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepReplay {
    pub step: String,
    pub component: PathBuf,
    #[serde(flatten)]
    pub verdict: Verdict,
}

impl StepReplay {
    pub fn same(&self) -> bool {
        matches!(self.verdict, Verdict::Same { .. })
    }

    /// What a person reads: one line, and a diff when there is one.
    pub fn render(&self) -> String {
        let step = &self.step;
        match &self.verdict {
            Verdict::Same { calls } => {
                format!("step `{step}`: same calls ({calls}) and same output")
            }
            Verdict::DifferentCalls {
                seq,
                expected,
                got,
                failed,
            } => {
                let show = |c: &Option<Call>| match c {
                    Some(c) => format!("{} {}", c.name, c.arguments),
                    None => "no call".to_owned(),
                };
                let mut text = format!(
                    "step `{step}`: different calls: call {seq}: the run made {}, the new build made {}",
                    show(expected),
                    show(got)
                );
                if let (None, Some(failed)) = (got, failed) {
                    text.push_str(&format!(
                        ": it failed first with `{}`: {}",
                        failed["code"].as_str().unwrap_or_default(),
                        failed["message"].as_str().unwrap_or_default()
                    ));
                }
                if let (Some(e), Some(g)) = (expected, got)
                    && e.name == g.name
                {
                    text.push_str(&format!(
                        "\n  arguments: {}",
                        diff(&g.arguments, &e.arguments).replace('\n', "\n  ")
                    ));
                }
                text
            }
            Verdict::DifferentOutput { expected, got } => format!(
                "step `{step}`: same calls, different output:\n  {}",
                diff(got, expected).replace('\n', "\n  ")
            ),
        }
    }
}

/// The differences of the new build's `got` from the run's `expected`.
fn diff(got: &Value, expected: &Value) -> String {
    crate::diff::strict(
        got,
        expected,
        [
            "new build",
            "run",
            "missing from the new build",
            "missing from the run",
        ],
        "no difference",
    )
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("no run `{0}` in the state")]
    UnknownRun(String),
    #[error("run `{run}`: {message}")]
    Step { run: String, message: String },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Load(#[from] crate::runtime::LoadError),
}

/// Replays the steps of run `run_id` named in `components` (step id → new
/// component file; the id `""` names the run's only step that runs a
/// component), in the run's definition order.
///
/// # Errors
/// [`ReplayError`]: no such run, a step that is not in it, did not run a
/// node, or has `for_each`; a component that does not load.
pub async fn replay(
    store: Arc<dyn Store>,
    run_id: &str,
    components: &HashMap<String, PathBuf>,
    runtime: RuntimeConfig,
) -> Result<Vec<StepReplay>, ReplayError> {
    let step_err = |message: String| ReplayError::Step {
        run: run_id.to_owned(),
        message,
    };
    let run = store
        .run(run_id)
        .await?
        .ok_or_else(|| ReplayError::UnknownRun(run_id.to_owned()))?;
    let spec: Spec = serde_json::from_value((*run.definition).clone())
        .map_err(|e| step_err(format!("its stored definition cannot be read: {e}")))?;
    let def = Definition::compile(&run.workflow, spec)
        .map_err(|e| step_err(format!("its stored definition does not compile: {e}")))?;
    let rows = store.steps(run_id).await?;
    let mut components = components.clone();
    if let Some(path) = components.remove("") {
        let nodes: Vec<&str> = def
            .steps
            .iter()
            .filter(|s| s.spec.runs_node())
            .map(|s| s.spec.id.as_str())
            .collect();
        let [only] = nodes[..] else {
            return Err(step_err(format!(
                "`--component {}` names no step, and workflow `{}` has {} steps that run a component ({}): name one as STEP=PATH",
                path.display(),
                run.workflow,
                nodes.len(),
                nodes.join(", ")
            )));
        };
        components.insert(only.to_owned(), path);
    }
    for id in components.keys() {
        if def.step(id).is_none() {
            let known: Vec<&str> = def.steps.iter().map(|s| s.spec.id.as_str()).collect();
            return Err(step_err(format!(
                "workflow `{}` has no step `{id}` (it has {})",
                run.workflow,
                known.join(", ")
            )));
        }
    }
    let mut reports = Vec::new();
    for step in &def.steps {
        let Some(path) = components.get(&step.spec.id) else {
            continue;
        };
        let id = &step.spec.id;
        if !step.spec.runs_node() {
            return Err(step_err(format!("step `{id}` runs no component")));
        }
        if step.for_each.is_some() {
            return Err(step_err(format!(
                "step `{id}` has `for_each`: replaying its items is not supported"
            )));
        }
        let row = rows
            .iter()
            .find(|r| &r.step_id == id)
            .filter(|r| r.started_at.is_some())
            .ok_or_else(|| step_err(format!("step `{id}` never ran in this run")))?;
        let input = row.input.clone().unwrap_or(Value::Null);
        // The attempt whose calls count: the last one.
        let calls: Vec<CallRow> = store
            .calls(run_id, id)
            .await?
            .into_iter()
            .filter(|c| c.attempt == row.attempts && c.item == 0)
            .collect();
        if let Some(lost) = calls.iter().find(|c| c.result.is_none() && !skipped(c)) {
            return Err(step_err(format!(
                "step `{id}`: the journal has no result for call {} (`{}`): runs journaled before results were kept, or a result over 64 KiB, cannot be replayed",
                lost.seq, lost.name
            )));
        }
        let backend = Arc::new(Journal::new(calls));
        let runtime = Runtime::new(runtime.clone(), backend.clone())?;
        let node = runtime.load(path)?;
        let report = runtime
            .run(
                &node,
                &input.to_string(),
                RunOptions {
                    run_id: format!("replay-{run_id}-{id}"),
                    limits: Some(step.limits),
                    grants: step.grants.clone(),
                    journal: Some(Arc::new(Replaying(backend.clone()))),
                    ..RunOptions::default()
                },
            )
            .await;
        let got = match &report.result {
            Ok(text) => serde_json::from_str(text).unwrap_or(Value::String(text.clone())),
            Err(RunError::Node { code, message }) => {
                json!({"error": {"code": code, "message": message}})
            }
            Err(e) => json!({"error": {"code": e.code(), "message": e.to_string()}}),
        };
        let verdict = match backend.verdict() {
            // The calls it did not make: its own error says why.
            Some(Verdict::DifferentCalls {
                seq,
                expected,
                got: None,
                ..
            }) if report.result.is_err() => Verdict::DifferentCalls {
                seq,
                expected,
                got: None,
                failed: Some(got["error"].clone()),
            },
            Some(calls) => calls,
            None if row.status == StepStatus::Succeeded && row.output.as_ref() != Some(&got) => {
                Verdict::DifferentOutput {
                    expected: row.output.clone().unwrap_or(Value::Null),
                    got,
                }
            }
            None => Verdict::Same {
                calls: backend.made(),
            },
        };
        reports.push(StepReplay {
            step: id.clone(),
            component: path.clone(),
            verdict,
        });
    }
    Ok(reports)
}

/// A journaled call the host refused before it reached a backend (the
/// step's grants, or arguments that are not a JSON object): refused again
/// in a replay, so not compared.
fn skipped(call: &CallRow) -> bool {
    call.error_code.as_deref() == Some("denied")
        || (call.error_code.as_deref() == Some("invalid-arguments")
            && !call.arguments.is_object()
            && !call.arguments.is_null())
}

/// Answers a step's calls from its journal, in order, and notes the first
/// that differs.
struct Journal {
    calls: Vec<CallRow>,
    state: Mutex<JournalState>,
    /// The clock reads and seed of the run, in order, read again.
    tape: Mutex<std::collections::VecDeque<Value>>,
}

#[derive(Default)]
struct JournalState {
    next: usize,
    made: usize,
    diverged: Option<Verdict>,
}

impl Journal {
    fn new(calls: Vec<CallRow>) -> Journal {
        let tape = calls
            .iter()
            .filter_map(|c| c.tape.as_ref()?.as_array().cloned())
            .flatten()
            .collect();
        Journal {
            calls: calls.into_iter().filter(|c| !skipped(c)).collect(),
            state: Mutex::default(),
            tape: Mutex::new(tape),
        }
    }

    /// The run's next read of `kind` (`wall`, `mono`, `seed`), when it is
    /// the next one.
    fn read(&self, kind: &str) -> Option<Value> {
        let mut tape = self.tape.lock().unwrap_or_else(|e| e.into_inner());
        let value = tape.front()?.get(kind)?.clone();
        tape.pop_front();
        Some(value)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, JournalState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calls made, when they all matched.
    fn made(&self) -> usize {
        self.lock().made
    }

    /// How the calls differ, if they do: one the new build made that the
    /// journal does not have, or one it has that was not made.
    fn verdict(&self) -> Option<Verdict> {
        let state = self.lock();
        if let Some(v) = &state.diverged {
            return Some(v.clone());
        }
        self.calls
            .get(state.next)
            .map(|missing| Verdict::DifferentCalls {
                seq: state.next + 1,
                expected: Some(Call {
                    name: missing.name.clone(),
                    arguments: missing.arguments.clone(),
                }),
                got: None,
                failed: None,
            })
    }

    /// The journal's answer to `name` with `arguments`, when it is the next
    /// call; else the divergence is noted and the call fails.
    fn answer(&self, name: String, arguments: Value) -> Result<Value, CapabilityError> {
        let mut state = self.lock();
        if state.diverged.is_some() {
            return Err(diverged());
        }
        let seq = state.next + 1;
        let got = Call { name, arguments };
        let expected = self.calls.get(state.next);
        let same = expected
            .is_some_and(|e| e.name == got.name && same_arguments(&e.arguments, &got.arguments));
        if !same {
            state.diverged = Some(Verdict::DifferentCalls {
                seq,
                expected: expected.map(|e| Call {
                    name: e.name.clone(),
                    arguments: e.arguments.clone(),
                }),
                got: Some(got),
                failed: None,
            });
            return Err(diverged());
        }
        let call = &self.calls[state.next];
        state.next += 1;
        state.made += 1;
        let result = call.result.clone().unwrap_or(Value::Null);
        match result.get("error") {
            Some(error) if call.error_code.is_some() => Err(CapabilityError::from_json(error)),
            _ => Ok(result),
        }
    }
}

/// Journaled `null` arguments (none given) and `{}` are the same call.
fn same_arguments(journaled: &Value, made: &Value) -> bool {
    let empty = |v: &Value| v.is_null() || v.as_object().is_some_and(Map::is_empty);
    journaled == made || (empty(journaled) && empty(made))
}

fn diverged() -> CapabilityError {
    CapabilityError::Unavailable(
        "replay: this call is not the one the run made next; see the report".to_owned(),
    )
}

impl Tape for Journal {
    fn wall(&self, live: std::time::Duration) -> std::time::Duration {
        self.read("wall")
            .and_then(|v| v.as_u64())
            .map_or(live, std::time::Duration::from_nanos)
    }

    fn monotonic(&self, live: u64) -> u64 {
        self.read("mono").and_then(|v| v.as_u64()).unwrap_or(live)
    }

    fn seed(&self, live: [u8; 32]) -> [u8; 32] {
        self.read("seed")
            .as_ref()
            .and_then(Value::as_str)
            .and_then(crate::workflow::decode_seed)
            .unwrap_or(live)
    }
}

/// The journal as a durable node's: its waits answered from it in their
/// turn (its calls go to the backend, [`Journal`] too), its clock reads and
/// seed read again from it, nothing recorded.
struct Replaying(Arc<Journal>);

#[async_trait]
impl CallJournal for Replaying {
    fn key_prefix(&self) -> &str {
        "replay"
    }

    async fn record(&self, _: JournalEntry) {}

    fn replayed(&self, _seq: u32, name: &str, arguments: &Value) -> Option<Replayed> {
        if !name.starts_with("wf:") {
            return None;
        }
        Some(Replayed {
            result: self.0.answer(name.to_owned(), arguments.clone()),
            record: None,
        })
    }

    fn tape(&self) -> Option<Arc<dyn Tape>> {
        Some(self.0.clone())
    }
}

#[async_trait]
impl CapabilityBackend for Journal {
    async fn call_tool(
        &self,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        self.answer(format!("{connection}.{tool}"), Value::Object(arguments))
    }

    async fn read_resource(&self, connection: &str, uri: &str) -> Result<Value, CapabilityError> {
        self.answer(format!("{connection}.{uri}"), Value::Null)
    }

    async fn get_prompt(
        &self,
        connection: &str,
        prompt: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        self.answer(format!("{connection}.{prompt}"), Value::Object(arguments))
    }

    async fn list(&self) -> Result<Vec<CapabilityEntry>, CapabilityError> {
        Err(CapabilityError::Unavailable(
            "replay: listing capabilities is not journaled, so it cannot be replayed".to_owned(),
        ))
    }
}
