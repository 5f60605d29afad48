//! The doc check: every command in the README runs as written, from the folder
//! the README says, and prints what the README says it prints.
//!
//! `cargo run --release -- ARGS` is run as `wf-host ARGS` with the binary built
//! for these tests (the same program, without a second release build). A
//! command this check does not know how to run fails it: new commands must be
//! run here or listed in [`NOT_RUN`] with the reason.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use common::*;

/// Commands that are not run here, and why.
const NOT_RUN: &[(&str, &str)] = &[(
    "tests/run.sh",
    "the test command itself: this check runs inside it",
)];

struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    lang: String,
    text: String,
    /// The prose after the block, up to the next fence.
    after: String,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut out: Vec<Block> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(lang) = lines[i].strip_prefix("```") {
            let start = i;
            let mut text = String::new();
            i += 1;
            while i < lines.len() && !lines[i].starts_with("```") {
                text.push_str(lines[i]);
                text.push('\n');
                i += 1;
            }
            let mut after = String::new();
            let mut j = i + 1;
            while j < lines.len() && !lines[j].starts_with("```") {
                after.push_str(lines[j]);
                after.push('\n');
                j += 1;
            }
            out.push(Block {
                line: start + 1,
                lang: lang.trim().to_owned(),
                text,
                after,
            });
        }
        i += 1;
    }
    out
}

/// A shell block's commands: `\` continuations joined, comment lines dropped.
/// Each with what it is said to print: a trailing `# prints X`.
fn commands(block: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        let line = line.trim_end();
        if current.is_empty() && (line.trim().is_empty() || line.trim_start().starts_with('#')) {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let (command, prints) = match current.split_once("   # ") {
            Some((command, comment)) => (
                command.trim().to_owned(),
                comment.trim().strip_prefix("prints ").map(str::to_owned),
            ),
            None => (current.trim().to_owned(), None),
        };
        out.push((command, prints));
        current.clear();
    }
    out
}

fn shell(script: &str, cwd: &Path, cache: &Path) -> std::process::Output {
    let bin_dir = wf_host_bin().parent().unwrap().to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(cwd)
        .env("PATH", path)
        .env("WF_HOST_CACHE_DIR", cache)
        .env_remove("WF_HOST_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("bash runs")
}

fn as_written(command: &str) -> String {
    command.replace("cargo run --release -- ", "wf-host ")
}

/// stdout equals `expected`, as JSON when both are JSON.
fn assert_prints(what: &str, stdout: &str, expected: &str) {
    let got = stdout.trim();
    match (
        serde_json::from_str::<Value>(got),
        serde_json::from_str::<Value>(expected),
    ) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}: printed {got}"),
        _ => assert_eq!(got, expected, "{what}"),
    }
}

/// What the prose right after a block says its (only) command prints: an
/// inline `prints `X`` or the ```json block that follows "prints …:".
fn said_to_print(blocks: &[Block], index: usize) -> Option<String> {
    let after = &blocks[index].after;
    if let Some(rest) = after.split("prints `").nth(1) {
        return rest.split('`').next().map(str::to_owned);
    }
    let next = blocks.get(index + 1)?;
    (after.trim_end().ends_with(':') && after.contains("prints") && next.lang == "json")
        .then(|| next.text.trim().to_owned())
}

#[test]
fn readme_commands_work_as_written() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let all = blocks(&readme);
    let rust_guide = readme[..readme.find("## Writing a node in Rust").unwrap()]
        .lines()
        .count();
    let cache = tempfile::tempdir().unwrap();
    let mut ran = 0;
    for (index, block) in all.iter().enumerate() {
        if block.lang != "sh" || block.line > rust_guide {
            continue;
        }
        let commands = commands(&block.text);
        let said = said_to_print(&all, index);
        for (n, (command, prints)) in commands.iter().enumerate() {
            let what = format!("README.md:{}: `{command}`", block.line);
            if let Some((_, why)) = NOT_RUN.iter().find(|(c, _)| c == command) {
                eprintln!("not run here ({why}): {command}");
                continue;
            }
            let out = if command.starts_with("curl ") {
                run_curl(command)
            } else {
                shell(&as_written(command), &root, cache.path())
            };
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{what} failed ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            let expected = prints.clone().or(if n == 0 { said.clone() } else { None });
            if let Some(expected) = expected {
                assert_prints(&what, &stdout, &expected);
            }
            ran += 1;
        }
    }
    assert!(ran >= 6, "only {ran} README commands ran");
    // Nothing the commands did was left in the repository.
    assert!(!root.join("examples/.wf-host").exists());
}

/// `curl … localhost:7878/rpc …` against `wf-host serve --config
/// examples/fixture.toml`, on a free port.
fn run_curl(command: &str) -> std::process::Output {
    let root = repo_root();
    let cache = tempfile::tempdir().unwrap();
    let mut serve = Command::new(wf_host_bin())
        .args([
            "serve",
            "--config",
            "examples/fixture.toml",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--state", ":memory:"])
        .current_dir(&root)
        .env("WF_HOST_CACHE_DIR", cache.path())
        .env_remove("WF_HOST_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(serve.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("serve printed its address").unwrap();
        if let Some(rest) = line.strip_prefix("wf-host listening on http://") {
            break rest.trim_end_matches("/rpc").to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let out = shell(
        &command.replace("localhost:7878", &addr),
        &root,
        cache.path(),
    );
    let _ = serve.kill();
    let _ = serve.wait();
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        reply["result"]["status"], "succeeded",
        "`{command}` answered {reply}"
    );
    out
}

/// The "Writing a node in Rust" guide, followed word for word in an empty
/// folder beside a `wf-host` clone: create, build, run.
#[test]
fn the_rust_node_guide_works_as_written() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme.find("## Writing a node in Rust").unwrap();
    let end = start
        + readme[start..]
            .find("\n## ")
            .map_or(readme.len() - start, |i| i + 1);
    let guide = blocks(&readme[start..end]);
    let work = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&root, work.path().join("wf-host")).unwrap();
    let cache = tempfile::tempdir().unwrap();
    // One shell session: `cd my-node` carries over, as in a terminal.
    let mut script = String::new();
    let mut checks = Vec::new();
    for block in &guide {
        match block.lang.as_str() {
            "sh" => {
                for (command, prints) in commands(&block.text) {
                    script.push_str(&as_written(&command));
                    script.push('\n');
                    if let Some(expected) = prints {
                        // The last line printed so far is what this command printed.
                        script.push_str("echo \"@@$?\"\n");
                        checks.push(expected);
                    }
                }
            }
            "rust" => {
                script.push_str(&format!(
                    "cat > src/lib.rs <<'WF_EOF'\n{}WF_EOF\n",
                    block.text
                ));
            }
            other => panic!("the Rust guide has a `{other}` block this check cannot follow"),
        }
    }
    let out = shell(&script, work.path(), cache.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the Rust guide failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Vec<&str> = stdout
        .lines()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[1] == "@@0")
        .map(|w| w[0])
        .collect();
    assert_eq!(printed.len(), checks.len(), "{stdout}");
    for (got, expected) in printed.iter().zip(&checks) {
        assert_prints("the Rust guide", got, expected);
    }
    assert!(!checks.is_empty());
}
