//! [`Steps`]: a two-phase route's request of several steps (the repository's
//! docs/recovery-points.md, "In the layer"). The layer reserves the key before the handler runs;
//! when the key has a recovery point the reservation answers `resume`, and the handler's
//! `steps.run(&plan, input)` continues after it, with its state, through the client's
//! `run_steps` machinery. The layer heartbeats while the handler runs and stores its response
//! as for every two-phase route; a release (a transient status, a panic) keeps a key with a
//! recovery point `RESUMABLE`.

use idempotency_client::types::Token;
use idempotency_client::{postgres_by_default, Driver, Error, HandlerError, Idempotency, Key, Plan};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::sync::{Arc, Mutex};

postgres_by_default! {
/// The request's steps, for a two-phase route's handler: `async fn create(steps: Steps, ..)`,
/// then `steps.run(&plan, input).await`. The layer holds the key; `run` runs the steps of
/// `plan` after the key's last recovery point (all of them for a new key), each committing its
/// recovery point, then `plan`'s finish, whose writes commit with a last recovery point holding
/// its result; that result is returned, and the handler answers from it (the layer stores the
/// answer and completes the key as for every two-phase route).
///
/// A handler that answers a transient status (5xx, 408, 409, 425, 429) or panics after a step
/// releases the key through `idem_release`: it stays `RESUMABLE` (counted toward
/// `max_retries`), and the client's retry continues after the last recovery point. A step's
/// error is returned to the handler as [`Error::Handler`], the key left to the handler's
/// answer. A retry after the finish's recovery point gets its recorded result without running
/// anything.
///
/// Taken once per request: a second extraction is [`StepsRejection::Taken`]; on a route
/// without a two-phase layer it is [`StepsRejection::Missing`]. With the `axum` feature it is
/// an axum extractor; any other tower service takes it from the request's extensions with
/// [`Steps::take`].
pub struct Steps<D: Driver = Postgres> {
    held: Held<D>,
}
}

struct Held<D: Driver> {
    idem: Idempotency<D>,
    key: Key,
    token: Token,
    reached: i32,
    recorded: Option<Value>,
}

/// The request's [`Steps`], put in its extensions by the two-phase core, until taken.
#[doc(hidden)]
pub struct StepsSlot<D: Driver>(Arc<Mutex<Option<Held<D>>>>);

impl<D: Driver> Clone for StepsSlot<D> {
    fn clone(&self) -> Self {
        StepsSlot(self.0.clone())
    }
}

impl<D: Driver> StepsSlot<D> {
    /// The slot of a key held with `token`, reserved `created` (`resumed` `None`) or `resume`
    /// (the recorded step and state).
    pub(crate) fn new(idem: Idempotency<D>, key: Key, token: Token, resumed: Option<(i32, Option<Value>)>) -> Self {
        let (reached, recorded) = resumed.unwrap_or((0, None));
        StepsSlot(Arc::new(Mutex::new(Some(Held { idem, key, token, reached, recorded }))))
    }
}

impl<D: Driver> Steps<D> {
    /// Takes the request's steps from `extensions` (a tower service's request's).
    ///
    /// # Errors
    ///
    /// [`StepsRejection::Missing`] without a two-phase layer in front,
    /// [`StepsRejection::Taken`] when they were already taken for this request.
    pub fn take(extensions: &http::Extensions) -> Result<Self, StepsRejection> {
        let slot = extensions.get::<StepsSlot<D>>().ok_or(StepsRejection::Missing)?;
        let held = slot.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        held.map(|held| Steps { held }).ok_or(StepsRejection::Taken)
    }

    /// The step the key's record had reached when the layer reserved it (0: a new key, or one
    /// without a recovery point); the finish's is the plan's step count plus 1.
    pub fn reached(&self) -> i32 {
        self.held.reached
    }

    /// Runs `plan` for the request, from the key's last recovery point (`input` is the state
    /// of a key without one), and returns its finish's result (`Idempotency::run_steps`'s
    /// steps, as docs/recovery-points.md describes them).
    ///
    /// # Errors
    ///
    /// [`Error::Handler`] with a step's or the finish's error; [`Error::LeaseLost`] when a
    /// recovery point found the key taken over; [`Error::Configuration`] for a plan whose step
    /// names break a rule or that has no finish; [`Error::Decode`] for a recorded state that
    /// is not an `S` (or a recorded result not an `R`); the store's errors. The key is left to
    /// the handler's answer: answer a transient status to release it.
    ///
    /// # Cancel safety
    ///
    /// As `Idempotency::run_steps`': a dropped step's transaction rolls back, the last recovery
    /// point stands, and the layer's release or lease settles the key.
    pub async fn run<S, R, E>(self, plan: &Plan<S, R, E, D>, input: S) -> Result<R, Error<E>>
    where
        S: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
        R: Serialize + DeserializeOwned + Send + 'static,
        E: HandlerError + Send + 'static,
    {
        let Held { idem, key, token, reached, recorded } = self.held;
        idem.run_steps_held(&key, token, reached, recorded, plan, input).await
    }
}

impl<D: Driver> std::fmt::Debug for Steps<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steps").field("reached", &self.held.reached).finish()
    }
}

/// Why a handler got no [`Steps`]: answered as a 500 problem
/// (`urn:idempotency:problem:no-steps`), whose detail is this error's text (with the `axum`
/// feature it is an `IntoResponse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepsRejection {
    /// The route is not behind an `IdempotencyLayer` in two-phase mode.
    #[error("this route is not behind an IdempotencyLayer in two-phase mode")]
    Missing,
    /// The request's [`Steps`] were already taken: extract them once per handler.
    #[error("the request's Steps were already taken: extract them once per handler")]
    Taken,
}
