//! `bench --scale`: ten million keys (issue 34, item 3), on a server of its own.
//!
//! What each figure measures (the 10M sizes; `--smoke` uses 20,000 rows and 1 s runs, which
//! checks only that every figure produced numbers):
//!
//! 1. **Reserve at scale**: the `fresh` pgbench script (reserve, business insert, complete; 8
//!    clients) in a database holding 10,000,000 live records (finished, unexpired) against one
//!    holding 10,000, interleaved A/B/B/A/A/B/B/A (10 s runs). The figure is the 10M side's tps over the
//!    10k side's (goal ≥ 0.85), with p99 on both sides, and each side's WAL per transaction, the
//!    full-page images in it (pg_walinspect over each run's WAL, read after the run) and the
//!    blocks read into shared buffers per transaction. The filled records look like the script's
//!    own: same operation, users `u1`..`u1000`, keys `k` + a uniform 63-bit number (so new keys
//!    land all over the primary key, not at one edge), a 64-hex-digit request hash, a 34-byte
//!    response, expiries spread over the next 2 to 24 hours; written in the table's own layout
//!    (0.7.0's compact record, its key digest, stored hash and status code from the extension's
//!    functions `_idem_id`, `_idem_hash` and `_idem_status_code`, or the text record of 0.6.0 and
//!    earlier).
//! 2. **Sweep of a 10M backlog**: `idem_sweep(10000)` (the worker's batch, the default of
//!    `idempotency.maintenance_batch_size`), one transaction per call as the worker runs it, until
//!    a batch comes back less than full, over 10,000,000 expired records (expiries spread over 22
//!    hours). Reports rows/s over the timed batches, the mean time of the first and of the last
//!    decile of full batches and their ratio (goal ≤ 1.5), the slowest batch, the autovacuums that
//!    ran meanwhile, and the plan and buffers of two probed batches (the sweep's own DELETE under
//!    `EXPLAIN (ANALYZE, BUFFERS)`, untimed: the first batch and the first of the last decile).
//!    Every timed batch's time goes to `target/bench/scale-sweep.csv`.
//! 3. **Bytes per record**: `pg_relation_size` of the heap, of the TOAST table and of each index of
//!    idem_records (main forks), over the row count, in the 10M database of row 1 right after its
//!    fill and `VACUUM ANALYZE` (the primary key grown by inserts in random order, as in use).
//! 4. **The worker's effect on p99**: the `fresh` script (8 clients, 10 s runs) in a database
//!    holding a backlog of 6,000,000 expired records, with the maintenance worker idle (no
//!    database listed) and while it drains that backlog (`idempotency.maintenance_databases`
//!    set by `ALTER SYSTEM` and a reload), in the order idle, draining, draining, idle. Reports
//!    both p99s and their ratio, both tps, the worker's rate meanwhile and its VACUUMs, and
//!    whether the backlog lasted through both draining runs.
//! 5. **The upgrade's rewrite cost**: a database created at extension version 0.5.0 holding
//!    10,000,000 records (0.5.0's columns), then `ALTER EXTENSION idempotency UPDATE` in a
//!    transaction: its duration (the statement, then the commit), whether it rewrote the table
//!    (relfilenode and size before and after), and the locks the transaction holds on idem_records
//!    at its end (`pg_locks`).
//! 6. **The online update from 0.6.0 under load** (issue 43, item 5): a database created at 0.6.0
//!    holding 10,000,000 live records (its text layout), the `fresh` script (8 clients) running in
//!    back-to-back 10 s pgbench runs that log every transaction, then `ALTER EXTENSION idempotency
//!    UPDATE` (which sets the old table aside as idem_records_060), then the maintenance worker
//!    listed for the database until it has moved every kept record into the compact table and
//!    dropped the old one (`idem_move_records`), then 10 s more. Reports the longest `fresh`
//!    transaction overlapping the update and the move (goal ≤ 1 s: a transaction's latency bounds
//!    how long its `idem_reserve` waited), the update's duration and WAL, and the move's duration,
//!    rows/s and WAL (the load's WAL included). The logs stay in `target/bench/scale-update-logs`.
//!
//! The server: a new cluster in `target/scale` (the data directory; `IDEM_SCALE_DIR` another) on
//! 127.0.0.1 port 56230 (`IDEM_SCALE_PORT` another) from the PostgreSQL of `PG_CONFIG` (the test
//! kit's, as every server of the bench), with `shared_buffers = 256MB`, `max_wal_size = 4GB`,
//! fsync on, data checksums off (PostgreSQL 18's initdb turns them on: `IDEM_SCALE_CHECKSUMS=on`
//! keeps them, and their hint-bit page images in the WAL), idempotency preloaded and its worker
//! idle but in rows 4 and 6; started as the `postgres` OS
//! user when run as root. The extension must be installed in that tree already. Each data set is
//! filled by one `INSERT .. SELECT generate_series` with fsync turned off for the fill only
//! (`ALTER SYSTEM`, reload), then `VACUUM ANALYZE`, `CHECKPOINT`, fsync back on and an OS `sync`,
//! before anything is timed; the fill's duration is reported. Each database is dropped after its
//! figure, and the cluster is stopped and its directory removed at the end (kept after a panic).
//! `IDEM_SCALE_ROWS=N` gives the 10M figures another size (the worker's backlog is 60 % of it).
//! `IDEM_SCALE_VERSION=0.6.0` creates the databases of rows 1 to 4 at that version instead of the
//! default (the same library serving 0.6.0's text record: the comparison of issue 43), and
//! `IDEM_SCALE_SKIP=reserve,sweep,worker,upgrade,update` leaves out any of the rows (row 3 goes
//! with row 1).

use crate::pgbench::{self, Measure};
use crate::soak::counter;
use crate::{connect, human, script, Row};
use idempotency_testkit::server::{as_server, chown_to_server};
use idempotency_testkit::{pg_bin, root};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// The worker's batch: the default of `idempotency.maintenance_batch_size` (extension/src/guc.rs).
const WORKER_BATCH: i64 = 10_000;
/// pgbench clients of rows 1 and 4.
const CLIENTS: u32 = 8;

