//! The run: the layers of the table (`layers::LAYERS`) on each major in order, the private
//! cluster around those that run on it, one result per layer, the summary and the closing line.

use crate::ctx::{Ctx, Focus};
use crate::layers::{with_needs, Layer, Run, Scope, LAYERS};
use crate::report::{Checks, Outcome};
use idempotency_pgserver::{config, default_major, major_of, majors, Server, Stop};
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// The layers of `--quick`, the inner loop (on the default major).
pub(crate) const QUICK: &[&str] = &["unit", "lint", "install", "regress", "isolation", "e2e"];

/// `test`'s options.
#[derive(Debug, Default)]
pub(crate) struct Options {
    all_majors: bool,
    majors: Option<Vec<u32>>,
    layers: Option<Vec<String>>,
    quick: bool,
    focus: Option<Focus>,
}

impl Options {
    /// `--all-majors`, `--majors "14 17"`, `--layers "regress upgrade"` (with the layers they
    /// need), `--quick` (the layers of [`QUICK`] on the default major, one e2e pass), `--test NAME
    /// [-- FILTER...]` (one e2e test binary, or `regress` / `isolation`, with the layers it
    /// needs, on the default major; the words after `--` go to libtest, or name the regress
    /// files or isolation specs).
    pub(crate) fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--all-majors" => o.all_majors = true,
                "--quick" => o.quick = true,
                "--test" => {
                    let suite = it.next().ok_or("--test needs a test binary of tests/tests (checklist), or regress or isolation")?;
                    let known = ["regress", "isolation"].contains(&suite.as_str()) || idempotency_pgserver::root().join(format!("tests/tests/{suite}.rs")).is_file();
                    if !known {
                        return Err(format!("--test: {suite} is not regress, isolation or a file tests/tests/{suite}.rs"));
                    }
                    o.focus = Some(Focus { suite: suite.clone(), filter: vec![] });
                }
                "--" => {
                    let focus = o.focus.as_mut().ok_or("`--` comes after --test NAME")?;
                    focus.filter = it.by_ref().cloned().collect();
                }
                "--majors" => {
                    let list = it.next().ok_or("--majors needs a list such as \"14 17\"")?;
                    let supported = majors();
                    let mut chosen = Vec::new();
                    for m in list.split_whitespace() {
                        match m.parse::<u32>() {
                            Ok(m) if supported.contains(&m) => chosen.push(m),
                            _ => return Err(format!("--majors: {m} is not one of: {supported:?}")),
                        }
                    }
                    o.majors = Some(chosen);
                }
                "--layers" => {
                    let list = it.next().ok_or("--layers needs a list such as \"regress upgrade\"")?;
                    let names: Vec<String> = list.split_whitespace().map(str::to_owned).collect();
                    if let Some(bad) = names.iter().find(|n| !LAYERS.iter().any(|l| l.name == n.as_str())) {
                        let all: Vec<&str> = LAYERS.iter().map(|l| l.name).collect();
                        return Err(format!("--layers: {bad} is not one of: {}", all.join(" ")));
                    }
                    o.layers = Some(names);
                }
                other => return Err(format!("unknown argument '{other}'")),
            }
        }
        if o.quick && o.focus.is_some() {
            return Err("--quick and --test: choose one".into());
        }
        if o.layers.is_some() && (o.quick || o.focus.is_some()) {
            return Err("--layers with --quick or --test: they choose the layers".into());
        }
        let chosen = if o.quick {
            Some(QUICK.iter().map(|l| (*l).to_owned()).collect())
        } else if let Some(f) = &o.focus {
            Some(vec![if f.suite == "regress" || f.suite == "isolation" { f.suite.clone() } else { "e2e".to_owned() }])
        } else {
            o.layers.take()
        };
        o.layers = chosen.map(|names| with_needs(&names));
        if (o.quick || o.focus.is_some()) && o.majors.is_none() {
            o.majors = Some(vec![default_major_of_run()]);
        }
        Ok(o)
    }
}

