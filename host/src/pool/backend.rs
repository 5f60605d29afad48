//! The pool as the node [`CapabilityBackend`], and the one place pool errors
//! become guest-visible capability errors.

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use super::{Pool, PoolError};
use crate::capability::{
    CallExtras, CapabilityBackend, CapabilityEntry, CapabilityError, CapabilityKind,
};

/// MCP's JSON-RPC codes that mean "no such thing" and "bad arguments".
const METHOD_NOT_FOUND: i32 = -32601;
const INVALID_PARAMS: i32 = -32602;
const RESOURCE_NOT_FOUND: i32 = -32002;

/// Maps a pool error to what a node may see. Operator detail (paths, commands,
/// URLs, transport errors) stays in logs and `host.status`; the guest gets the
/// connection id and the kind of failure.
pub fn to_capability_error(e: PoolError) -> CapabilityError {
    match e {
        PoolError::UnknownConnection { connection } => {
            CapabilityError::NotFound(format!("no connection `{connection}`"))
        }
        PoolError::ConnectFailed { connection, detail } => CapabilityError::Unavailable(format!(
            "connection `{connection}` could not be established{}",
            guest_safe_reason(&connection, &detail)
        )),
        PoolError::CircuitOpen {
            connection,
            retry_in,
            ..
        } => CapabilityError::Unavailable(format!(
            "connection `{connection}` is failing; next attempt in {}ms",
            retry_in.as_millis()
        )),
        PoolError::SessionClosed { connection, reason } => CapabilityError::Unavailable(format!(
            "connection `{connection}`: the session to the server was lost{}",
            guest_safe_reason(&connection, &reason)
        )),
        PoolError::Expired { connection } => CapabilityError::Unavailable(format!(
            "connection `{connection}`: the session to the server was lost"
        )),
        PoolError::ShutDown => CapabilityError::Unavailable("the host is shutting down".into()),
        // The message names no other tools: the caller may not be granted them.
        // The node dispatch adds the ones the node may call.
        e @ PoolError::NoSuchTool { .. } => CapabilityError::NotFound(e.to_string()),
        e @ PoolError::InvalidArguments { .. } => CapabilityError::InvalidArguments(e.to_string()),
        e @ PoolError::NotPinned { .. } => CapabilityError::Denied(e.to_string()),
        e @ PoolError::InvalidOutput { .. } => CapabilityError::ToolError(e.to_string()),
        e @ PoolError::Limited { .. } => CapabilityError::Timeout(e.to_string()),
        e @ PoolError::QueueFull { .. } => CapabilityError::Unavailable(e.to_string()),
        e @ PoolError::TooLong { .. } => CapabilityError::Timeout(e.to_string()),
        PoolError::Timeout {
            connection, after, ..
        } => CapabilityError::Timeout(format!(
            "connection `{connection}`: no answer within {}ms; the request was cancelled",
            after.as_millis()
        )),
        PoolError::Server {
            connection,
            code,
            message,
        } => {
            let mut message = format!("connection `{connection}`: {message}");
            if message.contains("no back-channel") {
                // A server that asks mid-call, as servers before 2026-07-28
                // do: that session revision has no channel for it.
                message.push_str(&format!(
                    " (this server asks during a call, as servers of MCP revisions before 2026-07-28 do; pin its connection to that way with `protocol = \"2025-11-25\"` in `[connections.{connection}]`)"
                ));
            }
            match code {
                INVALID_PARAMS => CapabilityError::InvalidArguments(message),
                METHOD_NOT_FOUND | RESOURCE_NOT_FOUND => CapabilityError::NotFound(message),
                _ => CapabilityError::Unavailable(message),
            }
        }
    }
}

/// The part of an operator's error a node may see too: which certificate
/// check failed, or that someone must sign in. Both name no host, path or
/// secret; anything else stays in logs and `host.status`.
fn guest_safe_reason(connection: &str, detail: &str) -> String {
    if let Some(at) = detail.find("TLS: ") {
        return format!(" ({})", &detail[at..]);
    }
    if detail.contains("run `wf-host auth login") {
        return format!(" (authorization is needed: run `wf-host auth login {connection}`)");
    }
    String::new()
}

#[async_trait]
impl CapabilityBackend for Pool {
    async fn call_tool(
        &self,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        Pool::call_tool_with(
            self,
            connection,
            tool,
            arguments,
            CallExtras::default(),
            None,
        )
        .await
        .map_err(to_capability_error)
    }

    async fn call_tool_with(
        &self,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
        extras: CallExtras,
    ) -> Result<Value, CapabilityError> {
        Pool::call_tool_with(self, connection, tool, arguments, extras, None)
            .await
            .map_err(to_capability_error)
    }

    async fn read_resource(&self, connection: &str, uri: &str) -> Result<Value, CapabilityError> {
        Pool::read_resource(self, connection, uri)
            .await
            .map_err(to_capability_error)
    }

    async fn get_prompt(
        &self,
        connection: &str,
        prompt: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, CapabilityError> {
        Pool::get_prompt(self, connection, prompt, arguments)
            .await
            .map_err(to_capability_error)
    }

    async fn list(&self) -> Result<Vec<CapabilityEntry>, CapabilityError> {
        self.list_connections(&|_| true).await
    }

    async fn list_connections(
        &self,
        wanted: &(dyn for<'c> Fn(&'c str) -> bool + Send + Sync),
    ) -> Result<Vec<CapabilityEntry>, CapabilityError> {
        let mut entries = Vec::new();
        for connection in self.connections().into_iter().filter(|c| wanted(c)) {
            let catalog = match self.catalog(&connection).await {
                Ok(catalog) => catalog,
                Err(e) => {
                    // One dead upstream must not hide the others' capabilities.
                    tracing::warn!(connection, "not listing capabilities: {e}");
                    continue;
                }
            };
            for tool in &catalog.tools {
                entries.push(CapabilityEntry {
                    name: format!("{connection}.{}", tool.name),
                    kind: CapabilityKind::Tool,
                    description: tool.description.as_ref().map(|d| d.to_string()),
                    schema: Some(Value::Object((*tool.input_schema).clone())),
                });
            }
            for resource in &catalog.resources {
                entries.push(CapabilityEntry {
                    name: format!("{connection}.{}", resource.uri),
                    kind: CapabilityKind::Resource,
                    description: resource.description.clone(),
                    schema: Some(json!({ "uri": resource.uri, "mimeType": resource.mime_type })),
                });
            }
            for prompt in &catalog.prompts {
                entries.push(CapabilityEntry {
                    name: format!("{connection}.{}", prompt.name),
                    kind: CapabilityKind::Prompt,
                    description: prompt.description.clone(),
                    schema: Some(serde_json::to_value(&prompt.arguments).unwrap_or(Value::Null)),
                });
            }
        }
        Ok(entries)
    }
}
