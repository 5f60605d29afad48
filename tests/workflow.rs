//! Multi-step workflows: definitions, data passing with jq, retries, and
//! durable runs that survive a SIGKILL. Real components built from source,
//! the fixture MCP server as a real child process, real SQLite files.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wf_host::config::Config;
use wf_host::host::{HostError, HostOptions};
use wf_host::pool::{Pool, PoolConfig};
use wf_host::runtime::RuntimeConfig;
use wf_host::store::{RunStatus, StepStatus};
use wf_host::workflow::{Options, RunRecord, WorkflowError, Workflows};

use common::fixture::HttpFixture;
use common::*;

/// Config text with `{echo}`, `{call}`, `{flaky}` and `{witness}` filled in, and
/// the fixture connection (which appends every call to `witness.jsonl`).
fn config_text(dir: &Path, body: &str) -> String {
    let root = repo_root();
    let head = format!(
        r#"[connections.fixture]
command = "wf-host"
args = ["fixture-server"]
env = {{ WF_FIXTURE_WITNESS = "{witness}" }}

"#,
        witness = dir.join("witness.jsonl").display()
    );
    (head + body)
        .replace(
            "{echo}",
            &root.join("plugins/echo.wasm").display().to_string(),
        )
        .replace(
            "{call}",
            &root.join("plugins/call.wasm").display().to_string(),
        )
        .replace("{flaky}", &guest("flaky").display().to_string())
        .replace("{durable}", &guest("durable").display().to_string())
        .replace(
            "{py-durable}",
            &root.join("plugins/py-durable.wasm").display().to_string(),
        )
        .replace(
            "{js-durable}",
            &root.join("plugins/js-durable.wasm").display().to_string(),
        )
        .replace(
            "{approval}",
            &root.join("plugins/approval.wasm").display().to_string(),
        )
        .replace(
            "{call-0.1.0}",
            &root
                .join("tests/compat/call-0.1.0.wasm")
                .display()
                .to_string(),
        )
}

/// Workflows over a fixture pool, in process: a [`wf_host::host::Host`]
/// with its config in a temp dir.
struct Host {
    host: wf_host::host::Host,
    workflows: Arc<Workflows>,
    pool: Pool,
    dir: tempfile::TempDir,
}

impl Host {
    async fn open(body: &str, options: Options) -> Result<Host, WorkflowError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wf.toml");
        let text = config_text(dir.path(), body);
        std::fs::write(&path, &text).unwrap();
        let config = Config::parse(&text, &path, dir.path().to_owned()).expect("config parses");
        let options = HostOptions {
            pool: PoolConfig {
                connections: config.connections.clone(),
                self_exe: Some(wf_host_bin()),
                ..Default::default()
            },
            runtime: RuntimeConfig {
                cache_dir: Some(dir.path().join("cache")),
                ..Default::default()
            },
            workflows: options,
        };
        let host = match wf_host::host::Host::open(&config, options).await {
            Ok(host) => host,
            Err(HostError::Workflows(e)) => return Err(e),
            Err(e) => panic!("the runtime: {e}"),
        };
        Ok(Host {
            workflows: host.workflows().clone(),
            pool: host.pool().clone(),
            host,
            dir,
        })
    }

    async fn new(body: &str) -> Host {
        Host::open(body, Options::default())
            .await
            .unwrap_or_else(|e| panic!("workflows load: {e}"))
    }

    /// Starts `workflow` and waits for it to finish; returns it with its steps.
    async fn run(&self, workflow: &str, input: Value) -> RunRecord {
        let started = self.workflows.start(workflow, input, None).await.unwrap();
        self.finish(&started.run_id).await
    }

    async fn finish(&self, run_id: &str) -> RunRecord {
        let done = self
            .workflows
            .wait(run_id, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(done.status.is_finished(), "run still going: {done:?}");
        self.workflows.get(run_id, true).await.unwrap()
    }

    /// The calls the fixture received, from its witness file.
    fn witness(&self) -> Vec<Value> {
        read_witness(&self.dir.path().join("witness.jsonl"))
    }

    async fn close(self) {
        self.host.shutdown(Duration::from_secs(5)).await;
    }
}

fn read_witness(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn step<'a>(run: &'a RunRecord, id: &str) -> &'a wf_host::workflow::StepRecord {
    run.steps
        .as_ref()
        .unwrap()
        .iter()
        .find(|s| s.id == id)
        .unwrap_or_else(|| panic!("no step `{id}` in {run:#?}"))
}