/// The default major of this run: PG_CONFIG's, else scripts/pg-env.sh's.
fn default_major_of_run() -> u32 {
    std::env::var_os("PG_CONFIG").map_or_else(default_major, |c| major_of(Path::new(&c)))
}

/// The results so far.
#[derive(Default)]
pub(crate) struct Harness {
    only: Option<Vec<String>>,
    summary: Vec<String>,
    per_major: Vec<String>,
    total: Totals,
    major: Totals,
    failed_layers: u32,
    /// The names of every check run (the same on every major, driver and install).
    names: BTreeSet<String>,
    /// Whether the e2e suites ran over each driver (tokio-postgres, sqlx) and against each
    /// install (extension, portable).
    drivers: BTreeSet<&'static str>,
    installs: BTreeSet<&'static str>,
    majors_run: BTreeSet<u32>,
    /// Server directories the run deleted after their layer passed, and kept after it failed.
    servers_deleted: u32,
    servers_kept: Vec<String>,
    /// Each timed test's seconds and where it ran (`pg15 e2e checklist::name`).
    times: Vec<(f64, String)>,
    /// Seconds cargo spent building, over every layer ([`crate::cargo::build_seconds`]).
    build_seconds: f64,
}

/// How many of the slowest tests the summary names.
const SLOWEST: usize = 10;

/// Checks passed, failed and skipped.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    passed: u32,
    failed: u32,
    skipped: u32,
}

impl std::fmt::Display for Totals {
    /// `N passed, N failed, N skipped`: the closing line's form.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} passed, {} failed, {} skipped", self.passed, self.failed, self.skipped)
    }
}

impl Harness {
    /// Runs `layer` on the major of `ctx` if `--layers` wants it.
    fn run(&mut self, ctx: &Ctx, layer: &Layer) {
        if !self.wants(layer.name) {
            return;
        }
        match layer.run {
            Run::Checks(f) => {
                self.layer(ctx, layer.name, &mut |c, k| f(c, k));
            }
            Run::Family(f) => f(ctx, &mut |name, g| self.layer(ctx, name, g)),
        }
    }

