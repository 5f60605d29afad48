//! The `wf:node/durable` interface: waits that outlive the node's instance.
//!
//! A wait is a step of the node's journal like a call: it takes the next
//! sequence number, and a node that runs again is answered from the journal.
//! A sleep keeps its wake time there before the node lets go, so a host that
//! restarts wakes it on time; a signal's payload is journaled when the node
//! runs again with it. Where there is no journal (`wf-host run`, `wf-host
//! test`), a sleep sleeps in place and a wait for a signal is unavailable.

use std::time::Duration;

use serde_json::{Value, json};

use super::{CapabilityCtx, CapabilityError, Parks, Replayed};
use crate::bindings::wf::node::durable as wit;

/// The journal name of a sleep.
pub const SLEEP: &str = "wf:sleep";
/// The journal name of a wait for a signal.
pub const WAIT_SIGNAL: &str = "wf:wait-signal";
/// The journal name of a child run.
pub const RUN_WORKFLOW: &str = "wf:run-workflow";

/// What a parked node waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// Until this time, in milliseconds since the Unix epoch.
    Sleep { until_ms: u64 },
    /// The signal `name`, for at most `timeout`.
    Signal {
        name: String,
        timeout: Option<Duration>,
    },
    /// A child run of `workflow` on `input`, to its end. Its answer is
    /// `{"run_id", "output"}` or `{"run_id"?, "error": {"code", "message"}}`.
    /// (A signal's is `{"payload"}`.)
    Child { workflow: String, input: Value },
}

/// A child run's answer that is not an output.
fn child_error(run_id: Option<&str>, code: &str, message: String) -> Value {
    json!({"run_id": run_id, "error": {"code": code, "message": message}})
}

/// Milliseconds since the Unix epoch, now.
fn now_ms() -> u64 {
    u64::try_from(crate::domain::now_ms()).unwrap_or(0)
}

impl CapabilityCtx {
    /// The answer of wait `seq` when the journal has it (journaling it
    /// now if it was not yet).
    async fn replayed_wait(
        &self,
        seq: u32,
        name: &str,
        arguments: &Value,
    ) -> Option<Result<Value, CapabilityError>> {
        let journal = self.journal.as_ref()?;
        let Replayed { result, record } = journal.replayed(seq, name, arguments)?;
        if let Some(duration) = record {
            self.record_entry(seq, name, arguments.clone(), &result, duration)
                .await;
        }
        Some(result)
    }

    /// Lets go of the node until `wait` is over; never returns when it
    /// does. `Ok` when the journal cannot (no workflow step): the caller
    /// waits in place, or fails.
    async fn park(
        &self,
        seq: u32,
        name: &str,
        arguments: &Value,
        wait: Wait,
    ) -> wasmtime::Result<()> {
        let Some(journal) = &self.journal else {
            return Ok(());
        };
        match journal.park(seq, name, arguments, wait) {
            Parks::Yes => std::future::pending().await,
            Parks::Unsupported => Ok(()),
            Parks::TooBig(why) => Err(wasmtime::Error::msg(why)),
        }
    }

    /// `sleep`: the wake time is journaled first, then the node lets go.
    async fn sleep(&self, ms: u64) -> wasmtime::Result<()> {
        if self.journal.is_none() {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            return Ok(());
        }
        let seq = self.next_seq();
        let arguments = json!({ "ms": ms });
        let until_ms = match self.replayed_wait(seq, SLEEP, &arguments).await {
            Some(answer) => answer
                .ok()
                .and_then(|a| a["until_ms"].as_u64())
                .unwrap_or_default(),
            None => {
                let until_ms = now_ms().saturating_add(ms);
                let result = Ok(json!({ "until_ms": until_ms }));
                self.record_entry(seq, SLEEP, arguments.clone(), &result, Duration::ZERO)
                    .await;
                until_ms
            }
        };
        let left = until_ms.saturating_sub(now_ms());
        if left == 0 {
            return Ok(());
        }
        self.park(seq, SLEEP, &arguments, Wait::Sleep { until_ms })
            .await?;
        tokio::time::sleep(Duration::from_millis(left)).await;
        Ok(())
    }

