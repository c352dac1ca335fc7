//! A `tracing` span around every call of the handle (feature `tracing`, on with `tower`):
//! `idempotency.call` with the call's name, the operation, the outcome and the duration. The
//! key itself is never recorded.

use crate::error::Error;
use crate::handle::Outcome;
use crate::key::Key;
use std::future::Future;

/// The outcome of a call, as the span records it.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) fn label<T, E>(result: &Result<Outcome<T>, Error<E>>) -> &'static str {
    match result {
        Ok(Outcome::Executed(_)) => "executed",
        Ok(Outcome::Replayed(_)) => "replayed",
        Ok(Outcome::Released(_)) => "released",
        Ok(Outcome::Poisoned(_)) => "poisoned",
        Err(Error::InProgress { .. }) => "in_progress",
        Err(Error::Mismatch) => "mismatch",
        Err(Error::Failed { .. }) => "failed",
        Err(Error::LeaseLost) => "lease_lost",
        Err(Error::StoreUnavailable(_)) => "store_unavailable",
        Err(Error::Handler { poisoned: true, .. }) => "poisoned",
        Err(Error::Handler { .. }) => "handler_error",
        Err(_) => "error",
    }
}

/// Runs `call` inside its span.
#[cfg(feature = "tracing")]
pub(crate) async fn call<T, E>(
    name: &'static str,
    key: &Key,
    call: impl Future<Output = Result<Outcome<T>, Error<E>>>,
) -> Result<Outcome<T>, Error<E>> {
    use tracing::Instrument;
    let span = tracing::debug_span!(
        "idempotency.call",
        call = name,
        operation = key.operation(),
        outcome = tracing::field::Empty,
        duration_ms = tracing::field::Empty,
    );
    let started = std::time::Instant::now();
    let result = call.instrument(span.clone()).await;
    span.record("outcome", label(&result));
    span.record("duration_ms", started.elapsed().as_secs_f64() * 1000.0);
    result
}

/// Runs `call` (no span without the `tracing` feature).
#[cfg(not(feature = "tracing"))]
pub(crate) async fn call<T, E>(
    _name: &'static str,
    _key: &Key,
    call: impl Future<Output = Result<Outcome<T>, Error<E>>>,
) -> Result<Outcome<T>, Error<E>> {
    call.await
}