    /// Runs layer `name`: its checks in target/test-logs/pgNN/NAME.log, a panic in it is one
    /// failure; records its result.
    /// Server directories under target/servers made by the layer (new, or made afresh) are
    /// deleted when it passed, once stopped (a private cluster is never one of them), and kept
    /// when it failed, the log and the summary saying where.
    fn layer(&mut self, ctx: &Ctx, name: &str, f: &mut dyn FnMut(&Ctx, &mut Checks)) -> Outcome {
        println!("\n== {} {name}", ctx.label);
        let started = Instant::now();
        let disk = disk_used();
        let log = ctx.logs.join(format!("{name}.log"));
        let before = server_dirs();
        let mut checks = Checks::new(name, &log);
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| f(ctx, &mut checks))) {
            checks.fail(&format!("{name}: the layer stopped"), &panic_text(&*panic));
        }
        // Made by the layer: new, or made again (a server of the same name created afresh); never
        // a private cluster (its directory changes when it restarts; it is kept across layers).
        let private = |d: &Path| d.file_name().is_some_and(|n| n.to_string_lossy().starts_with("private-"));
        let made: Vec<PathBuf> = server_dirs().into_iter().filter(|(d, t)| before.get(d) != Some(t) && !private(d)).map(|(d, _)| d).collect();
        if checks.failed() > 0 {
            for d in &made {
                let d = d.strip_prefix(idempotency_pgserver::root()).unwrap_or(d).display().to_string();
                checks.note(&format!("kept {d} (the layer failed)"));
                self.servers_kept.push(d);
            }
        } else {
            for d in made.iter().filter(|d| !d.join("data/postmaster.pid").exists()) {
                if std::fs::remove_dir_all(d).is_ok() {
                    self.servers_deleted += 1;
                }
            }
        }
        let outcome = checks.outcome();
        if outcome.passed + outcome.failed > 0 {
            match name {
                "e2e" | "e2e_portable" => {
                    // Each driver counts when a test of its instances ran (testkit's
                    // for_each_driver!: over_postgres::..., over_sqlx::...).
                    for (prefix, driver) in [("over_postgres::", "tokio-postgres"), ("over_sqlx::", "sqlx")] {
                        if outcome.names.iter().any(|n| n.contains(prefix)) {
                            self.drivers.insert(driver);
                        }
                    }
                    self.installs.insert(if name == "e2e_portable" { "portable" } else { "extension" });
                }
                _ => {}
            }
            if ctx.label != "all" {
                self.majors_run.insert(ctx.major);
            }
        }
        self.names.extend(outcome.names.iter().cloned());
        self.times.extend(outcome.times.iter().map(|(test, s)| (*s, format!("{} {name} {test}", ctx.label))));
        self.record(ctx, name, &outcome, started, disk, &log);
        outcome
    }

    /// Whether layer `name` is to run (`--layers`).
    fn wants(&self, name: &str) -> bool {
        self.only.as_ref().is_none_or(|l| l.iter().any(|n| n == name))
    }

    /// `disk`: the disk's bytes used before the layer ([`disk_used`]); the row shows the change.
    fn record(&mut self, ctx: &Ctx, name: &str, o: &Outcome, started: Instant, disk: Option<u64>, log: &Path) {
        let secs = started.elapsed().as_secs();
        let disk = match (disk, disk_used()) {
            // Signed MB: a layer that deletes what it made (servers, builds) frees space.
            (Some(before), Some(after)) => format!("  {:>+6} MB disk", (i128::from(after) - i128::from(before)) / 1_000_000),
            _ => String::new(),
        };
        let build = crate::cargo::build_seconds(&std::fs::read_to_string(log).unwrap_or_default());
        self.build_seconds += build;
        let build = if build >= 0.5 { format!(" (build {build:>3.0}s)") } else { " ".repeat(13) };
        let log = log.strip_prefix(idempotency_pgserver::root()).unwrap_or(log).display().to_string();
        let skipped = u32::try_from(o.skipped.len()).unwrap_or(u32::MAX);
        for t in [&mut self.total, &mut self.major] {
            t.passed += o.passed;
            t.failed += o.failed;
            t.skipped += skipped;
        }
        if let Some(why) = o.not_run() {
            println!("== {} {name}: skipped ({why})", ctx.label);
            self.summary.push(format!("{:<4} {name:<16} skipped: {why}", ctx.label));
            return;
        }
        if o.failed > 0 {
            self.failed_layers += 1;
        }
        let t = Totals { passed: o.passed, failed: o.failed, skipped };
        println!("== {} {name}: {t} (log: {log})", ctx.label);
        for why in &o.skipped {
            println!("   skipped: {why}");
        }
        let why = if o.skipped.is_empty() { String::new() } else { format!("  (skipped: {})", o.skipped.join("; ")) };
        self.summary.push(format!("{:<4} {name:<16} {:>5} passed, {} failed, {} skipped  {secs:>4}s{build}{disk}{why}", ctx.label, o.passed, o.failed, skipped));
    }
}

/// Bytes used on the disk that holds target/ (`df`): the summary's per-layer disk column, and
/// the closing size of target/.
fn disk_used() -> Option<u64> {
    let target = idempotency_pgserver::root().join("target");
    let out = crate::sh::capture(Command::new("df").args(["-B1", "--output=used"]).arg(&target)).ok()?;
    out.lines().nth(1)?.trim().parse().ok()
}

/// The server directories under target/servers now, each with its modification time.
fn server_dirs() -> std::collections::BTreeMap<PathBuf, Option<std::time::SystemTime>> {
    let dir = idempotency_pgserver::root().join("target/servers");
    let Ok(entries) = std::fs::read_dir(dir) else { return Default::default() };
    entries.filter_map(Result::ok).filter(|e| e.path().is_dir()).map(|e| (e.path(), e.metadata().and_then(|m| m.modified()).ok())).collect()
}

