//! The calls every face shares: JSON-RPC (`rpc/`), the MCP server
//! (`mcp.rs`) and the webhooks start, read, wait for, signal, answer and
//! cancel runs here, call capabilities here and read the host's status here.
//! Each call checks the caller's token first, then calls the workflows or the
//! pool; a face only parses its protocol and words the answer in it.

mod capabilities;
mod events;
mod host;
mod runs;

use std::sync::Arc;

use crate::pool::Pool;
use crate::reload::{Reloader, RpcGrants, RpcTokens};
use crate::workflow::{WorkflowError, Workflows};

pub use crate::capability::{Answer, CapabilityError, split_qualified};
pub use events::follow;
pub use runs::{Runs, Start};

/// Why a call of the API failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The caller's token does not cover the call.
    #[error("{0}")]
    Denied(String),
    #[error(transparent)]
    Workflow(#[from] WorkflowError),
    #[error(transparent)]
    Capability(#[from] CapabilityError),
    /// `host.reload` on a server without a config file, or a config that
    /// does not load.
    #[error("{0}")]
    Config(String),
}

/// What the calls work on: one per server, shared by its faces.
#[derive(Clone)]
pub struct Api {
    pub workflows: Arc<Workflows>,
    pub pool: Pool,
    /// What callers may call and list directly (`[rpc] allow`), checked
    /// before anything reaches the pool; a reload replaces them.
    pub grants: RpcGrants,
    /// The named tokens (`[[rpc.tokens]]`); a reload replaces them.
    pub tokens: RpcTokens,
    /// The config file `host.reload` reloads, if the server has one.
    pub config: Option<Arc<Reloader>>,
}

impl Api {
    /// The runs, as the callers may see and move them.
    pub fn runs(&self) -> Runs<'_> {
        Runs::of(&self.workflows)
    }
}
