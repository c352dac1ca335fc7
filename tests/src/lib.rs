//! Shared fixture of the end-to-end tests and the demo: the private cluster of
//! `scripts/pg.sh` (started on first use, under `target/pg`), one fresh database per test
//! process with the extension installed, and helpers.
//!
//! The extension must be installed into the server's directories first (`cargo pgrx install
//! --release`, which `scripts/test.sh` and `scripts/demo.sh` do).

use idempotency_client::{Config, Idempotency, Key};
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
    install(&url, &db).await;
    db.batch_execute("CREATE TABLE charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL, k text);")
        .await
        .expect("create the charges table");
    url
}

/// Installs idempotency into the schema `public` of the database at `url`: the extension, or with
/// `IDEM_INSTALL=portable` the portable script (`IDEM_PORTABLE_SCRIPT`, default
/// `target/idempotency-portable.sql`, built by `bash scripts/portable.sh`) run by the psql of
/// `PG_CONFIG`, exactly as its users run it.
async fn install(url: &str, db: &tokio_postgres::Client) {
    if std::env::var("IDEM_INSTALL").as_deref() != Ok("portable") {
        db.batch_execute("CREATE EXTENSION idempotency;")
            .await
            .expect("CREATE EXTENSION idempotency (is the release build installed? cargo pgrx install --release)");
        return;
    }
    let script = std::env::var_os("IDEM_PORTABLE_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/idempotency-portable.sql"));
    let pg_config = std::env::var("PG_CONFIG").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin/pg_config".into());
    let bindir = Command::new(&pg_config).arg("--bindir").output().unwrap_or_else(|e| panic!("{pg_config} --bindir: {e}"));
    let psql = PathBuf::from(String::from_utf8_lossy(&bindir.stdout).trim()).join("psql");
    let out = Command::new(&psql)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "schema=public", "-f"])
        .arg(&script)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", psql.display()));
    assert!(
        out.status.success(),
        "portable install of {} failed (bash scripts/portable.sh > {0} first?): {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
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

/// A handle on the test database with `config`.
pub async fn handle(config: Config) -> Idempotency {
    let url = test_database().await;
    let base = Idempotency::connect(url, 100).expect("pool");
    Idempotency::with_config(base.pool().clone(), config)
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
