//! Workflow definitions: the config's TOML turned into a checked graph of
//! steps, with every jq expression compiled once.
//!
//! A definition has two forms. [`Spec`] is plain data, resolved against the
//! config file (absolute component paths, their content hashes, every default
//! filled in); it is what a run stores, so a run always continues on the graph
//! and the code it started with. [`Definition`] is a spec compiled: jq
//! expressions, grants and the input schema, ready for the engine.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::expr::{CompileError, Expr};
pub use super::flow::{ConcurrencySpec, RateSpec};
use crate::config::{Config, RetryConfig, StepConfig, WorkflowConfig};
use crate::grants::Grants;
use crate::runtime::Limits;

/// Why a workflow definition was refused.
#[derive(Debug, thiserror::Error)]
pub enum DefinitionError {
    #[error("workflow `{workflow}`: {message}")]
    Workflow { workflow: String, message: String },
    #[error("workflow `{workflow}`, step `{step}`: {message}")]
    Step {
        workflow: String,
        step: String,
        message: String,
    },
}

/// Retry policy of a step, defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_ms: u64,
    pub max_ms: u64,
    pub multiplier: f64,
    pub on: Vec<String>,
}

impl Default for RetryPolicy {
    /// One attempt: no retry.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 1,
            initial_ms: 200,
            max_ms: 10_000,
            multiplier: 2.0,
            on: vec!["unavailable".into(), "timeout".into()],
        }
    }
}

impl RetryPolicy {
    fn from_config(c: &RetryConfig) -> Result<Self, String> {
        let d = RetryPolicy::default();
        let p = RetryPolicy {
            max_attempts: c.max_attempts.unwrap_or(3),
            initial_ms: c.initial.map_or(d.initial_ms, |t| t.as_millis() as u64),
            max_ms: c.max.map_or(d.max_ms, |t| t.as_millis() as u64),
            multiplier: c.multiplier.unwrap_or(d.multiplier),
            on: c.on.clone().unwrap_or(d.on),
        };
        if p.max_attempts == 0 {
            return Err("`retry.max_attempts` must be at least 1".into());
        }
        if !(p.multiplier.is_finite() && p.multiplier >= 1.0) {
            return Err("`retry.multiplier` must be a number ≥ 1".into());
        }
        if p.max_ms < p.initial_ms {
            return Err("`retry.max` must not be less than `retry.initial`".into());
        }
        Ok(p)
    }

    /// Whether a failure with `code` after `attempt` (from 1) is tried again.
    pub fn retries(&self, code: &str, attempt: u32) -> bool {
        attempt < self.max_attempts && self.on.iter().any(|c| c == code)
    }

    /// The delay before attempt `attempt + 1`: exponential, capped, with
    /// jitter in its upper half so retries of many runs spread out.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = self.multiplier.powi(attempt.saturating_sub(1) as i32);
        let ms = (self.initial_ms as f64 * exp).min(self.max_ms as f64);
        let jitter = rand::random::<f64>() * 0.5 + 0.5;
        Duration::from_millis((ms * jitter) as u64)
    }
}

/// One step as data. Fields added later must default, so that runs stored
/// by an older version still load.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepSpec {
    pub id: String,
    pub component: PathBuf,
    /// sha256 of the component's bytes, hex.
    pub component_hash: String,
    pub allow: Vec<String>,
    pub needs: Vec<String>,
    pub input: Option<String>,
    pub condition: Option<String>,
    pub for_each: Option<String>,
    pub concurrency: usize,
    pub timeout_ms: u64,
    pub max_memory: u64,
    pub retry: RetryPolicy,
    /// A sleep step: how long it sleeps (no component).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sleep_ms: Option<u64>,
    /// A sleep step: jq over `{input, steps}` giving the RFC 3339 time it
    /// sleeps until (no component).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// A wait step: the signal it waits for (no component).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait: Option<String>,
    /// A wait step: JSON Schema of the signal's payload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// A wait step: how long it waits before it fails `timeout`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_timeout_ms: Option<u64>,
    /// A child step: the workflow it runs as a child run (no component).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// The node that undoes this step when its run fails or is cancelled
    /// after it succeeded; its id is [`compensation_id`] of this one's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compensate: Option<Box<StepSpec>>,
}

