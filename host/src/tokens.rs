//! Named bearer tokens with scopes (`[[rpc.tokens]]`), so that several
//! callers (teams, services, a person at the console) share one host and
//! each reaches only what it was given.
//!
//! ```toml
//! [[rpc.tokens]]
//! name = "ci"
//! hash = "sha256:…"          # printed by `wf-host token new ci`; never the token
//! start = ["deploy-*"]       # workflows it may start (globs)
//! read = ["deploy-*"]        # whose runs it may see (default: `start`)
//! cancel = ["deploy-*"]      # whose runs it may cancel, retry, pause and resume
//! signal = []                # whose runs it may signal and answer
//! capabilities = []          # capability patterns it may call directly
//! console = false            # `host.status` and the console's views of the host
//! metrics = false            # `/metrics`
//! reload = false             # `host.reload`
//! ```
//!
//! The config holds a SHA-256 of each token: the tokens are 256 random bits,
//! so a plain hash is as good as a slow one, and a leaked config gives no
//! token away. The single `--token` (and a loopback server without one) is a
//! caller with every scope.

use std::sync::Arc;

use globset::{Glob, GlobSet, GlobSetBuilder};
use sha2::{Digest, Sha256};

use crate::config::TokenConfig;
use crate::grants::Grants;

/// Who sent a request, and what it may do.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's name; `None` for the `--token` and an open server.
    pub name: Option<String>,
    scopes: Option<Scopes>,
}

#[derive(Debug, Clone)]
struct Scopes {
    start: Patterns,
    read: Patterns,
    cancel: Patterns,
    signal: Patterns,
    capabilities: Grants,
    console: bool,
    metrics: bool,
    reload: bool,
}

/// Globs over workflow names.
#[derive(Debug, Clone)]
struct Patterns {
    given: Vec<String>,
    set: GlobSet,
}

impl Patterns {
    fn new(given: &[String], key: &str) -> Result<Patterns, String> {
        let mut builder = GlobSetBuilder::new();
        for pattern in given {
            builder.add(
                Glob::new(pattern).map_err(|e| format!("`{key}`: `{pattern}`: {}", e.kind()))?,
            );
        }
        Ok(Patterns {
            given: given.to_vec(),
            set: builder.build().map_err(|e| format!("`{key}`: {e}"))?,
        })
    }

    fn shown(&self) -> String {
        if self.given.is_empty() {
            "no workflow".to_owned()
        } else {
            self.given
                .iter()
                .map(|p| format!("`{p}`"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
}

/// What a caller asks to do to a workflow's runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunScope {
    Start,
    Read,
    Cancel,
    Signal,
}

impl RunScope {
    fn key(self) -> &'static str {
        match self {
            RunScope::Start => "start",
            RunScope::Read => "read",
            RunScope::Cancel => "cancel",
            RunScope::Signal => "signal",
        }
    }
}

/// A scope of the host itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostScope {
    Console,
    Metrics,
    Reload,
}

impl HostScope {
    fn key(self) -> &'static str {
        match self {
            HostScope::Console => "console",
            HostScope::Metrics => "metrics",
            HostScope::Reload => "reload",
        }
    }
}

impl Caller {
    /// The `--token`, or anyone on a loopback server without one.
    pub fn everything() -> Arc<Caller> {
        Arc::new(Caller {
            name: None,
            scopes: None,
        })
    }

    /// A caller with no scope at all.
    pub fn nobody() -> Arc<Caller> {
        let none = Patterns {
            given: Vec::new(),
            set: GlobSet::empty(),
        };
        Arc::new(Caller {
            name: Some("(none)".to_owned()),
            scopes: Some(Scopes {
                start: none.clone(),
                read: none.clone(),
                cancel: none.clone(),
                signal: none,
                capabilities: Grants::none(),
                console: false,
                metrics: false,
                reload: false,
            }),
        })
    }

    /// Whether this caller has every scope.
    pub fn is_unlimited(&self) -> bool {
        self.scopes.is_none()
    }

