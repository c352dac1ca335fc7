//! Layer lint: clippy over every crate and target, the extension included, with the lints of the
//! root Cargo.toml's `[workspace.lints]`; then the client, its test kit and tests over sqlx with
//! TLS (the code behind those features). A warning fails.

use crate::harness::Ctx;
use crate::report::Checks;
use std::process::Command;

/// Runs the layer.
pub(crate) fn run(_: &Ctx, checks: &mut Checks) {
    let features = "idempotency-client/sqlx,idempotency-client/tls,idempotency-tests/sqlx";
    let runs: [&[&str]; 2] = [
        &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"],
        &["clippy", "-p", "idempotency-client", "-p", "idempotency-testkit", "-p", "idempotency-tests", "--all-targets", "--features", features, "--", "-D", "warnings"],
    ];
    for args in runs {
        let log = checks.log_path().to_owned();
        let (ok, text) = crate::sh::to_log_text(Command::new("cargo").args(args), &log);
        let findings: Vec<&str> = text.lines().filter(|l| l.starts_with("warning") || l.starts_with("error")).take(30).collect();
        checks.check(&format!("cargo {}", args.join(" ")), if ok { Ok(()) } else { Err(findings.join("\n")) });
    }
}