impl StepSpec {
    /// Whether the step is a durable sleep, not a node.
    pub fn sleeps(&self) -> bool {
        self.sleep_ms.is_some() || self.until.is_some()
    }

    /// Whether the step waits for a signal, not a node.
    pub fn waits(&self) -> bool {
        self.wait.is_some()
    }

    /// Whether the step runs a child workflow, not a node.
    pub fn runs_child(&self) -> bool {
        self.workflow.is_some()
    }

    /// Whether the step runs a node (it neither sleeps, waits nor runs a
    /// child).
    pub fn runs_node(&self) -> bool {
        !self.sleeps() && !self.waits() && !self.runs_child()
    }
}

/// A whole workflow as data: what a run stores.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Spec {
    pub input_schema: Option<Value>,
    pub output: Option<String>,
    pub timeout_ms: Option<u64>,
    pub steps: Vec<StepSpec>,
    /// Fields whose values are never written in step inputs or journaled
    /// calls (`"[redacted]"` instead), at any depth.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub redact: Vec<String>,
    /// Flow control: at most `limit` runs per key at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencySpec>,
    /// Flow control: at most `limit` runs per key begin per `period_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateSpec>,
    /// Flow control: jq over the input, an integer; higher is admitted first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// Starts with the same key within `period_ms` make one run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debounce: Option<DebounceSpec>,
}

/// `debounce` of a workflow, as a run stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DebounceSpec {
    /// jq over the input; `None`: one key for the whole workflow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub period_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
}

