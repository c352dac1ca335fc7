//! Shared fixture of the end-to-end tests and the demo: the private cluster of
//! `scripts/pg.sh` (started on first use, under `target/pg`), one fresh database per test
//! process with the extension installed, and helpers.
//!
//! The extension must be installed into the server's directories first (`cargo pgrx install
//! --release`, which `scripts/test.sh` and `scripts/demo.sh` do).

use idempotency_client::{Idempotency, Key, Settings};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use tokio_postgres::NoTls;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Starts the private cluster if needed; returns the URL of its `postgres` database.
pub fn cluster_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let out = Command::new("bash")
            .arg(root().join("scripts/pg.sh"))
            .arg("start")
            .output()
            .unwrap_or_else(|e| panic!("cannot run scripts/pg.sh: {e}"));
        assert!(out.status.success(), "scripts/pg.sh start failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    })
}

/// The URL of a database `name` on the private cluster.
pub fn database_url(name: &str) -> String {
    let base = cluster_url();
    match base.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{name}"),
        None => panic!("unexpected cluster URL {base}"),
    }
}

/// Drops and recreates database `name` with the extension and a `charges` business table.
pub async fn fresh_database(name: &str) -> String {
    let (admin, conn) = tokio_postgres::connect(cluster_url(), NoTls).await.expect("connect to the private cluster");
    tokio::spawn(conn);
    for sql in [format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"), format!("CREATE DATABASE {name}")] {
        admin.batch_execute(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let url = database_url(name);
    let (db, conn) = tokio_postgres::connect(&url, NoTls).await.expect("connect to the test database");
    tokio::spawn(conn);
    db.batch_execute(
        "CREATE EXTENSION idempotency;
         CREATE TABLE charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL, k text);",
    )
    .await
    .expect("CREATE EXTENSION idempotency (is the release build installed? cargo pgrx install --release)");
    url
}

/// The database of this test process, created once.
pub async fn test_database() -> &'static str {
    static URL: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    URL.get_or_init(|| async {
        let exe = std::env::current_exe().ok();
        let stem = exe
            .as_ref()
            .and_then(|p| p.file_stem())
            .and_then(|s| s.to_str())
            .and_then(|s| s.split('-').next())
            .unwrap_or("e2e")
            .to_owned();
        fresh_database(&format!("idem_{stem}")).await
    })
    .await
}

/// A handle on the test database with `settings`.
pub async fn handle(settings: Settings) -> Idempotency {
    Idempotency::connect_with(test_database().await, 100, settings).expect("pool")
}

/// A pooled superuser connection to the test database, for assertions and direct `ops` calls.
pub async fn admin() -> deadpool_postgres::Client {
    let idem = Idempotency::connect(test_database().await, 2).expect("pool");
    idem.pool().get().await.expect("connect")
}

/// A key unique to this process and call: tests running in parallel never share keys.
pub fn unique_key(operation: &str) -> Key {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Key::new(operation, format!("user-{n}"), format!("key-{n}")).expect("valid key")
}

/// How many business rows a key's closure wrote.
pub async fn charges_for(admin: &deadpool_postgres::Client, key: &Key) -> i64 {
    let row = admin
        .query_one("SELECT count(*) AS n FROM charges WHERE k = $1", &[&key.to_string()])
        .await
        .expect("count charges");
    row.get("n")
}
