//! Flow control of a workflow's runs: `concurrency`, `rate` and `priority`.
//!
//! A run of a workflow with `concurrency` or `rate` is stored `queued`, with
//! its keys, limits and priority evaluated on its input ([`FlowControl::of`]).
//! The admission pass ([`Workflows::admit`]) proposes queued runs to the store
//! in the order they are to be admitted (highest priority, then oldest); the
//! store admits one ([`Transition::RunAdmitted`]) only while its limits allow
//! it, counting every worker's runs. A run it refuses is told why it waits
//! ([`Transition::RunQueued`]). The admitter (`maintenance/admitter.rs`) runs
//! the pass whenever room may have been made.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::expr::{CompileError, Expr};
use super::{WorkflowError, Workflows};
use crate::domain::{Flow, FlowLimit, FlowUsage, RunRow, RunStatus, Transition, now_ms};
use crate::store::StoreError;

/// How many queued runs one pass reads at a time.
const PAGE: u32 = 1000;
/// How many pages one pass reads at most: a queue longer than this many
/// pages is taken up in later passes, as runs leave it.
const MAX_PAGES: u32 = 50;

/// A workflow's flow control, compiled.
#[derive(Debug, Clone)]
pub struct FlowControl {
    concurrency: Option<Limit>,
    rate: Option<Limit>,
    priority: Option<Expr>,
}

#[derive(Debug, Clone)]
struct Limit {
    key: Option<Expr>,
    limit: u32,
    period_ms: i64,
}

/// `concurrency` of a workflow, as a run stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConcurrencySpec {
    /// jq over the input; `None`: one limit for the whole workflow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub limit: u32,
}

/// `rate` of a workflow, as a run stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub limit: u32,
    pub period_ms: u64,
}

impl FlowControl {
    /// The flow control of a workflow's `concurrency`, `rate` and
    /// `priority`, if it has any; its jq compiled.
    ///
    /// # Errors
    /// Which expression does not compile, and why.
    pub fn compile(
        concurrency: Option<&ConcurrencySpec>,
        rate: Option<&RateSpec>,
        priority: Option<&str>,
    ) -> Result<Option<FlowControl>, String> {
        if concurrency.is_none() && rate.is_none() {
            return Ok(None);
        }
        let compile = |what: &str, source: Option<&str>| {
            source
                .map(Expr::compile)
                .transpose()
                .map_err(|e: CompileError| format!("`{what}`: {e}"))
        };
        Ok(Some(FlowControl {
            concurrency: match concurrency {
                Some(c) => Some(Limit {
                    key: compile("concurrency.key", c.key.as_deref())?,
                    limit: c.limit,
                    period_ms: 0,
                }),
                None => None,
            },
            rate: match rate {
                Some(r) => Some(Limit {
                    key: compile("rate.key", r.key.as_deref())?,
                    limit: r.limit,
                    period_ms: i64::try_from(r.period_ms).unwrap_or(i64::MAX),
                }),
                None => None,
            },
            priority: compile("priority", priority)?,
        }))
    }

    /// The limits of a run on `input`: its keys and its priority.
    ///
    /// # Errors
    /// Which expression failed on the input, and why: the start is refused.
    pub fn of(&self, input: &Value) -> Result<Flow, String> {
        let limit = |what: &str, limit: &Option<Limit>| -> Result<Option<FlowLimit>, String> {
            let Some(l) = limit else { return Ok(None) };
            Ok(Some(FlowLimit {
                key: key_of(what, l.key.as_ref(), input)?,
                limit: l.limit,
                period_ms: l.period_ms,
            }))
        };
        let priority = match &self.priority {
            None => 0,
            Some(expr) => match expr.eval(input) {
                Ok(Value::Number(n)) if n.as_i64().is_some() => n.as_i64().unwrap_or(0),
                // A field the input does not have: the default.
                Ok(Value::Null) => 0,
                Ok(other) => {
                    return Err(format!(
                        "`priority`: jq expression `{}` produced {other}, expected an integer",
                        expr.source()
                    ));
                }
                Err(e) => return Err(format!("`priority`: {e}")),
            },
        };
        Ok(Flow {
            concurrency: limit("concurrency.key", &self.concurrency)?,
            rate: limit("rate.key", &self.rate)?,
            priority,
        })
    }
}

