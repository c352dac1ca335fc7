//! Layer regress: the pg_regress golden files of tests/regress (tests/regress/schedule) on the
//! private cluster, each file one test (`--test regress -- FILE...`: only those).

use crate::ctx::Ctx;
use crate::report::Checks;
use crate::suite::{self, Driver};
use std::path::PathBuf;

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let run = suite::Run {
        pg_config: &ctx.config,
        driver: Driver::Regress,
        port: ctx.port,
        dbname: "idem_regress",
        input: "regress",
        output: PathBuf::from(format!("target/regress/pg{}", ctx.major)),
        args: vec!["--load-extension=idempotency".into(), "--schedule=tests/regress/schedule".into()],
    };
    // `--test regress -- FILE...`: those files, in that order, instead of the schedule.
    let mut run = run;
    if let Some(focus) = ctx.focus.as_ref().filter(|f| f.suite == "regress" && !f.filter.is_empty()) {
        run.args.truncate(1);
        run.args.extend(focus.filter.iter().cloned());
    }
    let log = checks.log_path().to_owned();
    suite::run(checks, &run, &log);
}
