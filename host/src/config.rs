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
use serde::Deserialize;

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
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    pub max_memory: Option<ByteSize>,
    pub cache_dir: Option<PathBuf>,
    /// `false` disables the precompile cache.
    pub cache: Option<bool>,
    /// Runs executing at once; more wait their turn (default 64).
    pub max_concurrent_runs: Option<usize>,
    /// The largest run input JSON accepted (default 4 MiB).
    pub max_input: Option<ByteSize>,
    /// The largest node output JSON kept (default 4 MiB).
    pub max_output: Option<ByteSize>,
}

/// `[rpc]`: the grants of JSON-RPC clients.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RpcSection {
    /// Grants for `capability.*`, `resource.read` and `prompt.get`, as for a
    /// workflow. Absent: every capability of every configured connection.
    pub allow: Option<Vec<String>>,
}

/// `[workflows.<name>]`: a configured component, what it may reach, its limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowConfig {
    /// The component; relative paths are from the config file.
    pub component: PathBuf,
    /// Grants: globs over qualified capability names (`fixture.*`). Deny by default.
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    pub max_memory: Option<ByteSize>,
}

/// `[connections.<id>]`: how to reach one MCP server.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionConfig {
    /// stdio: the program to spawn. `wf-host` means this executable.
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// stdio: variables set for the child, on top of the inherited ones.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// stdio: host variables passed to the child besides the default set
    /// (`HOME`, `LOGNAME`, `PATH`, `SHELL`, `TERM`, `USER`). Nothing else is.
    #[serde(default)]
    pub inherit_env: Vec<String>,
    pub cwd: Option<PathBuf>,
    /// Streamable HTTP: the endpoint URL.
    pub url: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Per-operation timeout (default 30s).
    #[serde(default, with = "humantime_serde")]
    pub call_timeout: Option<Duration>,
    /// Close the session after this long without operations (default: never).
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// Ping the server this often to detect a dead transport (default 15s; HTTP only
    /// unless set).
    #[serde(default, with = "humantime_serde")]
    pub ping_interval: Option<Duration>,
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
            for (key, duration) in [
                ("call_timeout", conn.call_timeout),
                ("idle_timeout", conn.idle_timeout),
                ("ping_interval", conn.ping_interval),
            ] {
                if duration.is_some_and(|d| d.is_zero()) {
                    return Err(invalid(format!(
                        "connection `{id}`: `{key}` must be greater than zero"
                    )));
                }
            }
        }
        if config.runtime.max_concurrent_runs == Some(0) {
            return Err(ConfigError::Invalid {
                path: path.to_owned(),
                message: "`[runtime] max_concurrent_runs` must be at least 1".into(),
            });
        }
        for (name, workflow) in &config.workflows {
            if let Err(e) = crate::grants::Grants::new(&workflow.allow) {
                return Err(ConfigError::Invalid {
                    path: path.to_owned(),
                    message: format!("workflow `{name}`: {e}"),
                });
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

    /// The grants of every workflow whose component is `component` (compared
    /// after resolving both paths).
    pub fn grants_for_component(&self, component: &Path) -> Vec<String> {
        let target = std::fs::canonicalize(component).ok();
        self.workflows
            .values()
            .filter(|w| {
                let path = self.resolve(&w.component);
                target.is_some() && std::fs::canonicalize(path).ok() == target
            })
            .flat_map(|w| w.allow.iter().cloned())
            .collect()
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
