//! OpenTelemetry traces of workflow runs: one trace per run, a `run` span at
//! its root, a `step` span per step and a `call` span per capability call a
//! node makes during the step.
//!
//! The spans are `tracing` spans with the target [`TARGET`]. With an OTLP
//! endpoint configured (see [`endpoint`]), the binary adds [`layer`], which
//! exports them; without one no layer wants them, and each span costs one
//! check of a disabled callsite.
//!
//! Context crosses tasks explicitly: the engine keeps the run span in the
//! run's state, a step span is made with that as its parent, and the node's
//! calls get the step span through [`crate::runtime::RunOptions::span`]. A
//! caller's W3C `traceparent` (an RPC header, an MCP request's `_meta`) makes
//! the run span its child ([`TraceParent`]), and every `tools/call` a node
//! makes carries its call span's context to the MCP server in `_meta`
//! ([`inject`]).
//!
//! These spans are passed, never entered: a task spawned while one is the
//! current span (a pool session opened by a call) would keep it open, and
//! with it the run's whole trace.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::{Map, Value};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;

/// The target of every span (and span event) this module makes.
pub const TARGET: &str = "wf_host::trace";

/// What is logged when `RUST_LOG` is not set: warnings, and node logs and
/// guest output at `info`.
pub const DEFAULT_LOG_FILTER: &str = "warn,wf_host::node=info,wf_host::guest=info";

/// The W3C Trace Context header and `_meta` keys.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// The path OTLP/HTTP collectors take traces at.
const TRACES_PATH: &str = "/v1/traces";

/// A caller's trace context (W3C `traceparent`, and `tracestate` when sent)
/// that a run continues. Kept as text: it is parsed only when tracing is on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceParent {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl TraceParent {
    /// No caller context: the run starts a new trace.
    pub fn none() -> Self {
        Self::default()
    }

    /// From `traceparent` (and `tracestate`) text, as sent.
    pub fn new(traceparent: impl Into<String>, tracestate: Option<String>) -> Self {
        Self {
            traceparent: Some(traceparent.into()),
            tracestate,
        }
    }

    /// From the `traceparent` and `tracestate` headers of a request.
    pub fn from_headers(headers: &axum::http::HeaderMap) -> Self {
        let text = |name| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        Self {
            traceparent: text(TRACEPARENT),
            tracestate: text(TRACESTATE),
        }
    }

    /// From an MCP request's `_meta` (`traceparent`, `tracestate`).
    pub fn from_meta(meta: &Map<String, Value>) -> Self {
        let text = |key| meta.get(key).and_then(Value::as_str).map(str::to_owned);
        Self {
            traceparent: text(TRACEPARENT),
            tracestate: text(TRACESTATE),
        }
    }

    /// The remote context; `None` when absent or malformed (a malformed
    /// `traceparent` is ignored, as the W3C spec asks).
    fn context(&self) -> Option<opentelemetry::Context> {
        use opentelemetry::trace::TraceContextExt;
        let traceparent = self.traceparent.as_ref()?;
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert(TRACEPARENT.to_owned(), traceparent.clone());
        if let Some(state) = &self.tracestate {
            carrier.insert(TRACESTATE.to_owned(), state.clone());
        }
        let cx = TraceContextPropagator::new().extract(&carrier);
        cx.span().span_context().is_valid().then_some(cx)
    }
}

/// The root span of one run of `workflow`: a child of `parent` when the
/// caller sent one, else the root of a new trace.
pub(crate) fn run_span(workflow: &str, run_id: &str, parent: &TraceParent) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        parent: None,
        "run",
        wf.workflow = workflow,
        wf.run_id = run_id,
        wf.resumed = tracing::field::Empty,
        wf.status = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    );
    if !span.is_disabled()
        && let Some(cx) = parent.context()
    {
        // Only fails when no OpenTelemetry layer is installed: then nothing
        // is exported anyway.
        let _ = span.set_parent(cx);
    }
    span
}

/// A step of the run whose span is `run`.
pub(crate) fn step_span(run: &Span, step: &str, attempt: u32) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: run,
        "step",
        wf.step = step,
        wf.attempt = attempt,
        wf.status = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
}

/// One capability call a node made during the step whose span is `step`
/// (a root span when the node runs outside a workflow).
pub(crate) fn call_span(step: &Span, kind: &'static str, connection: &str, name: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: step,
        "call",
        otel.kind = "client",
        wf.kind = kind,
        wf.connection = connection,
        wf.tool = name,
        wf.outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
}

