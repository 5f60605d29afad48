//! The component step: its node run, item by item for a `for_each`, with
//! its attempts, deadlines, parking and the journal of its calls.

// The scheduler's types and helpers (`super`) are this step kind's vocabulary.
use super::*;

/// The first attempt a step's launch makes, and whether its start is
/// stored already (with the run).
#[derive(Clone, Copy)]
pub(super) struct Attempt {
    pub(super) first: u32,
    pub(super) recorded: bool,
    /// The attempt its host stopped in (a crash, a restart): a durable node
    /// goes on from that attempt's journal.
    pub(super) continues: Option<u32>,
}

/// Runs one step: its condition, its input mapping, then its node once (or
/// once per `for_each` item), with retries.
pub(super) async fn run_step(
    ctx: &Arc<RunCtx>,
    step: &Step,
    data: Value,
    attempt: Attempt,
    stop: &CancellationToken,
    span: &tracing::Span,
    log: &mut Option<Value>,
) -> Outcome {
    let id = &step.spec.id;
    let data = Arc::new(data);
    if let Some(cond) = step.condition.clone() {
        let d = data.clone();
        match jq("condition", move || cond.eval_bool(&d)).await {
            Ok(true) => {}
            Ok(false) => return Outcome::Skipped,
            Err(f) => return Outcome::Failed(f),
        }
    }
    if step.spec.sleeps() {
        return sleep_step(ctx, step, data, attempt, None, stop).await;
    }
    if step.spec.waits() {
        return wait_step(ctx, step, data, attempt, None, stop).await;
    }
    if step.spec.runs_child() {
        return child_step(ctx, step, data, attempt, stop).await;
    }
    // The attempt counter is the step's, shared by its items: every node run
    // (a first try or a retry) takes the next number, so the journal never
    // mixes two runs of the node.
    let first_attempt = attempt.first;
    let attempts = AtomicU32::new(first_attempt);
    let Some(each) = step.for_each.clone() else {
        let input = match step_input(step, &data, None).await {
            Ok(input) => input,
            Err(f) => return Outcome::Failed(f),
        };
        if !attempt.recorded
            && let Err(e) = step_started(ctx, id, first_attempt, &input).await
        {
            return store_failure(e);
        }
        let item = Item {
            index: None,
            continues: attempt.continues,
        };
        // The node gets its input as text: the values are not kept while it
        // runs (or waits, for hours).
        let text = input.to_string();
        drop((input, data));
        return match run_item(ctx, step, item, &text, &attempts, stop, span, Some(log)).await {
            Ok(output) => Outcome::Succeeded(output),
            Err(outcome) => outcome,
        };
    };
    let d = data.clone();
    let items = match jq("input-mapping", move || each.eval_array(&d)).await {
        Ok(items) if items.len() > MAX_ITEMS => {
            return Outcome::Failed(Failure::new(
                "input-mapping",
                format!(
                    "`for_each` produced {} items; the limit is {MAX_ITEMS}",
                    items.len()
                ),
            ));
        }
        Ok(items) => items,
        Err(f) => return Outcome::Failed(f),
    };
    // The step's recorded input is its items; each item's input is mapped
    // only when the item runs.
    let all = Value::Array(items);
    if let Err(e) = step_started(ctx, id, first_attempt, &all).await {
        return store_failure(e);
    }
    let Value::Array(items) = all else {
        unreachable!("built as an array above")
    };
    // Each item is its own task, so items run on every core; at most
    // `concurrency` at once, outputs kept in item order. The first failure
    // stops the rest.
    let attempts = Arc::new(attempts);
    let continues = attempt.continues;
    let step = Arc::new(step.clone());
    let count = items.len();
    let mut pending = items.into_iter().enumerate();
    let mut outputs: Vec<Option<Value>> = vec![None; count];
    let mut running: JoinSet<(usize, Result<Value, Outcome>)> = JoinSet::new();
    let mut failed: Option<Outcome> = None;
    loop {
        while failed.is_none() && running.len() < step.spec.concurrency {
            let Some((index, item)) = pending.next() else {
                break;
            };
            let (ctx, step, data) = (ctx.clone(), step.clone(), data.clone());
            let (attempts, stop, span) = (attempts.clone(), stop.clone(), span.clone());
            running.spawn(async move {
                let mut item_data = (*data).clone();
                item_data["item"] = item;
                item_data["index"] = json!(index);
                let input = step_input(&step, &item_data, Some(index)).await;
                drop((item_data, data));
                let result = match input {
                    Ok(input) => {
                        let item = Item {
                            index: Some(index),
                            continues,
                        };
                        let text = input.to_string();
                        drop(input);
                        run_item(&ctx, &step, item, &text, &attempts, &stop, &span, None).await
                    }
                    Err(f) => Err(Outcome::Failed(f)),
                };
                (index, result)
            });
        }
        let Some(joined) = running.join_next().await else {
            break;
        };
        match joined {
            Ok((index, Ok(output))) => outputs[index] = Some(output),
            Ok((_, Err(outcome))) => {
                if failed.is_none() {
                    failed = Some(outcome);
                    // Dropping a node run mid-flight cancels it (and its
                    // upstream call).
                    running.abort_all();
                }
            }
            Err(e) if e.is_cancelled() => {}
            Err(e) => {
                failed.get_or_insert(Outcome::Failed(Failure::new(
                    "trap",
                    format!("a for_each item's task failed: {e}"),
                )));
                running.abort_all();
            }
        }
    }
    let outputs = match failed {
        Some(outcome) => Err(outcome),
        None => Ok(outputs
            .into_iter()
            .map(|o| o.unwrap_or(Value::Null))
            .collect()),
    };
    match outputs {
        Ok(outputs) => Outcome::Succeeded(Value::Array(outputs)),
        Err(outcome) => outcome,
    }
}

