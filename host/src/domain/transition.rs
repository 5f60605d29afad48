//! The state machine of runs and steps: every move a stored run or step
//! makes, with the event it appends and the states it may start from.
//!
//! ```text
//! run:  queued ──RunQueued──▶ queued                (why it waits, when that changes)
//!       queued ──RunAdmitted──▶ running             (its flow limits allow it now)
//!       queued | running ──RunAbandoned──▶ cancelled | failed
//!       running ──RunFinished / RunAbandoned──▶ succeeded | failed | cancelled
//!       failed | cancelled ──RunReopened──▶ running (queued under flow control)
//!       running ──RunPaused──▶ paused ──RunResumed──▶ running (queued under flow control)
//!       paused ──RunFinished / RunAbandoned──▶ succeeded | failed | cancelled
//!       running | paused ──RunCompensating──▶ (same; its compensations added, its end set)
//!       running | paused ──RunCancelCompensating──▶ running (unclaimed, to compensate)
//! step: pending ──StepStarted──▶ running ──StepAttempt──▶ running
//!       pending ──StepWaits──▶ waiting                (a wait step, for its signal)
//!       pending | running | waiting ──StepFinished──▶ succeeded | failed | skipped | cancelled
//!       running ──StepStarted──▶ running            (after a crash: the next attempt)
//!       failed | cancelled ──RunReopened──▶ pending   (with its run)
//!       pending | running | waiting ──RunAbandoned──▶ cancelled (with its run)
//! ```
//!
//! A run of a workflow with flow control (`concurrency`, `rate`) is created
//! `queued`. [`Transition::RunAdmitted`] is the one move whose guard looks
//! past its own run: the run's flow limits must allow it, counted over
//! every run of its workflow and key in the same write (see each backend).
//!
//! A [`Transition`] says what it writes, which event it appends
//! ([`Transition::kind`], [`Transition::data`]) and from which states
//! ([`Transition::guard`]); the engine and the run lifecycle only build them,
//! and every backend writes them through the store's `transitions`,
//! which refuses a move whose guard does not hold
//! (refused) and changes nothing then.
//!
//! The moves of a driven run are fenced ([`Transition::fenced`]): they carry
//! the lease of the worker that drives it. A run move of a run nobody drives
//! (retry, abandon) is not.

use serde_json::{Value, json};

use super::{Failure, RunStatus, StepStatus};

