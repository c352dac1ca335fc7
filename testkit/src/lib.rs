//! The shared test kit of the end-to-end tests, the benchmark and the demo (not published).
//!
//! - [`cluster`]: the shared private cluster ([`server::Server::private`], started on first use),
//!   fresh databases with the extension installed, handles on them.
//! - [`pg_bin`]: the PostgreSQL programs of the major under test, from `PG_CONFIG`.
//! - [`proxy`]: a TCP proxy to the cluster that counts round trips or cuts a connection at COMMIT.
//! - [`forwarder`]: a TCP endpoint that moves to another server (a failover's writer endpoint).
//! - [`driver`]: both client drivers (tokio-postgres and sqlx) under one set of names each, and
//!   [`for_each_driver`], which instantiates a suite per driver in one test binary.
//! - [`handler`]: the business handler the tests and the demo run ("charge a card").
//! - [`ietf`]: the IETF Idempotency-Key checks of an example service, against its base URL.
//! - [`server`]: private servers of any major driven from Rust (the `idempotency-pgserver` crate,
//!   shared with the harness: initdb, configure, start, stop, a streaming standby, promotion,
//!   pg_upgrade and the other programs of a major).
//! - [`tls_server`]: a TLS-only server with certificates made for the test (the `sslmode` tests).
//! - [`trips`]: round trips per call of each flow, counted as a service makes its calls.
//! - [`replay_cache`]: `IDEM_REPLAY_CACHE=on` gives every handle it makes a replay cache.
//!
//! The extension must be installed into the server's directories first (`cargo pgrx install
//! --release`, which the harness's install layer and `scripts/demo.sh` do).

pub mod cluster;
pub mod driver;
pub mod forwarder;
pub mod handler;
pub mod ietf;
pub mod proxy;
pub mod replay_cache;
pub mod server;
pub mod tls_server;
pub mod trips;

pub use cluster::{admin, admin_at, blocked_behind, charges_for, cluster_addr, cluster_url, database_url, fresh_database, fresh_database_at, private_server, test_database, unique_key, until_passed, Passed};
pub use handler::{Failure, HeldRace};
/// The tokio-postgres names, for the suites whose checks are the server's whatever the driver
/// (no_subtransaction, lock_budget_default, ...); a suite that runs per driver is instantiated by
/// [`for_each_driver`] and names neither these nor the root's `handle`.
pub use driver::over_postgres::{batch, connect_with, duplicates_of_a_held_key, exec, handle, handle_in, query_i64, Charge, Conn, DbError, Idem, TestDriver};

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

pub use idempotency_pgserver::{pg_config, root};

/// The path of PostgreSQL program `name` (`pg_dump`, `pgbench`, ...) of the major under test.
pub fn pg_bin(name: &str) -> PathBuf {
    static BINDIR: OnceLock<PathBuf> = OnceLock::new();
    BINDIR
        .get_or_init(|| {
            let config = pg_config();
            let out = Command::new(&config)
                .arg("--bindir")
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", config.display()));
            assert!(out.status.success(), "{} --bindir failed", config.display());
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        })
        .join(name)
}
