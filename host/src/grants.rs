//! Capability grants: what a node may reach. Deny by default.
//!
//! A grant is a glob over qualified capability names, `<connection>.<name>`:
//! `fixture.echo`, `fixture.*`, `notes.read_*`. Resources are named
//! `<connection>.<uri>`, so `notes.file:///docs/*` grants those URIs on `notes`.
//! `*` matches any run of characters, including `/` and `.`.

use globset::{Glob, GlobSet, GlobSetBuilder};

/// Why a grant pattern was refused.
#[derive(Debug, thiserror::Error)]
#[error("invalid grant `{pattern}`: {reason}")]
pub struct GrantError {
    pub pattern: String,
    pub reason: String,
}

/// A node's grants, compiled once.
#[derive(Debug, Clone)]
pub struct Grants {
    patterns: Vec<String>,
    set: GlobSet,
}

impl Default for Grants {
    fn default() -> Self {
        Grants::none()
    }
}

impl Grants {
    /// Grants nothing.
    pub fn none() -> Grants {
        Grants {
            patterns: Vec::new(),
            set: GlobSet::empty(),
        }
    }

    /// Compiles `patterns`.
    ///
    /// # Errors
    /// A [`GrantError`] naming the first pattern that is not a valid glob or not
    /// of the form `<connection>.<name>`.
    pub fn new<S: AsRef<str>>(patterns: impl IntoIterator<Item = S>) -> Result<Grants, GrantError> {
        let mut builder = GlobSetBuilder::new();
        let mut kept = Vec::new();
        for pattern in patterns {
            let pattern = pattern.as_ref().trim();
            let invalid = |reason: &str| GrantError {
                pattern: pattern.to_owned(),
                reason: reason.to_owned(),
            };
            match pattern.split_once('.') {
                Some((conn, rest)) if !conn.is_empty() && !rest.is_empty() => {}
                _ => {
                    return Err(invalid(
                        "expected `<connection>.<name>`, e.g. `fixture.echo` or `fixture.*`",
                    ));
                }
            }
            let glob = Glob::new(pattern).map_err(|e| invalid(&e.kind().to_string()))?;
            builder.add(glob);
            kept.push(pattern.to_owned());
        }
        let set = builder.build().map_err(|e| GrantError {
            pattern: kept.join(", "),
            reason: e.to_string(),
        })?;
        Ok(Grants {
            patterns: kept,
            set,
        })
    }

    /// Whether `qualified` (`<connection>.<name>`) is granted.
    pub fn allows(&self, qualified: &str) -> bool {
        self.set.is_match(qualified)
    }

    /// The patterns, as given.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// The message for a refused capability: names it and the grant that would
    /// allow it.
    pub fn denial(&self, qualified: &str) -> String {
        let connection = qualified.split_once('.').map_or(qualified, |(c, _)| c);
        let granted = if self.patterns.is_empty() {
            "this node has no grants".to_owned()
        } else {
            format!(
                "its grants are {}",
                self.patterns
                    .iter()
                    .map(|p| format!("`{p}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        format!(
            "`{qualified}` is not granted to this node ({granted}); allow it with the grant `{qualified}` or `{connection}.*`"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_qualified_names() {
        let g = Grants::new(["fixture.*", "notes.read_*", "docs.file:///public/*"]).unwrap();
        assert!(g.allows("fixture.echo"));
        assert!(g.allows("fixture.fixture://greeting"));
        assert!(g.allows("notes.read_page"));
        assert!(!g.allows("notes.write_page"));
        assert!(g.allows("docs.file:///public/a/b.txt"));
        assert!(!g.allows("docs.file:///private/x"));
        assert!(!g.allows("other.echo"));
    }

    #[test]
    fn nothing_is_granted_by_default() {
        assert!(!Grants::default().allows("fixture.echo"));
        assert_eq!(
            Grants::default().denial("fixture.echo"),
            "`fixture.echo` is not granted to this node (this node has no grants); allow it with the grant `fixture.echo` or `fixture.*`"
        );
    }

    #[test]
    fn malformed_patterns_are_refused() {
        let e = Grants::new(["echo"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid grant `echo`: expected `<connection>.<name>`, e.g. `fixture.echo` or `fixture.*`"
        );
        assert!(Grants::new(["fixture.[oops"]).is_err());
    }
}
