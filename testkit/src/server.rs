//! A private PostgreSQL server of any major, driven from Rust: initdb, configure, start, stop
//! (fast or immediate), a streaming standby of a primary (pg_basebackup), promotion, and any
//! other program of its major run as the server's OS user (pg_upgrade, pg_checksums).
//!
//! The one place that creates and drives a cluster for tests that need more than the shared
//! private cluster of `scripts/pg.sh` ([`crate::cluster`]): several servers, several majors, a
//! primary and its standby. Each server lives in a directory of its own (the data directory,
//! its socket, its log); every server listens on 127.0.0.1 only, on the port it is given.
//!
//! PostgreSQL refuses to run as root: run as root, every server program runs as the `postgres`
//! OS user (through `sudo -u postgres`), and the server's directory is handed to that user.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::root;

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
}

fn running_as_root() -> bool {
    // `id -u` rather than libc: the test kit has no unsafe code and no libc dependency.
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn describe(out: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout).trim_end(), String::from_utf8_lossy(&out.stderr).trim_end())
}

/// The pg_config of major `major`'s relocatable tree (`scripts/pg-env.sh tree NN`, downloaded
/// and unpacked on first use), or why it cannot be obtained (offline, no such major): the
/// caller skips, saying so.
pub fn tree(major: u32) -> Result<PathBuf, String> {
    let out = Command::new("bash")
        .arg(root().join("scripts/pg-env.sh"))
        .args(["tree", &major.to_string()])
        .output()
        .map_err(|e| format!("cannot run scripts/pg-env.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!("scripts/pg-env.sh tree {major} failed: {}", describe(&out)));
    }
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("scripts/pg-env.sh tree {major} printed {}, which is not a file", path.display()))
    }
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
        }
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
        let mut cmd = if running_as_root() {
            let mut c = Command::new("sudo");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
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
        if running_as_root() {
            let out = Command::new("chown").arg("postgres:postgres").arg(&self.dir).output();
            assert!(out.is_ok_and(|o| o.status.success()), "{}: cannot chown {} to postgres", self.name, self.dir.display());
        }
    }

    /// Creates a new cluster (trust authentication, UTF-8, the C.UTF-8 locale, superuser
    /// `postgres`) with the extra `initdb` arguments `args` (`--no-data-checksums`, ...), and
    /// writes the settings every private server has: 127.0.0.1 only, its port, its own socket
    /// directory, a log line prefix with the process type.
    pub fn initdb(&self, args: &[&str]) {
        self.fresh_dir();
        let data = self.data();
        let data = data.to_str().expect("UTF-8 path");
        let mut all = vec!["-D", data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"];
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
        let started = Instant::now();
        loop {
            let before = self.log().len();
            let out = self.run_in(&self.bindir.clone(), "pg_ctl", &["-D", data, "-l", log, "-w", "-t", "120", "start"]);
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
            &["-D", data.to_str().expect("UTF-8 path"), "-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-R", "-X", "stream", "-c", "fast"],
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
    /// A server left running by a failed test is stopped, so the next run can reuse its port.
    fn drop(&mut self) {
        if self.data().join("PG_VERSION").is_file() {
            let data = self.data();
            // Never panics (a drop while panicking would abort): the outcome is not needed.
            let _ = self.run_in(&self.bindir.clone(), "pg_ctl", &["-D", data.to_str().unwrap_or_default(), "-m", "immediate", "-w", "stop"]);
        }
    }
}

/// Waits until `check` answers `Ok`, trying every 200 ms for at most `deadline`; panics with
/// `what` and the last thing `check` saw (its `Err`) when the deadline passes.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(v) => return v,
            Err(seen) if start.elapsed() >= deadline => {
                panic!("{what}: not reached within {} s; last seen: {seen}", deadline.as_secs())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
