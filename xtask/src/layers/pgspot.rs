//! Layer pgspot: pgspot over the generated install script. Every finding fails the layer but
//! two: sql/schema.sql's inlined SQL functions have no SET search_path (see [`INLINED`]), and the native functions of sql/native.sql and sql/replay.sql are SECURITY DEFINER without a SET search_path on
//! purpose (they resolve nothing by name; see that file), which pgspot reports as PS003.

use crate::ctx::Ctx;
use crate::report::Checks;
use std::process::Command;

/// sql/schema.sql's IMMUTABLE LANGUAGE sql functions: without a `SET` clause so the planner inlines
/// them (the expiry index's key is computed per inserted record; a `SET search_path` would make it
/// a function call with a GUC save and restore each time), every name in them schema-qualified.
const INLINED: [&str; 3] = [
    "extschema._idem_status_code(word text)",
    "extschema._idem_status_word(code pg_catalog.char)",
    "extschema._idem_expiry_bucket(expires_at timestamptz)",
];

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let script = ctx.extdir().join(format!("idempotency--{}.sql", ctx.version));
    let out = crate::sh::capture(
        Command::new("python3")
            .args(["-m", "pgspot", "--proc-without-search-path", "extschema.idem_maintain(batch_size integer,action text)"])
            .args(INLINED.iter().flat_map(|p| ["--proc-without-search-path", p]))
            .arg(&script),
    )
    .unwrap_or_else(|e| e);
    checks.log(&out);
    // sql/native.sql's replacements, and sql/replay.sql's idem_replay (native from the start).
    let native_sql = ["sql/native.sql", "sql/replay.sql"]
        .map(|f| std::fs::read_to_string(f).unwrap_or_else(|e| panic!("read {f}: {e}")))
        .join("\n");
    let native: Vec<&str> = native_sql
        .lines()
        .filter_map(|l| l.strip_prefix("CREATE OR REPLACE FUNCTION @extschema@.").or_else(|| l.strip_prefix("CREATE FUNCTION @extschema@.")))
        .filter_map(|rest| rest.split_once('(').map(|(name, _)| name))
        .filter(|name| name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .collect();
    let expected = |line: &str| {
        native.iter().any(|n| line.starts_with(&format!("PS003: SECURITY DEFINER function without explicit search_path: extschema.{n}(")))
    };
    let findings: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("PS") && l[2..].starts_with(|c: char| c.is_ascii_digit()))
        .filter(|l| !expected(l))
        .collect();
    let clean = out.lines().any(|l| {
        l.strip_prefix(" Errors: ")
            .and_then(|r| r.split_once(' '))
            .is_some_and(|(n, rest)| n.bytes().all(|b| b.is_ascii_digit()) && rest.starts_with("Warnings: 0 Unknown: 0"))
    });
    if native.is_empty() {
        checks.fail("sql/native.sql names its native functions", "no `CREATE OR REPLACE FUNCTION @extschema@.name(` line");
    } else if findings.is_empty() && clean {
        checks.pass(&format!("pgspot finds nothing in {} but the native functions' PS003", script.display()));
    } else {
        for f in &findings {
            checks.fail("pgspot finding", f);
        }
        if findings.is_empty() {
            checks.fail("pgspot reports no warning and no unknown", &crate::sh::tail(&out, 10));
        }
    }
}
