//! The TOML configuration file.
//!
//! ```toml
//! [runtime]
//! timeout = "30s"          # per run, wall clock
//! max_memory = "256 MiB"   # linear memory per run
//! cache_dir = ".wf-cache"  # precompile cache; relative paths are from this file
//! cache = true
//! max_concurrent_runs = 64 # more runs wait for a slot
//! max_output = "4 MiB"     # largest node output kept (`max_input`: largest input)
//!
//! [connections.fixture]    # an MCP server over stdio
//! command = "wf-host"      # `wf-host` means this very executable
//! args = ["fixture-server"]
//!
//! [connections.notes]      # an MCP server over streamable HTTP
//! url = "http://127.0.0.1:8080/mcp"
//! headers = { Authorization = "Bearer …" }
//! ca_file = "certs/ca.pem"  # extra trusted roots for `https://` (PEM); relative to this file
//! client_cert = "certs/client.pem"  # mTLS, with `client_key`
//! client_key = "certs/client.key"
//!
//! [connections.notes.auth]  # OAuth 2.1 (see `wf-host auth login`)
//! kind = "client-credentials"
//! client_id = "wf-host"
//! client_secret_env = "NOTES_SECRET"
//!
//! [workflows.call]          # a named component with its grants and limits
//! component = "plugins/call.wasm"
//! allow = ["fixture.*"]
//! timeout = "10s"
//!
//! [rpc]                     # what JSON-RPC clients may call (default: everything)
//! allow = ["fixture.echo"]
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::secrets::{ConfigValue, Secret};
use crate::tls::{self, TlsFiles};

/// Why the configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file `{path}` not found")]
    NotFound { path: PathBuf },
    #[error("cannot read config file `{path}`: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file `{path}` is invalid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config file `{path}`: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub runtime: RuntimeSection,
    /// MCP connections by id. Ids contain no `.`.
    #[serde(default)]
    pub connections: BTreeMap<String, ConnectionConfig>,
    /// Named workflows: a component, its grants and limits.
    #[serde(default)]
    pub workflows: BTreeMap<String, WorkflowConfig>,
    /// What JSON-RPC clients of `wf-host serve` may call.
    #[serde(default)]
    pub rpc: RpcSection,
    /// Directory of the config file; relative paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// `[runtime]`: limits and the precompile cache.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    pub max_memory: Option<ByteSize>,
    pub cache_dir: Option<PathBuf>,
    /// `false` disables the precompile cache.
    pub cache: Option<bool>,
    /// Where runs are kept: a SQLite file (relative to this file),
    /// `:memory:` to keep nothing, or a `postgres://` URL that several
    /// workers share. Default `.wf-host/state.db` beside the file.
    pub state: Option<String>,
    /// On a shared (PostgreSQL) state: how long a worker holds a run without
    /// renewing before another worker may take it over (default 30s).
    #[serde(default, with = "humantime_serde")]
    pub lease: Option<Duration>,
    /// How many workflow steps may run at once across all runs (default 64).
    pub max_concurrent_steps: Option<usize>,
    /// How many runs this process drives at once (those asleep, queued or
    /// paused in the state do not count); a start past it is refused as
    /// busy, with when to try again (default 4,000).
    pub max_live_runs: Option<usize>,
    /// How many finished runs to keep (default 10,000).
    pub keep_runs: Option<u64>,
    /// How long to keep finished runs (default 30 days).
    #[serde(default, with = "humantime_serde")]
    pub keep_for: Option<Duration>,
    /// Runs executing at once; more wait their turn (default 64).
    pub max_concurrent_runs: Option<usize>,
    /// The largest run input JSON accepted (default 4 MiB).
    pub max_input: Option<ByteSize>,
    /// The largest node output JSON kept (default 4 MiB).
    pub max_output: Option<ByteSize>,
    /// Reset memory between runs with Linux's `PAGEMAP_SCAN` where the
    /// kernel has it (default true).
    pub pagemap_scan: Option<bool>,
    /// Linear memory kept resident per pool slot when `pagemap_scan` is on
    /// (default 16 MiB).
    pub keep_resident: Option<ByteSize>,
    /// The OAuth token store (default `.wf-host/tokens.json` beside the file).
    pub tokens: Option<PathBuf>,
}

