//! The two-phase flow (`Idempotency::run_external` and the layer's two-phase mode), for a side
//! effect outside the database:
//!
//! 1. reserve the key in its own transaction (one round trip; a replay or another answer ends
//!    here, without calling out; with [`Settings::wait`](crate::Settings::wait), a key in
//!    progress is reserved again after a pause until another answer or the wait's bound,
//!    [`super::wait`], holding nothing in between);
//! 2. run the outside call while a background task heartbeats the lease; no pooled connection
//!    is held meanwhile;
//! 3. in one transaction, let `record` write the local result, complete the key and commit
//!    (`BEGIN` is queued to leave with `record`'s first statement, `idem_complete` with
//!    `COMMIT`).
//!
//! Once the call has succeeded the outside effect has happened, so the key is never released
//! again: the local transaction is retried on 40001, 40P01 and lost connections; if it still
//! fails, the key is completed with the call's result on its own and `RecordFailed` hands the
//! result back. A result larger than the server's `idempotency.max_response_bytes` (the
//! completion's 54000) is never stored: the local transaction runs once more and completes the
//! key `FAILED` with the marker `StoredResponse::too_large()`, answered `ResponseTooLarge`.

use super::heartbeat::Heartbeat;
use super::wait::Waiting;
use super::{backoff, calls, conflict, rollback, Context, TxFuture};
use crate::cache::Memo;
use crate::classify::retryable_sqlstate;
use crate::driver::{Driver, Step};
use crate::error::Error;
use crate::handler_error::{Disposition, HandlerError};
use crate::response::{Replayable, StoredResponse, Verdict, TOO_LARGE_SQLSTATE};
use crate::settings::DEFAULT_EXTERNAL_LEASE;
use crate::sql::complete_params;
use crate::types::{ReserveOutcome, Status, Token};
use crate::Outcome;
use idempotency_core::{Fingerprint, Key};
use serde_json::Value;

