//! The flow of a request of several steps (`Idempotency::run_steps` and the completer,
//! docs/recovery-points.md), written once over [`Driver`]:
//!
//! 1. one statement in autocommit reserves the key and, when it created it, writes recovery
//!    point 0 with the input as its state (a `resume` answer instead gives the last recovery
//!    point: the flow continues after it, with its state; every other answer is returned as
//!    `run_external` returns it);
//! 2. each step after the recovery point: a local step in a transaction whose `idem_checkpoint`
//!    leaves with the `COMMIT` (the checkpoint aborts the transaction when the key was lost, so
//!    the `COMMIT` behind it commits the step's writes only with its recovery point; 40001 /
//!    40P01 retry it); an outside step while the heartbeat keeps the lease (no pooled
//!    connection held), then its `idem_checkpoint` on its own;
//! 3. the finishing transaction: its writes, then `idem_complete` queued with the `COMMIT`.
//!
//! A step's transient error releases the key (`RESUMABLE`, counted: a retry or a completer
//! continues at the last recovery point); a permanent one completes it `FAILED` with its
//! response; a lost key is [`Error::LeaseLost`] (the step's writes rolled back). A dropped call
//! leaves no connection inside a transaction (the guards close it) and releases nothing: the
//! lease runs out and the key is resumable.

use super::heartbeat::Heartbeat;
use super::wait::Waiting;
use super::{calls, rollback, Context};
use crate::driver::{Driver, Step};
use crate::error::Error;
use crate::handler_error::{Disposition, HandlerError};
use crate::response::{Replayable, StoredResponse, Verdict, TOO_LARGE_SQLSTATE};
use crate::row::{only, Row};
use crate::settings::DEFAULT_EXTERNAL_LEASE;
use crate::sql::{checkpoint_params, complete_params, reserve_params_of, Param};
use crate::steps::{DerivedKey, FinishFn, Plan, Work};
use crate::types::{ReserveOptions, ReserveOutcome, Reservation, Status, Token};
use crate::Outcome;
use futures_util::future::BoxFuture;
use idempotency_core::Key;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::time::Duration;

/// Wraps an outside step's call (the handle stops its deadline's clock while it runs).
pub(crate) type Wrap<'a, S, E> = &'a (dyn Fn(BoxFuture<'static, Result<S, E>>) -> BoxFuture<'static, Result<S, E>> + Sync);

/// The attempt that holds the key.
struct Held<'a> {
    key: &'a Key,
    token: Token,
    lease: Duration,
}

