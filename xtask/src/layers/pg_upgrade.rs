//! Layer pg_upgrade, once after the majors (when the run covers 14, 15, 17 and 18):
//! tests/pg_upgrade.rs (ignored by the plain e2e run), pg_upgrade between the relocatable trees
//! of 14 -> 18 and 15 -> 17 with records in every state and a two-phase reservation in flight.
//! The other majors' trees got the extension from their install layer; the default major's tree
//! gets here the files its install layer installed into Debian's own directories (the same
//! build: no second one; the package layer proved a build against Debian's headers in a copy of
//! the tree). Ports from 56000 (`IDEM_SERVERS_PORT` overrides).

use crate::ctx::Ctx;
use crate::report::Checks;
use idempotency_pgserver::tree;
use std::path::{Path, PathBuf};

/// Runs the layer; `ctx` is the default major's.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let installed = tree(ctx.major).and_then(|tree| copy_installed(&ctx.config, &tree).map(|()| tree));
    if let Err(e) = installed {
        checks.fail(&format!("the extension installed into the relocatable tree of {}", ctx.major), &e);
        return;
    }
    let base = std::env::var("IDEM_SERVERS_PORT").unwrap_or_else(|_| "56000".into());
    let args = ["test", "--no-fail-fast", "-p", "idempotency-tests", "--test", "pg_upgrade", "--", "--ignored"];
    crate::cargo::test_timed(checks, Path::new("."), &args, &[("IDEM_SERVERS_PORT", &base)]);
}

/// Copies the extension installed in `from`'s directories (its library, control file and every
/// script) into `to`'s.
fn copy_installed(from: &Path, to: &Path) -> Result<(), String> {
    if from == to {
        return Ok(());
    }
    let dir = |config: &Path, flag: &str| PathBuf::from(idempotency_pgserver::pg_config_value(config, flag));
    let copy = |a: PathBuf, b: PathBuf| std::fs::copy(&a, &b).map(drop).map_err(|e| format!("copy {} to {}: {e}", a.display(), b.display()));
    copy(dir(from, "--pkglibdir").join("idempotency.so"), dir(to, "--pkglibdir").join("idempotency.so"))?;
    let (src, dst) = (dir(from, "--sharedir").join("extension"), dir(to, "--sharedir").join("extension"));
    let entries = std::fs::read_dir(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    let mut n = 0;
    for entry in entries.filter_map(Result::ok) {
        if entry.file_name().to_string_lossy().starts_with("idempotency") {
            copy(entry.path(), dst.join(entry.file_name()))?;
            n += 1;
        }
    }
    if n == 0 {
        return Err(format!("no idempotency* file in {}: the install layer has not run", src.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::copy_installed;
    use std::path::{Path, PathBuf};

    /// A fake installation under `dir`: a pg_config answering --pkglibdir and --sharedir.
    fn tree(dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir.join("lib")).expect("lib");
        std::fs::create_dir_all(dir.join("share/extension")).expect("share");
        let config = dir.join("pg_config");
        let script = format!("#!/bin/sh\ncase \"$1\" in --pkglibdir) echo {0}/lib ;; --sharedir) echo {0}/share ;; esac\n", dir.display());
        std::fs::write(&config, script).expect("write pg_config");
        std::process::Command::new("chmod").arg("+x").arg(&config).status().expect("chmod");
        config
    }

    /// The library, the control file and every script go over; nothing else does.
    #[test]
    fn copies_the_installed_extension_into_another_tree() {
        let root = std::env::temp_dir().join(format!("xtask-copy-{}", std::process::id()));
        let (from, to) = (tree(&root.join("from")), tree(&root.join("to")));
        for f in ["lib/idempotency.so", "share/extension/idempotency.control", "share/extension/idempotency--0.5.0.sql", "share/extension/other.control"] {
            std::fs::write(root.join("from").join(f), f).expect("write");
        }
        assert_eq!(copy_installed(&from, &to), Ok(()));
        for f in ["lib/idempotency.so", "share/extension/idempotency.control", "share/extension/idempotency--0.5.0.sql"] {
            assert_eq!(std::fs::read_to_string(root.join("to").join(f)).ok().as_deref(), Some(f));
        }
        assert!(!root.join("to/share/extension/other.control").exists());
        let empty = tree(&root.join("empty"));
        assert!(copy_installed(&empty, &to).is_err(), "nothing installed: an error");
        let _ = std::fs::remove_dir_all(&root);
    }
}
