//! The doc check: every command in the README and in the reference pages
//! ([`REFERENCE_PAGES`]) runs as written, from the repository root, and prints
//! what the page says it prints. The guides (the README's "Writing a node" and
//! `docs/*.md`) are followed top to bottom in an empty folder: their blocks
//! marked ```` ```sh run ```` run in one shell session, and a block marked
//! ```` ```<lang> file=PATH ```` is written to PATH. Every relative link of the
//! README and `docs/*.md` leads to a file, and its `#anchor` to a heading.
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

/// The pages the README's reference moved to, checked as the README is: their
/// ```` ```sh ```` blocks run from the repository root (a `# prints X`, or
/// the prose after the block, says what the first command prints), and their
/// marked blocks, if any, are followed as a guide.
const REFERENCE_PAGES: &[&str] = &[
    "docs/configuration.md",
    "docs/workflows.md",
    "docs/rpc.md",
    "docs/operations.md",
];

/// Commands that are not run here, and why.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "tests/run.sh",
        "the test command itself: this check runs inside it",
    ),
    (
        "wf-host serve --config wf.toml --state postgres://wf:PASSWORD@db.internal:5432/wf",
        "needs a PostgreSQL server of the reader's; tests/workers.rs runs workers the same way on a throwaway one",
    ),
    (
        "wf-host replay RUN_ID --config wf.toml --component answer=plugins/c-answer.wasm",
        "RUN_ID is a run of the reader's; docs/changes.md (followed below) replays a run of its own the same way, and tests/workflow.rs replays runs of the answer node's builds",
    ),
    (
        "cargo install --locked --path host",
        "the install: these checks run the `wf-host` built for the tests",
    ),
];

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

/// Runs `script` in bash with the tests' `wf-host` first on PATH. Rust nodes
/// build into the guests' target directory (as in `plugins/build.sh`), so the
/// SDK's dependencies are compiled once.
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
        .env("CARGO_TARGET_DIR", guests_target_dir())
        // Where a guide's reader has their clone (for its committed nodes).
        .env("WF_HOST_CLONE", repo_root())
        .env_remove("WF_HOST_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("bash runs")
}

fn guests_target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
        .join("guests")
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
    let ran = commands_work_as_written("README.md");
    assert!(ran >= 6, "only {ran} README commands ran");
}

#[test]
fn reference_pages_commands_work_as_written() {
    let mut ran = 0;
    for page in REFERENCE_PAGES {
        ran += commands_work_as_written(page);
        let markdown = std::fs::read_to_string(repo_root().join(page)).unwrap();
        if blocks(&markdown).iter().any(|b| guide_step(b).is_some()) {
            follow_guide(page);
        }
    }
    assert!(ran >= 3, "only {ran} commands of the reference pages ran");
}

