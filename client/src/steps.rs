//! A request of several steps that resumes where it stopped (`Idempotency::run_steps`, the
//! repository's docs/recovery-points.md): the [`Plan`] (named steps in order, each a local
//! transaction or an outside call, then a finishing transaction), the [`DerivedKey`] an outside
//! step calls with, and what a completer's pass did ([`Resumed`]).
//!
//! A step's closure is stored boxed (called for every key, every try); the async-closure forms
//! ([`Plan::local`], [`Plan::outside`], [`Plan::finish`]) are cloned for each call, as
//! `run_async`'s closure is, so their futures can be bounded `Send` on stable Rust
//! (`Idempotency::run_async` says why); the `_boxed` forms take
//! `|tx, state| Box::pin(async move { .. })`.

use crate::driver::{postgres_by_default, Driver};
use futures_util::future::BoxFuture;
use idempotency_core::{Key, KeyError};
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

/// The idempotency key of one outside step of a request, for the outside service
/// (`Key::derive(step)`: stable across retries, resumes and versions; distinct per operation,
/// user, key and step; at most 129 bytes; opaque). Send it as that service's idempotency key
/// (Stripe's `Idempotency-Key` header, say): a step repeated after a crash carries the same one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DerivedKey(String);

impl DerivedKey {
    /// The key of step `step` of `key`'s request; [`KeyError`] naming `step` when the name is
    /// not 1 to 64 bytes of `[A-Za-z0-9_.-]`.
    pub fn of(key: &Key, step: &str) -> Result<Self, KeyError> {
        key.derive(step).map(DerivedKey)
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key, by value.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl AsRef<str> for DerivedKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DerivedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An async closure of a local step or of [`Plan::finish`], called once on a transaction's
/// connection `&'t mut C` with the state: its future is `Send` and borrows nothing longer than
/// the connection. Implemented for every such closure: you only meet it in a bound.
pub trait StepFn<'t, C: ?Sized + 't, S, T, E>: FnOnce(&'t mut C, S) -> <Self as StepFn<'t, C, S, T, E>>::Future {
    /// The closure's future.
    type Future: Future<Output = Result<T, E>> + Send + 't;
}

impl<'t, C: ?Sized + 't, S, T, E, F, Fut> StepFn<'t, C, S, T, E> for F
where
    F: FnOnce(&'t mut C, S) -> Fut,
    Fut: Future<Output = Result<T, E>> + Send + 't,
{
    type Future = Fut;
}

fn call<'t, C: ?Sized + 't, S, T, E, F: StepFn<'t, C, S, T, E>>(f: F, conn: &'t mut C, state: S) -> F::Future {
    f(conn, state)
}

/// A step in a transaction: its writes, then the new state.
pub(crate) type LocalFn<C, S, E> = Arc<dyn for<'t> Fn(&'t mut C, S) -> BoxFuture<'t, Result<S, E>> + Send + Sync>;
/// An outside call with the step's derived key.
pub(crate) type OutsideFn<S, E> = Arc<dyn Fn(DerivedKey, S) -> BoxFuture<'static, Result<S, E>> + Send + Sync>;
/// The finishing transaction: its writes, then the response.
pub(crate) type FinishFn<C, S, R, E> = Arc<dyn for<'t> Fn(&'t mut C, S) -> BoxFuture<'t, Result<R, E>> + Send + Sync>;

/// What a step does.
pub(crate) enum Work<C: ?Sized, S, E> {
    Local(LocalFn<C, S, E>),
    Outside(OutsideFn<S, E>),
}

/// A named step.
pub(crate) struct Step<C: ?Sized, S, E> {
    pub(crate) name: String,
    pub(crate) work: Work<C, S, E>,
}

postgres_by_default! {
/// The steps of a request, in order, and how it finishes (docs/recovery-points.md):
///
/// ```no_run
/// # use idempotency_client::{Plan, StoredResponse};
/// # #[derive(Clone, serde::Serialize, serde::Deserialize)] struct Ride { id: Option<i64>, charge: Option<String> }
/// let plan = Plan::<Ride, StoredResponse, tokio_postgres::Error>::new()
///     .local("create_ride", async |tx, mut ride: Ride| {
///         ride.id = Some(tx.query_one("INSERT INTO rides DEFAULT VALUES RETURNING id", &[]).await?.get(0));
///         Ok(ride) // committed with its recovery point
///     })
///     .outside("charge", async |derived, mut ride: Ride| {
///         ride.charge = Some(format!("charged with key {derived}")); // the card network's call
///         Ok(ride) // then its own recovery point
///     })
///     .finish(async |tx, ride: Ride| {
///         tx.execute("UPDATE rides SET done = true WHERE id = $1", &[&ride.id]).await?;
///         Ok(StoredResponse::json(201, serde_json::json!({"ride": ride.id})))
///     });
/// ```
///
/// Each step has a name, 1 to 64 bytes of `[A-Za-z0-9_.-]`, unique in the plan: it derives the
/// outside step's key ([`DerivedKey`]). The record keeps the ordinal of the last step reached
/// (1 for the first), so steps may be appended to a plan whose keys are in flight, never
/// reordered or removed (a plan that changes its order takes a new operation name).
///
/// - A **local** step (`tx`, the state) runs in a transaction; its `idem_checkpoint` is queued
///   with the `COMMIT`, so its writes and its recovery point commit together. It must not call
///   out. After 40001 / 40P01 it runs again (cloned, as `run_async`'s closure is).
/// - An **outside** step (the [`DerivedKey`], the state) makes its call while a heartbeat keeps
///   the lease (no pooled connection held), then records its recovery point on its own. The
///   service must deduplicate by that key for longer than the key can be resumed.
/// - [`Plan::finish`] writes and completes the key in one transaction; its result is the stored
///   response.
///
/// Every closure is deterministic in the state it is given: a resumed step sees the state of
/// the last recovery point, not the memory of a process that died.
pub struct Plan<S, R, E, D: Driver = Postgres> {
    pub(crate) steps: Vec<Step<D::Conn, S, E>>,
    pub(crate) finish: Option<FinishFn<D::Conn, S, R, E>>,
    /// The first rule a step's name broke, reported by `run_steps`.
    pub(crate) problem: Option<String>,
}
}

impl<S, R, E, D: Driver> Clone for Plan<S, R, E, D> {
    fn clone(&self) -> Self {
        let steps = self
            .steps
            .iter()
            .map(|s| Step {
                name: s.name.clone(),
                work: match &s.work {
                    Work::Local(f) => Work::Local(f.clone()),
                    Work::Outside(f) => Work::Outside(f.clone()),
                },
            })
            .collect();
        Plan { steps, finish: self.finish.clone(), problem: self.problem.clone() }
    }
}

impl<S, R, E, D: Driver> fmt::Debug for Plan<S, R, E, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.steps.iter().map(|s| s.name.as_str()).collect();
        f.debug_struct("Plan").field("steps", &names).field("finish", &self.finish.is_some()).finish()
    }
}

