//! Layer package_deb: the major's .deb is what PostgreSQL's own Debian packages are (the control
//! fields, every file at Debian's path of the major and nothing else, lintian clean), then it is
//! installed: by `dpkg -i` where Debian's PostgreSQL of the major is installed (smoke-tested,
//! removed by `dpkg -r`, and whatever files of ours it replaced put back), else its files are
//! unpacked into a fresh copy of the major's tree; each smoke-tested.

use super::{find, smoke};
use crate::ctx::Ctx;
use crate::report::{eq, Checks};
use crate::sh::capture;
use idempotency_pgserver::{pg_config_value, unpack};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The package's name: `postgresql-NN-idempotency`, as pgvector's is `postgresql-NN-pgvector`.
fn name(major: u32) -> String {
    format!("postgresql-{major}-idempotency")
}

/// Runs the layer on the .deb of `pkg` (target/packages/pgNN), in `tested`.
pub(super) fn run(ctx: &Ctx, checks: &mut Checks, pkg: &Path, tested: &Path) {
    let package = name(ctx.major);
    let Some(deb) = find(pkg, &format!("{package}_{}_", ctx.version), ".deb") else {
        checks.fail("the release command builds the .deb", &format!("no {package}_{}_*.deb in {} (is dpkg-deb installed?)", ctx.version, pkg.display()));
        return;
    };
    fields(ctx, checks, &deb);
    contents(ctx, checks, &deb);
    lintian(checks, &deb);
    let debian_config = PathBuf::from(format!("/usr/lib/postgresql/{}/bin/pg_config", ctx.major));
    if debian_installed(ctx.major) && debian_config.is_file() {
        dpkg(ctx, checks, &deb, &debian_config, tested);
    } else {
        checks.note(&format!("Debian's postgresql-{} is not installed: the .deb's files go into a fresh copy of the tree", ctx.major));
        match unpacked(ctx, &deb, tested) {
            Ok(copy) => {
                checks.pass("the .deb's files into a fresh copy of the tree");
                smoke(ctx, checks, "package_deb", &copy);
            }
            Err(e) => checks.fail("the .deb's files into a fresh copy of the tree", &e),
        }
    }
}

/// The control fields: name, version, architecture, section and the dependency on the server.
fn fields(ctx: &Ctx, checks: &mut Checks, deb: &Path) {
    let field = |f: &str| capture(Command::new("dpkg-deb").arg("-f").arg(deb).arg(f));
    let arch = capture(Command::new("dpkg").arg("--print-architecture")).unwrap_or_default();
    checks.check(".deb Package: postgresql-NN-idempotency", field("Package").and_then(|got| eq(got, name(ctx.major))));
    checks.check(".deb Version: the workspace's version", field("Version").and_then(|got| eq(got, &ctx.version)));
    checks.check(".deb Architecture: dpkg's", field("Architecture").and_then(|got| eq(got, arch)));
    checks.check(".deb Section: database", field("Section").and_then(|got| eq(got, "database")));
    // The server of its major, and the packages of the libraries it links (libc.so.6,
    // libgcc_s.so.1).
    let server = format!("postgresql-{}", ctx.major);
    checks.check(
        ".deb Depends: on postgresql-NN, the server of its major, and on libc6 and libgcc-s1",
        field("Depends").and_then(|got| {
            let names: Vec<&str> = got.split(',').map(|d| d.split_whitespace().next().unwrap_or("")).collect();
            let missing: Vec<&str> = [server.as_str(), "libc6", "libgcc-s1"].into_iter().filter(|n| !names.contains(n)).collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("Depends: {got} (no {})", missing.join(", ")))
            }
        }),
    );
}