fn text_of(output: &Value) -> &str {
    output["content"][0]["text"].as_str().unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Definitions
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_load_error_names_the_workflow_the_step_and_the_problem() {
    let not_wasm = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_wasm.path(), "hello").unwrap();
    let cases = [
        (
            r#"[[workflows.w.steps]]
id = "a"
component = "{echo}"
needs = ["nope"]"#,
            "workflow `w`, step `a`: `needs` names unknown step `nope`".to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "a"
component = "{echo}"
[[workflows.w.steps]]
id = "a"
component = "{echo}""#,
            "workflow `w`, step `a`: duplicate step id".to_owned(),
        ),
        (
            r#"[workflows.w]
component = "{echo}"
debounce = { period = "10s", max_wait = "5s" }"#,
            "workflow `w`: `debounce.max_wait` must not be less than `debounce.period`".to_owned(),
        ),
        (
            r#"[workflows.w]
component = "{echo}"
debounce = { key = ".a |", period = "10s" }"#,
            "workflow `w`: `debounce.key`: jq expression `.a |` is invalid".to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "a"
sleep = "1s"
compensate = { component = "{echo}" }"#,
            "workflow `w`, step `a`: a sleep step (`sleep` or `until`) changes nothing outside the run: remove `compensate`".to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "a"
component = "{echo}"
compensate = { component = "nope.wasm" }"#,
            "workflow `w`, step `a`: `compensate`: component `".to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "a"
component = "{echo}"
compensate = { component = "{echo}", input = "{" }"#,
            "workflow `w`, step `a.compensate`: `input`: jq expression `{` is invalid".to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "a"
component = "{echo}"
needs = ["b"]
[[workflows.w.steps]]
id = "b"
component = "{echo}"
needs = ["a"]"#,
            "workflow `w`: the steps form a cycle: a → b → a".to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "a"
component = "{echo}"
input = "{q: .input | }""#,
            "workflow `w`, step `a`: `input`: jq expression `{q: .input | }` is invalid at position 13: expected term, found `}`".to_owned(),
        ),
        (
            r#"[workflows.w]
output = ".steps.a.output | nosuch"
[[workflows.w.steps]]
id = "a"
component = "{echo}""#,
            "workflow `w`: `output`: jq expression `.steps.a.output | nosuch` is invalid at position 18: undefined filter `nosuch`".to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "a"
component = "/nonexistent/missing.wasm""#,
            "workflow `w`, step `a`: component `/nonexistent/missing.wasm` not found".to_owned(),
        ),
        (
            &format!(
                r#"[[workflows.w.steps]]
id = "a"
component = "{}""#,
                not_wasm.path().display()
            ),
            format!(
                "workflow `w`, step `a`: `{}` is not a WebAssembly file",
                not_wasm.path().file_stem().unwrap().to_string_lossy()
            ),
        ),
        (
            r#"[[workflows.w.steps]]
id = "a"
component = "{echo}"
for_each = ".input"
concurrency = 0"#,
            "workflow `w`, step `a`: `concurrency` must be at least 1".to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "nap"
sleep = "1s"
component = "{echo}""#,
            "workflow `w`, step `nap`: a sleep step (`sleep` or `until`) runs no node: remove `component`".to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "nap"
sleep = "1s"
until = '.input.at'"#,
            "workflow `w`, step `nap`: sets both `sleep` and `until`; pick one".to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "a""#,
            "workflow `w`, step `a`: needs `component` (a node), `sleep` or `until` (a durable sleep), `wait` (a signal), or `workflow` (a child run)".to_owned(),
        ),
        (
            r#"[workflows.w]
component = "{echo}"
[[workflows.w.steps]]
id = "a"
component = "{echo}""#,
            "workflow `w`: sets both `component` (one node) and `steps` (a graph); pick one"
                .to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "ok"
wait = "approve"
component = "{echo}""#,
            "workflow `w`, step `ok`: a wait step (`wait`) runs no node: remove `component`"
                .to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "ok"
wait = "approve me"
"#,
            "workflow `w`, step `ok`: `wait = \"approve me\"`: a signal name uses only letters"
                .to_owned(),
        ),
        (
            r#"[[workflows.w.steps]]
id = "a"
component = "{echo}"
schema = { type = "object" }"#,
            "workflow `w`, step `a`: `schema` is for a `wait` step".to_owned(),
        ),
        (
            r#"[workflows.w]
component = "{echo}"
[[workflows.w.schedules]]
cron = "0 0 30 2 *""#,
            "workflow `w`: schedule `schedule`: `cron = \"0 0 30 2 *\"` never fires".to_owned(),
        ),
        (
            r#"[workflows.w]
component = "{echo}"
[[workflows.w.schedules]]
cron = "0 7 * * *"
[[workflows.w.schedules]]
cron = "0 8 * * *""#,
            "workflow `w`: two schedules are named `schedule`; give each its own `name`"
                .to_owned(),
        ),
        (
            r#"[workflows.w]
component = "{echo}"
[[workflows.w.schedules]]
cron = "0 7 * * *"
overlap = "later""#,
            "workflow `w`: schedule `schedule`: `overlap = \"later\"`: use `skip`, `queue` or `allow`"
                .to_owned(),
        ),
    ];
    for (body, expected) in cases {
        let err = match Host::open(body, Options::default()).await {
            Ok(_) => panic!("loaded: {body}"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.starts_with(&expected),
            "for\n{body}\nexpected: {expected}\n     got: {err}"
        );
    }
}

#[test]
fn a_cycle_exits_2_from_the_cli_with_the_cycle_printed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wf.toml");
    std::fs::write(
        &path,
        config_text(
            dir.path(),
            r#"[[workflows.w.steps]]
id = "a"
component = "{echo}"
needs = ["c"]
[[workflows.w.steps]]
id = "b"
component = "{echo}"
needs = ["a"]
[[workflows.w.steps]]
id = "c"
component = "{echo}"
needs = ["b"]"#,
        ),
    )
    .unwrap();
    let out = Command::new(wf_host_bin())
        .args(["run", "--config", path.to_str().unwrap(), "--workflow", "w"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: workflow `w`: the steps form a cycle: a → b → c → a\n"
    );
}

// ---------------------------------------------------------------------------
// Data passing
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_inputs_follow_the_needs_and_the_output_is_the_leaf() {
    let host = Host::new(
        r#"[[workflows.w.steps]]
id = "a"
component = "{echo}"
[[workflows.w.steps]]
id = "b"
component = "{echo}"
needs = ["a"]
[[workflows.w.steps]]
id = "c"
component = "{echo}"
needs = ["a", "b"]

[[workflows.two.steps]]
id = "x"
component = "{echo}"
[[workflows.two.steps]]
id = "y"
component = "{echo}"
"#,
    )
    .await;
    let run = host.run("w", json!({"k": 1})).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(step(&run, "a").output, Some(json!({"k": 1})));
    assert_eq!(step(&run, "b").output, Some(json!({"k": 1})));
    assert_eq!(
        step(&run, "c").output,
        Some(json!({"a": {"k": 1}, "b": {"k": 1}}))
    );
    assert_eq!(run.output, Some(json!({"a": {"k": 1}, "b": {"k": 1}})));
    for s in run.steps.as_ref().unwrap() {
        assert_eq!((s.status, s.attempts), (StepStatus::Succeeded, 1));
    }
    // Two leaves: an object keyed by step id.
    let run = host.run("two", json!(7)).await;
    assert_eq!(run.output, Some(json!({"x": 7, "y": 7})));
    host.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq_maps_inputs_if_skips_and_for_each_runs_each_item() {
    let host = Host::new(
        r#"[workflows.w]
output = '{each: .steps.each.output, n: (.steps.each.output | length), gated: .steps.gated.output}'

[[workflows.w.steps]]
id = "src"
component = "{echo}"
input = '{items: [.input.words[] | ascii_upcase]}'

[[workflows.w.steps]]
id = "each"
component = "{call}"
allow = ["fixture.echo"]
needs = ["src"]
for_each = ".steps.src.output.items"
concurrency = 2
input = '{capability: "fixture.echo", arguments: {text: "\(.index):\(.item)"}}'

[[workflows.w.steps]]
id = "gated"
component = "{echo}"
needs = ["src"]
if = '.steps.src.output.items | length > 5'

[[workflows.w.steps]]
id = "after_gated"
component = "{echo}"
needs = ["gated"]
"#,
    )
    .await;
    let run = host.run("w", json!({"words": ["a", "b", "c"]})).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    let each = run.output.as_ref().unwrap()["each"].as_array().unwrap();
    let texts: Vec<&str> = each.iter().map(text_of).collect();
    assert_eq!(texts, ["0:A", "1:B", "2:C"]);
    assert_eq!(run.output.as_ref().unwrap()["n"], 3);
    assert_eq!(run.output.as_ref().unwrap()["gated"], Value::Null);
    assert_eq!(step(&run, "gated").status, StepStatus::Skipped);
    assert_eq!(step(&run, "after_gated").status, StepStatus::Skipped);
    host.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn for_each_keeps_item_order_and_stops_at_the_first_failure() {
    let host = Host::new(
        r#"[[workflows.w.steps]]
id = "each"
component = "{call}"
allow = ["fixture.sleep", "fixture.fail"]
for_each = ".input"
concurrency = 3
input = 'if .item < 0 then {capability: "fixture.fail", arguments: {message: "item \(.index) fails"}} else {capability: "fixture.sleep", arguments: {ms: .item}} end'
"#,
    )
    .await;
    // Later items finish first; the output is still in item order.
    let run = host.run("w", json!([300, 10, 150])).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    let texts: Vec<&str> = run
        .output
        .as_ref()
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(text_of)
        .collect();
    assert_eq!(texts, ["slept 300ms", "slept 10ms", "slept 150ms"]);

    // Item 1 fails while item 0 sleeps for a minute: the step fails at once
    // and item 0's upstream call is cancelled.
    let started = Instant::now();
    let run = host.run("w", json!([60000, -1, 60000])).await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(run.status, RunStatus::Failed, "{run:#?}");
    let error = run.error.as_ref().unwrap();
    assert_eq!(error.code, "tool-error", "{error:?}");
    assert!(error.message.contains("item 1 fails"), "{error:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = host
            .pool
            .call_tool("fixture", "call_log", Default::default(), None)
            .await
            .unwrap();
        let cancelled = log["structuredContent"]["cancelled"]
            .as_array()
            .unwrap()
            .len();
        // Every long sleep that reached the server (item 2's may not have
        // started before item 1 failed) was cancelled.
        let long_sleeps = log["structuredContent"]["calls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["arguments"]["ms"] == 60000)
            .count();
        if long_sleeps >= 1 && cancelled >= long_sleeps {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sleeps were not cancelled: {log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    host.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jq_error_at_run_time_fails_the_step_naming_it() {
    let host = Host::new(
        r#"[[workflows.w.steps]]
id = "add"
component = "{echo}"
input = ".input.x + 1"

[[workflows.cond.steps]]
id = "gate"
component = "{echo}"
if = ".input | keys"

[workflows.out]
output = ".steps.s.output.x + 1"
[[workflows.out.steps]]
id = "s"
component = "{echo}"
"#,
    )
    .await;
    let run = host.run("w", json!({"x": "text"})).await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap();
    assert_eq!(error.code, "input-mapping");
    assert!(
        error
            .message
            .starts_with("jq expression `.input.x + 1` failed: "),
        "{}",
        error.message
    );
    let run = host.run("cond", json!(5)).await;
    assert_eq!(run.error.unwrap().code, "condition");
    let run = host.run("out", json!({"x": "s"})).await;
    let error = run.error.unwrap();
    assert_eq!(error.code, "output-mapping");
    assert!(
        error.message.contains("`.steps.s.output.x + 1`"),
        "{error:?}"
    );
    host.close().await;
}

/// A wait hands back the run as its end stored it (the host keeps it rather
/// than reading it back): the same record a later `get` reads, to the
/// millisecond of `finished_at`, for a run that succeeds, one that fails and
/// one that is cancelled, in memory and in a SQLite file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_returns_the_run_as_stored() {
    let dir = tempfile::tempdir().unwrap();
    let states = [
        ":memory:".to_owned(),
        dir.path().join("state.db").display().to_string(),
    ];
    for state in states {
        let options = Options {
            state: state.clone(),
            ..Options::default()
        };
        let host = Host::open(
            r#"[[workflows.ok.steps]]
id = "s"
component = "{echo}"

[workflows.bad]
output = ".steps.s.output.x + 1"
[[workflows.bad.steps]]
id = "s"
component = "{echo}"

[[workflows.slow.steps]]
id = "s"
component = "{call}"
allow = ["fixture.sleep"]
input = '{capability: "fixture.sleep", arguments: {ms: 30000}}'
"#,
            options,
        )
        .await
        .unwrap_or_else(|e| panic!("workflows load ({state}): {e}"));
        let wf = &host.workflows;
        let ok = wf.start("ok", json!({"x": 1}), None).await.unwrap();
        let bad = wf.start("bad", json!({"x": "s"}), None).await.unwrap();
        let slow = wf.start("slow", json!({}), None).await.unwrap();
        let long = Duration::from_secs(60);
        // The wait first (join! polls in order), then the cancel it sees.
        let cancelled = async {
            let (waited, cancel) =
                tokio::join!(wf.wait_run(&slow.run_id, long), wf.cancel(&slow.run_id));
            cancel.unwrap();
            waited
        };
        let waits = [
            (RunStatus::Succeeded, wf.wait_run(&ok.run_id, long).await),
            (RunStatus::Failed, wf.wait_run(&bad.run_id, long).await),
            (RunStatus::Cancelled, cancelled.await),
        ];
        for (status, waited) in waits {
            let waited = waited.unwrap();
            assert_eq!(waited.status, status, "{state}: {waited:#?}");
            assert!(waited.finished_at.is_some(), "{state}: {waited:#?}");
            let stored = wf.get(&waited.run_id, false).await.unwrap();
            assert_eq!(
                waited,
                RunRecord {
                    steps: None,
                    ..stored
                },
                "{state}"
            );
        }
        host.close().await;
    }
}

/// A run's first step starts in the same write as the run, and its last
/// step ends in the same write as the run (one commit each, not two): with
/// many runs starting and ending at once in a SQLite file, each run's
/// `run.started` is still followed at once by its first step's
/// `step.started`, and its last `step.finished` by its `run.finished`, with
/// no other run's event between them; no step starts twice. A failed run and
/// a two-step chain go so too; the chain's second step starts and its first
/// ends on their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_starts_and_ends_in_the_same_writes_as_its_first_and_last_steps() {
    const RUNS: usize = 24;
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        state: dir.path().join("state.db").display().to_string(),
        ..Options::default()
    };
    let host = Host::open(
        r#"[[workflows.ok.steps]]
id = "s"
component = "{echo}"

[workflows.bad]
output = ".steps.s.output.x + 1"
[[workflows.bad.steps]]
id = "s"
component = "{echo}"

[[workflows.chain.steps]]
id = "a"
component = "{echo}"
[[workflows.chain.steps]]
id = "b"
component = "{echo}"
needs = ["a"]
"#,
        options,
    )
    .await
    .unwrap();
    let wf = host.workflows.clone();
    let mut runs = tokio::task::JoinSet::new();
    for n in 0..RUNS {
        let wf = wf.clone();
        let (workflow, input) = match n % 3 {
            0 => ("ok", json!({"n": n})),
            1 => ("bad", json!({"x": "s"})),
            _ => ("chain", json!({"n": n})),
        };
        runs.spawn(async move {
            let started = wf.start(workflow, input, None).await.unwrap();
            let done = wf
                .wait_run(&started.run_id, Duration::from_secs(60))
                .await
                .unwrap();
            (workflow, done)
        });
    }
    let mut ended = Vec::new();
    while let Some(joined) = runs.join_next().await {
        let (workflow, done) = joined.unwrap();
        let status = if workflow == "bad" {
            RunStatus::Failed
        } else {
            RunStatus::Succeeded
        };
        assert_eq!(done.status, status, "{workflow}: {done:#?}");
        ended.push((workflow, done.run_id));
    }
    let events = wf.events(None, 0, 10_000).await.unwrap();
    for (workflow, run_id) in ended {
        let of_run: Vec<&str> = events
            .iter()
            .filter(|e| e.run_id == run_id)
            .map(|e| e.kind.as_str())
            .collect();
        let last_step = events
            .iter()
            .rposition(|e| e.run_id == run_id && e.kind == "step.finished")
            .unwrap_or_else(|| panic!("{workflow} {run_id}: {of_run:?}"));
        let next = &events[last_step + 1];
        assert_eq!(
            (next.run_id.as_str(), next.kind.as_str()),
            (run_id.as_str(), "run.finished"),
            "{workflow} {run_id}: the event after its last step.finished"
        );
        let start = events
            .iter()
            .position(|e| e.run_id == run_id && e.kind == "run.started")
            .unwrap_or_else(|| panic!("{workflow} {run_id}: {of_run:?}"));
        let first_step = if workflow == "chain" { "a" } else { "s" };
        let next = &events[start + 1];
        assert_eq!(
            (next.run_id.as_str(), next.kind.as_str(), &next.data),
            (
                run_id.as_str(),
                "step.started",
                &json!({"step": first_step, "attempt": 1})
            ),
            "{workflow} {run_id}: the event after its run.started"
        );
        let starts = of_run.iter().filter(|k| **k == "step.started").count();
        let steps = if workflow == "chain" { 2 } else { 1 };
        assert_eq!(starts, steps, "{workflow} {run_id}: {of_run:?}");
        let run = wf.get(&run_id, false).await.unwrap();
        let steps = run.steps.expect("get shows the steps");
        assert!(
            steps.iter().all(|s| s.attempts == 1),
            "{workflow} {run_id}: {steps:#?}"
        );
        if workflow == "chain" {
            let steps: Vec<&str> = of_run
                .iter()
                .copied()
                .filter(|k| k.starts_with("step.") && *k != "step.log")
                .collect();
            assert_eq!(
                steps,
                [
                    "step.started",
                    "step.finished",
                    "step.started",
                    "step.finished"
                ],
                "{run_id}"
            );
        }
    }
    host.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_naming_the_field() {
    let host = Host::new(
        r#"[workflows.w]
input_schema = { type = "object", required = ["topic"], properties = { topic = { type = "string" } } }
[[workflows.w.steps]]
id = "a"
component = "{echo}"
"#,
    )
    .await;
    let err = host
        .workflows
        .start("w", json!({"topic": 5}), None)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "workflow `w`: input field `/topic` does not match `input_schema`: 5 is not of type \"string\""
    );
    let err = host
        .workflows
        .start("w", json!({}), None)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "workflow `w`: the input does not match `input_schema`: \"topic\" is a required property"
    );
    let ok = host.run("w", json!({"topic": "t"})).await;
    assert_eq!(ok.status, RunStatus::Succeeded);
    host.close().await;
}

/// Four items that each sleep 300 ms upstream, `concurrency = 4`.
const SLEEPERS: &str = r#"[[workflows.w.steps]]
id = "sleep"
component = "{call}"
allow = ["fixture.sleep"]
for_each = ".input"
concurrency = 4
input = '{capability: "fixture.sleep", arguments: {ms: 300}}'

[[workflows.pair.steps]]
id = "left"
component = "{call}"
allow = ["fixture.sleep"]
input = '{capability: "fixture.sleep", arguments: {ms: 300}}'
[[workflows.pair.steps]]
id = "right"
component = "{call}"
allow = ["fixture.sleep"]
input = '{capability: "fixture.sleep", arguments: {ms: 300}}'
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_steps_run_in_parallel() {
    let host = Host::new(SLEEPERS).await;
    // Warm the session so its start-up is not timed.
    host.run("w", json!([1])).await;
    let run = host.run("pair", json!(null)).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    let span = |id: &str| {
        let s = step(&run, id);
        (
            humantime::parse_rfc3339(s.started_at.as_deref().unwrap()).unwrap(),
            humantime::parse_rfc3339(s.finished_at.as_deref().unwrap()).unwrap(),
        )
    };
    let (l0, l1) = span("left");
    let (r0, r1) = span("right");
    assert!(
        l0 < r1 && r0 < l1,
        "left {l0:?}..{l1:?} and right {r0:?}..{r1:?} do not overlap"
    );
    let started = Instant::now();
    let run = host.run("w", json!([1, 2, 3, 4])).await;
    assert_eq!(run.status, RunStatus::Succeeded);
    assert!(
        started.elapsed() < Duration::from_millis(1100),
        "4 × 300 ms with concurrency 4 took {:?}",
        started.elapsed()
    );
    host.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_steps_bounds_node_runs_and_drops_nothing() {
    let options = Options {
        max_concurrent_steps: 2,
        ..Options::default()
    };
    let host = Host::open(SLEEPERS, options).await.unwrap();
    host.run("w", json!([1])).await;
    let started = Instant::now();
    let run = host.run("w", json!([1, 2, 3, 4])).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(run.output.as_ref().unwrap().as_array().unwrap().len(), 4);
    // Two slots: two waves of 300 ms at least.
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "4 × 300 ms in 2 slots took only {:?}",
        started.elapsed()
    );
    host.close().await;
}

// ---------------------------------------------------------------------------
// Failures and retries
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_is_retried_with_backoff_until_it_succeeds() {
    let host = Host::new(
        r#"[[workflows.w.steps]]
id = "flaky"
component = "{flaky}"
allow = ["fixture.counter"]
retry = { max_attempts = 5, initial = "100ms", max = "1s", multiplier = 2.0 }
"#,
    )
    .await;
    let started = Instant::now();
    let run = host.run("w", json!({"fail_until": 3, "value": "v"})).await;
    let elapsed = started.elapsed();
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(run.output, Some(json!({"count": 3, "value": "v"})));
    assert_eq!(step(&run, "flaky").attempts, 3);
    // Delays of 100 ms and 200 ms, each jittered into its upper half.
    assert!(
        elapsed >= Duration::from_millis(150),
        "retried too fast: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_millis(1500),
        "retried too slowly: {elapsed:?}"
    );
    // Each attempt's log comes after its start and before the next
    // attempt's; the last one's is stored with the step's end.
    let events = host
        .workflows
        .events(Some(&run.run_id), 0, 100)
        .await
        .unwrap();
    let outline: Vec<String> = events
        .iter()
        .map(|e| match e.kind.as_str() {
            "step.started" => format!("started {}", e.data["attempt"]),
            "step.log" => format!(
                "log {} {}",
                e.data["attempt"], e.data["records"][0]["message"]
            ),
            other => other.to_owned(),
        })
        .collect();
    assert_eq!(
        outline,
        [
            "run.started",
            "started 1",
            "log 1 \"count 1\"",
            "started 2",
            "log 2 \"count 2\"",
            "started 3",
            "log 3 \"count 3\"",
            "step.finished",
            "run.finished",
        ]
    );
    host.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_is_not_retried_and_independent_steps_still_finish() {
    let host = Host::new(
        r#"[[workflows.w.steps]]
id = "nogrant"
component = "{flaky}"
retry = { max_attempts = 5, initial = "10ms" }
[[workflows.w.steps]]
id = "after"
component = "{echo}"
needs = ["nogrant"]
[[workflows.w.steps]]
id = "side"
component = "{echo}"
"#,
    )
    .await;
    let run = host.run("w", json!({"fail_until": 1})).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:#?}");
    let error = run.error.as_ref().unwrap();
    assert_eq!(error.code, "denied");
    assert!(error.message.starts_with("step `nogrant`: "), "{error:?}");
    assert_eq!(step(&run, "nogrant").attempts, 1);
    assert_eq!(step(&run, "nogrant").status, StepStatus::Failed);
    assert_eq!(step(&run, "after").status, StepStatus::Cancelled);
    assert_eq!(
        step(&run, "after").error.as_ref().unwrap().code,
        "need-failed"
    );
    assert_eq!(step(&run, "side").status, StepStatus::Succeeded);
    host.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_reruns_only_the_failed_step_and_what_needs_it() {
    let host = Host::new(
        r#"[[workflows.w.steps]]
id = "first"
component = "{call}"
allow = ["fixture.echo"]
input = '{capability: "fixture.echo", arguments: {text: "once"}}'
[[workflows.w.steps]]
id = "flaky"
component = "{flaky}"
allow = ["fixture.counter"]
needs = ["first"]
input = '{fail_until: 2}'
[[workflows.w.steps]]
id = "last"
component = "{echo}"
needs = ["flaky"]
"#,
    )
    .await;
    let run = host.run("w", json!(null)).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:#?}");
    assert_eq!(step(&run, "last").status, StepStatus::Cancelled);

    let retried = host.workflows.retry(&run.run_id).await.unwrap();
    assert_eq!(retried.run_id, run.run_id);
    let run = host.finish(&run.run_id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(run.output, Some(json!({"count": 2, "value": null})));
    assert_eq!(step(&run, "first").attempts, 1);
    assert_eq!(step(&run, "flaky").attempts, 2);
    let echoes = host
        .witness()
        .into_iter()
        .filter(|c| c["tool"] == "echo")
        .count();
    assert_eq!(echoes, 1, "the succeeded step ran again");
    // A succeeded run is not retried.
    let err = host.workflows.retry(&run.run_id).await.unwrap_err();
    assert!(matches!(err, WorkflowError::NotRetryable { .. }), "{err}");
    host.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_every_running_step_and_the_run_deadline_fails_it() {
    let host = Host::new(
        r#"[[workflows.w.steps]]
id = "a"
component = "{call}"
allow = ["fixture.sleep"]
input = '{capability: "fixture.sleep", arguments: {ms: 60000}}'
[[workflows.w.steps]]
id = "b"
component = "{call}"
allow = ["fixture.sleep"]
input = '{capability: "fixture.sleep", arguments: {ms: 60000}}'
[[workflows.w.steps]]
id = "c"
component = "{echo}"
needs = ["a"]

[workflows.slow]
timeout = "300ms"
[[workflows.slow.steps]]
id = "a"
component = "{call}"
allow = ["fixture.sleep"]
input = '{capability: "fixture.sleep", arguments: {ms: 60000}}'
"#,
    )
    .await;
    let started = host.workflows.start("w", json!(null), None).await.unwrap();
    // Wait until both sleeps are upstream.
    let deadline = Instant::now() + Duration::from_secs(20);
    while host
        .witness()
        .iter()
        .filter(|c| c["tool"] == "sleep")
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "the sleeps never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cancelled = host.workflows.cancel(&started.run_id).await.unwrap();
    assert_eq!(cancelled.status, RunStatus::Cancelled);
    let run = host.workflows.get(&started.run_id, false).await.unwrap();
    for id in ["a", "b", "c"] {
        assert_eq!(step(&run, id).status, StepStatus::Cancelled, "{id}");
    }
    let started = Instant::now();
    let run = host.run("slow", json!(null)).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error.as_ref().unwrap().code, "timeout");
    assert!(started.elapsed() < Duration::from_secs(10));
    host.close().await;
}

// ---------------------------------------------------------------------------
// Durable state
// ---------------------------------------------------------------------------

/// A three-step chain: echo, a long upstream sleep, echo.
const CHAIN: &str = r#"[runtime]
state = "state.db"

[[workflows.chain.steps]]
id = "one"
component = "{call}"
allow = ["fixture.echo"]
input = '{capability: "fixture.echo", arguments: {text: "one-\(.input.n)"}}'
[[workflows.chain.steps]]
id = "two"
component = "{call}"
allow = ["fixture.sleep"]
needs = ["one"]
input = '{capability: "fixture.sleep", arguments: {ms: .input.ms}}'
[[workflows.chain.steps]]
id = "three"
component = "{echo}"
needs = ["two"]
input = '{one: .steps.one.output.content[0].text, n: .input.n}'
"#;

/// `wf-host serve` on a state file in `dir`; killed and reaped on drop.
struct Serve {
    child: Child,
    url: String,
}

impl Serve {
    fn start(dir: &Path) -> Serve {
        Serve::start_with(dir, &[])
    }

    /// [`Serve::start`] with more arguments.
    fn start_with(dir: &Path, extra: &[&str]) -> Serve {
        let mut child = Command::new(wf_host_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(dir.join("wf.toml"))
            .args(extra)
            .env("WF_HOST_CACHE_DIR", dir.join("cache"))
            .env_remove("WF_HOST_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = match lines.next() {
                Some(line) => line.unwrap(),
                None => panic!("wf-host serve exited: {:?}", child.wait()),
            };
            if let Some(rest) = line.strip_prefix("wf-host listening on ") {
                break rest.to_owned();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Serve { child, url }
    }

    /// Waits until the first step of `run_id` is `waiting` and reports
    /// progress starting with `what` (a parked step says what it waits
    /// for); the message. Its `waiting_for` says the same.
    async fn says(&self, run_id: &str, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = self.call("workflow.get", json!({"run_id": run_id})).await;
            let step = &got["steps"][0];
            let said = step["progress"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if said.starts_with(what) && step["status"] == "waiting" {
                let waits = &step["waiting_for"][0];
                let key = match what {
                    w if w.starts_with("sleeping") => "sleep_until",
                    w if w.starts_with("waiting for signal") => "signal",
                    w if w.starts_with("waiting for run") => "child",
                    _ => "task",
                };
                assert!(!waits[key].is_null(), "{said:?} but waits for {waits}");
                return said;
            }
            assert!(Instant::now() < deadline, "never said {what:?}: {got}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn call(&self, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let text = common::http_client()
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let reply: Value = serde_json::from_str(&text).unwrap();
        match reply.get("result") {
            Some(result) => result.clone(),
            None => panic!("{method} failed: {reply}"),
        }
    }

    /// The JSON-RPC reply to `method` (a result or an error).
    async fn reply(&self, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        common::http_client()
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// `GET /metrics`.
    async fn metrics(&self) -> String {
        common::http_client()
            .get(self.url.replace("/rpc", "/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    fn kill(mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `code` against the SQLite file `db` with Python's own sqlite3 (an
/// independent client: `c` is the connection), commits, and returns stdout.
fn sqlite(db: &Path, code: &str) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sqlite3; c = sqlite3.connect({:?}); {code}; c.commit()",
            db.display().to_string()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python3 sqlite3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `wf-host serve` on the config in `dir`, expected to refuse to start:
/// exits 2; returns its stderr.
fn serve_refused(dir: &Path) -> String {
    let out = Command::new(wf_host_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.join("wf.toml"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn write_config(dir: &Path, body: &str) {
    std::fs::write(dir.join("wf.toml"), config_text(dir, body)).unwrap();
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_run_resumes_and_never_reruns_a_finished_step() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), CHAIN);
    let witness = dir.path().join("witness.jsonl");
    let serve = Serve::start(dir.path());
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "chain", "input": {"n": 1, "ms": 60000}, "idempotency_key": "k1"}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    // Step two is inside its upstream call.
    wait_until("step two's sleep upstream", || {
        read_witness(&witness).iter().any(|c| c["tool"] == "sleep")
    })
    .await;
    serve.kill();

    // Shorten the sleep: the resumed run keeps its stored input, so edit only
    // what the fixture sees by restarting it with the same state.
    let serve = Serve::start(dir.path());
    let got = serve.call("workflow.get", json!({"run_id": run_id})).await;
    assert_eq!(got["status"], "running", "{got}");
    let cancelled = serve
        .call("workflow.cancel", json!({"run_id": run_id}))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    serve.kill();

    // A run whose step two is short: killed inside it, resumed to success.
    let serve = Serve::start(dir.path());
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "chain", "input": {"n": 2, "ms": 1500}}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    wait_until("step two's sleep upstream", || {
        read_witness(&witness)
            .iter()
            .any(|c| c["tool"] == "sleep" && c["arguments"]["ms"] == 1500)
    })
    .await;
    serve.kill();
    let serve = Serve::start(dir.path());
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], json!({"one": "one-2", "n": 2}));
    let got = serve.call("workflow.get", json!({"run_id": run_id})).await;
    let attempts: Vec<_> = got["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_owned(),
                s["attempts"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [("one".into(), 1), ("two".into(), 2), ("three".into(), 1)]
    );
    let calls = read_witness(&witness);
    let ones = calls
        .iter()
        .filter(|c| c["tool"] == "echo" && c["arguments"]["text"] == "one-2")
        .count();
    assert_eq!(ones, 1, "step one ran again: {calls:#?}");
    let sleeps = calls
        .iter()
        .filter(|c| c["tool"] == "sleep" && c["arguments"]["ms"] == 1500)
        .count();
    assert_eq!(sleeps, 2, "step two runs again as its next attempt");
    // Both attempts carried the same idempotency key, so a server can dedupe.
    let keys: Vec<&Value> = calls
        .iter()
        .filter(|c| c["tool"] == "sleep" && c["arguments"]["ms"] == 1500)
        .map(|c| &c["meta"]["wf-host/idempotency-key"])
        .collect();
    assert_eq!(keys[0], &json!(format!("{run_id}/two/0/1")));
    assert_eq!(keys[0], keys[1]);
    // The idempotency key survived the restarts.
    let again = serve
        .call(
            "workflow.start",
            json!({"workflow": "chain", "input": {"n": 1, "ms": 60000}, "idempotency_key": "k1"}),
        )
        .await;
    assert_eq!(again["status"], "cancelled", "{again}");
}

/// Three steps that each leave a mark on the witness server, with a durable
/// sleep between the first two; the last call takes 100 ms, so a kill often
/// lands inside it.
const MARKS: &str = r#"[runtime]
state = "state.db"

[[workflows.marks.steps]]
id = "one"
component = "{call}"
allow = ["fixture.echo"]
input = '{capability: "fixture.echo", arguments: {text: "one-\(.input.n)"}}'
[[workflows.marks.steps]]
id = "nap"
sleep = "300ms"
needs = ["one"]
[[workflows.marks.steps]]
id = "two"
component = "{call}"
allow = ["fixture.echo"]
needs = ["nap"]
input = '{capability: "fixture.echo", arguments: {text: "two-\(.input.n)"}}'
[[workflows.marks.steps]]
id = "three"
component = "{call}"
allow = ["fixture.sleep"]
needs = ["two"]
input = '{capability: "fixture.sleep", arguments: {ms: 100}}'
"#;

/// Chaos: a steady load of runs while `serve` is SIGKILLed at 20 random
/// moments and started again. Every start that was answered with a run id
/// (and every start sent again with its idempotency key after it went
/// unanswered) ends with one run that succeeded, and the journal's promise
/// holds on the witness server: a call is made again only by a later
/// process, for a step whose attempt the kill interrupted (at most once per
/// interrupted attempt), never twice by the same process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_random_sigkills_lose_no_run_and_repeat_no_completed_call() {
    let mut rng = common::chaos::seeded_rng();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), MARKS);
    let mut serve = Serve::start(dir.path());
    let load = common::chaos::Load::start("marks", vec![serve.url.clone()]);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(rng.u64(200..1500))).await;
        serve.kill();
        serve = tokio::task::spawn_blocking({
            let dir = dir.path().to_owned();
            move || Serve::start(&dir)
        })
        .await
        .unwrap();
        load.set(0, serve.url.clone());
    }
    let accepted = load.finish(&serve.url).await;

    let mut attempts = std::collections::BTreeMap::new();
    let mut interrupted = 0;
    for (n, run_id) in &accepted {
        let done = serve
            .call(
                "workflow.wait",
                json!({"run_id": run_id, "timeout_ms": 60000}),
            )
            .await;
        assert_eq!(done["status"], "succeeded", "run {n}: {done}");
        let got = serve.call("workflow.get", json!({"run_id": run_id})).await;
        for step in got["steps"].as_array().unwrap() {
            assert_eq!(step["status"], "succeeded", "run {n}: {got}");
            let tried = step["attempts"].as_u64().unwrap();
            interrupted += tried.saturating_sub(1);
            attempts.insert(format!("{run_id}/{}", step["id"].as_str().unwrap()), tried);
        }
    }
    // One run per key, and no run the load did not start.
    let state = dir.path().join("state.db");
    let counts = sqlite(
        &state,
        "print(c.execute(\"select count(*), count(distinct idempotency_key) from runs\").fetchone()); print(c.execute(\"select count(*) from events where kind = 'run.finished'\").fetchone())",
    );
    let keys: std::collections::HashSet<_> = accepted.iter().map(|(n, _)| n).collect();
    let runs: std::collections::HashSet<_> = accepted.iter().map(|(_, r)| r).collect();
    assert_eq!(keys.len(), runs.len(), "two keys share a run");
    assert_eq!(
        counts,
        format!("({0}, {0})\n({0},)\n", keys.len()),
        "runs, keys and run.finished events in the state"
    );

    // The witness: every step's call was made, and made again only by
    // another process, once per interrupted attempt at most.
    let repeated = common::chaos::assert_calls_repeat_only_across_processes(
        &read_witness(&dir.path().join("witness.jsonl")),
        &attempts,
        |step| step.ends_with("/nap"),
    );
    eprintln!(
        "{} runs, {interrupted} interrupted attempts, {repeated} calls made again after a kill",
        accepted.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_interrupted_too_often_fails_crashed_instead_of_looping() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), CHAIN);
    let witness = dir.path().join("witness.jsonl");
    let serve = Serve::start(dir.path());
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "chain", "input": {"n": 1, "ms": 60000}}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    wait_until("step two's sleep upstream", || {
        read_witness(&witness).iter().any(|c| c["tool"] == "sleep")
    })
    .await;
    serve.kill();
    // As if the host had died in this step 21 times already.
    sqlite(
        &dir.path().join("state.db"),
        "c.execute(\"update steps set attempts = 21 where step_id = 'two'\")",
    );
    let serve = Serve::start(dir.path());
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 10000}),
        )
        .await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "crashed");
    let sleeps = read_witness(&witness)
        .iter()
        .filter(|c| c["tool"] == "sleep")
        .count();
    assert_eq!(sleeps, 1, "the step ran again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_that_is_not_ours_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), CHAIN);
    let state = dir.path().join("state.db");
    let cases: [(&[u8], &str); 2] = [
        (
            b"this is somebody's notes, not a database\n",
            "it is not a wf-host state file (not an SQLite database)",
        ),
        (&[], ""),
    ];
    // Garbage.
    std::fs::write(&state, cases[0].0).unwrap();
    let stderr = serve_refused(dir.path());
    assert!(stderr.contains(cases[0].1), "{stderr}");
    assert!(stderr.contains("state.db"), "{stderr}");
    assert_eq!(std::fs::read(&state).unwrap(), cases[0].0);

    // Another application's SQLite database.
    std::fs::remove_file(&state).unwrap();
    sqlite(
        &state,
        "c.execute('create table notes (t text)'); c.execute(\"insert into notes values ('mine')\")",
    );
    let before = std::fs::read(&state).unwrap();
    let stderr = serve_refused(dir.path());
    assert!(
        stderr.contains("it holds another application's database, not wf-host state"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&state).unwrap(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_state_file_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), CHAIN);
    let state = dir.path().join("state.db");
    {
        let serve = Serve::start(dir.path());
        for n in 0..20 {
            serve
                .call(
                    "workflow.start",
                    json!({"workflow": "chain", "input": {"n": n, "ms": 1}, "wait": true}),
                )
                .await;
        }
        serve.kill();
    }
    // Checkpoint the WAL into the file, then cut the file in the middle of
    // its pages, as a bad disk or a partial copy would.
    sqlite(&state, "c.execute('PRAGMA wal_checkpoint(TRUNCATE)')");
    let _ = std::fs::remove_file(dir.path().join("state.db-wal"));
    let _ = std::fs::remove_file(dir.path().join("state.db-shm"));
    let bytes = std::fs::read(&state).unwrap();
    assert!(bytes.len() > 8192, "state is only {} bytes", bytes.len());
    let mut damaged = bytes[..bytes.len() / 2].to_vec();
    damaged.extend(std::iter::repeat_n(0xA5u8, 4096));
    std::fs::write(&state, &damaged).unwrap();
    let stderr = serve_refused(dir.path());
    assert!(stderr.contains("cannot be used"), "{stderr}");
    assert_eq!(
        std::fs::read(&state).unwrap(),
        damaged,
        "the file was written to"
    );
    assert!(!dir.path().join("state.db-wal").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_cannot_share_one_state_file() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), CHAIN);
    let _first = Serve::start(dir.path());
    let stderr = serve_refused(dir.path());
    assert!(stderr.contains("another wf-host (pid "), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_component_fails_a_resumed_run_with_both_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let component = dir.path().join("node.wasm");
    std::fs::copy(plugin("call"), &component).unwrap();
    write_config(
        dir.path(),
        &format!(
            r#"[runtime]
state = "state.db"
[[workflows.w.steps]]
id = "wait"
component = "{}"
allow = ["fixture.sleep"]
input = '{{capability: "fixture.sleep", arguments: {{ms: 60000}}}}'
"#,
            component.display()
        ),
    );
    let witness = dir.path().join("witness.jsonl");
    let serve = Serve::start(dir.path());
    let started = serve
        .call("workflow.start", json!({"workflow": "w", "input": null}))
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    wait_until("the sleep upstream", || !read_witness(&witness).is_empty()).await;
    serve.kill();
    std::fs::copy(plugin("echo"), &component).unwrap();
    let serve = Serve::start(dir.path());
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 10000}),
        )
        .await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "definition-changed");
    let message = done["error"]["message"].as_str().unwrap();
    let call_hash =
        wf_host::workflow::definition::content_hash(&std::fs::read(plugin("call")).unwrap());
    let echo_hash =
        wf_host::workflow::definition::content_hash(&std::fs::read(plugin("echo")).unwrap());
    assert!(message.contains("step `wait`"), "{message}");
    assert!(
        message.contains(&call_hash) && message.contains(&echo_hash),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_is_journaled_and_carries_an_idempotency_key() {
    let host = Host::new(
        r#"[[workflows.w.steps]]
id = "greet"
component = "{call}"
allow = ["fixture.echo"]
for_each = ".input"
input = '{capability: "fixture.echo", arguments: {text: .item}}'
[[workflows.w.steps]]
id = "denied"
component = "{call}"
needs = ["greet"]
input = '{capability: "fixture.add", arguments: {a: 1, b: 2}}'
"#,
    )
    .await;
    let run = host.run("w", json!(["a", "b"])).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:#?}");
    let calls = |id: &str| serde_json::to_value(step(&run, id).calls.as_ref().unwrap()).unwrap();
    let greet = calls("greet");
    let greet: Vec<_> = greet
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["item"].clone(),
                c["attempt"].clone(),
                c["seq"].clone(),
                c["name"].clone(),
                c["arguments"].clone(),
                c["outcome"].clone(),
            )
        })
        .collect();
    assert_eq!(
        greet,
        [
            (
                json!(0),
                json!(1),
                json!(1),
                json!("fixture.echo"),
                json!({"text": "a"}),
                json!("ok")
            ),
            (
                json!(1),
                json!(1),
                json!(1),
                json!("fixture.echo"),
                json!({"text": "b"}),
                json!("ok")
            ),
        ]
    );
    let denied = calls("denied");
    assert_eq!(denied[0]["outcome"], "error");
    assert_eq!(denied[0]["error_code"], "denied");
    let keys: Vec<_> = host
        .witness()
        .iter()
        .map(|c| c["meta"]["wf-host/idempotency-key"].clone())
        .collect();
    let id = &run.run_id;
    assert_eq!(
        keys,
        [
            json!(format!("{id}/greet/0/1")),
            json!(format!("{id}/greet/1/1"))
        ]
    );
    host.close().await;
}

