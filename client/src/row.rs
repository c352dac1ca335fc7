//! Reading rows: the one column-access trait, implemented for each driver's row type, so that
//! every answer of the extension is decoded once (in `types.rs` and the flows), whatever the
//! driver. Columns are read by name; a missing or mistyped column is a protocol error.

use crate::error::Error;
use serde_json::Value;

/// The columns of one row of an answer, by name. Implemented by this crate for each driver's
/// row type only.
pub trait Row: Send + Sync {
    /// A `text` column.
    fn text(&self, name: &str) -> Result<Option<String>, Error>;
    /// A `bigint` column.
    fn int8(&self, name: &str) -> Result<Option<i64>, Error>;
    /// An `int` column.
    fn int4(&self, name: &str) -> Result<Option<i32>, Error>;
    /// A `float8` column.
    fn float8(&self, name: &str) -> Result<Option<f64>, Error>;
    /// A `boolean` column.
    fn boolean(&self, name: &str) -> Result<Option<bool>, Error>;
    /// A `jsonb` column.
    fn json(&self, name: &str) -> Result<Option<Value>, Error>;
}

/// `Row` for a driver's row type whose generic column reader is `$get(row, name)`.
macro_rules! impl_row {
    ($row:ty, $get:ident) => {
        impl $crate::row::Row for $row {
            fn text(&self, name: &str) -> Result<Option<String>, $crate::error::Error> {
                $get(self, name)
            }
            fn int8(&self, name: &str) -> Result<Option<i64>, $crate::error::Error> {
                $get(self, name)
            }
            fn int4(&self, name: &str) -> Result<Option<i32>, $crate::error::Error> {
                $get(self, name)
            }
            fn float8(&self, name: &str) -> Result<Option<f64>, $crate::error::Error> {
                $get(self, name)
            }
            fn boolean(&self, name: &str) -> Result<Option<bool>, $crate::error::Error> {
                $get(self, name)
            }
            fn json(&self, name: &str) -> Result<Option<serde_json::Value>, $crate::error::Error> {
                $get(self, name)
            }
        }
    };
}
pub(crate) use impl_row;

/// The error of a column that cannot be read.
pub(crate) fn unreadable(name: &str, source: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Protocol { reason: format!("cannot read column {name:?}"), source: Some(Box::new(source)) }
}

/// A column that must not be NULL.
pub(crate) fn required<T>(name: &str, value: Result<Option<T>, Error>) -> Result<T, Error> {
    value?.ok_or_else(|| Error::protocol(format!("column {name:?} is NULL")))
}

/// The only row of an answer that has one.
pub(crate) fn only<R: Row>(rows: Vec<R>) -> Result<R, Error> {
    let n = rows.len();
    let mut rows = rows.into_iter();
    match (rows.next(), n) {
        (Some(row), 1) => Ok(row),
        _ => Err(Error::protocol(format!("expected one row, the statement answered {n}"))),
    }
}
