//! The run: the layers of each major in order, one result per layer, the summary.

use crate::layers;
use crate::report::{Checks, Outcome};
use idempotency_pgserver::{config, default_major, major_of, majors, Server, Stop};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

/// `test`'s options.
#[derive(Debug, Default)]
pub(crate) struct Options {
    all_majors: bool,
    majors: Option<Vec<u32>>,
    layers: Option<Vec<String>>,
}

impl Options {
    /// `--all-majors`, `--majors "14 17"`, `--layers "regress upgrade"`.
    pub(crate) fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--all-majors" => o.all_majors = true,
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
                    if let Some(bad) = names.iter().find(|n| !LAYERS.contains(&n.as_str())) {
                        return Err(format!("--layers: {bad} is not one of: {}", LAYERS.join(" ")));
                    }
                    o.layers = Some(names);
                }
                other => return Err(format!("unknown argument '{other}'")),
            }
        }
        Ok(o)
    }
}

/// Every layer, in the order a major runs them (`--layers` picks some; the package layer
/// includes package_tarball and package_deb).
pub(crate) const LAYERS: &[&str] = &[
    "unit", "lint", "pg_test", "package", "install", "regress", "isolation", "e2e", "e2e_portable", "e2e_sqlx", "bench", "upgrade", "portable",
    "python", "ops", "citus", "pgspot", "failover", "pg_upgrade",
];

/// What a layer knows of the major it runs on.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    /// How the summary names it: `pgNN` (`all` for the layer across majors).
    pub(crate) label: String,
    /// The major.
    pub(crate) major: u32,
    /// Its pg_config.
    pub(crate) config: PathBuf,
    /// Every layer (else the core layers).
    pub(crate) full: bool,
    /// The default major (the client's unit tests and clippy run there only).
    pub(crate) is_default: bool,
    /// The private cluster's port; the layers' own servers use ports above it (ops +20/+21,
    /// the TLS server +25, citus +30..+32, failover +400/+401; pg_upgrade from 56000).
    pub(crate) port: u16,
    /// target/test-logs/pgNN.
    pub(crate) logs: PathBuf,
    /// The workspace version (Cargo.toml).
    pub(crate) version: String,
}

impl Ctx {
    /// The major's program `name`.
    pub(crate) fn bin(&self, name: &str) -> PathBuf {
        PathBuf::from(idempotency_pgserver::pg_config_value(&self.config, "--bindir")).join(name)
    }

    /// `pg_config --flag` of the major.
    pub(crate) fn value(&self, flag: &str) -> String {
        idempotency_pgserver::pg_config_value(&self.config, flag)
    }

    /// The major's extension directory.
    pub(crate) fn extdir(&self) -> PathBuf {
        PathBuf::from(self.value("--sharedir")).join("extension")
    }

    /// psql on a server of this major on `port`.
    pub(crate) fn psql(&self, port: u16) -> crate::psql::Psql {
        crate::psql::Psql::new(&PathBuf::from(self.value("--bindir")), port)
    }
}

/// The results so far.
pub(crate) struct Harness {
    only: Option<Vec<String>>,
    summary: Vec<String>,
    per_major: Vec<String>,
    passed: u32,
    failed: u32,
    failed_layers: u32,
    major_passed: u32,
    major_failed: u32,
}

