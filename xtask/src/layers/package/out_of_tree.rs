//! Layer package_out_of_tree (PostgreSQL 18 and later): the tarball loaded from the directory it
//! was unpacked into, as CloudNativePG mounts an extension image (docs/upgrading.md, "PostgreSQL
//! 18: out of the server's tree"). A fresh copy of the major's tree, with no idempotency file in
//! it (checked before and after), runs a server of its own with
//! `extension_control_path = '$system:DIR/share'` (PostgreSQL looks in each element's
//! `extension` subdirectory), `dynamic_library_path = '$libdir:DIR/lib'` and the library
//! preloaded by its path. Checked there: the maintenance launcher runs, and a worker's pass
//! sweeps an expired record (both load the library by name, through `dynamic_library_path`); the
//! release before this one is created, and a record survives `ALTER EXTENSION idempotency UPDATE`
//! to this one; `idem_metrics` counts the calls (its counters live in the shared memory the
//! preloaded library reserved, so the functions run the preloaded copy). Then the server is
//! restarted with the library preloaded by name, as CloudNativePG's `shared_preload_libraries`
//! lists it, and the launcher and the counters are checked again. The statements:
//! tests/package/out_of_tree.

use super::{port, untar};
use crate::ctx::Ctx;
use crate::psql::Named;
use crate::report::{eq, Checks};
use idempotency_pgserver::{extension_installed, unpack, Stop};
use std::path::Path;

/// Runs the layer on the tarball of `pkg` (target/packages/pgNN), in `tested`.
pub(super) fn run(ctx: &Ctx, checks: &mut Checks, pkg: &Path, tested: &Path) {
    let (dir, tree) = match untar(ctx, pkg, &tested.join("out-of-tree")).and_then(|dir| Ok((dir, unpack(ctx.major, &tested.join("bare-tree"))?))) {
        Ok(both) => both,
        Err(e) => return checks.fail("the tarball unpacked into a directory of its own, beside a fresh copy of the tree", &e),
    };
    let dir = dir.canonicalize().expect("the unpacked tarball's path");
    let clean = |checks: &mut Checks, when: &str| {
        checks.check(&format!("the server's own directories hold no idempotency file ({when})"), if extension_installed(&tree) { Err(format!("{} has idempotency's files", tree.display())) } else { Ok(()) });
    };
    clean(checks, "before");
    let paths = format!("extension_control_path = '$system:{d}/share'\ndynamic_library_path = '$libdir:{d}/lib'\n", d = dir.display());
    let server = crate::layers::throwaway_of(
        &tree,
        &format!("package-out-of-tree-{}", ctx.major),
        port(ctx),
        &format!("{paths}shared_preload_libraries = '{}/lib/idempotency'\nidempotency.maintenance_databases = 'idem_out_of_tree'\nidempotency.maintenance_interval = 1\n", dir.display()),
    );
    let sql = Named::load(Path::new("tests/package/out_of_tree"));
    let pg = crate::psql::Psql::new(&server.bin(""), server.port());
    let db = pg.db("idem_out_of_tree");
    checks.check("the launcher runs, the library preloaded by its path", pg.until_script_equal(30, sql.get("launchers"), &[], "1"));
    let versions = crate::sh::versions();
    let previous = &versions[versions.len() - 2];
    let flow = sql.q(&pg, "database", &[]).and_then(|_| {
        checks.check(&format!("CREATE EXTENSION idempotency VERSION '{previous}' (the release before this one)"), sql.q(&db, "create", &[("version", previous)]).and_then(|v| eq(v, previous)));
        sql.q(&db, "reserve_complete", &[("key", "kept")])
    });
    checks.check("a key reserved and completed on the release before", flow.and_then(|got| eq(got, "created\nt")));
    checks.check(&format!("ALTER EXTENSION idempotency UPDATE reaches {}", ctx.version), sql.q(&db, "update", &[]).and_then(|v| eq(v, &ctx.version)));
    checks.check("the key's record answers a replay after the update", sql.q(&db, "replay", &[("key", "kept")]).and_then(|got| eq(got, "replay {\"id\": 1}")));
    checks.check("idem_metrics counts the replay (the functions run the preloaded library)", sql.q(&db, "metric", &[("name", "reservations_replay")]).and_then(|n| eq(n, "1")));
    let swept = sql.q(&db, "expired", &[("key", "expired")]).and_then(|_| db.until_script_equal(30, sql.get("left"), &[("key", "expired")], "0"));
    checks.check("the maintenance worker sweeps an expired record", swept);

    server.stop(Stop::Fast);
    server.configure("shared_preload_libraries = 'idempotency'\n");
    server.start();
    checks.check("the launcher runs, the library preloaded by name (CloudNativePG's way)", pg.until_script_equal(30, sql.get("launchers"), &[], "1"));
    checks.check("idem_metrics answers, the library preloaded by name", sql.q(&db, "metric", &[("name", "reservations_replay")]).map(drop));
    crate::layers::finish(server, checks);
    clean(checks, "after");
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every statement the layer runs by name is in tests/package/out_of_tree, and every one there
    /// is run.
    #[test]
    fn every_named_statement_exists_and_is_used() {
        let named = crate::psql::Named::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/package/out_of_tree"));
        let used = crate::psql::named_in(include_str!("out_of_tree.rs"));
        let missing: Vec<&String> = used.iter().filter(|n| !named.names().any(|m| m == n.as_str())).collect();
        assert!(missing.is_empty(), "named in out_of_tree.rs, not in tests/package/out_of_tree: {missing:?}");
        let unused: Vec<&str> = named.names().filter(|m| !used.iter().any(|n| n == m)).collect();
        assert!(unused.is_empty(), "in tests/package/out_of_tree, never run: {unused:?}");
    }
}