impl RuntimeSection {
    /// The keys whose values differ from `other`'s (a reload applies none
    /// of them: they take effect when the host starts).
    pub fn changed_keys(&self, other: &RuntimeSection) -> Vec<&'static str> {
        let mut keys = Vec::new();
        macro_rules! compare {
            ($($key:ident),*) => {
                $(if self.$key != other.$key {
                    keys.push(stringify!($key));
                })*
            };
        }
        compare!(
            timeout,
            max_memory,
            cache_dir,
            cache,
            state,
            lease,
            max_concurrent_steps,
            max_live_runs,
            keep_runs,
            keep_for,
            max_concurrent_runs,
            max_input,
            max_output,
            pagemap_scan,
            keep_resident,
            tokens
        );
        keys
    }
}

/// `[rpc]`: the grants of JSON-RPC clients.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RpcSection {
    /// Grants for `capability.*`, `resource.read` and `prompt.get`, as for a
    /// workflow. Absent: every capability of every configured connection.
    pub allow: Option<Vec<String>>,
    /// `[[rpc.tokens]]`: named bearer tokens with scopes.
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
}

/// `[[rpc.tokens]]`: one caller's token (as a hash) and what it may do.
/// Workflow scopes are globs over workflow names.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Recorded with the runs it starts; shown in refusals.
    pub name: String,
    /// `sha256:<hex>` of the token, as `wf-host token new` prints it.
    pub hash: String,
    /// Workflows it may start.
    #[serde(default)]
    pub start: Vec<String>,
    /// Workflows whose runs it may see (default: `start`).
    pub read: Option<Vec<String>>,
    /// Workflows whose runs it may cancel, retry, pause and resume.
    #[serde(default)]
    pub cancel: Vec<String>,
    /// Workflows whose runs it may signal and answer.
    #[serde(default)]
    pub signal: Vec<String>,
    /// Capability patterns it may call directly (`capability.call`,
    /// `resource.read`, `prompt.get`); `[rpc] allow` still applies.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// `host.status` (the console's view of the host).
    #[serde(default)]
    pub console: bool,
    /// `GET /metrics`.
    #[serde(default)]
    pub metrics: bool,
    /// `host.reload`.
    #[serde(default)]
    pub reload: bool,
}

/// `[workflows.<name>]`: either one component (the one-node form) or a graph
/// of `[[workflows.<name>.steps]]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowConfig {
    /// The one-node form: the component; relative paths are from the config file.
    pub component: Option<PathBuf>,
    /// One-node form: grants, globs over qualified capability names (`fixture.*`).
    /// Deny by default.
    #[serde(default)]
    pub allow: Vec<String>,
    /// One-node form: the node's time limit. With `steps`: the whole run's.
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// One-node form: the node's memory limit.
    pub max_memory: Option<ByteSize>,
    /// One-node form: retries of the node.
    pub retry: Option<RetryConfig>,
    /// JSON Schema the input must satisfy, checked at `workflow.start`.
    pub input_schema: Option<Value>,
    /// jq over `{input, steps}`: the run's output.
    pub output: Option<String>,
    #[serde(default)]
    pub steps: Vec<StepConfig>,
    /// Offer this workflow as a tool of wf-host's own MCP server (`/mcp`,
    /// `wf-host mcp`). Default false: nothing is published by accident.
    #[serde(default)]
    pub expose: bool,
    /// The tool's display name when exposed.
    pub title: Option<String>,
    /// The tool's description when exposed.
    pub description: Option<String>,
    /// JSON Schema of the run's output; an exposed workflow's `outputSchema`.
    pub output_schema: Option<Value>,
    /// `[[workflows.<name>.schedules]]`: cron schedules that start runs.
    #[serde(default)]
    pub schedules: Vec<ScheduleConfig>,
    /// `[workflows.<name>.webhook]`: `POST /hooks/<name>` starts a run.
    pub webhook: Option<WebhookConfig>,
    /// Fields (by name, at any depth) whose values are written as
    /// `"[redacted]"` in stored step inputs and journaled calls.
    #[serde(default)]
    pub redact: Vec<String>,
    /// `concurrency = { key, limit }`: at most `limit` runs with the same
    /// key (jq over the input; without it, one limit for the workflow) run
    /// at once; the rest wait `queued`.
    pub concurrency: Option<ConcurrencyConfig>,
    /// `rate = { key, limit, period }`: at most `limit` runs with the same
    /// key begin within any `period`; the rest wait `queued`.
    pub rate: Option<RateConfig>,
    /// jq over the input giving an integer (default 0): queued runs with a
    /// higher priority are admitted first.
    pub priority: Option<String>,
    /// `debounce = { key, period, max_wait }`: starts with the same key
    /// within `period` of each other make one run, with the last input.
    pub debounce: Option<DebounceConfig>,
}

