//! `wf-host new`, `wf-host build` and `wf-host wit`: for every language, a new
//! project in an empty folder builds, runs against the fixture and passes its
//! own test case, by the commands its README gives, with the toolchains that
//! `tests/run.sh` installs. A missing toolchain fails the test with the command
//! that installs it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use serde_json::{Value, json};

use common::*;

/// Where Rust projects build: the guests' target directory (as in
/// `plugins/build.sh`), so the SDK's dependencies are compiled once.
fn cargo_target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
        .join("guests")
}

fn wf_host(args: &[&str], cwd: &Path, cache: &Path) -> Output {
    Command::new(wf_host_bin())
        .args(args)
        .current_dir(cwd)
        .env("WF_HOST_CACHE_DIR", cache)
        .env("CARGO_TARGET_DIR", cargo_target_dir())
        .stdin(Stdio::null())
        .output()
        .expect("wf-host starts")
}

fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "`{what}` failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The commands of the generated README's `sh` block, each with what it is
/// said to print (a trailing `# prints X`).
fn readme_commands(readme: &str) -> Vec<(String, Option<Value>)> {
    let block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README has a sh block");
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| match line.split_once("   # prints ") {
            Some((command, prints)) => (
                command.trim().to_owned(),
                Some(serde_json::from_str(prints.trim()).expect("prints JSON")),
            ),
            None => (line.trim().to_owned(), None),
        })
        .collect()
}

/// `wf-host new` (with `extra` arguments), then the commands of the
/// project's README as written: each must succeed and print what the README
/// says, and its test must pass its case. Prints how long each took. The
/// project's folder, and the commands with what each said to print.
fn new_and_follow_readme(
    language: &str,
    extra: &[&str],
    work: &Path,
    cache: &Path,
) -> (PathBuf, Vec<(String, Option<Value>)>) {
    let mut args = vec!["new", language, "my-node"];
    args.extend(extra);
    let out = wf_host(&args, work, cache);
    assert_success(&args.join(" "), &out);
    let project = work.join("my-node");
    let readme = std::fs::read_to_string(project.join("README.md")).unwrap();
    let commands = readme_commands(&readme);
    let path = format!(
        "{}:{}",
        wf_host_bin().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut timings = Vec::new();
    for (command, prints) in &commands {
        let started = Instant::now();
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", command])
            .current_dir(&project)
            .env("PATH", &path)
            .env("WF_HOST_CACHE_DIR", cache)
            .env("CARGO_TARGET_DIR", cargo_target_dir())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        timings.push(format!(
            "{} {:.1}s",
            command.split_whitespace().nth(1).unwrap_or(command),
            started.elapsed().as_secs_f64()
        ));
        assert_success(&format!("{language}: {command}"), &out);
        if let Some(expected) = prints {
            let printed: Value = serde_json::from_slice(&out.stdout).expect("prints JSON");
            assert_eq!(&printed, expected, "{language}: {command}");
        }
        if command.starts_with("wf-host test") {
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                stdout.contains("1 passed, 0 failed"),
                "{language}: {stdout}"
            );
        }
    }
    eprintln!(
        "{language} {extra:?}: {} ({} bytes)",
        timings.join(", "),
        std::fs::metadata(project.join("my-node.wasm"))
            .unwrap()
            .len()
    );
    (project, commands)
}

/// The commands' verbs: `build` of `wf-host build`.
fn verbs(commands: &[(String, Option<Value>)]) -> Vec<&str> {
    commands
        .iter()
        .map(|(c, _)| c.split_whitespace().nth(1).unwrap_or(""))
        .collect()
}

