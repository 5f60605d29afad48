//! The SQLite store: one file in WAL mode, or `:memory:`.
//!
//! A state file is marked with SQLite's `application_id`, so a file that
//! belongs to something else (or is not SQLite at all) is refused, never
//! written to. Migrations are embedded and run at open, so an older state file
//! upgrades in place.

use std::path::Path;
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Row};

use super::group_commit::{Write, Writer};
use super::rows::{
    cursor_of, json_text, parse_cursor, parse_json, run_row, schedule_row, signal_row, step_row,
};
use super::{
    CallRow, Counts, Created, EventRow, Fence, FirstTransitions, Flow, FlowUsage, Lease, ListQuery,
    NewRun, NewRunWrite, QuestionRow, RunRow, RunStatus, STEP_LOG, ScheduleRow, SignalRow, StepRow,
    StepStatus, Store, StoreError, Transition, WaitingStep, now_ms, now_text,
};

/// The file's schema, step by step.
static MIGRATOR: LazyLock<sqlx::migrate::Migrator> = LazyLock::new(|| super::embedded(MIGRATIONS));

/// `migrations/sqlite`, file by file (see [`super::embedded`]).
pub(super) const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "runs",
        include_str!("../../migrations/sqlite/0001_runs.sql"),
    ),
    (
        2,
        "events",
        include_str!("../../migrations/sqlite/0002_events.sql"),
    ),
    (
        3,
        "workers",
        include_str!("../../migrations/sqlite/0003_workers.sql"),
    ),
    (
        4,
        "triggers",
        include_str!("../../migrations/sqlite/0004_triggers.sql"),
    ),
    (
        5,
        "flow",
        include_str!("../../migrations/sqlite/0005_flow.sql"),
    ),
    (
        6,
        "prune index",
        include_str!("../../migrations/sqlite/0006_prune_index.sql"),
    ),
];

/// `PRAGMA application_id` of a wf-host state file: "wfhs".
const APPLICATION_ID: i64 = 0x7766_6873;

const FOREIGN: &str = "it holds another application's database, not wf-host state; move it away or pick another `state` path";

/// The SQLite store.
///
/// Reads use a pool of connections; every write of the runs and pruning go
/// through one connection owned by a [`Writer`], which commits concurrent
/// writes together (see [`super::group_commit`]). Only a migration, at
/// open, uses a connection of its own.
pub struct SqliteStore {
    /// For reads.
    pool: SqlitePool,
    /// Its one connection, for migrations.
    writes: SqlitePool,
    writer: Writer,
    location: String,
    /// An exclusive lock on `<file>.lock` while this store is open: two hosts
    /// on one state file would both resume the same runs.
    _lock: Option<std::fs::File>,
    /// Stops the WAL checkpoints (see [`checkpoints`]) when the store drops.
    _checkpoints: Option<tokio_util::sync::DropGuard>,
    /// Where a `:memory:` state keeps its file, removed with the store
    /// (declared last: it goes after the connections).
    _temp: Option<tempfile::TempDir>,
}

impl SqliteStore {
    /// Opens (creating if needed) the state at `location`: a file path, or
    /// `:memory:`.
    ///
    /// # Errors
    /// [`StoreError::Open`] for a file that is not a wf-host state file, is
    /// corrupt, or cannot be created.
    pub async fn open(location: &str) -> Result<SqliteStore, StoreError> {
        if location == ":memory:" {
            // A file of its own in a temp dir that goes with the store: the
            // writer's connection and the readers' share it, as they could
            // not share an in-memory database.
            let dir = tempfile::Builder::new()
                .prefix("wf-state-")
                .tempdir()
                .map_err(|e| StoreError::Open {
                    path: location.to_owned(),
                    message: format!("cannot make a temp dir for it: {e}"),
                })?;
            let path = dir.path().join("state.db");
            let mut store = SqliteStore::open_file(&path.display().to_string()).await?;
            store.location = location.to_owned();
            store._temp = Some(dir);
            return Ok(store);
        }
        SqliteStore::open_file(location).await
    }

