//! The `wf-host` command line: output, exit codes and error text.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

use common::*;

/// Runs `wf-host` with `args`, an isolated cache and optional stdin.
fn wf_host(args: &[&str], stdin: Option<&str>) -> Output {
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(wf_host_bin());
    cmd.args(args)
        .current_dir(repo_root())
        .env("WF_HOST_CACHE_DIR", cache.path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd.spawn().expect("spawn wf-host");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn run_prints_the_output_and_exits_zero() {
    let out = wf_host(
        &[
            "run",
            "plugins/echo.wasm",
            "--input",
            r#"{"hello": "wörld"}"#,
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "{\"hello\": \"wörld\"}\n");
    assert!(
        stderr(&out).contains("echo: 19 bytes"),
        "the node's log line goes to stderr: {}",
        stderr(&out)
    );
}

#[test]
fn bare_run_uses_null_without_piped_input() {
    let out = wf_host(&["run", "plugins/echo.wasm"], None);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "null\n");
}

#[test]
fn run_reads_piped_stdin_and_input_files() {
    let out = wf_host(&["run", "plugins/echo.wasm"], Some("[1, 2, 3]\n"));
    assert_eq!(stdout(&out), "[1, 2, 3]\n");
    let out = wf_host(
        &["run", "plugins/echo.wasm", "--input-file", "-"],
        Some(r#""dash""#),
    );
    assert_eq!(stdout(&out), "\"dash\"\n");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.json");
    std::fs::write(&file, r#"{"from": "file"}"#).unwrap();
    let out = wf_host(
        &[
            "run",
            "plugins/echo.wasm",
            "--input-file",
            file.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(stdout(&out), "{\"from\": \"file\"}\n");
}

#[test]
fn invalid_json_input_gives_the_position_and_exit_two() {
    let out = wf_host(
        &["run", "plugins/echo.wasm", "--input", "{\"a\": 1,}"],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: --input is not valid JSON: key must be a string at line 1 column 9\n"
    );
}

#[test]
fn a_missing_component_is_named() {
    let out = wf_host(&["run", "plugins/nope.wasm"], None);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: component `plugins/nope.wasm` not found\n"
    );
}

#[test]
fn a_core_module_is_rejected_with_how_to_wrap_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("core.wasm");
    std::fs::write(&path, wat::parse_str("(module)").unwrap()).unwrap();
    let out = wf_host(&["run", path.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    let p = path.display();
    assert_eq!(
        stderr(&out),
        format!(
            "error: `{p}` is a core WebAssembly module, not a component; build it for `wasm32-wasip2`, or wrap it with `wasm-tools component new {p} -o node.wasm` (add `--adapt wasi_snapshot_preview1=<adapter.wasm>` if it imports WASI preview 1)\n"
        )
    );
}

#[test]
fn a_component_for_another_world_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.wasm");
    std::fs::write(
        &path,
        wat::parse_str(r#"(component (import "acme:kv/store@1.0.0" (instance)))"#).unwrap(),
    )
    .unwrap();
    let out = wf_host(&["run", path.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "error: `{}` does not target the `wf:node/node@0.2.0` world: it imports `acme:kv/store@1.0.0`, which wf-host does not provide; a node may import only `wf:node/capability@0.2.0`, `wf:node/durable@0.2.0` (or `wf:node/capability@0.1.0`) and WASI\n",
            path.display()
        )
    );
}

#[test]
fn garbage_is_not_a_webassembly_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.wasm");
    std::fs::write(&path, b"\x7fELF\x02\x01").unwrap();
    let out = wf_host(&["run", path.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "error: `{}` is not a WebAssembly file (it does not start with the `\\0asm` header); wf-host runs components built for the `wf:node/node@0.2.0` world\n",
            path.display()
        )
    );
}

#[test]
fn a_node_error_exits_one_with_its_code() {
    let out = wf_host(
        &[
            "run",
            "plugins/call.wasm",
            "--allow",
            "fixture.echo",
            "--input",
            r#"{"capability": "fixture.echo"}"#,
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: `call` failed: node returned error `unavailable`: no MCP connection is configured; add a [connections.<id>] table to the config\n"
    );
    assert_eq!(stdout(&out), "");
}

#[test]
fn limits_from_the_command_line_are_enforced() {
    let misbehave = guest("misbehave");
    let m = misbehave.to_str().unwrap();
    let out = wf_host(
        &[
            "run",
            m,
            "--timeout",
            "300ms",
            "--input",
            r#"{"mode": "loop"}"#,
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: `misbehave` failed: run exceeded its time limit of 300ms\n"
    );

    let out = wf_host(
        &[
            "run",
            m,
            "--max-memory",
            "16MiB",
            "--input",
            r#"{"mode": "grow", "mib": 32}"#,
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: `misbehave` failed: run exceeded its memory limit of 16.0 MiB\n"
    );
}

#[test]
fn a_bad_config_file_is_named_with_exit_two() {
    let out = wf_host(&["run", "plugins/echo.wasm", "--config", "nope.toml"], None);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out), "error: config file `nope.toml` not found\n");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[runtime]\ntimeout = \"soon\"\n").unwrap();
    let out = wf_host(
        &[
            "run",
            "plugins/echo.wasm",
            "--config",
            path.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with(&format!(
            "error: config file `{}` is invalid: TOML parse error at line 2",
            path.display()
        )),
        "{}",
        stderr(&out)
    );
}

#[test]
fn usage_errors_exit_two() {
    let out = wf_host(&["run"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("required arguments were not provided"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn run_help_shows_examples() {
    let out = wf_host(&["run", "--help"], None);
    assert_eq!(out.status.code(), Some(0));
    let help = stdout(&out);
    assert!(help.contains("Examples:"), "{help}");
    assert!(
        help.contains("wf-host run plugins/echo.wasm --input"),
        "{help}"
    );
}

#[test]
fn compile_warms_the_cache_for_the_next_run() {
    let cache = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(wf_host_bin())
            .args(args)
            .current_dir(repo_root())
            .env("WF_HOST_CACHE_DIR", cache.path())
            .output()
            .unwrap()
    };
    let out = run(&["compile", "plugins/echo.wasm"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("compiled: "), "{}", stdout(&out));
    let out = run(&["compile", "plugins/echo.wasm"]);
    assert!(
        stdout(&out).starts_with("already cached: "),
        "{}",
        stdout(&out)
    );
    let entries = std::fs::read_dir(cache.path()).unwrap().count();
    assert_eq!(entries, 1);
}

#[test]
fn test_passes_on_good_cases() {
    let out = wf_host(
        &[
            "test",
            "plugins/call.wasm",
            "--case",
            "plugins/call/cases/echo.toml",
            "--case",
            "plugins/call/cases/denied.toml",
        ],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(
        stdout(&out),
        "ok   plugins/call/cases/echo.toml\nok   plugins/call/cases/denied.toml\n2 passed, 0 failed\n"
    );
}

#[test]
fn test_fails_on_a_bad_case_with_a_diff() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("bad.toml");
    std::fs::write(
        &case,
        r#"input = { capability = "fixture.echo", arguments = { text = "hi" } }
allow = ["fixture.echo"]

[expect]
output_includes = { content = [{ text = "bye" }] }
calls = [{ tool = "echo", arguments = { text = "bye" } }]
"#,
    )
    .unwrap();
    let out = wf_host(
        &[
            "test",
            "plugins/call.wasm",
            "--case",
            case.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stdout(&out),
        format!(
            r#"FAIL {}
  output does not include `expect.output_includes`:
  json atoms at path ".content[0].text" are not equal:
      expected:
          "bye"
      actual:
          "hi"
  call 0 (`echo`) arguments differ:
  json atoms at path ".text" are not equal:
      expected:
          "bye"
      actual:
          "hi"
  node output: {{"content":[{{"text":"hi","type":"text"}}],"isError":false,"structuredContent":{{"text":"hi"}}}}
  --- node log ---
  debug calling fixture.echo

0 passed, 1 failed
"#,
            case.display()
        )
    );
    assert_eq!(stderr(&out), "error: 1 of 1 cases failed\n");
}

#[test]
fn test_shows_guest_output_when_a_case_fails() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("print.toml");
    std::fs::write(
        &case,
        "input = { mode = \"print\", stdout = \"out line\\n\", stderr = \"err line\\n\" }\n[expect]\noutput = \"something else\"\n",
    )
    .unwrap();
    let misbehave = guest("misbehave");
    let out = wf_host(
        &[
            "test",
            misbehave.to_str().unwrap(),
            "--case",
            case.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("  --- guest stdout ---\n  out line\n"),
        "{text}"
    );
    assert!(
        text.contains("  --- guest stderr ---\n  err line\n"),
        "{text}"
    );
    assert!(
        text.contains("json atoms at path \"(root)\" are not equal:\n      actual:\n          \"printed\"\n      expected:\n          \"something else\""),
        "{text}"
    );
}

#[test]
fn test_rejects_an_invalid_case_file() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("empty.toml");
    std::fs::write(&case, "input = 1\n[expect]\n").unwrap();
    let out = wf_host(
        &[
            "test",
            "plugins/echo.wasm",
            "--case",
            case.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "error: case file `{}` is invalid: [expect] needs exactly one of `output`, `output_includes`, `error`\n",
            case.display()
        )
    );
}

#[test]
fn run_with_the_example_config_calls_the_fixture() {
    let out = wf_host(
        &[
            "run",
            "plugins/call.wasm",
            "--config",
            "examples/fixture.toml",
            "--input",
            r#"{"capability":"fixture.echo","arguments":{"text":"hi"}}"#,
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "{\"content\":[{\"text\":\"hi\",\"type\":\"text\"}],\"isError\":false,\"structuredContent\":{\"text\":\"hi\"}}\n"
    );
}

#[test]
fn run_denies_ungranted_capabilities() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("wf.toml");
    std::fs::write(
        &config,
        "[connections.fixture]\ncommand = \"wf-host\"\nargs = [\"fixture-server\"]\n",
    )
    .unwrap();
    let input = r#"{"capability":"fixture.echo","arguments":{"text":"hi"}}"#;
    let out = wf_host(
        &[
            "run",
            "plugins/call.wasm",
            "--config",
            config.to_str().unwrap(),
            "--input",
            input,
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "hint: `wf-host run` grants a node the `allow` of the config's workflows whose `component` is this same file, matched by its path; `plugins/call.wasm` is none of them. Grant on the command line with `--allow PATTERN`, or name this path in the config\n\
         error: `call` failed: node returned error `denied`: `fixture.echo` is not granted to this node (this node has no grants); allow it with the grant `fixture.echo` or `fixture.*`\n"
    );
    let out = wf_host(
        &[
            "run",
            "plugins/call.wasm",
            "--config",
            config.to_str().unwrap(),
            "--allow",
            "fixture.echo",
            "--input",
            input,
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// `wf-host test --record` runs a case against the config's real servers
/// (the official Python SDK server, and the fixture with a secret in its
/// environment) and writes a cassette beside each case, with the secret
/// redacted; without `--record` (and without a config, so no server at all)
/// the cases pass from their cassettes. A call the cassette does not hold
/// fails with its argument diff; a line no call used fails unless
/// `[cassette] allow_unused` says it may.
#[test]
fn cases_recorded_against_real_servers_replay_with_the_servers_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (python, script) = {
        let root = repo_root().join("tests/interop/python");
        (root.join(".venv/bin/python"), root.join("server.py"))
    };
    assert!(
        python.exists(),
        "{} is missing: run tests/interop/setup.sh (tests/run.sh does)",
        python.display()
    );
    let config = dir.path().join("wf.toml");
    std::fs::write(
        &config,
        format!(
            r#"[connections.py]
command = {python:?}
args = [{script:?}]

[connections.fx]
command = "wf-host"
args = ["fixture-server"]
env = {{ API_TOKEN = "tok-7f3a9c2e" }}
"#
        ),
    )
    .unwrap();
    let echo = dir.path().join("echo.toml");
    std::fs::write(
        &echo,
        r#"input = { capability = "py.echo", arguments = { text = "hi" } }
allow = ["py.echo"]
[expect]
output_includes = { content = [{ text = "hi" }] }
calls = [{ tool = "echo", arguments = { text = "hi" } }]
"#,
    )
    .unwrap();
    let env = dir.path().join("env.toml");
    std::fs::write(
        &env,
        r#"input = { capability = "fx.env", arguments = {} }
allow = ["fx.env"]
[expect]
output_includes = { isError = false }
"#,
    )
    .unwrap();
    let case_args = |extra: &[&str]| {
        let mut args = vec![
            "test".to_owned(),
            "plugins/call.wasm".to_owned(),
            "--case".to_owned(),
            echo.display().to_string(),
            env.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let config_arg = config.display().to_string();
    let record = case_args(&["--record", "--config", &config_arg]);
    let out = wf_host(&record.iter().map(String::as_str).collect::<Vec<_>>(), None);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("2 passed, 0 failed"),
        "{}",
        stdout(&out)
    );
    let echo_tape = std::fs::read_to_string(dir.path().join("echo.cassette.jsonl")).unwrap();
    let lines: Vec<Value> = echo_tape
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{echo_tape}");
    assert_eq!(lines[0]["kind"], "tool");
    assert_eq!(lines[0]["name"], "py.echo");
    assert_eq!(lines[0]["arguments"], json!({"text": "hi"}));
    assert_eq!(lines[0]["result"]["content"][0]["text"], "hi");
    let env_tape = std::fs::read_to_string(dir.path().join("env.cassette.jsonl")).unwrap();
    assert!(
        !env_tape.contains("tok-7f3a9c2e"),
        "the secret was written: {env_tape}"
    );
    assert!(env_tape.contains("[redacted]"), "{env_tape}");

    // Replayed: no config, so no server can be reached.
    let replay = case_args(&[]);
    let out = wf_host(&replay.iter().map(String::as_str).collect::<Vec<_>>(), None);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );

    // A call the cassette does not hold: the argument diff is shown.
    std::fs::write(
        &echo,
        std::fs::read_to_string(&echo)
            .unwrap()
            .replace("text = \"hi\" } }", "text = \"bye\" } }"),
    )
    .unwrap();
    let one = |case: &Path| {
        wf_host(
            &[
                "test",
                "plugins/call.wasm",
                "--case",
                case.to_str().unwrap(),
            ],
            None,
        )
    };
    let out = one(&echo);
    assert_eq!(out.status.code(), Some(1));
    let said = stdout(&out);
    assert!(
        said.contains("the cassette has no tool call `py.echo` with arguments {\"text\":\"bye\"}"),
        "{said}"
    );
    assert!(
        said.contains("\"bye\"") && said.contains("\"hi\""),
        "{said}"
    );
    assert!(
        said.contains("did not make"),
        "the recorded call went unused: {said}"
    );

    // A line no call uses: a failure, unless the case allows it.
    let unused = dir.path().join("unused.toml");
    std::fs::write(
        &unused,
        r#"input = { capability = "py.echo", arguments = { text = "hi" } }
allow = ["py.echo"]
[expect]
output_includes = { content = [{ text = "hi" }] }
"#,
    )
    .unwrap();
    let two_calls = format!("{}{}", echo_tape, echo_tape.replace("\"hi\"", "\"again\""));
    std::fs::write(dir.path().join("unused.cassette.jsonl"), &two_calls).unwrap();
    let out = one(&unused);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("`py.echo` {\"text\":\"again\"} that the node did not make"),
        "{}",
        stdout(&out)
    );
    std::fs::write(
        &unused,
        std::fs::read_to_string(&unused).unwrap() + "[cassette]\nallow_unused = true\n",
    )
    .unwrap();
    let out = one(&unused);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

/// A durable node's waits are answered by its case: a sleep of ten minutes is
/// over at once, `wait-signal` gets the case's payload, and `run-workflow`
/// gets the case's output or error of that workflow. Recorded against the
/// official Python SDK server, the cassette holds the node's tool calls only;
/// replayed with no server, the case passes again with its waits answered
/// the same way, and a changed payload is seen in the output.
#[test]
fn a_durable_nodes_case_answers_its_waits_and_replays_from_a_cassette() {
    let dir = tempfile::tempdir().unwrap();
    let (python, script) = {
        let root = repo_root().join("tests/interop/python");
        (root.join(".venv/bin/python"), root.join("server.py"))
    };
    let config = dir.path().join("wf.toml");
    std::fs::write(
        &config,
        format!("[connections.py]\ncommand = {python:?}\nargs = [{script:?}]\n"),
    )
    .unwrap();
    // JSON: the output holds a `null` (the sleep's), which TOML cannot say.
    let case = dir.path().join("approval.json");
    let written = |payload: Value| {
        let case_json = json!({
            "input": {"do": [
                {"call": "py.echo", "arguments": {"text": "asked"}},
                {"sleep_ms": 600000},
                {"signal": "approve"},
                {"workflow": "review", "input": {"n": 1}},
                {"workflow": "audit", "input": {}},
                {"call": "py.echo", "arguments": {"text": "told"}},
            ]},
            "allow": ["py.echo", "workflow.review", "workflow.audit"],
            "signals": {"approve": payload},
            "workflows": {
                "review": {"output": {"score": 7}},
                "audit": {"error": {"code": "failed", "message": "no auditor today"}},
            },
            "expect": {"output": [
                "asked", null, {"ok": true}, {"score": 7},
                {"error": "failed", "message": "no auditor today"}, "told",
            ]},
        });
        std::fs::write(&case, case_json.to_string()).unwrap();
    };
    written(json!({"ok": true}));
    let node = guest("durable").display().to_string();
    let case_arg = case.display().to_string();
    let config_arg = config.display().to_string();
    let started = std::time::Instant::now();
    let out = wf_host(
        &[
            "test",
            &node,
            "--case",
            &case_arg,
            "--record",
            "--config",
            &config_arg,
        ],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(300),
        "the case's ten-minute sleep was slept"
    );
    let tape = std::fs::read_to_string(dir.path().join("approval.cassette.jsonl")).unwrap();
    let lines: Vec<Value> = tape
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<_> = lines.iter().map(|l| l["name"].clone()).collect();
    assert_eq!(names, [json!("py.echo"), json!("py.echo")], "{tape}");

    // From the cassette, with no config: the same, waits answered by the case.
    let out = wf_host(&["test", &node, "--case", &case_arg], None);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    // The payload is the case's: another one is another output.
    written(json!({"ok": false}));
    let out = wf_host(&["test", &node, "--case", &case_arg], None);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("false"), "{}", stdout(&out));
}

/// Grants follow the component's path: a copy of a granted node at another
/// path is denied, and `wf-host run` says why (the config's workflow names
/// a file of the same name elsewhere) and how to grant it (`--allow`); with
/// `--allow` it runs. Without a config, the hint says to give one or
/// `--allow`.
#[test]
fn a_denied_run_says_where_grants_come_from() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("call.wasm");
    std::fs::copy(repo_root().join("plugins/call.wasm"), &copy).unwrap();
    let config = dir.path().join("wf.toml");
    let original = repo_root().join("plugins/call.wasm");
    std::fs::write(
        &config,
        format!(
            "[connections.fixture]\ncommand = \"wf-host\"\nargs = [\"fixture-server\"]\n\n[workflows.call]\ncomponent = {:?}\nallow = [\"fixture.echo\"]\n",
            original.display().to_string()
        ),
    )
    .unwrap();
    let input = r#"{"capability": "fixture.echo", "arguments": {"text": "hi"}}"#;
    let (copy, config) = (copy.display().to_string(), config.display().to_string());
    let out = wf_host(&["run", &copy, "--config", &config, "--input", input], None);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("matched by its path"), "{said}");
    assert!(
        said.contains("workflow `call` names") && said.contains("another file of the same name"),
        "{said}"
    );
    assert!(said.contains("--allow PATTERN"), "{said}");

    let out = wf_host(
        &[
            "run",
            &copy,
            "--config",
            &config,
            "--allow",
            "fixture.echo",
            "--input",
            input,
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let out = wf_host(&["run", &copy, "--input", input], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("or `--config FILE`"),
        "{}",
        stderr(&out)
    );
}
