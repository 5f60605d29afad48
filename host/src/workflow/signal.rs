//! Signals: `workflow.signal {run_id, signal, payload}` for a run's wait
//! steps (`wait = "<signal>"`), from JSON-RPC, the console and `/mcp`.
//!
//! A signal is checked against the run as stored, from any worker: the run
//! must be running and have a wait step for it that has not finished, with
//! no other signal already kept for that step, and the payload must satisfy
//! the step's `schema`. It is then kept in the store, so one sent before its
//! step starts waiting is not lost: the step takes it when it gets there.
//! Whoever drives the run hears of it (here, or through a note from the
//! store) and its wait step takes it.

use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

use super::definition::{Definition, Spec};
use super::{WorkflowError, Workflows};
use crate::domain::StepStatus;
use crate::runtime::Node;

/// Longest payload kept, in bytes of JSON.
pub const MAX_PAYLOAD: usize = 256 * 1024;

/// What `workflow.signal` answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Signalled {
    pub run_id: String,
    pub signal: String,
    /// The wait step that takes it.
    pub step: String,
    /// `waiting`: the step waits for it now; `kept`: it is kept until the
    /// step gets there.
    pub delivery: &'static str,
}

impl Workflows {
    /// Sends `signal` with `payload` to run `run_id`.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`]; [`WorkflowError::NotWaiting`] when the
    /// run does not wait (and will not) for this signal;
    /// [`WorkflowError::InvalidPayload`] when the payload breaks the step's
    /// `schema` (the run keeps waiting).
    pub async fn signal(
        self: &Arc<Self>,
        run_id: &str,
        signal: &str,
        payload: Value,
    ) -> Result<Signalled, WorkflowError> {
        let not_waiting = |message: String| WorkflowError::NotWaiting {
            run_id: run_id.to_owned(),
            message,
        };
        let run = self
            .running_run(run_id, "a signal is only taken by a running run")
            .await?;
        let def = Spec::deserialize_value(&run.definition)
            .and_then(|spec| Definition::compile(&run.workflow, spec).map_err(|e| e.to_string()))
            .map_err(|e| not_waiting(format!("its definition cannot be read: {e}")))?;
        let waits: Vec<_> = def
            .spec
            .steps
            .iter()
            .filter_map(|s| s.wait.as_deref().map(|w| (s.id.as_str(), w)))
            .collect();
        // A durable node may wait for any signal (`wait-signal`).
        let nodes = self.nodes_of(&def).unwrap_or_default();
        let durable: Vec<&str> = def
            .steps
            .iter()
            .filter(|s| nodes.get(&s.spec.id).is_some_and(Node::is_durable))
            .map(|s| s.spec.id.as_str())
            .collect();
        if !waits.iter().any(|(_, w)| *w == signal) && durable.is_empty() {
            let known = if waits.is_empty() {
                "it has no wait step and no node that waits (`wait-signal`)".to_owned()
            } else {
                let names: Vec<String> = waits.iter().map(|(_, w)| format!("`{w}`")).collect();
                format!("it waits only for {}", names.join(", "))
            };
            return Err(not_waiting(format!(
                "no step of workflow `{}` waits for signal `{signal}`: {known}",
                run.workflow
            )));
        }
        let steps = self.store.steps(run_id).await?;
        // The steps that can still take this signal, in the order they take
        // them: its wait steps (definition order; the one waiting first),
        // then the steps whose node may wait for it.
        let mut open: Vec<(&str, StepStatus)> = def
            .steps
            .iter()
            .filter(|s| s.spec.wait.as_deref() == Some(signal))
            .filter_map(|s| {
                let status = steps.iter().find(|r| r.step_id == s.spec.id)?.status;
                (!status.is_finished()).then_some((s.spec.id.as_str(), status))
            })
            .collect();
        open.sort_by_key(|(_, status)| *status != StepStatus::Waiting);
        open.extend(durable.iter().filter_map(|id| {
            let status = steps.iter().find(|r| r.step_id == *id)?.status;
            // Kept for the node: it takes it when it waits for it.
            (!status.is_finished()).then_some((*id, StepStatus::Pending))
        }));
        let kept = self
            .store
            .signals(run_id)
            .await?
            .into_iter()
            .filter(|s| s.signal == signal && s.step_id.is_none())
            .count();
        let Some(&(step_id, status)) = open.get(kept) else {
            return Err(not_waiting(if open.is_empty() {
                format!("its step waiting for signal `{signal}` has finished")
            } else {
                format!(
                    "a `{signal}` signal is already kept for each step that waits for one ({kept})"
                )
            }));
        };
        let step = def.step(step_id).expect("found in the definition");
        Definition::check_payload(step, &payload).map_err(WorkflowError::InvalidPayload)?;
        if crate::capability::json_len(&payload) > MAX_PAYLOAD {
            return Err(WorkflowError::InvalidPayload(format!(
                "the payload is larger than {MAX_PAYLOAD} bytes of JSON"
            )));
        }
        let open_count = u32::try_from(open.len()).unwrap_or(u32::MAX);
        if !self
            .store
            .send_signal(run_id, signal, &payload, open_count)
            .await?
        {
            return Err(not_waiting(format!(
                "a `{signal}` signal is already kept for each step that waits for one"
            )));
        }
        self.signal_local(run_id);
        // Asleep on its waits: driven again to take it.
        self.wake_for_signal(run_id).await;
        tracing::info!(run = %run_id, signal, step = step_id, "signal sent");
        Ok(Signalled {
            run_id: run_id.to_owned(),
            signal: signal.to_owned(),
            step: step_id.to_owned(),
            delivery: if status == StepStatus::Waiting {
                "waiting"
            } else {
                "kept"
            },
        })
    }