/// The sizes of one run.
struct Sizes {
    smoke: bool,
    /// Records of the large side of row 1 (and of row 3).
    large: i64,
    small: i64,
    /// The sweep's backlog (row 2).
    backlog: i64,
    /// The worker's backlog (row 4).
    worker_backlog: i64,
    /// Records of the 0.5.0 database (row 5).
    upgrade: i64,
    run: Duration,
    /// Rounds of A/B/B/A in row 1.
    rounds: usize,
    /// The extension version of the databases of rows 1 to 4 (`IDEM_SCALE_VERSION`; None: the
    /// default version, the compact record of 0.7.0 on; `0.6.0` measures 0.6.0's text layout
    /// served by the same library).
    version: Option<String>,
    /// Rows to leave out (`IDEM_SCALE_SKIP`, names separated by commas: `reserve` (with row 3),
    /// `sweep`, `worker`, `upgrade`, `update`).
    skip: Vec<String>,
}

impl Sizes {
    fn new(smoke: bool) -> Sizes {
        let large = match std::env::var("IDEM_SCALE_ROWS") {
            Ok(v) => v.parse().unwrap_or_else(|_| panic!("IDEM_SCALE_ROWS={v} is not a number of rows")),
            Err(_) if smoke => 20_000,
            Err(_) => 10_000_000,
        };
        let (small, run, rounds) = if smoke { (1_000, Duration::from_secs(1), 1) } else { (10_000, Duration::from_secs(10), 2) };
        let version = std::env::var("IDEM_SCALE_VERSION").ok().filter(|v| !v.is_empty());
        let skip: Vec<String> = std::env::var("IDEM_SCALE_SKIP").unwrap_or_default().split(',').map(str::trim).filter(|r| !r.is_empty()).map(str::to_owned).collect();
        if let Some(bad) = skip.iter().find(|r| !["reserve", "sweep", "worker", "upgrade", "update"].contains(&r.as_str())) {
            panic!("IDEM_SCALE_SKIP: {bad} is not a row that can be left out (reserve, sweep, worker, upgrade, update)");
        }
        Sizes { smoke, large, small, backlog: large, worker_backlog: large * 6 / 10, upgrade: large, run, rounds, version, skip }
    }

    fn runs(&self, row: &str) -> bool {
        !self.skip.iter().any(|r| r == row)
    }
}

/// A goal and which side of it is met.
#[derive(Clone, Copy)]
enum Goal {
    AtLeast(f64),
    AtMost(f64),
}

impl Goal {
    fn verdict(self, value: f64) -> String {
        match self {
            Goal::AtLeast(g) => format!("≥ {g} {}", if value >= g { "met" } else { "not met" }),
            Goal::AtMost(g) => format!("≤ {g} {}", if value <= g { "met" } else { "not met" }),
        }
    }
}

/// One measured figure of the section.
struct Figure {
    figure: String,
    value: f64,
    unit: &'static str,
    goal: Option<Goal>,
    detail: String,
}

impl Figure {
    fn new(figure: impl Into<String>, value: f64, unit: &'static str, detail: impl Into<String>) -> Figure {
        Figure { figure: figure.into(), value, unit, goal: None, detail: detail.into() }
    }

    fn goal(self, goal: Goal) -> Figure {
        Figure { goal: Some(goal), ..self }
    }

    fn value_text(&self) -> String {
        match self.unit {
            "" => format!("{:.3}", self.value),
            "rows" | "rows/s" => format!("{:.0} {}", self.value, self.unit),
            "B" => format!("{:.1} B", self.value),
            unit => format!("{:.2} {unit}", self.value),
        }
    }
}

/// What `bench --scale` measured.
pub(crate) struct Report {
    /// Row 1 as a benchmark row (tps, p50/p99 of both sides); None when left out.
    pub(crate) reserve: Option<Row>,
    figures: Vec<Figure>,
    pub(crate) run: Duration,
    /// Runs per side in row 1.
    pub(crate) reps: usize,
    header: String,
}

impl Report {
    /// The figures as a Markdown table, after a line on the server and the sizes.
    pub(crate) fn render(&self) -> String {
        let mut t = format!("\n{}\n\n| figure | value | goal | detail |\n|---|---|---|---|\n", self.header);
        for f in &self.figures {
            let goal = f.goal.map(|g| g.verdict(f.value)).unwrap_or_else(|| "—".into());
            let _ = writeln!(t, "| {} | {} | {goal} | {} |", f.figure, f.value_text(), f.detail);
        }
        t
    }

    /// `target/bench/scale.csv`: one line per figure.
    pub(crate) fn csv(&self) -> String {
        let mut c = String::from("figure,value,unit,goal,detail\n");
        for f in &self.figures {
            let goal = f.goal.map(|g| g.verdict(f.value)).unwrap_or_default();
            let _ = writeln!(c, "\"{}\",{},{},\"{goal}\",\"{}\"", f.figure, f.value, f.unit, f.detail.replace('"', "'"));
        }
        c
    }

    /// The figures that produced no number (the smoke mode's check).
    pub(crate) fn empty(&self) -> Vec<&str> {
        self.figures.iter().filter(|f| !f.value.is_finite()).map(|f| f.figure.as_str()).collect()
    }
}

/// The cluster of this section (see the module docs): stopped when dropped, its directory removed
/// unless the thread is panicking.
struct ScaleServer {
    bindir: PathBuf,
    data: PathBuf,
    port: u16,
}

impl ScaleServer {
    fn start() -> ScaleServer {
        let port = std::env::var("IDEM_SCALE_PORT").ok().map(|p| p.parse().unwrap_or_else(|_| panic!("IDEM_SCALE_PORT={p} is not a port"))).unwrap_or(56230);
        let data = std::env::var_os("IDEM_SCALE_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target/scale"));
        let bindir = pg_bin("initdb").parent().expect("bindir").to_owned();
        let server = ScaleServer { bindir, data, port };
        if server.data.join("PG_VERSION").is_file() {
            let _ = server.pg_ctl(&["-m", "immediate", "-w", "stop"]);
        }
        let _ = std::fs::remove_dir_all(&server.data);
        std::fs::create_dir_all(&server.data).unwrap_or_else(|e| panic!("{}: {e}", server.data.display()));
        chown_to_server(&server.data);
        let initdb = server.bindir.join("initdb");
        // PostgreSQL 18 turned data checksums on by default; with them the first hint bit set on
        // a page after a checkpoint logs the whole page (FPI_FOR_HINT), which the figures of
        // earlier majors never paid. Off, as every earlier major's default, unless
        // IDEM_SCALE_CHECKSUMS=on.
        let version = Command::new(&initdb).arg("--version").output().expect("initdb --version");
        let major: u32 = String::from_utf8_lossy(&version.stdout).split_whitespace().last().and_then(|v| v.split('.').next()).and_then(|m| m.parse().ok()).unwrap_or(0);
        let checksums = std::env::var("IDEM_SCALE_CHECKSUMS").is_ok_and(|v| v == "on");
        let out = as_server(&initdb)
            .args(["-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync"])
            .args(if checksums { &["--data-checksums"][..] } else if major >= 18 { &["--no-data-checksums"][..] } else { &[][..] })
            .arg("-D")
            .arg(&server.data)
            .output()
            .expect("run initdb");
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        server.configure();
        let log = server.data.join("server.log");
        let out = server.pg_ctl(&["-l", log.to_str().expect("UTF-8 path"), "-w", "-t", "120", "start"]);
        assert!(out.status.success(), "pg_ctl start: {}{}", String::from_utf8_lossy(&out.stdout), std::fs::read_to_string(&log).unwrap_or_default());
        server
    }

    fn configure(&self) {
        let conf = self.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("postgresql.conf");
        let _ = write!(
            text,
            "\n# bench --scale\nlisten_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n\
             shared_buffers = 256MB\nmax_wal_size = 4GB\nfsync = on\nlog_checkpoints = on\n\
             log_line_prefix = '%m [%p] %b: '\nshared_preload_libraries = 'idempotency'\n\
             idempotency.maintenance_databases = ''\nidempotency.maintenance_interval = 1\n",
            self.port,
            self.data.display()
        );
        std::fs::write(&conf, text).expect("write postgresql.conf");
    }

    fn pg_ctl(&self, args: &[&str]) -> std::process::Output {
        as_server(&self.bindir.join("pg_ctl")).arg("-D").arg(&self.data).args(args).output().expect("run pg_ctl")
    }

    fn url(&self, db: &str) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