/// The text of a caught panic.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned())).unwrap_or_default()
}

/// The whole run (see the crate docs); exits 1 when any layer failed.
pub(crate) fn run(options: &Options) -> ExitCode {
    let default = default_major();
    let default_config = match std::env::var_os("PG_CONFIG") {
        Some(c) => PathBuf::from(c),
        None => config(default).unwrap_or_else(|e| panic!("{e}")),
    };
    let default = major_of(&default_config);
    let default_port: Option<u16> = std::env::var("IDEM_PG_PORT").ok().map(|p| p.parse().expect("IDEM_PG_PORT: a port number"));
    let chosen = options.majors.clone().unwrap_or_else(majors);
    // The default major first: it runs every layer.
    let mut order: Vec<u32> = chosen.iter().copied().filter(|m| *m == default).collect();
    order.extend(chosen.iter().copied().filter(|m| *m != default));

    // The majors the run needs (registered with pgrx, the trees downloaded): setup.sh fetches a
    // major's tree when a run first needs it (the demo sets up only the default major).
    let mut needed: Vec<String> = order.iter().map(u32::to_string).collect();
    for layer in LAYERS {
        if let Scope::Across(across) = layer.scope {
            if options.layers.as_ref().is_none_or(|l| l.iter().any(|n| n == layer.name)) && across.iter().all(|m| chosen.contains(m)) {
                needed.extend(across.iter().map(u32::to_string).filter(|m| !needed.contains(m)).collect::<Vec<_>>());
            }
        }
    }
    let needed = needed.join(" ");
    println!("[xtask] bash scripts/setup.sh --majors \"{needed}\"");
    if std::env::var_os("IDEM_SETUP_DONE").is_none() && !Command::new("bash").args(["scripts/setup.sh", "--majors", &needed]).status().is_ok_and(|s| s.success()) {
        println!("setup failed");
        return ExitCode::FAILURE;
    }
    std::env::set_var("IDEM_SETUP_DONE", "1"); // scripts/package.sh need not run it again
    let version = workspace_version();

    let mut default_ctx = None;
    let run_started = Instant::now();
    let mut h = Harness { only: options.layers.clone(), ..Harness::default() };
    for major in order {
        let started = Instant::now();
        let is_default = major == default;
        let config = if is_default { default_config.clone() } else { config(major).unwrap_or_else(|e| panic!("{e}")) };
        let port = match default_port {
            Some(p) if is_default => p,
            _ => 55400 + u16::try_from(major).expect("a major below 100"),
        };
        let full = is_default || options.all_majors;
        let ctx = Ctx {
            label: format!("pg{major}"),
            major,
            config,
            full,
            is_default,
            port,
            logs: PathBuf::from(format!("target/test-logs/pg{major}")),
            version: version.clone(),
            quick: options.quick,
            focus: options.focus.clone(),
        };
        // The test kit and the scripts the layers run read these.
        std::env::set_var("PG_CONFIG", &ctx.config);
        std::env::set_var("IDEM_PG_PORT", port.to_string());
        println!(
            "\n######## PostgreSQL {major} ({}, port {port}, {} layers)",
            ctx.config.display(),
            if full { "all" } else { "core" }
        );
        h.major = Totals::default();
        run_major(&mut h, &ctx);
        if is_default {
            default_ctx = Some(ctx.clone());
        }
        h.per_major.push(format!("pg{major}: {} ({} layers, {}s)", h.major, if full { "all" } else { "core" }, started.elapsed().as_secs()));
        if std::env::var("CI").as_deref() == Ok("true") {
            ci_cleanup(&ctx, h.major.failed == 0);
        }
    }

    // Across majors, once every major's tree it needs has had its install layer.
    for layer in LAYERS {
        let Scope::Across(needs) = layer.scope else { continue };
        if !h.wants(layer.name) {
            continue;
        }
        let covered = needs.iter().all(|m| options.majors.as_ref().is_none_or(|chosen| chosen.contains(m)));
        let Some(default_ctx) = default_ctx.clone() else { continue };
        let ctx = Ctx { label: "all".into(), logs: PathBuf::from(format!("target/test-logs/{}", layer.name)), ..default_ctx };
        if !covered {
            let needs: Vec<String> = needs.iter().map(u32::to_string).collect();
            let why = format!("the run does not cover the majors it needs ({})", needs.join(", "));
            h.layer(&ctx, layer.name, &mut |_, checks| checks.skip(&why));
            continue;
        }
        std::env::set_var("PG_CONFIG", &ctx.config);
        std::env::set_var("IDEM_PG_PORT", ctx.port.to_string());
        let started = Instant::now();
        h.major = Totals::default();
        h.run(&ctx, layer);
        h.per_major.push(format!("all: {} ({}s)", h.major, started.elapsed().as_secs()));
    }

    println!("\n== summary");
    for l in h.summary.iter().chain(&h.per_major) {
        println!("{l}");
    }
    println!("servers: {} directories deleted after their layer passed, {} kept{}", h.servers_deleted, h.servers_kept.len(), if h.servers_kept.is_empty() { String::new() } else { format!(": {}", h.servers_kept.join(", ")) });
    h.times.sort_by(|a, b| b.0.total_cmp(&a.0));
    if !h.times.is_empty() {
        println!("slowest {} of {} timed tests (the e2e, failover and pg_upgrade layers' tests):", SLOWEST.min(h.times.len()), h.times.len());
        for (seconds, test) in h.times.iter().take(SLOWEST) {
            println!("  {seconds:7.1}s  {test}");
        }
    }
    let target = idempotency_pgserver::root().join("target");
    if let Ok(du) = crate::sh::capture(Command::new("du").args(["-sb"]).arg(&target)) {
        let bytes: u64 = du.split_whitespace().next().and_then(|b| b.parse().ok()).unwrap_or(0);
        println!("target/: {:.1} GB at the end of the run (du -sb)", bytes as f64 / 1e9);
    }
    let cargo_runs = crate::sh::CARGO_RUNS.load(std::sync::atomic::Ordering::Relaxed);
    println!("cargo: {cargo_runs} commands started by the harness (scripts/package.sh runs one more per major)");
    println!(
        "cargo builds: {:.0}s of the run's {}s (the layers' cargo `Finished .. in` lines: compilation, not tests)",
        h.build_seconds,
        run_started.elapsed().as_secs()
    );
    println!("{}", closing_line(&h));
    if h.total.failed == 0 && h.failed_layers == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `N passed, N failed, N skipped (N distinct checks over N majors, N drivers and N installs)`:
/// the checks counted, then the distinct names behind them (a test run on five majors, over two
/// drivers or against two installs is one distinct check).
fn closing_line(h: &Harness) -> String {
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    let mut over = vec![plural(h.majors_run.len(), "major")];
    if !h.drivers.is_empty() {
        over.push(plural(h.drivers.len(), "driver"));
    }
    if !h.installs.is_empty() {
        over.push(plural(h.installs.len(), "install"));
    }
    let over = match over.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => over.join(""),
    };
    format!("{} ({} distinct checks over {over})", h.total, h.names.len())
}

