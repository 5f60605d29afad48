//! Runs as callers see and move them: every call checks the caller's scope
//! for the run's workflow, then calls the workflows.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::ApiError;
use crate::capability::Answer;
use crate::domain::{ListQuery, WaitingStep};
use crate::tokens::{Caller, RunScope};
use crate::trace::TraceParent;
use crate::workflow::signal::Signalled;
use crate::workflow::{RunRecord, WorkflowError, Workflows};

/// Pages of runs [`Runs::list`] reads for a token that sees only some
/// workflows, to fill one answer.
const MAX_FILTERED_PAGES: usize = 20;

/// A run to start.
pub struct Start<'a> {
    pub workflow: &'a str,
    pub input: Value,
    pub idempotency_key: Option<String>,
    /// What the run records as what started it; the caller's named token
    /// when `None`.
    pub trigger: Option<Value>,
    /// Waits at most this long for the run to finish, and answers with the
    /// run without its steps.
    pub wait: Option<Duration>,
    /// The caller's trace, which the run continues.
    pub parent: &'a TraceParent,
}

impl<'a> Start<'a> {
    /// A run of `workflow` on `input`, recorded as the caller's, answered at
    /// once.
    pub fn new(workflow: &'a str, input: Value, parent: &'a TraceParent) -> Start<'a> {
        Start {
            workflow,
            input,
            idempotency_key: None,
            trigger: None,
            wait: None,
            parent,
        }
    }
}

/// The runs of one server, as callers may see and move them.
#[derive(Clone, Copy)]
pub struct Runs<'a> {
    workflows: &'a Arc<Workflows>,
}

