//! The actix-web twin of [`charges`](crate::charges): an idempotent `POST /charges` on
//! [`IdempotencyLayer`] in in-transaction mode (`.wrap(layer)` on the resource), over either
//! driver: the charge row and the stored response commit together.
//!
//! Served by the binary `actix_charges` (`src/bin/actix_charges.rs`; this crate's feature
//! `actix`), over tokio-postgres, or over sqlx with `IDEM_DRIVER=sqlx`:
//!
//! ```sh
//! DATABASE_URL=postgresql://postgres@127.0.0.1:55415/postgres BIND=127.0.0.1:3000 \
//!     cargo run -p idempotency-examples --features actix --bin actix_charges
//! curl -i -X POST localhost:3000/charges -H 'Idempotency-Key: k-1' -H 'X-User: u-1' -d '{"amount": 100}'
//! ```
//!
//! The answers are those of the axum example, from the same layer configuration: 400 without an
//! `Idempotency-Key` (bare or quoted) or with a bad one, 401 without `X-User`, the stored
//! response with `Idempotent-Replayed: true` for a retry, 409 + `Retry-After` while another
//! attempt holds the key, 422 when the key was used for another request, 413 for a body over
//! 1 MiB, 503 when the store is down. The handler only charges.

use actix_web::http::header;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use crate::store::Charges;
use idempotency_actix::{Connection, IdempotencyLayer};
use idempotency_client::{Driver, Idempotency};
use serde_json::{json, Value};

/// The SQL the route needs next to the extension.
pub const SCHEMA: &str = crate::charges::SCHEMA;

/// The layer: the configuration of the axum example (the user from `X-User`).
pub fn layer<D: Driver>(idem: Idempotency<D>) -> IdempotencyLayer<D> {
    IdempotencyLayer::in_transaction(idem)
        .user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned))
        .build()
        .expect("a complete layer configuration")
}

/// Adds the route, wrapped in `layer`, to an app.
pub fn routes<D: Charges>(layer: IdempotencyLayer<D>) -> impl Fn(&mut web::ServiceConfig) + Clone {
    move |config| {
        config.service(web::resource("/charges").wrap(layer.clone()).route(web::post().to(create_charge::<D>)));
    }
}

/// The server on `listener` (two workers), to run in an actix-web system (see the binary).
pub fn server<D: Charges>(idem: Idempotency<D>, listener: std::net::TcpListener) -> std::io::Result<actix_web::dev::Server> {
    let layer = layer(idem);
    Ok(HttpServer::new(move || App::new().configure(routes(layer.clone()))).listen(listener)?.workers(2).run())
}

/// Charges `{"amount": N}` for the `X-User`, through the request's transaction, used as the
/// connection itself. A 4xx is stored and replayed like a 201; a 500 (a database error) releases
/// the key for the retry.
async fn create_charge<D: Charges>(mut tx: Connection<D>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let user = req.headers().get("x-user").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let amount = serde_json::from_slice::<Value>(&body).ok().and_then(|v| v.get("amount").and_then(Value::as_i64));
    let Some(amount) = amount.filter(|a| *a > 0) else {
        return HttpResponse::UnprocessableEntity().json(json!({"error": "amount must be positive"}));
    };
    match D::insert(&mut tx, &user, amount).await {
        Ok(id) => HttpResponse::Created()
            .insert_header((header::LOCATION, format!("/charges/{id}")))
            .json(json!({"id": id, "amount": amount})),
        Err(e) => HttpResponse::InternalServerError().json(json!({"error": e})),
    }
}
