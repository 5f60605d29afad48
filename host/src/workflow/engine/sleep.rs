//! The durable sleep step: it sleeps until its wake time, holding no step
//! slot; a resumed run sleeps only what is left.

// The scheduler's types and helpers (`super`) are this step kind's vocabulary.
use super::*;

/// A durable sleep (`sleep` or `until`). Its wake time is stored as the
/// step's input (`{"until": <RFC 3339>}`) when it starts, so a host that
/// restarts (or another worker that takes the run over) sleeps only what is
/// left (`resumed`). It runs no node and holds no step slot. Its output is
/// what its input would be (its needs' outputs, or its `input` mapping):
/// data passes through it.
pub(super) async fn sleep_step(
    ctx: &RunCtx,
    step: &Step,
    data: Arc<Value>,
    attempt: Attempt,
    resumed: Option<String>,
    stop: &CancellationToken,
) -> Outcome {
    let output = match step_input(step, &data, None).await {
        Ok(output) => output,
        Err(f) => return Outcome::Failed(f),
    };
    let until = match resumed {
        Some(until) => until,
        None => {
            let until = match wake_time(step, &data).await {
                Ok(until) => humantime::format_rfc3339_millis(until).to_string(),
                Err(f) => return Outcome::Failed(f),
            };
            let input = json!({ "until": until });
            // The host's own bookkeeping: never the workflow's `redact`
            // fields (its wake time must survive a restart).
            let start = start_of(&step.spec.id, attempt.first, &input);
            if !attempt.recorded
                && let Err(e) = ctx
                    .events
                    .apply(&ctx.run_id, &[start], Some(&ctx.fence))
                    .await
            {
                return store_failure(e);
            }
            until
        }
    };
    let left = humantime::parse_rfc3339_weak(&until)
        .ok()
        .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
        .unwrap_or_default();
    let _asleep = ctx.asleep.enter();
    tokio::select! {
        _ = tokio::time::sleep(left) => Outcome::Succeeded(output),
        _ = stop.cancelled() => Outcome::Interrupted,
    }
}

/// When a sleep step that starts now wakes: `sleep` from now, or the time
/// its `until` gives.
async fn wake_time(step: &Step, data: &Arc<Value>) -> Result<std::time::SystemTime, Failure> {
    if let Some(ms) = step.spec.sleep_ms {
        return Ok(std::time::SystemTime::now() + Duration::from_millis(ms));
    }
    let Some(expr) = step.until.clone() else {
        return Err(Failure::new(
            "until",
            "a sleep step has no `sleep` or `until`",
        ));
    };
    let d = data.clone();
    let value = jq("until", move || expr.eval(&d)).await?;
    value
        .as_str()
        .and_then(|text| humantime::parse_rfc3339_weak(text).ok())
        .ok_or_else(|| {
            Failure::new(
                "until",
                format!("`until` gave {value}, not an RFC 3339 time in UTC (such as `2026-12-24T18:00:00Z`)"),
            )
        })
}