/// `debounce = { … }` of a workflow.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebounceConfig {
    /// jq over the run's input: the key starts are collapsed by (without
    /// it, one key for the workflow).
    pub key: Option<String>,
    /// How long after the last start the run begins.
    #[serde(with = "humantime_serde")]
    pub period: Duration,
    /// The longest a run waits after the first start, however many come.
    #[serde(default, with = "humantime_serde")]
    pub max_wait: Option<Duration>,
}

/// `concurrency = { … }` of a workflow.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyConfig {
    /// jq over the run's input: the key runs are counted by.
    pub key: Option<String>,
    pub limit: u32,
}

/// `rate = { … }` of a workflow.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    /// jq over the run's input: the key runs are counted by.
    pub key: Option<String>,
    pub limit: u32,
    #[serde(with = "humantime_serde")]
    pub period: Duration,
}

/// `[[workflows.<name>.schedules]]`: starts a run at every tick of a cron
/// pattern.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// Names the schedule in `workflow.get`, the console and metrics
    /// (default `schedule`; needed when a workflow has several).
    pub name: Option<String>,
    /// 5 fields (minute hour day-of-month month day-of-week), or 6 with
    /// seconds first.
    pub cron: String,
    /// IANA time zone the pattern is read in (default `UTC`).
    pub timezone: Option<String>,
    /// jq over `{scheduled_at, schedule}`: the run's input (default
    /// `{scheduled_at, schedule}` itself).
    pub input: Option<String>,
    /// When a tick comes while this schedule's last run still runs:
    /// `skip` (default), `queue` (start it when that run ends) or `allow`.
    pub overlap: Option<String>,
    /// After downtime: `one` (default) fires the latest missed tick once;
    /// `none` fires none.
    pub catch_up: Option<String>,
}

/// `[workflows.<name>.webhook]`: how `POST /hooks/<name>` is verified and
/// what input it gives.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// `github`, `standard-webhooks` or `hmac-sha256`.
    pub signature: Option<String>,
    /// `none` turns verification off; it must be written out.
    pub verify: Option<String>,
    /// `hmac-sha256`: the header with the hex signature (default
    /// `x-signature`; a `sha256=` prefix is accepted).
    pub header: Option<String>,
    /// The environment variable holding the secret.
    pub secret_env: Option<String>,
    /// A file holding the secret (relative to this file).
    pub secret_file: Option<PathBuf>,
    /// `hmac-sha256` (and `verify = "none"`): a header whose value names the
    /// delivery, so a redelivery returns the first run (GitHub:
    /// `X-GitHub-Delivery`; Standard Webhooks: `webhook-id`).
    pub delivery_header: Option<String>,
    /// jq over `{body, headers, query}`: the run's input (default the body).
    pub input: Option<String>,
    /// Largest body accepted (default 1 MiB).
    pub max_input: Option<ByteSize>,
}

/// `[[workflows.<name>.steps]]`: one node in the graph, or a durable sleep
/// (`sleep` or `until`, with no component).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepConfig {
    pub id: String,
    /// The node; absent for a sleep step.
    #[serde(default)]
    pub component: PathBuf,
    /// A durable sleep of this long (`"2s"`, `"1h"`): no node runs.
    #[serde(default, with = "humantime_serde")]
    pub sleep: Option<Duration>,
    /// A durable sleep until the time this jq expression gives (RFC 3339),
    /// over `{input, steps}`.
    pub until: Option<String>,
    #[serde(default)]
    pub allow: Vec<String>,
    /// Steps that must finish first.
    #[serde(default)]
    pub needs: Vec<String>,
    /// A step that waits for the signal of this name (`workflow.signal`,
    /// the console's Approve and Reject, `/mcp`'s `signal` tool): no node
    /// runs; its output is the signal's payload.
    pub wait: Option<String>,
    /// JSON Schema the payload of a `wait` step's signal must satisfy.
    pub schema: Option<Value>,
    /// A step that runs this configured workflow as a child run (on its
    /// `input` mapping) and gives its output: no node runs.
    pub workflow: Option<String>,
    /// jq over `{input, steps}` (plus `item`, `index` under `for_each`).
    pub input: Option<String>,
    /// jq condition; false skips the step.
    #[serde(rename = "if")]
    pub condition: Option<String>,
    /// jq giving an array; the node runs once per item.
    pub for_each: Option<String>,
    /// Items of `for_each` run at once (default 1).
    pub concurrency: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    pub max_memory: Option<ByteSize>,
    pub retry: Option<RetryConfig>,
    /// What undoes this step when its run fails or is cancelled after it
    /// succeeded (saga compensation).
    pub compensate: Option<CompensateConfig>,
}