/// `call-tools` sends its calls at once: two one-second sleeps overlap at
/// the server, the results come back in the order given, and the journal
/// and the idempotency keys number the calls in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_tools_makes_its_calls_at_once_and_answers_in_order() {
    let host = Host::new(
        r#"[[workflows.w.steps]]
id = "both"
component = "{call}"
allow = ["fixture.sleep", "fixture.echo"]
"#,
    )
    .await;
    let together = json!({"together": [
        {"capability": "fixture.sleep", "arguments": {"ms": 1000}},
        {"capability": "fixture.sleep", "arguments": {"ms": 1000}},
        {"capability": "fixture.echo", "arguments": {"text": "third"}},
    ]});
    let run = host.run("w", together).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    let results = run.output.as_ref().unwrap()["together"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(results.len(), 3, "{results:?}");
    let span = |r: &Value| {
        let s = &r["structuredContent"];
        (
            s["started_ms"].as_u64().unwrap(),
            s["ended_ms"].as_u64().unwrap(),
        )
    };
    let (a, b) = (span(&results[0]), span(&results[1]));
    assert!(
        a.0.max(b.0) < a.1.min(b.1),
        "the two sleeps did not overlap at the server: {a:?} and {b:?}"
    );
    assert_eq!(results[2]["content"][0]["text"], "third");
    // Journaled in the order given, each with its own key.
    assert_eq!(
        journal_of(&run, "both"),
        [
            (json!(1), json!("fixture.sleep")),
            (json!(2), json!("fixture.sleep")),
            (json!(3), json!("fixture.echo")),
        ]
    );
    let mut keys: Vec<String> = host
        .witness()
        .iter()
        .map(|c| {
            c["meta"]["wf-host/idempotency-key"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    keys.sort();
    let id = &run.run_id;
    assert_eq!(
        keys,
        [1, 2, 3].map(|n| format!("{id}/both/0/{n}")),
        "one key per call, numbered in the order given"
    );
    host.close().await;
}

/// More calls at once than `call-tools` takes are all refused, and none
/// reaches the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_tools_refuses_more_than_sixty_four_calls_and_makes_none() {
    let host = Host::new(
        r#"[[workflows.w.steps]]
id = "many"
component = "{call}"
allow = ["fixture.echo"]
"#,
    )
    .await;
    let calls: Vec<Value> = (0..65)
        .map(|n| json!({"capability": "fixture.echo", "arguments": {"text": n.to_string()}}))
        .collect();
    let run = host.run("w", json!({ "together": calls })).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    let results = run.output.as_ref().unwrap()["together"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(results.len(), 65);
    for result in &results {
        assert_eq!(result["error"]["code"], "invalid-arguments", "{result}");
        assert_eq!(
            result["error"]["message"],
            "call-tools takes at most 64 calls at once, not 65; none was made"
        );
    }
    assert!(host.witness().is_empty(), "{:?}", host.witness());
    host.close().await;
}

/// A node built against `wf:node@0.1.0` (before `call-tools`) runs
/// unchanged: its calls are checked, made and journaled as a current node's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_built_against_0_1_0_runs_unchanged() {
    let host = Host::new(
        r#"[[workflows.w.steps]]
id = "old"
component = "{call-0.1.0}"
allow = ["fixture.echo"]
"#,
    )
    .await;
    let input = json!({"capability": "fixture.echo", "arguments": {"text": "still here"}});
    let run = host.run("w", input).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(
        run.output.as_ref().unwrap()["content"][0]["text"],
        "still here"
    );
    let calls = serde_json::to_value(step(&run, "old").calls.as_ref().unwrap()).unwrap();
    assert_eq!(calls[0]["name"], "fixture.echo");
    assert_eq!(calls[0]["outcome"], "ok");
    assert_eq!(host.witness().len(), 1);
    host.close().await;
}

/// A workflow with one durable step: `approval` asks through the fixture,
/// waits for `approve`, and tells the decision.
const APPROVAL: &str = r#"[[workflows.w.steps]]
id = "ask"
component = "{approval}"
allow = ["fixture.echo"]
"#;

/// The journal of step `id` of `run` (with its calls): `(seq, name)` of each
/// call and wait, in order.
fn journal_of(run: &RunRecord, id: &str) -> Vec<(Value, Value)> {
    let calls = serde_json::to_value(step(run, id).calls.as_ref().unwrap()).unwrap();
    calls
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["seq"].clone(), c["name"].clone()))
        .collect()
}

/// What `approval` asks, given its output (the time and ticket it read).
fn asked_text(request: &str, output: &Value) -> String {
    format!(
        "approval needed for \"{request}\" (asked at {}, ticket {})",
        output["asked_at"],
        output["ticket"].as_str().unwrap()
    )
}