impl Spec {
    /// Resolves `[workflows.<name>]` against `config`: paths, hashes, defaults.
    ///
    /// # Errors
    /// A [`DefinitionError`] naming the workflow and step.
    pub fn from_config(
        name: &str,
        w: &WorkflowConfig,
        config: &Config,
        defaults: Limits,
    ) -> Result<Spec, DefinitionError> {
        let wf_err = |message: String| DefinitionError::Workflow {
            workflow: name.to_owned(),
            message,
        };
        let one_node;
        let (steps, run_timeout): (&[StepConfig], Option<Duration>) = match (
            &w.component,
            w.steps.is_empty(),
        ) {
            (Some(_), false) => {
                return Err(wf_err(
                    "sets both `component` (one node) and `steps` (a graph); pick one".into(),
                ));
            }
            (None, true) => {
                return Err(wf_err(
                    "needs `component` (one node) or `[[workflows.NAME.steps]]`".into(),
                ));
            }
            (Some(component), true) => {
                // The one-node form is a one-step graph; its limits are the node's.
                one_node = [StepConfig {
                    id: "main".into(),
                    component: component.clone(),
                    allow: w.allow.clone(),
                    timeout: w.timeout,
                    max_memory: w.max_memory,
                    retry: w.retry.clone(),
                    ..StepConfig::default()
                }];
                (&one_node, None)
            }
            (None, false) => {
                if !w.allow.is_empty() || w.max_memory.is_some() || w.retry.is_some() {
                    return Err(wf_err(
                            "`allow`, `max_memory` and `retry` belong on each step when the workflow has `steps`".into(),
                        ));
                }
                (&w.steps, w.timeout)
            }
        };
        let mut specs = Vec::with_capacity(steps.len());
        for s in steps {
            let step_err = |message: String| DefinitionError::Step {
                workflow: name.to_owned(),
                step: s.id.clone(),
                message,
            };
            if s.sleep.is_some() || s.until.is_some() || s.wait.is_some() || s.workflow.is_some() {
                let mut spec = nodeless_spec(s).map_err(step_err)?;
                spec.compensate = compensation(s, config, defaults).map_err(step_err)?;
                specs.push(spec);
                continue;
            }
            if s.schema.is_some() {
                return Err(step_err("`schema` is for a `wait` step".into()));
            }
            if s.component.as_os_str().is_empty() {
                return Err(step_err(
                    "needs `component` (a node), `sleep` or `until` (a durable sleep), `wait` (a signal), or `workflow` (a child run)".into(),
                ));
            }
            let concurrency = s.concurrency.unwrap_or(1);
            if concurrency == 0 {
                return Err(step_err("`concurrency` must be at least 1".into()));
            }
            if s.concurrency.is_some() && s.for_each.is_none() {
                return Err(step_err(
                    "`concurrency` only applies to a step with `for_each`".into(),
                ));
            }
            let node = NodeConfig {
                component: &s.component,
                allow: &s.allow,
                timeout: s.timeout,
                max_memory: s.max_memory,
                retry: s.retry.as_ref(),
            };
            let mut spec = node_spec(&s.id, &node, config, defaults).map_err(step_err)?;
            spec.needs = s.needs.clone();
            spec.input = s.input.clone();
            spec.condition = s.condition.clone();
            spec.for_each = s.for_each.clone();
            spec.concurrency = concurrency;
            spec.compensate = compensation(s, config, defaults).map_err(step_err)?;
            specs.push(spec);
        }
        if run_timeout.is_some_and(|t| t.is_zero()) {
            return Err(wf_err("`timeout` must be more than 0".into()));
        }
        if w.concurrency.as_ref().is_some_and(|c| c.limit == 0) {
            return Err(wf_err("`concurrency.limit` must be at least 1".into()));
        }
        if let Some(rate) = &w.rate {
            if rate.limit == 0 {
                return Err(wf_err("`rate.limit` must be at least 1".into()));
            }
            if rate.period.as_millis() < 1 {
                return Err(wf_err("`rate.period` must be at least 1ms".into()));
            }
        }
        if w.priority.is_some() && w.concurrency.is_none() && w.rate.is_none() {
            return Err(wf_err(
                "`priority` orders runs queued by `concurrency` or `rate`; set one of them".into(),
            ));
        }
        Ok(Spec {
            input_schema: w.input_schema.clone(),
            output: w.output.clone(),
            timeout_ms: run_timeout.map(|t| t.as_millis() as u64),
            steps: specs,
            redact: w.redact.clone(),
            concurrency: w.concurrency.as_ref().map(|c| ConcurrencySpec {
                key: c.key.clone(),
                limit: c.limit,
            }),
            rate: w.rate.as_ref().map(|r| RateSpec {
                key: r.key.clone(),
                limit: r.limit,
                period_ms: u64::try_from(r.period.as_millis()).unwrap_or(u64::MAX),
            }),
            priority: w.priority.clone(),
            debounce: w
                .debounce
                .as_ref()
                .map(|d| {
                    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                    if d.period.as_millis() < 1 {
                        return Err(wf_err("`debounce.period` must be at least 1ms".into()));
                    }
                    if d.max_wait.is_some_and(|m| m < d.period) {
                        return Err(wf_err(
                            "`debounce.max_wait` must not be less than `debounce.period`".into(),
                        ));
                    }
                    Ok(DebounceSpec {
                        key: d.key.clone(),
                        period_ms: ms(d.period),
                        max_wait_ms: d.max_wait.map(ms),
                    })
                })
                .transpose()?,
        })
    }

    /// A stable hash of the whole spec, hex.
    pub fn hash(&self) -> String {
        content_hash(
            serde_json::to_string(self)
                .expect("a spec is plain data")
                .as_bytes(),
        )
    }
}

/// What a node needs, from a step or its `compensate`.
struct NodeConfig<'a> {
    component: &'a std::path::Path,
    allow: &'a [String],
    timeout: Option<Duration>,
    max_memory: Option<bytesize::ByteSize>,
    retry: Option<&'a RetryConfig>,
}

/// The spec of a node `id`: its component resolved and hashed, its limits
/// and retry policy with the defaults filled in.
fn node_spec(
    id: &str,
    node: &NodeConfig<'_>,
    config: &Config,
    defaults: Limits,
) -> Result<StepSpec, String> {
    let path = config.resolve(node.component);
    let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("component `{}` not found", path.display()),
        _ => format!("cannot read component `{}`: {e}", path.display()),
    })?;
    let retry = match node.retry {
        Some(r) => RetryPolicy::from_config(r)?,
        None => RetryPolicy::default(),
    };
    let timeout = node.timeout.unwrap_or(defaults.timeout);
    if timeout.is_zero() {
        return Err("`timeout` must be more than 0".into());
    }
    Ok(StepSpec {
        id: id.to_owned(),
        component: std::path::absolute(&path).unwrap_or(path),
        component_hash: content_hash(&bytes),
        allow: node.allow.to_vec(),
        concurrency: 1,
        timeout_ms: timeout.as_millis() as u64,
        max_memory: node.max_memory.map_or(defaults.max_memory, |m| m.as_u64()),
        retry,
        ..StepSpec::default()
    })
}

