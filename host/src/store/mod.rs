//! Durable state: runs, their steps, and a journal of every capability call.
//!
//! The engine talks to a [`Store`]; all SQL lives in the backends. SQLite
//! ([`sqlite::SqliteStore`]) is the embedded default; `:memory:`
//! ([`memory::MemoryStore`]) keeps nothing past the process. PostgreSQL
//! ([`postgres::PgStore`]) is *shared*: several workers (`wf-host serve`
//! processes) use one database, each run driven by the worker that holds its
//! lease.

mod batch;
mod cells;
mod group_commit;
pub mod memory;
mod pg_writer;
pub mod postgres;
mod rows;
mod sql;
mod sql_store;
pub mod sqlite;

pub use sql_store::SqlStore;

pub use crate::domain::{
    AttemptWorker, CallRow, Counts, EventRow, Failure, Flow, FlowLimit, FlowUsage, Guard,
    ListQuery, MAX_CALL_RESULT, QuestionRow, RUN_STARTED, RunRow, RunStatus, STEP_LOG, ScheduleRow,
    SignalRow, StepRow, StepStatus, Transition, WaitingStep, WorkerRow, now_ms, now_text,
};

/// A backend's migrations, embedded in the binary: (version, description,
/// SQL), in the order of their files `NNNN_description.sql`. Listed by hand
/// rather than with `sqlx::migrate!`, whose proc-macro has sqlx and both
/// drivers (SQLite's C source with them) built a second time, for the
/// compiler; a test holds the lists to the directories.
fn embedded(migrations: &[(i64, &'static str, &'static str)]) -> sqlx::migrate::Migrator {
    use sqlx::SqlSafeStr;
    sqlx::migrate::Migrator::with_migrations(
        migrations
            .iter()
            .map(|&(version, description, sql)| {
                sqlx::migrate::Migration::new(
                    version,
                    description.into(),
                    sqlx::migrate::MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect(),
    )
}

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

/// The right to write a run's progress: the worker that holds the run's lease,
/// in the lease's epoch. A shared store commits a fenced write only while the
/// run's lease still has this owner and epoch, so a worker that lost its lease
/// (paused, partitioned, presumed dead) cannot overwrite the work of the
/// worker that took the run over. SQLite has one worker (its lock file) and
/// records only `worker`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub worker: Arc<str>,
    pub epoch: i64,
}

/// A lease to take on a run as it is created.
#[derive(Debug, Clone)]
pub struct Lease {
    pub worker: Arc<str>,
    pub duration: Duration,
}

/// What a shared store tells every worker (PostgreSQL: `LISTEN`/`NOTIFY`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A run can be claimed: started unclaimed, retried or released.
    Ready,
    /// The run has finished.
    Finished(String),
    /// `workflow.cancel` was asked of the run, on any worker.
    Cancel(String),
    /// A signal was sent to the run, on any worker.
    Signal(String),
    /// Events were appended.
    Event,
    /// The listening connection was lost and is back: notes may have been
    /// missed, so whoever waits on one should look at the store again.
    Reconnected,
}

/// What [`Store::renew`] found of the leases it renewed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Renewed {
    /// Runs whose lease this worker no longer holds: it must stop them
    /// without writing anything more.
    pub lost: Vec<String>,
    /// Runs that were asked to cancel (in case the note was missed).
    pub cancel: Vec<String>,
    /// Runs paused (`workflow.pause` on any worker): they start no new step.
    pub paused: Vec<String>,
}

/// What [`Store::request_cancel`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelRequest {
    /// The run is not running.
    NotRunning,
    /// No worker held the run: the cancel was made here, with these events.
    Ended(Vec<EventRow>),
    /// A worker holds the run and was told to cancel it.
    Signalled,
}

/// A run to create, with its steps all `pending`.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub run: RunRow,
    /// Step ids in definition order.
    pub steps: Vec<String>,
}

/// What [`Store::create_run`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    New,
    /// The idempotency key was used before: this is that run.
    Existing(Box<RunRow>),
}

/// Transitions of a new run to write with it
/// ([`Store::create_run_with_event`]), under the run's fence.
pub type FirstTransitions<'a> = (&'a Fence, &'a [Transition<'a>]);

