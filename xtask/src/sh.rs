//! Child processes: output captured, or written to a layer's log.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The cargo commands this run started (each [`to_log`] of a `cargo` command): the summary
/// prints it.
pub(crate) static CARGO_RUNS: AtomicU32 = AtomicU32::new(0);

/// Runs `cmd`; its stdout (trimmed at the end) on success, else its output and status.
pub(crate) fn capture(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim_end().to_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout}\n{}\n({})", String::from_utf8_lossy(&out.stderr).trim_end(), out.status).trim().to_owned())
    }
}

/// [`to_log`], and what the command appended to the log.
pub(crate) fn to_log_text(cmd: &mut Command, log: &Path) -> (bool, String) {
    let start = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
    let ok = to_log(cmd, log);
    let text = std::fs::read(log).unwrap_or_default();
    (ok, String::from_utf8_lossy(text.get(usize::try_from(start).unwrap_or(0)..).unwrap_or_default()).into_owned())
}

/// Runs `cmd` with its output appended to `log`; whether it succeeded.
pub(crate) fn to_log(cmd: &mut Command, log: &Path) -> bool {
    if cmd.get_program() == "cargo" {
        CARGO_RUNS.fetch_add(1, Ordering::Relaxed);
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", log.display()));
    let err = file.try_clone().expect("clone the log handle");
    match cmd.stdin(Stdio::null()).stdout(file).stderr(err).status() {
        Ok(s) => s.success(),
        Err(e) => {
            let _ = std::fs::write(log, format!("cannot run {cmd:?}: {e}\n"));
            false
        }
    }
}

/// A `bash -c SCRIPT` command (for a pipeline a layer checks, run as its users run it).
pub(crate) fn bash(script: &str) -> Command {
    let mut c = Command::new("bash");
    c.arg("-c").arg(script);
    c
}

/// The last `n` lines of `text`.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The version chain: released versions, then the current one (`scripts/sqlbuild.py versions`).
pub(crate) fn versions() -> Vec<String> {
    capture(Command::new("python3").arg("scripts/sqlbuild.py").arg("versions"))
        .unwrap_or_else(|e| panic!("scripts/sqlbuild.py versions: {e}"))
        .lines()
        .map(str::to_owned)
        .collect()
}
