//! The node runtime: loading, running, limits and the precompile cache, with real
//! components built from this repo.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use wf_host::capability::{CapabilityBackend, CapabilityEntry, CapabilityError};
use wf_host::capability::{MAX_LOG_BYTES, MAX_LOG_RECORD_BYTES, MAX_LOG_RECORDS};
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
        .load_bytes("empty.wasm", &wat_to_binary("(component)"))
        .err()
        .expect("must fail");
    assert!(matches!(err, LoadError::WrongWorld { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "`empty.wasm` does not target the `wf:node/node@0.2.0` world: it has no export `run`; a node exports `run: func(input: string) -> result<string, node-error>`"
    );
}

#[tokio::test]
async fn a_component_with_a_foreign_import_names_it() {
    let (runtime, _cache) = runtime();
    let err = runtime
        .load_bytes(
            "foreign.wasm",
            &wat_to_binary(r#"(component (import "acme:kv/store@1.0.0" (instance)))"#),
        )
        .err()
        .expect("must fail");
    assert_eq!(
        err.to_string(),
        "`foreign.wasm` does not target the `wf:node/node@0.2.0` world: it imports `acme:kv/store@1.0.0`, which wf-host does not provide; a node may import only `wf:node/capability@0.2.0`, `wf:node/durable@0.2.0` (or `wf:node/capability@0.1.0`) and WASI"
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

#[tokio::test]
async fn a_node_logging_big_strings_leaves_bounded_records_and_completes() {
    let (runtime, _cache) = runtime();
    let misbehave = runtime.load(&guest("misbehave")).unwrap();
    // 2,000 records of 100 KiB: ~200 MB if kept as logged.
    let report = runtime
        .run(
            &misbehave,
            r#"{"mode": "log", "count": 2000, "bytes": 102400}"#,
            RunOptions::default(),
        )
        .await;
    assert_eq!(expect_ok(&report), r#"{"logged":2000}"#);

    let marker = format!("… [{} more bytes truncated]", 102400 - MAX_LOG_RECORD_BYTES);
    let (last, kept) = report.logs.split_last().unwrap();
    assert!(kept.len() <= MAX_LOG_RECORDS);
    for record in kept {
        assert!(record.message.ends_with(&marker), "not marked truncated");
        assert_eq!(record.message.len(), MAX_LOG_RECORD_BYTES + marker.len());
    }
    let total: usize = report.logs.iter().map(|r| r.message.len()).sum();
    assert!(total <= MAX_LOG_BYTES + 1024, "{total} bytes of logs kept");
    assert_eq!(last.level, "warn");
    let dropped = 2000 - kept.len();
    assert_eq!(
        last.message,
        format!(
            "[{dropped} more log records ({} bytes) dropped: a run keeps at most {MAX_LOG_RECORDS} records and {MAX_LOG_BYTES} bytes]",
            dropped * 102400
        )
    );
}

/// A component whose `run` answers `null` (or spins forever when `looping`),
/// that also instantiates `hogs` core modules, each with a memory of `pages`
/// 64 KiB pages: many memories in one component.
fn many_memories(hogs: usize, pages: u32, looping: bool) -> String {
    let hog_instances: String = (0..hogs)
        .map(|i| format!("(core instance $hog{i} (instantiate $hog))\n"))
        .collect();
    let body = if looping {
        "(loop $spin (br $spin)) unreachable"
    } else {
        "i32.const 0"
    };
    format!(
        r#"(component
  (core module $hog (memory {pages}))
  {hog_instances}
  (core module $main
    (memory (export "memory") 1)
    (global $next (mut i32) (i32.const 1024))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $ptr i32)
      (local.set $ptr (global.get $next))
      (global.set $next (i32.add (global.get $next)
        (i32.and (i32.add (local.get 3) (i32.const 7)) (i32.const -8))))
      (local.get $ptr))
    (func (export "run") (param i32 i32) (result i32) {body})
    ;; result<string, _>: ok (tag 0), the string "null" at 12, 4 bytes long.
    (data (i32.const 0) "\00\00\00\00\0c\00\00\00\04\00\00\00null"))
  (core instance $main (instantiate $main))
  (type $node-error (record (field "code" string) (field "message" string)))
  (export $node-error-export "node-error" (type $node-error))
  (func (export "run") (param "input" string) (result (result string (error $node-error-export)))
    (canon lift (core func $main "run") (memory (core memory $main "memory")) (realloc (core func $main "realloc")))))"#
    )
}

#[tokio::test]
async fn a_many_memory_component_is_held_to_one_max_memory() {
    let max_memory = 64 << 20;
    let (runtime, _cache) = runtime_with(
        RuntimeConfig {
            limits: Limits {
                max_memory,
                ..Limits::default()
            },
            ..Default::default()
        },
        Arc::new(wf_host::capability::NoBackend),
    );
    // One 60 MiB memory fits; four of them (240 MiB in all) do not, though
    // each alone is under the limit.
    let one = runtime
        .load_bytes("one.wasm", &wat_to_binary(&many_memories(1, 960, false)))
        .unwrap();
    assert_eq!(
        expect_ok(&runtime.run(&one, "{}", RunOptions::default()).await),
        "null"
    );
    let four = runtime
        .load_bytes("four.wasm", &wat_to_binary(&many_memories(4, 960, false)))
        .unwrap();
    let report = runtime.run(&four, "{}", RunOptions::default()).await;
    assert_eq!(report.result, Err(RunError::MemoryLimit(max_memory)));
    assert_eq!(report.result.unwrap_err().code(), "memory-limit");
}

#[tokio::test]
async fn a_full_instance_pool_is_busy_not_a_trap_and_the_next_run_succeeds() {
    // Two component slots, so four memory slots: one spinning run of a
    // three-memory component leaves too few for a second.
    let (runtime, _cache) = runtime_with(
        RuntimeConfig {
            pool_instances: 2,
            max_concurrent_runs: 2,
            ..Default::default()
        },
        Arc::new(wf_host::capability::NoBackend),
    );
    let spin = runtime
        .load_bytes("spin.wasm", &wat_to_binary(&many_memories(2, 1, true)))
        .unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let one_run = || async {
        let report = runtime
            .run(
                &spin,
                "{}",
                RunOptions {
                    cancel: cancel.clone(),
                    limits: Some(Limits {
                        timeout: Duration::from_secs(20),
                        ..Limits::default()
                    }),
                    ..Default::default()
                },
            )
            .await;
        // The run that could not get slots ends the spinning one.
        cancel.cancel();
        report.result
    };
    let (a, b) = tokio::join!(one_run(), one_run());
    let mut outcomes = [a.unwrap_err(), b.unwrap_err()];
    outcomes.sort_by_key(|e| e.code().to_owned());
    let [busy, cancelled] = outcomes;
    assert_eq!(cancelled, RunError::Cancelled);
    assert_eq!(busy.code(), "busy");
    let message = busy.to_string();
    assert!(
        message.starts_with("the host is at capacity (maximum concurrent limit of 4 for memor")
            && message.ends_with("reached); retry later"),
        "{message}"
    );

    // The slots are back: the same component instantiates again.
    let echo = runtime.load(&plugin("echo")).unwrap();
    assert_eq!(
        expect_ok(&runtime.run(&echo, "[2]", RunOptions::default()).await),
        "[2]"
    );
}

/// Waits until `check` holds, polling the runtime's own counters.
async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "never saw: {what}");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn runs_past_max_concurrent_runs_wait_for_a_slot() {
    let (runtime, _cache) = runtime_with(
        RuntimeConfig {
            max_concurrent_runs: 1,
            ..Default::default()
        },
        Arc::new(wf_host::capability::NoBackend),
    );
    let misbehave = runtime.load(&guest("misbehave")).unwrap();
    let echo = runtime.load(&plugin("echo")).unwrap();
    let spinning = RunOptions::default();
    let stop_spinning = spinning.cancel.clone();
    let queued_cancel = RunOptions::default();
    let cancel_queued = queued_cancel.cancel.clone();

    let spin = runtime.run(&misbehave, r#"{"mode": "loop"}"#, spinning);
    let waiting = runtime.run(&echo, "[3]", RunOptions::default());
    let times_out = runtime.run(
        &echo,
        "[4]",
        RunOptions {
            limits: Some(Limits {
                timeout: Duration::from_millis(300),
                ..Limits::default()
            }),
            ..Default::default()
        },
    );
    let cancelled = runtime.run(&echo, "[5]", queued_cancel);
    let driver = async {
        until("one running, three queued", || {
            let s = runtime.stats();
            (s.running, s.queued) == (1, 3)
        })
        .await;
        cancel_queued.cancel();
        until("the timed-out run leaves the queue", || {
            runtime.stats().queued == 1
        })
        .await;
        // Only now is the slot given up; the waiting run then gets it.
        stop_spinning.cancel();
    };
    let (spin, waiting, times_out, cancelled, ()) =
        tokio::join!(spin, waiting, times_out, cancelled, driver);
    assert_eq!(spin.result, Err(RunError::Cancelled));
    assert_eq!(expect_ok(&waiting), "[3]");
    assert_eq!(
        times_out.result,
        Err(RunError::Timeout(Duration::from_millis(300)))
    );
    assert_eq!(cancelled.result, Err(RunError::Cancelled));
    let stats = runtime.stats();
    assert_eq!((stats.running, stats.queued), (0, 0));
}

#[tokio::test]
async fn output_past_max_output_is_output_too_large() {
    let (runtime, _cache) = runtime_with(
        RuntimeConfig {
            max_output: 1000,
            ..Default::default()
        },
        Arc::new(wf_host::capability::NoBackend),
    );
    let misbehave = runtime.load(&guest("misbehave")).unwrap();
    let report = runtime
        .run(
            &misbehave,
            r#"{"mode": "output", "bytes": 1000}"#,
            RunOptions::default(),
        )
        .await;
    assert_eq!(expect_ok(&report).len(), 1000);
    let report = runtime
        .run(
            &misbehave,
            r#"{"mode": "output", "bytes": 1001}"#,
            RunOptions::default(),
        )
        .await;
    let err = report.result.unwrap_err();
    assert_eq!(err.code(), "output-too-large");
    assert_eq!(
        err.to_string(),
        "node returned 1001 bytes of output; the limit is 1000 bytes (`[runtime] max_output`)"
    );
}

#[tokio::test]
async fn input_past_max_input_is_invalid_input() {
    let (runtime, _cache) = runtime_with(
        RuntimeConfig {
            max_input: 10,
            ..Default::default()
        },
        Arc::new(wf_host::capability::NoBackend),
    );
    let echo = runtime.load(&plugin("echo")).unwrap();
    assert_eq!(
        expect_ok(&runtime.run(&echo, "[1,2,3,4]", RunOptions::default()).await),
        "[1,2,3,4]"
    );
    let report = runtime
        .run(&echo, "[1,2,3,4,5]", RunOptions::default())
        .await;
    let err = report.result.unwrap_err();
    assert_eq!(err.code(), "invalid-input");
    assert_eq!(
        err.to_string(),
        "input is 11 bytes; the limit is 10 bytes (`[runtime] max_input`)"
    );
}

#[tokio::test]
async fn the_cache_dir_is_created_for_this_user_only() {
    use std::os::unix::fs::PermissionsExt;
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("new").join("cache");
    let config = RuntimeConfig {
        cache_dir: Some(dir.clone()),
        ..Default::default()
    };
    let runtime =
        wf_host::runtime::Runtime::new(config, Arc::new(wf_host::capability::NoBackend)).unwrap();
    assert!(runtime.cache().is_some());
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{mode:o}");
}

#[tokio::test]
async fn a_cache_dir_others_may_write_is_not_used() {
    use std::os::unix::fs::PermissionsExt;
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        ..Default::default()
    };
    let backend = Arc::new(wf_host::capability::NoBackend);
    let first = wf_host::runtime::Runtime::new(config.clone(), backend.clone()).unwrap();
    first.load(&plugin("echo")).unwrap();
    assert_eq!(first.stats().cache.stored, 1);

    // Anyone could have swapped the entry in a world-writable directory.
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let second = wf_host::runtime::Runtime::new(config.clone(), backend.clone()).unwrap();
    assert!(second.cache().is_none());
    let node = second.load(&plugin("echo")).unwrap();
    assert_eq!((second.stats().cache.hits, second.stats().compiles), (0, 1));
    assert_eq!(
        expect_ok(&second.run(&node, "7", RunOptions::default()).await),
        "7"
    );

    // An owner-only directory with an entry others may write: the entry is
    // refused and rebuilt.
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let entry = first
        .cache()
        .unwrap()
        .entry_path(&std::fs::read(plugin("echo")).unwrap());
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).unwrap();
    let third = wf_host::runtime::Runtime::new(config, backend).unwrap();
    third.load(&plugin("echo")).unwrap();
    let stats = third.stats();
    assert_eq!(
        (stats.cache.rejected, stats.cache.hits, stats.compiles),
        (1, 0, 1)
    );
}

