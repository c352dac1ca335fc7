//! The actix-web extractors: [`Connection`] (the request's transaction used as the connection,
//! extracted once) and [`Transaction`] (its shared form), and their typed rejection
//! [`TransactionRejection`], answered as the layer's no-transaction problem. They wrap
//! idempotency-tower's types (an actix-web trait on them must live here, with the types).

use crate::respond::response_of;
use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpMessage, HttpRequest, HttpResponse, ResponseError};
use idempotency_client::driver::Lease;
use idempotency_client::{postgres_by_default, Driver};
use idempotency_tower::adapter::{shared_of, Problem, Taken};
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;

postgres_by_default! {
/// The request's transaction used as the connection itself, for an in-transaction route's
/// handler: `async fn create(mut tx: Connection, ..)`, then `tx.execute(..)` (over `Postgres` the
/// pooled `deadpool_postgres::Client`) or `sqlx::query(..).execute(&mut *tx)` (over `Sqlx`). It
/// is idempotency-tower's [`Connection`](idempotency_tower::Connection) as an actix-web
/// extractor: taken once per request (a second extraction is [`TransactionRejection`] `Taken`),
/// held for the handler's life; whatever the handler writes through it commits with the stored
/// response, or not at all.
pub struct Connection<D: Driver = Postgres>(idempotency_tower::Connection<D>);
}

postgres_by_default! {
/// The request's transaction in its shared form, locked per use: idempotency-tower's
/// [`Transaction`](idempotency_tower::Transaction) as an actix-web extractor (it dereferences to
/// it). New handlers take a [`Connection`].
#[derive(Debug)]
pub struct Transaction<D: Driver = Postgres>(idempotency_tower::Transaction<D>);
}

impl<D: Driver> Deref for Connection<D> {
    type Target = <D::Shared as Lease>::Conn;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<D: Driver> DerefMut for Connection<D> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<D: Driver> std::fmt::Debug for Connection<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<D: Driver> Deref for Transaction<D> {
    type Target = idempotency_tower::Transaction<D>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<D: Driver> Clone for Transaction<D> {
    fn clone(&self) -> Self {
        Transaction(self.0.clone())
    }
}

/// The shared transaction in the request's extensions, unless its connection was taken.
fn shared<D: Driver>(req: &HttpRequest) -> Result<idempotency_tower::Transaction<D>, TransactionRejection> {
    let extensions = req.extensions();
    shared_of(extensions.get::<Taken>().is_some(), extensions.get::<idempotency_tower::Transaction<D>>()).map_err(TransactionRejection)
}

impl<D: Driver> FromRequest for Transaction<D> {
    type Error = TransactionRejection;
    type Future = std::future::Ready<Result<Self, TransactionRejection>>;

    /// The request's transaction; [`TransactionRejection`] on a route without an in-transaction
    /// layer, or once the handler has taken its [`Connection`].
    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(shared(req).map(Transaction))
    }
}

impl<D: Driver> FromRequest for Connection<D> {
    type Error = TransactionRejection;
    type Future = Pin<Box<dyn Future<Output = Result<Self, TransactionRejection>>>>;

    /// The request's connection, held for the handler's life.
    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let shared = shared::<D>(req);
        if shared.is_ok() {
            req.extensions_mut().insert(Taken);
        }
        Box::pin(async move {
            let held = idempotency_tower::Connection::hold(shared?).await.map_err(TransactionRejection)?;
            Ok(Connection(held))
        })
    }
}

/// Why a handler got no [`Connection`] or [`Transaction`] (idempotency-tower's
/// [`TransactionRejection`](idempotency_tower::TransactionRejection): `Missing`, `Taken`,
/// `Ended`), as an actix-web error: the 500 no-transaction problem, whose detail says why.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TransactionRejection(pub idempotency_tower::TransactionRejection);

impl std::fmt::Debug for TransactionRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for TransactionRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for TransactionRejection {}

impl ResponseError for TransactionRejection {
    fn status_code(&self) -> actix_web::http::StatusCode {
        actix_web::http::StatusCode::INTERNAL_SERVER_ERROR
    }

    fn error_response(&self) -> HttpResponse {
        response_of(Problem::of_rejection(self.0).into_reply())
    }
}
