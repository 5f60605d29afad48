//! Group commit for the SQLite store: every write goes through one task that
//! owns the only writing connection, and the writes that queued up while the
//! last group ran go to SQLite together, in one transaction.
//!
//! A write is one or more statements with numbered parameters (`?1`, `?2`…).
//! The writes of one kind in a group are joined into one query (see
//! [`commit`]), so a group costs a few round trips to the connection's
//! thread, not one per statement. Every caller is answered after the commit,
//! with the rows of its own statements. If the group fails, it is
//! rolled back and its writes run again one by one, so a bad write fails
//! alone. A write is atomic: its statements commit together or not at all.
//!
//! Why: each statement through sqlx costs a hand-off to the connection's
//! thread and back. With one statement per hand-off, a `workflow.start` load
//! spent its time waking threads, not in SQLite (`bench/rpc/run.sh`).

use sqlx::sqlite::{SqliteArguments, SqlitePool, SqliteRow};
use sqlx::{Either, Executor, Row, Sqlite};
use tokio::sync::{mpsc, oneshot};

use super::StoreError;

/// At most this many writes go in one group.
const MAX_WRITES: usize = 128;
/// The largest chunk of writes of one kind sent to SQLite at once; chunks
/// are powers of two up to it, so each kind has at most 12 texts to compile
/// (6 sizes, with and without BEGIN and COMMIT).
const MAX_CHUNK: usize = 32;

