//! Layer unit: the pure rules (core), the client without TLS (the feature-off refusals, over
//! both drivers) and with the axum, metrics, actix and tonic features (the layer's adapters), doc
//! tests included, and the harness's own tests (xtask: its readers of test output, the import
//! check, the feature table's completeness); then the client's TLS code with TLS on, over both
//! drivers. Two builds of the client's tests, not one per feature set: every set users can pick
//! is compiled instead, `cargo check` of each (crate::features).
use crate::ctx::Ctx;
use crate::report::Checks;
use std::path::Path;

/// Runs the layer.
pub(crate) fn run(_: &Ctx, checks: &mut Checks) {
    let features = "idempotency-client/axum,idempotency-client/metrics,idempotency-client/actix,idempotency-client/tonic,idempotency-client/sqlx";
    crate::cargo::test(checks, Path::new("."), &["test", "--no-fail-fast", "-p", "idempotency-core", "-p", "idempotency-client", "-p", "xtask", "--features", features], &[]);
    crate::cargo::test(checks, Path::new("."), &["test", "--no-fail-fast", "-p", "idempotency-client", "--features", "tls,sqlx", "--lib", "--", "tls", "driver::sqlx"], &[]);
    crate::features::check(checks);
}
