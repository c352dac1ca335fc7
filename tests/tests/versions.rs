//! Versions: the strings the docs show, and the client against every extension version it
//! claims to speak.
//!
//! **The docs.** Every version string shown to users as the current release matches Cargo.toml.
//! Scans README.md, CONTRIBUTING.md and docs/*.md for the shapes that name the version a user
//! installs or runs today — package file names (`idempotency-X.Y.Z-pgNN-...`,
//! `postgresql-15-idempotency_X.Y.Z_amd64.deb`), `ALTER EXTENSION idempotency UPDATE TO 'X.Y.Z'`,
//! the demo's banner (`idempotency X.Y.Z:`) and dependency lines (`idempotency-client = "X.Y.Z"`,
//! `version = "X.Y.Z"`) — and fails when one differs from `[workspace.package] version`. Prose
//! about past releases ("0.1.0 had …", "`CREATE EXTENSION idempotency VERSION '0.1.0'`", the
//! performance history) has none of these shapes and is not flagged.
//!
//! **The client-extension matrix** (what client/src/sql.rs `SUPPORTED_EXTENSIONS` and
//! docs/upgrading.md claim): every released version (`sql/released/`, installed next to the
//! current one by the install layer) and the current one, each with `CREATE EXTENSION idempotency
//! VERSION 'x'` in a database of its own, through each client driver (tokio-postgres and sqlx,
//! from one binary): `run` executed, replayed, mismatched, released by a
//! transient result, stored as a permanent failure; `run_external` executed and replayed; and
//! `run_batch` executed and replayed where the version has `idem_reserve_many`, refused with
//! [`Error::IncompatibleExtension`] naming the version where it has not.

use std::fs;
use std::path::{Path, PathBuf};

// The docs' version strings: driver-neutral, run once.

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

// The client-extension matrix, over each driver.

