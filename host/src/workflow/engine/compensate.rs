//! Compensation (a saga): when a run fails or is cancelled, the steps that
//! succeeded and name a `compensate` node are undone, one after the other,
//! in reverse order of completion.
//!
//! The compensations are steps of the run, added `pending` by the move that
//! begins them ([`Transition::RunCompensating`]), which also stores how the
//! run will end. So a crash while they run leaves a state a later driver
//! picks up: a compensation that succeeded or failed is never run again, one
//! that was running runs again as its next attempt, and the run then ends as
//! the stored end says, with what the compensations did added to its error.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::component::{Attempt, run_step};
use super::{Ending, Outcome, RunCtx, StepState, apply, end_run, transition};
use serde::Deserialize;

use crate::domain::{Failure, RunRow, RunStatus, StepRow, StepStatus, Transition};
use crate::store::StoreError;
use crate::trace;
use crate::workflow::definition::{Spec, StepSpec, compensated_by, compensation_id};

/// How a run that began compensating will end, as its row stores it: a
/// run that is not finished and has an error is compensating (only
/// [`Transition::RunCompensating`] and [`Transition::RunCancelCompensating`]
/// give an unfinished run an error). It ends `cancelled` when it was
/// cancelled, else `failed`.
pub(crate) fn compensating(run: &RunRow) -> Option<(RunStatus, Failure)> {
    if run.status.is_finished() || run.status == RunStatus::Queued {
        return None;
    }
    let error = run.error.clone()?;
    let status = if error.code == "cancelled" {
        RunStatus::Cancelled
    } else {
        RunStatus::Failed
    };
    Some((status, error))
}

/// The compensations a run that ends now must run: of its succeeded steps
/// that have one, latest finished first (steps that finished in the same
/// instant: the later in the graph's order first).
pub(super) fn to_compensate(ctx: &RunCtx, states: &HashMap<String, StepState>) -> Vec<String> {
    latest_first(ctx.def.steps.iter().map(|s| &s.spec), |id| {
        states.get(id).map(|s| (s.status, s.finished_at.as_deref()))
    })
}

/// [`to_compensate`] of a stored run nothing drives, from its definition
/// and its steps as stored.
pub(crate) fn to_compensate_stored(run: &RunRow, rows: &[StepRow]) -> Vec<String> {
    let Ok(spec) = Spec::deserialize(&*run.definition) else {
        return Vec::new();
    };
    latest_first(spec.steps.iter(), |id| {
        rows.iter()
            .find(|r| r.step_id == id)
            .map(|r| (r.status, r.finished_at.as_deref()))
    })
}

/// The compensations of the `steps` that `state` says succeeded, latest
/// finished first (the later in `steps`' order first at the same time).
fn latest_first<'a>(
    steps: impl Iterator<Item = &'a StepSpec>,
    state: impl Fn(&str) -> Option<(StepStatus, Option<&'a str>)>,
) -> Vec<String> {
    let mut done: Vec<(String, usize, &str)> = steps
        .enumerate()
        .filter(|(_, s)| s.compensate.is_some())
        .filter_map(|(order, s)| match state(&s.id)? {
            (StepStatus::Succeeded, at) => {
                Some((at.unwrap_or("").to_owned(), order, s.id.as_str()))
            }
            _ => None,
        })
        .collect();
    done.sort();
    done.iter()
        .rev()
        .map(|(_, _, id)| compensation_id(id))
        .collect()
}

/// Begins compensating `undo` (in that order) for a run that will end
/// `status` with `error`: stores both (after `step`'s end, in the same
/// write, when given), then runs them.
pub(super) async fn begin(
    ctx: &Arc<RunCtx>,
    states: &mut HashMap<String, StepState>,
    (status, error): (RunStatus, Failure),
    undo: Vec<String>,
    step: Option<Transition<'_>>,
) -> Result<Ending, StoreError> {
    let ids = json!(undo);
    let moves = Transition::RunCompensating {
        status,
        error: &error,
        steps: &ids,
    };
    match step {
        Some(step) => apply(ctx, &[step, moves]).await?,
        None => apply(ctx, &[moves]).await?,
    };
    tracing::info!(run = %ctx.run_id, steps = ?undo, "run compensating");
    for id in &undo {
        states.insert(id.clone(), StepState::pending());
    }
    run(ctx, states, (status, error), &undo).await
}

