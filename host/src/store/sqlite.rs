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
use sqlx::ConnectOptions;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::StoreError;
use super::batch::{Applied, Batch};
use super::cells::{Cells, sqlite_cells};
use super::group_commit::{Write, Writer};
use super::rows::json_text;
use super::sql::{Arg, Dialect, Guard, bind};
use super::sql_store::{Db, SqlStore};

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
    (
        7,
        "tape",
        include_str!("../../migrations/sqlite/0007_tape.sql"),
    ),
    (
        8,
        "debounce",
        include_str!("../../migrations/sqlite/0008_debounce.sql"),
    ),
    (
        9,
        "paused workflows",
        include_str!("../../migrations/sqlite/0009_paused_workflows.sql"),
    ),
    (
        10,
        "asleep",
        include_str!("../../migrations/sqlite/0010_asleep.sql"),
    ),
    (
        11,
        "prune finished",
        include_str!("../../migrations/sqlite/0011_prune_finished.sql"),
    ),
];

/// `PRAGMA application_id` of a wf-host state file: "wfhs".
const APPLICATION_ID: i64 = 0x7766_6873;

const FOREIGN: &str = "it holds another application's database, not wf-host state; move it away or pick another `state` path";

/// The SQLite store: the SQL store over one SQLite file.
pub type SqliteStore = SqlStore<SqliteDb>;

/// A SQLite file, as the SQL store uses it.
///
/// Reads use a pool of connections; every write of the runs and pruning go
/// through one connection owned by a [`Writer`], which commits concurrent
/// writes together (see [`super::group_commit`]). Only a migration, at
/// open, uses a connection of its own.
pub struct SqliteDb {
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

impl SqlStore<SqliteDb> {
    /// Opens (creating if needed) the state at `location`: a file path, or
    /// `:memory:`.
    ///
    /// # Errors
    /// [`StoreError::Open`] for a file that is not a wf-host state file, is
    /// corrupt, or cannot be created.
    pub async fn open(location: &str) -> Result<SqliteStore, StoreError> {
        let db = SqliteDb::open(location).await?;
        Ok(SqlStore {
            location: db.location.clone(),
            db,
        })
    }

    /// Opens the state file at `path` to read it, while another wf-host
    /// may be using it (a file in WAL mode is read beside its writer): no
    /// lock, no migration, no checkpoints; a write fails.
    ///
    /// # Errors
    /// [`StoreError::Open`] for a missing file, one that is not wf-host
    /// state, or one of another schema version than this wf-host's.
    pub async fn open_read_only(path: &str) -> Result<SqliteStore, StoreError> {
        let db = SqliteDb::open_read_only(path).await?;
        Ok(SqlStore {
            location: db.location.clone(),
            db,
        })
    }

    /// The pool, for tests that inspect the file.
    pub fn pool(&self) -> &SqlitePool {
        &self.db.pool
    }
}

impl SqliteDb {
    async fn open(location: &str) -> Result<SqliteDb, StoreError> {
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
            let mut store = SqliteDb::open_file(&path.display().to_string()).await?;
            store.location = location.to_owned();
            store._temp = Some(dir);
            return Ok(store);
        }
        SqliteDb::open_file(location).await
    }

