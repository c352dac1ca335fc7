//! One function per SQL call, for the calls you make yourself (inside your own transaction, in
//! a maintenance job): over tokio-postgres (feature `postgres`) at the top of this module,
//! generic over the executor, a pooled client or a transaction you hold
//! (`deadpool_postgres::GenericClient`); over sqlx (feature `sqlx`) in `ops::sqlx`,
//! the same functions over any `sqlx::PgExecutor` (`&PgPool`, `&mut PgConnection`, a
//! `&mut sqlx::Transaction`). Both are written once (the macro `calls!`): the statements, their
//! values and the decoding of their answers are the ones the flows use (`sql.rs`, `types.rs`),
//! prepared once per connection by either driver; every call is qualified with the extension's
//! [`Schema`].
//!
//! # Errors
//!
//! Every function answers the errors of one statement of this crate, classified as the flows'
//! own are (the repository's docs/rust-client.md, "Errors", has the table):
//! [`Error::StoreUnavailable`] for a lost connection or a pool that gave none,
//! [`Error::IncompatibleExtension`] for a function missing in `schema` (or at another version),
//! [`Error::Protocol`] for an answer of an unexpected shape, [`Error::Database`] for any other
//! error of the server (its [`Error::sqlstate`]).
//!
//! # Cancel safety
//!
//! A call is one statement on your executor. Dropped before its answer, the statement may or
//! may not have run: inside a transaction you hold, what it did commits or rolls back with that
//! transaction; on a pooled client in autocommit it may have committed (a dropped `reserve` can
//! leave the key `PROCESSING` until its lease ends, a dropped `complete` or `release` may have
//! settled it: read it back with `lookup`). tokio-postgres leaves a connection whose answer was
//! not read usable; sqlx closes it.

use crate::error::Error;
use crate::row::{only, required, Row};
use crate::sql::{complete_params, heartbeat_params, key_params, release_params, reserve_params, Param};
pub use crate::sql::Schema;
pub use crate::types::{RecoverAction, Record, ReleaseOutcome, ReserveOptions, ReserveOutcome, Reservation, Stats, Status, Token};
use crate::types::release_answer;
use idempotency_core::{Fingerprint, Key};
use serde_json::Value;
use std::time::Duration;

/// The values of `idem_recover_stuck`.
fn recover_params(batch_size: i32, action: RecoverAction, max_retries: Option<i32>) -> [Param<'static>; 3] {
    let action = match action {
        RecoverAction::Fail => "fail",
        RecoverAction::Release => "release",
    };
    [Param::Int4(batch_size), Param::Text(action), Param::int4_or_null(max_retries)]
}

