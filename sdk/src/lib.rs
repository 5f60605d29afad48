//! Write [wf-host] workflow nodes in Rust.
//!
//! A node is a WebAssembly component that exports one `run` function and reaches
//! MCP tools, resources and prompts through the host. With this crate a node is
//! one function over serde types plus one macro line; the WIT bindings stay hidden.
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use wf_sdk::{capability, info};
//!
//! #[derive(Deserialize)]
//! struct Input {
//!     text: String,
//! }
//!
//! #[derive(Serialize)]
//! struct Output {
//!     echoed: String,
//! }
//!
//! fn run(input: Input) -> Result<Output, wf_sdk::Error> {
//!     info!("echoing {} bytes", input.text.len());
//!     // Calls the tool `echo` on the connection `fixture`.
//!     let result = capability::call_tool("fixture.echo", &serde_json::json!({ "text": input.text }))?;
//!     Ok(Output { echoed: result.text() })
//! }
//!
//! wf_sdk::node!(run);
//! ```
//!
//! Build it as a component with `cargo build --release --target wasm32-wasip2`
//! and a `crate-type = ["cdylib"]` library, then run it with
//! `wf-host run target/wasm32-wasip2/release/my_node.wasm --input '{"text":"hi"}'`.
//!
//! [wf-host]: https://crates.io/crates/wf-host

extern crate self as wf_sdk;

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;
pub use serde_json::{Value, json};

#[doc(hidden)]
pub use wit_bindgen as __wit_bindgen;

/// The generated WIT bindings. Node authors do not need them; they are public so
/// that [`node!`] can reach them from the node's crate.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "node",
        pub_export_macro: true,
        export_macro_name: "__export_node_world",
        default_bindings_module: "wf_sdk::bindings",
        runtime_path: "wf_sdk::__wit_bindgen::rt",
    });
}

use bindings::wf::node::capability as wit;

pub use wit::CapabilityInfo;
/// Why a capability call failed; match on it to handle a case.
pub use wit::Error as CapabilityError;
/// What kind of MCP item a capability is.
pub use wit::Kind;
/// Severity of a log record.
pub use wit::Level;

/// Why a node's `run` failed: a short machine-readable `code` and a message.
///
/// A [`CapabilityError`] converts into it with `?`, keeping its case as the code
/// (`unavailable`, `tool-error`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// A short machine-readable code, e.g. `invalid-input`.
    pub code: String,
    /// What went wrong, for a person.
    pub message: String,
}

impl Error {
    /// An error with your own code and message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Error {
            code: code.into(),
            message: message.into(),
        }
    }

    /// The input did not have the shape the node needs.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Error::new("invalid-input", message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

impl From<CapabilityError> for Error {
    fn from(err: CapabilityError) -> Self {
        let (code, message) = capability_error_parts(&err);
        Error::new(code, message)
    }
}

/// The WIT case name and the message of a capability error.
pub fn capability_error_parts(err: &CapabilityError) -> (&'static str, &str) {
    match err {
        CapabilityError::NotFound(m) => ("not-found", m),
        CapabilityError::Denied(m) => ("denied", m),
        CapabilityError::InvalidArguments(m) => ("invalid-arguments", m),
        CapabilityError::ToolError(m) => ("tool-error", m),
        CapabilityError::Unavailable(m) => ("unavailable", m),
        CapabilityError::Timeout(m) => ("timeout", m),
    }
}

/// Waits that outlive the node's instance: a node that uses them is a
/// *durable node*.
///
/// In a workflow step, a node that waits is let go (no instance, no step
/// slot) and runs again from the start when the wait is over; every call and
/// wait it made before is answered from its journal instead of being made
/// again. So a durable node must make the same calls and waits, in the same
/// order, each time it runs with the same answers: decide from its input and
/// its answers, not from the clock or randomness. A run that differs fails
/// its step, naming the first difference.
pub mod durable {
    use super::*;
    use bindings::wf::node::durable as wit;
    use std::time::Duration;

