//! The host as callers see it: its status, and reloading its config.

use serde_json::{Value, json};

use super::{Api, ApiError};
use crate::tokens::{Caller, HostScope};

impl Api {
    /// Checks that `caller` has the host scope `scope`.
    ///
    /// # Errors
    /// [`ApiError::Denied`], naming the scope and where it is given.
    pub fn may_host(caller: &Caller, scope: HostScope) -> Result<(), ApiError> {
        match caller.host_refusal(scope) {
            Some(refusal) => Err(ApiError::Denied(refusal)),
            None => Ok(()),
        }
    }

    /// The host's workers, connections, workflows, schedules, webhooks and
    /// state (the `console` scope).
    ///
    /// # Errors
    /// [`ApiError::Denied`]; the store's error.
    pub async fn status(&self, caller: &Caller) -> Result<Value, ApiError> {
        Self::may_host(caller, HostScope::Console)?;
        let workflows = &self.workflows;
        let store = workflows.state_status().await?;
        let (worker, workers) = workflows.worker_status().await?;
        let schedules = workflows.schedules_status().await?;
        let definitions = workflows.definitions_status().await?;
        Ok(json!({
            "worker": worker,
            "workers": workers,
            "connections": self.pool.stats(),
            "workflows": workflows.names(),
            "paused_workflows": workflows.paused_workflows(),
            "input_schemas": workflows.input_schemas(),
            "definitions": definitions,
            "schedules": schedules,
            "webhooks": workflows.webhooks(),
            "runs_waiting_here": workflows.waiting(),
            "exposed": workflows.exposed().iter().map(|w| w.name.clone()).collect::<Vec<_>>(),
            "state": store,
            "config": self.config.as_ref().map(|c| c.status()),
        }))
    }

    /// Reloads the config file (the `reload` scope).
    ///
    /// # Errors
    /// [`ApiError::Denied`]; [`ApiError::Config`] without a config file or
    /// when the file does not load.
    pub async fn reload(&self, caller: &Caller) -> Result<Value, ApiError> {
        Self::may_host(caller, HostScope::Reload)?;
        let Some(reloader) = &self.config else {
            return Err(ApiError::Config(
                "this server was started without a config file: there is nothing to reload".into(),
            ));
        };
        match reloader.reload("host.reload").await {
            Ok(report) => Ok(json!(report)),
            Err(e) => Err(ApiError::Config(e.to_string())),
        }
    }
}
