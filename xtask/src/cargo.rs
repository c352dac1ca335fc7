//! Runs cargo test binaries and counts their tests: the one place that reads libtest's output.

use crate::report::Checks;
use std::path::Path;
use std::process::Command;

/// Runs `cargo ARGS` (a `cargo test` or `cargo pgrx test`) in `dir` with `envs`, its output
/// appended to the layer's log, and adds every test it ran to `checks`: the sum of libtest's
/// `test result:` lines, each failing test printed, and each test's name (`BINARY::TEST`, the
/// binary from cargo's `Running` and `Doc-tests` lines). A failed run that counted no failure (a
/// build error, a crash) is one failure.
pub(crate) fn test(checks: &mut Checks, dir: &Path, args: &[&str], envs: &[(&str, &str)]) {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(dir).args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let log = checks.log_path().to_owned();
    let (ok, text) = crate::sh::to_log_text(&mut cmd, &log);
    let (mut passed, mut failed) = (0, 0);
    let mut binary = String::new();
    for line in text.lines() {
        if let Some(b) = binary_of(line) {
            binary = b;
        } else if let Some(name) = test_name(line) {
            checks.named(format!("{binary}::{name}"));
            if let Some(seconds) = reported_time(line) {
                checks.timed(format!("{binary}::{name}"), seconds);
            }
        }
        if let Some(rest) = line.strip_prefix("test result: ") {
            passed += count_before(rest, "passed");
            failed += count_before(rest, "failed");
        } else if (line.starts_with("test ") && (without_time(line).ends_with("FAILED") || line.ends_with("failed"))) || line.starts_with("error") {
            println!("{line}");
        }
    }
    if !ok {
        if failed == 0 {
            failed = 1;
        }
        let detail: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("---- ")).take(80).collect();
        for l in detail {
            println!("{l}");
        }
        println!("(cargo {} failed; log: {})", args.join(" "), log.display());
    }
    checks.add(passed, failed);
}

/// [`test`] with each test's time: libtest's `--report-time`, unstable, which a test binary
/// accepts on a stable toolchain when it runs with `RUSTC_BOOTSTRAP=1`; a runner sets that for the
/// test binaries alone, so nothing is compiled differently (a runner is no part of cargo's
/// fingerprints). For `cargo test` of packages without doc tests only: rustdoc runs those without
/// the runner and would refuse the option. `args` may hold `--` and libtest's arguments.
pub(crate) fn test_timed(checks: &mut Checks, dir: &Path, args: &[&str], envs: &[(&str, &str)]) {
    let (cargo, libtest) = args.iter().position(|a| *a == "--").map_or((args, &[][..]), |i| (&args[..i], &args[i + 1..]));
    let mut timed: Vec<&str> = cargo.to_vec();
    timed.extend(["--config", "target.'cfg(all())'.runner = ['env', 'RUSTC_BOOTSTRAP=1']", "--"]);
    timed.extend(libtest);
    timed.extend(["-Z", "unstable-options", "--report-time"]);
    test(checks, dir, &timed, envs);
}

/// Seconds cargo spent building, from the `Finished `PROFILE` profile [..] target(s) in 1m 35s`
/// lines of its output in `text` (one per cargo command; a command that built nothing says
/// `in 0.25s`): the summary's build column.
pub(crate) fn build_seconds(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.trim_start().starts_with("Finished `"))
        .filter_map(|l| l.rsplit_once(" target(s) in "))
        .map(|(_, took)| took.split_whitespace().map(duration_part).sum::<f64>())
        .sum()
}

/// `1m` → 60, `35s` → 35, `0.25s` → 0.25 (a part of cargo's elapsed time).
fn duration_part(part: &str) -> f64 {
    let unit = match part.chars().last() {
        Some('h') => 3600.0,
        Some('m') => 60.0,
        _ => 1.0,
    };
    part.trim_end_matches(['h', 'm', 's']).parse::<f64>().map_or(0.0, |n| n * unit)
}

/// The seconds libtest reported for a test (`test NAME ... ok <0.233s>`).
fn reported_time(line: &str) -> Option<f64> {
    line.strip_suffix("s>")?.rsplit_once(" <")?.1.parse().ok()
}

