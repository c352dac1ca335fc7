//! Layer bench: the benchmark in smoke mode on the private cluster: every case runs and
//! produces numbers (no speed asserted).

use crate::ctx::Ctx;
use crate::report::Checks;
use std::process::Command;

/// Runs the layer.
pub(crate) fn run(_: &Ctx, checks: &mut Checks) {
    let log = checks.log_path().to_owned();
    let ok = crate::sh::to_log(Command::new("cargo").args(["build", "--release", "-q", "-p", "idempotency-bench", "--bin", "bench"]), &log)
        && crate::sh::to_log(Command::new("target/release/bench").arg("--smoke"), &log);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    for l in crate::sh::tail(&text, 3).lines() {
        checks.note(l);
    }
    checks.check("target/release/bench --smoke", if ok { Ok(()) } else { Err(crate::sh::tail(&text, 20)) });
}
