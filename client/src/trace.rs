//! A `tracing` span around every call of the handle (feature `tracing`, on with `tower`):
//! `idempotency.call` with the call's name, the operation, the outcome (its
//! [`crate::Decision`] label) and the duration. The key itself is never recorded.

use crate::error::Error;
use crate::Outcome;
use idempotency_core::Key;
use std::future::Future;

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
    span.record("outcome", crate::outcome::decision(&result).as_str());
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
