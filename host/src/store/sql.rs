//! A move's [`Effects`] as SQL, for SQLite and PostgreSQL alike: one
//! renderer generic over a small [`Dialect`] (how a parameter is written,
//! the larger of two numbers, a JSON list append, the database's clock).
//!
//! SQLite runs the statements through its group-commit writer; PostgreSQL
//! hands those of many runs to one call of `wf_apply` (migration 0008),
//! which runs each with `EXECUTE … USING` its arguments. Neither backend
//! knows what a move is: a new [`crate::domain::Transition`] changes only
//! its effects.

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};

use super::{Lease, NewRun};
use crate::domain::{
    Attempts, CallRow, Effects, RunSet, RunTo, Stamp, StepSet, StepStatus, Target,
};

pub use super::group_commit::Arg;

/// `sql` with `args` bound to `$1`, `$2`… (`?N` too, on SQLite), for
/// either database.
pub fn bind<DB>(
    sql: &'static str,
    args: Vec<Arg>,
) -> sqlx::query::Query<'static, DB, <DB as sqlx::Database>::Arguments>
where
    DB: sqlx::Database,
    String: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<String>: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    args.into_iter().fold(
        sqlx::query(sqlx::AssertSqlSafe(sql)),
        |query, arg| match arg {
            Arg::Text(text) => query.bind(text),
            Arg::Int(n) => query.bind(n),
            Arg::Null => query.bind(None::<String>),
        },
    )
}

/// Where the statements run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `?N` parameters, bound one by one.
    Sqlite,
    /// Run by `EXECUTE sql USING args` inside `wf_apply`: every argument is
    /// an element of one text array, `$1`, cast where it is a number.
    Postgres,
}

/// The advisory lock (with the workflow's hash) a PostgreSQL admission of a
/// queued run takes until it commits: "wfad".
pub const ADMIT_LOCK: i32 = 0x7766_6164;

/// One statement of a run's write, its arguments, and what it means when it
/// changes no row.
#[derive(Debug)]
pub struct Statement {
    pub sql: &'static str,
    pub args: Vec<Arg>,
    pub guard: Guard,
}

/// What a statement that changes (or returns) no row means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Nothing: it may change none.
    None,
    /// Move `n` of the batch is refused (its guard did not hold): the batch
    /// fails with [`StoreError::Refused`](super::StoreError::Refused).
    Refuse(usize),
    /// The batch stops here, having written nothing more and appending
    /// nothing (a run that exists already, a signal not kept).
    Exists,
}

/// A statement being written: its text and the arguments its parameters
/// name, in order.
struct Sql {
    dialect: Dialect,
    text: String,
    args: Vec<Arg>,
}

impl Sql {
    fn new(dialect: Dialect) -> Sql {
        Sql {
            dialect,
            text: String::new(),
            args: Vec::new(),
        }
    }

    /// A text parameter bound to `value`.
    fn text(&mut self, value: impl Into<Arg>) -> String {
        self.args.push(value.into());
        let n = self.args.len();
        match self.dialect {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres => format!("($1)[{n}]"),
        }
    }

    /// An integer parameter bound to `value`.
    fn int(&mut self, value: impl Into<Arg>) -> String {
        self.args.push(value.into());
        let n = self.args.len();
        match self.dialect {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres => format!("(($1)[{n}])::bigint"),
        }
    }

    /// The larger of two numbers.
    fn greatest(&self, a: &str, b: &str) -> String {
        match self.dialect {
            Dialect::Sqlite => format!("max({a}, {b})"),
            Dialect::Postgres => format!("greatest({a}, {b})"),
        }
    }