impl Host {
    /// Waits until step `step` of `run_id` reports `message` as its
    /// progress (a parked step says what it waits for there).
    async fn progress_says(&self, run_id: &str, step: &str, message: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let run = self.workflows.get(run_id, false).await.unwrap();
            let record = run.steps.iter().flatten().find(|s| s.id == step);
            let said = record
                .and_then(|s| s.progress.as_ref())
                .and_then(|p| p.message.clone());
            // A parked step is `waiting`, and says for what.
            let waiting = record
                .is_some_and(|s| s.status == StepStatus::Waiting && !s.waiting_for.is_empty());
            if said.as_deref() == Some(message) && waiting {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "step `{step}` of {run_id} never said {message:?} (it says {said:?}; run {run:#?})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A durable node sleeps and waits for a signal with its instance let go,
/// then goes on where it waited: its call before the waits is made once,
/// and its journal holds its calls and waits in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_node_lets_go_while_it_waits_and_goes_on_with_the_signal() {
    let host = Host::new(APPROVAL).await;
    let input = json!({"request": "deploy", "notify": "fixture.echo", "sleep_ms": 300});
    let started = host.workflows.start("w", input, None).await.unwrap();
    let id = started.run_id.clone();
    host.progress_says(&id, "ask", "waiting for signal `approve`")
        .await;
    assert_eq!(
        host.workflows.waiting(),
        1,
        "the parked run holds no step slot"
    );
    let sent = host
        .workflows
        .signal(&id, "approve", json!({"approved": true}))
        .await
        .unwrap();
    assert_eq!(sent.step, "ask");
    let run = host.finish(&id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    let output = run.output.clone().unwrap();
    assert_eq!(output["decision"], json!({"approved": true}));
    // The node ran three times; each side effect happened once, and each
    // run read the clock and the random number the first one read (else
    // its first call would differ, and the step fail `diverged`).
    let asked = asked_text("deploy", &output);
    assert_eq!(output["asked"], asked);
    let texts: Vec<Value> = host
        .witness()
        .iter()
        .map(|c| c["arguments"]["text"].clone())
        .collect();
    assert_eq!(
        texts,
        [
            json!(asked),
            json!("decision for \"deploy\": {\"approved\":true}")
        ]
    );
    let calls = serde_json::to_value(step(&run, "ask").calls.as_ref().unwrap()).unwrap();
    assert_eq!(
        journal_of(&run, "ask"),
        [
            (json!(1), json!("fixture.echo")),
            (json!(2), json!("wf:sleep")),
            (json!(3), json!("wf:wait-signal")),
            (json!(4), json!("fixture.echo")),
        ]
    );
    let waited = &step(&run, "ask").calls.as_ref().unwrap()[2];
    assert_eq!(waited.result, Some(json!({"payload": {"approved": true}})));
    // The reads before the first call are journaled with it.
    let kinds: Vec<String> = calls[0]["tape"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_object().unwrap().keys().cloned())
        .collect();
    assert!(kinds.contains(&"wall".to_owned()), "{kinds:?}");
    assert!(kinds.contains(&"seed".to_owned()), "{kinds:?}");
    host.close().await;
}

/// A signal sent before the durable node waits for it is kept for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_sent_before_a_durable_node_waits_is_kept_for_it() {
    let host = Host::new(APPROVAL).await;
    let input = json!({"request": "early", "notify": "fixture.echo", "sleep_ms": 500});
    let started = host.workflows.start("w", input, None).await.unwrap();
    let sent = host
        .workflows
        .signal(&started.run_id, "approve", json!("yes"))
        .await
        .unwrap();
    assert_eq!(sent.delivery, "kept");
    let run = host.finish(&started.run_id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(run.output.unwrap()["decision"], "yes");
    host.close().await;
}

/// Durable nodes that wait hold no step slot: with one slot, five runs all
/// wait for their signal at once, and all finish once signalled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_durable_nodes_wait_at_once_on_one_step_slot() {
    let options = Options {
        max_concurrent_steps: 1,
        ..Options::default()
    };
    let host = Host::open(APPROVAL, options).await.unwrap();
    let mut ids = Vec::new();
    for n in 0..5 {
        let input = json!({"request": n, "notify": "fixture.echo"});
        ids.push(host.workflows.start("w", input, None).await.unwrap().run_id);
    }
    for id in &ids {
        host.progress_says(id, "ask", "waiting for signal `approve`")
            .await;
    }
    for id in &ids {
        host.workflows
            .signal(id, "approve", json!(id))
            .await
            .unwrap();
    }
    for id in &ids {
        let run = host.finish(id).await;
        assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
        assert_eq!(run.output.unwrap()["decision"], json!(id));
    }
    assert_eq!(host.witness().len(), 10, "two calls a run, each once");
    host.close().await;
}

/// A durable node's wait with a timeout fails `timeout` when no signal
/// comes, and the node sees it as an error it may handle (here it passes
/// it on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_wait_times_out_as_an_error_the_node_sees() {
    let host = Host::new(APPROVAL).await;
    let input = json!({"request": "late", "notify": "fixture.echo", "timeout_ms": 200});
    let run = host.run("w", input).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:#?}");
    let error = run.error.clone().unwrap();
    assert_eq!(error.code, "timeout", "{error:?}");
    assert!(
        error
            .message
            .contains("no `approve` signal came within 200ms"),
        "{error:?}"
    );
    host.close().await;
}

/// A parent whose durable node runs child workflows: `child` echoes its
/// input, `failing` fails (its call is denied), `stuck` waits for a signal
/// that never comes.
const FAMILY: &str = r#"[[workflows.parent.steps]]
id = "lead"
component = "{durable}"
allow = ["fixture.echo", "workflow.child", "workflow.failing", "workflow.stuck", "workflow.nowhere"]

[[workflows.ungranted.steps]]
id = "lead"
component = "{durable}"
allow = ["fixture.echo"]

[[workflows.child.steps]]
id = "echo"
component = "{echo}"

[[workflows.failing.steps]]
id = "call"
component = "{call}"
input = '{capability: "fixture.add", arguments: {a: 1, b: 2}}'

[[workflows.stuck.steps]]
id = "wait"
component = "{durable}"
"#;

/// `run-workflow` runs a child to its end and gives the node its output,
/// or its failure as an error the node sees; the child records its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_node_runs_child_workflows_and_sees_their_outcome() {
    let host = Host::new(FAMILY).await;
    let input = json!({"do": [
        {"workflow": "child", "input": {"n": 1}},
        {"workflow": "failing", "input": null},
        {"workflow": "nowhere", "input": {}},
        {"call": "fixture.echo", "arguments": {"text": "after"}},
    ]});
    let run = host.run("parent", input).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    let out = run.output.clone().unwrap();
    assert_eq!(out[0], json!({"n": 1}));
    assert_eq!(out[1]["error"], "denied", "{out}");
    assert!(
        out[1]["message"]
            .as_str()
            .unwrap()
            .contains("of `failing` failed"),
        "{out}"
    );
    assert_eq!(out[2]["error"], "unknown-workflow", "{out}");
    assert_eq!(out[3], "after");
    // The children are runs of their own, started by this one.
    let (children, _) = host
        .workflows
        .list(&wf_host::domain::ListQuery {
            workflow: Some("child".into()),
            status: None,
            limit: 10,
            cursor: None,
        })
        .await
        .unwrap();
    assert_eq!(children.len(), 1);
    let child = host
        .workflows
        .get(&children[0].run_id, false)
        .await
        .unwrap();
    assert_eq!(child.trigger.as_ref().unwrap()["kind"], "parent");
    assert_eq!(child.trigger.as_ref().unwrap()["run_id"], json!(run.run_id));
    // Without the grant, no child starts.
    let denied = host
        .run(
            "ungranted",
            json!({"do": [{"workflow": "child", "input": 2}]}),
        )
        .await;
    assert_eq!(denied.status, RunStatus::Succeeded, "{denied:#?}");
    let out = denied.output.unwrap();
    assert_eq!(out[0]["error"], "denied");
    assert!(
        out[0]["message"]
            .as_str()
            .unwrap()
            .contains("`workflow.child`"),
        "{out}"
    );
    host.close().await;
}

/// The same durable flow in Python and in JavaScript (`plugins/py-durable`,
/// `plugins/js-durable`): the clock, a call, a sleep, a signal, a child run,
/// two calls at once, a call and the clock again. Each call is made once
/// across the node's three runs, both clock reads give what the first run
/// read, and the two calls overlapped at the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_durable_flow_runs_in_python_and_javascript() {
    for node in ["{py-durable}", "{js-durable}"] {
        let host = Host::new(&format!(
            r#"[[workflows.flow.steps]]
id = "lead"
component = "{node}"
allow = ["fixture.echo", "fixture.sleep", "workflow.child"]

[[workflows.child.steps]]
id = "echo"
component = "{{echo}}"
"#
        ))
        .await;
        let input = json!({"do": [
            {"clock": true},
            {"call": "fixture.echo", "arguments": {"text": "start"}},
            {"sleep_ms": 200},
            {"signal": "go"},
            {"workflow": "child", "input": {"n": 1}},
            {"together": [
                {"call": "fixture.sleep", "arguments": {"ms": 500}},
                {"call": "fixture.sleep", "arguments": {"ms": 500}},
            ]},
            {"call": "fixture.echo", "arguments": {"text": "end"}},
            {"clock": true},
        ]});
        let started = host.workflows.start("flow", input, None).await.unwrap();
        let id = started.run_id;
        host.progress_says(&id, "lead", "waiting for signal `go`")
            .await;
        let before = host.workflows.get(&id, true).await.unwrap();
        host.workflows.signal(&id, "go", json!("ok")).await.unwrap();
        let run = host.finish(&id).await;
        assert_eq!(run.status, RunStatus::Succeeded, "{node}: {run:#?}");
        let out = run.output.clone().unwrap();
        assert_eq!(out[1], "start", "{node}: {out}");
        assert_eq!(out[3], "ok", "{node}: {out}");
        assert_eq!(out[4], json!({"n": 1}), "{node}: {out}");
        assert_eq!(out[6], "end", "{node}: {out}");
        // The clock read first was journaled with the first call, before
        // the node was let go, and read again by its later runs.
        let first = &step(&before, "lead").calls.as_ref().unwrap()[0];
        let walls: Vec<i64> = first
            .tape
            .as_ref()
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["wall"].as_u64())
            .map(|ns| (ns / 1_000_000) as i64)
            .collect();
        let read = out[0].as_i64().unwrap();
        assert!(
            walls.iter().any(|ms| (ms - read).abs() <= 1),
            "{node}: the clock read {read}, not one the first run read {walls:?}"
        );
        let span = |r: &Value| {
            let s = &r["structuredContent"];
            (
                s["started_ms"].as_u64().unwrap(),
                s["ended_ms"].as_u64().unwrap(),
            )
        };
        let (a, b) = (span(&out[5][0]), span(&out[5][1]));
        assert!(
            a.0.max(b.0) < a.1.min(b.1),
            "{node}: no overlap: {a:?} {b:?}"
        );
        let tools: Vec<Value> = host.witness().iter().map(|c| c["tool"].clone()).collect();
        assert_eq!(
            tools,
            [json!("echo"), json!("sleep"), json!("sleep"), json!("echo")],
            "{node}: each call once"
        );
        host.close().await;
    }
}

/// A TOML step `workflow = "name"` runs that workflow as a child run on
/// its input mapping and gives its output to the steps after it; a child
/// that fails fails the step with the child's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_step_runs_a_workflow_and_gives_its_output() {
    let host = Host::new(
        r#"[[workflows.parent.steps]]
id = "kid"
workflow = "child"
input = '{n: .input.n}'
[[workflows.parent.steps]]
id = "after"
component = "{echo}"
needs = ["kid"]
input = '{got: .steps.kid.output}'

[[workflows.sad.steps]]
id = "kid"
workflow = "failing"

[[workflows.child.steps]]
id = "echo"
component = "{echo}"

[[workflows.failing.steps]]
id = "call"
component = "{call}"
input = '{capability: "fixture.add", arguments: {a: 1, b: 2}}'
"#,
    )
    .await;
    let run = host.run("parent", json!({"n": 5})).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(run.output, Some(json!({"got": {"n": 5}})));
    let kid = step(&run, "kid");
    assert_eq!(kid.input.as_ref().unwrap()["workflow"], "child");
    let sad = host.run("sad", json!({})).await;
    assert_eq!(sad.status, RunStatus::Failed, "{sad:#?}");
    let error = step(&sad, "kid").error.clone().unwrap();
    assert_eq!(error.code, "denied", "{error:?}");
    assert!(error.message.contains("of `failing` failed"), "{error:?}");
    host.close().await;
}

/// A child step that names no workflow, or a workflow that runs itself
/// through its children, is refused at load, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_step_naming_nothing_or_itself_is_refused_at_load() {
    let unknown = Host::open(
        r#"[[workflows.a.steps]]
id = "kid"
workflow = "nowhere"
"#,
        Options::default(),
    )
    .await
    .err()
    .expect("refused");
    assert!(
        unknown
            .to_string()
            .contains("`workflow = \"nowhere\"` names no configured workflow (there are a)"),
        "{unknown}"
    );
    let cycle = Host::open(
        r#"[[workflows.a.steps]]
id = "to-b"
workflow = "b"
[[workflows.b.steps]]
id = "to-a"
workflow = "a"
"#,
        Options::default(),
    )
    .await
    .err()
    .expect("refused");
    assert!(
        cycle
            .to_string()
            .contains("runs itself as a child (a → b → a)"),
        "{cycle}"
    );
}