impl StepConfig {
    /// The nodes the step names: its own (when it runs one) and its
    /// compensation's, as `(component, allow, max_memory)`.
    pub fn nodes(&self) -> impl Iterator<Item = (&PathBuf, &Vec<String>, Option<ByteSize>)> {
        let own = (!self.component.as_os_str().is_empty()).then_some((
            &self.component,
            &self.allow,
            self.max_memory,
        ));
        let undo = self
            .compensate
            .as_ref()
            .map(|c| (&c.component, &c.allow, c.max_memory));
        own.into_iter().chain(undo)
    }
}

/// `compensate = { … }` of a step: a node that undoes what the step did.
/// Its `input` is jq over `{input, output, run: {input, error}}` (the
/// step's input and output); by default `{input, output}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompensateConfig {
    pub component: PathBuf,
    #[serde(default)]
    pub allow: Vec<String>,
    pub input: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    pub max_memory: Option<ByteSize>,
    pub retry: Option<RetryConfig>,
}

/// `retry = { … }` of a step.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts in all, the first included (default 3).
    pub max_attempts: Option<u32>,
    /// First delay (default 200ms).
    #[serde(default, with = "humantime_serde")]
    pub initial: Option<Duration>,
    /// Longest delay (default 10s).
    #[serde(default, with = "humantime_serde")]
    pub max: Option<Duration>,
    /// Growth per attempt (default 2.0).
    pub multiplier: Option<f64>,
    /// Error codes worth retrying (default `unavailable`, `timeout`).
    pub on: Option<Vec<String>>,
}

/// `[connections.<id>]`: how to reach one MCP server.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionConfig {
    /// stdio: the program to spawn. `wf-host` means this executable.
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// stdio: variables set for the child, on top of the inherited ones;
    /// a value may be a secret (`{ secret = "NAME" }`).
    #[serde(default)]
    pub env: BTreeMap<String, ConfigValue>,
    /// stdio: host variables passed to the child besides the default set
    /// (`HOME`, `LOGNAME`, `PATH`, `SHELL`, `TERM`, `USER`). Nothing else is.
    #[serde(default)]
    pub inherit_env: Vec<String>,
    pub cwd: Option<PathBuf>,
    /// Streamable HTTP: the endpoint URL.
    pub url: Option<String>,
    /// Streamable HTTP: headers sent with every request; a value may be a
    /// secret (`{ secret = "NAME", prefix = "Bearer " }`).
    #[serde(default)]
    pub headers: BTreeMap<String, ConfigValue>,
    /// HTTPS: extra trusted root certificates (PEM), besides the system's.
    pub ca_file: Option<PathBuf>,
    /// HTTPS: our certificate chain (PEM) for servers that require mTLS.
    pub client_cert: Option<PathBuf>,
    /// HTTPS: the private key (PEM) of `client_cert`.
    pub client_key: Option<PathBuf>,
    /// OAuth 2.1 for an HTTP connection.
    pub auth: Option<AuthConfig>,
    /// Per-operation timeout (default 30s).
    #[serde(default, with = "humantime_serde")]
    pub call_timeout: Option<Duration>,
    /// The longest a call may take however often its server reports
    /// progress, each report restarting `call_timeout` (default 1h).
    #[serde(default, with = "humantime_serde")]
    pub max_call_time: Option<Duration>,
    /// Close the session after this long without operations (default: never).
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// Ping the server this often to detect a dead transport (default 15s; HTTP only
    /// unless set).
    #[serde(default, with = "humantime_serde")]
    pub ping_interval: Option<Duration>,
    /// Re-list the catalog this often even without `list_changed` (default
    /// 5m): it catches changes a server announces where we cannot hear them.
    #[serde(default, with = "humantime_serde")]
    pub catalog_refresh: Option<Duration>,
    /// Requests at once on this connection; more wait their turn, in order.
    pub max_in_flight: Option<usize>,
    /// Requests per period, as a token bucket: `"20/s"`, `"600/min"`,
    /// `"1000/h"`. More wait their turn, in order.
    pub rate: Option<String>,
    /// How many requests `rate` lets through at once (default: its count).
    pub burst: Option<u32>,
    /// What a question the server asks during a call (elicitation) gets:
    /// `"ask"` (default: the run's step shows it and waits for an answer)
    /// or `"decline"`.
    pub elicitation: Option<String>,
    /// How long a question waits for its answer (default 10m); then it is
    /// declined.
    #[serde(default, with = "humantime_serde")]
    pub elicitation_timeout: Option<Duration>,
    /// The MCP revision to speak: `"2026-07-28"` or `"2025-11-25"` (the
    /// `initialize` handshake, for servers that ask mid-call). Default: the
    /// newest the server speaks.
    pub protocol: Option<String>,
}

