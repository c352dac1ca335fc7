//! Layer isolation: the pg_isolation_regress specs of tests/isolation on the private cluster,
//! each spec one test.

use crate::ctx::Ctx;
use crate::report::Checks;
use crate::suite::{self, Driver};
use std::path::PathBuf;

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let mut args = vec!["--load-extension=idempotency".to_owned()];
    args.extend(suite::isolation_specs());
    let run = suite::Run {
        pg_config: &ctx.config,
        driver: Driver::Isolation,
        port: ctx.port,
        dbname: "idem_isolation",
        input: "isolation",
        output: PathBuf::from(format!("target/isolation/pg{}", ctx.major)),
        args,
    };
    let log = checks.log_path().to_owned();
    suite::run(checks, &run, &log);
}
