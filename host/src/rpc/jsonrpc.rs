//! A small JSON-RPC 2.0 model that follows the spec to the letter: named or
//! positional params, absent params, batches, notifications.

use serde::Serialize;
use serde_json::{Map, Value, json};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;

/// Application error codes (documented in docs/rpc.md and `rpc.discover`).
pub const UNKNOWN_WORKFLOW: i64 = -32001;
pub const UNKNOWN_RUN: i64 = -32002;
pub const DENIED: i64 = -32003;
pub const UNAVAILABLE: i64 = -32004;
pub const TIMEOUT: i64 = -32005;
pub const NOT_FOUND: i64 = -32006;
pub const SHUTTING_DOWN: i64 = -32007;
pub const NOT_WAITING: i64 = -32008;
pub const CONFIG_INVALID: i64 = -32009;

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn invalid_params(message: impl Into<String>) -> Self {
        RpcError::new(INVALID_PARAMS, message)
    }
}

/// One request, checked against the spec.
#[derive(Debug)]
pub struct Request {
    /// `None` for a notification, which gets no response.
    pub id: Option<Value>,
    pub method: String,
    /// `Null` when absent.
    pub params: Value,
}

/// Checks one element of a body: an object with `jsonrpc: "2.0"`, a string
/// `method`, params that are an object or array, and an id that is a string,
/// number or null. On failure, the error and the id to answer with.
pub fn parse_request(value: Value) -> Result<Request, (RpcError, Value)> {
    let Value::Object(mut obj) = value else {
        return Err((
            RpcError::new(INVALID_REQUEST, "a request must be a JSON object"),
            Value::Null,
        ));
    };
    let id = match obj.remove("id") {
        None => None,
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => Some(id),
        Some(_) => {
            return Err((
                RpcError::new(INVALID_REQUEST, "`id` must be a string, a number or null"),
                Value::Null,
            ));
        }
    };
    let answer_id = id.clone().unwrap_or(Value::Null);
    let invalid = |m: &str| (RpcError::new(INVALID_REQUEST, m), answer_id.clone());
    if obj.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        return Err(invalid("`jsonrpc` must be exactly \"2.0\""));
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        Some(_) => return Err(invalid("`method` must be a string")),
        None => return Err(invalid("`method` is missing")),
    };
    let params = match obj.remove("params") {
        None => Value::Null,
        Some(p @ (Value::Object(_) | Value::Array(_))) => p,
        Some(_) => return Err(invalid("`params` must be an object or an array")),
    };
    Ok(Request { id, method, params })
}

pub fn success(id: Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

pub fn failure(id: Value, error: RpcError) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": error })
}

/// Turns params into an object: by name as given, by position mapped onto
/// `names`, or `{}` when absent.
///
/// # Errors
/// Invalid params when there are more positional params than names.
pub fn named_params(params: Value, names: &[&str]) -> Result<Map<String, Value>, RpcError> {
    match params {
        Value::Null => Ok(Map::new()),
        Value::Object(map) => Ok(map),
        Value::Array(items) => {
            if items.len() > names.len() {
                return Err(RpcError::invalid_params(format!(
                    "expected at most {} positional params ({}), got {}",
                    names.len(),
                    names.join(", "),
                    items.len()
                )));
            }
            Ok(names.iter().map(|n| n.to_string()).zip(items).collect())
        }
        _ => Err(RpcError::invalid_params(
            "params must be an object or an array",
        )),
    }
}
