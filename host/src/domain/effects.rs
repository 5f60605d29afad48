//! What a move writes, computed once: [`Transition::effects`] turns a move
//! into the row it writes, the columns it sets, the states it may start
//! from, the events it appends and the note it sends. Every backend only
//! applies [`Effects`]: the memory store to its maps, the SQL store renders
//! them into statements for SQLite or PostgreSQL. A new move is a new arm
//! here and in [`Transition`]'s other matches, and nothing in a backend.

use serde_json::Value;

use super::transition::{Guard, STEP_LOG, Transition};
use super::{Failure, RunStatus, StepStatus};

/// The writes of one move.
#[derive(Debug, Clone, PartialEq)]
pub struct Effects<'a> {
    /// The row the move writes, and what it sets there.
    pub target: Target<'a>,
    /// The states the target row may be in ([`Guard::steps`] for a step
    /// move, [`Guard::run`] for a run move); the move is refused, and its
    /// batch with it, when the row is in none of them.
    pub guard: Guard,
    /// Whether the write needs the run's fence (the lease of the worker that
    /// drives it), checked before it.
    pub fenced: bool,
    /// Whether the run's flow limits must allow it, counted over every run
    /// of its workflow and keys in the same write (an admission).
    pub admits: bool,
    /// The events the move appends, in order: `(kind, data)`.
    pub events: Vec<(&'static str, Value)>,
    /// What a shared store tells every worker once the move commits.
    pub notice: Option<Notice>,
}

/// The row a move writes.
#[derive(Debug, Clone, PartialEq)]
pub enum Target<'a> {
    /// One step of the run.
    Step { step_id: &'a str, set: StepSet<'a> },
    /// The run; with `steps`, the run's steps whose states are in the
    /// guard's [`Guard::steps`] move with it (only when the run did).
    Run {
        set: RunSet<'a>,
        steps: Option<StepSet<'a>>,
    },
}

/// A time column set to the move's time, or cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    Now,
    Clear,
}

/// How a move sets a step's attempt count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempts {
    /// To this attempt.
    Is(u32),
    /// To this attempt, unless it is past it already.
    AtLeast(u32),
}

/// The status a run move gives its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunTo {
    Is(RunStatus),
    /// `running`, or `queued` for a run under flow control (a reopened run
    /// is admitted again).
    RunningUnlessFlow,
}

/// What a move sets on a step: `None` leaves a column as it is; for the
/// nullable ones, `Some(None)` clears it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepSet<'a> {
    pub status: Option<StepStatus>,
    pub attempts: Option<Attempts>,
    pub input: Option<Option<&'a Value>>,
    pub output: Option<Option<&'a Value>>,
    pub error: Option<Option<&'a Failure>>,
    pub started: Option<Stamp>,
    pub finished: Option<Stamp>,
    /// The attempt whose worker (the fence's) joins the step's list of
    /// workers.
    pub worker_of: Option<u32>,
}

/// What a move sets on a run; `None` leaves a column as it is.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RunSet<'a> {
    pub status: Option<RunTo>,
    pub output: Option<Option<&'a Value>>,
    pub error: Option<Option<&'a Failure>>,
    /// `finished_at` and `finished_ms`.
    pub finished: Option<Stamp>,
    pub queued_reason: Option<Option<&'a str>>,
    /// Admitted now: `admitted_ms` is the later of this time (the pass that
    /// proposed it) and the store's clock when it writes.
    pub admitted: Option<i64>,
    /// Nobody holds the run's lease any more.
    pub release_lease: bool,
    /// A cancel asked of the run is forgotten.
    pub clear_cancel: bool,
    /// The run's definition (as runs store it) and its hash.
    pub definition: Option<(&'a Value, &'a str)>,
    /// Steps added to the run, `pending`, after its own (a JSON array of
    /// ids, in order), once its other steps have moved.
    pub new_steps: Option<&'a Value>,
    /// The run's input (a debounced run takes its last start's).
    pub input: Option<&'a Value>,
    /// Not admitted before this time (ms since the epoch), capped at the
    /// run's debounce deadline.
    pub not_before: Option<i64>,
    /// Asleep until this time (ms since the epoch): a waker drives it then.
    pub wake: Option<i64>,
}

