//! The child step (`workflow = "name"`): it runs a configured workflow as a
//! child run, holding no step slot, and gives its output; a durable node's
//! `run-workflow` follows its child the same way.

// The scheduler's types and helpers (`super`) are this step kind's vocabulary.
use super::*;

/// A child step: its input mapping is the child's input. The child starts
/// with an idempotency key of the step, so a host that restarts (or another
/// worker) finds the same child instead of starting a second; the step's
/// stored input says which child it is. Its output is the child's; a child
/// that fails or is cancelled fails the step with its error.
pub(super) async fn child_step(
    ctx: &RunCtx,
    step: &Step,
    data: Arc<Value>,
    attempt: Attempt,
    stop: &CancellationToken,
) -> Outcome {
    let workflow = step.spec.workflow.as_deref().unwrap_or_default();
    let input = match step_input(step, &data, None).await {
        Ok(input) => input,
        Err(f) => return Outcome::Failed(f),
    };
    let stored = json!({"workflow": workflow, "input": input});
    if !attempt.recorded
        && let Err(e) = step_started(ctx, &step.spec.id, attempt.first, &stored).await
    {
        return store_failure(e);
    }
    let key = format!("{}/{}/child", ctx.run_id, step.spec.id);
    let _asleep = ctx.asleep.enter();
    let answer = match child_run(ctx, step, None, workflow, input, key, stop).await {
        Ok(answer) => answer,
        Err(outcome) => return outcome,
    };
    match answer.get("output") {
        Some(output) => Outcome::Succeeded(output.clone()),
        None => Outcome::Failed(Failure::new(
            answer["error"]["code"].as_str().unwrap_or("unavailable"),
            answer["error"]["message"].as_str().unwrap_or_default(),
        )),
    }
}

/// Starts (or, after a crash, finds again by its idempotency key) the child
/// run of `workflow` on `input`, and follows it to its end: its answer is
/// `{"run_id", "output"}` or `{"run_id", "error"}`. A stop because this run
/// was cancelled cancels the child too; a host shutdown leaves it to run.
pub(super) async fn child_run(
    ctx: &RunCtx,
    step: &Step,
    journal: Option<&StepJournal>,
    workflow: &str,
    input: Value,
    key: String,
    stop: &CancellationToken,
) -> Result<Value, Outcome> {
    let error = |run_id: Option<&str>, code: &str, message: String| json!({"run_id": run_id, "error": {"code": code, "message": message}});
    let Some(workflows) = ctx.workflows.upgrade() else {
        return Err(Outcome::Interrupted);
    };
    let trigger = json!({"kind": "parent", "run_id": ctx.run_id, "step": step.spec.id});
    let parent = crate::trace::TraceParent::none();
    let child = match workflows
        .start_triggered(workflow, input, Some(key), trigger, &parent)
        .await
    {
        Ok(started) => started.run.run_id,
        Err(e) => {
            let code = match &e {
                WorkflowError::UnknownWorkflow { .. } => "unknown-workflow",
                WorkflowError::InvalidInput { .. } => "invalid-input",
                WorkflowError::ShuttingDown => return Err(Outcome::Interrupted),
                _ => "unavailable",
            };
            return Ok(error(None, code, e.to_string()));
        }
    };
    let message = format!("waiting for run `{child}` of `{workflow}`");
    match journal {
        Some(journal) => {
            let told = json!({"child": child, "workflow": workflow});
            park_told(ctx, step, journal, told, message).await;
        }
        None => {
            tracing::info!(run = %ctx.run_id, step = %step.spec.id, "{message}");
            let data =
                json!({"step": step.spec.id, "item": 0, "child": child, "workflow": workflow});
            ctx.events.emit(&ctx.run_id, "step.parked", data).await;
        }
    }
    loop {
        let record = tokio::select! {
            record = workflows.wait_run(&child, Duration::from_secs(60)) => record,
            () = stop.cancelled() => {
                if ctx.cancel.is_cancelled() {
                    tracing::info!(run = %ctx.run_id, child = %child, "the run is cancelled; so is its child");
                    if let Err(e) = workflows.cancel(&child).await {
                        tracing::warn!(run = %ctx.run_id, child = %child, "cannot cancel the child run: {e}");
                    }
                }
                return Err(Outcome::Interrupted);
            }
        };
        let record = match record {
            Ok(record) => record,
            Err(WorkflowError::ShuttingDown) => return Err(Outcome::Interrupted),
            Err(e) => return Ok(error(Some(&child), "unavailable", e.to_string())),
        };
        if !record.status.is_finished() {
            if workflows.is_closing() {
                return Err(Outcome::Interrupted);
            }
            if record.status == RunStatus::Paused {
                // A paused child is waited for without asking on and on.
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = stop.cancelled() => return Err(Outcome::Interrupted),
                }
            }
            continue;
        }
        return Ok(match (record.status, record.output, record.error) {
            (RunStatus::Succeeded, output, _) => {
                json!({"run_id": child, "output": output.unwrap_or(Value::Null)})
            }
            (status, _, Some(failure)) => error(
                Some(&child),
                &failure.code,
                format!(
                    "run `{child}` of `{workflow}` {}: {}",
                    status.as_str(),
                    failure.message
                ),
            ),
            (status, _, None) => error(
                Some(&child),
                status.as_str(),
                format!("run `{child}` of `{workflow}` {}", status.as_str()),
            ),
        });
    }
}
