//! The example services of `idempotency-client`: axum routes behind its
//! [`IdempotencyLayer`](idempotency_tower::IdempotencyLayer). Each is a module to read top
//! to bottom (the routes, their handlers and the SQL they need) and a binary in `src/bin/` that
//! serves it:
//!
//! | module | route | binary |
//! |---|---|---|
//! | [`charges`] | `POST /charges`, in-transaction mode, tokio-postgres | `axum_charges` |
//! | `charges_sqlx` (feature `sqlx`, a default) | the same over sqlx | `axum_charges_sqlx` |
//! | [`payouts`] | `POST /payouts`, two-phase mode, calling a provider stub | `two_phase_stub` |
//! | `actix_charges` (feature `actix`) | `POST /charges` on actix-web, in-transaction, either driver | `actix_charges` |
//! | `grpc_charges` (feature `tonic`) | the gRPC `charges.v1.Charges/Create` on tonic, either mode and driver | `tonic_charges` |
//!
//! ```sh
//! DATABASE_URL=postgresql://postgres@127.0.0.1:55415/postgres BIND=127.0.0.1:3000 \
//!     cargo run -p idempotency-examples --bin axum_charges
//! ```
//!
//! The library is also what the tests (`tests/tests/http.rs`, `tests/tests/failover.rs`) and the
//! benchmark's HTTP rows (`bench/src/http.rs`) serve: the routers the binaries serve, so what
//! they prove and measure is the example itself.

#[cfg(feature = "actix")]
pub mod actix_charges;
pub mod charges;
#[cfg(feature = "tonic")]
pub mod grpc_charges;
#[cfg(feature = "sqlx")]
pub mod charges_sqlx;
pub mod payouts;
pub mod store;