/// The id of the compensation of step `id`: no step id has a `.`.
pub fn compensation_id(id: &str) -> String {
    format!("{id}{COMPENSATION_SUFFIX}")
}

/// What ends the id of a compensation ([`compensation_id`]).
pub const COMPENSATION_SUFFIX: &str = ".compensate";

/// The step a compensation id undoes; `None` for a step's own id.
pub fn compensated_by(id: &str) -> Option<&str> {
    id.strip_suffix(COMPENSATION_SUFFIX)
}

/// A step's `compensate`, as the spec of its node.
fn compensation(
    s: &StepConfig,
    config: &Config,
    defaults: Limits,
) -> Result<Option<Box<StepSpec>>, String> {
    let Some(c) = &s.compensate else {
        return Ok(None);
    };
    if c.component.as_os_str().is_empty() {
        return Err("`compensate` needs `component`".into());
    }
    let node = NodeConfig {
        component: &c.component,
        allow: &c.allow,
        timeout: c.timeout,
        max_memory: c.max_memory,
        retry: c.retry.as_ref(),
    };
    let mut spec = node_spec(&compensation_id(&s.id), &node, config, defaults)
        .map_err(|e| format!("`compensate`: {e}"))?;
    spec.input = Some(
        c.input
            .clone()
            .unwrap_or_else(|| "{input, output}".to_owned()),
    );
    Ok(Some(Box::new(spec)))
}

/// A sleep step (`sleep` or `until`), a wait step (`wait`) or a child step
/// (`workflow`): no node, so nothing of a node's may be set (but a wait
/// step's `timeout`).
fn nodeless_spec(s: &StepConfig) -> Result<StepSpec, String> {
    let waits = s.wait.is_some();
    let what = if s.workflow.is_some() {
        "a child step (`workflow`)"
    } else if waits {
        "a wait step (`wait`)"
    } else {
        "a sleep step (`sleep` or `until`)"
    };
    if s.workflow.is_some() && (waits || s.sleep.is_some() || s.until.is_some()) {
        return Err("sets `workflow` and also `wait`, `sleep` or `until`; pick one".into());
    }
    let node_only = [
        ("component", !s.component.as_os_str().is_empty()),
        ("allow", !s.allow.is_empty()),
        ("for_each", s.for_each.is_some()),
        ("concurrency", s.concurrency.is_some()),
        ("timeout", s.timeout.is_some() && !waits),
        ("max_memory", s.max_memory.is_some()),
        ("retry", s.retry.is_some()),
        ("schema", s.schema.is_some() && !waits),
    ];
    if let Some((key, _)) = node_only.iter().find(|(_, set)| *set) {
        return Err(format!("{what} runs no node: remove `{key}`"));
    }
    if waits && (s.sleep.is_some() || s.until.is_some()) {
        return Err("sets both `wait` and a sleep (`sleep` or `until`); pick one".into());
    }
    if s.sleep.is_some() && s.until.is_some() {
        return Err("sets both `sleep` and `until`; pick one".into());
    }
    if let Some(signal) = &s.wait
        && (signal.is_empty()
            || signal.len() > 100
            || !signal
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "`wait = \"{signal}\"`: a signal name uses only letters, digits, `_`, `-` and `.` (at most 100)"
        ));
    }
    if let Some(schema) = &s.schema {
        jsonschema::validator_for(schema)
            .map_err(|e| format!("`schema` is not a valid JSON Schema: {e}"))?;
    }
    if s.timeout.is_some_and(|t| t.is_zero()) {
        return Err("`timeout` must be more than 0".into());
    }
    if s.compensate.is_some() && s.workflow.is_none() {
        return Err(format!(
            "{what} changes nothing outside the run: remove `compensate`"
        ));
    }
    Ok(StepSpec {
        workflow: s.workflow.clone(),
        wait: s.wait.clone(),
        schema: s.schema.clone(),
        wait_timeout_ms: s
            .timeout
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        id: s.id.clone(),
        needs: s.needs.clone(),
        input: s.input.clone(),
        condition: s.condition.clone(),
        concurrency: 1,
        sleep_ms: s
            .sleep
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        until: s.until.clone(),
        ..StepSpec::default()
    })
}

