//! The OpenRPC document served by `rpc.discover`.

use serde_json::{Value, json};

use super::jsonrpc::*;

fn param(name: &str, required: bool, schema: Value, description: &str) -> Value {
    json!({ "name": name, "required": required, "schema": schema, "description": description })
}

fn method(name: &str, summary: &str, params: Vec<Value>, result: Value) -> Value {
    json!({
        "name": name,
        "summary": summary,
        "paramStructure": "either",
        "params": params,
        "result": { "name": "result", "schema": result },
    })
}

fn run_record() -> Value {
    json!({
        "type": "object",
        "required": ["run_id", "workflow", "status", "input", "started_at"],
        "properties": {
            "run_id": { "type": "string" },
            "workflow": { "type": "string" },
            "status": { "enum": ["running", "succeeded", "failed", "cancelled"] },
            "input": {},
            "output": {},
            "error": {
                "type": "object",
                "properties": { "code": { "type": "string" }, "message": { "type": "string" } }
            },
            "started_at": { "type": "string", "format": "date-time" },
            "finished_at": { "type": "string", "format": "date-time" }
        }
    })
}

/// The document.
pub fn document() -> Value {
    let string = json!({ "type": "string" });
    let object = json!({ "type": "object" });
    json!({
        "openrpc": "1.3.2",
        "info": {
            "title": "wf-host",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Start and follow workflow runs, and call MCP capabilities through the host's shared session pool.",
        },
        "methods": [
            method("workflow.start", "Starts a configured workflow; with `wait`, returns once it has finished.", vec![
                param("workflow", true, string.clone(), "A workflow name from the config."),
                param("input", false, json!({}), "The node's input JSON (default null)."),
                param("wait", false, json!({ "type": "boolean" }), "Wait for the run to finish (up to 300 s)."),
                param("idempotency_key", false, string.clone(), "The same key for the same workflow returns the same run."),
            ], json!({
                "type": "object",
                "required": ["run_id", "status"],
                "properties": { "run_id": string, "status": { "type": "string" }, "output": {}, "error": object }
            })),
            method("workflow.get", "The run record.", vec![param("run_id", true, string.clone(), "")], run_record()),
            method("workflow.wait", "The run record once finished, or the current one after `timeout_ms` (default 30000, at most 300000).", vec![
                param("run_id", true, string.clone(), ""),
                param("timeout_ms", false, json!({ "type": "integer", "minimum": 0 }), ""),
            ], run_record()),
            method("workflow.cancel", "Stops the node and any in-flight upstream call; returns the record.", vec![param("run_id", true, string.clone(), "")], run_record()),
            method("workflow.list", "Runs, newest first.", vec![
                param("status", false, json!({ "enum": ["running", "succeeded", "failed", "cancelled"] }), ""),
                param("limit", false, json!({ "type": "integer", "minimum": 0 }), "Default 100."),
            ], json!({ "type": "object", "properties": { "runs": { "type": "array", "items": run_record() } } })),
            method("capability.list", "Every tool, resource and prompt, with qualified names, descriptions and schemas.", vec![], json!({
                "type": "object", "properties": { "capabilities": { "type": "array" } }
            })),
            method("capability.call", "Calls a tool; the MCP CallToolResult.", vec![
                param("name", true, string.clone(), "`<connection>.<tool>`"),
                param("arguments", false, object.clone(), "The tool's arguments; checked against its input schema."),
            ], object.clone()),
            method("resource.read", "Reads a resource; the MCP ReadResourceResult.", vec![
                param("connection", true, string.clone(), ""),
                param("uri", true, string.clone(), ""),
            ], object.clone()),
            method("prompt.get", "Renders a prompt; the MCP GetPromptResult.", vec![
                param("name", true, string.clone(), "`<connection>.<prompt>`"),
                param("arguments", false, object.clone(), ""),
            ], object.clone()),
            method("host.status", "Per connection: transport, state, sessions opened, calls, failures, last error, catalog sizes.", vec![], json!({
                "type": "object", "properties": { "connections": { "type": "array" }, "workflows": { "type": "array" } }
            })),
            method("rpc.discover", "This document.", vec![], object),
        ],
        "components": {
            "errors": {
                "ParseError": { "code": PARSE_ERROR, "message": "parse error" },
                "InvalidRequest": { "code": INVALID_REQUEST, "message": "invalid request (also: body too large)" },
                "MethodNotFound": { "code": METHOD_NOT_FOUND, "message": "method not found" },
                "InvalidParams": { "code": INVALID_PARAMS, "message": "invalid params; names the param (also: tool arguments failing the input schema)" },
                "Internal": { "code": INTERNAL_ERROR, "message": "internal error" },
                "UnknownWorkflow": { "code": UNKNOWN_WORKFLOW, "message": "unknown workflow" },
                "UnknownRun": { "code": UNKNOWN_RUN, "message": "unknown run" },
                "Denied": { "code": DENIED, "message": "denied" },
                "Unavailable": { "code": UNAVAILABLE, "message": "upstream unavailable" },
                "Timeout": { "code": TIMEOUT, "message": "upstream timeout" },
                "NotFound": { "code": NOT_FOUND, "message": "no such connection, tool, resource or prompt" },
                "ShuttingDown": { "code": SHUTTING_DOWN, "message": "the host is shutting down" },
            }
        }
    })
}
