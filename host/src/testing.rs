//! Component tests: run a node against a real fixture MCP server and check its
//! output and the tool calls it made.
//!
//! A case file (TOML, or JSON of the same shape) says what to feed the node,
//! what it may reach, what the fixture answers, and what to expect:
//!
//! ```toml
//! input = { capability = "fixture.echo", arguments = { text = "hi" } }
//! allow = ["fixture.echo"]          # grants; deny by default
//!
//! [canned.echo]                     # optional: what the fixture's `echo` answers
//! content = [{ type = "text", text = "canned" }]
//!
//! [expect]
//! output_includes = { content = [{ text = "canned" }] }   # or `output` (exact),
//!                                                         # or `error = { code = "denied" }`
//! calls = [{ tool = "echo", arguments = { text = "hi" } }] # optional; `[]` means none
//! ```
//!
//! A durable node's waits are answered by the case: its sleeps are over at
//! once, `wait-signal` gets `signals.<name>` and `run-workflow` gets
//! `workflows.<name>` (`{ output = … }` or `{ error = { code, message } }`).
//!
//! `wf-host test <COMPONENT> --case <FILE>` runs cases from any language's test
//! runner; [`run_case`] is the same thing for Rust tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use assert_json_diff::CompareMode;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::capability::LogRecord;
use crate::config::ConnectionConfig;
use crate::grants::Grants;
use crate::pool::{Pool, PoolConfig};
use crate::runtime::{RunError, RunOptions, Runtime, RuntimeConfig};

/// Why a case could not be run at all (as opposed to failing).
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    #[error("cannot read case file `{path}`: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("case file `{path}` is invalid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error(transparent)]
    Load(#[from] crate::runtime::LoadError),
    #[error("case: {0}")]
    Setup(String),
}

/// One test case.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// The node's input (default `null`).
    #[serde(default)]
    pub input: Value,
    /// Grants for the run.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Canned tool results the fixture serves: tool name → `CallToolResult`.
    #[serde(default)]
    pub canned: BTreeMap<String, Value>,
    /// How calls are matched against the case's cassette, when it has one.
    #[serde(default)]
    pub cassette: CassetteOptions,
    /// What a durable node's `wait-signal` gets: signal name → payload. A
    /// wait for a signal not given here fails `timeout`.
    #[serde(default)]
    pub signals: BTreeMap<String, Value>,
    /// What a durable node's `run-workflow` gets: workflow name → `{output}`
    /// or `{error = {code, message}}`.
    #[serde(default)]
    pub workflows: BTreeMap<String, ChildAnswer>,
    pub expect: Expect,
    /// The case file ([`Case::load`]); its cassette is beside it.
    #[serde(skip)]
    pub path: PathBuf,
}

/// `[cassette]` of a case.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CassetteOptions {
    /// Argument fields left out of the match, as JSON pointers
    /// (`/request_id`): values that differ from run to run.
    #[serde(default)]
    pub ignore: Vec<String>,
    /// Calls of the cassette the node does not make are not a failure.
    #[serde(default)]
    pub allow_unused: bool,
}

/// What the case expects. Give exactly one of `output`, `output_includes`, `error`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The output, exactly.
    pub output: Option<Value>,
    /// A subset of the output: objects may have more keys than given here.
    pub output_includes: Option<Value>,
    /// The node fails with this error.
    pub error: Option<ExpectedError>,
    /// The tool calls that reached the fixture, in order.
    pub calls: Option<Vec<ExpectedCall>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedError {
    pub code: String,
    pub message_contains: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedCall {
    /// The tool name on the fixture, e.g. `echo`.
    pub tool: String,
    /// A subset of the arguments it was called with.
    pub arguments: Option<Value>,
}

impl Case {
    /// Reads a `.toml` or `.json` case file.
    ///
    /// # Errors
    /// [`CaseError::Read`] or [`CaseError::Parse`], naming the file.
    pub fn load(path: &Path) -> Result<Case, CaseError> {
        let text = std::fs::read_to_string(path).map_err(|source| CaseError::Read {
            path: path.to_owned(),
            source,
        })?;
        let parse_error = |message: String| CaseError::Parse {
            path: path.to_owned(),
            message,
        };
        let case: Case = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| parse_error(e.to_string()))?
        } else {
            toml::from_str(&text).map_err(|e| parse_error(e.to_string().trim_end().to_owned()))?
        };
        let given = [
            case.expect.output.is_some(),
            case.expect.output_includes.is_some(),
            case.expect.error.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(parse_error(
                "[expect] needs exactly one of `output`, `output_includes`, `error`".into(),
            ));
        }
        Grants::new(&case.allow).map_err(|e| parse_error(e.to_string()))?;
        for (workflow, answer) in &case.workflows {
            if answer.output.is_some() == answer.error.is_some() {
                return Err(parse_error(format!(
                    "[workflows.{workflow}] needs exactly one of `output`, `error`"
                )));
            }
        }
        for pointer in &case.cassette.ignore {
            if !pointer.starts_with('/') {
                return Err(parse_error(format!(
                    "[cassette] ignore: `{pointer}` is not a JSON pointer (such as `/request_id`)"
                )));
            }
        }
        Ok(Case {
            path: path.to_owned(),
            ..case
        })
    }

    /// The cassette of this case: `<case file stem>.cassette.jsonl` beside it.
    pub fn cassette_path(&self) -> PathBuf {
        let stem = self
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "case".to_owned());
        self.path.with_file_name(format!("{stem}.cassette.jsonl"))
    }
}

