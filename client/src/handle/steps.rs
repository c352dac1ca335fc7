//! The entry points of a request of several steps: `run_steps`, and the completer `resume`
//! over a registry of plans by operation ([`Plans`]).

use super::{deadline, Idempotency};
use crate::driver::Driver;
use crate::error::Error;
use crate::flow;
use crate::handler_error::{Disposition, HandlerError};
use crate::response::Replayable;
use crate::steps::{Plan, Resumed};
use crate::types::Token;
use crate::Outcome;
use futures_util::future::BoxFuture;
use idempotency_core::{Fingerprint, Key};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

impl<D: Driver> Idempotency<D> {
    /// A request of several steps that resumes where it stopped (the repository's
    /// docs/recovery-points.md): one statement reserves the key and saves `input` as recovery
    /// point 0 (so a completer can resume from the record alone: `input` must fit
    /// `idempotency.max_response_bytes`); then each step of `plan` after the last recovery
    /// point, the state passing from step to step; then `plan`'s finish, whose result is stored
    /// and returned as `Outcome::Executed`.
    ///
    /// - A key with a recovery point and no live holder (`RESUMABLE`, or `PROCESSING` with its
    ///   lease run out) is resumed: the steps continue after the recorded one, with the recorded
    ///   state (`input` is not used). Every other answer is as [`Idempotency::run_external`]'s:
    ///   a replay, a stored failure, in progress, a mismatch.
    /// - A local step runs in a transaction whose `idem_checkpoint` leaves with the `COMMIT`
    ///   (no extra round trip); 40001 / 40P01 retry it, up to
    ///   [`crate::Settings::serialization_retries`] times. An outside step runs while a
    ///   background heartbeat keeps the lease (no pooled connection held), then records its
    ///   recovery point in one statement.
    /// - A step's (or the finish's) transient error, or a transient finish result, releases
    ///   the key: it stays `RESUMABLE` (counted toward `max_retries`), and the next call with
    ///   the key, or a completer ([`Idempotency::resume`]), continues at the last recovery
    ///   point. A permanent error completes it `FAILED` with its response, as `run`.
    ///
    /// Round trips: 1 for the reservation; per local step, its statements plus 1 (checkpoint
    /// and `COMMIT`); per outside step, 1 (its checkpoint); the finish's statements plus 1.
    /// The lease is [`crate::Settings::lease`] (60 s by default, as `run_external`'s).
    /// [`crate::Settings::call_timeout`] bounds the database parts; an outside call is never
    /// cut (bound it yourself and return a transient error).
    ///
    /// # Errors
    ///
    /// Those of [`Idempotency::run_external`] but [`Error::RecordFailed`]: [`Error::LeaseLost`]
    /// when a recovery point or the completion found the key taken over (the step's writes
    /// rolled back; the attempt holding it continues), [`Error::Handler`] / [`Error::Poisoned`]
    /// with a step's error, [`Error::Configuration`] for a plan whose step names break a rule
    /// (1 to 64 bytes of `[A-Za-z0-9_.-]`, unique) or that has no finish,
    /// [`Error::ResponseTooLarge`] (the key keeps the marker: the outside steps happened),
    /// [`Error::Decode`] for a state that does not serialize or a recorded one that is not an
    /// `S`, [`Error::Database`] `54000` for an `input` over the server's bound (nothing kept).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in the client's sense at every await: no pooled connection is left inside a
    /// transaction (a dropped step's transaction rolls back on a closed connection) and nothing
    /// of the dropped call's own commits after the drop. Dropped before the reservation
    /// answered, nothing exists or the key is held with recovery point 0; in a local step, the
    /// last recovery point stands; during an outside call, that call may or may not have
    /// happened and a resume repeats it with the same [`crate::DerivedKey`]. A drop releases
    /// nothing: the lease runs out and the next call with the key, or a completer, resumes it
    /// (counted toward `max_retries`).
    pub async fn run_steps<S, R, E>(&self, key: &Key, fingerprint: &Fingerprint, plan: &Plan<S, R, E, D>, input: S) -> Result<Outcome<R>, Error<E>>
    where
        S: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
        R: Replayable + Send,
        E: HandlerError + Send + 'static,
    {
        crate::trace::call("run_steps", key, self.steps_unbounded(key, fingerprint.as_str(), plan, input)).await
    }

