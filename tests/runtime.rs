//! The node runtime: loading, running, limits and the precompile cache, with real
//! components built from this repo.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use wf_host::capability::{CapabilityBackend, CapabilityEntry, CapabilityError};
use wf_host::runtime::{Limits, LoadError, RunError, RunOptions, RuntimeConfig};

use common::*;

#[tokio::test]
async fn echo_round_trips_json_exactly() {
    let (runtime, _cache) = runtime();
    let node = runtime.load(&plugin("echo")).unwrap();
    for input in [
        "null",
        "true",
        "-12.5e3",
        r#""a string""#,
        r#"{"z": 1, "a": [1, 2, {"nested": null}], "m": "x"}"#,
        r#"{"unicode": "héllo wörld ✓ 日本語 🦀", "escapes": "\"\\\n\t\u0000"}"#,
    ] {
        let report = runtime.run(&node, input, RunOptions::default()).await;
        assert_eq!(expect_ok(&report), input, "echo changed its input");
    }
}

#[tokio::test]
async fn echo_round_trips_a_one_mib_input() {
    let (runtime, _cache) = runtime();
    let node = runtime.load(&plugin("echo")).unwrap();
    let big = "é✓".repeat((1 << 20) / 5);
    let input = serde_json::to_string(&json!({ "big": big })).unwrap();
    assert!(input.len() >= 1 << 20);
    let report = runtime.run(&node, &input, RunOptions::default()).await;
    assert_eq!(expect_ok(&report), input);
}

/// One call that reached the backend: connection, tool, arguments.
type RecordedCall = (String, String, Map<String, Value>);

/// A backend that records what reached it and answers like an MCP server would.
#[derive(Default)]
struct RecordingBackend {
    calls: Mutex<Vec<RecordedCall>>,
}

#[async_trait]
impl CapabilityBackend for RecordingBackend {
    async fn call_tool(
        &self,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        self.calls
            .lock()
            .unwrap()
            .push((connection.into(), tool.into(), arguments.clone()));
        Ok(json!({
            "content": [{"type": "text", "text": format!("{connection}/{tool}")}],
            "structuredContent": {"arguments": arguments},
            "isError": false
        }))
    }
    async fn read_resource(&self, _: &str, _: &str) -> Result<Value, CapabilityError> {
        Err(CapabilityError::NotFound("no resources".into()))
    }
    async fn get_prompt(
        &self,
        _: &str,
        _: &str,
        _: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        Err(CapabilityError::NotFound("no prompts".into()))
    }
    async fn list(&self) -> Result<Vec<CapabilityEntry>, CapabilityError> {
        Ok(vec![])
    }
}

#[tokio::test]
async fn call_reaches_the_backend_with_name_and_arguments() {
    let backend = Arc::new(RecordingBackend::default());
    let (runtime, _cache) = runtime_with(RuntimeConfig::default(), backend.clone());
    let node = runtime.load(&plugin("call")).unwrap();
    let input = json!({"capability": "notes.search", "arguments": {"query": "wasm", "limit": 3}});
    let report = runtime
        .run(&node, &input.to_string(), granting(&["notes.search"]))
        .await;
    let output: Value = serde_json::from_str(expect_ok(&report)).unwrap();

    let calls = backend.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, "notes");
    assert_eq!(calls[0].1, "search");
    assert_eq!(
        Value::Object(calls[0].2.clone()),
        json!({"query": "wasm", "limit": 3})
    );
    assert_eq!(output["content"][0]["text"], "notes/search");
    assert_eq!(output["structuredContent"]["arguments"]["limit"], 3);
    assert_eq!(output["isError"], false);
}