/// The flow.
/// `start` makes the call once the key is held: given the attempt's token and, when `resumes`
/// and the reservation answered `resume` (the layer's `Steps`), the recorded step and state;
/// without `resumes`, a `resume` answer is refused as every flow without steps refuses it.
pub(crate) async fn run<D, T, E, C, S, R>(
    cx: &Context<'_, D>,
    key: &Key,
    fingerprint: &Fingerprint,
    resumes: bool,
    start: S,
    mut record: R,
) -> Result<Outcome<T>, Error<E>>
where
    D: Driver,
    T: Replayable + Send + Sync,
    E: HandlerError + Send,
    C: std::future::Future<Output = Result<T, E>> + Send,
    S: FnOnce(Token, Option<(i32, Option<Value>)>) -> C + Send,
    R: for<'t> FnMut(&'t mut D::Conn, &'t T) -> TxFuture<'t, (), E> + Send,
{
    let lease = cx.settings.lease.unwrap_or(DEFAULT_EXTERNAL_LEASE);
    let memo = Memo::start(cx.settings.replay_cache.as_ref(), cx.settings.ttl);
    let options = cx.options(Some(lease));
    let mut waiting = Waiting::start(cx.settings);
    let reservation = loop {
        // Waiting in the server for an uncommitted holder, the reservation's own task outlives
        // the wait's bound (see `reserve_detached`: a key it creates after that is released).
        let Some(reserved) = waiting.within(calls::reserve_detached(cx.driver, cx.schema, key, fingerprint, &options, resumes)).await else {
            return Err(Error::InProgress { retry_after: cx.settings.retry_after });
        };
        let reservation = reserved.map_err(Error::widen)?;
        match (&reservation.outcome, waiting.pause()) {
            (ReserveOutcome::InProgress, Some(pause)) => tokio::time::sleep(pause).await,
            _ => break reservation,
        }
    };
    let memo = memo.reserved(key, fingerprint, &reservation);
    let (token, call) = match reservation.outcome {
        ReserveOutcome::Created(token) => (token, start(token, None)),
        ReserveOutcome::Resume { token, step, state } if resumes => (token, start(token, Some((step, state)))),
        other => return cx.answer(other),
    };

    let _beat = Heartbeat::start(cx.driver.clone(), cx.schema.clone(), key.clone(), token, lease);
    let value = match call.await {
        Ok(value) => value,
        Err(error) => {
            return match error.disposition() {
                Disposition::Transient => {
                    let answer = calls::release(cx.driver, cx.schema, key, token, cx.settings.max_retries).await.map_err(Error::widen)?;
                    cx.released(Some(answer), Err(error))
                }
                Disposition::Permanent(response) => {
                    match calls::complete(cx.driver, cx.schema, key, token, response.as_ref(), Status::Failed).await.map_err(Error::widen)? {
                        true => Err(Error::Handler { error }),
                        false => Err(cx.lease_lost()),
                    }
                }
            };
        }
    };
    let status = match value.verdict() {
        Verdict::Transient => {
            let answer = calls::release(cx.driver, cx.schema, key, token, cx.settings.max_retries).await.map_err(Error::widen)?;
            return cx.released(Some(answer), Ok(value));
        }
        Verdict::Success => Status::Success,
        Verdict::Failure => Status::Failed,
    };
    let mut stored = serde_json::to_value(&value).map_err(Error::Decode)?;
    let mut status = status;
    let mut too_large = false;

    let mut attempt = 0;
    let last = loop {
        match record_once(cx, key, token, &value, &stored, status, &mut record).await {
            Ok(()) if too_large => return Err(Error::ResponseTooLarge { effect_stands: true, key_failed: true }),
            Ok(()) => {
                memo.executed(status, &stored);
                return Ok(Outcome::Executed(value));
            }
            Err(e @ Error::LeaseLost { .. }) => return Err(e),
            Err(e) if !too_large && e.sqlstate() == Some(TOO_LARGE_SQLSTATE) => {
                // The result can never be stored, and the effect happened: the local
                // transaction runs again and completes the key with the marker instead.
                too_large = true;
                stored = serde_json::to_value(StoredResponse::too_large()).map_err(Error::Decode)?;
                status = Status::Failed;
            }
            Err(e) if transient_for_record(&e) && attempt < cx.settings.serialization_retries => {
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            Err(e) => break e,
        }
    };
    // The outside effect happened and cannot be recorded with the local write: keep its result
    // in the key (never release it), and hand it back.
    let key_completed = matches!(calls::complete(cx.driver, cx.schema, key, token, Some(&stored), status).await, Ok(true));
    Err(Error::RecordFailed { response: stored, key_completed, error: Box::new(last) })
}

/// One try of the local transaction: `BEGIN` with `record`, then complete and `COMMIT`
/// together. [`Error::LeaseLost`] when the key was lost (the transaction rolled back).
async fn record_once<D, T, E, R>(
    cx: &Context<'_, D>,
    key: &Key,
    token: Token,
    value: &T,
    stored: &Value,
    status: Status,
    record: &mut R,
) -> Result<(), Error<E>>
where
    D: Driver,
    T: Replayable + Send + Sync,
    E: HandlerError + Send,
    R: for<'t> FnMut(&'t mut D::Conn, &'t T) -> TxFuture<'t, (), E> + Send,
{
    let mut tx = cx.driver.connection().await.map_err(Error::widen)?;
    D::queue(&mut tx, &Step::Begin(None));
    if let Err(error) = record(D::conn(&mut tx), value).await {
        rollback::<D>(&mut tx).await;
        return Err(Error::Handler { error });
    }
    let steps = [Step::Query(&cx.schema.sql().complete_or_abort, complete_params(key, token, Some(stored), status)), Step::Commit];
    if let Err(e) = D::send(&mut tx, &steps).await {
        rollback::<D>(&mut tx).await;
        return Err(cx.ours(e));
    }
    Ok(())
}

/// Whether the local transaction is retried for this error: 40001 / 40P01 or a lost
/// connection, from our statements or from `record`.
fn transient_for_record<E: HandlerError>(e: &Error<E>) -> bool {
    match e {
        Error::StoreUnavailable(_) => true,
        Error::Handler { error } => retryable_sqlstate(error.sqlstate()) || error.store_unavailable(),
        other => conflict(other),
    }
}