    /// The database's clock, in ms since the epoch (PostgreSQL's
    /// `clock_timestamp()`, not the transaction's start).
    fn db_now_ms(&self) -> &'static str {
        match self.dialect {
            Dialect::Sqlite => "CAST(unixepoch('subsec') * 1000 AS INTEGER)",
            Dialect::Postgres => "(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
        }
    }

    /// `column`'s JSON list (text) with `{attempt, worker}` appended.
    fn append_worker(&self, column: &str, attempt: &str, worker: &str) -> String {
        match self.dialect {
            Dialect::Sqlite => format!(
                "json_insert(coalesce({column}, '[]'), '$[#]', \
                 json_object('attempt', {attempt}, 'worker', {worker}))"
            ),
            Dialect::Postgres => format!(
                "(coalesce({column}, '[]')::jsonb || jsonb_build_array(\
                 jsonb_build_object('attempt', {attempt}, 'worker', {worker})))::text"
            ),
        }
    }

    fn push(&mut self, text: &str) {
        self.text.push_str(text);
    }

    fn done(self, guard: Guard) -> Statement {
        Statement {
            sql: intern(self.text),
            args: self.args,
            guard,
        }
    }
}

/// The statement texts made so far, kept for the process's life: a move
/// makes one of a few dozen shapes, and the SQLite writer keeps each
/// compiled by its (static) text.
static TEXTS: LazyLock<Mutex<HashSet<&'static str>>> = LazyLock::new(Default::default);

fn intern(text: String) -> &'static str {
    let mut texts = TEXTS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(known) = texts.get(text.as_str()) {
        return known;
    }
    let leaked: &'static str = Box::leak(text.into_boxed_str());
    texts.insert(leaked);
    leaked
}

/// `states` as an SQL list of literals: our own status names, never input.
fn states<T: Copy>(states: &[T], name: fn(T) -> &'static str) -> String {
    let names: Vec<String> = states.iter().map(|s| format!("'{}'", name(*s))).collect();
    format!("({})", names.join(", "))
}

/// The time a move writes, and who makes it.
pub struct MoveContext<'a> {
    pub run_id: &'a str,
    /// The worker of the fence the move is made under, if any.
    pub worker: Option<&'a str>,
    /// The move's time (RFC 3339), for its columns and its events.
    pub at: &'a str,
    /// The same time in ms since the epoch.
    pub at_ms: i64,
}

/// The updates of move `index` of a batch, in order: its guarded update
/// first, then the steps that move with its run. (Its events are the
/// batch's: each backend appends them its own way.)
pub fn move_statements(
    dialect: Dialect,
    effects: &Effects<'_>,
    cx: &MoveContext<'_>,
    index: usize,
) -> Vec<Statement> {
    let mut out = Vec::with_capacity(3);
    match &effects.target {
        Target::Step { step_id, set } => {
            let mut sql = Sql::new(dialect);
            let run = sql.text(cx.run_id);
            let step = sql.text(*step_id);
            let sets = step_sets(&mut sql, set, cx);
            sql.push(&format!(
                "UPDATE steps SET {sets} WHERE run_id = {run} AND step_id = {step} \
                 AND status IN {}",
                states(effects.guard.steps, StepStatus::as_str)
            ));
            out.push(sql.done(Guard::Refuse(index)));
        }
        Target::Run { set, steps } => {
            if effects.admits && dialect == Dialect::Postgres {
                // Admissions of one workflow (whichever worker makes them)
                // one after the other, until commit: under READ COMMITTED
                // two at once would each count the other's as not yet
                // made, and both take the last slot. The count below
                // starts after the lock and sees every admission before.
                let mut sql = Sql::new(dialect);
                let run = sql.text(cx.run_id);
                sql.push(&format!(
                    "SELECT pg_advisory_xact_lock({ADMIT_LOCK}, hashtext(workflow)) \
                     FROM runs WHERE run_id = {run}"
                ));
                out.push(sql.done(Guard::None));
            }
            let mut sql = Sql::new(dialect);
            let run = sql.text(cx.run_id);
            let (sets, admitted_at) = run_sets(&mut sql, set, cx);
            let mut where_ = format!(
                "run_id = {run} AND status IN {}",
                states(effects.guard.run, |s| s.as_str())
            );
            if effects.admits {
                // Counted over every run of the workflow with the same
                // keys, as of the admission's own time.
                let now = admitted_at.unwrap_or_else(|| sql.db_now_ms().to_owned());
                where_.push_str(&format!(
                    " AND (flow_key IS NULL
                           OR flow_limit > (SELECT count(*) FROM runs other
                                            WHERE other.workflow = runs.workflow
                                              AND other.flow_key = runs.flow_key
                                              AND other.status = 'running'))
                      AND (rate_key IS NULL
                           OR rate_limit > (SELECT count(*) FROM runs other
                                            WHERE other.workflow = runs.workflow
                                              AND other.rate_key = runs.rate_key
                                              AND other.admitted_ms > {now} - runs.rate_period_ms))
                      AND (not_before_ms IS NULL OR not_before_ms <= {now})
                      AND NOT EXISTS (SELECT 1 FROM paused_workflows p
                                      WHERE p.workflow = runs.workflow)"
                ));
            }
            sql.push(&format!("UPDATE runs SET {sets} WHERE {where_}"));
            out.push(sql.done(Guard::Refuse(index)));
            if let Some(steps) = steps {
                let mut sql = Sql::new(dialect);
                let run = sql.text(cx.run_id);
                let sets = step_sets(&mut sql, steps, cx);
                sql.push(&format!(
                    "UPDATE steps SET {sets} WHERE run_id = {run} AND status IN {}",
                    states(effects.guard.steps, StepStatus::as_str)
                ));
                out.push(sql.done(Guard::None));
            }
            if let Some(ids) = set.new_steps {
                out.push(new_steps(dialect, cx.run_id, ids));
            }
        }
    }
    out
}

