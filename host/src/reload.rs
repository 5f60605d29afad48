//! Reloading `wf-host serve`'s config while it serves: on SIGHUP, on
//! `host.reload`, and (with `--watch`) when the config file or a component
//! it names changes.
//!
//! A new config is loaded and checked completely (the same checks as at
//! start, components compiled) before anything switches; one that fails
//! changes nothing, and its error is kept for `host.status`. Reloads are one
//! at a time.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::grants::Grants;
use crate::pool::Pool;
use crate::tokens::Tokens;
use crate::workflow::{Reloaded, Workflows};

/// Something of the config that the ways in read on every request and a
/// reload replaces.
pub struct Reloadable<T>(Arc<RwLock<Arc<T>>>);

impl<T> Clone for Reloadable<T> {
    fn clone(&self) -> Self {
        Reloadable(self.0.clone())
    }
}

impl<T> Reloadable<T> {
    pub fn new(value: T) -> Reloadable<T> {
        Reloadable(Arc::new(RwLock::new(Arc::new(value))))
    }

    /// What is in force now.
    pub fn load(&self) -> Arc<T> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn store(&self, value: T) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
    }
}

/// The RPC grants (`[rpc] allow`).
pub type RpcGrants = Reloadable<Grants>;
/// The named tokens (`[[rpc.tokens]]`).
pub type RpcTokens = Reloadable<Tokens>;

/// What `host.status` shows of the config.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigStatus {
    pub path: PathBuf,
    /// When the config in force was loaded (RFC 3339).
    pub loaded_at: String,
    /// The sha256 of the config text in force.
    pub sha256: String,
    /// Reloads that switched the config, since start.
    pub reloads: u64,
    /// Why the last reload that failed failed, unless one succeeded since.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error_at: Option<String>,
    /// `[runtime]` keys the config in force changed since the host started:
    /// not applied until it restarts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub restart_needed: Vec<String>,
}

/// Reloads one config file into a running host.
pub struct Reloader {
    path: PathBuf,
    workflows: Arc<Workflows>,
    pool: Pool,
    grants: RpcGrants,
    tokens: RpcTokens,
    /// `[runtime]` as the host started with it: a reload does not apply it.
    runtime: crate::config::RuntimeSection,
    /// The server listens beyond loopback with no `--token`: a config
    /// without named tokens would leave it open, and is refused.
    tokens_required: bool,
    status: Mutex<ConfigStatus>,
    /// The files a change of which `--watch` reloads for (the config and the
    /// components it names), as they were just before the config in force
    /// (or the last one refused) was read.
    seen: Mutex<Stamps>,
    /// One reload at a time.
    turn: tokio::sync::Mutex<()>,
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
#[error("reloading {path} failed; the configuration in force is kept: {message}")]
pub struct ReloadError {
    pub path: PathBuf,
    pub message: String,
}

/// What a reload that switched did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReloadReport {
    #[serde(flatten)]
    pub workflows: Reloaded,
    /// What the new config changed that the reload did not apply (`[runtime]
    /// timeout`, …): it takes effect when the host restarts.
    pub not_applied: Vec<String>,
    pub config: ConfigStatus,
}

/// Files with their modification time and length (`None` when a file
/// cannot be read), taken before the files are read, so that a change made
/// while they are read is still a change.
#[derive(Debug, Clone, PartialEq)]
pub struct Stamps(Vec<(PathBuf, Option<(SystemTime, u64)>)>);

impl Stamps {
    /// The config file at `path`, before it is read.
    pub fn of_config(path: &Path) -> Stamps {
        Stamps::of([path.to_owned()])
    }

    /// The config file's stamp from these, and a stamp for each component
    /// `config` names (the one these hold, or one taken now): call it before
    /// the components are compiled.
    pub fn with_components(self, config: &Config) -> Stamps {
        let mut files = self.0.into_iter();
        let mut kept: Vec<_> = files.next().into_iter().collect();
        let old: Vec<_> = files.collect();
        for component in config.component_files() {
            if kept.iter().any(|(path, _)| *path == component) {
                continue;
            }
            match old.iter().find(|(path, _)| *path == component) {
                Some(entry) => kept.push(entry.clone()),
                None => kept.extend(Stamps::of([component]).0),
            }
        }
        Stamps(kept)
    }

    fn of(files: impl IntoIterator<Item = PathBuf>) -> Stamps {
        Stamps(
            files
                .into_iter()
                .map(|path| {
                    let stamp = std::fs::metadata(&path)
                        .ok()
                        .and_then(|m| Some((m.modified().ok()?, m.len())));
                    (path, stamp)
                })
                .collect(),
        )
    }

    /// The same files, looked at again.
    fn again(&self) -> Stamps {
        Stamps::of(self.0.iter().map(|(path, _)| path.clone()))
    }

    /// The files whose stamp differs from the one in `before`.
    fn changed_since(&self, before: &Stamps) -> Vec<String> {
        self.0
            .iter()
            .filter(|entry| !before.0.contains(entry))
            .map(|(path, _)| path.display().to_string())
            .collect()
    }
}

