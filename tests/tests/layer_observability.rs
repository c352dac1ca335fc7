//! The layer's traces and metrics, seen by a recording `tracing` subscriber and a recording
//! `metrics` recorder (both global, so this file holds one test).
//!
//! Over tokio-postgres; layer_observability_sqlx.rs runs the same suite over sqlx, in a process
//! of its own (the suite installs the process's global tracing subscriber and metrics recorder).

mod kit {
    pub(crate) use idempotency_testkit::driver::over_postgres::*;
}

#[path = "layer_observability/suite.rs"]
mod over_postgres;
