//! Private PostgreSQL servers of any major, driven from Rust: initdb, configure, start, stop
//! (fast or immediate), a streaming standby of a primary (pg_basebackup), promotion, and any
//! other program of its major run as the server's OS user (pg_upgrade, pg_checksums).
//!
//! The one place that creates, configures, starts and stops a cluster: the test kit's shared
//! private cluster ([`Server::private`]), the harness's layers (`cargo run -p xtask -- test`),
//! its `pg` command, and the tests that need several servers, several majors, a primary and its
//! standby. Each server lives in a directory of its own under `target/servers/` (the data
//! directory, its socket, its log); every server listens on 127.0.0.1 only, on the port it is
//! given. Which PostgreSQL a major is comes from `scripts/pg-env.sh` ([`config`], [`tree`]).
//!
//! PostgreSQL refuses to run as root: run as root, every server program runs as the `postgres`
//! OS user (through `sudo -u postgres`), and the server's directory is handed to that user.
//!
//! Test servers are disposable: `initdb --no-sync`, and started with `fsync = off` (the crash
//! tests kill processes, not the machine: what a killed server wrote is in the kernel's page
//! cache, and crash recovery reads it back; `synchronous_commit` keeps its default, so a commit
//! still waits for its WAL write and for a synchronous standby). With `IDEM_PG_DURABLE=1` every
//! server starts with `fsync = on` (scripts/bench.sh: the benchmark's figures are a real
//! server's); [`Server::ensure_started`] restarts a running one started the other way.
//!
//! A server value that is dropped stops its server and deletes its directory, unless the thread
//! is panicking (a failed test) or [`Server::keep`] was called: then the directory stays, and
//! stderr says where. The shared private cluster ([`Server::private`]) is never deleted.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// How long [`Server::start`] keeps trying a port that another socket holds: longer than
/// Linux's TIME-WAIT (60 s).
pub const BIND_DEADLINE: Duration = Duration::from_secs(90);

/// How to stop a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Ends sessions, writes a checkpoint: a clean shutdown.
    Fast,
    /// Kills the server without a checkpoint: a crash (the next start runs crash recovery).
    Immediate,
}

/// A server of one major in a directory of its own (see the module docs).
#[derive(Debug)]
pub struct Server {
    name: String,
    pg_config: PathBuf,
    bindir: PathBuf,
    major: u32,
    dir: PathBuf,
    port: u16,
    /// Left running when the value is dropped (the shared private cluster).
    persistent: bool,
    /// Started with `fsync = on` (else off): `IDEM_PG_DURABLE=1`.
    durable: bool,
    /// Its directory is kept when the value is dropped (see [`Server::keep`]).
    kept: AtomicBool,
}

/// The settings of the shared private cluster, beyond every server's own: room for the
/// concurrency tests, prepared transactions for the two-phase tests, and pg_stat_statements
/// preloaded so the benchmark and the tests can count the statements the server runs (tracking
/// off until a session turns it on). `fsync` is no setting of the file: each start says it
/// (off, or on with `IDEM_PG_DURABLE=1`).
pub const PRIVATE_SETTINGS: &str = "max_connections = 200
max_prepared_transactions = 10
shared_buffers = 256MB
log_min_messages = warning
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = none
";

