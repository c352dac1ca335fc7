//! Layer pg_test: `cargo pgrx test` of the major, the Rust that runs inside PostgreSQL (its data
//! directory under target/pgrx-test-data/NN, deleted when every test passed; as the postgres OS
//! user when run as root). Built in the workspace's `target/debug` like every dev build
//! (only pgrx and the extension are compiled per major: crate::artifacts): the install layer's
//! build shares every dependency with it.

use crate::ctx::Ctx;
use crate::report::Checks;
use std::path::Path;

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let data = idempotency_pgserver::root().join(format!("target/pgrx-test-data/{}", ctx.major));
    std::fs::create_dir_all(&data).expect("create the pgrx test data directory");
    if idempotency_pgserver::running_as_root() {
        for dir in [data.parent().expect("a parent"), &data] {
            let _ = std::process::Command::new("chown").arg("postgres:postgres").arg(dir).status();
        }
    }
    let pg = format!("pg{}", ctx.major);
    let data = data.display().to_string();
    let mut args = vec!["pgrx", "test", &pg, "--no-default-features", "--features", &pg];
    if idempotency_pgserver::running_as_root() {
        args.extend(["--runas", "postgres"]);
    }
    args.extend(["--pgdata", &data]);
    crate::cargo::test(checks, Path::new("extension"), &args, &[]);
    // Its cluster is disposable: deleted when every test passed, else kept for inspection.
    if checks.failed() == 0 {
        let _ = std::fs::remove_dir_all(&data);
    } else {
        checks.note(&format!("kept {data} (a test failed)"));
    }
}
