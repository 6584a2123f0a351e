//! Reading rows: columns by name, a one-column answer, and types built from a whole row.

use tokio_postgres::Row;
use tokio_postgres::types::FromSql;

use crate::domain::Error;
use crate::store::{Result, StoreError};

/// Reading a column without a panic: a column that is missing or of another type (a schema that
/// drifted from the binary, as in a rolling deploy) is an internal error of that one call.
/// Columns are read by name, so a query's column order is not a second contract; `only` reads a
/// one-column answer (a count, an id) and fails if the query grew a column.
pub(crate) trait Col {
    fn col<'a, T: FromSql<'a>>(&'a self, name: &str) -> Result<T>;
    fn only<'a, T: FromSql<'a>>(&'a self) -> Result<T>;
}

impl Col for Row {
    fn col<'a, T: FromSql<'a>>(&'a self, name: &str) -> Result<T> {
        self.try_get(name).map_err(|e| shape_error(name, &e))
    }

    fn only<'a, T: FromSql<'a>>(&'a self) -> Result<T> {
        if self.len() != 1 {
            let e = format!("{} columns where one was expected", self.len());
            return Err(shape_error("the only one", &e));
        }
        self.try_get(0).map_err(|e| shape_error("the only one", &e))
    }
}

fn shape_error(column: &str, error: &dyn std::fmt::Display) -> StoreError {
    tracing::error!(column, %error, "a row does not have the shape this binary expects");
    Error::Internal(format!("unexpected database row shape (column {column})")).into()
}

/// A type read from a whole row, by its columns' names.
pub(crate) trait FromRow: Sized {
    fn from_row(row: &Row) -> Result<Self>;
}
