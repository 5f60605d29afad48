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
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::batch::{Applied, Batch};
use super::cells::{Cells, pg_cells};
use super::pg_writer::{self, CHANNEL};
use super::rows::run_row;
use super::sql::{Arg, Dialect, bind};
use super::sql_store::{Db, SqlStore};
use super::{
    CancelRequest, Fence, Note, Renewed, RunRow, RunStatus, Shared, StoreError, Transition,
    WorkerRow,
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
    (
        8,
        "one write path",
        include_str!("../../migrations/postgres/0008_one_write_path.sql"),
    ),
    (
        9,
        "tape",
        include_str!("../../migrations/postgres/0009_tape.sql"),
    ),
    (
        10,
        "paused",
        include_str!("../../migrations/postgres/0010_paused.sql"),
    ),
    (
        11,
        "debounce",
        include_str!("../../migrations/postgres/0011_debounce.sql"),
    ),
    (
        12,
        "paused workflows",
        include_str!("../../migrations/postgres/0012_paused_workflows.sql"),
    ),
    (
        13,
        "asleep",
        include_str!("../../migrations/postgres/0013_asleep.sql"),
    ),
    (
        14,
        "prune finished",
        include_str!("../../migrations/postgres/0014_prune_finished.sql"),
    ),
];

/// The database's clock, in ms since the epoch. `clock_timestamp()`, not
/// `now()`: the latter is the start of the transaction.
const DB_NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Workers not seen for this long are forgotten.
const FORGET_WORKERS_MS: i64 = 24 * 60 * 60 * 1000;

/// How many notes a slow receiver may fall behind before it lags.
const NOTE_CAPACITY: usize = 1024;

/// The PostgreSQL store: the SQL store over a database its workers share.
pub type PgStore = SqlStore<PgDb>;

/// A PostgreSQL database, as the SQL store uses it.
pub struct PgDb {
    pool: PgPool,
    /// Every write of runs, grouped across runs (see [`pg_writer`]).
    writer: pg_writer::Writer,
    notes: broadcast::Sender<Note>,
    /// The task that turns notifications into [`Note`]s; stopped on drop.
    listener: ListenerTask,
    /// Why the last write failed, while the database refuses writes or
    /// cannot be reached; cleared by the next write that commits.
    refusing: std::sync::Mutex<Option<String>>,
}

impl PgDb {
    /// Notes how a write went, for [`Store::degraded`].
    fn note<T>(&self, written: &Result<T, StoreError>) {
        let now = match written {
            Ok(_) => None,
            Err(e) if e.is_away() => Some(format!(
                "the database refuses writes or cannot be reached: {e}"
            )),
            Err(_) => return,
        };
        let mut refusing = self.refusing.lock().unwrap_or_else(|p| p.into_inner());
        if refusing.is_some() && now.is_none() {
            tracing::info!("the database takes writes again");
        } else if refusing.is_none()
            && let Some(why) = &now
        {
            tracing::warn!("{why}");
        }
        *refusing = now;
    }
}

impl SqlStore<PgDb> {
    /// Connects to the database at `url` (`postgres://user:password@host/db`),
    /// migrates it, and starts listening for other workers' notes.
    ///
    /// # Errors
    /// [`StoreError::Open`], naming the URL without its password, when the
    /// URL is malformed, the database cannot be reached, its schema is newer
    /// than this wf-host's, or it cannot be migrated.
    pub async fn open(url: &str) -> Result<PgStore, StoreError> {
        Ok(SqlStore {
            db: PgDb::open(url).await?,
            location: redact_password(url),
        })
    }

    /// The pool, for tests that inspect the database.
    pub fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    /// Stops listening and closes every connection.
    pub async fn close(&self) {
        self.db.listener.stop.cancel();
        self.db.pool.close().await;
    }
}

impl PgDb {
    async fn open(url: &str) -> Result<PgDb, StoreError> {
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
        Ok(PgDb {
            writer: pg_writer::Writer::start(pool.clone()),
            refusing: std::sync::Mutex::default(),
            pool,
            notes,
            listener,
        })
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

/// `pg_notify` on the channel; delivered when the transaction commits.
async fn notify(conn: &mut sqlx::PgConnection, payload: &str) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(payload)
        .execute(conn)
        .await?;
    Ok(())
}

#[async_trait]
impl Db for PgDb {
    const DIALECT: Dialect = Dialect::Postgres;
    const BACKEND: &'static str = "postgres";

    fn shared_by(&self) -> Option<&dyn Shared> {
        Some(self)
    }

    async fn read(&self, sql: &'static str, args: Vec<Arg>) -> Result<Vec<Cells>, StoreError> {
        pg_cells(bind(sql, args).fetch_all(&self.pool).await?)
    }

    async fn write(&self, sql: &'static str, args: Vec<Arg>) -> Result<Vec<i64>, StoreError> {
        let rows = pg_cells(bind(sql, args).fetch_all(&self.pool).await?)?;
        Ok(rows.iter().filter_map(Cells::first_int).collect())
    }

    /// Grouped with other runs' batches into one call (see [`pg_writer`]).
    async fn apply(&self, batch: Batch) -> Result<Applied, StoreError> {
        let written = self.writer.write(batch).await;
        self.note(&written);
        written
    }

    fn degraded(&self) -> Option<String> {
        self.refusing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[async_trait]
impl Shared for PgDb {
    fn listen(&self) -> broadcast::Receiver<Note> {
        self.notes.subscribe()
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
        let mut claimed = pg_cells(rows)?
            .iter()
            .map(|row| {
                let fence = Fence {
                    worker: worker.clone(),
                    epoch: row.int("lease_epoch")?,
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
        let renewed: Vec<(String, bool, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE runs SET lease_until_ms = {DB_NOW_MS} + $3
             WHERE lease_owner = $1 AND run_id = ANY($2) AND status IN ('running', 'paused')
             RETURNING run_id, cancel_requested, status"
        )))
        .bind(worker)
        .bind(runs)
        .bind(duration_ms(lease))
        .fetch_all(&self.pool)
        .await?;
        let lost = runs
            .iter()
            .filter(|id| !renewed.iter().any(|(r, _, _)| r == *id))
            .cloned()
            .collect();
        let paused = renewed
            .iter()
            .filter(|(_, _, status)| status == RunStatus::Paused.as_str())
            .map(|(id, _, _)| id.clone())
            .collect();
        let cancel = renewed
            .into_iter()
            .filter_map(|(id, cancel, _)| cancel.then_some(id))
            .collect();
        Ok(Renewed {
            lost,
            cancel,
            paused,
        })
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

    async fn heartbeat(&self, worker: &WorkerRow) -> Result<(), StoreError> {
        let written = sqlx::query(sqlx::AssertSqlSafe(format!(
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
        .await
        .map_err(StoreError::from);
        // Every worker writes its heartbeat every third of a lease: the
        // degraded state follows the database even when no run writes.
        self.note(&written);
        written?;
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

    /// Ends the run here when nobody holds it, else marks it and tells its
    /// worker, under the run's row lock.
    async fn request_cancel(
        &self,
        run_id: &str,
        end: Transition<'_>,
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
                    && status != RunStatus::Queued.as_str()
                    && status != RunStatus::Paused.as_str() =>
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
                let mut batch = Batch::new(run_id);
                batch.moves(Dialect::Postgres, &[end], None)?;
                let mut applied = pg_writer::apply(&mut *tx, &[&batch]).await?;
                CancelRequest::Ended(applied.remove(0).events)
            }
        };
        tx.commit().await?;
        Ok(outcome)
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
