//! A private PostgreSQL server that accepts TLS connections only, for the `sslmode` tests: a CA
//! and a server certificate made by `openssl` for the test (the server's names only `localhost`),
//! a second CA that signed nothing, `ssl = on` and a `pg_hba.conf` whose TCP lines are all
//! `hostssl` (a plain TCP connection is refused: no pg_hba.conf entry, `28000`): `trust`, but
//! SCRAM-SHA-256 for role `idem_scram` ([`SCRAM_PASSWORD`]). Its `postgres` database has the
//! extension installed, for the handles of both drivers.
//!
//! Port: `IDEM_TLS_PORT`, else 25 above the private cluster's (`IDEM_PG_PORT`, or
//! `scripts/pg.sh`'s default). Data and certificates under `target/tls-server/<port>/`, made
//! anew by the first test of a process that asks for it; the server stops when that process
//! exits (a watcher process stops it, also after a crash or a kill of the tests).

use crate::{pg_bin, root};
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
}

impl TlsServer {
    /// The running server, started on first use and shared by the tests of this process.
    pub fn shared() -> &'static TlsServer {
        static SERVER: OnceLock<TlsServer> = OnceLock::new();
        SERVER.get_or_init(TlsServer::start)
    }

    /// Makes the certificates and the cluster, and starts it.
    fn start() -> TlsServer {
        let port = port();
        let dir = root().join("target/tls-server").join(port.to_string());
        let data = dir.join("data");
        // A server left by an earlier run that was killed: stop it before starting over.
        if data.join("postmaster.pid").exists() {
            let _ = as_server(pg_bin("pg_ctl")).arg("-D").arg(&data).args(["-m", "immediate", "-w", "stop"]).output();
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).expect("create the certificate directory");
        make_certificates(&certs);
        chown_to_server(&dir);

        run(as_server(pg_bin("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync"]));
        for name in ["server.crt", "server.key"] {
            std::fs::copy(certs.join(name), data.join(name)).unwrap_or_else(|e| panic!("copy {name}: {e}"));
        }
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{dir}'\nssl = on\n\
             ssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nmax_connections = 50\nlog_min_messages = warning\n",
            dir = dir.display()
        );
        append(&data.join("postgresql.conf"), &conf);
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
        // The port lies in Linux's ephemeral range, so an outgoing connection may hold it for a
        // moment: a start that fails is tried again, three times in all.
        for attempt in 1..=3 {
            let out = as_server(pg_bin("pg_ctl"))
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(dir.join("server.log"))
                .args(["-w", "-t", "60", "start"])
                .output()
                .unwrap_or_else(|e| panic!("cannot run pg_ctl: {e}"));
            if out.status.success() {
                break;
            }
            assert!(attempt < 3, "pg_ctl start failed three times: {}", String::from_utf8_lossy(&out.stdout));
            std::thread::sleep(std::time::Duration::from_secs(2));
        }
        stop_when_this_process_exits(&data);
        run(Command::new(pg_bin("psql"))
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-d", "postgres", "-h"])
            .arg(&dir)
            .args(["-p", &port.to_string(), "-c"])
            .arg(format!("CREATE ROLE idem_scram LOGIN PASSWORD '{SCRAM_PASSWORD}'; CREATE EXTENSION idempotency")));
        TlsServer { port, ca: certs.join("ca.crt"), other_ca: certs.join("other-ca.crt") }
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
        let sep = if params.is_empty() { "" } else { "?" };
        format!("postgresql://postgres@{host}:{}/postgres{sep}{params}", self.port)
    }
}

/// A watcher that stops the server at `data` once this process has exited: statics are never
/// dropped, and a killed test binary runs no destructor.
fn stop_when_this_process_exits(data: &Path) {
    let pg_ctl = pg_bin("pg_ctl");
    let sudo = if is_root() { "sudo -u postgres -- " } else { "" };
    let script = format!(
        "(while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {sudo}'{pg_ctl}' -D '{data}' -m fast -w stop) &",
        pid = std::process::id(),
        pg_ctl = pg_ctl.display(),
        data = data.display()
    );
    Command::new("bash")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status() // returns at once: the watcher runs in the background, outliving its shell
        .expect("start the watcher that stops the TLS server");
}

/// `IDEM_TLS_PORT`, else the private cluster's port + 25.
fn port() -> u16 {
    if let Some(port) = std::env::var("IDEM_TLS_PORT").ok().and_then(|p| p.parse().ok()) {
        return port;
    }
    let out = Command::new("bash").arg(root().join("scripts/pg.sh")).arg("url").output().expect("run scripts/pg.sh url");
    let url = String::from_utf8_lossy(&out.stdout);
    let base: u16 = url
        .trim()
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in scripts/pg.sh url's answer {url:?}"));
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

fn as_server(program: PathBuf) -> Command {
    if is_root() {
        let mut c = Command::new("sudo");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn chown_to_server(dir: &Path) {
    if is_root() {
        run(Command::new("chown").arg("-R").arg("postgres:postgres").arg(dir));
    }
}

fn set_key_mode(key: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o600))
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all(text.as_bytes()).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
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
