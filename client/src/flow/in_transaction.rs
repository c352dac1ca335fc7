//! The in-transaction flow (`Idempotency::run` and the layer's in-transaction mode): reserve the
//! key, run the work in the same transaction, record its result and commit.
//!
//! Round trips, for work of one statement: (1) `BEGIN` and `idem_reserve`; a replay or any other
//! final answer returns here, its `ROLLBACK` queued without waiting; (2) the work's statement;
//! (3) `idem_complete` and `COMMIT`, the completion aborting the transaction when the key was
//! lost, so the `COMMIT` behind it commits only a completed key. Each numbered request is one
//! [`Driver::send`]: one round trip on either driver.
//!
//! With [`Settings::replay_first`](crate::Settings::replay_first), a request (0) comes first:
//! `idem_replay` in autocommit on a pooled connection; a final answer (replay, failed,
//! mismatch) returns there, with nothing queued behind it, and anything else goes on to (1).
//!
//! No subtransaction on any path. A failure (a transient result or error, a permanent error)
//! rolls the whole transaction back, which undoes the work's writes and the reservation with
//! them, then records the failure in a fresh transaction that reserves the key again and at once
//! releases it (counting the failure towards `max_retries`) or completes it `FAILED` with the
//! error's response, all in the same request: one more round trip, on the failure paths only.
//! Between the two transactions another attempt may take the key; the failure is then not
//! counted, and that attempt's result stands. A result larger than the server's
//! `idempotency.max_response_bytes` (the completion's 54000) takes the same path: rolled back
//! and counted, answered [`Error::ResponseTooLarge`].

use super::wait::Waiting;
use super::{rollback, Context, TxFuture};
use crate::cache::Memo;
use crate::classify::retryable_sqlstate;
use crate::driver::{Driver, Step};
use crate::error::Error;
use crate::handler_error::{Disposition, HandlerError};
use crate::response::{Replayable, Verdict, TOO_LARGE_SQLSTATE};
use crate::row::only;
use crate::sql::{complete_params, reserve_params, Param};
use crate::types::{release_answer, ReleaseOutcome, ReserveOptions, ReserveOutcome, Reservation, Status, Token};
use crate::Outcome;
use idempotency_core::{Fingerprint, Key};

/// The flow, with retries of the whole transaction after 40001 / 40P01 wherever they arise
/// (the work included), without counting a failure, and with
/// [`Settings::wait`](crate::Settings::wait) the wait for the key's holder ([`super::wait`]):
/// an uncommitted holder waited for in the reservation, a committed one polled (the `ROLLBACK`
/// of the poll that found the key held is queued, and its connection goes back to the pool
/// before the pause).
pub(crate) async fn run<D, T, E, F>(cx: &Context<'_, D>, key: &Key, fingerprint: &Fingerprint, mut work: F) -> Result<Outcome<T>, Error<E>>
where
    D: Driver,
    T: Replayable + Send,
    E: HandlerError + Send,
    F: for<'t> FnMut(&'t mut D::Tx) -> TxFuture<'t, T, E> + Send,
{
    // Replay first: a final answer returns at once; otherwise its connection takes the first
    // attempt (given back to the pool and taken again, it would cost sqlx's check between them).
    let mut held = None;
    if cx.settings.replay_first {
        match replayed(cx, key, fingerprint).await {
            First::Answered(answer) => return answer,
            First::Reserve(tx) => held = Some(tx),
        }
    }
    let mut waiting = Waiting::start(cx.settings);
    loop {
        let result = super::retried!(cx, once(cx, key, fingerprint, &mut waiting, &mut work, held.take()).await);
        match waiting.after(&result) {
            Some(pause) => tokio::time::sleep(pause).await,
            None => break result,
        }
    }
}

/// What replay first found: the answer, or the connection to reserve on.
enum First<D: Driver, T, E> {
    Answered(Result<Outcome<T>, Error<E>>),
    Reserve(D::Tx),
}

/// Replay first: `idem_replay` on a pooled connection outside any transaction.
async fn replayed<D: Driver, T: Replayable, E>(cx: &Context<'_, D>, key: &Key, fingerprint: &Fingerprint) -> First<D, T, E> {
    let mut tx = match cx.driver.connection().await {
        Ok(tx) => tx,
        Err(e) => return First::Answered(Err(e.widen())),
    };
    let memo = Memo::start(cx.settings.replay_cache.as_ref(), cx.settings.ttl);
    match super::calls::replay::<D>(&mut tx, cx.schema, key, fingerprint).await {
        Ok(Some(reservation)) => {
            // Kept in the replay cache as a reservation's replay would be.
            let _ = memo.reserved(key, fingerprint, &reservation);
            First::Answered(cx.answer(reservation.outcome))
        }
        Ok(None) => First::Reserve(tx),
        Err(e) => First::Answered(Err(cx.ours(e))),
    }
}