/// A move of a stored run or of one of its steps.
#[derive(Debug, Clone, Copy)]
pub enum Transition<'a> {
    /// A step starts an attempt on `input` (its first, or after a crash its
    /// next).
    StepStarted {
        step_id: &'a str,
        attempt: u32,
        input: Option<&'a Value>,
    },
    /// A wait step starts waiting for its signal, on `input` (`{signal,
    /// timeout_at, request}`).
    StepWaits {
        step_id: &'a str,
        attempt: u32,
        input: Option<&'a Value>,
    },
    /// A running step retries, as `attempt`.
    StepAttempt { step_id: &'a str, attempt: u32 },
    /// A step ends, having run or not.
    StepFinished {
        step_id: &'a str,
        status: StepStatus,
        output: Option<&'a Value>,
        error: Option<&'a Failure>,
        /// The data of a `step.log` event (the records of the step's last
        /// attempt), appended just before the transition's own event.
        log: Option<&'a Value>,
    },
    /// A driven run ends, as its steps decided. Its lease is released.
    RunFinished {
        status: RunStatus,
        output: Option<&'a Value>,
        error: Option<&'a Failure>,
    },
    /// `workflow.retry`: a failed or cancelled run runs again, unclaimed,
    /// from its failed and cancelled steps (they go back to `pending`). A
    /// run under flow control goes back to `queued`, to be admitted again.
    RunReopened { workflow: &'a str },
    /// A run that nothing drives ends (its task failed, or it was cancelled
    /// while no worker held it or while it was queued); its pending and
    /// running steps are cancelled with the same error.
    RunAbandoned {
        status: RunStatus,
        error: &'a Failure,
    },
    /// A queued run says (again) why it waits: its first reason, or a new
    /// one.
    RunQueued { reason: &'a str },
    /// `workflow.pause`: a running run starts no new step; its running steps
    /// finish and are recorded.
    RunPaused,
    /// `workflow.resume`: a paused run runs on, unclaimed (queued again
    /// under flow control, which a paused run does not hold).
    RunResumed,
    /// `workflow.migrate`: an unfinished run goes on with another
    /// definition of its workflow (`definition`, as runs store it, and its
    /// `hash`), unclaimed.
    RunMigrated {
        definition: &'a Value,
        hash: &'a str,
    },
    /// A driven run whose steps have all ended, failed or cancelled, begins
    /// to undo its succeeded steps: it will end `status` with `error` (its
    /// error from now on), and `steps` (a JSON array of the compensations'
    /// ids, in the order they run) are added `pending`.
    RunCompensating {
        status: RunStatus,
        error: &'a Failure,
        steps: &'a Value,
    },
    /// `workflow.cancel` of a run nothing drives whose succeeded steps have
    /// compensations: its unfinished steps are cancelled, `steps` added
    /// `pending`, and it is `running` again, unclaimed, to run them; then it
    /// ends `cancelled`.
    RunCancelCompensating {
        error: &'a Failure,
        steps: &'a Value,
    },
    /// A later start with a debounced run's key joins it: the run takes
    /// `input`, and is not admitted before `not_before_ms` (capped at its
    /// deadline), for `reason`.
    RunDebounced {
        input: &'a Value,
        not_before_ms: i64,
        reason: &'a str,
    },
    /// A driven run whose only steps in flight sleep lets go of its driver
    /// until `wake_ms` (the earliest of their wake times): a waker drives
    /// it again then.
    RunAsleep { wake_ms: i64 },
    /// A queued run is admitted at `at_ms` and becomes `running`, unclaimed:
    /// only while its flow limits allow it (its concurrency key has fewer
    /// than `limit` runs running, its rate key fewer than `limit` admitted
    /// since `at_ms - period`), which the backend checks in the same write.
    RunAdmitted { at_ms: i64 },
}

/// The values a move carries from a node or a caller
/// ([`Transition::carried`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Carried<'a> {
    pub input: Option<&'a Value>,
    pub output: Option<&'a Value>,
    pub error: Option<&'a Failure>,
    pub log: Option<&'a Value>,
}

/// The states a [`Transition`] may start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guard {
    /// A run move: the states its run may be in. Empty for a step move,
    /// whose run is running while its fence holds it.
    pub run: &'static [RunStatus],
    /// A step move: the states its step may be in. A run move: the states
    /// of the steps that move with the run (the others stay as they are).
    pub steps: &'static [StepStatus],
}

impl Guard {
    /// The statuses of `run`, as text (a refusal names them).
    pub fn run_text(&self) -> Vec<&'static str> {
        self.run.iter().map(|s| s.as_str()).collect()
    }

    /// The statuses of `steps`, as text.
    pub fn steps_text(&self) -> Vec<&'static str> {
        self.steps.iter().map(|s| s.as_str()).collect()
    }
}

/// The kind of the event that carries a node's log records.
pub const STEP_LOG: &str = "step.log";
/// The kind of a run's first event, and of the one that reopens it.
pub const RUN_STARTED: &str = "run.started";

