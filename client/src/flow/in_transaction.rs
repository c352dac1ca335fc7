//! The in-transaction flow (`Idempotency::run` and the layer's in-transaction mode): reserve the
//! key, run the work in the same transaction, record its result and commit.
//!
//! Round trips, for work of one prepared statement: (1) `BEGIN` and `idem_reserve`; a replay or
//! any other final answer returns here, its `ROLLBACK` queued without waiting; (2) the work's
//! statement; (3) `idem_complete` and `COMMIT`, the completion aborting the transaction when the
//! key was lost, so the `COMMIT` behind it commits only a completed key.
//!
//! No subtransaction on any path. A failure (a transient result or error, a permanent error)
//! rolls the whole transaction back, which undoes the work's writes and the reservation with
//! them, then records the failure in a fresh transaction that reserves the key again and at once
//! releases it (counting the failure towards `max_retries`) or completes it `FAILED` with the
//! error's response: one more round trip, on the failure paths only. Between the two
//! transactions another attempt may take the key; the failure is then not counted, and that
//! attempt's result stands.

use super::{backoff, Context, TxFuture};
use crate::cache::Memo;
use crate::driver::Driver;
use crate::error::Error;
use crate::handler::{is_retryable_sqlstate, Disposition, HandlerError};
use crate::ops::{ReserveOptions, ReserveOutcome, Status, Token};
use crate::response::{Replayable, Verdict};
use crate::Outcome;
use idempotency_core::{Fingerprint, Key};

/// The flow, with retries of the whole transaction after 40001 / 40P01 wherever they arise
/// (the work included), without counting a failure.
pub(crate) async fn run<D, T, E, F>(cx: &Context<'_, D>, key: &Key, fingerprint: &Fingerprint, mut work: F) -> Result<Outcome<T>, Error<E>>
where
    D: Driver,
    T: Replayable + Send,
    E: HandlerError + Send,
    F: for<'t> FnMut(&'t mut D::Tx) -> TxFuture<'t, T, E> + Send,
{
    let mut attempt = 0;
    loop {
        match once(cx, key, fingerprint, &mut work).await {
            Err(e) if e.is_retryable_conflict() && attempt < cx.settings.serialization_retries => {
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

async fn once<D, T, E, F>(cx: &Context<'_, D>, key: &Key, fingerprint: &Fingerprint, work: &mut F) -> Result<Outcome<T>, Error<E>>
where
    D: Driver,
    T: Replayable + Send,
    E: HandlerError + Send,
    F: for<'t> FnMut(&'t mut D::Tx) -> TxFuture<'t, T, E> + Send,
{
    let options = cx.options(cx.settings.lease);
    let memo = Memo::start(cx.settings);
    let (mut tx, reservation) = cx
        .driver
        .begin_and_reserve(cx.schema, cx.settings.isolation, key, fingerprint, &options)
        .await
        .map_err(Error::widen)?;
    let memo = memo.reserved(key, fingerprint, &reservation);
    let token = match reservation.outcome {
        ReserveOutcome::Created(token) => token,
        other => {
            D::abandon(tx);
            return cx.answer(other);
        }
    };
    let result = work(&mut tx).await;
    finish(cx, &mut tx, Attempt { key, fingerprint, options: &options, token, memo }, result).await
}

/// The reservation a finishing attempt holds.
struct Attempt<'a> {
    key: &'a Key,
    fingerprint: &'a Fingerprint,
    options: &'a ReserveOptions,
    token: Token,
    memo: Memo<'a>,
}

/// Records the work's result (or its failure) and ends the transaction.
async fn finish<D, T, E>(cx: &Context<'_, D>, tx: &mut D::Tx, a: Attempt<'_>, result: Result<T, E>) -> Result<Outcome<T>, Error<E>>
where
    D: Driver,
    T: Replayable,
    E: HandlerError,
{
    match result {
        Ok(value) => {
            let status = match value.verdict() {
                Verdict::Transient => return release(cx, tx, &a, Ok(value)).await,
                Verdict::Success => Status::Success,
                Verdict::Failure => Status::Failed,
            };
            let stored = match serde_json::to_value(&value) {
                Ok(stored) => stored,
                Err(e) => {
                    D::rollback(tx).await;
                    return Err(Error::Decode(e));
                }
            };
            match D::complete_and_commit(tx, cx.schema, a.key, a.token, Some(&stored), status).await.map_err(Error::widen)? {
                true => {
                    a.memo.executed(status, &stored);
                    Ok(Outcome::Executed(value))
                }
                false => Err(cx.lease_lost()),
            }
        }
        Err(error) if is_retryable_sqlstate(error.sqlstate()) => {
            // Not a failure of the key: the whole transaction is retried by `run`.
            D::rollback(tx).await;
            Err(Error::Handler { error })
        }
        Err(error) => match error.disposition() {
            Disposition::Transient => release(cx, tx, &a, Err(error)).await,
            Disposition::Permanent(response) => {
                D::rollback_and_fail(tx, cx.schema, a.key, a.fingerprint, a.options, response.as_ref())
                    .await
                    .map_err(Error::widen)?;
                Err(Error::Handler { error })
            }
        },
    }
}

/// The transient-failure path: roll back, count the failure in a fresh transaction, answer.
async fn release<D: Driver, T, E>(cx: &Context<'_, D>, tx: &mut D::Tx, a: &Attempt<'_>, result: Result<T, E>) -> Result<Outcome<T>, Error<E>> {
    let max_retries = cx.settings.max_retries;
    let answer = D::rollback_and_release(tx, cx.schema, a.key, a.fingerprint, a.options, max_retries).await.map_err(Error::widen)?;
    cx.released(answer, result)
}
