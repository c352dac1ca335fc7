//! Layer lint: clippy over every crate and target, the extension included, with the lints of the
//! root Cargo.toml's `[workspace.lints]`; a warning fails.

use crate::harness::Ctx;
use crate::report::Checks;
use std::process::Command;

/// Runs the layer.
pub(crate) fn run(_: &Ctx, checks: &mut Checks) {
    let log = checks.log_path().to_owned();
    let ok = crate::sh::to_log(Command::new("cargo").args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]), &log);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let findings: Vec<&str> = text.lines().filter(|l| l.starts_with("warning") || l.starts_with("error")).take(30).collect();
    checks.check("cargo clippy --workspace --all-targets -- -D warnings", if ok { Ok(()) } else { Err(findings.join("\n")) });
}