    /// Answers the question an upstream server asked step `step_id` (item
    /// `item`) of run `run_id` during a call (elicitation): `accept` with
    /// `content` matching the question's `requested_schema` (a form), or
    /// `decline` or `cancel`. The step's call then goes on.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownRun`]; [`WorkflowError::NotWaiting`] when the
    /// step has no open question (or it is answered already);
    /// [`WorkflowError::InvalidPayload`] when the answer is malformed or its
    /// content breaks the requested schema (the question stays open).
    pub async fn answer(
        self: &Arc<Self>,
        run_id: &str,
        step_id: &str,
        item: u32,
        answer: crate::capability::Answer,
    ) -> Result<Signalled, WorkflowError> {
        let not_waiting = |message: String| WorkflowError::NotWaiting {
            run_id: run_id.to_owned(),
            message,
        };
        self.running_run(run_id, "only a running run's questions can be answered")
            .await?;
        let open = self.store.questions(run_id).await?;
        let Some(asked) = open.iter().find(|q| q.step_id == step_id && q.item == item) else {
            let known: Vec<String> = open
                .iter()
                .map(|q| format!("`{}` (item {})", q.step_id, q.item))
                .collect();
            return Err(not_waiting(format!(
                "step `{step_id}` (item {item}) has no open question{}",
                if known.is_empty() {
                    String::new()
                } else {
                    format!("; open: {}", known.join(", "))
                }
            )));
        };
        let invalid = |m: String| WorkflowError::InvalidPayload(m);
        let payload = match answer.action.as_str() {
            "accept" => {
                let form = asked.question["mode"] == "form";
                let content = match (&answer.content, form) {
                    (Some(content @ Value::Object(_)), true) => {
                        // Fields left out take the schema's defaults.
                        let mut content = content.clone();
                        if let Some(schema) = asked.question.get("requested_schema") {
                            crate::capability::apply_defaults(schema, &mut content);
                        }
                        Some(content)
                    }
                    (None, false) => None,
                    (Some(_), false) => {
                        return Err(invalid(
                            "a URL question is accepted without `content`".to_owned(),
                        ));
                    }
                    _ => {
                        return Err(invalid(
                            "`accept` of a form question needs `content`, an object".to_owned(),
                        ));
                    }
                };
                if let (Some(content), Some(schema)) =
                    (&content, asked.question.get("requested_schema"))
                {
                    let validator = jsonschema::validator_for(schema).map_err(|e| {
                        invalid(format!(
                            "the question's requested schema does not compile: {e}"
                        ))
                    })?;
                    if let Some(e) = validator.iter_errors(content).next() {
                        let at = e.instance_path().to_string();
                        let at = if at.is_empty() {
                            "the content".to_owned()
                        } else {
                            format!("content field `{at}`")
                        };
                        return Err(invalid(format!(
                            "{at} does not match the requested schema: {e}"
                        )));
                    }
                }
                json!({"action": "accept", "content": content})
            }
            "decline" | "cancel" => {
                if answer.content.is_some() {
                    return Err(invalid(format!("`{}` takes no `content`", answer.action)));
                }
                json!({"action": answer.action})
            }
            other => {
                return Err(invalid(format!(
                    "`action` is accept, decline or cancel, not {other:?}"
                )));
            }
        };
        if crate::capability::json_len(&payload) > MAX_PAYLOAD {
            return Err(invalid(format!(
                "the answer is larger than {MAX_PAYLOAD} bytes of JSON"
            )));
        }
        let signal = super::engine::answer_signal(step_id, item);
        if !self.store.send_signal(run_id, &signal, &payload, 1).await? {
            return Err(not_waiting(format!(
                "the question of step `{step_id}` (item {item}) is answered already"
            )));
        }
        self.signal_local(run_id);
        tracing::info!(run = %run_id, step = step_id, item, action = %answer.action, "question answered");
        Ok(Signalled {
            run_id: run_id.to_owned(),
            signal,
            step: step_id.to_owned(),
            delivery: "waiting",
        })
    }