/// Every file at Debian's path of the major, owned by root, and nothing else: the library, the
/// control file, the install script of every release and every update script between
/// consecutive releases, the copyright and changelog.
fn contents(ctx: &Ctx, checks: &mut Checks, deb: &Path) {
    let major = ctx.major;
    let listing = match capture(Command::new("dpkg-deb").arg("-c").arg(deb)) {
        Ok(l) => l,
        Err(e) => return checks.fail(".deb contents are readable (dpkg-deb -c)", &e),
    };
    // `-rw-r--r-- root/root  1234 2026-12-06 12:00 ./usr/lib/...`: regular files only.
    let files: Vec<(&str, &str)> = listing
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            Some((*words.get(1)?, words.last()?.trim_start_matches("./")))
        })
        .collect();
    let got: BTreeSet<String> = files.iter().map(|(_, p)| (*p).to_owned()).collect();
    let ext = format!("usr/share/postgresql/{major}/extension");
    let doc = format!("usr/share/doc/{}", name(major));
    let versions = crate::sh::versions();
    let mut want: BTreeSet<String> = [format!("usr/lib/postgresql/{major}/lib/idempotency.so"), format!("{ext}/idempotency.control"), format!("{doc}/copyright"), format!("{doc}/changelog.gz")].into_iter().collect();
    want.extend(versions.iter().map(|v| format!("{ext}/idempotency--{v}.sql")));
    want.extend(versions.windows(2).map(|w| format!("{ext}/idempotency--{}--{}.sql", w[0], w[1])));
    checks.check(
        &format!(".deb holds the library, the control file, every release's install script and every update script at Debian's paths of PostgreSQL NN ({} files), and nothing else", want.len()),
        if got == want { Ok(()) } else { Err(format!("missing: {:?}\nunexpected: {:?}", want.difference(&got).collect::<Vec<_>>(), got.difference(&want).collect::<Vec<_>>())) },
    );
    let foreign: Vec<&str> = files.iter().filter(|(owner, _)| *owner != "root/root").map(|(_, p)| *p).collect();
    checks.check(".deb files are owned by root", if foreign.is_empty() { Ok(()) } else { Err(format!("not root/root: {foreign:?}")) });
}

/// lintian with errors and warnings failing (installed by scripts/setup.sh). Left out:
/// `bogus-mail-host` and `bogus-mail-host-in-debian-changelog`, the maintainer address being a
/// placeholder until the project has a public one (scripts/package.sh, `maintainer`).
fn lintian(checks: &mut Checks, deb: &Path) {
    let label = "lintian finds no error or warning in the .deb";
    let Ok(version) = capture(Command::new("lintian").arg("--version")) else {
        return checks.fail(label, "lintian is not installed: run bash scripts/setup.sh (apt-get install lintian)");
    };
    let out = Command::new("lintian")
        .args(["--fail-on", "error,warning", "--suppress-tags", "bogus-mail-host,bogus-mail-host-in-debian-changelog", "--allow-root"])
        .arg(deb)
        .output();
    match out {
        Ok(o) => {
            let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            checks.log(&format!("{version}: {}", if text.trim().is_empty() { "no tags" } else { text.trim() }));
            checks.check(label, if o.status.success() { Ok(()) } else { Err(text) });
        }
        Err(e) => checks.fail(label, &format!("cannot run lintian: {e}")),
    }
}

/// Whether Debian's package `postgresql-NN` is installed (dpkg can satisfy the dependency).
fn debian_installed(major: u32) -> bool {
    capture(Command::new("dpkg-query").args(["-W", "-f=${Status}", &format!("postgresql-{major}")])).is_ok_and(|s| s == "install ok installed")
}