/// The flow, for the request `hash` (a fingerprint's text, or the stored hash a completer read).
pub(crate) async fn run<D, S, R, E>(
    cx: &Context<'_, D>,
    key: &Key,
    hash: &str,
    plan: &Plan<S, R, E, D>,
    input: S,
    wrap: Wrap<'_, S, E>,
) -> Result<Outcome<R>, Error<E>>
where
    D: Driver,
    S: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    R: Replayable + Send,
    E: HandlerError + Send + 'static,
{
    plan.check().map_err(|reason| Error::Configuration { reason, source: None })?;
    let lease = cx.settings.lease.unwrap_or(DEFAULT_EXTERNAL_LEASE);
    let options = cx.options(Some(lease));
    let saved = serde_json::to_value(&input).map_err(Error::Decode)?;
    let mut waiting = Waiting::start(cx.settings);
    let reservation = loop {
        let Some(reserved) = waiting.within(reserve(cx, key, hash, &options, &saved)).await else {
            return Err(Error::InProgress { retry_after: cx.settings.retry_after });
        };
        let reservation = reserved.map_err(|e| cx.ours(e))?;
        match (&reservation.outcome, waiting.pause()) {
            (ReserveOutcome::InProgress, Some(pause)) => tokio::time::sleep(pause).await,
            _ => break reservation,
        }
    };
    let (token, reached, state) = match reservation.outcome {
        ReserveOutcome::Created(token) => (token, 0, input),
        ReserveOutcome::Resume { token, step, state } => {
            let state = serde_json::from_value(state.unwrap_or(Value::Null)).map_err(Error::Decode)?;
            (token, step, state)
        }
        other => return cx.answer(other),
    };
    let held = Held { key, token, lease };
    let from = usize::try_from(reached).map_err(|_| Error::protocol(format!("the record's step is {reached}, below 0")))?;
    if from > plan.steps.len() {
        return Err(Error::protocol(format!("the record's step is {from}, past the plan's {} steps", plan.steps.len())));
    }
    let state = match steps_from(cx, &held, plan, from, state, wrap).await {
        Ok(state) => state,
        Err(Error::Handler { error }) => return failed(cx, &held, error).await,
        Err(other) => return Err(other),
    };
    let finish = plan.finish.as_ref().ok_or_else(|| Error::protocol("a plan without finish passed its check"))?;
    match super::retried!(cx, finish_once(cx, &held, finish, state.clone()).await) {
        Ok(Finished::Committed(value)) => Ok(Outcome::Executed(value)),
        Ok(Finished::Transient(value)) => {
            let answer = calls::release(cx.driver, cx.schema, key, token, cx.settings.max_retries).await.map_err(Error::widen)?;
            cx.released(Some(answer), Ok(value))
        }
        Err(Error::Handler { error }) => failed(cx, &held, error).await,
        Err(e) if e.sqlstate() == Some(TOO_LARGE_SQLSTATE) => {
            // The response can never be stored, and the outside steps happened: the key keeps
            // the marker (never released, so they are not made again).
            let marker = serde_json::to_value(StoredResponse::too_large()).map_err(Error::Decode)?;
            match calls::complete(cx.driver, cx.schema, key, token, Some(&marker), Status::Failed).await.map_err(Error::widen)? {
                true => Err(Error::ResponseTooLarge { effect_stands: true, key_failed: true }),
                false => Err(cx.lease_lost()),
            }
        }
        Err(other) => Err(other),
    }
}

