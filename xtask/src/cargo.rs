//! Runs cargo test binaries and counts their tests: the one place that reads libtest's output.

use crate::report::Checks;
use std::path::Path;
use std::process::Command;

/// Runs `cargo ARGS` (a `cargo test` or `cargo pgrx test`) in `dir` with `envs`, its output
/// appended to the layer's log, and adds every test it ran to `checks`: the sum of libtest's
/// `test result:` lines, each failing test printed. A failed run that counted no failure (a
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
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("test result: ") {
            passed += count_before(rest, "passed");
            failed += count_before(rest, "failed");
        } else if (line.starts_with("test ") && (line.ends_with("FAILED") || line.ends_with("failed"))) || line.starts_with("error") {
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

/// `12` in `ok. 12 passed; 0 failed; ...` for `word` = `passed`.
fn count_before(summary: &str, word: &str) -> u32 {
    let words: Vec<&str> = summary.split(|c: char| c.is_whitespace() || c == ';').filter(|w| !w.is_empty()).collect();
    words.windows(2).filter(|w| w[1] == word).filter_map(|w| w[0].parse::<u32>().ok()).sum()
}

#[cfg(test)]
mod tests {
    use super::count_before;

    #[test]
    fn reads_libtest_summaries() {
        let line = "ok. 12 passed; 3 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s";
        assert_eq!((count_before(line, "passed"), count_before(line, "failed")), (12, 3));
    }
}
