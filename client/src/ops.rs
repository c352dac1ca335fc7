//! One function per SQL call over tokio-postgres (feature `postgres`), generic over the
//! executor: a pooled client or a transaction you hold (`deadpool_postgres::GenericClient`).
//! Statements are prepared once per connection and cached; they, their values and the
//! decoding of their answers are the ones the flows use (`sql.rs`, `types.rs`); every call is
//! qualified with the extension's [`Schema`].

use crate::classify::{classify, Origin};
use crate::error::Error;
use crate::row::{only, required, Row};
use crate::sql::{complete_params, heartbeat_params, key_params, release_params, reserve_params, Param};
pub use crate::sql::Schema;
pub use crate::types::{RecoverAction, Record, ReleaseOutcome, ReserveOptions, ReserveOutcome, Reservation, Stats, Status, Token};
use crate::types::release_answer;
use deadpool_postgres::GenericClient;
use idempotency_core::{Fingerprint, Key};
use serde_json::Value;
use std::time::Duration;
use tokio_postgres::types::ToSql;

/// The rows of `sql` with `params`, prepared and cached.
async fn query<C: GenericClient>(client: &C, sql: &str, params: &[Param<'_>]) -> Result<Vec<tokio_postgres::Row>, Error> {
    let ours = |e| classify(e, Origin::Ours);
    let statement = client.prepare_typed_cached(sql, &crate::driver::postgres::values::types(params)).await.map_err(ours)?;
    let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
    client.query(&statement, &params).await.map_err(ours)
}

/// The one row of `sql` with `params`.
async fn one<C: GenericClient>(client: &C, sql: &str, params: &[Param<'_>]) -> Result<tokio_postgres::Row, Error> {
    only(query(client, sql, params).await?)
}

/// `idem_reserve`.
pub async fn reserve<C: GenericClient>(
    client: &C,
    schema: &Schema,
    key: &Key,
    fingerprint: &Fingerprint,
    options: &ReserveOptions,
) -> Result<Reservation, Error> {
    Reservation::read(&one(client, &schema.sql().reserve, &reserve_params(key, fingerprint, options)).await?)
}

/// `idem_complete`: true when this token held the key and the record is now `status`.
pub async fn complete<C: GenericClient>(
    client: &C,
    schema: &Schema,
    key: &Key,
    token: Token,
    response: Option<&Value>,
    status: Status,
) -> Result<bool, Error> {
    let row = one(client, &schema.sql().complete, &complete_params(key, token, response, status)).await?;
    required("completed", row.boolean("completed"))
}

/// `idem_release`: a transient failure of the attempt holding `token`.
pub async fn release<C: GenericClient>(
    client: &C,
    schema: &Schema,
    key: &Key,
    token: Token,
    max_retries: Option<i32>,
) -> Result<ReleaseOutcome, Error> {
    let row = one(client, &schema.sql().release, &release_params(key, token, max_retries)).await?;
    release_answer(&row, "released")?.ok_or_else(|| Error::protocol("idem_release answered NULL"))
}

/// `idem_heartbeat`: false when the token no longer holds the key.
pub async fn heartbeat<C: GenericClient>(
    client: &C,
    schema: &Schema,
    key: &Key,
    token: Token,
    lease: Option<Duration>,
) -> Result<bool, Error> {
    let row = one(client, &schema.sql().heartbeat, &heartbeat_params(key, token, lease)).await?;
    required("extended", row.boolean("extended"))
}

/// `idem_recover_stuck`: how many stuck attempts were handled.
pub async fn recover_stuck<C: GenericClient>(
    client: &C,
    schema: &Schema,
    batch_size: i32,
    action: RecoverAction,
    max_retries: Option<i32>,
) -> Result<i64, Error> {
    let action = match action {
        RecoverAction::Fail => "fail",
        RecoverAction::Release => "release",
    };
    let params = [Param::Int4(batch_size), Param::Text(action), Param::int4_or_null(max_retries)];
    let row = one(client, &schema.sql().recover_stuck, &params).await?;
    required("handled", row.int8("handled"))
}

/// `idem_sweep`: how many expired rows were deleted.
pub async fn sweep<C: GenericClient>(client: &C, schema: &Schema, batch_size: i32) -> Result<i64, Error> {
    let row = one(client, &schema.sql().sweep, &[Param::Int4(batch_size)]).await?;
    required("deleted", row.int8("deleted"))
}

/// `idem_lookup` (operators only).
pub async fn lookup<C: GenericClient>(client: &C, schema: &Schema, key: &Key) -> Result<Option<Record>, Error> {
    query(client, &schema.sql().lookup, &key_params(key)).await?.first().map(Record::read).transpose()
}

/// `idem_stats` (operators only).
pub async fn stats<C: GenericClient>(client: &C, schema: &Schema) -> Result<Stats, Error> {
    Stats::read(&one(client, &schema.sql().stats, &[]).await?)
}