/// A parameter of a write.
#[derive(Debug)]
pub(super) enum Arg {
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

/// One write: its statements, separated by `;`, with parameters `?1`..`?n`
/// bound to `args` in order; and the statements of any writes joined to it
/// ([`Write::then`]), each part numbering its own parameters.
pub(super) struct Write {
    parts: Vec<Part>,
}

struct Part {
    sql: &'static str,
    args: Vec<Arg>,
}

impl Write {
    pub(super) fn new(sql: &'static str) -> Write {
        Write {
            parts: vec![Part {
                sql,
                args: Vec::new(),
            }],
        }
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

    /// Whether `other` has the same statements (so the same text in a chunk).
    fn same_kind(&self, other: &Write) -> bool {
        self.parts.len() == other.parts.len()
            && self
                .parts
                .iter()
                .zip(&other.parts)
                .all(|(a, b)| std::ptr::eq(a.sql, b.sql))
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
}

impl Writer {
    /// Starts the task that owns `pool`'s writes. It ends when the last
    /// handle is dropped, after the writes already queued.
    pub(super) fn start(pool: SqlitePool) -> Writer {
        let (queue, rx) = mpsc::channel(1024);
        tokio::spawn(write_loop(pool, rx));
        Writer { queue }
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

async fn write_loop(pool: SqlitePool, mut rx: mpsc::Receiver<Queued>) {
    let mut group: Vec<Queued> = Vec::new();
    while let Some(first) = rx.recv().await {
        group.push(first);
        while group.len() < MAX_WRITES {
            match rx.try_recv() {
                Ok(next) => group.push(next),
                Err(_) => break,
            }
        }
        let writes: Vec<&Write> = group.iter().map(|q| &q.write).collect();
        match commit(&pool, &writes).await {
            Ok(results) => {
                for (queued, done) in group.drain(..).zip(results) {
                    let _ = queued.reply.send(Ok(done));
                }
            }
            Err(e) if group.len() == 1 => {
                let _ = group.pop().expect("one write").reply.send(Err(e));
            }
            // One of them failed: each alone, so only that one fails.
            Err(e) => {
                tracing::debug!(
                    writes = group.len(),
                    "a group of writes failed ({e}); writing them one by one"
                );
                for queued in group.drain(..) {
                    let result = commit(&pool, &[&queued.write])
                        .await
                        .map(|mut done| done.pop().expect("one write"));
                    let _ = queued.reply.send(result);
                }
            }
        }
    }
}

/// Runs `writes` in one transaction; per write, the results of its
/// statements. On an error the transaction is rolled back.
///
/// Writes with the same statements go to SQLite together, in chunks of 1, 2,
/// 4… [`MAX_CHUNK`] writes: each chunk's text depends only on its statements
/// and its size, so SQLite compiles it once and the connection keeps it
/// (parsing a fresh text for every group took a third of the writer's time).
/// Writes of one kind keep their order; writes of different kinds in one
/// group were made concurrently and have no order between them.
async fn commit(pool: &SqlitePool, writes: &[&Write]) -> Result<Vec<Vec<Done>>, StoreError> {
    // Each kind of write (its statements' text), in order of first
    // appearance, with the writes of that kind; then cut into chunks.
    let mut kinds: Vec<(&Write, Vec<usize>)> = Vec::new();
    for (i, &write) in writes.iter().enumerate() {
        match kinds.iter_mut().find(|(kind, _)| kind.same_kind(write)) {
            Some((_, of_kind)) => of_kind.push(i),
            None => kinds.push((write, vec![i])),
        }
    }
    let mut chunks: Vec<&[usize]> = Vec::new();
    for (_, of_kind) in &kinds {
        let mut rest = &of_kind[..];
        while !rest.is_empty() {
            let (chunk, after) = rest.split_at(MAX_CHUNK.min(1 << rest.len().ilog2()));
            chunks.push(chunk);
            rest = after;
        }
    }
    let mut conn = pool.acquire().await?;
    // A lone chunk (in a quiet moment, a single write) carries BEGIN and
    // COMMIT itself: one round trip instead of three.
    let alone = chunks.len() == 1;
    let result = async {
        if !alone {
            conn.execute("BEGIN IMMEDIATE").await?;
        }
        let mut results: Vec<Vec<Done>> = (0..writes.len()).map(|_| Vec::new()).collect();
        for chunk in chunks {
            let mut sql = String::new();
            if alone {
                sql.push_str("BEGIN IMMEDIATE;\n");
            }
            let mut args: Vec<&Arg> = Vec::new();
            let mut counts = Vec::with_capacity(chunk.len());
            for &i in chunk {
                counts.push(unnumber(writes[i], &mut sql, &mut args));
                sql.push_str(";\n");
            }
            if alone {
                sql.push_str("COMMIT");
            }
            let mut query = sqlx::query::<Sqlite>(sqlx::AssertSqlSafe(sql));
            for arg in args {
                query = match arg {
                    Arg::Text(s) => query.bind(s.as_str()),
                    Arg::Int(n) => query.bind(*n),
                    Arg::Null => query.bind(None::<i64>),
                };
            }
            let statements = run(&mut conn, query).await?;
            let extra = if alone { 2 } else { 0 };
            let expected = counts.iter().sum::<usize>() + extra;
            if statements.len() != expected {
                return Err(StoreError::Corrupt(format!(
                    "a chunk of writes ran {} statements, not {expected}",
                    statements.len()
                )));
            }
            // Without BEGIN's result.
            let mut statements = statements.into_iter().skip(extra / 2);
            for (&i, n) in chunk.iter().zip(counts) {
                results[i] = statements.by_ref().take(n).collect();
            }
        }
        if !alone {
            conn.execute("COMMIT").await?;
        }
        Ok(results)
    }
    .await;
    if result.is_err() {
        // Still in the transaction unless COMMIT went through (it did not,
        // or this would be Ok); if none is open, this fails harmlessly.
        let _ = conn.execute("ROLLBACK").await;
    }
    result
}

/// Every statement's rows, in order.
async fn run(
    conn: &mut sqlx::SqliteConnection,
    query: sqlx::query::Query<'_, Sqlite, SqliteArguments>,
) -> Result<Vec<Done>, StoreError> {
    use futures::TryStreamExt;
    let mut stream = conn.fetch_many(query);
    let mut statements = Vec::new();
    let mut current = Done::default();
    while let Some(item) = stream.try_next().await? {
        match item {
            // The end of a statement.
            Either::Left(_) => statements.push(std::mem::take(&mut current)),
            Either::Right(row) => {
                let row: SqliteRow = row;
                current.push(row.try_get::<i64, _>(0).unwrap_or_default());
            }
        }
    }
    Ok(statements)
}

/// Appends `write`'s statements to `sql` with each `?N` as a plain `?`, and
/// argument `N` (of the statement's part) to `args` for each: the parameters
/// of the joined statements are then bound in order. (sqlx binds `?N` past
/// the first statement's numbers wrongly: it stops at the first number a
/// statement skips.) The number of statements in `write`.
///
/// The statements are this module's callers' own, with no `?` or `;` inside
/// a string literal.
fn unnumber<'a>(write: &'a Write, sql: &mut String, args: &mut Vec<&'a Arg>) -> usize {
    let mut statements = 0;
    for (i, part) in write.parts.iter().enumerate() {
        if i > 0 {
            sql.push_str(";\n");
        }
        statements += unnumber_part(part, sql, args);
    }
    statements
}

fn unnumber_part<'a>(part: &'a Part, sql: &mut String, args: &mut Vec<&'a Arg>) -> usize {
    let mut statements = 0;
    let mut open = false;
    let mut chars = part.sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '?' => {
                let mut n = 0usize;
                while let Some(v) = chars.peek().and_then(|d| d.to_digit(10)) {
                    n = n * 10 + v as usize;
                    chars.next();
                }
                let arg = n
                    .checked_sub(1)
                    .and_then(|i| part.args.get(i))
                    .unwrap_or_else(|| panic!("no argument for ?{n} in: {}", part.sql));
                args.push(arg);
                sql.push('?');
                open = true;
            }
            ';' => {
                if open {
                    statements += 1;
                    open = false;
                }
                sql.push(';');
            }
            c => {
                open |= !c.is_whitespace();
                sql.push(c);
            }
        }
    }
    if open {
        statements += 1;
    }
    statements
}

#[cfg(test)]
mod tests {
    use super::{Arg, Write, unnumber};

