//! Row decoding and text helpers shared by the SQL backends: a run, a step,
//! JSON columns, failures, list cursors. Both SQLite and PostgreSQL store
//! JSON as text and statuses as their names, so one decoder serves both.

use std::sync::Arc;

use serde_json::Value;

use super::cells::Cells;
use super::{
    AttemptWorker, Failure, Flow, FlowLimit, RunRow, RunStatus, StepRow, StepStatus, StoreError,
};
use crate::domain::Debounce;

/// A JSON value as stored: its text.
pub(super) fn json_text(value: &Value) -> String {
    value.to_string()
}

pub(super) fn parse_json(text: Option<String>) -> Result<Option<Value>, StoreError> {
    text.map(|t| serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(e.to_string())))
        .transpose()
}

pub(super) fn failure(code: Option<String>, message: Option<String>) -> Option<Failure> {
    code.map(|code| Failure {
        code,
        message: message.unwrap_or_default(),
    })
}

/// The `workers` column of a step: a JSON array of `{attempt, worker}`.
pub(super) fn attempt_workers(text: Option<String>) -> Result<Vec<AttemptWorker>, StoreError> {
    match text {
        None => Ok(Vec::new()),
        Some(text) => serde_json::from_str(&text)
            .map_err(|e| StoreError::Corrupt(format!("a step's workers: {e}"))),
    }
}

/// The cursor of the page that follows `run` in [`super::Store::list_runs`].
pub(super) fn cursor_of(run: &RunRow) -> String {
    format!("{}.{}", run.created_ms, run.run_id)
}

pub(super) fn parse_cursor(cursor: &str) -> Result<(i64, String), StoreError> {
    cursor
        .split_once('.')
        .and_then(|(ms, id)| Some((ms.parse().ok()?, id.to_owned())))
        .ok_or_else(|| StoreError::BadCursor(cursor.to_owned()))
}

/// A `runs` row.
pub(super) fn run_row(row: &Cells) -> Result<RunRow, StoreError> {
    Ok(RunRow {
        run_id: row.text("run_id")?,
        workflow: row.text("workflow")?,
        status: status(&row.text("status")?, RunStatus::parse)?,
        input: parse_json(row.text_opt("input")?)?.unwrap_or(Value::Null),
        output: parse_json(row.text_opt("output")?)?,
        error: failure(row.text_opt("error_code")?, row.text_opt("error_message")?),
        definition: Arc::new(parse_json(row.text_opt("definition")?)?.unwrap_or(Value::Null)),
        definition_hash: row.text("definition_hash")?,
        idempotency_key: row.text_opt("idempotency_key")?,
        created_ms: row.int("created_ms")?,
        started_at: row.text("started_at")?,
        finished_at: row.text_opt("finished_at")?,
        trigger: parse_json(row.text_opt("run_trigger")?)?,
        flow: flow(row)?,
        queued_reason: row.text_opt("queued_reason")?,
        admitted_ms: row.int_opt("admitted_ms")?,
        wake_ms: row.int_opt("wake_ms")?,
        debounce: match row.text_opt("debounce_key")? {
            Some(key) => Some(Debounce {
                key,
                not_before_ms: row.int_opt("not_before_ms")?.unwrap_or(0),
                deadline_ms: row.int_opt("debounce_deadline_ms")?,
            }),
            None => None,
        },
    })
}

/// The flow columns of a `runs` row; `None` for a run without flow control.
fn flow(row: &Cells) -> Result<Option<Flow>, StoreError> {
    let limit = |key: Option<String>, limit: &str, period: Option<&str>| {
        key.map(|key| -> Result<FlowLimit, StoreError> {
            Ok(FlowLimit {
                key,
                limit: u32::try_from(row.int_opt(limit)?.unwrap_or(0)).unwrap_or(u32::MAX),
                period_ms: match period {
                    Some(column) => row.int_opt(column)?.unwrap_or(0),
                    None => 0,
                },
            })
        })
        .transpose()
    };
    let concurrency = limit(row.text_opt("flow_key")?, "flow_limit", None)?;
    let rate = limit(
        row.text_opt("rate_key")?,
        "rate_limit",
        Some("rate_period_ms"),
    )?;
    if concurrency.is_none() && rate.is_none() {
        return Ok(None);
    }
    Ok(Some(Flow {
        concurrency,
        rate,
        priority: row.int("priority")?,
    }))
}

/// A `schedules` row.
pub(super) fn schedule_row(row: &Cells) -> Result<super::ScheduleRow, StoreError> {
    Ok(super::ScheduleRow {
        workflow: row.text("workflow")?,
        name: row.text("name")?,
        last_tick_ms: row.int("last_tick_ms")?,
        last_run_id: row.text_opt("last_run_id")?,
    })
}

/// A `signals` row.
pub(super) fn signal_row(row: &Cells) -> Result<super::SignalRow, StoreError> {
    Ok(super::SignalRow {
        signal: row.text("signal")?,
        payload: parse_json(row.text_opt("payload")?)?.unwrap_or(Value::Null),
        sent_at: row.text("sent_at")?,
        step_id: row.text_opt("step_id")?,
    })
}

/// A `steps` row.
pub(super) fn step_row(row: &Cells) -> Result<StepRow, StoreError> {
    Ok(StepRow {
        step_id: row.text("step_id")?,
        status: status(&row.text("status")?, StepStatus::parse)?,
        attempts: u32::try_from(row.int("attempts")?).unwrap_or(u32::MAX),
        input: parse_json(row.text_opt("input")?)?,
        output: parse_json(row.text_opt("output")?)?,
        error: failure(row.text_opt("error_code")?, row.text_opt("error_message")?),
        started_at: row.text_opt("started_at")?,
        finished_at: row.text_opt("finished_at")?,
        workers: attempt_workers(row.text_opt("workers")?)?,
    })
}

/// A status column's value, or what is wrong with it.
fn status<T>(text: &str, parse: fn(&str) -> Option<T>) -> Result<T, StoreError> {
    parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown status `{text}`")))
}
