//! wf-host runs workflow nodes written as WebAssembly components and gives them
//! MCP tools, resources and prompts as capabilities.
//!
//! - [`runtime`] loads components and runs them, one fresh locked-down instance
//!   per run, with time and memory limits.
//! - [`capability`] is the WIT-facing dispatch of the `wf:node/capability`
//!   interface, in front of a [`capability::CapabilityBackend`].
//! - [`pool`] holds one persistent MCP client session per connection and is
//!   the backend behind every capability call.
//! - [`workflow`] runs graphs of nodes (jq between steps, retries, deadlines),
//!   and [`store`] keeps their runs durable (SQLite, or PostgreSQL shared by
//!   several workers), so a restarted host resumes them.
//! - [`host`] builds the pool, the runtime and the workflows together from a
//!   config, and shuts them down in order.
//! - [`rpc`] is the JSON-RPC 2.0 server over HTTP; [`mcp`] offers exposed
//!   workflows as tools of an MCP server; [`console`] is the web console it
//!   serves at `/`.
//! - [`tls`] reads a connection's TLS files (CA, client certificate and key),
//!   for [`config`] to check and for [`pool`] to connect with.
//! - [`trace`] makes the OpenTelemetry spans of runs, steps and capability
//!   calls, exported over OTLP when an endpoint is configured.
//! - [`fixture`] is an MCP server for tests.
//! - [`scaffold`] starts node projects (`wf-host new`) and builds them
//!   (`wf-host build`).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use wf_host::capability::NoBackend;
//! use wf_host::runtime::{RunOptions, Runtime, RuntimeConfig};
//!
//! let runtime = Runtime::new(RuntimeConfig::default(), Arc::new(NoBackend))?;
//! let node = runtime.load("plugins/echo.wasm".as_ref())?;
//! let report = runtime.run(&node, r#"{"hello": "world"}"#, RunOptions::default()).await;
//! assert_eq!(report.result?, r#"{"hello": "world"}"#);
//! # Ok(()) }
//! ```

pub mod api;
mod bindings;
pub mod capability;
pub mod config;
pub mod console;
pub mod diff;
pub mod domain;
pub mod fixture;
pub mod grants;
pub mod host;
pub mod jwt;
pub mod mcp;
pub mod metrics;
pub mod pool;
pub mod reload;
pub mod replay;
pub mod rpc;
pub mod runtime;
pub mod scaffold;
pub mod secrets;
pub mod store;
pub mod testing;
pub mod tls;
pub mod tokens;
pub mod trace;
pub mod workflow;