#[tokio::test]
async fn call_without_a_backend_is_unavailable() {
    let (runtime, _cache) = runtime();
    let node = runtime.load(&plugin("call")).unwrap();
    let report = runtime
        .run(
            &node,
            r#"{"capability": "fixture.echo", "arguments": {}}"#,
            granting(&["fixture.*"]),
        )
        .await;
    match report.result {
        Err(RunError::Node { code, message }) => {
            assert_eq!(code, "unavailable");
            assert!(
                message.contains("no MCP connection is configured"),
                "{message}"
            );
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn a_core_module_is_rejected_with_how_to_wrap_it() {
    let (runtime, _cache) = runtime();
    let core = wat_to_binary("(module (func (export \"run\")))");
    let err = runtime
        .load_bytes("core.wasm", &core)
        .err()
        .expect("must fail");
    assert!(matches!(err, LoadError::CoreModule { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "`core.wasm` is a core WebAssembly module, not a component; build it for `wasm32-wasip2`, or wrap it with `wasm-tools component new core.wasm -o node.wasm` (add `--adapt wasi_snapshot_preview1=<adapter.wasm>` if it imports WASI preview 1)"
    );
}

#[tokio::test]
async fn a_component_for_another_world_names_the_missing_export() {
    let (runtime, _cache) = runtime();
    let err = runtime
        .load_bytes("empty.wasm", b"(component)")
        .err()
        .expect("must fail");
    assert!(matches!(err, LoadError::WrongWorld { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "`empty.wasm` does not target the `wf:node/node@0.1.0` world: it has no export `run`; a node exports `run: func(input: string) -> result<string, node-error>`"
    );
}

#[tokio::test]
async fn a_component_with_a_foreign_import_names_it() {
    let (runtime, _cache) = runtime();
    let err = runtime
        .load_bytes(
            "foreign.wasm",
            br#"(component (import "acme:kv/store@1.0.0" (instance)))"#,
        )
        .err()
        .expect("must fail");
    assert_eq!(
        err.to_string(),
        "`foreign.wasm` does not target the `wf:node/node@0.1.0` world: it imports `acme:kv/store@1.0.0`, which wf-host does not provide; a node may import only `wf:node/capability@0.1.0` and WASI"
    );
}

#[tokio::test]
async fn garbage_bytes_are_rejected() {
    let (runtime, _cache) = runtime();
    let err = runtime
        .load_bytes("garbage.wasm", &[0x7f, b'E', b'L', b'F', 1, 2, 3])
        .err()
        .expect("must fail");
    assert!(matches!(err, LoadError::NotWasm { .. }), "{err:?}");
    let mut truncated = std::fs::read(plugin("echo")).unwrap();
    truncated.truncate(truncated.len() / 2);
    let err = runtime
        .load_bytes("truncated.wasm", &truncated)
        .err()
        .expect("must fail");
    assert!(matches!(err, LoadError::Invalid { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("`truncated.wasm` is not a valid component: "),
        "{err}"
    );
}

#[tokio::test]
async fn an_infinite_loop_stops_at_the_deadline_and_the_next_run_succeeds() {
    let (runtime, _cache) = runtime();
    let misbehave = runtime.load(&guest("misbehave")).unwrap();
    let echo = runtime.load(&plugin("echo")).unwrap();
    let limits = Limits {
        timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let report = runtime
        .run(
            &misbehave,
            r#"{"mode": "loop"}"#,
            RunOptions {
                limits: Some(limits),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(
        report.result,
        Err(RunError::Timeout(Duration::from_millis(200)))
    );
    assert_eq!(
        report.result.unwrap_err().to_string(),
        "run exceeded its time limit of 200ms"
    );
    assert!(
        report.elapsed < Duration::from_secs(5),
        "took {:?}",
        report.elapsed
    );

    let report = runtime.run(&echo, "[1]", RunOptions::default()).await;
    assert_eq!(expect_ok(&report), "[1]");
}

#[tokio::test]
async fn growing_memory_past_the_cap_traps_and_the_next_run_succeeds() {
    let (runtime, _cache) = runtime();
    let misbehave = runtime.load(&guest("misbehave")).unwrap();
    let limits = Limits {
        max_memory: 32 << 20,
        ..Limits::default()
    };
    let opts = RunOptions {
        limits: Some(limits),
        ..Default::default()
    };
    let report = runtime
        .run(&misbehave, r#"{"mode": "grow", "mib": 64}"#, opts.clone())
        .await;
    assert_eq!(report.result, Err(RunError::MemoryLimit(32 << 20)));
    assert_eq!(
        report.result.unwrap_err().to_string(),
        "run exceeded its memory limit of 32.0 MiB"
    );

    // Under the cap the same node works in the same process.
    let report = runtime
        .run(&misbehave, r#"{"mode": "grow", "mib": 8}"#, opts)
        .await;
    assert_eq!(expect_ok(&report), r#"{"grew_mib":8}"#);
}

#[tokio::test]
async fn cancelling_interrupts_a_running_node() {
    let (runtime, _cache) = runtime();
    let misbehave = runtime.load(&guest("misbehave")).unwrap();
    let opts = RunOptions::default();
    let cancel = opts.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let report = runtime.run(&misbehave, r#"{"mode": "loop"}"#, opts).await;
    assert_eq!(report.result, Err(RunError::Cancelled));
}

#[tokio::test]
async fn a_trapping_node_reports_the_trap() {
    let (runtime, _cache) = runtime();
    let misbehave = runtime.load(&guest("misbehave")).unwrap();
    let report = runtime
        .run(&misbehave, r#"{"mode": "trap"}"#, RunOptions::default())
        .await;
    assert!(
        matches!(report.result, Err(RunError::Trap(_))),
        "{:?}",
        report.result
    );
}

#[tokio::test]
async fn guest_stdio_is_captured_not_inherited() {
    let (runtime, _cache) = runtime();
    let misbehave = runtime.load(&guest("misbehave")).unwrap();
    let report = runtime
        .run(
            &misbehave,
            r#"{"mode": "print", "stdout": "to stdout\n", "stderr": "to stderr\n"}"#,
            RunOptions::default(),
        )
        .await;
    assert_eq!(expect_ok(&report), r#""printed""#);
    assert_eq!(report.stdout, "to stdout\n");
    assert_eq!(report.stderr, "to stderr\n");
}

#[tokio::test]
async fn node_input_errors_come_back_as_invalid_input() {
    let (runtime, _cache) = runtime();
    let call = runtime.load(&plugin("call")).unwrap();
    let report = runtime
        .run(&call, r#"{"nope": 1}"#, RunOptions::default())
        .await;
    match report.result {
        Err(RunError::Node { code, .. }) => assert_eq!(code, "invalid-input"),
        other => panic!("expected invalid-input, got {other:?}"),
    }
    let report = runtime.run(&call, "{not json", RunOptions::default()).await;
    assert!(
        matches!(report.result, Err(RunError::InvalidInput(_))),
        "{:?}",
        report.result
    );
}

#[tokio::test]
async fn the_second_load_hits_the_precompile_cache() {
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        ..Default::default()
    };
    let first =
        wf_host::runtime::Runtime::new(config.clone(), Arc::new(wf_host::capability::NoBackend))
            .unwrap();
    first.load(&plugin("echo")).unwrap();
    assert_eq!(first.stats().cache.misses, 1);
    assert_eq!(first.stats().cache.stored, 1);
    assert_eq!(first.stats().compiles, 1);

    // A new runtime (a new process, in effect) loads from the cache.
    let second =
        wf_host::runtime::Runtime::new(config, Arc::new(wf_host::capability::NoBackend)).unwrap();
    let node = second.load(&plugin("echo")).unwrap();
    assert_eq!(second.stats().cache.hits, 1);
    assert_eq!(second.stats().compiles, 0);
    let report = second
        .run(&node, r#"{"cached": true}"#, RunOptions::default())
        .await;
    assert_eq!(expect_ok(&report), r#"{"cached": true}"#);
}

#[tokio::test]
async fn a_corrupt_cache_entry_is_detected_and_rebuilt() {
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        ..Default::default()
    };
    let backend = Arc::new(wf_host::capability::NoBackend);
    let first = wf_host::runtime::Runtime::new(config.clone(), backend.clone()).unwrap();
    first.load(&plugin("echo")).unwrap();
    let entry = first
        .cache()
        .unwrap()
        .entry_path(&std::fs::read(plugin("echo")).unwrap());

    // Flip one byte in the middle of the artifact.
    let mut bytes = std::fs::read(&entry).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&entry, &bytes).unwrap();

    let second = wf_host::runtime::Runtime::new(config.clone(), backend.clone()).unwrap();
    let node = second.load(&plugin("echo")).unwrap();
    let stats = second.stats();
    assert_eq!(
        (
            stats.cache.rejected,
            stats.cache.hits,
            stats.compiles,
            stats.cache.stored
        ),
        (1, 0, 1, 1)
    );
    assert_eq!(
        expect_ok(&second.run(&node, "1", RunOptions::default()).await),
        "1"
    );

    // Truncated entries are caught the same way; the rebuilt entry then hits.
    std::fs::write(&entry, &bytes[..10]).unwrap();
    let third = wf_host::runtime::Runtime::new(config.clone(), backend.clone()).unwrap();
    third.load(&plugin("echo")).unwrap();
    assert_eq!(third.stats().cache.rejected, 1);
    let fourth = wf_host::runtime::Runtime::new(config, backend).unwrap();
    fourth.load(&plugin("echo")).unwrap();
    assert_eq!(fourth.stats().cache.hits, 1);
}

#[tokio::test]
async fn an_on_demand_runtime_runs_the_same_node() {
    let (runtime, _cache) = runtime_with(
        RuntimeConfig {
            allocator: wf_host::runtime::Allocator::OnDemand,
            ..Default::default()
        },
        Arc::new(wf_host::capability::NoBackend),
    );
    let node = runtime.load(&plugin("echo")).unwrap();
    assert_eq!(
        expect_ok(&runtime.run(&node, "[]", RunOptions::default()).await),
        "[]"
    );
}

/// Run options that grant `patterns`; runs reach nothing by default.
fn granting(patterns: &[&str]) -> RunOptions {
    RunOptions {
        grants: Arc::new(wf_host::grants::Grants::new(patterns).unwrap()),
        ..Default::default()
    }
}

fn wat_to_binary(text: &str) -> Vec<u8> {
    wat::parse_str(text).expect("valid wat")
}
