//! jq expressions (via jaq), compiled once when a workflow is loaded and run
//! over JSON values at each step.

use std::fmt;
use std::sync::Arc;

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars, data, unwrap_valr};
use jaq_json::Val;
use serde_json::Value;

type Filter = jaq_core::compile::Filter<jaq_core::Native<data::JustLut<Val>>>;

/// Largest number of values an expression may produce before it is cut off:
/// an expression is expected to yield one value.
const MAX_OUTPUTS: usize = 2;

/// A compiled jq filter and its source text.
#[derive(Clone)]
pub struct Expr {
    source: Arc<str>,
    filter: Arc<Filter>,
}

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Expr({:?})", self.source)
    }
}

/// Why an expression does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("jq expression `{expr}` is invalid at position {position}: {message}")]
pub struct CompileError {
    pub expr: String,
    /// Character offset of the problem, from 0.
    pub position: usize,
    pub message: String,
}

/// Why evaluating an expression failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    #[error("jq expression `{expr}` failed: {message}")]
    Failed { expr: String, message: String },
    #[error("jq expression `{expr}` produced no value")]
    Empty { expr: String },
    #[error("jq expression `{expr}` produced {got}, expected {expected}")]
    WrongType {
        expr: String,
        got: String,
        expected: &'static str,
    },
}