    /// Whether the caller may `scope` runs of `workflow`.
    pub fn may(&self, scope: RunScope, workflow: &str) -> bool {
        self.patterns(scope)
            .is_none_or(|given| given.set.is_match(workflow))
    }

    /// Why the caller may not `scope` runs of `workflow`; `None` when it may.
    pub fn refusal(&self, scope: RunScope, workflow: &str) -> Option<String> {
        let given = self.patterns(scope)?;
        if given.set.is_match(workflow) {
            return None;
        }
        Some(format!(
            "token `{}` may not {} runs of workflow `{workflow}`: its `{}` scope covers {}",
            self.name.as_deref().unwrap_or_default(),
            scope.key(),
            scope.key(),
            given.shown()
        ))
    }

    /// The workflows `scope` covers; `None` for a caller with every scope.
    fn patterns(&self, scope: RunScope) -> Option<&Patterns> {
        let s = self.scopes.as_ref()?;
        Some(match scope {
            RunScope::Start => &s.start,
            RunScope::Read => &s.read,
            RunScope::Cancel => &s.cancel,
            RunScope::Signal => &s.signal,
        })
    }

    /// What a run started by this caller records: the named token that
    /// started it (`--token` and an open server record nothing).
    pub fn trigger(&self) -> Option<serde_json::Value> {
        self.name
            .as_ref()
            .map(|name| serde_json::json!({"kind": "token", "name": name}))
    }

    /// Whether the caller may call `qualified` (`<connection>.<name>`)
    /// directly; `[rpc] allow` is checked besides.
    pub fn may_call(&self, qualified: &str) -> bool {
        self.scopes
            .as_ref()
            .is_none_or(|s| s.capabilities.allows(qualified))
    }

    /// Why the caller may not call `qualified`; `None` when it may.
    pub fn call_refusal(&self, qualified: &str) -> Option<String> {
        if self.may_call(qualified) {
            return None;
        }
        let s = self.scopes.as_ref()?;
        let given = s.capabilities.shown();
        Some(format!(
            "token `{}` may not call `{qualified}`: its `capabilities` scope covers {given}",
            self.name.as_deref().unwrap_or_default()
        ))
    }

    /// Whether the caller has the host scope.
    pub fn has(&self, scope: HostScope) -> bool {
        self.scopes.as_ref().is_none_or(|s| match scope {
            HostScope::Console => s.console,
            HostScope::Metrics => s.metrics,
            HostScope::Reload => s.reload,
        })
    }

    /// Why the caller lacks the host scope; `None` when it has it.
    pub fn host_refusal(&self, scope: HostScope) -> Option<String> {
        (!self.has(scope)).then(|| {
            format!(
                "token `{}` lacks the `{}` scope (`{} = true` in its `[[rpc.tokens]]` entry)",
                self.name.as_deref().unwrap_or_default(),
                scope.key(),
                scope.key()
            )
        })
    }
}

/// The named tokens of a config.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<([u8; 32], Arc<Caller>)>,
}

