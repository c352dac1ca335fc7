//! The shared private cluster ([`Server::private`]) and fresh databases on it.

use idempotency_client::ops;
use idempotency_client::{Idempotency, Key, Postgres, Schema, Settings};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};
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
    fresh(name, None).await
}

/// [`fresh_database`] with the extension at `version` (`CREATE EXTENSION idempotency VERSION`,
/// whatever `IDEM_INSTALL` says; the install layer puts every released script in place): the
/// client-extension version matrix.
pub async fn fresh_database_at(name: &str, version: &str) -> String {
    fresh(name, Some(version)).await
}

async fn fresh(name: &str, version: Option<&str>) -> String {
    let (admin, conn) = tokio_postgres::connect(cluster_url(), NoTls).await.expect("connect to the private cluster");
    tokio::spawn(conn);
    for sql in [format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"), format!("CREATE DATABASE {name}")] {
        admin.batch_execute(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let url = database_url(name);
    let (db, conn) = tokio_postgres::connect(&url, NoTls).await.expect("connect to the test database");
    tokio::spawn(conn);
    match version {
        Some(v) => db
            .batch_execute(&format!("CREATE EXTENSION idempotency VERSION '{v}';"))
            .await
            .unwrap_or_else(|e| panic!("CREATE EXTENSION idempotency VERSION '{v}' (python3 scripts/sqlbuild.py install-files installs it): {e:?}")),
        None => install(&url, &db).await,
    }
    db.batch_execute("CREATE TABLE charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL, k text);")
        .await
        .expect("create the charges table");
    url
}

/// Installs idempotency into the existing database at `url` on any server (the extension, or the
/// portable script with `IDEM_INSTALL=portable`, exactly as [`fresh_database`] does).
pub async fn install_into(url: &str) {
    let (db, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect to the database");
    tokio::spawn(conn);
    install(url, &db).await;
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
    URL.get_or_init(|| async { fresh_database(&process_database(None)).await }).await
}

/// The database of this test process for one driver's instance of a suite (`short`: `pg` or
/// `sqlx`), created once: both instances run at once in one binary, each on its own database.
pub async fn test_database_of(short: &'static str) -> &'static str {
    static PG: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    static SQLX: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    let cell = if short == "pg" { &PG } else { &SQLX };
    cell.get_or_init(|| async { fresh_database(&process_database(Some(short))).await }).await
}

/// `idem_<test binary>` (and `_<short>` for one driver's instance).
fn process_database(short: Option<&str>) -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe
        .as_ref()
        .and_then(|p| p.file_stem())
        .and_then(|s| s.to_str())
        .and_then(|s| s.split('-').next())
        .unwrap_or("e2e");
    match short {
        Some(short) => format!("idem_{stem}_{short}"),
        None => format!("idem_{stem}"),
    }
}

/// A pooled superuser connection to the test database, for assertions and direct `ops` calls
/// (tokio-postgres whatever the driver under test).
pub async fn admin() -> deadpool_postgres::Client {
    admin_at(test_database().await).await
}

/// A pooled superuser connection (tokio-postgres) to the database at `url`.
pub async fn admin_at(url: &str) -> deadpool_postgres::Client {
    let idem = Idempotency::<Postgres>::from_url(url, 2, Settings::default()).expect("pool");
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

/// Which time of a record [`until_passed`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passed {
    /// `lease_expires_at`: the attempt's lease (as its last heartbeat left it).
    Lease,
    /// `expires_at`: the record's TTL.
    Expiry,
    /// This long after `created_at` (a reservation that must outlive its first leases).
    Created(Duration),
}

/// Waits until the lease, the expiry or a time after the creation of `key`'s record has passed
/// on the database's clock (the clock every lease and expiry decision uses), for at most 30 s:
/// what a test awaits before it recovers, sweeps or takes a key over, instead of sleeping past a
/// short lease or TTL. Panics when the deadline passes or there is no record.
pub async fn until_passed(client: &deadpool_postgres::Client, schema: &Schema, key: &Key, which: Passed) {
    crate::server::eventually(&format!("{which:?} of {key} passes on the database's clock"), Duration::from_secs(30), || async {
        let record = ops::lookup(client, schema, key).await.map_err(|e| e.to_string())?.ok_or("no record")?;
        let at = match which {
            Passed::Lease => record.lease_expires_at,
            Passed::Expiry => record.expires_at,
            Passed::Created(after) => record.created_at + after,
        };
        let now: SystemTime = client.query_one("SELECT clock_timestamp()", &[]).await.map_err(|e| e.to_string())?.get(0);
        match now.duration_since(at) {
            Ok(_) => Ok(()),
            Err(e) => Err(format!("{} ms to go", e.duration().as_millis())),
        }
    })
    .await
}

/// Waits (at most 60 s) until `n` sessions are blocked, directly or behind one another, by the
/// backend `pid`, as the server sees them (pg_blocking_pids): the concurrency suites' proof that
/// duplicates overlapped a held key, not guessed from elapsed time.
pub async fn blocked_behind(pid: i64, n: i64) {
    let admin = admin_at(cluster_url()).await;
    let sql = "WITH RECURSIVE blocked (pid) AS (
                   SELECT a.pid FROM pg_catalog.pg_stat_activity a WHERE $1::int8::int4 = ANY (pg_catalog.pg_blocking_pids(a.pid))
                   UNION
                   SELECT a.pid FROM pg_catalog.pg_stat_activity a, blocked b WHERE b.pid = ANY (pg_catalog.pg_blocking_pids(a.pid)))
               SELECT count(*) FROM blocked";
    crate::server::eventually(&format!("{n} duplicates blocked behind backend {pid}"), Duration::from_secs(60), || async {
        let seen: i64 = admin.query_one(sql, &[&pid]).await.map_err(|e| e.to_string())?.get(0);
        if seen >= n { Ok(()) } else { Err(format!("{seen} blocked")) }
    })
    .await
}
