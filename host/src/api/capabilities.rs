//! Capabilities called directly (not by a node): the caller's token and
//! `[rpc] allow` are both checked before anything reaches the pool.

use serde_json::{Map, Value};

use super::{Api, ApiError};
use crate::capability::{CapabilityBackend, CapabilityEntry, CapabilityError};
use crate::tokens::Caller;

impl Api {
    /// Checks that `caller` may call `qualified` (`<connection>.<name>`),
    /// and that `[rpc] allow` grants it.
    ///
    /// # Errors
    /// [`CapabilityError::Denied`], saying what is granted and where.
    fn may_call(&self, caller: &Caller, qualified: &str) -> Result<(), ApiError> {
        if let Some(refusal) = caller.call_refusal(qualified) {
            return Err(CapabilityError::Denied(refusal).into());
        }
        let grants = self.grants.load();
        if grants.allows(qualified) {
            return Ok(());
        }
        let granted = grants.shown();
        Err(CapabilityError::Denied(format!(
            "`{qualified}` is not granted to RPC clients (`[rpc] allow` grants {granted}); add it to `[rpc] allow` in the config"
        ))
        .into())
    }

    /// The capabilities of every connection that `caller` may call.
    ///
    /// # Errors
    /// As the pool's list.
    pub async fn capabilities(&self, caller: &Caller) -> Result<Vec<CapabilityEntry>, ApiError> {
        let mut entries = self.pool.list().await?;
        let grants = self.grants.load();
        entries.retain(|e| grants.allows(&e.name) && caller.may_call(&e.name));
        Ok(entries)
    }

    /// Calls tool `tool` of `connection`.
    ///
    /// # Errors
    /// [`CapabilityError::Denied`]; the call's own error, with a hint when
    /// the tool is not there.
    pub async fn call_tool(
        &self,
        caller: &Caller,
        connection: &str,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, ApiError> {
        self.may_call(caller, &format!("{connection}.{tool}"))?;
        let result = CapabilityBackend::call_tool(&self.pool, connection, tool, arguments).await;
        Ok(
            crate::capability::with_tool_hint(&self.pool, &self.grants.load(), connection, result)
                .await?,
        )
    }

    /// Reads resource `uri` of `connection` (granted as `<connection>.<uri>`,
    /// as for nodes).
    ///
    /// # Errors
    /// [`CapabilityError::Denied`]; the read's own error.
    pub async fn read_resource(
        &self,
        caller: &Caller,
        connection: &str,
        uri: &str,
    ) -> Result<Value, ApiError> {
        self.may_call(caller, &format!("{connection}.{uri}"))?;
        Ok(CapabilityBackend::read_resource(&self.pool, connection, uri).await?)
    }

    /// Gets prompt `prompt` of `connection`.
    ///
    /// # Errors
    /// [`CapabilityError::Denied`]; the call's own error.
    pub async fn get_prompt(
        &self,
        caller: &Caller,
        connection: &str,
        prompt: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, ApiError> {
        self.may_call(caller, &format!("{connection}.{prompt}"))?;
        Ok(CapabilityBackend::get_prompt(&self.pool, connection, prompt, arguments).await?)
    }
}