/// A parked step ([`super::parking`]): its node run was stopped while it
/// waited, on an upstream task or on a wait of its own; the step waits in
/// its place, holding no instance and no step slot, and gives back the
/// answers the next run of the node gets.
async fn follow_parked(
    ctx: &RunCtx,
    step: &Step,
    journal: &StepJournal,
    parked: Parked,
    stop: &CancellationToken,
) -> Result<Vec<Answered>, Outcome> {
    let _asleep = ctx.asleep.enter();
    match &parked.on {
        // Boxed: a future holds room for its largest branch, and a parked
        // step waits in this one for as long as it waits.
        ParkedOn::Task { .. } => Box::pin(follow_task(ctx, step, journal, parked, stop)).await,
        ParkedOn::Wait(Wait::Sleep { until_ms }) => {
            let until = std::time::UNIX_EPOCH + Duration::from_millis(*until_ms);
            let at = humantime::format_rfc3339_millis(until).to_string();
            park_told(
                ctx,
                step,
                journal,
                json!({"sleep_until": at}),
                format!("sleeping until {at}"),
            )
            .await;
            let left = until
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            tokio::select! {
                () = tokio::time::sleep(left) => {}
                () = stop.cancelled() => return Err(Outcome::Interrupted),
            }
            Ok(parked.earlier())
        }
        ParkedOn::Wait(Wait::Signal { name, timeout }) => {
            let (name, timeout) = (name.clone(), *timeout);
            let timeout_at = timeout.map(|t| {
                humantime::format_rfc3339_millis(std::time::SystemTime::now() + t).to_string()
            });
            park_told(
                ctx,
                step,
                journal,
                json!({"signal": name, "timeout_at": timeout_at}),
                format!("waiting for signal `{name}`"),
            )
            .await;
            let taker = format!("{}/{}/{}", step.spec.id, journal.item, parked.seq);
            let deadline = timeout.map(|t| Instant::now() + t);
            let result = match take_signal(ctx, &name, &taker, deadline, stop).await? {
                Some(payload) => Ok(json!({ "payload": payload })),
                None => Err(crate::capability::CapabilityError::Timeout(format!(
                    "no `{name}` signal came within {}",
                    humantime::format_duration(timeout.unwrap_or_default())
                ))),
            };
            Ok(parked.answers(result))
        }
        ParkedOn::Wait(Wait::Child { workflow, input }) => {
            let key = format!("{}/{}/{}", journal.key_prefix(), parked.seq, workflow);
            let child = child_run(ctx, step, Some(journal), workflow, input.clone(), key, stop);
            let answer = Box::pin(child).await?;
            Ok(parked.answers(Ok(answer)))
        }
    }
}

/// Says that the step let go of its node, and what it waits for: a
/// `step.parked` event (with `what`) and the step's progress message.
pub(super) async fn park_told(
    ctx: &RunCtx,
    step: &Step,
    journal: &StepJournal,
    what: Value,
    message: String,
) {
    tracing::info!(run = %ctx.run_id, step = %step.spec.id, item = journal.item,
        "the node waits; it is let go until {message}");
    let mut data = json!({"step": step.spec.id, "item": journal.item});
    if let (Some(data), Value::Object(what)) = (data.as_object_mut(), what) {
        data.extend(what);
    }
    ctx.events.emit(&ctx.run_id, "step.parked", data).await;
    journal.progress(Progress {
        progress: 0.0,
        total: None,
        message: Some(message),
    });
}

