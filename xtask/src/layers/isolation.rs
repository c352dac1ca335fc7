//! Layer isolation: the pg_isolation_regress specs of tests/isolation on the private cluster,
//! each spec one test (`--test isolation -- SPEC...`: only those).

use crate::ctx::Ctx;
use crate::report::Checks;
use crate::suite::{self, Driver};
use std::path::PathBuf;

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let mut args = vec!["--load-extension=idempotency".to_owned()];
    // `--test isolation -- SPEC...`: only those specs.
    match ctx.focus.as_ref().filter(|f| f.suite == "isolation" && !f.filter.is_empty()) {
        Some(focus) => args.extend(focus.filter.iter().cloned()),
        None => args.extend(suite::isolation_specs()),
    }
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
