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

    /// The host's workers, connections, workflows, schedules, webhooks,
    /// load and state (the `console` scope). It answers while the state
    /// cannot be read too: what comes from the state is then `null`, and
    /// `state.degraded` says why.
    ///
    /// # Errors
    /// [`ApiError::Denied`].
    pub async fn status(&self, caller: &Caller) -> Result<Value, ApiError> {
        Self::may_host(caller, HostScope::Console)?;
        let workflows = &self.workflows;
        let unread = |what: &str, e: &crate::workflow::WorkflowError| {
            tracing::warn!("host.status: cannot read {what} from the state: {e}");
        };
        let store = workflows.state_status().await.unwrap_or_else(|e| {
            unread("its counts", &e);
            let (backend, path) = workflows.state_location();
            let why = workflows
                .degraded()
                .unwrap_or_else(|| format!("the state cannot be read: {e}"));
            json!({"backend": backend, "path": path, "degraded": why})
        });
        let (worker, workers) = workflows.worker_status().await.unwrap_or_else(|e| {
            unread("the workers", &e);
            (Value::Null, Value::Null)
        });
        let schedules = workflows.schedules_status().await.unwrap_or_else(|e| {
            unread("the schedules", &e);
            Vec::new()
        });
        let definitions = workflows.definitions_status().await.unwrap_or_else(|e| {
            unread("the runs per definition", &e);
            Value::Null
        });
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
            "load": workflows.load_status(),
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
