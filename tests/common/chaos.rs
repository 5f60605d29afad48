//! What the chaos tests share: the random schedule of their faults, a
//! steady load of keyed starts that follows the hosts as they restart, and
//! the journal's promise checked on a witness file (every call a fixture
//! server received, with the idempotency key the host gave it and the host
//! process that made it, `ppid`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The random numbers of a chaos test: seeded from `CHAOS_SEED` when set,
/// else at random, the seed printed so that a failure can be played again.
pub fn seeded_rng() -> fastrand::Rng {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("chaos seed {seed} (CHAOS_SEED={seed} plays these faults again)");
    fastrand::Rng::with_seed(seed)
}

/// Starts a run of `workflow` with input `{n}` and idempotency key
/// `<workflow>-<n>` at the JSON-RPC endpoint `rpc`; its id, or `None` when
/// nothing is known (the host died under it, or refused it), so that it is
/// to be sent again with the same key.
pub async fn start_keyed(rpc: &str, workflow: &str, n: u64) -> Option<String> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "workflow.start",
        "params": {"workflow": workflow, "input": {"n": n}, "idempotency_key": format!("{workflow}-{n}")}});
    let reply: Value = super::http_client()
        .post(rpc)
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(5))
        .body(body.to_string())
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    reply["result"]["run_id"].as_str().map(str::to_owned)
}

/// The starts a load made: those answered with their run, and the numbers
/// of those that went unanswered.
type Started = (Vec<(u64, String)>, Vec<u64>);

/// A start every 30 ms of `workflow` ([`start_keyed`]), through each of the
/// endpoints in turn; [`Load::set`] follows a host that restarted elsewhere.
pub struct Load {
    workflow: &'static str,
    endpoints: Arc<Mutex<Vec<String>>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Started>,
}

impl Load {
    pub fn start(workflow: &'static str, endpoints: Vec<String>) -> Load {
        let endpoints = Arc::new(Mutex::new(endpoints));
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (endpoints, stop) = (endpoints.clone(), stop.clone());
            async move {
                let (mut accepted, mut unknown) = (Vec::new(), Vec::new());
                let mut n = 0u64;
                while !stop.is_cancelled() {
                    let rpc = {
                        let endpoints = endpoints.lock().unwrap();
                        endpoints[n as usize % endpoints.len()].clone()
                    };
                    match start_keyed(&rpc, workflow, n).await {
                        Some(run_id) => accepted.push((n, run_id)),
                        None => unknown.push(n),
                    }
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                (accepted, unknown)
            }
        });
        Load {
            workflow,
            endpoints,
            stop,
            task,
        }
    }

    /// Endpoint `i` is now `rpc`.
    pub fn set(&self, i: usize, rpc: String) {
        self.endpoints.lock().unwrap()[i] = rpc;
    }

    /// Stops the load and sends every start that went unanswered again,
    /// with its key, to `rpc`: it either made its run before the fault (and
    /// gets that run) or makes it now. Every start and its run, which are
    /// more than 100.
    pub async fn finish(self, rpc: &str) -> Vec<(u64, String)> {
        self.stop.cancel();
        let (mut accepted, unknown) = self.task.await.unwrap();
        for n in unknown {
            let deadline = Instant::now() + Duration::from_secs(60);
            let run_id = loop {
                if let Some(run_id) = start_keyed(rpc, self.workflow, n).await {
                    break run_id;
                }
                assert!(Instant::now() < deadline, "start {n} is never answered");
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            accepted.push((n, run_id));
        }
        assert!(accepted.len() > 100, "too little load: {}", accepted.len());
        accepted
    }
}

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
