//! psql against a test server: one value or rows (`|` between columns), stopping at the first
//! error.

use crate::sh::capture;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// psql of a major, on a port, as a role, in a database.
#[derive(Clone, Debug)]
pub(crate) struct Psql {
    bin: PathBuf,
    port: u16,
    db: String,
    user: String,
}

impl Psql {
    /// psql from `bindir` on 127.0.0.1:`port`, database `postgres`, role `postgres`.
    pub(crate) fn new(bindir: &Path, port: u16) -> Psql {
        Psql { bin: bindir.join("psql"), port, db: "postgres".into(), user: "postgres".into() }
    }

    /// The same in database `db`.
    pub(crate) fn db(&self, db: &str) -> Psql {
        Psql { db: db.into(), ..self.clone() }
    }

    /// The same as role `user`.
    pub(crate) fn user(&self, user: &str) -> Psql {
        Psql { user: user.into(), ..self.clone() }
    }

    /// The URL of the database.
    pub(crate) fn url(&self) -> String {
        format!("postgresql://{}@127.0.0.1:{}/{}", self.user, self.port, self.db)
    }

    /// The port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// A psql command with the connection and `-X -q -v ON_ERROR_STOP=1` (a later `-v
    /// ON_ERROR_STOP=0` wins).
    pub(crate) fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", &self.user, "-d", &self.db]);
        c
    }

    /// The rows of `sql`, unaligned (`-At`, `|` between columns).
    pub(crate) fn q(&self, sql: &str) -> Result<String, String> {
        capture(self.command().args(["-At", "-F", "|", "-c", sql]))
    }

    /// [`Psql::q`], panicking with the error (for set-up statements the checks rely on).
    pub(crate) fn run(&self, sql: &str) -> String {
        self.q(sql).unwrap_or_else(|e| panic!("psql -d {} -c {sql:?}: {e}", self.db))
    }

    /// The rows of file `file`, with psql variables `vars`.
    pub(crate) fn file(&self, file: &Path, vars: &[(&str, &str)]) -> Result<String, String> {
        let mut c = self.command();
        c.args(["-At", "-F", "|"]);
        for (k, v) in vars {
            c.arg("-v").arg(format!("{k}={v}"));
        }
        capture(c.arg("-f").arg(file))
    }

    /// The rows of the script `sql` given on standard input, with extra arguments `args`.
    pub(crate) fn stdin(&self, sql: &str, args: &[&str]) -> Result<String, String> {
        let mut child = self
            .command()
            .args(["-At", "-F", "|"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run psql: {e}"))?;
        child.stdin.take().expect("stdin").write_all(sql.as_bytes()).map_err(|e| format!("write to psql: {e}"))?;
        let out = child.wait_with_output().map_err(|e| format!("psql: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).trim_end().to_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr).trim_end()))
        }
    }

    /// Drops (forcing out its sessions) and creates database `db`.
    pub(crate) fn recreate(&self, db: &str) -> Result<(), String> {
        self.db("postgres")
            .stdin(&format!("SET client_min_messages = warning;\nDROP DATABASE IF EXISTS {db} WITH (FORCE);\nCREATE DATABASE {db};\n"), &[])
            .map(drop)
    }

    /// Polls `sql` every 200 ms until it answers `want`, for at most `secs` seconds; else what
    /// it answered last.
    pub(crate) fn until_equal(&self, secs: u64, sql: &str, want: &str) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let got = self.q(sql).unwrap_or_else(|e| e);
            if got == want {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("waited {secs} s for [{sql}] = [{want}], last [{got}]"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The rows `label|t` or `label|f` of a checking script: each one check.
pub(crate) fn sql_checks(checks: &mut crate::report::Checks, what: &str, result: Result<String, String>) {
    match result {
        Err(e) => checks.fail(what, &crate::sh::tail(&e, 15)),
        Ok(out) => {
            for line in out.lines().filter(|l| !l.is_empty()) {
                match line.rsplit_once('|') {
                    Some((label, "t")) => checks.pass(label),
                    Some((label, got)) => checks.fail(label, &format!("got: {got}")),
                    None => checks.fail(what, &format!("not a `label|t` row: {line}")),
                }
            }
        }
    }
}
