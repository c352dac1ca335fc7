//! Every version string shown to users as the current release matches Cargo.toml.
//!
//! Scans README.md, CONTRIBUTING.md and docs/*.md for the shapes that name the version a user
//! installs or runs today — package file names (`idempotency-X.Y.Z-pgNN-...`,
//! `postgresql-15-idempotency_X.Y.Z_amd64.deb`), `ALTER EXTENSION idempotency UPDATE TO 'X.Y.Z'`,
//! the demo's banner (`idempotency X.Y.Z:`) and dependency lines (`idempotency-client = "X.Y.Z"`,
//! `version = "X.Y.Z"`) — and fails when one differs from `[workspace.package] version`. Prose
//! about past releases ("0.1.0 had …", "`CREATE EXTENSION idempotency VERSION '0.1.0'`", the
//! performance history) has none of these shapes and is not flagged. Std only.

use std::fs;
use std::path::{Path, PathBuf};

/// The shapes of a current-version string: the text before the version and the text that must
/// follow it.
const SHAPES: &[(&str, &str)] = &[
    ("idempotency-", "-pg"),
    ("idempotency_", "_"),
    ("UPDATE TO '", "'"),
    ("idempotency ", ":"),
    ("idempotency-client = \"", "\""),
    ("version = \"", "\""),
];

/// One version string found: where, and what it says.
#[derive(Debug, PartialEq, Eq)]
struct Found {
    file: String,
    line: usize,
    version: String,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives one level below the repository root")
        .to_path_buf()
}

/// `[workspace.package] version` of the root Cargo.toml.
fn workspace_version(cargo_toml: &str) -> String {
    let mut in_section = false;
    for line in cargo_toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == "[workspace.package]";
        } else if in_section {
            if let Some(rest) = line.strip_prefix("version") {
                let value = rest.trim_start().strip_prefix('=').map(str::trim);
                if let Some(v) = value
                    .and_then(|v| v.strip_prefix('"'))
                    .and_then(|v| v.strip_suffix('"'))
                {
                    return v.to_owned();
                }
            }
        }
    }
    panic!("Cargo.toml has no [workspace.package] version = \"...\" line");
}

/// True for `N.N.N` (digits only).
fn is_semver(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Every current-version string of `text` (named `file` in the result).
fn versions_in(file: &str, text: &str) -> Vec<Found> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for (before, after) in SHAPES {
            let mut from = 0;
            while let Some(i) = line[from..].find(before) {
                let start = from + i + before.len();
                let rest = &line[start..];
                let len = rest
                    .bytes()
                    .take_while(|b| b.is_ascii_digit() || *b == b'.')
                    .count();
                let version = rest[..len].trim_end_matches('.');
                if is_semver(version) && rest[version.len()..].starts_with(after) {
                    found.push(Found {
                        file: file.to_owned(),
                        line: n + 1,
                        version: version.to_owned(),
                    });
                }
                from = start;
            }
        }
    }
    found
}

/// The files users read: README.md, CONTRIBUTING.md, docs/*.md.
fn user_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The version strings of `root`'s user files that differ from `expected`, and how many were found.
fn wrong_versions(root: &Path, expected: &str) -> (Vec<Found>, usize) {
    let mut all = Vec::new();
    for path in user_files(root) {
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let name = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .display()
            .to_string();
        all.extend(versions_in(&name, &text));
    }
    let count = all.len();
    (
        all.into_iter().filter(|f| f.version != expected).collect(),
        count,
    )
}

#[test]
fn every_current_version_string_matches_cargo_toml() {
    let root = repo_root();
    let cargo = fs::read_to_string(root.join("Cargo.toml")).expect("the root Cargo.toml");
    let expected = workspace_version(&cargo);
    let (wrong, count) = wrong_versions(&root, &expected);
    assert!(count > 0, "no current-version string found in README.md, CONTRIBUTING.md or docs/*.md: the scan is broken");
    let listed: Vec<String> = wrong
        .iter()
        .map(|f| {
            format!(
                "{}:{}: {} (Cargo.toml says {expected})",
                f.file, f.line, f.version
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} version string(s) differ from [workspace.package] version:\n{}",
        wrong.len(),
        listed.join("\n")
    );
}

#[test]
fn the_scan_finds_current_version_shapes_and_skips_history() {
    let text = "dpkg -i postgresql-15-idempotency_0.9.1_amd64.deb\n\
                tar -xzf idempotency-0.9.2-pg15-linux-amd64.tar.gz\n\
                ALTER EXTENSION idempotency UPDATE TO '0.9.3';\n\
                idempotency 0.9.4: 32 concurrent retries\n\
                idempotency-client = \"0.9.5\"\n\
                0.1.0 had a PL/pgSQL hot path; CREATE EXTENSION idempotency VERSION '0.1.0'\n\
                | 0.2.0 | 1.00 | idempotency-core 0.3.0 |\n";
    let versions: Vec<(usize, String)> = versions_in("t.md", text)
        .into_iter()
        .map(|f| (f.line, f.version))
        .collect();
    let want: Vec<(usize, String)> = [
        (1, "0.9.1"),
        (2, "0.9.2"),
        (3, "0.9.3"),
        (4, "0.9.4"),
        (5, "0.9.5"),
    ]
    .iter()
    .map(|(l, v)| (*l, v.to_string()))
    .collect();
    assert_eq!(versions, want);
    assert_eq!(
        workspace_version(
            "[workspace]\nversion = \"9.9.9\"\n[workspace.package]\nversion = \"0.4.0\"\n"
        ),
        "0.4.0"
    );
}