/// A run's key (flow control's, debounce's): `expr` (`what` in the
/// config) over its input, a string as it is and anything else as its JSON
/// text; `""` without an expression (one key for the workflow).
///
/// # Errors
/// The expression's failure, naming `what`: the start is refused.
pub(super) fn key_of(what: &str, expr: Option<&Expr>, input: &Value) -> Result<String, String> {
    match expr.map(|expr| expr.eval(input)) {
        None => Ok(String::new()),
        Some(Ok(Value::String(key))) => Ok(key),
        Some(Ok(other)) => Ok(other.to_string()),
        Some(Err(e)) => Err(format!("`{what}`: {e}")),
    }
}

/// Why a run of `flow` waits, given what its limits use; `None` when they
/// would admit it.
pub(super) fn reason(flow: &Flow, usage: &FlowUsage) -> Option<String> {
    let key = |key: &str| {
        if key.is_empty() {
            String::new()
        } else {
            format!("key {} ", json!(key))
        }
    };
    if let Some(c) = &flow.concurrency
        && usage.running >= u64::from(c.limit)
    {
        return Some(format!(
            "concurrency: {}has {} of {} running",
            key(&c.key),
            usage.running,
            c.limit
        ));
    }
    if let Some(r) = &flow.rate
        && usage.admitted >= u64::from(r.limit)
    {
        let period = humantime::format_duration(Duration::from_millis(
            u64::try_from(r.period_ms).unwrap_or(0),
        ));
        return Some(format!(
            "rate: {}used {} of {} in {period}",
            key(&r.key),
            usage.admitted,
            r.limit
        ));
    }
    None
}

/// What `workflow.pause {workflow}` and `workflow.resume {workflow}` did.
#[derive(Debug, Clone, Serialize)]
pub struct WorkflowPause {
    pub workflow: String,
    /// Whether the workflow is paused now.
    pub paused: bool,
    /// Whether this call changed that (false: it was so already).
    pub changed: bool,
}

/// What one admission pass did.
#[derive(Debug, Default)]
pub(super) struct Pass {
    /// The runs admitted (now `running`).
    pub admitted: Vec<String>,
    /// When a rate window next lets a queued run in, or a debounced run's
    /// time comes (ms since the epoch).
    pub next_window_ms: Option<i64>,
}

