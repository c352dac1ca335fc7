//! The layers, one module each, the one table of them ([`LAYERS`]), and what several of them
//! share (a throwaway server, the regress and isolation suites on a prepared database, the
//! schema description).

pub(crate) mod bench; // the benchmark in smoke mode: every case runs and produces numbers
pub(crate) mod citus; // a Citus coordinator and two workers: distribution, flow, duplicates, tokens, maintenance, a shard move
pub(crate) mod e2e; // cargo test -p idempotency-tests against the extension or the portable install, over either driver
pub(crate) mod failover; // tests/failover.rs: a primary and a synchronous standby, the primary killed, the standby promoted
pub(crate) mod install; // cargo pgrx install --release and every released and update script
pub(crate) mod isolation; // pg_isolation_regress specs (tests/isolation) on the private cluster
pub(crate) mod lint; // cargo clippy over every crate and target (a warning fails); the crates.io dry run
pub(crate) mod ops; // the maintenance worker, the counters, idem_stats and the pg_cron recipe on preloaded servers
pub(crate) mod package; // scripts/package.sh, each package installed into a fresh tree and smoke-tested
pub(crate) mod pg_test; // cargo pgrx test: the Rust that runs inside PostgreSQL
pub(crate) mod pg_upgrade; // tests/pg_upgrade.rs once across majors: pg_upgrade 14 -> 18 and 15 -> 17
pub(crate) mod pgspot; // pgspot over the generated install script
pub(crate) mod portable; // the portable install: no superuser, refusals, fingerprint parity, suites, portable upgrades
pub(crate) mod python; // examples/python/check.py against the extension and the portable install
pub(crate) mod regress; // pg_regress golden files (tests/regress) on the private cluster
pub(crate) mod unit; // cargo test of the core and client crates (with and without TLS)
pub(crate) mod upgrade; // ALTER EXTENSION UPDATE from every released version: answers, schema, suites, load

use crate::ctx::Ctx;
use crate::psql::Psql;
use crate::report::{Checks, Outcome};
use crate::suite::{self, Driver};
use idempotency_pgserver::Server;
use std::path::{Path, PathBuf};

/// Which majors a layer runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The default major only, also with `--all-majors` (what does not depend on the major).
    Default,
    /// Every major: the core layers.
    Core,
    /// The default major, and every major with `--all-majors`.
    Full,
    /// Once after the majors, with the default major's context, when the run covers these
    /// majors (else reported as skipped).
    Across(&'static [u32]),
}

/// A layer that records layers of its own: `record(NAME, checks)` runs and records one.
pub(crate) type Record<'a> = dyn FnMut(&str, &mut dyn FnMut(&Ctx, &mut Checks)) -> Outcome + 'a;

