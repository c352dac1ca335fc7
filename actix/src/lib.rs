//! `idempotency-actix`: the idempotency layer for actix-web, over idempotency-tower's core (the
//! same [`Builder`], configuration and rules as the tower layer; see idempotency-tower's docs for
//! the two modes and the answers). An [`IdempotencyLayer`] is an actix-web `Transform`, so
//! `.wrap(layer)` on a resource (or a scope) makes its routes idempotent, and [`Connection`] (and
//! [`Transaction`]) is an actix-web extractor. The client is re-exported as [`client`].
//!
//! ```no_run
//! use actix_web::{web, App, HttpResponse};
//! use idempotency_actix::client::Idempotency;
//! use idempotency_actix::{Connection, IdempotencyLayer};
//!
//! async fn create(tx: Connection, body: web::Bytes) -> HttpResponse {
//!     tx.execute("INSERT INTO charges (user_id, amount) VALUES ('u', 1)", &[]).await.unwrap();
//!     HttpResponse::Created().body(body)
//! }
//!
//! # fn demo(idem: Idempotency) -> Result<(), Box<dyn std::error::Error>> {
//! let layer = IdempotencyLayer::in_transaction(idem)
//!     .user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned))
//!     .build()?;
//! let app = App::new().service(web::resource("/charges").wrap(layer).route(web::post().to(create)));
//! # Ok(())
//! # }
//! ```

mod extract;
mod layer;
mod middleware;
mod respond;

pub use extract::{Connection, Transaction, TransactionRejection};
pub use idempotency_client as client;
pub use idempotency_tower::{default_status_policy, http_status, problem, retry_after, Builder, ConfigError, Mode, Reply, ANONYMOUS_USER, DEFAULT_RESPONSE_LIMIT};
pub use layer::IdempotencyLayer;
pub use middleware::IdempotencyMiddleware;
pub use respond::ErrorResponse;
