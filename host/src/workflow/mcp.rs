//! What the workflows offer as MCP tools: each `expose = true` workflow's
//! name, description and schemas, checked when the config loads. The MCP
//! server (`crate::mcp`) serves them; this room knows no MCP types, only the
//! JSON Schemas a tool is described with.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::{DefinitionError, WorkflowError};

pub(super) fn same_exposed(
    a: &BTreeMap<String, Arc<Exposed>>,
    b: &BTreeMap<String, Arc<Exposed>>,
) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((na, ea), (nb, eb))| {
            na == nb
                && ea.title == eb.title
                && ea.description == eb.description
                && ea.input_schema == eb.input_schema
                && ea.output_schema == eb.output_schema
        })
}

/// A workflow offered as an MCP tool (`expose = true`).
#[derive(Debug)]
pub struct Exposed {
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    /// The input schema (an object schema), or an open object schema.
    pub input_schema: Arc<Map<String, Value>>,
    pub output_schema: Option<Arc<Map<String, Value>>>,
    output_validator: Option<Arc<jsonschema::Validator>>,
    /// How many steps a run has, for progress.
    pub steps: usize,
}

impl Exposed {
    /// `Some(problem)` when `output` breaks the declared output schema.
    pub fn check_output(&self, output: &Value) -> Option<String> {
        let error = self.output_validator.as_ref()?.iter_errors(output).next()?;
        let path = error.instance_path().to_string();
        Some(if path.is_empty() {
            error.to_string()
        } else {
            format!("`{path}`: {error}")
        })
    }
}

/// The `expose = true` workflows of `config`, checked: MCP tool arguments and
/// structured results are JSON objects, so their schemas must describe objects.
pub(super) fn exposed_workflows(
    config: &crate::config::Config,
) -> Result<BTreeMap<String, Arc<Exposed>>, WorkflowError> {
    let mut exposed = BTreeMap::new();
    for (name, w) in config.workflows.iter().filter(|(_, w)| w.expose) {
        let invalid = |message: String| {
            WorkflowError::Definition(DefinitionError::Workflow {
                workflow: name.clone(),
                message,
            })
        };
        let object_schema = |key: &str, schema: &Value| match schema {
            Value::Object(map) if map.get("type").is_none_or(|t| t == "object") => {
                Ok(Arc::new(map.clone()))
            }
            _ => Err(invalid(format!(
                "`expose = true` needs an `{key}` of `type = \"object\"`: MCP tool arguments and structured results are objects"
            ))),
        };
        let input_schema = match &w.input_schema {
            Some(schema) => object_schema("input_schema", schema)?,
            None => Arc::new(
                json!({"type": "object"})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            ),
        };
        let (output_schema, output_validator) = match &w.output_schema {
            Some(schema) => {
                let validator = jsonschema::validator_for(schema).map_err(|e| {
                    invalid(format!("`output_schema` is not a valid JSON Schema: {e}"))
                })?;
                (
                    Some(object_schema("output_schema", schema)?),
                    Some(Arc::new(validator)),
                )
            }
            None => (None, None),
        };
        let steps = w.steps.len().max(1);
        exposed.insert(
            name.clone(),
            Arc::new(Exposed {
                name: name.clone(),
                title: w.title.clone(),
                description: w.description.clone(),
                input_schema,
                output_schema,
                output_validator,
                steps,
            }),
        );
    }
    Ok(exposed)
}
