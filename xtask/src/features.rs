//! The feature sets users can pick, per publishable crate: the one table ([`FEATURE_SETS`]),
//! each set compiled by the unit layer with `cargo check -p CRATE --no-default-features
//! --features SET` (one check each; a warning fails it too: code that only some sets compile
//! is where an unused import hides). A unit test keeps the table whole: every crate that
//! publishes has a row, and every feature it declares is in one of its sets.

use crate::report::Checks;
use std::process::Command;
use std::time::Instant;

/// Each publishable crate and the feature sets compiled for it (`""`: no feature at all).
/// A crate added to the workspace without `publish = false` needs a row here.
pub(crate) const FEATURE_SETS: &[(&str, &[&str])] = &[
    ("idempotency-core", &[""]),
    (
        "idempotency-client",
        &[
            // No set without a driver: the crate refuses it (driver/mod.rs's compile_error!).
            "postgres",      // the default
            "sqlx",          // sqlx without tokio-postgres (lib.rs, "Layout")
            "postgres,sqlx", // both drivers
            "postgres,tls",
            "sqlx,tls",
            "postgres,tracing",
            "postgres,anyhow",
            "sqlx,eyre",
            // docs.rs's build (all-features).
            "postgres,sqlx,tls,tracing,anyhow,eyre",
        ],
    ),
    (
        "idempotency-tower",
        &[
            // A driver in every set, as for the client (its compile_error!).
            "postgres",      // the default: the tower layer, no web framework
            "sqlx",
            "postgres,axum", // the README's axum stack
            "sqlx,axum",
            "postgres,metrics",
            "sqlx,tls",
            "postgres,sqlx,tls,axum,metrics", // docs.rs's build (all-features)
        ],
    ),
    ("idempotency-actix", &["postgres", "sqlx", "postgres,metrics", "sqlx,tls", "postgres,sqlx,tls,metrics"]),
    ("idempotency-tonic", &["postgres", "sqlx", "postgres,metrics", "sqlx,tls", "postgres,sqlx,tls,metrics"]),
];

/// `cargo check` of every set of [`FEATURE_SETS`], one check each, and how long they took
/// together (a note).
pub(crate) fn check(checks: &mut Checks) {
    let started = Instant::now();
    let mut count = 0;
    for (krate, sets) in FEATURE_SETS {
        for set in *sets {
            let mut args = vec!["check", "-p", krate, "--no-default-features"];
            if !set.is_empty() {
                args.extend(["--features", set]);
            }
            let log = checks.log_path().to_owned();
            let (ok, text) = crate::sh::to_log_text(Command::new("cargo").args(&args), &log);
            let findings: Vec<&str> = text.lines().filter(|l| l.starts_with("warning") || l.starts_with("error")).take(30).collect();
            checks.check(&format!("cargo {}", args.join(" ")), if ok && findings.is_empty() { Ok(()) } else { Err(findings.join("\n")) });
            count += 1;
        }
    }
    checks.note(&format!("{count} feature sets checked in {:.0} s", started.elapsed().as_secs_f64()));
}

#[cfg(test)]
mod tests {
    use super::FEATURE_SETS;
    use std::path::Path;

    #[test]
    fn every_publishable_crate_and_feature_has_a_set() {
        let members = crate::workspace::members(Path::new(".."));
        for member in members.iter().filter(|m| m.publish) {
            let Some((_, sets)) = FEATURE_SETS.iter().find(|(name, _)| *name == member.name) else {
                panic!("{} publishes: give it a row of feature sets in xtask/src/features.rs", member.name);
            };
            for feature in member.features.iter().filter(|f| *f != "default") {
                assert!(sets.iter().any(|set| set.split(',').any(|f| f == feature)), "{}'s feature {feature} is in none of its FEATURE_SETS", member.name);
            }
        }
        for (name, _) in FEATURE_SETS {
            assert!(members.iter().any(|m| m.name == *name && m.publish), "FEATURE_SETS names {name}, not a publishable member of the workspace");
        }
    }
}
