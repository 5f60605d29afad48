//! Group commit for the PostgreSQL store: the batches of many runs go to the
//! database as one call of `wf_apply` (migration 0008), one round trip and
//! one commit for them all.
//!
//! Callers queue their [`Batch`]es; each lane takes every batch queued
//! while the last call ran and sends them together. When a grouped call
//! fails, nothing of it was written, and the batches run again one by one,
//! so a refused move fails only its own caller. Every caller is answered
//! after the commit.

use std::sync::Arc;

use serde_json::Value;
use sqlx::postgres::PgPool;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio::task::JoinHandle;

use super::StoreError;
use super::batch::{Applied, Batch};

/// The channel every worker listens on. Payloads: `ready`,
/// `finished:<run_id>`, `cancel:<run_id>`, `event`.
pub const CHANNEL: &str = "wf_host";

/// At most this many batches go in one call.
const MAX_BATCHES: usize = 256;
/// Calls in flight at once (each on a connection of the pool): one is
/// written while the next fills up.
const LANES: usize = 2;
/// Batches that may wait for a lane before callers wait to queue.
const QUEUE: usize = 4096;

/// The advisory lock taken by each call that appends events until it
/// commits: "wfhsev". Ids are drawn from a sequence when a row is inserted
/// but become visible when it commits; under the lock, drawing and
/// committing are one step, so ids appear in order to the event tail. One
/// call takes it once for all its batches' events.
const EVENT_LOCK: i64 = 0x7766_6873_6576;

/// The error a failed call gives `batch` (the call's only one): which move
/// was refused, or that the lease is lost.
fn error(batch: &Batch, e: sqlx::Error) -> StoreError {
    let Some(db) = e.as_database_error() else {
        return StoreError::Db(e);
    };
    match db.code().as_deref() {
        Some("WF001") => StoreError::LeaseLost(batch.run_id.clone()),
        Some("WF002") => {
            let refusal = db
                .message()
                .split_once(' ')
                .and_then(|(_, n)| n.parse::<usize>().ok())
                .and_then(|n| batch.refusal(n));
            match refusal {
                Some(refusal) => StoreError::Refused(refusal.to_owned()),
                None => StoreError::Db(e),
            }
        }
        _ => StoreError::Db(e),
    }
}

/// Applies `writes` in one call of `wf_apply` on `db` (a pool: its own
/// transaction; a transaction: part of it).
///
/// # Errors
/// When the call fails nothing of it was written; the error is that of the
/// batch that failed (see [`error`]) when there is one batch.
pub async fn apply(
    db: impl sqlx::PgExecutor<'_>,
    writes: &[&Batch],
) -> Result<Vec<Applied>, StoreError> {
    let payload = Value::Array(writes.iter().map(|w| w.to_json()).collect());
    let called: Result<(Vec<i64>, Vec<i32>), sqlx::Error> =
        sqlx::query_as("SELECT ids, skipped FROM wf_apply($1::jsonb, $2, $3)")
            .bind(payload.to_string())
            .bind(EVENT_LOCK)
            .bind(CHANNEL)
            .fetch_one(db)
            .await;
    let (ids, skipped) = match called {
        Ok(done) => done,
        Err(e) => {
            return Err(match writes {
                [write] => error(write, e),
                _ => StoreError::Db(e),
            });
        }
    };
    let expected: usize = writes
        .iter()
        .enumerate()
        .filter(|(i, _)| !skipped.contains(&(*i as i32)))
        .map(|(_, w)| w.events.len())
        .sum();
    if ids.len() != expected {
        return Err(StoreError::Corrupt(format!(
            "{} events appended, not {expected}",
            ids.len()
        )));
    }
    let mut ids = ids.into_iter();
    writes
        .iter()
        .enumerate()
        .map(|(i, w)| w.applied(&mut ids, skipped.contains(&(i as i32))))
        .collect()
}

struct Queued {
    write: Batch,
    reply: oneshot::Sender<Result<Applied, StoreError>>,
}

/// The handle callers write through; its lanes end with it.
pub struct Writer {
    queue: mpsc::Sender<Queued>,
    lanes: Vec<JoinHandle<()>>,
}

impl Writer {
    /// Starts the lanes, writing on `pool`.
    pub fn start(pool: PgPool) -> Writer {
        let (queue, rx) = mpsc::channel(QUEUE);
        // Shared by the lanes: the one that holds it gathers the next group.
        let rx = Arc::new(Mutex::new(rx));
        let lanes = (0..LANES)
            .map(|_| tokio::spawn(lane(pool.clone(), rx.clone())))
            .collect();
        Writer { queue, lanes }
    }

    /// Queues `write` and waits for it to commit with its group.
    ///
    /// # Errors
    /// The batch's own error (see [`error`]).
    pub async fn write(&self, write: Batch) -> Result<Applied, StoreError> {
        let (reply, answer) = oneshot::channel();
        let closed = || StoreError::Unavailable("the store is closing".into());
        self.queue
            .send(Queued { write, reply })
            .await
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        for lane in &self.lanes {
            lane.abort();
        }
    }
}

/// Gathers the writes queued, up to [`MAX_BATCHES`], and commits them, until
/// the queue closes.
async fn lane(pool: PgPool, rx: Arc<Mutex<mpsc::Receiver<Queued>>>) {
    loop {
        let group = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else {
                return;
            };
            let mut group = vec![first];
            while group.len() < MAX_BATCHES {
                match rx.try_recv() {
                    Ok(next) => group.push(next),
                    Err(_) => break,
                }
            }
            group
        };
        commit(&pool, group).await;
    }
}

/// Commits `group` in one call; when that fails, each write alone.
async fn commit(pool: &PgPool, group: Vec<Queued>) {
    let writes: Vec<&Batch> = group.iter().map(|q| &q.write).collect();
    let result = apply(pool, &writes).await;
    match result {
        Ok(applied) => {
            for (queued, applied) in group.into_iter().zip(applied) {
                let _ = queued.reply.send(Ok(applied));
            }
        }
        Err(e) if group.len() > 1 && e.is_unavailable() => {
            // The database is away: nothing of the group was written, and
            // each write alone would wait for it in turn.
            let message = e.to_string();
            let mut group = group.into_iter();
            if let Some(first) = group.next() {
                let _ = first.reply.send(Err(e));
            }
            for queued in group {
                let _ = queued
                    .reply
                    .send(Err(StoreError::Unavailable(message.clone())));
            }
        }
        Err(e) if group.len() == 1 => {
            let queued = group.into_iter().next().expect("one");
            let _ = queued.reply.send(Err(e));
        }
        Err(_) => {
            for queued in group {
                let alone = apply(pool, &[&queued.write])
                    .await
                    .map(|mut applied| applied.remove(0));
                let _ = queued.reply.send(alone);
            }
        }
    }
}
