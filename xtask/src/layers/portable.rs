//! Layer portable, in a throwaway server on the private cluster's port (the extension installed
//! too: fingerprint parity compares with it):
//!
//!   build      bash scripts/portable.sh: one plain-SQL script, no LANGUAGE c, no library
//!   install    by a role that only owns the schema (no superuser); the API works for an app
//!              role with USAGE + EXECUTE; nobody else reads records; operator functions not PUBLIC
//!   refuse     a second install, a schema holding the extension, a missing schema, no -v
//!              schema: each fails and changes nothing (schema compared before and after)
//!   parity     idem_fingerprint: PL/pgSQL against the extension's Rust, on IDEM_PARITY_COUNT
//!              (default 5000) generated JSON texts and their jsonb values, plus invalid texts
//!   answers    the state machine: a scenario of every outcome (replay, mismatch, failed, retries
//!              counted and poisoned, stale tokens, heartbeat, one transaction, a rollback, a key
//!              held by another session, a takeover, a takeover losing every race, recovery,
//!              sweep) against the extension's native functions and the portable ones: every
//!              column of every answer and of the stored rows equal, and the contract's values
//!   defaults   the portable defaults of the settings equal the extension's
//!   suites     the regress suite (less install, members, guc_prefix and privileges, which test
//!              the extension's own catalog entries and CREATE EXTENSION, and write_once, the
//!              native hot path's own flow) and the isolation suite (less lock_budget_nowait,
//!              the native dirty read), on a portable install
//!   upgrade    the portable upgrade script between consecutive versions: records kept, answers
//!              unchanged, schema equal to a fresh portable install, a second run refused (the
//!              suites run once, on the fresh install: the upgraded schema equals it)

use super::{diff, schema_of, suites, throwaway};
use crate::ctx::Ctx;
use crate::psql::{sql_checks, Psql};
use crate::report::{eq, Checks};
use std::path::{Path, PathBuf};

/// The isolation specs the portable install does not run: lock_budget_nowait tests the native
/// hot path's dirty read.
const PORTABLE_SKIPS_SPECS: &[&str] = &["lock_budget_nowait"];

const INSTALL_CHECKS: &str = "SELECT 'the installing role is no superuser', NOT rolsuper FROM pg_roles WHERE rolname = 'idem_owner';
SELECT 'no function of the install is LANGUAGE c',
       NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                    WHERE p.pronamespace = 'idem'::regnamespace AND l.lanname NOT IN ('plpgsql', 'sql'));
SELECT 'every function the extension has, the portable install has (same arguments, defaults, result)',
       NOT EXISTS (SELECT p.proname, pg_get_function_arguments(p.oid),
                          replace(pg_get_function_result(p.oid), 'ext.', '')
                     FROM pg_proc p WHERE p.pronamespace = 'ext'::regnamespace
                   EXCEPT
                   SELECT p.proname, pg_get_function_arguments(p.oid),
                          replace(pg_get_function_result(p.oid), 'idem.', '')
                     FROM pg_proc p WHERE p.pronamespace = 'idem'::regnamespace);
SELECT 'the same tables, columns and types as the extension',
       NOT EXISTS (SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
                     FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
                    WHERE c.relnamespace = 'ext'::regnamespace
                   EXCEPT
                   SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
                     FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
                    WHERE c.relnamespace = 'idem'::regnamespace);
SELECT 'PUBLIC cannot read or change the tables',
       NOT has_table_privilege('public', 'idem.idem_records', 'SELECT, INSERT, UPDATE, DELETE')
       AND NOT has_table_privilege('public', 'idem.idem_retries', 'SELECT, INSERT, UPDATE, DELETE');
SELECT 'the operator functions are not PUBLIC',
       NOT has_function_privilege('public', 'idem.idem_sweep(integer)', 'EXECUTE')
       AND NOT has_function_privilege('public', 'idem.idem_recover_stuck(integer,text,integer)', 'EXECUTE')
       AND NOT has_function_privilege('public', 'idem.idem_lookup(text,text,text)', 'EXECUTE')
       AND NOT has_function_privilege('public', 'idem.idem_stats()', 'EXECUTE');
";

