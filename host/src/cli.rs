//! Command-line parsing and the subcommands. Every error is printed once, here,
//! as `error: …` with a `Caused by:` chain.
//!
//! Exit codes: 0 success; 1 the run failed (the node returned an error, trapped,
//! or hit a limit); 2 usage, config or load errors.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use bytesize::ByteSize;
use clap::{Args, Parser, Subcommand};
use opentelemetry_sdk::trace::SdkTracerProvider;
use wf_host::capability::{CapabilityBackend, NoBackend};
use wf_host::config::Config;
use wf_host::domain::RunStatus;
use wf_host::grants::Grants;
use wf_host::host::{Host, HostOptions};
use wf_host::pool::pin::{self, Pins};
use wf_host::pool::{Pool, PoolConfig};
use wf_host::reload::{ReloadError, ReloadReport, Reloader, RpcGrants, RpcTokens, Stamps};
use wf_host::rpc::{Access, RpcState};
use wf_host::runtime::{Limits, RunOptions, Runtime, RuntimeConfig, default_cache_dir};
use wf_host::testing::{Case, CaseOptions, run_case};
use wf_host::tokens::Tokens;
use wf_host::workflow;

mod auth;
mod conformance;
mod scaffold;

const EXIT_RUN_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;

#[derive(Parser)]
#[command(
    name = "wf-host",
    version,
    about = "Runs workflow nodes written as WebAssembly components and gives them MCP capabilities",
    after_help = "Exit codes: 0 success; 1 the run failed; 2 usage, config or load error.\nLogs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug) for more."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node once and print its output JSON.
    #[command(after_help = "Examples:
  wf-host run plugins/echo.wasm --input '{\"hello\": \"world\"}'
  echo '[1, 2, 3]' | wf-host run plugins/echo.wasm
  wf-host run plugins/echo.wasm --input-file input.json --timeout 5s --max-memory 64MiB
  wf-host run plugins/call.wasm --config examples/fixture.toml --allow 'fixture.*' \\
      --input '{\"capability\": \"fixture.echo\", \"arguments\": {\"text\": \"hi\"}}'

Without --input or --input-file the input is read from stdin when it is piped,
and is JSON `null` otherwise.")]
    Run(RunArgs),
    /// Serve JSON-RPC 2.0 over HTTP: start and follow workflows, call capabilities.
    #[command(after_help = "Examples:
  wf-host serve --config examples/fixture.toml
  curl -s localhost:7878/rpc -H 'Content-Type: application/json' -d '{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"workflow.start\",\"params\":{\"workflow\":\"echo\",\"input\":[1],\"wait\":true}}'
  WF_HOST_TOKEN=$(openssl rand -hex 32) wf-host serve --listen 0.0.0.0:7878 --config wf.toml