/// What [`Store::create_run_with_event`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRunWrite {
    pub created: Created,
    /// The events appended, in id order: the run's first, then those of the
    /// transitions that followed it.
    pub events: Vec<EventRow>,
    /// Whether the transitions that follow the first event were stored
    /// (always, where the backend writes all in one; only when they were
    /// asked for and the run is new).
    pub then_stored: bool,
}

impl NewRunWrite {
    /// Takes what writing `then` after the new run gave: its events, or
    /// (logged, not an error: the run is stored either way) why it failed.
    pub(crate) fn then_written(&mut self, run_id: &str, then: Result<Vec<EventRow>, StoreError>) {
        match then {
            Ok(events) => {
                self.events.extend(events);
                self.then_stored = true;
            }
            Err(e) => {
                tracing::warn!(run = %run_id, "cannot record the run's first steps' starts: {e}");
            }
        }
    }
}

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state `{path}` cannot be used: {message}")]
    Open { path: String, message: String },
    #[error("state store: {0}")]
    Db(#[from] sqlx::Error),
    /// A write the SQLite writer could not make (its message).
    #[error("state store: {0}")]
    Write(String),
    #[error("state store holds bad data: {0}")]
    Corrupt(String),
    #[error("cursor `{0}` is not one this server returned")]
    BadCursor(String),
    /// A fenced write found that this worker no longer holds the run's lease.
    #[error(
        "run `{0}` is no longer held by this worker (its lease expired and another worker took it)"
    )]
    LeaseLost(String),
    /// A [`Transition`] whose guard did not hold (see
    /// [`Transition::refusal`]): nothing was written.
    #[error("state store: {0}")]
    Refused(String),
    /// The disk holding the state is full: nothing was written (the
    /// message names the file). Writes resume by themselves once there is
    /// room.
    #[error("state store: {0}")]
    Full(String),
    /// The store was unreachable for a write grouped with others: each of
    /// them is told so (the error itself goes to one of them).
    #[error("state store unavailable: {0}")]
    Unavailable(String),
}

impl StoreError {
    /// The kind of a failed write, as `/metrics` counts it (`disk_full`,
    /// `unavailable`, `other`), or `None` for an error that is no failure of
    /// the state (a lease another worker took, a guard that did not hold).
    pub fn failure_kind(&self) -> Option<&'static str> {
        match self {
            StoreError::Full(_) => Some("disk_full"),
            StoreError::LeaseLost(_) | StoreError::Refused(_) | StoreError::BadCursor(_) => None,
            e if e.is_away() => Some("unavailable"),
            _ => Some("other"),
        }
    }

    /// Whether the store was out of reach or refused writes for now (a
    /// database restarting or read-only, a lost connection): the same write
    /// may go through once it is back. Not a full SQLite disk, which has a
    /// recovery of its own, nor a lease another worker took.
    pub fn is_away(&self) -> bool {
        self.is_unavailable() && !matches!(self, StoreError::Full(_) | StoreError::LeaseLost(_))
    }

    /// Whether the store was unreachable (a lost connection, a pool that
    /// timed out) rather than refusing the write: the run should pause, not
    /// fail, and be picked up again when the store is back.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Db(e) => {
                matches!(
                    e,
                    sqlx::Error::Io(_)
                        | sqlx::Error::PoolTimedOut
                        | sqlx::Error::PoolClosed
                        | sqlx::Error::Tls(_)
                        | sqlx::Error::Protocol(_)
                ) || e
                    .as_database_error()
                    .and_then(|d| d.code())
                    .is_some_and(|c| refuses_for_now(&c))
            }
            StoreError::LeaseLost(_) | StoreError::Unavailable(_) | StoreError::Full(_) => true,
            _ => false,
        }
    }
}

/// Whether a PostgreSQL error code says the database cannot take the write
/// now, for a reason that passes (an operator's fix or a restart): admin
/// shutdown, crash shutdown, cannot connect now; read-only (a standby, or
/// `default_transaction_read_only`); its disk full, out of memory, too many
/// connections (class 53, insufficient resources).
fn refuses_for_now(code: &str) -> bool {
    matches!(code, "57P01" | "57P02" | "57P03" | "25006") || code.starts_with("53")
}

