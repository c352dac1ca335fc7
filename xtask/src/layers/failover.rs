//! Layer failover: tests/failover.rs (ignored by the plain e2e run), a primary and a synchronous
//! standby of the major on ports 40 and 41 above the private cluster's.

use crate::harness::Ctx;
use crate::report::Checks;
use std::path::Path;

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let base = (ctx.port + 40).to_string();
    crate::cargo::test(checks, Path::new("."), &["test", "-p", "idempotency-tests", "--test", "failover", "--", "--ignored"], &[("IDEM_SERVERS_PORT", &base)]);
}