/// A line without libtest's reported time.
fn without_time(line: &str) -> &str {
    line.rsplit_once(" <").filter(|(_, t)| t.ends_with("s>")).map_or(line, |(l, _)| l)
}

/// The test binary a line of cargo's begins: `Running tests/checklist.rs
/// (target/debug/deps/checklist-0a1b)` → `checklist`, `Doc-tests idempotency_core` →
/// `doc idempotency_core`.
fn binary_of(line: &str) -> Option<String> {
    let line = line.trim_start();
    if let Some(rest) = line.strip_prefix("Running ") {
        let path = rest.rsplit_once('(').map_or(rest, |(_, p)| p.trim_end_matches(')'));
        let file = path.rsplit('/').next().unwrap_or(path);
        return Some(file.rsplit_once('-').map_or(file, |(name, _)| name).to_owned());
    }
    line.strip_prefix("Doc-tests ").map(|crate_name| format!("doc {}", crate_name.trim()))
}

/// The name of a test libtest ran (`test NAME ... ok` or `... FAILED`; with `--nocapture` the
/// result may follow on a later line), not of one it ignored.
fn test_name(line: &str) -> Option<&str> {
    let (name, result) = without_time(line).strip_prefix("test ")?.split_once(" ... ")?;
    (!result.trim_start().starts_with("ignored") && !name.is_empty()).then_some(name)
}

/// `12` in `ok. 12 passed; 0 failed; ...` for `word` = `passed`.
fn count_before(summary: &str, word: &str) -> u32 {
    let words: Vec<&str> = summary.split(|c: char| c.is_whitespace() || c == ';').filter(|w| !w.is_empty()).collect();
    words.windows(2).filter(|w| w[1] == word).filter_map(|w| w[0].parse::<u32>().ok()).sum()
}

#[cfg(test)]
mod tests {
    use super::{binary_of, build_seconds, count_before, reported_time, test_name, without_time};

    #[test]
    fn reads_libtest_summaries() {
        let line = "ok. 12 passed; 3 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s";
        assert_eq!((count_before(line, "passed"), count_before(line, "failed")), (12, 3));
    }

    #[test]
    fn reads_binaries_and_test_names() {
        assert_eq!(binary_of("     Running tests/checklist.rs (target/debug/deps/checklist-0a1b2c)").as_deref(), Some("checklist"));
        assert_eq!(binary_of("     Running unittests src/lib.rs (target/debug/deps/idempotency_core-9f)").as_deref(), Some("idempotency_core"));
        assert_eq!(binary_of("   Doc-tests idempotency_client").as_deref(), Some("doc idempotency_client"));
        assert_eq!(test_name("test duplicate_replays ... ok"), Some("duplicate_replays"));
        assert_eq!(test_name("test tls::refuses ... FAILED"), Some("tls::refuses"));
        assert_eq!(test_name("test failover ... "), Some("failover"));
        assert_eq!(test_name("test pg_upgrade ... ignored, its own layer"), None);
        assert_eq!(test_name("test result: ok. 3 passed"), None);
    }

    #[test]
    fn reads_build_times() {
        let log = "   Compiling tokio v1.54.1\n    Finished `test` profile [unoptimized + debuginfo] target(s) in 1m 35s\n\
                   \u{1b}[32m    Finished\u{1b}[0m installing idempotency\n    Finished `release` profile [optimized] target(s) in 2.50s\n";
        assert!((build_seconds(log) - 97.5).abs() < 1e-9);
        assert_eq!(build_seconds("test result: ok. 3 passed"), 0.0);
    }

    #[test]
    fn reads_reported_times() {
        assert_eq!(test_name("test tls::refuses ... ok <0.233s>"), Some("tls::refuses"));
        assert_eq!(reported_time("test tls::refuses ... ok <0.233s>"), Some(0.233));
        assert_eq!(reported_time("test tls::refuses ... ok"), None);
        assert_eq!(without_time("test a ... FAILED <12.500s>"), "test a ... FAILED");
        assert_eq!(without_time("test a<b ... ok"), "test a<b ... ok");
    }
}