impl Harness {
    /// Runs layer `name`: its checks in target/test-logs/pgNN/NAME.log, a panic in it is one
    /// failure; records its result.
    pub(crate) fn layer(&mut self, ctx: &Ctx, name: &str, f: impl FnOnce(&Ctx, &mut Checks)) -> Outcome {
        let family = if name.starts_with("package") { "package" } else { name };
        if !self.wants(family) {
            return Outcome::default();
        }
        println!("\n== {} {name}", ctx.label);
        let started = Instant::now();
        let log = ctx.logs.join(format!("{name}.log"));
        let mut checks = Checks::new(&log);
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| f(ctx, &mut checks))) {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            checks.fail(&format!("{name}: the layer stopped"), &msg);
        }
        let outcome = checks.outcome();
        self.record(ctx, name, &outcome, started, &log);
        outcome
    }

    /// Whether layer `name` is to run (`--layers`).
    pub(crate) fn wants(&self, name: &str) -> bool {
        self.only.as_ref().is_none_or(|l| l.iter().any(|n| n == name))
    }

    fn record(&mut self, ctx: &Ctx, name: &str, o: &Outcome, started: Instant, log: &std::path::Path) {
        let secs = started.elapsed().as_secs();
        let log = log.strip_prefix(idempotency_pgserver::root()).unwrap_or(log).display().to_string();
        if let Some(why) = &o.skipped {
            println!("== {} {name}: skipped ({why})", ctx.label);
            self.summary.push(format!("{:<4} {name:<16} skipped: {why}", ctx.label));
            return;
        }
        self.passed += o.passed;
        self.failed += o.failed;
        self.major_passed += o.passed;
        self.major_failed += o.failed;
        if o.failed > 0 {
            self.failed_layers += 1;
        }
        println!("== {} {name}: {} passed, {} failed (log: {log})", ctx.label, o.passed, o.failed);
        self.summary.push(format!("{:<4} {name:<16} {:>5} passed, {} failed  {secs:>4}s", ctx.label, o.passed, o.failed));
    }
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

    println!("[xtask] bash scripts/setup.sh");
    if std::env::var_os("IDEM_SETUP_DONE").is_none() && !Command::new("bash").arg("scripts/setup.sh").status().is_ok_and(|s| s.success()) {
        println!("setup failed");
        return ExitCode::FAILURE;
    }
    std::env::set_var("IDEM_SETUP_DONE", "1"); // scripts/package.sh need not run it again
    let version = workspace_version();

    let mut default_ctx = None;
    let mut h = Harness { only: options.layers.clone(), summary: vec![], per_major: vec![], passed: 0, failed: 0, failed_layers: 0, major_passed: 0, major_failed: 0 };
    for major in order {
        let started = Instant::now();
        let is_default = major == default;
        let config = if is_default { default_config.clone() } else { config(major).unwrap_or_else(|e| panic!("{e}")) };
        let port = match default_port {
            Some(p) if is_default => p,
            _ => 55400 + u16::try_from(major).expect("a major below 100"),
        };
        let full = is_default || options.all_majors;
        let ctx = Ctx { label: format!("pg{major}"), major, config, full, is_default, port, logs: PathBuf::from(format!("target/test-logs/pg{major}")), version: version.clone() };
        // The test kit and the scripts the layers run read these.
        std::env::set_var("PG_CONFIG", &ctx.config);
        std::env::set_var("IDEM_PG_PORT", port.to_string());
        println!(
            "\n######## PostgreSQL {major} ({}, port {port}, {} layers)",
            ctx.config.display(),
            if full { "all" } else { "core" }
        );
        h.major_passed = 0;
        h.major_failed = 0;
        run_major(&mut h, &ctx);
        if is_default {
            default_ctx = Some(ctx.clone());
        }
        h.per_major.push(format!(
            "pg{major}: {} passed, {} failed ({} layers, {}s)",
            h.major_passed,
            h.major_failed,
            if full { "all" } else { "core" },
            started.elapsed().as_secs()
        ));
    }

    // Across majors, once every major's tree it needs has had its install layer.
    let covered = options.majors.as_ref().is_none_or(|m| [14, 15, 17, 18].iter().all(|x| m.contains(x)));
    if let (true, Some(default_ctx)) = (covered, default_ctx) {
        let ctx = Ctx { label: "all".into(), logs: PathBuf::from("target/test-logs/pg_upgrade"), ..default_ctx };
        std::env::set_var("PG_CONFIG", &ctx.config);
        std::env::set_var("IDEM_PG_PORT", ctx.port.to_string());
        let started = Instant::now();
        let (p, f) = (h.passed, h.failed);
        h.layer(&ctx, "pg_upgrade", layers::pg_upgrade::run);
        h.per_major.push(format!("all: {} passed, {} failed ({}s)", h.passed - p, h.failed - f, started.elapsed().as_secs()));
    }

    println!("\n== summary");
    for l in h.summary.iter().chain(&h.per_major) {
        println!("{l}");
    }
    println!("{} passed, {} failed", h.passed, h.failed);
    if h.failed == 0 && h.failed_layers == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The layers of one major, in the order their inputs need (the install before the suites).
fn run_major(h: &mut Harness, ctx: &Ctx) {
    if ctx.is_default {
        // The client crate does not depend on the major.
        h.layer(ctx, "unit", layers::unit::run);
        h.layer(ctx, "lint", layers::lint::run);
    }
    h.layer(ctx, "pg_test", layers::pg_test::run);
    layers::package::run(h, ctx);
    h.layer(ctx, "install", layers::install::run);

    // The suites and the client's tests share the major's private cluster.
    let private = Server::private(&ctx.config);
    let needed = ["regress", "isolation", "e2e", "e2e_portable", "e2e_sqlx", "bench"].iter().any(|l| h.wants(l));
    let started = if needed { catch_unwind(AssertUnwindSafe(|| private.ensure_started())) } else { Ok(()) };
    if started.is_err() {
        h.layer(ctx, "regress", |_, c| c.fail("start the private cluster", &idempotency_pgserver::root().join("target/servers").display().to_string()));
    } else {
        h.layer(ctx, "regress", layers::regress::run);
        h.layer(ctx, "isolation", layers::isolation::run);
        use layers::e2e::{Driver, Install};
        h.layer(ctx, "e2e", |c, k| layers::e2e::run(c, k, Install::Extension, Driver::TokioPostgres));
        h.layer(ctx, "e2e_portable", |c, k| layers::e2e::run(c, k, Install::Portable, Driver::TokioPostgres));
        h.layer(ctx, "e2e_sqlx", |c, k| layers::e2e::run(c, k, Install::Extension, Driver::Sqlx));
        if ctx.full {
            h.layer(ctx, "bench", layers::bench::run);
        }
    }
    // Also when this run did not start it (a test process leaves it running): the next layers
    // use its port.
    let _ = catch_unwind(AssertUnwindSafe(|| private.stop(Stop::Fast)));

    // These run servers of their own (the upgrade, portable and python layers on the now free
    // port of the private cluster).
    h.layer(ctx, "failover", layers::failover::run);
    h.layer(ctx, "upgrade", layers::upgrade::run);
    h.layer(ctx, "portable", layers::portable::run);
    h.layer(ctx, "python", layers::python::run);
    if ctx.full {
        h.layer(ctx, "ops", layers::ops::run);
        h.layer(ctx, "citus", layers::citus::run);
        h.layer(ctx, "pgspot", layers::pgspot::run);
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
