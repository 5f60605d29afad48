//! Capability grants: what a node may reach. Deny by default.
//!
//! A grant is a glob over qualified capability names, `<connection>.<name>`:
//! `fixture.echo`, `fixture.*`, `notes.read_*`. Resources are named
//! `<connection>.<uri>`, so `notes.file:///docs/*` grants those URIs on `notes`.
//! `*` matches any run of characters, including `/` and `.`.
//!
//! A name with a `.` or `..` path segment (`file:///public/../secret`, also
//! percent-encoded as `%2e%2e`, `%2E.` or `..%2f`, or behind `\\`) is never
//! granted: servers resolve such paths after our check, so a glob over the raw
//! text could not say where it leads.

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
        !has_dot_segment(qualified) && self.set.is_match(qualified)
    }

    /// Whether any name on `connection` could be granted. Errs on the side of
    /// `true`: it reads each pattern's literal text up to its first wildcard, so
    /// `fixture.*` reaches only `fixture`, and `fix*.echo` every id starting
    /// with `fix`. Used to avoid opening connections a node can never use.
    pub fn may_reach_connection(&self, connection: &str) -> bool {
        self.patterns.iter().any(|pattern| {
            let literal = pattern
                .find(['*', '?', '[', '{', '\\'])
                .map_or(pattern.as_str(), |end| &pattern[..end]);
            match literal.split_once('.') {
                Some((conn, _)) => conn == connection,
                None => connection.starts_with(literal),
            }
        })
    }

    /// The patterns, as given.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// The patterns as a message shows them: "`a.*`, `b.c`", or "nothing".
    pub fn shown(&self) -> String {
        if self.patterns.is_empty() {
            return "nothing".to_owned();
        }
        self.patterns
            .iter()
            .map(|p| format!("`{p}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The message for a refused capability: names it and the grant that would
    /// allow it.
    pub fn denial(&self, qualified: &str) -> String {
        if has_dot_segment(qualified) {
            return format!(
                "`{qualified}` has a `.` or `..` path segment (possibly percent-encoded), which no grant allows; name the resource by its plain path"
            );
        }
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

/// Whether the name part of `qualified` has a `.` or `..` path segment, as
/// written or after percent-decoding (repeatedly, so `%252e` counts too).
fn has_dot_segment(qualified: &str) -> bool {
    let name = qualified
        .split_once('.')
        .map_or(qualified, |(_, name)| name);
    let mut text = name.to_owned();
    // Each round removes at least one `%xx`; a few rounds cover any real
    // double encoding, and what is left after them is refused outright.
    for _ in 0..4 {
        if text
            .split(['/', '\\'])
            .map(|segment| segment.split(['?', '#', ';']).next().unwrap_or(""))
            .any(|segment| segment == "." || segment == "..")
        {
            return true;
        }
        let decoded = percent_decode(&text);
        if decoded == text {
            return false;
        }
        text = decoded;
    }
    true
}

/// `%xx` escapes decoded to bytes; invalid escapes are kept as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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

    #[test]
    fn connections_no_pattern_can_reach_are_ruled_out() {
        let g = Grants::new(["fixture.echo", "notes.file:///*", "fix*.x", "{a,b}.y"]).unwrap();
        assert!(g.may_reach_connection("fixture"));
        assert!(g.may_reach_connection("notes"));
        assert!(g.may_reach_connection("fixer"));
        assert!(
            g.may_reach_connection("anything"),
            "`{{a,b}}.y` is not ruled out"
        );
        let g = Grants::new(["fixture.echo", "notes.*"]).unwrap();
        assert!(!g.may_reach_connection("other"));
        assert!(!g.may_reach_connection("fix"));
        assert!(!g.may_reach_connection("notesx"));
        assert!(!Grants::none().may_reach_connection("fixture"));
        // `*` spans dots, so a pattern wild before its first dot may reach any
        // connection its literal start allows.
        let g = Grants::new(["f*.echo"]).unwrap();
        assert!(g.allows("f.x.echo"));
        assert!(g.may_reach_connection("f"));
    }

    #[test]
    fn dot_segments_are_never_granted() {
        let g = Grants::new(["notes.file:///public/*", "fixture.*"]).unwrap();
        assert!(g.allows("notes.file:///public/a/b.txt"));
        assert!(g.allows("notes.file:///public/..hidden/x"));
        assert!(g.allows("notes.file:///public/a..b"));
        for uri in [
            "notes.file:///public/../secret",
            "notes.file:///public/./../secret",
            "notes.file:///public/..",
            "notes.file:///public/%2e%2e/secret",
            "notes.file:///public/%2E%2E/secret",
            "notes.file:///public/.%2e/secret",
            "notes.file:///public/%2e./secret",
            "notes.file:///public/..%2fsecret",
            "notes.file:///public/..%2Fsecret",
            "notes.file:///public%2f..%2fsecret",
            "notes.file:///public/%252e%252e/secret",
            "notes.file:///public/..\\secret",
            "notes.file:///public/..%5csecret",
            "notes.file:///public/..?x=1",
            "fixture.fixture://../config.json",
        ] {
            assert!(!g.allows(uri), "{uri} must be denied");
            assert!(
                g.denial(uri).contains("`.` or `..` path segment"),
                "{}",
                g.denial(uri)
            );
        }
    }
}