/// Adds the steps `ids` (a JSON array) to a run, `pending`, after its own.
fn new_steps(dialect: Dialect, run_id: &str, ids: &serde_json::Value) -> Statement {
    let mut sql = Sql::new(dialect);
    let (run, ids) = (sql.text(run_id), sql.text(json(ids)));
    let after = format!("(SELECT count(*) FROM steps WHERE run_id = {run})");
    sql.push(&match dialect {
        Dialect::Sqlite => format!(
            "INSERT INTO steps (run_id, step_id, position, status)
             SELECT {run}, value, {after} + key, 'pending' FROM json_each({ids})"
        ),
        Dialect::Postgres => format!(
            "INSERT INTO steps (run_id, step_id, position, status)
             SELECT {run}, s.step_id, {after} + s.n - 1, 'pending'
             FROM jsonb_array_elements_text(({ids})::jsonb) WITH ORDINALITY AS s (step_id, n)"
        ),
    });
    sql.done(Guard::None)
}

/// A new run's insert (the batch stops there when the run, or its
/// idempotency key, exists already), then its pending steps. With
/// `lease`, the run is held by that worker (epoch 1).
pub fn create_run(dialect: Dialect, new: &NewRun, lease: Option<&Lease>) -> [Statement; 2] {
    let run = &new.run;
    let concurrency = run.flow.as_ref().and_then(|f| f.concurrency.as_ref());
    let rate = run.flow.as_ref().and_then(|f| f.rate.as_ref());
    let mut sql = Sql::new(dialect);
    let values = [
        sql.text(run.run_id.as_str()),
        sql.text(run.workflow.as_str()),
        sql.text(run.status.as_str()),
        sql.text(json(&run.input)),
        sql.text(json(&run.definition)),
        sql.text(run.definition_hash.as_str()),
        sql.text(run.idempotency_key.as_deref()),
        sql.int(run.created_ms),
        sql.text(run.started_at.as_str()),
        sql.text(run.trigger.as_ref().map(json)),
        sql.text(concurrency.map(|c| c.key.as_str())),
        sql.int(concurrency.map(|c| i64::from(c.limit))),
        sql.text(rate.map(|r| r.key.as_str())),
        sql.int(rate.map(|r| i64::from(r.limit))),
        sql.int(rate.map(|r| r.period_ms)),
        sql.int(run.flow.as_ref().map_or(0, |f| f.priority)),
        sql.text(run.debounce.as_ref().map(|d| d.key.as_str())),
        sql.int(run.debounce.as_ref().map(|d| d.not_before_ms)),
        sql.int(run.debounce.as_ref().and_then(|d| d.deadline_ms)),
        sql.text(run.queued_reason.as_deref()),
    ]
    .join(", ");
    let owner = sql.text(lease.map(|l| &*l.worker));
    let until = sql.int(lease.map(|l| i64::try_from(l.duration.as_millis()).unwrap_or(i64::MAX)));
    let now = sql.db_now_ms();
    sql.push(&format!(
        "INSERT INTO runs (run_id, workflow, status, input, definition, definition_hash,
                           idempotency_key, created_ms, started_at, run_trigger,
                           flow_key, flow_limit, rate_key, rate_limit, rate_period_ms, priority,
                           debounce_key, not_before_ms, debounce_deadline_ms, queued_reason,
                           lease_owner, lease_until_ms, lease_epoch)
         VALUES ({values}, {owner}, {now} + {until},
                 CASE WHEN {owner} IS NULL THEN 0 ELSE 1 END)
         ON CONFLICT DO NOTHING"
    ));
    let insert = sql.done(Guard::Exists);
    let mut sql = Sql::new(dialect);
    let run_id = sql.text(run.run_id.as_str());
    let ids = sql.text(serde_json::to_string(&new.steps).expect("step ids are strings"));
    // The steps from a JSON list of their ids, positions from its indexes.
    sql.push(&match dialect {
        Dialect::Sqlite => format!(
            "INSERT INTO steps (run_id, step_id, position, status)
             SELECT {run_id}, value, key, 'pending' FROM json_each({ids})"
        ),
        Dialect::Postgres => format!(
            "INSERT INTO steps (run_id, step_id, position, status)
             SELECT {run_id}, s.step_id, s.n - 1, 'pending'
             FROM jsonb_array_elements_text(({ids})::jsonb) WITH ORDINALITY AS s (step_id, n)"
        ),
    });
    [insert, sql.done(Guard::None)]
}