/// sha256 of `bytes`, hex.
pub fn content_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A compiled step.
#[derive(Debug, Clone)]
pub struct Step {
    pub spec: StepSpec,
    pub grants: Arc<Grants>,
    pub input: Option<Expr>,
    pub condition: Option<Expr>,
    pub for_each: Option<Expr>,
    /// A sleep step's `until`.
    pub until: Option<Expr>,
    /// A wait step's `schema`.
    pub schema: Option<Arc<jsonschema::Validator>>,
    pub limits: Limits,
}

impl Step {
    /// Whether the step starts the moment its run does, on the run's input
    /// as it is: it needs nothing and has no expression to evaluate first.
    /// Its start is then stored with the run, in the same write.
    pub fn starts_with_run(&self) -> bool {
        self.spec.needs.is_empty()
            && self.spec.runs_node()
            && self.input.is_none()
            && self.condition.is_none()
            && self.for_each.is_none()
    }
}

/// A compiled workflow.
#[derive(Clone)]
pub struct Definition {
    pub name: String,
    pub spec: Arc<Spec>,
    /// `spec` as JSON, as every run of it stores it.
    pub spec_json: Arc<serde_json::Value>,
    pub hash: String,
    /// In an order where every step comes after its needs.
    pub steps: Vec<Step>,
    pub output: Option<Expr>,
    pub input_schema: Option<Arc<jsonschema::Validator>>,
    pub timeout: Option<Duration>,
    /// Ids of the steps nothing depends on, in definition order.
    pub leaves: Vec<String>,
    /// `concurrency`, `rate` and `priority`, when the workflow has them.
    pub flow: Option<super::flow::FlowControl>,
    /// The compensations of the steps that have one, by their own id
    /// ([`compensation_id`]).
    pub compensations: HashMap<String, Step>,
    /// `debounce`'s key, compiled (`Some(None)`: one key for the workflow).
    pub debounce_key: Option<Option<Expr>>,
}

impl std::fmt::Debug for Definition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Definition")
            .field("name", &self.name)
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

impl Definition {
    /// Checks and compiles `spec`: ids, needs, cycles, jq, grants, schema.
    ///
    /// # Errors
    /// A [`DefinitionError`] naming the workflow, the step and the problem.
    pub fn compile(name: &str, spec: Spec) -> Result<Definition, DefinitionError> {
        let wf_err = |message: String| DefinitionError::Workflow {
            workflow: name.to_owned(),
            message,
        };
        let mut seen = HashSet::new();
        for s in &spec.steps {
            let step_err = |message: String| DefinitionError::Step {
                workflow: name.to_owned(),
                step: s.id.clone(),
                message,
            };
            if s.id.is_empty()
                || !s
                    .id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(wf_err(format!(
                    "step id `{}` must be non-empty and use only letters, digits, `_` and `-`",
                    s.id
                )));
            }
            if !seen.insert(s.id.as_str()) {
                return Err(step_err("duplicate step id".into()));
            }
        }
        for s in &spec.steps {
            for need in &s.needs {
                if !seen.contains(need.as_str()) {
                    return Err(DefinitionError::Step {
                        workflow: name.to_owned(),
                        step: s.id.clone(),
                        message: format!("`needs` names unknown step `{need}`"),
                    });
                }
                if need == &s.id {
                    return Err(DefinitionError::Step {
                        workflow: name.to_owned(),
                        step: s.id.clone(),
                        message: "a step cannot need itself".into(),
                    });
                }
            }
        }
        let order = topological_order(&spec.steps)
            .map_err(|cycle| wf_err(format!("the steps form a cycle: {}", cycle.join(" → "))))?;