impl Workflows {
    /// One admission pass: every queued run (up to [`PASS`]), best first,
    /// proposed to the store, which admits it only while its limits allow.
    /// Once a run of a key is refused, the rest of that key wait this pass,
    /// so a lower priority never overtakes a higher one. Alone, the admitted
    /// runs are driven here; shared, they are `running` and unclaimed, and
    /// the store told every worker's claimer.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read or written.
    pub(super) async fn admit(self: &Arc<Self>) -> Result<Pass, StoreError> {
        // One pass at a time in this process; other workers' passes are
        // serialised by the store.
        let _pass = self.admitting.lock().await;
        let mut pass = Pass::default();
        if self.tasks.is_closed() {
            return Ok(pass);
        }
        let mut per_workflow: std::collections::BTreeMap<String, i64> =
            self.names().into_iter().map(|name| (name, 0)).collect();
        // Keys that refused a run in this pass: (workflow, kind, key).
        let mut full: HashSet<(String, &'static str, String)> = HashSet::new();
        // What the limits of a refused run use, by workflow and keys: read
        // once a pass, however many runs of theirs wait.
        let mut used: HashMap<(String, Option<String>, Option<String>), FlowUsage> = HashMap::new();
        // The whole queue, a page at a time: runs of a full key ahead never
        // hide the runs of other keys behind them. Admitted runs leave the
        // queue, so the next page starts that many runs earlier.
        // Another worker may have paused or resumed a workflow.
        if self.store.shared() {
            self.read_paused_workflows().await?;
        }
        let paused = self.paused_workflows();
        let mut offset = 0;
        for _ in 0..MAX_PAGES {
            let queued = self.store.queued_runs(PAGE, offset).await?;
            let (read, admitted_before) = (queued.len(), pass.admitted.len());
            for mut run in queued {
                // Its workflow is paused: it waits for `workflow.resume`.
                if paused.contains(&run.workflow) {
                    *per_workflow.entry(run.workflow.clone()).or_default() += 1;
                    continue;
                }
                // A debounced run waits for later starts until its time.
                if let Some(at) = run
                    .debounce
                    .as_ref()
                    .map(|d| d.not_before_ms)
                    .filter(|&at| at > now_ms())
                {
                    pass.next_window_ms = Some(pass.next_window_ms.map_or(at, |n| n.min(at)));
                    continue;
                }
                let Some(flow) = run.flow.clone() else {
                    // Debounced, or of a workflow paused then: without flow
                    // control, nothing else holds it. (Refused: a start
                    // joined it just now, its workflow was paused, or
                    // another worker admitted it.)
                    self.propose(run, &mut pass).await?;
                    continue;
                };
                let keys = [("c", &flow.concurrency), ("r", &flow.rate)];
                let blocked = keys.iter().any(|(kind, limit)| {
                    limit.as_ref().is_some_and(|l| {
                        full.contains(&(run.workflow.clone(), *kind, l.key.clone()))
                    })
                });
                if !blocked {
                    match self.propose(run, &mut pass).await? {
                        None => continue,
                        Some(refused) => run = refused,
                    }
                }
                *per_workflow.entry(run.workflow.clone()).or_default() += 1;
                let group = (
                    run.workflow.clone(),
                    flow.concurrency.as_ref().map(|c| c.key.clone()),
                    flow.rate.as_ref().map(|r| r.key.clone()),
                );
                let usage = match used.get(&group) {
                    Some(usage) => *usage,
                    None => {
                        let usage = self
                            .store
                            .flow_usage(&run.workflow, &flow, now_ms())
                            .await?;
                        used.insert(group, usage);
                        usage
                    }
                };
                let Some(why) = reason(&flow, &usage) else {
                    // Offered and refused, yet there is room now (a run ended
                    // since): the next pass takes it. A run only held back
                    // behind a full key waits for that key.
                    if !blocked {
                        self.worker.queue.notify_one();
                    }
                    continue;
                };
                // Only the keys that are full hold back the runs behind.
                if let Some(c) = &flow.concurrency
                    && usage.running >= u64::from(c.limit)
                {
                    full.insert((run.workflow.clone(), "c", c.key.clone()));
                }
                if let Some(r) = &flow.rate
                    && usage.admitted >= u64::from(r.limit)
                {
                    full.insert((run.workflow.clone(), "r", r.key.clone()));
                }
                if flow
                    .rate
                    .as_ref()
                    .is_some_and(|r| usage.admitted >= u64::from(r.limit))
                    && let Some(at) = usage.window_frees_ms
                {
                    pass.next_window_ms = Some(pass.next_window_ms.map_or(at, |n| n.min(at)));
                }
                if run.queued_reason.as_deref() != Some(why.as_str()) {
                    let queued = Transition::RunQueued { reason: &why };
                    match self.events.apply(&run.run_id, &[queued], None).await {
                        Ok(_) | Err(StoreError::Refused(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            if read < PAGE as usize {
                break;
            }
            offset += u32::try_from(read - (pass.admitted.len() - admitted_before)).unwrap_or(PAGE);
        }
        for (workflow, count) in per_workflow {
            crate::metrics::metrics().runs_queued(&workflow, count);
        }
        if !pass.admitted.is_empty() {
            // Alone, they are driven by now: waiters on them look again.
            self.admissions.send_modify(|n| *n += 1);
        }
        Ok(pass)
    }

    /// Whether `workflow` is paused as a whole (as this process knows).
    pub(super) fn workflow_paused(&self, workflow: &str) -> bool {
        self.paused_workflows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(workflow)
    }

    /// The workflows paused as a whole.
    pub fn paused_workflows(&self) -> BTreeSet<String> {
        self.paused_workflows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads which workflows are paused from the store.
    pub(super) async fn read_paused_workflows(&self) -> Result<(), StoreError> {
        let paused: BTreeSet<String> = self.store.paused_workflows().await?.into_iter().collect();
        let before = std::mem::replace(
            &mut *self
                .paused_workflows
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
            paused.clone(),
        );
        for workflow in before.union(&paused) {
            crate::metrics::metrics().workflow_paused(workflow, paused.contains(workflow));
        }
        Ok(())
    }

    /// `workflow.pause {workflow}` (`paused`) and `workflow.resume
    /// {workflow}`: while a workflow is paused, its new runs (from any
    /// start) wait `queued`, none of its queued runs is admitted, and its
    /// schedules skip their ticks; its running runs go on. Resuming lets
    /// its queued runs in, as their flow control allows.
    ///
    /// # Errors
    /// [`WorkflowError::UnknownWorkflow`], [`WorkflowError::Store`].
    pub async fn pause_workflow(
        self: &Arc<Self>,
        workflow: &str,
        paused: bool,
    ) -> Result<WorkflowPause, WorkflowError> {
        if self.definition(workflow).is_none() {
            return Err(WorkflowError::unknown_workflow(workflow, self.names()));
        }
        let changed = self.store.pause_workflow(workflow, paused).await?;
        {
            let mut set = self
                .paused_workflows
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if paused {
                set.insert(workflow.to_owned());
            } else {
                set.remove(workflow);
            }
        }
        crate::metrics::metrics().workflow_paused(workflow, paused);
        tracing::info!(
            workflow,
            paused,
            changed,
            "workflow {}",
            if paused { "paused" } else { "resumed" }
        );
        if !paused {
            // Its queued runs may go in now.
            self.worker.queue.notify_one();
        }
        Ok(WorkflowPause {
            workflow: workflow.to_owned(),
            paused,
            changed,
        })
    }

    /// Proposes `run` to the store for admission now: admitted (and
    /// driven, alone) and counted in `pass`, or refused by the store and
    /// given back.
    async fn propose(
        self: &Arc<Self>,
        run: RunRow,
        pass: &mut Pass,
    ) -> Result<Option<RunRow>, StoreError> {
        let now = now_ms();
        let admit = Transition::RunAdmitted { at_ms: now };
        match self.events.apply(&run.run_id, &[admit], None).await {
            Ok(_) => {
                pass.admitted.push(run.run_id.clone());
                self.admitted(run, now).await;
                Ok(None)
            }
            Err(StoreError::Refused(_)) => Ok(Some(run)),
            Err(e) => Err(e),
        }
    }

    /// A run this pass admitted, as the store now holds it.
    async fn admitted(self: &Arc<Self>, mut run: RunRow, at_ms: i64) {
        tracing::debug!(run = %run.run_id, workflow = %run.workflow, "run admitted");
        run.status = RunStatus::Running;
        run.admitted_ms = Some(at_ms);
        run.queued_reason = None;
        self.mode.admitted(self, run).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(key: Option<&str>, priority: Option<&str>) -> FlowControl {
        let concurrency = ConcurrencySpec {
            key: key.map(str::to_owned),
            limit: 2,
        };
        let rate = RateSpec {
            key: None,
            limit: 3,
            period_ms: 60_000,
        };
        FlowControl::compile(Some(&concurrency), Some(&rate), priority)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn a_key_is_a_string_as_it_is_and_anything_else_its_json() {
        let flow = control(Some(".customer"), None);
        let key = |input: Value| flow.of(&input).unwrap().concurrency.unwrap().key;
        assert_eq!(key(json!({"customer": "acme"})), "acme");
        assert_eq!(key(json!({"customer": 7})), "7");
        assert_eq!(key(json!({"customer": {"id": 1}})), r#"{"id":1}"#);
        assert_eq!(key(json!({})), "null");
        let global = control(None, None).of(&json!({})).unwrap();
        assert_eq!(global.rate.unwrap().key, "");
        assert_eq!(global.priority, 0);
    }

    #[test]
    fn a_key_or_priority_that_fails_refuses_the_start() {
        let flow = control(Some(".customer | error(\"no\")"), None);
        let e = flow.of(&json!({"customer": "a"})).unwrap_err();
        assert!(e.starts_with("`concurrency.key`: "), "{e}");
        let flow = control(None, Some(".tier"));
        assert_eq!(flow.of(&json!({"tier": 5})).unwrap().priority, 5);
        assert_eq!(flow.of(&json!({})).unwrap().priority, 0);
        let e = flow.of(&json!({"tier": "gold"})).unwrap_err();
        assert!(e.contains("expected an integer"), "{e}");
    }

    #[test]
    fn a_reason_says_which_limit_is_full() {
        let flow = control(Some(".c"), None).of(&json!({"c": "acme"})).unwrap();
        let usage = |running, admitted| FlowUsage {
            running,
            admitted,
            window_frees_ms: None,
        };
        assert_eq!(reason(&flow, &usage(1, 2)), None);
        assert_eq!(
            reason(&flow, &usage(2, 0)).unwrap(),
            "concurrency: key \"acme\" has 2 of 2 running"
        );
        assert_eq!(
            reason(&flow, &usage(0, 3)).unwrap(),
            "rate: used 3 of 3 in 1m"
        );
    }
}
