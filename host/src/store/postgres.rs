//! The PostgreSQL store: shared by every worker pointed at one database.
//!
//! Each running run is driven by the worker that holds its lease
//! (`runs.lease_owner` until `runs.lease_until_ms`, in `runs.lease_epoch`).
//! A worker claims runs nobody holds ([`Store::claim_runs`]: one query with
//! `FOR UPDATE SKIP LOCKED`, so two workers never claim the same run), renews
//! its leases while it drives them, and every write of a run's progress is
//! fenced: it commits only while the writer's lease has the owner and epoch it
//! was claimed with. Lease times are the database's clock, so the workers'
//! clocks need not agree.
//!
//! Workers hear of each other through `LISTEN`/`NOTIFY` on one channel
//! ([`Store::listen`]). Migrations are embedded and run at open.

use std::str::FromStr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::rows::{
    cursor_of, json_text, parse_cursor, parse_json, run_row, schedule_row, signal_row, step_row,
};
use super::{
    CallRow, CancelRequest, Counts, Created, EventRow, Failure, Fence, FirstTransitions, Flow,
    FlowUsage, Lease, ListQuery, NewRun, NewRunWrite, Note, QuestionRow, Renewed, RunRow,
    RunStatus, STEP_LOG, ScheduleRow, SignalRow, StepRow, StepStatus, Store, StoreError,
    Transition, WaitingStep, WorkerRow, now_ms, now_text,
};

// sqlx's PostgreSQL migrator takes a session advisory lock (`pg_advisory_lock`
// on a key derived from the database's name) before it looks at
// `_sqlx_migrations`, and releases it when done: workers that start at once
// migrate one after the other, and all but the first find nothing to do.
static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| super::embedded(MIGRATIONS));

/// `migrations/postgres`, file by file (see [`super::embedded`]).
pub(super) const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "runs",
        include_str!("../../migrations/postgres/0001_runs.sql"),
    ),
    (
        2,
        "events",
        include_str!("../../migrations/postgres/0002_events.sql"),
    ),
    (
        3,
        "workers",
        include_str!("../../migrations/postgres/0003_workers.sql"),
    ),
    (
        4,
        "triggers",
        include_str!("../../migrations/postgres/0004_triggers.sql"),
    ),
    (
        5,
        "flow",
        include_str!("../../migrations/postgres/0005_flow.sql"),
    ),
    (
        6,
        "one round trip",
        include_str!("../../migrations/postgres/0006_one_round_trip.sql"),
    ),
    (
        7,
        "prune index",
        include_str!("../../migrations/postgres/0007_prune_index.sql"),
    ),
];

/// The channel every worker listens on. Payloads: `ready`,
/// `finished:<run_id>`, `cancel:<run_id>`, `event`.
const CHANNEL: &str = "wf_host";

/// The database's clock, in ms since the epoch. `clock_timestamp()`, not
/// `now()`: the latter is the start of the transaction.
const DB_NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The advisory lock taken by each event append until it commits: "wfhsev".
const EVENT_LOCK: i64 = 0x7766_6873_6576;

/// The advisory lock (with the workflow's hash) an admission of a queued run
/// takes until it commits: "wfad".
const ADMIT_LOCK: i32 = 0x7766_6164;

/// Workers not seen for this long are forgotten.
const FORGET_WORKERS_MS: i64 = 24 * 60 * 60 * 1000;

/// How many notes a slow receiver may fall behind before it lags.
const NOTE_CAPACITY: usize = 1024;