/// Cancelling a run whose node waits for a child cancels the child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parent_cancels_its_child() {
    let host = Host::new(FAMILY).await;
    let input = json!({"do": [{"workflow": "stuck", "input": {"do": [{"signal": "never"}]}}]});
    let parent = host.workflows.start("parent", input, None).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let child = loop {
        let (runs, _) = host
            .workflows
            .list(&wf_host::domain::ListQuery {
                workflow: Some("stuck".into()),
                status: None,
                limit: 1,
                cursor: None,
            })
            .await
            .unwrap();
        if let Some(run) = runs.first() {
            break run.run_id.clone();
        }
        assert!(Instant::now() < deadline, "no child run started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    host.progress_says(&child, "wait", "waiting for signal `never`")
        .await;
    host.workflows.cancel(&parent.run_id).await.unwrap();
    let child = host.finish(&child).await;
    assert_eq!(child.status, RunStatus::Cancelled, "{child:#?}");
    host.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_list_newest_first_in_pages_from_the_store() {
    let host = Host::new(
        r#"[[workflows.a.steps]]
id = "s"
component = "{echo}"
[[workflows.b.steps]]
id = "s"
component = "{echo}"
"#,
    )
    .await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            host.run(if i % 2 == 0 { "a" } else { "b" }, json!(i))
                .await
                .run_id,
        );
    }
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let (page, next) = host
            .workflows
            .list(&wf_host::store::ListQuery {
                limit: 2,
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
    let newest_first: Vec<_> = ids.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    let (only_a, _) = host
        .workflows
        .list(&wf_host::store::ListQuery {
            workflow: Some("a".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(only_a.len(), 3);
    host.close().await;
}

#[test]
fn wf_host_run_runs_a_whole_workflow_and_prints_its_output() {
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        r#"[[workflows.w.steps]]
id = "a"
component = "{echo}"
input = "{doubled: (.input * 2)}"
"#,
    );
    let out = Command::new(wf_host_bin())
        .args(["run", "--config"])
        .arg(dir.path().join("wf.toml"))
        .args(["--workflow", "w", "--input", "21"])
        .env("WF_HOST_CACHE_DIR", dir.path().join("cache"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"doubled\":42}\n",
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0));
    // In memory unless --state: nothing was written beside the config.
    assert!(!dir.path().join(".wf-host").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_sigkills_during_fifty_runs_lose_nothing_and_rerun_no_finished_step() {
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        r#"[runtime]
state = "state.db"

[[workflows.chain.steps]]
id = "one"
component = "{call}"
allow = ["fixture.echo"]
input = '{capability: "fixture.echo", arguments: {text: "one-\(.input)"}}'
[[workflows.chain.steps]]
id = "two"
component = "{call}"
allow = ["fixture.sleep"]
needs = ["one"]
input = '{capability: "fixture.sleep", arguments: {ms: (50 + (.input % 7) * 30)}}'
[[workflows.chain.steps]]
id = "three"
component = "{call}"
allow = ["fixture.echo"]
needs = ["two"]
input = '{capability: "fixture.echo", arguments: {text: "three-\(.input)"}}'
"#,
    );
    let witness = dir.path().join("witness.jsonl");
    let serve = Serve::start(dir.path());
    let mut ids = Vec::new();
    for n in 0..50 {
        let started = serve
            .call("workflow.start", json!({"workflow": "chain", "input": n}))
            .await;
        ids.push(started["run_id"].as_str().unwrap().to_owned());
    }
    let mut serve = Some(serve);
    for _ in 0..20 {
        let wait = rand::random_range(30..300);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        serve.take().unwrap().kill();
        serve = Some(Serve::start(dir.path()));
    }
    let serve = serve.unwrap();
    for (n, id) in ids.iter().enumerate() {
        let done = serve
            .call("workflow.wait", json!({"run_id": id, "timeout_ms": 60000}))
            .await;
        assert_eq!(done["status"], "succeeded", "run {n}: {done}");
        assert_eq!(done["output"]["content"][0]["text"], format!("three-{n}"));
    }
    // In the witness, every call of a step comes before the first call of the
    // step that needs it: a step that had finished (its output committed, so
    // the next step could start) never ran again.
    let calls = read_witness(&witness);
    for (n, id) in ids.iter().enumerate() {
        let pos = |pred: &dyn Fn(&Value) -> bool| -> Vec<usize> {
            calls
                .iter()
                .enumerate()
                .filter(|(_, c)| pred(c))
                .map(|(i, _)| i)
                .collect()
        };
        let one = pos(&|c| c["arguments"]["text"] == format!("one-{n}"));
        let two = pos(&|c| {
            c["tool"] == "sleep"
                && c["meta"]["wf-host/idempotency-key"]
                    .as_str()
                    .is_some_and(|k| k.starts_with(&format!("{id}/two/")))
        });
        let three = pos(&|c| c["arguments"]["text"] == format!("three-{n}"));
        assert!(!one.is_empty() && !two.is_empty() && !three.is_empty());
        assert!(
            one.last() < two.first() && two.last() < three.first(),
            "run {n}: step calls out of order (one {one:?}, two {two:?}, three {three:?})"
        );
    }
    serve.kill();
    let check = sqlite(
        &dir.path().join("state.db"),
        "print(c.execute('PRAGMA integrity_check').fetchone()[0])",
    );
    assert_eq!(check, "ok\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_step_shows_the_latest_progress_of_its_call() {
    let host = Host::new(
        r#"[[workflows.w.steps]]
id = "long"
component = "{call}"
allow = ["fixture.progress"]
input = '{capability: "fixture.progress", arguments: {steps: 30, interval_ms: 100}}'
"#,
    )
    .await;
    let started = host.workflows.start("w", json!(null), None).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let progress = loop {
        let run = host.workflows.get(&started.run_id, false).await.unwrap();
        if let Some(p) = &step(&run, "long").progress {
            break serde_json::to_value(p).unwrap();
        }
        assert!(Instant::now() < deadline, "no progress shown: {run:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(progress["total"], 30.0, "{progress}");
    let n = progress["progress"].as_f64().unwrap();
    assert!((1.0..30.0).contains(&n), "{progress}");
    assert_eq!(progress["message"], format!("step {n} of 30"));
    let run = host.finish(&started.run_id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(step(&run, "long").progress, None);
    host.close().await;
}

/// `a` → `nap` (a durable sleep) → `b`, and the same with `until` from the
/// input.
const NAP: &str = r#"
[[workflows.nap.steps]]
id = "a"
component = "{echo}"
[[workflows.nap.steps]]
id = "nap"
needs = ["a"]
sleep = "1s"
[[workflows.nap.steps]]
id = "b"
component = "{echo}"
needs = ["nap"]

[[workflows.until.steps]]
id = "nap"
until = '.input.at'
[[workflows.until.steps]]
id = "b"
component = "{echo}"
needs = ["nap"]
input = '{at: .steps.nap.output.at, slept: true}'
"#;

/// The time `d` from now, as RFC 3339 in UTC with milliseconds.
fn rfc3339_in(d: Duration) -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now() + d).to_string()
}

/// Milliseconds between two RFC 3339 times of the same run.
fn ms_between(from: &str, to: &str) -> i64 {
    let at = |t: &str| {
        humantime::parse_rfc3339_weak(t)
            .unwrap_or_else(|e| panic!("`{t}`: {e}"))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    at(to) - at(from)
}

/// Sleep steps hold no step slot: with one slot, 1,000 runs that each sleep
/// a second between two node steps all finish within seconds (holding the
/// slot, they would take 1,000 s). Each run sleeps its second, stores when
/// it wakes as the sleep step's input, and passes its data through it.
/// `until` sleeps until the time its jq gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_sleeping_runs_hold_no_step_slot_and_each_sleeps_its_time() {
    const RUNS: usize = 1000;
    let options = Options {
        max_concurrent_steps: 1,
        ..Options::default()
    };
    let host = Host::open(NAP, options).await.unwrap();
    let started = Instant::now();
    let mut ids = Vec::with_capacity(RUNS);
    for n in 0..RUNS {
        let run = host
            .workflows
            .start("nap", json!({ "n": n }), None)
            .await
            .unwrap();
        ids.push(run.run_id);
    }
    for (n, run_id) in ids.iter().enumerate() {
        let run = host.finish(run_id).await;
        assert_eq!(run.status, RunStatus::Succeeded, "{run:?}");
        assert_eq!(run.output, Some(json!({ "n": n })), "data passes through");
        let steps = run.steps.as_ref().unwrap();
        let nap = &steps[1];
        assert_eq!((nap.id.as_str(), nap.attempts), ("nap", 1));
        assert_eq!(nap.output, Some(json!({ "n": n })));
        let until = nap.input.as_ref().unwrap()["until"].as_str().unwrap();
        let woke = nap.finished_at.as_deref().unwrap();
        assert!(
            ms_between(until, woke) >= 0,
            "{run_id}: woke at {woke}, before {until}"
        );
        // The wake time is worked out just before the start is stored.
        let asked = ms_between(nap.started_at.as_deref().unwrap(), until);
        assert!((900..=1000).contains(&asked), "{run_id}: sleeps {asked} ms");
    }
    let all = started.elapsed();
    assert!(
        all < Duration::from_secs(60),
        "1,000 sleeping runs took {all:?}: a sleep holds a step slot"
    );

    let at = rfc3339_in(Duration::from_millis(1500));
    let run = host.run("until", json!({ "at": at })).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:?}");
    assert_eq!(run.output, Some(json!({ "at": at, "slept": true })));
    let nap = &run.steps.as_ref().unwrap()[0];
    let until = nap.input.as_ref().unwrap()["until"].as_str().unwrap();
    assert_eq!(ms_between(&at, until), 0, "it sleeps until `at`");
    assert!(ms_between(&at, nap.finished_at.as_deref().unwrap()) >= 0);
    // A time that is not one fails the step, naming what it got.
    let run = host.run("until", json!({ "at": "tomorrow" })).await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap();
    assert_eq!(error.code, "until");
    assert!(error.message.contains("\"tomorrow\""), "{error:?}");
    // A cancel ends a sleep at once.
    let at = rfc3339_in(Duration::from_secs(60));
    let run = host
        .workflows
        .start("until", json!({ "at": at }), None)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = host.workflows.get(&run.run_id, false).await.unwrap();
        if got.steps.is_some_and(|s| s[0].input.is_some()) {
            break;
        }
        assert!(Instant::now() < deadline, "the sleep step never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked = Instant::now();
    let cancelled = host.workflows.cancel(&run.run_id).await.unwrap();
    assert_eq!(cancelled.status, RunStatus::Cancelled, "{cancelled:?}");
    assert!(asked.elapsed() < Duration::from_secs(5));
    let steps = host.finish(&run.run_id).await.steps.unwrap();
    assert_eq!(steps[0].status, StepStatus::Cancelled, "{steps:?}");
    host.close().await;
}

/// A run sleeping 4 s survives a SIGKILL of `serve` 1 s in: after the
/// restart it sleeps only what is left (its stored wake time, unchanged),
/// wakes on time (not a whole new sleep later) and not before, and its
/// sleep step is not counted as a crashed attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_run_survives_a_sigkill_and_wakes_on_time() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &NAP.replace("sleep = \"1s\"", "sleep = \"4s\""));
    let serve = Serve::start(dir.path());
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "nap", "input": {"n": 7}}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    let mut until = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while until.is_empty() {
        assert!(Instant::now() < deadline, "the sleep step never started");
        let got = serve.call("workflow.get", json!({"run_id": run_id})).await;
        if let Some(text) = got["steps"][1]["input"]["until"].as_str() {
            assert_eq!(got["steps"][1]["status"], "running", "{got}");
            until = text.to_owned();
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    serve.kill();

    let serve = Serve::start(dir.path());
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], json!({"n": 7}));
    let got = serve.call("workflow.get", json!({"run_id": run_id})).await;
    let nap = &got["steps"][1];
    assert_eq!(nap["input"]["until"], json!(until), "the wake time is kept");
    assert_eq!(nap["attempts"], 1, "not a crashed attempt: {nap}");
    let woke = nap["finished_at"].as_str().unwrap();
    let late = ms_between(&until, woke);
    assert!(late >= 0, "woke at {woke}, before {until}");
    assert!(
        late < 1000,
        "woke {late} ms after {until}: it slept anew after the restart"
    );
    let asked = ms_between(nap["started_at"].as_str().unwrap(), &until);
    assert!((3900..=4000).contains(&asked), "sleeps {asked} ms");
}

/// A durable node's host is SIGKILLed while the node sleeps: the restarted
/// host goes on from its journal (the call it made before is not made
/// again, the sleep keeps its wake time), the node waits for its signal,
/// and the run succeeds with each side effect made once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_node_survives_a_sigkill_while_it_sleeps() {
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        &format!("[runtime]\nstate = \"state.db\"\n\n{APPROVAL}"),
    );
    let serve = Serve::start(dir.path());
    let input = json!({"request": "deploy", "notify": "fixture.echo", "sleep_ms": 3000});
    let started = serve
        .call("workflow.start", json!({"workflow": "w", "input": input}))
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    let sleeping = serve.says(&run_id, "sleeping until").await;
    serve.kill();

    let serve = Serve::start(dir.path());
    // The same wake time, then the wait for the signal.
    assert_eq!(serve.says(&run_id, "sleeping until").await, sleeping);
    serve.says(&run_id, "waiting for signal `approve`").await;
    serve
        .call(
            "workflow.signal",
            json!({"run_id": run_id, "signal": "approve", "payload": {"ok": true}}),
        )
        .await;
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"]["decision"], json!({"ok": true}));
    let texts: Vec<Value> = read_witness(&dir.path().join("witness.jsonl"))
        .iter()
        .map(|c| c["arguments"]["text"].clone())
        .collect();
    // The clock and the random number read before the crash are the ones
    // the node read after it: the call made before the crash says them.
    assert_eq!(
        texts,
        [
            json!(asked_text("deploy", &done["output"])),
            json!("decision for \"deploy\": {\"ok\":true}")
        ],
        "each call once, across the crash"
    );
    // The attempt after the crash journaled the whole node again.
    let got = serve
        .call("workflow.get", json!({"run_id": run_id, "calls": true}))
        .await;
    let last: Vec<(Value, Value)> = got["steps"][0]["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["attempt"] == 2)
        .map(|c| (c["seq"].clone(), c["name"].clone()))
        .collect();
    assert_eq!(
        last,
        [
            (json!(1), json!("fixture.echo")),
            (json!(2), json!("wf:sleep")),
            (json!(3), json!("wf:wait-signal")),
            (json!(4), json!("fixture.echo")),
        ]
    );
}

/// The flow of a durable node end to end, against a server on the official
/// Python SDK (its own process, so its record of calls outlives `serve`):
/// it reads the clock, marks, sleeps 3 s, waits for a signal, runs a child
/// workflow, makes two 1 s calls at once, marks again and reads the clock.
/// `serve` is SIGKILLed during the sleep and restarted. The run succeeds;
/// each call reached the server once; the clock read before the crash is
/// the one the node read after it; the two calls overlapped at the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_flow_survives_a_sigkill_with_each_side_effect_once() {
    use common::interop::{HttpServer, Sdk};
    let python = HttpServer::start(Sdk::Python, "127.0.0.1:0");
    let dir = tempfile::tempdir().unwrap();
    let body = format!(
        r#"[runtime]
state = "state.db"

[rpc]
allow = ["python.call_log"]

[connections.python]
url = "{url}"

[[workflows.flow.steps]]
id = "lead"
component = "{{durable}}"
allow = ["python.echo", "python.sleep", "workflow.child"]

[[workflows.child.steps]]
id = "echo"
component = "{{echo}}"
"#,
        url = python.url()
    );
    write_config(dir.path(), &body);
    let serve = Serve::start(dir.path());
    let input = json!({"do": [
        {"clock": true},
        {"call": "python.echo", "arguments": {"text": "start"}},
        {"sleep_ms": 3000},
        {"signal": "go"},
        {"workflow": "child", "input": {"n": 1}},
        {"together": [
            {"call": "python.sleep", "arguments": {"ms": 1000}},
            {"call": "python.sleep", "arguments": {"ms": 1000}},
        ]},
        {"call": "python.echo", "arguments": {"text": "end"}},
        {"clock": true},
    ]});
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "flow", "input": input}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    serve.says(&run_id, "sleeping until").await;
    serve.kill();

    let serve = Serve::start(dir.path());
    serve.says(&run_id, "waiting for signal `go`").await;
    serve
        .call(
            "workflow.signal",
            json!({"run_id": run_id, "signal": "go", "payload": "ok"}),
        )
        .await;
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 60000}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let out = done["output"].as_array().unwrap().clone();
    assert_eq!(out[1], "start");
    assert_eq!(out[3], "ok");
    assert_eq!(out[4], json!({"n": 1}), "the child's output");
    assert_eq!(out[5], json!(["slept 1000ms", "slept 1000ms"]));
    assert_eq!(out[6], "end");

    // The clock read before the crash (journaled with the first call of the
    // first attempt) is the one the node read after it.
    let got = serve
        .call("workflow.get", json!({"run_id": run_id, "calls": true}))
        .await;
    let calls = got["steps"][0]["calls"].as_array().unwrap().clone();
    let first = calls
        .iter()
        .find(|c| c["attempt"] == 1 && c["seq"] == 1)
        .unwrap();
    let wall = first["tape"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|r| r["wall"].as_u64())
        .expect("a wall clock read before the first call");
    assert_eq!(out[0], json!(wall / 1_000_000), "{first}");
    assert!(
        calls.iter().any(|c| c["attempt"] == 2),
        "the node went on in a new attempt after the crash: {calls:?}"
    );

    // Each call reached the server once; the two sleeps overlapped.
    let log = serve
        .call(
            "capability.call",
            json!({"name": "python.call_log", "arguments": {}}),
        )
        .await;
    let log: Value = serde_json::from_str(log["content"][0]["text"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("call_log is not JSON ({e}): {log}"));
    let of = |tool: &str| -> Vec<Value> {
        log["calls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["tool"] == tool)
            .cloned()
            .collect()
    };
    let echoes: Vec<Value> = of("echo")
        .iter()
        .map(|c| c["arguments"]["text"].clone())
        .collect();
    assert_eq!(echoes, [json!("start"), json!("end")], "{log}");
    let sleeps = of("sleep");
    assert_eq!(sleeps.len(), 2, "{log}");
    let span = |c: &Value| (c["at"].as_f64().unwrap(), c["ended"].as_f64().unwrap());
    let (a, b) = (span(&sleeps[0]), span(&sleeps[1]));
    assert!(
        a.0.max(b.0) < a.1.min(b.1),
        "the two sleeps did not overlap at the server: {a:?} and {b:?}"
    );
    // One child run.
    let children = serve
        .call("workflow.list", json!({"workflow": "child"}))
        .await;
    assert_eq!(children["runs"].as_array().unwrap().len(), 1, "{children}");
}

/// `wf-host replay` on a durable node's run: its waits are answered from the
/// journal (no sleep, no signal needed) and its clock and random reads read
/// again, so the same build replays with the same calls and output; another
/// build is told where it differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_run_replays_from_its_journal() {
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        &format!("[runtime]\nstate = \"state.db\"\n\n{APPROVAL}"),
    );
    let serve = Serve::start(dir.path());
    let input = json!({"request": "r", "notify": "fixture.echo", "sleep_ms": 100});
    let started = serve
        .call("workflow.start", json!({"workflow": "w", "input": input}))
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    serve.says(&run_id, "waiting for signal `approve`").await;
    serve
        .call(
            "workflow.signal",
            json!({"run_id": run_id, "signal": "approve", "payload": "yes"}),
        )
        .await;
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    serve.kill();
    let replay = |component: PathBuf| {
        let out = Command::new(wf_host_bin())
            .args(["replay", &run_id, "--config"])
            .arg(dir.path().join("wf.toml"))
            .arg("--component")
            .arg(format!("ask={}", component.display()))
            .env("WF_HOST_CACHE_DIR", dir.path().join("cache"))
            .env_remove("WF_HOST_STATE")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let started = Instant::now();
    let (code, stdout, stderr) = replay(repo_root().join("plugins/approval.wasm"));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert_eq!(stdout.trim(), "step `ask`: same calls (4) and same output");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the replay waited"
    );
    let (code, stdout, stderr) = replay(guest("durable"));
    assert_ne!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("different calls: call 1: the run made fixture.echo"),
        "{stdout}{stderr}"
    );
}

/// Fifty runs at once call a slow upstream tool through a connection with
/// `max_in_flight = 2`: the server never sees more than 2 calls at once
/// (it counts), the others wait their turn (shown as `queued`) and none
/// fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_runs_share_a_connection_that_takes_two_calls_at_once() {
    let host = Host::new(
        r#"[connections.limited]
command = "wf-host"
args = ["fixture-server"]
max_in_flight = 2

[workflows.slow]
component = "{call}"
allow = ["limited.sleep"]
"#,
    )
    .await;
    let started = Instant::now();
    let mut runs = Vec::new();
    for _ in 0..50 {
        let input = json!({"capability": "limited.sleep", "arguments": {"ms": 100}});
        runs.push(
            host.workflows
                .start("slow", input, None)
                .await
                .unwrap()
                .run_id,
        );
    }
    let mut most_queued = 0;
    for id in &runs {
        loop {
            let stats = host.pool.connection_stats("limited").unwrap();
            most_queued = most_queued.max(stats.queued);
            let run = host.workflows.get(id, false).await.unwrap();
            if run.status.is_finished() {
                assert_eq!(run.status, RunStatus::Succeeded, "{run:?}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let took = started.elapsed();
    let log = host
        .pool
        .call_tool("limited", "call_log", serde_json::Map::new(), None)
        .await
        .unwrap();
    assert_eq!(log["structuredContent"]["max_in_flight"], 2, "{log}");
    assert!(
        most_queued >= 10,
        "the runs waited their turn: {most_queued} queued at most"
    );
    // 50 calls of 100 ms, 2 at a time.
    assert!(took >= Duration::from_millis(2400), "{took:?}");
    assert_eq!(host.pool.connection_stats("limited").unwrap().queued, 0);
    host.close().await;
}

/// Forty runs at once call a tool through a connection with `rate =
/// "20/s"` and `burst = 1`: the server sees them spaced at 20 a second,
/// never more than 10 % faster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_rate_spaces_the_calls_of_many_runs() {
    let host = Host::new(
        r#"[connections.paced]
command = "wf-host"
args = ["fixture-server"]
rate = "20/s"
burst = 1

[workflows.ping]
component = "{call}"
allow = ["paced.echo"]
"#,
    )
    .await;
    let mut runs = Vec::new();
    for i in 0..40 {
        let input = json!({"capability": "paced.echo", "arguments": {"text": format!("{i}")}});
        runs.push(
            host.workflows
                .start("ping", input, None)
                .await
                .unwrap()
                .run_id,
        );
    }
    for id in &runs {
        let run = host.finish(id).await;
        assert_eq!(run.status, RunStatus::Succeeded, "{run:?}");
    }
    let log = host
        .pool
        .call_tool("paced", "call_log", serde_json::Map::new(), None)
        .await
        .unwrap();
    let arrivals: Vec<u64> = log["structuredContent"]["arrivals_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(arrivals.len(), 40);
    let span = (arrivals.iter().max().unwrap() - arrivals.iter().min().unwrap()) as f64 / 1000.0;
    let rate = 39.0 / span;
    // The limit holds within 10 % (never faster); slower only by what a
    // busy machine adds to each wait.
    assert!(rate <= 22.0, "{rate:.1} calls/s over {span:.2} s");
    assert!(rate >= 15.0, "{rate:.1} calls/s over {span:.2} s");
    host.close().await;
}

/// A run whose step calls a tool the server makes a task (4 s) survives a
/// SIGKILL of `serve` 1.5 s in: after the restart the step follows the same
/// upstream task with `tasks/get` instead of calling the tool again, so the
/// server saw exactly one call and no cancel. A cancelled run cancels its
/// task upstream (`tasks/cancel`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_run_follows_its_upstream_task_again_and_never_calls_twice() {
    let dir = tempfile::tempdir().unwrap();
    // The upstream outlives `serve`: its own process, over HTTP.
    let remote = HttpFixture::start("127.0.0.1:0");
    write_config(
        dir.path(),
        &format!(
            r#"[runtime]
state = "state.db"

[connections.remote]
url = "{url}"

[workflows.long]
component = "{{call}}"
allow = ["remote.task_sleep"]
"#,
            url = remote.url()
        ),
    );
    let call_log = async |serve: &Serve| -> Value {
        let got = serve
            .call("capability.call", json!({"name": "remote.call_log"}))
            .await;
        got["structuredContent"].clone()
    };
    let task_sleeps = |log: &Value| {
        log["calls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["tool"] == "task_sleep")
            .count()
    };

    let serve = Serve::start(dir.path());
    let input = json!({"capability": "remote.task_sleep", "arguments": {"ms": 4000}});
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "long", "input": input}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = call_log(&serve).await;
        if task_sleeps(&log) == 1 && log["task_polls"].as_u64() > Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "the task never started: {log}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    serve.kill();

    let serve = Serve::start(dir.path());
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(
        done["output"]["content"][0]["text"], "slept 4000ms as a task",
        "{done}"
    );
    let log = call_log(&serve).await;
    assert_eq!(task_sleeps(&log), 1, "the tool was called again: {log}");
    assert_eq!(log["cancelled"], json!([]), "{log}");
    assert_eq!(log["sessions"], 2, "one session per serve: {log}");

    // Cancelling a run cancels its upstream task.
    let input = json!({"capability": "remote.task_sleep", "arguments": {"ms": 60000}});
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "long", "input": input}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut polls = None;
    loop {
        // Followed: polled since the call arrived (a cancel before the
        // server's answer arrives cancels the request, not a task).
        let log = call_log(&serve).await;
        let now = log["task_polls"].as_u64().unwrap();
        if task_sleeps(&log) == 2 {
            if polls.is_some_and(|p| now > p) {
                break;
            }
            polls.get_or_insert(now);
        }
        assert!(
            Instant::now() < deadline,
            "the second task never started: {log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled = serve
        .call("workflow.cancel", json!({"run_id": run_id}))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = call_log(&serve).await;
        if log["cancelled"] == json!([{"session": 2, "tool": "task_sleep"}]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tasks/cancel never arrived: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    serve.kill();
}

/// A step whose call waits on an upstream task lets go of its node
/// (parks): with one step slot, the calls of three runs all reach the
/// server while the first task still works, and meanwhile no node instance
/// is alive. When a task ends, its node runs again: its earlier call (`echo`)
/// and the task's call are answered from before, not made again, and the
/// journal holds each call once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_waiting_on_an_upstream_task_holds_no_node_and_no_step_slot() {
    let options = Options {
        max_concurrent_steps: 1,
        ..Options::default()
    };
    let host = Host::open(
        r#"[workflows.long]
component = "{call}"
allow = ["fixture.task_sleep", "fixture.echo"]
"#,
        options,
    )
    .await
    .unwrap();
    let mut runs = Vec::new();
    for i in 0..3 {
        let input = json!({
            "before": [{"capability": "fixture.echo", "arguments": {"text": format!("run {i}")}}],
            "capability": "fixture.task_sleep",
            "arguments": {"ms": 8000},
        });
        let started = host.workflows.start("long", input, None).await.unwrap();
        runs.push(started.run_id);
    }
    let calls_of = |tool: &str| host.witness().iter().filter(|c| c["tool"] == tool).count();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let running = host.host.runtime().stats().running;
        if calls_of("task_sleep") == 3 && running == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} tasks made, {running} nodes running",
            calls_of("task_sleep")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for id in &runs {
        let run = host.workflows.get(id, false).await.unwrap();
        assert!(
            !run.status.is_finished(),
            "a task ended before all were made: {run:?}"
        );
    }
    for (i, id) in runs.iter().enumerate() {
        let run = host.finish(id).await;
        assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
        let output = run.output.as_ref().unwrap();
        assert_eq!(
            text_of(&output["result"]),
            "slept 8000ms as a task",
            "{output}"
        );
        assert_eq!(
            text_of(&output["before"][0]),
            format!("run {i}"),
            "{output}"
        );
        let calls = serde_json::to_value(step(&run, "main").calls.as_ref().unwrap()).unwrap();
        let journaled: Vec<_> = calls
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["attempt"].clone(), c["seq"].clone(), c["name"].clone()))
            .collect();
        assert_eq!(
            journaled,
            [
                (json!(1), json!(1), json!("fixture.echo")),
                (json!(1), json!(2), json!("fixture.task_sleep")),
            ],
            "{calls}"
        );
    }
    assert_eq!(calls_of("echo"), 3, "an earlier call was made again");
    assert_eq!(calls_of("task_sleep"), 3, "a task's call was made again");
    let log = host
        .pool
        .call_tool("fixture", "call_log", serde_json::Map::new(), None)
        .await
        .unwrap();
    assert_eq!(
        log["structuredContent"]["cancelled"],
        json!([]),
        "a parked step cancelled its task: {log}"
    );
    host.close().await;
}