/// Whether this process runs as root (then servers run as the `postgres` OS user).
pub fn running_as_root() -> bool {
    // `id -u` rather than libc: no unsafe code and no libc dependency.
    static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ROOT.get_or_init(|| Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0"))
}

/// A command that runs `program` as the server's OS user: through `sudo -u postgres` when this
/// process is root, else as itself.
pub fn as_server(program: &Path) -> Command {
    if running_as_root() {
        let mut c = Command::new("sudo");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Hands `path` (a directory a server writes into) to the server's OS user when run as root.
pub fn chown_to_server(path: &Path) {
    if running_as_root() {
        let out = Command::new("chown").arg("-R").arg("postgres:postgres").arg(path).output();
        assert!(out.is_ok_and(|o| o.status.success()), "cannot chown {} to postgres", path.display());
    }
}

fn describe(out: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout).trim_end(), String::from_utf8_lossy(&out.stderr).trim_end())
}

/// `scripts/pg-env.sh ARGS` (the one map from a major to its installation): its output, or
/// why it failed.
pub fn pg_env(args: &[&str]) -> Result<String, String> {
    let out = Command::new("bash")
        .arg(root().join("scripts/pg-env.sh"))
        .args(args)
        .output()
        .map_err(|e| format!("cannot run scripts/pg-env.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!("scripts/pg-env.sh {} failed: {}", args.join(" "), describe(&out)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn pg_config_path(args: &[&str]) -> Result<PathBuf, String> {
    let path = PathBuf::from(pg_env(args)?);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("scripts/pg-env.sh {} printed {}, which is not a file", args.join(" "), path.display()))
    }
}

/// The supported majors, in order.
pub fn majors() -> Vec<u32> {
    pg_env(&["majors"])
        .unwrap_or_else(|e| panic!("{e}"))
        .split_whitespace()
        .map(|m| m.parse().unwrap_or_else(|_| panic!("scripts/pg-env.sh majors printed {m:?}, not a major")))
        .collect()
}

/// The default major (Debian's own PostgreSQL).
pub fn default_major() -> u32 {
    let m = pg_env(&["default"]).unwrap_or_else(|e| panic!("{e}"));
    m.parse().unwrap_or_else(|_| panic!("scripts/pg-env.sh default printed {m:?}, not a major"))
}

/// The pg_config of major `major`: Debian's for the default major, else its relocatable tree.
pub fn config(major: u32) -> Result<PathBuf, String> {
    pg_config_path(&["config", &major.to_string()])
}

/// The pg_config of Debian's own PostgreSQL (the default major).
pub fn debian() -> PathBuf {
    PathBuf::from(pg_env(&["debian"]).unwrap_or_else(|e| panic!("{e}")))
}

/// The pg_config of major `major`'s relocatable tree (`scripts/pg-env.sh tree NN`, downloaded
/// and unpacked on first use), or why it cannot be obtained (offline, no such major): the
/// caller skips, saying so.
pub fn tree(major: u32) -> Result<PathBuf, String> {
    pg_config_path(&["tree", &major.to_string()])
}

/// A fresh copy of major `major`'s relocatable tree in `dir`; its pg_config.
pub fn unpack(major: u32, dir: &Path) -> Result<PathBuf, String> {
    pg_config_path(&["unpack", &major.to_string(), dir.to_str().expect("UTF-8 path")])
}

/// The pg_config of the PostgreSQL under test: `$PG_CONFIG`, else the default major's.
pub fn pg_config() -> PathBuf {
    std::env::var_os("PG_CONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| config(default_major()).unwrap_or_else(|e| panic!("{e}")))
}

/// `pg_config --flag` of `pg_config`.
pub fn pg_config_value(pg_config: &Path, flag: &str) -> String {
    let out = Command::new(pg_config)
        .arg(flag)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} {flag}: {e}", pg_config.display()));
    assert!(out.status.success(), "{} {flag} failed: {}", pg_config.display(), describe(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The major of a pg_config (`PostgreSQL 15.19` → 15).
pub fn major_of(pg_config: &Path) -> u32 {
    let version = pg_config_value(pg_config, "--version");
    version
        .trim_start_matches("PostgreSQL ")
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("cannot read a major from {version:?}"))
}

/// Whether the idempotency extension (library and control file) is installed in a pg_config's
/// tree.
pub fn extension_installed(pg_config: &Path) -> bool {
    let share = PathBuf::from(pg_config_value(pg_config, "--sharedir"));
    let lib = PathBuf::from(pg_config_value(pg_config, "--pkglibdir"));
    share.join("extension/idempotency.control").is_file() && lib.join("idempotency.so").is_file()
}

impl Server {
    /// A server of `pg_config`'s major named `name`, in `target/servers/<name>`, on `port`.
    /// Nothing is created yet: [`Server::initdb`] or [`Server::standby_of`] does.
    pub fn new(name: &str, pg_config: &Path, port: u16) -> Server {
        let bindir = PathBuf::from(pg_config_value(pg_config, "--bindir"));
        Server {
            name: name.to_owned(),
            pg_config: pg_config.to_owned(),
            bindir,
            major: major_of(pg_config),
            dir: root().join("target/servers").join(name),
            port,
            persistent: false,
            durable: std::env::var_os("IDEM_PG_DURABLE").is_some_and(|v| v == "1"),
            kept: AtomicBool::new(false),
        }
    }

    /// Keeps the server's directory when the value is dropped (a failed check outside a panic),
    /// and says where on stderr.
    pub fn keep(&self) {
        if !self.kept.swap(true, Ordering::Relaxed) {
            eprintln!("kept {} for inspection (server log: {})", self.dir.display(), self.dir.join("server.log").display());
        }
    }

    /// The `-c fsync=...` this server starts with.
    fn fsync_option(&self) -> &'static str {
        if self.durable {
            "-c fsync=on"
        } else {
            "-c fsync=off"
        }
    }

    /// The shared private cluster of `pg_config`'s major: `target/servers/private-NN`, on
    /// `IDEM_PG_PORT`, else 554NN (55415 for 15), never the system cluster or 5432. It is left
    /// running when dropped; [`Server::ensure_started`] creates it on first use.
    pub fn private(pg_config: &Path) -> Server {
        let major = major_of(pg_config);
        let port = match std::env::var("IDEM_PG_PORT") {
            Ok(p) => p.parse().unwrap_or_else(|_| panic!("IDEM_PG_PORT={p:?}: not a port number")),
            Err(_) => 55400 + u16::try_from(major).expect("a major below 100"),
        };
        let mut server = Server::new(&format!("private-{major}"), pg_config, port);
        server.persistent = true;
        server
    }

    /// Creates the cluster with [`PRIVATE_SETTINGS`] when it does not exist yet, and starts it
    /// when it is not running (restarts it when it runs with the other `fsync`: the options of
    /// its start are in `postmaster.opts`).
    pub fn ensure_started(&self) {
        if !self.data().join("PG_VERSION").is_file() {
            self.initdb(&[]);
            self.configure(PRIVATE_SETTINGS);
        }
        if self.is_running() {
            let opts = fs::read_to_string(self.data().join("postmaster.opts")).unwrap_or_default();
            let want = if self.durable { "fsync=on" } else { "fsync=off" };
            if opts.contains(want) {
                return;
            }
            self.stop(Stop::Fast);
        }
        self.start();
    }

    /// Stops the server if it runs and deletes its directory.
    pub fn destroy(&self) {
        self.stop(Stop::Fast);
        let _ = fs::remove_dir_all(&self.dir);
    }

    /// The server's name (its directory under `target/servers`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's major.
    pub fn major(&self) -> u32 {
        self.major
    }

    /// The pg_config of the server's major.
    pub fn pg_config(&self) -> &Path {
        &self.pg_config
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data directory.
    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The server's directory (data, socket, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of program `name` of the server's major.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bindir.join(name)
    }

    /// The URL of database `db`, as the superuser `postgres`.
    pub fn url(&self, db: &str) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The server log so far (empty before the first start).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// Runs program `program` of `bindir` with `args`, as the server's OS user, in the server's
    /// directory (pg_upgrade writes its logs into the current directory); answers its output.
    pub fn run_in(&self, bindir: &Path, program: &str, args: &[&str]) -> Output {
        let path = bindir.join(program);
        let mut cmd = as_server(&path);
        cmd.args(args).current_dir(&self.dir);
        cmd.output().unwrap_or_else(|e| panic!("{}: cannot run {}: {e}", self.name, path.display()))
    }

    /// Runs program `program` of the server's major (see [`Server::run_in`]); panics with its
    /// output when it fails.
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        let out = self.run_in(&self.bindir.clone(), program, args);
        assert!(out.status.success(), "{}: {program} {} failed: {}", self.name, args.join(" "), describe(&out));
        out
    }

    /// An empty directory for the server, owned by the server's OS user (any earlier server of
    /// this name stopped and removed first).
    fn fresh_dir(&self) {
        if self.data().join("PG_VERSION").is_file() {
            self.stop(Stop::Immediate);
        }
        let _ = fs::remove_dir_all(&self.dir);
        fs::create_dir_all(&self.dir).unwrap_or_else(|e| panic!("{}: cannot create {}: {e}", self.name, self.dir.display()));
        chown_to_server(&self.dir);
    }

    /// Creates a new cluster (trust authentication, UTF-8, the C.UTF-8 locale, superuser
    /// `postgres`, `--no-sync`: a test server need not survive the machine) with the extra
    /// `initdb` arguments `args` (`--no-data-checksums`, ...), and writes the settings every
    /// private server has: 127.0.0.1 only, its port, its own socket directory, a log line prefix
    /// with the process type.
    pub fn initdb(&self, args: &[&str]) {
        self.fresh_dir();
        let data = self.data();
        let data = data.to_str().expect("UTF-8 path");
        let mut all = vec!["-D", data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"];
        if !args.contains(&"--no-sync") {
            all.push("--no-sync");
        }
        all.extend_from_slice(args);
        self.run("initdb", &all);
        self.configure(&self.base_settings());
    }

    fn base_settings(&self) -> String {
        format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\nlog_line_prefix = '%m [%p] %b: '\n",
            self.port,
            self.dir.display()
        )
    }

    /// Appends `lines` to postgresql.conf (a later line wins over an earlier one); they take
    /// effect at the next start (or reload).
    pub fn configure(&self, lines: &str) {
        let conf = self.data().join("postgresql.conf");
        let mut text = fs::read_to_string(&conf).unwrap_or_else(|e| panic!("{}: cannot read {}: {e}", self.name, conf.display()));
        text.push_str("\n# added by the test kit\n");
        text.push_str(lines);
        text.push('\n');
        // Written as ourselves: the file stays owned by the server's user (it existed already).
        fs::write(&conf, text).unwrap_or_else(|e| panic!("{}: cannot write {}: {e}", self.name, conf.display()));
    }

    /// Whether the server is running (`pg_ctl status`).
    pub fn is_running(&self) -> bool {
        let data = self.data();
        self.data().join("PG_VERSION").is_file()
            && self.run_in(&self.bindir.clone(), "pg_ctl", &["-D", data.to_str().expect("UTF-8 path"), "status"]).status.success()
    }

    /// Starts the server and waits until it accepts connections (a standby: until it accepts
    /// read-only ones). The port may be held by a client connection elsewhere (it lies in the
    /// ephemeral range), also in TIME-WAIT for a minute after that connection closed: a start
    /// that fails to bind is tried again every 2 s for up to [`BIND_DEADLINE`].
    pub fn start(&self) {
        let data = self.data();
        let data = data.to_str().expect("UTF-8 path");
        let log = self.dir.join("server.log");
        let log = log.to_str().expect("UTF-8 path");
        let port = format!("-p {} {}", self.port, self.fsync_option());
        let started = Instant::now();
        loop {
            let before = self.log().len();
            // The port on the command line too: a data directory made earlier for another port
            // (the private cluster's, IDEM_PG_PORT changed) listens where this server says; and
            // fsync (see the module docs).
            let out = self.run_in(&self.bindir.clone(), "pg_ctl", &["-D", data, "-l", log, "-o", &port, "-w", "-t", "120", "start"]);
            if out.status.success() {
                return;
            }
            let tail = self.log().get(before..).unwrap_or_default().to_owned();
            if started.elapsed() >= BIND_DEADLINE || !tail.contains("Address already in use") {
                panic!("{}: pg_ctl start on port {} failed: {}\nserver log:\n{tail}", self.name, self.port, describe(&out));
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    /// Stops the server (nothing to do when it is not running).
    pub fn stop(&self, mode: Stop) {
        if !self.is_running() {
            return;
        }
        let data = self.data();
        let mode = match mode {
            Stop::Fast => "fast",
            Stop::Immediate => "immediate",
        };
        self.run("pg_ctl", &["-D", data.to_str().expect("UTF-8 path"), "-m", mode, "-w", "-t", "120", "stop"]);
    }

    /// A streaming standby of `primary` (which must be running) named `name` on `port`:
    /// `pg_basebackup -R` (which writes `standby.signal` and `primary_conninfo`) with the WAL
    /// streamed during the copy, then this server's own settings. The standby connects with
    /// `application_name` (and `cluster_name`) `name`, so the primary sees it under that name
    /// (`synchronous_standby_names`, `pg_stat_replication`). Not started.
    pub fn standby_of(primary: &Server, name: &str, port: u16) -> Server {
        let standby = Server::new(name, &primary.pg_config, port);
        standby.fresh_dir();
        let data = standby.data();
        let port = primary.port.to_string();
        standby.run(
            "pg_basebackup",
            &["-D", data.to_str().expect("UTF-8 path"), "-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-R", "-X", "stream", "-c", "fast", "--no-sync"],
        );
        standby.configure(&format!("{}cluster_name = '{name}'\n", standby.base_settings()));
        // pg_basebackup -R writes every option its libpq knows into primary_conninfo; the
        // server's walreceiver may load an older libpq (a relocatable tree finds the system's),
        // which refuses unknown ones (17's `sslnegotiation`). The few that matter, last (the
        // last setting in postgresql.auto.conf wins).
        let auto = standby.data().join("postgresql.auto.conf");
        let mut text = fs::read_to_string(&auto).unwrap_or_else(|e| panic!("{name}: cannot read {}: {e}", auto.display()));
        text.push_str(&format!("primary_conninfo = 'host=127.0.0.1 port={port} user=postgres application_name={name}'\n"));
        fs::write(&auto, text).unwrap_or_else(|e| panic!("{name}: cannot write {}: {e}", auto.display()));
        standby
    }

    /// Promotes a standby and waits until it has left recovery (`pg_ctl promote -w`).
    pub fn promote(&self) {
        let data = self.data();
        self.run("pg_ctl", &["-D", data.to_str().expect("UTF-8 path"), "-w", "-t", "120", "promote"]);
    }
}

impl Drop for Server {
    /// A server still running is stopped, so the next run can reuse its port; then its directory
    /// is deleted, unless this thread is panicking (a failed test) or [`Server::keep`] was called:
    /// then it stays for inspection, and stderr says where. The shared private cluster is left
    /// as it is.
    fn drop(&mut self) {
        if self.persistent {
            return;
        }
        if self.data().join("PG_VERSION").is_file() {
            let data = self.data();
            // Never panics (a drop while panicking would abort): the outcome is not needed.
            let _ = self.run_in(&self.bindir.clone(), "pg_ctl", &["-D", data.to_str().unwrap_or_default(), "-m", "immediate", "-w", "stop"]);
        }
        if std::thread::panicking() {
            self.keep();
        }
        if !self.kept.load(Ordering::Relaxed) && self.dir.exists() {
            if let Err(e) = fs::remove_dir_all(&self.dir) {
                eprintln!("cannot delete {}: {e}", self.dir.display());
            }
        }
    }
}