/// In CI (CI=true), after a major: the builds of the crates compiled per major (the extension,
/// pgrx and its bindings: [`crate::artifacts`]) are removed, and, when the major passed, its
/// private cluster; the disk holds the shared builds and one major's own.
fn ci_cleanup(ctx: &Ctx, passed: bool) {
    let freed = crate::artifacts::remove_per_major(&idempotency_pgserver::root().join("target"));
    println!("[xtask] CI: removed {} MB of PostgreSQL {}'s own builds", freed / 1_000_000, ctx.major);
    if passed {
        let _ = catch_unwind(AssertUnwindSafe(|| Server::private(&ctx.config).destroy()));
        let _ = std::fs::remove_dir_all(idempotency_pgserver::root().join(format!("target/pgrx-test-data/{}", ctx.major)));
    }
}

/// The layers of one major, in the table's order; the private cluster started before the first
/// layer that runs on it (when one of those is to run) and stopped after the last (also when
/// this run did not start it: a test process leaves it running, and the next layers use its
/// port): before the first later layer that is to run (some use the port for servers of their
/// own), else at the end when a layer ran on it. A run of no layer on the private cluster or
/// after it (`--layers package`) leaves it as it is: another run may be using it.
fn run_major(h: &mut Harness, ctx: &Ctx) {
    let private = Server::private(&ctx.config);
    let here: Vec<&Layer> = LAYERS.iter().filter(|l| l.runs_on(ctx)).collect();
    let needed = here.iter().any(|l| l.private && h.wants(l.name));
    // None before the first layer on the private cluster; then whether it started.
    let mut cluster: Option<Result<(), String>> = None;
    let mut stopped = false;
    let stop = || {
        let _ = catch_unwind(AssertUnwindSafe(|| private.stop(Stop::Fast)));
    };
    for layer in here {
        if layer.private && cluster.is_none() {
            let started = if needed { catch_unwind(AssertUnwindSafe(|| private.ensure_started())) } else { Ok(()) };
            cluster = Some(started.map_err(|p| format!("{}\n{}", panic_text(&*p), idempotency_pgserver::root().join("target/servers").display())));
        }
        if !layer.private && cluster.is_some() && !stopped && h.wants(layer.name) {
            stop();
            stopped = true;
        }
        match &cluster {
            Some(Err(e)) if layer.private => {
                if h.wants(layer.name) {
                    h.layer(ctx, layer.name, &mut |_, c| c.fail("start the private cluster", e));
                }
            }
            _ => h.run(ctx, layer),
        }
    }
    if cluster.is_some() && !stopped && needed {
        stop();
    }
}

