//! Group commit for the SQLite store: every grouped write goes through one
//! thread that owns a writing connection of its own, and the writes that
//! queued up while the last group ran go to SQLite together, in one
//! transaction.
//!
//! A write is one or more statements with numbered parameters (`?1`, `?2`…),
//! and the statements of any writes joined to it ([`Write::then`]), each part
//! numbering its own parameters. A write is atomic: its statements commit
//! together or not at all. A group runs as one transaction; when one of its
//! writes fails, that try is rolled back and the group runs again with each
//! write in a savepoint of its own, so a write that fails is rolled back
//! alone and only its caller gets the error. A part of a write may be
//! guarded ([`Write::guard`]): when its first statement changes no row, the
//! whole write fails as refused (a transition whose from-states did not
//! hold). Every caller is answered after the commit, with the rows of its
//! own statements.
//!
//! Why a thread with its own synchronous connection: through sqlx, each
//! statement's result and each row came back to the writing task over a
//! channel between threads, one hand-off each. A `workflow.start` load made
//! groups of about 32 writes that took 2.9 ms each, most of it waking
//! threads (`bench/rpc/run.sh`). Here a group costs one wake-up to start and
//! one per caller to answer, and statements stay compiled between groups.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::hooks::Wal;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use tokio::sync::{mpsc, oneshot};

use super::StoreError;

/// At most this many writes go in one group.
const MAX_WRITES: usize = 128;
/// Past this many pages of WAL (64 MiB of 4 KiB pages), the writer
/// finishes a checkpoint itself ([`restart_wal`]).
const WAL_RESTART_PAGES: i32 = 16_384;
/// After a checkpoint that could not finish, how many more pages of WAL
/// before the next try (4 MiB).
const WAL_RETRY_PAGES: i32 = 1_024;
/// What a WAL file is cut back to when it starts over.
const WAL_KEEP_BYTES: i64 = 64 << 20;
/// Statements the writing connection keeps compiled: every statement of
/// every kind of write, with room to spare.
const STATEMENT_CACHE: usize = 128;

/// A parameter of a write.
#[derive(Debug, Clone)]
pub enum Arg {
    Text(String),
    Int(i64),
    Null,
}

impl From<&str> for Arg {
    fn from(s: &str) -> Arg {
        Arg::Text(s.to_owned())
    }
}

impl From<String> for Arg {
    fn from(s: String) -> Arg {
        Arg::Text(s)
    }
}

impl From<i64> for Arg {
    fn from(n: i64) -> Arg {
        Arg::Int(n)
    }
}

impl<T: Into<Arg>> From<Option<T>> for Arg {
    fn from(value: Option<T>) -> Arg {
        value.map_or(Arg::Null, Into::into)
    }
}

impl rusqlite::ToSql for Arg {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Arg::Text(s) => ValueRef::Text(s.as_bytes()),
            Arg::Int(n) => ValueRef::Integer(*n),
            Arg::Null => ValueRef::Null,
        }))
    }
}

/// One write: its statements, separated by `;`, with parameters `?1`..`?n`
/// bound to `args` in order; and the statements of any writes joined to it
/// ([`Write::then`]), each part numbering its own parameters.
///
/// The statements are this module's callers' own, with no `;` inside a
/// string literal.
pub(super) struct Write {
    parts: Vec<Part>,
}

struct Part {
    sql: &'static str,
    args: Vec<Arg>,
    /// A guarded part: its first statement must change a row, or the whole
    /// write fails with [`StoreError::Refused`] and this message.
    refused: Option<String>,
    /// When its first statement changes no row, the write stops there
    /// (what it wrote before stays): its result has fewer statements.
    stops: bool,
}

impl Write {
    pub(super) fn new(sql: &'static str) -> Write {
        Write {
            parts: vec![Part {
                sql,
                args: Vec::new(),
                refused: None,
                stops: false,
            }],
        }
    }

    /// Guards the last part: when its first statement changes no row, the
    /// write is rolled back and fails with [`StoreError::Refused`]
    /// (`refusal`).
    pub(super) fn guard(mut self, refusal: String) -> Write {
        self.parts.last_mut().expect("a write has a part").refused = Some(refusal);
        self
    }

