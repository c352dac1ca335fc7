//! A private PostgreSQL server that accepts TLS connections only, for the `sslmode` tests: a CA
//! and a server certificate made by `openssl` for the test (the server's names only `localhost`),
//! a second CA that signed nothing, `ssl = on` and a `pg_hba.conf` whose TCP lines are all
//! `hostssl` (a plain TCP connection is refused: no pg_hba.conf entry, `28000`): `trust`, but
//! SCRAM-SHA-256 for role `idem_scram` ([`SCRAM_PASSWORD`]). Its `postgres` database has the
//! extension installed, for the handles of both drivers.
//!
//! Port: `IDEM_TLS_PORT`, else 25 above the private cluster's (`IDEM_PG_PORT`, or
//! its default 554NN). Data and certificates under `target/servers/tls-<port>/`, made
//! anew by the first test of a process that asks for it; the server stops when that process
//! exits (a watcher process stops it, also after a crash or a kill of the tests), and the next
//! process to ask for it (tests/tests/cancellation.rs and tests/tests/tls.rs use it, one after
//! the other) waits for that watcher before it makes its own.

use crate::server::{chown_to_server, running_as_root, Server};
use crate::{pg_bin, pg_config, root};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The password of role `idem_scram`, the one role that must authenticate (SCRAM-SHA-256, so a
/// client can require channel binding to the TLS session).
pub const SCRAM_PASSWORD: &str = "idem-scram-secret";

/// A running TLS-only server (see the module docs).
#[derive(Debug)]
pub struct TlsServer {
    /// Its TCP port on 127.0.0.1.
    pub port: u16,
    /// The CA that signed the server certificate (PEM).
    pub ca: PathBuf,
    /// A CA that signed nothing the server presents (PEM).
    pub other_ca: PathBuf,
    /// The server (never dropped: the watcher stops it when this process exits).
    _server: Server,
}

impl TlsServer {
    /// The running server, started on first use and shared by the tests of this process.
    pub fn shared() -> &'static TlsServer {
        static SERVER: OnceLock<TlsServer> = OnceLock::new();
        SERVER.get_or_init(TlsServer::start)
    }

    /// Makes the cluster and the certificates, and starts it.
    fn start() -> TlsServer {
        let port = port();
        // The previous test process's server is stopped by its watcher once that process has
        // exited: wait for the watcher, or it would stop (or pull the directory from under) the
        // server made here. Then a server of this name left by an earlier run that was killed is
        // stopped first.
        let watcher = root().join(format!("target/servers/tls-{port}.watcher"));
        previous_watcher_done(&watcher);
        let server = Server::new(&format!("tls-{port}"), &pg_config(), port);
        server.initdb(&["--no-sync"]);
        let (dir, data) = (server.dir().to_owned(), server.data());
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).expect("create the certificate directory");
        make_certificates(&certs);
        for name in ["server.crt", "server.key"] {
            std::fs::copy(certs.join(name), data.join(name)).unwrap_or_else(|e| panic!("copy {name}: {e}"));
        }
        server.configure("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nmax_connections = 50\nlog_min_messages = warning\n");
        // Local socket for the server's own tools; every TCP connection must be TLS.
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all idem_scram 127.0.0.1/32 scram-sha-256\n\
             hostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n",
        )
        .expect("write pg_hba.conf");
        chown_to_server(&dir);
        if let Err(e) = set_key_mode(&data.join("server.key")) {
            panic!("chmod 600 server.key: {e}");
        }
        server.start();
        stop_when_this_process_exits(&data, &watcher);
        run(Command::new(pg_bin("psql"))
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-d", "postgres", "-h"])
            .arg(&dir)
            .args(["-p", &port.to_string(), "-c"])
            .arg(format!("CREATE ROLE idem_scram LOGIN PASSWORD '{SCRAM_PASSWORD}'; CREATE EXTENSION idempotency")));
        TlsServer { port, ca: certs.join("ca.crt"), other_ca: certs.join("other-ca.crt"), _server: server }
    }

    /// A URL to the server's `postgres` database through `host` (`hostaddr` is always
    /// 127.0.0.1, so any name can be tried against the certificate) with extra `params`
    /// (`sslmode=...&...`).
    pub fn url(&self, host: &str, params: &str) -> String {
        let sep = if params.is_empty() { "" } else { "&" };
        format!("postgresql://postgres@{host}:{}/postgres?hostaddr=127.0.0.1&connect_timeout=10{sep}{params}", self.port)
    }

    /// A URL to the server's `postgres` database through `host` alone, for either driver (sqlx
    /// reads `hostaddr` as the host, so the certificate would be checked against the address):
    /// `localhost`, the certificate's name, or `127.0.0.1`, an address it does not name.
    pub fn direct_url(&self, host: &str, params: &str) -> String {
        self.database_url("postgres", host, params)
    }

    /// [`TlsServer::direct_url`] to the database `database`.
    pub fn database_url(&self, database: &str, host: &str, params: &str) -> String {
        let sep = if params.is_empty() { "" } else { "?" };
        format!("postgresql://postgres@{host}:{}/{database}{sep}{params}", self.port)
    }

    /// A new database `name` (dropped first if an earlier run left it) with the extension and the
    /// test kit's `charges` table, as `crate::fresh_database` makes one on the private cluster.
    pub fn fresh_database(&self, name: &str) {
        let dir = self._server.dir();
        let psql = |database: &str, sql: &str| {
            run(Command::new(pg_bin("psql"))
                .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-d", database, "-h"])
                .arg(dir)
                .args(["-p", &self.port.to_string(), "-c", sql]))
        };
        psql("postgres", &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        psql("postgres", &format!("CREATE DATABASE {name}"));
        psql(
            name,
            "CREATE EXTENSION idempotency; \
             CREATE TABLE charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL, k text)",
        );
    }
}

