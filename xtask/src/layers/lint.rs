//! Layer lint: clippy over every crate and target, the extension included, with the lints of the
//! root Cargo.toml's `[workspace.lints]`; then the client with sqlx and TLS (the code behind
//! those features; the test kit and the tests build both drivers in every build). A warning fails. Then the crates.io dry run of
//! every crate that publishes (`cargo publish --dry-run --workspace`: the members without
//! `publish = false`, packaged together through a temporary local registry, so each is built
//! against the others as it is about to publish them), or `cargo package --workspace --offline`
//! where the index is unreachable; the check's name says which ran. A warning about a manifest
//! (metadata crates.io shows, such as documentation, homepage or repository) fails it.
//! `--allow-dirty`: a working tree with uncommitted edits is what a contributor runs the test
//! command in, and dirt says nothing about publishability (the package is built from the
//! working tree either way); CI runs from a clean clone.

use crate::ctx::Ctx;
use crate::report::Checks;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Runs the layer.
pub(crate) fn run(_: &Ctx, checks: &mut Checks) {
    let runs: [&[&str]; 2] = [
        &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"],
        &["clippy", "-p", "idempotency-client", "--all-targets", "--features", "sqlx,tls", "--", "-D", "warnings"],
    ];
    for args in runs {
        let log = checks.log_path().to_owned();
        let (ok, text) = crate::sh::to_log_text(Command::new("cargo").args(args), &log);
        let findings: Vec<&str> = text.lines().filter(|l| l.starts_with("warning") || l.starts_with("error")).take(30).collect();
        checks.check(&format!("cargo {}", args.join(" ")), if ok { Ok(()) } else { Err(findings.join("\n")) });
    }
    publish(checks);
}

/// Words of cargo's errors when the registry cannot be reached (not when it refuses a package).
const UNREACHABLE: &[&str] = &["Unable to update registry", "failed to query replaced source", "network failure", "Could not resolve host", "Couldn't resolve host", "failed to download from"];

/// `cargo publish --dry-run --workspace`, or `cargo package --workspace --offline` when the
/// index is unreachable; how long it took (a note).
fn publish(checks: &mut Checks) {
    let started = Instant::now();
    forget_packaged_copies(checks);
    let log = checks.log_path().to_owned();
    let mut args = vec!["publish", "--dry-run", "--allow-dirty", "--workspace", "--target-dir", PUBLISH_TARGET];
    let (mut ok, mut text) = crate::sh::to_log_text(Command::new("cargo").args(&args), &log);
    if !ok && UNREACHABLE.iter().any(|w| text.contains(w)) {
        checks.note("the crates.io index is unreachable: cargo package --offline instead of the dry run");
        args = vec!["package", "--offline", "--allow-dirty", "--workspace", "--target-dir", PUBLISH_TARGET];
        (ok, text) = crate::sh::to_log_text(Command::new("cargo").args(&args), &log);
    }
    let mut findings: Vec<&str> = text.lines().filter(|l| l.starts_with("warning: manifest")).collect();
    findings.extend(text.lines().skip_while(|l| !l.starts_with("error")).take(30));
    let packaged = text.lines().filter(|l| l.trim_start().starts_with("Packaging ")).count();
    checks.check(&format!("cargo {} ({packaged} crates)", args.join(" ")), if ok && findings.is_empty() { Ok(()) } else { Err(findings.join("\n")) });
    checks.note(&format!("cargo {} took {:.0} s", args[..2].join(" "), started.elapsed().as_secs_f64()));
}

/// The dry run's own target directory: its builds of the packaged crates come from cargo's
/// temporary registry, and [`forget_packaged_copies`] removes them before each run without
/// touching the other layers' builds.
const PUBLISH_TARGET: &str = "target/publish";

/// Removes what cargo keeps of the workspace's publishable crates from earlier dry runs: their
/// unpacked copies from its temporary local registries (`$CARGO_HOME/registry/src/-HASH/
/// NAME-VERSION`; crates.io's folder is named, `index.crates.io-HASH`, and is left alone) and
/// their builds in [`PUBLISH_TARGET`]. Cargo unpacks and builds a registry crate once per name
/// and version and reuses both in every later run (a registry crate is taken as immutable), so
/// without this a crate is verified against its dependencies as the first dry run of the version
/// packaged them, not as it is about to publish them (seen in 0.7.0: the client verified
/// against a core from before `Key::derive`).
fn forget_packaged_copies(checks: &mut Checks) {
    let names: Vec<String> = crate::workspace::members(Path::new(".")).into_iter().filter(|m| m.publish).map(|m| m.name).collect();
    let home = std::env::var_os("CARGO_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
    let unpacked = home.map(|h| h.join("registry/src")).into_iter().flat_map(|src| entries(&src)).filter(|r| r.file_name().is_some_and(|n| n.to_string_lossy().starts_with('-')));
    let built = ["deps", ".fingerprint", "build", "incremental"].map(|d| Path::new(PUBLISH_TARGET).join("debug").join(d));
    for dir in unpacked.chain(built) {
        for path in entries(&dir) {
            let file = path.file_name().map(|n| n.to_string_lossy().replace('_', "-")).unwrap_or_default();
            let ours = names.iter().any(|n| file.strip_prefix(n.as_str()).is_some_and(|rest| rest.starts_with('-') || rest.starts_with('.')) || file.strip_prefix("lib").and_then(|f| f.strip_prefix(n.as_str())).is_some_and(|rest| rest.starts_with('-') || rest.starts_with('.')));
            let removed = if !ours { Ok(()) } else if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            if let Err(e) = removed {
                checks.note(&format!("cannot remove {}: {e}", path.display()));
            }
        }
    }
}

/// The paths in folder `dir` (none if it cannot be read).
fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}
