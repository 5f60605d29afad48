//! The in-memory store (`state = ":memory:"`): runs, steps, calls and events
//! in the process, gone with it.
//!
//! It keeps what the SQLite store keeps and answers every query the same way
//! (`tests/store.rs` runs the same tests on both), without a database: a write
//! is a map update under a lock, where SQLite's `:memory:` costs a round trip
//! to its worker thread. It has one worker, like SQLite.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use serde_json::Value;

use super::rows::{cursor_of, parse_cursor};
use crate::domain::{Attempts, Effects, RunSet, RunTo, Stamp, StepSet, Target};

use super::{
    AttemptWorker, CallRow, Counts, Created, EventRow, Fence, FirstTransitions, Flow, FlowLimit,
    FlowUsage, Lease, ListQuery, NewRun, NewRunWrite, QuestionRow, RunRow, RunStatus, ScheduleRow,
    SignalRow, StepRow, StepStatus, Store, StoreError, Transition, WaitingStep, now_ms, now_text,
};

/// The in-memory store.
#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    runs: HashMap<String, RunEntry>,
    /// `(created_ms, run_id)` of every run: the order `list_runs` pages in.
    by_created: BTreeSet<(i64, String)>,
    /// `(workflow, idempotency key)` to run id.
    by_key: HashMap<(String, String), String>,
    /// Every kept event by id; ids are never reused, as with SQLite's
    /// `AUTOINCREMENT`.
    events: BTreeMap<i64, EventRow>,
    last_event: i64,
    /// `(finished_ms, run_id)` of every finished run, oldest first (a missing
    /// time first, as SQLite's `ORDER BY finished_ms DESC` puts it last):
    /// the order `prune` takes them in, kept so a prune need not sort.
    finished: BTreeSet<(Option<i64>, String)>,
    /// Schedules' progress by `(workflow, name)`.
    schedules: BTreeMap<(String, String), ScheduleRow>,
    /// Workflows paused as a whole.
    paused_workflows: BTreeSet<String>,
    /// Signals by run, oldest first.
    signals: HashMap<String, Vec<SignalRow>>,
    /// Upstream tasks by call key: `(run_id, task_id)`.
    tasks: HashMap<String, (String, String)>,
    /// Open questions by run.
    questions: HashMap<String, Vec<QuestionRow>>,
}

struct RunEntry {
    row: RunRow,
    finished_ms: Option<i64>,
    /// In definition order.
    steps: Vec<StepRow>,
    /// By step, then `(attempt, item, seq)`.
    calls: HashMap<String, BTreeMap<(u32, u32, u32), CallRow>>,
    /// Ids of this run's events, ascending.
    events: Vec<i64>,
}

impl RunEntry {
    /// This run's key in [`State::finished`], when it is finished.
    fn finished_key(&self) -> Option<(Option<i64>, String)> {
        self.row
            .status
            .is_finished()
            .then(|| (self.finished_ms, self.row.run_id.clone()))
    }

