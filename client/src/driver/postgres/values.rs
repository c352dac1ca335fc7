//! The tokio-postgres forms of the driver-neutral values: a [`Param`] as a parameter, a
//! `tokio_postgres::Row` as a [`Row`].

use crate::error::Error;
use crate::row::{impl_row, unreadable};
use crate::sql::Param;
use bytes::BytesMut;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type};

impl ToSql for Param<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Param::Text(t) => t.to_sql(ty, out),
            Param::Int4(i) => i.to_sql(ty, out),
            Param::Int8(i) => i.to_sql(ty, out),
            Param::Float(f) => f.to_sql(ty, out),
            Param::Bool(b) => b.to_sql(ty, out),
            Param::Json(v) => v.to_sql(ty, out),
            Param::Null4 => None::<i32>.to_sql(ty, out),
            Param::TextArray(items) => items.to_sql(ty, out),
            Param::IntArray(items) => items.to_sql(ty, out),
            Param::JsonArray(items) => items.to_sql(ty, out),
        }
    }

    /// Every statement of `sql.rs` casts or declares its parameters' types; each value encodes
    /// as the type the server asks for, or fails to.
    fn accepts(_: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// The types of `params`, declared when a statement is prepared: the server then casts from
/// them where the statement says so (`$2::uuid` from a text value), as sqlx declares its own.
pub(crate) fn types(params: &[Param<'_>]) -> Vec<Type> {
    params
        .iter()
        .map(|p| match p {
            Param::Text(_) => Type::TEXT,
            Param::Int4(_) | Param::Null4 => Type::INT4,
            Param::Int8(_) => Type::INT8,
            Param::Float(_) => Type::FLOAT8,
            Param::Bool(_) => Type::BOOL,
            Param::Json(_) => Type::JSONB,
            Param::TextArray(_) => Type::TEXT_ARRAY,
            Param::IntArray(_) => Type::INT8_ARRAY,
            Param::JsonArray(_) => Type::JSONB_ARRAY,
        })
        .collect()
}

/// A column by name.
fn get<'a, T: FromSql<'a>>(row: &'a tokio_postgres::Row, name: &str) -> Result<Option<T>, Error> {
    row.try_get(name).map_err(|e| unreadable(name, e))
}

impl_row!(tokio_postgres::Row, get);