const APP_CHECKS: &str = "BEGIN;
SELECT token AS t FROM idem.idem_reserve('o', 'u', 'k', idem.idem_fingerprint('{\"a\": 1}'::jsonb)) \\gset
INSERT INTO public.orders VALUES (1);
SELECT 'an app role with USAGE completes a reservation in its transaction', idem.idem_complete('o', 'u', 'k', :t, '{\"id\": 1}');
COMMIT;
SELECT 'and the key replays its response', outcome = 'replay' AND response = '{\"id\": 1}'
  FROM idem.idem_reserve('o', 'u', 'k', idem.idem_fingerprint('{\"a\": 1}'::jsonb));
SELECT 'the app role cannot read the records', NOT has_table_privilege('idem.idem_records', 'SELECT');
";

const OBJECT_COUNT: &str = "WITH sys(ns) AS (SELECT oid FROM pg_namespace WHERE nspname IN ('pg_catalog', 'information_schema', 'pg_toast'))
    SELECT (SELECT count(*) FROM pg_class WHERE relnamespace NOT IN (SELECT ns FROM sys))
         + (SELECT count(*) FROM pg_proc WHERE pronamespace NOT IN (SELECT ns FROM sys))
         + (SELECT count(*) FROM pg_type WHERE typnamespace NOT IN (SELECT ns FROM sys))";

