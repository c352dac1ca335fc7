//! Layer failover: tests/failover.rs (ignored by the plain e2e run), a primary and a synchronous
//! standby of the major, the primary killed under load, the standby promoted: raw SQL, then the
//! example services of both drivers (every build has both) through a host list and a
//! moving endpoint; on ports 400 and 401 above the private cluster's (`IDEM_SERVERS_PORT`
//! overrides the first). Their output (the failover figures) is in the layer's log.

use crate::ctx::Ctx;
use crate::report::Checks;
use std::path::Path;

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let base = std::env::var("IDEM_SERVERS_PORT").unwrap_or_else(|_| (ctx.port + 400).to_string());
    let args = ["test", "--no-fail-fast", "-p", "idempotency-tests", "--test", "failover", "--", "--ignored", "--nocapture", "--test-threads=1"];
    crate::cargo::test_timed(checks, Path::new("."), &args, &[("IDEM_SERVERS_PORT", &base)]);
}