    /// Sleeps for `duration`. In a workflow step the node is let go while it
    /// sleeps, and a host that restarts (or another worker) wakes it on time.
    /// Elsewhere (`wf-host run`, `wf-host test`) it sleeps in place.
    pub fn sleep(duration: Duration) {
        wit::sleep(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX));
    }

    /// Waits for the signal `name` sent to this run (`workflow.signal`) and
    /// returns its payload. A signal sent before the node waits is kept for
    /// it.
    ///
    /// # Errors
    /// `unavailable` outside a workflow step, or when the node's journal is
    /// past its limit.
    pub fn wait_signal(name: &str) -> Result<Value, Error> {
        wait(name, None)
    }

    /// [`wait_signal`], for at most `timeout`.
    ///
    /// # Errors
    /// `timeout` when no signal came within it; as [`wait_signal`].
    pub fn wait_signal_for(name: &str, timeout: Duration) -> Result<Value, Error> {
        wait(
            name,
            Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// Runs the configured workflow `name` on `input` as a child of this
    /// run and returns its output once it ends. The node needs the grant
    /// `workflow.<name>`; while the child runs, the node is let go.
    ///
    /// # Errors
    /// With the child's own error code when it failed (`cancelled` when it
    /// was cancelled), or `denied`, `unknown-workflow`, `invalid-input`,
    /// `unavailable` (outside a workflow step).
    pub fn run_workflow(name: &str, input: &Value) -> Result<Value, Error> {
        match wit::run_workflow(name, &input.to_string()) {
            Ok(output) => serde_json::from_str(&output)
                .map_err(|e| Error::new("unavailable", format!("host returned invalid JSON: {e}"))),
            Err(e) => Err(Error::new(e.code, e.message)),
        }
    }

    fn wait(name: &str, timeout_ms: Option<u64>) -> Result<Value, Error> {
        match wit::wait_signal(name, timeout_ms) {
            Ok(payload) => serde_json::from_str(&payload)
                .map_err(|e| Error::new("unavailable", format!("host returned invalid JSON: {e}"))),
            Err(wit::WaitError::Timeout(m)) => Err(Error::new("timeout", m)),
            Err(wit::WaitError::Unavailable(m)) => Err(Error::new("unavailable", m)),
        }
    }
}

/// Calls to MCP tools, resources and prompts through the host.
pub mod capability {
    use super::*;

    /// The result of a tool call: the MCP `CallToolResult` JSON.
    #[derive(Debug, Clone, PartialEq)]
    pub struct ToolResult(pub Value);

    impl ToolResult {
        /// The text parts of `content`, joined with newlines.
        pub fn text(&self) -> String {
            join_text(self.0.get("content"), "text")
        }

        /// The tool's `structuredContent`, if it gave any.
        pub fn structured(&self) -> Option<&Value> {
            self.0.get("structuredContent")
        }

        /// The whole `CallToolResult` JSON.
        pub fn into_json(self) -> Value {
            self.0
        }
    }

    /// Calls the tool `name` (`<connection>.<tool>`) with `arguments`, which must
    /// serialize to a JSON object.
    ///
    /// # Errors
    /// Any [`CapabilityError`]; a tool that answers `isError` gives
    /// [`CapabilityError::ToolError`] with its text.
    pub fn call_tool(
        name: &str,
        arguments: &impl Serialize,
    ) -> Result<ToolResult, CapabilityError> {
        let args = to_json_text(arguments)?;
        let text = wit::call_tool(name, &args)?;
        Ok(ToolResult(parse_host_json(&text)?))
    }

    /// Calls several tools at once: each `(name, arguments)` as
    /// [`call_tool`] would call it, all sent together through the host, so
    /// that slow calls overlap. The results come back in the order of
    /// `calls`. At most 64 calls at once; past that, each fails with
    /// [`CapabilityError::InvalidArguments`] and none is made.
    ///
    /// ```no_run
    /// use wf_sdk::{capability, json};
    /// let results = capability::call_tools(&[
    ///     ("weather.forecast", json!({"city": "Lyon"})),
    ///     ("weather.forecast", json!({"city": "Oslo"})),
    /// ]);
    /// for result in results {
    ///     println!("{}", result?.text());
    /// }
    /// # Ok::<(), wf_sdk::CapabilityError>(())
    /// ```
    pub fn call_tools(calls: &[(&str, Value)]) -> Vec<Result<ToolResult, CapabilityError>> {
        let calls: Vec<wit::ToolCall> = calls
            .iter()
            .map(|(name, arguments)| wit::ToolCall {
                name: (*name).to_owned(),
                arguments: arguments.to_string(),
            })
            .collect();
        wit::call_tools(&calls)
            .into_iter()
            .map(|result| Ok(ToolResult(parse_host_json(&result?)?)))
            .collect()
    }

    /// Reads `uri` from `connection`: the MCP `ReadResourceResult` JSON.
    ///
    /// # Errors
    /// Any [`CapabilityError`].
    pub fn read_resource(connection: &str, uri: &str) -> Result<Value, CapabilityError> {
        parse_host_json(&wit::read_resource(connection, uri)?)
    }

    /// Reads `uri` from `connection` and joins the text of its contents.
    ///
    /// # Errors
    /// Any [`CapabilityError`].
    pub fn read_resource_text(connection: &str, uri: &str) -> Result<String, CapabilityError> {
        let result = read_resource(connection, uri)?;
        Ok(join_text(result.get("contents"), "text"))
    }

    /// Renders the prompt `name` (`<connection>.<prompt>`): the MCP
    /// `GetPromptResult` JSON.
    ///
    /// # Errors
    /// Any [`CapabilityError`].
    pub fn get_prompt(name: &str, arguments: &impl Serialize) -> Result<Value, CapabilityError> {
        let args = to_json_text(arguments)?;
        parse_host_json(&wit::get_prompt(name, &args)?)
    }

    /// The capabilities this node was granted.
    ///
    /// # Errors
    /// Any [`CapabilityError`].
    pub fn list() -> Result<Vec<CapabilityInfo>, CapabilityError> {
        wit::list_capabilities()
    }

    fn to_json_text(value: &impl Serialize) -> Result<String, CapabilityError> {
        serde_json::to_string(value).map_err(|e| {
            CapabilityError::InvalidArguments(format!("arguments do not serialize to JSON: {e}"))
        })
    }

    fn parse_host_json(text: &str) -> Result<Value, CapabilityError> {
        serde_json::from_str(text)
            .map_err(|e| CapabilityError::Unavailable(format!("host returned invalid JSON: {e}")))
    }

    fn join_text(items: Option<&Value>, key: &str) -> String {
        items
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(|item| item.get(key).and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    }
}

/// Writes a log record at `level`; the host tags it with the run and the node.
pub fn log(level: Level, message: &str) {
    wit::log(level, message);
}

/// Logs at `trace` level, `format!`-style.
#[macro_export]
macro_rules! trace { ($($arg:tt)*) => { $crate::log($crate::Level::Trace, &format!($($arg)*)) }; }
/// Logs at `debug` level, `format!`-style.
#[macro_export]
macro_rules! debug { ($($arg:tt)*) => { $crate::log($crate::Level::Debug, &format!($($arg)*)) }; }
/// Logs at `info` level, `format!`-style.
#[macro_export]
macro_rules! info { ($($arg:tt)*) => { $crate::log($crate::Level::Info, &format!($($arg)*)) }; }
/// Logs at `warn` level, `format!`-style.
#[macro_export]
macro_rules! warn { ($($arg:tt)*) => { $crate::log($crate::Level::Warn, &format!($($arg)*)) }; }
/// Logs at `error` level, `format!`-style.
#[macro_export]
macro_rules! error { ($($arg:tt)*) => { $crate::log($crate::Level::Error, &format!($($arg)*)) }; }

/// Exports `run` as the node's entry point.
///
/// `run` is any `fn(I) -> Result<O, E>` where `I: Deserialize`, `O: Serialize`
/// and `E: Into<wf_sdk::Error>`. Input that does not deserialize into `I` fails
/// the run with the code `invalid-input`.
#[macro_export]
macro_rules! node {
    ($run:path) => {
        #[doc(hidden)]
        struct __WfNode;

        impl $crate::bindings::Guest for __WfNode {
            fn run(
                input: ::std::string::String,
            ) -> ::core::result::Result<::std::string::String, $crate::bindings::NodeError> {
                $crate::__run_json(&input, $run)
            }
        }

        $crate::bindings::__export_node_world!(__WfNode with_types_in $crate::bindings);
    };
}

#[doc(hidden)]
pub fn __run_json<I, O, E>(
    input: &str,
    run: impl FnOnce(I) -> Result<O, E>,
) -> Result<String, bindings::NodeError>
where
    I: DeserializeOwned,
    O: Serialize,
    E: Into<Error>,
{
    let to_wit = |e: Error| bindings::NodeError {
        code: e.code,
        message: e.message,
    };
    let input: I = serde_json::from_str(input).map_err(|e| {
        to_wit(Error::invalid_input(format!(
            "input does not fit this node: {e}"
        )))
    })?;
    let output = run(input).map_err(|e| to_wit(e.into()))?;
    serde_json::to_string(&output).map_err(|e| {
        to_wit(Error::new(
            "invalid-output",
            format!("output is not JSON: {e}"),
        ))
    })
}