/// What a shared store tells every worker when a move commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// The run has finished.
    Finished,
    /// The run can be claimed.
    Ready,
}

impl<'a> Transition<'a> {
    /// What the move writes. Pure: the same move always gives the same
    /// effects, whatever the backend.
    pub fn effects(&self) -> Effects<'a> {
        let target = match *self {
            Transition::StepStarted {
                step_id,
                attempt,
                input,
            }
            | Transition::StepWaits {
                step_id,
                attempt,
                input,
            } => Target::Step {
                step_id,
                set: StepSet {
                    status: self.step_to(),
                    attempts: Some(Attempts::Is(attempt)),
                    input: Some(input),
                    output: Some(None),
                    error: Some(None),
                    started: Some(Stamp::Now),
                    finished: Some(Stamp::Clear),
                    worker_of: Some(attempt),
                },
            },
            Transition::StepAttempt { step_id, attempt } => Target::Step {
                step_id,
                set: StepSet {
                    attempts: Some(Attempts::AtLeast(attempt)),
                    worker_of: Some(attempt),
                    ..StepSet::default()
                },
            },
            Transition::StepFinished {
                step_id,
                status,
                output,
                error,
                log: _,
            } => Target::Step {
                step_id,
                set: StepSet {
                    status: Some(status),
                    output: Some(output),
                    error: Some(error),
                    finished: Some(Stamp::Now),
                    ..StepSet::default()
                },
            },
            Transition::RunFinished {
                status,
                output,
                error,
            } => Target::Run {
                set: RunSet {
                    status: Some(RunTo::Is(status)),
                    output: Some(output),
                    error: Some(error),
                    finished: Some(Stamp::Now),
                    release_lease: true,
                    ..RunSet::default()
                },
                steps: None,
            },
            Transition::RunReopened { .. } => Target::Run {
                set: RunSet {
                    status: Some(RunTo::RunningUnlessFlow),
                    output: Some(None),
                    error: Some(None),
                    finished: Some(Stamp::Clear),
                    release_lease: true,
                    clear_cancel: true,
                    ..RunSet::default()
                },
                steps: Some(StepSet {
                    status: self.step_to(),
                    error: Some(None),
                    finished: Some(Stamp::Clear),
                    ..StepSet::default()
                }),
            },
            Transition::RunAbandoned { status, error } => Target::Run {
                set: RunSet {
                    status: Some(RunTo::Is(status)),
                    error: Some(Some(error)),
                    finished: Some(Stamp::Now),
                    release_lease: true,
                    ..RunSet::default()
                },
                steps: Some(StepSet {
                    status: self.step_to(),
                    error: Some(Some(error)),
                    finished: Some(Stamp::Now),
                    ..StepSet::default()
                }),
            },
            Transition::RunQueued { reason } => Target::Run {
                set: RunSet {
                    queued_reason: Some(Some(reason)),
                    ..RunSet::default()
                },
                steps: None,
            },
            Transition::RunPaused => Target::Run {
                set: RunSet {
                    status: Some(RunTo::Is(RunStatus::Paused)),
                    ..RunSet::default()
                },
                steps: None,
            },
            Transition::RunResumed => Target::Run {
                set: RunSet {
                    status: Some(RunTo::RunningUnlessFlow),
                    ..RunSet::default()
                },
                steps: None,
            },
            Transition::RunMigrated { definition, hash } => Target::Run {
                set: RunSet {
                    definition: Some((definition, hash)),
                    release_lease: true,
                    ..RunSet::default()
                },
                steps: None,
            },
            Transition::RunCompensating { error, steps, .. } => Target::Run {
                set: RunSet {
                    error: Some(Some(error)),
                    new_steps: Some(steps),
                    ..RunSet::default()
                },
                steps: None,
            },
            Transition::RunCancelCompensating { error, steps } => Target::Run {
                set: RunSet {
                    status: Some(RunTo::Is(RunStatus::Running)),
                    error: Some(Some(error)),
                    release_lease: true,
                    clear_cancel: true,
                    new_steps: Some(steps),
                    ..RunSet::default()
                },
                steps: Some(StepSet {
                    status: self.step_to(),
                    error: Some(Some(error)),
                    finished: Some(Stamp::Now),
                    ..StepSet::default()
                }),
            },
            Transition::RunDebounced {
                input,
                not_before_ms,
                reason,
            } => Target::Run {
                set: RunSet {
                    input: Some(input),
                    not_before: Some(not_before_ms),
                    queued_reason: Some(Some(reason)),
                    ..RunSet::default()
                },
                steps: None,
            },
            Transition::RunAsleep { wake_ms } => Target::Run {
                set: RunSet {
                    wake: Some(wake_ms),
                    ..RunSet::default()
                },
                steps: None,
            },
            Transition::RunAdmitted { at_ms } => Target::Run {
                set: RunSet {
                    status: Some(RunTo::Is(RunStatus::Running)),
                    queued_reason: Some(None),
                    admitted: Some(at_ms),
                    release_lease: true,
                    ..RunSet::default()
                },
                steps: None,
            },
        };
        let mut events = Vec::with_capacity(2);
        if let Some(log) = self.log() {
            events.push((STEP_LOG, log.clone()));
        }
        events.push((self.kind(), self.data()));
        let notice = match self {
            Transition::RunFinished { .. } | Transition::RunAbandoned { .. } => {
                Some(Notice::Finished)
            }
            Transition::RunReopened { .. }
            | Transition::RunAdmitted { .. }
            | Transition::RunResumed
            | Transition::RunMigrated { .. }
            | Transition::RunCancelCompensating { .. } => Some(Notice::Ready),
            _ => None,
        };
        Effects {
            target,
            guard: self.guard(),
            fenced: self.fenced(),
            admits: matches!(self, Transition::RunAdmitted { .. }),
            events,
            notice,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_step_start_resets_the_step_and_records_its_worker() {
        let input = json!({"x": 1});
        let effects = Transition::StepStarted {
            step_id: "a",
            attempt: 2,
            input: Some(&input),
        }
        .effects();
        let Target::Step { step_id, set } = effects.target else {
            panic!("a step move writes its step: {effects:?}");
        };
        assert_eq!(step_id, "a");
        assert_eq!(
            set,
            StepSet {
                status: Some(StepStatus::Running),
                attempts: Some(Attempts::Is(2)),
                input: Some(Some(&input)),
                output: Some(None),
                error: Some(None),
                started: Some(Stamp::Now),
                finished: Some(Stamp::Clear),
                worker_of: Some(2),
            }
        );
        assert_eq!(
            effects.guard.steps,
            [StepStatus::Pending, StepStatus::Running]
        );
        assert!(effects.fenced && !effects.admits && effects.notice.is_none());
        assert_eq!(
            effects.events,
            [("step.started", json!({"step": "a", "attempt": 2}))]
        );
    }

    #[test]
    fn a_retried_attempt_only_grows_the_count() {
        let effects = Transition::StepAttempt {
            step_id: "a",
            attempt: 3,
        }
        .effects();
        let Target::Step { set, .. } = effects.target else {
            panic!("{effects:?}")
        };
        assert_eq!(set.attempts, Some(Attempts::AtLeast(3)));
        assert_eq!(set.status, None, "the step stays as it is");
        assert_eq!(set.worker_of, Some(3));
    }

    #[test]
    fn a_finished_step_appends_its_log_before_its_own_event() {
        let log = json!([{"level": "info", "message": "hi"}]);
        let output = json!("out");
        let effects = Transition::StepFinished {
            step_id: "a",
            status: StepStatus::Succeeded,
            output: Some(&output),
            error: None,
            log: Some(&log),
        }
        .effects();
        let kinds: Vec<_> = effects.events.iter().map(|(kind, _)| *kind).collect();
        assert_eq!(kinds, ["step.log", "step.finished"]);
        assert_eq!(effects.events[0].1, log);
        let Target::Step { set, .. } = effects.target else {
            panic!("{effects:?}")
        };
        assert_eq!(set.output, Some(Some(&output)));
        assert_eq!(set.error, Some(None));
        assert_eq!(set.finished, Some(Stamp::Now));
        assert_eq!(set.started, None, "a step keeps its start");
    }

    #[test]
    fn ending_a_run_releases_it_and_tells_the_workers() {
        let failure = Failure::new("cancelled", "the run was cancelled");
        for end in [
            Transition::RunFinished {
                status: RunStatus::Failed,
                output: None,
                error: Some(&failure),
            },
            Transition::RunAbandoned {
                status: RunStatus::Cancelled,
                error: &failure,
            },
        ] {
            let effects = end.effects();
            assert_eq!(effects.notice, Some(Notice::Finished), "{}", end.name());
            let Target::Run { set, .. } = effects.target else {
                panic!("{effects:?}")
            };
            assert!(set.release_lease);
            assert_eq!(set.finished, Some(Stamp::Now));
            assert_eq!(set.error, Some(Some(&failure)));
        }
    }

    #[test]
    fn an_abandoned_run_cancels_its_unfinished_steps_with_it() {
        let failure = Failure::new("cancelled", "the run was cancelled");
        let effects = Transition::RunAbandoned {
            status: RunStatus::Cancelled,
            error: &failure,
        }
        .effects();
        assert!(!effects.fenced, "nothing drives an abandoned run");
        let Target::Run {
            steps: Some(steps), ..
        } = effects.target
        else {
            panic!("its steps move with it: {effects:?}")
        };
        assert_eq!(steps.status, Some(StepStatus::Cancelled));
        assert_eq!(steps.error, Some(Some(&failure)));
        assert_eq!(
            effects.guard.steps,
            [
                StepStatus::Pending,
                StepStatus::Running,
                StepStatus::Waiting
            ]
        );
    }

    #[test]
    fn a_reopened_run_is_queued_again_under_flow_control() {
        let effects = Transition::RunReopened { workflow: "w" }.effects();
        let Target::Run {
            set,
            steps: Some(steps),
        } = effects.target
        else {
            panic!("{effects:?}")
        };
        assert_eq!(set.status, Some(RunTo::RunningUnlessFlow));
        assert_eq!(set.finished, Some(Stamp::Clear));
        assert!(set.clear_cancel && set.release_lease);
        assert_eq!(steps.status, Some(StepStatus::Pending));
        assert_eq!(steps.finished, Some(Stamp::Clear));
        assert_eq!(effects.notice, Some(Notice::Ready));
        assert_eq!(
            effects.events,
            [("run.started", json!({"workflow": "w", "retry": true}))]
        );
    }

    #[test]
    fn only_an_admission_counts_the_flow_limits() {
        let admitted = Transition::RunAdmitted { at_ms: 5 }.effects();
        assert!(admitted.admits);
        let Target::Run { set, steps } = admitted.target else {
            panic!("{admitted:?}")
        };
        assert_eq!(set.admitted, Some(5));
        assert_eq!(set.queued_reason, Some(None));
        assert!(steps.is_none());
        let queued = Transition::RunQueued { reason: "busy" }.effects();
        assert!(!queued.admits && queued.notice.is_none());
        assert_eq!(
            queued.target,
            Target::Run {
                set: RunSet {
                    queued_reason: Some(Some("busy")),
                    ..RunSet::default()
                },
                steps: None,
            }
        );
    }
}