    async fn open_file(location: &str) -> Result<SqliteDb, StoreError> {
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
        let store = SqliteDb {
            pool: writes.clone(),
            writer: Writer::start(path, false).map_err(open_err)?,
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
        Ok(SqliteDb {
            pool,
            _checkpoints: Some(stop.drop_guard()),
            ..store
        })
    }

    async fn open_read_only(location: &str) -> Result<SqliteDb, StoreError> {
        let path = Path::new(location);
        let open_err = |message: String| StoreError::Open {
            path: location.to_owned(),
            message,
        };
        if !path.is_file() {
            return Err(open_err("there is no such state file".into()));
        }
        // Not `immutable`: what the writer has in its WAL is read too.
        let options = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(|e| open_err(e.to_string()))?;
        let app_id: i64 = sqlx::query_scalar("PRAGMA application_id")
            .fetch_one(&pool)
            .await
            .map_err(|e| open_err(e.to_string()))?;
        if app_id != APPLICATION_ID {
            return Err(open_err(FOREIGN.into()));
        }
        let version: Option<i64> =
            sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
                .fetch_one(&pool)
                .await
                .map_err(|e| open_err(e.to_string()))?;
        let ours = MIGRATIONS.last().map(|m| m.0);
        if version != ours {
            return Err(open_err(format!(
                "it has the schema of another wf-host version ({}; this one reads {}): read it with that version, or open it read-write (stop the other wf-host first)",
                version.unwrap_or(0),
                ours.unwrap_or(0)
            )));
        }
        Ok(SqliteDb {
            writes: pool.clone(),
            writer: Writer::start(path, true).map_err(open_err)?,
            pool,
            location: location.to_owned(),
            _lock: None,
            _checkpoints: None,
            _temp: None,
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
impl Db for SqliteDb {
    const DIALECT: Dialect = Dialect::Sqlite;
    const BACKEND: &'static str = "sqlite";

    async fn read(&self, sql: &'static str, args: Vec<Arg>) -> Result<Vec<Cells>, StoreError> {
        sqlite_cells(bind(sql, args).fetch_all(&self.pool).await?)
    }

    fn degraded(&self) -> Option<String> {
        self.writer.full()
    }

    /// Writes a megabyte and takes it back, in one transaction: its pages
    /// still go to the WAL, so this commits only where a run's write has
    /// room (a write of one page may fit in a WAL a full disk left).
    async fn probe_write(&self) -> Result<(), StoreError> {
        self.writer
            .write(Write::new(
                "CREATE TABLE IF NOT EXISTS room_probe (b BLOB);
                 INSERT INTO room_probe (b) VALUES (zeroblob(1048576));
                 DELETE FROM room_probe",
            ))
            .await
            .map(drop)
    }

    /// Through the writer, as the runs' own writes: a write from another
    /// connection held SQLite's lock while the writer slept waiting for it.
    async fn write(&self, sql: &'static str, args: Vec<Arg>) -> Result<Vec<i64>, StoreError> {
        let write = args.into_iter().fold(Write::new(sql), Write::arg);
        Ok(self
            .writer
            .write(write)
            .await?
            .into_iter()
            .flatten()
            .collect())
    }

    /// The batch as one write of the writer's group: its statements (a
    /// refusal fails it, an `Exists` guard stops it), then an insert per
    /// event, each returning its id. One worker: a fence is recorded (the
    /// worker of an attempt, by the statements), never checked.
    async fn apply(&self, mut batch: Batch) -> Result<Applied, StoreError> {
        // The arguments move into the write; the rest of the batch reads
        // its result.
        let statements = std::mem::take(&mut batch.statements);
        let count = statements.len();
        let parts = statements.into_iter().map(|statement| {
            let part = statement
                .args
                .into_iter()
                .fold(Write::new(statement.sql), Write::arg);
            match statement.guard {
                Guard::Refuse(n) => part.guard(batch.refusal(n).unwrap_or_default().to_owned()),
                Guard::Exists => part.stops(),
                Guard::None => part,
            }
        });
        let events = batch.events.iter().map(|(kind, data)| {
            Write::new(
                "INSERT INTO events (run_id, kind, data, at) VALUES (?1, ?2, ?3, ?4) RETURNING id",
            )
            .arg(batch.run_id.as_str())
            .arg(&**kind)
            .arg(json_text(data))
            .arg(batch.at.as_str())
        });
        let Some(write) = parts.chain(events).reduce(Write::then) else {
            return batch.applied(&mut std::iter::empty(), false);
        };
        let done = self.writer.write(write).await?;
        // A write that stopped has fewer results than statements.
        let stopped = done.len() < count + batch.events.len();
        let mut ids = done.into_iter().skip(count).flatten();
        batch.applied(&mut ids, stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prune's cut walks the `runs_finished` index alone: a filter the
    /// index does not cover reads every walked run from the table, on the
    /// one writing connection (it came twice, with `queued` and `paused`,
    /// and halved the durable `workflow.start` rate the second time).
    #[tokio::test]
    async fn the_prune_cut_reads_its_index_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        drop(SqliteStore::open(path.to_str().unwrap()).await.unwrap());
        let conn = rusqlite::Connection::open(&path).unwrap();
        let sql = super::super::sql_store::PRUNE_SQLITE.replace('$', "?");
        let mut plan = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let lines: Vec<String> = plan
            .query_map((0_i64, 10_000_i64), |row| row.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let walks: Vec<&String> = lines.iter().filter(|l| l.contains("runs ")).collect();
        assert_eq!(walks.len(), 2, "{lines:#?}");
        for walk in walks {
            assert!(
                walk.contains("USING COVERING INDEX runs_finished"),
                "the prune reads the table: {lines:#?}"
            );
        }
    }
}