    /// Stops the write after the last part's first statement when it
    /// changes no row: the write's result then ends with that statement's.
    pub(super) fn stops(mut self) -> Write {
        self.parts.last_mut().expect("a write has a part").stops = true;
        self
    }

    /// The next parameter (of the last part).
    pub(super) fn arg(mut self, value: impl Into<Arg>) -> Write {
        self.parts
            .last_mut()
            .expect("a write has a part")
            .args
            .push(value.into());
        self
    }

    /// This write, then `next`'s statements, as one write: committed
    /// together, in this order.
    pub(super) fn then(mut self, next: Write) -> Write {
        self.parts.extend(next.parts);
        self
    }
}

/// What one statement of a write returned: the first column of every row,
/// as an integer (`RETURNING id`, `RETURNING 1`).
pub(super) type Done = Vec<i64>;

struct Queued {
    write: Write,
    reply: oneshot::Sender<Result<Vec<Done>, StoreError>>,
}

/// The handle callers write through.
#[derive(Clone)]
pub(super) struct Writer {
    queue: mpsc::Sender<Queued>,
    /// While the disk is full: why writes fail (cleared by the next write
    /// that commits).
    full: Arc<Mutex<Option<String>>>,
}

impl Writer {
    /// Opens a writing connection to the SQLite database at `path` (already
    /// in WAL mode) and starts the thread that owns it. The thread ends when
    /// the last handle is dropped, after the writes already queued.
    /// `read_only`: the file is another process's, opened to be read; a
    /// write fails.
    pub(super) fn start(path: &Path, read_only: bool) -> Result<Writer, String> {
        let mode = match read_only {
            true => OpenFlags::SQLITE_OPEN_READ_ONLY,
            false => OpenFlags::SQLITE_OPEN_READ_WRITE,
        };
        let conn = Connection::open_with_flags(path, mode | OpenFlags::SQLITE_OPEN_NO_MUTEX)
            .map_err(|e| e.to_string())?;
        let setup = || -> rusqlite::Result<()> {
            // As the store's other connections: see `SqliteStore::open`.
            conn.busy_timeout(Duration::from_secs(10))?;
            conn.pragma_update(None, "foreign_keys", "ON")?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            // Checkpoints run beside it (see `checkpoints` in the store).
            conn.pragma_update(None, "wal_autocheckpoint", 0)?;
            // A savepoint's journal in memory, not in a temp file: the
            // writes of a group each have one (kernel time in a temp file's
            // writes was a tenth of this thread's).
            conn.pragma_update(None, "temp_store", "MEMORY")?;
            // A WAL that grew under a load is cut back to this when it
            // starts over.
            conn.pragma_update(None, "journal_size_limit", WAL_KEEP_BYTES)?;
            conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
            // After `wal_autocheckpoint`, which sets a hook of its own.
            conn.wal_hook(Some(note_wal_pages));
            Ok(())
        };
        setup().map_err(|e| e.to_string())?;
        let (queue, rx) = mpsc::channel(1024);
        let full = Arc::new(Mutex::new(None));
        let state = Disk {
            path: path.display().to_string(),
            full: full.clone(),
        };
        std::thread::Builder::new()
            .name("wf-sqlite-writer".into())
            .spawn(move || write_loop(conn, rx, state))
            .map_err(|e| format!("cannot start its writer: {e}"))?;
        Ok(Writer { queue, full })
    }