/// Where the fixture comes from and where compiled components are cached.
#[derive(Debug, Clone)]
pub struct CaseOptions {
    /// The `wf-host` executable that serves `fixture-server`.
    pub wf_host_exe: PathBuf,
    pub cache_dir: Option<PathBuf>,
    /// Record each case's calls against these real connections into its
    /// cassette (`wf-host test --record`), instead of the fixture.
    pub record: Option<Recording>,
}

/// The real connections a recording runs against, and the values never
/// written to a cassette.
#[derive(Debug, Clone)]
pub struct Recording {
    pub pool: PoolConfig,
    /// Connection secrets (header and environment values, OAuth client
    /// secrets): replaced by `[redacted]` wherever they appear.
    pub secrets: Vec<String>,
}

impl Recording {
    /// The connections of `config`, and their secrets.
    pub fn of(config: &crate::config::Config, pool: PoolConfig) -> Recording {
        let mut secrets: Vec<String> = config
            .connections
            .values()
            .flat_map(|c| {
                let auth = c.auth.as_ref();
                let client_secret = auth
                    .and_then(|a| a.client_secret.as_ref())
                    .map(|s| s.expose().to_owned())
                    .or_else(|| {
                        auth.and_then(|a| a.client_secret_env.as_ref())
                            .and_then(|name| std::env::var(name).ok())
                    });
                c.headers
                    .values()
                    .chain(c.env.values())
                    .map(|v| v.expose().to_owned())
                    .chain(client_secret)
            })
            .chain(crate::secrets::known())
            .filter(|v| v.len() >= 4)
            .collect();
        // Longest first, so a secret that contains another goes whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Recording { pool, secrets }
    }
}

/// What a case run found.
#[derive(Debug, Clone)]
pub struct CaseReport {
    /// Every mismatch, readable; empty when the case passed.
    pub failures: Vec<String>,
    /// The node's output, or its error as `{code, message}`.
    pub outcome: Result<Value, Value>,
    /// The tool calls the fixture received: `{tool, arguments}`.
    pub calls: Vec<Value>,
    pub stdout: String,
    pub stderr: String,
    pub logs: Vec<LogRecord>,
}

impl CaseReport {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The failures, then the guest's stdio and logs, for a person.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for failure in &self.failures {
            out.push_str(&indent(failure, "  "));
            out.push('\n');
        }
        let outcome = match &self.outcome {
            Ok(v) => format!("output: {v}"),
            Err(e) => format!("error: {e}"),
        };
        out.push_str(&format!("  node {outcome}\n"));
        for (name, text) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if !text.is_empty() {
                out.push_str(&format!("  --- guest {name} ---\n{}\n", indent(text, "  ")));
            }
        }
        if !self.logs.is_empty() {
            out.push_str("  --- node log ---\n");
            for log in &self.logs {
                out.push_str(&format!("  {:<5} {}\n", log.level, log.message));
            }
        }
        out
    }
}