/// Waits until step `step` of run `run_id` shows an open question; returns it.
async fn question_of(host: &Host, run_id: &str, step: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = host.workflows.get(run_id, false).await.unwrap();
        let shown = serde_json::to_value(&run).unwrap();
        let steps = shown["steps"].as_array().cloned().unwrap_or_default();
        let shown_step = steps.iter().find(|s| s["id"] == step);
        if let Some(q) = shown_step.and_then(|s| s["questions"].get(0)) {
            // Asked, the step waits for its answer.
            assert_eq!(shown_step.unwrap()["status"], "waiting", "{shown}");
            return q.clone();
        }
        assert!(Instant::now() < deadline, "no question shown: {shown}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const ASKING: &str = r#"[workflows.asks]
component = "{call}"
allow = ["fixture.ask"]
"#;

/// Tools of a server on the TypeScript SDK 1.x that run only as tasks, in
/// revision 2025-11-25's form (`taskSupport: "required"`; `task` in
/// `tools/call`, `tasks/get`, `tasks/result`): a node's call of one runs as
/// a task, followed past the connection's `call_timeout` and past the step
/// letting go of its node (`waiting` for the task), and made once; a task
/// that asks for input (`input_required`) shows the question on the step,
/// and `workflow.answer` gives the task its answer; cancelling the run
/// cancels its task upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typescript_sdk_task_tool_runs_as_a_2025_11_25_task() {
    let (node, args) = common::interop::Sdk::Node.command();
    let host = Host::new(&format!(
        "[connections.ts]\ncommand = {node:?}\nargs = {args:?}\ncall_timeout = \"1s\"\n\n[workflows.asks]\ncomponent = \"{{call}}\"\nallow = [\"ts.*\"]\n",
        node = node.display().to_string(),
    ))
    .await;
    let input = json!({"capability": "ts.task_sleep", "arguments": {"ms": 2500}});
    let run_id = host
        .workflows
        .start("asks", input, None)
        .await
        .unwrap()
        .run_id;
    let done = host.finish(&run_id).await;
    assert_eq!(done.status, RunStatus::Succeeded, "{done:?}");
    assert_eq!(
        done.output.as_ref().unwrap()["content"][0]["text"],
        "slept 2500",
        "{done:?}"
    );
    // It let go of its node while the task ran, and went on with its result.
    let events = host.workflows.events(Some(&run_id), 0, 100).await.unwrap();
    let parked = events
        .iter()
        .find(|e| e.kind == "step.parked")
        .unwrap_or_else(|| panic!("never parked: {events:?}"));
    assert_eq!(parked.data["call"], "ts.task_sleep", "{parked:?}");
    assert!(parked.data["task"].is_string(), "{parked:?}");

    let input = json!({"capability": "ts.task_ask", "arguments": {"message": "Which colour?"}});
    let run_id = host
        .workflows
        .start("asks", input, None)
        .await
        .unwrap()
        .run_id;
    let asked = question_of(&host, &run_id, "main").await;
    assert_eq!(asked["question"]["message"], "Which colour?", "{asked}");
    let good = wf_host::capability::Answer {
        action: "accept".into(),
        content: Some(json!({"answer": "teal"})),
    };
    host.workflows
        .answer(&run_id, "main", 0, good)
        .await
        .unwrap();
    let done = host.finish(&run_id).await;
    assert_eq!(done.status, RunStatus::Succeeded, "{done:?}");
    assert_eq!(
        done.output.as_ref().unwrap()["content"][0]["text"],
        "answer: teal"
    );

    // Cancelling the run cancels its task upstream (`tasks/cancel`).
    let input = json!({"capability": "ts.task_sleep", "arguments": {"ms": 60000}});
    let run_id = host
        .workflows
        .start("asks", input, None)
        .await
        .unwrap()
        .run_id;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host
        .workflows
        .events(Some(&run_id), 0, 100)
        .await
        .unwrap()
        .iter()
        .any(|e| e.kind == "step.parked")
    {
        assert!(
            Instant::now() < deadline,
            "the step never let go of its node"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    host.workflows.cancel(&run_id).await.unwrap();
    let call_log = async || {
        let log = host
            .pool
            .call_tool("ts", "call_log", serde_json::Map::new(), None)
            .await
            .unwrap();
        serde_json::from_str::<Value>(log["content"][0]["text"].as_str().unwrap()).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = call_log().await;
        if log["cancelled"].as_array().is_some_and(|c| !c.is_empty()) {
            break log;
        }
        assert!(
            Instant::now() < deadline,
            "the task was not cancelled: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(log["cancelled"][0]["tool"], "task_sleep", "{log}");
    // Each tool was called once (as a task), never again.
    let called: Vec<&str> = log["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["tool"].as_str())
        .collect();
    assert_eq!(called, ["task_sleep", "task_ask", "task_sleep"], "{log}");
    host.close().await;
}

/// An upstream tool that asks a question mid-call (elicitation; at
/// 2026-07-28 an `input_required` round): the step shows the question with
/// its requested schema in `workflow.get` and a `step.question` event, an
/// answer that breaks the schema is refused and the question stays open,
/// and `workflow.answer` accept resumes the call with the content, past
/// the connection's `call_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_from_upstream_waits_for_workflow_answer() {
    let host = Host::new(&format!(
        "[connections.asker]\ncommand = \"wf-host\"\nargs = [\"fixture-server\"]\ncall_timeout = \"1s\"\n\n{}",
        ASKING.replace("fixture.ask", "asker.ask")
    ))
    .await;
    let input = json!({"capability": "asker.ask", "arguments": {"message": "Which colour?"}});
    let run_id = host
        .workflows
        .start("asks", input, None)
        .await
        .unwrap()
        .run_id;
    let asked = question_of(&host, &run_id, "main").await;
    assert_eq!(asked["item"], 0, "{asked}");
    let question = &asked["question"];
    assert_eq!(question["connection"], "asker");
    assert_eq!(question["tool"], "ask");
    assert_eq!(question["mode"], "form");
    assert_eq!(question["message"], "Which colour?");
    assert_eq!(
        question["requested_schema"]["required"],
        json!(["answer"]),
        "{question}"
    );
    let events = host.workflows.events(Some(&run_id), 0, 100).await.unwrap();
    assert!(
        events.iter().any(|e| e.kind == "step.question"),
        "{events:?}"
    );

    // Content that breaks the requested schema: refused, still open.
    let bad = wf_host::capability::Answer {
        action: "accept".into(),
        content: Some(json!({"answer": 7})),
    };
    let refused = host
        .workflows
        .answer(&run_id, "main", 0, bad)
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, WorkflowError::InvalidPayload(m) if m.contains("/answer")),
        "{refused}"
    );
    let wrong_step = host
        .workflows
        .answer(&run_id, "nope", 0, wf_host::capability::Answer::decline())
        .await
        .unwrap_err();
    assert!(
        matches!(&wrong_step, WorkflowError::NotWaiting { message, .. } if message.contains("open: `main` (item 0)")),
        "{wrong_step}"
    );
    // A person takes longer than the call's timeout: the call waits.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    question_of(&host, &run_id, "main").await;

    let good = wf_host::capability::Answer {
        action: "accept".into(),
        content: Some(json!({"answer": "teal"})),
    };
    host.workflows
        .answer(&run_id, "main", 0, good.clone())
        .await
        .unwrap();
    let done = host.finish(&run_id).await;
    assert_eq!(done.status, RunStatus::Succeeded, "{done:?}");
    assert_eq!(
        done.output.as_ref().unwrap()["content"][0]["text"],
        "answer: teal"
    );
    assert!(step(&done, "main").questions.is_empty());
    // Answered once: a second answer has no question to go to.
    let again = host
        .workflows
        .answer(&run_id, "main", 0, good)
        .await
        .unwrap_err();
    assert!(matches!(again, WorkflowError::NotWaiting { .. }), "{again}");
    host.close().await;
}

/// A question nobody answers is declined after the connection's
/// `elicitation_timeout`; with `elicitation = "decline"` it is declined at
/// once and never shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_question_is_declined_and_decline_mode_never_asks() {
    for (setting, waits) in [
        ("elicitation_timeout = \"1s\"", true),
        ("elicitation = \"decline\"", false),
    ] {
        let host = Host::new(&format!(
            "[connections.asker]\ncommand = \"wf-host\"\nargs = [\"fixture-server\"]\n{setting}\n\n{}",
            ASKING.replace("fixture.ask", "asker.ask")
        ))
        .await;
        let input = json!({"capability": "asker.ask", "arguments": {}});
        let started = Instant::now();
        let done = host.run("asks", input).await;
        assert_eq!(done.status, RunStatus::Succeeded, "{done:?}");
        assert_eq!(
            done.output.as_ref().unwrap()["content"][0]["text"],
            "declined",
            "{setting}"
        );
        let events = host
            .workflows
            .events(Some(&done.run_id), 0, 100)
            .await
            .unwrap();
        let asked = events.iter().any(|e| e.kind == "step.question");
        assert_eq!(asked, waits, "{setting}: {events:?}");
        if waits {
            assert!(started.elapsed() >= Duration::from_secs(1));
        }
        host.close().await;
    }
}

/// Questions from servers on the official SDKs: the Python `mcp` server
/// asks at 2026-07-28 (an `input_required` round, `Elicit` resolver), the
/// TypeScript server with `elicitation/create` mid-call (2025-11-25). Each
/// is shown on the step, one nobody answers is declined after the
/// connection's `elicitation_timeout`, one is accepted through
/// `workflow.answer` and the next declined, and the tool sees each answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_from_the_official_sdk_servers_are_answered_through_rpc() {
    use common::interop::Sdk;
    for sdk in [Sdk::Python, Sdk::Node] {
        let (program, args) = sdk.command();
        let args: Vec<toml::Value> = args.into_iter().map(toml::Value::from).collect();
        let host = Host::new(&format!(
            "[connections.sdk]\ncommand = {}\nargs = {}\nelicitation_timeout = \"3s\"\n\n{}",
            toml::Value::from(program.display().to_string()),
            toml::Value::from(args),
            ASKING.replace("fixture.ask", "sdk.ask")
        ))
        .await;
        // Nobody answers: declined after the connection's elicitation_timeout.
        let input = json!({"capability": "sdk.ask", "arguments": {"message": "Anyone?"}});
        let run_id = host
            .workflows
            .start("asks", input, None)
            .await
            .unwrap()
            .run_id;
        question_of(&host, &run_id, "main").await;
        let done = host.finish(&run_id).await;
        assert_eq!(
            done.output.as_ref().unwrap()["content"][0]["text"],
            "declined",
            "{sdk:?}: {done:?}"
        );
        for (action, content, said) in [
            ("accept", Some(json!({"answer": "teal"})), "answer: teal"),
            ("decline", None, "declined"),
        ] {
            let input = json!({"capability": "sdk.ask", "arguments": {"message": "Which colour?"}});
            let run_id = host
                .workflows
                .start("asks", input, None)
                .await
                .unwrap()
                .run_id;
            let asked = question_of(&host, &run_id, "main").await;
            assert_eq!(asked["question"]["message"], "Which colour?", "{sdk:?}");
            assert_eq!(
                asked["question"]["requested_schema"]["properties"]["answer"]["type"], "string",
                "{sdk:?}: {asked}"
            );
            let answer = wf_host::capability::Answer {
                action: action.into(),
                content,
            };
            host.workflows
                .answer(&run_id, "main", 0, answer)
                .await
                .unwrap();
            let done = host.finish(&run_id).await;
            assert_eq!(done.status, RunStatus::Succeeded, "{sdk:?}: {done:?}");
            assert_eq!(
                done.output.as_ref().unwrap()["content"][0]["text"],
                said,
                "{sdk:?}"
            );
        }
        host.close().await;
    }
}

/// A workflow `w` calling `fixture.echo` with a run timeout of `60 +
/// version` seconds, and a connection `other` with `call_timeout = {timeout}`.
fn reloadable(version: u64, timeout: &str) -> String {
    let run_timeout = 60 + version;
    format!(
        r#"[runtime]
state = "state.db"

[connections.other]
command = "wf-host"
args = ["fixture-server"]
call_timeout = "{timeout}"

[workflows.w]
timeout = "{run_timeout}s"
component = "{{call}}"
allow = ["fixture.echo", "other.echo"]
"#
    )
}

/// A thousand starts while the config is reloaded ten times
/// (`host.reload`): none is refused or lost; the connection whose settings
/// never change keeps its one session, the one whose settings change gets
/// a new one; `host.status` shows the config in force. An invalid config
/// is refused (-32009) with the reason, kept in `host.status`, and the old
/// one keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_load_refuse_nothing_and_keep_unchanged_sessions() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &reloadable(0, "30s"));
    let serve = Arc::new(Serve::start(dir.path()));
    let first = serve.call("host.status", json!({})).await;
    let sha0 = first["config"]["sha256"].as_str().unwrap().to_owned();
    assert_eq!(first["config"]["reloads"], 0, "{first}");

    let starts = {
        let serve = serve.clone();
        tokio::spawn(async move {
            let mut runs = Vec::new();
            for batch in 0..100 {
                let mut calls = Vec::new();
                for i in 0..10 {
                    let serve = serve.clone();
                    let n = batch * 10 + i;
                    let target = if n % 2 == 0 {
                        "fixture.echo"
                    } else {
                        "other.echo"
                    };
                    calls.push(tokio::spawn(async move {
                        let input =
                            json!({"capability": target, "arguments": {"text": format!("n{n}")}});
                        serve
                            .reply("workflow.start", json!({"workflow": "w", "input": input}))
                            .await
                    }));
                }
                for call in calls {
                    runs.push(call.await.unwrap());
                }
            }
            runs
        })
    };
    for round in 1..=10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The workflow changes every time; `other`'s settings every other time.
        let timeout = if round % 2 == 0 { "30s" } else { "31s" };
        write_config(dir.path(), &reloadable(round, timeout));
        let reloaded = serve.reply("host.reload", json!({})).await;
        assert_eq!(reloaded["result"]["changed"], json!(["w"]), "{reloaded}");
        assert_eq!(reloaded["result"]["config"]["reloads"], round, "{reloaded}");
    }
    let replies = starts.await.unwrap();
    assert_eq!(replies.len(), 1000);
    let mut ids = Vec::new();
    for reply in &replies {
        let id = reply["result"]["run_id"].as_str();
        assert!(id.is_some(), "a start was refused: {reply}");
        ids.push(id.unwrap().to_owned());
    }
    for id in &ids {
        let done = serve
            .call("workflow.wait", json!({"run_id": id, "timeout_ms": 60000}))
            .await;
        assert_eq!(done["status"], "succeeded", "{done}");
    }
    let status = serve.call("host.status", json!({})).await;
    let sessions = |id: &str| {
        status["connections"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap()["sessions_opened"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(sessions("fixture"), 1, "unchanged: one session: {status}");
    assert!(sessions("other") >= 2, "changed: new sessions: {status}");
    assert_eq!(status["config"]["reloads"], 10);
    assert_ne!(status["config"]["sha256"], json!(sha0));
    let got = serve
        .call("workflow.list", json!({"workflow": "w", "limit": 1000}))
        .await;
    assert_eq!(got["runs"].as_array().unwrap().len(), 1000, "none lost");

    // An invalid config: refused with the reason, the old one serves on.
    let before = serve.call("host.status", json!({})).await["config"].clone();
    std::fs::write(
        dir.path().join("wf.toml"),
        config_text(
            dir.path(),
            &reloadable(99, "30s").replace("{call}", "missing.wasm"),
        ),
    )
    .unwrap();
    let refused = serve.reply("host.reload", json!({})).await;
    assert_eq!(refused["error"]["code"], -32009, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("missing.wasm"), "{message}");
    let status = serve.call("host.status", json!({})).await;
    assert_eq!(status["config"]["sha256"], before["sha256"]);
    assert_eq!(status["config"]["reloads"], 10);
    assert!(
        status["config"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("missing.wasm")),
        "{status}"
    );
    let input = json!({"capability": "fixture.echo", "arguments": {"text": "still"}});
    let done = serve
        .call(
            "workflow.start",
            json!({"workflow": "w", "input": input, "wait": true}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
}

/// A reload applies no `[runtime]` change (those take effect at a
/// restart): it switches to the rest of the file, and says which it did not
/// apply, in `host.reload`'s answer and in `host.status` (kept until a
/// restart), instead of leaving it unsaid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_says_which_runtime_changes_wait_for_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let workflow = "[workflows.w]\ncomponent = \"{echo}\"\n";
    write_config(
        dir.path(),
        &format!("[runtime]\nstate = \"state.db\"\n\n{workflow}"),
    );
    let serve = Serve::start(dir.path());
    write_config(
        dir.path(),
        &format!(
            "[runtime]\nstate = \"state.db\"\ntimeout = \"5s\"\nmax_concurrent_steps = 3\n\n{workflow}[workflows.added]\ncomponent = \"{{echo}}\"\n"
        ),
    );
    let reloaded = serve.call("host.reload", json!({})).await;
    assert_eq!(reloaded["added"], json!(["added"]), "{reloaded}");
    let waiting = json!(["[runtime] timeout", "[runtime] max_concurrent_steps"]);
    assert_eq!(reloaded["not_applied"], waiting, "{reloaded}");
    let status = serve.call("host.status", json!({})).await;
    assert_eq!(status["config"]["restart_needed"], waiting, "{status}");
    // Put back as it started with: nothing waits for a restart any more.
    write_config(
        dir.path(),
        &format!("[runtime]\nstate = \"state.db\"\n\n{workflow}"),
    );
    let reloaded = serve.call("host.reload", json!({})).await;
    assert_eq!(reloaded["not_applied"], json!([]), "{reloaded}");
    let status = serve.call("host.status", json!({})).await;
    assert!(status["config"].get("restart_needed").is_none(), "{status}");
}

/// `workflow.pause` during a durable sleep: the sleep keeps its wake time
/// and ends, and after it no later step starts; the run stays `paused`
/// across a restart (nothing resumes it); `workflow.resume` finishes it.
/// Pausing a run that is not running, or resuming one that is not paused,
/// is refused (-32008).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_run_starts_no_step_until_resumed_also_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        &format!(
            "[runtime]\nstate = \"state.db\"\n{}",
            NAP.replace("sleep = \"1s\"", "sleep = \"2s\"")
        ),
    );
    let serve = Serve::start(dir.path());
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "nap", "input": {"n": 1}}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    let step_status = async |serve: &Serve, id: &str| {
        let got = serve.call("workflow.get", json!({"run_id": run_id})).await;
        let step = got["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .cloned()
            .unwrap();
        (got["status"].clone(), step["status"].clone())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while step_status(&serve, "nap").await.1 != "running" {
        assert!(Instant::now() < deadline, "never slept");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let paused = serve
        .call("workflow.pause", json!({"run_id": run_id}))
        .await;
    assert_eq!(paused["status"], "paused", "{paused}");
    let again = serve
        .reply("workflow.pause", json!({"run_id": run_id}))
        .await;
    assert_eq!(again["error"]["code"], -32008, "{again}");

    // Past the wake time: the sleep ended, and `b` did not start.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(
        step_status(&serve, "nap").await,
        (json!("paused"), json!("succeeded"))
    );
    assert_eq!(step_status(&serve, "b").await.1, "pending");
    serve.kill();

    // A restart resumes running runs, not paused ones.
    let serve = Serve::start(dir.path());
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        step_status(&serve, "b").await,
        (json!("paused"), json!("pending"))
    );
    let status = serve.call("host.status", json!({})).await;
    assert_eq!(status["state"]["runs_paused"], 1, "{status}");
    let resumed = serve
        .call("workflow.resume", json!({"run_id": run_id}))
        .await;
    assert_ne!(resumed["status"], "paused", "{resumed}");
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], json!({"n": 1}));
    let again = serve
        .reply("workflow.resume", json!({"run_id": run_id}))
        .await;
    assert_eq!(again["error"]["code"], -32008, "{again}");
    assert!(
        again["error"]["message"]
            .as_str()
            .unwrap()
            .contains("only a paused run can be resumed"),
        "{again}"
    );

    // Paused and resumed while its sleep still runs: it goes on at once.
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "nap", "input": {"n": 2}}),
        )
        .await;
    let other = started["run_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = serve.call("workflow.get", json!({"run_id": other})).await;
        if got["steps"][1]["status"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "never slept: {got}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    serve.call("workflow.pause", json!({"run_id": other})).await;
    serve
        .call("workflow.resume", json!({"run_id": other}))
        .await;
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": other, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], json!({"n": 2}));
}

/// Versions of a workflow, seen and moved: a run waiting across a reload
/// that changes a later step's mapping stays on its definition, a run
/// started after takes the new one, and `host.status` and `/metrics` count
/// the live runs on each. `workflow.migrate` moves the waiting run to the
/// definition in force, so its later step maps as that one says; a run
/// whose finished step the definition in force changed is refused, naming
/// the step and the difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_is_counted_on_its_definition_and_migrated_when_safe() {
    let dir = tempfile::tempdir().unwrap();
    let version = |first: &str, last: &str| {
        format!(
            "[runtime]\nstate = \"state.db\"\n\n[[workflows.w.steps]]\nid = \"a\"\ncomponent = \"{{echo}}\"\ninput = '{first}'\n\n[[workflows.w.steps]]\nid = \"gate\"\nneeds = [\"a\"]\nwait = \"go\"\n\n[[workflows.w.steps]]\nid = \"b\"\nneeds = [\"gate\"]\ncomponent = \"{{echo}}\"\ninput = '{last}'\n"
        )
    };
    write_config(dir.path(), &version("{a: 1}", "{v: 1}"));
    let serve = Serve::start(dir.path());
    let waiting = async |run_id: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = serve.call("workflow.get", json!({"run_id": run_id})).await;
            if got["steps"][1]["status"] == "waiting" {
                return got;
            }
            assert!(Instant::now() < deadline, "never waited: {got}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let start = async || {
        let started = serve
            .call("workflow.start", json!({"workflow": "w", "input": {}}))
            .await;
        started["run_id"].as_str().unwrap().to_owned()
    };
    let old_run = start().await;
    let first = waiting(&old_run).await["definition_hash"].clone();

    write_config(dir.path(), &version("{a: 1}", "{v: 2}"));
    serve.call("host.reload", json!({})).await;
    let new_run = start().await;
    let second = waiting(&new_run).await["definition_hash"].clone();
    assert_ne!(first, second);
    let status = serve.call("host.status", json!({})).await;
    let defs = &status["definitions"]["w"];
    assert_eq!(defs["current"], second, "{status}");
    let mut live: Vec<Value> = defs["live"].as_array().unwrap().clone();
    live.sort_by_key(|l| l["hash"].as_str().unwrap().to_owned());
    let mut expected = vec![
        json!({"hash": first, "runs": 1}),
        json!({"hash": second, "runs": 1}),
    ];
    expected.sort_by_key(|l| l["hash"].as_str().unwrap().to_owned());
    assert_eq!(live, expected, "{status}");
    let metrics = common::http_client()
        .get(serve.url.replace("/rpc", "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = format!(
        "wf_runs_live{{workflow=\"w\",definition=\"{}\"}} 1",
        first.as_str().unwrap()
    );
    assert!(metrics.contains(&line), "{line} not in\n{metrics}");

    // The old run moves to the definition in force.
    let moved = serve
        .call("workflow.migrate", json!({"run_id": old_run}))
        .await;
    assert_eq!(moved["definition_hash"], second, "{moved}");
    let again = serve
        .reply("workflow.migrate", json!({"run_id": old_run}))
        .await;
    assert_eq!(again["error"]["code"], -32008, "{again}");
    waiting(&old_run).await;
    for run_id in [&old_run, &new_run] {
        serve
            .call(
                "workflow.signal",
                json!({"run_id": run_id, "signal": "go", "payload": {}}),
            )
            .await;
    }
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": old_run, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], json!({"v": 2}), "the new mapping");

    // A definition that changes a step the run finished: refused, saying so.
    let third_run = start().await;
    waiting(&third_run).await;
    write_config(dir.path(), &version("{a: 3}", "{v: 2}"));
    serve.call("host.reload", json!({})).await;
    let refused = serve
        .reply("workflow.migrate", json!({"run_id": third_run}))
        .await;
    assert_eq!(refused["error"]["code"], -32008, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("step `a` (succeeded) is defined differently in the definition in force"),
        "{message}"
    );
    assert!(
        message.contains("{a: 3}") || message.contains("a: 3"),
        "{message}"
    );

    // A definition with another step: refused (its step would have no row).
    write_config(
        dir.path(),
        &format!(
            "{}\n[[workflows.w.steps]]\nid = \"extra\"\nneeds = [\"b\"]\ncomponent = \"{{echo}}\"\n",
            version("{a: 1}", "{v: 2}")
        ),
    );
    serve.call("host.reload", json!({})).await;
    let refused = serve
        .reply("workflow.migrate", json!({"run_id": third_run}))
        .await;
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("adds [\"extra\"]"), "{refused}");
    // Refused, the run still waits, driven: a signal finishes it.
    waiting(&third_run).await;
    serve
        .call(
            "workflow.signal",
            json!({"run_id": third_run, "signal": "go", "payload": {}}),
        )
        .await;
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": third_run, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
}