/// The MCP revisions `protocol` may pin.
pub const PROTOCOLS: [&str; 2] = ["2026-07-28", "2025-11-25"];

/// A `rate` of a connection: `count` requests per `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub per: Duration,
}

impl Rate {
    /// `"20/s"`, `"600/min"`, `"1000/h"` (also `sec`, `second`, `m`,
    /// `minute`, `hour`).
    ///
    /// # Errors
    /// What is wrong with the text.
    pub fn parse(text: &str) -> Result<Rate, String> {
        let bad = || format!("`rate = \"{text}\"` is not like \"20/s\", \"600/min\" or \"1000/h\"");
        let (count, unit) = text.split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        if count == 0 {
            return Err(format!(
                "`rate = \"{text}\"` lets nothing through; at least 1"
            ));
        }
        if count > 1_000_000 {
            return Err(format!(
                "`rate = \"{text}\"` is more than a million per period; leave `rate` out for no limit"
            ));
        }
        let per = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        Ok(Rate { count, per })
    }
}

impl ConnectionConfig {
    /// The connection's TLS files, relative ones resolved against `base_dir`.
    pub fn tls_files(&self, base_dir: &Path) -> TlsFiles {
        let resolve = |p: &Option<PathBuf>| p.as_ref().map(|p| base_dir.join(p));
        TlsFiles {
            ca_file: resolve(&self.ca_file),
            client_cert: resolve(&self.client_cert),
            client_key: resolve(&self.client_key),
        }
    }
}

/// `[connections.<id>.auth]`: how the host gets OAuth access tokens.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub kind: AuthKind,
    /// A pre-registered client; without one, `wf-host auth login` registers
    /// dynamically (authorization code only).
    pub client_id: Option<String>,
    /// The client secret: inline, or by reference (`{ secret = "NAME" }`).
    pub client_secret: Option<ConfigValue>,
    /// The host variable holding the client secret.
    pub client_secret_env: Option<String>,
    /// Scopes to ask for besides those the server names (its
    /// `WWW-Authenticate` challenge, else its metadata's `scopes_supported`)
    /// and those a refused call asked for since.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// `wf-host auth login` with no `client_id`: the HTTPS URL of this
    /// client's metadata document (SEP-991), used as its client id where the
    /// authorization server supports that; else the client registers.
    pub client_metadata_url: Option<String>,
    /// How the client authenticates at the token endpoint.
    #[serde(default)]
    pub token_endpoint_auth: TokenEndpointAuth,
    /// `private_key_jwt`: the client's PKCS#8 PEM private key, by reference
    /// only (`{ secret_file = "client.pem" }` or `{ secret = "NAME" }`).
    pub private_key: Option<ConfigValue>,
}

/// The OAuth grant a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthKind {
    /// Unattended: the client's own credentials.
    ClientCredentials,
    /// A user signs in once with `wf-host auth login`; runs refresh.
    AuthorizationCode,
}

/// Client authentication at the token endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenEndpointAuth {
    /// HTTP Basic (the default).
    #[default]
    ClientSecretBasic,
    /// In the request body.
    ClientSecretPost,
    /// A JWT signed with `private_key` (RFC 7523); no secret is sent.
    PrivateKeyJwt,
}

impl TokenEndpointAuth {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenEndpointAuth::ClientSecretBasic => "client_secret_basic",
            TokenEndpointAuth::ClientSecretPost => "client_secret_post",
            TokenEndpointAuth::PrivateKeyJwt => "private_key_jwt",
        }
    }
}

