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

fn failure() -> Value {
    json!({
        "type": "object",
        "properties": { "code": { "type": "string" }, "message": { "type": "string" } }
    })
}

fn step_record() -> Value {
    json!({
        "type": "object",
        "required": ["id", "status", "attempts", "needs"],
        "properties": {
            "id": { "type": "string" },
            "status": { "enum": ["pending", "running", "waiting", "succeeded", "failed", "skipped", "cancelled"] },
            "attempts": { "type": "integer", "minimum": 0 },
            "needs": {
                "type": "array", "items": { "type": "string" },
                "description": "The steps this one waits for, in the definition the run started with: the edges of the run's graph."
            },
            "input": { "description": "Once the step started: its node's input, or a `for_each` step's items." },
            "started_at": { "type": "string", "format": "date-time" },
            "finished_at": { "type": "string", "format": "date-time" },
            "output": {},
            "error": failure(),
            "progress": {
                "type": "object",
                "description": "While the step runs: the latest `notifications/progress` of its tool call.",
                "required": ["progress"],
                "properties": {
                    "progress": { "type": "number" },
                    "total": { "type": "number" },
                    "message": { "type": "string" }
                }
            },
            "calls": {
                "type": "array",
                "description": "With `calls: true`: every capability call of the step, by attempt, item and sequence.",
                "items": {
                    "type": "object",
                    "properties": {
                        "item": { "type": "integer" }, "attempt": { "type": "integer" },
                        "seq": { "type": "integer" }, "name": { "type": "string" },
                        "arguments": {}, "outcome": { "enum": ["ok", "error"] },
                        "error_code": { "type": "string" }, "duration_us": { "type": "integer" },
                        "at": { "type": "string", "format": "date-time" }
                    }
                }
            },
            "logs": {
                "type": "array",
                "description": "With `logs: true`: the log records of every node attempt, oldest first.",
                "items": {
                    "type": "object",
                    "required": ["item", "attempt", "at", "records"],
                    "properties": {
                        "item": { "type": "integer" }, "attempt": { "type": "integer" },
                        "at": { "type": "string", "format": "date-time" },
                        "records": { "type": "array", "items": { "type": "object", "properties": { "level": { "type": "string" }, "message": { "type": "string" } } } }
                    }
                }
            }
        }
    })
}

