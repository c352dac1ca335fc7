//! Layers package, package_tarball, package_deb: scripts/package.sh builds the packages of the
//! major; the tarball is installed by its install.sh into a fresh copy of the major's tree, the
//! .deb by dpkg into Debian's own directories when the major is Debian's (and removed again),
//! else unpacked into a fresh copy of the tree; each is smoke-tested (tests/package) on the
//! private cluster's data run with that tree's binaries.

use super::Record;
use crate::ctx::Ctx;
use crate::report::Checks;
use crate::suite::{self, Driver};
use idempotency_pgserver::{debian, pg_config_value, unpack, Server, Stop};
use std::path::{Path, PathBuf};
use std::process::Command;

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
        let prefix = format!("idempotency-{}-pg{}-linux-", ctx.version, ctx.major);
        let tarball = find(&pkg, &prefix, ".tar.gz");
        let installed = tarball.ok_or_else(|| format!("no {prefix}*.tar.gz in {}", pkg.display())).and_then(|tarball| {
            let copy = unpack(ctx.major, &tested.join("tree"))?;
            let untar = crate::sh::to_log(Command::new("tar").arg("-xzf").arg(&tarball).arg("-C").arg(&tested), &log);
            let dir = find(&tested, "idempotency-", "").ok_or("the tarball holds no idempotency-* directory")?;
            let ok = untar && crate::sh::to_log(Command::new(dir.join("install.sh")).env("PG_CONFIG", &copy), &log);
            if ok {
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

    let deb = find(&pkg, &format!("postgresql-{}-idempotency_", ctx.major), ".deb");
    if let Some(deb) = deb {
        layer("package_deb", &mut |ctx, checks| {
            let log = checks.log_path().to_owned();
            if ctx.config == debian() {
                if crate::sh::to_log(Command::new("dpkg").arg("-i").arg(&deb), &log) {
                    checks.pass("dpkg -i the .deb into Debian's PostgreSQL");
                    smoke(ctx, checks, "package_deb", &ctx.config);
                    let removed = crate::sh::to_log(Command::new("dpkg").arg("-r").arg(format!("postgresql-{}-idempotency", ctx.major)), &log);
                    checks.check("dpkg -r removes it again", if removed { Ok(()) } else { Err("dpkg -r failed (see the log)".into()) });
                } else {
                    checks.fail("dpkg -i the .deb into Debian's PostgreSQL", &crate::sh::tail(&std::fs::read_to_string(&log).unwrap_or_default(), 20));
                }
            } else {
                let unpacked = (|| -> Result<PathBuf, String> {
                    let copy = unpack(ctx.major, &tested.join("deb-tree"))?;
                    let root = tested.join("deb-root");
                    crate::sh::capture(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
                    let deb_lib = format!("{}{}", root.display(), pg_config_value(&debian(), "--pkglibdir"));
                    let deb_ext = format!("{}{}/extension", root.display(), pg_config_value(&debian(), "--sharedir"));
                    let lib = pg_config_value(&copy, "--pkglibdir");
                    std::fs::copy(Path::new(&deb_lib).join("idempotency.so"), Path::new(&lib).join("idempotency.so")).map_err(|e| format!("copy the library: {e}"))?;
                    let ext = PathBuf::from(pg_config_value(&copy, "--sharedir")).join("extension");
                    for entry in std::fs::read_dir(&deb_ext).map_err(|e| format!("{deb_ext}: {e}"))? {
                        let entry = entry.map_err(|e| e.to_string())?;
                        if entry.file_name().to_string_lossy().starts_with("idempotency") {
                            std::fs::copy(entry.path(), ext.join(entry.file_name())).map_err(|e| format!("copy {:?}: {e}", entry.file_name()))?;
                        }
                    }
                    Ok(copy)
                })();
                match unpacked {
                    Ok(copy) => {
                        checks.pass("the .deb's files into a fresh copy of the tree");
                        smoke(ctx, checks, "package_deb", &copy);
                    }
                    Err(e) => checks.fail("the .deb's files into a fresh copy of the tree", &e),
                }
            }
        });
    }
    let _ = std::fs::remove_dir_all(&tested);
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

/// The package smoke test (tests/package) on the private cluster's data, run with `config`'s
/// binaries.
fn smoke(ctx: &Ctx, checks: &mut Checks, name: &str, config: &Path) {
    Server::private(&ctx.config).stop(Stop::Fast);
    let server = Server::private(config);
    server.ensure_started();
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
    server.stop(Stop::Fast);
}
