//! Layer package_pgxn: the PGXN distribution scripts/package.sh builds
//! (target/packages/pgxn: META.json and idempotency-VERSION.zip) checked by
//! tests/package/pgxn/check.py: META.json valid against the PGXN Meta Spec 1.0's schema
//! (tests/package/pgxn/meta.schema.json, written from the spec), each deliberately broken copy of
//! it rejected, its versions the workspace's, and the zip holding it with the source. The
//! distribution does not depend on the major; each major's run checks the one its run built.

use crate::ctx::Ctx;
use crate::report::Checks;
use std::path::Path;
use std::process::Command;

/// Runs the layer.
pub(super) fn run(ctx: &Ctx, checks: &mut Checks) {
    let out = Path::new("target/packages/pgxn");
    let zip = out.join(format!("idempotency-{}.zip", ctx.version));
    if crate::sh::capture(Command::new("python3").args(["-c", "import jsonschema"])).is_err() {
        return checks.fail("the PGXN checks run", "python3 has no jsonschema: run bash scripts/setup.sh (pip install jsonschema)");
    }
    let ran = Command::new("python3").arg("tests/package/pgxn/check.py").arg("tests/package/pgxn/meta.schema.json").arg(out.join("META.json")).arg(&zip).arg(&ctx.version).output();
    let Ok(ran) = ran else {
        return checks.fail("the PGXN checks run", "cannot run python3");
    };
    let stdout = String::from_utf8_lossy(&ran.stdout);
    let mut counted = 0;
    for line in stdout.lines() {
        if let Some(name) = line.strip_prefix("ok ") {
            checks.pass(name);
            counted += 1;
        } else if let Some((name, why)) = line.strip_prefix("FAILED ").and_then(|l| l.split_once(": ")) {
            checks.fail(name, why);
            counted += 1;
        }
    }
    if counted == 0 || (!ran.status.success() && checks.failed() == 0) {
        checks.fail("the PGXN checks run", &format!("{stdout}{}", String::from_utf8_lossy(&ran.stderr)));
    }
}