impl Config {
    /// Reads and checks the file at `path`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file and the offending key.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => ConfigError::NotFound {
                path: path.to_owned(),
            },
            _ => ConfigError::Read {
                path: path.to_owned(),
                source,
            },
        })?;
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, path, base_dir)
    }

    /// Parses `text`; `path` is only used in messages.
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn parse(text: &str, path: &Path, base_dir: PathBuf) -> Result<Self, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        config.base_dir = base_dir;
        config
            .resolve_secrets()
            .map_err(|message| ConfigError::Invalid {
                path: path.to_owned(),
                message,
            })?;
        for (id, conn) in &config.connections {
            let invalid = |message: String| ConfigError::Invalid {
                path: path.to_owned(),
                message,
            };
            if id.is_empty() || id.contains('.') {
                return Err(invalid(format!(
                    "connection id `{id}` must be non-empty and contain no `.` (capabilities are named `<connection>.<name>`)"
                )));
            }
            match (&conn.command, &conn.url) {
                (Some(_), Some(_)) => {
                    return Err(invalid(format!(
                        "connection `{id}` sets both `command` (stdio) and `url` (HTTP); pick one"
                    )));
                }
                (None, None) => {
                    return Err(invalid(format!(
                        "connection `{id}` needs `command` (stdio) or `url` (streamable HTTP)"
                    )));
                }
                _ => {}
            }
            check_remote(id, conn, &config.base_dir).map_err(invalid)?;
            if let Some(mode) = conn.elicitation.as_deref()
                && !matches!(mode, "ask" | "decline")
            {
                return Err(invalid(format!(
                    "connection `{id}`: `elicitation` is \"ask\" or \"decline\", not {mode:?}"
                )));
            }
            if let Some(protocol) = conn.protocol.as_deref()
                && !PROTOCOLS.contains(&protocol)
            {
                return Err(invalid(format!(
                    "connection `{id}`: `protocol` is one of {}, not {protocol:?} (leave it out to speak the newest the server speaks)",
                    PROTOCOLS.map(|p| format!("\"{p}\"")).join(", ")
                )));
            }
            if conn.max_in_flight == Some(0) {
                return Err(invalid(format!(
                    "connection `{id}`: `max_in_flight` must be at least 1"
                )));
            }
            if let Some(rate) = &conn.rate {
                Rate::parse(rate).map_err(|e| invalid(format!("connection `{id}`: {e}")))?;
            }
            match (conn.burst, &conn.rate) {
                (Some(0), _) => {
                    return Err(invalid(format!(
                        "connection `{id}`: `burst` must be at least 1"
                    )));
                }
                (Some(_), None) => {
                    return Err(invalid(format!(
                        "connection `{id}`: `burst` is for `rate`; set `rate` too"
                    )));
                }
                _ => {}
            }
            for (key, duration) in [
                ("call_timeout", conn.call_timeout),
                ("max_call_time", conn.max_call_time),
                ("idle_timeout", conn.idle_timeout),
                ("ping_interval", conn.ping_interval),
                ("catalog_refresh", conn.catalog_refresh),
                ("elicitation_timeout", conn.elicitation_timeout),
            ] {
                if duration.is_some_and(|d| d.is_zero()) {
                    return Err(invalid(format!(
                        "connection `{id}`: `{key}` must be greater than zero"
                    )));
                }
            }
            // (Against the default `call_timeout` the pool takes the longer.)
            if let (Some(ceiling), Some(timeout)) = (conn.max_call_time, conn.call_timeout)
                && ceiling < timeout
            {
                return Err(invalid(format!(
                    "connection `{id}`: `max_call_time` ({}) is shorter than `call_timeout` ({})",
                    humantime::format_duration(ceiling),
                    humantime::format_duration(timeout)
                )));
            }
        }
        if config.runtime.max_concurrent_runs == Some(0) {
            return Err(ConfigError::Invalid {
                path: path.to_owned(),
                message: "`[runtime] max_concurrent_runs` must be at least 1".into(),
            });
        }
        if config.runtime.keep_runs == Some(0) {
            return Err(ConfigError::Invalid {
                path: path.to_owned(),
                message: "`runtime.keep_runs` must be at least 1".into(),
            });
        }
        if config.runtime.keep_for.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::Invalid {
                path: path.to_owned(),
                message: "`runtime.keep_for` must be greater than zero".into(),
            });
        }
        if config
            .runtime
            .lease
            .is_some_and(|d| d < Duration::from_millis(300))
        {
            return Err(ConfigError::Invalid {
                path: path.to_owned(),
                message: "`runtime.lease` must be at least 300ms: it is renewed every third of it"
                    .into(),
            });
        }
        if config.runtime.max_concurrent_steps == Some(0) {
            return Err(ConfigError::Invalid {
                path: path.to_owned(),
                message: "`runtime.max_concurrent_steps` must be at least 1".into(),
            });
        }
        if config.runtime.max_live_runs == Some(0) {
            return Err(ConfigError::Invalid {
                path: path.to_owned(),
                message: "`runtime.max_live_runs` must be at least 1".into(),
            });
        }
        for (name, workflow) in &config.workflows {
            if let Err(e) = crate::grants::Grants::new(&workflow.allow) {
                return Err(ConfigError::Invalid {
                    path: path.to_owned(),
                    message: format!("workflow `{name}`: {e}"),
                });
            }
            for step in &workflow.steps {
                if let Err(e) = crate::grants::Grants::new(&step.allow) {
                    return Err(ConfigError::Invalid {
                        path: path.to_owned(),
                        message: format!("workflow `{name}`, step `{}`: {e}", step.id),
                    });
                }
            }
        }
        if let Err(e) = crate::grants::Grants::new(config.rpc_allow()) {
            return Err(ConfigError::Invalid {
                path: path.to_owned(),
                message: format!("[rpc] allow: {e}"),
            });
        }
        Ok(config)
    }

    /// The grants of JSON-RPC clients: `[rpc] allow`, or `<connection>.*` for
    /// every connection when the key is absent.
    pub fn rpc_allow(&self) -> Vec<String> {
        match &self.rpc.allow {
            Some(allow) => allow.clone(),
            None => self
                .connections
                .keys()
                .map(|id| format!("{id}.*"))
                .collect(),
        }
    }

    /// Every component file the workflows name, resolved against the
    /// config's folder.
    pub fn component_files(&self) -> Vec<PathBuf> {
        self.workflows
            .values()
            .flat_map(|w| {
                w.component
                    .iter()
                    .chain(w.steps.iter().flat_map(|s| s.nodes().map(|n| n.0)))
            })
            .filter(|c| !c.as_os_str().is_empty())
            .map(|c| self.resolve(c))
            .collect()
    }

    /// The grants of every workflow whose component is `component` (compared
    /// after resolving both paths).
    pub fn grants_for_component(&self, component: &Path) -> Vec<String> {
        let target = std::fs::canonicalize(component).ok();
        self.workflows
            .values()
            .flat_map(|w| {
                let one = w.component.iter().map(|c| (c, &w.allow));
                let steps = w
                    .steps
                    .iter()
                    .flat_map(|s| s.nodes().map(|(c, allow, _)| (c, allow)));
                one.chain(steps)
            })
            .filter(|(component, _)| {
                let path = self.resolve(component);
                target.is_some() && std::fs::canonicalize(path).ok() == target
            })
            .flat_map(|(_, allow)| allow.iter().cloned())
            .collect()
    }

    /// Where OAuth tokens are kept: `[runtime] tokens`, by default
    /// `.wf-host/tokens.json` beside the file.
    pub fn tokens_path(&self) -> PathBuf {
        self.resolve(
            self.runtime
                .tokens
                .as_deref()
                .unwrap_or(Path::new(DEFAULT_TOKENS)),
        )
    }

    /// Resolves a path from the file against the file's directory.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_owned()
        } else {
            self.base_dir.join(path)
        }
    }
}