impl Tokens {
    /// Compiles `[[rpc.tokens]]`.
    ///
    /// # Errors
    /// What is wrong, naming the token.
    pub fn new(configs: &[TokenConfig]) -> Result<Tokens, String> {
        let mut entries: Vec<([u8; 32], Arc<Caller>)> = Vec::new();
        for c in configs {
            let err = |e: String| format!("[[rpc.tokens]] `{}`: {e}", c.name);
            let valid = !c.name.is_empty()
                && c.name.len() <= 64
                && c.name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.'));
            if !valid {
                return Err(format!(
                    "[[rpc.tokens]]: name `{}` must be 1 to 64 letters, digits, `-`, `_` or `.`",
                    c.name
                ));
            }
            if entries
                .iter()
                .any(|(_, e)| e.name.as_deref() == Some(&c.name))
            {
                return Err(err("the name is used twice".into()));
            }
            let hash = parse_hash(&c.hash).map_err(err)?;
            if entries.iter().any(|(h, _)| *h == hash) {
                return Err(err(
                    "has the hash of another token; make each with `wf-host token new`".into(),
                ));
            }
            let start = Patterns::new(&c.start, "start").map_err(err)?;
            let read = match &c.read {
                Some(read) => Patterns::new(read, "read").map_err(err)?,
                None => start.clone(),
            };
            let scopes = Scopes {
                start,
                read,
                cancel: Patterns::new(&c.cancel, "cancel").map_err(err)?,
                signal: Patterns::new(&c.signal, "signal").map_err(err)?,
                capabilities: Grants::new(&c.capabilities)
                    .map_err(|e| err(format!("`capabilities`: {e}")))?,
                console: c.console,
                metrics: c.metrics,
                reload: c.reload,
            };
            entries.push((
                hash,
                Arc::new(Caller {
                    name: Some(c.name.clone()),
                    scopes: Some(scopes),
                }),
            ));
        }
        Ok(Tokens { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller whose token `given` is. Every entry is compared, in
    /// constant time, whether or not an earlier one matched.
    pub fn identify(&self, given: &str) -> Option<Arc<Caller>> {
        let hash: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        let mut found = None;
        for (h, caller) in &self.entries {
            if constant_time_eq::constant_time_eq_32(h, &hash) {
                found = Some(caller.clone());
            }
        }
        found
    }
}

/// `sha256:<64 hex digits>`.
fn parse_hash(text: &str) -> Result<[u8; 32], String> {
    let bad = || {
        "`hash` is not `sha256:` and 64 hex digits; make it with `wf-host token new NAME`"
            .to_owned()
    };
    let hex_part = text.strip_prefix("sha256:").ok_or_else(bad)?;
    let bytes = hex::decode(hex_part).map_err(|_| bad())?;
    bytes.try_into().map_err(|_| bad())
}

/// The hash the config keeps of `token`.
pub fn hash_of(token: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(token.as_bytes())))
}

/// A fresh token: `wfh_` and 256 random bits, in hex.
pub fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("wfh_{}", hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str, token: &str) -> TokenConfig {
        TokenConfig {
            name: name.into(),
            hash: hash_of(token),
            start: vec!["deploy-*".into()],
            read: None,
            cancel: vec![],
            signal: vec![],
            capabilities: vec!["fixture.echo".into()],
            console: false,
            metrics: true,
            reload: false,
        }
    }

    #[test]
    fn a_token_is_known_by_its_hash_and_held_to_its_scopes() {
        let token = new_token();
        assert!(token.starts_with("wfh_") && token.len() > 40, "{token}");
        let tokens = Tokens::new(&[config("ci", &token)]).unwrap();
        let ci = tokens.identify(&token).unwrap();
        assert!(tokens.identify("wfh_other").is_none());
        assert_eq!(ci.name.as_deref(), Some("ci"));
        assert!(ci.may(RunScope::Start, "deploy-web"));
        assert!(
            ci.may(RunScope::Read, "deploy-web"),
            "read defaults to start"
        );
        assert!(!ci.may(RunScope::Cancel, "deploy-web"));
        let refusal = ci.refusal(RunScope::Start, "billing").unwrap();
        assert!(
            refusal.contains("`start` scope covers `deploy-*`"),
            "{refusal}"
        );
        assert!(ci.may_call("fixture.echo") && !ci.may_call("fixture.sleep"));
        assert!(ci.has(HostScope::Metrics) && !ci.has(HostScope::Console));
        assert!(Caller::everything().may(RunScope::Cancel, "anything"));
    }

    #[test]
    fn bad_entries_are_refused_by_name() {
        let mut c = config("ci", "t");
        c.hash = "plain-token".into();
        assert!(Tokens::new(&[c]).unwrap_err().contains("`ci`: `hash`"));
        let twice = Tokens::new(&[config("a", "t"), config("b", "t")]).unwrap_err();
        assert!(twice.contains("another token"), "{twice}");
        let name = Tokens::new(&[config("a b", "t")]).unwrap_err();
        assert!(name.contains("name `a b`"), "{name}");
    }
}
