//! Layer install: `cargo pgrx install` (the dev profile: no LTO, the build pg_test made of the same
//! crates, in the workspace's `target/debug`) into the major; the later layers
//! test this build, and the package layer builds and smoke-tests the release build (fat LTO)
//! that ships. Then every released install script and every update script (scripts/sqlbuild.py
//! install-files).

use crate::ctx::Ctx;
use crate::report::Checks;
use std::process::Command;

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let log = checks.log_path().to_owned();
    let pg = format!("pg{}", ctx.major);
    let built = crate::sh::to_log(
        Command::new("cargo")
            .current_dir("extension")
            .args(["pgrx", "install", "--pg-config"])
            .arg(&ctx.config)
            .args(["--no-default-features", "--features", &pg]),
        &log,
    );
    let ok = built && crate::sh::to_log(Command::new("python3").args(["scripts/sqlbuild.py", "install-files"]).arg(ctx.extdir()), &log);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    checks.note(&format!("into {}", ctx.extdir().display()));
    checks.check("the dev build and every released and update script installed into the major", if ok { Ok(()) } else { Err(crate::sh::tail(&text, 20)) });
}