/// With `--watch`, writing the config reloads it: a workflow added to the
/// file can be started without a signal or a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reloads_a_changed_config() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &reloadable(0, "30s"));
    let serve = Serve::start_with(dir.path(), &["--watch"]);
    let added = reloadable(0, "30s") + "\n[workflows.added]\ncomponent = \"{echo}\"\n";
    write_config(dir.path(), &added);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = serve.call("host.status", json!({})).await;
        if status["workflows"]
            .as_array()
            .is_some_and(|w| w.iter().any(|n| n == "added"))
        {
            assert_eq!(status["config"]["reloads"], 1, "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "never reloaded: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = serve
        .call(
            "workflow.start",
            json!({"workflow": "added", "input": {"x": 1}, "wait": true}),
        )
        .await;
    assert_eq!(done["output"], json!({"x": 1}), "{done}");
}

/// `wf-host replay`: a run of the Python `answer` node (a resource read, a
/// tool call, a tool error it handles) replayed with its C and JavaScript
/// builds makes the same calls and gives the same output, with no server
/// (exit 0), also read beside the `serve` that is using the state file;
/// replayed with `echo`, which calls nothing, it names the first call that
/// differs (exit 1); with a build that fails first, its error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_with_a_new_build_passes_or_names_the_divergence() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = repo_root().join("plugins");
    write_config(
        dir.path(),
        &format!(
            r#"[runtime]
state = "state.db"

[[workflows.answer.steps]]
id = "first"
component = "{{echo}}"
[[workflows.answer.steps]]
id = "answer"
needs = ["first"]
component = "{py}"
allow = ["fixture.*"]
input = '{{skip_fail: false}}'
"#,
            py = plugins.join("py-answer.wasm").display()
        ),
    );
    let serve = Serve::start(dir.path());
    let done = serve
        .call(
            "workflow.start",
            json!({"workflow": "answer", "input": {}, "wait": true}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let run_id = done["run_id"].as_str().unwrap().to_owned();
    let replay = |component: &str, extra: &[&str]| {
        let out = Command::new(wf_host_bin())
            .args(["replay", &run_id, "--config"])
            .arg(dir.path().join("wf.toml"))
            .arg("--component")
            .arg(format!("answer={}", plugins.join(component).display()))
            .args(extra)
            .env("WF_HOST_CACHE_DIR", dir.path().join("cache"))
            .env_remove("WF_HOST_STATE")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // While `serve` runs on the state file: read beside it.
    let (code, stdout, stderr) = replay("c-answer.wasm", &[]);
    assert_eq!(code, Some(0), "beside a running serve: {stdout}{stderr}");
    let ok = serve
        .call(
            "workflow.start",
            json!({"workflow": "answer", "input": {}, "wait": true}),
        )
        .await;
    assert_eq!(
        ok["status"], "succeeded",
        "serve writes on after a replay: {ok}"
    );
    serve.kill();
    for build in ["c-answer.wasm", "js-answer.wasm", "py-answer.wasm"] {
        let (code, stdout, stderr) = replay(build, &[]);
        assert_eq!(code, Some(0), "{build}: {stdout}{stderr}");
        assert_eq!(
            stdout.trim(),
            "step `answer`: same calls (3) and same output",
            "{build}"
        );
    }
    let (code, stdout, stderr) = replay("echo.wasm", &[]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert_eq!(
        stdout.trim(),
        "step `answer`: different calls: call 1: the run made fixture.fixture://config.json null, the new build made no call",
    );
    assert!(
        stderr.contains("1 of 1 replayed steps diverged"),
        "{stderr}"
    );
    let (code, stdout, _) = replay("echo.wasm", &["--json"]);
    assert_eq!(code, Some(1));
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report[0]["verdict"], "different_calls", "{report}");
    assert_eq!(report[0]["seq"], 1);
    // A build that fails before the call: its own error says why.
    let (code, stdout, stderr) = replay("call.wasm", &[]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains("the new build made no call: it failed first with `invalid-input`: "),
        "{stdout}"
    );
    let (_, stdout, _) = replay("call.wasm", &["--json"]);
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report[0]["failed"]["code"], "invalid-input", "{report}");

    // `--component` as given, for a usage error (exit 2): its stderr.
    let usage_error = |component: &str| {
        let out = Command::new(wf_host_bin())
            .args(["replay", &run_id, "--config"])
            .arg(dir.path().join("wf.toml"))
            .args(["--component", component])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{component}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };

    // A step the workflow does not have: a usage error naming the steps.
    let stderr = usage_error("nope=x.wasm");
    assert!(
        stderr.contains("has no step `nope` (it has first, answer)"),
        "{stderr}"
    );

    // A component with no step, where two steps run one: a usage error
    // asking for STEP=PATH. (With one such step, the guide in
    // docs/changes.md replays it so.)
    let stderr = usage_error("x.wasm");
    assert!(
        stderr.contains("`--component x.wasm` names no step, and workflow `answer` has 2 steps that run a component (first, answer): name one as STEP=PATH"),
        "{stderr}"
    );
}

/// A three-step trip: book a flight, book a hotel, pay. Each booking names
/// a compensation that echoes `undo-<what it booked>` on the fixture (the
/// flight's sleeps 3 s instead when the input says `slow_undo`).
const TRIP: &str = r#"[[workflows.trip.steps]]
id = "flight"
component = "{call}"
allow = ["fixture.echo"]
input = '{capability: "fixture.echo", arguments: {text: "flight-\(.input.n)"}}'
compensate = { component = "{call}", allow = ["fixture.echo", "fixture.sleep"], input = 'if .run.input.slow_undo then {capability: "fixture.sleep", arguments: {ms: 3000}} else {capability: "fixture.echo", arguments: {text: "undo-\(.output.content[0].text)"}} end' }
[[workflows.trip.steps]]
id = "hotel"
component = "{call}"
allow = ["fixture.echo"]
needs = ["flight"]
input = '{capability: "fixture.echo", arguments: {text: "hotel-\(.input.n)"}}'
compensate = { component = "{call}", allow = ["fixture.echo"], input = '{capability: "fixture.echo", arguments: {text: "undo-\(.output.content[0].text)"}}' }
[[workflows.trip.steps]]
id = "pay"
component = "{call}"
allow = ["fixture.fail", "fixture.sleep", "fixture.echo"]
needs = ["hotel"]
input = 'if .input.pay == "fail" then {capability: "fixture.fail", arguments: {message: "card declined"}} elif .input.pay == "slow" then {capability: "fixture.sleep", arguments: {ms: 60000}} else {capability: "fixture.echo", arguments: {text: "paid"}} end'
"#;

/// The `echo` texts the fixture was asked for, in order.
fn echoed(witness: &[Value]) -> Vec<String> {
    witness
        .iter()
        .filter(|c| c["tool"] == "echo")
        .filter_map(|c| c["arguments"]["text"].as_str().map(str::to_owned))
        .collect()
}

fn calls_of(witness: &[Value], tool: &str) -> usize {
    witness.iter().filter(|c| c["tool"] == tool).count()
}

/// Saga compensation: when the trip's payment fails, the two bookings are
/// undone once each, the hotel (booked last) first; the run fails with
/// its error and what was compensated, the compensations are steps of the
/// run (with `compensates`), a `run.compensating` event names them, and a
/// compensated run cannot be retried. A run that succeeds compensates
/// nothing; a cancelled one undoes what it had booked and ends `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_trip_undoes_its_bookings_once_each_latest_first() {
    let host = Host::new(TRIP).await;
    let run = host.run("trip", json!({"n": 1, "pay": "fail"})).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:#?}");
    let error = run.error.clone().unwrap();
    assert!(
        error.message.contains("card declined")
            && error.message.ends_with("; compensated: hotel, flight"),
        "{error:?}"
    );
    assert_eq!(
        echoed(&host.witness()),
        ["flight-1", "hotel-1", "undo-hotel-1", "undo-flight-1"]
    );
    for (id, undone) in [
        ("hotel.compensate", "hotel"),
        ("flight.compensate", "flight"),
    ] {
        let s = step(&run, id);
        assert_eq!(s.status, StepStatus::Succeeded, "{s:#?}");
        assert_eq!(s.compensates.as_deref(), Some(undone));
        assert_eq!(s.needs, [undone]);
        assert_eq!(s.attempts, 1);
    }
    assert_eq!(step(&run, "pay").status, StepStatus::Failed);
    let events = host
        .workflows
        .events(Some(&run.run_id), 0, 100)
        .await
        .unwrap();
    let compensating: Vec<&Value> = events
        .iter()
        .filter(|e| e.kind == "run.compensating")
        .map(|e| &e.data)
        .collect();
    assert_eq!(compensating.len(), 1, "{events:#?}");
    assert_eq!(
        compensating[0]["steps"],
        json!(["hotel.compensate", "flight.compensate"])
    );
    assert_eq!(compensating[0]["status"], "failed");
    let retry = host.workflows.retry(&run.run_id).await.unwrap_err();
    assert!(
        matches!(retry, WorkflowError::Compensated { .. }),
        "{retry:?}"
    );

    // Paid: nothing to undo, and no compensation step at all.
    let paid = host.run("trip", json!({"n": 2, "pay": "ok"})).await;
    assert_eq!(paid.status, RunStatus::Succeeded, "{paid:#?}");
    assert_eq!(paid.steps.as_ref().unwrap().len(), 3);

    // Cancelled while it pays: both bookings undone, the run `cancelled`.
    let started = host
        .workflows
        .start("trip", json!({"n": 3, "pay": "slow"}), None)
        .await
        .unwrap();
    wait_until("the payment to start", || {
        calls_of(&host.witness(), "sleep") == 1
    })
    .await;
    host.workflows.cancel(&started.run_id).await.unwrap();
    let cancelled = host.finish(&started.run_id).await;
    assert_eq!(cancelled.status, RunStatus::Cancelled, "{cancelled:#?}");
    assert_eq!(
        cancelled.error.as_ref().unwrap().message,
        "the run was cancelled; compensated: hotel, flight"
    );
    let echoes = echoed(&host.witness());
    assert_eq!(
        echoes[echoes.len() - 2..],
        ["undo-hotel-3", "undo-flight-3"]
    );
    host.close().await;
}

/// A compensation that fails is reported in the run's error and on its
/// step, and the others still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_compensation_is_reported_and_the_others_still_run() {
    let broken = TRIP.replacen(
        r#"allow = ["fixture.echo", "fixture.sleep"], input = 'if .run.input.slow_undo then {capability: "fixture.sleep", arguments: {ms: 3000}} else {capability: "fixture.echo", arguments: {text: "undo-\(.output.content[0].text)"}} end' }"#,
        r#"allow = ["fixture.fail"], input = '{capability: "fixture.fail", arguments: {message: "airline is down"}}' }"#,
        1,
    );
    assert_ne!(broken, TRIP);
    let host = Host::new(&broken).await;
    let run = host.run("trip", json!({"n": 1, "pay": "fail"})).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:#?}");
    let message = &run.error.as_ref().unwrap().message;
    assert!(
        message.ends_with(
            "; compensated: hotel; compensation `flight.compensate` failed (tool-error: airline is down)"
        ),
        "{message}"
    );
    let failed = step(&run, "flight.compensate");
    assert_eq!(failed.status, StepStatus::Failed);
    assert_eq!(failed.error.as_ref().unwrap().message, "airline is down");
    assert_eq!(step(&run, "hotel.compensate").status, StepStatus::Succeeded);
    host.close().await;
}

