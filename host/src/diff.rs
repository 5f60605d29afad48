//! JSON differences, said in the caller's words: test cases compare a
//! node's output with what was expected, cassettes a call with the one
//! recorded, replays a new build's calls with the run's.

use assert_json_diff::{CompareMode, Config, assert_json_matches_no_panic};
use serde_json::Value;

/// How `got` differs from `want` (`Ok` when it does not), in the caller's
/// words: what to call `got` and `want`, and what to say of a field missing
/// from each (the diff crate says `lhs`, `rhs`, `missing from lhs`).
pub fn json_diff(
    got: &Value,
    want: &Value,
    mode: CompareMode,
    [got_is, want_is, missing_from_got, missing_from_want]: [&str; 4],
) -> Result<(), String> {
    assert_json_matches_no_panic(got, want, Config::new(mode)).map_err(|d| {
        d.replace("    lhs:", &format!("    {got_is}:"))
            .replace("    rhs:", &format!("    {want_is}:"))
            .replace("missing from lhs", missing_from_got)
            .replace("missing from rhs", missing_from_want)
    })
}

/// [`json_diff`] in strict mode, as text: `same` when there is no
/// difference to show.
pub fn strict(got: &Value, want: &Value, words: [&str; 4], same: &str) -> String {
    json_diff(got, want, CompareMode::Strict, words)
        .err()
        .unwrap_or_else(|| same.to_owned())
}
