//! The entry points in their async-closure form: `run_async`, `run_batch_async` and
//! `run_external_async` take `async move |tx| { .. }` and hand the flows the boxed form
//! (`TxFuture`) that `run`, `run_batch` and `run_external` take, one clone of the closure per
//! try. The traits [`TxFn`], [`BatchFn`] and [`RecordFn`] state, for every lifetime of the
//! transaction's borrow, that the closure's future is `Send`: the bound a spawned handler (axum,
//! tonic, a `tokio::spawn`) needs, which stable Rust cannot write on the async-closure traits
//! themselves (see [`Idempotency::run_async`]).

use super::Idempotency;
use crate::batch::{BatchItem, BatchOutcome};
use crate::driver::Driver;
use crate::error::Error;
use crate::handler_error::HandlerError;
use crate::response::Replayable;
use crate::Outcome;
use idempotency_core::{Fingerprint, Key};
use std::future::Future;

/// An async closure of [`Idempotency::run_async`] called once on a transaction's connection
/// `&'t mut C`, whose future is `Send` and borrows nothing longer than the connection.
/// Implemented for every such closure: you never implement it, only meet it in a bound.
pub trait TxFn<'t, C: ?Sized + 't, T, E>: FnOnce(&'t mut C) -> <Self as TxFn<'t, C, T, E>>::Future {
    /// The closure's future.
    type Future: Future<Output = Result<T, E>> + Send + 't;
}

impl<'t, C: ?Sized + 't, T, E, F, Fut> TxFn<'t, C, T, E> for F
where
    F: FnOnce(&'t mut C) -> Fut,
    Fut: Future<Output = Result<T, E>> + Send + 't,
{
    type Future = Fut;
}

/// An async closure of [`Idempotency::run_batch_async`]: [`TxFn`] with the created keys.
pub trait BatchFn<'t, C: ?Sized + 't, T, E>: FnOnce(&'t mut C, &'t [String]) -> <Self as BatchFn<'t, C, T, E>>::Future {
    /// The closure's future.
    type Future: Future<Output = Result<Vec<T>, E>> + Send + 't;
}

impl<'t, C: ?Sized + 't, T, E, F, Fut> BatchFn<'t, C, T, E> for F
where
    F: FnOnce(&'t mut C, &'t [String]) -> Fut,
    Fut: Future<Output = Result<Vec<T>, E>> + Send + 't,
{
    type Future = Fut;
}

/// The `record` closure of [`Idempotency::run_external_async`]: [`TxFn`] with the outside
/// call's result.
pub trait RecordFn<'t, C: ?Sized + 't, T: 't, E>: FnOnce(&'t mut C, &'t T) -> <Self as RecordFn<'t, C, T, E>>::Future {
    /// The closure's future.
    type Future: Future<Output = Result<(), E>> + Send + 't;
}

impl<'t, C: ?Sized + 't, T: 't, E, F, Fut> RecordFn<'t, C, T, E> for F
where
    F: FnOnce(&'t mut C, &'t T) -> Fut,
    Fut: Future<Output = Result<(), E>> + Send + 't,
{
    type Future = Fut;
}

/// Calls `f` through [`TxFn`] (not through `AsyncFnOnce`, whose future has no `Send` bound).
fn call<'t, C: ?Sized + 't, T, E, F: TxFn<'t, C, T, E>>(f: F, conn: &'t mut C) -> F::Future {
    f(conn)
}

fn call_batch<'t, C: ?Sized + 't, T, E, F: BatchFn<'t, C, T, E>>(f: F, conn: &'t mut C, keys: &'t [String]) -> F::Future {
    f(conn, keys)
}

fn call_record<'t, C: ?Sized + 't, T: 't, E, F: RecordFn<'t, C, T, E>>(f: F, conn: &'t mut C, result: &'t T) -> F::Future {
    f(conn, result)
}