impl Drop for ScaleServer {
    fn drop(&mut self) {
        let mode = if std::thread::panicking() { "immediate" } else { "fast" };
        let _ = self.pg_ctl(&["-m", mode, "-w", "-t", "120", "stop"]);
        let _ = std::fs::copy(self.data.join("server.log"), root().join("target/bench/scale-server.log"));
        if std::thread::panicking() {
            eprintln!("kept {} (server.log inside)", self.data.display());
        } else if let Err(e) = std::fs::remove_dir_all(&self.data) {
            eprintln!("cannot remove {}: {e}", self.data.display());
        }
    }
}

/// The load average (1, 5, 15 min) as /proc/loadavg says it.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_default()
}

/// A new database `name` with the extension (at `version`, else the default) and the business
/// table of the pgbench scripts.
async fn database(server: &ScaleServer, admin: &Client, name: &str, version: Option<&str>) -> (String, Client) {
    drop_database(admin, name).await;
    admin.batch_execute(&format!("CREATE DATABASE {name}")).await.expect("create database");
    let url = server.url(name);
    let db = connect(&url).await;
    let create = match version {
        Some(v) => format!("CREATE EXTENSION idempotency VERSION '{v}'"),
        None => "CREATE EXTENSION idempotency".into(),
    };
    db.batch_execute(&format!("{create}; CREATE EXTENSION pg_walinspect; CREATE TABLE bench_charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL)"))
        .await
        .unwrap_or_else(|e| panic!("{name}: {create}: {e}"));
    (url, db)
}

async fn drop_database(admin: &Client, name: &str) {
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.expect("drop database");
}

/// Which records a fill writes.
#[derive(Clone, Copy, PartialEq)]
enum Records {
    /// Finished, expiring 2 to 24 hours from now.
    Live,
    /// Finished, expired 4 to 26 hours ago.
    Expired,
}

/// `fsync` on or off for the whole server (ALTER SYSTEM and a reload).
async fn set_fsync(admin: &Client, on: bool) {
    let sql = if on { "ALTER SYSTEM RESET fsync" } else { "ALTER SYSTEM SET fsync = off" };
    admin.batch_execute(sql).await.expect("fsync setting");
    admin.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// The physical layout of a database's idem_records: 0.7.0's compact record (a `uuid` digest key,
/// the hash as 32 bytes, a one-byte status code, `attempts`) or the text layout of 0.6.0 and
/// earlier (`owner` from 0.6.0 on).
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    Compact,
    Text { owner: bool },
}

impl Layout {
    async fn of(db: &Client) -> Layout {
        let columns: Vec<String> = db
            .query("SELECT attname::text FROM pg_attribute WHERE attrelid = 'idem_records'::regclass AND attnum > 0 AND NOT attisdropped", &[])
            .await
            .expect("idem_records' columns")
            .iter()
            .map(|r| r.get(0))
            .collect();
        let has = |c: &str| columns.iter().any(|x| x == c);
        if has("id") { Layout::Compact } else { Layout::Text { owner: has("owner") } }
    }

    /// The sweep's condition on a row `x` as sql/maintenance.sql writes it for this layout (`now()`
    /// for its `v_now`): what its DELETE re-checks.
    fn sweepable(self, x: &str) -> String {
        match self {
            Layout::Compact => format!("{x}.status <> 'p' AND {x}.expires_at <= now()"),
            Layout::Text { .. } => format!("{x}.status <> 'PROCESSING' AND {x}.expires_at <= now()"),
        }
    }

    /// The sweep's candidate condition: [`Layout::sweepable`], and on the compact layout the
    /// expiry index's bucket up to now's.
    fn candidate(self, x: &str) -> String {
        match self {
            Layout::Compact => format!("{} AND _idem_expiry_bucket({x}.expires_at) <= _idem_expiry_bucket(now())", self.sweepable(x)),
            Layout::Text { .. } => self.sweepable(x),
        }
    }
}

