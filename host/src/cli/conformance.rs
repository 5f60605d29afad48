//! `wf-host conformance-client` (hidden): the client the MCP conformance
//! suite drives (`tests/conformance.rs`).

use anyhow::anyhow;
use wf_host::pool::{Pool, PoolConfig};

use super::{EXIT_RUN_FAILED, Failure};

/// One conformance scenario against `url`: connect through the pool, list
/// the tools and call each with sample arguments, answering questions with
/// their defaults. The suite's `auth/*` scenarios are not played here but as
/// a person plays them, with `wf-host auth login` and `wf-host run`
/// (`tests/conformance/person.sh`).
pub(super) async fn run(url: String) -> Result<(), Failure> {
    let failed = |e: anyhow::Error| Failure {
        code: EXIT_RUN_FAILED,
        error: e,
    };
    let dir = tempfile::tempdir().map_err(|e| failed(e.into()))?;
    let conn: wf_host::config::ConnectionConfig =
        toml::from_str(&format!("url = {url:?}\n")).map_err(|e| failed(e.into()))?;
    let pool = Pool::new(PoolConfig {
        connections: [("server".to_owned(), conn)].into(),
        base_dir: dir.path().to_owned(),
        ..PoolConfig::default()
    });
    let result = async {
        for tool in pool.list_tools("server").await? {
            let arguments = sample_arguments(&tool.input_schema);
            // A question is accepted as a person who fills in nothing
            // would: with the schema's defaults.
            let extras = wf_host::capability::CallExtras {
                elicit: Some(std::sync::Arc::new(AcceptDefaults)),
                ..Default::default()
            };
            pool.call_tool_with("server", &tool.name, arguments, extras, None)
                .await?;
        }
        Ok::<_, wf_host::pool::PoolError>(())
    }
    .await;
    pool.shutdown().await;
    result.map_err(|e| failed(anyhow!(e)))
}

/// Arguments for a tool from its input schema: 1 for numbers, `"test"` for
/// strings, `true` for booleans.
fn sample_arguments(
    schema: &serde_json::Map<String, serde_json::Value>,
) -> serde_json::Map<String, serde_json::Value> {
    let Some(properties) = schema.get("properties").and_then(|p| p.as_object()) else {
        return serde_json::Map::new();
    };
    properties
        .iter()
        .map(|(name, property)| {
            let value = match property["type"].as_str() {
                Some("number" | "integer") => serde_json::json!(1),
                Some("boolean") => serde_json::json!(true),
                Some("string") => serde_json::json!("test"),
                _ => serde_json::Value::Null,
            };
            (name.clone(), value)
        })
        .collect()
}

/// Accepts every question with the defaults its schema gives.
struct AcceptDefaults;

#[async_trait::async_trait]
impl wf_host::capability::Elicitor for AcceptDefaults {
    async fn ask(
        &self,
        question: wf_host::capability::Question,
        _within: std::time::Duration,
    ) -> wf_host::capability::Answer {
        let mut content = serde_json::json!({});
        if let Some(schema) = &question.requested_schema {
            wf_host::capability::apply_defaults(schema, &mut content);
        }
        wf_host::capability::Answer {
            action: "accept".to_owned(),
            content: (question.mode == "form").then_some(content),
        }
    }
}