idempotency_testkit::for_each_driver! {
    use idempotency_client::{BatchItem, BatchOutcome, Error, Fingerprint, Outcome, Settings, StoredResponse, TxFuture};
    use idempotency_testkit::{admin_at, charges_for, fresh_database_at, unique_key};
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use super::{is_semver, repo_root, workspace_version};
    use std::fs;
    use std::path::Path;

    /// The versions a user can install: every released script in sql/released/ and the current
    /// release (Cargo.toml's), oldest first.
    fn installable_versions(root: &Path) -> Vec<String> {
        let mut versions: Vec<String> = fs::read_dir(root.join("sql/released"))
            .expect("sql/released/ exists")
            .filter_map(|e| {
                let name = e.expect("directory entry").file_name().into_string().ok()?;
                Some(name.strip_prefix("idempotency--")?.strip_suffix(".sql")?.to_owned())
            })
            .filter(|v| is_semver(v))
            .collect();
        versions.push(workspace_version(&fs::read_to_string(root.join("Cargo.toml")).expect("the root Cargo.toml")));
        let number = |v: &String| v.split('.').map(|p| p.parse::<u32>().expect("a number")).collect::<Vec<_>>();
        versions.sort_by_key(number);
        versions.dedup();
        versions
    }

    /// Whether the version installed at `url` has `idem_reserve_many` (the batch form; 0.4.0 on).
    async fn has_reserve_many(url: &str) -> bool {
        let sql = "SELECT count(*) FROM pg_catalog.pg_proc WHERE proname = 'idem_reserve_many'";
        admin_at(url).await.query_one(sql, &[]).await.expect("pg_proc").get::<_, i64>(0) == 1
    }

    /// The local write of `run_external`: one `charges` row tagged `tag`.
    fn record(tag: String) -> impl for<'t> FnMut(&'t mut Conn, &'t StoredResponse) -> TxFuture<'t, (), DbError> + Send {
        move |conn, _| {
            let tag = tag.clone();
            Box::pin(async move { exec(conn, "INSERT INTO charges (user_id, amount, k) VALUES ('u', 1, $1)", &[&tag]).await.map(drop) })
        }
    }

    /// The closure of `run_batch`: one `charges` row for the batch, 201 for every created key.
    fn consume<'t>(conn: &'t mut Conn, keys: &'t [String]) -> TxFuture<'t, Vec<StoredResponse>, DbError> {
        let n = keys.len();
        Box::pin(async move {
            exec(conn, "INSERT INTO charges (user_id, amount, k) VALUES ('batch', 1, 'b')", &[]).await?;
            Ok(vec![StoredResponse::json(201, json!({})); n])
        })
    }

    /// Every flow of the client against extension `version`, in a database of its own; panics with
    /// the version and the flow on the first wrong answer, else returns what `run_batch` did.
    async fn flows_against(version: &str) -> &'static str {
        let url = fresh_database_at(&db(&format!("idem_versions_{}", version.replace('.', "_"))), version).await;
        let idem = connect_with(&url, 4, Settings::default());
        let admin = admin_at(&url).await;
        let at = |flow: &str| format!("{NAME} client, extension {version}: {flow}");
        assert_eq!(idem.check_extension().await.map_err(|e| e.to_string()), Ok(version.to_owned()), "{}", at("check_extension"));
        let fp = |v: i64| Fingerprint::of_json(&json!({"amount": v})).unwrap();

        // run: executed, replayed, mismatched.
        let key = unique_key("versions.run");
        let runs = Arc::new(AtomicUsize::new(0));
        let first = idem.run(&key, &fp(1), Charge::of(&key).handler::<DbError>(&runs)).await;
        assert!(matches!(first, Ok(Outcome::Executed(_))), "{}: {first:?}", at("run executes a new key"));
        let again = idem.run(&key, &fp(1), Charge::of(&key).handler::<DbError>(&runs)).await;
        assert!(matches!(&again, Ok(o) if o.is_replayed() && o.value() == first.as_ref().unwrap().value()), "{}: {again:?}", at("run replays"));
        let other = idem.run(&key, &fp(2), Charge::of(&key).handler::<DbError>(&runs)).await;
        assert!(matches!(other, Err(Error::Mismatch)), "{}: {other:?}", at("run: another request is a mismatch"));
        assert_eq!((runs.load(Ordering::SeqCst), charges_for(&admin, &key).await), (1, 1), "{}", at("run executed once"));

        // run: a transient result releases the key (its write rolled back), the retry executes.
        let key = unique_key("versions.transient");
        let released = idem.run(&key, &fp(1), Charge::of(&key).status(503).handler::<DbError>(&runs)).await;
        assert!(matches!(&released, Ok(Outcome::Released(r)) if r.status == 503), "{}: {released:?}", at("run releases on a 503"));
        assert_eq!(charges_for(&admin, &key).await, 0, "{}", at("the released attempt's write rolled back"));
        let retry = idem.run(&key, &fp(1), Charge::of(&key).handler::<DbError>(&runs)).await;
        assert!(matches!(retry, Ok(Outcome::Executed(_))), "{}: {retry:?}", at("the released key executes again"));

        // run: a permanent failure is stored and answered as such.
        let key = unique_key("versions.permanent");
        let declined = idem.run(&key, &fp(1), Charge::of(&key).status(402).handler::<DbError>(&runs)).await;
        assert!(matches!(&declined, Ok(Outcome::Executed(r)) if r.status == 402), "{}: {declined:?}", at("run records a 402"));
        let stored = idem.run(&key, &fp(1), Charge::of(&key).handler::<DbError>(&runs)).await;
        assert!(matches!(&stored, Err(Error::Failed { response: Some(r) }) if r["status"] == 402), "{}: {stored:?}", at("the 402 is replayed as a failure"));

        // run_external: executed with its local write, then replayed without calling out.
        let key = unique_key("versions.external");
        let call = async { Ok::<_, DbError>(StoredResponse::json(201, json!({"network_ref": "ch_1"}))) };
        let out = idem.run_external(&key, &fp(1), call, record(key.to_string())).await;
        assert!(matches!(out, Ok(Outcome::Executed(_))), "{}: {out:?}", at("run_external executes"));
        let called_again = async { Ok::<_, DbError>(StoredResponse::json(500, json!({}))) };
        let out = idem.run_external(&key, &fp(1), called_again, record("again".into())).await;
        assert!(matches!(&out, Ok(o) if o.is_replayed()), "{}: {out:?}", at("run_external replays"));
        assert_eq!(charges_for(&admin, &key).await, 1, "{}", at("run_external's local write"));

        // run_batch: where the version has the batch functions.
        let items: Vec<BatchItem> = (0..3).map(|i| BatchItem { key: format!("b-{i}"), fingerprint: fp(i) }).collect();
        let batch = idem.run_batch("versions.batch", "u", &items, consume).await;
        if has_reserve_many(&url).await {
            assert!(matches!(&batch, Ok(out) if out.iter().all(|(_, o)| matches!(o, BatchOutcome::Executed(_)))), "{}: {batch:?}", at("run_batch executes"));
            let again = idem.run_batch("versions.batch", "u", &items, consume).await;
            assert!(matches!(&again, Ok(out) if out.iter().all(|(_, o)| matches!(o, BatchOutcome::Replayed(_)))), "{}: {again:?}", at("run_batch replays"));
            "executed, replayed"
        } else {
            match &batch {
                Err(Error::IncompatibleExtension { reason, .. }) if reason.contains(version) && reason.contains("run_batch") => {}
                other => panic!("{}: {other:?}", at("run_batch before idem_reserve_many is refused, naming the version and run_batch")),
            }
            let rows: i64 = admin.query_one("SELECT count(*) FROM charges WHERE user_id = 'batch'", &[]).await.unwrap().get(0);
            assert_eq!(rows, 0, "{}", at("the refused batch ran nothing"));
            "refused (no idem_reserve_many)"
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_client_speaks_every_installable_extension_version() {
        let versions = installable_versions(&repo_root());
        assert!(versions.len() >= 2, "sql/released/ holds no released version: {versions:?}");
        for version in &versions {
            let batch = flows_against(version).await;
            println!("ok: {NAME} client, extension {version}: run (executed, replay, mismatch, released, permanent failure), run_external, run_batch {batch}");
        }
    }
}
