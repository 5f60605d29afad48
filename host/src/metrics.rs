//! Prometheus metrics, served by `wf-host serve` at `GET /metrics` in the
//! Prometheus text format (version 0.0.4).
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `wf_runs_total` | `workflow`, `status` | runs finished (`succeeded`, `failed`, `cancelled`) |
//! | `wf_runs_running` | | runs executing now |
//! | `wf_state_degraded` | | 1 while the state cannot be written (its disk is full, the database refuses writes or cannot be reached; `/healthz` says degraded) |
//! | `wf_runs_waiting` | | of those, runs waiting (a durable sleep, a signal) |
//! | `wf_runs_asleep` | | runs asleep in the state until their wake time, driven by no process (every worker's, from the state at scrape time) |
//! | `wf_starts_refused_total` | `reason` | starts refused: `busy` (`max_live_runs`), `disk_full`, `state_unavailable` |
//! | `wf_store_errors_total` | `kind` | writes to the state that failed: `disk_full`, `unavailable` (the database away), `other` |
//! | `wf_runs_live` | `workflow`, `definition` | unfinished runs (queued, running, paused) on each definition of their workflow (its hash), from the state at scrape time |
//! | `wf_runs_queued` | `workflow` | runs `queued` by the workflow's `concurrency` or `rate` (every worker's, as the last admission pass found them) |
//! | `wf_workflow_paused` | `workflow` | 1 while the workflow is paused as a whole (`workflow.pause {workflow}`), as this process last set or read it |
//! | `wf_schedule_fires_total` | `workflow`, `schedule` | runs started by a schedule's tick (`skipped` ticks apart) |
//! | `wf_schedule_skips_total` | `workflow`, `schedule` | ticks that started no run (`overlap = "skip"`, missed, or the workflow paused) |
//! | `wf_webhook_requests_total` | `workflow`, `status` | `POST /hooks/…` requests, by HTTP status |
//! | `wf_step_duration_seconds` | `workflow`, `step` | histogram of step run times, all attempts |
//! | `wf_capability_calls_total` | `connection`, `outcome` | tool calls: `ok`, `tool_error`, `refused`, `timeout`, `unavailable`, `server_error` |
//! | `wf_capability_call_duration_seconds` | `connection` | histogram of tool call times |
//! | `wf_pool_sessions_opened_total` | `connection` | MCP sessions opened (`initialize` handshakes) |
//! | `wf_pool_connection_up` | `connection` | 1 while the connection has a live session |
//! | `wf_pool_queued` | `connection` | requests waiting for a turn under `max_in_flight` or `rate` |
//!
//! The counters live for the process; the gauges are read at scrape time.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// The process's metrics.
pub struct Metrics {
    registry: Registry,
    runs: Family<Labels, Counter>,
    runs_running: Gauge,
    state_degraded: Gauge,
    runs_waiting: Gauge,
    runs_asleep: Gauge,
    starts_refused: Family<Labels, Counter>,
    store_errors: Family<Labels, Counter>,
    runs_queued: Family<Labels, Gauge>,
    workflow_paused: Family<Labels, Gauge>,
    runs_live: Family<Labels, Gauge>,
    step_duration: Histograms,
    calls: Family<Labels, Counter>,
    call_duration: Histograms,
    sessions_opened: Family<Labels, Counter>,
    connection_up: Family<Labels, Gauge>,
    queued: Family<Labels, Gauge>,
    schedule_fires: Family<Labels, Counter>,
    schedule_skips: Family<Labels, Counter>,
    webhook_requests: Family<Labels, Counter>,
}

/// 1 ms to about 65 s, doubling.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Why a start may be refused: the host drives `max_live_runs` already, the
/// state's disk is full, the state (a database) cannot be reached.
pub const REFUSALS: &[&str] = &["busy", "disk_full", "state_unavailable"];
/// The kinds of failed writes to the state.
pub const STORE_ERRORS: &[&str] = &["disk_full", "unavailable", "other"];

/// The counter of each of `values` of `label` in `family` (created at 0
/// where missing, so it shows in `/metrics`).
fn by_label(
    family: &Family<Labels, Counter>,
    label: &'static str,
    values: &[&'static str],
) -> std::collections::BTreeMap<&'static str, u64> {
    values
        .iter()
        .map(|v| {
            let n = family.get_or_create(&vec![(label, (*v).to_owned())]).get();
            (*v, n)
        })
        .collect()
}

