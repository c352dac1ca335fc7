//! Layer unit: the pure rules (core), the client without TLS (the feature-off refusals, over
//! both drivers), the layer's crates (idempotency-tower with axum and metrics, idempotency-actix,
//! idempotency-tonic), doc tests included, and the harness's own tests (xtask: its readers of
//! test output, the import check, the feature table's completeness); then the client's TLS code
//! with TLS on, over both drivers. Two builds of the tests, not one per feature set: every set
//! users can pick, of every publishable crate, is compiled instead, `cargo check` of each
//! (crate::features).
use crate::ctx::Ctx;
use crate::report::Checks;
use std::path::Path;

/// Runs the layer.
pub(crate) fn run(_: &Ctx, checks: &mut Checks) {
    let features = "idempotency-client/sqlx,idempotency-tower/axum,idempotency-tower/metrics";
    let crates = ["-p", "idempotency-core", "-p", "idempotency-client", "-p", "idempotency-tower", "-p", "idempotency-actix", "-p", "idempotency-tonic", "-p", "xtask"];
    let mut args = vec!["test", "--no-fail-fast"];
    args.extend(crates);
    args.extend(["--features", features]);
    crate::cargo::test(checks, Path::new("."), &args, &[]);
    crate::cargo::test(checks, Path::new("."), &["test", "--no-fail-fast", "-p", "idempotency-client", "--features", "tls,sqlx", "--lib", "--", "tls", "driver::sqlx"], &[]);
    crate::features::check(checks);
}
