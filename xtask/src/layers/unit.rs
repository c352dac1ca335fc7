//! Layer unit: the pure rules (core), the client without TLS (the feature-off refusals, over
//! both drivers) and with the axum, metrics, actix and tonic features (the layer's adapters), doc
//! tests included, and the harness's own readers of test output (xtask); then the client's TLS
//! code with TLS on, over both drivers. Two builds of the client, not one per feature set.
use crate::ctx::Ctx;
use crate::report::Checks;
use std::path::Path;

/// Runs the layer.
pub(crate) fn run(_: &Ctx, checks: &mut Checks) {
    let features = "idempotency-client/axum,idempotency-client/metrics,idempotency-client/actix,idempotency-client/tonic,idempotency-client/sqlx";
    crate::cargo::test(checks, Path::new("."), &["test", "--no-fail-fast", "-p", "idempotency-core", "-p", "idempotency-client", "-p", "xtask", "--features", features], &[]);
    crate::cargo::test(checks, Path::new("."), &["test", "--no-fail-fast", "-p", "idempotency-client", "--features", "tls,sqlx", "--lib", "--", "tls", "driver::sqlx"], &[]);
}