impl Reloader {
    /// A reloader for the host that the config at `path` started; `seen`
    /// was taken with [`Stamps::of_config`] before the config was read and
    /// [`Stamps::with_components`] before its components were.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        path: PathBuf,
        seen: Stamps,
        workflows: Arc<Workflows>,
        pool: Pool,
        grants: RpcGrants,
        tokens: RpcTokens,
        runtime: crate::config::RuntimeSection,
        tokens_required: bool,
    ) -> Reloader {
        let sha256 = std::fs::read(&path)
            .map(|text| hex::encode(Sha256::digest(&text)))
            .unwrap_or_default();
        Reloader {
            status: Mutex::new(ConfigStatus {
                path: path.clone(),
                loaded_at: now(),
                sha256,
                reloads: 0,
                last_error: None,
                last_error_at: None,
                restart_needed: Vec::new(),
            }),
            seen: Mutex::new(seen),
            path,
            workflows,
            pool,
            grants,
            tokens,
            runtime,
            tokens_required,
            turn: tokio::sync::Mutex::new(()),
        }
    }

    pub fn status(&self) -> ConfigStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Loads the config file again and, when it is valid through and
    /// through, switches to it: workflows (new runs use the new definitions;
    /// running runs keep theirs), schedules, webhooks, exposed tools,
    /// connections (unchanged ones keep their sessions; changed ones are
    /// drained and replaced; removed ones close after their calls) and the
    /// RPC grants. `why` is logged.
    ///
    /// # Errors
    /// [`ReloadError`]: nothing changed; the error is kept for `host.status`.
    pub async fn reload(&self, why: &str) -> Result<ReloadReport, ReloadError> {
        let _turn = self.turn.lock().await;
        // What is read from here on counts as seen, also when it is refused.
        let seen = self.seen().again();
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = seen.clone();
        match self.switch(seen).await {
            Ok((workflows, sha256, runtime)) => {
                let not_applied: Vec<String> = self
                    .runtime
                    .changed_keys(&runtime)
                    .into_iter()
                    .map(|key| format!("[runtime] {key}"))
                    .collect();
                let config = {
                    let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
                    status.loaded_at = now();
                    status.sha256 = sha256;
                    status.reloads += 1;
                    status.last_error = None;
                    status.last_error_at = None;
                    status.restart_needed = not_applied.clone();
                    status.clone()
                };
                tracing::info!(config = %self.path.display(), why, added = ?workflows.added,
                    removed = ?workflows.removed, changed = ?workflows.changed, "config reloaded");
                if !not_applied.is_empty() {
                    tracing::warn!(config = %self.path.display(),
                        "reloaded, but {} changed since start and take effect only when wf-host restarts",
                        not_applied.join(", "));
                }
                Ok(ReloadReport {
                    workflows,
                    not_applied,
                    config,
                })
            }
            Err(message) => {
                tracing::warn!(config = %self.path.display(), why,
                    "config not reloaded; the one in force is kept: {message}");
                let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
                status.last_error = Some(message.clone());
                status.last_error_at = Some(now());
                Err(ReloadError {
                    path: self.path.clone(),
                    message,
                })
            }
        }
    }

    /// Switches to the config file as it is now: what the workflows did,
    /// the text's sha256, and its `[runtime]` (not applied).
    async fn switch(
        &self,
        seen: Stamps,
    ) -> Result<(Reloaded, String, crate::config::RuntimeSection), String> {
        let text = tokio::fs::read(&self.path)
            .await
            .map_err(|e| format!("cannot read {}: {e}", self.path.display()))?;
        let sha256 = hex::encode(Sha256::digest(&text));
        let path = self.path.clone();
        // Parsing and checking reads component files: off the async threads.
        let config = tokio::task::spawn_blocking(move || Config::load(&path))
            .await
            .map_err(|e| format!("the config check stopped: {e}"))?
            .map_err(|e| e.to_string())?;
        // Components the new config adds, before they are compiled.
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = seen.with_components(&config);
        let grants = Grants::new(config.rpc_allow()).map_err(|e| format!("[rpc] allow: {e}"))?;
        let tokens = Tokens::new(&config.rpc.tokens)?;
        if !self.tokens_required && tokens.is_empty() && !self.tokens.load().is_empty() {
            tracing::warn!(
                "this config has no `[[rpc.tokens]]`: once it is in force, the server takes requests without a token (it listens on loopback and has no `--token`)"
            );
        }
        if self.tokens_required && tokens.is_empty() {
            return Err(
                "the server listens beyond loopback without `--token`: the config must keep at least one `[[rpc.tokens]]` entry".into(),
            );
        }
        let workflows = self.workflows.clone();
        let loaded = config.clone();
        // Compiles the components of every workflow before it switches.
        let report = tokio::task::spawn_blocking(move || workflows.reload(&loaded))
            .await
            .map_err(|e| format!("the reload stopped: {e}"))?
            .map_err(|e| format!("{e:#}"))?;
        self.pool.update(config.connections.clone());
        self.grants.store(grants);
        self.tokens.store(tokens);
        Ok((report, sha256, config.runtime))
    }

    /// Reloads whenever a watched file (the config, or a component it names)
    /// changes and then holds still for a moment, until `stop`. Files are
    /// looked at every `every`.
    pub async fn watch(
        self: Arc<Self>,
        every: Duration,
        stop: tokio_util::sync::CancellationToken,
        said: impl Fn(&Result<ReloadReport, ReloadError>) + Send,
    ) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = stop.cancelled() => return,
            }
            let seen = self.seen();
            let now = seen.again();
            if now == seen {
                continue;
            }
            // A file being written: wait until it holds still.
            tokio::time::sleep(every).await;
            if now.again() != now {
                continue;
            }
            let changed = now.changed_since(&seen);
            said(
                &self
                    .reload(&format!("changed: {}", changed.join(", ")))
                    .await,
            );
        }
    }

    /// The watched files as they were before the last read.
    fn seen(&self) -> Stamps {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}