/// The token store, relative to the config file.
pub const DEFAULT_TOKENS: &str = ".wf-host/tokens.json";

impl Config {
    /// Reads every secret the connections name, so that a missing one fails
    /// the load (and a reload), and remembers each for redaction.
    fn resolve_secrets(&mut self) -> Result<(), String> {
        let base_dir = self.base_dir.clone();
        for (id, conn) in &mut self.connections {
            for (key, value) in &mut conn.env {
                value.resolve(&base_dir, &format!("connection `{id}`: `env.{key}`"))?;
            }
            for (key, value) in &mut conn.headers {
                value.resolve(&base_dir, &format!("connection `{id}`: `headers.{key}`"))?;
            }
            if let Some(secret) = conn.auth.as_mut().and_then(|a| a.client_secret.as_mut()) {
                secret.resolve(
                    &base_dir,
                    &format!("connection `{id}`: `auth.client_secret`"),
                )?;
                crate::secrets::remember(secret.expose());
            }
            if let Some(key) = conn.auth.as_mut().and_then(|a| a.private_key.as_mut()) {
                key.resolve(&base_dir, &format!("connection `{id}`: `auth.private_key`"))?;
                crate::secrets::remember(key.expose());
            }
        }
        Ok(())
    }
}

/// Checks the TLS and OAuth keys of one connection, reading the TLS files now so
/// that a missing or unparsable one fails at load, naming the connection and key.
fn check_remote(id: &str, conn: &ConnectionConfig, base_dir: &Path) -> Result<(), String> {
    let tls_keys = [
        ("ca_file", &conn.ca_file),
        ("client_cert", &conn.client_cert),
        ("client_key", &conn.client_key),
    ];
    if conn.url.is_none() {
        if let Some((key, _)) = tls_keys.iter().find(|(_, v)| v.is_some()) {
            return Err(format!(
                "connection `{id}`: `{key}` is only for HTTP connections (`url`)"
            ));
        }
        if conn.auth.is_some() {
            return Err(format!(
                "connection `{id}`: `auth` is only for HTTP connections (`url`)"
            ));
        }
        return Ok(());
    }
    let files = conn.tls_files(base_dir);
    tls::load_tls_files(&files).map_err(|e| format!("connection `{id}`: {e}"))?;
    if let Some(auth) = &conn.auth {
        if auth.client_secret.is_some() && auth.client_secret_env.is_some() {
            return Err(format!(
                "connection `{id}`: `auth` sets both `client_secret` and `client_secret_env`; pick one"
            ));
        }
        if let Some(document) = &auth.client_metadata_url {
            let valid = url_has_path(document, "https://");
            if !valid {
                return Err(format!(
                    "connection `{id}`: `auth.client_metadata_url` must be an https:// URL with a path (the client metadata document), not `{document}`"
                ));
            }
        }
        if auth.token_endpoint_auth == TokenEndpointAuth::PrivateKeyJwt {
            return check_private_key_jwt(id, auth);
        }
        if auth.private_key.is_some() {
            return Err(format!(
                "connection `{id}`: `auth.private_key` is for `token_endpoint_auth = \"private_key_jwt\"`"
            ));
        }
        if auth.kind == AuthKind::ClientCredentials
            && (auth.client_id.is_none()
                || (auth.client_secret.is_none() && auth.client_secret_env.is_none()))
        {
            return Err(format!(
                "connection `{id}`: `auth` kind `client-credentials` needs `client_id` and `client_secret_env` (or `client_secret`)"
            ));
        }
    }
    Ok(())
}

