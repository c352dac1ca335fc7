//! Layers package, package_tarball, package_deb, package_rpm, package_out_of_tree (PostgreSQL 18
//! and later) and package_pgxn: scripts/package.sh builds the major's tarball, .deb and .rpm and
//! the PGXN distribution; the tarball is installed by its install.sh into a fresh copy of the
//! major's tree; the .deb is inspected and installed by dpkg where Debian's PostgreSQL of the
//! major is installed, else unpacked into a fresh copy of the tree ([`deb`]); the .rpm is
//! inspected and its files copied into a fresh copy of the tree ([`rpm`]); on 18 the tarball is
//! also loaded from where it was unpacked ([`out_of_tree`]); META.json is validated against the
//! PGXN Meta Spec ([`pgxn`]). Each install is smoke-tested (tests/package) on a server of its own on
//! [`port`], never on the private cluster (another layer's, or another run's, may be using it).

mod deb;
mod out_of_tree;
mod pgxn;
mod rpm;

use super::Record;
use crate::ctx::Ctx;
use crate::report::Checks;
use crate::suite::{self, Driver};
use idempotency_pgserver::unpack;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The port of the layers' own servers: the private cluster's + 60 (one server at a time).
fn port(ctx: &Ctx) -> u16 {
    ctx.port + 60
}

/// Runs the layers, each recorded through `layer`.
pub(crate) fn run(ctx: &Ctx, layer: &mut Record<'_>) {
    let built = layer("package", &mut |ctx, checks| {
        let log = checks.log_path().to_owned();
        let ok = crate::sh::to_log(Command::new("bash").arg("scripts/package.sh").arg(ctx.major.to_string()), &log);
        // The release build's own log (the summary's build column reads cargo's `Finished` line).
        let build = std::fs::read_to_string(format!("target/packages/pg{}/build.log", ctx.major)).unwrap_or_default();
        for l in build.lines().filter(|l| l.trim_start().starts_with("Finished `")) {
            checks.log(l);
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        checks.check(&format!("the release command builds the packages (bash scripts/package.sh {})", ctx.major), if ok { Ok(()) } else { Err(crate::sh::tail(&text, 30)) });
    });
    if built.failed > 0 {
        return;
    }
    let pkg = PathBuf::from(format!("target/packages/pg{}", ctx.major));
    let tested = idempotency_pgserver::root().join(format!("target/package-test/pg{}", ctx.major));
    let _ = std::fs::remove_dir_all(&tested);
    std::fs::create_dir_all(&tested).expect("create the package test directory");

    layer("package_tarball", &mut |ctx, checks| {
        let log = checks.log_path().to_owned();
        let installed = untar(ctx, &pkg, &tested.join("tarball")).and_then(|dir| {
            let copy = unpack(ctx.major, &tested.join("tree"))?;
            if crate::sh::to_log(Command::new(dir.join("install.sh")).env("PG_CONFIG", &copy), &log) {
                Ok(copy)
            } else {
                Err(crate::sh::tail(&std::fs::read_to_string(&log).unwrap_or_default(), 20))
            }
        });
        match installed {
            Ok(copy) => {
                checks.pass("the tarball's install.sh into a fresh copy of the tree");
                smoke(ctx, checks, "package_tarball", &copy);
            }
            Err(e) => checks.fail("the tarball's install.sh into a fresh copy of the tree", &e),
        }
    });
    layer("package_deb", &mut |ctx, checks| deb::run(ctx, checks, &pkg, &tested));
    layer("package_rpm", &mut |ctx, checks| rpm::run(ctx, checks, &pkg, &tested));
    if ctx.major >= 18 {
        layer("package_out_of_tree", &mut |ctx, checks| out_of_tree::run(ctx, checks, &pkg, &tested));
    }
    layer("package_pgxn", &mut |ctx, checks| pgxn::run(ctx, checks));
    let _ = std::fs::remove_dir_all(&tested);
}

/// The major's tarball unpacked into `into`: the one directory it holds.
fn untar(ctx: &Ctx, pkg: &Path, into: &Path) -> Result<PathBuf, String> {
    let prefix = format!("idempotency-{}-pg{}-linux-", ctx.version, ctx.major);
    let tarball = find(pkg, &prefix, ".tar.gz").ok_or_else(|| format!("no {prefix}*.tar.gz in {}", pkg.display()))?;
    let _ = std::fs::remove_dir_all(into);
    std::fs::create_dir_all(into).map_err(|e| format!("create {}: {e}", into.display()))?;
    crate::sh::capture(Command::new("tar").arg("-xzf").arg(&tarball).arg("-C").arg(into))?;
    find(into, "idempotency-", "").ok_or_else(|| format!("{} holds no idempotency-* directory", tarball.display()))
}

/// The first entry of `dir` named `prefix*suffix`.
fn find(dir: &Path, prefix: &str, suffix: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(prefix) && n.ends_with(suffix)))
        .map(|e| e.path())
        .collect();
    found.sort();
    found.into_iter().next()
}

/// The package smoke test (tests/package) on a fresh server of `config`'s binaries on [`port`],
/// stopped afterwards (its directory deleted, or kept when a check failed).
fn smoke(ctx: &Ctx, checks: &mut Checks, name: &str, config: &Path) {
    let server = super::throwaway_of(config, &format!("{name}-{}", ctx.major), port(ctx), "");
    let run = suite::Run {
        pg_config: config,
        driver: Driver::Regress,
        port: server.port(),
        dbname: &format!("idem_{name}"),
        input: "package",
        output: PathBuf::from(format!("target/{name}/pg{}", ctx.major)),
        args: vec!["smoke".into()],
    };
    let log = ctx.logs.join(format!("{name}-smoke.log"));
    suite::run(checks, &run, &log);
    super::finish(server, checks);
}
