//! The run: the layers of the table (`layers::LAYERS`) on each major in order, the private
//! cluster around those that run on it, one result per layer, the summary and the closing line.

use crate::ctx::Ctx;
use crate::layers::{Layer, Run, Scope, LAYERS};
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
                    if let Some(bad) = names.iter().find(|n| !LAYERS.iter().any(|l| l.name == n.as_str())) {
                        let all: Vec<&str> = LAYERS.iter().map(|l| l.name).collect();
                        return Err(format!("--layers: {bad} is not one of: {}", all.join(" ")));
                    }
                    o.layers = Some(names);
                }
                other => return Err(format!("unknown argument '{other}'")),
            }
        }
        Ok(o)
    }
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
}

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
    fn layer(&mut self, ctx: &Ctx, name: &str, f: &mut dyn FnMut(&Ctx, &mut Checks)) -> Outcome {
        println!("\n== {} {name}", ctx.label);
        let started = Instant::now();
        let log = ctx.logs.join(format!("{name}.log"));
        let mut checks = Checks::new(&log);
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| f(ctx, &mut checks))) {
            checks.fail(&format!("{name}: the layer stopped"), &panic_text(&*panic));
        }
        let outcome = checks.outcome();
        self.record(ctx, name, &outcome, started, &log);
        outcome
    }

    /// Whether layer `name` is to run (`--layers`).
    fn wants(&self, name: &str) -> bool {
        self.only.as_ref().is_none_or(|l| l.iter().any(|n| n == name))
    }

    fn record(&mut self, ctx: &Ctx, name: &str, o: &Outcome, started: Instant, log: &std::path::Path) {
        let secs = started.elapsed().as_secs();
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
        self.summary.push(format!("{:<4} {name:<16} {:>5} passed, {} failed, {} skipped  {secs:>4}s{why}", ctx.label, o.passed, o.failed, skipped));
    }
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

    println!("[xtask] bash scripts/setup.sh");
    if std::env::var_os("IDEM_SETUP_DONE").is_none() && !Command::new("bash").arg("scripts/setup.sh").status().is_ok_and(|s| s.success()) {
        println!("setup failed");
        return ExitCode::FAILURE;
    }
    std::env::set_var("IDEM_SETUP_DONE", "1"); // scripts/package.sh need not run it again
    let version = workspace_version();

    let mut default_ctx = None;
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
        let ctx = Ctx { label: format!("pg{major}"), major, config, full, is_default, port, logs: PathBuf::from(format!("target/test-logs/pg{major}")), version: version.clone() };
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
    println!("{}", h.total);
    if h.total.failed == 0 && h.failed_layers == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The layers of one major, in the table's order; the private cluster started before the first
/// layer that runs on it (when one of those is to run) and stopped after the last (also when
/// this run did not start it: a test process leaves it running, and the next layers use its
/// port).
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
        if !layer.private && cluster.is_some() && !stopped {
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
    if cluster.is_some() && !stopped {
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