fn run_record() -> Value {
    json!({
        "type": "object",
        "required": ["run_id", "workflow", "status", "input", "started_at", "definition_hash"],
        "properties": {
            "definition_hash": { "type": "string", "description": "sha256 of the definition the run started with" },
            "steps": { "type": "array", "items": step_record() },
            "run_id": { "type": "string" },
            "workflow": { "type": "string" },
            "status": { "enum": ["queued", "running", "paused", "succeeded", "failed", "cancelled"] },
            "trigger": { "type": "object", "description": "What started the run: `{kind: \"schedule\", name, scheduled_at, missed}`, `{kind: \"webhook\", delivery}`, or the named token that did, `{kind: \"token\", name}`." },
            "queued_reason": { "type": "string", "description": "While `queued`: why the run waits (its concurrency key or rate)." },
            "input": {},
            "output": {},
            "error": failure(),
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
                param("input", false, json!({}), "The workflow's input JSON (default null); checked against its `input_schema`."),
                param("wait", false, json!({ "type": "boolean" }), "Wait for the run to finish (up to 300 s)."),
                param("idempotency_key", false, string.clone(), "The same key for the same workflow returns the same run."),
            ], json!({
                "type": "object",
                "required": ["run_id", "status"],
                "properties": { "run_id": string, "status": { "type": "string" }, "output": {}, "error": object }
            })),
            method("workflow.get", "The run record with its steps.", vec![
                param("run_id", true, string.clone(), ""),
                param("calls", false, json!({ "type": "boolean" }), "Add each step's journal of capability calls."),
                param("logs", false, json!({ "type": "boolean" }), "Add each step's log records, by attempt and item."),
            ], run_record()),
            method("workflow.wait", "The run record once finished, or the current one after `timeout_ms` (default 30000, at most 300000).", vec![
                param("run_id", true, string.clone(), ""),
                param("timeout_ms", false, json!({ "type": "integer", "minimum": 0 }), ""),
            ], run_record()),
            method("workflow.signal", "Sends a signal to a run's wait step (`wait = \"<signal>\"`); its payload becomes the step's output. A signal sent before the step waits is kept for it. -32602 when the payload breaks the step's `schema` (the run keeps waiting); -32008 when the run does not wait for it.", vec![
                param("run_id", true, string.clone(), ""),
                param("signal", true, string.clone(), "The name the step's `wait` gives, e.g. `approve`."),
                param("payload", false, json!({}), "Any JSON; the console sends `{approved, comment}`."),
            ], json!({
                "type": "object", "properties": {
                    "run_id": { "type": "string" }, "signal": { "type": "string" },
                    "step": { "type": "string", "description": "The wait step that takes it." },
                    "delivery": { "enum": ["waiting", "kept"], "description": "`waiting`: the step waits now; `kept`: kept until it does." }
                }
            })),
            method("workflow.answer", "Answers the question an upstream server asked a running step's call (elicitation; the step's `questions` in `workflow.get`): `accept` with `content` matching the question's `requested_schema`, `decline` or `cancel`. -32602 when the content breaks the schema (the question stays open); -32008 when the step has no open question.", vec![
                param("run_id", true, string.clone(), ""),
                param("step_id", true, string.clone(), ""),
                param("item", false, json!({"type": "integer", "minimum": 0}), "The `for_each` item asked (default 0)."),
                param("action", true, json!({"enum": ["accept", "decline", "cancel"]}), ""),
                param("content", false, json!({"type": "object"}), "With `accept` of a form question."),
            ], json!({
                "type": "object", "properties": {
                    "run_id": { "type": "string" }, "signal": { "type": "string" },
                    "step": { "type": "string" }, "delivery": { "const": "waiting" }
                }
            })),
            method("workflow.waiting", "The wait steps waiting for a signal, the longest waiting first: `{steps: [{run_id, workflow, step, input: {signal, timeout_at, request}, since}]}`.", vec![
                param("limit", false, json!({"type": "integer", "minimum": 1, "maximum": 1000}), "Default 100."),
            ], json!({"type": "object"})),
            method("workflow.cancel", "Stops every running step and its in-flight upstream calls; returns the record.", vec![param("run_id", true, string.clone(), "")], run_record()),
            method("workflow.migrate", "Moves an unfinished run to the definition of its workflow in force (after a reload changed it): its steps to come run as that one says. -32008, with the reason, when a step that has run or waits is not in it or is defined differently, or a step's node is running now.", vec![param("run_id", true, string.clone(), "")], run_record()),
            method("workflow.pause", "Pauses a running run (`run_id`): it starts no new step (its running steps finish and are recorded, sleeps keep their wake time) and stays `paused`, across restarts, until `workflow.resume`; -32008 for a run that is not running. Or pauses a whole workflow (`workflow`): its new runs wait `queued`, its schedules skip their ticks, its running runs go on; answers `{workflow, paused, changed}`.", vec![param("run_id", false, string.clone(), "one run"), param("workflow", false, string.clone(), "or a whole workflow")], run_record()),
            method("workflow.resume", "Resumes a paused run where it stopped (`run_id`; -32008 for a run that is not paused), or a paused workflow (`workflow`), whose queued runs are then admitted.", vec![param("run_id", false, string.clone(), "one run"), param("workflow", false, string.clone(), "or a whole workflow")], run_record()),
            method("workflow.retry", "Starts a failed or cancelled run again from its failed or cancelled steps, keeping the outputs of the steps that succeeded; same run id.", vec![param("run_id", true, string.clone(), "")], run_record()),
            method("workflow.list", "Runs, newest first, a page at a time.", vec![
                param("workflow", false, string.clone(), "Only runs of this workflow."),
                param("status", false, json!({ "enum": ["queued", "running", "paused", "succeeded", "failed", "cancelled"] }), ""),
                param("limit", false, json!({ "type": "integer", "minimum": 1, "maximum": 1000 }), "Default 100."),
                param("cursor", false, string.clone(), "`next_cursor` of the previous page."),
            ], json!({ "type": "object", "properties": {
                "runs": { "type": "array", "items": run_record() },
                "next_cursor": { "type": "string" }
            } })),
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
            method("host.status", "Per connection: transport, state, sessions opened, calls, failures, last error, catalog sizes; the workflows; the state store; this worker and, on a shared (PostgreSQL) store, every live worker.", vec![], json!({
                "type": "object", "properties": {
                    "worker": { "type": "object", "properties": {
                        "id": { "type": "string" }, "started_at": { "type": "string" }
                    } },
                    "workers": { "type": "array", "items": { "type": "object", "properties": {
                        "id": { "type": "string" }, "started_at": { "type": "string" },
                        "last_heartbeat": { "type": "string" }, "running_steps": { "type": "integer" }
                    } } },
                    "connections": { "type": "array" },
                    "workflows": { "type": "array" },
                    "load": { "type": "object", "description": "This process: the runs it drives (`live_runs`) and its limit (`max_live_runs`; `busy` at it, when new starts are refused), the starts it refused by reason (`refused: {busy, disk_full, state_unavailable}`) and its failed writes to the state by kind (`store_errors: {disk_full, unavailable, other}`), since it started." },
                    "config": { "type": ["object", "null"], "description": "The config file in force: `{path, loaded_at, sha256, reloads, last_error?, last_error_at?}`; `last_error` says why the last reload failed, until one succeeds." },
                    "state": { "type": "object", "properties": {
                        "backend": { "type": "string" }, "path": { "type": "string" },
                        "runs_running": { "type": "integer" }, "runs_total": { "type": "integer" },
                        "runs_asleep": { "type": "integer", "description": "Runs asleep in the state until their wake time, driven by no process." },
                        "degraded": { "type": ["string", "null"], "description": "Why the state cannot be written now (its disk is full, the database refuses writes or cannot be reached); `null` when it can." },
                        "last_event_id": { "type": "integer", "description": "The newest kept event's id: stream `/events` with `Last-Event-ID` set to it to get only what happens next." }
                    } }
                }
            })),
            method("host.reload", "Loads the config file again and, when all of it is valid, switches to it (as SIGHUP does): workflows, schedules, webhooks, exposed tools, connections (unchanged ones keep their sessions), `[rpc] allow` and `[[rpc.tokens]]`. Running runs keep their definitions. `not_applied` lists what changed that applies only at a restart (`[runtime]` keys). -32009 when the new config is invalid: nothing changed, the old one keeps serving.", vec![], json!({
                "type": "object", "properties": {
                    "added": { "type": "array" }, "removed": { "type": "array" }, "changed": { "type": "array" }, "not_applied": { "type": "array", "description": "What changed that applies only when wf-host restarts, such as `[runtime] timeout`." },
                    "config": { "type": "object", "properties": {
                        "path": { "type": "string" }, "loaded_at": { "type": "string" },
                        "sha256": { "type": "string" }, "reloads": { "type": "integer" }
                    } }
                }
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
                "ConfigInvalid": { "code": CONFIG_INVALID, "message": "the config to reload is invalid (or there is none); the one in force is kept" },
                "NotWaiting": { "code": NOT_WAITING, "message": "the run does not wait for this signal (finished, no such wait step, or one is already kept for each)" },
            }
        }
    })
}