/// The functions of one driver, written once: `$query(executor, sql, params)` answers the rows
/// of one prepared statement; `$exec: $exec_ty` is how the functions take the executor, with
/// the generics `[$($generics)*]`.
macro_rules! calls {
    ([$($generics:tt)*], $exec:ident: $exec_ty:ty, $query:path) => {
        /// `idem_reserve`.
        ///
        /// # Errors
        ///
        /// Those of every call: [the module's](crate::ops#errors) (docs/rust-client.md, "Errors").
        ///
        /// # Cancel safety
        ///
        /// One statement on your executor: [the module's](crate::ops#cancel-safety).
        pub async fn reserve<$($generics)*>(
            $exec: $exec_ty,
            schema: &Schema,
            key: &Key,
            fingerprint: &Fingerprint,
            options: &ReserveOptions,
        ) -> Result<Reservation, Error> {
            Reservation::read(&only($query($exec, &schema.sql().reserve, &reserve_params(key, fingerprint, options)).await?)?)
        }

        /// `idem_complete`: true when this token held the key and the record is now `status`.
        ///
        /// # Errors
        ///
        /// Those of every call: [the module's](crate::ops#errors) (docs/rust-client.md, "Errors").
        ///
        /// # Cancel safety
        ///
        /// One statement on your executor: [the module's](crate::ops#cancel-safety).
        pub async fn complete<$($generics)*>(
            $exec: $exec_ty,
            schema: &Schema,
            key: &Key,
            token: Token,
            response: Option<&Value>,
            status: Status,
        ) -> Result<bool, Error> {
            let row = only($query($exec, &schema.sql().complete, &complete_params(key, token, response, status)).await?)?;
            required("completed", row.boolean("completed"))
        }

        /// `idem_release`: a transient failure of the attempt holding `token`.
        ///
        /// # Errors
        ///
        /// Those of every call: [the module's](crate::ops#errors) (docs/rust-client.md, "Errors").
        ///
        /// # Cancel safety
        ///
        /// One statement on your executor: [the module's](crate::ops#cancel-safety).
        pub async fn release<$($generics)*>(
            $exec: $exec_ty,
            schema: &Schema,
            key: &Key,
            token: Token,
            max_retries: Option<i32>,
        ) -> Result<ReleaseOutcome, Error> {
            let row = only($query($exec, &schema.sql().release, &release_params(key, token, max_retries)).await?)?;
            release_answer(&row, "released")?.ok_or_else(|| Error::protocol("idem_release answered NULL"))
        }

        /// `idem_heartbeat`: false when the token no longer holds the key.
        ///
        /// # Errors
        ///
        /// Those of every call: [the module's](crate::ops#errors) (docs/rust-client.md, "Errors").
        ///
        /// # Cancel safety
        ///
        /// One statement on your executor: [the module's](crate::ops#cancel-safety).
        pub async fn heartbeat<$($generics)*>(
            $exec: $exec_ty,
            schema: &Schema,
            key: &Key,
            token: Token,
            lease: Option<Duration>,
        ) -> Result<bool, Error> {
            let row = only($query($exec, &schema.sql().heartbeat, &heartbeat_params(key, token, lease)).await?)?;
            required("extended", row.boolean("extended"))
        }

        /// `idem_recover_stuck`: how many stuck attempts were handled.
        ///
        /// # Errors
        ///
        /// Those of every call: [the module's](crate::ops#errors) (docs/rust-client.md, "Errors").
        ///
        /// # Cancel safety
        ///
        /// One statement on your executor: [the module's](crate::ops#cancel-safety).
        pub async fn recover_stuck<$($generics)*>(
            $exec: $exec_ty,
            schema: &Schema,
            batch_size: i32,
            action: RecoverAction,
            max_retries: Option<i32>,
        ) -> Result<i64, Error> {
            let row = only($query($exec, &schema.sql().recover_stuck, &recover_params(batch_size, action, max_retries)).await?)?;
            required("handled", row.int8("handled"))
        }

        /// `idem_sweep`: how many expired rows were deleted.
        ///
        /// # Errors
        ///
        /// Those of every call: [the module's](crate::ops#errors) (docs/rust-client.md, "Errors").
        ///
        /// # Cancel safety
        ///
        /// One statement on your executor: [the module's](crate::ops#cancel-safety).
        pub async fn sweep<$($generics)*>($exec: $exec_ty, schema: &Schema, batch_size: i32) -> Result<i64, Error> {
            let row = only($query($exec, &schema.sql().sweep, &[Param::Int4(batch_size)]).await?)?;
            required("deleted", row.int8("deleted"))
        }

        /// `idem_lookup` (operators only).
        ///
        /// # Errors
        ///
        /// Those of every call: [the module's](crate::ops#errors) (docs/rust-client.md, "Errors").
        ///
        /// # Cancel safety
        ///
        /// One statement on your executor: [the module's](crate::ops#cancel-safety).
        pub async fn lookup<$($generics)*>($exec: $exec_ty, schema: &Schema, key: &Key) -> Result<Option<Record>, Error> {
            $query($exec, &schema.sql().lookup, &key_params(key)).await?.first().map(Record::read).transpose()
        }

        /// `idem_stats` (operators only).
        ///
        /// # Errors
        ///
        /// Those of every call: [the module's](crate::ops#errors) (docs/rust-client.md, "Errors").
        ///
        /// # Cancel safety
        ///
        /// One statement on your executor: [the module's](crate::ops#cancel-safety).
        pub async fn stats<$($generics)*>($exec: $exec_ty, schema: &Schema) -> Result<Stats, Error> {
            Stats::read(&only($query($exec, &schema.sql().stats, &[]).await?)?)
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use crate::classify::{classify, Origin};
    use deadpool_postgres::GenericClient;
    use tokio_postgres::types::ToSql;

    /// The rows of `sql` with `params`, prepared and cached.
    async fn query<C: GenericClient>(client: &C, sql: &str, params: &[Param<'_>]) -> Result<Vec<tokio_postgres::Row>, Error> {
        let ours = |e| classify(e, Origin::Ours);
        let statement = client.prepare_typed_cached(sql, &crate::driver::postgres::values::types(params)).await.map_err(ours)?;
        let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        client.query(&statement, &params).await.map_err(ours)
    }

    calls!([C: GenericClient], client: &C, query);
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use self::postgres::{complete, heartbeat, lookup, recover_stuck, release, reserve, stats, sweep};

/// The same functions over sqlx: any `sqlx::PgExecutor` (a `&PgPool`, a `&mut PgConnection`,
/// a `&mut sqlx::Transaction<'_, Postgres>`). The statements are prepared and cached by sqlx
/// on the connection; the errors and cancel safety are the module's.
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub mod sqlx {
    use super::*;
    use crate::classify::{classify, Origin};
    use ::sqlx::postgres::PgRow;
    use ::sqlx::{AssertSqlSafe, PgExecutor};

    /// The rows of `sql` with `params`, prepared (and cached by sqlx).
    async fn query<'c, X: PgExecutor<'c>>(executor: X, sql: &str, params: &[Param<'_>]) -> Result<Vec<PgRow>, Error> {
        let query = params.iter().fold(::sqlx::query(AssertSqlSafe(sql)), crate::driver::sqlx::values::bind);
        query.fetch_all(executor).await.map_err(|e| classify(e, Origin::Ours))
    }

    calls!(['c, X: PgExecutor<'c>], executor: X, query);
}
