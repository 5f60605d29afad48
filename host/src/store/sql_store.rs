//! The SQL store: one [`Store`] for SQLite and PostgreSQL, generic over a
//! small [`Db`]: how a read and a write reach the database, how a run's
//! [`Batch`] is applied (grouped with other runs'), and what a database with
//! several workers adds (leases, claims, notes). The queries are written
//! once, with `$N` parameters, which both databases take; where their SQL
//! differs, the [`Dialect`] says how.

use async_trait::async_trait;
use serde_json::Value;

use super::batch::{Applied, Batch};
use super::cells::Cells;
use super::rows::{
    cursor_of, json_text, parse_cursor, parse_json, run_row, schedule_row, signal_row, step_row,
};
use super::sql::{self, Arg, Dialect};
use super::{
    CallRow, Counts, Created, EventRow, Fence, FirstTransitions, Flow, FlowUsage, Lease, ListQuery,
    NewRun, NewRunWrite, QuestionRow, RunRow, RunStatus, ScheduleRow, Shared, SignalRow, StepRow,
    Store, StoreError, Transition, WaitingStep, now_text,
};

/// What the SQL store needs of a database.
#[async_trait]
pub trait Db: Send + Sync + 'static {
    /// How its SQL differs.
    const DIALECT: Dialect;
    /// `sqlite` or `postgres`.
    const BACKEND: &'static str;

    /// The rows a read returns (`$N` parameters bound to `args`).
    async fn read(&self, sql: &'static str, args: Vec<Arg>) -> Result<Vec<Cells>, StoreError>;
    /// A write outside any run's progress (schedules, tasks, questions,
    /// pruning), committed: the first column of each row it returns.
    async fn write(&self, sql: &'static str, args: Vec<Arg>) -> Result<Vec<i64>, StoreError>;
    /// A run's write, committed (grouped with other runs' where it can).
    async fn apply(&self, batch: Batch) -> Result<Applied, StoreError>;

    /// What its workers do, where several share it.
    fn shared_by(&self) -> Option<&dyn Shared> {
        None
    }

    /// See [`Store::degraded`].
    fn degraded(&self) -> Option<String> {
        None
    }

    /// See [`Store::probe_write`].
    async fn probe_write(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The update that takes a signal for a step: its own (taken before a
/// restart) first, else the oldest kept; `$lock` locks the row it picks
/// where workers take signals at once.
macro_rules! take_signal {
    ($lock:literal) => {
        concat!(
            "UPDATE signals SET step_id = $3
             WHERE id = (SELECT id FROM signals
                         WHERE run_id = $1 AND signal = $2
                           AND (step_id IS NULL OR step_id = $3)
                         ORDER BY step_id IS NULL, id LIMIT 1 ",
            $lock,
            ")
             RETURNING id"
        )
    };
}

/// The SQL store over database `D`.
pub struct SqlStore<D> {
    pub db: D,
    /// The file, `:memory:`, or the URL without its password.
    pub location: String,
}

impl<D: Db> SqlStore<D> {
    async fn runs(&self, sql: &'static str, args: Vec<Arg>) -> Result<Vec<RunRow>, StoreError> {
        self.db.read(sql, args).await?.iter().map(run_row).collect()
    }

    /// The run and its first event, without the transitions that follow.
    fn create_batch(
        &self,
        new: &NewRun,
        lease: Option<&Lease>,
        first: Option<(&str, &Value)>,
    ) -> Batch {
        let mut batch = Batch::new(&new.run.run_id);
        // One worker drives every run of a database it has alone: no lease.
        let lease = lease.filter(|_| self.shared());
        for statement in sql::create_run(D::DIALECT, new, lease) {
            batch.statement(statement);
        }
        if lease.is_none() {
            batch.note("ready".to_owned());
        }
        if let Some((kind, data)) = first {
            batch.event(kind.to_owned().into(), data.clone());
        }
        batch
    }
}

/// Deletes the finished runs past the newest `$2` and those finished before
/// `$1` (ms). Its filter is the `runs_finished` index's own
/// (`finished_ms IS NOT NULL`): the cut is a walk of the index alone.
/// `$bound` is the dialect's own extra bound.
macro_rules! prune {
    ($bound:literal) => {
        concat!(
            "WITH cut AS (SELECT finished_ms AS ms, run_id AS id FROM runs
                          WHERE finished_ms IS NOT NULL
                          ORDER BY finished_ms DESC, run_id DESC LIMIT 1 OFFSET $2)
             DELETE FROM runs WHERE finished_ms IS NOT NULL ",
            $bound,
            " AND (finished_ms < $1 OR (finished_ms, run_id) <= (SELECT ms, id FROM cut))
             RETURNING 1"
        )
    };
}

/// The prune on SQLite, which walks the index only with this upper bound.
pub(crate) const PRUNE_SQLITE: &str =
    prune!("AND finished_ms <= max($1, coalesce((SELECT ms FROM cut), $1))");

#[async_trait]
impl<D: Db> Store for SqlStore<D> {
    fn backend(&self) -> &'static str {
        D::BACKEND
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    fn shared_by(&self) -> Option<&dyn Shared> {
        self.db.shared_by()
    }

    fn degraded(&self) -> Option<String> {
        self.db.degraded()
    }

    async fn probe_write(&self) -> Result<(), StoreError> {
        self.db.probe_write().await
    }

    /// One worker writes (SQLite), or workers write at once (PostgreSQL):
    /// either way events reach the log in id order.
    fn feeds_from_log(&self) -> bool {
        true
    }

    /// A batch binds one time to its writes and its events. (A shared
    /// store says no: a run's end may be written by another worker.)
    fn stamps_with_event_time(&self) -> bool {
        !self.shared()
    }

    /// The run, its steps, its first event and the transitions that follow,
    /// in one batch; when the transitions cannot be written, the run is
    /// written alone and that is logged.
    async fn create_run_with_event(
        &self,
        new: &NewRun,
        lease: Option<&Lease>,
        first: Option<(&str, &Value)>,
        then: Option<FirstTransitions<'_>>,
    ) -> Result<NewRunWrite, StoreError> {
        let run = &new.run;
        let mut written = NewRunWrite {
            created: Created::New,
            events: Vec::new(),
            then_stored: false,
        };
        let then = then.filter(|(_, moves)| first.is_some() && !moves.is_empty());
        let applied = match then {
            Some((fence, moves)) => {
                let mut all = self.create_batch(new, lease, first);
                all.moves(D::DIALECT, moves, Some(fence))?;
                match self.db.apply(all).await {
                    Ok(applied) => {
                        written.then_stored = !applied.stopped;
                        applied
                    }
                    Err(e) => {
                        let applied = self.db.apply(self.create_batch(new, lease, first)).await?;
                        if !applied.stopped {
                            written.then_written(&run.run_id, Err(e));
                        }
                        applied
                    }
                }
            }
            None => self.db.apply(self.create_batch(new, lease, first)).await?,
        };
        if applied.stopped {
            // Committed by now, so a reader sees the run it conflicts with.
            let existing = self
                .runs(
                    "SELECT * FROM runs WHERE (workflow = $1 AND idempotency_key = $2) OR run_id = $3
                        OR (workflow = $1 AND debounce_key = $4 AND status = 'queued')
                     ORDER BY run_id = $3, CASE WHEN idempotency_key = $2 THEN 0 ELSE 1 END
                     LIMIT 1",
                    vec![
                        Arg::from(run.workflow.as_str()),
                        Arg::from(run.idempotency_key.as_deref()),
                        Arg::from(run.run_id.as_str()),
                        Arg::from(run.debounce.as_ref().map(|d| d.key.as_str())),
                    ],
                )
                .await?
                .pop()
                .ok_or_else(|| match &run.debounce {
                    // The debounced run it would have joined was admitted
                    // since: the start tries again.
                    Some(_) => StoreError::Refused(format!(
                        "run `{}`: the debounced run it was to join has started",
                        run.run_id
                    )),
                    None => StoreError::Corrupt(format!(
                        "run `{}` was neither created nor found: the run it conflicted with is gone",
                        run.run_id
                    )),
                })?;
            return Ok(NewRunWrite {
                created: Created::Existing(Box::new(existing)),
                events: Vec::new(),
                then_stored: false,
            });
        }
        written.events = applied.events;
        Ok(written)
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunRow>, StoreError> {
        Ok(self
            .runs("SELECT * FROM runs WHERE run_id = $1", vec![run_id.into()])
            .await?
            .pop())
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRow>, StoreError> {
        self.db
            .read(
                "SELECT * FROM steps WHERE run_id = $1 ORDER BY position",
                vec![run_id.into()],
            )
            .await?
            .iter()
            .map(step_row)
            .collect()
    }

    async fn calls(&self, run_id: &str, step_id: &str) -> Result<Vec<CallRow>, StoreError> {
        let rows = self
            .db
            .read(
                "SELECT * FROM calls WHERE run_id = $1 AND step_id = $2
                 ORDER BY attempt, item, seq",
                vec![run_id.into(), step_id.into()],
            )
            .await?;
        let number = |row: &Cells, column| -> Result<u32, StoreError> {
            Ok(u32::try_from(row.int(column)?).unwrap_or(u32::MAX))
        };
        rows.iter()
            .map(|row| {
                Ok(CallRow {
                    run_id: row.text("run_id")?,
                    step_id: row.text("step_id")?,
                    item: number(row, "item")?,
                    attempt: number(row, "attempt")?,
                    seq: number(row, "seq")?,
                    name: row.text("name")?,
                    arguments: parse_json(row.text_opt("arguments")?)?.unwrap_or(Value::Null),
                    outcome: row.text("outcome")?,
                    error_code: row.text_opt("error_code")?,
                    duration_us: u64::try_from(row.int("duration_us")?).unwrap_or_default(),
                    at: row.text("at")?,
                    result: parse_json(row.text_opt("result")?)?,
                    tape: parse_json(row.text_opt("tape")?)?,
                })
            })
            .collect()
    }

    async fn list_runs(
        &self,
        query: &ListQuery,
    ) -> Result<(Vec<RunRow>, Option<String>), StoreError> {
        let (after_ms, after_id) = match &query.cursor {
            Some(c) => parse_cursor(c)?,
            None => (i64::MAX, "\u{10FFFF}".to_owned()),
        };
        let limit = query.limit.clamp(1, 1000);
        let mut runs = self
            .runs(
                "SELECT * FROM runs
                 WHERE ($1 IS NULL OR workflow = $1) AND ($2 IS NULL OR status = $2)
                   AND (created_ms < $3 OR (created_ms = $3 AND run_id < $4))
                 ORDER BY created_ms DESC, run_id DESC
                 LIMIT $5",
                vec![
                    query.workflow.as_deref().into(),
                    query.status.map(RunStatus::as_str).into(),
                    after_ms.into(),
                    after_id.into(),
                    (i64::from(limit) + 1).into(),
                ],
            )
            .await?;
        let next = if runs.len() > limit as usize {
            runs.truncate(limit as usize);
            runs.last().map(cursor_of)
        } else {
            None
        };
        Ok((runs, next))
    }

    async fn unfinished_runs(&self, awake_by_ms: i64) -> Result<Vec<RunRow>, StoreError> {
        self.runs(
            "SELECT * FROM runs WHERE status = 'running'
               AND (wake_ms IS NULL OR wake_ms <= $1
                    OR EXISTS (SELECT 1 FROM signals
                               WHERE signals.run_id = runs.run_id AND signals.step_id IS NULL))
             ORDER BY created_ms, run_id",
            vec![awake_by_ms.into()],
        )
        .await
    }

    async fn asleep_runs(
        &self,
        after: (i64, &str),
        until_ms: i64,
        limit: u32,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        self.db
            .read(
                "SELECT run_id, wake_ms FROM runs
                 WHERE status = 'running' AND wake_ms IS NOT NULL
                   AND (wake_ms, run_id) > ($1, $2) AND wake_ms <= $3
                 ORDER BY wake_ms, run_id LIMIT $4",
                vec![
                    after.0.into(),
                    after.1.into(),
                    until_ms.into(),
                    i64::from(limit).into(),
                ],
            )
            .await?
            .iter()
            .map(|row| Ok((row.text("run_id")?, row.int("wake_ms")?)))
            .collect()
    }

    async fn queued_runs(&self, limit: u32, offset: u32) -> Result<Vec<RunRow>, StoreError> {
        self.runs(
            "SELECT * FROM runs WHERE status = 'queued'
             ORDER BY priority DESC, created_ms, run_id LIMIT $1 OFFSET $2",
            vec![i64::from(limit).into(), i64::from(offset).into()],
        )
        .await
    }

    async fn flow_usage(
        &self,
        workflow: &str,
        flow: &Flow,
        now_ms: i64,
    ) -> Result<FlowUsage, StoreError> {
        let concurrency = flow.concurrency.as_ref();
        let rate = flow.rate.as_ref();
        let rows = self
            .db
            .read(
                "SELECT (SELECT count(*) FROM runs WHERE workflow = $1 AND flow_key = $2
                                                     AND status = 'running') AS running,
                        (SELECT count(*) FROM runs WHERE workflow = $1 AND rate_key = $3
                                                     AND admitted_ms > $4 - $5) AS admitted,
                        (SELECT min(admitted_ms) FROM runs WHERE workflow = $1 AND rate_key = $3
                                                           AND admitted_ms > $4 - $5) AS oldest",
                vec![
                    workflow.into(),
                    concurrency.map(|c| c.key.as_str()).into(),
                    rate.map(|r| r.key.as_str()).into(),
                    now_ms.into(),
                    rate.map_or(0, |r| r.period_ms).into(),
                ],
            )
            .await?;
        let row = one(rows)?;
        Ok(FlowUsage {
            running: row.int("running")? as u64,
            admitted: row.int("admitted")? as u64,
            window_frees_ms: row
                .int_opt("oldest")?
                .zip(rate)
                .map(|(oldest, r)| oldest + r.period_ms),
        })
    }

    async fn transitions(
        &self,
        run_id: &str,
        moves: &[Transition<'_>],
        fence: Option<&Fence>,
    ) -> Result<Vec<EventRow>, StoreError> {
        if moves.is_empty() {
            return Ok(Vec::new());
        }
        let mut batch = Batch::new(run_id);
        batch.moves(D::DIALECT, moves, fence)?;
        Ok(self.db.apply(batch).await?.events)
    }

    async fn record_call(&self, call: &CallRow, fence: &Fence) -> Result<(), StoreError> {
        let mut batch = Batch::new(&call.run_id);
        batch.fence(fence);
        batch.statement(sql::record_call(D::DIALECT, call));
        self.db.apply(batch).await?;
        Ok(())
    }

    async fn live_definitions(&self) -> Result<Vec<(String, String, u64)>, StoreError> {
        let rows = self
            .db
            .read(
                "SELECT workflow, definition_hash, count(*) AS runs FROM runs
                 WHERE status IN ('queued', 'running', 'paused')
                 GROUP BY workflow, definition_hash ORDER BY workflow, definition_hash",
                Vec::new(),
            )
            .await?;
        rows.into_iter()
            .map(|row| {
                Ok((
                    row.text("workflow")?,
                    row.text("definition_hash")?,
                    row.int("runs")? as u64,
                ))
            })
            .collect()
    }

    async fn counts(&self) -> Result<Counts, StoreError> {
        let rows = self
            .db
            .read(
                "SELECT count(*) AS total,
                        count(*) FILTER (WHERE status = 'running') AS running,
                        count(*) FILTER (WHERE status = 'queued') AS queued,
                        count(*) FILTER (WHERE status = 'paused') AS paused,
                        count(*) FILTER (WHERE status = 'running' AND wake_ms > $1) AS asleep,
                        (SELECT coalesce(max(id), 0) FROM events) AS last_event,
                        (SELECT count(DISTINCT run_id) FROM steps WHERE status = 'waiting') AS waiting
                 FROM runs",
                vec![crate::domain::now_ms().into()],
            )
            .await?;
        let row = one(rows)?;
        Ok(Counts {
            runs_running: row.int("running")? as u64,
            runs_queued: row.int("queued")? as u64,
            runs_paused: row.int("paused")? as u64,
            runs_total: row.int("total")? as u64,
            runs_waiting_for_signal: row.int("waiting")? as u64,
            runs_asleep: row.int("asleep")? as u64,
            last_event_id: row.int("last_event")?,
        })
    }

    async fn append_event(
        &self,
        run_id: &str,
        kind: &str,
        data: &Value,
    ) -> Result<EventRow, StoreError> {
        let mut batch = Batch::new(run_id);
        batch.event(kind.to_owned().into(), data.clone());
        let mut events = self.db.apply(batch).await?.events;
        events
            .pop()
            .ok_or_else(|| StoreError::Corrupt("an event insert returned no id".into()))
    }

    async fn events(
        &self,
        run_id: Option<&str>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<EventRow>, StoreError> {
        // Two texts, not `($2 IS NULL OR run_id = $2)`: a plan made for
        // both walks every event from `after` for one run's.
        let rows = match run_id {
            None => {
                self.db
                    .read(
                        "SELECT id, run_id, kind, data, at FROM events
                         WHERE id > $1 ORDER BY id LIMIT $2",
                        vec![after.into(), i64::from(limit).into()],
                    )
                    .await?
            }
            Some(run_id) => {
                self.db
                    .read(
                        "SELECT id, run_id, kind, data, at FROM events
                         WHERE run_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                        vec![run_id.into(), after.into(), i64::from(limit).into()],
                    )
                    .await?
            }
        };
        rows.iter()
            .map(|row| {
                let id = row.int("id")?;
                Ok(EventRow {
                    id,
                    run_id: row.text("run_id")?,
                    kind: row.text("kind")?,
                    data: serde_json::from_str(&row.text("data")?)
                        .map_err(|e| StoreError::Corrupt(format!("event {id}: {e}")))?,
                    at: row.text("at")?,
                })
            })
            .collect()
    }

    async fn last_event_id(&self) -> Result<i64, StoreError> {
        let rows = self
            .db
            .read("SELECT coalesce(max(id), 0) AS id FROM events", Vec::new())
            .await?;
        one(rows)?.int("id")
    }

    async fn prune(&self, keep_runs: u64, finished_before_ms: i64) -> Result<u64, StoreError> {
        // The newest finished run past `keep_runs` is the cut: it and every
        // run finished before it go, found by a range of the `runs_finished`
        // index (a `NOT IN` of the runs kept built a list of them all each
        // time: 22 ms with 10,000 kept). A run is finished exactly when it
        // has a `finished_ms`: the filter is the index's own, so the walk
        // reads the index alone (a filter on statuses the index did not
        // cover read every walked run from the table: 16 ms each time).
        let deleted = self
            .db
            .write(
                match D::DIALECT {
                    Dialect::Sqlite => PRUNE_SQLITE,
                    Dialect::Postgres => prune!(""),
                },
                vec![
                    finished_before_ms.into(),
                    i64::try_from(keep_runs).unwrap_or(i64::MAX).into(),
                ],
            )
            .await?;
        Ok(deleted.len() as u64)
    }

    async fn schedule(
        &self,
        workflow: &str,
        name: &str,
        from_ms: i64,
    ) -> Result<ScheduleRow, StoreError> {
        let read = || {
            self.db.read(
                "SELECT * FROM schedules WHERE workflow = $1 AND name = $2",
                vec![workflow.into(), name.into()],
            )
        };
        if let Some(row) = read().await?.first() {
            return schedule_row(row);
        }
        // Two statements: in one, a worker that loses the race to insert
        // would read a snapshot from before the winner's row.
        self.db
            .write(
                "INSERT INTO schedules (workflow, name, last_tick_ms) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
                vec![workflow.into(), name.into(), from_ms.into()],
            )
            .await?;
        schedule_row(&one(read().await?)?)
    }

    async fn schedule_fired(
        &self,
        workflow: &str,
        name: &str,
        tick_ms: i64,
        run_id: Option<&str>,
    ) -> Result<bool, StoreError> {
        // Row-locked: of two workers recording one tick, the second finds
        // it recorded.
        let done = self
            .db
            .write(
                "UPDATE schedules SET last_tick_ms = $3, last_run_id = coalesce($4, last_run_id)
                 WHERE workflow = $1 AND name = $2 AND last_tick_ms < $3
                 RETURNING 1",
                vec![workflow.into(), name.into(), tick_ms.into(), run_id.into()],
            )
            .await?;
        Ok(!done.is_empty())
    }

    async fn send_signal(
        &self,
        run_id: &str,
        signal: &str,
        payload: &Value,
        open: u32,
    ) -> Result<bool, StoreError> {
        let mut batch = Batch::new(run_id);
        for statement in sql::send_signal(D::DIALECT, run_id, signal, payload, open, &now_text()) {
            batch.statement(statement);
        }
        batch.note(format!("signal:{run_id}"));
        Ok(!self.db.apply(batch).await?.stopped)
    }

    async fn take_signal(
        &self,
        run_id: &str,
        signal: &str,
        step_id: &str,
    ) -> Result<Option<Value>, StoreError> {
        let args = || -> Vec<Arg> { vec![run_id.into(), signal.into(), step_id.into()] };
        // A read first: a step that finds nothing (most looks) costs the
        // writer nothing.
        let any = self
            .db
            .read(
                "SELECT id FROM signals
                 WHERE run_id = $1 AND signal = $2 AND (step_id IS NULL OR step_id = $3) LIMIT 1",
                args(),
            )
            .await?;
        if any.is_empty() {
            return Ok(None);
        }
        // Its own (taken before a restart) first, else the oldest kept.
        let taken = self
            .db
            .write(
                match D::DIALECT {
                    Dialect::Sqlite => take_signal!(""),
                    Dialect::Postgres => take_signal!("FOR UPDATE"),
                },
                args(),
            )
            .await?;
        let Some(&id) = taken.first() else {
            return Ok(None);
        };
        let rows = self
            .db
            .read("SELECT payload FROM signals WHERE id = $1", vec![id.into()])
            .await?;
        parse_json(one(rows)?.text_opt("payload")?)
    }

    async fn signals(&self, run_id: &str) -> Result<Vec<SignalRow>, StoreError> {
        self.db
            .read(
                "SELECT * FROM signals WHERE run_id = $1 ORDER BY id",
                vec![run_id.into()],
            )
            .await?
            .iter()
            .map(signal_row)
            .collect()
    }

    async fn waiting_steps(&self, limit: u32) -> Result<Vec<WaitingStep>, StoreError> {
        let rows = self
            .db
            .read(
                "SELECT s.run_id, r.workflow, s.step_id, s.input, s.started_at
                 FROM steps s JOIN runs r ON r.run_id = s.run_id
                 WHERE s.status = 'waiting' ORDER BY s.started_at, s.run_id LIMIT $1",
                vec![i64::from(limit).into()],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(WaitingStep {
                    run_id: row.text("run_id")?,
                    workflow: row.text("workflow")?,
                    step: row.text("step_id")?,
                    input: parse_json(row.text_opt("input")?)?.unwrap_or(Value::Null),
                    since: row.text_opt("started_at")?,
                })
            })
            .collect()
    }

    async fn record_task(
        &self,
        run_id: &str,
        key: &str,
        connection: &str,
        task_id: &str,
    ) -> Result<(), StoreError> {
        self.db
            .write(
                "INSERT INTO upstream_tasks (call_key, run_id, connection, task_id, created_at)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (call_key) DO UPDATE SET task_id = excluded.task_id,
                     connection = excluded.connection, created_at = excluded.created_at",
                vec![
                    key.into(),
                    run_id.into(),
                    connection.into(),
                    task_id.into(),
                    now_text().into(),
                ],
            )
            .await?;
        Ok(())
    }

    async fn task_of(&self, key: &str) -> Result<Option<String>, StoreError> {
        let rows = self
            .db
            .read(
                "SELECT task_id FROM upstream_tasks WHERE call_key = $1",
                vec![key.into()],
            )
            .await?;
        rows.first().map(|row| row.text("task_id")).transpose()
    }

    async fn put_question(
        &self,
        run_id: &str,
        step_id: &str,
        item: u32,
        question: Option<&Value>,
    ) -> Result<(), StoreError> {
        let key: Vec<Arg> = vec![run_id.into(), step_id.into(), i64::from(item).into()];
        match question {
            Some(question) => {
                let mut args = key;
                args.extend([json_text(question).into(), now_text().into()]);
                self.db
                    .write(
                        "INSERT INTO questions (run_id, step_id, item, question, asked_at)
                         VALUES ($1, $2, $3, $4, $5)
                         ON CONFLICT (run_id, step_id, item) DO UPDATE
                         SET question = excluded.question, asked_at = excluded.asked_at",
                        args,
                    )
                    .await?
            }
            None => {
                self.db
                    .write(
                        "DELETE FROM questions WHERE run_id = $1 AND step_id = $2 AND item = $3",
                        key,
                    )
                    .await?
            }
        };
        Ok(())
    }

    async fn questions(&self, run_id: &str) -> Result<Vec<QuestionRow>, StoreError> {
        let rows = self
            .db
            .read(
                "SELECT step_id, item, question, asked_at FROM questions
                 WHERE run_id = $1 ORDER BY asked_at, step_id, item",
                vec![run_id.into()],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(QuestionRow {
                    step_id: row.text("step_id")?,
                    item: u32::try_from(row.int("item")?).unwrap_or_default(),
                    question: parse_json(row.text_opt("question")?)?.unwrap_or(Value::Null),
                    asked_at: row.text("asked_at")?,
                })
            })
            .collect()
    }

    async fn pause_workflow(&self, workflow: &str, paused: bool) -> Result<bool, StoreError> {
        let changed = if paused {
            self.db
                .write(
                    "INSERT INTO paused_workflows (workflow, paused_at) VALUES ($1, $2)
                     ON CONFLICT DO NOTHING RETURNING 1",
                    vec![workflow.into(), now_text().into()],
                )
                .await?
        } else {
            self.db
                .write(
                    "DELETE FROM paused_workflows WHERE workflow = $1 RETURNING 1",
                    vec![workflow.into()],
                )
                .await?
        };
        Ok(!changed.is_empty())
    }

    async fn paused_workflows(&self) -> Result<Vec<String>, StoreError> {
        self.db
            .read(
                "SELECT workflow FROM paused_workflows ORDER BY workflow",
                Vec::new(),
            )
            .await?
            .iter()
            .map(|row| row.text("workflow"))
            .collect()
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRow>, StoreError> {
        self.db
            .read(
                "SELECT * FROM schedules ORDER BY workflow, name",
                Vec::new(),
            )
            .await?
            .iter()
            .map(schedule_row)
            .collect()
    }
}

/// The one row a read returns.
fn one(mut rows: Vec<Cells>) -> Result<Cells, StoreError> {
    match rows.len() {
        1 => Ok(rows.remove(0)),
        n => Err(StoreError::Corrupt(format!(
            "a read that returns one row returned {n}"
        ))),
    }
}