/// The documented install command: `psql -v schema=SCHEMA -f SCRIPT` as `role` (errors do not
/// stop psql: the script stops itself).
fn install(psql: &Psql, db: &str, schema: &str, role: &str, script: &Path) -> Result<String, String> {
    crate::sh::capture(
        psql.db(db)
            .user(role)
            .command()
            .args(["-v", "ON_ERROR_STOP=0", "-v", &format!("schema={schema}"), "-f"])
            .arg(script),
    )
}

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let versions = crate::sh::versions();
    let current = versions.last().expect("a version").clone();
    let root = idempotency_pgserver::root();
    let script = root.join("target/idempotency-portable.sql");
    let logs = ctx.logs.clone();
    checks.note(&format!("== portable install tests, PostgreSQL {}, version {current}", ctx.major));

    let sh = |s: &str| crate::sh::capture(&mut crate::sh::bash(s)).map(drop);
    checks.check("bash scripts/portable.sh > target/idempotency-portable.sql", sh(&format!("bash scripts/portable.sh > '{}'", script.display())));
    checks.check(
        "the script has no LANGUAGE c function and names no library",
        sh(&format!("! grep -v '^[[:space:]]*--' '{}' | grep -inE 'language[[:space:]]+c\\b|MODULE_PATHNAME|\\$libdir'", script.display())),
    );
    checks.check("the pg_tle wrapper builds (not installable here: no pg_tle)", sh(&format!("bash scripts/portable.sh pgtle > '{}'", root.join("target/idempotency-pgtle.sql").display())));

    let server = throwaway(ctx, "portable", ctx.port, "");
    let psql = ctx.psql(ctx.port);
    let p = psql.db("idem_portable");

    psql.run("CREATE ROLE idem_owner LOGIN");
    psql.run("CREATE ROLE idem_app LOGIN");
    psql.run("CREATE ROLE idem_other LOGIN");
    psql.run("CREATE DATABASE idem_portable");
    for sql in ["CREATE SCHEMA idem AUTHORIZATION idem_owner", "CREATE SCHEMA ext", "CREATE EXTENSION idempotency SCHEMA ext", "CREATE TABLE public.orders (id int)", "GRANT INSERT ON public.orders TO idem_app"] {
        p.run(sql);
    }
    checks.check(
        "psql -v schema=idem -f idempotency-portable.sql, as the schema's owner (not a superuser)",
        install(&psql, "idem_portable", "idem", "idem_owner", &script).map(drop),
    );
    sql_checks(checks, "install checks", p.stdin(INSTALL_CHECKS, &[]));
    p.user("idem_owner").run("GRANT USAGE ON SCHEMA idem TO idem_app");
    // The application role of 0.6.0: EXECUTE on the write API (a fresh install grants PUBLIC none).
    p.run("GRANT idempotency_user TO idem_app");
    sql_checks(checks, "app role checks", p.user("idem_app").stdin(APP_CHECKS, &[]));

    // Refusals that change nothing.
    let before = schema_of(&psql, "idem_portable", "idem").unwrap_or_else(|e| e);
    p.run("CREATE SCHEMA locked");
    p.run("GRANT USAGE ON SCHEMA locked TO idem_other");
    let objects = p.run(OBJECT_COUNT);
    let refused = |checks: &mut Checks, label: &str, want: &str, result: Result<String, String>| match result {
        Ok(_) => checks.fail(&format!("{label}: refused"), "it succeeded"),
        Err(out) if !out.contains(want) => checks.fail(&format!("{label}: refused with a clear error"), &out),
        Err(out) => {
            let same = schema_of(&psql, "idem_portable", "idem").is_ok_and(|s| s == before) && p.q(OBJECT_COUNT).is_ok_and(|n| n == objects);
            if same {
                let msg = out.lines().find_map(|l| l.find("ERROR: ").map(|i| l[i..].chars().take(110).collect::<String>())).unwrap_or_default();
                checks.pass(&format!("{label}: refused ({msg}), nothing changed"));
            } else {
                checks.fail(&format!("{label}: refused, changing nothing"), "the schema changed");
            }
        }
    };
    refused(checks, "a second install into the same schema", "already holds idempotency", install(&psql, "idem_portable", "idem", "idem_owner", &script));
    refused(checks, "an install into the schema holding the extension", "holds the idempotency extension", install(&psql, "idem_portable", "ext", "postgres", &script));
    refused(checks, "an install into a missing schema", "does not exist", install(&psql, "idem_portable", "nosuchschema", "postgres", &script));
    refused(
        checks,
        "an install without -v schema",
        "missing -v schema",
        crate::sh::capture(p.command().args(["-v", "ON_ERROR_STOP=0", "-f"]).arg(&script)),
    );
    refused(checks, "an install by a role without CREATE on the schema", "permission denied", install(&psql, "idem_portable", "locked", "idem_other", &script));

    // Parity of idem_fingerprint with the extension.
    p.run("CREATE SCHEMA port");
    let _ = install(&psql, "idem_portable", "port", "postgres", &script);
    let count = std::env::var("IDEM_PARITY_COUNT").unwrap_or_else(|_| "5000".into());
    sql_checks(checks, "tests/portable/parity.sql", p.file(Path::new("tests/portable/parity.sql"), &[("count", &count)]));

    // Parity of the state machine with the extension: every column of every answer.
    sql_checks(checks, "tests/portable/answers.sql", p.file(Path::new("tests/portable/answers.sql"), &[]));

    // Defaults: each side in a new session, the portable one first (the extension's call loads
    // its library).
    for setting in ["ttl", "lease", "max_retries", "max_response_bytes"] {
        let portable = p.q(&format!("SELECT port._idem_setting('idempotency.{setting}'), port._idem_max_response_bytes()")).unwrap_or_else(|e| e);
        let extension = p.q(&format!("SELECT ext._idem_setting('idempotency.{setting}'), ext._idem_max_response_bytes()")).unwrap_or_else(|e| e);
        let first = |s: &str| s.split('|').next().unwrap_or_default().to_owned();
        checks.check(&format!("default of idempotency.{setting}: portable {} = extension {}", first(&portable), first(&extension)), eq(&portable, &extension));
    }

    // Suites on a portable install.
    let schedule = root.join("target/portable-schedule");
    let skipped = ["install", "members", "guc_prefix", "privileges", "write_once"];
    let full = std::fs::read_to_string("tests/regress/schedule").expect("read tests/regress/schedule");
    let kept: Vec<&str> = full.lines().filter(|l| !skipped.iter().any(|s| *l == format!("test: {s}"))).collect();
    std::fs::write(&schedule, kept.join("\n") + "\n").expect("write the portable schedule");
    let prepare = |db: &str| install(&psql, db, "public", "postgres", &script).map(drop);
    suites(checks, ctx, &psql, "portable", &schedule, PORTABLE_SKIPS_SPECS, &prepare);

    upgrades(checks, &psql, &versions, &logs);
    super::finish(server, checks);
}

