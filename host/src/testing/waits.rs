//! What a durable node's waits get in a component test: a case has no run
//! to signal and no workflows to start, so it says what each wait answers.
//! A sleep is over at once; a wait for a signal gets the case's payload of
//! that name (`signals`), or fails `timeout` when the case sends none; a
//! child run gets the case's `workflows` answer of that name.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::capability::{
    CallJournal, CapabilityError, JournalEntry, RUN_WORKFLOW, Replayed, SLEEP, WAIT_SIGNAL,
};

/// What a case's child run of one workflow ends with: give exactly one.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildAnswer {
    /// The child succeeded with this output.
    pub output: Option<Value>,
    /// The child failed with this error.
    pub error: Option<ChildError>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildError {
    pub code: String,
    #[serde(default)]
    pub message: String,
}

/// The journal of a case's node run: it records nothing and answers only
/// the node's waits, from the case.
pub(super) struct CaseWaits {
    pub(super) signals: BTreeMap<String, Value>,
    pub(super) workflows: BTreeMap<String, ChildAnswer>,
}

/// The run id a case's child runs answer with.
const CHILD_RUN_ID: &str = "case-child";

#[async_trait]
impl CallJournal for CaseWaits {
    fn key_prefix(&self) -> &str {
        "case/node/0"
    }

    async fn record(&self, _entry: JournalEntry) {}

    fn replayed(&self, _seq: u32, name: &str, arguments: &Value) -> Option<Replayed> {
        let result = match name {
            SLEEP => Ok(json!({"until_ms": 0})),
            WAIT_SIGNAL => {
                let signal = arguments["signal"].as_str().unwrap_or_default();
                match self.signals.get(signal) {
                    Some(payload) => Ok(json!({ "payload": payload })),
                    None => Err(CapabilityError::Timeout(format!(
                        "the case sends no `{signal}` signal (give its payload under `[signals]`)"
                    ))),
                }
            }
            RUN_WORKFLOW => {
                let workflow = arguments["workflow"].as_str().unwrap_or_default();
                Ok(match self.workflows.get(workflow) {
                    Some(ChildAnswer {
                        output: Some(output),
                        ..
                    }) => json!({"run_id": CHILD_RUN_ID, "output": output}),
                    Some(ChildAnswer {
                        error: Some(error), ..
                    }) => json!({"run_id": CHILD_RUN_ID,
                                 "error": {"code": error.code, "message": error.message}}),
                    _ => json!({"run_id": null, "error": {
                        "code": "unknown-workflow",
                        "message": format!("the case has no answer for a run of `{workflow}` (give it under `[workflows.{workflow}]`)"),
                    }}),
                })
            }
            _ => return None,
        };
        Some(Replayed {
            result,
            record: None,
        })
    }
}