#[tokio::test]
async fn cache_entries_of_other_engine_versions_are_pruned() {
    let cache = tempfile::tempdir().unwrap();
    let stale = cache
        .path()
        .join(format!("{}-00000000deadbeef.cwasm", "ab".repeat(32)));
    std::fs::write(&stale, b"compiled by another wasmtime").unwrap();
    let runtime = wf_host::runtime::Runtime::new(
        RuntimeConfig {
            cache_dir: Some(cache.path().to_path_buf()),
            ..Default::default()
        },
        Arc::new(wf_host::capability::NoBackend),
    )
    .unwrap();
    runtime.load(&plugin("echo")).unwrap();
    assert!(!stale.exists(), "the other engine's entry is still there");
    let stats = runtime.stats().cache;
    assert_eq!((stats.stored, stats.pruned), (1, 1));
}

#[tokio::test]
async fn a_node_sees_no_files_env_or_sockets_but_has_clocks_and_random() {
    let (runtime, _cache) = runtime();
    let sandbox = runtime.load(&guest("sandbox")).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let input = json!({"connect": listener.local_addr().unwrap().to_string()}).to_string();

    let first: Value = serde_json::from_str(expect_ok(
        &runtime.run(&sandbox, &input, RunOptions::default()).await,
    ))
    .unwrap();
    for (what, outcome) in first["files"].as_object().unwrap() {
        assert!(outcome.get("err").is_some(), "{what}: {outcome}");
    }
    assert_eq!(first["env"], json!([]));
    assert_eq!(first["args"], json!([]));
    assert!(first["tcp"].get("err").is_some(), "{}", first["tcp"]);
    assert!(first["dns"].get("err").is_some(), "{}", first["dns"]);
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the node reached a host socket"
    );

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(first["wall_clock_secs"].as_u64().unwrap().abs_diff(now) < 60);
    assert_eq!(first["monotonic_ok"], true);

    let second: Value = serde_json::from_str(expect_ok(
        &runtime.run(&sandbox, &input, RunOptions::default()).await,
    ))
    .unwrap();
    assert_ne!(
        first["random"], second["random"],
        "random is seeded per instance"
    );
}