/// The portable upgrade between consecutive versions, then every step in a row.
fn upgrades(checks: &mut Checks, psql: &Psql, versions: &[String], logs: &Path) {
    let root = idempotency_pgserver::root();
    let current = versions.last().expect("a version");
    let file = |name: String| root.join(format!("target/{name}"));
    let build = |args: &str, out: &PathBuf| {
        crate::sh::capture(&mut crate::sh::bash(&format!("{args} > '{}'", out.display()))).unwrap_or_else(|e| panic!("{args}: {e}"));
    };
    let inst = |db: &str, script: &Path| install(psql, db, "public", "postgres", script);
    let version_of = |db: &str| psql.db(db).q("SELECT _idem_portable_version()").unwrap_or_else(|e| e);
    for w in versions.windows(2) {
        let (old, new) = (&w[0], &w[1]);
        let old_script = file(format!("idempotency-portable-{old}.sql"));
        let step = file(format!("idempotency-portable-{old}--{new}.sql"));
        // The first portable version is 0.2.0; an older one is built from its released snapshot
        // only to prove the upgrade mechanism.
        build(&format!("python3 scripts/sqlbuild.py portable {old}"), &old_script);
        build(&format!("bash scripts/portable.sh upgrade {old} {new}"), &step);
        let db = format!("idem_portable_from_{}", old.replace('.', "_"));
        psql.recreate(&db).unwrap_or_else(|e| panic!("{e}"));
        checks.check(&format!("portable {old} installs"), inst(&db, &old_script).map(drop));
        checks.check(&format!("records in every state on portable {old}"), psql.db(&db).file(Path::new("tests/upgrade/before.sql"), &[]).map(drop));
        checks.check(&format!("portable upgrade {old} -> {new}"), inst(&db, &step).map(drop));
        checks.check(&format!("the schema records version {new}"), eq(version_of(&db), new));
        sql_checks(checks, "tests/upgrade/after.sql", psql.db(&db).file(Path::new("tests/upgrade/after.sql"), &[]));
        psql.recreate("idem_portable_fresh").unwrap_or_else(|e| panic!("{e}"));
        // A fresh install of the version the step ends at (built from its released snapshot when
        // that is not the current one).
        let fresh_script = file(format!("idempotency-portable-fresh-{new}.sql"));
        build(&format!("python3 scripts/sqlbuild.py portable {new}"), &fresh_script);
        let _ = inst("idem_portable_fresh", &fresh_script);
        let label = format!("portable schema upgraded from {old} equals a fresh portable install of {new}");
        let upgraded = schema_of(psql, &db, "public").unwrap_or_else(|e| e);
        let fresh = schema_of(psql, "idem_portable_fresh", "public").unwrap_or_else(|e| e);
        checks.check(&label, diff(logs, &format!("portable-upgrade-{old}"), &upgraded, &fresh));
        match inst(&db, &step) {
            Ok(_) => checks.fail(&format!("the upgrade script refuses a schema already at {new}"), "it succeeded"),
            Err(out) => {
                if schema_of(psql, &db, "public").is_ok_and(|s| s == upgraded) {
                    let msg = out.lines().find_map(|l| l.find("ERROR: ").map(|i| l[i..].chars().take(90).collect::<String>())).unwrap_or_default();
                    checks.pass(&format!("the upgrade script refuses a schema already at {new} ({msg}), nothing changed"));
                } else {
                    checks.fail(&format!("the upgrade script refuses a schema already at {new}, changing nothing"), "the schema changed");
                }
            }
        }
        // No suites on the upgraded schema: they ran on a fresh portable install above, and the
        // upgraded schema was just compared equal to a fresh one (every function's body,
        // attributes, grants, comments; tables, indexes, constraints, types), so a second run
        // would prove nothing more. What the upgrade alone proves is here: records kept, every
        // answer unchanged (tests/upgrade/after.sql), the schema equal, a second run refused.
    }
    // Every step in a row, from the oldest version to the current one.
    if versions.len() > 2 {
        let db = "idem_portable_chain";
        psql.recreate(db).unwrap_or_else(|e| panic!("{e}"));
        let _ = inst(db, &file(format!("idempotency-portable-{}.sql", versions[0])));
        checks.check(&format!("records in every state on portable {}", versions[0]), psql.db(db).file(Path::new("tests/upgrade/before.sql"), &[]).map(drop));
        let mut chain_ok = true;
        for w in versions.windows(2) {
            chain_ok &= inst(db, &file(format!("idempotency-portable-{}--{}.sql", w[0], w[1]))).is_ok();
        }
        let at = version_of(db);
        checks.check(
            &format!("portable upgrades in a row {}", versions.join(" ")),
            if chain_ok { eq(at, current) } else { Err(format!("a step failed; the schema is at {at}")) },
        );
        sql_checks(checks, "tests/upgrade/after.sql", psql.db(db).file(Path::new("tests/upgrade/after.sql"), &[]));
        let upgraded = schema_of(psql, db, "public").unwrap_or_else(|e| e);
        let fresh = schema_of(psql, "idem_portable_fresh", "public").unwrap_or_else(|e| e);
        checks.check(
            &format!("portable schema upgraded from {} step by step equals a fresh portable install of {current}", versions[0]),
            diff(logs, "portable-upgrade-chain", &upgraded, &fresh),
        );
    }
}