/// A step parked on an upstream task: its node run was stopped while its
/// call waited on the task; the step follows that task itself. The call is
/// made again with its idempotency key, which finds the task kept under it,
/// so the pool follows the task (it calls the tool again only when the
/// server no longer knows the task). A stop drops the call, which cancels
/// the task upstream (not on a host shutdown: the next start follows it).
async fn follow_task(
    ctx: &RunCtx,
    step: &Step,
    journal: &StepJournal,
    parked: Parked,
    stop: &CancellationToken,
) -> Result<Vec<Answered>, Outcome> {
    use crate::capability::{
        CallExtras, IDEMPOTENCY_META_KEY, split_qualified, tool_result_to_outcome,
    };
    let ParkedOn::Task {
        key,
        connection,
        task_id,
    } = &parked.on
    else {
        unreachable!("follow_parked follows tasks here")
    };
    tracing::info!(run = %ctx.run_id, step = %step.spec.id, item = journal.item,
        connection = %connection, task = %task_id,
        "the step's call waits on an upstream task; its node is let go until the task ends");
    ctx.events
        .emit(
            &ctx.run_id,
            "step.parked",
            json!({"step": step.spec.id, "item": journal.item, "call": parked.name,
                   "connection": connection, "task": task_id}),
        )
        .await;
    journal.progress(Progress {
        progress: 0.0,
        total: None,
        message: Some(format!("waiting for task `{task_id}` of `{}`", parked.name)),
    });
    // The follow's own ledger: it keeps no task when dropped.
    let follower = Arc::new(step_journal(
        ctx,
        step,
        journal.item,
        journal.attempt,
        Vec::new(),
    ));
    let follow = async {
        let (connection, tool) = split_qualified(&parked.name)?;
        let Value::Object(arguments) = parked.arguments.clone() else {
            return Err(crate::capability::CapabilityError::InvalidArguments(
                "arguments must be a JSON object".into(),
            ));
        };
        let mut extras = CallExtras::default();
        extras
            .meta
            .insert(IDEMPOTENCY_META_KEY.into(), Value::String(key.clone()));
        extras.tasks = follower.tasks().map(|ledger| (key.clone(), ledger));
        extras.elicit = follower.elicitor();
        let follower = follower.clone();
        extras.progress = Some(Arc::new(move |p: Progress| follower.progress(p)));
        ctx.runtime
            .backend()
            .call_tool_with(connection, tool, arguments, extras)
            .await
            .and_then(tool_result_to_outcome)
    };
    let result = tokio::select! {
        result = follow => result,
        _ = stop.cancelled() => return Err(Outcome::Interrupted),
    };
    tracing::info!(run = %ctx.run_id, step = %step.spec.id, item = journal.item,
        task = %task_id, ok = result.is_ok(), "the upstream task ended; the node runs again");
    Ok(parked.answers(result))
}

/// Which item of a step a node run is (`None`: the step has one), and the
/// attempt whose journal it goes on from, if any.
#[derive(Clone, Copy)]
pub(super) struct Item {
    index: Option<usize>,
    continues: Option<u32>,
}

/// The answers a durable node's run after a crash is given: the journal of
/// attempt `attempt` of its item, when the node waited in it (its calls and
/// waits, each answered again, and journaled anew under the new attempt).
/// Empty for a node that never waited: it runs again as any node does. A
/// call whose result was too large to keep ends the answers there.
async fn journaled_answers(
    ctx: &RunCtx,
    step: &Step,
    item: u32,
    attempt: u32,
) -> Result<Vec<Answered>, Outcome> {
    let calls = ctx
        .store
        .calls(&ctx.run_id, &step.spec.id)
        .await
        .map_err(store_failure)?;
    let mut mine: Vec<_> = calls
        .into_iter()
        .filter(|c| c.attempt == attempt && c.item == item)
        .collect();
    if !mine.iter().any(|c| Answered::is_wait(&c.name)) {
        return Ok(Vec::new());
    }
    mine.sort_by_key(|c| c.seq);
    let mut answers = Vec::new();
    for (expected, call) in (1..).zip(mine) {
        let Some(result) = call.result.filter(|_| call.seq == expected) else {
            tracing::warn!(run = %ctx.run_id, step = %step.spec.id, item, seq = expected,
                "the journal of the interrupted attempt has no answer for this call; the node goes on live from it");
            break;
        };
        let result = match &call.error_code {
            Some(_) => Err(crate::capability::CapabilityError::from_json(
                &result["error"],
            )),
            None => Ok(result),
        };
        let took = Duration::from_micros(call.duration_us);
        let tape = tape_of(call.tape.as_ref());
        answers.push(Answered::journaled(
            call.seq,
            call.name,
            call.arguments,
            result,
            took,
            tape,
        ));
    }
    tracing::info!(run = %ctx.run_id, step = %step.spec.id, item, attempt, answers = answers.len(),
        "a durable node goes on from its journal after its host stopped");
    Ok(answers)
}

