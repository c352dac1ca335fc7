//! The calls a flow makes in a transaction of their own (autocommit, one statement, one round
//! trip): the two-phase flow's reservation, release, completion and heartbeat, replay first's
//! `idem_replay`, and the lookup of the installed extension.

use crate::driver::{Driver, Step};
use crate::error::Error;
use crate::row::{only, required, Row};
use crate::sql::{complete_params, heartbeat_params, release_params, replay_params, reserve_params, Param, Schema, EXTENSION_SQL};
use crate::types::{release_answer, ReleaseOutcome, ReserveOptions, ReserveOutcome, Reservation, Status, Token};
use idempotency_core::{Fingerprint, Key};
use serde_json::Value;
use std::time::Duration;

/// The one row of `sql` with `params`, on a pooled connection, outside a transaction.
async fn one<D: Driver>(driver: &D, sql: &str, params: Vec<Param<'_>>) -> Result<D::Row, Error> {
    let mut tx = driver.connection().await?;
    only(D::send(&mut tx, &[Step::Query(sql, params)]).await?)
}

/// The installed extension's schema and version (the caller checks the version).
pub(crate) async fn installed<D: Driver>(driver: &D) -> Result<(String, String), Error> {
    let mut tx = driver.connection().await?;
    let rows = D::send(&mut tx, &[Step::Query(EXTENSION_SQL, vec![])]).await?;
    let Some(row) = rows.first() else {
        return Err(Error::IncompatibleExtension {
            reason: "the idempotency extension is not installed in this database (CREATE EXTENSION idempotency)".into(),
            source: None,
        });
    };
    Ok((required("schema", row.text("schema"))?, required("version", row.text("version"))?))
}

/// `idem_reserve`.
pub(crate) async fn reserve<D: Driver>(driver: &D, schema: &Schema, key: &Key, fingerprint: &Fingerprint, options: &ReserveOptions) -> Result<Reservation, Error> {
    Reservation::read(&one(driver, &schema.sql().reserve, reserve_params(key, fingerprint, options)).await?)
}

/// `idem_replay` on `tx` (a pooled connection outside a transaction): the key's final answer
/// (replay, failed, mismatch) read without reserving; None when its record is not final
/// (absent, expired, in progress, resumable): the caller reserves, on the same connection.
pub(crate) async fn replay<D: Driver>(tx: &mut D::Tx, schema: &Schema, key: &Key, fingerprint: &Fingerprint) -> Result<Option<Reservation>, Error> {
    let row = only(D::send(tx, &[Step::Query(&schema.sql().replay, replay_params(key, fingerprint))]).await?)?;
    if row.text("outcome")?.is_none() {
        return Ok(None);
    }
    Reservation::read(&row).map(Some)
}

/// `idem_reserve` with the `step` and `state` of a `resume` answer (`reserve_resumable`).
async fn reserve_resumable<D: Driver>(driver: &D, schema: &Schema, key: &Key, fingerprint: &Fingerprint, options: &ReserveOptions) -> Result<Reservation, Error> {
    Reservation::read(&one(driver, &schema.sql().reserve_resumable, reserve_params(key, fingerprint, options)).await?)
}

/// `idem_reserve` for the two-phase flow, safe to drop at any point: the request runs in a task
/// of its own, so a caller dropped while it is in flight (a timeout before the outside call
/// started) does not leave behind a key that nobody will run. A key created for a caller that is
/// gone is released: by the task, when nobody is left to take the answer, or by the dropped
/// caller's [`Unclaimed`] guard, when the answer arrived but was never read. The release counts
/// one transient failure (`idem_release` always counts) but never poisons the key (its
/// `max_retries` is the largest there is): a drop must not fail a call that never ran. With
/// `resumes`, a `resume` answer carries its step and state (`reserve_resumable`); a key resumed
/// for a caller that is gone is left to its lease, as a dropped `run_steps` leaves it.
pub(crate) async fn reserve_detached<D: Driver>(
    driver: &D,
    schema: &Schema,
    key: &Key,
    fingerprint: &Fingerprint,
    options: &ReserveOptions,
    resumes: bool,
) -> Result<Reservation, Error> {
    let (driver, schema, key, fingerprint, options) = (driver.clone(), schema.clone(), key.clone(), fingerprint.clone(), options.clone());
    let (answer, answered) = tokio::sync::oneshot::channel();
    let mut unclaimed = Unclaimed { answered: Some(answered), key: (driver.clone(), schema.clone(), key.clone()) };
    tokio::spawn(async move {
        let reserved = match resumes {
            true => reserve_resumable(&driver, &schema, &key, &fingerprint, &options).await,
            false => reserve(&driver, &schema, &key, &fingerprint, &options).await,
        };
        if let Err(Ok(Reservation { outcome: ReserveOutcome::Created(token), .. })) = answer.send(reserved) {
            let _ = release(&driver, &schema, &key, token, NEVER_POISON).await;
        }
    });
    let reserved = match unclaimed.answered.as_mut() {
        Some(answered) => answered.await,
        None => unreachable!("the receiver is only taken here"),
    };
    unclaimed.answered = None;
    reserved.unwrap_or_else(|_| Err(Error::protocol("the reservation's task ended without an answer")))
}

/// The `max_retries` of a release made for a caller that is gone: a drop never poisons a key.
const NEVER_POISON: Option<i32> = Some(i32::MAX);

/// The answer of a detached reservation until its caller reads it; dropped unread (the caller's
/// future dropped in the tick the answer arrived), it releases a key that was created.
struct Unclaimed<D: Driver> {
    answered: Option<tokio::sync::oneshot::Receiver<Result<Reservation, Error>>>,
    key: (D, Schema, Key),
}

impl<D: Driver> Drop for Unclaimed<D> {
    fn drop(&mut self) {
        let Some(mut answered) = self.answered.take() else { return };
        if let Ok(Ok(Reservation { outcome: ReserveOutcome::Created(token), .. })) = answered.try_recv() {
            let (driver, schema, key) = self.key.clone();
            tokio::spawn(async move {
                let _ = release(&driver, &schema, &key, token, NEVER_POISON).await;
            });
        }
    }
}

/// `idem_release`.
pub(crate) async fn release<D: Driver>(driver: &D, schema: &Schema, key: &Key, token: Token, max_retries: Option<i32>) -> Result<ReleaseOutcome, Error> {
    let row = one(driver, &schema.sql().release, release_params(key, token, max_retries)).await?;
    release_answer(&row, "released")?.ok_or_else(|| Error::protocol("idem_release answered NULL"))
}

/// `idem_complete`.
pub(crate) async fn complete<D: Driver>(driver: &D, schema: &Schema, key: &Key, token: Token, response: Option<&Value>, status: Status) -> Result<bool, Error> {
    let row = one(driver, &schema.sql().complete, complete_params(key, token, response, status)).await?;
    required("completed", row.boolean("completed"))
}

/// `idem_heartbeat`.
pub(crate) async fn heartbeat<D: Driver>(driver: &D, schema: &Schema, key: &Key, token: Token, lease: Duration) -> Result<bool, Error> {
    let row = one(driver, &schema.sql().heartbeat, heartbeat_params(key, token, Some(lease))).await?;
    required("extended", row.boolean("extended"))
}