/// Fills idem_records of `db` with `rows` records in one INSERT .. SELECT under fsync off, then
/// VACUUM ANALYZE, CHECKPOINT, fsync on and an OS sync. The records are the same whatever the
/// table's [`Layout`]; the compact one gets its key digest, stored hash and status code from the
/// extension's own functions (`_idem_id`, `_idem_hash`, `_idem_status_code`: core/src/record.rs
/// and core/src/vocabulary.rs), as every write of the extension does. Returns the seconds of the
/// INSERT and of the VACUUM ANALYZE.
async fn fill(admin: &Client, db: &Client, records: Records, rows: i64) -> (f64, f64) {
    let layout = Layout::of(db).await;
    set_fsync(admin, false).await;
    let hours_from_now = if records == Records::Live { 2 } else { -26 };
    let from = format!(
        "FROM generate_series(1, {rows}::bigint) AS i,
              LATERAL (SELECT 'u' || (1 + i % 1000) AS u, 'k' || abs(hashint8extended(i, 0)) AS k, encode(sha256(i::text::bytea), 'hex') AS h,
                              now() + interval '{hours_from_now} hours' + (i::float8 / {rows}) * interval '22 hours' AS e) AS t"
    );
    let response = "'{\"status\": 201, \"body\": {\"id\": 1}}'";
    let times = "e - interval '1 day' + interval '5 minutes', e, e - interval '1 day', e - interval '1 day'";
    let sql = match layout {
        Layout::Compact => format!(
            "INSERT INTO idem_records (id, operation, user_id, key, request_hash, status, token, response, lease_expires_at, expires_at, created_at, updated_at, owner, attempts)
             SELECT _idem_id('bench.fresh', u, k), 'bench.fresh', u, k, _idem_hash(h), _idem_status_code('SUCCESS'), i, {response}, {times}, to_regrole(current_user), 0
             {from}"
        ),
        Layout::Text { owner } => {
            let (owner_column, owner_value) = if owner { (", owner", ", to_regrole(current_user)") } else { ("", "") };
            format!(
                "INSERT INTO idem_records (operation, user_id, key, request_hash, status, token, response, lease_expires_at, expires_at, created_at, updated_at{owner_column})
                 SELECT 'bench.fresh', u, k, h, 'SUCCESS', i, {response}, {times}{owner_value}
                 {from}"
            )
        }
    };
    let started = Instant::now();
    db.batch_execute(&sql).await.expect("fill idem_records");
    db.batch_execute(&format!("SELECT setval('idem_token_seq', {rows})")).await.expect("setval");
    let inserted = started.elapsed().as_secs_f64();
    let started = Instant::now();
    db.batch_execute("VACUUM ANALYZE idem_records").await.expect("vacuum");
    let vacuumed = started.elapsed().as_secs_f64();
    admin.batch_execute("CHECKPOINT").await.expect("checkpoint");
    set_fsync(admin, true).await;
    admin.batch_execute("CHECKPOINT").await.expect("checkpoint");
    let synced = Command::new("sync").status();
    assert!(synced.is_ok_and(|s| s.success()), "sync failed");
    (inserted, vacuumed)
}

/// One pgbench run of the `fresh` script (8 clients) against `url`; its log under
/// target/bench/scale-logs.
fn fresh(url: &str, run: Duration) -> Measure {
    pgbench::run(&pg_bin("pgbench"), url, &script("fresh"), CLIENTS, run, &root().join("target/bench/scale-logs"))
}

/// What one side of row 1 read and logged, summed over its runs.
#[derive(Default)]
struct Side {
    /// Blocks the database read into shared buffers (pg_stat_database, flushed when the pgbench
    /// sessions end).
    reads: i64,
    /// The bytes of full-page images in the run's WAL (pg_walinspect, read after the run).
    fpi_bytes: f64,
}

/// [`fresh`] with the WAL written (pgbench's counters), its full-page images and the blocks the
/// database read, added to `side`.
async fn counted(url: &str, db: &Client, run: Duration, side: &mut Side) -> Measure {
    let blocks_read = || async { db.query_one("SELECT blks_read FROM pg_stat_database WHERE datname = current_database()", &[]).await.expect("blks_read").get::<_, i64>(0) };
    let lsn = || async { db.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).await.expect("lsn").get::<_, String>(0) };
    let (before, read_before, lsn_before) = (pgbench::counters(db).await, blocks_read().await, lsn().await);
    let mut m = fresh(url, run);
    let lsn_after = lsn().await;
    pgbench::delta(db, &before, &mut m).await;
    side.reads += blocks_read().await - read_before;
    let fpi = db
        .query_one("SELECT coalesce(sum(fpi_size), 0)::float8 FROM pg_get_wal_stats($1::text::pg_lsn, $2::text::pg_lsn, false)", &[&lsn_before, &lsn_after])
        .await
        .expect("pg_get_wal_stats");
    side.fpi_bytes += fpi.get::<_, f64>(0);
    m
}

/// Row 1 (and row 3 in the same large database).
/// Returns the row and the extension's version and layout in the large database.
async fn reserve_at_scale(server: &ScaleServer, admin: &Client, z: &Sizes, figures: &mut Vec<Figure>) -> (Row, String) {
    let (small_url, small_db) = database(server, admin, "idem_scale_small", z.version.as_deref()).await;
    fill(admin, &small_db, Records::Live, z.small).await;
    let (large_url, large_db) = database(server, admin, "idem_scale_large", z.version.as_deref()).await;
    let (inserted, vacuumed) = fill(admin, &large_db, Records::Live, z.large).await;
    let extversion: String = large_db.query_one("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'", &[]).await.expect("extversion").get(0);
    let extension = format!("{extversion} ({})", if Layout::of(&large_db).await == Layout::Compact { "the compact record" } else { "the text record" });
    figures.push(Figure::new(
        format!("fill: {} live records, one INSERT .. SELECT", human(z.large)),
        inserted,
        "s",
        format!("{:.0} rows/s under fsync off; then VACUUM ANALYZE {vacuumed:.1} s", z.large as f64 / inserted),
    ));
    figures.extend(bytes_per_record(&large_db, z.large).await);
    let load_before = load();
    let (mut small, mut large) = (Vec::new(), Vec::new());
    let (mut small_side, mut large_side) = (Side::default(), Side::default());
    for _ in 0..z.rounds {
        for small_first in [true, false, false, true] {
            if small_first {
                small.push(counted(&small_url, &small_db, z.run, &mut small_side).await);
            } else {
                large.push(counted(&large_url, &large_db, z.run, &mut large_side).await);
            }
        }
    }
    let (small, large) = (Measure::mean(&small), Measure::mean(&large));
    let per_op = |x: f64, m: &Measure| x / m.transactions.max(1) as f64;
    let (small_reads, large_reads) = (per_op(small_side.reads as f64, &small), per_op(large_side.reads as f64, &large));
    let row = Row {
        figure: format!("reserve (fresh script) at {} vs {} live records", human(z.large), human(z.small)),
        clients: CLIENTS.to_string(),
        baseline: format!("the same, {} live records", human(z.small)),
        base: small.clone(),
        ours: large.clone(),
        goal: Some(0.85),
        work: Some(format!("load {load_before} before, {} after", load())),
    };
    figures.push(
        Figure::new(
            format!("reserve tps at {} / at {} live records", human(z.large), human(z.small)),
            row.ratio(),
            "",
            format!(
                "{:.0} / {:.0} tps; p99 {:.2} / {:.2} ms; p50 {:.2} / {:.2} ms; WAL {:.0} / {:.0} B per transaction; blocks read into shared buffers {large_reads:.2} / {small_reads:.2} per transaction; {} x {} s runs per side, A/B/B/A; load {load_before}",
                large.tps, small.tps, large.p99_ms, small.p99_ms, large.p50_ms, small.p50_ms, large.wal_per_op(), small.wal_per_op(), 2 * z.rounds, z.run.as_secs()
            ),
        )
        .goal(Goal::AtLeast(0.85)),
    );
    figures.push(Figure::new(format!("reserve p99 at {} / at {} live records", human(z.large), human(z.small)), large.p99_ms / small.p99_ms, "", format!("{:.2} / {:.2} ms", large.p99_ms, small.p99_ms)));
    for (records, m, side) in [(z.large, &large, &large_side), (z.small, &small, &small_side)] {
        figures.push(Figure::new(
            format!("WAL per fresh transaction at {} live records", human(records)),
            m.wal_per_op(),
            "B",
            format!(
                "of which full-page images {:.1} B; blocks read into shared buffers {:.2} per transaction; {} transactions over {} runs since the fill's CHECKPOINT",
                per_op(side.fpi_bytes, m),
                per_op(side.reads as f64, m),
                m.transactions,
                2 * z.rounds
            ),
        ));
    }
    drop_database(admin, "idem_scale_small").await;
    drop_database(admin, "idem_scale_large").await;
    (row, extension)
}

