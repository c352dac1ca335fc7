//! The sqlx forms of the driver-neutral values: a [`Param`] bound to a prepared query, a
//! `sqlx::postgres::PgRow` as a [`Row`] (prepared rows are binary, simple-query rows text; sqlx
//! decodes both).

use crate::error::Error;
use crate::row::{impl_row, unreadable};
use crate::sql::Param;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::Row as _;

/// `query` with `param` bound as its next `$n`.
pub(crate) fn bind<'q>(query: Query<'q, sqlx::Postgres, PgArguments>, param: &Param<'q>) -> Query<'q, sqlx::Postgres, PgArguments> {
    match param {
        Param::Text(t) => query.bind(*t),
        Param::Int4(i) => query.bind(*i),
        Param::Int8(i) => query.bind(*i),
        Param::Float(f) => query.bind(*f),
        Param::Bool(b) => query.bind(*b),
        Param::Json(v) => query.bind(v.cloned()),
        Param::Null4 => query.bind(None::<i32>),
        Param::TextArray(items) => query.bind(items.clone()),
        Param::IntArray(items) => query.bind(items.clone()),
        Param::JsonArray(items) => query.bind(items.clone()),
    }
}

fn get<'r, T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>>(row: &'r PgRow, name: &str) -> Result<Option<T>, Error> {
    row.try_get(name).map_err(|e| unreadable(name, e))
}

impl_row!(PgRow, get);
