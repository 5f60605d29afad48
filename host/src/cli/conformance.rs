//! `wf-host conformance-client` (hidden): the client the MCP conformance
//! suite drives (`tests/conformance.rs`).

use anyhow::anyhow;
use wf_host::pool::{Pool, PoolConfig};

use super::{EXIT_RUN_FAILED, Failure};

/// One conformance scenario against `url`: connect through the pool (signing
/// in first, unattended, for an authorization-code scenario), list the tools
/// and call each with sample arguments. A 403 that asks for more scope signs
/// in again with it, once.
pub(super) async fn run(url: String) -> Result<(), Failure> {
    let failed = |e: anyhow::Error| Failure {
        code: EXIT_RUN_FAILED,
        error: e,
    };
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    let context: serde_json::Value = std::env::var("MCP_CONFORMANCE_CONTEXT")
        .ok()
        .and_then(|c| serde_json::from_str(&c).ok())
        .unwrap_or_default();
    let dir = tempfile::tempdir().map_err(|e| failed(e.into()))?;
    let tokens = dir.path().join("tokens.json");
    let mut toml = format!("url = {url:?}\n");
    match (context["client_id"].as_str(), context["client_secret"].as_str()) {
        (Some(id), Some(secret)) => toml.push_str(&format!(
            "[auth]\nkind = \"client-credentials\"\nclient_id = {id:?}\nclient_secret = {secret:?}\n"
        )),
        _ if scenario.starts_with("auth/") => {
            toml.push_str("[auth]\nkind = \"authorization-code\"\n")
        }
        _ => {}
    }
    let mut conn: wf_host::config::ConnectionConfig =
        toml::from_str(&toml).map_err(|e| failed(e.into()))?;
    let code_flow = conn
        .auth
        .as_ref()
        .is_some_and(|a| a.kind == wf_host::config::AuthKind::AuthorizationCode);
    // Signed in only once the server asks, with the scope it names: first
    // on a 401, then again on a 403 that wants more.
    let mut sign_in = false;
    for attempt in 1.. {
        if sign_in {
            let mut browser = None;
            let signed_in = wf_host::pool::login("server", &conn, dir.path(), &tokens, |url| {
                // The suite's authorization server approves at once and
                // redirects to our listener: a browser that follows it.
                let url = url.to_owned();
                browser = Some(tokio::spawn(
                    async move { reqwest::get(url).await.map(drop) },
                ));
            })
            .await;
            if let Some(browser) = browser {
                let _ = browser.await;
            }
            signed_in.map_err(|e| failed(anyhow!(e)))?;
        }
        let pool = Pool::new(PoolConfig {
            connections: [("server".to_owned(), conn.clone())].into(),
            base_dir: dir.path().to_owned(),
            tokens: Some(tokens.clone()),
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
        let Err(e) = result else { return Ok(()) };
        let message = e.to_string();
        match conn.auth.as_mut() {
            Some(auth) if code_flow && attempt < 3 && message.contains("wf-host auth login") => {
                if let Some((_, rest)) = message.split_once("wants scope `")
                    && let Some((scope, _)) = rest.split_once('`')
                {
                    auth.scopes = scope.split_whitespace().map(str::to_owned).collect();
                }
                sign_in = true;
            }
            _ => return Err(failed(anyhow!(e))),
        }
    }
    Ok(())
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
