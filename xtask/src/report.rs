//! One way to report a check, and one result type per layer.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a layer found: its checks passed and failed, and what it legitimately could not run
/// (each one skipped, with why; a layer with nothing else did not run at all); and the names of
/// its checks, for the count of distinct ones (see [`Checks::named`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Outcome {
    pub(crate) passed: u32,
    pub(crate) failed: u32,
    pub(crate) skipped: Vec<String>,
    pub(crate) names: BTreeSet<String>,
    /// Each timed test's name and seconds (libtest's `--report-time`: [`crate::cargo::test_timed`]).
    pub(crate) times: Vec<(String, f64)>,
}

impl Outcome {
    /// The layer did not run at all: why.
    pub(crate) fn not_run(&self) -> Option<String> {
        (self.passed == 0 && self.failed == 0 && !self.skipped.is_empty()).then(|| self.skipped.join("; "))
    }
}

/// The checks of one layer: each is one line `ok     LABEL` or `FAILED LABEL` (with its detail
/// indented below) in the layer's log; failures and notes are printed as well.
pub(crate) struct Checks {
    layer: String,
    passed: u32,
    failed: u32,
    skipped: Vec<String>,
    names: BTreeSet<String>,
    times: Vec<(String, f64)>,
    log: File,
    path: PathBuf,
}

impl Checks {
    /// The checks of layer `layer` logging to `log` (created anew).
    pub(crate) fn new(layer: &str, log: &Path) -> Checks {
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        }
        // Appending, like the child processes that write to the same log (crate::sh::to_log): a
        // handle at its own offset would write over their output.
        File::create(log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let file = std::fs::OpenOptions::new().append(true).open(log).unwrap_or_else(|e| panic!("cannot open {}: {e}", log.display()));
        Checks { layer: layer.to_owned(), passed: 0, failed: 0, skipped: vec![], names: BTreeSet::new(), times: vec![], log: file, path: log.to_owned() }
    }

    /// Failures so far.
    pub(crate) fn failed(&self) -> u32 {
        self.failed
    }

    /// The name of a check a test program ran (`checklist::duplicate_replays`, `regress: reserve`),
    /// the same on every major, driver and install: the closing line counts the distinct names.
    pub(crate) fn named(&mut self, name: String) {
        self.names.insert(name);
    }

    /// How long test `name` took, in seconds.
    pub(crate) fn timed(&mut self, name: String, seconds: f64) {
        self.times.push((name, seconds));
    }

    /// A check of the harness's own, named by its layer and its label without the parenthesized
    /// details (counts, messages), which may differ between runs.
    fn own(&mut self, label: &str) {
        let name = format!("{}: {}", self.layer, without_details(label));
        self.names.insert(name);
    }

    /// The layer's log file (for the child processes a layer runs).
    pub(crate) fn log_path(&self) -> &Path {
        &self.path
    }

    fn line(&mut self, text: &str, print: bool) {
        let _ = writeln!(self.log, "{text}");
        if print {
            println!("{text}");
        }
    }

    /// A check that passed.
    pub(crate) fn pass(&mut self, label: &str) {
        self.passed += 1;
        self.own(label);
        self.line(&format!("ok     {label}"), false);
    }

    /// A check that failed, with what was seen.
    pub(crate) fn fail(&mut self, label: &str, detail: &str) {
        self.failed += 1;
        self.own(label);
        self.line(&format!("FAILED {label}"), true);
        for l in detail.lines().take(60) {
            self.line(&format!("       {l}"), true);
        }
    }

    /// One check: passes on `Ok`, fails with the `Err`'s text.
    pub(crate) fn check(&mut self, label: &str, result: Result<(), String>) -> bool {
        match result {
            Ok(()) => {
                self.pass(label);
                true
            }
            Err(detail) => {
                self.fail(label, &detail);
                false
            }
        }
    }

    /// A line of information, not a check (printed and logged).
    pub(crate) fn note(&mut self, text: &str) {
        self.line(&format!("   {text}"), true);
    }

    /// A line for the log only.
    pub(crate) fn log(&mut self, text: &str) {
        self.line(text, false);
    }

    /// Tests counted by a test program (a cargo test binary, pg_regress, check.py): each one a
    /// check of this layer (their names through [`Checks::named`]).
    pub(crate) fn add(&mut self, passed: u32, failed: u32) {
        self.passed += passed;
        self.failed += failed;
    }

    /// The layer, or a part of it, did not run, and why: one skipped in the closing line. Only
    /// for a subject that is legitimately absent (Citus not installed, a part the run's
    /// settings leave out); a layer that cannot run what it must fails instead.
    pub(crate) fn skip(&mut self, why: &str) {
        self.line(&format!("skipped: {why}"), false);
        self.skipped.push(why.to_owned());
    }

    /// The result. A layer that counted nothing and skipped nothing has failed.
    pub(crate) fn outcome(mut self) -> Outcome {
        if self.skipped.is_empty() && self.passed == 0 && self.failed == 0 {
            self.fail("the layer counted no test", "");
        }
        self.line(&format!("{} passed, {} failed, {} skipped", self.passed, self.failed, self.skipped.len()), false);
        Outcome { passed: self.passed, failed: self.failed, skipped: self.skipped, names: self.names, times: self.times }
    }
}

/// `label` without its parenthesized parts, spaces folded.
fn without_details(label: &str) -> String {
    let mut out = String::new();
    let mut depth = 0u32;
    for c in label.chars() {
        match c {
            '(' => depth += 1,
            ')' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ").replace(" ,", ",")
}

/// `Ok` when `got` equals `want`, else what was expected and seen.
pub(crate) fn eq(got: impl AsRef<str>, want: impl AsRef<str>) -> Result<(), String> {
    let (got, want) = (got.as_ref(), want.as_ref());
    if got == want {
        Ok(())
    } else {
        Err(format!("expected [{want}], got [{got}]"))
    }
}

/// `Ok` when `got` (a number) is at least `min`.
pub(crate) fn ge(got: i64, min: i64) -> Result<(), String> {
    if got >= min {
        Ok(())
    } else {
        Err(format!("expected >= {min}, got {got}"))
    }
}

/// `Ok` when `cond` holds, else `why`.
pub(crate) fn ensure(cond: bool, why: impl Into<String>) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(why.into())
    }
}

#[cfg(test)]
mod tests {
    use super::without_details;

    #[test]
    fn a_label_without_its_details() {
        assert_eq!(without_details("8 clients ran through the update (1234 transactions)"), "8 clients ran through the update");
        assert_eq!(without_details("refused (ERROR: x (y)), nothing changed"), "refused, nothing changed");
    }
}