impl<S, R, E, D: Driver> Default for Plan<S, R, E, D> {
    fn default() -> Self {
        Plan { steps: Vec::new(), finish: None, problem: None }
    }
}

impl<S: Send + 'static, R: Send + 'static, E: Send + 'static, D: Driver> Plan<S, R, E, D> {
    /// An empty plan.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(mut self, name: &str, work: Work<D::Conn, S, E>) -> Self {
        if self.problem.is_none() {
            if let Err(e) = idempotency_core::key::check_step_name(name) {
                self.problem = Some(format!("step {name:?}: {e}"));
            } else if self.steps.iter().any(|s| s.name == name) {
                self.problem = Some(format!("step names must be unique in a plan, got {name:?} twice"));
            }
        }
        self.steps.push(Step { name: name.to_owned(), work });
        self
    }

    /// A local step, `async move |tx, state| { ..; Ok(state) }`: its writes and its recovery
    /// point commit together. Cloned for each run (and each try after 40001 / 40P01), so it
    /// owns what it captures, as [`crate::Idempotency::run_async`]'s closure does.
    pub fn local<F>(self, name: &str, f: F) -> Self
    where
        F: AsyncFnOnce(&mut D::Conn, S) -> Result<S, E> + for<'t> StepFn<'t, D::Conn, S, S, E> + Clone + Send + Sync + 'static,
    {
        self.local_boxed(name, move |conn, state| Box::pin(call(f.clone(), conn, state)))
    }

    /// [`Plan::local`] with a boxed closure, `|tx, state| Box::pin(async move { .. })`.
    pub fn local_boxed<F>(self, name: &str, f: F) -> Self
    where
        F: for<'t> Fn(&'t mut D::Conn, S) -> BoxFuture<'t, Result<S, E>> + Send + Sync + 'static,
    {
        self.push(name, Work::Local(Arc::new(f)))
    }

    /// An outside step, `async move |derived, state| { ..; Ok(state) }`: one call to another
    /// service with `derived` as its idempotency key, followed by its recovery point.
    pub fn outside<F, Fut>(self, name: &str, f: F) -> Self
    where
        F: AsyncFnOnce(DerivedKey, S) -> Result<S, E> + FnOnce(DerivedKey, S) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<S, E>> + Send + 'static,
    {
        self.outside_boxed(name, move |derived, state| Box::pin(f.clone()(derived, state)))
    }

    /// [`Plan::outside`] with a boxed closure.
    pub fn outside_boxed<F>(self, name: &str, f: F) -> Self
    where
        F: Fn(DerivedKey, S) -> BoxFuture<'static, Result<S, E>> + Send + Sync + 'static,
    {
        self.push(name, Work::Outside(Arc::new(f)))
    }

    /// How the request finishes, `async move |tx, state| { ..; Ok(response) }`: its writes and
    /// the key's completion commit together; the response is stored and replayed.
    pub fn finish<F>(self, f: F) -> Self
    where
        F: AsyncFnOnce(&mut D::Conn, S) -> Result<R, E> + for<'t> StepFn<'t, D::Conn, S, R, E> + Clone + Send + Sync + 'static,
    {
        self.finish_boxed(move |conn, state| Box::pin(call(f.clone(), conn, state)))
    }

    /// [`Plan::finish`] with a boxed closure.
    pub fn finish_boxed<F>(mut self, f: F) -> Self
    where
        F: for<'t> Fn(&'t mut D::Conn, S) -> BoxFuture<'t, Result<R, E>> + Send + Sync + 'static,
    {
        self.finish = Some(Arc::new(f));
        self
    }

}