        let mut steps = Vec::with_capacity(order.len());
        let mut compensations = HashMap::new();
        for index in order {
            let s = &spec.steps[index];
            steps.push(compile_step(name, s)?);
            if let Some(c) = &s.compensate {
                compensations.insert(c.id.clone(), compile_step(name, c)?);
            }
        }
        let output = compile_expr(name, "", "output", &spec.output)?;
        let input_schema = spec
            .input_schema
            .as_ref()
            .map(|schema| {
                jsonschema::validator_for(schema)
                    .map(Arc::new)
                    .map_err(|e| wf_err(format!("`input_schema` is not a valid JSON Schema: {e}")))
            })
            .transpose()?;
        let needed: HashSet<&str> = spec
            .steps
            .iter()
            .flat_map(|s| s.needs.iter().map(String::as_str))
            .collect();
        let leaves = spec
            .steps
            .iter()
            .filter(|s| !needed.contains(s.id.as_str()))
            .map(|s| s.id.clone())
            .collect();
        let flow = super::flow::FlowControl::compile(
            spec.concurrency.as_ref(),
            spec.rate.as_ref(),
            spec.priority.as_deref(),
        )
        .map_err(wf_err)?;
        let debounce_key = match &spec.debounce {
            Some(d) => Some(compile_expr(name, "", "debounce.key", &d.key)?),
            None => None,
        };
        Ok(Definition {
            flow,
            compensations,
            debounce_key,
            name: name.to_owned(),
            hash: spec.hash(),
            timeout: spec.timeout_ms.map(Duration::from_millis),
            spec_json: Arc::new(serde_json::to_value(&spec).expect("a spec is plain data")),
            spec: Arc::new(spec),
            steps,
            output,
            input_schema,
            leaves,
        })
    }

    /// Checks a signal's `payload` against the `schema` of wait step `step`.
    ///
    /// # Errors
    /// A message naming the field that breaks the schema.
    pub fn check_payload(step: &Step, payload: &Value) -> Result<(), String> {
        let Some(schema) = &step.schema else {
            return Ok(());
        };
        match schema.iter_errors(payload).next() {
            None => Ok(()),
            Some(e) => {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() {
                    "the payload".to_owned()
                } else {
                    format!("payload field `{at}`")
                };
                Err(format!(
                    "{at} does not match the `schema` of step `{}`: {e}",
                    step.spec.id
                ))
            }
        }
    }

    /// The step with `id`.
    /// The step with `id`, or the compensation with that id.
    pub fn step(&self, id: &str) -> Option<&Step> {
        self.steps
            .iter()
            .find(|s| s.spec.id == id)
            .or_else(|| self.compensations.get(id))
    }

    /// Checks `input` against `input_schema`.
    ///
    /// # Errors
    /// A message naming the field that breaks the schema.
    pub fn check_input(&self, input: &Value) -> Result<(), String> {
        let Some(schema) = &self.input_schema else {
            return Ok(());
        };
        match schema.iter_errors(input).next() {
            None => Ok(()),
            Some(e) => {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() {
                    "the input".to_owned()
                } else {
                    format!("input field `{at}`")
                };
                Err(format!("{at} does not match `input_schema`: {e}"))
            }
        }
    }
}

/// Compiles jq `source` of `what` (a step's when `step` is not empty).
fn compile_expr(
    workflow: &str,
    step: &str,
    what: &str,
    source: &Option<String>,
) -> Result<Option<Expr>, DefinitionError> {
    source
        .as_deref()
        .map(Expr::compile)
        .transpose()
        .map_err(|e: CompileError| {
            let message = format!("`{what}`: {e}");
            if step.is_empty() {
                DefinitionError::Workflow {
                    workflow: workflow.to_owned(),
                    message,
                }
            } else {
                DefinitionError::Step {
                    workflow: workflow.to_owned(),
                    step: step.to_owned(),
                    message,
                }
            }
        })
}

/// Compiles one step (or a compensation): its jq, grants and schema.
fn compile_step(workflow: &str, s: &StepSpec) -> Result<Step, DefinitionError> {
    let step_err = |message: String| DefinitionError::Step {
        workflow: workflow.to_owned(),
        step: s.id.clone(),
        message,
    };
    let grants = Grants::new(&s.allow).map_err(|e| step_err(e.to_string()))?;
    Ok(Step {
        input: compile_expr(workflow, &s.id, "input", &s.input)?,
        condition: compile_expr(workflow, &s.id, "if", &s.condition)?,
        for_each: compile_expr(workflow, &s.id, "for_each", &s.for_each)?,
        until: compile_expr(workflow, &s.id, "until", &s.until)?,
        schema: s
            .schema
            .as_ref()
            .map(|schema| {
                jsonschema::validator_for(schema)
                    .map(Arc::new)
                    .map_err(|e| step_err(format!("`schema` is not a valid JSON Schema: {e}")))
            })
            .transpose()?,
        grants: Arc::new(grants),
        limits: Limits {
            timeout: Duration::from_millis(s.timeout_ms),
            max_memory: s.max_memory,
        },
        spec: s.clone(),
    })
}