    /// Run `run_id`, which must be running (or queued): else [`WorkflowError::NotWaiting`]
    /// saying its status and `why` (or [`WorkflowError::UnknownRun`]).
    async fn running_run(
        &self,
        run_id: &str,
        why: &str,
    ) -> Result<crate::domain::RunRow, WorkflowError> {
        let run = self
            .store
            .run(run_id)
            .await?
            .ok_or_else(|| WorkflowError::UnknownRun(run_id.to_owned()))?;
        // A queued run keeps its signals for when it runs.
        if run.status.is_finished() {
            return Err(WorkflowError::NotWaiting {
                run_id: run_id.to_owned(),
                message: format!("it has finished as `{}`; {why}", run.status.as_str()),
            });
        }
        Ok(run)
    }

    /// The names of the signals kept for run `run_id` that no step took
    /// yet (one per signal kept).
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn kept_signals(&self, run_id: &str) -> Result<Vec<String>, WorkflowError> {
        Ok(self
            .store
            .signals(run_id)
            .await?
            .into_iter()
            .filter(|s| s.step_id.is_none())
            .map(|s| s.signal)
            .collect())
    }

    /// Up to `limit` wait steps waiting for their signal, the longest
    /// waiting first (`workflow.waiting`, the console).
    ///
    /// # Errors
    /// [`WorkflowError::Store`].
    pub async fn waiting_steps(
        &self,
        limit: u32,
    ) -> Result<Vec<crate::domain::WaitingStep>, WorkflowError> {
        Ok(self.store.waiting_steps(limit).await?)
    }

    /// Tells the run's wait steps, if this process drives it, that a signal
    /// was sent.
    pub(crate) fn signal_local(&self, run_id: &str) {
        self.with_live(run_id, |live| live.signals.send_modify(|n| *n += 1));
    }
}

impl Spec {
    /// A stored spec, read back.
    fn deserialize_value(value: &Value) -> Result<Spec, String> {
        serde::Deserialize::deserialize(value).map_err(|e: serde_json::Error| e.to_string())
    }
}
