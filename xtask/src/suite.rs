//! pg_regress and pg_isolation_regress runs and their counts: the one place that reads them.

use crate::report::Checks;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Which driver of the major's pgxs runs the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Driver {
    /// `src/test/regress/pg_regress`: golden files.
    Regress,
    /// `src/test/isolation/pg_isolation_regress`: isolation specs.
    Isolation,
}

/// One run of a suite of `tests/<input>` against a server.
pub(crate) struct Run<'a> {
    pub(crate) pg_config: &'a Path,
    pub(crate) driver: Driver,
    pub(crate) port: u16,
    pub(crate) dbname: &'a str,
    pub(crate) input: &'a str,
    pub(crate) output: PathBuf,
    pub(crate) args: Vec<String>,
}

/// The isolation specs of tests/isolation, sorted (each one a test of the suite).
pub(crate) fn isolation_specs() -> Vec<String> {
    let mut specs: Vec<String> = std::fs::read_dir("tests/isolation/specs")
        .expect("read tests/isolation/specs")
        .filter_map(|e| e.ok()?.file_name().into_string().ok()?.strip_suffix(".spec").map(str::to_owned))
        .collect();
    specs.sort();
    specs
}

/// Runs the suite with its output appended to `log` and adds each of its tests to `checks` (`... ok` /
/// `... FAILED` up to 15, TAP `ok N -` / `not ok N -` from 16); a failed run that counted no
/// failure is one. Prints the failures and the head of regression.diffs. Answers (passed,
/// failed).
pub(crate) fn run(checks: &mut Checks, run: &Run<'_>, log: &Path) -> (u32, u32) {
    let pgxs = PathBuf::from(idempotency_pgserver::pg_config_value(run.pg_config, "--pgxs"));
    let base = pgxs.parent().and_then(Path::parent).and_then(Path::parent).expect("pgxs lies three levels down");
    let driver = match run.driver {
        Driver::Regress => base.join("src/test/regress/pg_regress"),
        Driver::Isolation => base.join("src/test/isolation/pg_isolation_regress"),
    };
    let bindir = idempotency_pgserver::pg_config_value(run.pg_config, "--bindir");
    let _ = std::fs::remove_dir_all(&run.output);
    std::fs::create_dir_all(&run.output).unwrap_or_else(|e| panic!("cannot create {}: {e}", run.output.display()));
    let start = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
    let mut cmd = Command::new(&driver);
    cmd.arg(format!("--bindir={bindir}"))
        .args(["--host=127.0.0.1", &format!("--port={}", run.port), "--user=postgres"])
        .arg(format!("--dbname={}", run.dbname))
        .arg(format!("--inputdir=tests/{}", run.input))
        .arg(format!("--outputdir={}", run.output.display()))
        .args(&run.args);
    let ok = crate::sh::to_log(&mut cmd, log);
    let text = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(text.get(usize::try_from(start).unwrap_or(0)..).unwrap_or_default()).into_owned();
    let (mut passed, mut failed) = (0, 0);
    for line in text.lines() {
        let tap_ok = line.strip_prefix("ok ").is_some_and(starts_numbered);
        let tap_not_ok = line.strip_prefix("not ok ").is_some_and(starts_numbered);
        if tap_ok || dots_then(line, "ok") {
            passed += 1;
        } else if tap_not_ok || dots_then(line, "FAILED") || dots_then(line, "failed") {
            failed += 1;
            println!("{line}");
        } else {
            continue;
        }
        if let Some(name) = suite_test_name(line) {
            checks.named(format!("{}: {name}", run.input));
        }
    }
    if !ok {
        if failed == 0 {
            failed = 1;
        }
        let diffs = std::fs::read_to_string(run.output.join("regression.diffs")).unwrap_or_else(|_| crate::sh::tail(&text, 30));
        for l in diffs.lines().take(150) {
            println!("{l}");
        }
    }
    checks.add(passed, failed);
    (passed, failed)
}

/// The test a result line names: `test install ... ok`, `     reserve ... FAILED`, `ok 1 -
/// install 12 ms`, `not ok 3 + reserve` (a parallel group's member).
fn suite_test_name(line: &str) -> Option<&str> {
    if let Some((head, _)) = line.split_once("...") {
        let head = head.trim();
        return head.strip_prefix("test ").unwrap_or(head).split_whitespace().next();
    }
    let rest = line.strip_prefix("not ok ").or_else(|| line.strip_prefix("ok "))?;
    let mut words = rest.split_whitespace().skip(1);
    match words.next()? {
        "-" | "+" => words.next(),
        other => Some(other),
    }
}

fn starts_numbered(rest: &str) -> bool {
    rest.split(' ').next().is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) && rest.contains(' ')
}

/// `test name ... ok` (any run of spaces after the dots).
fn dots_then(line: &str, word: &str) -> bool {
    line.split_once("...").is_some_and(|(_, rest)| rest.trim_start().starts_with(word) && rest.starts_with(' '))
}

#[cfg(test)]
mod tests {
    use super::{dots_then, starts_numbered, suite_test_name};

    #[test]
    fn reads_both_output_forms() {
        assert!(dots_then("test install                   ... ok           12 ms", "ok"));
        assert!(dots_then("     reserve                  ... FAILED       30 ms", "FAILED"));
        assert!(!dots_then("test install ... okay", "FAILED"));
        assert!(starts_numbered("1         - install    12 ms"));
        assert!(!starts_numbered("- install"));
        assert_eq!(suite_test_name("test install                   ... ok           12 ms"), Some("install"));
        assert_eq!(suite_test_name("     reserve                  ... FAILED       30 ms"), Some("reserve"));
        assert_eq!(suite_test_name("ok 1         - install                                    12 ms"), Some("install"));
        assert_eq!(suite_test_name("not ok 3     + reserve                                    30 ms"), Some("reserve"));
    }
}
