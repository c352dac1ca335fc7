//! psql against a test server: one value or rows (`|` between columns), stopping at the first
//! error; scripts and named statements of files under tests/ with psql variables, sessions in
//! the background, pgbench.

use crate::sh::capture;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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

    /// The rows of the script `sql` (given on standard input) with psql variables `vars`
    /// (`:'name'` a literal, `:"name"` an identifier, `:name` as is). psql sends each statement
    /// as a query of its own; `\;` between statements sends them as one, as `-c` does.
    pub(crate) fn script(&self, sql: &str, vars: &[(&str, &str)]) -> Result<String, String> {
        let args = var_args(vars);
        self.stdin(sql, &args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// The script `sql` with psql variables `vars`, its output and the server's notices (psql's
    /// standard output, then its standard error), whether it succeeded or not.
    pub(crate) fn with_notices(&self, sql: &str, vars: &[(&str, &str)]) -> String {
        let mut child = self
            .command()
            .arg("-At")
            .args(var_args(vars))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start psql");
        child.stdin.take().expect("stdin").write_all(sql.as_bytes()).expect("write to psql");
        let out = child.wait_with_output().expect("psql");
        format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }

    /// A session in the background, not stopping at an error: the script `sql` with psql
    /// variables `vars`, its output (rows, `-At`) and errors into `log`.
    pub(crate) fn spawn(&self, sql: &str, vars: &[(&str, &str)], log: &Path) -> Child {
        let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let mut child = self
            .command()
            .args(["-v", "ON_ERROR_STOP=0", "-At"])
            .args(var_args(vars))
            .stdin(Stdio::piped())
            .stdout(out.try_clone().expect("clone the log handle"))
            .stderr(out)
            .spawn()
            .expect("start psql");
        child.stdin.take().expect("stdin").write_all(sql.as_bytes()).expect("write to psql");
        child
    }

    /// pgbench (`-n`, the major's, as this role) of the script `file` on this database with
    /// extra arguments `args`, its output into `log`.
    pub(crate) fn pgbench(&self, file: &Path, args: &[&str], log: &Path) -> Child {
        let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        Command::new(self.bin.with_file_name("pgbench"))
            .args(["-n", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", &self.user])
            .args(args)
            .arg("-f")
            .arg(file)
            .arg(&self.db)
            .stdout(out.try_clone().expect("clone the log handle"))
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("start pgbench")
    }

    /// Drops (forcing out its sessions) and creates database `db`.
    pub(crate) fn recreate(&self, db: &str) -> Result<(), String> {
        self.db("postgres")
            .stdin(&format!("SET client_min_messages = warning;\nDROP DATABASE IF EXISTS {db} WITH (FORCE);\nCREATE DATABASE {db};\n"), &[])
            .map(drop)
    }

    /// Polls the script `sql` with psql variables `vars` every 200 ms until it answers `want`,
    /// for at most `secs` seconds; else what it answered last.
    pub(crate) fn until_script_equal(&self, secs: u64, sql: &str, vars: &[(&str, &str)], want: &str) -> Result<(), String> {
        self.until(secs, sql, want, || self.script(sql, vars))
    }

    fn until(&self, secs: u64, sql: &str, want: &str, ask: impl Fn() -> Result<String, String>) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let got = ask().unwrap_or_else(|e| e);
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

/// The SQLSTATE of the first `ERROR:  CODE` line of psql's errors (`VERBOSITY=sqlstate`), else
/// the whole text.
pub(crate) fn error_code(err: &str) -> String {
    err.lines()
        .find_map(|l| l.split_once("ERROR:  ").map(|(_, code)| code.trim().to_owned()))
        .unwrap_or_else(|| err.to_owned())
}

/// `-v name=value` for each of `vars`.
fn var_args(vars: &[(&str, &str)]) -> Vec<String> {
    vars.iter().flat_map(|(k, v)| ["-v".to_owned(), format!("{k}={v}")]).collect()
}

/// Named statements of the `.sql` files of a directory under tests/: a line `-- [name]` (a
/// description may follow) starts one, which runs to the next such line; the lines before the
/// first are the file's comment. Names are unique across the directory.
pub(crate) struct Named {
    dir: PathBuf,
    texts: BTreeMap<String, String>,
}

impl Named {
    /// The statements of `dir`'s `.sql` files; panics on an unreadable file or a name given twice.
    pub(crate) fn load(dir: &Path) -> Named {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "sql"))
            .collect();
        files.sort();
        let mut texts = BTreeMap::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
            for (name, body) in sections(&text) {
                if texts.insert(name.clone(), body).is_some() {
                    panic!("{}: the statement [{name}] is named twice in {}", file.display(), dir.display());
                }
            }
        }
        Named { dir: dir.to_owned(), texts }
    }

    /// The statement `name`; panics naming the directory when there is none.
    pub(crate) fn get(&self, name: &str) -> &str {
        self.texts.get(name).unwrap_or_else(|| panic!("no statement [{name}] in {}/*.sql", self.dir.display()))
    }

    /// Statement `name` on `on`, with psql variables `vars` ([`Psql::script`]).
    pub(crate) fn q(&self, on: &Psql, name: &str, vars: &[(&str, &str)]) -> Result<String, String> {
        on.script(self.get(name), vars)
    }

    /// [`Named::q`], panicking with the error (for set-up statements the checks rely on).
    pub(crate) fn run(&self, on: &Psql, name: &str, vars: &[(&str, &str)]) -> String {
        self.q(on, name, vars).unwrap_or_else(|e| panic!("{} [{name}] {vars:?} on port {}: {e}", self.dir.display(), on.port))
    }

    /// Every name.
    #[cfg(test)]
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.texts.keys().map(String::as_str)
    }
}

