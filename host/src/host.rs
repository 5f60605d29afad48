//! The host assembled: the MCP [`Pool`], the [`Runtime`] whose capability
//! calls go to it, and the [`Workflows`] that run on that runtime, built in
//! that order and shut down in the reverse one.
//!
//! Like the rest of the library it listens for no signal: whoever owns the
//! host decides when to call [`Host::shutdown`]. It may import `config`,
//! `pool`, `runtime` and `workflow`; none of them imports it.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::pool::{Pool, PoolConfig};
use crate::runtime::{LoadError, Runtime, RuntimeConfig};
use crate::workflow::{self, WorkflowError, Workflows};

/// How each part of a [`Host`] is set up.
#[derive(Debug, Clone, Default)]
pub struct HostOptions {
    /// The pool, used as given: its connections are not taken from the
    /// config passed to [`Host::open`].
    pub pool: PoolConfig,
    pub runtime: RuntimeConfig,
    pub workflows: workflow::Options,
}

/// Why a [`Host`] could not be built. Each variant says what its error says.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// wasmtime refused the runtime's configuration.
    #[error(transparent)]
    Runtime(#[from] LoadError),
    /// A workflow did not load, or the state did not open.
    #[error(transparent)]
    Workflows(#[from] WorkflowError),
}

/// The pool, the runtime and the workflows of one host process.
pub struct Host {
    pool: Pool,
    runtime: Arc<Runtime>,
    workflows: Arc<Workflows>,
}

impl Host {
    /// Builds the pool, a runtime whose capability calls go to it, and the
    /// workflows of `config` on that runtime. Nothing connects yet: the pool
    /// starts a session on its first call.
    ///
    /// # Errors
    /// [`HostError::Runtime`] when wasmtime refuses `options.runtime` (e.g.
    /// the pooling allocator cannot reserve its memory);
    /// [`HostError::Workflows`] naming the workflow and step that did not
    /// load, or the state that did not open.
    pub async fn open(config: &Config, options: HostOptions) -> Result<Host, HostError> {
        // On an error below the pool has had no caller yet: dropping it leaves
        // no session or child process behind.
        let pool = Pool::new(options.pool);
        let runtime = Arc::new(Runtime::new(options.runtime, Arc::new(pool.clone()))?);
        let workflows = Workflows::open(config, runtime.clone(), options.workflows).await?;
        Ok(Host {
            pool,
            runtime,
            workflows,
        })
    }

    /// The MCP pool; clones share its sessions.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The runtime that runs the nodes.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// The workflows of the config.
    pub fn workflows(&self) -> &Arc<Workflows> {
        &self.workflows
    }

    /// Shuts down from the top: the workflows stop new runs and give running
    /// ones up to `grace` (see [`Workflows::shutdown`]), then the pool closes
    /// every session and reaps every child process. Workflows already shut
    /// down (say, alongside a server that was draining) stop again at once.
    pub async fn shutdown(self, grace: Duration) {
        // Runs stopped past `grace` resume at the next start, following the
        // upstream tasks their calls made: those stay.
        self.pool.keep_tasks_on_stop();
        self.workflows.shutdown(grace).await;
        // The runtime has no task to stop: its epoch ticker ends when the
        // last reference to it goes, ours or the workflows'.
        drop(self.runtime);
        // After the workflows, so runs that finish within `grace` can still
        // call their tools.
        self.pool.shutdown().await;
    }
}