    async fn open_file(location: &str) -> Result<SqliteStore, StoreError> {
        let path = Path::new(location);
        let open_err = |message: String| StoreError::Open {
            path: location.to_owned(),
            message,
        };
        let fresh = match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => return Err(open_err("it is a directory".into())),
            Ok(meta) => meta.len() == 0,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| open_err(format!("cannot create its directory: {e}")))?;
                }
                true
            }
            Err(e) => return Err(open_err(e.to_string())),
        };
        let lock = lock_file(path).map_err(open_err)?;
        if !fresh {
            // Checked before SQLite touches the file: a foreign file is never
            // turned into a database, not even by a WAL side file.
            let mut head = [0u8; 16];
            let n = std::io::Read::read(
                &mut std::fs::File::open(path).map_err(|e| open_err(e.to_string()))?,
                &mut head,
            )
            .map_err(|e| open_err(e.to_string()))?;
            if n < 16 || &head != b"SQLite format 3\0" {
                return Err(open_err(
                    "it is not a wf-host state file (not an SQLite database); move it away or pick another `state` path".into(),
                ));
            }
        }
        if !fresh {
            // Asked read-only, before the pool switches the file to WAL: a
            // database that is not ours is left exactly as it was.
            // `immutable`: no lock, no WAL or shared-memory side files.
            let mut probe = SqliteConnectOptions::new()
                .filename(path)
                .read_only(true)
                .immutable(true)
                .connect()
                .await
                .map_err(|e| open_err(e.to_string()))?;
            let app_id: i64 = sqlx::query_scalar("PRAGMA application_id")
                .fetch_one(&mut probe)
                .await
                .map_err(|e| open_err(e.to_string()))?;
            let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_master")
                .fetch_one(&mut probe)
                .await
                .map_err(|e| open_err(e.to_string()))?;
            if app_id != APPLICATION_ID && (app_id != 0 || tables > 0) {
                let _ = sqlx::Connection::close(probe).await;
                return Err(open_err(FOREIGN.into()));
            }
            let check: String = sqlx::query_scalar("PRAGMA quick_check")
                .fetch_one(&mut probe)
                .await
                .map_err(|e| open_err(format!("it is corrupt: {e}")))?;
            let _ = sqlx::Connection::close(probe).await;
            if check != "ok" {
                return Err(open_err(format!("it is corrupt: {check}")));
            }
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // WAL + NORMAL: a killed process loses nothing that was committed;
            // only a power cut may lose the last transactions.
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        // A connection to a file in this process does not go away: testing
        // one before each use would cost a round trip to its thread.
        let writes = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            // Room for every chunk the writer compiles (see group_commit).
            .connect_with(
                options
                    .clone()
                    .statement_cache_capacity(256)
                    // Checkpoints run beside it (see `checkpoints`), so that
                    // no write waits for one.
                    .pragma("wal_autocheckpoint", "0"),
            )
            .await
            .map_err(|e| open_err(e.to_string()))?;
        let store = SqliteStore {
            pool: writes.clone(),
            writer: Writer::start(path).map_err(open_err)?,
            writes,
            location: location.to_owned(),
            _lock: Some(lock),
            _checkpoints: None,
            _temp: None,
        };
        store.prepare().await.map_err(|e| match e {
            StoreError::Db(e) => open_err(e.to_string()),
            other => other,
        })?;
        // Readers only once the file is ours and migrated.
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(|e| open_err(e.to_string()))?;
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(checkpoints(pool.clone(), stop.clone()));
        Ok(SqliteStore {
            pool,
            _checkpoints: Some(stop.drop_guard()),
            ..store
        })
    }

    /// Checks that the database is ours (or empty), then migrates it, on the
    /// writing connection.
    async fn prepare(&self) -> Result<(), StoreError> {
        let open_err = |message: String| StoreError::Open {
            path: self.location.clone(),
            message,
        };
        let app_id: i64 = sqlx::query_scalar("PRAGMA application_id")
            .fetch_one(&self.writes)
            .await?;
        if app_id != APPLICATION_ID {
            let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_master")
                .fetch_one(&self.writes)
                .await?;
            if app_id != 0 || tables > 0 {
                return Err(open_err(FOREIGN.into()));
            }
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "PRAGMA application_id = {APPLICATION_ID}"
            )))
            .execute(&self.writes)
            .await?;
        }
        let check: String = sqlx::query_scalar("PRAGMA quick_check")
            .fetch_one(&self.writes)
            .await?;
        if check != "ok" {
            return Err(open_err(format!("it is corrupt: {check}")));
        }
        MIGRATOR
            .run(&self.writes)
            .await
            .map_err(|e| open_err(format!("cannot migrate it: {e}")))?;
        Ok(())
    }

    /// The pool, for tests that inspect the file.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// A new run with its pending steps and, with `event`, its first event
    /// and then the transitions of `then`, in one write; or the run that used
    /// the same idempotency key.
    async fn create(
        &self,
        new: &NewRun,
        _lease: Option<&Lease>,
        event: Option<(&str, &Value)>,
        then: Option<FirstTransitions<'_>>,
    ) -> Result<NewRunWrite, StoreError> {
        // One worker: every run is this process's, without a lease.
        let run = &new.run;
        // The run and all its steps in one write (the steps from a JSON array
        // of their ids, positions from its indexes). The steps, and the
        // event, are inserted only when the run was: `changes()` is the run
        // insert's count, and a run whose key was used before is not there
        // under this run's id.
        macro_rules! create {
            ($($event:literal)?) => {
                concat!(
                    "INSERT INTO runs (run_id, workflow, status, input, definition, definition_hash,
                                       idempotency_key, created_ms, started_at, run_trigger,
                                       flow_key, flow_limit, rate_key, rate_limit,
                                       rate_period_ms, priority)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?11, ?15, ?16, ?17, ?18, ?19, ?20)
                     ON CONFLICT DO NOTHING
                     RETURNING 1;
                     INSERT INTO steps (run_id, step_id, position, status)
                     SELECT ?1, value, key, 'pending' FROM json_each(?10) WHERE changes() = 1"
                    $(, $event)?
                )
            };
        }
        let steps = serde_json::to_string(&new.steps).expect("step ids are strings");
        let at = now_text();
        let write = match event {
            None => Write::new(create!()),
            Some(_) => Write::new(create!(
                "; INSERT INTO events (run_id, kind, data, at)
                   SELECT ?1, ?12, ?13, ?14 WHERE EXISTS (SELECT 1 FROM runs WHERE run_id = ?1)
                   RETURNING id"
            )),
        }
        .arg(run.run_id.as_str())
        .arg(run.workflow.as_str())
        .arg(run.status.as_str())
        .arg(json_text(&run.input))
        .arg(json_text(&run.definition))
        .arg(run.definition_hash.as_str())
        .arg(run.idempotency_key.as_deref())
        .arg(run.created_ms)
        .arg(run.started_at.as_str())
        .arg(steps)
        .arg(run.trigger.as_ref().map(json_text));
        // ?12..?14 are the event's; without one they are bound all the same,
        // so the flow columns keep their numbers.
        let write = match event {
            None => write.arg(None::<&str>).arg(None::<&str>).arg(None::<&str>),
            Some((kind, data)) => write.arg(kind).arg(json_text(data)).arg(at.as_str()),
        };
        let flow = run.flow.as_ref();
        let concurrency = flow.and_then(|f| f.concurrency.as_ref());
        let rate = flow.and_then(|f| f.rate.as_ref());
        let write = write
            .arg(concurrency.map(|c| c.key.as_str()))
            .arg(concurrency.map(|c| i64::from(c.limit)))
            .arg(rate.map(|r| r.key.as_str()))
            .arg(rate.map(|r| i64::from(r.limit)))
            .arg(rate.map(|r| r.period_ms))
            .arg(flow.map_or(0, |f| f.priority));
        // The transitions that follow go in the same write, but only where
        // the run's id alone decides that the run is new: with a key, a run
        // found by it is not this one, and its steps are not to be touched.
        let then = then.filter(|(_, writes)| event.is_some() && !writes.is_empty());
        let (write, then) = match then {
            Some((fence, writes)) if run.idempotency_key.is_none() => {
                let (joined, each) = transitions_write(&run.run_id, writes, Some(fence));
                (write.then(joined), Some((writes, each)))
            }
            _ => (write, None),
        };
        let done = self.writer.write(write).await?;
        if done.first().is_some_and(|insert| !insert.is_empty()) {
            let mut written = NewRunWrite {
                created: Created::New,
                events: Vec::new(),
                then_stored: then.is_some(),
            };
            if let (Some((kind, data)), Some(&id)) =
                (event, done.get(2).and_then(|ids| ids.first()))
            {
                written.events.push(EventRow {
                    id,
                    run_id: run.run_id.clone(),
                    kind: kind.to_owned(),
                    data: data.clone(),
                    at,
                });
            }
            if let Some((writes, each)) = then {
                let ids = done.into_iter().skip(3).flatten().collect();
                written
                    .events
                    .extend(transition_events(&run.run_id, writes, &each, ids)?);
            }
            return Ok(written);
        }
        // Committed by now, so a reader sees the run it conflicts with.
        let existing = sqlx::query(
            "SELECT * FROM runs WHERE workflow = ? AND idempotency_key = ? OR run_id = ?",
        )
        .bind(&run.workflow)
        .bind(&run.idempotency_key)
        .bind(&run.run_id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| {
            StoreError::Corrupt(format!(
                "run `{}` was neither created nor found: the run it conflicted with is gone",
                run.run_id
            ))
        })?;
        Ok(NewRunWrite {
            created: Created::Existing(Box::new(run_row(&existing)?)),
            events: Vec::new(),
            then_stored: false,
        })
    }
}

