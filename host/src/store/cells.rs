//! A row as both SQL databases give it back: each column's name and its
//! value, null, an integer or text. The SQL store reads every row through
//! this one shape, so one decoder (`rows.rs`) and one set of queries serve
//! SQLite and PostgreSQL.

use std::sync::Arc;

use sqlx::{Column, Row, TypeInfo, ValueRef};

use super::StoreError;

/// One column's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    Null,
    Int(i64),
    Text(String),
}

/// One row: the query's column names (shared by its rows) and this row's
/// values, in the same order.
#[derive(Debug, Clone)]
pub struct Cells {
    names: Arc<[String]>,
    values: Vec<Cell>,
}

impl Cells {
    fn get(&self, column: &str) -> Result<&Cell, StoreError> {
        self.names
            .iter()
            .position(|name| name == column)
            .map(|i| &self.values[i])
            .ok_or_else(|| StoreError::Corrupt(format!("no column `{column}` in a row")))
    }

    /// A text column that may be null.
    pub fn text_opt(&self, column: &str) -> Result<Option<String>, StoreError> {
        match self.get(column)? {
            Cell::Null => Ok(None),
            Cell::Text(text) => Ok(Some(text.clone())),
            Cell::Int(n) => Ok(Some(n.to_string())),
        }
    }

    /// A text column.
    pub fn text(&self, column: &str) -> Result<String, StoreError> {
        self.text_opt(column)?
            .ok_or_else(|| StoreError::Corrupt(format!("column `{column}` is null")))
    }

    /// An integer column that may be null.
    pub fn int_opt(&self, column: &str) -> Result<Option<i64>, StoreError> {
        match self.get(column)? {
            Cell::Null => Ok(None),
            Cell::Int(n) => Ok(Some(*n)),
            Cell::Text(text) => text.parse().map(Some).map_err(|_| {
                StoreError::Corrupt(format!("column `{column}` is `{text}`, not a number"))
            }),
        }
    }

    /// An integer column.
    pub fn int(&self, column: &str) -> Result<i64, StoreError> {
        self.int_opt(column)?
            .ok_or_else(|| StoreError::Corrupt(format!("column `{column}` is null")))
    }

    /// The first column, as an integer.
    pub fn first_int(&self) -> Option<i64> {
        match self.values.first()? {
            Cell::Int(n) => Some(*n),
            Cell::Text(text) => text.parse().ok(),
            Cell::Null => None,
        }
    }
}

/// Whether a column of type `name` (as the database names it) holds an
/// integer (or a boolean, kept as 0 or 1).
fn is_integer(name: &str) -> bool {
    let name = name.to_ascii_uppercase();
    name.contains("INT") || name.starts_with("BOOL")
}

/// `rows` as cells, each column decoded by `cell` (its row, its index).
fn cells<R: Row>(
    rows: Vec<R>,
    cell: impl Fn(&R, usize) -> Result<Cell, sqlx::Error>,
) -> Result<Vec<Cells>, StoreError> {
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let names: Arc<[String]> = first
        .columns()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    rows.iter()
        .map(|row| {
            let values = (0..row.len())
                .map(|i| cell(row, i))
                .collect::<Result<_, sqlx::Error>>()?;
            Ok(Cells {
                names: names.clone(),
                values,
            })
        })
        .collect()
}

/// SQLite's rows as cells; a value's type is its own.
pub fn sqlite_cells(rows: Vec<sqlx::sqlite::SqliteRow>) -> Result<Vec<Cells>, StoreError> {
    cells(rows, |row, i| {
        let raw = row.try_get_raw(i)?;
        if raw.is_null() {
            return Ok(Cell::Null);
        }
        Ok(match is_integer(raw.type_info().name()) {
            true => Cell::Int(row.try_get_unchecked::<i64, _>(i)?),
            false => Cell::Text(row.try_get_unchecked::<String, _>(i)?),
        })
    })
}

/// PostgreSQL's rows as cells, by each column's type.
pub fn pg_cells(rows: Vec<sqlx::postgres::PgRow>) -> Result<Vec<Cells>, StoreError> {
    cells(rows, |row, i| {
        if row.try_get_raw(i)?.is_null() {
            return Ok(Cell::Null);
        }
        Ok(match row.column(i).type_info().name() {
            "BOOL" => Cell::Int(i64::from(row.try_get::<bool, _>(i)?)),
            "INT2" => Cell::Int(i64::from(row.try_get::<i16, _>(i)?)),
            "INT4" => Cell::Int(i64::from(row.try_get::<i32, _>(i)?)),
            "INT8" => Cell::Int(row.try_get::<i64, _>(i)?),
            _ => Cell::Text(row.try_get::<String, _>(i)?),
        })
    })
}