impl<S, R, E, D: Driver> Plan<S, R, E, D> {
    /// The names of the steps, in order (the record's step `n` is the `n`-th, from 1).
    pub fn step_names(&self) -> impl Iterator<Item = &str> {
        self.steps.iter().map(|s| s.name.as_str())
    }

    /// Why the plan cannot run: a step's name that breaks a rule, or no `finish`.
    pub(crate) fn check(&self) -> Result<(), String> {
        if let Some(problem) = &self.problem {
            return Err(problem.clone());
        }
        if self.finish.is_none() {
            return Err("a plan needs finish(..): the transaction that completes the key".to_owned());
        }
        debug_assert_eq!(self.steps.iter().map(|s| &s.name).collect::<HashSet<_>>().len(), self.steps.len());
        Ok(())
    }
}

/// What one pass of a completer (`Idempotency::resume`) did with the resumable keys it found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resumed {
    /// Finished now (or found finished: a replay).
    pub completed: usize,
    /// A step failed transiently: released again (`RESUMABLE`, counted).
    pub released: usize,
    /// Failed for good: a permanent error, or poisoned at `max_retries`.
    pub failed: usize,
    /// Another attempt held the key, or took it over meanwhile.
    pub in_progress: usize,
    /// Not resumed for another reason (the store, a state this plan cannot decode, no plan for
    /// the operation): the key stays as it was, for the next pass.
    pub errors: usize,
}
