//! The store backends. The tests at the top run against every backend
//! (the in-memory store, SQLite in memory and in a file, PostgreSQL); those in `shared` are about
//! what only a shared store does (leases, fencing, notes) and run on
//! PostgreSQL.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use common::postgres::TestPostgres;
use common::repo_root;
use wf_host::store::memory::MemoryStore;
use wf_host::store::postgres::PgStore;
use wf_host::store::sqlite::SqliteStore;
use wf_host::store::{
    AttemptWorker, CallRow, CancelRequest, Created, Failure, Fence, Lease, ListQuery, NewRun, Note,
    RunRow, RunStatus, StepStatus, Store, StoreError, Transition, WorkerRow, now_ms, now_text,
};

/// The single moves these tests make, each one [`Store::transitions`] of
/// one [`Transition`]: the engine's own moves, by name.
trait Moves {
    async fn step_started(
        &self,
        run_id: &str,
        step_id: &str,
        attempt: u32,
        input: Option<&Value>,
        fence: &Fence,
    ) -> Result<(), StoreError>;
    async fn step_attempt(
        &self,
        run_id: &str,
        step_id: &str,
        attempt: u32,
        fence: &Fence,
    ) -> Result<(), StoreError>;
    async fn step_finished(
        &self,
        run_id: &str,
        step_id: &str,
        status: StepStatus,
        output: Option<&Value>,
        error: Option<&Failure>,
        fence: &Fence,
    ) -> Result<(), StoreError>;
    async fn run_finished(
        &self,
        run_id: &str,
        status: RunStatus,
        output: Option<&Value>,
        error: Option<&Failure>,
        fence: &Fence,
    ) -> Result<(), StoreError>;
    /// `workflow.retry`'s move: false when the run is not failed or
    /// cancelled (the store refused it).
    async fn reopen_run(&self, run_id: &str) -> Result<bool, StoreError>;
    /// Ends a run nothing drives; nothing happens to a run that is not
    /// running (the store refused it).
    async fn abandon_run(
        &self,
        run_id: &str,
        status: RunStatus,
        failure: &Failure,
    ) -> Result<(), StoreError>;
}

impl<S: Store + ?Sized> Moves for S {
    async fn step_started(
        &self,
        run_id: &str,
        step_id: &str,
        attempt: u32,
        input: Option<&Value>,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let write = Transition::StepStarted {
            step_id,
            attempt,
            input,
        };
        self.transitions(run_id, &[write], Some(fence))
            .await
            .map(drop)
    }

    async fn step_attempt(
        &self,
        run_id: &str,
        step_id: &str,
        attempt: u32,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let write = Transition::StepAttempt { step_id, attempt };
        self.transitions(run_id, &[write], Some(fence))
            .await
            .map(drop)
    }

    async fn step_finished(
        &self,
        run_id: &str,
        step_id: &str,
        status: StepStatus,
        output: Option<&Value>,
        error: Option<&Failure>,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let write = Transition::StepFinished {
            step_id,
            status,
            output,
            error,
            log: None,
        };
        self.transitions(run_id, &[write], Some(fence))
            .await
            .map(drop)
    }

    async fn run_finished(
        &self,
        run_id: &str,
        status: RunStatus,
        output: Option<&Value>,
        error: Option<&Failure>,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let write = Transition::RunFinished {
            status,
            output,
            error,
        };
        self.transitions(run_id, &[write], Some(fence))
            .await
            .map(drop)
    }

    async fn reopen_run(&self, run_id: &str) -> Result<bool, StoreError> {
        let write = Transition::RunReopened { workflow: "w" };
        match self.transitions(run_id, &[write], None).await {
            Ok(_) => Ok(true),
            Err(StoreError::Refused(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn abandon_run(
        &self,
        run_id: &str,
        status: RunStatus,
        failure: &Failure,
    ) -> Result<(), StoreError> {
        let write = Transition::RunAbandoned {
            status,
            error: failure,
        };
        match self.transitions(run_id, &[write], None).await {
            Ok(_) | Err(StoreError::Refused(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A store under test and what keeps it alive (its file, its server).
struct Backend {
    store: Arc<dyn Store>,
    _file: Option<tempfile::TempDir>,
    _server: Option<TestPostgres>,
}

impl Backend {
    async fn memory() -> Backend {
        Backend {
            store: Arc::new(MemoryStore::new()),
            _file: None,
            _server: None,
        }
    }

    async fn sqlite_memory() -> Backend {
        Backend {
            store: Arc::new(SqliteStore::open(":memory:").await.unwrap()),
            _file: None,
            _server: None,
        }
    }

    async fn sqlite_file() -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        Backend {
            store: Arc::new(SqliteStore::open(path.to_str().unwrap()).await.unwrap()),
            _file: Some(dir),
            _server: None,
        }
    }

    async fn postgres() -> Backend {
        let server = TestPostgres::start();
        Backend {
            store: Arc::new(PgStore::open(&server.url()).await.unwrap()),
            _file: None,
            _server: Some(server),
        }
    }
}

/// Runs each named test (an `async fn(Backend)`) against every backend.
macro_rules! every_backend {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Backend::memory().await).await;
            })*
        }
        mod sqlite_memory {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Backend::sqlite_memory().await).await;
            })*
        }
        mod sqlite_file {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Backend::sqlite_file().await).await;
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Backend::postgres().await).await;
            })*
        }
    };
}

every_backend!(
    prune_keeps_running_runs_and_the_newest_finished_ones,
    prune_follows_runs_that_reopen_and_finish_again,
    an_idempotency_key_finds_the_first_run,
    a_new_run_is_stored_with_its_first_event,
    a_new_run_s_first_steps_start_with_it,
    a_bad_cursor_is_refused,
    a_run_s_progress_is_recorded,
    runs_page_newest_first,
    a_failed_run_reopens,
    abandoning_a_run_cancels_its_unfinished_steps,
    a_transition_records_the_write_and_its_event,
    a_step_s_end_and_its_run_s_end_are_stored_together_in_order,
    a_pruned_run_takes_its_events_and_calls_and_ids_are_not_reused,
    concurrent_writes_each_get_their_own_result_and_a_bad_one_fails_alone,
    a_move_its_guard_refuses_writes_nothing_of_its_batch,
    compensating_adds_its_steps_after_the_run_s_own,
);

