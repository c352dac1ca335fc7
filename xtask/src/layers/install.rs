//! Layer install: `cargo pgrx install --release` into the major (pg_test installed a debug
//! build; the later layers test the release build), then every released install script and
//! every update script (scripts/sqlbuild.py install-files).

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
            .args(["pgrx", "install", "--release", "--pg-config"])
            .arg(&ctx.config)
            .args(["--no-default-features", "--features", &pg]),
        &log,
    );
    let ok = built && crate::sh::to_log(Command::new("python3").args(["scripts/sqlbuild.py", "install-files"]).arg(ctx.extdir()), &log);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    checks.check(&format!("the release build and every script installed into {}", ctx.extdir().display()), if ok { Ok(()) } else { Err(crate::sh::tail(&text, 20)) });
}