/// How a layer runs.
pub(crate) enum Run {
    /// Its checks, as one result.
    Checks(fn(&Ctx, &mut Checks)),
    /// Layers of its own, each recorded through [`Record`] (package: package, package_tarball,
    /// package_deb, package_rpm, package_out_of_tree, package_pgxn).
    Family(fn(&Ctx, &mut Record<'_>)),
}

/// One row of the table of layers.
pub(crate) struct Layer {
    /// Its name in `--layers`, the summary and its log (target/test-logs/pgNN/NAME.log).
    pub(crate) name: &'static str,
    /// Which majors it runs on.
    pub(crate) scope: Scope,
    /// It runs on the major's private cluster: the harness starts the cluster before the first
    /// such layer (when one of them is to run) and stops it after the last (always: the next
    /// layers use its port).
    pub(crate) private: bool,
    /// The layers it needs to have run before it on the same major (`--layers` and `--test`
    /// add them): the install layer for every layer that tests the installed extension.
    pub(crate) needs: &'static [&'static str],
    /// What it runs.
    pub(crate) run: Run,
}

impl Layer {
    /// Whether it runs on the major of `ctx` (the layers across majors run after them).
    pub(crate) fn runs_on(&self, ctx: &Ctx) -> bool {
        match self.scope {
            Scope::Default => ctx.is_default,
            Scope::Core => true,
            Scope::Full => ctx.full,
            Scope::Across(_) => false,
        }
    }
}

const fn layer(name: &'static str, scope: Scope, private: bool, needs: &'static [&'static str], run: fn(&Ctx, &mut Checks)) -> Layer {
    Layer { name, scope, private, needs, run: Run::Checks(run) }
}

/// What a layer that tests the installed extension needs first.
const INSTALLED: &[&str] = &["install"];

/// The layers `names` with every layer they need, in no particular order (the table's order is
/// the run's).
pub(crate) fn with_needs(names: &[String]) -> Vec<String> {
    let mut all: Vec<String> = names.to_vec();
    let mut i = 0;
    while i < all.len() {
        if let Some(l) = LAYERS.iter().find(|l| l.name == all[i]) {
            for n in l.needs {
                if !all.iter().any(|a| a == n) {
                    all.push((*n).to_owned());
                }
            }
        }
        i += 1;
    }
    all
}

/// Every layer, in the order a major runs them (the install before the suites, the suites on
/// the private cluster before the layers that use its port for servers of their own): the one
/// list that the harness runs, `--layers` is checked against and CONTRIBUTING.md's test-layer
/// lists are tested against. A layer across majors needs its layers on each major of the run.
pub(crate) const LAYERS: &[Layer] = {
    use e2e::Install::*;
    use Scope::*;
    &[
        layer("unit", Default, false, &[], unit::run),
        layer("lint", Default, false, &[], lint::run),
        layer("pg_test", Core, false, &[], pg_test::run),
        Layer { name: "package", scope: Core, private: false, needs: &[], run: Run::Family(package::run) },
        layer("install", Core, false, &[], install::run),
        layer("regress", Core, true, INSTALLED, regress::run),
        layer("isolation", Core, true, INSTALLED, isolation::run),
        layer("e2e", Core, true, INSTALLED, |c, k| e2e::run(c, k, Extension)),
        layer("e2e_portable", Core, true, INSTALLED, |c, k| e2e::run(c, k, Portable)),
        layer("bench", Full, true, INSTALLED, bench::run),
        layer("failover", Core, false, INSTALLED, failover::run),
        layer("upgrade", Core, false, INSTALLED, upgrade::run),
        layer("portable", Core, false, INSTALLED, portable::run),
        layer("python", Core, false, INSTALLED, python::run),
        layer("ops", Full, false, INSTALLED, ops::run),
        layer("citus", Full, false, INSTALLED, citus::run),
        layer("pgspot", Full, false, INSTALLED, pgspot::run),
        layer("pg_upgrade", Across(&[14, 15, 17, 18]), false, INSTALLED, pg_upgrade::run),
    ]
};

/// A fresh server `NAME-MAJOR` of the major on `port` with the settings every throwaway test
/// server has plus `settings`, started.
pub(crate) fn throwaway(ctx: &Ctx, name: &str, port: u16, settings: &str) -> Server {
    throwaway_of(&ctx.config, &format!("{name}-{}", ctx.major), port, settings)
}

/// Stops a throwaway server at the end of its layer; its directory is deleted when the layer
/// has no failure so far, else kept, and the log says where.
pub(crate) fn finish(server: Server, checks: &mut Checks) {
    server.stop(idempotency_pgserver::Stop::Fast);
    if checks.failed() > 0 {
        checks.note(&format!("kept {} (a check failed)", server.dir().display()));
        server.keep();
    }
}

/// [`throwaway`] of the PostgreSQL of `pg_config` (not necessarily the major under test),
/// named `name`.
pub(crate) fn throwaway_of(pg_config: &Path, name: &str, port: u16, settings: &str) -> Server {
    let server = Server::new(name, pg_config, port);
    server.initdb(&[]);
    server.configure(&format!("max_connections = 100\nmax_prepared_transactions = 10\nlog_min_messages = warning\n{settings}"));
    server.start();
    server
}

/// The regress and isolation suites on databases `prepare` has set up (`idem_regress`,
/// `idem_isolation`), each of their tests one check; `schedule` picks the regress files,
/// `skip_specs` leaves isolation specs out.
pub(crate) fn suites(checks: &mut Checks, ctx: &Ctx, psql: &Psql, name: &str, schedule: &Path, skip_specs: &[&str], prepare: &dyn Fn(&str) -> Result<(), String>) {
    for (input, driver) in [("regress", Driver::Regress), ("isolation", Driver::Isolation)] {
        let db = format!("idem_{input}");
        if let Err(e) = psql.recreate(&db).and_then(|()| prepare(&db)) {
            checks.fail(&format!("{name} {input}: prepare {db}"), &e);
            continue;
        }
        let args = match driver {
            Driver::Regress => vec![format!("--schedule={}", schedule.display())],
            Driver::Isolation => suite::isolation_specs().into_iter().filter(|s| !skip_specs.contains(&s.as_str())).collect(),
        };
        let mut all = vec!["--use-existing".to_owned()];
        all.extend(args);
        let run = suite::Run {
            pg_config: &ctx.config,
            driver,
            port: psql.port(),
            dbname: &db,
            input,
            output: PathBuf::from(format!("target/{name}-{input}")),
            args: all,
        };
        let (p, f) = suite::run(checks, &run, &ctx.logs.join(format!("{name}-{input}.log")));
        if f == 0 {
            checks.note(&format!("ok     {name} {input} suite: {p} passed"));
        } else {
            checks.note(&format!("FAILED {name} {input} suite: {p} passed, {f} failed"));
        }
    }
}

/// The canonical description of everything idempotency owns in `schema` of `db`
/// (tests/upgrade/schema.sql).
pub(crate) fn schema_of(psql: &Psql, db: &str, schema: &str) -> Result<String, String> {
    psql.db(db).file(Path::new("tests/upgrade/schema.sql"), &[("schema", schema)])
}

/// `diff -u` of two texts (written under `dir` as `name.a` and `name.b`): `Ok` when equal,
/// else the diff.
pub(crate) fn diff(dir: &Path, name: &str, a: &str, b: &str) -> Result<(), String> {
    let (pa, pb) = (dir.join(format!("{name}.a")), dir.join(format!("{name}.b")));
    std::fs::write(&pa, format!("{a}\n")).expect("write a diff side");
    std::fs::write(&pb, format!("{b}\n")).expect("write a diff side");
    crate::sh::capture(std::process::Command::new("diff").arg("-u").arg(&pa).arg(&pb)).map(drop)
}

#[cfg(test)]
mod tests {
    use super::{Scope, LAYERS};

    /// The names of the comma-separated list in `text` between `start` and `end` (each item's
    /// first word), whitespace folded.
    fn list(text: &str, start: &str, end: &str) -> Vec<String> {
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let from = text.split_once(start).unwrap_or_else(|| panic!("CONTRIBUTING.md has no `{start}`")).1;
        let items = from.split_once(end).unwrap_or_else(|| panic!("CONTRIBUTING.md has no `{end}` after `{start}`")).0;
        items.split(", ").map(|i| i.split(' ').next().unwrap_or_default().to_owned()).collect()
    }

    fn names(keep: impl Fn(Scope) -> bool) -> Vec<String> {
        LAYERS.iter().filter(|l| keep(l.scope)).map(|l| l.name.to_owned()).collect()
    }

    /// CONTRIBUTING.md's test-layer lists are this table's: the core layers, the default
    /// major's layers in order and the layer across majors, and a row for every layer.
    #[test]
    fn contributing_lists_the_table_of_layers() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../CONTRIBUTING.md")).expect("read CONTRIBUTING.md");
        assert_eq!(list(&doc, "and the core layers (", ") on each other major"), names(|s| s == Scope::Core), "the core layers");
        assert_eq!(list(&doc, "| 15 (default) | every layer: ", "; then "), names(|s| !matches!(s, Scope::Across(_))), "the default major's layers");
        let across = list(&doc, "each other major, then ", " once across majors");
        assert_eq!(across, names(|s| matches!(s, Scope::Across(_))), "the layers across majors");
        let missing: Vec<&str> = LAYERS.iter().map(|l| l.name).filter(|n| !doc.contains(&format!("\n| {n} | "))).collect();
        assert!(missing.is_empty(), "no row in CONTRIBUTING.md's table of layers for {missing:?}");
    }
}
