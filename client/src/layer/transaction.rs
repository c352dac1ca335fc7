//! The transaction an in-transaction route's handler writes through.

use crate::driver::{postgres_by_default, Driver};
use std::ops::Deref;

postgres_by_default! {
/// The transaction that holds the request's reservation, for an in-transaction route's handler.
/// It dereferences to the driver's [`crate::Lent`] guard, whose `lock().await` is the connection
/// inside the transaction: over [`crate::Postgres`] the pooled `deadpool_postgres::Client`
/// (`query`, `execute`, `prepare_cached`; [`crate::SharedClient`]), over `Sqlx` (feature `sqlx`)
/// the `sqlx::PgConnection` (`.execute(&mut *conn)`; `SharedConnection`). Whatever the handler
/// writes through it commits together with the stored response, or not at all. The layer
/// begins, completes and commits it: do not `COMMIT` or `ROLLBACK` yourself. Once the handler
/// has returned, a copy it kept reaches no connection: its `lock` is
/// [`crate::TransactionEnded`].
///
/// With the `axum` feature it is an axum extractor, with `actix` an actix-web one; any other
/// tower service finds it in the request's extensions.
pub struct Transaction<D: Driver = Postgres>(pub(crate) D::Shared);
}

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

#[cfg(feature = "actix")]
impl<D: Driver> actix_web::FromRequest for Transaction<D> {
    type Error = actix_web::Error;
    type Future = std::future::Ready<Result<Self, actix_web::Error>>;

    /// The request's transaction; a 500 problem on a route without an in-transaction layer.
    fn from_request(req: &actix_web::HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        use actix_web::HttpMessage;
        std::future::ready(req.extensions().get::<Transaction<D>>().cloned().ok_or_else(|| {
            let problem = super::problem::Problem::new(
                500,
                super::problem::types::NO_TRANSACTION,
                "No idempotency transaction",
                "this route is not wrapped in an IdempotencyLayer in in-transaction mode",
            );
            actix_web::error::InternalError::from_response("no idempotency transaction", super::actix::response_of(problem.into_reply())).into()
        }))
    }
}