#[tokio::test]
async fn no_state_carries_over_between_runs() {
    let (runtime, _cache) = runtime();
    let sandbox = runtime.load(&guest("sandbox")).unwrap();
    let input = r#"{"connect": "127.0.0.1:9"}"#;
    for _ in 0..3 {
        let seen: Value = serde_json::from_str(expect_ok(
            &runtime.run(&sandbox, input, RunOptions::default()).await,
        ))
        .unwrap();
        assert_eq!(seen["runs_in_this_instance"], 1, "a global survived a run");
    }
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

/// A component that looks for a mark at two addresses (just past its data,
/// and in its third page), answers `"seen"` if either holds it, else sets both
/// and answers `null`: what one run leaves behind, the next must not see.
const RESIDUE: &str = r#"(component
  (core module $main
    (memory (export "memory") 3)
    (global $next (mut i32) (i32.const 1024))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $ptr i32)
      (local.set $ptr (global.get $next))
      (global.set $next (i32.add (global.get $next)
        (i32.and (i32.add (local.get 3) (i32.const 7)) (i32.const -8))))
      (local.get $ptr))
    (func (export "run") (param i32 i32) (result i32)
      (if (i32.or
            (i32.eq (i32.load (i32.const 4096)) (i32.const 0xC0FFEE))
            (i32.eq (i32.load (i32.const 131172)) (i32.const 0xC0FFEE)))
        (then (return (i32.const 32))))
      (i32.store (i32.const 4096) (i32.const 0xC0FFEE))
      (i32.store (i32.const 131172) (i32.const 0xC0FFEE))
      (i32.const 0))
    ;; ok "null" at 0 (string at 12), ok "\"seen\"" at 32 (string at 44)
    (data (i32.const 0) "\00\00\00\00\0c\00\00\00\04\00\00\00null")
    (data (i32.const 32) "\00\00\00\00\2c\00\00\00\06\00\00\00\22seen\22"))
  (core instance $main (instantiate $main))
  (type $node-error (record (field "code" string) (field "message" string)))
  (export $node-error-export "node-error" (type $node-error))
  (func (export "run") (param "input" string) (result (result string (error $node-error-export)))
    (canon lift (core func $main "run") (memory (core memory $main "memory")) (realloc (core func $main "realloc")))))"#;