/// Row 3: bytes per record of each relation of idem_records.
async fn bytes_per_record(db: &Client, rows: i64) -> Vec<Figure> {
    let relations = db
        .query(
            "SELECT 'heap' AS what, pg_relation_size('idem_records') AS bytes
             UNION ALL SELECT 'TOAST (table and index)', coalesce(pg_total_relation_size(NULLIF(reltoastrelid, 0)), 0) FROM pg_class WHERE oid = 'idem_records'::regclass
             UNION ALL (SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index WHERE indrelid = 'idem_records'::regclass ORDER BY 1)",
            &[],
        )
        .await
        .expect("relation sizes");
    let mut figures = Vec::new();
    let mut total = 0i64;
    for r in relations {
        let (what, bytes): (String, i64) = (r.get("what"), r.get("bytes"));
        total += bytes;
        figures.push(Figure::new(format!("bytes per record at {}: {what}", human(rows)), bytes as f64 / rows as f64, "B", format!("{:.1} MiB", bytes as f64 / 1048576.0)));
    }
    figures.push(Figure::new(format!("bytes per record at {}: all of the above", human(rows)), total as f64 / rows as f64, "B", format!("{:.1} MiB; main forks, right after fill and VACUUM ANALYZE", total as f64 / 1048576.0)));
    figures
}

/// What one probed batch did.
struct Probe {
    rows: i64,
    /// Shared buffers hit + read by the whole statement.
    buffers: i64,
    ms: f64,
    /// The scan under the candidate SELECT (`Seq Scan`, `Index Scan idem_records_expiry_idx`).
    scan: String,
}

/// One batch run as the sweep's own DELETE (sql/maintenance.sql, with `now()` for its `v_now`)
/// under `EXPLAIN (ANALYZE, BUFFERS)`: it deletes what a batch deletes, so it leaves the table and
/// the synchronized-scan position as a batch does (a read-only probe of the candidate SELECT moved
/// that position past the rows it read, and the sweep came back for them at the end of the drain,
/// through the emptied heap: the first two runs' last full batches). Not among the timed batches.
async fn probe(db: &Client) -> Probe {
    let layout = Layout::of(db).await;
    let (candidate, row) = (layout.candidate("x"), layout.sweepable("r"));
    let sql = format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
         DELETE FROM idem_records AS r
          WHERE r.ctid = ANY (ARRAY(
                    SELECT x.ctid FROM idem_records AS x
                     WHERE {candidate}
                     LIMIT {WORKER_BATCH}
                       FOR UPDATE OF x SKIP LOCKED))
            AND {row}"
    );
    let plan: serde_json::Value = db.query_one(&sql, &[]).await.expect("explain").get(0);
    let top = &plan[0];
    let node = &top["Plan"];
    let buffers = node["Shared Hit Blocks"].as_i64().unwrap_or(0) + node["Shared Read Blocks"].as_i64().unwrap_or(0);
    // The InitPlan (the candidate SELECT): Limit, LockRows, then the scan.
    let mut scan = &node["Plans"][0];
    let rows = scan["Actual Rows"].as_i64().unwrap_or(0);
    while let Some(child) = scan["Plans"].get(0) {
        scan = child;
    }
    let how = format!("{} {}", scan["Node Type"].as_str().unwrap_or("?"), scan["Index Name"].as_str().unwrap_or(""));
    Probe { rows, buffers, ms: top["Execution Time"].as_f64().unwrap_or(f64::NAN), scan: how.trim().to_owned() }
}

/// Checkpoints so far (timed and requested): pg_stat_checkpointer from PostgreSQL 17 on,
/// pg_stat_bgwriter before.
async fn checkpoints(db: &Client) -> i64 {
    let version: i32 = db.query_one("SELECT current_setting('server_version_num')::int", &[]).await.expect("server_version_num").get(0);
    let sql = if version >= 170000 {
        "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
    } else {
        "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
    };
    db.query_one(sql, &[]).await.expect("checkpoints").get(0)
}

/// The checkpointer's wait event (`CheckpointerMain` when idle between checkpoints) and the WAL
/// bytes written since `lsn`.
async fn checkpointer(db: &Client, lsn: &str) -> (String, f64) {
    let r = db
        .query_one(
            "SELECT coalesce((SELECT wait_event FROM pg_stat_activity WHERE backend_type = 'checkpointer'), 'none'),
                    pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8",
            &[&lsn],
        )
        .await
        .expect("checkpointer");
    (r.get(0), r.get(1))
}