/// A journaled call, replacing one of the same attempt, item and number.
pub fn record_call(dialect: Dialect, call: &CallRow) -> Statement {
    let mut sql = Sql::new(dialect);
    let values = [
        sql.text(call.run_id.as_str()),
        sql.text(call.step_id.as_str()),
        sql.int(i64::from(call.item)),
        sql.int(i64::from(call.attempt)),
        sql.int(i64::from(call.seq)),
        sql.text(call.name.as_str()),
        sql.text(json(&call.arguments)),
        sql.text(call.outcome.as_str()),
        sql.text(call.error_code.as_deref()),
        sql.int(i64::try_from(call.duration_us).unwrap_or(i64::MAX)),
        sql.text(call.at.as_str()),
        sql.text(call.result.as_ref().map(json)),
        sql.text(call.tape.as_ref().map(json)),
    ]
    .join(", ");
    sql.push(&format!(
        "INSERT INTO calls (run_id, step_id, item, attempt, seq, name, arguments,
                            outcome, error_code, duration_us, at, result, tape)
         VALUES ({values})
         ON CONFLICT (run_id, step_id, item, attempt, seq) DO UPDATE
             SET name = excluded.name, arguments = excluded.arguments,
                 outcome = excluded.outcome, error_code = excluded.error_code,
                 duration_us = excluded.duration_us, at = excluded.at,
                 result = excluded.result, tape = excluded.tape"
    ));
    sql.done(Guard::None)
}

/// Signal `signal` kept for `run_id`, unless `open` of that name are kept
/// (untaken) already: then the batch stops. Senders of one run's signals
/// take turns on its row where workers write at once, so the count is not
/// stale when the insert commits.
pub fn send_signal(
    dialect: Dialect,
    run_id: &str,
    signal: &str,
    payload: &serde_json::Value,
    open: u32,
    at: &str,
) -> Vec<Statement> {
    let mut out = Vec::with_capacity(2);
    if dialect == Dialect::Postgres {
        let mut sql = Sql::new(dialect);
        let run = sql.text(run_id);
        sql.push(&format!(
            "SELECT 1 FROM runs WHERE run_id = {run} FOR NO KEY UPDATE"
        ));
        out.push(sql.done(Guard::None));
    }
    let mut sql = Sql::new(dialect);
    let (run, name, payload, at, open) = (
        sql.text(run_id),
        sql.text(signal),
        sql.text(json(payload)),
        sql.text(at),
        sql.int(i64::from(open)),
    );
    sql.push(&format!(
        "INSERT INTO signals (run_id, signal, payload, sent_at)
         SELECT {run}, {name}, {payload}, {at}
         WHERE (SELECT count(*) FROM signals
                WHERE run_id = {run} AND signal = {name} AND step_id IS NULL) < {open}"
    ));
    out.push(sql.done(Guard::Exists));
    out
}