/// The PostgreSQL store.
pub struct PgStore {
    pool: PgPool,
    location: String,
    notes: broadcast::Sender<Note>,
    /// The task that turns notifications into [`Note`]s; stopped on drop.
    listener: ListenerTask,
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host/db`),
    /// migrates it, and starts listening for other workers' notes.
    ///
    /// # Errors
    /// [`StoreError::Open`], naming the URL without its password, when the
    /// URL is malformed, the database cannot be reached, its schema is newer
    /// than this wf-host's, or it cannot be migrated.
    pub async fn open(url: &str) -> Result<PgStore, StoreError> {
        let location = redact_password(url);
        let open_err = |message: String| StoreError::Open {
            path: location.clone(),
            message,
        };
        let options = PgConnectOptions::from_str(url).map_err(|e| open_err(e.to_string()))?;
        // One connection first: the pool retries a refused connection until
        // its acquire timeout, which would hide the cause for 5 s.
        let probe = tokio::time::timeout(Duration::from_secs(5), options.connect())
            .await
            .unwrap_or(Err(sqlx::Error::PoolTimedOut))
            .map_err(|e| open_err(format!("cannot connect: {e}")))?;
        let _ = probe.close().await;
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(|e| open_err(format!("cannot connect: {e}")))?;
        if let Err(e) = migrate(&pool).await {
            // Closing ends the migrating session, and with it any advisory
            // lock sqlx's migrator did not release on its way out.
            pool.close().await;
            return Err(open_err(e));
        }
        let mut listener = PgListener::connect_with(&pool)
            .await
            .map_err(|e| open_err(format!("cannot listen: {e}")))?;
        listener
            .listen(CHANNEL)
            .await
            .map_err(|e| open_err(format!("cannot listen: {e}")))?;
        let (notes, _) = broadcast::channel(NOTE_CAPACITY);
        let listener = ListenerTask::spawn(listener, pool.clone(), notes.clone());
        Ok(PgStore {
            pool,
            location,
            notes,
            listener,
        })
    }

    /// The pool, for tests that inspect the database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Stops listening and closes every connection.
    pub async fn close(&self) {
        self.listener.stop.cancel();
        self.pool.close().await;
    }
}

/// Refuses a database migrated by a newer wf-host, then migrates.
async fn migrate(pool: &PgPool) -> Result<(), String> {
    let known = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let newer = |version: i64| {
        format!(
            "the database's schema is newer than this wf-host (migration {version}); upgrade wf-host"
        )
    };
    let read_err = |e: sqlx::Error| format!("cannot read its migrations: {e}");
    let has_table: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await
        .map_err(read_err)?;
    let applied: Option<i64> = if has_table {
        sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
            .fetch_one(pool)
            .await
            .map_err(read_err)?
    } else {
        None
    };
    if let Some(version) = applied.filter(|v| *v > known) {
        return Err(newer(version));
    }
    MIGRATOR.run(pool).await.map_err(|e| match e {
        // A newer wf-host migrated it since the check above.
        MigrateError::VersionMissing(version) if version > known => newer(version),
        e => format!("cannot migrate it: {e}"),
    })
}

/// `url` without its password (in the user info or a `password` parameter).
pub fn redact_password(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let head = match head.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let authority = match authority.rsplit_once('@') {
                Some((user_info, host)) => {
                    let user = user_info.split_once(':').map_or(user_info, |(u, _)| u);
                    format!("{user}@{host}")
                }
                None => authority.to_owned(),
            };
            format!("{scheme}://{authority}{path}")
        }
        None => head.to_owned(),
    };
    let query = query.map(|q| {
        q.split('&')
            .filter(|param| !param.to_ascii_lowercase().starts_with("password="))
            .collect::<Vec<_>>()
            .join("&")
    });
    match query {
        Some(q) if !q.is_empty() => format!("{head}?{q}"),
        _ => head,
    }
}

/// The listening task, owned by the store: cancelled and aborted on drop.
struct ListenerTask {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl ListenerTask {
    fn spawn(listener: PgListener, pool: PgPool, notes: broadcast::Sender<Note>) -> ListenerTask {
        let stop = CancellationToken::new();
        let task = tokio::spawn(listen(listener, pool, notes, stop.clone()));
        ListenerTask { stop, task }
    }
}

impl Drop for ListenerTask {
    fn drop(&mut self) {
        self.stop.cancel();
        self.task.abort();
    }
}

/// Turns notifications into notes until `stop`. When the connection drops,
/// it connects again (backing off while the database is away) and sends
/// [`Note::Reconnected`], since notes may have been missed meanwhile.
async fn listen(
    mut listener: PgListener,
    pool: PgPool,
    notes: broadcast::Sender<Note>,
    stop: CancellationToken,
) {
    const FIRST_BACKOFF: Duration = Duration::from_millis(100);
    const MAX_BACKOFF: Duration = Duration::from_secs(5);
    loop {
        let received = tokio::select! {
            () = stop.cancelled() => return,
            received = listener.try_recv() => received,
        };
        match received {
            Ok(Some(notification)) => {
                if let Some(note) = parse_note(notification.payload()) {
                    // No receivers is fine: nobody is waiting.
                    let _ = notes.send(note);
                }
                continue;
            }
            // Lost and already connected again (sqlx reconnects eagerly).
            Ok(None) => {
                tracing::warn!("the store's listening connection was lost; reconnected");
                let _ = notes.send(Note::Reconnected);
                continue;
            }
            Err(sqlx::Error::PoolClosed) => return,
            Err(e) => tracing::warn!("the store's listening connection failed: {e}"),
        }
        // A fresh listener, until the database is back.
        let mut backoff = FIRST_BACKOFF;
        listener = loop {
            let connected = tokio::select! {
                () = stop.cancelled() => return,
                connected = connect_listener(&pool) => connected,
            };
            match connected {
                Ok(listener) => break listener,
                Err(sqlx::Error::PoolClosed) => return,
                Err(e) => {
                    tracing::debug!(
                        "the store's listening connection: {e}; retrying in {backoff:?}"
                    );
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        };
        tracing::info!("the store's listening connection is back");
        let _ = notes.send(Note::Reconnected);
    }
}

async fn connect_listener(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let connect = async {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(CHANNEL).await?;
        Ok(listener)
    };
    // A host that drops packets would otherwise hold the loop forever.
    tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .unwrap_or(Err(sqlx::Error::PoolTimedOut))
}

fn parse_note(payload: &str) -> Option<Note> {
    match payload.split_once(':') {
        None => match payload {
            "ready" => Some(Note::Ready),
            "event" => Some(Note::Event),
            _ => None,
        },
        Some(("finished", run_id)) => Some(Note::Finished(run_id.to_owned())),
        Some(("cancel", run_id)) => Some(Note::Cancel(run_id.to_owned())),
        Some(("signal", run_id)) => Some(Note::Signal(run_id.to_owned())),
        Some(_) => None,
    }
}

fn ms_text(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(at).to_string()
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Applies `moves` of `run_id` in `tx`, which the caller commits: each
/// move's guarded update in order (a refused or unfenced one fails them all,
/// as the caller then rolls back), then their events, appended under the
/// event lock. Returns the events, in id order.
async fn apply_moves(
    tx: &mut sqlx::PgConnection,
    run_id: &str,
    moves: &[Transition<'_>],
    fence: Option<&Fence>,
) -> Result<Vec<EventRow>, StoreError> {
    if moves.is_empty() {
        return Ok(Vec::new());
    }
    for &write in moves {
        let changed = apply_move(tx, run_id, write, fence).await?;
        if changed == 0 {
            if let (true, Some(fence)) = (write.fenced(), fence)
                && !held(tx, run_id, fence).await?
            {
                return Err(StoreError::LeaseLost(run_id.to_owned()));
            }
            return Err(StoreError::Refused(write.refusal(run_id)));
        }
        match write {
            Transition::RunFinished { .. } | Transition::RunAbandoned { .. } => {
                notify(tx, &format!("finished:{run_id}")).await?;
            }
            Transition::RunReopened { .. } | Transition::RunAdmitted { .. } => {
                notify(tx, "ready").await?
            }
            _ => {}
        }
    }
    let at = now_text();
    let mut events = Vec::with_capacity(moves.len() + 1);
    for write in moves {
        if let Some(log) = write.log() {
            events.push((STEP_LOG, log.clone()));
        }
        events.push((write.kind(), write.data()));
    }
    append_events(tx, run_id, events, &at).await
}

/// Whether [`apply_in_one_trip`] writes `write`: the fenced moves of a
/// driven run, which are every write of its steps while it runs.
fn one_trip(write: &Transition<'_>) -> bool {
    matches!(
        write,
        Transition::StepStarted { .. }
            | Transition::StepWaits { .. }
            | Transition::StepAttempt { .. }
            | Transition::StepFinished { .. }
            | Transition::RunFinished { .. }
    )
}

/// The fenced `moves` of `run_id` and their events in one call of
/// `wf_apply_moves` (migration 0006): one statement, one round trip, and,
/// outside a transaction, its own commit. The same writes as
/// [`apply_moves`] (each guarded; one refused, none written), with the
/// fence checked first instead of after a refusal.
async fn apply_in_one_trip(
    db: impl sqlx::PgExecutor<'_>,
    run_id: &str,
    moves: &[Transition<'_>],
    fence: &Fence,
) -> Result<Vec<EventRow>, StoreError> {
    let text = |value: Option<&Value>| value.map(json_text);
    let encoded: Vec<Value> = moves
        .iter()
        .map(|write| {
            let guard = match write {
                Transition::RunFinished { .. } => write.guard().run_text(),
                _ => write.guard().steps_text(),
            };
            let to = match write {
                Transition::RunFinished { status, .. } => Some(status.as_str()),
                _ => write.step_to().map(StepStatus::as_str),
            };
            let (what, attempt, input, output, error) = match *write {
                Transition::StepStarted { attempt, input, .. }
                | Transition::StepWaits { attempt, input, .. } => {
                    ("start", Some(attempt), text(input), None, None)
                }
                Transition::StepAttempt { attempt, .. } => {
                    ("attempt", Some(attempt), None, None, None)
                }
                Transition::StepFinished { output, error, .. } => {
                    ("finish", None, None, text(output), error)
                }
                Transition::RunFinished { output, error, .. } => {
                    ("run_finish", None, None, text(output), error)
                }
                _ => unreachable!("one_trip lets only these through"),
            };
            serde_json::json!({
                "move": what,
                "step": write.step_id(),
                "to": to,
                "attempt": attempt.map(|a| a.to_string()),
                "input": input,
                "output": output,
                "code": error.map(|e| e.code.as_str()),
                "message": error.map(|e| e.message.as_str()),
                "guard": guard,
            })
        })
        .collect();
    let mut events = Vec::with_capacity(moves.len() + 1);
    for write in moves {
        if let Some(log) = write.log() {
            events.push((STEP_LOG, log.clone()));
        }
        events.push((write.kind(), write.data()));
    }
    let kinds: Vec<&str> = events.iter().map(|(kind, _)| *kind).collect();
    let data: Vec<String> = events.iter().map(|(_, data)| json_text(data)).collect();
    let at = now_text();
    let ids: Vec<i64> =
        sqlx::query_scalar("SELECT wf_apply_moves($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10)")
            .bind(run_id)
            .bind(&*fence.worker)
            .bind(fence.epoch)
            .bind(Value::Array(encoded).to_string())
            .bind(&kinds)
            .bind(&data)
            .bind(&at)
            .bind(now_ms())
            .bind(EVENT_LOCK)
            .bind(CHANNEL)
            .fetch_one(db)
            .await
            .map_err(
                |e| match e.as_database_error().and_then(|d| d.code()).as_deref() {
                    Some("WF001") => StoreError::LeaseLost(run_id.to_owned()),
                    Some("WF002") => {
                        let refused = e
                            .as_database_error()
                            .and_then(|d| d.message().parse::<usize>().ok())
                            .and_then(|i| moves.get(i));
                        match refused {
                            Some(write) => StoreError::Refused(write.refusal(run_id)),
                            None => StoreError::from(e),
                        }
                    }
                    _ => StoreError::from(e),
                },
            )?;
    events_with_ids(run_id, ids, events, &at)
}

/// The rows of `events` appended at `at` with `ids` (ascending).
fn events_with_ids(
    run_id: &str,
    ids: Vec<i64>,
    events: Vec<(&str, Value)>,
    at: &str,
) -> Result<Vec<EventRow>, StoreError> {
    if ids.len() != events.len() {
        return Err(StoreError::Corrupt(format!(
            "{} events appended, not {}",
            ids.len(),
            events.len()
        )));
    }
    Ok(ids
        .into_iter()
        .zip(events)
        .map(|(id, (kind, data))| EventRow {
            id,
            run_id: run_id.to_owned(),
            kind: kind.to_owned(),
            data,
            at: at.to_owned(),
        })
        .collect())
}

/// One move's update; how many rows its guarded statement changed.
async fn apply_move(
    tx: &mut sqlx::PgConnection,
    run_id: &str,
    write: Transition<'_>,
    fence: Option<&Fence>,
) -> Result<u64, StoreError> {
    let guard = write.guard();
    if write.fenced() && fence.is_none() {
        return Err(StoreError::Corrupt(format!(
            "run `{run_id}`: {} without the run's fence",
            write.name()
        )));
    }
    // A fenced move binds $1 run id, $2 worker, $3 epoch (see `HELD`), $4
    // the guard's states; its own from $5.
    let worker = fence.map(|f| &*f.worker);
    let epoch = fence.map_or(0, |f| f.epoch);
    let now = now_text();
    let query = match write {
        Transition::StepStarted {
            step_id,
            attempt,
            input,
        }
        | Transition::StepWaits {
            step_id,
            attempt,
            input,
        } => sqlx::query(sqlx::AssertSqlSafe(format!(
            "WITH {HELD}
             UPDATE steps SET status = $9, attempts = $6, input = $7, output = NULL,
                              error_code = NULL, error_message = NULL,
                              started_at = $8, finished_at = NULL,
                              workers = (coalesce(workers, '[]')::jsonb || jsonb_build_array(
                                  jsonb_build_object('attempt', $6, 'worker', $2::text)))::text
             WHERE run_id = $1 AND step_id = $5 AND status = ANY($4)
               AND EXISTS (SELECT 1 FROM held)"
        )))
        .bind(run_id)
        .bind(worker)
        .bind(epoch)
        .bind(guard.steps_text())
        .bind(step_id)
        .bind(i64::from(attempt))
        .bind(input.map(json_text))
        .bind(now)
        .bind(write.step_to().map_or("running", StepStatus::as_str)),
        Transition::StepAttempt { step_id, attempt } => sqlx::query(sqlx::AssertSqlSafe(format!(
            "WITH {HELD}
             UPDATE steps SET attempts = greatest(attempts, $6),
                              workers = (coalesce(workers, '[]')::jsonb || jsonb_build_array(
                                  jsonb_build_object('attempt', $6, 'worker', $2::text)))::text
             WHERE run_id = $1 AND step_id = $5 AND status = ANY($4)
               AND EXISTS (SELECT 1 FROM held)"
        )))
        .bind(run_id)
        .bind(worker)
        .bind(epoch)
        .bind(guard.steps_text())
        .bind(step_id)
        .bind(i64::from(attempt)),
        Transition::StepFinished {
            step_id,
            status,
            output,
            error,
            log: _,
        } => sqlx::query(sqlx::AssertSqlSafe(format!(
            "WITH {HELD}
             UPDATE steps SET status = $6, output = $7, error_code = $8, error_message = $9,
                              finished_at = $10
             WHERE run_id = $1 AND step_id = $5 AND status = ANY($4)
               AND EXISTS (SELECT 1 FROM held)"
        )))
        .bind(run_id)
        .bind(worker)
        .bind(epoch)
        .bind(guard.steps_text())
        .bind(step_id)
        .bind(status.as_str())
        .bind(output.map(json_text))
        .bind(error.map(|e| e.code.as_str()))
        .bind(error.map(|e| e.message.as_str()))
        .bind(now),
        Transition::RunFinished {
            status,
            output,
            error,
        } => sqlx::query(
            "UPDATE runs SET status = $5, output = $6, error_code = $7, error_message = $8,
                             finished_at = $9, finished_ms = $10,
                             lease_owner = NULL, lease_until_ms = NULL
             WHERE run_id = $1 AND lease_owner = $2 AND lease_epoch = $3
               AND status = ANY($4)",
        )
        .bind(run_id)
        .bind(worker)
        .bind(epoch)
        .bind(guard.run_text())
        .bind(status.as_str())
        .bind(output.map(json_text))
        .bind(error.map(|e| e.code.as_str()))
        .bind(error.map(|e| e.message.as_str()))
        .bind(now)
        .bind(now_ms()),
        // Unfenced run moves: $2 the steps' guard; the run first, so that
        // its steps move only when it did.
        Transition::RunReopened { .. } => {
            let changed = sqlx::query(
                "UPDATE runs SET status = CASE WHEN flow_key IS NULL AND rate_key IS NULL
                                               THEN 'running' ELSE 'queued' END,
                                 output = NULL, error_code = NULL,
                                 error_message = NULL, finished_at = NULL, finished_ms = NULL,
                                 lease_owner = NULL, lease_until_ms = NULL,
                                 cancel_requested = FALSE
                 WHERE run_id = $1 AND status = ANY($2)",
            )
            .bind(run_id)
            .bind(guard.run_text())
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if changed > 0 {
                sqlx::query(
                    "UPDATE steps SET status = 'pending', error_code = NULL, error_message = NULL,
                                      finished_at = NULL
                     WHERE run_id = $1 AND status = ANY($2)",
                )
                .bind(run_id)
                .bind(guard.steps_text())
                .execute(&mut *tx)
                .await?;
            }
            return Ok(changed);
        }
        Transition::RunAbandoned { status, error } => {
            let changed = sqlx::query(
                "UPDATE runs SET status = $3, error_code = $4, error_message = $5,
                                 finished_at = $6, finished_ms = $7,
                                 lease_owner = NULL, lease_until_ms = NULL
                 WHERE run_id = $1 AND status = ANY($2)",
            )
            .bind(run_id)
            .bind(guard.run_text())
            .bind(status.as_str())
            .bind(&error.code)
            .bind(&error.message)
            .bind(&now)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if changed > 0 {
                sqlx::query(
                    "UPDATE steps SET status = 'cancelled', error_code = $3, error_message = $4,
                                      finished_at = $5
                     WHERE run_id = $1 AND status = ANY($2)",
                )
                .bind(run_id)
                .bind(guard.steps_text())
                .bind(&error.code)
                .bind(&error.message)
                .bind(&now)
                .execute(&mut *tx)
                .await?;
            }
            return Ok(changed);
        }
        Transition::RunQueued { reason } => {
            sqlx::query("UPDATE runs SET queued_reason = $3 WHERE run_id = $1 AND status = ANY($2)")
                .bind(run_id)
                .bind(guard.run_text())
                .bind(reason)
        }
        // The proposal's time (`at_ms`) is the worker's; see below.
        Transition::RunAdmitted { .. } => {
            // Under READ COMMITTED two workers admitting runs of one key at
            // once would each count the other's admission as not yet made,
            // and both take the last slot. So every admission of a workflow
            // first takes an advisory lock on it, held until this
            // transaction commits: admissions of one workflow (whichever
            // worker makes them) happen one after the other, and the count
            // below, a statement that starts after the lock is taken, sees
            // every admission committed before. Runs only leave `running`
            // (and the window) in the meantime, which frees room and never
            // overfills it.
            sqlx::query(
                "SELECT pg_advisory_xact_lock($2, hashtext(workflow)) FROM runs WHERE run_id = $1",
            )
            .bind(run_id)
            .bind(ADMIT_LOCK)
            .fetch_optional(&mut *tx)
            .await?;
            // The admission is dated, and its rate window measured, on the
            // database's clock once the lock is held (`DB_NOW_MS`): not
            // before a run that ended meanwhile, and the same clock for
            // every worker.
            sqlx::query(
                "UPDATE runs SET status = 'running',
                                 admitted_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
                                 queued_reason = NULL,
                                 lease_owner = NULL, lease_until_ms = NULL
                 WHERE run_id = $1 AND status = ANY($2)
                   AND (flow_key IS NULL
                        OR flow_limit > (SELECT count(*) FROM runs other
                                         WHERE other.workflow = runs.workflow
                                           AND other.flow_key = runs.flow_key
                                           AND other.status = 'running'))
                   AND (rate_key IS NULL
                        OR rate_limit > (SELECT count(*) FROM runs other
                                         WHERE other.workflow = runs.workflow
                                           AND other.rate_key = runs.rate_key
                                           AND other.admitted_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                                                                   - runs.rate_period_ms))",
            )
            .bind(run_id)
            .bind(guard.run_text())
        }
    };
    Ok(query.execute(&mut *tx).await?.rows_affected())
}

/// Whether `fence` holds `run_id`.
async fn held(
    tx: &mut sqlx::PgConnection,
    run_id: &str,
    fence: &Fence,
) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = $1 AND lease_owner = $2
                                             AND lease_epoch = $3 AND status = 'running')",
    )
    .bind(run_id)
    .bind(&*fence.worker)
    .bind(fence.epoch)
    .fetch_one(tx)
    .await?)
}

/// Appends `events` (kind, data) of `run_id` in `tx`, in order, all at
/// `at`, and sends the `event` note when it commits.
///
/// Ids are drawn from a sequence when a row is inserted, but become
/// visible when it commits: two workers appending at once could commit ids
/// 8 and 7 in that order, and a client that read 8 and resumes after it
/// would never see 7. Held until commit, the event lock makes drawing and
/// committing one step, so ids appear in order.
async fn append_events(
    tx: &mut sqlx::PgConnection,
    run_id: &str,
    events: Vec<(&str, Value)>,
    at: &str,
) -> Result<Vec<EventRow>, StoreError> {
    let kinds: Vec<&str> = events.iter().map(|(kind, _)| *kind).collect();
    let data: Vec<String> = events.iter().map(|(_, data)| json_text(data)).collect();
    // The lock, the note and one insert for them all (migration 0006); each
    // row draws its id in order, so the ids, ascending, are the events'.
    let ids: Vec<i64> = sqlx::query_scalar("SELECT wf_append_events($1, $2, $3, $4, $5, $6)")
        .bind(run_id)
        .bind(&kinds)
        .bind(&data)
        .bind(at)
        .bind(EVENT_LOCK)
        .bind(CHANNEL)
        .fetch_one(&mut *tx)
        .await?;
    events_with_ids(run_id, ids, events, at)
}

/// `pg_notify` on the channel; delivered when the transaction commits.
async fn notify(conn: &mut sqlx::PgConnection, payload: &str) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(payload)
        .execute(conn)
        .await?;
    Ok(())
}

/// The fence of a write, as a CTE over `$1` (run id), `$2` (worker) and `$3`
/// (epoch). `FOR SHARE` holds the run row until the write commits, so a
/// claim cannot take the run between the check and the write: either the
/// claim waits for the write, or the write sees the claim and changes nothing.
const HELD: &str = "held AS (SELECT 1 FROM runs WHERE run_id = $1 AND lease_owner = $2
                                               AND lease_epoch = $3 AND status = 'running'
                             FOR SHARE)";

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    fn shared(&self) -> bool {
        true
    }

    /// The run, its steps, its first event and the transitions that
    /// follow, in one transaction.
    async fn create_run_with_event(
        &self,
        new: &NewRun,
        lease: Option<&Lease>,
        first: Option<(&str, &Value)>,
        then: Option<FirstTransitions<'_>>,
    ) -> Result<NewRunWrite, StoreError> {
        let run = &new.run;
        let concurrency = run.flow.as_ref().and_then(|f| f.concurrency.as_ref());
        let rate = run.flow.as_ref().and_then(|f| f.rate.as_ref());
        let mut tx = self.pool.begin().await?;
        let inserted = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO runs (run_id, workflow, status, input, definition, definition_hash,
                               idempotency_key, created_ms, started_at,
                               lease_owner, lease_until_ms, lease_epoch, run_trigger,
                               flow_key, flow_limit, rate_key, rate_limit, rate_period_ms,
                               priority)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9,
                     $10, CASE WHEN $10::text IS NULL THEN NULL ELSE {DB_NOW_MS} + $11 END,
                     CASE WHEN $10::text IS NULL THEN 0 ELSE 1 END, $12,
                     $13, $14, $15, $16, $17, $18)
             ON CONFLICT DO NOTHING"
        )))
        .bind(&run.run_id)
        .bind(&run.workflow)
        .bind(run.status.as_str())
        .bind(json_text(&run.input))
        .bind(json_text(&run.definition))
        .bind(&run.definition_hash)
        .bind(&run.idempotency_key)
        .bind(run.created_ms)
        .bind(&run.started_at)
        .bind(lease.map(|l| &*l.worker))
        .bind(lease.map_or(0, |l| duration_ms(l.duration)))
        .bind(run.trigger.as_ref().map(json_text))
        .bind(concurrency.map(|c| c.key.as_str()))
        .bind(concurrency.map(|c| i64::from(c.limit)))
        .bind(rate.map(|r| r.key.as_str()))
        .bind(rate.map(|r| i64::from(r.limit)))
        .bind(rate.map(|r| r.period_ms))
        .bind(run.flow.as_ref().map_or(0, |f| f.priority))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            let existing = sqlx::query(
                "SELECT * FROM runs WHERE (workflow = $1 AND idempotency_key = $2) OR run_id = $3
                 ORDER BY run_id = $3 LIMIT 1",
            )
            .bind(&run.workflow)
            .bind(&run.idempotency_key)
            .bind(&run.run_id)
            .fetch_one(&mut *tx)
            .await?;
            tx.rollback().await?;
            return Ok(NewRunWrite {
                created: Created::Existing(Box::new(run_row(&existing)?)),
                events: Vec::new(),
                then_stored: false,
            });
        }
        sqlx::query(
            "INSERT INTO steps (run_id, step_id, position, status)
             SELECT $1, step_id, position - 1, 'pending'
             FROM unnest($2::text[]) WITH ORDINALITY AS s (step_id, position)",
        )
        .bind(&run.run_id)
        .bind(&new.steps)
        .execute(&mut *tx)
        .await?;
        if lease.is_none() {
            notify(&mut tx, "ready").await?;
        }
        let mut written = NewRunWrite {
            created: Created::New,
            events: Vec::new(),
            then_stored: false,
        };
        if let Some((kind, data)) = first {
            written.events = append_events(
                &mut tx,
                &run.run_id,
                vec![(kind, data.clone())],
                &now_text(),
            )
            .await?;
            // The steps that start with the run, under its fence; a
            // savepoint, so that their failure leaves the run stored.
            if let Some((fence, moves)) = then.filter(|(_, moves)| !moves.is_empty()) {
                let mut starts = tx.begin().await?;
                let then = if moves.iter().all(one_trip) {
                    apply_in_one_trip(&mut *starts, &run.run_id, moves, fence).await
                } else {
                    apply_moves(&mut starts, &run.run_id, moves, Some(fence)).await
                };
                if then.is_ok() {
                    starts.commit().await?;
                } else {
                    starts.rollback().await?;
                }
                written.then_written(&run.run_id, then);
            }
        }
        tx.commit().await?;
        Ok(written)
    }

    async fn schedule(
        &self,
        workflow: &str,
        name: &str,
        from_ms: i64,
    ) -> Result<ScheduleRow, StoreError> {
        // Two statements: in one, a worker that loses the race to insert
        // would read a snapshot from before the winner's row.
        sqlx::query(
            "INSERT INTO schedules (workflow, name, last_tick_ms) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING",
        )
        .bind(workflow)
        .bind(name)
        .bind(from_ms)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query("SELECT * FROM schedules WHERE workflow = $1 AND name = $2")
            .bind(workflow)
            .bind(name)
            .fetch_one(&self.pool)
            .await?;
        schedule_row(&row)
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
        let done = sqlx::query(
            "UPDATE schedules SET last_tick_ms = $3, last_run_id = coalesce($4, last_run_id)
             WHERE workflow = $1 AND name = $2 AND last_tick_ms < $3",
        )
        .bind(workflow)
        .bind(name)
        .bind(tick_ms)
        .bind(run_id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn send_signal(
        &self,
        run_id: &str,
        signal: &str,
        payload: &Value,
        open: u32,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        // The run's row, locked: senders of one run's signals take turns,
        // so the count below is not stale when the insert commits.
        sqlx::query("SELECT 1 FROM runs WHERE run_id = $1 FOR NO KEY UPDATE")
            .bind(run_id)
            .execute(&mut *tx)
            .await?;
        let kept = sqlx::query(
            "INSERT INTO signals (run_id, signal, payload, sent_at)
             SELECT $1, $2, $3, $4
             WHERE (SELECT count(*) FROM signals
                    WHERE run_id = $1 AND signal = $2 AND step_id IS NULL) < $5",
        )
        .bind(run_id)
        .bind(signal)
        .bind(json_text(payload))
        .bind(now_text())
        .bind(i64::from(open))
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if kept {
            notify(&mut tx, &format!("signal:{run_id}")).await?;
        }
        tx.commit().await?;
        Ok(kept)
    }

    async fn take_signal(
        &self,
        run_id: &str,
        signal: &str,
        step_id: &str,
    ) -> Result<Option<Value>, StoreError> {
        let payload: Option<String> = sqlx::query_scalar(
            "UPDATE signals SET step_id = $3
             WHERE id = (SELECT id FROM signals
                         WHERE run_id = $1 AND signal = $2 AND (step_id IS NULL OR step_id = $3)
                         ORDER BY step_id IS NULL, id LIMIT 1
                         FOR UPDATE)
             RETURNING payload",
        )
        .bind(run_id)
        .bind(signal)
        .bind(step_id)
        .fetch_optional(&self.pool)
        .await?;
        parse_json(payload)
    }

    async fn signals(&self, run_id: &str) -> Result<Vec<SignalRow>, StoreError> {
        sqlx::query("SELECT * FROM signals WHERE run_id = $1 ORDER BY id")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(signal_row)
            .collect()
    }

    async fn waiting_steps(&self, limit: u32) -> Result<Vec<WaitingStep>, StoreError> {
        let rows: Vec<(String, String, String, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT s.run_id, r.workflow, s.step_id, s.input, s.started_at
             FROM steps s JOIN runs r ON r.run_id = s.run_id
             WHERE s.status = 'waiting' ORDER BY s.started_at, s.run_id LIMIT $1",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(run_id, workflow, step, input, since)| {
                Ok(WaitingStep {
                    run_id,
                    workflow,
                    step,
                    input: parse_json(input)?.unwrap_or(Value::Null),
                    since,
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
        sqlx::query(
            "INSERT INTO upstream_tasks (call_key, run_id, connection, task_id, created_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (call_key) DO UPDATE SET task_id = excluded.task_id,
                 connection = excluded.connection, created_at = excluded.created_at",
        )
        .bind(key)
        .bind(run_id)
        .bind(connection)
        .bind(task_id)
        .bind(now_text())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn task_of(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT task_id FROM upstream_tasks WHERE call_key = $1")
                .bind(key)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn put_question(
        &self,
        run_id: &str,
        step_id: &str,
        item: u32,
        question: Option<&Value>,
    ) -> Result<(), StoreError> {
        let query = match question {
            Some(question) => sqlx::query(
                "INSERT INTO questions (run_id, step_id, item, question, asked_at)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (run_id, step_id, item) DO UPDATE
                 SET question = excluded.question, asked_at = excluded.asked_at",
            )
            .bind(run_id)
            .bind(step_id)
            .bind(i64::from(item))
            .bind(question.to_string())
            .bind(now_text()),
            None => sqlx::query(
                "DELETE FROM questions WHERE run_id = $1 AND step_id = $2 AND item = $3",
            )
            .bind(run_id)
            .bind(step_id)
            .bind(i64::from(item)),
        };
        query.execute(&self.pool).await?;
        Ok(())
    }

    async fn questions(&self, run_id: &str) -> Result<Vec<QuestionRow>, StoreError> {
        let rows: Vec<(String, i64, String, String)> = sqlx::query_as(
            "SELECT step_id, item, question, asked_at FROM questions
             WHERE run_id = $1 ORDER BY asked_at, step_id, item",
        )
        .bind(run_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(step_id, item, question, asked_at)| QuestionRow {
                step_id,
                item: u32::try_from(item).unwrap_or_default(),
                question: serde_json::from_str(&question).unwrap_or(Value::Null),
                asked_at,
            })
            .collect())
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRow>, StoreError> {
        sqlx::query("SELECT * FROM schedules ORDER BY workflow, name")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(schedule_row)
            .collect()
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunRow>, StoreError> {
        sqlx::query("SELECT * FROM runs WHERE run_id = $1")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(run_row)
            .transpose()
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRow>, StoreError> {
        sqlx::query("SELECT * FROM steps WHERE run_id = $1 ORDER BY position")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(step_row)
            .collect()
    }

    async fn calls(&self, run_id: &str, step_id: &str) -> Result<Vec<CallRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM calls WHERE run_id = $1 AND step_id = $2 ORDER BY attempt, item, seq",
        )
        .bind(run_id)
        .bind(step_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(CallRow {
                    run_id: row.try_get("run_id")?,
                    step_id: row.try_get("step_id")?,
                    item: row.try_get::<i64, _>("item")? as u32,
                    attempt: row.try_get::<i64, _>("attempt")? as u32,
                    seq: row.try_get::<i64, _>("seq")? as u32,
                    name: row.try_get("name")?,
                    arguments: parse_json(row.try_get("arguments")?)?.unwrap_or(Value::Null),
                    outcome: row.try_get("outcome")?,
                    error_code: row.try_get("error_code")?,
                    duration_us: row.try_get::<i64, _>("duration_us")? as u64,
                    at: row.try_get("at")?,
                    result: parse_json(row.try_get("result")?)?,
                })
            })
            .collect()
    }

    async fn list_runs(
        &self,
        query: &ListQuery,
    ) -> Result<(Vec<RunRow>, Option<String>), StoreError> {
        let after = query.cursor.as_deref().map(parse_cursor).transpose()?;
        let limit = query.limit.clamp(1, 1000);
        let rows = sqlx::query(
            "SELECT * FROM runs
             WHERE ($1::text IS NULL OR workflow = $1) AND ($2::text IS NULL OR status = $2)
               AND ($3::bigint IS NULL OR created_ms < $3 OR (created_ms = $3 AND run_id < $4))
             ORDER BY created_ms DESC, run_id DESC
             LIMIT $5",
        )
        .bind(&query.workflow)
        .bind(query.status.map(RunStatus::as_str))
        .bind(after.as_ref().map(|(ms, _)| *ms))
        .bind(after.as_ref().map(|(_, id)| id.as_str()))
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.pool)
        .await?;
        let mut runs = rows.iter().map(run_row).collect::<Result<Vec<_>, _>>()?;
        let next = if runs.len() > limit as usize {
            runs.truncate(limit as usize);
            runs.last().map(cursor_of)
        } else {
            None
        };
        Ok((runs, next))
    }

    async fn unfinished_runs(&self) -> Result<Vec<RunRow>, StoreError> {
        sqlx::query("SELECT * FROM runs WHERE status = 'running' ORDER BY created_ms, run_id")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(run_row)
            .collect()
    }

    async fn queued_runs(&self, limit: u32, offset: u32) -> Result<Vec<RunRow>, StoreError> {
        sqlx::query(
            "SELECT * FROM runs WHERE status = 'queued'
             ORDER BY priority DESC, created_ms, run_id LIMIT $1 OFFSET $2",
        )
        .bind(i64::from(limit))
        .bind(i64::from(offset))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(run_row)
        .collect()
    }

    async fn flow_usage(
        &self,
        workflow: &str,
        flow: &Flow,
        now_ms: i64,
    ) -> Result<FlowUsage, StoreError> {
        let concurrency = flow.concurrency.as_ref();
        let rate = flow.rate.as_ref();
        let row = sqlx::query(
            "SELECT (SELECT count(*) FROM runs WHERE workflow = $1 AND flow_key = $2
                                                 AND status = 'running') AS running,
                    (SELECT count(*) FROM runs WHERE workflow = $1 AND rate_key = $3
                                                 AND admitted_ms > $4 - $5) AS admitted,
                    (SELECT min(admitted_ms) FROM runs WHERE workflow = $1 AND rate_key = $3
                                                       AND admitted_ms > $4 - $5) AS oldest",
        )
        .bind(workflow)
        .bind(concurrency.map(|c| c.key.as_str()))
        .bind(rate.map(|r| r.key.as_str()))
        .bind(now_ms)
        .bind(rate.map_or(0, |r| r.period_ms))
        .fetch_one(&self.pool)
        .await?;
        Ok(FlowUsage {
            running: row.try_get::<i64, _>("running")? as u64,
            admitted: row.try_get::<i64, _>("admitted")? as u64,
            window_frees_ms: row
                .try_get::<Option<i64>, _>("oldest")?
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
        if let Some(fence) = fence
            && moves.iter().all(one_trip)
        {
            return apply_in_one_trip(&self.pool, run_id, moves, fence).await;
        }
        let mut tx = self.pool.begin().await?;
        let events = apply_moves(&mut tx, run_id, moves, fence).await?;
        tx.commit().await?;
        Ok(events)
    }

    async fn record_call(&self, call: &CallRow, fence: &Fence) -> Result<(), StoreError> {
        let inserted = sqlx::query(sqlx::AssertSqlSafe(format!(
            "WITH {HELD}
             INSERT INTO calls (run_id, step_id, item, attempt, seq, name, arguments,
                                outcome, error_code, duration_us, at, result)
             SELECT $1, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14 FROM held
             ON CONFLICT (run_id, step_id, item, attempt, seq) DO UPDATE
                 SET name = excluded.name, arguments = excluded.arguments,
                     outcome = excluded.outcome, error_code = excluded.error_code,
                     duration_us = excluded.duration_us, at = excluded.at,
                     result = excluded.result"
        )))
        .bind(&call.run_id)
        .bind(&*fence.worker)
        .bind(fence.epoch)
        .bind(&call.step_id)
        .bind(i64::from(call.item))
        .bind(i64::from(call.attempt))
        .bind(i64::from(call.seq))
        .bind(&call.name)
        .bind(json_text(&call.arguments))
        .bind(&call.outcome)
        .bind(&call.error_code)
        .bind(call.duration_us as i64)
        .bind(&call.at)
        .bind(call.result.as_ref().map(json_text))
        .execute(&self.pool)
        .await?
        .rows_affected();
        if inserted == 0 {
            return Err(StoreError::LeaseLost(call.run_id.clone()));
        }
        Ok(())
    }

    async fn counts(&self) -> Result<Counts, StoreError> {
        let row = sqlx::query(
            "SELECT count(*) AS total, count(*) FILTER (WHERE status = 'running') AS running,
                    count(*) FILTER (WHERE status = 'queued') AS queued,
                    (SELECT coalesce(max(id), 0)::bigint FROM events) AS last_event,
                    (SELECT count(DISTINCT run_id) FROM steps WHERE status = 'waiting') AS waiting
             FROM runs",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Counts {
            runs_running: row.try_get::<i64, _>("running")? as u64,
            runs_queued: row.try_get::<i64, _>("queued")? as u64,
            runs_total: row.try_get::<i64, _>("total")? as u64,
            runs_waiting_for_signal: row.try_get::<i64, _>("waiting")? as u64,
            last_event_id: row.try_get("last_event")?,
        })
    }

    async fn append_event(
        &self,
        run_id: &str,
        kind: &str,
        data: &Value,
    ) -> Result<EventRow, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut events =
            append_events(&mut tx, run_id, vec![(kind, data.clone())], &now_text()).await?;
        tx.commit().await?;
        Ok(events.remove(0))
    }

    async fn events(
        &self,
        run_id: Option<&str>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<EventRow>, StoreError> {
        let rows: Vec<(i64, String, String, String, String)> = sqlx::query_as(
            "SELECT id, run_id, kind, data, at FROM events
             WHERE id > $1 AND ($2::text IS NULL OR run_id = $2) ORDER BY id LIMIT $3",
        )
        .bind(after)
        .bind(run_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(id, run_id, kind, data, at)| {
                Ok(EventRow {
                    id,
                    run_id,
                    kind,
                    data: serde_json::from_str(&data)
                        .map_err(|e| StoreError::Corrupt(format!("event {id}: {e}")))?,
                    at,
                })
            })
            .collect()
    }

    async fn last_event_id(&self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT coalesce(max(id), 0)::bigint FROM events")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    async fn prune(&self, keep_runs: u64, finished_before_ms: i64) -> Result<u64, StoreError> {
        let deleted = sqlx::query(
            // As SQLite's: the newest finished run past `keep_runs` and
            // every one finished before it, by a range of finished times.
            "WITH cut AS (SELECT finished_ms AS ms, run_id AS id FROM runs
                          WHERE status != 'running' AND status != 'queued'
                          ORDER BY finished_ms DESC NULLS LAST, run_id DESC LIMIT 1 OFFSET $2)
             DELETE FROM runs WHERE status != 'running' AND status != 'queued'
                 AND (finished_ms < $1
                      OR (finished_ms, run_id) <= (SELECT ms, id FROM cut)
                      OR (finished_ms IS NULL AND EXISTS (SELECT 1 FROM cut)))",
        )
        .bind(finished_before_ms)
        .bind(i64::try_from(keep_runs).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(deleted)
    }

    fn listen(&self) -> Option<broadcast::Receiver<Note>> {
        Some(self.notes.subscribe())
    }

    async fn claim_runs(
        &self,
        worker: &str,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<(RunRow, Fence)>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // SKIP LOCKED: rows another worker is claiming right now are passed
        // over rather than waited for (and never claimed twice).
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE runs SET lease_owner = $1, lease_until_ms = {DB_NOW_MS} + $2,
                             lease_epoch = lease_epoch + 1
             WHERE run_id IN (
                 SELECT run_id FROM runs
                 WHERE status = 'running'
                   AND (lease_owner IS NULL OR lease_until_ms < {DB_NOW_MS})
                 ORDER BY created_ms, run_id
                 LIMIT $3
                 FOR UPDATE SKIP LOCKED)
             RETURNING *"
        )))
        .bind(worker)
        .bind(duration_ms(lease))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        let worker: Arc<str> = worker.into();
        let mut claimed = rows
            .iter()
            .map(|row| {
                let fence = Fence {
                    worker: worker.clone(),
                    epoch: row.try_get("lease_epoch")?,
                };
                Ok((run_row(row)?, fence))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        // RETURNING has no order.
        claimed.sort_by(|(a, _), (b, _)| (a.created_ms, &a.run_id).cmp(&(b.created_ms, &b.run_id)));
        Ok(claimed)
    }

    async fn renew(
        &self,
        worker: &str,
        runs: &[String],
        lease: Duration,
    ) -> Result<Renewed, StoreError> {
        if runs.is_empty() {
            return Ok(Renewed::default());
        }
        let renewed: Vec<(String, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE runs SET lease_until_ms = {DB_NOW_MS} + $3
             WHERE lease_owner = $1 AND run_id = ANY($2) AND status = 'running'
             RETURNING run_id, cancel_requested"
        )))
        .bind(worker)
        .bind(runs)
        .bind(duration_ms(lease))
        .fetch_all(&self.pool)
        .await?;
        let lost = runs
            .iter()
            .filter(|id| !renewed.iter().any(|(r, _)| r == *id))
            .cloned()
            .collect();
        let cancel = renewed
            .into_iter()
            .filter_map(|(id, cancel)| cancel.then_some(id))
            .collect();
        Ok(Renewed { lost, cancel })
    }

    async fn release_runs(&self, worker: &str, runs: &[String]) -> Result<(), StoreError> {
        if runs.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "WITH released AS (
                 UPDATE runs SET lease_owner = NULL, lease_until_ms = NULL
                 WHERE lease_owner = $1 AND run_id = ANY($2)
                 RETURNING 1)
             SELECT pg_notify($3, 'ready') WHERE EXISTS (SELECT 1 FROM released)",
        )
        .bind(worker)
        .bind(runs)
        .bind(CHANNEL)
        .fetch_all(&self.pool)
        .await?;
        Ok(())
    }

    async fn request_cancel(
        &self,
        run_id: &str,
        failure: &Failure,
    ) -> Result<CancelRequest, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(String, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT status, lease_owner IS NOT NULL AND lease_until_ms >= {DB_NOW_MS}
             FROM runs WHERE run_id = $1 FOR UPDATE"
        )))
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await?;
        let outcome = match row {
            // A queued run is held by nobody: it ends here (below).
            Some((status, _))
                if status != RunStatus::Running.as_str()
                    && status != RunStatus::Queued.as_str() =>
            {
                CancelRequest::NotRunning
            }
            None => CancelRequest::NotRunning,
            Some((_, true)) => {
                sqlx::query("UPDATE runs SET cancel_requested = TRUE WHERE run_id = $1")
                    .bind(run_id)
                    .execute(&mut *tx)
                    .await?;
                notify(&mut tx, &format!("cancel:{run_id}")).await?;
                CancelRequest::Signalled
            }
            Some((_, false)) => {
                let abandon = Transition::RunAbandoned {
                    status: RunStatus::Cancelled,
                    error: failure,
                };
                CancelRequest::Ended(apply_moves(&mut tx, run_id, &[abandon], None).await?)
            }
        };
        tx.commit().await?;
        Ok(outcome)
    }

    async fn heartbeat(&self, worker: &WorkerRow) -> Result<(), StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO workers (id, started_at, heartbeat_ms, running_steps)
             VALUES ($1, $2, {DB_NOW_MS}, $3)
             ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at,
                                            heartbeat_ms = excluded.heartbeat_ms,
                                            running_steps = excluded.running_steps"
        )))
        .bind(&worker.id)
        .bind(&worker.started_at)
        .bind(i64::try_from(worker.running_steps).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await?;
        // Workers that went away long ago, so the table does not grow.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM workers WHERE heartbeat_ms < {DB_NOW_MS} - $1"
        )))
        .bind(FORGET_WORKERS_MS)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn workers(&self, within: Duration) -> Result<Vec<WorkerRow>, StoreError> {
        let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT id, started_at, heartbeat_ms, running_steps FROM workers
             WHERE heartbeat_ms >= {DB_NOW_MS} - $1 ORDER BY id"
        )))
        .bind(duration_ms(within))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, started_at, heartbeat_ms, running_steps)| WorkerRow {
                id,
                started_at,
                last_heartbeat: ms_text(heartbeat_ms),
                running_steps: running_steps.max(0) as u64,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_left_out_of_the_location() {
        assert_eq!(
            redact_password("postgres://wf:s3cret@db.example:5432/wf?sslmode=disable"),
            "postgres://wf@db.example:5432/wf?sslmode=disable"
        );
        assert_eq!(
            redact_password("postgresql://wf@localhost/wf?password=s3cret&application_name=x"),
            "postgresql://wf@localhost/wf?application_name=x"
        );
        assert_eq!(
            redact_password("postgres://localhost/wf?password=s3cret"),
            "postgres://localhost/wf"
        );
        assert_eq!(redact_password("postgres://a:b:c@h"), "postgres://a@h");
    }

    #[test]
    fn notes_parse() {
        assert_eq!(parse_note("ready"), Some(Note::Ready));
        assert_eq!(parse_note("event"), Some(Note::Event));
        assert_eq!(
            parse_note("finished:r:1"),
            Some(Note::Finished("r:1".into()))
        );
        assert_eq!(parse_note("cancel:r1"), Some(Note::Cancel("r1".into())));
        assert_eq!(parse_note("other"), None);
    }
}