/// Records how a run or step ended: `status` as `wf.status`, and an error
/// status (with `error`) unless it `ok`.
pub(crate) fn record_status(span: &Span, status: &str, ok: bool, error: Option<&str>) {
    if span.is_disabled() {
        return;
    }
    span.record("wf.status", status);
    span.record("otel.status_code", if ok { "OK" } else { "ERROR" });
    if let Some(error) = error {
        span.record("otel.status_description", &*crate::secrets::redact(error));
    }
}

/// Records a call's outcome: `ok`, or the error's code with its message.
pub(crate) fn record_outcome(span: &Span, error: Option<(&str, &str)>) {
    if span.is_disabled() {
        return;
    }
    match error {
        None => {
            span.record("wf.outcome", "ok");
        }
        Some((code, message)) => {
            span.record("wf.outcome", code);
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_description", &*crate::secrets::redact(message));
        }
    }
}

/// Adds `span`'s context to a request's `_meta` as `traceparent` (and
/// `tracestate`), so the server can continue the trace. Adds nothing when the
/// span is not exported.
pub(crate) fn inject(span: &Span, meta: &mut Map<String, Value>) {
    if span.is_disabled() {
        return;
    }
    let mut carrier = HashMap::with_capacity(2);
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    for (key, value) in carrier {
        meta.insert(key, Value::String(value));
    }
}

/// `span`'s context as `traceparent` text, when it is exported.
pub(crate) fn traceparent(span: &Span) -> Option<String> {
    let mut meta = Map::new();
    inject(span, &mut meta);
    match meta.remove(TRACEPARENT) {
        Some(Value::String(text)) => Some(text),
        _ => None,
    }
}

/// Links `span` to the span whose context `traceparent` is (a resumed run to
/// the run span of the process that started it).
pub(crate) fn link(span: &Span, traceparent: &str) {
    use opentelemetry::trace::TraceContextExt;
    if span.is_disabled() {
        return;
    }
    if let Some(cx) = TraceParent::new(traceparent, None).context() {
        span.add_link(cx.span().span_context().clone());
    }
}

/// The OTLP/HTTP traces URL, or `None` when tracing is off.
///
/// `flag` (`--otlp-endpoint`) wins over the environment; like
/// `OTEL_EXPORTER_OTLP_ENDPOINT` it is a base URL that gets `/v1/traces`
/// appended (unless it already ends so). `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
/// is used as it is. `OTEL_SDK_DISABLED=true` turns tracing off whatever else
/// is set.
pub fn endpoint(flag: Option<&str>) -> Option<String> {
    resolve_endpoint(flag, |name| std::env::var(name).ok())
}

fn resolve_endpoint(flag: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let set = |name| env(name).filter(|v| !v.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return None;
    }
    let base = |url: &str| {
        let url = url.trim().trim_end_matches('/');
        if url.ends_with(TRACES_PATH) {
            url.to_owned()
        } else {
            format!("{url}{TRACES_PATH}")
        }
    };
    if let Some(flag) = flag.filter(|f| !f.trim().is_empty()) {
        return Some(base(flag));
    }
    if let Some(url) = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Some(url.trim().to_owned());
    }
    set("OTEL_EXPORTER_OTLP_ENDPOINT").map(|url| base(&url))
}

/// Why the exporter could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to `{endpoint}`: {detail}")]
pub struct ExporterError {
    endpoint: String,
    detail: String,
}

/// A tracer provider that sends spans in batches to `endpoint` over
/// OTLP/HTTP with protobuf. The batches are sent from the provider's own
/// thread; the usual `OTEL_BSP_*` variables tune them, `OTEL_SERVICE_NAME`
/// names the service (`wf-host` by default). Call `shutdown` on it before the
/// process exits, or the last batch is lost.
///
/// # Errors
/// [`ExporterError`] when the URL is not one or the HTTP client cannot be
/// built.
pub fn provider(endpoint: &str) -> Result<SdkTracerProvider, ExporterError> {
    use opentelemetry_otlp::WithExportConfig;
    let failed = |detail: String| ExporterError {
        endpoint: endpoint.to_owned(),
        detail,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| failed(e.to_string()))?;
    Ok(SdkTracerProvider::builder()
        .with_resource(resource())
        .with_batch_exporter(exporter)
        .build())
}

/// The SDK's resource (from `OTEL_SERVICE_NAME` and
/// `OTEL_RESOURCE_ATTRIBUTES`), named `wf-host` unless those name it.
fn resource() -> opentelemetry_sdk::Resource {
    use opentelemetry_sdk::Resource;
    let detected = Resource::builder().build();
    let unnamed = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_none_or(|name| name.as_str().starts_with("unknown_service"));
    let builder = if unnamed {
        Resource::builder().with_service_name("wf-host")
    } else {
        Resource::builder()
    };
    builder
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build()
}

