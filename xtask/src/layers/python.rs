//! Layer python: the SQL API from Python (examples/python/check.py, psycopg 3) against the
//! extension and against the portable install, in a throwaway server on the private cluster's
//! port (pg_stat_statements preloaded: no SAVEPOINT on any in-transaction outcome); each of
//! check.py's checks is one test.

use crate::ctx::Ctx;
use crate::report::Checks;
use std::process::Command;

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    checks.note(&format!("== Python example (psycopg 3), PostgreSQL {}", ctx.major));
    if crate::sh::capture(Command::new("python3").args(["-c", "import psycopg"])).is_err() {
        checks.fail("psycopg is importable by python3", "missing: run bash scripts/setup.sh (or python3 -m pip install 'psycopg[binary]')");
        return;
    }
    let built = crate::sh::capture(&mut crate::sh::bash("bash scripts/portable.sh > target/idempotency-portable.sql"));
    if !checks.check("bash scripts/portable.sh > target/idempotency-portable.sql", built.map(drop)) {
        return;
    }
    // pg_stat_statements: check.py counts the SAVEPOINTs the server ran (none, on every outcome).
    let server = super::throwaway(ctx, "python", ctx.port, "shared_preload_libraries = 'pg_stat_statements'");
    let psql = ctx.psql(ctx.port);
    for kind in ["extension", "portable"] {
        let db = format!("idem_python_{kind}");
        psql.recreate(&db).unwrap_or_else(|e| panic!("create {db}: {e}"));
        let installed = match kind {
            "extension" => psql.db(&db).q("CREATE EXTENSION idempotency"),
            _ => psql.db(&db).file(std::path::Path::new("target/idempotency-portable.sql"), &[("schema", "public")]),
        };
        if let Err(e) = installed {
            checks.fail(&format!("{kind}: install idempotency into {db}"), &crate::sh::tail(&e, 5));
            continue;
        }
        check_py(checks, &psql.db(&db).url(), kind);
    }
    super::finish(server, checks);
}

/// check.py's checks: its lines logged, its closing `N passed, N failed` line read (a run
/// without one is a failure).
fn check_py(checks: &mut Checks, url: &str, label: &str) {
    let out = Command::new("python3").current_dir("examples/python").args(["check.py", url, label]).output();
    let text = match out {
        Ok(o) => format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        Err(e) => format!("cannot run check.py: {e}"),
    };
    let last = text.lines().last().unwrap_or_default();
    let counts = last.split_once(" passed, ").and_then(|(p, rest)| Some((p.parse::<u32>().ok()?, rest.strip_suffix(" failed")?.parse::<u32>().ok()?)));
    for l in text.lines().filter(|l| *l != last) {
        // `ok     LABEL: name` / `FAILED LABEL: name`: the name is the same for both installs.
        let result = l.strip_prefix("ok     ").or_else(|| l.strip_prefix("FAILED "));
        if let Some(name) = result.and_then(|r| r.strip_prefix(label)).and_then(|r| r.strip_prefix(": ")) {
            checks.named(format!("check.py: {name}"));
        }
        if l.starts_with("FAILED") || l.starts_with("  ") {
            checks.note(l);
        } else {
            checks.log(l);
        }
    }
    match counts {
        Some((p, f)) => checks.add(p, f),
        None => checks.fail(&format!("{label}: check.py ends with `N passed, N failed`"), &crate::sh::tail(&text, 15)),
    }
}
