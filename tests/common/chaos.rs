//! The journal's promise, checked on a witness file: every call a fixture
//! server received, with the idempotency key the host gave it and the host
//! process that made it (`ppid`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// Checks the calls on `witness` against `attempts` (per `<run>/<step>`, how
/// many attempts the step was given): every step in `attempts` made its
/// call, no step made more calls than it had attempts, no process made a
/// step's call twice, and no call belongs to a step `attempts` lacks. Steps
/// `calls_nothing` names are left out. Returns how many calls were made
/// again (by a later process).
pub fn assert_calls_repeat_only_across_processes(
    witness: &[Value],
    attempts: &BTreeMap<String, u64>,
    calls_nothing: impl Fn(&str) -> bool,
) -> usize {
    let mut made: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for call in witness {
        let key = call["meta"]["wf-host/idempotency-key"].as_str().unwrap();
        // `<run_id>/<step>/<item>/<seq>`
        let step = key.rsplitn(3, '/').nth(2).unwrap();
        made.entry(step.to_owned())
            .or_default()
            .push(call["ppid"].as_i64().unwrap());
    }
    let mut repeated = 0;
    for (step, tried) in attempts {
        if calls_nothing(step) {
            continue;
        }
        let by = made.get(step).cloned().unwrap_or_default();
        assert!(!by.is_empty(), "{step} never called its server");
        assert!(
            by.len() as u64 <= *tried,
            "{step}: {} calls in {tried} attempts",
            by.len()
        );
        // A process that died before the call was written down may show as
        // reparented (ppid 1): those cannot be told apart.
        let processes: BTreeSet<_> = by.iter().collect();
        assert!(
            processes.len() == by.len() || by.contains(&1),
            "{step}: one process made its call twice: {by:?}"
        );
        repeated += by.len() - 1;
    }
    assert!(
        made.keys().all(|k| attempts.contains_key(k)),
        "calls of steps no run has"
    );
    repeated
}