async fn autovacuums(db: &Client) -> i64 {
    db.query_one("SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'idem_records'", &[]).await.expect("autovacuum_count").get(0)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Row 2: the sweep draining the backlog, every batch timed.
async fn sweep_backlog(server: &ScaleServer, admin: &Client, z: &Sizes, figures: &mut Vec<Figure>) {
    let (_, db) = database(server, admin, "idem_scale_sweep", z.version.as_deref()).await;
    let (inserted, _) = fill(admin, &db, Records::Expired, z.backlog).await;
    let full = (z.backlog / WORKER_BATCH) as usize;
    // Two of the full batches are probed (the first, and the first of the last decile of the
    // timed ones).
    // (None in a backlog of fewer than 20 batches: the smoke mode's.)
    let probing = full >= 20;
    let timed = full.saturating_sub(2);
    let last_decile_start = timed - timed / 10;
    let load_before = load();
    let autovacuums_before = autovacuums(&db).await;
    let mut probes = Vec::new();
    let mut batches: Vec<(f64, i64)> = Vec::new();
    let mut states: Vec<(String, f64)> = Vec::new();
    let checkpoints_before = checkpoints(&db).await;
    let lsn_before: String = db.query_one("SELECT pg_current_wal_lsn()::text", &[]).await.expect("lsn").get(0);
    let mut seconds = 0.0;
    loop {
        if probing && ((batches.is_empty() && probes.is_empty()) || (batches.len() == last_decile_start && probes.len() == 1)) {
            let p = probe(&db).await;
            let n = p.rows;
            probes.push(p);
            if n < WORKER_BATCH {
                break;
            }
            continue;
        }
        let t = Instant::now();
        let n: i64 = db.query_one("SELECT idem_sweep($1::int)", &[&(WORKER_BATCH as i32)]).await.expect("idem_sweep").get(0);
        let elapsed = t.elapsed().as_secs_f64();
        seconds += elapsed;
        batches.push((elapsed * 1000.0, n));
        // Not timed: what the checkpointer is doing right after the batch, and the WAL so far.
        states.push(checkpointer(&db, &lsn_before).await);
        if n < WORKER_BATCH {
            break;
        }
    }
    let checkpoints = checkpoints(&db).await - checkpoints_before;
    let wal = states.last().map(|s| s.1).unwrap_or(0.0);
    let autovacuums = autovacuums(&db).await - autovacuums_before;
    let deleted: i64 = batches.iter().map(|b| b.1).sum::<i64>() + probes.iter().map(|p| p.rows).sum::<i64>();
    let timed_rows: i64 = batches.iter().map(|b| b.1).sum();
    let times: Vec<f64> = batches.iter().filter(|b| b.1 == WORKER_BATCH).map(|b| b.0).collect();
    let decile = (times.len() / 10).max(1);
    let (first, last) = (mean(&times[..decile.min(times.len())]), mean(&times[times.len().saturating_sub(decile)..]));
    let slowest = times.iter().copied().fold(0.0, f64::max);
    let median = {
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
    };
    let slow: Vec<usize> = (0..batches.len()).filter(|&i| batches[i].0 > 3.0 * median).collect();
    let slow_in_checkpoint = slow.iter().filter(|&&i| states[i].0 != "CheckpointerMain").count();
    let mut csv = String::from("batch,ms,rows,checkpointer_after,wal_bytes_so_far\n");
    for (i, ((ms, n), (state, wal))) in batches.iter().zip(&states).enumerate() {
        let _ = writeln!(csv, "{i},{ms:.3},{n},{state},{wal:.0}");
    }
    std::fs::write(root().join("target/bench/scale-sweep.csv"), csv).expect("scale-sweep.csv");
    figures.push(Figure::new(
        format!("sweep: rows/s draining {} expired records", human(z.backlog)),
        timed_rows as f64 / seconds,
        "rows/s",
        format!(
            "{deleted} rows: {timed_rows} in {} timed batches of {WORKER_BATCH}, {seconds:.1} s, and {} in {} probed batches (fill {inserted:.0} s); WAL {:.0} B per row; {checkpoints} checkpoints and {autovacuums} autovacuums of idem_records meanwhile; load {load_before}",
            batches.len(),
            deleted - timed_rows,
            probes.len(),
            wal / deleted.max(1) as f64
        ),
    ));
    let probe_text = |p: Option<&Probe>| p.map(|p| format!("{} rows, {} buffer accesses, {:.1} ms ({})", p.rows, p.buffers, p.ms, p.scan)).unwrap_or_else(|| "—".into());
    figures.push(
        Figure::new(
            "sweep: mean batch time, last decile / first decile",
            last / first,
            "",
            format!(
                "{first:.1} ms first, {last:.1} ms last ({decile} full batches each), median {median:.1} ms, slowest {slowest:.1} ms; {} batches over 3x the median, {slow_in_checkpoint} of them ending while a checkpoint ran (batches {}); probed batches (the sweep's DELETE under EXPLAIN ANALYZE, BUFFERS): {} at the start, {} at the last decile",
                slow.len(),
                slow.iter().map(|i| format!("{i}: {:.0} ms", batches[*i].0)).collect::<Vec<_>>().join(", "),
                probe_text(probes.first()),
                probe_text(probes.get(1))
            ),
        )
        .goal(Goal::AtMost(1.5)),
    );
    drop_database(admin, "idem_scale_sweep").await;
}

async fn vacuums(db: &Client) -> i64 {
    db.query_one("SELECT vacuum_count + autovacuum_count FROM pg_stat_user_tables WHERE relname = 'idem_records'", &[]).await.expect("vacuum_count").get(0)
}

/// Lists `database` for the worker (None: no database, the worker idles) and reloads.
async fn set_worker(admin: &Client, database: Option<&str>) {
    let sql = match database {
        Some(d) => format!("ALTER SYSTEM SET idempotency.maintenance_databases = '{d}'"),
        None => "ALTER SYSTEM RESET idempotency.maintenance_databases".into(),
    };
    admin.batch_execute(&sql).await.expect("worker setting");
    admin.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
}

/// Polls `ready` every 100 ms for at most 2 minutes.
async fn until<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready().await {
        assert!(Instant::now() < deadline, "bench --scale: {what} not within 2 minutes");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until no maintenance worker has run for 3 s in a row (the pass running at the reload
/// finishes its batches first).
async fn worker_stopped(admin: &Client) {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut quiet_since = Instant::now();
    loop {
        if workers_running(admin).await > 0 {
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= Duration::from_secs(3) {
            return;
        }
        assert!(Instant::now() < deadline, "bench --scale: the maintenance worker still runs 5 minutes after its database was unlisted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn workers_running(admin: &Client) -> i64 {
    admin.query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency maintenance'", &[]).await.expect("pg_stat_activity").get(0)
}

/// Row 4: fresh-script p99 with the worker idle and while it drains a backlog: idle, draining,
/// draining, idle.
async fn worker_effect(server: &ScaleServer, admin: &Client, z: &Sizes, figures: &mut Vec<Figure>) {
    const NAME: &str = "idem_scale_worker";
    let (url, db) = database(server, admin, NAME, z.version.as_deref()).await;
    fill(admin, &db, Records::Expired, z.worker_backlog).await;
    let load_before = load();
    let swept_at_start = counter(&db, "swept").await;
    let mut idle = vec![fresh(&url, z.run)];
    set_worker(admin, Some(NAME)).await;
    let db_ref = &db;
    until("the worker's first sweep", || async move { counter(db_ref, "swept").await > swept_at_start }).await;
    let (swept_before, vacuums_before, started) = (counter(&db, "swept").await, vacuums(&db).await, Instant::now());
    let draining = vec![fresh(&url, z.run), fresh(&url, z.run)];
    let (swept_after, vacuums_after, seconds) = (counter(&db, "swept").await, vacuums(&db).await, started.elapsed().as_secs_f64());
    set_worker(admin, None).await;
    worker_stopped(admin).await;
    let swept_while_draining = swept_after - swept_before;
    let swept_total = counter(&db, "swept").await - swept_at_start;
    idle.push(fresh(&url, z.run));
    let (idle, draining) = (Measure::mean(&idle), Measure::mean(&draining));
    let lasted = swept_after - swept_at_start < z.worker_backlog;
    figures.push(
        Figure::new(
            format!("worker: fresh p99 while it drains a {} backlog / idle", human(z.worker_backlog)),
            draining.p99_ms / idle.p99_ms,
            "",
            format!(
                "p99 {:.2} ms draining, {:.2} ms idle; tps {:.0} / {:.0}; p50 {:.2} / {:.2} ms; idle, draining, draining, idle, {} s runs; load {load_before}",
                draining.p99_ms, idle.p99_ms, draining.tps, idle.tps, draining.p50_ms, idle.p50_ms, z.run.as_secs()
            ),
        ),
    );
    figures.push(Figure::new(
        "worker: rows/s swept during the draining runs",
        swept_while_draining as f64 / seconds,
        "rows/s",
        format!(
            "{swept_while_draining} rows in {seconds:.1} s, {} VACUUMs of idem_records meanwhile; {} of the backlog swept by the end of the draining runs, {swept_total} by the time it stopped ({})",
            vacuums_after - vacuums_before,
            swept_after - swept_at_start,
            if lasted { "the backlog lasted through both runs" } else { "THE BACKLOG RAN OUT during the draining runs" }
        ),
    ));
    drop_database(admin, NAME).await;
}

/// The relfilenode and main-fork size of idem_records.
async fn storage(db: &Client) -> (u32, i64) {
    let r = db.query_one("SELECT relfilenode, pg_relation_size(oid) FROM pg_class WHERE oid = 'idem_records'::regclass", &[]).await.expect("relfilenode");
    (r.get::<_, tokio_postgres::types::Oid>(0), r.get(1))
}

/// Row 5: `ALTER EXTENSION idempotency UPDATE` from 0.5.0 over a filled table.
async fn upgrade_cost(server: &ScaleServer, admin: &Client, z: &Sizes, figures: &mut Vec<Figure>) {
    const NAME: &str = "idem_scale_upgrade";
    let (_, db) = database(server, admin, NAME, Some("0.5.0")).await;
    let (inserted, _) = fill(admin, &db, Records::Live, z.upgrade).await;
    let (node_before, size_before) = storage(&db).await;
    let load_before = load();
    db.batch_execute("BEGIN").await.expect("begin");
    let started = Instant::now();
    db.batch_execute("ALTER EXTENSION idempotency UPDATE").await.expect("ALTER EXTENSION idempotency UPDATE");
    let statement = started.elapsed().as_secs_f64() * 1000.0;
    let locks: Vec<String> = db
        .query("SELECT mode FROM pg_locks WHERE locktype = 'relation' AND relation = 'idem_records'::regclass AND pid = pg_backend_pid() AND granted ORDER BY mode", &[])
        .await
        .expect("pg_locks")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let started = Instant::now();
    db.batch_execute("COMMIT").await.expect("commit");
    let commit = started.elapsed().as_secs_f64() * 1000.0;
    let version: String = db.query_one("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'", &[]).await.expect("extversion").get(0);
    let (node_after, size_after) = storage(&db).await;
    figures.push(Figure::new(
        format!("upgrade 0.5.0 -> {version} over {} records: ALTER EXTENSION UPDATE", human(z.upgrade)),
        statement + commit,
        "ms",
        format!(
            "statement {statement:.0} ms + commit {commit:.0} ms; table {} (relfilenode {node_before} -> {node_after}, {:.0} -> {:.0} MiB); locks held on idem_records until commit: {}; fill {inserted:.0} s; load {load_before}",
            if node_before == node_after { "not rewritten" } else { "REWRITTEN" },
            size_before as f64 / 1048576.0,
            size_after as f64 / 1048576.0,
            if locks.is_empty() { "none".to_owned() } else { locks.join(", ") }
        ),
    ));
    drop_database(admin, NAME).await;
}

/// One transaction of a pgbench per-transaction log: when it started and ended (µs since the
/// epoch) and its latency (µs).
struct Logged {
    start_us: u64,
    end_us: u64,
    latency_us: u64,
}

/// Every transaction in the pgbench logs under `dir` (its subdirectories too): lines of
/// `client_id transaction_no time script_no time_epoch time_us`.
fn logged(dir: &std::path::Path) -> Vec<Logged> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(logged(&path));
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
            let f: Vec<u64> = line.split_whitespace().filter_map(|v| v.parse().ok()).collect();
            if let [_, _, latency_us, _, epoch, us, ..] = f[..] {
                let end_us = epoch * 1_000_000 + us;
                out.push(Logged { start_us: end_us.saturating_sub(latency_us), end_us, latency_us });
            }
        }
    }
    out
}

fn epoch_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_micros() as u64
}

/// The longest transaction among `txs` that overlapped `[from, to]` (µs since the epoch), in ms,
/// and how many overlapped.
fn longest(txs: &[Logged], from: u64, to: u64) -> (f64, usize) {
    let overlapping: Vec<&Logged> = txs.iter().filter(|t| t.start_us <= to && t.end_us >= from).collect();
    (overlapping.iter().map(|t| t.latency_us).max().unwrap_or(0) as f64 / 1000.0, overlapping.len())
}

/// Row 6: the update from 0.6.0 over a filled table under the `fresh` load (issue 43, item 5):
/// the `fresh` script (8 clients) runs in back-to-back 10 s pgbench runs, each logging every
/// transaction, from 10 s before `ALTER EXTENSION idempotency UPDATE` until 10 s after the
/// maintenance worker (listed for the database when the update has committed) has moved every
/// record kept in idem_records_060 into the compact table and dropped the old one. Reports the
/// update's duration and WAL, the move's duration, rows/s and WAL, and the longest `fresh`
/// transaction that overlapped the update, the move, and the 10 s before (each transaction's
/// latency bounds how long its `idem_reserve` waited for a lock).
async fn online_update(server: &ScaleServer, admin: &Client, z: &Sizes, figures: &mut Vec<Figure>) {
    const NAME: &str = "idem_scale_update";
    const CHUNK: Duration = Duration::from_secs(10);
    let (url, db) = database(server, admin, NAME, Some("0.6.0")).await;
    let (inserted, _) = fill(admin, &db, Records::Live, z.upgrade).await;
    let lsn = || async { db.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).await.expect("lsn").get::<_, String>(0) };
    let wal_since = |from: String| {
        let db = &db;
        async move { db.query_one("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::text::pg_lsn)::float8", &[&from]).await.expect("wal").get::<_, f64>(0) }
    };
    let logs = root().join("target/bench/scale-update-logs");
    let _ = std::fs::remove_dir_all(&logs);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load_thread = {
        let (stop, logs, url) = (stop.clone(), logs.clone(), url.clone());
        std::thread::spawn(move || {
            let mut runs = Vec::new();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                runs.push(pgbench::run(&pg_bin("pgbench"), &url, &script("fresh"), CLIENTS, CHUNK, &logs.join(format!("run{i:03}"))));
                i += 1;
            }
            runs
        })
    };
    let load_before = load();
    let load_started = epoch_us();
    tokio::time::sleep(CHUNK).await;
    let before_update = lsn().await;
    let update_started = epoch_us();
    db.batch_execute("ALTER EXTENSION idempotency UPDATE").await.expect("ALTER EXTENSION idempotency UPDATE");
    let update_ended = epoch_us();
    let update_wal = wal_since(before_update).await;
    let version: String = db.query_one("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'", &[]).await.expect("extversion").get(0);
    // The records set aside for the move (none when the update moved them itself).
    let aside: bool = db.query_one("SELECT to_regclass('idem_records_060') IS NOT NULL", &[]).await.expect("to_regclass").get(0);
    let kept: i64 = if aside { db.query_one("SELECT count(*) FROM idem_records_060", &[]).await.expect("idem_records_060 after the update").get(0) } else { 0 };
    let load_during_update = load();
    let before_move = lsn().await;
    let move_started = epoch_us();
    set_worker(admin, Some(NAME)).await;
    let db_ref = &db;
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let gone: bool = db_ref.query_one("SELECT to_regclass('idem_records_060') IS NULL", &[]).await.expect("to_regclass").get(0);
        if gone {
            break;
        }
        assert!(Instant::now() < deadline, "bench --scale: idem_records_060 still there an hour after the worker started moving it");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let move_ended = epoch_us();
    let move_wal = wal_since(before_move).await;
    let load_during_move = load();
    set_worker(admin, None).await;
    worker_stopped(admin).await;
    tokio::time::sleep(CHUNK).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let runs = load_thread.join().expect("the load's thread");
    let records: i64 = db.query_one("SELECT count(*) FROM idem_records", &[]).await.expect("count").get(0);
    let txs = logged(&logs);
    let (before_ms, before_n) = longest(&txs, load_started, update_started);
    let (update_ms, update_n) = longest(&txs, update_started, update_ended);
    let (move_ms, move_n) = longest(&txs, move_started, move_ended);
    let update_s = (update_ended - update_started) as f64 / 1e6;
    let move_s = (move_ended - move_started) as f64 / 1e6;
    let tps = Measure::mean(&runs).tps;
    figures.push(
        Figure::new(
            format!("update 0.6.0 -> {version} over {} records under the fresh load: the longest fresh transaction during ALTER EXTENSION UPDATE", human(z.upgrade)),
            update_ms / 1000.0,
            "s",
            format!(
                "{update_n} transactions overlapped the update ({update_s:.3} s, {update_wal:.0} B of WAL; {kept} records kept in idem_records_060); the longest in the 10 s before: {before_ms:.1} ms ({before_n} transactions); fresh {} clients, {} runs of {} s back to back, {tps:.0} tps on average; fill {inserted:.0} s; load {load_before} before, {load_during_update} after the update",
                CLIENTS,
                runs.len(),
                CHUNK.as_secs()
            ),
        )
        .goal(Goal::AtMost(1.0)),
    );
    figures.push(
        Figure::new("update: the longest fresh transaction during the worker's move", move_ms / 1000.0, "s", format!("{move_n} transactions overlapped the move"))
            .goal(Goal::AtMost(1.0)),
    );
    figures.push(Figure::new(
        format!("update: the worker's move of {} records kept from 0.6.0", human(kept)),
        kept as f64 / move_s,
        "rows/s",
        format!(
            "{move_s:.1} s from listing the database for the worker until idem_records_060 was dropped; {:.1} B of WAL per row moved (the fresh load's included); {records} records in idem_records after; load {load_during_move} at its end",
            move_wal / kept.max(1) as f64
        ),
    ));
    drop_database(admin, NAME).await;
}