/// The metrics of this process.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::default();
        let runs = Family::<Labels, Counter>::default();
        registry.register("wf_runs", "Workflow runs finished, by status", runs.clone());
        let state_degraded = Gauge::default();
        registry.register(
            "wf_state_degraded",
            "1 while the state cannot be written (its disk is full, or the database refuses writes or cannot be reached)",
            state_degraded.clone(),
        );
        let runs_running = Gauge::default();
        registry.register(
            "wf_runs_running",
            "Workflow runs executing now",
            runs_running.clone(),
        );
        let runs_waiting = Gauge::default();
        registry.register(
            "wf_runs_waiting",
            "Workflow runs of this process waiting (a durable sleep), holding no step slot",
            runs_waiting.clone(),
        );
        let runs_asleep = Gauge::default();
        registry.register(
            "wf_runs_asleep",
            "Workflow runs asleep in the state until their wake time, driven by no process",
            runs_asleep.clone(),
        );
        let starts_refused = Family::<Labels, Counter>::default();
        registry.register(
            "wf_starts_refused",
            "Run starts refused by the host, by reason",
            starts_refused.clone(),
        );
        let store_errors = Family::<Labels, Counter>::default();
        registry.register(
            "wf_store_errors",
            "Writes to the state that failed, by kind",
            store_errors.clone(),
        );
        // Every reason and kind shows from the start, at 0.
        by_label(&starts_refused, "reason", REFUSALS);
        by_label(&store_errors, "kind", STORE_ERRORS);
        let runs_live = Family::<Labels, Gauge>::default();
        registry.register(
            "wf_runs_live",
            "Unfinished workflow runs on each definition of their workflow",
            runs_live.clone(),
        );
        let runs_queued = Family::<Labels, Gauge>::default();
        registry.register(
            "wf_runs_queued",
            "Workflow runs queued by their workflow's concurrency or rate, as the last admission pass found them",
            runs_queued.clone(),
        );
        let workflow_paused = Family::<Labels, Gauge>::default();
        registry.register(
            "wf_workflow_paused",
            "1 while the workflow is paused as a whole",
            workflow_paused.clone(),
        );
        let step_duration: Histograms = Family::new_with_constructor(duration_histogram);
        registry.register(
            "wf_step_duration_seconds",
            "How long workflow steps took, every attempt included",
            step_duration.clone(),
        );
        let calls = Family::<Labels, Counter>::default();
        registry.register(
            "wf_capability_calls",
            "Tool calls through the pool, by outcome",
            calls.clone(),
        );
        let call_duration: Histograms = Family::new_with_constructor(duration_histogram);
        registry.register(
            "wf_capability_call_duration_seconds",
            "How long tool calls through the pool took",
            call_duration.clone(),
        );
        let sessions_opened = Family::<Labels, Counter>::default();
        registry.register(
            "wf_pool_sessions_opened",
            "MCP sessions opened (initialize handshakes completed)",
            sessions_opened.clone(),
        );
        let connection_up = Family::<Labels, Gauge>::default();
        registry.register(
            "wf_pool_connection_up",
            "1 while the connection has a live MCP session, else 0",
            connection_up.clone(),
        );
        let queued = Family::<Labels, Gauge>::default();
        registry.register(
            "wf_pool_queued",
            "Requests waiting for a turn under the connection's max_in_flight or rate",
            queued.clone(),
        );
        let schedule_fires = Family::<Labels, Counter>::default();
        registry.register(
            "wf_schedule_fires",
            "Runs started by a schedule's tick",
            schedule_fires.clone(),
        );
        let schedule_skips = Family::<Labels, Counter>::default();
        registry.register(
            "wf_schedule_skips",
            "Schedule ticks that started no run (overlap skip, or missed while down)",
            schedule_skips.clone(),
        );
        let webhook_requests = Family::<Labels, Counter>::default();
        registry.register(
            "wf_webhook_requests",
            "Webhook requests, by HTTP status",
            webhook_requests.clone(),
        );
        Metrics {
            queued,
            schedule_fires,
            schedule_skips,
            webhook_requests,
            registry,
            runs,
            runs_running,
            state_degraded,
            runs_waiting,
            runs_asleep,
            starts_refused,
            store_errors,
            runs_queued,
            workflow_paused,
            runs_live,
            step_duration,
            calls,
            call_duration,
            sessions_opened,
            connection_up,
        }
    }

    /// How many runs of `workflow` wait `queued` (set by each admission pass).
    pub fn workflow_paused(&self, workflow: &str, paused: bool) {
        self.workflow_paused
            .get_or_create(&vec![("workflow", workflow.to_owned())])
            .set(i64::from(paused));
    }

    pub fn runs_queued(&self, workflow: &str, count: i64) {
        self.runs_queued
            .get_or_create(&vec![("workflow", workflow.to_owned())])
            .set(count);
    }

    pub fn run_finished(&self, workflow: &str, status: &str) {
        self.runs
            .get_or_create(&vec![
                ("workflow", workflow.to_owned()),
                ("status", status.to_owned()),
            ])
            .inc();
    }

    pub fn step_finished(&self, workflow: &str, step: &str, took: Duration) {
        self.step_duration
            .get_or_create(&vec![
                ("workflow", workflow.to_owned()),
                ("step", step.to_owned()),
            ])
            .observe(took.as_secs_f64());
    }

    pub fn call_finished(&self, connection: &str, outcome: &'static str, took: Duration) {
        self.calls
            .get_or_create(&vec![
                ("connection", connection.to_owned()),
                ("outcome", outcome.to_owned()),
            ])
            .inc();
        self.call_duration
            .get_or_create(&vec![("connection", connection.to_owned())])
            .observe(took.as_secs_f64());
    }

    pub fn schedule_fired(&self, workflow: &str, schedule: &str) {
        self.schedule_fires
            .get_or_create(&vec![
                ("workflow", workflow.to_owned()),
                ("schedule", schedule.to_owned()),
            ])
            .inc();
    }

    pub fn schedule_skipped(&self, workflow: &str, schedule: &str) {
        self.schedule_skips
            .get_or_create(&vec![
                ("workflow", workflow.to_owned()),
                ("schedule", schedule.to_owned()),
            ])
            .inc();
    }

    pub fn webhook_request(&self, workflow: &str, status: u16) {
        self.webhook_requests
            .get_or_create(&vec![
                ("workflow", workflow.to_owned()),
                ("status", status.to_string()),
            ])
            .inc();
    }

    /// A start the host refused (one of [`REFUSALS`]).
    pub fn start_refused(&self, reason: &'static str) {
        self.starts_refused
            .get_or_create(&vec![("reason", reason.to_owned())])
            .inc();
    }

    /// A write to the state that failed, by its kind (one of
    /// [`STORE_ERRORS`]; `None`, no failure of the state, is not counted).
    pub fn store_error(&self, kind: Option<&'static str>) {
        if let Some(kind) = kind {
            self.store_errors
                .get_or_create(&vec![("kind", kind.to_owned())])
                .inc();
        }
    }

    /// Starts refused so far, by reason, for `host.status`.
    pub fn refusals(&self) -> std::collections::BTreeMap<&'static str, u64> {
        by_label(&self.starts_refused, "reason", REFUSALS)
    }

    /// Failed writes to the state so far, by kind, for `host.status`.
    pub fn store_errors(&self) -> std::collections::BTreeMap<&'static str, u64> {
        by_label(&self.store_errors, "kind", STORE_ERRORS)
    }

    pub fn session_opened(&self, connection: &str) {
        self.sessions_opened
            .get_or_create(&vec![("connection", connection.to_owned())])
            .inc();
    }

    /// The text to serve, with the gauges set from `connections` (id, up,
    /// queued), `running` and `waiting` first.
    pub fn render(
        &self,
        connections: &[(String, bool, u64)],
        running: usize,
        waiting: usize,
        live: &[(String, String, u64)],
        degraded: bool,
        asleep: Option<u64>,
    ) -> String {
        self.state_degraded.set(i64::from(degraded));
        if let Some(asleep) = asleep {
            self.runs_asleep
                .set(i64::try_from(asleep).unwrap_or(i64::MAX));
        }
        // Only the definitions with live runs now: one whose runs ended goes.
        self.runs_live.clear();
        for (workflow, definition, runs) in live {
            self.runs_live
                .get_or_create(&vec![
                    ("workflow", workflow.clone()),
                    ("definition", definition.clone()),
                ])
                .set(i64::try_from(*runs).unwrap_or(i64::MAX));
        }
        for (id, up, queued) in connections {
            self.connection_up
                .get_or_create(&vec![("connection", id.clone())])
                .set(i64::from(*up));
            self.queued
                .get_or_create(&vec![("connection", id.clone())])
                .set(i64::try_from(*queued).unwrap_or(i64::MAX));
        }
        self.runs_running
            .set(i64::try_from(running).unwrap_or(i64::MAX));
        self.runs_waiting
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry);
        text
    }
}