impl<'a> Runs<'a> {
    pub fn of(workflows: &'a Arc<Workflows>) -> Runs<'a> {
        Runs { workflows }
    }

    /// Checks that `caller` may `scope` runs of `workflow`.
    ///
    /// # Errors
    /// [`ApiError::Denied`], saying which scope the token lacks.
    pub fn may_workflow(caller: &Caller, scope: RunScope, workflow: &str) -> Result<(), ApiError> {
        match caller.refusal(scope, workflow) {
            Some(refusal) => Err(ApiError::Denied(refusal)),
            None => Ok(()),
        }
    }

    /// The workflow of `run_id`, when `caller` may `scope` its runs.
    ///
    /// # Errors
    /// [`ApiError::Denied`]; [`WorkflowError::UnknownRun`],
    /// [`WorkflowError::Store`].
    pub async fn owner(
        &self,
        caller: &Caller,
        scope: RunScope,
        run_id: &str,
    ) -> Result<String, ApiError> {
        let workflow = self.workflows.workflow_of(run_id).await?;
        Self::may_workflow(caller, scope, &workflow)?;
        Ok(workflow)
    }

    /// Checks that `caller` may `scope` the run `run_id` (by its workflow);
    /// a run that does not exist is left to the call to report.
    ///
    /// # Errors
    /// [`ApiError::Denied`]; [`ApiError::Workflow`] when the store cannot
    /// say.
    pub async fn may(
        &self,
        caller: &Caller,
        scope: RunScope,
        run_id: &str,
    ) -> Result<(), ApiError> {
        if caller.is_unlimited() {
            return Ok(());
        }
        match self.owner(caller, scope, run_id).await {
            Err(ApiError::Workflow(WorkflowError::UnknownRun(_))) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Starts a run (or finds the one its idempotency key started).
    ///
    /// # Errors
    /// [`ApiError::Denied`] without the `start` scope; as
    /// [`Workflows::start_by`].
    pub async fn start(&self, caller: &Caller, start: Start<'_>) -> Result<RunRecord, ApiError> {
        Self::may_workflow(caller, RunScope::Start, start.workflow)?;
        let record = self
            .workflows
            .start_by(
                start.workflow,
                start.input,
                start.idempotency_key,
                start.trigger.or_else(|| caller.trigger()),
                start.parent,
            )
            .await?;
        Ok(match start.wait {
            Some(timeout) => self.workflows.wait_run(&record.run_id, timeout).await?,
            None => record,
        })
    }

    /// The record of `run_id` with its steps; their calls when `calls`, their
    /// log lines when `logs`.
    ///
    /// # Errors
    /// [`ApiError::Denied`]; as [`Workflows::get`].
    pub async fn get(
        &self,
        caller: &Caller,
        run_id: &str,
        calls: bool,
        logs: bool,
    ) -> Result<RunRecord, ApiError> {
        self.may(caller, RunScope::Read, run_id).await?;
        let mut record = self.workflows.get(run_id, calls).await?;
        if logs {
            let mut logs: HashMap<_, _> = self.workflows.logs(run_id).await?;
            for step in record.steps.iter_mut().flatten() {
                step.logs = Some(logs.remove(&step.id).unwrap_or_default());
            }
        }
        Ok(record)
    }

    /// Waits until `run_id` has finished or `timeout` passes.
    ///
    /// # Errors
    /// [`ApiError::Denied`]; as [`Workflows::wait`].
    pub async fn wait(
        &self,
        caller: &Caller,
        run_id: &str,
        timeout: Duration,
    ) -> Result<RunRecord, ApiError> {
        self.may(caller, RunScope::Read, run_id).await?;
        Ok(self.workflows.wait(run_id, timeout).await?)
    }

    /// Cancels `run_id`.
    ///
    /// # Errors
    /// [`ApiError::Denied`] without the `cancel` scope; as
    /// [`Workflows::cancel`].
    pub async fn cancel(&self, caller: &Caller, run_id: &str) -> Result<RunRecord, ApiError> {
        self.may(caller, RunScope::Cancel, run_id).await?;
        Ok(self.workflows.cancel(run_id).await?)
    }

    /// Runs a failed or cancelled run again from its unfinished steps.
    ///
    /// # Errors
    /// [`ApiError::Denied`] without the `cancel` scope; as
    /// [`Workflows::retry`].
    pub async fn retry(&self, caller: &Caller, run_id: &str) -> Result<RunRecord, ApiError> {
        self.may(caller, RunScope::Cancel, run_id).await?;
        Ok(self.workflows.retry(run_id).await?)
    }

    /// Pauses `run_id` (the `cancel` scope: it stops a run's progress).
    ///
    /// # Errors
    /// [`ApiError::Denied`] without the `cancel` scope; as
    /// [`Workflows::pause_run`].
    pub async fn pause(&self, caller: &Caller, run_id: &str) -> Result<RunRecord, ApiError> {
        self.may(caller, RunScope::Cancel, run_id).await?;
        Ok(self.workflows.pause_run(run_id).await?)
    }

    /// Resumes a paused run.
    ///
    /// # Errors
    /// [`ApiError::Denied`] without the `cancel` scope; as
    /// [`Workflows::resume_run`].
    pub async fn resume(&self, caller: &Caller, run_id: &str) -> Result<RunRecord, ApiError> {
        self.may(caller, RunScope::Cancel, run_id).await?;
        Ok(self.workflows.resume_run(run_id).await?)
    }

    /// Pauses or resumes a whole workflow (the `cancel` scope on it).
    ///
    /// # Errors
    /// [`ApiError::Denied`] without the `cancel` scope; as
    /// [`Workflows::pause_workflow`].
    pub async fn pause_workflow(
        &self,
        caller: &Caller,
        workflow: &str,
        paused: bool,
    ) -> Result<crate::workflow::WorkflowPause, ApiError> {
        Self::may_workflow(caller, RunScope::Cancel, workflow)?;
        Ok(self.workflows.pause_workflow(workflow, paused).await?)
    }

    /// Moves an unfinished run to its workflow's definition in force (the
    /// `cancel` scope: it changes what a run does).
    ///
    /// # Errors
    /// [`ApiError::Denied`] without the `cancel` scope; as
    /// [`Workflows::migrate`].
    pub async fn migrate(&self, caller: &Caller, run_id: &str) -> Result<RunRecord, ApiError> {
        self.may(caller, RunScope::Cancel, run_id).await?;
        Ok(self.workflows.migrate(run_id).await?)
    }

    /// Sends `signal` with `payload` to `run_id`.
    ///
    /// # Errors
    /// [`ApiError::Denied`] without the `signal` scope; as
    /// [`Workflows::signal`].
    pub async fn signal(
        &self,
        caller: &Caller,
        run_id: &str,
        signal: &str,
        payload: Value,
    ) -> Result<Signalled, ApiError> {
        self.may(caller, RunScope::Signal, run_id).await?;
        Ok(self.workflows.signal(run_id, signal, payload).await?)
    }

    /// Answers the question an upstream server asked `run_id`'s step.
    ///
    /// # Errors
    /// [`ApiError::Denied`] without the `signal` scope; as
    /// [`Workflows::answer`].
    pub async fn answer(
        &self,
        caller: &Caller,
        run_id: &str,
        step_id: &str,
        item: u32,
        answer: Answer,
    ) -> Result<Signalled, ApiError> {
        self.may(caller, RunScope::Signal, run_id).await?;
        Ok(self.workflows.answer(run_id, step_id, item, answer).await?)
    }

    /// Steps that wait for a signal or an answer, of the workflows the
    /// caller may read.
    ///
    /// # Errors
    /// As [`Workflows::waiting_steps`].
    pub async fn waiting(&self, caller: &Caller, limit: u32) -> Result<Vec<WaitingStep>, ApiError> {
        let mut steps = self.workflows.waiting_steps(limit).await?;
        steps.retain(|s| caller.may(RunScope::Read, &s.workflow));
        Ok(steps)
    }

    /// A page of runs the caller may read, and the cursor of the next.
    ///
    /// # Errors
    /// [`ApiError::Denied`] for a workflow the caller may not read; as
    /// [`Workflows::list`].
    pub async fn list(
        &self,
        caller: &Caller,
        mut query: ListQuery,
    ) -> Result<(Vec<RunRecord>, Option<String>), ApiError> {
        if let Some(workflow) = &query.workflow {
            Self::may_workflow(caller, RunScope::Read, workflow)?;
        }
        let (mut runs, mut next) = self.workflows.list(&query).await?;
        if caller.is_unlimited() {
            return Ok((runs, next));
        }
        // The runs of other workflows are left out; further pages fill the
        // answer, a bounded number of them.
        let limit = query.limit as usize;
        runs.retain(|r| caller.may(RunScope::Read, &r.workflow));
        for _ in 0..MAX_FILTERED_PAGES {
            let Some(cursor) = next.take().filter(|_| runs.len() < limit) else {
                break;
            };
            query.cursor = Some(cursor);
            // No more than would fill the answer: the cursor then follows the
            // last run read.
            query.limit = u32::try_from(limit - runs.len()).unwrap_or(1);
            let (more, after) = self.workflows.list(&query).await?;
            runs.extend(
                more.into_iter()
                    .filter(|r| caller.may(RunScope::Read, &r.workflow)),
            );
            next = after;
        }
        Ok((runs, next))
    }
}