/// Runs the section (see the module docs) on its own server.
pub(crate) async fn run(smoke: bool) -> Report {
    let z = Sizes::new(smoke);
    std::fs::create_dir_all(root().join("target/bench")).expect("target/bench");
    let server = ScaleServer::start();
    let admin = connect(&server.url("postgres")).await;
    let version: String = admin.query_one("SHOW server_version", &[]).await.expect("server_version").get(0);
    let mut figures = Vec::new();
    let (reserve, extension) = if z.runs("reserve") {
        let (row, extension) = reserve_at_scale(&server, &admin, &z, &mut figures).await;
        (Some(row), extension)
    } else {
        (None, "(row 1 left out)".to_owned())
    };
    if z.runs("sweep") {
        sweep_backlog(&server, &admin, &z, &mut figures).await;
    }
    if z.runs("worker") {
        worker_effect(&server, &admin, &z, &mut figures).await;
    }
    if z.runs("upgrade") {
        upgrade_cost(&server, &admin, &z, &mut figures).await;
    }
    if z.runs("update") {
        online_update(&server, &admin, &z, &mut figures).await;
    }
    let fsync: String = admin.query_one("SHOW fsync", &[]).await.expect("fsync").get(0);
    let checksums: String = admin.query_one("SHOW data_checksums", &[]).await.expect("data_checksums").get(0);
    let header = format!(
        "bench --scale — PostgreSQL {version} on port {}, shared_buffers 256MB, fsync {fsync} (off only while filling), data checksums {checksums}, {} records, extension {}{}",
        server.port,
        human(z.large),
        extension,
        if z.smoke { " (SMOKE: numbers are not meaningful)" } else { "" }
    );
    drop(admin);
    drop(server);
    Report { reserve, figures, run: z.run, reps: 2 * z.rounds, header }
}