/// Indexes of `steps` with every step after its needs (Kahn's algorithm, ties
/// in definition order), or a cycle as ids, first repeated at the end.
fn topological_order(steps: &[StepSpec]) -> Result<Vec<usize>, Vec<String>> {
    let index: HashMap<&str, usize> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| (s.id.as_str(), i))
        .collect();
    let mut missing: Vec<usize> = steps.iter().map(|s| s.needs.len()).collect();
    let mut order = Vec::with_capacity(steps.len());
    let mut done = vec![false; steps.len()];
    while order.len() < steps.len() {
        let Some(next) = (0..steps.len()).find(|&i| !done[i] && missing[i] == 0) else {
            return Err(find_cycle(steps, &index, &done));
        };
        done[next] = true;
        order.push(next);
        for (i, s) in steps.iter().enumerate() {
            if s.needs.iter().any(|n| n == &steps[next].id) {
                missing[i] -= s.needs.iter().filter(|n| *n == &steps[next].id).count();
            }
        }
    }
    Ok(order)
}

/// A cycle among the steps not yet ordered: walk needs until one repeats.
fn find_cycle(steps: &[StepSpec], index: &HashMap<&str, usize>, done: &[bool]) -> Vec<String> {
    let start = (0..steps.len()).find(|&i| !done[i]).unwrap_or(0);
    let mut path: Vec<usize> = vec![start];
    let mut at = start;
    loop {
        let next = steps[at]
            .needs
            .iter()
            .filter_map(|n| index.get(n.as_str()).copied())
            .find(|&i| !done[i]);
        let Some(next) = next else {
            return path.iter().map(|&i| steps[i].id.clone()).collect();
        };
        if let Some(pos) = path.iter().position(|&i| i == next) {
            // `a needs b` means b runs first: show the flow, b → a.
            let mut cycle: Vec<usize> = path[pos..].to_vec();
            cycle.reverse();
            // Start from the step defined first, so the message is stable.
            let first = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
            cycle.rotate_left(first);
            cycle.push(cycle[0]);
            return cycle.iter().map(|&i| steps[i].id.clone()).collect();
        }
        path.push(next);
        at = next;
    }
}

/// Resolves and compiles every `[workflows.*]` of `config`.
///
/// # Errors
/// The first [`DefinitionError`].
pub fn load_all(
    config: &Config,
    defaults: Limits,
) -> Result<BTreeMap<String, Definition>, DefinitionError> {
    let all: BTreeMap<String, Definition> = config
        .workflows
        .iter()
        .map(|(name, w)| {
            let spec = Spec::from_config(name, w, config, defaults)?;
            Ok((name.clone(), Definition::compile(name, spec)?))
        })
        .collect::<Result<_, DefinitionError>>()?;
    check_children(&all)?;
    Ok(all)
}