    /// While the disk holding the state is full: what the last write that
    /// failed said. `None` once a write has committed since.
    pub(super) fn full(&self) -> Option<String> {
        self.full.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Commits `write`; the result of each of its statements, in order.
    ///
    /// Once queued, the write happens even if the caller stops waiting.
    pub(super) async fn write(&self, write: Write) -> Result<Vec<Done>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let gone = || StoreError::Corrupt("the SQLite writer has stopped".into());
        self.queue
            .send(Queued { write, reply })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// The state file, and whether its disk is full (see [`Writer::full`]).
struct Disk {
    path: String,
    full: Arc<Mutex<Option<String>>>,
}

impl Disk {
    /// `e` as the store's error: a full disk says so, naming the file.
    fn error(&self, e: &rusqlite::Error) -> StoreError {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
            let message = format!(
                "the disk holding the state file `{}` is full ({e}); writes resume once space is freed",
                self.path
            );
            let mut full = self.full.lock().unwrap_or_else(|p| p.into_inner());
            if full.is_none() {
                tracing::error!("{message}");
            }
            *full = Some(message.clone());
            return StoreError::Full(message);
        }
        StoreError::Write(e.to_string())
    }

    /// A write committed: there is room again.
    fn committed(&self) {
        let mut full = self.full.lock().unwrap_or_else(|p| p.into_inner());
        if full.take().is_some() {
            tracing::info!(path = %self.path, "the disk holding the state has room again; writes resume");
        }
    }
}

fn write_loop(mut conn: Connection, mut rx: mpsc::Receiver<Queued>, disk: Disk) {
    let mut split = Statements::default();
    let mut group: Vec<Queued> = Vec::new();
    let mut restart_at = WAL_RESTART_PAGES;
    while let Some(first) = rx.blocking_recv() {
        group.push(first);
        while group.len() < MAX_WRITES {
            match rx.try_recv() {
                Ok(next) => group.push(next),
                Err(_) => break,
            }
        }
        match commit(&mut conn, &mut split, &group, &disk) {
            Ok(results) => {
                if results.iter().any(Result::is_ok) {
                    disk.committed();
                }
                for (queued, result) in group.drain(..).zip(results) {
                    let _ = queued.reply.send(result);
                }
            }
            // Nothing of the group was committed.
            Err(e) => {
                let error = disk.error(&e);
                if !matches!(error, StoreError::Full(_)) {
                    tracing::warn!(writes = group.len(), "a group of state writes failed: {e}");
                }
                for queued in group.drain(..) {
                    let each = match &error {
                        StoreError::Full(message) => StoreError::Full(message.clone()),
                        _ => StoreError::Write(e.to_string()),
                    };
                    let _ = queued.reply.send(Err(each));
                }
            }
        }
        if WAL_PAGES.get() >= restart_at {
            // One that could not finish (a reader holds part of the WAL) is
            // tried again 4 MiB later, not after every group.
            restart_at = if restart_wal(&conn) {
                WAL_RESTART_PAGES
            } else {
                WAL_PAGES.get().saturating_add(WAL_RETRY_PAGES)
            };
        }
    }
}

thread_local! {
    /// The pages in the writer's WAL after its last commit.
    static WAL_PAGES: Cell<i32> = const { Cell::new(0) };
}

fn note_wal_pages(_: &Wal, pages: c_int) -> rusqlite::Result<()> {
    WAL_PAGES.set(pages);
    Ok(())
}

/// A checkpoint from the writing connection, between two groups: no write
/// lands while it runs, so it completes, and the next write starts the WAL
/// over. The store's checkpoints from another connection (every 250 ms)
/// copy most of the WAL back beside the writer, but under a steady load they
/// never complete, and a WAL starts over only after a complete one: a
/// `workflow.start` load grew it by 90 MB a second. This one has only what
/// came since theirs to copy.
///
/// Whether it copied the whole WAL back.
fn restart_wal(conn: &Connection) -> bool {
    // (busy, pages in the WAL, pages copied back)
    match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((
            row.get::<_, i64>(0)?,
            row.get::<_, i64>(1)?,
            row.get::<_, i64>(2)?,
        ))
    }) {
        Ok((_, pages, copied)) if copied < pages => {
            tracing::debug!(
                pages,
                copied,
                "the state WAL could not all be copied back (a reader holds it)"
            );
            false
        }
        Ok(_) => {
            // The next commit starts the WAL over and reports its pages.
            WAL_PAGES.set(0);
            true
        }
        Err(e) => {
            tracing::warn!("cannot copy the state file's WAL back into it: {e}");
            false
        }
    }
}