Only workflows named in the config can be started. Binding to a non-loopback
address requires a bearer token. Requests must be `Content-Type: application/json`;
a request with an `Origin` other than the server's own (or an --allow-origin) is
refused, and on loopback so is a `Host` that is not a loopback name.
SIGINT/SIGTERM stop accepting, end open waits, let runs finish for the grace
period, then cancel them and close every MCP session.")]
    Serve(ServeArgs),
    /// Precompile a component into the cache so its first run starts fast.
    #[command(after_help = "Example:\n  wf-host compile plugins/echo.wasm")]
    Compile(CompileArgs),
    /// Test a component against the fixture MCP server with case files.
    #[command(after_help = "Examples:
  wf-host test plugins/call.wasm --case plugins/call/cases/echo.toml
  wf-host test plugins/call.wasm --case plugins/call/cases/*.toml

A case file (TOML or JSON) gives the input, the grants (`allow`), optional canned
tool results (`[canned.<tool>]`) and what to expect (`[expect]`: `output`,
`output_includes` or `error`, and optionally `calls`); a durable node's waits are answered
by `[signals]` and `[workflows.<name>]`. See docs/operations.md, \"Testing a component\".

Exit codes: 0 every case passed; 1 a case failed (a diff is printed); 2 usage,
case file or load errors.")]
    Test(TestArgs),
    /// Replay a stored run's steps with new components, answering their
    /// capability calls from the run's journal.
    #[command(after_help = "Example:
  wf-host replay run-01a2… --config wf.toml --component fetch=target/fetch-v2.wasm

Each named step runs with the new component on the input it had in the run;
each capability call is answered from the run's journal (in order, matched on
name and arguments) and nothing reaches an MCP server. Per step it reports the
same calls and output, the first call that differs (with an argument diff), or
the output that differs.

Exit codes: 0 no step diverged; 1 a step diverged; 2 usage, state or load errors.")]
    Replay(ReplayArgs),
    /// Serve the config's exposed workflows as MCP tools over stdio.
    #[command(after_help = "Example (an MCP client's server entry):
  {\"command\": \"wf-host\", \"args\": [\"mcp\", \"--config\", \"/path/to/wf.toml\"]}

Only workflows with `expose = true` are listed. Each tool call runs the
workflow to the end and returns its output. Logs go to stderr; stdout carries
the protocol. `wf-host serve` offers the same server over HTTP at `/mcp`.")]
    Mcp(McpArgs),
    /// Pin every tool definition of the config's connections in `wf.lock`.
    #[command(after_help = "Example:
  wf-host pin --config examples/fixture.toml

Connects to every connection of the config and writes `wf.lock` beside it: a
digest of each tool's name, title, description, schemas and annotations. While
the lock exists, a tool whose definition differs from it, or that is not in it,
is refused (`denied`) before anything is sent. Review the changes to the lock
like code, and re-run this command to accept them.")]
    Pin(PinArgs),
    /// Serve the fixture MCP server (for tests): stdio by default.
    #[command(after_help = "Examples:
  wf-host fixture-server
  wf-host fixture-server --http 127.0.0.1:8931")]
    FixtureServer(FixtureArgs),
    /// Start a node project: rust, python, js or c.
    New(scaffold::NewArgs),
    /// Build the node project in DIR by its language into DIR/<folder name>.wasm.
    Build(scaffold::BuildArgs),
    /// Write the WIT package that nodes are built against.
    Wit(scaffold::WitArgs),
    /// OAuth sign-in for HTTP connections with `kind = "authorization-code"`.
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Named bearer tokens for `wf-host serve` (`[[rpc.tokens]]`).
    #[command(subcommand)]
    Token(TokenCommand),
    /// The client the MCP conformance suite drives for its scenarios that
    /// are not about sign-in (those are played with `auth login` and `run`):
    /// the suite appends the server URL.
    #[command(hide = true)]
    ConformanceClient { url: String },
}

#[derive(Subcommand)]
enum AuthCommand {
    /// Sign in once: prints the authorization URL alone on the first line of
    /// stdout, waits for the redirect on 127.0.0.1, stores the tokens.
    Login {
        /// The connection id.
        connection: String,
        /// Configuration file (TOML).
        #[arg(long, value_name = "FILE", default_value = "wf.toml")]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Make a fresh token: prints it once (stdout's first line), then the
    /// `[[rpc.tokens]]` entry to paste into the config, which holds only its
    /// hash.
    #[command(after_help = "Example:
  wf-host token new ci

Give the token to the caller (it is not stored anywhere) and paste the entry
into the config, then fill in its scopes. See docs/rpc.md, \"Tokens and scopes\".")]
    New {
        /// The token's name: recorded with the runs it starts.
        name: String,
    },
}

#[derive(Args)]
struct CommonArgs {
    /// Configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Directory for the precompile cache [default: ~/.cache/wf-host].
    #[arg(long, value_name = "DIR", env = "WF_HOST_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Do not read or write the precompile cache.
    #[arg(long)]
    no_cache: bool,
}

#[derive(Args)]
struct TraceArgs {
    /// Export OpenTelemetry traces to this OTLP/HTTP collector, e.g.
    /// `http://localhost:4318` (`/v1/traces` is appended). The standard
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` and `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
    /// work too; `OTEL_SDK_DISABLED=true` turns tracing off.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
}

#[derive(Args)]
struct RunArgs {
    /// The component (.wasm) to run.
    #[arg(required_unless_present = "workflow", conflicts_with = "workflow")]
    component: Option<PathBuf>,
    /// Run the whole workflow NAME of the config instead of one component.
    #[arg(long, value_name = "NAME", requires = "config")]
    workflow: Option<String>,
    /// With --workflow: keep the run in this SQLite file or `postgres://` database
    /// [default: in memory].
    #[arg(long, value_name = "PATH|URL", requires = "workflow")]
    state: Option<String>,
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    trace: TraceArgs,
    /// Input JSON.
    #[arg(long, value_name = "JSON", conflicts_with = "input_file")]
    input: Option<String>,
    /// Read input JSON from FILE, or from stdin with `-`.
    #[arg(long, value_name = "FILE|-")]
    input_file: Option<PathBuf>,
    /// Wall-clock limit for the run, e.g. `500ms`, `30s` [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
    /// Linear-memory limit, e.g. `64MiB` [default: 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_memory: Option<ByteSize>,
    /// Grant a capability: a glob over `<connection>.<name>`, e.g. `fixture.*`.
    /// Repeatable. Nothing is granted by default; grants of config workflows
    /// using this component apply too.
    #[arg(long = "allow", value_name = "PATTERN")]
    allow: Vec<String>,
}

#[derive(Args)]
struct CompileArgs {
    /// The component (.wasm) to precompile.
    component: PathBuf,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    trace: TraceArgs,
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7878")]
    listen: std::net::SocketAddr,
    /// Bearer token required on every request; needed for non-loopback addresses.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "WF_HOST_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// How long running workflows may take to finish on shutdown before they are cancelled.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// Largest request body, e.g. `1MiB`.
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = parse_size)]
    max_body: ByteSize,
    /// How many finished runs to keep; the oldest are pruned past it
    /// [default: `[runtime] keep_runs`, else 10000].
    #[arg(long, value_name = "N")]
    max_runs: Option<u64>,
    /// Where runs are kept: a SQLite file, `:memory:` to keep nothing, or a
    /// `postgres://` URL shared by several workers
    /// [default: `[runtime] state`, else `.wf-host/state.db` beside the config].
    #[arg(
        long,
        value_name = "PATH|URL",
        env = "WF_HOST_STATE",
        hide_env_values = true
    )]
    state: Option<String>,
    /// Also accept requests from this browser origin, e.g. `http://localhost:3000`.
    /// Repeatable. Requests from other origins than the server's own are refused.
    #[arg(long = "allow-origin", value_name = "ORIGIN", value_parser = parse_origin)]
    allow_origin: Vec<String>,
    /// Reload the config when it, or a component it names, changes (as
    /// SIGHUP and `host.reload` do). Needs `--config`.
    #[arg(long)]
    watch: bool,
}

#[derive(Args)]
struct TestArgs {
    /// The component (.wasm) under test.
    component: PathBuf,
    /// Case files: `--case a.toml b.toml` or `--case a.toml --case b.toml`.
    #[arg(long = "case", value_name = "FILE", required = true, num_args = 1..)]
    cases: Vec<PathBuf>,
    /// Run the cases against the config's real connections and record what
    /// each call answered in a cassette beside each case
    /// (`<case>.cassette.jsonl`); later runs answer from it, with no server.
    #[arg(long, requires = "config")]
    record: bool,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Args)]
struct ReplayArgs {
    /// The run to replay.
    run_id: String,
    /// A step and its new component: `STEP=PATH`, or `PATH` alone for a
    /// workflow with one step that runs a component. Repeatable.
    #[arg(long = "component", value_name = "STEP=PATH", required = true, value_parser = parse_step_component)]
    components: Vec<(String, PathBuf)>,
    /// Where the run is kept: a SQLite file or a `postgres://` URL
    /// [default: `[runtime] state`, else `.wf-host/state.db` beside the config].
    #[arg(
        long,
        value_name = "PATH|URL",
        env = "WF_HOST_STATE",
        hide_env_values = true
    )]
    state: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    common: CommonArgs,
}

/// `STEP=PATH`, or `PATH` (the step left empty: the only one).
fn parse_step_component(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((step, path)) if !step.is_empty() && !path.is_empty() => {
            Ok((step.to_owned(), PathBuf::from(path)))
        }
        None if !text.is_empty() => Ok((String::new(), PathBuf::from(text))),
        _ => Err(format!("`{text}` is not STEP=PATH (or PATH)")),
    }
}

#[derive(Args)]
struct McpArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    trace: TraceArgs,
    /// Where runs are kept: a SQLite file, `:memory:`, or a `postgres://` URL
    /// [default: `[runtime] state`, else `.wf-host/state.db` beside the config].
    #[arg(
        long,
        value_name = "PATH|URL",
        env = "WF_HOST_STATE",
        hide_env_values = true
    )]
    state: Option<String>,
}

#[derive(Args)]
struct PinArgs {
    /// Configuration file (TOML).
    #[arg(long, value_name = "FILE", default_value = "wf.toml")]
    config: PathBuf,
}

#[derive(Args)]
struct FixtureArgs {
    /// Serve streamable HTTP at ADDR (path `/mcp`) instead of stdio.
    #[arg(long, value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
    /// JSON file of canned tool results: `{"tool": <CallToolResult>}`.
    #[arg(long, value_name = "FILE")]
    canned: Option<PathBuf>,
}

fn parse_origin(s: &str) -> Result<String, String> {
    wf_host::rpc::normalize_origin(s).map_err(|e| e.to_string())
}

fn parse_size(s: &str) -> Result<ByteSize, String> {
    s.parse::<ByteSize>()
        .map_err(|e| format!("`{s}` is not a size like `64MiB`: {e}"))
}

/// An error with the exit code it maps to.
struct Failure {
    code: u8,
    error: anyhow::Error,
}

fn usage(error: impl Into<anyhow::Error>) -> Failure {
    Failure {
        code: EXIT_USAGE,
        error: error.into(),
    }
}

/// Parses the command line, runs the subcommand and prints any error once.
pub fn run() -> Result<(), ExitCode> {
    let cli = Cli::parse();
    // Traces are exported by the commands that run workflows and nodes.
    let otlp_endpoint = match &cli.command {
        Command::Run(RunArgs { trace, .. })
        | Command::Serve(ServeArgs { trace, .. })
        | Command::Mcp(McpArgs { trace, .. }) => {
            wf_host::trace::endpoint(trace.otlp_endpoint.as_deref())
        }
        _ => None,
    };
    let tracer = match otlp_endpoint.as_deref().map(wf_host::trace::provider) {
        Some(Ok(provider)) => Some(provider),
        Some(Err(e)) => return Err(report(usage(e))),
        None => None,
    };
    // `wf-host test` reports node logs itself, with the failing case.
    init_tracing(
        match cli.command {
            Command::Test(_) | Command::Replay(_) => "warn",
            _ => wf_host::trace::DEFAULT_LOG_FILTER,
        },
        tracer.as_ref(),
    );
    let result = run_command(cli.command);
    if let Some(tracer) = tracer {
        // Sends the spans still batched; without it the last ones are lost.
        if let Err(e) = tracer.shutdown() {
            eprintln!("warning: not every trace span was exported: {e}");
        }
    }
    result.map_err(report)
}

/// Prints `failure` (with its `Caused by:` chain) and returns its exit code.
fn report(failure: Failure) -> ExitCode {
    eprintln!("error: {}", failure.error);
    let mut chain = failure.error.chain().skip(1).peekable();
    if chain.peek().is_some() {
        eprintln!("\nCaused by:");
        for cause in chain {
            eprintln!("    {cause}");
        }
    }
    ExitCode::from(failure.code)
}

fn run_command(command: Command) -> Result<(), Failure> {
    match command {
        Command::Run(args) => block_on(run_node(args)),
        Command::Compile(args) => compile(args),
        Command::Test(args) => block_on(test_component(args)),
        Command::Replay(args) => block_on(replay_run(args)),
        Command::Serve(args) => block_on(serve(args)),
        Command::Pin(args) => block_on(pin_tools(args)),
        Command::Mcp(args) => block_on(mcp_stdio(args)),
        Command::FixtureServer(args) => block_on(fixture_server(args)),
        Command::New(args) => scaffold::new(args),
        Command::Build(args) => scaffold::build(args),
        Command::Wit(args) => scaffold::wit(args),
        Command::Auth(AuthCommand::Login { connection, config }) => {
            block_on(auth::login(connection, config))
        }
        Command::Token(TokenCommand::New { name }) => new_token(&name),
        Command::ConformanceClient { url } => block_on(conformance::run(url)),
    }
}

/// `wf-host token new NAME`.
fn new_token(name: &str) -> Result<(), Failure> {
    let token = wf_host::tokens::new_token();
    let entry = wf_host::config::TokenConfig {
        name: name.to_owned(),
        hash: wf_host::tokens::hash_of(&token),
        ..Default::default()
    };
    // The name is checked as the config will check it.
    wf_host::tokens::Tokens::new(std::slice::from_ref(&entry)).map_err(|e| usage(anyhow!(e)))?;
    println!("{token}");
    println!();
    println!("# Give the token above to its caller; it is shown once and kept nowhere.");
    println!("# Paste this into the config, and list what the token may do:");
    println!("[[rpc.tokens]]");
    println!("name = {name:?}");
    println!("hash = {:?}", entry.hash);
    println!("start = []          # workflows it may start (globs)");
    println!("# read = [...]      # whose runs it may see (default: start)");
    println!("cancel = []         # whose runs it may cancel, retry, pause and resume");
    println!("signal = []         # whose runs it may signal and answer");
    println!("capabilities = []   # capability patterns it may call directly");
    println!("console = false     # host.status");
    println!("metrics = false     # /metrics");
    println!("reload = false      # host.reload");
    Ok(())
}

/// Logs to stderr, filtered by `RUST_LOG`; with `tracer`, also exports the
/// run, step and call spans (a layer with its own filter, so `RUST_LOG`
/// does not change what is exported).
fn init_tracing(default_filter: &str, tracer: Option<&SdkTracerProvider>) {
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let ansi = std::io::stderr().is_terminal();
    wf_host::trace::subscriber(filter, std::io::stderr, ansi, tracer).init();
}

fn block_on(fut: impl Future<Output = Result<(), Failure>>) -> Result<(), Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| usage(anyhow!(e).context("cannot start the async runtime")))?
        .block_on(fut)
}

fn load_config(path: Option<&Path>) -> Result<Config, Failure> {
    match path {
        Some(path) => Config::load(path).map_err(usage),
        None => Ok(Config::default()),
    }
}

/// The pool of `config`, with the tool pins of its `wf.lock` when it has one.
fn pool_config(config: &Config) -> Result<PoolConfig, Failure> {
    let pins = if config.connections.is_empty() {
        None
    } else {
        Pins::load(&pin::lock_path(&config.base_dir))
            .map_err(usage)?
            .map(Arc::new)
    };
    Ok(PoolConfig {
        connections: config.connections.clone(),
        base_dir: config.base_dir.clone(),
        pins,
        tokens: Some(config.tokens_path()),
        ..PoolConfig::default()
    })
}

fn runtime_config(config: &Config, common: &CommonArgs, limits: Limits) -> RuntimeConfig {
    let cache_enabled = !common.no_cache && config.runtime.cache != Some(false);
    let cache_dir = common
        .cache_dir
        .clone()
        .or_else(|| {
            config
                .runtime
                .cache_dir
                .as_deref()
                .map(|d| config.resolve(d))
        })
        .or_else(default_cache_dir);
    let defaults = RuntimeConfig::default();
    let bytes = |b: Option<ByteSize>, default: usize| {
        b.map_or(default, |b| {
            usize::try_from(b.as_u64()).unwrap_or(usize::MAX)
        })
    };
    RuntimeConfig {
        cache_dir: cache_dir.filter(|_| cache_enabled),
        limits,
        max_concurrent_runs: config
            .runtime
            .max_concurrent_runs
            .unwrap_or(defaults.max_concurrent_runs),
        max_input: bytes(config.runtime.max_input, defaults.max_input),
        max_output: bytes(config.runtime.max_output, defaults.max_output),
        reset: wf_host::runtime::SlotReset {
            pagemap_scan: config
                .runtime
                .pagemap_scan
                .unwrap_or(defaults.reset.pagemap_scan),
            keep_resident: config
                .runtime
                .keep_resident
                .map_or(defaults.reset.keep_resident, |b| b.as_u64()),
            ..defaults.reset
        },
        ..defaults
    }
}

async fn run_node(args: RunArgs) -> Result<(), Failure> {
    if let Some(name) = args.workflow.clone() {
        return run_workflow(args, &name).await;
    }
    let component = args.component.clone().expect("clap requires a component");
    let config = load_config(args.common.config.as_deref())?;
    let defaults = Limits::default();
    let limits = Limits {
        timeout: args
            .timeout
            .or(config.runtime.timeout)
            .unwrap_or(defaults.timeout),
        max_memory: args
            .max_memory
            .or(config.runtime.max_memory)
            .map_or(defaults.max_memory, |b| b.as_u64()),
    };
    let input = read_input(&args)?;
    let mut patterns = config.grants_for_component(&component);
    let granted_by_config = !patterns.is_empty();
    patterns.extend(args.allow.iter().cloned());
    let grants = Arc::new(Grants::new(&patterns).map_err(usage)?);
    let pool = match config.connections.is_empty() {
        true => None,
        false => Some(Pool::new(pool_config(&config)?)),
    };
    let backend: Arc<dyn CapabilityBackend> = match &pool {
        Some(pool) => Arc::new(pool.clone()),
        None => Arc::new(NoBackend),
    };
    let runtime =
        Runtime::new(runtime_config(&config, &args.common, limits), backend).map_err(usage)?;
    let node = runtime.load(&component).map_err(usage)?;
    let opts = RunOptions {
        grants,
        ..RunOptions::default()
    };
    let report = runtime.run(&node, &input, opts).await;
    if let Some(pool) = pool {
        // Close sessions and reap MCP server processes before exiting.
        pool.shutdown().await;
    }
    if let Err(wf_host::runtime::RunError::Node { code, .. }) = &report.result
        && code == "denied"
        && !granted_by_config
    {
        let config_given = args.common.config.is_some();
        eprintln!("{}", grants_hint(&config, &component, config_given));
    }
    match report.result {
        Ok(output) => {
            println!("{output}");
            Ok(())
        }
        Err(e @ wf_host::runtime::RunError::InvalidInput(_)) => Err(usage(e)),
        Err(e) => Err(Failure {
            code: EXIT_RUN_FAILED,
            error: anyhow!("`{}` failed: {e}", node.name()),
        }),
    }
}

/// Where a denied node's grants would come from: the config's workflows
/// that name the same file (by its path), or `--allow`.
fn grants_hint(config: &Config, component: &Path, config_given: bool) -> String {
    if !config_given {
        return "hint: a node reaches nothing unless granted: give `--allow PATTERN` (such as `--allow 'fixture.*'`), or `--config FILE` with a workflow whose `component` is this file and whose `allow` grants it".to_owned();
    }
    let name = component.file_name();
    let same_name = config.workflows.iter().find_map(|(workflow, w)| {
        let steps = w.steps.iter().flat_map(|s| s.nodes().map(|n| n.0));
        w.component
            .iter()
            .chain(steps)
            .find(|c| c.file_name() == name)
            .map(|c| {
                format!(
                    " (workflow `{workflow}` names `{}`, another file of the same name)",
                    c.display()
                )
            })
    });
    format!(
        "hint: `wf-host run` grants a node the `allow` of the config's workflows whose `component` is this same file, matched by its path; `{}` is none of them{}. Grant on the command line with `--allow PATTERN`, or name this path in the config",
        component.display(),
        same_name.unwrap_or_default()
    )
}

/// `wf-host mcp`: the exposed workflows as an MCP server on stdio, until the
/// client closes stdin or a signal arrives.
async fn mcp_stdio(args: McpArgs) -> Result<(), Failure> {
    use rmcp::ServiceExt;
    let config = load_config(args.common.config.as_deref())?;
    if !config.workflows.values().any(|w| w.expose) {
        eprintln!("warning: no workflow has `expose = true`; the MCP server lists no tools");
    }
    let mut rc = runtime_config(&config, &args.common, config_limits(&config));
    rc.memory_ceiling = memory_ceiling(&config);
    let pool = pool_config(&config)?;
    let mut options = workflow_options(&config);
    if let Some(state) = &args.state {
        options.state = state.clone();
    }
    let host = Host::open(
        &config,
        HostOptions {
            pool,
            runtime: rc,
            workflows: options,
        },
    )
    .await
    .map_err(usage)?;
    host.workflows().resume().await.map_err(usage)?;
    let server = wf_host::mcp::WorkflowServer::new(host.workflows().clone());
    let result = match server.serve(rmcp::transport::stdio()).await {
        Ok(running) => {
            tokio::select! {
                ended = running.waiting() => ended.map(|_| ()).map_err(|e| anyhow!(e)),
                () = shutdown_signal() => Ok(()),
            }
        }
        Err(e) => Err(anyhow!(e).context("MCP initialize failed")),
    };
    host.shutdown(Duration::from_secs(10)).await;
    result.map_err(|error| Failure {
        code: EXIT_RUN_FAILED,
        error,
    })
}

/// `wf-host pin`: lists every connection's tools, with no lock in force,
/// and writes their digests to `wf.lock`. Nothing is written unless every
/// connection answered.
async fn pin_tools(args: PinArgs) -> Result<(), Failure> {
    let config = Config::load(&args.config).map_err(usage)?;
    if config.connections.is_empty() {
        return Err(usage(anyhow!(
            "`{}` has no connections to pin",
            args.config.display()
        )));
    }
    let pool = Pool::new(PoolConfig {
        pins: None,
        ..pool_config(&config)?
    });
    let mut pins = Pins::new();
    let mut failed = None;
    let mut summary = Vec::new();
    for connection in pool.connections() {
        match pool.list_tools(&connection).await {
            Ok(tools) => {
                summary.push(format!("{connection}: {} tools", tools.len()));
                pins.pin(&connection, &tools);
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    pool.shutdown().await;
    if let Some(e) = failed {
        return Err(Failure {
            code: EXIT_RUN_FAILED,
            error: anyhow!(e).context("nothing was pinned"),
        });
    }
    let path = pin::lock_path(&config.base_dir);
    let previous = Pins::load(&path).ok().flatten();
    pins.save(&path).map_err(usage)?;
    let changed = previous.as_ref() != Some(&pins);
    println!(
        "{} {} ({})",
        if changed { "wrote" } else { "unchanged:" },
        path.display(),
        summary.join(", ")
    );
    Ok(())
}

/// `wf-host run --workflow NAME`: runs a whole workflow in this process and
/// prints its output.
async fn run_workflow(args: RunArgs, name: &str) -> Result<(), Failure> {
    let config = load_config(args.common.config.as_deref())?;
    let input: serde_json::Value =
        serde_json::from_str(&read_input(&args)?).expect("read_input checked the JSON");
    let pool = pool_config(&config)?;
    let limits = config_limits(&config);
    let mut rc = runtime_config(&config, &args.common, limits);
    rc.memory_ceiling = memory_ceiling(&config);
    let options = workflow::Options {
        state: args.state.clone().unwrap_or_else(|| ":memory:".into()),
        ..workflow_options(&config)
    };
    let host = Host::open(
        &config,
        HostOptions {
            pool,
            runtime: rc,
            workflows: options,
        },
    )
    .await
    .map_err(usage)?;
    let result = async {
        let workflows = host.workflows();
        if workflows.definition(name).is_none() {
            let unknown =
                wf_host::workflow::WorkflowError::unknown_workflow(name, workflows.names());
            return Err(usage(unknown));
        }
        let record = workflows
            .start(name, input, None)
            .await
            .map_err(|e| match e {
                e @ wf_host::workflow::WorkflowError::InvalidInput { .. } => usage(e),
                e => Failure {
                    code: EXIT_RUN_FAILED,
                    error: e.into(),
                },
            })?;
        let record = loop {
            let r = workflows
                .wait(&record.run_id, Duration::from_secs(3600))
                .await
                .map_err(|e| usage(anyhow!(e)))?;
            if r.status.is_finished() {
                break r;
            }
        };
        workflows.shutdown(Duration::ZERO).await;
        match (record.status, record.output) {
            (RunStatus::Succeeded, output) => {
                println!("{}", output.unwrap_or(serde_json::Value::Null));
                Ok(())
            }
            (status, _) => {
                let error = record.error.map_or_else(
                    || status.as_str().to_owned(),
                    |e| format!("{}: {}", e.code, e.message),
                );
                Err(Failure {
                    code: EXIT_RUN_FAILED,
                    error: anyhow!("workflow `{name}` {}: {error}", status.as_str()),
                })
            }
        }
    }
    .await;
    host.shutdown(Duration::ZERO).await;
    result
}

fn config_limits(config: &Config) -> Limits {
    let defaults = Limits::default();
    Limits {
        timeout: config.runtime.timeout.unwrap_or(defaults.timeout),
        max_memory: config
            .runtime
            .max_memory
            .map_or(defaults.max_memory, |b| b.as_u64()),
    }
}

/// The pool reserves memory slots for the largest limit any step asks for.
fn memory_ceiling(config: &Config) -> Option<u64> {
    config
        .workflows
        .values()
        .flat_map(|w| {
            w.max_memory
                .into_iter()
                .chain(w.steps.iter().flat_map(|s| s.nodes().filter_map(|n| n.2)))
        })
        .map(|m| m.as_u64())
        .max()
}

fn workflow_options(config: &Config) -> workflow::Options {
    let defaults = workflow::Options::default();
    workflow::Options {
        state: config.runtime.state.as_deref().map_or_else(
            || {
                config
                    .base_dir
                    .join(".wf-host")
                    .join("state.db")
                    .display()
                    .to_string()
            },
            |s| {
                if s == ":memory:" || workflow::is_postgres_url(s) {
                    s.to_owned()
                } else {
                    config.resolve(Path::new(s)).display().to_string()
                }
            },
        ),
        max_concurrent_steps: config
            .runtime
            .max_concurrent_steps
            .unwrap_or(defaults.max_concurrent_steps),
        max_live_runs: config
            .runtime
            .max_live_runs
            .unwrap_or(defaults.max_live_runs),
        keep_runs: config.runtime.keep_runs.unwrap_or(defaults.keep_runs),
        keep_for: config.runtime.keep_for.unwrap_or(defaults.keep_for),
        lease: config.runtime.lease.unwrap_or(defaults.lease),
    }
}

/// The input JSON text: from `--input`, `--input-file`, piped stdin, or `null`.
fn read_input(args: &RunArgs) -> Result<String, Failure> {
    let (text, source) = if let Some(text) = &args.input {
        (text.clone(), "--input".to_owned())
    } else if let Some(path) = &args.input_file {
        if path == Path::new("-") {
            (read_stdin()?, "stdin".to_owned())
        } else {
            let text = std::fs::read_to_string(path).map_err(|e| {
                usage(anyhow!(e).context(format!("cannot read input file `{}`", path.display())))
            })?;
            (text, format!("input file `{}`", path.display()))
        }
    } else if !std::io::stdin().is_terminal() {
        let text = read_stdin()?;
        if text.trim().is_empty() {
            ("null".to_owned(), "stdin".to_owned())
        } else {
            (text, "stdin".to_owned())
        }
    } else {
        ("null".to_owned(), "default".to_owned())
    };
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&text) {
        return Err(usage(anyhow!("{source} is not valid JSON: {e}")));
    }
    Ok(text)
}

fn read_stdin() -> Result<String, Failure> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("cannot read input from stdin")
        .map_err(usage)?;
    Ok(text)
}

fn compile(args: CompileArgs) -> Result<(), Failure> {
    let config = load_config(args.common.config.as_deref())?;
    let rc = runtime_config(&config, &args.common, Limits::default());
    if rc.cache_dir.is_none() {
        return Err(usage(anyhow!(
            "the precompile cache is disabled (--no-cache or `cache = false`); nothing to compile into"
        )));
    }
    let runtime = Runtime::new(rc, Arc::new(NoBackend)).map_err(usage)?;
    runtime.load(&args.component).map_err(usage)?;
    let stats = runtime.stats();
    let cache = runtime.cache().ok_or_else(|| {
        usage(anyhow!(
            "the precompile cache directory was refused (see the warning above); nothing to compile into"
        ))
    })?;
    let bytes = std::fs::read(&args.component).map_err(|e| usage(anyhow!(e)))?;
    let state = if stats.cache.hits > 0 {
        "already cached"
    } else {
        "compiled"
    };
    println!("{state}: {}", cache.entry_path(&bytes).display());
    Ok(())
}

async fn serve(args: ServeArgs) -> Result<(), Failure> {
    let access = Access {
        token: args.token.clone().filter(|t| !t.is_empty()),
        max_body: usize::try_from(args.max_body.as_u64()).unwrap_or(usize::MAX),
        allow_origins: args.allow_origin.clone(),
        // Rebinding needs a loopback listener; elsewhere a token is required.
        any_host: !args.listen.ip().is_loopback(),
    };
    // Taken before the files are read: a change while they are, counts.
    let seen = args.common.config.as_deref().map(Stamps::of_config);
    let config = load_config(args.common.config.as_deref())?;
    let tokens = Tokens::new(&config.rpc.tokens).map_err(|e| usage(anyhow!(e)))?;
    wf_host::rpc::check_access(args.listen, &access, !tokens.is_empty()).map_err(usage)?;
    let tokens_required = !args.listen.ip().is_loopback() && access.token.is_none();
    let rpc_tokens = RpcTokens::new(tokens);
    let seen = seen.map(|seen| seen.with_components(&config));
    let mut rc = runtime_config(&config, &args.common, config_limits(&config));
    rc.memory_ceiling = memory_ceiling(&config);
    let rpc_grants = RpcGrants::new(Grants::new(config.rpc_allow()).map_err(usage)?);
    if args.watch && args.common.config.is_none() {
        return Err(usage(anyhow!(
            "--watch needs --config: there is no config file to watch"
        )));
    }
    let pool = pool_config(&config)?;
    let mut options = workflow_options(&config);
    if args.common.config.is_none() {
        // No config, no workflows: nothing worth a state file.
        options.state = ":memory:".into();
    }
    if let Some(state) = &args.state {
        options.state = state.clone();
    }
    if let Some(n) = args.max_runs {
        options.keep_runs = n.max(1);
    }
    let host = Host::open(
        &config,
        HostOptions {
            pool,
            runtime: rc,
            workflows: options,
        },
    )
    .await
    .map_err(usage)?;
    let (workflows, pool) = (host.workflows(), host.pool());
    let resumed = workflows.resume().await.map_err(usage)?;
    if resumed > 0 {
        eprintln!("wf-host resumed {resumed} unfinished runs");
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|source| {
            usage(wf_host::rpc::ServeError::Bind {
                addr: args.listen,
                source,
            })
        })?;
    let local = listener.local_addr().map_err(|e| usage(anyhow!(e)))?;
    eprintln!("wf-host listening on http://{local}/rpc");
    eprintln!("console: http://{local}/");
    let (backend, location) = workflows.state_location();
    match location.as_str() {
        ":memory:" => {
            eprintln!("state: in memory (lost when wf-host stops; --state FILE keeps it)")
        }
        _ => eprintln!("state: {location} ({backend})"),
    }
    let reloader = args.common.config.clone().zip(seen).map(|(path, seen)| {
        Arc::new(Reloader::new(
            path,
            seen,
            workflows.clone(),
            pool.clone(),
            rpc_grants.clone(),
            rpc_tokens.clone(),
            config.runtime.clone(),
            tokens_required,
        ))
    });
    let app = wf_host::rpc::router(
        RpcState {
            workflows: workflows.clone(),
            pool: pool.clone(),
            grants: rpc_grants,
            tokens: rpc_tokens,
            config: reloader.clone(),
        },
        access,
    )
    .map_err(usage)?;
    // The server stops accepting when `stopping` fires; open requests finish
    // meanwhile, and waits end at once because the workflows shut down too.
    let stopping = tokio_util::sync::CancellationToken::new();
    if let Some(reloader) = &reloader {
        tokio::spawn(reload_on_sighup(reloader.clone(), stopping.clone()));
        if args.watch {
            tokio::spawn(
                reloader
                    .clone()
                    .watch(WATCH_EVERY, stopping.clone(), say_reload),
            );
        }
    }
    let served = wf_host::rpc::serve(listener, app, stopping.clone().cancelled_owned());
    tokio::pin!(served);
    let served = tokio::select! {
        // Only an I/O failure ends the server before a signal.
        result = &mut served => result,
        () = shutdown_signal() => {
            eprintln!("wf-host shutting down");
            stopping.cancel();
            // The grace period is for runs only, not for the HTTP requests
            // waiting on them. The workflows stop alongside the server, so
            // `host.shutdown` below finds them stopped.
            let ((), result) = tokio::join!(workflows.shutdown(args.grace), served);
            result
        }
    };
    host.shutdown(args.grace).await;
    served.map_err(|e| Failure {
        code: EXIT_RUN_FAILED,
        error: e.into(),
    })
}

async fn replay_run(args: ReplayArgs) -> Result<(), Failure> {
    let config = load_config(args.common.config.as_deref())?;
    let state = match &args.state {
        Some(state) => state.clone(),
        None if args.common.config.is_some() => workflow_options(&config).state,
        None => {
            return Err(usage(anyhow!(
                "say where the run is kept: --state PATH|URL, or --config FILE"
            )));
        }
    };
    if !workflow::is_postgres_url(&state) && !Path::new(&state).exists() {
        return Err(usage(anyhow!("there is no state file {state}")));
    }
    // Read beside a wf-host that may be serving from it.
    let store = wf_host::store::open_to_read(&state).await.map_err(usage)?;
    let rc = runtime_config(&config, &args.common, config_limits(&config));
    let components = args.components.into_iter().collect();
    let reports = wf_host::replay::replay(store, &args.run_id, &components, rc)
        .await
        .map_err(usage)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).unwrap_or_default()
        );
    } else {
        for report in &reports {
            println!("{}", report.render());
        }
    }
    let diverged = reports.iter().filter(|r| !r.same()).count();
    if diverged > 0 {
        return Err(Failure {
            code: EXIT_RUN_FAILED,
            error: anyhow!("{diverged} of {} replayed steps diverged", reports.len()),
        });
    }
    Ok(())
}

async fn test_component(args: TestArgs) -> Result<(), Failure> {
    let config = load_config(args.common.config.as_deref())?;
    let rc = runtime_config(&config, &args.common, Limits::default());
    let opts = CaseOptions {
        wf_host_exe: std::env::current_exe()
            .context("cannot find the wf-host executable to serve the fixture")
            .map_err(usage)?,
        cache_dir: rc.cache_dir,
        record: if args.record {
            Some(wf_host::testing::Recording::of(
                &config,
                pool_config(&config)?,
            ))
        } else {
            None
        },
    };
    let mut failed = 0;
    for path in &args.cases {
        let case = Case::load(path).map_err(usage)?;
        let report = run_case(&args.component, &case, &opts)
            .await
            .map_err(usage)?;
        if args.record {
            println!("recorded {}", case.cassette_path().display());
        }
        if report.passed() {
            println!("ok   {}", path.display());
        } else {
            failed += 1;
            println!(
                "FAIL {}
{}",
                path.display(),
                report.render()
            );
        }
    }
    let total = args.cases.len();
    println!("{} passed, {failed} failed", total - failed);
    if failed > 0 {
        return Err(Failure {
            code: EXIT_RUN_FAILED,
            error: anyhow!("{failed} of {total} cases failed"),
        });
    }
    Ok(())
}

async fn fixture_server(args: FixtureArgs) -> Result<(), Failure> {
    let opts = match &args.canned {
        Some(path) => wf_host::fixture::FixtureOptions::from_canned_file(path),
        None => Ok(wf_host::fixture::FixtureOptions::default()),
    }
    .and_then(|opts| opts.with_env())
    .map_err(usage)?;
    let served = match args.http {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))
                .map_err(usage)?;
            let local = listener.local_addr().map_err(|e| usage(anyhow!(e)))?;
            eprintln!("fixture MCP server listening on http://{local}/mcp");
            wf_host::fixture::serve_http(listener, opts, shutdown_signal()).await
        }
        None => wf_host::fixture::serve_stdio(opts).await,
    };
    served.map_err(|e| Failure {
        code: EXIT_RUN_FAILED,
        error: e.context("fixture server failed"),
    })
}

/// How often `--watch` looks at the config and its components.
const WATCH_EVERY: Duration = Duration::from_millis(500);

/// Says on stderr what a reload did.
/// (A refused reload is said once, by its warning.)
fn say_reload(reloaded: &Result<ReloadReport, ReloadError>) {
    if let Ok(r) = reloaded {
        eprintln!(
            "wf-host reloaded {}: workflows added {:?}, removed {:?}, changed {:?}{}",
            r.config.path.display(),
            r.workflows.added,
            r.workflows.removed,
            r.workflows.changed,
            match r.not_applied.is_empty() {
                true => String::new(),
                false => format!(
                    "; not applied until a restart: {}",
                    r.not_applied.join(", ")
                ),
            }
        );
    }
}

/// Reloads the config on each SIGHUP until `stopping`.
async fn reload_on_sighup(reloader: Arc<Reloader>, stopping: tokio_util::sync::CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        loop {
            tokio::select! {
                _ = hup.recv() => {}
                () = stopping.cancelled() => return,
            }
            say_reload(&reloader.reload("SIGHUP").await);
        }
    }
    #[cfg(not(unix))]
    {
        let _ = reloader;
        stopping.cancelled().await;
    }
}

/// Resolves on ctrl-c or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