/// `private_key_jwt`: a client id and a private key that signs, given by
/// reference, and no secret besides.
fn check_private_key_jwt(id: &str, auth: &AuthConfig) -> Result<(), String> {
    let refuse = |why: &str| Err(format!("connection `{id}`: `auth`: {why}"));
    if auth.kind != AuthKind::ClientCredentials {
        return refuse("`private_key_jwt` is for kind `client-credentials`");
    }
    if auth.client_id.is_none() {
        return refuse("`private_key_jwt` needs `client_id`");
    }
    if auth.client_secret.is_some() || auth.client_secret_env.is_some() {
        return refuse("`private_key_jwt` signs with `private_key`; drop the client secret");
    }
    match &auth.private_key {
        None => refuse(
            "`private_key_jwt` needs `private_key = { secret_file = \"client.pem\" }` (or `{ secret = \"NAME\" }`)",
        ),
        Some(ConfigValue::Plain(_)) => refuse(
            "`private_key` takes a reference, `{ secret_file = \"client.pem\" }` or `{ secret = \"NAME\" }`, never the key itself",
        ),
        Some(key) => match crate::jwt::Signer::from_pem(key.expose()) {
            Ok(_) => Ok(()),
            Err(e) => refuse(&format!("`private_key`: {e}")),
        },
    }
}

/// Whether `url` starts with `scheme` and names a host and a path beyond `/`.
fn url_has_path(url: &str, scheme: &str) -> bool {
    url.strip_prefix(scheme)
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(host, path)| !host.is_empty() && !path.is_empty())
}
