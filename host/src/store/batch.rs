//! One run's write, as both SQL databases take it: statements (from the one
//! renderer, [`super::sql`]), each with what it means when it changes no row,
//! then the events to append and the notes to send when it commits.
//!
//! The SQL store builds a [`Batch`] for every write of a run's progress (its
//! creation, its moves, an event, a journaled call, a signal); SQLite's
//! group-commit writer and PostgreSQL's (`pg_writer`) each apply it their own
//! way, grouped with other runs' batches.

use std::borrow::Cow;

use serde_json::{Value, json};

use super::sql::{self, Arg, Dialect, Guard, MoveContext, Statement};
use super::{EventRow, Fence, StoreError, Transition, now_ms, now_text};
use crate::domain::Notice;

/// One run's write.
#[derive(Debug)]
pub struct Batch {
    pub run_id: String,
    /// The time of the write, its columns' and its events'.
    pub at: String,
    /// The run's fence, checked first where workers share the database
    /// (and held until the batch commits); one worker records it only.
    pub fence: Option<Fence>,
    pub statements: Vec<Statement>,
    pub events: Vec<(Cow<'static, str>, Value)>,
    /// What a shared store tells every worker when the batch commits.
    pub notes: Vec<String>,
    /// What a refusal of each move says ([`Guard::Refuse`]).
    refusals: Vec<String>,
}

/// What a batch did.
#[derive(Debug)]
pub struct Applied {
    /// Its events, in id order.
    pub events: Vec<EventRow>,
    /// Whether it stopped at a statement guarded by [`Guard::Exists`] (a
    /// run created before, a signal not kept), appending nothing.
    pub stopped: bool,
}

impl Batch {
    /// An empty batch of `run_id`, stamped now.
    pub fn new(run_id: &str) -> Batch {
        Batch {
            run_id: run_id.to_owned(),
            at: now_text(),
            fence: None,
            statements: Vec::new(),
            events: Vec::new(),
            notes: Vec::new(),
            refusals: Vec::new(),
        }
    }

    /// A statement of the batch.
    pub fn statement(&mut self, statement: Statement) {
        self.statements.push(statement);
    }

    /// A note sent when the batch commits.
    pub fn note(&mut self, payload: String) {
        self.notes.push(payload);
    }

    /// An event appended with the batch.
    pub fn event(&mut self, kind: Cow<'static, str>, data: Value) {
        self.events.push((kind, data));
    }

    /// The batch is written only while `fence` holds the run.
    pub fn fence(&mut self, fence: &Fence) {
        self.fence = Some(fence.clone());
    }

    /// `moves` of the run, in order, each with its events and notes; under
    /// `fence` (checked first) when one is given.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a fenced move without a fence.
    pub fn moves(
        &mut self,
        dialect: Dialect,
        moves: &[Transition<'_>],
        fence: Option<&Fence>,
    ) -> Result<(), StoreError> {
        if let Some(fence) = fence {
            self.fence(fence);
        }
        let at_ms = now_ms();
        for write in moves {
            if write.fenced() && fence.is_none() {
                return Err(StoreError::Corrupt(format!(
                    "run `{}`: {} without the run's fence",
                    self.run_id,
                    write.name()
                )));
            }
            let effects = write.effects();
            let cx = MoveContext {
                run_id: &self.run_id,
                worker: fence.map(|f| &*f.worker),
                at: &self.at,
                at_ms,
            };
            let index = self.refusals.len();
            self.statements
                .extend(sql::move_statements(dialect, &effects, &cx, index));
            self.refusals.push(write.refusal(&self.run_id));
            self.events.extend(
                effects
                    .events
                    .into_iter()
                    .map(|(kind, data)| (Cow::Borrowed(kind), data)),
            );
            match effects.notice {
                Some(Notice::Finished) => self.notes.push(format!("finished:{}", self.run_id)),
                Some(Notice::Ready) => self.notes.push("ready".to_owned()),
                None => {}
            }
        }
        Ok(())
    }

    /// What a refusal of move `n` says.
    pub fn refusal(&self, n: usize) -> Option<&str> {
        self.refusals.get(n).map(String::as_str)
    }

    /// The batch as `wf_apply` (PostgreSQL) takes it.
    pub fn to_json(&self) -> Value {
        let statements: Vec<Value> = self
            .statements
            .iter()
            .map(|statement| {
                let args: Vec<Value> = statement
                    .args
                    .iter()
                    .map(|arg| match arg {
                        Arg::Text(text) => Value::from(text.as_str()),
                        Arg::Int(n) => Value::from(*n),
                        Arg::Null => Value::Null,
                    })
                    .collect();
                let (guard, index) = match statement.guard {
                    Guard::None => (None, None),
                    Guard::Refuse(n) => (Some("refuse"), Some(n)),
                    Guard::Exists => (Some("exists"), None),
                };
                json!({"sql": statement.sql, "args": args, "guard": guard, "move": index})
            })
            .collect();
        let events: Vec<Value> = self
            .events
            .iter()
            .map(|(kind, data)| json!([kind, data.to_string()]))
            .collect();
        json!({
            "run": self.run_id,
            "at": self.at,
            "fence": self.fence.as_ref().map(|f| json!([&*f.worker, f.epoch])),
            "stmts": statements,
            "events": events,
            "notes": self.notes,
        })
    }

    /// What the batch did, given its events' ids (ascending) unless it
    /// stopped.
    pub fn applied(
        &self,
        ids: &mut impl Iterator<Item = i64>,
        stopped: bool,
    ) -> Result<Applied, StoreError> {
        if stopped {
            return Ok(Applied {
                events: Vec::new(),
                stopped,
            });
        }
        let events = self
            .events
            .iter()
            .map(|(kind, data)| {
                let id = ids.next().ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "run `{}`: fewer event ids than events",
                        self.run_id
                    ))
                })?;
                Ok(EventRow {
                    id,
                    run_id: self.run_id.clone(),
                    kind: kind.to_string(),
                    data: data.clone(),
                    at: self.at.clone(),
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Applied { events, stopped })
    }
}