    /// `wait-signal`: the node lets go until the signal (or the timeout)
    /// comes, and runs again answered with it. The wait is journaled as
    /// pending before the node lets go, so a host that takes the run over
    /// after a crash goes on from the journal up to it.
    async fn wait_signal(
        &self,
        name: &str,
        timeout_ms: Option<u64>,
    ) -> wasmtime::Result<Result<Value, CapabilityError>> {
        if self.journal.is_none() {
            return Ok(Err(CapabilityError::Unavailable(format!(
                "there is no run to send signal `{name}` to: `wait-signal` waits in a workflow step (`wf-host serve`), not in `wf-host run` or `wf-host test`"
            ))));
        }
        let seq = self.next_seq();
        let arguments = json!({ "signal": name, "timeout_ms": timeout_ms });
        match self.replayed_wait(seq, WAIT_SIGNAL, &arguments).await {
            Some(Ok(answer)) if !is_pending(&answer) => return Ok(Ok(answer["payload"].clone())),
            Some(Err(e)) => return Ok(Err(e)),
            Some(Ok(_)) => {}
            None => self.record_pending(seq, WAIT_SIGNAL, &arguments).await,
        }
        let wait = Wait::Signal {
            name: name.to_owned(),
            timeout: timeout_ms.map(Duration::from_millis),
        };
        self.park(seq, WAIT_SIGNAL, &arguments, wait).await?;
        Ok(Err(CapabilityError::Unavailable(
            "this step cannot let go of its node to wait for a signal".into(),
        )))
    }

    /// Journals wait `seq` as begun but not answered ([`PENDING`]).
    async fn record_pending(&self, seq: u32, name: &str, arguments: &Value) {
        let pending = Ok(json!({ PENDING: true }));
        self.record_entry(seq, name, arguments.clone(), &pending, Duration::ZERO)
            .await;
    }
}

/// The journal's answer of a wait that has begun and has no answer yet: a
/// run of the node that gets it waits again.
pub const PENDING: &str = "pending";

/// Whether a wait's journaled answer is [`PENDING`].
pub fn is_pending(answer: &Value) -> bool {
    answer.get(PENDING) == Some(&Value::Bool(true))
}

impl CapabilityCtx {
    /// `run-workflow`: the node lets go until its child run ends, and runs
    /// again answered with the child's output or error. The answer (either)
    /// is journaled as the wait's result.
    async fn run_workflow(&self, name: &str, input: &str) -> wasmtime::Result<Value> {
        let grant = format!("workflow.{name}");
        if !self.grants.allows(&grant) {
            return Ok(child_error(None, "denied", self.grants.denial(&grant)));
        }
        let input: Value = match serde_json::from_str(if input.is_empty() { "null" } else { input })
        {
            Ok(input) => input,
            Err(e) => {
                return Ok(child_error(
                    None,
                    "invalid-input",
                    format!("the child's input is not JSON: {e}"),
                ));
            }
        };
        if self.journal.is_none() {
            return Ok(child_error(
                None,
                "unavailable",
                format!(
                    "there is no run to be the parent of a run of `{name}`: `run-workflow` runs a child in a workflow step (`wf-host serve`), not in `wf-host run` or `wf-host test`"
                ),
            ));
        }
        let seq = self.next_seq();
        let arguments = json!({ "workflow": name, "input": input });
        match self.replayed_wait(seq, RUN_WORKFLOW, &arguments).await {
            Some(Ok(answer)) if !is_pending(&answer) => return Ok(answer),
            Some(Err(e)) => return Ok(child_error(None, e.code(), e.message().to_owned())),
            Some(Ok(_)) => {}
            None => self.record_pending(seq, RUN_WORKFLOW, &arguments).await,
        }
        let wait = Wait::Child {
            workflow: name.to_owned(),
            input,
        };
        self.park(seq, RUN_WORKFLOW, &arguments, wait).await?;
        Ok(child_error(
            None,
            "unavailable",
            "this step cannot let go of its node to wait for a child run".into(),
        ))
    }
}

impl wit::Host for CapabilityCtx {
    async fn run_workflow(
        &mut self,
        name: String,
        input: String,
    ) -> wasmtime::Result<Result<String, wit::RunError>> {
        tracing::debug!(run = %self.run_id, node = %self.node, workflow = %name, "run-workflow");
        let answer = CapabilityCtx::run_workflow(self, &name, &input).await?;
        let run_id = answer["run_id"].as_str().map(str::to_owned);
        Ok(match answer.get("output") {
            Some(output) => Ok(output.to_string()),
            None => Err(wit::RunError {
                run_id,
                code: answer["error"]["code"]
                    .as_str()
                    .unwrap_or("unavailable")
                    .to_owned(),
                message: answer["error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            }),
        })
    }

    async fn sleep(&mut self, ms: u64) -> wasmtime::Result<()> {
        tracing::debug!(run = %self.run_id, node = %self.node, ms, "sleep");
        CapabilityCtx::sleep(self, ms).await
    }

    async fn wait_signal(
        &mut self,
        name: String,
        timeout_ms: Option<u64>,
    ) -> wasmtime::Result<Result<String, wit::WaitError>> {
        tracing::debug!(run = %self.run_id, node = %self.node, signal = %name, "wait-signal");
        Ok(CapabilityCtx::wait_signal(self, &name, timeout_ms)
            .await?
            .map(|payload| payload.to_string())
            .map_err(|e| match e {
                CapabilityError::Timeout(m) => wit::WaitError::Timeout(m),
                other => wit::WaitError::Unavailable(other.message().to_owned()),
            }))
    }
}