#[tokio::test]
async fn a_run_never_sees_what_the_previous_run_left_in_memory() {
    for pagemap_scan in [true, false] {
        let (runtime, _cache) = runtime_with(
            RuntimeConfig {
                // One slot, so every run reuses the same memory.
                pool_instances: 1,
                max_concurrent_runs: 1,
                reset: wf_host::runtime::SlotReset {
                    pagemap_scan,
                    ..Default::default()
                },
                ..Default::default()
            },
            Arc::new(wf_host::capability::NoBackend),
        );
        if !pagemap_scan {
            assert!(!runtime.pagemap_scan());
        }
        let node = runtime
            .load_bytes("residue.wasm", &wat_to_binary(RESIDUE))
            .unwrap();
        eprintln!(
            "pagemap_scan asked: {pagemap_scan}, in use: {}",
            runtime.pagemap_scan()
        );
        for run in 0..5 {
            let report = runtime.run(&node, "{}", RunOptions::default()).await;
            assert_eq!(
                expect_ok(&report),
                "null",
                "run {run} saw the previous run's memory (pagemap_scan: {})",
                runtime.pagemap_scan()
            );
        }
    }
}

/// Answers every tool call from another task, so a run waits on its call
/// (the answer is not ready when the guest asks).
struct LaterBackend;