/// Runs the node on one input, retrying as the step's policy says.
///
/// An attempt's log records become a `step.log` event. With `deferred`, the
/// last attempt's is left there, to be stored with the step's transition (one
/// write fewer); earlier attempts' are emitted before their retry.
#[allow(clippy::too_many_arguments)]
async fn run_item(
    ctx: &RunCtx,
    step: &Step,
    item: Item,
    text: &str,
    attempts: &AtomicU32,
    stop: &CancellationToken,
    span: &tracing::Span,
    mut deferred: Option<&mut Option<Value>>,
) -> Result<Value, Outcome> {
    let node = &ctx.nodes[&step.spec.id];
    let mut tries = 0u32;
    let mut attempt = attempts.load(Ordering::Relaxed);
    let Item {
        index: item,
        continues,
    } = item;
    let item_no = item.unwrap_or(0) as u32;
    // The answers a run of the node after a parked one is given.
    let mut answers: Option<Vec<Answered>> = None;
    // The first run's, going on from an interrupted attempt.
    let mut carried = match continues {
        Some(before) => journaled_answers(ctx, step, item_no, before).await?,
        None => Vec::new(),
    };
    loop {
        // A run after a parked one goes on with the same attempt.
        if answers.is_none() {
            tries += 1;
        }
        let replay = answers
            .take()
            .unwrap_or_else(|| std::mem::take(&mut carried));
        let journal = Arc::new(step_journal(ctx, step, item_no, attempt, replay));
        let ran = {
            let permit = tokio::select! {
                permit = ctx.slots.acquire() => permit,
                _ = stop.cancelled() => return Err(Outcome::Interrupted),
            };
            let _permit = permit.expect("the step slots are never closed");
            let run_id = match item {
                Some(i) => format!("{}/{}/{i}", ctx.run_id, step.spec.id),
                None => format!("{}/{}", ctx.run_id, step.spec.id),
            };
            let cancel = stop.child_token();
            let opts = RunOptions {
                run_id,
                limits: Some(step.limits),
                cancel: cancel.clone(),
                grants: step.grants.clone(),
                journal: Some(journal.clone()),
                span: span.clone(),
            };
            let run = ctx.runtime.run(node, text, opts);
            tokio::pin!(run);
            tokio::select! {
                report = &mut run => (report, None),
                parked = journal.parking.parks(PARK_AFTER) => {
                    // Stopped like a cancel; its call's task is kept.
                    cancel.cancel();
                    (run.await, Some(parked))
                }
            }
        };
        let report = match ran {
            // Parked (not stopped by the run's own cancel or deadline): its
            // logs are what the next run logs again.
            (
                RunReport {
                    result: Err(RunError::Cancelled),
                    ..
                },
                Some(parked),
            ) if !stop.is_cancelled() => {
                answers = Some(follow_parked(ctx, step, &journal, parked, stop).await?);
                journal.resumed().await;
                continue;
            }
            (report, _) => report,
        };
        if !report.logs.is_empty() {
            let data = json!({"step": step.spec.id, "item": item_no, "attempt": attempt, "records": report.logs});
            match deferred.as_deref_mut() {
                Some(slot) => *slot = Some(data),
                None => ctx.events.emit(&ctx.run_id, STEP_LOG, data).await,
            }
        }
        // A durable node that ran differently from its journal fails,
        // whatever it answered: its calls past the difference were not made.
        if let Some(diverged) = journal.parking.diverged() {
            return Err(Outcome::Failed(Failure::new("diverged", diverged)));
        }
        let result = report.result;
        let failure = match result {
            Ok(output) => {
                return serde_json::from_str(&output)
                    .map_err(|e| Outcome::Failed(Failure::new("invalid-output", e.to_string())));
            }
            Err(RunError::Cancelled) => return Err(Outcome::Interrupted),
            Err(e) => Failure::new(
                e.code(),
                match &e {
                    RunError::Node { message, .. } => message.clone(),
                    other => other.to_string(),
                },
            ),
        };
        if !step.spec.retry.retries(&failure.code, tries) {
            return Err(Outcome::Failed(failure));
        }
        // Retrying: this attempt's log comes before the next one starts.
        if let Some(data) = deferred.as_deref_mut().and_then(Option::take) {
            ctx.events.emit(&ctx.run_id, STEP_LOG, data).await;
        }
        let delay: Duration = step.spec.retry.delay(tries);
        tracing::info!(
            run = %ctx.run_id, step = %step.spec.id, attempt, code = %failure.code,
            "step attempt failed; retrying in {delay:?}"
        );
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.cancelled() => return Err(Outcome::Interrupted),
        }
        attempt = attempts.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(target: trace::TARGET, parent: span, code = %failure.code, attempt, "retry");
        span.record("wf.attempt", attempt);
        let write = Transition::StepAttempt {
            step_id: &step.spec.id,
            attempt,
        };
        apply(ctx, &[write]).await.map_err(store_failure)?;
    }
}