/// Every child step names a configured workflow, and no workflow runs
/// itself as a child, directly or through others (a run would start runs
/// without end).
fn check_children(all: &BTreeMap<String, Definition>) -> Result<(), DefinitionError> {
    let children = |name: &str| -> Vec<(String, String)> {
        all.get(name)
            .map(|d| {
                d.spec
                    .steps
                    .iter()
                    .filter_map(|s| Some((s.id.clone(), s.workflow.clone()?)))
                    .collect()
            })
            .unwrap_or_default()
    };
    for (name, def) in all {
        for step in &def.spec.steps {
            let Some(child) = &step.workflow else {
                continue;
            };
            if !all.contains_key(child) {
                let known: Vec<&str> = all.keys().map(String::as_str).collect();
                return Err(DefinitionError::Step {
                    workflow: name.clone(),
                    step: step.id.clone(),
                    message: format!(
                        "`workflow = \"{child}\"` names no configured workflow (there are {})",
                        known.join(", ")
                    ),
                });
            }
        }
        // Depth-first through the children: the path back to `name` is a
        // cycle.
        let mut stack: Vec<(String, Vec<String>)> = vec![(name.clone(), vec![name.clone()])];
        let mut seen = std::collections::BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for (step, child) in children(&at) {
                if child == *name {
                    let mut cycle = path.clone();
                    cycle.push(child);
                    return Err(DefinitionError::Step {
                        workflow: name.clone(),
                        step: if path.len() == 1 {
                            step
                        } else {
                            def.spec
                                .steps
                                .iter()
                                .find(|s| s.workflow.as_deref() == path.get(1).map(String::as_str))
                                .map_or(step, |s| s.id.clone())
                        },
                        message: format!(
                            "runs itself as a child ({}): a run would start runs without end",
                            cycle.join(" → ")
                        ),
                    });
                }
                if seen.insert(child.clone()) {
                    let mut next = path.clone();
                    next.push(child.clone());
                    stack.push((child, next));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(id: &str, needs: &[&str]) -> StepSpec {
        StepSpec {
            id: id.into(),
            component: "x.wasm".into(),
            component_hash: String::new(),
            allow: vec![],
            needs: needs.iter().map(|s| s.to_string()).collect(),
            input: None,
            condition: None,
            for_each: None,
            concurrency: 1,
            timeout_ms: 1000,
            max_memory: 1 << 20,
            retry: RetryPolicy::default(),
            ..StepSpec::default()
        }
    }

    fn spec(steps: Vec<StepSpec>) -> Spec {
        Spec {
            input_schema: None,
            output: None,
            timeout_ms: None,
            steps,
            redact: Vec::new(),
            ..Spec::default()
        }
    }

    #[test]
    fn a_spec_without_flow_control_is_stored_as_before() {
        // Runs stored before flow control keep their hash.
        let json = serde_json::to_value(spec(vec![step("a", &[])])).unwrap();
        for key in ["concurrency", "rate", "priority"] {
            assert!(json.get(key).is_none(), "{json}");
        }
    }

    #[test]
    fn orders_steps_after_their_needs() {
        let d = Definition::compile(
            "w",
            spec(vec![step("c", &["b"]), step("a", &[]), step("b", &["a"])]),
        )
        .unwrap();
        let ids: Vec<_> = d.steps.iter().map(|s| s.spec.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(d.leaves, ["c"]);
    }

    #[test]
    fn prints_cycles() {
        let e = Definition::compile(
            "w",
            spec(vec![step("a", &["b"]), step("b", &["a"]), step("c", &[])]),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "workflow `w`: the steps form a cycle: a → b → a"
        );
    }

    #[test]
    fn unknown_and_duplicate_ids() {
        let e = Definition::compile("w", spec(vec![step("a", &["zz"])])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "workflow `w`, step `a`: `needs` names unknown step `zz`"
        );
        let e = Definition::compile("w", spec(vec![step("a", &[]), step("a", &[])])).unwrap_err();
        assert_eq!(e.to_string(), "workflow `w`, step `a`: duplicate step id");
    }

    #[test]
    fn jq_errors_name_step_and_expression() {
        let mut s = step("a", &[]);
        s.input = Some("{x: }".into());
        let e = Definition::compile("w", spec(vec![s])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "workflow `w`, step `a`: `input`: jq expression `{x: }` is invalid at position 4: expected term, found `}`"
        );
    }

    #[test]
    fn retry_delays_grow_and_stay_capped() {
        let p = RetryPolicy {
            max_attempts: 10,
            initial_ms: 100,
            max_ms: 1000,
            multiplier: 2.0,
            on: vec!["unavailable".into()],
        };
        for attempt in 1..10 {
            let d = p.delay(attempt).as_millis() as f64;
            let full = (100.0 * 2f64.powi(attempt as i32 - 1)).min(1000.0);
            assert!(d >= full * 0.5 - 1.0 && d <= full, "attempt {attempt}: {d}");
        }
        assert!(p.retries("unavailable", 1));
        assert!(!p.retries("denied", 1));
        assert!(!p.retries("unavailable", 10));
    }
}