    #[test]
    fn parameters_are_bound_in_order_and_statements_counted() {
        let write = Write::new("UPDATE t SET a = ?2 WHERE b = ?1;\n INSERT INTO u VALUES (?2) ")
            .arg("one")
            .arg(2);
        let mut sql = String::new();
        let mut args = Vec::new();
        assert_eq!(unnumber(&write, &mut sql, &mut args), 2);
        assert_eq!(
            sql,
            "UPDATE t SET a = ? WHERE b = ?;\n INSERT INTO u VALUES (?) "
        );
        let args: Vec<String> = args
            .iter()
            .map(|a| match a {
                Arg::Text(s) => s.clone(),
                Arg::Int(n) => n.to_string(),
                Arg::Null => "null".into(),
            })
            .collect();
        assert_eq!(args, ["2", "one", "2"]);
        let mut sql = String::new();
        assert_eq!(
            unnumber(&Write::new("SELECT 1;  "), &mut sql, &mut Vec::new()),
            1
        );
    }

    #[test]
    fn joined_writes_number_their_own_parameters() {
        let write = Write::new("UPDATE t SET a = ?2 WHERE b = ?1")
            .arg("one")
            .arg(2)
            .then(
                Write::new("INSERT INTO u VALUES (?1, ?1); SELECT ?2")
                    .arg(3)
                    .arg(4),
            );
        let mut sql = String::new();
        let mut args = Vec::new();
        assert_eq!(unnumber(&write, &mut sql, &mut args), 3);
        assert_eq!(
            sql,
            "UPDATE t SET a = ? WHERE b = ?;\nINSERT INTO u VALUES (?, ?); SELECT ?"
        );
        let args: Vec<String> = args
            .iter()
            .map(|a| match a {
                Arg::Text(s) => s.clone(),
                Arg::Int(n) => n.to_string(),
                Arg::Null => "null".into(),
            })
            .collect();
        assert_eq!(args, ["2", "one", "3", "3", "4"]);
    }
}