/// The process's subscriber: log lines to `writer`, filtered by `filter`,
/// and with `tracer` the exporting [`layer`] as well.
///
/// Without a tracer no layer is added at all, rather than a `None` one: a
/// `None` layer counts as interested in every callsite, so each run, step and
/// call span (`info`, a level the default filter allows for node logs) would
/// be built in the registry and entered on every poll, only for the log
/// filter to drop it.
pub fn subscriber<W>(
    filter: tracing_subscriber::EnvFilter,
    writer: W,
    ansi: bool,
    tracer: Option<&SdkTracerProvider>,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::prelude::*;
    // Known secrets never reach the log, whatever a message holds.
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(crate::secrets::RedactingMakeWriter(writer))
        .with_ansi(ansi)
        .with_target(false)
        .with_filter(filter);
    let registry = tracing_subscriber::registry().with(logs);
    match tracer {
        Some(tracer) => Box::new(registry.with(layer(tracer))),
        None => Box::new(registry),
    }
}

/// The layer that exports this module's spans through `provider`, and node
/// logs (info and up) as events of the step span they happened in. It sees
/// nothing else, so neither the exporter's own logs nor other spans reach it.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("wf-host"))
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_filter(
            Targets::new()
                .with_target(TARGET, tracing::Level::INFO)
                .with_target("wf_host::node", tracing::Level::INFO),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    /// Log lines captured in memory.
    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    fn default_filter() -> tracing_subscriber::EnvFilter {
        tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER)
    }

    /// One test for both cases, one after the other: `tracing` caches each
    /// callsite's interest across every live subscriber, so a subscriber
    /// with a tracer in a parallel test could make this one's spans live.
    #[test]
    fn spans_are_built_only_with_a_tracer_and_node_logs_print_without_one() {
        let lines = Lines::default();
        let writer = lines.clone();
        let logs_only = subscriber(default_filter(), move || writer.clone(), false, None);
        tracing::subscriber::with_default(logs_only, || {
            let run = run_span("wf", "run-1", &TraceParent::none());
            assert!(run.is_disabled(), "a run span with nothing to export it");
            let step = step_span(&run, "a", 1);
            assert!(step.is_disabled(), "a step span with nothing to export it");
            let runtime_span = tracing::info_span!("run", run = "run-1", node = "echo");
            assert!(
                runtime_span.is_disabled(),
                "an info span the logs filter out"
            );
            tracing::info!(target: "wf_host::node", parent: &step, run = "run-1", node = "echo", "hello from the node");
        });
        let text = lines.text();
        assert!(
            text.contains(r#"INFO hello from the node run="run-1" node="echo""#),
            "logged: {text}"
        );

        let provider = SdkTracerProvider::builder().build();
        let traced = subscriber(default_filter(), std::io::sink, false, Some(&provider));
        tracing::subscriber::with_default(traced, || {
            let run = run_span("wf", "run-1", &TraceParent::none());
            assert!(!run.is_disabled(), "the exporter wants run spans");
            assert!(!step_span(&run, "a", 1).is_disabled());
        });
        let _ = provider.shutdown();
    }

    #[test]
    fn endpoint_is_off_without_flag_or_variables() {
        assert_eq!(resolve_endpoint(None, env(&[])), None);
        assert_eq!(resolve_endpoint(Some(" "), env(&[])), None);
    }

    #[test]
    fn flag_is_a_base_url_and_wins_over_the_environment() {
        let vars = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318")];
        for flag in [
            "http://127.0.0.1:4318",
            "http://127.0.0.1:4318/",
            "http://127.0.0.1:4318/v1/traces",
        ] {
            assert_eq!(
                resolve_endpoint(Some(flag), env(&vars)).as_deref(),
                Some("http://127.0.0.1:4318/v1/traces")
            );
        }
    }

    #[test]
    fn variables_follow_the_otlp_rules() {
        let both = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318/"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:9/x"),
        ];
        assert_eq!(
            resolve_endpoint(None, env(&both)).as_deref(),
            Some("http://traces:9/x")
        );
        assert_eq!(
            resolve_endpoint(None, env(&both[..1])).as_deref(),
            Some("http://base:4318/v1/traces")
        );
    }

    #[test]
    fn sdk_disabled_wins() {
        let vars = [("OTEL_SDK_DISABLED", "TRUE")];
        assert_eq!(resolve_endpoint(Some("http://x:1"), env(&vars)), None);
        let vars = [
            ("OTEL_SDK_DISABLED", "false"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:1"),
        ];
        assert!(resolve_endpoint(None, env(&vars)).is_some());
    }

    #[test]
    fn malformed_traceparent_is_ignored() {
        assert!(TraceParent::new("nonsense", None).context().is_none());
        assert!(TraceParent::none().context().is_none());
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert!(TraceParent::new(tp, None).context().is_some());
    }
}