/// A watcher that stops the server at `data` once this process has exited: statics are never
/// dropped, and a killed test binary runs no destructor. Its process id is written to `record`,
/// for the next process to wait for ([`previous_watcher_done`]).
fn stop_when_this_process_exits(data: &Path, record: &Path) {
    let pg_ctl = pg_bin("pg_ctl");
    let sudo = if running_as_root() { "sudo -u postgres -- " } else { "" };
    let script = format!(
        "(while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {sudo}'{pg_ctl}' -D '{data}' -m fast -w stop) \
         </dev/null >/dev/null 2>&1 & echo $! > '{record}'",
        pid = std::process::id(),
        pg_ctl = pg_ctl.display(),
        data = data.display(),
        record = record.display()
    );
    Command::new("bash")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status() // returns at once: the watcher runs in the background, outliving its shell
        .expect("start the watcher that stops the TLS server");
}

/// Until the watcher recorded in `record` by an earlier test process (this server's port) has
/// exited, that is stopped its server, for at most two minutes; at once when there is none.
fn previous_watcher_done(record: &Path) {
    let Some(pid) = std::fs::read_to_string(record).ok().and_then(|p| p.trim().parse::<u32>().ok()) else { return };
    // Alive: not a zombie, and still that watcher (its command line names the record).
    let alive = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(") ").map_or(' ', |(_, rest)| rest.chars().next().unwrap_or(' '));
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        state != ' ' && state != 'Z' && String::from_utf8_lossy(&cmdline).contains(".watcher")
    };
    let start = std::time::Instant::now();
    while alive() && start.elapsed() < std::time::Duration::from_secs(120) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = std::fs::remove_file(record);
}

/// `IDEM_TLS_PORT`, else the private cluster's port + 25.
fn port() -> u16 {
    if let Some(port) = std::env::var("IDEM_TLS_PORT").ok().and_then(|p| p.parse().ok()) {
        return port;
    }
    let base = Server::private(&pg_config()).port();
    base + 25
}

/// The CA, the server certificate it signs (for DNS name `localhost` only) and an unrelated CA.
fn make_certificates(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    for (name, subject) in [("ca", "/CN=idempotency test CA"), ("other-ca", "/CN=idempotency unrelated CA")] {
        run(Command::new("openssl")
            .current_dir(dir)
            .args(["req", "-x509"])
            .args(ec)
            .args(["-days", "2", "-subj", subject, "-keyout", &format!("{name}.key"), "-out", &format!("{name}.crt")])
            .args(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]));
    }
    run(Command::new("openssl")
        .current_dir(dir)
        .arg("req")
        .args(ec)
        .args(["-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.csr"]));
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName = DNS:localhost\nbasicConstraints = critical,CA:FALSE\nkeyUsage = critical,digitalSignature\n\
         extendedKeyUsage = serverAuth\n",
    )
    .expect("write server.ext");
    run(Command::new("openssl").current_dir(dir).args([
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "server.ext", "-out", "server.crt",
    ]));
}

fn set_key_mode(key: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o600))
}

fn run(command: &mut Command) {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
