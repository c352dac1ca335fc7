//! Layer pg_upgrade: tests/pg_upgrade.rs (ignored by the plain e2e run), pg_upgrade between the
//! relocatable trees of 14 -> 18 and 15 -> 17 on ports 42-45 above the private cluster's; runs
//! when the extension is installed in those four trees (a run of their majors installs it),
//! otherwise reported as skipped.

use crate::harness::Ctx;
use crate::report::Checks;
use idempotency_pgserver::{extension_installed, tree};
use std::path::Path;

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let missing: Vec<String> = [14, 15, 17, 18]
        .into_iter()
        .filter(|m| !tree(*m).is_ok_and(|c| extension_installed(&c)))
        .map(|m| m.to_string())
        .collect();
    if !missing.is_empty() {
        checks.skip(&format!("the extension is not installed in the relocatable tree of {}", missing.join(", ")));
        return;
    }
    let base = (ctx.port + 40).to_string();
    crate::cargo::test(checks, Path::new("."), &["test", "-p", "idempotency-tests", "--test", "pg_upgrade", "--", "--ignored"], &[("IDEM_SERVERS_PORT", &base)]);
}