    /// `run_steps` for the request `hash` (the completer's, read from the record), within the
    /// call's deadline around every part but the outside calls.
    async fn steps_unbounded<S, R, E>(&self, key: &Key, hash: &str, plan: &Plan<S, R, E, D>, input: S) -> Result<Outcome<R>, Error<E>>
    where
        S: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
        R: Replayable + Send,
        E: HandlerError + Send + 'static,
    {
        let outside = deadline::Outside::default();
        let wrap = |call: BoxFuture<'static, Result<S, E>>| -> BoxFuture<'static, Result<S, E>> { Box::pin(outside.wrap(call)) };
        let flow = async {
            let schema = self.resolve_schema().await.map_err(Error::widen)?;
            flow::steps::run(&self.context(&schema), key, hash, plan, input, &wrap).await
        };
        deadline::around_outside("run_steps", self.settings.call_timeout, outside.clone(), flow).await
    }

    /// The two-phase layer's `Steps` (the repository's docs/recovery-points.md, "In the
    /// layer"): `plan` for a key the layer holds with `token`, reserved `created` (`reached`
    /// 0, `recorded` `None`) or `resume` (the recorded step and state); returns the finish's
    /// result, recorded as the recovery point after the last step. Within the call's deadline
    /// around every part but the outside calls. Hidden: the layer crates' seam.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub async fn run_steps_held<S, R, E>(
        &self,
        key: &Key,
        token: Token,
        reached: i32,
        recorded: Option<Value>,
        plan: &Plan<S, R, E, D>,
        input: S,
    ) -> Result<R, Error<E>>
    where
        S: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
        R: Serialize + DeserializeOwned + Send + 'static,
        E: HandlerError + Send + 'static,
    {
        let outside = deadline::Outside::default();
        let wrap = |call: BoxFuture<'static, Result<S, E>>| -> BoxFuture<'static, Result<S, E>> { Box::pin(outside.wrap(call)) };
        let flow = async {
            let schema = self.resolve_schema().await.map_err(Error::widen)?;
            flow::steps::run_held(&self.context(&schema), key, token, reached, recorded, plan, input, &wrap).await
        };
        deadline::around_outside("run_steps", self.settings.call_timeout, outside.clone(), flow).await
    }

    /// The two-phase flow of `run_external` for the layer, whose reservation may answer
    /// `resume`: `start` gets the token and, on `resume`, the recorded step and state (for
    /// [`Idempotency::run_steps_held`]). Hidden: the layer crates' seam.
    #[doc(hidden)]
    pub async fn run_external_resumable<T, E, C, St, Rec>(&self, key: &Key, fingerprint: &Fingerprint, start: St, record: Rec) -> Result<Outcome<T>, Error<E>>
    where
        T: Replayable + Send + Sync,
        E: HandlerError + Send,
        C: std::future::Future<Output = Result<T, E>> + Send,
        St: FnOnce(Token, Option<(i32, Option<Value>)>) -> C + Send,
        Rec: for<'t> FnMut(&'t mut D::Conn, &'t T) -> crate::TxFuture<'t, (), E> + Send,
    {
        let outside = deadline::Outside::default();
        let wrapped = outside.clone();
        let start = move |token, resumed| wrapped.wrap(start(token, resumed));
        let flow = async {
            if let Some(hit) = crate::cache::hit(self.settings.replay_cache.as_ref(), key, fingerprint) {
                return hit;
            }
            let schema = self.resolve_schema().await.map_err(Error::widen)?;
            flow::two_phase::run(&self.context(&schema), key, fingerprint, true, start, record).await
        };
        crate::trace::call("run_external", key, deadline::around_outside("run_external", self.settings.call_timeout, outside, flow)).await
    }

    /// A completer's pass over `operation` (docs/recovery-points.md, "The completer"): reads up
    /// to `batch` of its `RESUMABLE` keys (`idem_resumable`, the caller's own, oldest first) and
    /// resumes each through the plan `plans` registers for `operation`, from the recorded state
    /// alone; answers how many were completed, released again, failed, found in progress, or
    /// not resumed. Run it on a timer in any number of processes: completers and client
    /// retries race only for the key's lock, and one of them resumes it.
    ///
    /// # Errors
    ///
    /// The lookup's: [`Error::StoreUnavailable`], [`Error::IncompatibleExtension`] (an extension
    /// without `idem_resumable`), [`Error::Database`] (`22023` for a batch below 1),
    /// [`Error::Configuration`] when `plans` has no plan for `operation`. A key that could not
    /// be resumed is counted in [`Resumed::errors`], not returned.
    ///
    /// # Cancel safety
    ///
    /// As [`Idempotency::run_steps`] for the key being resumed when dropped; the keys after it
    /// are left `RESUMABLE` for the next pass.
    pub async fn resume(&self, plans: &Plans<D>, operation: &str, batch: i32) -> Result<Resumed, Error> {
        let plan = plans.0.get(operation).ok_or_else(|| Error::Configuration {
            reason: format!("operation {operation:?} has no plan registered in the completer's Plans"),
            source: None,
        })?;
        let schema = deadline::bounded("resume", self.settings.call_timeout, self.resolve_schema()).await?;
        let keys = deadline::bounded("resume", self.settings.call_timeout, flow::steps::resumable(&self.context(&schema), operation, batch)).await?;
        let mut resumed = Resumed::default();
        for row in keys {
            let Ok(key) = Key::new(operation, row.user_id, row.key) else {
                resumed.errors += 1;
                continue;
            };
            match plan.resume_one(self, key, row.request_hash, row.state).await {
                Count::Completed => resumed.completed += 1,
                Count::Released => resumed.released += 1,
                Count::Failed => resumed.failed += 1,
                Count::InProgress => resumed.in_progress += 1,
                Count::Error => resumed.errors += 1,
            }
        }
        Ok(resumed)
    }
}

