//! Layer bench: the benchmark in smoke mode on the private cluster: every case runs and
//! produces numbers (no speed asserted, so the dev build: no release build for a smoke run;
//! `bash scripts/bench.sh` measures with the release build). Beside it, the soak's plateau as a
//! property: `bench --soak-check` runs [`SOAK_CYCLES`] cycles of the soak's shape on its own server
//! (port [`SOAK_CHECK_PORT`]; the smoke's own soak uses the default one) and fails if the size
//! after the last cycle exceeds 1.3x the size after cycle 5 (sizes only, no timing). The check
//! mostly waits for the maintenance worker's passes (one a second), so it runs while the smoke
//! does instead of after it.

use crate::ctx::Ctx;
use crate::report::Checks;
use std::process::Command;

/// The benchmark's dev build.
const BENCH: &str = "target/debug/bench";

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let log = checks.log_path().to_owned();
    let built = crate::sh::to_log(Command::new("cargo").args(["build", "-p", "idempotency-bench", "--bin", "bench"]), &log);
    let cycles = SOAK_CYCLES.to_string();
    let label = format!("{BENCH} --soak-check {cycles}");
    let soak_log = ctx.logs.join("bench-soak-check.log");
    let soak = built.then(|| {
        let mut check = Command::new(BENCH);
        check.args(["--soak-check", &cycles]).env("IDEM_SOAK_PORT", SOAK_CHECK_PORT.to_string());
        let soak_log = soak_log.clone();
        std::thread::spawn(move || crate::sh::to_log(&mut check, &soak_log))
    });

    let ok = built && crate::sh::to_log(Command::new(BENCH).arg("--smoke"), &log);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    for l in crate::sh::tail(&text, 3).lines() {
        checks.note(l);
    }
    checks.check(&format!("{BENCH} --smoke"), if ok { Ok(()) } else { Err(crate::sh::tail(&text, 20)) });

    let ok = soak.is_some_and(|t| t.join().unwrap_or(false));
    let text = std::fs::read_to_string(&soak_log).unwrap_or_default();
    checks.log(&text);
    let verdict = text.lines().rev().find(|l| l.starts_with("soak check ")).unwrap_or("no soak check line");
    checks.note(verdict);
    checks.check(&label, if ok { Ok(()) } else { Err(crate::sh::tail(&text, 20)) });
}

/// The soak check's server port (its directory target/servers/bench-soak-PORT).
const SOAK_CHECK_PORT: u16 = 55916;

/// Cycles of the plateau check (at least 30: the bound; each a few seconds).
const SOAK_CYCLES: usize = 30;
