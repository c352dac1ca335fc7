//! The one-statement flow (`Idempotency::run_statement`): the reservation, the caller's write
//! and the completion as one statement in autocommit (`sql::Schema::one_statement`), one round
//! trip. A failing write rolls the reservation back with it; the failure is then counted in a
//! fresh transaction (reserve again and release, as the in-transaction flow's transient path):
//! one more round trip, on that path only.

use super::wait::Waiting;
use super::Context;
use crate::classify::retryable_sqlstate;
use crate::driver::{Driver, Step};
use crate::error::{DatabaseError, Error};
use crate::one_statement::OneStatement;
use crate::response::Replayable;
use crate::row::{only, Row};
use crate::sql::{reserve_params, Param};
use crate::types::{release_answer, ReserveOptions, ReserveOutcome, Reservation};
use crate::Outcome;
use idempotency_core::{Fingerprint, Key};

/// The flow, retried after 40001 / 40P01 without counting a failure, and with
/// [`Settings::wait`](crate::Settings::wait) the wait for the key's holder ([`super::wait`]):
/// a committed holder polled until the wait's bound; an uncommitted one waited for inside the
/// statement, bounded by `call_timeout` only, since the same statement runs the write, which
/// the wait's bound must not cut.
pub(crate) async fn run<D, T>(cx: &Context<'_, D>, key: &Key, fingerprint: &Fingerprint, write: &OneStatement<'_>) -> Result<Outcome<T>, Error<DatabaseError>>
where
    D: Driver,
    T: Replayable + Send,
{
    let options = cx.options(cx.settings.lease);
    let sql = cx.schema.one_statement(write.sql, write.params.len());
    let mut waiting = Waiting::start(cx.settings);
    loop {
        let result = super::retried!(cx, once(cx, key, fingerprint, &options, &sql, write).await);
        match waiting.after(&result) {
            Some(pause) => tokio::time::sleep(pause).await,
            None => break result,
        }
    }
}

async fn once<D, T>(
    cx: &Context<'_, D>,
    key: &Key,
    fingerprint: &Fingerprint,
    options: &ReserveOptions,
    sql: &str,
    write: &OneStatement<'_>,
) -> Result<Outcome<T>, Error<DatabaseError>>
where
    D: Driver,
    T: Replayable + Send,
{
    let mut params = write.params.clone();
    params.extend(reserve_params(key, fingerprint, options));
    let mut tx = cx.driver.connection().await.map_err(Error::widen)?;
    let row = match D::send(&mut tx, &[Step::Query(sql, params)]).await.and_then(only) {
        Ok(row) => row,
        Err(Error::Database(db)) if !retryable_sqlstate(db.sqlstate()) => return failed(cx, &mut tx, key, fingerprint, options, db).await,
        Err(e) => return Err(cx.ours(e)),
    };
    match Reservation::read(&row).map_err(Error::widen)?.outcome {
        ReserveOutcome::Created(_) => {
            let response = row.json("response").map_err(Error::widen)?;
            serde_json::from_value(response.unwrap_or_default()).map(Outcome::Executed).map_err(Error::Decode)
        }
        other => cx.answer(other),
    }
}

/// The write failed, and the reservation rolled back with it: count the failure (reserve again
/// and release, in a fresh transaction), and answer with the database's error.
async fn failed<D: Driver, T>(
    cx: &Context<'_, D>,
    tx: &mut D::Tx,
    key: &Key,
    fingerprint: &Fingerprint,
    options: &ReserveOptions,
    error: DatabaseError,
) -> Result<Outcome<T>, Error<DatabaseError>> {
    let mut params = reserve_params(key, fingerprint, &ReserveOptions { wait: false, ..options.clone() });
    params.push(Param::int4_or_null(cx.settings.max_retries));
    let steps = [Step::Begin(None), Step::Query(&cx.schema.sql().reserve_and_release, params), Step::Commit];
    let rows = match D::send(tx, &steps).await {
        Ok(rows) => rows,
        Err(e) => {
            super::rollback::<D>(tx).await;
            return Err(cx.ours(e));
        }
    };
    let answer = rows.first().map(|row| release_answer(row, "answer")).transpose().map_err(Error::widen)?.flatten();
    cx.released(answer, Err(error))
}