/// A crash while compensating resumes it: `serve` is SIGKILLed after the
/// hotel was undone, while the flight's undo runs. After the restart the
/// hotel's undo is not made again, the flight's runs again (it was
/// interrupted inside its call, which may repeat), and the run ends failed
/// with both compensated. A paused run that is cancelled while nothing
/// drives it is compensated too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensation_interrupted_by_sigkill_resumes_and_none_is_made_twice() {
    let dir = tempfile::tempdir().unwrap();
    let hold = r#"
[[workflows.hold.steps]]
id = "book"
component = "{call}"
allow = ["fixture.echo"]
input = '{capability: "fixture.echo", arguments: {text: "held-\(.input.n)"}}'
compensate = { component = "{call}", allow = ["fixture.echo"], input = '{capability: "fixture.echo", arguments: {text: "unheld-\(.input.arguments.text)"}}' }
[[workflows.hold.steps]]
id = "nap"
sleep = "2s"
needs = ["book"]
[[workflows.hold.steps]]
id = "after"
component = "{echo}"
needs = ["nap"]
"#;
    write_config(
        dir.path(),
        &format!("[runtime]\nstate = \"state.db\"\n{TRIP}{hold}"),
    );
    let witness = dir.path().join("witness.jsonl");
    let serve = Serve::start(dir.path());
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "trip", "input": {"n": 1, "pay": "fail", "slow_undo": true}}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    wait_until("the flight's undo to start", || {
        calls_of(&read_witness(&witness), "sleep") == 1
    })
    .await;
    serve.kill();
    assert_eq!(
        echoed(&read_witness(&witness)),
        ["flight-1", "hotel-1", "undo-hotel-1"]
    );

    let serve = Serve::start(dir.path());
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(done["status"], "failed", "{done}");
    assert!(
        done["error"]["message"]
            .as_str()
            .unwrap()
            .ends_with("; compensated: hotel, flight"),
        "{done}"
    );
    let after = read_witness(&witness);
    assert_eq!(echoed(&after), ["flight-1", "hotel-1", "undo-hotel-1"]);
    assert_eq!(calls_of(&after, "sleep"), 2, "{after:#?}");
    let got = serve.call("workflow.get", json!({"run_id": run_id})).await;
    let attempts = |id: &str| {
        got["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .map(|s| s["attempts"].clone())
    };
    assert_eq!(attempts("hotel.compensate"), Some(json!(1)), "{got}");
    assert_eq!(attempts("flight.compensate"), Some(json!(2)), "{got}");

    // Paused once its nap ends (nothing drives it then), then cancelled:
    // the booking is undone and the run ends `cancelled`.
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "hold", "input": {"n": 7}}),
        )
        .await;
    let held = started["run_id"].as_str().unwrap().to_owned();
    wait_until("the booking", || {
        echoed(&read_witness(&witness)).contains(&"held-7".to_owned())
    })
    .await;
    let paused = serve.call("workflow.pause", json!({"run_id": held})).await;
    assert_eq!(paused["status"], "paused", "{paused}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = serve.call("workflow.get", json!({"run_id": held})).await;
        if got["steps"][1]["status"] == "succeeded" {
            break;
        }
        assert!(Instant::now() < deadline, "the nap never ended: {got}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    serve.call("workflow.cancel", json!({"run_id": held})).await;
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": held, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert_eq!(
        done["error"]["message"],
        "the run was cancelled; compensated: book"
    );
    assert!(echoed(&read_witness(&witness)).contains(&"unheld-held-7".to_owned()));
}

/// A tmpfs of `size` mounted on a temp dir (this test host runs as root,
/// as CI does), unmounted on drop.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mounting a small tmpfs (the test needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { dir }
    }

    fn resize(&self, size: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// The state on a small disk that fills up: a start is refused as busy
/// (-32004 with `retry_after_ms`), naming the full disk and the file; a
/// run that was going on when it filled waits, `serve` answers reads and
/// `/healthz` says it is degraded. Once there is room again it recovers by
/// itself: every run accepted before finishes, new starts go through, and
/// SQLite's `integrity_check` is `ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_starts_clearly_and_loses_nothing_when_space_comes_back() {
    let disk = SmallDisk::mount("4m");
    let dir = tempfile::tempdir().unwrap();
    let db = disk.dir.path().join("state.db");
    write_config(
        dir.path(),
        &format!(
            "[runtime]\nstate = {:?}\n\n[[workflows.w.steps]]\nid = \"a\"\ncomponent = \"{{echo}}\"\n[[workflows.w.steps]]\nid = \"b\"\ncomponent = \"{{echo}}\"\nneeds = [\"a\"]\n",
            db.display().to_string()
        ),
    );
    let serve = Serve::start(dir.path());
    let pad = "x".repeat(2000);
    let mut accepted = Vec::new();
    let refused = loop {
        let reply = serve
            .reply(
                "workflow.start",
                json!({"workflow": "w", "input": {"n": accepted.len(), "pad": pad}}),
            )
            .await;
        match reply.get("result") {
            Some(run) => accepted.push(run["run_id"].as_str().unwrap().to_owned()),
            None => break reply["error"].clone(),
        }
        assert!(accepted.len() < 5000, "the disk never filled");
    };
    assert!(!accepted.is_empty());
    assert_eq!(refused["code"], -32004, "{refused}");
    assert_eq!(refused["data"]["retry_after_ms"], 5000, "{refused}");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("is full") && message.contains(&db.display().to_string()),
        "{message}"
    );
    let health = common::http_client()
        .get(serve.url.replace("/rpc", "/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 503);
    assert!(
        health
            .text()
            .await
            .unwrap()
            .starts_with("degraded: the disk holding the state file")
    );
    // Reads are answered.
    let listed = serve.call("workflow.list", json!({"limit": 5})).await;
    assert!(!listed["runs"].as_array().unwrap().is_empty());
    let status = serve.call("host.status", json!({})).await;
    assert!(
        status["state"]["degraded"]
            .as_str()
            .unwrap()
            .contains("is full"),
        "{status}"
    );
    assert!(serve.metrics().await.contains("wf_state_degraded 1"));

    disk.resize("32m");
    for run_id in &accepted {
        let done = serve
            .call(
                "workflow.wait",
                json!({"run_id": run_id, "timeout_ms": 30000}),
            )
            .await;
        assert_eq!(done["status"], "succeeded", "{done}");
    }
    // Healthy again within the probe's longest backoff.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let health = common::http_client()
            .get(serve.url.replace("/rpc", "/healthz"))
            .send()
            .await
            .unwrap();
        if health.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {}",
            health.text().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(serve.metrics().await.contains("wf_state_degraded 0"));
    let after = serve
        .call(
            "workflow.start",
            json!({"workflow": "w", "input": {"n": -1}, "wait": true}),
        )
        .await;
    assert_eq!(after["status"], "succeeded", "{after}");
    serve.kill();
    assert_eq!(
        sqlite(
            &db,
            "print(c.execute('PRAGMA integrity_check').fetchone()[0])"
        )
        .trim(),
        "ok"
    );
}

/// A run whose only step in flight is a long durable sleep lets go of its
/// driver (a `run.asleep` event with its wake time): no task of this
/// process holds it while it sleeps, and the waker drives it again on
/// time, also after `serve` was SIGKILLed in between; `workflow.wait`
/// waits across it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_sleep_lets_go_of_its_driver_and_wakes_on_time_across_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        &format!(
            "[runtime]\nstate = \"state.db\"\n{}",
            NAP.replace("sleep = \"1s\"", "sleep = \"7s\"")
        ),
    );
    let serve = Serve::start(dir.path());
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "nap", "input": {"n": 1}}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    // The `run.asleep` event's wake time, read from the state file.
    let db = dir.path().join("state.db");
    let deadline = Instant::now() + Duration::from_secs(10);
    let wake_ms = loop {
        let data = sqlite(
            &db,
            &format!(
                "r = c.execute(\"SELECT data FROM events WHERE run_id = '{run_id}' AND kind = 'run.asleep'\").fetchone(); print(r[0] if r else '')"
            ),
        );
        if !data.trim().is_empty() {
            let data: Value = serde_json::from_str(data.trim()).unwrap();
            break data["wake_ms"].as_i64().unwrap();
        }
        assert!(Instant::now() < deadline, "never let go of its driver");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let status = serve.call("host.status", json!({})).await;
    assert_eq!(
        status["runs_waiting_here"], 0,
        "no driver sleeps here: {status}"
    );
    assert_eq!(status["state"]["runs_asleep"], 1, "{status}");
    assert!(serve.metrics().await.contains("wf_runs_asleep 1"));
    let got = serve.call("workflow.get", json!({"run_id": run_id})).await;
    assert_eq!(got["status"], "running", "{got}");
    assert_eq!(got["steps"][1]["status"], "running", "{got}");
    serve.kill();

    let serve = Serve::start(dir.path());
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 30000}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let status = serve.call("host.status", json!({})).await;
    assert_eq!(status["state"]["runs_asleep"], 0, "{status}");
    let got = serve.call("workflow.get", json!({"run_id": run_id})).await;
    let b_started = ms_between(
        "1970-01-01T00:00:00Z",
        got["steps"][2]["started_at"].as_str().unwrap(),
    );
    assert!(
        b_started >= wake_ms && b_started - wake_ms < 3000,
        "the step after the sleep began {} ms after its wake time",
        b_started - wake_ms
    );
}

/// `gate`: an echo, a wait for `go` (no timeout), an echo; `gate_timed`:
/// the same wait with an 8 s timeout.
const GATE: &str = r#"[runtime]
state = "state.db"

[[workflows.gate.steps]]
id = "a"
component = "{echo}"
[[workflows.gate.steps]]
id = "go"
needs = ["a"]
wait = "go"
[[workflows.gate.steps]]
id = "b"
component = "{echo}"
needs = ["go"]
input = '.steps.go.output'

[[workflows.gate_timed.steps]]
id = "go"
wait = "go"
timeout = "8s"
"#;

/// The `run.asleep` wake time of `run_id`, once it fell asleep.
async fn asleep_until(db: &Path, run_id: &str) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let data = sqlite(
            db,
            &format!(
                "r = c.execute(\"SELECT data FROM events WHERE run_id = '{run_id}' AND kind = 'run.asleep'\").fetchone(); print(r[0] if r else '')"
            ),
        );
        if !data.trim().is_empty() {
            let data: Value = serde_json::from_str(data.trim()).unwrap();
            return data["wake_ms"].as_i64().unwrap();
        }
        assert!(Instant::now() < deadline, "never let go of its driver");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A run waiting for a signal lets go of its driver (nothing of it stays in
/// the process), across a SIGKILL too, and a signal drives it again at
/// once; a wait with a timeout wakes at its timeout and fails `timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_for_a_signal_lets_go_of_its_driver_until_the_signal() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), GATE);
    let db = dir.path().join("state.db");
    let serve = Serve::start(dir.path());
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "gate", "input": {"n": 1}}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    asleep_until(&db, &run_id).await;
    let status = serve.call("host.status", json!({})).await;
    assert_eq!(status["runs_waiting_here"], 0, "{status}");
    assert_eq!(status["load"]["live_runs"], 0, "{status}");
    assert_eq!(status["state"]["runs_asleep"], 1, "{status}");
    let got = serve.call("workflow.get", json!({"run_id": run_id})).await;
    assert_eq!(got["steps"][1]["status"], "waiting", "{got}");
    serve.kill();

    // Restarted, it stays asleep; the signal wakes it.
    let serve = Serve::start(dir.path());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = serve.call("host.status", json!({})).await;
    assert_eq!(status["load"]["live_runs"], 0, "{status}");
    let sent = Instant::now();
    serve
        .call(
            "workflow.signal",
            json!({"run_id": run_id, "signal": "go", "payload": {"ok": 1}}),
        )
        .await;
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 20000}),
        )
        .await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], json!({"ok": 1}));
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "{:?}",
        sent.elapsed()
    );

    // A timed wait wakes at its timeout.
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "gate_timed", "input": {}}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    let wake_ms = asleep_until(&db, &run_id).await;
    let done = serve
        .call(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 20000}),
        )
        .await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "timeout", "{done}");
    let got = serve.call("workflow.get", json!({"run_id": run_id})).await;
    let ended = ms_between(
        "1970-01-01T00:00:00Z",
        got["steps"][0]["finished_at"].as_str().unwrap(),
    );
    assert!(
        ended >= wake_ms && ended - wake_ms < 3000,
        "{} ms after its timeout",
        ended - wake_ms
    );

    // A run asleep on its wait is cancelled as any.
    let started = serve
        .call(
            "workflow.start",
            json!({"workflow": "gate", "input": {"n": 2}}),
        )
        .await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    asleep_until(&db, &run_id).await;
    let cancelled = serve
        .call("workflow.cancel", json!({"run_id": run_id}))
        .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let status = serve.call("host.status", json!({})).await;
    assert_eq!(status["state"]["runs_asleep"], 0, "{status}");
}

/// Past `[runtime] max_live_runs`, a start is refused as busy (-32004 with
/// `retry_after_ms`) and stores nothing; once a run ends, starts go through
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_past_max_live_runs_is_refused_busy_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        r#"[runtime]
state = "state.db"
max_live_runs = 2

[[workflows.slow.steps]]
id = "nap"
component = "{call}"
allow = ["fixture.sleep"]
input = '{capability: "fixture.sleep", arguments: {ms: .input.ms}}'
"#,
    );
    let serve = Serve::start(dir.path());
    let mut ids = Vec::new();
    for _ in 0..2 {
        let started = serve
            .call(
                "workflow.start",
                json!({"workflow": "slow", "input": {"ms": 1500}}),
            )
            .await;
        ids.push(started["run_id"].as_str().unwrap().to_owned());
    }
    let refused = serve
        .reply(
            "workflow.start",
            json!({"workflow": "slow", "input": {"ms": 1}}),
        )
        .await;
    assert_eq!(refused["error"]["code"], -32004, "{refused}");
    assert_eq!(
        refused["error"]["data"]["retry_after_ms"], 1000,
        "{refused}"
    );
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_live_runs"),
        "{refused}"
    );
    let listed = serve.call("workflow.list", json!({"limit": 10})).await;
    assert_eq!(listed["runs"].as_array().unwrap().len(), 2, "{listed}");
    // Counted, and shown as the load.
    let status = serve.call("host.status", json!({})).await;
    let load = &status["load"];
    assert_eq!(
        (&load["live_runs"], &load["max_live_runs"], &load["busy"]),
        (&json!(2), &json!(2), &json!(true)),
        "{status}"
    );
    assert_eq!(load["refused"]["busy"], 1, "{status}");
    assert!(
        serve
            .metrics()
            .await
            .contains("wf_starts_refused_total{reason=\"busy\"} 1"),
    );
    for id in &ids {
        let done = serve
            .call("workflow.wait", json!({"run_id": id, "timeout_ms": 30000}))
            .await;
        assert_eq!(done["status"], "succeeded", "{done}");
    }
    let again = serve
        .call(
            "workflow.start",
            json!({"workflow": "slow", "input": {"ms": 1}, "wait": true}),
        )
        .await;
    assert_eq!(again["status"], "succeeded", "{again}");
}