#[async_trait]
impl CapabilityBackend for LaterBackend {
    async fn call_tool(
        &self,
        _: &str,
        _: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        let answer = tokio::spawn(async move {
            tokio::task::yield_now().await;
            json!({"content": [], "structuredContent": arguments, "isError": false})
        });
        Ok(answer.await.expect("the answering task"))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_waited_keeps_its_slot_until_its_instance_is_gone() {
    // One instance slot. A run that waited on a host call hands its answer
    // back before its instance is torn down; the next run must still find the
    // slot free (it waits for the run slot, which the teardown holds), never
    // `busy`.
    let (runtime, _cache) = runtime_with(
        RuntimeConfig {
            pool_instances: 1,
            max_concurrent_runs: 1,
            ..Default::default()
        },
        Arc::new(LaterBackend),
    );
    let runtime = Arc::new(runtime);
    let node = runtime.load(&plugin("call")).unwrap();
    let loops = (0..4).map(|i| {
        let (runtime, node) = (runtime.clone(), node.clone());
        tokio::spawn(async move {
            for n in 0..25 {
                let input = json!({"capability": "notes.search", "arguments": {"loop": i, "n": n}});
                let report = runtime
                    .run(&node, &input.to_string(), granting(&["notes.search"]))
                    .await;
                let output: Value = serde_json::from_str(expect_ok(&report)).unwrap();
                assert_eq!(output["structuredContent"], json!({"loop": i, "n": n}));
            }
        })
    });
    for handle in loops.collect::<Vec<_>>() {
        handle.await.unwrap();
    }
}
