//! What a layer knows of the major it runs on: the one thing every layer takes besides its
//! checks.

use std::path::PathBuf;

/// A major under test, as the layers see it.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    /// How the summary names it: `pgNN` (`all` for the layer across majors).
    pub(crate) label: String,
    /// The major.
    pub(crate) major: u32,
    /// Its pg_config.
    pub(crate) config: PathBuf,
    /// Every layer (else the core layers).
    pub(crate) full: bool,
    /// The default major (the client's unit tests and clippy run there only).
    pub(crate) is_default: bool,
    /// The private cluster's port; the layers' own servers use ports above it (ops +20/+21,
    /// the TLS server +25, citus +30..+32, no_subtransaction +41/+43, lock_budget_default +42,
    /// maintenance_fairness +44, maintenance_vacuum_backoff +45, the package layers +60,
    /// failover +400/+401; pg_upgrade from 56000; the bench layer's soak check 55916, the
    /// smoke's soak 55915).
    pub(crate) port: u16,
    /// target/test-logs/pgNN.
    pub(crate) logs: PathBuf,
    /// The workspace version (Cargo.toml).
    pub(crate) version: String,
    /// `--quick`: the inner loop (one e2e pass: no rerun with the replay cache).
    pub(crate) quick: bool,
    /// `--test NAME [-- FILTER...]`: the one suite (and its tests) to run.
    pub(crate) focus: Option<Focus>,
}

/// `--test NAME [-- FILTER...]`: an e2e test binary (tests/tests/NAME.rs) with libtest's filter
/// arguments, or `regress` / `isolation` with the files or specs to run.
#[derive(Debug, Clone)]
pub(crate) struct Focus {
    pub(crate) suite: String,
    pub(crate) filter: Vec<String>,
}

impl Ctx {
    /// The major's program `name`.
    pub(crate) fn bin(&self, name: &str) -> PathBuf {
        PathBuf::from(self.value("--bindir")).join(name)
    }

    /// `pg_config --flag` of the major.
    pub(crate) fn value(&self, flag: &str) -> String {
        idempotency_pgserver::pg_config_value(&self.config, flag)
    }

    /// The major's extension directory.
    pub(crate) fn extdir(&self) -> PathBuf {
        PathBuf::from(self.value("--sharedir")).join("extension")
    }

    /// psql on a server of this major on `port`.
    pub(crate) fn psql(&self, port: u16) -> crate::psql::Psql {
        crate::psql::Psql::new(&PathBuf::from(self.value("--bindir")), port)
    }
}