/// Where one resumed key is counted.
enum Count {
    Completed,
    Released,
    Failed,
    InProgress,
    Error,
}

/// A plan whatever its state, response and error types, for the completer.
trait Resumable<D: Driver>: Send + Sync {
    fn resume_one<'a>(&'a self, idem: &'a Idempotency<D>, key: Key, hash: String, state: Option<Value>) -> BoxFuture<'a, Count>;
}

impl<S, R, E, D> Resumable<D> for Plan<S, R, E, D>
where
    D: Driver,
    S: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    R: Replayable + Send + 'static,
    E: HandlerError + Send + 'static,
{
    fn resume_one<'a>(&'a self, idem: &'a Idempotency<D>, key: Key, hash: String, state: Option<Value>) -> BoxFuture<'a, Count> {
        Box::pin(async move {
            // The recorded state: the input a key created afresh would start from (one whose
            // record expired between the listing and the resume).
            let Ok(input) = serde_json::from_value::<S>(state.unwrap_or(Value::Null)) else { return Count::Error };
            let result = crate::trace::call("resume", &key, idem.steps_unbounded(&key, &hash, self, input)).await;
            match &result {
                Ok(Outcome::Executed(_) | Outcome::Replayed(_)) => Count::Completed,
                Ok(Outcome::Released(_)) => Count::Released,
                Err(Error::Handler { .. }) if !permanent(&result) => Count::Released,
                Ok(Outcome::Poisoned(_)) | Err(Error::Poisoned { .. } | Error::Failed { .. } | Error::Mismatch | Error::Handler { .. }) => Count::Failed,
                Err(Error::InProgress { .. } | Error::LeaseLost { .. }) => Count::InProgress,
                Err(_) => Count::Error,
            }
        })
    }
}

/// Whether a run's error is a step's permanent error (the key completed `FAILED`).
fn permanent<T, E: HandlerError>(result: &Result<T, Error<E>>) -> bool {
    matches!(result, Err(Error::Handler { error }) if matches!(error.disposition(), Disposition::Permanent(_)))
}

/// The completer's registry: the [`Plan`] of each operation it resumes.
pub struct Plans<D: Driver>(HashMap<String, Arc<dyn Resumable<D>>>);

impl<D: Driver> Default for Plans<D> {
    fn default() -> Self {
        Plans(HashMap::new())
    }
}

impl<D: Driver> std::fmt::Debug for Plans<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl<D: Driver> Plans<D> {
    /// No plan yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `plan` for the keys of `operation` (a later one for the same operation
    /// replaces it).
    pub fn with<S, R, E>(mut self, operation: &str, plan: &Plan<S, R, E, D>) -> Self
    where
        S: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
        R: Replayable + Send + 'static,
        E: HandlerError + Send + 'static,
    {
        self.0.insert(operation.to_owned(), Arc::new(plan.clone()));
        self
    }
}