/// Runs the unmarked ```` ```sh ```` blocks of `file` (the README or a
/// reference page) from the repository root, checks what they print, and
/// returns how many commands ran.
fn commands_work_as_written(file: &str) -> usize {
    let root = repo_root();
    let markdown = std::fs::read_to_string(root.join(file)).unwrap();
    let all = blocks(&markdown);
    let cache = tempfile::tempdir().unwrap();
    let mut ran = 0;
    for (index, block) in all.iter().enumerate() {
        // Marked blocks are a guide, followed in an empty folder instead.
        if block.lang != "sh" {
            continue;
        }
        let commands = commands(&block.text);
        let said = said_to_print(&all, index);
        for (n, (command, prints)) in commands.iter().enumerate() {
            let what = format!("{file}:{}: `{command}`", block.line);
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
    // Nothing the commands did was left in the repository.
    assert!(
        !root.join("examples/.wf-host").exists(),
        "{file}: a command left examples/.wf-host behind"
    );
    ran
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

/// Whether a block is marked to run as a guide, in an empty folder:
/// ```` ```sh run ```` for commands, ```` ```<lang> file=PATH ```` for a file
/// the guide has you write.
fn guide_step(block: &Block) -> Option<GuideStep<'_>> {
    let mut words = block.lang.split_whitespace();
    let _lang = words.next()?;
    let mark = words.next()?;
    if mark == "run" {
        Some(GuideStep::Run)
    } else {
        mark.strip_prefix("file=").map(GuideStep::File)
    }
}

enum GuideStep<'a> {
    Run,
    File(&'a str),
}

/// Follows the marked blocks of `file` top to bottom in one shell session in an
/// empty folder, with `wf-host` on PATH, and checks every `# prints`.
fn follow_guide(file: &str) {
    let root = repo_root();
    let markdown = std::fs::read_to_string(root.join(file)).unwrap();
    let all = blocks(&markdown);
    let work = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut script = String::new();
    let mut checks = Vec::new();
    for block in &all {
        match guide_step(block) {
            Some(GuideStep::Run) => {
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
            Some(GuideStep::File(path)) => {
                script.push_str(&format!(
                    "mkdir -p \"$(dirname '{path}')\"\ncat > '{path}' <<'WF_EOF'\n{}WF_EOF\n",
                    block.text
                ));
            }
            None => {}
        }
    }
    assert!(
        !checks.is_empty(),
        "{file} has no `sh run` block with `# prints`"
    );
    let started = std::time::Instant::now();
    let out = shell(&script, work.path(), cache.path());
    eprintln!(
        "{file}: followed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{file}, followed in an empty folder, failed ({}):\n{stdout}\n{}",
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
        assert_prints(file, got, expected);
    }
}

#[test]
fn the_triggers_guide_works_as_written() {
    follow_guide("docs/triggers.md");
}

#[test]
fn the_durable_nodes_guide_works_as_written() {
    follow_guide("docs/durable.md");
}

/// The durable guide's node is the one `wf-host new --durable` writes.
#[test]
fn the_durable_nodes_guide_shows_the_template_as_written() {
    let root = repo_root();
    let guide = std::fs::read_to_string(root.join("docs/durable.md")).unwrap();
    let shown = guide
        .split("```rust file=src/lib.rs\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/durable.md shows src/lib.rs");
    let template =
        std::fs::read_to_string(root.join("host/templates/rust/src/durable.rs")).unwrap();
    assert_eq!(shown, template);
}

#[test]
fn the_changes_guide_works_as_written() {
    follow_guide("docs/changes.md");
}

#[test]
fn the_readme_node_guide_works_as_written() {
    follow_guide("README.md");
}

#[test]
fn the_rust_guide_works_as_written() {
    follow_guide("docs/rust.md");
}

#[test]
fn the_python_guide_works_as_written() {
    follow_guide("docs/python.md");
}

#[test]
fn the_javascript_guide_works_as_written() {
    follow_guide("docs/javascript.md");
}

#[test]
fn the_c_guide_works_as_written() {
    follow_guide("docs/c.md");
}

/// Every relative link of the README and `docs/*.md` (outside code blocks)
/// leads to a file or folder of the repository, and a `#anchor` to a heading
/// of the page it names.
#[test]
fn links_in_the_docs_lead_somewhere() {
    let root = repo_root();
    let mut pages = vec![std::path::PathBuf::from("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| path.strip_prefix(&root).unwrap().to_owned())
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut broken = Vec::new();
    for page in &pages {
        let markdown = std::fs::read_to_string(root.join(page)).unwrap();
        let dir = root.join(page).parent().unwrap().to_owned();
        let mut fenced = false;
        for (n, line) in markdown.lines().enumerate() {
            if line.starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if fenced {
                continue;
            }
            for target in link_targets(line) {
                let (path, anchor) = match target.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (target, None),
                };
                let file = if path.is_empty() {
                    root.join(page)
                } else {
                    dir.join(path)
                };
                let at = format!("{}:{}: `{target}`", page.display(), n + 1);
                if !file.exists() {
                    broken.push(format!("{at}: no such file"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&text).iter().any(|a| a == anchor) {
                    broken.push(format!("{at}: no heading with that anchor"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The targets of a line's `[text](target)` links that are not URLs.
fn link_targets(line: &str) -> Vec<&str> {
    line.match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &line[i + 2..];
            let target = &rest[..rest.find(')')?];
            (!target.is_empty() && !target.contains(char::is_whitespace)).then_some(target)
        })
        .filter(|target| {
            !target.split_once(':').is_some_and(|(scheme, _)| {
                !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_lowercase())
            })
        })
        .collect()
}

/// The anchors GitHub gives a page's headings (outside code blocks): the
/// heading lower-cased, without punctuation but `-` and `_`, spaces made `-`;
/// a repeated one gets `-1`, `-2`, and so on.
fn anchors(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashMap::<String, usize>::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let hashes = line.len() - line.trim_start_matches('#').len();
        if fenced || !(1..=6).contains(&hashes) {
            continue;
        }
        let Some(heading) = line[hashes..].strip_prefix(' ') else {
            continue;
        };
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        out.push(if *count == 0 {
            slug
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    out
}