/// One attempt, on `held` (replay first's connection) or a pooled connection.
async fn once<D, T, E, F>(
    cx: &Context<'_, D>,
    key: &Key,
    fingerprint: &Fingerprint,
    waiting: &mut Waiting,
    work: &mut F,
    held: Option<D::Tx>,
) -> Result<Outcome<T>, Error<E>>
where
    D: Driver,
    T: Replayable + Send,
    E: HandlerError + Send,
    F: for<'t> FnMut(&'t mut D::Tx) -> TxFuture<'t, T, E> + Send,
{
    let options = cx.options(cx.settings.lease);
    let memo = Memo::start(cx.settings.replay_cache.as_ref(), cx.settings.ttl);
    let mut tx = match held {
        Some(tx) => tx,
        None => cx.driver.connection().await.map_err(Error::widen)?,
    };
    let steps = [Step::Begin(cx.settings.isolation), Step::Query(&cx.schema.sql().reserve, reserve_params(key, fingerprint, &options))];
    // A reservation waiting in the server for an uncommitted holder is given up at the wait's
    // bound: its guard, dropped with the request in flight, closes the connection.
    let Some(sent) = waiting.within(D::send(&mut tx, &steps)).await else {
        return Err(Error::InProgress { retry_after: cx.settings.retry_after });
    };
    let reservation = match sent.and_then(|rows| Reservation::read(&only(rows)?)) {
        Ok(reservation) => reservation,
        Err(e) => {
            rollback::<D>(&mut tx).await;
            return Err(cx.ours(e));
        }
    };
    let memo = memo.reserved(key, fingerprint, &reservation);
    let token = match reservation.outcome {
        ReserveOutcome::Created(token) => token,
        other => {
            // The transaction wrote nothing: its ROLLBACK leaves with the connection's next use.
            D::queue(&mut tx, &Step::Rollback);
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
    /// The replay cache's part (nothing when it is off).
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
                    rollback::<D>(tx).await;
                    return Err(Error::Decode(e));
                }
            };
            let sql = &cx.schema.sql().complete_or_abort;
            let steps = [Step::Query(sql, complete_params(a.key, a.token, Some(&stored), status)), Step::Commit];
            match D::send(tx, &steps).await {
                Ok(_) => {
                    a.memo.executed(status, &stored);
                    Ok(Outcome::Executed(value))
                }
                Err(e) if e.sqlstate() == Some(TOO_LARGE_SQLSTATE) => {
                    // The result can never be stored: the work is undone with the transaction
                    // and the failure counted like a transient one, so retries end in a
                    // poisoned key instead of running the work for ever.
                    match count(cx, tx, &a).await? {
                        Some(ReleaseOutcome::Stale) => Err(cx.lease_lost()),
                        answer => Err(Error::ResponseTooLarge { effect_stands: false, key_failed: answer == Some(ReleaseOutcome::Poisoned) }),
                    }
                }
                Err(e) => {
                    // A lost key aborted the transaction, so the COMMIT behind it rolled back
                    // (or was skipped: then it is rolled back here).
                    rollback::<D>(tx).await;
                    Err(cx.ours(e))
                }
            }
        }
        Err(error) if retryable_sqlstate(error.sqlstate()) => {
            // Not a failure of the key: the whole transaction is retried by `run`.
            rollback::<D>(tx).await;
            Err(Error::Handler { error })
        }
        Err(error) => match error.disposition() {
            Disposition::Transient => release(cx, tx, &a, Err(error)).await,
            Disposition::Permanent(response) => {
                again(cx, tx, &a, &cx.schema.sql().reserve_and_fail, Param::Json(response.as_ref())).await?;
                Err(Error::Handler { error })
            }
        },
    }
}

/// The transient-failure path: roll back, count the failure in a fresh transaction, answer.
async fn release<D: Driver, T, E>(cx: &Context<'_, D>, tx: &mut D::Tx, a: &Attempt<'_>, result: Result<T, E>) -> Result<Outcome<T>, Error<E>> {
    let answer = count(cx, tx, a).await?;
    cx.released(answer, result)
}

/// Rolls back and counts a failure towards `max_retries` in a fresh transaction: the release's
/// answer, None when the key could not be taken again (nothing was counted).
async fn count<D: Driver, E>(cx: &Context<'_, D>, tx: &mut D::Tx, a: &Attempt<'_>) -> Result<Option<ReleaseOutcome>, Error<E>> {
    let max_retries = Param::int4_or_null(cx.settings.max_retries);
    let answer = again(cx, tx, a, &cx.schema.sql().reserve_and_release, max_retries).await?;
    answer.as_ref().map(|row| release_answer(row, "answer")).transpose().map_err(Error::widen).map(Option::flatten)
}

/// One request of a failure path: `ROLLBACK` (the attempt's writes and its reservation), then
/// in a fresh transaction reserve the key again (never waiting) and release it or complete it
/// `FAILED` (`sql`, whose `$8` is `last`), and `COMMIT`. The row, whose `answer` column is NULL
/// when the key was not created again (nothing was counted); None when the statement answered
/// no row.
async fn again<D: Driver, E>(cx: &Context<'_, D>, tx: &mut D::Tx, a: &Attempt<'_>, sql: &str, last: Param<'_>) -> Result<Option<D::Row>, Error<E>> {
    let mut params = reserve_params(a.key, a.fingerprint, &ReserveOptions { wait: false, ..a.options.clone() });
    params.push(last);
    let steps = [Step::Rollback, Step::Begin(None), Step::Query(sql, params), Step::Commit];
    match D::send(tx, &steps).await {
        Ok(rows) => Ok(rows.into_iter().next()),
        Err(e) => {
            rollback::<D>(tx).await;
            Err(cx.ours(e))
        }
    }
}