impl Expr {
    /// Parses and compiles `source`.
    ///
    /// # Errors
    /// A [`CompileError`] with the position of the first problem.
    pub fn compile(source: &str) -> Result<Self, CompileError> {
        let error = |offset: usize, message: String| CompileError {
            expr: source.to_owned(),
            position: source[..offset.min(source.len())].chars().count(),
            message,
        };
        let span = |part: &str| {
            // Parts are slices of `source`; anything else points at its start.
            let start = part.as_ptr() as usize;
            let base = source.as_ptr() as usize;
            if start >= base && start <= base + source.len() {
                start - base
            } else {
                0
            }
        };
        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        let funs = jaq_core::funs()
            .chain(jaq_std::funs())
            .chain(jaq_json::funs());
        let loader = Loader::new(defs);
        let arena = Arena::default();
        let program = File {
            code: source,
            path: (),
        };
        let modules = loader.load(&arena, program).map_err(|errors| {
            let Some((_, e)) = errors.into_iter().next() else {
                return error(0, "cannot be parsed".into());
            };
            match e {
                jaq_core::load::Error::Io(list) => list
                    .into_iter()
                    .next()
                    .map(|(part, msg)| error(span(part), msg))
                    .unwrap_or_else(|| error(0, "cannot be loaded".into())),
                jaq_core::load::Error::Lex(list) => list
                    .into_iter()
                    .next()
                    .map(|(expect, part)| {
                        error(span(part), format!("expected {}", expect.as_str()))
                    })
                    .unwrap_or_else(|| error(0, "cannot be lexed".into())),
                jaq_core::load::Error::Parse(list) => list
                    .into_iter()
                    .next()
                    .map(|(expect, part)| {
                        let found = if part.is_empty() {
                            "the end".to_owned()
                        } else {
                            format!("`{}`", part.chars().take(20).collect::<String>())
                        };
                        error(
                            span(part),
                            format!("expected {}, found {found}", expect.as_str()),
                        )
                    })
                    .unwrap_or_else(|| error(0, "cannot be parsed".into())),
            }
        })?;
        let filter = Compiler::default()
            .with_funs(funs)
            .compile(modules)
            .map_err(|errors| {
                let first = errors
                    .into_iter()
                    .next()
                    .and_then(|(_, list)| list.into_iter().next());
                match first {
                    Some((name, undefined)) => error(
                        span(name),
                        format!("undefined {} `{name}`", undefined.as_str()),
                    ),
                    None => error(0, "cannot be compiled".into()),
                }
            })?;
        Ok(Expr {
            source: source.into(),
            filter: Arc::new(filter),
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Runs the filter on `input` and returns its first value.
    ///
    /// # Errors
    /// [`EvalError::Failed`] on a jq runtime error, [`EvalError::Empty`] when it
    /// yields nothing.
    pub fn eval(&self, input: &Value) -> Result<Value, EvalError> {
        let failed = |message: String| EvalError::Failed {
            expr: self.source.to_string(),
            message,
        };
        let input: Val =
            serde_json::from_value(input.clone()).map_err(|e| failed(e.to_string()))?;
        let ctx = Ctx::<data::JustLut<Val>>::new(&self.filter.lut, Vars::new([]));
        let mut outputs = self
            .filter
            .id
            .run((ctx, input))
            .map(unwrap_valr)
            .take(MAX_OUTPUTS);
        match outputs.next() {
            None => Err(EvalError::Empty {
                expr: self.source.to_string(),
            }),
            Some(Err(e)) => Err(failed(e.to_string())),
            Some(Ok(value)) => to_json(&value).map_err(failed),
        }
    }

    /// Runs the filter as a condition: jq truthiness (everything but `false`
    /// and `null` is true).
    ///
    /// # Errors
    /// As [`Expr::eval`].
    pub fn eval_bool(&self, input: &Value) -> Result<bool, EvalError> {
        Ok(!matches!(
            self.eval(input)?,
            Value::Null | Value::Bool(false)
        ))
    }

    /// Runs the filter and requires an array.
    ///
    /// # Errors
    /// As [`Expr::eval`], and [`EvalError::WrongType`] for a non-array.
    pub fn eval_array(&self, input: &Value) -> Result<Vec<Value>, EvalError> {
        match self.eval(input)? {
            Value::Array(items) => Ok(items),
            other => Err(EvalError::WrongType {
                expr: self.source.to_string(),
                got: type_name(&other).to_owned(),
                expected: "an array",
            }),
        }
    }
}

fn to_json(value: &Val) -> Result<Value, String> {
    serde_json::from_str(&value.to_string()).map_err(|e| format!("result is not JSON: {e}"))
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn maps_objects() {
        let e = Expr::compile("{q: .input.topic, n: (.steps.a.output | length)}").unwrap();
        let out = e
            .eval(&json!({"input": {"topic": "rust"}, "steps": {"a": {"output": [1, 2, 3]}}}))
            .unwrap();
        assert_eq!(out, json!({"q": "rust", "n": 3}));
    }

    #[test]
    fn truthiness_follows_jq() {
        let e = Expr::compile(".x").unwrap();
        assert!(!e.eval_bool(&json!({"x": null})).unwrap());
        assert!(!e.eval_bool(&json!({"x": false})).unwrap());
        assert!(e.eval_bool(&json!({"x": 0})).unwrap());
        assert!(e.eval_bool(&json!({"x": []})).unwrap());
    }

    #[test]
    fn syntax_errors_name_the_position() {
        let e = Expr::compile(".a | {b: }").unwrap_err();
        assert_eq!(e.expr, ".a | {b: }");
        assert_eq!(e.position, 9, "{e}");
        let e = Expr::compile(".a | nosuchfn").unwrap_err();
        assert_eq!(e.position, 5, "{e}");
        assert!(e.message.contains("undefined"), "{e}");
    }

    #[test]
    fn runtime_errors_and_types() {
        let e = Expr::compile(".a + 1").unwrap();
        let err = e.eval(&json!({"a": "x"})).unwrap_err();
        assert!(matches!(err, EvalError::Failed { .. }), "{err}");
        let e = Expr::compile("empty").unwrap();
        assert!(matches!(e.eval(&json!(1)), Err(EvalError::Empty { .. })));
        let e = Expr::compile(".").unwrap();
        let err = e.eval_array(&json!({"a": 1})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "jq expression `.` produced an object, expected an array"
        );
    }

    #[test]
    fn big_numbers_and_strings_round_trip() {
        let e = Expr::compile(".").unwrap();
        let v = json!({"n": 12345678901234i64, "f": 1.5, "s": "é\n\"", "a": [true, null]});
        assert_eq!(e.eval(&v).unwrap(), v);
    }
}