/// How often the WAL is copied back into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// Copies the WAL back into the database file every [`CHECKPOINT_EVERY`],
/// from a reading connection, until `stop`.
///
/// SQLite's automatic checkpoint runs inside the commit that crosses 1,000
/// pages of WAL, with an `fsync`: that write, and every write grouped with
/// it, waited tens of milliseconds. A passive checkpoint from another
/// connection waits for nobody and holds up no writer. (Under a steady load
/// it never completes; the writer finishes one past a bound, see
/// `group_commit`.)
async fn checkpoints(pool: SqlitePool, stop: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&pool)
            .await
        {
            tracing::warn!("cannot copy the state file's WAL back into it: {e}");
        }
    }
}

/// Takes `<path>.lock` exclusively, or says who holds it.
fn lock_file(path: &Path) -> Result<std::fs::File, String> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| format!("cannot open its lock file: {e}"))?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if !locked {
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = holder.trim();
        return Err(format!(
            "another wf-host{} is using it; stop that one, or give this one its own `--state`",
            if holder.is_empty() {
                String::new()
            } else {
                format!(" (pid {holder})")
            }
        ));
    }
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = write!(file, "{}", std::process::id());
    Ok(file)
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    /// One connection writes, so events commit in id order.
    fn feeds_from_log(&self) -> bool {
        true
    }

    /// Its `transition` binds one time (`?4`) to the write and the event.
    fn stamps_with_event_time(&self) -> bool {
        true
    }

    /// The run, its steps, its first event and (for a run without an
    /// idempotency key) the transitions that follow, in one write. With a
    /// key, the transitions are a second write, once the run is known new.
    async fn create_run_with_event(
        &self,
        new: &NewRun,
        lease: Option<&Lease>,
        first: Option<(&str, &Value)>,
        then: Option<FirstTransitions<'_>>,
    ) -> Result<NewRunWrite, StoreError> {
        let mut written = self.create(new, lease, first, then).await?;
        if let Some((fence, writes)) = then
            && first.is_some()
            && written.created == Created::New
            && !written.then_stored
            && !writes.is_empty()
        {
            let run_id = &new.run.run_id;
            let then = self.transitions(run_id, writes, Some(fence)).await;
            written.then_written(run_id, then);
        }
        Ok(written)
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunRow>, StoreError> {
        sqlx::query("SELECT * FROM runs WHERE run_id = ?")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(run_row)
            .transpose()
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRow>, StoreError> {
        sqlx::query("SELECT * FROM steps WHERE run_id = ? ORDER BY position")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(step_row)
            .collect()
    }

    async fn calls(&self, run_id: &str, step_id: &str) -> Result<Vec<CallRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM calls WHERE run_id = ? AND step_id = ? ORDER BY attempt, item, seq",
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
        let (after_ms, after_id) = match &query.cursor {
            Some(c) => parse_cursor(c)?,
            None => (i64::MAX, String::new()),
        };
        let limit = query.limit.clamp(1, 1000);
        let rows = sqlx::query(
            "SELECT * FROM runs
             WHERE (?1 IS NULL OR workflow = ?1) AND (?2 IS NULL OR status = ?2)
               AND (created_ms < ?3 OR (created_ms = ?3 AND run_id < ?4))
             ORDER BY created_ms DESC, run_id DESC
             LIMIT ?5",
        )
        .bind(&query.workflow)
        .bind(query.status.map(RunStatus::as_str))
        .bind(after_ms)
        .bind(if query.cursor.is_some() {
            after_id
        } else {
            "\u{10FFFF}".to_owned()
        })
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
             ORDER BY priority DESC, created_ms, run_id LIMIT ? OFFSET ?",
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
            "SELECT (SELECT count(*) FROM runs WHERE workflow = ?1 AND flow_key = ?2
                                                 AND status = 'running') AS running,
                    (SELECT count(*) FROM runs WHERE workflow = ?1 AND rate_key = ?3
                                                 AND admitted_ms > ?4 - ?5) AS admitted,
                    (SELECT min(admitted_ms) FROM runs WHERE workflow = ?1 AND rate_key = ?3
                                                       AND admitted_ms > ?4 - ?5) AS oldest",
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
        // One write of them all, committed together, in order.
        if moves.is_empty() {
            return Ok(Vec::new());
        }
        let (joined, each) = transitions_write(run_id, moves, fence);
        // One id per event inserted, in order.
        let ids = self
            .writer
            .write(joined)
            .await?
            .into_iter()
            .flatten()
            .collect();
        transition_events(run_id, moves, &each, ids)
    }

    async fn record_call(&self, call: &CallRow, _fence: &Fence) -> Result<(), StoreError> {
        self.writer
            .write(
                Write::new(
                    "INSERT OR REPLACE INTO calls (run_id, step_id, item, attempt, seq, name,
                                                   arguments, outcome, error_code, duration_us, at,
                                                   result)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                )
                .arg(call.run_id.as_str())
                .arg(call.step_id.as_str())
                .arg(i64::from(call.item))
                .arg(i64::from(call.attempt))
                .arg(i64::from(call.seq))
                .arg(call.name.as_str())
                .arg(json_text(&call.arguments))
                .arg(call.outcome.as_str())
                .arg(call.error_code.as_deref())
                .arg(call.duration_us as i64)
                .arg(call.at.as_str())
                .arg(call.result.as_ref().map(json_text)),
            )
            .await?;
        Ok(())
    }

    async fn counts(&self) -> Result<Counts, StoreError> {
        let row = sqlx::query(
            "SELECT count(*) AS total, coalesce(sum(status = 'running'), 0) AS running,
                    coalesce(sum(status = 'queued'), 0) AS queued,
                    (SELECT coalesce(max(id), 0) FROM events) AS last_event,
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
        let at = now_text();
        let done = self
            .writer
            .write(
                Write::new(
                    "INSERT INTO events (run_id, kind, data, at) VALUES (?1, ?2, ?3, ?4)
                     RETURNING id",
                )
                .arg(run_id)
                .arg(kind)
                .arg(json_text(data))
                .arg(at.as_str()),
            )
            .await?;
        let Some(&id) = done.first().and_then(|insert| insert.first()) else {
            return Err(StoreError::Corrupt("an event insert returned no id".into()));
        };
        Ok(EventRow {
            id,
            run_id: run_id.to_owned(),
            kind: kind.to_owned(),
            data: data.clone(),
            at,
        })
    }

    async fn events(
        &self,
        run_id: Option<&str>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<EventRow>, StoreError> {
        let rows: Vec<(i64, String, String, String, String)> = sqlx::query_as(
            "SELECT id, run_id, kind, data, at FROM events
             WHERE id > ?1 AND (?2 IS NULL OR run_id = ?2) ORDER BY id LIMIT ?3",
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
            sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM events")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    async fn schedule(
        &self,
        workflow: &str,
        name: &str,
        from_ms: i64,
    ) -> Result<ScheduleRow, StoreError> {
        let found = sqlx::query("SELECT * FROM schedules WHERE workflow = ? AND name = ?")
            .bind(workflow)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        if let Some(row) = found {
            return schedule_row(&row);
        }
        self.writer
            .write(
                Write::new(
                    "INSERT INTO schedules (workflow, name, last_tick_ms) VALUES (?1, ?2, ?3)
                     ON CONFLICT DO NOTHING",
                )
                .arg(workflow)
                .arg(name)
                .arg(from_ms),
            )
            .await?;
        let row = sqlx::query("SELECT * FROM schedules WHERE workflow = ? AND name = ?")
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
        let done = self
            .writer
            .write(
                Write::new(
                    "UPDATE schedules SET last_tick_ms = ?3, last_run_id = coalesce(?4, last_run_id)
                     WHERE workflow = ?1 AND name = ?2 AND last_tick_ms < ?3
                     RETURNING 1",
                )
                .arg(workflow)
                .arg(name)
                .arg(tick_ms)
                .arg(run_id),
            )
            .await?;
        Ok(done.first().is_some_and(|rows| !rows.is_empty()))
    }

    async fn send_signal(
        &self,
        run_id: &str,
        signal: &str,
        payload: &Value,
        open: u32,
    ) -> Result<bool, StoreError> {
        // One writer: the count and the insert are one step of it.
        let done = self
            .writer
            .write(
                Write::new(
                    "INSERT INTO signals (run_id, signal, payload, sent_at)
                     SELECT ?1, ?2, ?3, ?4
                     WHERE (SELECT count(*) FROM signals
                            WHERE run_id = ?1 AND signal = ?2 AND step_id IS NULL) < ?5
                     RETURNING id",
                )
                .arg(run_id)
                .arg(signal)
                .arg(json_text(payload))
                .arg(now_text())
                .arg(i64::from(open)),
            )
            .await?;
        Ok(done.first().is_some_and(|rows| !rows.is_empty()))
    }

    async fn take_signal(
        &self,
        run_id: &str,
        signal: &str,
        step_id: &str,
    ) -> Result<Option<Value>, StoreError> {
        // A read first: a step that finds nothing (most looks) costs the
        // writer nothing.
        let any: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM signals
             WHERE run_id = ? AND signal = ? AND (step_id IS NULL OR step_id = ?) LIMIT 1",
        )
        .bind(run_id)
        .bind(signal)
        .bind(step_id)
        .fetch_optional(&self.pool)
        .await?;
        if any.is_none() {
            return Ok(None);
        }
        let done = self
            .writer
            .write(
                Write::new(
                    "UPDATE signals SET step_id = ?3
                     WHERE id = (SELECT id FROM signals
                                 WHERE run_id = ?1 AND signal = ?2
                                   AND (step_id IS NULL OR step_id = ?3)
                                 ORDER BY step_id IS NULL, id LIMIT 1)
                     RETURNING id",
                )
                .arg(run_id)
                .arg(signal)
                .arg(step_id),
            )
            .await?;
        let Some(&id) = done.first().and_then(|rows| rows.first()) else {
            return Ok(None);
        };
        let payload: String = sqlx::query_scalar("SELECT payload FROM signals WHERE id = ?")
            .bind(id)
            .fetch_one(&self.pool)
            .await?;
        parse_json(Some(payload))
    }

    async fn signals(&self, run_id: &str) -> Result<Vec<SignalRow>, StoreError> {
        sqlx::query("SELECT * FROM signals WHERE run_id = ? ORDER BY id")
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
             WHERE s.status = 'waiting' ORDER BY s.started_at, s.run_id LIMIT ?",
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
        self.writer
            .write(
                Write::new(
                    "INSERT OR REPLACE INTO upstream_tasks (call_key, run_id, connection, task_id, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .arg(key)
                .arg(run_id)
                .arg(connection)
                .arg(task_id)
                .arg(now_text()),
            )
            .await?;
        Ok(())
    }

    async fn task_of(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT task_id FROM upstream_tasks WHERE call_key = ?")
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
        let write = match question {
            Some(question) => Write::new(
                "INSERT OR REPLACE INTO questions (run_id, step_id, item, question, asked_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .arg(run_id)
            .arg(step_id)
            .arg(i64::from(item))
            .arg(question.to_string())
            .arg(now_text()),
            None => {
                Write::new("DELETE FROM questions WHERE run_id = ?1 AND step_id = ?2 AND item = ?3")
                    .arg(run_id)
                    .arg(step_id)
                    .arg(i64::from(item))
            }
        };
        self.writer.write(write).await?;
        Ok(())
    }

    async fn questions(&self, run_id: &str) -> Result<Vec<QuestionRow>, StoreError> {
        let rows: Vec<(String, i64, String, String)> = sqlx::query_as(
            "SELECT step_id, item, question, asked_at FROM questions
             WHERE run_id = ? ORDER BY asked_at, step_id, item",
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

    async fn prune(&self, keep_runs: u64, finished_before_ms: i64) -> Result<u64, StoreError> {
        // Through the writer, as the runs' own writes: a delete from another
        // connection held SQLite's lock while the writer slept waiting for it.
        let deleted = self
            .writer
            .write(
                // The newest finished run past `keep_runs` is the cut: it and
                // every run finished before it go, found by a range of the
                // `runs_finished` index (a `NOT IN` of the runs kept built a
                // list of them all each time: 22 ms with 10,000 kept).
                Write::new(
                    "WITH cut AS (SELECT finished_ms AS ms, run_id AS id FROM runs
                                  WHERE status != 'running' AND status != 'queued'
                                  ORDER BY finished_ms DESC, run_id DESC LIMIT 1 OFFSET ?2)
                     DELETE FROM runs WHERE status != 'running' AND status != 'queued'
                         AND finished_ms <= max(?1, coalesce((SELECT ms FROM cut), ?1))
                         AND (finished_ms < ?1 OR (finished_ms, run_id) <= (SELECT ms, id FROM cut))
                     RETURNING 1",
                )
                .arg(finished_before_ms)
                .arg(i64::try_from(keep_runs).unwrap_or(i64::MAX)),
            )
            .await?;
        Ok(deleted.first().map_or(0, |rows| rows.len() as u64))
    }
}

/// Per transition of a [`transitions_write`], the `step.log` event it
/// appends first (if any) and its time.
type TransitionTimes<'a> = Vec<(Option<&'a Value>, String)>;

/// `moves` (not empty) as one write, in order, and what
/// [`transition_events`] needs to read its result.
fn transitions_write<'a>(
    run_id: &str,
    moves: &[Transition<'a>],
    fence: Option<&Fence>,
) -> (Write, TransitionTimes<'a>) {
    let mut joined: Option<Write> = None;
    let mut each = Vec::with_capacity(moves.len());
    for &write in moves {
        let at = now_text();
        let query = transition_write(run_id, write, fence, &at);
        each.push((write.log(), at));
        joined = Some(match joined {
            None => query,
            Some(before) => before.then(query),
        });
    }
    (joined.expect("moves is not empty"), each)
}

/// The events a [`transitions_write`] appended, from the ids its inserts
/// returned (in order).
fn transition_events(
    run_id: &str,
    moves: &[Transition<'_>],
    each: &TransitionTimes<'_>,
    ids: Vec<i64>,
) -> Result<Vec<EventRow>, StoreError> {
    let count: usize = each
        .iter()
        .map(|(log, _)| 1 + usize::from(log.is_some()))
        .sum();
    if ids.len() != count {
        return Err(StoreError::Corrupt(format!(
            "the event inserts returned {} ids, not {count}",
            ids.len()
        )));
    }
    let event = |id, kind: &str, data: Value, at: &str| EventRow {
        id,
        run_id: run_id.to_owned(),
        kind: kind.to_owned(),
        data,
        at: at.to_owned(),
    };
    let mut ids = ids.into_iter();
    let mut appended = Vec::with_capacity(count);
    for (write, (log, at)) in moves.iter().zip(each) {
        if let Some(log) = log {
            appended.push(event(
                ids.next().expect("counted"),
                STEP_LOG,
                (*log).clone(),
                at,
            ));
        }
        appended.push(event(
            ids.next().expect("counted"),
            write.kind(),
            write.data(),
            at,
        ));
    }
    Ok(appended)
}

/// A [`Transition`]'s write, with `at` as now: its guarded update (see
/// [`Write::guard`]), the updates that go with it, and its events' inserts.
///
/// SQLite has one worker, so the fence is recorded (the worker of an
/// attempt), never checked.
fn transition_write(run_id: &str, write: Transition<'_>, fence: Option<&Fence>, at: &str) -> Write {
    // The move's statements, then its event's insert, committed together.
    // All use numbered parameters: ?1 run id, ?2 kind, ?3 data, ?4 now, ?5
    // the guard's states (space-separated); the move's own from ?6.
    macro_rules! with_event {
        ($write:literal) => {
            concat!(
                $write,
                "; INSERT INTO events (run_id, kind, data, at) VALUES (?1, ?2, ?3, ?4) RETURNING id"
            )
        };
    }
    let guard = write.guard();
    // A guard's states as ` pending running `: `instr` finds a status in it
    // without a JSON table per statement.
    let states = |states: Vec<&str>| format!(" {} ", states.join(" "));
    let base = |sql: &'static str, states_json: String| {
        Write::new(sql)
            .arg(run_id)
            .arg(write.kind())
            .arg(json_text(&write.data()))
            .arg(at)
            .arg(states_json)
    };
    let worker = fence.map(|f| &*f.worker);
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
        } => base(
            with_event!(
                "UPDATE steps SET status = ?10, attempts = ?7, input = ?8, output = NULL,
                                  error_code = NULL, error_message = NULL,
                                  started_at = ?4, finished_at = NULL,
                                  workers = json_insert(coalesce(workers, '[]'), '$[#]',
                                                        json_object('attempt', ?7, 'worker', ?9))
                 WHERE run_id = ?1 AND step_id = ?6
                   AND instr(?5, ' ' || status || ' ') > 0"
            ),
            states(guard.steps_text()),
        )
        .arg(step_id)
        .arg(i64::from(attempt))
        .arg(input.map(json_text))
        .arg(worker)
        .arg(write.step_to().map_or("running", StepStatus::as_str)),
        Transition::StepAttempt { step_id, attempt } => base(
            with_event!(
                "UPDATE steps SET attempts = max(attempts, ?7),
                                  workers = json_insert(coalesce(workers, '[]'), '$[#]',
                                                        json_object('attempt', ?7, 'worker', ?8))
                 WHERE run_id = ?1 AND step_id = ?6
                   AND instr(?5, ' ' || status || ' ') > 0"
            ),
            states(guard.steps_text()),
        )
        .arg(step_id)
        .arg(i64::from(attempt))
        .arg(worker),
        Transition::StepFinished {
            step_id,
            status,
            output,
            error,
            log,
        } => {
            let query = match log {
                None => base(
                    with_event!(
                        "UPDATE steps SET status = ?7, output = ?8, error_code = ?9,
                                          error_message = ?10, finished_at = ?4
                         WHERE run_id = ?1 AND step_id = ?6
                           AND instr(?5, ' ' || status || ' ') > 0"
                    ),
                    states(guard.steps_text()),
                ),
                // The step's log event first (?11 its data), then the
                // step's own.
                Some(_) => base(
                    with_event!(
                        "UPDATE steps SET status = ?7, output = ?8, error_code = ?9,
                                          error_message = ?10, finished_at = ?4
                         WHERE run_id = ?1 AND step_id = ?6
                           AND instr(?5, ' ' || status || ' ') > 0;
                         INSERT INTO events (run_id, kind, data, at)
                         VALUES (?1, 'step.log', ?11, ?4) RETURNING id"
                    ),
                    states(guard.steps_text()),
                ),
            };
            let query = query
                .arg(step_id)
                .arg(status.as_str())
                .arg(output.map(json_text))
                .arg(error.map(|e| e.code.as_str()))
                .arg(error.map(|e| e.message.as_str()));
            match log {
                Some(log) => query.arg(json_text(log)),
                None => query,
            }
        }
        Transition::RunFinished {
            status,
            output,
            error,
        } => base(
            with_event!(
                "UPDATE runs SET status = ?6, output = ?7, error_code = ?8, error_message = ?9,
                                 finished_at = ?4, finished_ms = ?10
                 WHERE run_id = ?1 AND instr(?5, ' ' || status || ' ') > 0"
            ),
            states(guard.run_text()),
        )
        .arg(status.as_str())
        .arg(output.map(json_text))
        .arg(error.map(|e| e.code.as_str()))
        .arg(error.map(|e| e.message.as_str()))
        .arg(now_ms()),
        // The run first (the guarded statement), then the steps that move
        // with it (?6 their states).
        Transition::RunReopened { .. } => base(
            with_event!(
                "UPDATE runs SET status = CASE WHEN flow_key IS NULL AND rate_key IS NULL
                                               THEN 'running' ELSE 'queued' END,
                                 output = NULL, error_code = NULL,
                                 error_message = NULL, finished_at = NULL, finished_ms = NULL
                 WHERE run_id = ?1 AND instr(?5, ' ' || status || ' ') > 0;
                 UPDATE steps SET status = 'pending', error_code = NULL, error_message = NULL,
                                  finished_at = NULL
                 WHERE run_id = ?1 AND instr(?6, ' ' || status || ' ') > 0"
            ),
            states(guard.run_text()),
        )
        .arg(states(guard.steps_text())),
        Transition::RunAbandoned { status, error } => base(
            with_event!(
                "UPDATE runs SET status = ?7, error_code = ?8, error_message = ?9,
                                 finished_at = ?4, finished_ms = ?10
                 WHERE run_id = ?1 AND instr(?5, ' ' || status || ' ') > 0;
                 UPDATE steps SET status = 'cancelled', error_code = ?8, error_message = ?9,
                                  finished_at = ?4
                 WHERE run_id = ?1 AND instr(?6, ' ' || status || ' ') > 0"
            ),
            states(guard.run_text()),
        )
        .arg(states(guard.steps_text()))
        .arg(status.as_str())
        .arg(error.code.as_str())
        .arg(error.message.as_str())
        .arg(now_ms()),
        Transition::RunQueued { reason } => base(
            with_event!(
                "UPDATE runs SET queued_reason = ?6
                 WHERE run_id = ?1 AND instr(?5, ' ' || status || ' ') > 0"
            ),
            states(guard.run_text()),
        )
        .arg(reason),
        // The guard counts every run of the workflow with the same keys: one
        // connection makes every write, so nothing is admitted between the
        // count and the update. ?6 the admission time.
        Transition::RunAdmitted { at_ms } => base(
            with_event!(
                // The time of the write, not of the pass that proposed it:
                // a run that ended in between is not counted, so the
                // admission must not be dated before that end.
                "UPDATE runs SET status = 'running',
                                 admitted_ms = MAX(?6, CAST(unixepoch('subsec') * 1000 AS INTEGER)),
                                 queued_reason = NULL
                 WHERE run_id = ?1 AND instr(?5, ' ' || status || ' ') > 0
                   AND (flow_key IS NULL
                        OR flow_limit > (SELECT count(*) FROM runs other
                                         WHERE other.workflow = runs.workflow
                                           AND other.flow_key = runs.flow_key
                                           AND other.status = 'running'))
                   AND (rate_key IS NULL
                        OR rate_limit > (SELECT count(*) FROM runs other
                                         WHERE other.workflow = runs.workflow
                                           AND other.rate_key = runs.rate_key
                                           AND other.admitted_ms > MAX(?6, CAST(unixepoch('subsec') * 1000 AS INTEGER))
                                                                   - runs.rate_period_ms))"
            ),
            states(guard.run_text()),
        )
        .arg(at_ms),
    };
    query.guard(write.refusal(run_id))
}