/// Many writers at once (SQLite commits them in groups): every run, step
/// and event lands with its own ids, the log shows each run's events in the
/// order they were written, and a write that cannot be made (an event of an
/// unknown run) fails alone, without taking the others with it.
async fn concurrent_writes_each_get_their_own_result_and_a_bad_one_fails_alone(b: Backend) {
    const RUNS: usize = 40;
    let store = &b.store;
    let before = store.last_event_id().await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for r in 0..RUNS {
        let store = store.clone();
        tasks.spawn(async move {
            let id = format!("run-{r:02}");
            let mut run = new_run(&id, 1000 + r as i64);
            run.steps = vec!["a".into(), "b".into()];
            let created = store.create_run(&run, Some(&lease("w1"))).await.unwrap();
            assert!(matches!(created, Created::New));
            let f = fence("w1");
            let mut ids = Vec::new();
            let started = store
                .append_event(&id, "run.started", &json!({"r": r}))
                .await;
            ids.push(started.unwrap().id);
            for step in ["a", "b"] {
                let input = json!({"r": r, "step": step});
                let log = json!({"step": step, "r": r});
                for write in [
                    Transition::StepStarted {
                        step_id: step,
                        attempt: 1,
                        input: Some(&input),
                    },
                    Transition::StepFinished {
                        step_id: step,
                        status: StepStatus::Succeeded,
                        output: Some(&input),
                        error: None,
                        log: Some(&log),
                    },
                ] {
                    let events = store.transitions(&id, &[write], Some(&f)).await.unwrap();
                    ids.extend(events.iter().map(|e| e.id));
                }
            }
            let finished = Transition::RunFinished {
                status: RunStatus::Succeeded,
                output: Some(&json!(r)),
                error: None,
            };
            let events = store.transitions(&id, &[finished], Some(&f)).await.unwrap();
            ids.extend(events.iter().map(|e| e.id));
            (id, ids)
        });
        if r == RUNS / 2 {
            let store = b.store.clone();
            tasks.spawn(async move {
                let bad = store.append_event("no-such-run", "x", &json!({})).await;
                assert!(bad.is_err(), "an event of an unknown run: {bad:?}");
                (String::new(), Vec::new())
            });
        }
    }
    let mut all_ids = HashSet::new();
    let mut finished = 0;
    while let Some(done) = tasks.join_next().await {
        let (id, ids) = done.unwrap();
        if id.is_empty() {
            continue;
        }
        finished += 1;
        // run.started, two events per step transition, run.finished.
        assert_eq!(ids.len(), 1 + 2 * 3 + 1, "{id}: {ids:?}");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{id}: {ids:?}");
        let logged: Vec<i64> = store
            .events(Some(&id), before, 100)
            .await
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(logged, ids, "{id}");
        let run = store.run(&id).await.unwrap().unwrap();
        assert_eq!(run.status, RunStatus::Succeeded);
        let steps = store.steps(&id).await.unwrap();
        assert!(
            steps.iter().all(|s| s.status == StepStatus::Succeeded),
            "{steps:?}"
        );
        for id in ids {
            assert!(all_ids.insert(id), "event id {id} given twice");
        }
    }
    assert_eq!(finished, RUNS);
    assert_eq!(all_ids.len(), RUNS * 8);
    // The whole log, in id order, holds exactly these events.
    let log = store.events(None, before, 1000).await.unwrap();
    assert_eq!(log.len(), all_ids.len());
    assert!(log.iter().all(|e| all_ids.contains(&e.id)));
}

/// Pruning deletes a run's steps, calls and events with it; the event stream
/// of the other runs is untouched, pages by `limit`, and a new event never
/// gets a deleted one's id.
async fn a_pruned_run_takes_its_events_and_calls_and_ids_are_not_reused(b: Backend) {
    let store = &b.store;
    let f = fence("w");
    for (i, id) in ["r1", "r2"].iter().enumerate() {
        let mut run = new_run(id, i as i64);
        run.steps = vec!["a".into()];
        store.create_run(&run, Some(&lease("w"))).await.unwrap();
    }
    let mut ids = Vec::new();
    for n in 0..3 {
        for run in ["r1", "r2"] {
            let e = store
                .append_event(run, "test", &json!({"n": n}))
                .await
                .unwrap();
            ids.push((run, e.id));
        }
    }
    let call = CallRow {
        run_id: "r1".into(),
        step_id: "a".into(),
        item: 0,
        attempt: 1,
        seq: 1,
        name: "fixture.echo".into(),
        arguments: json!({}),
        outcome: "ok".into(),
        error_code: None,
        duration_us: 1,
        at: now_text(),
        result: None,
        tape: None,
    };
    store.record_call(&call, &f).await.unwrap();
    let first_two = store.events(None, 0, 2).await.unwrap();
    assert_eq!(
        first_two.iter().map(|e| e.id).collect::<Vec<_>>(),
        [ids[0].1, ids[1].1],
        "the stream pages by limit, oldest first"
    );

    store
        .run_finished("r1", RunStatus::Succeeded, None, None, &f)
        .await
        .unwrap();
    assert_eq!(store.prune(0, 0).await.unwrap(), 1);
    assert!(store.events(Some("r1"), 0, 100).await.unwrap().is_empty());
    assert!(store.calls("r1", "a").await.unwrap().is_empty());
    let left: Vec<i64> = store
        .events(None, 0, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let r2: Vec<i64> = ids
        .iter()
        .filter(|(r, _)| *r == "r2")
        .map(|(_, id)| *id)
        .collect();
    assert_eq!(left, r2, "only the kept run's events are left");
    assert_eq!(
        store.events(Some("r2"), r2[0], 1).await.unwrap()[0].id,
        r2[1],
        "a run's events page from `after`"
    );
    let newest = ids.iter().map(|(_, id)| *id).max().unwrap();
    let next = store.append_event("r2", "test", &json!({})).await.unwrap();
    assert!(next.id > newest, "{} reuses an id up to {newest}", next.id);
}

/// `Store::transitions` of one move at a time: each write lands, and its
/// event (of the kind and with the data the move gives) is appended with the
/// next id; a finished step's log event just before its own. A store that says it stamps writes with their event's
/// time does: a step's start and end and the run's end carry the `at` of
/// the event that recorded them.
async fn a_transition_records_the_write_and_its_event(b: Backend) {
    let store = &b.store;
    let mut run = new_run("r1", 1);
    run.steps = vec!["a".into()];
    store.create_run(&run, Some(&lease("w1"))).await.unwrap();
    let f = fence("w1");
    let before = store.last_event_id().await.unwrap();
    let input = json!({"in": 1});
    let output = json!({"out": 2});
    let failure = Failure::new("unavailable", "try later");
    let log = json!({"step": "a", "records": [{"level": "info", "message": "hi"}]});
    let writes = [
        Transition::StepStarted {
            step_id: "a",
            attempt: 1,
            input: Some(&input),
        },
        Transition::StepAttempt {
            step_id: "a",
            attempt: 2,
        },
        Transition::StepFinished {
            step_id: "a",
            status: StepStatus::Succeeded,
            output: Some(&output),
            error: None,
            log: Some(&log),
        },
        Transition::RunFinished {
            status: RunStatus::Failed,
            output: None,
            error: Some(&failure),
        },
    ];
    let mut ids = Vec::new();
    let mut ats = Vec::new();
    let expected = [
        ("step.started", json!({"step": "a", "attempt": 1})),
        ("step.started", json!({"step": "a", "attempt": 2})),
        (
            "step.finished",
            json!({"step": "a", "status": "succeeded", "error": null}),
        ),
        (
            "run.finished",
            json!({"status": "failed", "error": {"code": "unavailable", "message": "try later"}}),
        ),
    ];
    for (n, write) in writes.into_iter().enumerate() {
        let events = store.transitions("r1", &[write], Some(&f)).await.unwrap();
        ats.push(events.last().unwrap().at.clone());
        let kinds: Vec<(&str, &serde_json::Value)> =
            events.iter().map(|e| (e.kind.as_str(), &e.data)).collect();
        let (kind, data) = &expected[n];
        if n == 2 {
            assert_eq!(kinds, [("step.log", &log), (*kind, data)]);
        } else {
            assert_eq!(kinds, [(*kind, data)]);
        }
        ids.extend(events.iter().map(|e| e.id));
    }
    assert!(
        ids[0] > before && ids.windows(2).all(|w| w[0] < w[1]),
        "{ids:?}"
    );
    let step = &store.steps("r1").await.unwrap()[0];
    assert_eq!(step.status, StepStatus::Succeeded);
    assert_eq!(step.attempts, 2);
    assert_eq!(step.input, Some(input));
    assert_eq!(step.output, Some(output));
    assert_eq!(
        step.workers.iter().map(|w| w.attempt).collect::<Vec<_>>(),
        [1, 2]
    );
    let run = store.run("r1").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error, Some(failure));
    let events = store.events(Some("r1"), before, 10).await.unwrap();
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), ids);
    // PostgreSQL writes and appends in two statements, each with its own time.
    assert_eq!(
        store.stamps_with_event_time(),
        store.backend() != "postgres"
    );
    if store.stamps_with_event_time() {
        assert_eq!(step.started_at.as_ref(), Some(&ats[0]));
        assert_eq!(step.finished_at.as_ref(), Some(&ats[2]));
        assert_eq!(run.finished_at.as_ref(), Some(&ats[3]));
    }
}

