//! The shared private cluster ([`Server::private`]) and fresh databases on it.

use idempotency_client::{Idempotency, Key, Settings};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use tokio_postgres::NoTls;

use crate::server::Server;
use crate::{pg_bin, pg_config, root};

/// The shared private cluster of the major under test (`PG_CONFIG`), created and started on
/// first use; left running when the process exits.
pub fn private_server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let server = Server::private(&pg_config());
        server.ensure_started();
        server
    })
}

/// Starts the private cluster if needed; returns the URL of its `postgres` database.
pub fn cluster_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| private_server().url("postgres"))
}

/// The cluster's TCP address (for proxies in front of it).
pub fn cluster_addr() -> SocketAddr {
    let url = cluster_url();
    url.split('@')
        .nth(1)
        .and_then(|s| s.split('/').next())
        .and_then(|hostport| hostport.parse().ok())
        .unwrap_or_else(|| panic!("no host:port in the cluster URL {url}"))
}

/// The URL of a database `name` on the private cluster.
pub fn database_url(name: &str) -> String {
    let base = cluster_url();
    match base.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{name}"),
        None => panic!("unexpected cluster URL {base}"),
    }
}

/// Drops and recreates database `name` with idempotency installed (see [`install`]) and a
/// `charges` business table.
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
    let psql = pg_bin("psql");
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

/// A handle of the driver under test with `settings` on the database of this test process
/// (shared by its tests).
pub async fn handle(settings: Settings) -> crate::Idem {
    crate::connect_with(test_database().await, 100, settings)
}

/// A handle of the driver under test with `settings` on a fresh database `name` of its own (for
/// tests that change the server or count everything in a database).
pub async fn handle_in(name: &str, settings: Settings) -> crate::Idem {
    crate::connect_with(&fresh_database(name).await, 32, settings)
}

/// A pooled superuser connection to the test database, for assertions and direct `ops` calls
/// (tokio-postgres whatever the driver under test).
pub async fn admin() -> deadpool_postgres::Client {
    admin_at(test_database().await).await
}

/// A pooled superuser connection (tokio-postgres) to the database at `url`.
pub async fn admin_at(url: &str) -> deadpool_postgres::Client {
    let idem = Idempotency::connect(url, 2).expect("pool");
    idem.pool().get().await.expect("connect")
}

/// A key unique to this process and call: tests running in parallel never share keys.
pub fn unique_key(operation: &str) -> Key {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Key::new(operation, format!("user-{n}"), format!("key-{n}")).expect("valid key")
}

/// How many business rows a key's handler wrote.
pub async fn charges_for(client: &deadpool_postgres::Client, key: &Key) -> i64 {
    let row = client
        .query_one("SELECT count(*) AS n FROM charges WHERE k = $1", &[&key.to_string()])
        .await
        .expect("count charges");
    row.get("n")
}