fn indent(text: &str, prefix: &str) -> String {
    text.lines()
        .map(|l| format!("{prefix}{l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs `case` against the component at `component`, with a fresh fixture MCP
/// server as the connection `fixture`.
///
/// # Errors
/// A [`CaseError`] when the case cannot run at all (bad component, no fixture);
/// a run that does not match is a report with failures.
pub async fn run_case(
    component: &Path,
    case: &Case,
    opts: &CaseOptions,
) -> Result<CaseReport, CaseError> {
    if let Some(recording) = &opts.record {
        return record_case(component, case, opts, recording).await;
    }
    let cassette = case.cassette_path();
    if cassette.exists() {
        return replay_case(component, case, opts, &cassette).await;
    }
    let canned_file = if case.canned.is_empty() {
        None
    } else {
        let file = tempfile::NamedTempFile::new().map_err(|e| CaseError::Setup(e.to_string()))?;
        std::fs::write(
            file.path(),
            serde_json::to_vec(&case.canned).unwrap_or_default(),
        )
        .map_err(|e| CaseError::Setup(e.to_string()))?;
        Some(file)
    };
    let mut args = vec!["fixture-server".to_owned()];
    if let Some(file) = &canned_file {
        args.extend(["--canned".to_owned(), file.path().display().to_string()]);
    }
    let connection: ConnectionConfig = toml::from_str(&format!(
        "command = \"wf-host\"\nargs = {}",
        serde_json::to_string(&args).unwrap_or_default()
    ))
    .map_err(|e| CaseError::Setup(e.to_string()))?;
    let pool = Pool::new(PoolConfig {
        connections: BTreeMap::from([("fixture".to_owned(), connection)]),
        self_exe: Some(opts.wf_host_exe.clone()),
        ..PoolConfig::default()
    });
    let result = run_with_pool(component, case, opts, &pool).await;
    pool.shutdown().await;
    result
}

async fn run_with_pool(
    component: &Path,
    case: &Case,
    opts: &CaseOptions,
    pool: &Pool,
) -> Result<CaseReport, CaseError> {
    let (outcome, report) = run_node(component, case, opts, Arc::new(pool.clone())).await?;

    // The fixture's own record of what reached it; read outside the node's grants.
    let log = pool
        .call_tool("fixture", "call_log", Map::new(), None)
        .await
        .map_err(|e| CaseError::Setup(format!("cannot read the fixture's call log: {e}")))?;
    let calls: Vec<Value> = log["structuredContent"]["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|c| json!({"tool": c["tool"], "arguments": c["arguments"]}))
        .collect();

    Ok(CaseReport::checked(
        case,
        Vec::new(),
        outcome,
        calls,
        report,
    ))
}

impl CaseReport {
    /// The report of a run whose `outcome` and `calls` are checked against
    /// the case's expectations, after the `failures` found already.
    fn checked(
        case: &Case,
        mut failures: Vec<String>,
        outcome: Result<Value, Value>,
        calls: Vec<Value>,
        report: crate::runtime::RunReport,
    ) -> CaseReport {
        failures.extend(check(&case.expect, &outcome, &calls));
        CaseReport {
            failures,
            outcome,
            calls,
            stdout: report.stdout,
            stderr: report.stderr,
            logs: report.logs,
        }
    }
}

/// Runs the case's node once against `backend`: its outcome (output, or
/// error as `{code, message}`) and the run's report.
async fn run_node(
    component: &Path,
    case: &Case,
    opts: &CaseOptions,
    backend: Arc<dyn crate::capability::CapabilityBackend>,
) -> Result<(Result<Value, Value>, crate::runtime::RunReport), CaseError> {
    let runtime = Runtime::new(
        RuntimeConfig {
            cache_dir: opts.cache_dir.clone(),
            ..RuntimeConfig::default()
        },
        backend,
    )?;
    let node = runtime.load(component)?;
    let grants = Grants::new(&case.allow).map_err(|e| CaseError::Setup(e.to_string()))?;
    let report = runtime
        .run(
            &node,
            &case.input.to_string(),
            RunOptions {
                grants: Arc::new(grants),
                journal: Some(Arc::new(waits::CaseWaits {
                    signals: case.signals.clone(),
                    workflows: case.workflows.clone(),
                })),
                ..RunOptions::default()
            },
        )
        .await;

    let outcome = match &report.result {
        Ok(text) => Ok(serde_json::from_str(text).unwrap_or(Value::Null)),
        Err(RunError::Node { code, message }) => Err(json!({"code": code, "message": message})),
        Err(other) => Err(json!({"code": other.code(), "message": other.to_string()})),
    };
    Ok((outcome, report))
}

/// `--record`: runs the case against the real connections and writes what
/// each call answered to the case's cassette.
async fn record_case(
    component: &Path,
    case: &Case,
    opts: &CaseOptions,
    recording: &Recording,
) -> Result<CaseReport, CaseError> {
    let pool = Pool::new(recording.pool.clone());
    let recorder = Arc::new(cassette::Recorder::new(
        Arc::new(pool.clone()),
        recording.secrets.clone(),
    ));
    let ran = run_node(component, case, opts, recorder.clone()).await;
    pool.shutdown().await;
    let (outcome, report) = ran?;
    let entries = recorder.entries();
    let path = case.cassette_path();
    cassette::write(&path, &entries)
        .map_err(|e| CaseError::Setup(format!("cannot write {}: {e}", path.display())))?;
    let calls = cassette::tool_calls(&entries);
    Ok(CaseReport::checked(
        case,
        Vec::new(),
        outcome,
        calls,
        report,
    ))
}

/// A case with a cassette: its calls are answered from it, with no server.
async fn replay_case(
    component: &Path,
    case: &Case,
    opts: &CaseOptions,
    path: &Path,
) -> Result<CaseReport, CaseError> {
    let cassette = Arc::new(
        cassette::Cassette::load(path, &case.cassette)
            .map_err(|e| CaseError::Setup(format!("cassette {}: {e}", path.display())))?,
    );
    let (outcome, report) = run_node(component, case, opts, cassette.clone()).await?;
    let failures = cassette.failures(path);
    Ok(CaseReport::checked(
        case,
        failures,
        outcome,
        cassette.calls(),
        report,
    ))
}

mod cassette;
mod waits;

pub use waits::{ChildAnswer, ChildError};

fn check(expect: &Expect, outcome: &Result<Value, Value>, calls: &[Value]) -> Vec<String> {
    let mut failures = Vec::new();
    let diff = |actual: &Value, expected: &Value, mode: CompareMode| {
        crate::diff::json_diff(
            actual,
            expected,
            mode,
            [
                "actual",
                "expected",
                "missing from the output",
                "not expected",
            ],
        )
    };
    match (expect, outcome) {
        (
            Expect {
                output: Some(expected),
                ..
            },
            Ok(actual),
        ) => {
            if let Err(d) = diff(actual, expected, CompareMode::Strict) {
                failures.push(format!("output differs from `expect.output`:\n{d}"));
            }
        }
        (
            Expect {
                output_includes: Some(expected),
                ..
            },
            Ok(actual),
        ) => {
            if let Err(d) = diff(actual, expected, CompareMode::Inclusive) {
                failures.push(format!(
                    "output does not include `expect.output_includes`:\n{d}"
                ));
            }
        }
        (
            Expect {
                error: Some(expected),
                ..
            },
            Err(actual),
        ) => {
            if actual["code"] != expected.code.as_str() {
                failures.push(format!(
                    "expected error code `{}`, got `{}`: {}",
                    expected.code,
                    actual["code"].as_str().unwrap_or_default(),
                    actual["message"].as_str().unwrap_or_default()
                ));
            } else if let Some(part) = &expected.message_contains
                && !actual["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(part.as_str())
            {
                failures.push(format!(
                    "expected the error message to contain {part:?}, got {:?}",
                    actual["message"].as_str().unwrap_or_default()
                ));
            }
        }
        (
            Expect {
                error: Some(expected),
                ..
            },
            Ok(actual),
        ) => {
            failures.push(format!(
                "expected error `{}`, but the node succeeded with {actual}",
                expected.code
            ));
        }
        (_, Err(actual)) => failures.push(format!(
            "expected output, but the node failed with `{}`: {}",
            actual["code"].as_str().unwrap_or_default(),
            actual["message"].as_str().unwrap_or_default()
        )),
        _ => {}
    }
    if let Some(expected) = &expect.calls {
        let actual_tools: Vec<&str> = calls
            .iter()
            .map(|c| c["tool"].as_str().unwrap_or_default())
            .collect();
        let expected_tools: Vec<&str> = expected.iter().map(|c| c.tool.as_str()).collect();
        if actual_tools != expected_tools {
            failures.push(format!(
                "expected calls {expected_tools:?}, the fixture received {actual_tools:?}"
            ));
        } else {
            for (i, (want, got)) in expected.iter().zip(calls).enumerate() {
                if let Some(args) = &want.arguments
                    && let Err(d) = diff(&got["arguments"], args, CompareMode::Inclusive)
                {
                    failures.push(format!("call {i} (`{}`) arguments differ:\n{d}", want.tool));
                }
            }
        }
    }
    failures
}