/// `column = value` of every column `set` sets on a step.
fn step_sets(sql: &mut Sql, set: &StepSet<'_>, cx: &MoveContext<'_>) -> String {
    let mut sets = Vec::new();
    if let Some(status) = set.status {
        sets.push(format!("status = {}", sql.text(status.as_str())));
    }
    match set.attempts {
        Some(Attempts::Is(n)) => sets.push(format!("attempts = {}", sql.int(i64::from(n)))),
        Some(Attempts::AtLeast(n)) => {
            let n = sql.int(i64::from(n));
            sets.push(format!("attempts = {}", sql.greatest("attempts", &n)));
        }
        None => {}
    }
    if let Some(input) = set.input {
        sets.push(format!("input = {}", sql.text(input.map(json))));
    }
    outcome_sets(sql, &mut sets, set.output, set.error);
    for (column, stamp) in [("started_at", set.started), ("finished_at", set.finished)] {
        match stamp {
            Some(Stamp::Now) => sets.push(format!("{column} = {}", sql.text(cx.at))),
            Some(Stamp::Clear) => sets.push(format!("{column} = NULL")),
            None => {}
        }
    }
    if let Some(attempt) = set.worker_of {
        let attempt = sql.int(i64::from(attempt));
        let worker = sql.text(cx.worker);
        sets.push(format!(
            "workers = {}",
            sql.append_worker("workers", &attempt, &worker)
        ));
    }
    sets.join(", ")
}

/// `column = value` of every column `set` sets on a run, and the time an
/// admission is dated (an expression), if it is one.
fn run_sets(sql: &mut Sql, set: &RunSet<'_>, cx: &MoveContext<'_>) -> (String, Option<String>) {
    let mut sets = Vec::new();
    match set.status {
        Some(RunTo::Is(status)) => sets.push(format!("status = {}", sql.text(status.as_str()))),
        Some(RunTo::RunningUnlessFlow) => sets.push(
            "status = CASE WHEN flow_key IS NULL AND rate_key IS NULL \
             THEN 'running' ELSE 'queued' END"
                .to_owned(),
        ),
        None => {}
    }
    outcome_sets(sql, &mut sets, set.output, set.error);
    match set.finished {
        Some(Stamp::Now) => {
            sets.push(format!("finished_at = {}", sql.text(cx.at)));
            sets.push(format!("finished_ms = {}", sql.int(cx.at_ms)));
        }
        Some(Stamp::Clear) => sets.push("finished_at = NULL, finished_ms = NULL".to_owned()),
        None => {}
    }
    if let Some(reason) = set.queued_reason {
        sets.push(format!("queued_reason = {}", sql.text(reason)));
    }
    let mut admitted_at = None;
    if let Some(at_ms) = set.admitted {
        // Dated when written, not when proposed: a run that ended in
        // between is not counted, so the admission must not be dated
        // before that end. PostgreSQL dates it on the database's clock
        // alone, the same for every worker.
        let at = match sql.dialect {
            Dialect::Sqlite => {
                let proposed = sql.int(at_ms);
                sql.greatest(&proposed, sql.db_now_ms())
            }
            Dialect::Postgres => sql.db_now_ms().to_owned(),
        };
        sets.push(format!("admitted_ms = {at}"));
        admitted_at = Some(at);
    }
    if set.release_lease {
        sets.push("lease_owner = NULL, lease_until_ms = NULL".to_owned());
    }
    if set.clear_cancel {
        sets.push("cancel_requested = FALSE".to_owned());
    }
    if let Some(input) = set.input {
        sets.push(format!("input = {}", sql.text(json(input))));
    }
    if let Some(wake) = set.wake {
        sets.push(format!("wake_ms = {}", sql.int(wake)));
    }
    if let Some(at) = set.not_before {
        let at = sql.int(at);
        let capped = match sql.dialect {
            Dialect::Sqlite => format!("min({at}, coalesce(debounce_deadline_ms, {at}))"),
            Dialect::Postgres => format!("least({at}, debounce_deadline_ms)"),
        };
        sets.push(format!("not_before_ms = {capped}"));
    }
    if let Some((definition, hash)) = set.definition {
        sets.push(format!(
            "definition = {}, definition_hash = {}",
            sql.text(json(definition)),
            sql.text(hash)
        ));
    }
    (sets.join(", "), admitted_at)
}