/// Runs the compensations `order` that have not finished, one after the
/// other, then ends the run as it was to end, with what they did added to
/// its error. A failed compensation does not stop the others.
pub(super) async fn run(
    ctx: &Arc<RunCtx>,
    states: &mut HashMap<String, StepState>,
    (status, error): (RunStatus, Failure),
    order: &[String],
) -> Result<Ending, StoreError> {
    // The steps' inputs, as their starts stored them.
    let inputs: HashMap<String, Option<Value>> = ctx
        .store
        .steps(&ctx.run_id)
        .await?
        .into_iter()
        .map(|r| (r.step_id, r.input))
        .collect();
    for id in order {
        let state = &states[id];
        if state.status.is_finished() {
            continue;
        }
        let Some(step) = ctx.def.compensations.get(id) else {
            let f = Failure::new(
                "definition-changed",
                "the run's definition has no such compensation",
            );
            transition(ctx, states, id, StepStatus::Failed, None, Some(f), None).await?;
            continue;
        };
        let undone = compensated_by(id).unwrap_or(id);
        let data = json!({
            "input": inputs.get(undone).cloned().flatten().unwrap_or(Value::Null),
            "output": states.get(undone).and_then(|s| s.output.clone()).unwrap_or(Value::Null),
            "run": {"input": ctx.input_value(), "error": error},
        });
        let attempt = Attempt {
            first: state.attempts + 1,
            recorded: false,
            continues: state.interrupted.then_some(state.attempts),
        };
        let span = trace::step_span(&ctx.span, id, attempt.first);
        // Compensations run whatever cancelled the run; only the host's
        // shutdown stops one, to run again at the next start.
        let stop = CancellationToken::new();
        let mut log = None;
        let outcome = {
            let step_run = run_step(ctx, step, data, attempt, &stop, &span, &mut log);
            tokio::pin!(step_run);
            tokio::select! {
                outcome = &mut step_run => outcome,
                _ = ctx.shutdown.cancelled() => {
                    stop.cancel();
                    step_run.await
                }
            }
        };
        outcome.trace(&span);
        let (to, output, failure) = match outcome {
            Outcome::Succeeded(output) => (StepStatus::Succeeded, Some(output), None),
            Outcome::Skipped => (StepStatus::Skipped, None, None),
            Outcome::Failed(f) => (StepStatus::Failed, None, Some(f)),
            Outcome::Interrupted if ctx.shutdown.is_cancelled() => {
                if let Some(log) = log {
                    ctx.events
                        .emit(&ctx.run_id, crate::domain::STEP_LOG, log)
                        .await;
                }
                return Ok(Ending::Interrupted);
            }
            Outcome::Interrupted => (
                StepStatus::Failed,
                None,
                Some(Failure::new("interrupted", "the compensation was stopped")),
            ),
            Outcome::Lost(e) => return Err(e),
        };
        transition(ctx, states, id, to, output, failure, log).await?;
    }
    let error = with_outcome(&error, order, states);
    end_run(ctx, (status, None, Some(error)), None).await
}

/// The run's error with what its compensations did: which steps were
/// undone, and each compensation that failed, with its error.
fn with_outcome(error: &Failure, order: &[String], states: &HashMap<String, StepState>) -> Failure {
    let undone: Vec<&str> = order
        .iter()
        .filter(|id| states[*id].status == StepStatus::Succeeded)
        .filter_map(|id| compensated_by(id))
        .collect();
    let failed: Vec<String> = order
        .iter()
        .filter(|id| states[*id].status == StepStatus::Failed)
        .map(|id| {
            let why = states[id].error.as_ref().map_or("failed".to_owned(), |e| {
                format!("{}: {}", e.code, e.message)
            });
            format!("`{id}` failed ({why})")
        })
        .collect();
    let mut message = error.message.clone();
    if !undone.is_empty() {
        message.push_str(&format!("; compensated: {}", undone.join(", ")));
    }
    if !failed.is_empty() {
        message.push_str(&format!("; compensation {}", failed.join(", ")));
    }
    Failure::new(error.code.clone(), message)
}
