//! Layer pg_upgrade, once after the majors (when the run covers 14, 15, 17 and 18):
//! tests/pg_upgrade.rs (ignored by the plain e2e run), pg_upgrade between the relocatable trees
//! of 14 -> 18 and 15 -> 17 with records in every state and a two-phase reservation in flight.
//! The other majors' trees got the extension from their install layer; the default major's tree
//! gets it here (its layers used Debian's own directories). Ports from 56000
//! (`IDEM_SERVERS_PORT` overrides).

use crate::ctx::Ctx;
use crate::report::Checks;
use idempotency_pgserver::tree;
use std::path::Path;
use std::process::Command;

/// Runs the layer; `ctx` is the default major's.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let log = checks.log_path().to_owned();
    let installed = tree(ctx.major).and_then(|tree| {
        let pg = format!("pg{}", ctx.major);
        let ok = crate::sh::to_log(
            Command::new("cargo")
                .current_dir("extension")
                .args(["pgrx", "install", "--release", "--pg-config"])
                .arg(&tree)
                .args(["--no-default-features", "--features", &pg]),
            &log,
        ) && crate::sh::to_log(
            Command::new("python3")
                .args(["scripts/sqlbuild.py", "install-files"])
                .arg(Path::new(&idempotency_pgserver::pg_config_value(&tree, "--sharedir")).join("extension")),
            &log,
        );
        if ok {
            Ok(tree)
        } else {
            Err(crate::sh::tail(&std::fs::read_to_string(&log).unwrap_or_default(), 20))
        }
    });
    if let Err(e) = installed {
        checks.fail(&format!("the extension installed into the relocatable tree of {}", ctx.major), &e);
        return;
    }
    let base = std::env::var("IDEM_SERVERS_PORT").unwrap_or_else(|_| "56000".into());
    let args = ["test", "--no-fail-fast", "-p", "idempotency-tests", "--test", "pg_upgrade", "--", "--ignored"];
    crate::cargo::test(checks, Path::new("."), &args, &[("IDEM_SERVERS_PORT", &base)]);
}