    fn step(&mut self, step_id: &str) -> Option<&mut StepRow> {
        self.steps.iter_mut().find(|s| s.step_id == step_id)
    }
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update below leaves the state whole before it can panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    /// Whether every move of `moves` is allowed, one after the other, from
    /// the run's state: [`StoreError::Refused`] for the first that is not.
    fn check(
        &self,
        run_id: &str,
        moves: &[Transition<'_>],
        effects: &[Effects<'_>],
    ) -> Result<(), StoreError> {
        let refused = |m: &Transition<'_>| Err(StoreError::Refused(m.refusal(run_id)));
        let Some(run) = self.runs.get(run_id) else {
            return match moves.first() {
                Some(m) => refused(m),
                None => Ok(()),
            };
        };
        // Each move is checked against the status the moves before it in the
        // batch leave (a batch is a few moves): nothing is copied.
        for (i, m) in moves.iter().enumerate() {
            let before = &moves[..i];
            let allowed = match m.step_id() {
                Some(id) => run.steps.iter().find(|s| s.step_id == id).is_some_and(|s| {
                    let from = before.iter().fold(s.status, |from, b| moved(b, id, from));
                    m.allows_step(from)
                }),
                None => {
                    let from = before
                        .iter()
                        .fold(run.row.status, |from, b| b.run_to().unwrap_or(from));
                    m.allows_run(from)
                }
            };
            if !allowed {
                return refused(m);
            }
            if let Target::Run { set, .. } = &effects[i].target
                && effects[i].admits
                && !self.flow_allows(&run.row, set.admitted.unwrap_or(0).max(now_ms()))
            {
                return refused(m);
            }
        }
        Ok(())
    }

    /// What [`State::flow_usage`] finds of `run`'s workflow and keys at
    /// `now_ms`: whether its flow limits admit one more.
    fn flow_allows(&self, run: &RunRow, now_ms: i64) -> bool {
        if run
            .debounce
            .as_ref()
            .is_some_and(|d| d.not_before_ms > now_ms)
            || self.paused_workflows.contains(&run.workflow)
        {
            return false;
        }
        let Some(flow) = &run.flow else { return true };
        let usage = self.flow_usage(&run.workflow, flow, now_ms);
        flow.concurrency
            .as_ref()
            .is_none_or(|c| usage.running < u64::from(c.limit))
            && flow
                .rate
                .as_ref()
                .is_none_or(|r| usage.admitted < u64::from(r.limit))
    }

    fn flow_usage(&self, workflow: &str, flow: &Flow, now_ms: i64) -> FlowUsage {
        let mut usage = FlowUsage::default();
        let same = |limit: &Option<FlowLimit>, other: &Option<FlowLimit>| matches!((limit, other), (Some(a), Some(b)) if a.key == b.key);
        for other in self.runs.values().map(|r| &r.row) {
            let Some(theirs) = other.flow.as_ref().filter(|_| other.workflow == workflow) else {
                continue;
            };
            if other.status == RunStatus::Running && same(&flow.concurrency, &theirs.concurrency) {
                usage.running += 1;
            }
            if let (Some(rate), Some(at)) = (&flow.rate, other.admitted_ms)
                && same(&flow.rate, &theirs.rate)
                && at > now_ms - rate.period_ms
            {
                usage.admitted += 1;
                let frees = at + rate.period_ms;
                usage.window_frees_ms = Some(usage.window_frees_ms.map_or(frees, |f| f.min(frees)));
            }
        }
        usage
    }

    /// Applies a move's `effects` to the run (checked with
    /// [`State::check`]), at `at`.
    fn apply(&mut self, run_id: &str, effects: &Effects<'_>, fence: Option<&Fence>, at: &str) {
        let Some(run) = self.runs.get_mut(run_id) else {
            return;
        };
        let worker = fence.map_or("", |f| &*f.worker);
        match &effects.target {
            Target::Step { step_id, set } => {
                if let Some(step) = run.step(step_id) {
                    set_step(step, set, worker, at);
                }
            }
            Target::Run { set, steps } => {
                let before = run.finished_key();
                set_run(run, set, at);
                reindex(&mut self.finished, before, run.finished_key());
                let moving = steps.as_ref().map_or(&[][..], |_| effects.guard.steps);
                for step in run.steps.iter_mut().filter(|s| moving.contains(&s.status)) {
                    set_step(step, steps.as_ref().expect("moving"), worker, at);
                }
                if let Some(ids) = set.new_steps.and_then(Value::as_array) {
                    let ids = ids.iter().filter_map(Value::as_str).map(str::to_owned);
                    run.steps.extend(ids.map(StepRow::pending));
                }
            }
        }
    }

    /// Checks `moves`, then applies them with their events, all at `at`.
    fn transitions(
        &mut self,
        run_id: &str,
        moves: &[Transition<'_>],
        fence: Option<&Fence>,
        at: &str,
    ) -> Result<Vec<EventRow>, StoreError> {
        let effects: Vec<Effects<'_>> = moves.iter().map(Transition::effects).collect();
        self.check(run_id, moves, &effects)?;
        let mut appended = Vec::with_capacity(moves.len() + 1);
        for effects in effects {
            self.apply(run_id, &effects, fence, at);
            for (kind, data) in &effects.events {
                appended.push(self.append(run_id, kind, data, at)?);
            }
        }
        Ok(appended)
    }

    /// Appends an event; an event of a run that is not kept is not kept
    /// either (SQLite's foreign key refuses it).
    fn append(
        &mut self,
        run_id: &str,
        kind: &str,
        data: &Value,
        at: &str,
    ) -> Result<EventRow, StoreError> {
        let Some(run) = self.runs.get_mut(run_id) else {
            return Err(StoreError::Corrupt(format!(
                "an event of run `{run_id}`, which is not stored"
            )));
        };
        self.last_event += 1;
        let event = EventRow {
            id: self.last_event,
            run_id: run_id.to_owned(),
            kind: kind.to_owned(),
            data: data.clone(),
            at: at.to_owned(),
        };
        run.events.push(event.id);
        self.events.insert(event.id, event.clone());
        Ok(event)
    }

    /// The newest kept event's id, `0` when none is kept (not `last_event`:
    /// pruning may have taken the newest).
    fn newest_event(&self) -> i64 {
        self.events.keys().next_back().copied().unwrap_or(0)
    }

    fn remove_run(&mut self, run_id: &str) {
        let Some(run) = self.runs.remove(run_id) else {
            return;
        };
        self.signals.remove(run_id);
        self.tasks.retain(|_, (run, _)| run != run_id);
        self.questions.remove(run_id);
        reindex(&mut self.finished, run.finished_key(), None);
        self.by_created
            .remove(&(run.row.created_ms, run.row.run_id.clone()));
        if let Some(key) = run.row.idempotency_key {
            self.by_key.remove(&(run.row.workflow, key));
        }
        for id in run.events {
            self.events.remove(&id);
        }
    }
}

/// The status of step `id`, `from` before the move `b`, after it: a step
/// move of that step sets it; a run move that moves steps sets it when the
/// step is one it moves.
fn moved(b: &Transition<'_>, id: &str, from: StepStatus) -> StepStatus {
    match (b.step_id(), b.step_to()) {
        (Some(other), Some(to)) if other == id => to,
        (None, Some(to)) if b.allows_step(from) => to,
        _ => from,
    }
}

/// Sets on `step` what `set` says, at `at`; `worker` runs the attempt.
fn set_step(step: &mut StepRow, set: &StepSet<'_>, worker: &str, at: &str) {
    if let Some(status) = set.status {
        step.status = status;
    }
    match set.attempts {
        Some(Attempts::Is(n)) => step.attempts = n,
        Some(Attempts::AtLeast(n)) => step.attempts = step.attempts.max(n),
        None => {}
    }
    if let Some(input) = set.input {
        step.input = input.cloned();
    }
    if let Some(output) = set.output {
        step.output = output.cloned();
    }
    if let Some(error) = set.error {
        step.error = error.cloned();
    }
    if let Some(started) = set.started {
        step.started_at = stamp(started, at);
    }
    if let Some(finished) = set.finished {
        step.finished_at = stamp(finished, at);
    }
    if let Some(attempt) = set.worker_of {
        step.workers.push(AttemptWorker {
            attempt,
            worker: worker.to_owned(),
        });
    }
}

/// Sets on `run` what `set` says, at `at`. It has no lease to release.
fn set_run(run: &mut RunEntry, set: &RunSet<'_>, at: &str) {
    let row = &mut run.row;
    match set.status {
        Some(RunTo::Is(status)) => row.status = status,
        Some(RunTo::RunningUnlessFlow) => {
            row.status = match row.flow {
                Some(_) => RunStatus::Queued,
                None => RunStatus::Running,
            }
        }
        None => {}
    }
    if let Some(output) = set.output {
        row.output = output.cloned();
    }
    if let Some(error) = set.error {
        row.error = error.cloned();
    }
    if let Some(finished) = set.finished {
        row.finished_at = stamp(finished, at);
        run.finished_ms = (finished == Stamp::Now).then(now_ms);
    }
    if let Some(reason) = set.queued_reason {
        row.queued_reason = reason.map(str::to_owned);
    }
    if let Some(at_ms) = set.admitted {
        // Dated when written, as the SQL stores do.
        row.admitted_ms = Some(at_ms.max(now_ms()));
    }
    if let Some(input) = set.input {
        row.input = input.clone();
    }
    if let Some(wake) = set.wake {
        row.wake_ms = Some(wake);
    }
    if let (Some(at), Some(debounce)) = (set.not_before, row.debounce.as_mut()) {
        debounce.not_before_ms = debounce.deadline_ms.map_or(at, |d| at.min(d));
    }
    if let Some((definition, hash)) = set.definition {
        row.definition = std::sync::Arc::new(definition.clone());
        row.definition_hash = hash.to_owned();
    }
}

fn stamp(stamp: Stamp, at: &str) -> Option<String> {
    (stamp == Stamp::Now).then(|| at.to_owned())
}

/// Moves a run's entry in the finished index from `before` to `after`.
fn reindex(
    finished: &mut BTreeSet<(Option<i64>, String)>,
    before: Option<(Option<i64>, String)>,
    after: Option<(Option<i64>, String)>,
) {
    if before == after {
        return;
    }
    if let Some(key) = before {
        finished.remove(&key);
    }
    if let Some(key) = after {
        finished.insert(key);
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn location(&self) -> String {
        ":memory:".into()
    }

    fn stamps_with_event_time(&self) -> bool {
        true
    }

    /// The run, its first event and the transitions that follow, under one
    /// lock.
    async fn create_run_with_event(
        &self,
        new: &NewRun,
        _lease: Option<&Lease>,
        first: Option<(&str, &Value)>,
        then: Option<FirstTransitions<'_>>,
    ) -> Result<NewRunWrite, StoreError> {
        let run = &new.run;
        let mut state = self.lock();
        let mut written = NewRunWrite {
            created: Created::New,
            events: Vec::new(),
            then_stored: false,
        };
        let key = run
            .idempotency_key
            .as_ref()
            .map(|k| (run.workflow.clone(), k.clone()));
        let existing = key
            .as_ref()
            .and_then(|k| state.by_key.get(k))
            .and_then(|id| state.runs.get(id))
            .or_else(|| state.runs.get(&run.run_id))
            .or_else(|| {
                // A queued run with its debounce key, which it joins.
                let key = run.debounce.as_ref()?;
                state.runs.values().find(|r| {
                    r.row.workflow == run.workflow
                        && r.row.status == RunStatus::Queued
                        && r.row.debounce.as_ref().is_some_and(|d| d.key == key.key)
                })
            });
        if let Some(existing) = existing {
            written.created = Created::Existing(Box::new(existing.row.clone()));
            return Ok(written);
        }
        if let Some(key) = key {
            state.by_key.insert(key, run.run_id.clone());
        }
        state
            .by_created
            .insert((run.created_ms, run.run_id.clone()));
        let steps = new.steps.iter().cloned().map(StepRow::pending).collect();
        let entry = RunEntry {
            row: run.clone(),
            finished_ms: None,
            steps,
            calls: HashMap::new(),
            events: Vec::new(),
        };
        reindex(&mut state.finished, None, entry.finished_key());
        state.runs.insert(run.run_id.clone(), entry);
        let Some((kind, data)) = first else {
            return Ok(written);
        };
        let at = now_text();
        written
            .events
            .push(state.append(&run.run_id, kind, data, &at)?);
        if let Some((fence, moves)) = then.filter(|(_, moves)| !moves.is_empty()) {
            let then = state.transitions(&run.run_id, moves, Some(fence), &at);
            written.then_written(&run.run_id, then);
        }
        Ok(written)
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunRow>, StoreError> {
        Ok(self.lock().runs.get(run_id).map(|r| r.row.clone()))
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRow>, StoreError> {
        Ok(self
            .lock()
            .runs
            .get(run_id)
            .map(|r| r.steps.clone())
            .unwrap_or_default())
    }

    async fn calls(&self, run_id: &str, step_id: &str) -> Result<Vec<CallRow>, StoreError> {
        Ok(self
            .lock()
            .runs
            .get(run_id)
            .and_then(|r| r.calls.get(step_id))
            .map(|calls| calls.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn list_runs(
        &self,
        query: &ListQuery,
    ) -> Result<(Vec<RunRow>, Option<String>), StoreError> {
        let after = query.cursor.as_deref().map(parse_cursor).transpose()?;
        let limit = query.limit.clamp(1, 1000) as usize;
        let state = self.lock();
        let newest_first = match &after {
            Some(after) => state.by_created.range(..after.clone()).rev(),
            None => state.by_created.range(..).rev(),
        };
        let mut runs: Vec<RunRow> = newest_first
            .filter_map(|(_, id)| state.runs.get(id))
            .map(|r| &r.row)
            .filter(|r| query.workflow.as_ref().is_none_or(|w| *w == r.workflow))
            .filter(|r| query.status.is_none_or(|s| s == r.status))
            .take(limit + 1)
            .cloned()
            .collect();
        let next = if runs.len() > limit {
            runs.truncate(limit);
            runs.last().map(cursor_of)
        } else {
            None
        };
        Ok((runs, next))
    }

    async fn unfinished_runs(&self, awake_by_ms: i64) -> Result<Vec<RunRow>, StoreError> {
        let state = self.lock();
        Ok(state
            .by_created
            .iter()
            .filter_map(|(_, id)| state.runs.get(id))
            .filter(|r| r.row.status == RunStatus::Running)
            .filter(|r| {
                r.row.wake_ms.is_none_or(|w| w <= awake_by_ms)
                    || state
                        .signals
                        .get(&r.row.run_id)
                        .is_some_and(|s| s.iter().any(|s| s.step_id.is_none()))
            })
            .map(|r| r.row.clone())
            .collect())
    }

    async fn asleep_runs(
        &self,
        after: (i64, &str),
        until_ms: i64,
        limit: u32,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let state = self.lock();
        let mut due: Vec<(i64, String)> = state
            .runs
            .values()
            .filter(|r| r.row.status == RunStatus::Running)
            .filter_map(|r| Some((r.row.wake_ms?, r.row.run_id.clone())))
            .filter(|(w, id)| (*w, id.as_str()) > after && *w <= until_ms)
            .collect();
        due.sort();
        due.truncate(limit as usize);
        Ok(due.into_iter().map(|(w, id)| (id, w)).collect())
    }

    async fn queued_runs(&self, limit: u32, offset: u32) -> Result<Vec<RunRow>, StoreError> {
        let state = self.lock();
        let mut queued: Vec<&RunRow> = state
            .runs
            .values()
            .map(|r| &r.row)
            .filter(|r| r.status == RunStatus::Queued)
            .collect();
        let priority = |r: &RunRow| r.flow.as_ref().map_or(0, |f| f.priority);
        queued.sort_by(|a, b| {
            (priority(b), a.created_ms, &a.run_id).cmp(&(priority(a), b.created_ms, &b.run_id))
        });
        Ok(queued
            .into_iter()
            .skip(offset as usize)
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn flow_usage(
        &self,
        workflow: &str,
        flow: &Flow,
        now_ms: i64,
    ) -> Result<FlowUsage, StoreError> {
        Ok(self.lock().flow_usage(workflow, flow, now_ms))
    }

    async fn transitions(
        &self,
        run_id: &str,
        moves: &[Transition<'_>],
        fence: Option<&Fence>,
    ) -> Result<Vec<EventRow>, StoreError> {
        // One time for the writes and their events, as SQLite stamps them.
        self.lock().transitions(run_id, moves, fence, &now_text())
    }

    async fn record_call(&self, call: &CallRow, _fence: &Fence) -> Result<(), StoreError> {
        let mut state = self.lock();
        let Some(run) = state.runs.get_mut(&call.run_id) else {
            return Err(StoreError::Corrupt(format!(
                "a call of run `{}`, which is not stored",
                call.run_id
            )));
        };
        run.calls
            .entry(call.step_id.clone())
            .or_default()
            .insert((call.attempt, call.item, call.seq), call.clone());
        Ok(())
    }

    async fn live_definitions(&self) -> Result<Vec<(String, String, u64)>, StoreError> {
        let state = self.lock();
        let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
        for run in state.runs.values().filter(|r| !r.row.status.is_finished()) {
            *counts
                .entry((run.row.workflow.clone(), run.row.definition_hash.clone()))
                .or_default() += 1;
        }
        Ok(counts.into_iter().map(|((w, h), n)| (w, h, n)).collect())
    }

    async fn counts(&self) -> Result<Counts, StoreError> {
        let state = self.lock();
        Ok(Counts {
            runs_running: state
                .runs
                .values()
                .filter(|r| r.row.status == RunStatus::Running)
                .count() as u64,
            runs_queued: state
                .runs
                .values()
                .filter(|r| r.row.status == RunStatus::Queued)
                .count() as u64,
            runs_paused: state
                .runs
                .values()
                .filter(|r| r.row.status == RunStatus::Paused)
                .count() as u64,
            runs_total: state.runs.len() as u64,
            runs_asleep: state
                .runs
                .values()
                .filter(|r| {
                    r.row.status == RunStatus::Running
                        && r.row.wake_ms.is_some_and(|w| w > crate::domain::now_ms())
                })
                .count() as u64,
            runs_waiting_for_signal: state
                .runs
                .values()
                .filter(|r| r.steps.iter().any(|s| s.status == StepStatus::Waiting))
                .count() as u64,
            last_event_id: state.newest_event(),
        })
    }

    async fn append_event(
        &self,
        run_id: &str,
        kind: &str,
        data: &Value,
    ) -> Result<EventRow, StoreError> {
        self.lock().append(run_id, kind, data, &now_text())
    }

    async fn events(
        &self,
        run_id: Option<&str>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<EventRow>, StoreError> {
        let state = self.lock();
        let limit = limit as usize;
        Ok(match run_id {
            None => state
                .events
                .range(after.saturating_add(1)..)
                .take(limit)
                .map(|(_, e)| e.clone())
                .collect(),
            Some(run_id) => {
                let Some(run) = state.runs.get(run_id) else {
                    return Ok(Vec::new());
                };
                let from = run.events.partition_point(|id| *id <= after);
                run.events[from..]
                    .iter()
                    .take(limit)
                    .filter_map(|id| state.events.get(id).cloned())
                    .collect()
            }
        })
    }

    async fn schedule(
        &self,
        workflow: &str,
        name: &str,
        from_ms: i64,
    ) -> Result<ScheduleRow, StoreError> {
        let mut state = self.lock();
        Ok(state
            .schedules
            .entry((workflow.to_owned(), name.to_owned()))
            .or_insert_with(|| ScheduleRow {
                workflow: workflow.to_owned(),
                name: name.to_owned(),
                last_tick_ms: from_ms,
                last_run_id: None,
            })
            .clone())
    }

    async fn schedule_fired(
        &self,
        workflow: &str,
        name: &str,
        tick_ms: i64,
        run_id: Option<&str>,
    ) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let Some(row) = state
            .schedules
            .get_mut(&(workflow.to_owned(), name.to_owned()))
        else {
            return Ok(false);
        };
        if row.last_tick_ms >= tick_ms {
            return Ok(false);
        }
        row.last_tick_ms = tick_ms;
        if let Some(run_id) = run_id {
            row.last_run_id = Some(run_id.to_owned());
        }
        Ok(true)
    }

    async fn send_signal(
        &self,
        run_id: &str,
        signal: &str,
        payload: &Value,
        open: u32,
    ) -> Result<bool, StoreError> {
        let mut state = self.lock();
        if !state.runs.contains_key(run_id) {
            return Err(StoreError::Refused(format!("run `{run_id}` is not stored")));
        }
        let signals = state.signals.entry(run_id.to_owned()).or_default();
        let kept = signals
            .iter()
            .filter(|s| s.signal == signal && s.step_id.is_none())
            .count();
        if kept >= open as usize {
            return Ok(false);
        }
        signals.push(SignalRow {
            signal: signal.to_owned(),
            payload: payload.clone(),
            sent_at: now_text(),
            step_id: None,
        });
        Ok(true)
    }

    async fn take_signal(
        &self,
        run_id: &str,
        signal: &str,
        step_id: &str,
    ) -> Result<Option<Value>, StoreError> {
        let mut state = self.lock();
        let Some(signals) = state.signals.get_mut(run_id) else {
            return Ok(None);
        };
        let taken = signals
            .iter()
            .position(|s| s.signal == signal && s.step_id.as_deref() == Some(step_id))
            .or_else(|| {
                signals
                    .iter()
                    .position(|s| s.signal == signal && s.step_id.is_none())
            });
        Ok(taken.map(|i| {
            signals[i].step_id = Some(step_id.to_owned());
            signals[i].payload.clone()
        }))
    }

    async fn signals(&self, run_id: &str) -> Result<Vec<SignalRow>, StoreError> {
        Ok(self.lock().signals.get(run_id).cloned().unwrap_or_default())
    }

    async fn waiting_steps(&self, limit: u32) -> Result<Vec<WaitingStep>, StoreError> {
        let state = self.lock();
        let mut waiting: Vec<WaitingStep> = state
            .runs
            .values()
            .flat_map(|run| {
                run.steps
                    .iter()
                    .filter(|s| s.status == StepStatus::Waiting)
                    .map(|s| WaitingStep {
                        run_id: run.row.run_id.clone(),
                        workflow: run.row.workflow.clone(),
                        step: s.step_id.clone(),
                        input: s.input.clone().unwrap_or(Value::Null),
                        since: s.started_at.clone(),
                    })
            })
            .collect();
        waiting.sort_by(|a, b| (&a.since, &a.run_id).cmp(&(&b.since, &b.run_id)));
        waiting.truncate(limit as usize);
        Ok(waiting)
    }

    async fn record_task(
        &self,
        run_id: &str,
        key: &str,
        _connection: &str,
        task_id: &str,
    ) -> Result<(), StoreError> {
        self.lock()
            .tasks
            .insert(key.to_owned(), (run_id.to_owned(), task_id.to_owned()));
        Ok(())
    }

    async fn task_of(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self.lock().tasks.get(key).map(|(_, task)| task.clone()))
    }

    async fn put_question(
        &self,
        run_id: &str,
        step_id: &str,
        item: u32,
        question: Option<&Value>,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        let open = state.questions.entry(run_id.to_owned()).or_default();
        open.retain(|q| !(q.step_id == step_id && q.item == item));
        if let Some(question) = question {
            open.push(QuestionRow {
                step_id: step_id.to_owned(),
                item,
                question: question.clone(),
                asked_at: now_text(),
            });
        }
        Ok(())
    }

    async fn questions(&self, run_id: &str) -> Result<Vec<QuestionRow>, StoreError> {
        Ok(self
            .lock()
            .questions
            .get(run_id)
            .cloned()
            .unwrap_or_default())
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRow>, StoreError> {
        Ok(self.lock().schedules.values().cloned().collect())
    }

    async fn pause_workflow(&self, workflow: &str, paused: bool) -> Result<bool, StoreError> {
        let mut state = self.lock();
        Ok(match paused {
            true => state.paused_workflows.insert(workflow.to_owned()),
            false => state.paused_workflows.remove(workflow),
        })
    }

    async fn paused_workflows(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.lock().paused_workflows.iter().cloned().collect())
    }

    async fn last_event_id(&self) -> Result<i64, StoreError> {
        Ok(self.lock().newest_event())
    }

    async fn prune(&self, keep_runs: u64, finished_before_ms: i64) -> Result<u64, StoreError> {
        let mut state = self.lock();
        // Oldest first: past the newest `keep_runs`, or finished before
        // `finished_before_ms`. Times only grow from there, so the scan stops
        // at the first kept run that has a time.
        let keep = usize::try_from(keep_runs).unwrap_or(usize::MAX);
        let over = state.finished.len().saturating_sub(keep);
        let mut doomed = Vec::new();
        for (index, (ms, id)) in state.finished.iter().enumerate() {
            let too_old = ms.is_some_and(|ms| ms < finished_before_ms);
            if index < over || too_old {
                doomed.push(id.clone());
            } else if ms.is_some() {
                break;
            }
        }
        for id in &doomed {
            state.remove_run(id);
        }
        Ok(doomed.len() as u64)
    }
}
