//! Layer bench: the benchmark in smoke mode on the private cluster: every case runs and
//! produces numbers (no speed asserted, so the dev build: no release build for a smoke run;
//! `bash scripts/bench.sh` measures with the release build). Then the soak's plateau as a
//! property: `bench --soak-check` runs [`SOAK_CYCLES`] cycles of the soak's shape on its own server
//! and fails if the size after the last cycle exceeds 1.3x the size after cycle 5 (sizes only, no
//! timing).

use crate::ctx::Ctx;
use crate::report::Checks;
use std::process::Command;

/// The benchmark's dev build.
const BENCH: &str = "target/debug/bench";

/// Runs the layer.
pub(crate) fn run(_: &Ctx, checks: &mut Checks) {
    let log = checks.log_path().to_owned();
    let built = crate::sh::to_log(Command::new("cargo").args(["build", "-q", "-p", "idempotency-bench", "--bin", "bench"]), &log);
    let ok = built && crate::sh::to_log(Command::new(BENCH).arg("--smoke"), &log);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    for l in crate::sh::tail(&text, 3).lines() {
        checks.note(l);
    }
    checks.check(&format!("{BENCH} --smoke"), if ok { Ok(()) } else { Err(crate::sh::tail(&text, 20)) });

    let cycles = SOAK_CYCLES.to_string();
    let label = format!("{BENCH} --soak-check {cycles}");
    let ok = built && crate::sh::to_log(Command::new(BENCH).args(["--soak-check", &cycles]), &log);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let verdict = text.lines().rev().find(|l| l.starts_with("soak check ")).unwrap_or("no soak check line");
    checks.note(verdict);
    checks.check(&label, if ok { Ok(()) } else { Err(crate::sh::tail(&text, 20)) });
}

/// Cycles of the plateau check (at least 30: the bound; each a few seconds).
const SOAK_CYCLES: usize = 30;