/// `Store::transitions`, as a run's last step ends: the step's end and the
/// run's end both land, and their events come back, and read back from the
/// log, in the order written (the step's log, the step's end, the run's
/// end), each stamped as `transition` stamps it.
async fn a_step_s_end_and_its_run_s_end_are_stored_together_in_order(b: Backend) {
    let store = &b.store;
    let mut run = new_run("r1", 1);
    run.steps = vec!["a".into()];
    store.create_run(&run, Some(&lease("w1"))).await.unwrap();
    let f = fence("w1");
    store.step_started("r1", "a", 1, None, &f).await.unwrap();
    let before = store.last_event_id().await.unwrap();
    let output = json!({"out": 2});
    let log = json!({"step": "a", "records": [{"level": "info", "message": "hi"}]});
    let step_data = json!({"step": "a", "status": "succeeded", "error": null});
    let run_data = json!({"status": "succeeded", "error": null});
    let writes = [
        Transition::StepFinished {
            step_id: "a",
            status: StepStatus::Succeeded,
            output: Some(&output),
            error: None,
            log: Some(&log),
        },
        Transition::RunFinished {
            status: RunStatus::Succeeded,
            output: Some(&output),
            error: None,
        },
    ];
    let events = store.transitions("r1", &writes, Some(&f)).await.unwrap();
    let kinds: Vec<(&str, &serde_json::Value)> =
        events.iter().map(|e| (e.kind.as_str(), &e.data)).collect();
    assert_eq!(
        kinds,
        [
            ("step.log", &log),
            ("step.finished", &step_data),
            ("run.finished", &run_data)
        ]
    );
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    assert!(
        ids[0] > before && ids.windows(2).all(|w| w[0] < w[1]),
        "{ids:?}"
    );
    let read = store.events(Some("r1"), before, 10).await.unwrap();
    assert_eq!(read.iter().map(|e| e.id).collect::<Vec<_>>(), ids);
    let step = &store.steps("r1").await.unwrap()[0];
    assert_eq!(step.status, StepStatus::Succeeded);
    assert_eq!(step.output.as_ref(), Some(&output));
    let run = store.run("r1").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!(run.output.as_ref(), Some(&output));
    if store.stamps_with_event_time() {
        assert_eq!(step.finished_at.as_ref(), Some(&events[1].at));
        assert_eq!(run.finished_at.as_ref(), Some(&events[2].at));
    }
    // Nothing to write is no write.
    assert!(
        store
            .transitions("r1", &[], Some(&f))
            .await
            .unwrap()
            .is_empty()
    );
}

/// The guards of the state machine, in every backend: a move from a state
/// its guard does not allow is refused ([`StoreError::Refused`]), and so is
/// its whole batch: the moves before it in the batch are not written and no
/// event is appended. A run move of a run in another state is refused too.
async fn a_move_its_guard_refuses_writes_nothing_of_its_batch(b: Backend) {
    let store = &b.store;
    let mut run = new_run("r1", 1);
    run.steps = vec!["a".into(), "b".into()];
    store.create_run(&run, Some(&lease("w1"))).await.unwrap();
    let f = fence("w1");
    store.step_started("r1", "a", 1, None, &f).await.unwrap();
    let before = store.last_event_id().await.unwrap();
    let refused = |r: Result<Vec<wf_host::store::EventRow>, StoreError>, what: &str| match r {
        Err(StoreError::Refused(message)) => message,
        other => panic!("{what}: {other:?}"),
    };
    // `a` succeeds, then a retry attempt of it (only a running step
    // retries), in one batch: neither lands.
    let batch = [
        Transition::StepFinished {
            step_id: "a",
            status: StepStatus::Succeeded,
            output: Some(&json!(1)),
            error: None,
            log: Some(&json!({"records": []})),
        },
        Transition::StepAttempt {
            step_id: "a",
            attempt: 2,
        },
    ];
    let message = refused(
        store.transitions("r1", &batch, Some(&f)).await,
        "a retry of a finished step",
    );
    assert_eq!(
        message,
        "run `r1`: step.started (StepAttempt) refused: step `a` is not running"
    );
    let a = &store.steps("r1").await.unwrap()[0];
    assert_eq!((a.status, a.output.as_ref()), (StepStatus::Running, None));
    assert_eq!(store.last_event_id().await.unwrap(), before, "no event");
    // A pending step does not retry; an unknown step does not move.
    refused(
        store
            .transitions(
                "r1",
                &[Transition::StepAttempt {
                    step_id: "b",
                    attempt: 2,
                }],
                Some(&f),
            )
            .await,
        "a retry of a pending step",
    );
    refused(
        store
            .transitions(
                "r1",
                &[Transition::StepStarted {
                    step_id: "nope",
                    attempt: 1,
                    input: None,
                }],
                Some(&f),
            )
            .await,
        "an unknown step",
    );
    // A running run does not reopen; a finished one does not end again.
    refused(
        store
            .transitions("r1", &[Transition::RunReopened { workflow: "w" }], None)
            .await,
        "a reopen of a running run",
    );
    store
        .run_finished("r1", RunStatus::Succeeded, None, None, &f)
        .await
        .unwrap();
    let after_end = store.last_event_id().await.unwrap();
    let failure = Failure::new("cancelled", "too late");
    refused(
        store
            .transitions(
                "r1",
                &[Transition::RunAbandoned {
                    status: RunStatus::Cancelled,
                    error: &failure,
                }],
                None,
            )
            .await,
        "an abandon of a finished run",
    );
    let run = store.run("r1").await.unwrap().unwrap();
    assert_eq!((run.status, run.error), (RunStatus::Succeeded, None));
    assert_eq!(store.last_event_id().await.unwrap(), after_end);
}

fn new_run(id: &str, created_ms: i64) -> NewRun {
    NewRun {
        run: RunRow {
            run_id: id.into(),
            workflow: "w".into(),
            status: RunStatus::Running,
            input: json!(null),
            output: None,
            error: None,
            definition: Arc::new(json!({})),
            definition_hash: "h".into(),
            idempotency_key: None,
            created_ms,
            started_at: now_text(),
            finished_at: None,
            trigger: None,
            flow: None,
            queued_reason: None,
            admitted_ms: None,
            debounce: None,
            wake_ms: None,
        },
        steps: vec!["a".into()],
    }
}