/// The workspace version, from the root Cargo.toml's `version = "..."`.
fn workspace_version() -> String {
    let toml = std::fs::read_to_string("Cargo.toml").expect("read Cargo.toml");
    toml.lines()
        .find_map(|l| l.strip_prefix("version = \"").and_then(|r| r.strip_suffix('"')))
        .expect("a version line in Cargo.toml")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::{Options, QUICK};

    fn parse(args: &[&str]) -> Result<Options, String> {
        Options::parse(&args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>())
    }

    /// `--layers` adds what a layer needs; `--quick` and `--test` choose their layers and the
    /// default major; `--` belongs to `--test`.
    #[test]
    fn options_choose_layers_with_what_they_need() {
        let o = parse(&["--layers", "upgrade"]).expect("parse");
        assert_eq!(o.layers, Some(vec!["upgrade".to_owned(), "install".to_owned()]));
        assert!(o.majors.is_none());
        let o = parse(&["--quick"]).expect("parse");
        let mut want: Vec<String> = QUICK.iter().map(|l| (*l).to_owned()).collect();
        want.sort();
        let mut got = o.layers.expect("layers");
        got.sort();
        assert_eq!(got, want);
        assert_eq!(o.majors.map(|m| m.len()), Some(1));
        let o = parse(&["--test", "checklist", "--", "duplicate", "--exact"]).expect("parse");
        assert_eq!(o.layers, Some(vec!["e2e".to_owned(), "install".to_owned()]));
        let focus = o.focus.expect("focus");
        assert_eq!((focus.suite.as_str(), focus.filter), ("checklist", vec!["duplicate".to_owned(), "--exact".to_owned()]));
        assert_eq!(parse(&["--test", "regress"]).expect("parse").layers, Some(vec!["regress".to_owned(), "install".to_owned()]));
        assert!(parse(&["--test", "no_such_binary"]).is_err());
        assert!(parse(&["--", "x"]).is_err());
        assert!(parse(&["--quick", "--layers", "e2e"]).is_err());
    }
}