/// Runs `group` in one transaction: per write, its statements' results, or
/// its error (that write rolled back, the others committed). `Err` when the
/// transaction itself failed, and nothing was committed.
fn commit(
    conn: &mut Connection,
    split: &mut Statements,
    group: &[Queued],
    disk: &Disk,
) -> rusqlite::Result<Vec<Result<Vec<Done>, StoreError>>> {
    // First without savepoints: a savepoint copies every page a write
    // touches into its journal again (an eighth of the writer's time under
    // a `workflow.start` load). Writes seldom fail; when one does, nothing
    // of this try is kept.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    match group
        .iter()
        .map(|q| run(&tx, split, &q.write))
        .collect::<Result<Vec<_>, Failed>>()
    {
        Ok(results) => {
            tx.commit()?;
            return Ok(results.into_iter().map(Ok).collect());
        }
        // A lone write's error is its own (the transaction rolls back as
        // it drops).
        Err(e) if group.len() == 1 => return Ok(vec![Err(e.into_store(disk))]),
        Err(_) => tx.rollback()?,
    }
    // Again, each write in a savepoint of its own.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut results = Vec::with_capacity(group.len());
    for queued in group {
        tx.prepare_cached("SAVEPOINT write")?.execute([])?;
        match run(&tx, split, &queued.write) {
            Ok(done) => {
                tx.prepare_cached("RELEASE write")?.execute([])?;
                results.push(Ok(done));
            }
            Err(e) => {
                tx.prepare_cached("ROLLBACK TO write")?.execute([])?;
                tx.prepare_cached("RELEASE write")?.execute([])?;
                results.push(Err(e.into_store(disk)));
            }
        }
    }
    tx.commit()?;
    Ok(results)
}

/// Why a write failed.
enum Failed {
    Sql(rusqlite::Error),
    /// A guarded part's first statement changed nothing.
    Refused(String),
}

impl From<rusqlite::Error> for Failed {
    fn from(e: rusqlite::Error) -> Failed {
        Failed::Sql(e)
    }
}

impl Failed {
    fn into_store(self, disk: &Disk) -> StoreError {
        match self {
            Failed::Sql(e) => disk.error(&e),
            Failed::Refused(message) => StoreError::Refused(message),
        }
    }
}

/// Runs each statement of `write`, in order; the first column of each row
/// each returned.
fn run(conn: &Connection, split: &mut Statements, write: &Write) -> Result<Vec<Done>, Failed> {
    let mut done = Vec::new();
    for part in &write.parts {
        for (n, &sql) in split.of(part.sql).iter().enumerate() {
            let mut statement = conn.prepare_cached(sql)?;
            // `?N` (or `$N`) is argument N of the statement's part; a
            // statement need not use every one.
            for i in 1..=statement.parameter_count() {
                let number = statement
                    .parameter_name(i)
                    .and_then(|name| name.get(1..))
                    .and_then(|digits| digits.parse::<usize>().ok())
                    .unwrap_or(i);
                let arg = part.args.get(number.wrapping_sub(1)).ok_or(
                    rusqlite::Error::InvalidParameterCount(number, part.args.len()),
                )?;
                statement.raw_bind_parameter(i, arg)?;
            }
            let mut rows = statement.raw_query();
            let mut ints = Done::new();
            while let Some(row) = rows.next()? {
                ints.push(row.get::<_, i64>(0).unwrap_or_default());
            }
            drop(rows);
            let unchanged = n == 0 && conn.changes() == 0;
            if unchanged && let Some(refusal) = &part.refused {
                return Err(Failed::Refused(refusal.clone()));
            }
            done.push(ints);
            if unchanged && part.stops {
                return Ok(done);
            }
        }
    }
    Ok(done)
}

/// Each write text cut into its statements, once per text.
#[derive(Default)]
struct Statements(HashMap<(usize, usize), Vec<&'static str>>);

impl Statements {
    fn of(&mut self, sql: &'static str) -> &[&'static str] {
        self.0
            .entry((sql.as_ptr() as usize, sql.len()))
            .or_insert_with(|| split(sql))
    }
}

/// `sql`'s statements (separated by `;`), without empty ones.
fn split(sql: &'static str) -> Vec<&'static str> {
    sql.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn a_write_is_cut_into_its_statements() {
        assert_eq!(
            split("UPDATE t SET a = ?2 WHERE b = ?1;\n INSERT INTO u VALUES (?2) ; "),
            [
                "UPDATE t SET a = ?2 WHERE b = ?1",
                "INSERT INTO u VALUES (?2)"
            ]
        );
        assert_eq!(split("SELECT 1"), ["SELECT 1"]);
        assert!(split(" ; ").is_empty());
    }
}