/// The statement names a layer's source runs through [`Named`]: each `"name"` that is the
/// first argument of a call to `get`, `background` or `q`, or the second of `run` or `q` (its
/// first being a node), in the code before its tests.
#[cfg(test)]
pub(crate) fn named_in(source: &str) -> Vec<String> {
    let code = source.split("#[cfg(test)]").next().unwrap_or_default();
    let mut names = Vec::new();
    for line in code.lines() {
        for (i, _) in line.match_indices('"') {
            let rest = &line[i + 1..];
            let Some(end) = rest.find('"') else { continue };
            let name = &rest[..end];
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
                continue;
            }
            let before = &line[..i];
            let Some(open) = before.rfind('(') else { continue };
            let callee = before[..open].rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or_default();
            let first = before[open + 1..].trim();
            let direct = first.is_empty() && ["get", "background", "q"].contains(&callee);
            let after_node = first.ends_with(',') && !first[..first.len() - 1].contains([',', '(', ')', '"']) && ["run", "q"].contains(&callee);
            if (direct || after_node) && !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
    }
    names
}

/// The `-- [name]` sections of a file: (name, its text trimmed).
fn sections(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let name = line.strip_prefix("-- [").and_then(|r| r.split_once(']')).map(|(n, _)| n.to_owned());
        match (name, out.last_mut()) {
            (Some(n), _) => out.push((n, String::new())),
            (None, Some((_, body))) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    for (_, body) in &mut out {
        *body = body.trim().to_owned();
    }
    out
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

#[cfg(test)]
mod tests {
    use super::{named_in, sections};

    #[test]
    fn reads_named_sections() {
        let text = "-- a file comment\n\n-- [one] what it does\nSELECT 1;\n\n-- [two]\nBEGIN;\nSELECT :'x';\nCOMMIT;\n";
        let got = sections(text);
        assert_eq!(got, vec![("one".to_owned(), "SELECT 1;".to_owned()), ("two".to_owned(), "BEGIN;\nSELECT :'x';\nCOMMIT;".to_owned())]);
    }

    #[test]
    fn finds_the_names_a_layer_runs() {
        let src = "let a = k.run(c, \"first\", &[(\"user\", u)]);\nlet b = q(\"second\");\nk.q(&k.w1, \"third\", &[]);\nchecks.check(\"label\", eq(x, \"t\"));\nk.sql.get(\"fourth\");\n#[cfg(test)]\nq(\"not_code\");";
        assert_eq!(named_in(src), vec!["first", "second", "third", "fourth"]);
    }
}
