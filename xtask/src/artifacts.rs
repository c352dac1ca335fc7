//! The build outputs that belong to one major. Every cargo command of every major builds in the
//! workspace's `target/` (the extension's dependencies, pgrx's tools and the client's crates are
//! compiled once for all majors); only the crates compiled with a major's feature differ per
//! major: pgrx-pg-sys (its bindings), pgrx, pgrx-tests and the extension itself. In CI the
//! harness removes those after each major ([`remove_per_major`]), so the disk holds the shared
//! builds and one major's own.

use std::path::Path;

/// The crates whose build depends on the major (hyphenated as in `.fingerprint/` and `build/`;
/// `deps/` spells them with underscores).
const PER_MAJOR: &[&str] = &["pgrx-pg-sys", "pgrx", "pgrx-tests", "idempotency"];

/// Removes every profile's per-major outputs under `target` (`deps/`, `build/`, `.fingerprint/`,
/// the library and pgrx's staging directories `idempotency-pgNN`) and returns the bytes freed.
/// What is removed is rebuilt by the next major's cargo command, as after `cargo clean -p`.
pub(crate) fn remove_per_major(target: &Path) -> u64 {
    let mut freed = 0;
    for profile in ["debug", "release"] {
        let dir = target.join(profile);
        for sub in [dir.clone(), dir.join("deps"), dir.join("build"), dir.join(".fingerprint")] {
            let Ok(entries) = std::fs::read_dir(&sub) else { continue };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if per_major(&name) {
                    freed += size(&entry.path());
                    let _ = if entry.path().is_dir() { std::fs::remove_dir_all(entry.path()) } else { std::fs::remove_file(entry.path()) };
                }
            }
        }
    }
    freed
}

/// Whether a file or directory name in a profile directory is one of [`PER_MAJOR`]'s outputs:
/// `CRATE-HASH` (`.fingerprint/`, `build/`), `[lib]CRATE-HASH.EXT` (`deps/`), `libidempotency.*`
/// and `idempotency.d` (the profile's top level), `idempotency-pgNN` (pgrx's staging).
fn per_major(name: &str) -> bool {
    if name.starts_with("libidempotency.") || name == "idempotency.d" {
        return true;
    }
    let stem = name.split('.').next().unwrap_or(name);
    let stem = stem.strip_prefix("lib").unwrap_or(stem);
    let Some((krate, tail)) = stem.rsplit_once('-') else { return false };
    let hashed = tail.len() == 16 && tail.bytes().all(|b| b.is_ascii_hexdigit());
    let staged = krate == "idempotency" && tail.strip_prefix("pg").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    (hashed && PER_MAJOR.contains(&krate.replace('_', "-").as_str())) || staged
}

/// Bytes under `path` (a file or a directory tree).
fn size(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path).map(|es| es.flatten().map(|e| size(&e.path())).sum()).unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::per_major;

    #[test]
    fn names_only_the_crates_built_per_major() {
        for name in [
            "libpgrx_pg_sys-79ed0e381f204a06.rlib",
            "pgrx_pg_sys-79ed0e381f204a06.d",
            "pgrx-pg-sys-3a44ae1785f8ab78",
            "libpgrx-2f177ad4caedf4c4.rmeta",
            "pgrx-2f177ad4caedf4c4",
            "libpgrx_tests-f99bb91487ff6a6b.rlib",
            "idempotency-1169e39247d24707",
            "idempotency-1169e39247d24707.d",
            "libidempotency.so",
            "idempotency.d",
            "idempotency-pg15",
        ] {
            assert!(per_major(name), "{name} is built per major");
        }
        for name in [
            "libpgrx_macros-2f3b9eabd61e865f.so",
            "libpgrx_bindgen-4fe2b7c4f69b8f67.rlib",
            "pgrx-pg-config-949f7bb33f2c446b",
            "pgrx-sql-entity-graph-4f19dc49355629c5",
            "libidempotency_core-12f2d264306c45b5.rlib",
            "idempotency-client-12f2d264306c45b5",
            "idempotency_tests-12f2d264306c45b5.d",
            "checklist-0a1b2c3d4e5f6a7b",
            "libtoml-0a1b2c3d4e5f6a7b.rlib",
            "idempotency-pgtle.sql",
            "deps",
        ] {
            assert!(!per_major(name), "{name} is shared by every major");
        }
    }
}