/// `output`, `error_code` and `error_message`, where a move sets them.
fn outcome_sets(
    sql: &mut Sql,
    sets: &mut Vec<String>,
    output: Option<Option<&serde_json::Value>>,
    error: Option<Option<&crate::domain::Failure>>,
) {
    if let Some(output) = output {
        sets.push(format!("output = {}", sql.text(output.map(json))));
    }
    if let Some(error) = error {
        let code = sql.text(error.map(|e| e.code.as_str()));
        let message = sql.text(error.map(|e| e.message.as_str()));
        sets.push(format!("error_code = {code}, error_message = {message}"));
    }
}

fn json(value: &serde_json::Value) -> String {
    value.to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::{Failure, RunStatus, Transition};

    fn cx() -> MoveContext<'static> {
        MoveContext {
            run_id: "r1",
            worker: Some("w1"),
            at: "2026-01-01T00:00:00.000Z",
            at_ms: 7,
        }
    }

    #[test]
    fn a_step_move_is_one_guarded_update_of_its_step() {
        let input = json!({"a": 1});
        let effects = Transition::StepStarted {
            step_id: "s",
            attempt: 1,
            input: Some(&input),
        }
        .effects();
        let [update] = &move_statements(Dialect::Sqlite, &effects, &cx(), 0)[..] else {
            panic!("one statement")
        };
        assert_eq!(update.guard, Guard::Refuse(0));
        assert!(
            update
                .sql
                .starts_with("UPDATE steps SET status = ?3, attempts = ?4")
        );
        assert!(
            update.sql.ends_with(
                "WHERE run_id = ?1 AND step_id = ?2 AND status IN ('pending', 'running')"
            ),
            "{}",
            update.sql
        );
        // The same shape twice is the same (interned) text.
        let again = move_statements(Dialect::Sqlite, &effects, &cx(), 0);
        assert!(std::ptr::eq(again[0].sql, update.sql));
    }

    #[test]
    fn postgres_reads_every_argument_from_one_array() {
        let effects = Transition::StepAttempt {
            step_id: "s",
            attempt: 2,
        }
        .effects();
        let statements = move_statements(Dialect::Postgres, &effects, &cx(), 0);
        let sql = statements[0].sql;
        assert!(
            sql.contains("attempts = greatest(attempts, (($1)[3])::bigint)"),
            "{sql}"
        );
        assert!(sql.contains("'worker', ($1)[5]"), "{sql}");
        assert!(!sql.contains('?'), "{sql}");
    }

    #[test]
    fn a_run_move_moves_its_steps_after_its_guarded_update() {
        let failure = Failure::new("cancelled", "no");
        let effects = Transition::RunAbandoned {
            status: RunStatus::Cancelled,
            error: &failure,
        }
        .effects();
        let statements = move_statements(Dialect::Sqlite, &effects, &cx(), 0);
        assert_eq!(statements.len(), 2);
        assert_eq!(statements[0].guard, Guard::Refuse(0));
        assert!(statements[0].sql.starts_with("UPDATE runs"));
        assert_eq!(statements[1].guard, Guard::None);
        assert!(
            statements[1]
                .sql
                .ends_with("AND status IN ('pending', 'running', 'waiting')"),
            "{}",
            statements[1].sql
        );
    }

    #[test]
    fn a_postgres_admission_takes_the_workflow_lock_first() {
        let effects = Transition::RunAdmitted { at_ms: 5 }.effects();
        let statements = move_statements(Dialect::Postgres, &effects, &cx(), 0);
        assert!(statements[0].sql.contains("pg_advisory_xact_lock"));
        assert_eq!(
            (statements[0].guard, statements[1].guard),
            (Guard::None, Guard::Refuse(0))
        );
        assert!(statements[1].sql.contains("flow_limit >"));
        let sqlite = move_statements(Dialect::Sqlite, &effects, &cx(), 0);
        assert_eq!(sqlite.len(), 1, "one writer: no lock needed");
    }
}
