//! Layer lint: clippy over every crate and target, the extension included, with the lints of the
//! root Cargo.toml's `[workspace.lints]`; then the client with sqlx and TLS (the code behind
//! those features; the test kit and the tests build both drivers in every build). A warning fails. Then the crates.io dry run of the
//! published crates (core, client, and the layer's tower, actix and tonic crates) (`cargo publish --dry-run`: cargo packages them together and builds the
//! client against the core it is about to publish), or `cargo package --offline` where the
//! index is unreachable; the check's name says which ran. `--allow-dirty`: a working tree with
//! uncommitted edits is what a contributor runs the test command in, and dirt says nothing about
//! publishability (the package is built from the working tree either way); CI runs from a clean
//! clone.

use crate::ctx::Ctx;
use crate::report::Checks;
use std::process::Command;

/// Runs the layer.
pub(crate) fn run(_: &Ctx, checks: &mut Checks) {
    let runs: [&[&str]; 2] = [
        &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"],
        &["clippy", "-p", "idempotency-client", "--all-targets", "--features", "sqlx,tls", "--", "-D", "warnings"],
    ];
    for args in runs {
        let log = checks.log_path().to_owned();
        let (ok, text) = crate::sh::to_log_text(Command::new("cargo").args(args), &log);
        let findings: Vec<&str> = text.lines().filter(|l| l.starts_with("warning") || l.starts_with("error")).take(30).collect();
        checks.check(&format!("cargo {}", args.join(" ")), if ok { Ok(()) } else { Err(findings.join("\n")) });
    }
    publish(checks);
}

/// The published crates, packaged together.
const PUBLISHED: [&str; 10] = ["-p", "idempotency-core", "-p", "idempotency-client", "-p", "idempotency-tower", "-p", "idempotency-actix", "-p", "idempotency-tonic"];

/// Words of cargo's errors when the registry cannot be reached (not when it refuses a package).
const UNREACHABLE: &[&str] = &["Unable to update registry", "failed to query replaced source", "network failure", "Could not resolve host", "Couldn't resolve host", "failed to download from"];

/// `cargo publish --dry-run`, or `cargo package --offline` when the index is unreachable.
fn publish(checks: &mut Checks) {
    let log = checks.log_path().to_owned();
    let mut args = vec!["publish", "--dry-run", "--allow-dirty"];
    args.extend(PUBLISHED);
    let (mut ok, mut text) = crate::sh::to_log_text(Command::new("cargo").args(&args), &log);
    if !ok && UNREACHABLE.iter().any(|w| text.contains(w)) {
        checks.note("the crates.io index is unreachable: cargo package --offline instead of the dry run");
        args = vec!["package", "--offline", "--allow-dirty"];
        args.extend(PUBLISHED);
        (ok, text) = crate::sh::to_log_text(Command::new("cargo").args(&args), &log);
    }
    let findings: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("error")).take(30).collect();
    checks.check(&format!("cargo {}", args.join(" ")), if ok { Ok(()) } else { Err(findings.join("\n")) });
}
