//! The transaction an in-transaction route's handler writes through.

use crate::driver::{DefaultDriver, Driver};
use std::ops::Deref;

/// The transaction that holds the request's reservation, for an in-transaction route's handler.
/// Over [`crate::Postgres`] it dereferences to the driver's [`crate::Tx`] and through it to the pooled
/// `deadpool_postgres::Client` (`query`, `execute`, `prepare_cached`); over `Sqlx` (feature
/// `sqlx`) to a `SharedConnection`, whose `lock().await` is the `sqlx::PgConnection` to run your
/// queries on (`.execute(&mut *conn)`). Whatever the handler writes through it commits together
/// with the stored response, or not at all. The layer begins, completes and commits it: do not
/// `COMMIT` or `ROLLBACK` yourself, and do not keep it after the handler returns.
///
/// With the `axum` feature it is an extractor; any other tower service finds it in the request's
/// extensions.
pub struct Transaction<D: Driver = DefaultDriver>(pub(crate) D::Shared);

impl<D: Driver> Clone for Transaction<D> {
    fn clone(&self) -> Self {
        Transaction(self.0.clone())
    }
}

impl<D: Driver> Deref for Transaction<D> {
    type Target = D::Shared;

    fn deref(&self) -> &D::Shared {
        &self.0
    }
}

impl<D: Driver> std::fmt::Debug for Transaction<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Transaction")
    }
}

#[cfg(feature = "axum")]
impl<S: Send + Sync, D: Driver> axum::extract::FromRequestParts<S> for Transaction<D> {
    type Rejection = axum::response::Response;

    /// The request's transaction; a 500 problem on a route without an in-transaction layer.
    async fn from_request_parts(parts: &mut http::request::Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Transaction<D>>().cloned().ok_or_else(|| {
            super::problem::Problem::new(
                500,
                super::problem::types::NO_TRANSACTION,
                "No idempotency transaction",
                "this route is not behind an IdempotencyLayer in in-transaction mode",
            )
            .into_response()
        })
    }
}