impl<D: Driver> Idempotency<D> {
    /// [`Idempotency::run`] with an async closure: the same flow, rules, answers and round
    /// trips, written without `Box::pin`:
    ///
    /// ```no_run
    /// # async fn f(idem: idempotency_client::Idempotency, key: idempotency_client::Key, fp: idempotency_client::Fingerprint) {
    /// use idempotency_client::StoredResponse;
    /// let amount: i64 = 100;
    /// let outcome = idem
    ///     .run_async(&key, &fp, async move |tx| {
    ///         tx.execute("INSERT INTO charges (amount) VALUES ($1)", &[&amount]).await?;
    ///         Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, serde_json::json!({ "amount": amount })))
    ///     })
    ///     .await;
    /// # }
    /// ```
    ///
    /// **Why a second method, and its two rules.** A handler that axum, tonic or
    /// `tokio::spawn` runs must be a `Send` future, so the closure's future must be bounded
    /// `Send`; stable Rust (1.95) cannot name the future of an `AsyncFnMut` or `AsyncFnOnce`
    /// closure (`CallRefFuture`, `CallOnceFuture` are unstable, and return-type notation is not
    /// stable), so the bound goes through `FnOnce` ([`TxFn`]), and that shapes the closure:
    ///
    /// - it is **cloned for each try** (the flow runs it again after a 40001 / 40P01): it must
    ///   be `Clone`, and what it changes in its captures is not seen by the next try;
    /// - it **owns what it captures** (`async move`, cloning an `Arc` or a `String` in): one that
    ///   borrows a local is refused ("borrowed value does not live long enough ... argument
    ///   requires that ... is borrowed for `'static`"), a limit of higher-ranked bounds.
    ///
    /// A closure that borrows from its surroundings or keeps state across tries uses
    /// [`Idempotency::run`]'s boxed form, which stays. Rust cannot infer the error type
    /// through `?`: name it in the final `Ok::<_, E>(..)` (or annotate the closure's return).
    ///
    /// # Errors
    ///
    /// Those of [`Idempotency::run`] (the repository's docs/rust-client.md, "Errors", has the
    /// table of what each means and whether a retry is safe: [`Error::is_retryable`]).
    ///
    /// # Cancel safety
    ///
    /// As [`Idempotency::run`]: dropped at any await, the connection is closed, the server rolls
    /// back, and the key is free for the next attempt (or completed, when the `COMMIT` had
    /// already left). docs/rust-client.md, "When a call is dropped".
    pub async fn run_async<T, E, F>(&self, key: &Key, fingerprint: &Fingerprint, work: F) -> Result<Outcome<T>, Error<E>>
    where
        T: Replayable + Send,
        E: HandlerError + Send,
        F: AsyncFnOnce(&mut D::Conn) -> Result<T, E> + for<'t> TxFn<'t, D::Conn, T, E> + Clone + Send,
    {
        self.run(key, fingerprint, move |conn| Box::pin(call(work.clone(), conn))).await
    }

    /// [`Idempotency::run_batch`] with an async closure, `async move |tx, created| { .. }`
    /// returning one result per created key; the rules of [`Idempotency::run_async`] (cloned
    /// per try, owns its captures) apply.
    ///
    /// # Errors
    ///
    /// Those of [`Idempotency::run_batch`] (docs/rust-client.md, "Errors").
    ///
    /// # Cancel safety
    ///
    /// As [`Idempotency::run_batch`]: dropped at any await, the connection is closed and the
    /// server rolls the whole batch back, reservations included.
    pub async fn run_batch_async<T, E, F>(
        &self,
        operation: &str,
        user_id: &str,
        items: &[BatchItem],
        work: F,
    ) -> Result<Vec<(String, BatchOutcome<T>)>, Error<E>>
    where
        T: Replayable + Send,
        E: HandlerError + Send,
        F: AsyncFnOnce(&mut D::Conn, &[String]) -> Result<Vec<T>, E> + for<'t> BatchFn<'t, D::Conn, T, E> + Clone + Send,
    {
        self.run_batch(operation, user_id, items, move |conn, keys| Box::pin(call_batch(work.clone(), conn, keys))).await
    }

    /// [`Idempotency::run_external`] with an async `record` closure,
    /// `async move |tx, result| { .. }`; `call` is a future, as there. The rules of
    /// [`Idempotency::run_async`] (cloned per try, owns its captures) apply to `record`.
    ///
    /// # Errors
    ///
    /// Those of [`Idempotency::run_external`] (docs/rust-client.md, "Errors"), among them
    /// [`Error::RecordFailed`] when `record` failed for good after `call` succeeded.
    ///
    /// # Cancel safety
    ///
    /// As [`Idempotency::run_external`]: dropped before `call` started it leaves nothing;
    /// dropped once `call` may have started it keeps the key `PROCESSING` until its lease ends
    /// (docs/rust-client.md, "When a call is dropped").
    pub async fn run_external_async<T, E, C, R>(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        call: C,
        record: R,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Replayable + Send + Sync,
        E: HandlerError + Send,
        C: Future<Output = Result<T, E>> + Send,
        R: AsyncFnOnce(&mut D::Conn, &T) -> Result<(), E> + for<'t> RecordFn<'t, D::Conn, T, E> + Clone + Send,
    {
        self.run_external(key, fingerprint, call, move |conn, result| Box::pin(call_record(record.clone(), conn, result))).await
    }
}