/// `dpkg -i`, the smoke test on Debian's own binaries, `dpkg -r`; the files of ours that were
/// there before (a developer's `cargo pgrx install`) are kept aside in `tested` and put back
/// (each written beside itself and renamed over, so a backend that has the library mapped keeps
/// its copy).
fn dpkg(ctx: &Ctx, checks: &mut Checks, deb: &Path, config: &Path, tested: &Path) {
    let log = checks.log_path().to_owned();
    let package = name(ctx.major);
    let owned = capture(Command::new("dpkg-deb").arg("-c").arg(deb)).unwrap_or_default();
    let paths: Vec<PathBuf> = owned.lines().filter(|l| l.starts_with('-')).filter_map(|l| l.split_whitespace().last()).map(|p| PathBuf::from(p.trim_start_matches('.'))).filter(|p| p.to_string_lossy().contains("idempotency")).collect();
    let aside = tested.join("debian-aside");
    let kept: Vec<&PathBuf> = paths.iter().filter(|p| p.is_file()).collect();
    for p in &kept {
        let to = aside.join(p.strip_prefix("/").unwrap_or(p));
        std::fs::create_dir_all(to.parent().expect("a parent")).expect("create the aside directory");
        std::fs::copy(p, &to).unwrap_or_else(|e| panic!("keep {} aside: {e}", p.display()));
    }
    if kept.is_empty() {
        checks.note("no idempotency file in Debian's directories before dpkg -i");
    } else {
        checks.note(&format!("{} idempotency files in Debian's directories before dpkg -i: kept aside, put back after dpkg -r", kept.len()));
    }
    if !crate::sh::to_log(Command::new("dpkg").arg("-i").arg(deb), &log) {
        checks.fail("dpkg -i the .deb into Debian's PostgreSQL", &crate::sh::tail(&std::fs::read_to_string(&log).unwrap_or_default(), 20));
    } else {
        checks.pass("dpkg -i the .deb into Debian's PostgreSQL");
        checks.check(
            "dpkg --verify finds every file of the package installed as the .deb has it",
            capture(Command::new("dpkg").arg("--verify").arg(&package)).and_then(|out| if out.is_empty() { Ok(()) } else { Err(out) }),
        );
        checks.check(
            "Debian's pg_config directories hold the library and the control file",
            if PathBuf::from(pg_config_value(config, "--pkglibdir")).join("idempotency.so").is_file() && PathBuf::from(pg_config_value(config, "--sharedir")).join("extension/idempotency.control").is_file() {
                Ok(())
            } else {
                Err("the installed files are not where Debian's pg_config says".into())
            },
        );
        // A panic of the smoke test (a server that does not start) still removes the package
        // and puts our files back before it goes on.
        let smoked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| smoke(ctx, checks, "package_deb", config)));
        let removed = crate::sh::to_log(Command::new("dpkg").arg("-r").arg(&package), &log);
        let left: Vec<&PathBuf> = paths.iter().filter(|p| p.exists()).collect();
        checks.check("dpkg -r removes it again, every file", if !removed { Err("dpkg -r failed (see the log)".into()) } else if !left.is_empty() { Err(format!("left: {left:?}")) } else { Ok(()) });
        if let Err(panic) = smoked {
            put_back(checks, &kept, &aside);
            std::panic::resume_unwind(panic);
        }
    }
    put_back(checks, &kept, &aside);
}

/// The files `kept` aside in `aside` put back where they were, each written beside itself and
/// renamed over.
fn put_back(checks: &mut Checks, kept: &[&PathBuf], aside: &Path) {
    if kept.is_empty() {
        return;
    }
    let failed: Vec<String> = kept
        .iter()
        .filter_map(|p| {
            let from = aside.join(p.strip_prefix("/").unwrap_or(p));
            let beside = p.with_extension("idem-restore");
            std::fs::copy(&from, &beside).and_then(|_| std::fs::rename(&beside, p)).err().map(|e| format!("{}: {e}", p.display()))
        })
        .collect();
    checks.check("the files dpkg replaced are put back", if failed.is_empty() { Ok(()) } else { Err(failed.join("\n")) });
}

/// The .deb's files copied from Debian's paths of the major into a fresh copy of the tree.
fn unpacked(ctx: &Ctx, deb: &Path, tested: &Path) -> Result<PathBuf, String> {
    let copy = unpack(ctx.major, &tested.join("deb-tree"))?;
    let root = tested.join("deb-root");
    capture(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root))?;
    let deb_lib = root.join(format!("usr/lib/postgresql/{}/lib", ctx.major));
    let deb_ext = root.join(format!("usr/share/postgresql/{}/extension", ctx.major));
    let lib = PathBuf::from(pg_config_value(&copy, "--pkglibdir"));
    std::fs::copy(deb_lib.join("idempotency.so"), lib.join("idempotency.so")).map_err(|e| format!("copy the library: {e}"))?;
    let ext = PathBuf::from(pg_config_value(&copy, "--sharedir")).join("extension");
    for entry in std::fs::read_dir(&deb_ext).map_err(|e| format!("{}: {e}", deb_ext.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        std::fs::copy(entry.path(), ext.join(entry.file_name())).map_err(|e| format!("copy {:?}: {e}", entry.file_name()))?;
    }
    Ok(copy)
}