/// `wf-host new`, then the three commands of the project's README (build, run
/// against the fixture, test) as written.
fn new_build_run_test(language: &str) {
    let work = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let (project, commands) = new_and_follow_readme(language, &[], work.path(), cache.path());
    assert_eq!(
        verbs(&commands),
        ["build", "run", "test"],
        "{language}: README commands"
    );
    assert_eq!(commands[1].1, Some(json!({"echoed": "hi"})), "{language}");

    // Without wf.toml nothing is granted: the node passes the `denied` on.
    let out = wf_host(
        &["run", "my-node.wasm", "--input", r#"{"text": "hi"}"#],
        &project,
        cache.path(),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{language}: ran without a grant"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("node returned error `denied`: `fixture.echo` is not granted"),
        "{language}: {stderr}"
    );
}

/// `wf-host new --durable`: the approval flow builds and passes its case
/// (whose `[signals]` answers its wait); a case that sends another payload
/// gets it back, and one that sends none fails `timeout`. Outside a
/// workflow step (`wf-host run`) there is no run to signal, and it says so.
fn new_durable_build_test(language: &str) {
    let work = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let (project, commands) =
        new_and_follow_readme(language, &["--durable"], work.path(), cache.path());
    assert_eq!(verbs(&commands), ["build", "test"], "{language}");
    let case = project.join("cases/approved.toml");
    let text = std::fs::read_to_string(&case).unwrap();
    std::fs::write(
        project.join("cases/rejected.toml"),
        text.replace("approved = true", "approved = false"),
    )
    .unwrap();
    let silent = text.replace("approve = { approved = true }", "").replace(
        "output_includes = { decision = { approved = true } }",
        "error = { code = \"timeout\", message_contains = \"no `approve` signal\" }",
    );
    let silent = silent.replace("  { tool = \"echo\" },\n", "");
    std::fs::write(project.join("cases/silent.toml"), silent).unwrap();
    let out = wf_host(
        &[
            "test",
            "my-node.wasm",
            "--case",
            "cases/rejected.toml",
            "cases/silent.toml",
        ],
        &project,
        cache.path(),
    );
    assert_success(&format!("{language}: more cases"), &out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("2 passed, 0 failed"),
        "{language}"
    );
    let out = wf_host(
        &[
            "run",
            "my-node.wasm",
            "--config",
            "wf.toml",
            "--input",
            r#"{"request": "x"}"#,
        ],
        &project,
        cache.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{language}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("there is no run to send signal `approve` to"),
        "{language}: {stderr}"
    );
}

#[test]
fn a_new_rust_node_builds_runs_and_passes_its_case() {
    new_build_run_test("rust");
}

#[test]
fn a_new_python_node_builds_runs_and_passes_its_case() {
    new_build_run_test("python");
}

#[test]
fn a_new_js_node_builds_runs_and_passes_its_case() {
    new_build_run_test("js");
}

#[test]
fn a_new_c_node_builds_runs_and_passes_its_case() {
    new_build_run_test("c");
}

#[test]
fn a_new_durable_rust_node_builds_and_passes_its_case() {
    new_durable_build_test("rust");
}

#[test]
fn a_new_durable_python_node_builds_and_passes_its_case() {
    new_durable_build_test("python");
}

#[test]
fn a_new_durable_js_node_builds_and_passes_its_case() {
    new_durable_build_test("js");
}

#[test]
fn a_new_durable_c_node_builds_and_passes_its_case() {
    new_durable_build_test("c");
}

#[test]
fn a_missing_toolchain_names_the_command_that_installs_it() {
    let work = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    assert_success(
        "wf-host new python",
        &wf_host(&["new", "python", "p"], work.path(), cache.path()),
    );
    // An empty PATH: componentize-py is nowhere.
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(wf_host_bin())
        .args(["build", "p"])
        .current_dir(work.path())
        .env("PATH", empty.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        "error: componentize-py is not installed; install it with:  python3 -m pip install componentize-py==0.25.1"
    );
}

#[test]
fn new_refuses_bad_names_unknown_languages_and_full_folders() {
    let work = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let out = wf_host(&["new", "rust", "My Node"], work.path(), cache.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`My Node` is not a valid node name"));

    let out = wf_host(&["new", "cobol", "x"], work.path(), cache.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("there are: rust, python, js, c"));

    std::fs::create_dir(work.path().join("taken")).unwrap();
    std::fs::write(work.path().join("taken/keep.txt"), "mine").unwrap();
    let out = wf_host(
        &["new", "c", "x", "--dir", "taken"],
        work.path(),
        cache.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists and is not empty"));
    assert_eq!(
        std::fs::read_to_string(work.path().join("taken/keep.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn build_outside_a_project_says_so() {
    let work = tempfile::tempdir().unwrap();
    let out = wf_host(&["build"], work.path(), work.path());
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not a node project"), "{stderr}");
    assert!(stderr.contains("wf-host new"), "{stderr}");
}

#[test]
fn wit_writes_the_package_nodes_are_built_against() {
    let work = tempfile::tempdir().unwrap();
    let out = wf_host(&["wit", "--out", "deps/wit"], work.path(), work.path());
    assert_success("wf-host wit", &out);
    assert_eq!(
        std::fs::read_to_string(work.path().join("deps/wit/node.wit")).unwrap(),
        std::fs::read_to_string(repo_root().join("wit/node.wit")).unwrap()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "wrote deps/wit/node.wit"
    );
}
