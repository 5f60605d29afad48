//! The step's capability wrappers: the journal that records a node run's
//! calls in the store (and answers them again after a park), the elicitor
//! that turns an upstream server's question into a signal the run waits
//! for, and the ledger of the upstream tasks its calls follow.

// The scheduler's types and helpers (`super`) are this step kind's vocabulary.
use super::*;

/// Records a step attempt's capability calls in the store.
pub(super) struct StepJournal {
    store: Arc<dyn Store>,
    run_id: String,
    step_id: String,
    pub(super) item: u32,
    pub(super) attempt: u32,
    prefix: String,
    progress: StepProgress,
    events: Events,
    fence: Fence,
    /// Bumped when a signal (an answer too) is sent to the run.
    signals: tokio::sync::watch::Receiver<u64>,
    /// The workflow's `redact` fields.
    redact: Arc<Spec>,
    /// The process is stopping: a journal write waiting for the store
    /// gives up.
    shutdown: CancellationToken,
    /// This node run's calls, for a step that parks ([`super::parking`]).
    pub(super) parking: Arc<Parking>,
}

/// The signal that answers the question step `step_id` (item `item`) was
/// asked: `workflow.answer` sends it.
pub(crate) fn answer_signal(step_id: &str, item: u32) -> String {
    format!("answer:{step_id}/{item}")
}

/// Puts the questions a step's calls are asked to whoever answers the run:
/// the question is kept in the store (`workflow.get`, the console) and sent
/// as a `step.question` event, and the answer comes as a signal
/// ([`answer_signal`]).
struct StepElicitor {
    store: Arc<dyn Store>,
    run_id: String,
    step_id: String,
    item: u32,
    events: Events,
    signals: tokio::sync::watch::Receiver<u64>,
}

impl StepElicitor {
    async fn take_answer(&self, signal: &str) -> Option<crate::capability::Answer> {
        match self
            .store
            .take_signal(&self.run_id, signal, &self.step_id)
            .await
        {
            Ok(Some(payload)) => Some(
                serde_json::from_value(payload)
                    .unwrap_or_else(|_| crate::capability::Answer::decline()),
            ),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(run = %self.run_id, step = %self.step_id,
                    "cannot look for the answer to a question: {e}");
                None
            }
        }
    }
}

#[async_trait::async_trait]
impl crate::capability::Elicitor for StepElicitor {
    async fn ask(
        &self,
        question: crate::capability::Question,
        within: Duration,
    ) -> crate::capability::Answer {
        use crate::capability::Answer;
        let signal = answer_signal(&self.step_id, self.item);
        // An answer left from an earlier question (sent as it timed out)
        // is not this one's.
        let _ = self.take_answer(&signal).await;
        // Kept in the store: what an upstream asks holds no known secret.
        let asked = serde_json::to_value(&question).unwrap_or_default();
        let asked = crate::secrets::redact_json(&asked).unwrap_or(asked);
        if let Err(e) = self
            .store
            .put_question(&self.run_id, &self.step_id, self.item, Some(&asked))
            .await
        {
            tracing::warn!(run = %self.run_id, step = %self.step_id,
                "cannot keep the question; declined: {e}");
            return Answer::decline();
        }
        tracing::info!(run = %self.run_id, step = %self.step_id, connection = %question.connection,
            tool = %question.tool, "the server asks a question; waiting for `workflow.answer`");
        self.events
            .emit(
                &self.run_id,
                "step.question",
                json!({"step": self.step_id, "item": self.item, "question": asked}),
            )
            .await;
        let deadline = Instant::now() + within;
        let mut sent = self.signals.clone();
        let answer = loop {
            sent.borrow_and_update();
            if let Some(answer) = self.take_answer(&signal).await {
                break answer;
            }
            tokio::select! {
                Ok(()) = sent.changed() => {}
                _ = tokio::time::sleep(SIGNAL_POLL_SHARED) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    // An answer sent just before the deadline still counts.
                    if let Some(answer) = self.take_answer(&signal).await {
                        break answer;
                    }
                    tracing::info!(run = %self.run_id, step = %self.step_id,
                        "no answer within {}; declined", humantime::format_duration(within));
                    break Answer::decline();
                }
            }
        };
        if let Err(e) = self
            .store
            .put_question(&self.run_id, &self.step_id, self.item, None)
            .await
        {
            tracing::warn!(run = %self.run_id, step = %self.step_id, "cannot forget the question: {e}");
        }
        self.events
            .emit(
                &self.run_id,
                "step.answered",
                json!({"step": self.step_id, "item": self.item, "action": answer.action}),
            )
            .await;
        answer
    }
}

/// The upstream tasks of a run's calls, kept in the store.
struct RunTasks {
    store: Arc<dyn Store>,
    run_id: String,
    parking: Arc<Parking>,
}

#[async_trait::async_trait]
impl crate::capability::TaskLedger for RunTasks {
    async fn task_of(&self, key: &str) -> Option<String> {
        match self.store.task_of(key).await {
            Ok(task) => task,
            Err(e) => {
                tracing::warn!(run = %self.run_id, "cannot look up the call's upstream task: {e}");
                None
            }
        }
    }