fn lease(worker: &str) -> Lease {
    Lease {
        worker: worker.into(),
        duration: Duration::from_secs(60),
    }
}

/// The fence of a run created with `lease(worker)`.
fn fence(worker: &str) -> Fence {
    Fence {
        worker: worker.into(),
        epoch: 1,
    }
}

/// A run that finishes, reopens and finishes again is pruned by its last
/// finish only, and never while it runs; an abandoned run counts as finished.
async fn prune_follows_runs_that_reopen_and_finish_again(b: Backend) {
    let store = &b.store;
    for (i, id) in ["r1", "r2", "r3"].iter().enumerate() {
        store
            .create_run(&new_run(id, i as i64), Some(&lease("w")))
            .await
            .unwrap();
    }
    let failure = Failure::new("test", "failed on purpose");
    store
        .run_finished("r1", RunStatus::Failed, None, Some(&failure), &fence("w"))
        .await
        .unwrap();
    store
        .abandon_run("r2", RunStatus::Cancelled, &failure)
        .await
        .unwrap();
    assert!(
        store.reopen_run("r1").await.unwrap(),
        "a failed run reopens"
    );
    // r1 runs again and r3 never finished: only the abandoned r2 goes.
    assert_eq!(store.prune(0, 0).await.unwrap(), 1);
    assert!(store.run("r2").await.unwrap().is_none());
    assert!(
        store.run("r1").await.unwrap().is_some(),
        "a reopened run stays"
    );
    // It ends again (abandoned: a reopened run may be unclaimed, so it has
    // no fence to finish with here).
    store
        .abandon_run("r1", RunStatus::Failed, &failure)
        .await
        .unwrap();
    // Newest finished kept: r1 stays with a keep of one, goes with none.
    assert_eq!(store.prune(1, 0).await.unwrap(), 0);
    assert_eq!(store.prune(0, 0).await.unwrap(), 1);
    assert!(store.run("r1").await.unwrap().is_none());
    assert!(store.run("r3").await.unwrap().is_some(), "running stays");
}

