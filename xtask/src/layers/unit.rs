//! Layer unit: the pure rules (core), the client without TLS (the feature-off refusals) and
//! with the axum, metrics, actix and tonic features (the layer's adapters), then its TLS code, the sqlx driver's constructor without
//! TLS and with it; doc tests included; and the harness's own readers of test output (xtask).

use crate::ctx::Ctx;
use crate::report::Checks;
use std::path::Path;

/// Runs the layer.
pub(crate) fn run(_: &Ctx, checks: &mut Checks) {
    let features = "idempotency-client/axum,idempotency-client/metrics,idempotency-client/actix,idempotency-client/tonic";
    crate::cargo::test(checks, Path::new("."), &["test", "--no-fail-fast", "-p", "idempotency-core", "-p", "idempotency-client", "-p", "xtask", "--features", features], &[]);
    crate::cargo::test(checks, Path::new("."), &["test", "--no-fail-fast", "-p", "idempotency-client", "--features", "tls", "--lib", "tls"], &[]);
    for features in ["sqlx", "sqlx,tls"] {
        crate::cargo::test(checks, Path::new("."), &["test", "--no-fail-fast", "-p", "idempotency-client", "--features", features, "--lib", "driver::sqlx"], &[]);
    }
}