    async fn task_started(&self, key: &str, connection: &str, task_id: &str) {
        if let Err(e) = self
            .store
            .record_task(&self.run_id, key, connection, task_id)
            .await
        {
            tracing::warn!(run = %self.run_id, "cannot keep the call's upstream task: {e}");
        }
        self.parking.task_started(key, connection, task_id);
    }

    fn keeps_task(&self) -> bool {
        self.parking.keeps_task()
    }
}

/// The latest progress a running step's calls reported, by step id.
pub(crate) type StepProgress = Arc<std::sync::Mutex<HashMap<String, Progress>>>;

impl StepJournal {
    /// The step's node runs again after a wait: what the wait said is
    /// over, and the step says so (a `step.resumed` event).
    pub(super) async fn resumed(&self) {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.step_id);
        let data = json!({"step": self.step_id, "item": self.item});
        self.events.emit(&self.run_id, "step.resumed", data).await;
    }
}

#[async_trait::async_trait]
impl CallJournal for StepJournal {
    fn key_prefix(&self) -> &str {
        &self.prefix
    }

    fn progress(&self, progress: Progress) {
        self.events.ephemeral(
            &self.run_id,
            "step.progress",
            json!({"step": self.step_id, "item": self.item, "progress": progress}),
        );
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.step_id.clone(), progress);
    }

    fn elicitor(&self) -> Option<Arc<dyn crate::capability::Elicitor>> {
        Some(Arc::new(StepElicitor {
            store: self.store.clone(),
            run_id: self.run_id.clone(),
            step_id: self.step_id.clone(),
            item: self.item,
            events: self.events.clone(),
            signals: self.signals.clone(),
        }))
    }

    fn tasks(&self) -> Option<Arc<dyn crate::capability::TaskLedger>> {
        Some(Arc::new(RunTasks {
            store: self.store.clone(),
            run_id: self.run_id.clone(),
            parking: self.parking.clone(),
        }))
    }

    fn calling(&self, seq: u32, name: &str, arguments: &Value) {
        self.parking.calling(seq, name, arguments);
    }

    fn park(
        &self,
        seq: u32,
        name: &str,
        arguments: &Value,
        wait: crate::capability::Wait,
    ) -> crate::capability::Parks {
        self.parking.park(seq, name, arguments, wait)
    }

    fn replayed(
        &self,
        seq: u32,
        name: &str,
        arguments: &Value,
    ) -> Option<crate::capability::Replayed> {
        self.parking.replayed(seq, name, arguments)
    }

    fn tape(&self) -> Option<Arc<dyn crate::capability::Tape>> {
        Some(self.parking.clone())
    }

    async fn record(&self, entry: JournalEntry) {
        let tape = self.parking.recorded(&entry);
        if entry.seq > MAX_JOURNALED_CALLS {
            if entry.seq == MAX_JOURNALED_CALLS + 1 {
                tracing::warn!(run = %self.run_id, step = %self.step_id,
                    "more than {MAX_JOURNALED_CALLS} capability calls; later ones are not journaled");
            }
            return;
        }
        // Known secrets and the workflow's `redact` fields are never journaled.
        let mut arguments = crate::secrets::redact_value(entry.arguments, &self.redact.redact);
        let result = crate::secrets::redact_value(entry.result, &self.redact.redact);
        let text = arguments.to_string();
        if text.len() > MAX_JOURNALED_ARGUMENTS {
            arguments = Value::String(truncate_utf8(text, MAX_JOURNALED_ARGUMENTS));
        }
        let row = CallRow {
            run_id: self.run_id.clone(),
            step_id: self.step_id.clone(),
            item: self.item,
            attempt: self.attempt,
            seq: entry.seq,
            name: crate::secrets::redact(&entry.name).into_owned(),
            arguments,
            outcome: if entry.error_code.is_some() {
                "error"
            } else {
                "ok"
            }
            .into(),
            error_code: entry.error_code.map(str::to_owned),
            duration_us: entry.duration.as_micros() as u64,
            at: now_text(),
            result: (crate::capability::json_len(&result) <= crate::domain::MAX_CALL_RESULT)
                .then_some(result),
            tape: (!tape.is_empty()).then(|| json!(tape)),
        };
        let written = until_written(&self.shutdown, &self.run_id, "a journaled call", || {
            self.store.record_call(&row, &self.fence)
        })
        .await;
        if let Err(e) = written {
            crate::metrics::metrics().store_error(e.failure_kind());
            tracing::warn!(run = %self.run_id, step = %self.step_id, "cannot journal a call: {e}");
        }
    }
}

/// The journal of a node run of `step` (item `item`) in `attempt`, given
/// `answers` when the run before it parked.
pub(super) fn step_journal(
    ctx: &RunCtx,
    step: &Step,
    item: u32,
    attempt: u32,
    answers: Vec<Answered>,
) -> StepJournal {
    let prefix = format!("{}/{}/{item}", ctx.run_id, step.spec.id);
    StepJournal {
        store: ctx.store.clone(),
        run_id: ctx.run_id.clone(),
        step_id: step.spec.id.clone(),
        item,
        attempt,
        parking: Arc::new(Parking::new(prefix.clone(), answers)),
        prefix,
        progress: ctx.progress.clone(),
        events: ctx.events.clone(),
        fence: ctx.fence.clone(),
        signals: ctx.signals.clone(),
        redact: ctx.def.spec.clone(),
        shutdown: ctx.shutdown.clone(),
    }
}