/// Where runs are kept. Every write is committed before it returns: the
/// engine acts on a transition only after it is stored.
#[async_trait]
pub trait Store: Send + Sync {
    /// `sqlite`, `postgres`.
    fn backend(&self) -> &'static str;
    /// Why writes fail now, while they do for a reason that passes by
    /// itself (the disk holding the state is full); `None` when they do not.
    fn degraded(&self) -> Option<String> {
        None
    }
    /// A small write that changes nothing: whether writes go through again.
    async fn probe_write(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// The file, `:memory:`, or the URL without its password.
    fn location(&self) -> String;
    /// What several workers sharing this store do, where they may
    /// (PostgreSQL); `None` for a store with one worker, which drives every
    /// run it starts and resumes the rest at start.
    fn shared_by(&self) -> Option<&dyn Shared> {
        None
    }
    /// Whether several workers may use this store at once: runs are then
    /// claimed under leases ([`Store::claim_runs`]) and workers hear of each
    /// other's runs through [`Store::listen`].
    fn shared(&self) -> bool {
        self.shared_by().is_some()
    }
    /// Whether live event streams are fed from the event log (by a task that
    /// reads what was appended) rather than as each event is appended.
    ///
    /// Needed where other workers append too ([`Store::shared`]), and worth it
    /// where an append waits on I/O: feeding streams as events are appended
    /// keeps them in id order by appending one event at a time, which would
    /// make every run wait for every other run's writes. The log must show
    /// events in id order: a reader never sees an id before a smaller one.
    fn feeds_from_log(&self) -> bool {
        self.shared()
    }

    /// Whether [`Store::transition`] stamps the times it writes (a step's
    /// `started_at` and `finished_at`, a run's `finished_at`) with the `at` of
    /// the event it appends. Where it does, a run's end is known exactly from
    /// what the end wrote, and a waiter needs no read of the run.
    fn stamps_with_event_time(&self) -> bool {
        false
    }

    /// Inserts a run and its pending steps, or finds the run that used the
    /// same idempotency key. With `lease`, the new run is held by that worker
    /// (its [`Fence`] has epoch 1); without, a shared store leaves it for any
    /// worker to claim and sends [`Note::Ready`].
    async fn create_run(&self, run: &NewRun, lease: Option<&Lease>) -> Result<Created, StoreError> {
        let written = self.create_run_with_event(run, lease, None, None).await?;
        Ok(written.created)
    }
    /// [`Store::create_run`], and when the run is new: its first event
    /// (`first`: kind and data), then the transitions of `then` (the starts
    /// of the steps that start with the run) under its fence; all in one
    /// write where the backend can. What cannot be written after the run was
    /// created is logged, not an error: the run is stored either way, and
    /// [`NewRunWrite::then_stored`] says whether `then` was.
    async fn create_run_with_event(
        &self,
        new: &NewRun,
        lease: Option<&Lease>,
        first: Option<(&str, &Value)>,
        then: Option<FirstTransitions<'_>>,
    ) -> Result<NewRunWrite, StoreError>;
    async fn run(&self, run_id: &str) -> Result<Option<RunRow>, StoreError>;
    /// Steps in definition order.
    async fn steps(&self, run_id: &str) -> Result<Vec<StepRow>, StoreError>;
    async fn calls(&self, run_id: &str, step_id: &str) -> Result<Vec<CallRow>, StoreError>;
    /// A page of runs, newest first, and the cursor of the next page.
    async fn list_runs(
        &self,
        query: &ListQuery,
    ) -> Result<(Vec<RunRow>, Option<String>), StoreError>;
    /// Runs still `running`: what a start-up resumes.
    /// The runs `running` but for those asleep past `awake_by_ms` (their
    /// waker drives them), unless a signal is kept for them (it was sent
    /// as they fell asleep, or just before the host stopped).
    async fn unfinished_runs(&self, awake_by_ms: i64) -> Result<Vec<RunRow>, StoreError>;
    /// Runs asleep ([`Transition::RunAsleep`]) that wake by `until_ms`,
    /// after `after` (`(wake_ms, run_id)`), in that order: `(run_id,
    /// wake_ms)`, at most `limit`.
    async fn asleep_runs(
        &self,
        after: (i64, &str),
        until_ms: i64,
        limit: u32,
    ) -> Result<Vec<(String, i64)>, StoreError>;
    /// Up to `limit` `queued` runs past the first `offset`, in the order
    /// flow control admits them: highest priority first, then oldest first.
    async fn queued_runs(&self, limit: u32, offset: u32) -> Result<Vec<RunRow>, StoreError>;
    /// How much of `flow`'s limits the runs of `workflow` use at `now_ms`
    /// (to say why a run waits; admission itself is
    /// [`Transition::RunAdmitted`]).
    async fn flow_usage(
        &self,
        workflow: &str,
        flow: &Flow,
        now_ms: i64,
    ) -> Result<FlowUsage, StoreError>;

    /// The one write of a run's state: `moves` of one run, in order, each
    /// with its events (a finished step's `step.log`, then the move's own;
    /// see [`Transition::kind`]), committed together: all or nothing. Returns
    /// the events appended, in id order.
    ///
    /// A move whose guard ([`Transition::guard`]) does not hold fails the
    /// whole batch with [`StoreError::Refused`]. A fenced move
    /// ([`Transition::fenced`]) needs `fence`, and fails with
    /// [`StoreError::LeaseLost`] (changing nothing) when `fence` no longer
    /// holds the run. Ending a run ([`Transition::RunFinished`],
    /// [`Transition::RunAbandoned`]) releases its lease and, on a shared
    /// store, sends [`Note::Finished`]; reopening it sends [`Note::Ready`].
    async fn transitions(
        &self,
        run_id: &str,
        moves: &[Transition<'_>],
        fence: Option<&Fence>,
    ) -> Result<Vec<EventRow>, StoreError>;
    /// Journals one capability call of a step attempt (fenced).
    async fn record_call(&self, call: &CallRow, fence: &Fence) -> Result<(), StoreError>;
    async fn counts(&self) -> Result<Counts, StoreError>;
    /// How many unfinished runs (queued, running, paused) each workflow
    /// has on each of its definitions: `(workflow, definition_hash, runs)`.
    async fn live_definitions(&self) -> Result<Vec<(String, String, u64)>, StoreError>;
    /// Appends an event of `run_id` that goes with no move (a retried
    /// attempt's log) to the event log; returns it with its id.
    async fn append_event(
        &self,
        run_id: &str,
        kind: &str,
        data: &Value,
    ) -> Result<EventRow, StoreError>;
    /// Up to `limit` events with an id past `after`, oldest first; of one run,
    /// or of all runs.
    async fn events(
        &self,
        run_id: Option<&str>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<EventRow>, StoreError>;
    /// Deletes finished runs past the newest `keep_runs`, and those finished
    /// before `finished_before_ms`. Returns how many went.
    async fn prune(&self, keep_runs: u64, finished_before_ms: i64) -> Result<u64, StoreError>;

    // What a shared store adds ([`Store::shared_by`]); without it, what a
    // store with one worker does.

    /// Notes from every worker of a shared store; `None` for a store with one
    /// worker.
    fn listen(&self) -> Option<tokio::sync::broadcast::Receiver<Note>> {
        self.shared_by().map(Shared::listen)
    }
    /// Claims up to `limit` runs that are `running` and held by nobody (never
    /// claimed, released, or with an expired lease), oldest first, skipping
    /// rows another worker is claiming at the same moment. Each claimed run's
    /// lease is `worker`'s for `lease`, in the next epoch.
    async fn claim_runs(
        &self,
        worker: &str,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<(RunRow, Fence)>, StoreError> {
        match self.shared_by() {
            Some(shared) => shared.claim_runs(worker, limit, lease).await,
            None => Ok(Vec::new()),
        }
    }
    /// Extends `worker`'s leases on `runs` by `lease` from now; says which it
    /// no longer holds and which were asked to cancel.
    async fn renew(
        &self,
        worker: &str,
        runs: &[String],
        lease: Duration,
    ) -> Result<Renewed, StoreError> {
        match self.shared_by() {
            Some(shared) => shared.renew(worker, runs, lease).await,
            None => Ok(Renewed::default()),
        }
    }
    /// Gives up `worker`'s leases on `runs` (a worker shutting down), so any
    /// worker may claim them at once; sends [`Note::Ready`].
    async fn release_runs(&self, worker: &str, runs: &[String]) -> Result<(), StoreError> {
        match self.shared_by() {
            Some(shared) => shared.release_runs(worker, runs).await,
            None => Ok(()),
        }
    }
    /// `workflow.cancel` of a run this worker does not drive: ends it at once
    /// when nobody holds it, else marks it and tells its worker
    /// ([`Note::Cancel`]).
    async fn request_cancel(
        &self,
        run_id: &str,
        end: Transition<'_>,
    ) -> Result<CancelRequest, StoreError> {
        if let Some(shared) = self.shared_by() {
            return shared.request_cancel(run_id, end).await;
        }
        match self.transitions(run_id, &[end], None).await {
            Ok(events) => Ok(CancelRequest::Ended(events)),
            Err(StoreError::Refused(_)) => Ok(CancelRequest::NotRunning),
            Err(e) => Err(e),
        }
    }
    /// Registers `worker` or refreshes its heartbeat.
    async fn heartbeat(&self, worker: &WorkerRow) -> Result<(), StoreError> {
        match self.shared_by() {
            Some(shared) => shared.heartbeat(worker).await,
            None => Ok(()),
        }
    }
    /// The id of the newest event, `0` when there is none.
    async fn last_event_id(&self) -> Result<i64, StoreError>;
    /// The progress of schedule `name` of `workflow`; a schedule seen for
    /// the first time counts its ticks from `from_ms`.
    async fn schedule(
        &self,
        workflow: &str,
        name: &str,
        from_ms: i64,
    ) -> Result<ScheduleRow, StoreError>;
    /// Records that the schedule fired (or skipped) the tick `tick_ms`, with
    /// the run it started, unless a later tick is recorded already. Says
    /// whether it was recorded.
    async fn schedule_fired(
        &self,
        workflow: &str,
        name: &str,
        tick_ms: i64,
        run_id: Option<&str>,
    ) -> Result<bool, StoreError>;
    /// Every schedule's progress.
    async fn schedules(&self) -> Result<Vec<ScheduleRow>, StoreError>;
    /// Pauses `workflow` as a whole (`paused`), or resumes it; whether that
    /// changed anything.
    async fn pause_workflow(&self, workflow: &str, paused: bool) -> Result<bool, StoreError>;
    /// The workflows paused as a whole.
    async fn paused_workflows(&self) -> Result<Vec<String>, StoreError>;
    /// Keeps the upstream task a call of run `run_id` (idempotency key
    /// `key`) made on `connection`.
    async fn record_task(
        &self,
        run_id: &str,
        key: &str,
        connection: &str,
        task_id: &str,
    ) -> Result<(), StoreError>;
    /// The upstream task the call with idempotency key `key` made, if kept.
    async fn task_of(&self, key: &str) -> Result<Option<String>, StoreError>;
    /// Keeps the question an upstream server asked step `step_id` (item
    /// `item`) of run `run_id`, while it waits for an answer; `None`
    /// forgets it (answered, or no longer waited for).
    async fn put_question(
        &self,
        run_id: &str,
        step_id: &str,
        item: u32,
        question: Option<&Value>,
    ) -> Result<(), StoreError>;
    /// The questions run `run_id`'s steps wait to have answered.
    async fn questions(&self, run_id: &str) -> Result<Vec<QuestionRow>, StoreError>;
    /// Keeps signal `signal` for run `run_id` until a wait step of the run
    /// takes it, unless `open` signals of that name are kept (untaken)
    /// already: one for each step that can still take one. Checked and
    /// written at once, so two senders racing for the last step do not both
    /// get it. Says whether it was kept; a shared store then tells every
    /// worker ([`Note::Signal`]).
    async fn send_signal(
        &self,
        run_id: &str,
        signal: &str,
        payload: &Value,
        open: u32,
    ) -> Result<bool, StoreError>;
    /// Takes, for wait step `step_id`, the signal `signal` it took before
    /// (a restart between taking it and finishing the step), else the
    /// oldest one no step took. Its payload.
    async fn take_signal(
        &self,
        run_id: &str,
        signal: &str,
        step_id: &str,
    ) -> Result<Option<Value>, StoreError>;
    /// The run's signals, oldest first.
    async fn signals(&self, run_id: &str) -> Result<Vec<SignalRow>, StoreError>;
    /// Up to `limit` wait steps waiting for their signal, the longest
    /// waiting first.
    async fn waiting_steps(&self, limit: u32) -> Result<Vec<WaitingStep>, StoreError>;
    /// Workers seen within `within`, by id.
    async fn workers(&self, within: Duration) -> Result<Vec<WorkerRow>, StoreError> {
        match self.shared_by() {
            Some(shared) => shared.workers(within).await,
            None => Ok(Vec::new()),
        }
    }
}

/// What several workers sharing one store do ([`Store::shared_by`]): each
/// method is [`Store`]'s of the same name, where more than one worker writes.
#[async_trait]
pub trait Shared: Send + Sync {
    fn listen(&self) -> tokio::sync::broadcast::Receiver<Note>;
    async fn claim_runs(
        &self,
        worker: &str,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<(RunRow, Fence)>, StoreError>;
    async fn renew(
        &self,
        worker: &str,
        runs: &[String],
        lease: Duration,
    ) -> Result<Renewed, StoreError>;
    async fn release_runs(&self, worker: &str, runs: &[String]) -> Result<(), StoreError>;
    /// Makes `end` (a cancel: [`Transition::RunAbandoned`], or
    /// [`Transition::RunCancelCompensating`]) at once when nobody holds the
    /// run, else marks it and tells its worker.
    async fn request_cancel(
        &self,
        run_id: &str,
        end: Transition<'_>,
    ) -> Result<CancelRequest, StoreError>;
    async fn heartbeat(&self, worker: &WorkerRow) -> Result<(), StoreError>;
    async fn workers(&self, within: Duration) -> Result<Vec<WorkerRow>, StoreError>;
}

/// Whether `state` names a PostgreSQL database rather than a SQLite file.
pub fn is_postgres_url(state: &str) -> bool {
    state.starts_with("postgres://") || state.starts_with("postgresql://")
}

/// Opens the store `state` names: a PostgreSQL URL (shared by workers),
/// `:memory:` (kept in the process), or a SQLite file.
///
/// # Errors
/// [`StoreError::Open`] or [`StoreError::Db`] when it cannot be opened.
pub async fn open(state: &str) -> Result<Arc<dyn Store>, StoreError> {
    Ok(if is_postgres_url(state) {
        Arc::new(postgres::PgStore::open(state).await?)
    } else if state == ":memory:" {
        Arc::new(memory::MemoryStore::new())
    } else {
        Arc::new(sqlite::SqliteStore::open(state).await?)
    })
}

/// Opens the state at `state` to read runs from it while another wf-host
/// may be using it: a SQLite file is opened read-only beside its writer
/// (its lock is not taken); PostgreSQL is shared anyway.
///
/// # Errors
/// [`StoreError::Open`]: `:memory:` (nothing outlives its process), or as
/// [`open`].
pub async fn open_to_read(state: &str) -> Result<Arc<dyn Store>, StoreError> {
    Ok(if is_postgres_url(state) {
        Arc::new(postgres::PgStore::open(state).await?)
    } else if state == ":memory:" {
        return Err(StoreError::Open {
            path: state.to_owned(),
            message: "an in-memory state lives in its own process; read it over `workflow.get` of that wf-host".into(),
        });
    } else {
        Arc::new(sqlite::SqliteStore::open_read_only(state).await?)
    })
}

#[cfg(test)]
mod migration_tests {
    /// Each backend's list is its directory: every file, in order, with
    /// the version and description `sqlx::migrate!` would have read.
    #[test]
    fn the_embedded_migrations_are_the_files() {
        for (dir, listed) in [
            ("postgres", super::postgres::MIGRATIONS),
            ("sqlite", super::sqlite::MIGRATIONS),
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("migrations")
                .join(dir);
            let mut files: Vec<String> = std::fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            files.sort();
            let expected: Vec<(i64, String, String)> = files
                .iter()
                .map(|name| {
                    let (version, rest) = name.split_once('_').unwrap();
                    let description = rest.trim_end_matches(".sql").replace('_', " ");
                    let sql = std::fs::read_to_string(path.join(name)).unwrap();
                    (version.parse().unwrap(), description, sql)
                })
                .collect();
            let listed: Vec<(i64, String, String)> = listed
                .iter()
                .map(|&(v, d, sql)| (v, d.to_owned(), sql.to_owned()))
                .collect();
            assert_eq!(listed, expected, "migrations/{dir}");
        }
    }
}
