//! The transaction an in-transaction route's handler writes through.

use crate::Tx;
use std::ops::Deref;

/// The transaction that holds the request's reservation, for an in-transaction route's handler:
/// it dereferences to the pooled `deadpool_postgres::Client` (`query`, `execute`,
/// `prepare_cached`). Whatever the handler writes through it commits together with the stored
/// response, or not at all. The layer begins, completes and commits it: do not `COMMIT` or
/// `ROLLBACK` yourself, and do not keep it after the handler returns.
///
/// With the `axum` feature it is an extractor; any other tower service finds it in the request's
/// extensions.
#[derive(Clone)]
pub struct Transaction(pub(crate) Tx);

impl Deref for Transaction {
    type Target = deadpool_postgres::Client;

    fn deref(&self) -> &deadpool_postgres::Client {
        &self.0
    }
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Transaction")
    }
}

#[cfg(feature = "axum")]
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Transaction {
    type Rejection = axum::response::Response;

    /// The request's transaction; a 500 problem on a route without an in-transaction layer.
    async fn from_request_parts(parts: &mut http::request::Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Transaction>().cloned().ok_or_else(|| {
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