impl<'a> Transition<'a> {
    /// The kind of the event the move appends.
    pub fn kind(&self) -> &'static str {
        match self {
            Transition::StepStarted { .. } | Transition::StepAttempt { .. } => "step.started",
            Transition::StepWaits { .. } => "step.waiting",
            Transition::StepFinished { .. } => "step.finished",
            Transition::RunFinished { .. } | Transition::RunAbandoned { .. } => "run.finished",
            Transition::RunReopened { .. } => RUN_STARTED,
            Transition::RunQueued { .. } => "run.queued",
            Transition::RunAdmitted { .. } => "run.admitted",
            Transition::RunPaused => "run.paused",
            Transition::RunResumed => "run.resumed",
            Transition::RunMigrated { .. } => "run.migrated",
            Transition::RunDebounced { .. } => "run.debounced",
            Transition::RunAsleep { .. } => "run.asleep",
            Transition::RunCompensating { .. } | Transition::RunCancelCompensating { .. } => {
                "run.compensating"
            }
        }
    }

    /// The data of the event the move appends.
    pub fn data(&self) -> Value {
        match *self {
            Transition::StepStarted {
                step_id, attempt, ..
            }
            | Transition::StepAttempt { step_id, attempt } => {
                json!({"step": step_id, "attempt": attempt})
            }
            Transition::StepWaits { step_id, input, .. } => {
                json!({"step": step_id, "signal": input.and_then(|i| i.get("signal"))})
            }
            Transition::StepFinished {
                step_id,
                status,
                error,
                ..
            } => json!({"step": step_id, "status": status, "error": error}),
            Transition::RunFinished { status, error, .. } => {
                json!({"status": status, "error": error})
            }
            Transition::RunAbandoned { status, error } => {
                json!({"status": status, "error": error})
            }
            Transition::RunReopened { workflow } => json!({"workflow": workflow, "retry": true}),
            Transition::RunQueued { reason } => json!({"reason": reason}),
            Transition::RunAdmitted { .. } | Transition::RunPaused | Transition::RunResumed => {
                json!({})
            }
            Transition::RunMigrated { hash, .. } => json!({"definition_hash": hash}),
            Transition::RunDebounced { not_before_ms, .. } => {
                json!({"not_before_ms": not_before_ms})
            }
            Transition::RunAsleep { wake_ms } => json!({"wake_ms": wake_ms}),
            Transition::RunCompensating {
                status,
                error,
                steps,
            } => json!({"status": status, "error": error, "steps": steps}),
            Transition::RunCancelCompensating { error, steps } => {
                json!({"status": RunStatus::Cancelled, "error": error, "steps": steps})
            }
        }
    }

    /// The states the move may start from.
    pub fn guard(&self) -> Guard {
        use RunStatus as R;
        use StepStatus as S;
        match self {
            Transition::StepStarted { .. } => Guard {
                run: &[],
                steps: &[S::Pending, S::Running],
            },
            Transition::StepWaits { .. } => Guard {
                run: &[],
                steps: &[S::Pending, S::Waiting],
            },
            Transition::StepAttempt { .. } => Guard {
                run: &[],
                steps: &[S::Running],
            },
            Transition::StepFinished { .. } => Guard {
                run: &[],
                steps: &[S::Pending, S::Running, S::Waiting],
            },
            Transition::RunFinished { .. } => Guard {
                run: &[R::Running, R::Paused],
                steps: &[],
            },
            Transition::RunReopened { .. } => Guard {
                run: &[R::Failed, R::Cancelled],
                steps: &[S::Failed, S::Cancelled],
            },
            Transition::RunAbandoned { .. } => Guard {
                run: &[R::Queued, R::Running, R::Paused],
                steps: &[S::Pending, S::Running, S::Waiting],
            },
            Transition::RunPaused => Guard {
                run: &[R::Running],
                steps: &[],
            },
            Transition::RunResumed => Guard {
                run: &[R::Paused],
                steps: &[],
            },
            Transition::RunMigrated { .. } => Guard {
                run: &[R::Queued, R::Running, R::Paused],
                steps: &[],
            },
            Transition::RunCompensating { .. } => Guard {
                run: &[R::Running, R::Paused],
                steps: &[],
            },
            Transition::RunAsleep { .. } => Guard {
                run: &[R::Running],
                steps: &[],
            },
            Transition::RunCancelCompensating { .. } => Guard {
                run: &[R::Running, R::Paused],
                steps: &[S::Pending, S::Running, S::Waiting],
            },
            Transition::RunQueued { .. }
            | Transition::RunAdmitted { .. }
            | Transition::RunDebounced { .. } => Guard {
                run: &[R::Queued],
                steps: &[],
            },
        }
    }

    /// Whether the move is made by the worker that drives the run, under its
    /// lease.
    pub fn fenced(&self) -> bool {
        !matches!(
            self,
            Transition::RunReopened { .. }
                | Transition::RunAbandoned { .. }
                | Transition::RunQueued { .. }
                | Transition::RunAdmitted { .. }
                | Transition::RunPaused
                | Transition::RunResumed
                | Transition::RunMigrated { .. }
                | Transition::RunCancelCompensating { .. }
                | Transition::RunDebounced { .. }
        )
    }

    /// The step a step move moves.
    pub fn step_id(&self) -> Option<&'a str> {
        match *self {
            Transition::StepStarted { step_id, .. }
            | Transition::StepWaits { step_id, .. }
            | Transition::StepAttempt { step_id, .. }
            | Transition::StepFinished { step_id, .. } => Some(step_id),
            _ => None,
        }
    }

    /// The status the step (a step move) or the steps it moves (a run
    /// move) end in; `None` for a move that leaves steps as they are.
    pub fn step_to(&self) -> Option<StepStatus> {
        match *self {
            Transition::StepStarted { .. } | Transition::StepAttempt { .. } => {
                Some(StepStatus::Running)
            }
            Transition::StepWaits { .. } => Some(StepStatus::Waiting),
            Transition::StepFinished { status, .. } => Some(status),
            Transition::RunReopened { .. } => Some(StepStatus::Pending),
            Transition::RunAbandoned { .. } | Transition::RunCancelCompensating { .. } => {
                Some(StepStatus::Cancelled)
            }
            Transition::RunFinished { .. }
            | Transition::RunCompensating { .. }
            | Transition::RunDebounced { .. }
            | Transition::RunAsleep { .. }
            | Transition::RunQueued { .. }
            | Transition::RunAdmitted { .. }
            | Transition::RunPaused
            | Transition::RunResumed
            | Transition::RunMigrated { .. } => None,
        }
    }

    /// The status the run ends in; `None` for a step move.
    pub fn run_to(&self) -> Option<RunStatus> {
        match *self {
            Transition::RunFinished { status, .. } | Transition::RunAbandoned { status, .. } => {
                Some(status)
            }
            Transition::RunReopened { .. }
            | Transition::RunAdmitted { .. }
            | Transition::RunResumed
            | Transition::RunCancelCompensating { .. } => Some(RunStatus::Running),
            Transition::RunQueued { .. } | Transition::RunDebounced { .. } => {
                Some(RunStatus::Queued)
            }
            Transition::RunPaused => Some(RunStatus::Paused),
            _ => None,
        }
    }

    /// The `step.log` event data appended before the move's own event.
    pub fn log(&self) -> Option<&'a Value> {
        match *self {
            Transition::StepFinished { log, .. } => log,
            _ => None,
        }
    }

    /// The values the move carries from a node or a caller (a step's
    /// input, an output, an error, a step's log): what may hold a secret.
    pub fn carried(&self) -> Carried<'a> {
        match *self {
            Transition::StepStarted { input, .. } | Transition::StepWaits { input, .. } => {
                Carried {
                    input,
                    ..Carried::default()
                }
            }
            // A run's input is stored as it is, as at its start.
            Transition::RunDebounced { .. } | Transition::RunAsleep { .. } => Carried::default(),
            Transition::StepFinished {
                output, error, log, ..
            } => Carried {
                output,
                error,
                log,
                ..Carried::default()
            },
            Transition::RunFinished { output, error, .. } => Carried {
                output,
                error,
                ..Carried::default()
            },
            Transition::RunAbandoned { error, .. }
            | Transition::RunCompensating { error, .. }
            | Transition::RunCancelCompensating { error, .. } => Carried {
                error: Some(error),
                ..Carried::default()
            },
            // A queued run's reason holds its keys, from its input, which
            // is stored as it is.
            Transition::StepAttempt { .. }
            | Transition::RunReopened { .. }
            | Transition::RunQueued { .. }
            | Transition::RunAdmitted { .. }
            | Transition::RunPaused
            | Transition::RunResumed
            | Transition::RunMigrated { .. } => Carried::default(),
        }
    }

    /// The move with the values of `new` in place of those it carries
    /// (each `None` of `new` keeps the move's own).
    pub fn with_carried<'b>(&self, new: Carried<'b>) -> Transition<'b>
    where
        'a: 'b,
    {
        let pick = |new: Option<&'b Value>, old: Option<&'a Value>| new.or(old);
        match *self {
            Transition::StepStarted {
                step_id,
                attempt,
                input,
            } => Transition::StepStarted {
                step_id,
                attempt,
                input: pick(new.input, input),
            },
            Transition::StepWaits {
                step_id,
                attempt,
                input,
            } => Transition::StepWaits {
                step_id,
                attempt,
                input: pick(new.input, input),
            },
            Transition::StepFinished {
                step_id,
                status,
                output,
                error,
                log,
            } => Transition::StepFinished {
                step_id,
                status,
                output: pick(new.output, output),
                error: new.error.or(error),
                log: pick(new.log, log),
            },
            Transition::RunFinished {
                status,
                output,
                error,
            } => Transition::RunFinished {
                status,
                output: pick(new.output, output),
                error: new.error.or(error),
            },
            Transition::RunAbandoned { status, error } => Transition::RunAbandoned {
                status,
                error: new.error.unwrap_or(error),
            },
            Transition::RunCompensating {
                status,
                error,
                steps,
            } => Transition::RunCompensating {
                status,
                error: new.error.unwrap_or(error),
                steps,
            },
            Transition::RunCancelCompensating { error, steps } => {
                Transition::RunCancelCompensating {
                    error: new.error.unwrap_or(error),
                    steps,
                }
            }
            other => other,
        }
    }

    /// Whether `from` satisfies the guard: the step's status for a step
    /// move, the run's for a run move.
    pub fn allows_step(&self, from: StepStatus) -> bool {
        self.guard().steps.contains(&from)
    }

    /// See [`Transition::allows_step`].
    pub fn allows_run(&self, from: RunStatus) -> bool {
        self.guard().run.contains(&from)
    }

    /// What a refusal of this move says: which run (and step), and the
    /// states it may start from.
    pub fn refusal(&self, run_id: &str) -> String {
        let guard = self.guard();
        let (what, states) = match self.step_id() {
            Some(step) => (format!("step `{step}`"), guard.steps_text()),
            None => ("the run".to_owned(), guard.run_text()),
        };
        format!(
            "run `{run_id}`: {} ({}) refused: {what} is not {}",
            self.kind(),
            self.name(),
            states.join(" or ")
        )
    }

    /// The variant's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Transition::StepStarted { .. } => "StepStarted",
            Transition::StepWaits { .. } => "StepWaits",
            Transition::StepAttempt { .. } => "StepAttempt",
            Transition::StepFinished { .. } => "StepFinished",
            Transition::RunFinished { .. } => "RunFinished",
            Transition::RunReopened { .. } => "RunReopened",
            Transition::RunAbandoned { .. } => "RunAbandoned",
            Transition::RunQueued { .. } => "RunQueued",
            Transition::RunAdmitted { .. } => "RunAdmitted",
            Transition::RunPaused => "RunPaused",
            Transition::RunResumed => "RunResumed",
            Transition::RunMigrated { .. } => "RunMigrated",
            Transition::RunCompensating { .. } => "RunCompensating",
            Transition::RunCancelCompensating { .. } => "RunCancelCompensating",
            Transition::RunDebounced { .. } => "RunDebounced",
            Transition::RunAsleep { .. } => "RunAsleep",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_STEPS: [StepStatus; 7] = [
        StepStatus::Pending,
        StepStatus::Running,
        StepStatus::Waiting,
        StepStatus::Succeeded,
        StepStatus::Failed,
        StepStatus::Skipped,
        StepStatus::Cancelled,
    ];

    #[test]
    fn a_finished_step_moves_only_with_a_retry() {
        let failure = Failure::new("x", "y");
        let moves = [
            Transition::StepStarted {
                step_id: "a",
                attempt: 1,
                input: None,
            },
            Transition::StepAttempt {
                step_id: "a",
                attempt: 2,
            },
            Transition::StepFinished {
                step_id: "a",
                status: StepStatus::Failed,
                output: None,
                error: Some(&failure),
                log: None,
            },
        ];
        for m in moves {
            for from in ALL_STEPS {
                if from.is_finished() {
                    assert!(!m.allows_step(from), "{} from {from:?}", m.name());
                }
            }
        }
        let reopen = Transition::RunReopened { workflow: "w" };
        assert!(reopen.allows_run(RunStatus::Failed));
        assert!(reopen.allows_run(RunStatus::Cancelled));
        assert!(!reopen.allows_run(RunStatus::Running));
        assert!(!reopen.allows_run(RunStatus::Succeeded));
        // The steps a retry runs again, and only those.
        let again: Vec<_> = ALL_STEPS
            .into_iter()
            .filter(|s| reopen.allows_step(*s))
            .collect();
        assert_eq!(again, [StepStatus::Failed, StepStatus::Cancelled]);
    }

    #[test]
    fn a_queued_run_is_admitted_queued_again_or_cancelled() {
        let admit = Transition::RunAdmitted { at_ms: 1 };
        let queued = Transition::RunQueued { reason: "r" };
        for m in [admit, queued] {
            assert!(m.allows_run(RunStatus::Queued));
            assert!(!m.allows_run(RunStatus::Running));
            assert!(!m.fenced());
        }
        assert_eq!(admit.run_to(), Some(RunStatus::Running));
        assert_eq!(
            (queued.kind(), queued.data()),
            ("run.queued", json!({"reason": "r"}))
        );
        let failure = Failure::new("cancelled", "the run was cancelled");
        let cancel = Transition::RunAbandoned {
            status: RunStatus::Cancelled,
            error: &failure,
        };
        assert!(cancel.allows_run(RunStatus::Queued));
        assert!(!RunStatus::Queued.is_finished());
    }

    #[test]
    fn each_move_knows_its_event() {
        let failure = Failure::new("cancelled", "the run was cancelled");
        let abandoned = Transition::RunAbandoned {
            status: RunStatus::Cancelled,
            error: &failure,
        };
        assert_eq!(abandoned.kind(), "run.finished");
        assert_eq!(
            abandoned.data(),
            json!({"status": "cancelled", "error": {"code": "cancelled", "message": "the run was cancelled"}})
        );
        assert!(!abandoned.fenced());
        let reopened = Transition::RunReopened { workflow: "w" };
        assert_eq!(
            (reopened.kind(), reopened.data()),
            ("run.started", json!({"workflow": "w", "retry": true}))
        );
        let attempt = Transition::StepAttempt {
            step_id: "a",
            attempt: 3,
        };
        assert_eq!(
            (attempt.kind(), attempt.data()),
            ("step.started", json!({"step": "a", "attempt": 3}))
        );
        assert!(attempt.fenced());
        assert_eq!(
            attempt.refusal("r1"),
            "run `r1`: step.started (StepAttempt) refused: step `a` is not running"
        );
    }

    #[test]
    fn a_move_gives_back_what_it_carries_and_takes_replacements() {
        let (output, clean) = (json!("s3cret"), json!("[redacted]"));
        let failure = Failure::new("x", "s3cret");
        let finished = Transition::StepFinished {
            step_id: "a",
            status: StepStatus::Failed,
            output: Some(&output),
            error: Some(&failure),
            log: None,
        };
        let carried = finished.carried();
        assert_eq!(
            (carried.output, carried.error, carried.input),
            (Some(&output), Some(&failure), None)
        );
        let replaced = finished.with_carried(Carried {
            output: Some(&clean),
            ..Carried::default()
        });
        assert_eq!(replaced.carried().output, Some(&clean));
        assert_eq!(
            replaced.carried().error,
            Some(&failure),
            "a `None` keeps the move's own"
        );
        assert_eq!(replaced.step_id(), Some("a"));
        // A move that carries nothing stays as it is.
        let queued = Transition::RunQueued { reason: "r" };
        assert_eq!(queued.carried(), Carried::default());
        assert_eq!(queued.with_carried(Carried::default()).name(), "RunQueued");
    }
}
