//! The wait step: it waits for its signal (or its timeout), holding no step
//! slot, and finishes with the signal's payload.

// The scheduler's types and helpers (`super`) are this step kind's vocabulary.
use super::*;

/// A wait step (`wait`): waits, holding no step slot, for a signal of its
/// name ([`crate::store::Store::take_signal`]; one sent before the step
/// started was kept for it), and gives its payload as output. What it waits
/// for and until when is stored as its input (`{signal, timeout_at,
/// request}`, `request` being what its input would be), so a host that
/// restarts (or another worker) waits on for what is left (`resumed`).
pub(super) async fn wait_step(
    ctx: &RunCtx,
    step: &Step,
    data: Arc<Value>,
    attempt: Attempt,
    resumed: Option<Value>,
    stop: &CancellationToken,
) -> Outcome {
    let signal = step.spec.wait.as_deref().unwrap_or_default();
    let timeout_at = match resumed {
        Some(input) => input["timeout_at"].as_str().map(str::to_owned),
        None => {
            let request = match step_input(step, &data, None).await {
                Ok(request) => request,
                Err(f) => return Outcome::Failed(f),
            };
            let timeout_at = step.spec.wait_timeout_ms.map(|ms| {
                humantime::format_rfc3339_millis(
                    std::time::SystemTime::now() + Duration::from_millis(ms),
                )
                .to_string()
            });
            let input = json!({"signal": signal, "timeout_at": timeout_at, "request": request});
            let write = Transition::StepWaits {
                step_id: &step.spec.id,
                attempt: attempt.first,
                input: Some(&input),
            };
            if let Err(e) = apply(ctx, &[write]).await {
                return store_failure(e);
            }
            timeout_at
        }
    };
    let deadline = timeout_at.as_deref().map(|at| {
        let left = humantime::parse_rfc3339_weak(at)
            .ok()
            .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
            .unwrap_or_default();
        Instant::now() + left
    });
    let _asleep = ctx.asleep.enter();
    match take_signal(ctx, signal, &step.spec.id, deadline, stop).await {
        Ok(Some(payload)) => Outcome::Succeeded(payload),
        Ok(None) => {
            let limit = step.spec.wait_timeout_ms.unwrap_or_default();
            Outcome::Failed(Failure::new(
                "timeout",
                format!(
                    "no `{signal}` signal came within {}",
                    humantime::format_duration(Duration::from_millis(limit))
                ),
            ))
        }
        Err(outcome) => outcome,
    }
}

/// The payload of the signal `name` sent to the run, taken for `taker` (a
/// wait step's id, or a durable node's wait: a restart takes the same one
/// again); `None` when `deadline` passed first. Holds nothing while it
/// waits: it looks when a signal is sent here, and every so often for one
/// sent through another worker.
pub(super) async fn take_signal(
    ctx: &RunCtx,
    name: &str,
    taker: &str,
    deadline: Option<Instant>,
    stop: &CancellationToken,
) -> Result<Option<Value>, Outcome> {
    let mut sent = ctx.signals.clone();
    let poll = if ctx.store.shared() {
        SIGNAL_POLL_SHARED
    } else {
        SIGNAL_POLL_ALONE
    };
    loop {
        // Seen before looking, so a signal sent while looking wakes the wait.
        sent.borrow_and_update();
        match ctx.store.take_signal(&ctx.run_id, name, taker).await {
            Ok(Some(payload)) => return Ok(Some(payload)),
            Ok(None) => {}
            Err(e) if e.is_unavailable() => {
                tracing::warn!(run = %ctx.run_id, "cannot look for signal `{name}`: {e}");
            }
            Err(e) => return Err(store_failure(e)),
        }
        tokio::select! {
            Ok(()) = sent.changed() => {}
            _ = tokio::time::sleep(poll) => {}
            _ = sleep_until(deadline), if deadline.is_some() => {
                // A signal sent just before the deadline still counts.
                if let Ok(Some(payload)) = ctx.store.take_signal(&ctx.run_id, name, taker).await {
                    return Ok(Some(payload));
                }
                return Ok(None);
            }
            _ = stop.cancelled() => return Err(Outcome::Interrupted),
        }
    }
}
