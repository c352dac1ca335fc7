//! Layers e2e and e2e_portable: `cargo test -p idempotency-tests` (every test binary; the core
//! run: the checklist binary, which holds the concurrency tests, and the binaries of
//! CORE_BINARIES) against the private cluster, with the extension or with the portable install
//! (IDEM_INSTALL=portable). One build runs both drivers: a suite that depends on the driver is
//! instantiated per driver in its binary (testkit's for_each_driver!: `over_postgres::...`,
//! `over_sqlx::...`; layer_observability has a binary per driver), so e2e runs each suite over
//! both. e2e_portable skips the sqlx instances (`--skip over_sqlx::`, and the sqlx binary): the
//! install under test sits below the driver, and the extension's pass runs both. With the
//! extension, the checklist (and in a full run the faults) again with a replay cache on every
//! handle (IDEM_REPLAY_CACHE=on), over tokio-postgres; the core run adds the cache's own tests.
//! `--test NAME -- FILTER` runs that binary alone, with the filter.

use crate::ctx::Ctx;
use crate::report::Checks;
use std::path::Path;

/// What the test kit installs into each test database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Install {
    /// CREATE EXTENSION idempotency.
    Extension,
    /// target/idempotency-portable.sql, built by scripts/portable.sh.
    Portable,
}

/// The test binaries the core run adds to the checklist on every major, over tokio-postgres (their
/// counts are the server's, whatever the driver): the subtransaction counts of every function
/// (no_subtransaction) and 100,000 keys in one transaction on a server with default settings
/// (lock_budget_default), each on a throwaway server of its own; and the crash test of recovery
/// points (steps, over both drivers: its sqlx half on the portable install below).
const CORE_BINARIES: &[&str] = &["no_subtransaction", "lock_budget_default", "steps"];

/// The libtest arguments that leave out the sqlx instances (the portable pass).
const SKIP_SQLX: &[&str] = &["--skip", "over_sqlx::"];

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks, install: Install) {
    let kind = match install {
        Install::Extension => "extension",
        Install::Portable => {
            let built = crate::sh::capture(&mut crate::sh::bash("bash scripts/portable.sh > target/idempotency-portable.sql"));
            if let Err(e) = built {
                checks.fail("bash scripts/portable.sh > target/idempotency-portable.sql", &e);
                return;
            }
            "portable"
        }
    };
    let mut args = vec!["test", "--no-fail-fast", "-p", "idempotency-tests"];
    if let Some(focus) = &ctx.focus {
        // `--test NAME -- FILTER`: that binary alone, with libtest's filter.
        args.extend(["--test", &focus.suite]);
        if !focus.filter.is_empty() {
            args.push("--");
            args.extend(focus.filter.iter().map(String::as_str));
        }
        crate::cargo::test_timed(checks, Path::new("."), &args, &[("IDEM_INSTALL", kind)]);
        return;
    }
    if !ctx.full {
        args.extend(["--test", "checklist"]);
        for binary in CORE_BINARIES {
            args.extend(["--test", binary]);
        }
    }
    if install == Install::Portable {
        args.push("--");
        args.extend(SKIP_SQLX);
    }
    crate::cargo::test_timed(checks, Path::new("."), &args, &[("IDEM_INSTALL", kind)]);
    // The cancellation suite over sqlx on the portable install too (issue 32 asks for both drivers
    // on both installs): where a dropped call stalls differs per install (the portable
    // reservation writes the table at once), and per driver (sqlx sends no cancel request).
    if install == Install::Portable && ctx.full {
        let sqlx = ["test", "--no-fail-fast", "-p", "idempotency-tests", "--test", "cancellation", "--", "over_sqlx::"];
        crate::cargo::test_timed(checks, Path::new("."), &sqlx, &[("IDEM_INSTALL", kind)]);
    }
    // The crash test of recovery points over sqlx on the portable install too (issue 45: every
    // boundary, driver and install).
    if install == Install::Portable {
        let sqlx = ["test", "--no-fail-fast", "-p", "idempotency-tests", "--test", "steps", "--", "over_sqlx::"];
        crate::cargo::test_timed(checks, Path::new("."), &sqlx, &[("IDEM_INSTALL", kind)]);
    }
    // The concurrency suites again with a replay cache on every handle of the test kit: what
    // the rerun proves is the checklist (and in a full run the faults) answered through the
    // cache. Once, over tokio-postgres and the extension: the cache sits above the driver and
    // the install (client/src/cache), so a rerun over sqlx proved nothing more; the cache's own
    // tests (replay_cache.rs) run over both drivers in the full run. (A full run ran them above;
    // a core run runs them here.) Not in the inner loop (`--quick`).
    if install == Install::Extension && !ctx.quick {
        let mut cached = vec!["test", "--no-fail-fast", "-p", "idempotency-tests", "--test", "checklist"];
        cached.extend(if ctx.full { ["--test", "faults"] } else { ["--test", "replay_cache"] });
        cached.push("--");
        cached.extend(SKIP_SQLX);
        crate::cargo::test_timed(checks, Path::new("."), &cached, &[("IDEM_INSTALL", kind), ("IDEM_REPLAY_CACHE", "on")]);
    }
}