/// Each step of `plan` after the first `from`, the state passing from step to step; a step's
/// error is returned as [`Error::Handler`], the key left as it is.
async fn steps_from<D, S, R, E>(cx: &Context<'_, D>, held: &Held<'_>, plan: &Plan<S, R, E, D>, from: usize, mut state: S, wrap: Wrap<'_, S, E>) -> Result<S, Error<E>>
where
    D: Driver,
    S: Serialize + Clone + Send + Sync + 'static,
    E: HandlerError + Send + 'static,
{
    for (index, step) in plan.steps.iter().enumerate().skip(from) {
        let ordinal = i32::try_from(index + 1).map_err(|_| Error::protocol("a plan of more than 2^31 steps"))?;
        state = match &step.work {
            Work::Local(f) => super::retried!(cx, local_once(cx, held, ordinal, f, state.clone()).await)?,
            Work::Outside(f) => outside(cx, held, ordinal, &step.name, f(derived(held.key, &step.name)?, state.clone()), wrap).await?,
        };
    }
    Ok(state)
}

/// The plan of a request whose key the two-phase layer holds (`token`, reserved `created` or
/// `resume` at recovery point `reached` with `recorded`): the steps after it, then `finish` in
/// a transaction that commits with recovery point `steps + 1` holding its result, which is
/// returned (the layer stores the handler's response and completes the key). A key recorded at
/// `steps + 1` answers the recorded result without running anything. Errors leave the key as it
/// is, for the layer: a step's is [`Error::Handler`].
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_held<D, S, R, E>(
    cx: &Context<'_, D>,
    key: &Key,
    token: Token,
    reached: i32,
    recorded: Option<Value>,
    plan: &Plan<S, R, E, D>,
    input: S,
    wrap: Wrap<'_, S, E>,
) -> Result<R, Error<E>>
where
    D: Driver,
    S: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
    E: HandlerError + Send + 'static,
{
    plan.check().map_err(|reason| Error::Configuration { reason, source: None })?;
    let lease = cx.settings.lease.unwrap_or(DEFAULT_EXTERNAL_LEASE);
    let held = Held { key, token, lease };
    let from = usize::try_from(reached).map_err(|_| Error::protocol(format!("the record's step is {reached}, below 0")))?;
    let last = plan.steps.len() + 1;
    if from == last {
        return serde_json::from_value(recorded.unwrap_or(Value::Null)).map_err(Error::Decode);
    }
    if from > last {
        return Err(Error::protocol(format!("the record's step is {from}, past the plan's {} steps and its finish", plan.steps.len())));
    }
    let state = match recorded {
        Some(recorded) => serde_json::from_value(recorded).map_err(Error::Decode)?,
        None => input,
    };
    let state = steps_from(cx, &held, plan, from, state, wrap).await?;
    let finish = plan.finish.as_ref().ok_or_else(|| Error::protocol("a plan without finish passed its check"))?;
    let ordinal = i32::try_from(last).map_err(|_| Error::protocol("a plan of more than 2^31 steps"))?;
    super::retried!(cx, local_once(cx, &held, ordinal, finish, state.clone()).await)
}

fn derived<E>(key: &Key, step: &str) -> Result<DerivedKey, Error<E>> {
    DerivedKey::of(key, step).map_err(Error::InvalidKey)
}

/// The reservation, with recovery point 0 when it created the key: one statement, one round
/// trip, in autocommit (a drop in flight closes the connection: the server rolls both back, or
/// both committed and the key is resumable once its lease runs out).
async fn reserve<D: Driver>(cx: &Context<'_, D>, key: &Key, hash: &str, options: &ReserveOptions, input: &Value) -> Result<Reservation, Error> {
    let mut params = reserve_params_of(key, hash, options);
    params.push(Param::Json(Some(input)));
    let mut tx = cx.driver.connection().await?;
    let row = only(D::send(&mut tx, &[Step::Query(&cx.schema.sql().reserve_steps, params)]).await?)?;
    let reservation = Reservation::read(&row)?;
    if matches!(reservation.outcome, ReserveOutcome::Created(_)) && row.boolean("checkpointed")? != Some(true) {
        return Err(Error::protocol("idem_checkpoint refused recovery point 0 of a key just created"));
    }
    Ok(reservation)
}

/// One try of a local step: `BEGIN` with the step's first statement, its writes, then its
/// recovery point and `COMMIT` together.
async fn local_once<D, S, T, E>(cx: &Context<'_, D>, held: &Held<'_>, ordinal: i32, f: &FinishFn<D::Conn, S, T, E>, state: S) -> Result<T, Error<E>>
where
    D: Driver,
    T: Serialize,
{
    let mut tx = cx.driver.connection().await.map_err(Error::widen)?;
    D::queue(&mut tx, &Step::Begin(cx.settings.isolation));
    let next = match f(D::conn(&mut tx), state).await {
        Ok(next) => next,
        Err(error) => {
            rollback::<D>(&mut tx).await;
            return Err(Error::Handler { error });
        }
    };
    let saved = match serde_json::to_value(&next) {
        Ok(saved) => saved,
        Err(e) => {
            rollback::<D>(&mut tx).await;
            return Err(Error::Decode(e));
        }
    };
    let params = checkpoint_params(held.key, held.token, ordinal, Some(&saved), Some(held.lease));
    let steps = [Step::Query(&cx.schema.sql().checkpoint_or_abort, params), Step::Commit];
    if let Err(e) = D::send(&mut tx, &steps).await {
        rollback::<D>(&mut tx).await;
        return Err(cx.ours(e));
    }
    Ok(next)
}

/// An outside step: the call with the heartbeat running, then its recovery point on its own.
async fn outside<D, S, E>(
    cx: &Context<'_, D>,
    held: &Held<'_>,
    ordinal: i32,
    name: &str,
    call: BoxFuture<'static, Result<S, E>>,
    wrap: Wrap<'_, S, E>,
) -> Result<S, Error<E>>
where
    D: Driver,
    S: Serialize,
{
    let beat = Heartbeat::start(cx.driver.clone(), cx.schema.clone(), held.key.clone(), held.token, held.lease);
    let result = wrap(call).await;
    drop(beat);
    let next = result.map_err(|error| Error::Handler { error })?;
    let saved = serde_json::to_value(&next).map_err(Error::Decode)?;
    let params = checkpoint_params(held.key, held.token, ordinal, Some(&saved), Some(held.lease));
    let mut tx = cx.driver.connection().await.map_err(Error::widen)?;
    let row = only(D::send(&mut tx, &[Step::Query(&cx.schema.sql().checkpoint, params)]).await.map_err(|e| cx.ours(e))?).map_err(Error::widen)?;
    match row.boolean("checkpointed").map_err(Error::widen)? {
        Some(true) => Ok(next),
        Some(false) => Err(cx.lease_lost()),
        None => Err(Error::protocol(format!("idem_checkpoint answered NULL after step {name:?}"))),
    }
}

/// How the finishing transaction ended.
enum Finished<R> {
    /// Completed with the key, committed.
    Committed(R),
    /// A transient result: rolled back, the key to be released.
    Transient(R),
}

/// One try of the finishing transaction: its writes, then `idem_complete` with `COMMIT`.
async fn finish_once<D, S, R, E>(
    cx: &Context<'_, D>,
    held: &Held<'_>,
    f: &FinishFn<D::Conn, S, R, E>,
    state: S,
) -> Result<Finished<R>, Error<E>>
where
    D: Driver,
    R: Replayable,
{
    let mut tx = cx.driver.connection().await.map_err(Error::widen)?;
    D::queue(&mut tx, &Step::Begin(cx.settings.isolation));
    let value = match f(D::conn(&mut tx), state).await {
        Ok(value) => value,
        Err(error) => {
            rollback::<D>(&mut tx).await;
            return Err(Error::Handler { error });
        }
    };
    let status = match value.verdict() {
        Verdict::Transient => {
            rollback::<D>(&mut tx).await;
            return Ok(Finished::Transient(value));
        }
        Verdict::Success => Status::Success,
        Verdict::Failure => Status::Failed,
    };
    let stored = match serde_json::to_value(&value) {
        Ok(stored) => stored,
        Err(e) => {
            rollback::<D>(&mut tx).await;
            return Err(Error::Decode(e));
        }
    };
    let steps = [Step::Query(&cx.schema.sql().complete_or_abort, complete_params(held.key, held.token, Some(&stored), status)), Step::Commit];
    if let Err(e) = D::send(&mut tx, &steps).await {
        rollback::<D>(&mut tx).await;
        return Err(cx.ours(e));
    }
    Ok(Finished::Committed(value))
}

/// A step's (or the finish's) error: a transient one releases the key (`RESUMABLE`, counted), a
/// permanent one completes it `FAILED` with its response.
async fn failed<D: Driver, R, E: HandlerError>(cx: &Context<'_, D>, held: &Held<'_>, error: E) -> Result<Outcome<R>, Error<E>> {
    match error.disposition() {
        Disposition::Transient => {
            let answer = calls::release(cx.driver, cx.schema, held.key, held.token, cx.settings.max_retries).await.map_err(Error::widen)?;
            cx.released(Some(answer), Err(error))
        }
        Disposition::Permanent(response) => {
            match calls::complete(cx.driver, cx.schema, held.key, held.token, response.as_ref(), Status::Failed).await.map_err(Error::widen)? {
                true => Err(Error::Handler { error }),
                false => Err(cx.lease_lost()),
            }
        }
    }
}

/// One row of `idem_resumable`.
pub(crate) struct ResumableKey {
    pub(crate) user_id: String,
    pub(crate) key: String,
    pub(crate) request_hash: String,
    pub(crate) state: Option<Value>,
}

/// `idem_resumable(operation, batch_size)`: the caller's `RESUMABLE` keys, oldest first.
pub(crate) async fn resumable<D: Driver>(cx: &Context<'_, D>, operation: &str, batch: i32) -> Result<Vec<ResumableKey>, Error> {
    let mut tx = cx.driver.connection().await?;
    let rows = D::send(&mut tx, &[Step::Query(&cx.schema.sql().resumable, vec![Param::Text(operation), Param::Int4(batch)])]).await?;
    rows.iter()
        .map(|row| {
            Ok(ResumableKey {
                user_id: crate::row::required("user_id", row.text("user_id"))?,
                key: crate::row::required("key", row.text("key"))?,
                request_hash: crate::row::required("request_hash", row.text("request_hash"))?,
                state: row.json("state")?,
            })
        })
        .collect()
}
