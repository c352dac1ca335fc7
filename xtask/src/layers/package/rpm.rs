//! Layer package_rpm: the major's .rpm is what the PostgreSQL RPM repository's extension
//! packages are (`idempotency_NN`, `Requires: postgresqlNN-server`, every file under
//! `/usr/pgsql-NN` and nothing else); its files, unpacked by `rpm -i --root` into a scratch
//! root, are copied into a fresh copy of the major's tree and smoke-tested. (Not installed into
//! the system: the test machine is Debian.)

use super::{find, smoke};
use crate::ctx::Ctx;
use crate::report::{eq, Checks};
use crate::sh::capture;
use idempotency_pgserver::{pg_config_value, unpack};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs the layer on the .rpm of `pkg` (target/packages/pgNN), in `tested`.
pub(super) fn run(ctx: &Ctx, checks: &mut Checks, pkg: &Path, tested: &Path) {
    let major = ctx.major;
    let Some(rpm) = find(pkg, &format!("idempotency_{major}-{}-", ctx.version), ".rpm") else {
        return checks.fail("the release command builds the .rpm", &format!("no idempotency_{major}-{}-*.rpm in {} (is rpmbuild installed? bash scripts/setup.sh installs it)", ctx.version, pkg.display()));
    };
    let query = |format: &str| capture(Command::new("rpm").args(["-qp", "--qf", format]).arg(&rpm));
    let arch = capture(Command::new("uname").arg("-m")).unwrap_or_default();
    checks.check(".rpm Name: idempotency_NN", query("%{NAME}").and_then(|got| eq(got, format!("idempotency_{major}"))));
    checks.check(".rpm Version: the workspace's version", query("%{VERSION}").and_then(|got| eq(got, &ctx.version)));
    checks.check(".rpm Arch: the machine's", query("%{ARCH}").and_then(|got| eq(got, arch)));
    checks.check(
        ".rpm Requires: postgresqlNN-server, the server of its major",
        capture(Command::new("rpm").arg("-qpR").arg(&rpm)).and_then(|got| {
            let server = format!("postgresql{major}-server");
            if got.lines().any(|l| l.trim() == server) {
                Ok(())
            } else {
                Err(format!("no {server} in:\n{got}"))
            }
        }),
    );
    let versions = crate::sh::versions();
    let ext = format!("/usr/pgsql-{major}/share/extension");
    let mut want: BTreeSet<String> = [format!("/usr/pgsql-{major}/lib/idempotency.so"), format!("{ext}/idempotency.control")].into_iter().collect();
    want.extend(versions.iter().map(|v| format!("{ext}/idempotency--{v}.sql")));
    want.extend(versions.windows(2).map(|w| format!("{ext}/idempotency--{}--{}.sql", w[0], w[1])));
    checks.check(
        &format!(".rpm holds the library, the control file, every release's install script and every update script under /usr/pgsql-NN ({} files), and nothing else", want.len()),
        capture(Command::new("rpm").arg("-qpl").arg(&rpm)).and_then(|got| {
            let got: BTreeSet<String> = got.lines().map(str::to_owned).collect();
            if got == want {
                Ok(())
            } else {
                Err(format!("missing: {:?}\nunexpected: {:?}", want.difference(&got).collect::<Vec<_>>(), got.difference(&want).collect::<Vec<_>>()))
            }
        }),
    );
    match unpacked(ctx, &rpm, tested) {
        Ok(copy) => {
            checks.pass("the .rpm's files into a fresh copy of the tree");
            smoke(ctx, checks, "package_rpm", &copy);
        }
        Err(e) => checks.fail("the .rpm's files into a fresh copy of the tree", &e),
    }
}

/// The .rpm installed into a scratch root (`rpm -i --root`, no dependencies, no scripts), its
/// files copied into a fresh copy of the tree.
fn unpacked(ctx: &Ctx, rpm: &Path, tested: &Path) -> Result<PathBuf, String> {
    let root = tested.join("rpm-root");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).map_err(|e| format!("create {}: {e}", root.display()))?;
    let root = root.canonicalize().map_err(|e| e.to_string())?;
    capture(Command::new("rpm").arg("-i").arg(format!("--root={}", root.display())).arg(format!("--dbpath={}/rpmdb", root.display())).args(["--nodeps", "--noscripts", "--notriggers"]).arg(rpm))?;
    let copy = unpack(ctx.major, &tested.join("rpm-tree"))?;
    let lib = PathBuf::from(pg_config_value(&copy, "--pkglibdir"));
    std::fs::copy(root.join(format!("usr/pgsql-{}/lib/idempotency.so", ctx.major)), lib.join("idempotency.so")).map_err(|e| format!("copy the library: {e}"))?;
    let from = root.join(format!("usr/pgsql-{}/share/extension", ctx.major));
    let ext = PathBuf::from(pg_config_value(&copy, "--sharedir")).join("extension");
    for entry in std::fs::read_dir(&from).map_err(|e| format!("{}: {e}", from.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        std::fs::copy(entry.path(), ext.join(entry.file_name())).map_err(|e| format!("copy {:?}: {e}", entry.file_name()))?;
    }
    Ok(copy)
}