async fn prune_keeps_running_runs_and_the_newest_finished_ones(b: Backend) {
    let store = &b.store;
    for (i, id) in ["r1", "r2", "r3", "r4"].iter().enumerate() {
        store
            .create_run(&new_run(id, i as i64), Some(&lease("w")))
            .await
            .unwrap();
    }
    // A queued run (flow control) has not finished either.
    let mut queued = new_run("r5", 5);
    queued.run.status = RunStatus::Queued;
    store.create_run(&queued, None).await.unwrap();
    for id in ["r1", "r2", "r3"] {
        store
            .run_finished(id, RunStatus::Succeeded, Some(&json!(1)), None, &fence("w"))
            .await
            .unwrap();
    }
    // Keep two finished runs; none is old enough for the age limit.
    assert_eq!(store.prune(2, 0).await.unwrap(), 1);
    assert!(store.run("r1").await.unwrap().is_none(), "the oldest goes");
    assert!(store.run("r4").await.unwrap().is_some(), "running stays");
    assert!(
        store.steps("r1").await.unwrap().is_empty(),
        "its steps go too"
    );
    // Everything finished before now goes; the running and the queued run
    // stay.
    assert_eq!(store.prune(100, now_ms() + 1).await.unwrap(), 2);
    let left: Vec<_> = store
        .list_runs(&ListQuery {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .0
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(left, ["r5", "r4"]);
}

async fn an_idempotency_key_finds_the_first_run(b: Backend) {
    let store = &b.store;
    let mut first = new_run("r1", 1);
    first.run.idempotency_key = Some("k".into());
    assert_eq!(store.create_run(&first, None).await.unwrap(), Created::New);
    let mut second = new_run("r2", 2);
    second.run.idempotency_key = Some("k".into());
    match store.create_run(&second, None).await.unwrap() {
        Created::Existing(run) => assert_eq!(run.run_id, "r1"),
        Created::New => panic!("a second run with the same key"),
    }
    assert!(store.run("r2").await.unwrap().is_none());
    // The same key in another workflow is another run.
    let mut other = new_run("r3", 3);
    other.run.workflow = "other".into();
    other.run.idempotency_key = Some("k".into());
    assert_eq!(store.create_run(&other, None).await.unwrap(), Created::New);
}

/// `Store::create_run_with_event`: a new run is stored with its steps and its
/// first event; a run whose idempotency key was used before appends nothing
/// and finds the first run.
async fn a_new_run_is_stored_with_its_first_event(b: Backend) {
    let store = &b.store;
    let mut first = new_run("r1", 1);
    first.run.idempotency_key = Some("k".into());
    let data = json!({"workflow": "w", "input": null});
    let written = store
        .create_run_with_event(
            &first,
            Some(&lease("w1")),
            Some(("run.started", &data)),
            None,
        )
        .await
        .unwrap();
    assert_eq!(written.created, Created::New);
    assert!(!written.then_stored, "nothing was asked to follow");
    let [event] = <[_; 1]>::try_from(written.events).expect("the new run's one event");
    assert_eq!(
        (event.run_id.as_str(), event.kind.as_str(), &event.data),
        ("r1", "run.started", &data)
    );
    assert_eq!(
        store.events(Some("r1"), 0, 10).await.unwrap(),
        std::slice::from_ref(&event)
    );
    assert_eq!(store.steps("r1").await.unwrap()[0].step_id, "a");
    let mut again = new_run("r2", 2);
    again.run.idempotency_key = Some("k".into());
    let written = store
        .create_run_with_event(&again, None, Some(("run.started", &data)), None)
        .await
        .unwrap();
    match written.created {
        Created::Existing(run) => assert_eq!(run.run_id, "r1"),
        Created::New => panic!("a second run with the same key"),
    }
    assert_eq!(written.events, []);
    assert_eq!(store.last_event_id().await.unwrap(), event.id);
}

/// `Store::create_run_with_event` with transitions to follow: a new run's
/// first steps' starts are stored with it, their events right after its
/// first one; a run found by its idempotency key is left as it was.
async fn a_new_run_s_first_steps_start_with_it(b: Backend) {
    let store = &b.store;
    let f = fence("w1");
    let data = json!({"workflow": "w", "input": null});
    let input = json!({"x": 1});
    let start = Transition::StepStarted {
        step_id: "a",
        attempt: 1,
        input: Some(&input),
    };
    let start_data = json!({"step": "a", "attempt": 1});
    let then = [start];
    // Without a key and with one: each a new run.
    for (id, key) in [("r1", None), ("r2", Some("k"))] {
        let mut new = new_run(id, 1);
        new.steps = vec!["a".into(), "b".into()];
        new.run.idempotency_key = key.map(str::to_owned);
        let written = store
            .create_run_with_event(
                &new,
                Some(&lease("w1")),
                Some(("run.started", &data)),
                Some((&f, &then)),
            )
            .await
            .unwrap();
        assert_eq!(written.created, Created::New, "{id}");
        assert!(written.then_stored, "{id}: the start was stored");
        let kinds: Vec<_> = written.events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["run.started", "step.started"], "{id}");
        assert_eq!(written.events[1].data, start_data);
        assert!(written.events[0].id < written.events[1].id);
        assert_eq!(store.events(Some(id), 0, 10).await.unwrap(), written.events);
        let steps = store.steps(id).await.unwrap();
        assert_eq!(
            (steps[0].status, steps[0].attempts, steps[0].input.as_ref()),
            (StepStatus::Running, 1, Some(&input)),
            "{id}"
        );
        assert_eq!(steps[0].workers.len(), 1, "{id}: one attempt, by w1");
        assert_eq!(steps[0].workers[0].worker, "w1");
        assert_eq!(
            (steps[1].status, steps[1].attempts),
            (StepStatus::Pending, 0)
        );
    }
    // The key again: the run it finds is not started a second time.
    let last = store.last_event_id().await.unwrap();
    let mut again = new_run("r3", 2);
    again.run.idempotency_key = Some("k".into());
    let other = json!({"x": 2});
    let start = Transition::StepStarted {
        step_id: "a",
        attempt: 1,
        input: Some(&other),
    };
    let written = store
        .create_run_with_event(
            &again,
            Some(&lease("w1")),
            Some(("run.started", &data)),
            Some((&f, &[start])),
        )
        .await
        .unwrap();
    assert!(matches!(written.created, Created::Existing(ref run) if run.run_id == "r2"));
    assert!(!written.then_stored);
    assert_eq!(written.events, []);
    assert_eq!(store.last_event_id().await.unwrap(), last);
    let steps = store.steps("r2").await.unwrap();
    assert_eq!(steps[0].input.as_ref(), Some(&input));
    assert_eq!(steps[0].workers.len(), 1);
}

async fn a_bad_cursor_is_refused(b: Backend) {
    let err = b
        .store
        .list_runs(&ListQuery {
            limit: 1,
            cursor: Some("nonsense".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cursor `nonsense` is not one this server returned"
    );
}

async fn a_run_s_progress_is_recorded(b: Backend) {
    let store = &b.store;
    let mut run = new_run("r1", 1);
    run.steps = vec!["a".into(), "b".into()];
    run.run.input = json!({"x": 1});
    store.create_run(&run, Some(&lease("w1"))).await.unwrap();
    let f = fence("w1");
    store
        .step_started("r1", "a", 1, Some(&json!({"in": 1})), &f)
        .await
        .unwrap();
    store.step_attempt("r1", "a", 2, &f).await.unwrap();
    let call = CallRow {
        run_id: "r1".into(),
        step_id: "a".into(),
        item: 0,
        attempt: 2,
        seq: 0,
        name: "fs.read".into(),
        arguments: json!({"path": "/x"}),
        outcome: "error".into(),
        error_code: Some("denied".into()),
        duration_us: 42,
        at: now_text(),
        result: Some(json!({"error": {"code": "denied", "message": "no"}})),
        tape: None,
    };
    store.record_call(&call, &f).await.unwrap();
    // Recorded again (a replayed journal): replaced, not doubled.
    store.record_call(&call, &f).await.unwrap();
    store
        .step_finished("r1", "a", StepStatus::Succeeded, Some(&json!(7)), None, &f)
        .await
        .unwrap();
    let steps = store.steps("r1").await.unwrap();
    assert_eq!(
        steps.iter().map(|s| s.step_id.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    let a = &steps[0];
    assert_eq!(a.status, StepStatus::Succeeded);
    assert_eq!(a.attempts, 2);
    assert_eq!(a.input, Some(json!({"in": 1})));
    assert_eq!(a.output, Some(json!(7)));
    assert_eq!(
        a.workers,
        [
            AttemptWorker {
                attempt: 1,
                worker: "w1".into()
            },
            AttemptWorker {
                attempt: 2,
                worker: "w1".into()
            }
        ]
    );
    assert_eq!(steps[1].status, StepStatus::Pending);
    assert!(steps[1].workers.is_empty());
    assert_eq!(store.calls("r1", "a").await.unwrap(), [call]);

    // Each move above appended its own event (three); these two follow.
    let moved = store.events(Some("r1"), 0, 10).await.unwrap();
    let kinds: Vec<&str> = moved.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["step.started", "step.started", "step.finished"]);
    let e1 = store
        .append_event("r1", "step.started", &json!({"step": "a"}))
        .await
        .unwrap();
    let e2 = store
        .append_event("r1", "step.finished", &json!({"step": "a"}))
        .await
        .unwrap();
    assert!(e2.id > e1.id);
    assert_eq!(
        store.events(Some("r1"), moved[2].id, 10).await.unwrap(),
        [e1.clone(), e2.clone()]
    );
    assert_eq!(store.events(None, e1.id, 10).await.unwrap(), [e2]);
    assert!(store.events(Some("nope"), 0, 10).await.unwrap().is_empty());

    let counts = store.counts().await.unwrap();
    assert_eq!((counts.runs_running, counts.runs_total), (1, 1));
    let failure = Failure::new("boom", "it broke");
    store
        .run_finished("r1", RunStatus::Failed, None, Some(&failure), &f)
        .await
        .unwrap();
    let row = store.run("r1").await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Failed);
    assert_eq!(row.error, Some(failure));
    assert_eq!(row.input, json!({"x": 1}));
    assert!(row.finished_at.is_some());
    assert!(store.unfinished_runs(i64::MAX).await.unwrap().is_empty());
    assert_eq!(store.counts().await.unwrap().runs_running, 0);
}

async fn runs_page_newest_first(b: Backend) {
    let store = &b.store;
    // Two runs share a created_ms: the id orders them.
    for (id, ms) in [("r1", 1), ("r2", 2), ("r3", 2), ("r4", 4)] {
        store.create_run(&new_run(id, ms), None).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let (page, next) = store
            .list_runs(&ListQuery {
                limit: 1,
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        seen.extend(page.into_iter().map(|r| r.run_id));
        match next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ["r4", "r3", "r2", "r1"]);
    let unfinished: Vec<_> = store
        .unfinished_runs(i64::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(unfinished, ["r1", "r2", "r3", "r4"]);
    let none = store
        .list_runs(&ListQuery {
            limit: 10,
            status: Some(RunStatus::Succeeded),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(none.0.is_empty() && none.1.is_none());
}

async fn a_failed_run_reopens(b: Backend) {
    let store = &b.store;
    store
        .create_run(&new_run("r1", 1), Some(&lease("w")))
        .await
        .unwrap();
    assert!(!store.reopen_run("r1").await.unwrap(), "a running run");
    store
        .step_finished(
            "r1",
            "a",
            StepStatus::Failed,
            None,
            Some(&Failure::new("x", "y")),
            &fence("w"),
        )
        .await
        .unwrap();
    store
        .run_finished(
            "r1",
            RunStatus::Failed,
            None,
            Some(&Failure::new("x", "y")),
            &fence("w"),
        )
        .await
        .unwrap();
    assert!(store.reopen_run("r1").await.unwrap());
    let run = store.run("r1").await.unwrap().unwrap();
    assert_eq!((run.status, run.error), (RunStatus::Running, None));
    assert_eq!(
        store.steps("r1").await.unwrap()[0].status,
        StepStatus::Pending
    );
}

async fn abandoning_a_run_cancels_its_unfinished_steps(b: Backend) {
    let store = &b.store;
    let mut run = new_run("r1", 1);
    run.steps = vec!["a".into(), "b".into(), "c".into()];
    store.create_run(&run, Some(&lease("w"))).await.unwrap();
    store
        .step_finished("r1", "a", StepStatus::Succeeded, None, None, &fence("w"))
        .await
        .unwrap();
    store
        .step_started("r1", "b", 1, None, &fence("w"))
        .await
        .unwrap();
    let failure = Failure::new("cancelled", "asked to");
    store
        .abandon_run("r1", RunStatus::Cancelled, &failure)
        .await
        .unwrap();
    let statuses: Vec<_> = store
        .steps("r1")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.status)
        .collect();
    assert_eq!(
        statuses,
        [
            StepStatus::Succeeded,
            StepStatus::Cancelled,
            StepStatus::Cancelled
        ]
    );
    let run = store.run("r1").await.unwrap().unwrap();
    assert_eq!(
        (run.status, run.error),
        (RunStatus::Cancelled, Some(failure))
    );
    // A finished run is left alone.
    store
        .abandon_run("r1", RunStatus::Failed, &Failure::new("other", "later"))
        .await
        .unwrap();
    assert_eq!(
        store.run("r1").await.unwrap().unwrap().status,
        RunStatus::Cancelled
    );
}

/// `workflow.cancel`'s move of a run without compensations.
fn cancel(failure: &Failure) -> Transition<'_> {
    Transition::RunAbandoned {
        status: RunStatus::Cancelled,
        error: failure,
    }
}

/// A run that begins compensating keeps its status, takes the error it
/// will end with, and gets its compensations as new `pending` steps after
/// its own, in order; a cancel of a run nothing drives cancels its
/// unfinished steps, not the compensations it adds, and leaves it running
/// for a worker to claim.
async fn compensating_adds_its_steps_after_the_run_s_own(b: Backend) {
    let store = &b.store;
    let mut run = new_run("r1", 1);
    run.steps = vec!["a".into(), "b".into(), "c".into()];
    store.create_run(&run, Some(&lease("w"))).await.unwrap();
    let failure = Failure::new("tool-error", "step `c`: no");
    let undo = json!(["b.compensate", "a.compensate"]);
    let begin = Transition::RunCompensating {
        status: RunStatus::Failed,
        error: &failure,
        steps: &undo,
    };
    let events = store
        .transitions("r1", &[begin], Some(&fence("w")))
        .await
        .unwrap();
    assert_eq!(events[0].kind, "run.compensating");
    assert_eq!(events[0].data["steps"], undo);
    let ids = |steps: Vec<wf_host::store::StepRow>| {
        steps
            .into_iter()
            .map(|s| (s.step_id, s.status))
            .collect::<Vec<_>>()
    };
    let pending = StepStatus::Pending;
    assert_eq!(
        ids(store.steps("r1").await.unwrap()),
        [
            ("a".to_owned(), pending),
            ("b".to_owned(), pending),
            ("c".to_owned(), pending),
            ("b.compensate".to_owned(), pending),
            ("a.compensate".to_owned(), pending),
        ]
    );
    let stored = store.run("r1").await.unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.error),
        (RunStatus::Running, Some(failure))
    );

    let mut run = new_run("r2", 2);
    run.steps = vec!["a".into(), "b".into()];
    store.create_run(&run, Some(&lease("w"))).await.unwrap();
    store
        .step_finished("r2", "a", StepStatus::Succeeded, None, None, &fence("w"))
        .await
        .unwrap();
    // Its worker let it go (paused): nobody holds it.
    store.release_runs("w", &["r2".to_owned()]).await.unwrap();
    let cancelled = Failure::new("cancelled", "the run was cancelled");
    let undo = json!(["a.compensate"]);
    let cancel = Transition::RunCancelCompensating {
        error: &cancelled,
        steps: &undo,
    };
    assert!(matches!(
        store.request_cancel("r2", cancel).await.unwrap(),
        CancelRequest::Ended(_)
    ));
    assert_eq!(
        ids(store.steps("r2").await.unwrap()),
        [
            ("a".to_owned(), StepStatus::Succeeded),
            ("b".to_owned(), StepStatus::Cancelled),
            ("a.compensate".to_owned(), pending),
        ]
    );
    let stored = store.run("r2").await.unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.error),
        (RunStatus::Running, Some(cancelled))
    );
}

/// A SQLite state file gets its WAL copied back while it is open, by a
/// checkpoint beside the writer (the writer's own automatic one is off, so no
/// write waits for it). Without it, these 3 MB would all still sit in the WAL
/// (SQLite's own checkpoint starts at 4 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_state_file_is_checkpointed_while_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = SqliteStore::open(path.to_str().unwrap()).await.unwrap();
    store
        .create_run(&new_run("r1", 1), Some(&lease("w1")))
        .await
        .unwrap();
    let fresh = std::fs::metadata(&path).unwrap().len();
    let filler = "x".repeat(1000);
    for n in 0..3000 {
        store
            .append_event("r1", "test", &json!({"n": n, "filler": filler}))
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let len = std::fs::metadata(&path).unwrap().len();
        if len > 3_000_000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the database file is still {len} bytes (it was {fresh}): nothing was checkpointed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.events(Some("r1"), 0, 5000).await.unwrap().len(), 3000);
}

/// Under a steady load of writes the WAL starts over, so it stays bounded
/// (256 MiB written, the WAL file stays under 128 MiB):
/// a checkpoint from beside the writer never completes while writes keep
/// landing, and a WAL only starts over after a complete one. Before the
/// writer finished checkpoints itself, a `workflow.start` load grew the WAL
/// by 90 MB a second, for as long as the load lasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_wal_stays_bounded_under_a_steady_load() {
    const WRITERS: usize = 8;
    const TOTAL: usize = 256 << 20;
    // The writer's bound is 64 MiB; a reader can hold a checkpoint off for a
    // moment, so the file may pass it. Without the bound, it grows to most of
    // what was written.
    const LIMIT: u64 = 128 << 20;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = Arc::new(SqliteStore::open(path.to_str().unwrap()).await.unwrap());
    store
        .create_run(&new_run("r1", 1), Some(&lease("w1")))
        .await
        .unwrap();
    let filler = Arc::new("x".repeat(8 << 10));
    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..WRITERS {
        let (store, filler) = (store.clone(), filler.clone());
        writers.spawn(async move {
            for n in 0..TOTAL / filler.len() / WRITERS {
                store
                    .append_event("r1", "test", &json!({"n": n, "filler": *filler}))
                    .await
                    .unwrap();
            }
        });
    }
    let wal = dir.path().join("state.db-wal");
    let mut largest = 0;
    while !writers.is_empty() {
        tokio::select! {
            joined = writers.join_next() => joined.unwrap().unwrap(),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
    }
    assert!(
        largest < LIMIT,
        "the WAL grew to {largest} bytes for {TOTAL} bytes written"
    );
    // Every write landed.
    let written = (TOTAL / filler.len() / WRITERS * WRITERS) as i64;
    assert_eq!(store.last_event_id().await.unwrap(), written);
}

/// What only a shared store does, on PostgreSQL.
mod shared {
    use super::*;

    async fn open(server: &TestPostgres) -> PgStore {
        PgStore::open(&server.url()).await.unwrap()
    }

    fn lease_for(worker: &str, duration: Duration) -> Lease {
        Lease {
            worker: worker.into(),
            duration,
        }
    }

    fn lease_lost(result: Result<(), StoreError>, run_id: &str) {
        match result {
            Err(StoreError::LeaseLost(id)) => assert_eq!(id, run_id),
            other => panic!("expected LeaseLost, got {other:?}"),
        }
    }

    /// The next note `want` accepts, within 5 s.
    async fn note(rx: &mut broadcast::Receiver<Note>, want: impl Fn(&Note) -> bool) -> Note {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Ok(note)) if want(&note) => return note,
                Ok(Ok(_)) => {}
                Ok(Err(e)) => panic!("notes: {e}"),
                Err(_) => panic!("no such note within 5 s"),
            }
        }
    }

    #[tokio::test]
    async fn a_write_with_a_stale_fence_changes_nothing() {
        let server = TestPostgres::start();
        let store = open(&server).await;
        store
            .create_run(&new_run("r1", 1), Some(&lease("w1")))
            .await
            .unwrap();
        let stale = [
            Fence {
                worker: "w1".into(),
                epoch: 2,
            },
            Fence {
                worker: "w2".into(),
                epoch: 1,
            },
        ];
        for f in &stale {
            lease_lost(store.step_started("r1", "a", 1, None, f).await, "r1");
            lease_lost(store.step_attempt("r1", "a", 2, f).await, "r1");
            lease_lost(
                store
                    .step_finished("r1", "a", StepStatus::Succeeded, None, None, f)
                    .await,
                "r1",
            );
            let call = CallRow {
                run_id: "r1".into(),
                step_id: "a".into(),
                item: 0,
                attempt: 1,
                seq: 0,
                name: "t".into(),
                arguments: json!({}),
                outcome: "ok".into(),
                error_code: None,
                duration_us: 1,
                at: now_text(),
                result: None,
                tape: None,
            };
            lease_lost(store.record_call(&call, f).await, "r1");
            lease_lost(
                store
                    .run_finished("r1", RunStatus::Succeeded, None, None, f)
                    .await,
                "r1",
            );
        }
        let step = &store.steps("r1").await.unwrap()[0];
        assert_eq!((step.status, step.attempts), (StepStatus::Pending, 0));
        assert!(step.workers.is_empty());
        assert!(store.calls("r1", "a").await.unwrap().is_empty());
        assert_eq!(
            store.run("r1").await.unwrap().unwrap().status,
            RunStatus::Running
        );
        // The holder's own fence writes.
        store
            .step_started("r1", "a", 1, None, &fence("w1"))
            .await
            .unwrap();
        assert_eq!(
            store.steps("r1").await.unwrap()[0].status,
            StepStatus::Running
        );
        // A finished run takes no more writes, even from its last holder.
        store
            .run_finished("r1", RunStatus::Succeeded, None, None, &fence("w1"))
            .await
            .unwrap();
        lease_lost(
            store
                .step_finished("r1", "a", StepStatus::Succeeded, None, None, &fence("w1"))
                .await,
            "r1",
        );
    }

    #[tokio::test]
    async fn concurrent_claimers_never_claim_a_run_twice() {
        let server = TestPostgres::start();
        let store = open(&server).await;
        for i in 0..200 {
            store
                .create_run(&new_run(&format!("r{i:03}"), i), None)
                .await
                .unwrap();
        }
        let mut claimers = Vec::new();
        for w in 0..4 {
            let store = open(&server).await;
            claimers.push(tokio::spawn(async move {
                let worker = format!("w{w}");
                let mut mine = Vec::new();
                loop {
                    let claimed = store
                        .claim_runs(&worker, 7, Duration::from_secs(60))
                        .await
                        .unwrap();
                    if claimed.is_empty() {
                        return mine;
                    }
                    for (run, fence) in claimed {
                        assert_eq!((&*fence.worker, fence.epoch), (worker.as_str(), 1));
                        mine.push(run.run_id);
                    }
                }
            }));
        }
        let mut all = Vec::new();
        for claimer in claimers {
            all.extend(claimer.await.unwrap());
        }
        let unique: HashSet<_> = all.iter().collect();
        assert_eq!(all.len(), 200, "every run claimed once");
        assert_eq!(unique.len(), 200, "no run claimed twice");
        assert!(
            store
                .claim_runs("late", 10, Duration::from_secs(60))
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn an_expired_lease_passes_to_another_worker() {
        let server = TestPostgres::start();
        let store = open(&server).await;
        store
            .create_run(
                &new_run("r1", 1),
                Some(&lease_for("w1", Duration::from_millis(300))),
            )
            .await
            .unwrap();
        assert!(
            store
                .claim_runs("w2", 10, Duration::from_secs(60))
                .await
                .unwrap()
                .is_empty(),
            "a held run is not claimable"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        let claimed = store
            .claim_runs("w2", 10, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
        let (run, new_fence) = &claimed[0];
        assert_eq!(run.run_id, "r1");
        assert_eq!((&*new_fence.worker, new_fence.epoch), ("w2", 2));
        lease_lost(
            store.step_started("r1", "a", 1, None, &fence("w1")).await,
            "r1",
        );
        store
            .step_started("r1", "a", 1, None, new_fence)
            .await
            .unwrap();
        let renewed = store
            .renew("w1", &["r1".into()], Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(renewed.lost, ["r1"]);
    }

    #[tokio::test]
    async fn renew_reports_lost_and_cancelled_runs() {
        let server = TestPostgres::start();
        let store = open(&server).await;
        for id in ["r1", "r2"] {
            store
                .create_run(&new_run(id, 1), Some(&lease("w1")))
                .await
                .unwrap();
        }
        store
            .create_run(&new_run("r3", 1), Some(&lease("w2")))
            .await
            .unwrap();
        let failure = Failure::new("cancelled", "asked to");
        assert_eq!(
            store.request_cancel("r2", cancel(&failure)).await.unwrap(),
            CancelRequest::Signalled
        );
        let ids: Vec<String> = ["r1", "r2", "r3", "gone"].map(String::from).to_vec();
        let renewed = store
            .renew("w1", &ids, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(renewed.lost, ["r3", "gone"]);
        assert_eq!(renewed.cancel, ["r2"]);
        // Released runs are claimable at once.
        store.release_runs("w1", &ids).await.unwrap();
        let mut claimed: Vec<_> = store
            .claim_runs("w3", 10, Duration::from_secs(60))
            .await
            .unwrap()
            .into_iter()
            .map(|(r, f)| (r.run_id, f.epoch))
            .collect();
        claimed.sort();
        assert_eq!(claimed, [("r1".to_owned(), 2), ("r2".to_owned(), 2)]);
    }

    #[tokio::test]
    async fn request_cancel_ends_signals_or_refuses() {
        let server = TestPostgres::start();
        let store = open(&server).await;
        let failure = Failure::new("cancelled", "asked to");
        assert_eq!(
            store
                .request_cancel("nope", cancel(&failure))
                .await
                .unwrap(),
            CancelRequest::NotRunning
        );
        // Held by a live worker: marked, and that worker is told.
        store
            .create_run(&new_run("held", 1), Some(&lease("w1")))
            .await
            .unwrap();
        assert_eq!(
            store
                .request_cancel("held", cancel(&failure))
                .await
                .unwrap(),
            CancelRequest::Signalled
        );
        assert_eq!(
            store.run("held").await.unwrap().unwrap().status,
            RunStatus::Running
        );
        // Held by nobody: ended here.
        store.create_run(&new_run("free", 2), None).await.unwrap();
        let CancelRequest::Ended(events) = store
            .request_cancel("free", cancel(&failure))
            .await
            .unwrap()
        else {
            panic!("a run nobody holds is ended here");
        };
        let kinds: Vec<(&str, &Value)> =
            events.iter().map(|e| (e.kind.as_str(), &e.data)).collect();
        assert_eq!(
            kinds,
            [(
                "run.finished",
                &json!({"status": "cancelled", "error": {"code": "cancelled", "message": "asked to"}})
            )],
            "its end is on the event log"
        );
        let run = store.run("free").await.unwrap().unwrap();
        assert_eq!(
            (run.status, run.error),
            (RunStatus::Cancelled, Some(failure.clone()))
        );
        assert_eq!(
            store.steps("free").await.unwrap()[0].status,
            StepStatus::Cancelled
        );
        assert_eq!(
            store
                .request_cancel("free", cancel(&failure))
                .await
                .unwrap(),
            CancelRequest::NotRunning
        );
        // Its lease expired: nobody drives it any more.
        store
            .create_run(
                &new_run("expired", 3),
                Some(&lease_for("w1", Duration::ZERO)),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(matches!(
            store
                .request_cancel("expired", cancel(&failure))
                .await
                .unwrap(),
            CancelRequest::Ended(_)
        ));
    }

    #[tokio::test]
    async fn every_worker_hears_the_notes() {
        let server = TestPostgres::start();
        let writer = open(&server).await;
        let other = open(&server).await;
        let mut rx = other.listen().expect("a shared store listens");
        assert!(writer.shared() && writer.backend() == "postgres");

        writer.create_run(&new_run("r1", 1), None).await.unwrap();
        note(&mut rx, |n| *n == Note::Ready).await;
        let (_, f) = writer
            .claim_runs("w1", 1, Duration::from_secs(60))
            .await
            .unwrap()
            .remove(0);
        writer
            .request_cancel("r1", cancel(&Failure::new("cancelled", "asked to")))
            .await
            .unwrap();
        note(&mut rx, |n| *n == Note::Cancel("r1".into())).await;
        writer
            .append_event("r1", "run.started", &json!({}))
            .await
            .unwrap();
        note(&mut rx, |n| *n == Note::Event).await;
        writer
            .run_finished("r1", RunStatus::Cancelled, None, None, &f)
            .await
            .unwrap();
        note(&mut rx, |n| *n == Note::Finished("r1".into())).await;
        assert!(writer.reopen_run("r1").await.unwrap());
        note(&mut rx, |n| *n == Note::Ready).await;
        writer
            .claim_runs("w1", 1, Duration::from_secs(60))
            .await
            .unwrap();
        writer.release_runs("w1", &["r1".into()]).await.unwrap();
        note(&mut rx, |n| *n == Note::Ready).await;
        writer
            .abandon_run("r1", RunStatus::Failed, &Failure::new("x", "y"))
            .await
            .unwrap();
        note(&mut rx, |n| *n == Note::Finished("r1".into())).await;
    }

    #[tokio::test]
    async fn a_lost_listening_connection_is_reported_when_back() {
        let server = TestPostgres::dedicated();
        let store = open(&server).await;
        let mut rx = store.listen().unwrap();
        server.stop();
        let err = store.run("r1").await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        server.restart();
        note(&mut rx, |n| *n == Note::Reconnected).await;
        // And it hears notes again.
        store.create_run(&new_run("r1", 1), None).await.unwrap();
        note(&mut rx, |n| *n == Note::Ready).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn event_ids_appear_in_order_across_workers() {
        let server = TestPostgres::start();
        let store = open(&server).await;
        store.create_run(&new_run("r1", 1), None).await.unwrap();
        const WRITERS: usize = 4;
        const EACH: usize = 50;
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let store = open(&server).await;
            writers.push(tokio::spawn(async move {
                for i in 0..EACH {
                    store
                        .append_event("r1", "step.log", &json!({"w": w, "i": i}))
                        .await
                        .unwrap();
                }
            }));
        }
        // A reader that resumes after the last id it saw, as an SSE client
        // with Last-Event-ID does: it must never find a gap.
        let reader = open(&server).await;
        let mut last = 0;
        let mut seen = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen < WRITERS * EACH {
            assert!(Instant::now() < deadline, "saw {seen} events");
            for event in reader.events(Some("r1"), last, 1000).await.unwrap() {
                assert_eq!(event.id, last + 1, "an id was skipped");
                last = event.id;
                seen += 1;
            }
        }
        for w in writers {
            w.await.unwrap();
        }
        assert!(reader.events(None, last, 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn workers_heartbeat() {
        let server = TestPostgres::start();
        let store = open(&server).await;
        for (id, steps) in [("w2", 1), ("w1", 3)] {
            store
                .heartbeat(&WorkerRow {
                    id: id.into(),
                    started_at: now_text(),
                    last_heartbeat: String::new(),
                    running_steps: steps,
                })
                .await
                .unwrap();
        }
        store
            .heartbeat(&WorkerRow {
                id: "w1".into(),
                started_at: now_text(),
                last_heartbeat: String::new(),
                running_steps: 5,
            })
            .await
            .unwrap();
        let workers = store.workers(Duration::from_secs(60)).await.unwrap();
        let seen: Vec<_> = workers
            .iter()
            .map(|w| (w.id.as_str(), w.running_steps))
            .collect();
        assert_eq!(seen, [("w1", 5), ("w2", 1)]);
        assert!(humantime::parse_rfc3339(&workers[0].last_heartbeat).is_ok());
        server.psql("UPDATE workers SET heartbeat_ms = heartbeat_ms - 120000 WHERE id = 'w2'");
        let seen: Vec<_> = store
            .workers(Duration::from_secs(60))
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.id)
            .collect();
        assert_eq!(seen, ["w1"]);
    }

    #[tokio::test]
    async fn a_newer_schema_is_refused() {
        let server = TestPostgres::start();
        open(&server).await.close().await;
        server.psql(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (9999, 'from the future', TRUE, '\\x00', 0)",
        );
        let err = PgStore::open(&server.url()).await.err().expect("refused");
        assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
        assert!(
            err.to_string().contains(
                "the database's schema is newer than this wf-host (migration 9999); upgrade wf-host"
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_dead_database_fails_fast_without_showing_the_password() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("postgres://wf:s3cret@127.0.0.1:{port}/wf");
        let started = Instant::now();
        let err = PgStore::open(&url).await.err().expect("no database there");
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "{:?}",
            started.elapsed()
        );
        let message = err.to_string();
        assert!(
            message.contains(&format!("`postgres://wf@127.0.0.1:{port}/wf`")),
            "{message}"
        );
        assert!(!message.contains("s3cret"), "{message}");
    }

    #[tokio::test]
    async fn workers_opening_a_fresh_database_at_once_migrate_it_once() {
        let server = TestPostgres::start();
        let url = server.url();
        let (a, b) = tokio::join!(PgStore::open(&url), PgStore::open(&url));
        let (a, _b) = (a.unwrap(), b.unwrap());
        let files = std::fs::read_dir(repo_root().join("host/migrations/postgres"))
            .unwrap()
            .count();
        assert_eq!(
            server.psql("SELECT count(*) FROM _sqlx_migrations"),
            files.to_string()
        );
        assert!(!a.location().contains('@') || a.location().starts_with("postgres://postgres@"));
    }
}
