//! Layer citus: a coordinator and two workers of the major on loopback (ports 30-32 above the
//! private cluster's), idem_records and idem_retries distributed by user_id and co-located with
//! a business table. Runs when Citus is installed in the major (its citus.control), otherwise
//! reported as skipped.
//!
//!   setup       CREATE EXTENSION idempotency on the coordinator reaches the workers;
//!               idem_distribute('charges'): both tables co-located with charges, the API delegated
//!   flow        BEGIN; reserve; business INSERT; complete; COMMIT through the coordinator is one
//!               single-node transaction (no two-phase commit, one worker); replay, mismatch,
//!               in_progress without blocking while the holder is open, release and retry
//!   duplicates  clients hammer a set of keys through the coordinator: exactly one business row
//!               and one SUCCESS record per executed key, no PROCESSING left
//!   tokens      tokens issued on both workers are unique; a stale token never completes
//!   maintenance idem_recover_stuck (fail and release) and idem_sweep across shards, in
//!               batches; the maintenance worker preloaded on the coordinator does both
//!   move        a shard move under load loses no record and no business row

use crate::ctx::Ctx;
use crate::psql::Psql;
use crate::report::{ensure, eq, Checks};
use idempotency_pgserver::{Server, Stop};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DUP_PGBENCH: &str = r#"\set u random(1, 8)
\set k random(1, 5)
BEGIN;
SELECT (r.outcome = 'created')::int AS created, coalesce(r.token, 0) AS token,
       CASE WHEN r.outcome NOT IN ('created', 'replay', 'in_progress')
            THEN ('unexpected ' || r.outcome)::int END AS unexpected
  FROM idem_reserve('dup', 'd-:u', 'k-:k', 'h') AS r \gset
\if :created
INSERT INTO charges (user_id, key, amount) VALUES ('d-:u', 'dup-:k', 1);
SELECT pg_sleep(0.01);
SELECT CASE WHEN NOT c.ok THEN ('complete refused its token: ' || c.ok::text)::int END AS stale
  FROM idem_complete('dup', 'd-:u', 'k-:k', :token, '{"status": 201}') AS c(ok) \gset
\endif
END;
"#;

const MOVE_PGBENCH: &str = r#"\set u random(1, 6)
\set k random(1, 400)
BEGIN;
SELECT (r.outcome = 'created')::int AS created, coalesce(r.token, 0) AS token
  FROM idem_reserve('move', 'm-:u', 'k-:k', 'h') AS r \gset
\if :created
INSERT INTO charges (user_id, key, amount) VALUES ('m-:u', 'move-:k', 1);
SELECT c.ok FROM idem_complete('move', 'm-:u', 'k-:k', :token, '{"status": 201}') AS c(ok);
\endif
END;
"#;

fn settings(preload: &str) -> String {
    format!(
        "shared_preload_libraries = '{preload}'
max_connections = 200
max_prepared_transactions = 100
max_worker_processes = 32
wal_level = logical
max_replication_slots = 10
max_wal_senders = 10
citus.node_conninfo = 'sslmode=disable'
citus.shard_count = 8
idempotency.maintenance_databases = 'postgres'
idempotency.maintenance_interval = 0
"
    )
}

fn sleep(secs: f64) {
    std::thread::sleep(Duration::from_secs_f64(secs));
}

/// The nodes and how to reach them.
struct Citus {
    work: PathBuf,
    c: Psql,
    w1: Psql,
    w2: Psql,
    bindir: PathBuf,
}

impl Citus {
    /// psql in the background: `args` then the script `stdin`, output into `work/NAME.log`.
    fn background(&self, name: &str, args: &[&str], stdin: Option<&str>) -> Child {
        let out = std::fs::File::create(self.work.join(format!("{name}.log"))).expect("create a session log");
        let mut cmd = Command::new(self.bindir.join("psql"));
        cmd.args(["-X", "-q", "-At", "-h", "127.0.0.1", "-p", &self.c.port().to_string(), "-U", "postgres", "-d", "postgres"])
            .args(args)
            .stdout(out.try_clone().expect("clone"))
            .stderr(out)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = cmd.spawn().expect("start psql");
        if let Some(sql) = stdin {
            use std::io::Write;
            child.stdin.take().expect("stdin").write_all(sql.as_bytes()).expect("write to psql");
        }
        child
    }

    fn session_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.work.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// A pgbench run of `script` through the coordinator.
    fn pgbench(&self, name: &str, script: &str, args: &[&str]) -> Child {
        let file = self.work.join(format!("{name}.pgbench"));
        std::fs::write(&file, script).expect("write the pgbench script");
        let out = std::fs::File::create(self.work.join(format!("{name}.log"))).expect("create the pgbench log");
        Command::new(self.bindir.join("pgbench"))
            .args(["-n", "-M", "simple", "-h", "127.0.0.1", "-p", &self.c.port().to_string(), "-U", "postgres"])
            .args(args)
            .arg("-f")
            .arg(&file)
            .arg("postgres")
            .stdout(out.try_clone().expect("clone"))
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("start pgbench")
    }

    /// Waits (at most 10 s) until a session runs a query starting with `prefix`.
    fn until_active(&self, prefix: &str) {
        let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '{prefix}%' AND state = 'active'");
        let _ = self.c.until_equal(10, &sql, "1");
    }

    /// The port of the worker that holds `user`'s shard of idem_records.
    fn node_of(&self, user: &str) -> String {
        self.c.run(&format!(
            "SELECT n.nodeport FROM pg_dist_placement AS p JOIN pg_dist_node AS n ON n.groupid = p.groupid
              WHERE p.shardid = get_shard_id_for_distribution_column('idem_records', '{user}')"
        ))
    }
}

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let control = ctx.extdir().join("citus.control");
    if !control.is_file() {
        checks.skip(&format!("Citus is not installed in {}", ctx.extdir().display()));
        return;
    }
    let base = ctx.port + 30;
    let (cp, p1, p2) = (base, base + 1, base + 2);
    let work = idempotency_pgserver::root().join(format!("target/citus/pg{}", ctx.major));
    std::fs::create_dir_all(&work).expect("create target/citus");
    checks.note(&format!("== Citus on {}: coordinator {cp}, workers {p1} and {p2}", ctx.value("--version")));

    // The coordinator also preloads idempotency: its maintenance worker (off until the test
    // turns it on).
    let mut nodes = Vec::new();
    for (name, port, preload) in [("coordinator", cp, "citus,idempotency"), ("worker1", p1, "citus"), ("worker2", p2, "citus")] {
        let server = Server::new(&format!("citus-{name}-{}", ctx.major), &ctx.config, port);
        server.initdb(&[]);
        server.configure(&settings(preload));
        server.start();
        nodes.push(server);
    }
    let k = Citus { work: work.clone(), c: ctx.psql(cp), w1: ctx.psql(p1), w2: ctx.psql(p2), bindir: PathBuf::from(ctx.value("--bindir")) };
    for p in [&k.c, &k.w1, &k.w2] {
        p.run("CREATE EXTENSION citus");
    }
    setup(checks, &k, cp, p1, p2);
    let (u1, u2) = (user_on(&k, p1), user_on(&k, p2));
    checks.note(&format!("users {u1} (worker {p1}) and {u2} (worker {p2})"));
    flow(checks, &k, &u1, &u2, p1, p2);
    duplicates(checks, &k);
    tokens(checks, &k, &u1);
    maintenance(checks, &k, &u1, &nodes[0]);
    shard_move(checks, &k);
    for n in &nodes {
        n.stop(Stop::Fast);
    }
}

/// A user id whose shard is on the worker at `port`.
fn user_on(k: &Citus, port: u16) -> String {
    (1..=64).map(|i| format!("u-{i}")).find(|u| k.node_of(u) == port.to_string()).unwrap_or_else(|| panic!("no user of u-1..u-64 on worker {port}"))
}

fn setup(checks: &mut Checks, k: &Citus, cp: u16, p1: u16, p2: u16) {
    let c = &k.c;
    checks.note(&c.run("SELECT citus_version()"));
    c.run(&format!("SELECT citus_set_coordinator_host('127.0.0.1', {cp})"));
    c.run(&format!("SELECT citus_add_node('127.0.0.1', {p1})"));
    c.run(&format!("SELECT citus_add_node('127.0.0.1', {p2})"));
    checks.check("two workers are active", eq(c.run("SELECT count(*) FROM citus_get_active_worker_nodes()"), "2"));

    // The previous release first, then the update: both reach the workers through the coordinator.
    let versions = crate::sh::versions();
    let current = versions.last().expect("a version").clone();
    let previous = versions.len().checked_sub(2).map_or(current.clone(), |i| versions[i].clone());
    let versions_on = || {
        [&k.c, &k.w1, &k.w2]
            .iter()
            .map(|p| p.q("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").unwrap_or_else(|e| e) + " ")
            .collect::<String>()
    };
    c.run(&format!("CREATE EXTENSION idempotency VERSION '{previous}'"));
    checks.check(
        &format!("CREATE EXTENSION idempotency VERSION '{previous}' on the coordinator reaches both workers"),
        eq(versions_on(), format!("{previous} {previous} {previous} ")),
    );
    c.run("ALTER EXTENSION idempotency UPDATE");
    checks.check(
        &format!("ALTER EXTENSION idempotency UPDATE on the coordinator updates both workers to {current}"),
        eq(versions_on(), format!("{current} {current} {current} ")),
    );
    // The business table, distributed by its user_id first; then the records join it.
    c.run("CREATE TABLE charges (user_id text NOT NULL, id bigserial, key text NOT NULL, amount integer NOT NULL, PRIMARY KEY (user_id, id))");
    c.run("SELECT create_distributed_table('charges', 'user_id')");
    // A session that used the API before the distribution (its native catalog cached: a local
    // table) keeps answering right afterwards, in its own backend.
    let mut early = k.background(
        "early",
        &[],
        Some(
            "SELECT idem_complete('early', 'e-1', 'k', (idem_reserve('early', 'e-1', 'k', 'h')).token, '{\"early\": 1}');
SELECT 'waiting for the distribution' /* early */;
DO $$ BEGIN FOR i IN 1..600 LOOP EXIT WHEN _idem_distributed(); PERFORM pg_sleep(0.1); END LOOP; END $$;
SELECT (x).outcome || ' ' || (x).response::text FROM (SELECT idem_reserve('early', 'e-1', 'k', 'h') AS x OFFSET 0) AS s;
SELECT (idem_reserve('early', 'e-1', 'k2', 'h')).outcome;
",
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !k.session_log("early").lines().any(|l| l.starts_with("waiting")) && Instant::now() < deadline {
        sleep(0.1);
    }
    checks.check("idem_distribute('charges') runs", c.q("SET client_min_messages = warning; SELECT idem_distribute('charges')").map(drop));
    let _ = early.wait();
    let last2: Vec<String> = k.session_log("early").lines().rev().take(2).map(|l| format!("{l}|")).collect();
    checks.check(
        "a session that cached the local table before the distribution replays the moved record, then creates",
        eq(last2.into_iter().rev().collect::<String>(), "replay {\"early\": 1}|created|"),
    );
    checks.check(
        "idem_records and idem_retries are distributed by user_id, co-located with charges",
        eq(
            c.run(
                "SELECT string_agg(logicalrelid::text || ':' || column_to_column_name(logicalrelid, partkey), ' ' ORDER BY logicalrelid::text)
                        || ' ' || count(DISTINCT colocationid)
                   FROM pg_dist_partition WHERE logicalrelid IN ('charges'::regclass, 'idem_records'::regclass, 'idem_retries'::regclass)",
            ),
            "charges:user_id idem_records:user_id idem_retries:user_id 1",
        ),
    );
    checks.check(
        "idem_reserve, idem_complete, idem_release, idem_heartbeat, idem_lookup and the batch functions are delegated by user_id with force_delegation",
        eq(
            c.run(
                "SELECT string_agg(p.proname || ':' || o.distribution_argument_index || ':' || o.force_delegation, ' ' ORDER BY p.proname)
                   FROM pg_dist_object AS o JOIN pg_proc AS p ON o.classid = 'pg_proc'::regclass AND o.objid = p.oid
                  WHERE p.proname LIKE 'idem\\_%'",
            ),
            "idem_complete:1:true idem_complete_many:1:true idem_heartbeat:1:true idem_lookup:1:true idem_release:1:true idem_reserve:1:true idem_reserve_many:1:true",
        ),
    );
    checks.check("idem_distribute is idempotent (a second call changes nothing)", c.q("SELECT idem_distribute('charges')").map(drop));
    checks.check(
        "the workers see idem_records as distributed (Citus metadata synced)",
        eq(k.w1.run("SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 'idem_records'::regclass"), "1"),
    );
}

/// The remote servers' ports (`on server USER@HOST:PORT`, on a NOTICE line or the DETAIL line
/// after it) a log of `citus.log_remote_commands` names; with `only_prepare`, those of the
/// `PREPARE TRANSACTION` commands only.
fn servers_in(text: &str, only_prepare: bool) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut ports: Vec<String> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let considered: Vec<&str> = if !only_prepare {
            vec![line]
        } else if line.contains("PREPARE TRANSACTION") {
            lines[i..(i + 2).min(lines.len())].to_vec()
        } else {
            vec![]
        };
        for l in considered {
            let port = l.split_once("on server ").and_then(|(_, rest)| rest.split_whitespace().next()).and_then(|hp| hp.rsplit_once(':')).map(|(_, p)| p);
            if let Some(port) = port.filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
                if !ports.iter().any(|p| p == port) {
                    ports.push(port.to_owned());
                }
            }
        }
    }
    ports.sort();
    ports.iter().map(|p| format!("{p} ")).collect()
}

fn flow(checks: &mut Checks, k: &Citus, u1: &str, u2: &str, p1: u16, p2: u16) {
    let c = &k.c;
    checks.note("-- flow: in-transaction through the coordinator, delegated");
    let flow_log = run_with_notices(
        k,
        &format!(
            "SET citus.log_remote_commands = on;
SET client_min_messages = notice;
BEGIN;
SELECT outcome, token FROM idem_reserve('pay', '{u1}', 'k-1', 'h1') \\gset
INSERT INTO charges (user_id, key, amount) VALUES ('{u1}', 'k-1', 100);
SELECT ok AS completed FROM idem_complete('pay', '{u1}', 'k-1', :token, '{{\"status\": 201}}') AS c(ok) \\gset
COMMIT;
\\echo RESULT :outcome :completed
"
        ),
    );
    std::fs::write(k.work.join("flow.log"), &flow_log).expect("write flow.log");
    checks.check("created, then completed, in one transaction", ensure(flow_log.lines().any(|l| l == "RESULT created t"), crate::sh::tail(&flow_log, 10)));
    checks.check("no two-phase commit: the transaction committed on one node", eq(flow_log.matches("PREPARE TRANSACTION").count().to_string(), "0"));
    checks.check(&format!("every statement ran on the worker of the user's shard ({p1})"), eq(servers_in(&flow_log, false), format!("{p1} ")));
    checks.check(
        "the reserve ran there as a delegated call",
        ensure(flow_log.lines().any(|l| l.contains("issuing SELECT ") && l.contains("idem_reserve")), "no `issuing SELECT ... idem_reserve` line"),
    );
    let rshard = c.run(&format!("SELECT get_shard_id_for_distribution_column('idem_records', '{u1}')"));
    let cshard = c.run(&format!("SELECT get_shard_id_for_distribution_column('charges', '{u1}')"));
    checks.check(
        "the record and the business row are in that worker's shards",
        eq(
            format!(
                "{}|{}",
                k.w1.q(&format!("SELECT status FROM idem_records_{rshard} WHERE user_id = '{u1}' AND key = 'k-1'")).unwrap_or_else(|e| e),
                k.w1.q(&format!("SELECT count(*) FROM charges_{cshard} WHERE user_id = '{u1}' AND key = 'k-1'")).unwrap_or_else(|e| e)
            ),
            "SUCCESS|1",
        ),
    );
    let q = |sql: &str| c.q(sql).unwrap_or_else(|e| e);
    checks.check("a retry through the coordinator replays the stored response", eq(q(&format!("SELECT outcome || ' ' || response::text FROM idem_reserve('pay', '{u1}', 'k-1', 'h1')")), "replay {\"status\": 201}"));
    checks.check("the same key with another request is a mismatch", eq(q(&format!("SELECT outcome FROM idem_reserve('pay', '{u1}', 'k-1', 'other')")), "mismatch"));
    checks.check("keys are scoped per user: the other user's same key is new", eq(q(&format!("SELECT outcome FROM idem_reserve('pay', '{u2}', 'k-1', 'h1')")), "created"));
    checks.check("one business row", eq(q(&format!("SELECT count(*) FROM charges WHERE user_id = '{u1}' AND key = 'k-1'")), "1"));

    // A holder with an open transaction: a duplicate answers in_progress at once.
    let reserve = format!("SELECT outcome FROM idem_reserve('pay', '{u2}', 'k-open', 'h')");
    let mut holder = k.background("holder", &["-c", "BEGIN", "-c", &reserve, "-c", "SELECT pg_sleep(4) /* holder */", "-c", "COMMIT"], None);
    k.until_active("SELECT pg_sleep(4) /* holder */");
    checks.check(
        "a concurrent duplicate through the coordinator answers in_progress without blocking",
        eq(q(&format!("SET statement_timeout = '5s'; SELECT outcome FROM idem_reserve('pay', '{u2}', 'k-open', 'h')")), "in_progress"),
    );
    checks.check(
        "and so does one sent to the worker directly (the lock is on the shard's node)",
        eq(k.w2.q(&format!("SET statement_timeout = '5s'; SELECT outcome FROM idem_reserve('pay', '{u2}', 'k-open', 'h')")).unwrap_or_else(|e| e), "in_progress"),
    );
    let _ = holder.wait();
    checks.check("the holder committed its reservation", eq(q(&format!("SELECT status FROM idem_lookup('pay', '{u2}', 'k-open')")), "PROCESSING"));

    // Without delegation the advisory lock is per node: a delegated duplicate waits on the
    // holder's uncommitted row and answers in_progress once it commits (the wait is printed).
    let nested = format!("SELECT (idem_reserve('pay', '{u2}', 'k-nodeleg', 'h')).outcome");
    let mut holder = k.background("nodeleg", &["-c", "BEGIN", "-c", &nested, "-c", "SELECT pg_sleep(2) /* nodeleg */", "-c", "COMMIT"], None);
    k.until_active("SELECT pg_sleep(2) /* nodeleg */");
    let started = Instant::now();
    let dup = q(&format!("SET statement_timeout = '20s'; SELECT outcome FROM idem_reserve('pay', '{u2}', 'k-nodeleg', 'h')"));
    let waited = started.elapsed().as_secs_f64();
    let _ = holder.wait();
    let first = k.session_log("nodeleg").lines().next().unwrap_or_default().to_owned();
    checks.check("a holder on the coordinator (not delegated): a delegated duplicate answers in_progress, never created", eq(format!("{first}|{dup}"), "created|in_progress"));
    checks.note(&format!("the duplicate waited {waited:.1} s for the holder's commit (the holder slept 2 s; with delegation it answers at once)"));

    // A transaction for users on two workers: two-phase commit on both.
    let multi = run_with_notices(
        k,
        &format!(
            "SET citus.log_remote_commands = on;
BEGIN;
SELECT outcome FROM idem_reserve('pay', '{u1}', 'k-multi', 'h');
SELECT outcome FROM idem_reserve('pay', '{u2}', 'k-multi', 'h');
COMMIT;
"
        ),
    );
    std::fs::write(k.work.join("multi.log"), &multi).expect("write multi.log");
    checks.check("a transaction spanning users on two workers commits by two-phase commit on both", eq(servers_in(&multi, true), format!("{p1} {p2} ")));

    checks.check(
        "release after a transient failure, then the retry runs again with attempts 1",
        eq(
            format!(
                "{}|{}",
                q(&format!("SELECT idem_release('pay', '{u2}', 'k-rel', token) FROM idem_reserve('pay', '{u2}', 'k-rel', 'h')")),
                q(&format!("SELECT outcome || ' ' || attempts FROM idem_reserve('pay', '{u2}', 'k-rel', 'h')"))
            ),
            "released|created 1",
        ),
    );
    checks.check(
        "heartbeat through the coordinator extends the lease of the right token only",
        eq(
            format!(
                "{}|{}",
                q(&format!("SELECT idem_heartbeat('pay', '{u2}', 'k-rel', token, '1 hour') FROM idem_lookup('pay', '{u2}', 'k-rel')")),
                q(&format!("SELECT idem_heartbeat('pay', '{u2}', 'k-rel', 1)"))
            ),
            "t|f",
        ),
    );
    checks.check(
        "idem_stats counts the PROCESSING records of every shard exactly",
        eq(q("SELECT processing FROM idem_stats()"), q("SELECT count(*) FROM idem_records WHERE status = 'PROCESSING'")),
    );
}

/// Runs `script` through the coordinator with psql's stdout and stderr (the NOTICEs of
/// citus.log_remote_commands) together.
fn run_with_notices(k: &Citus, script: &str) -> String {
    let mut child = Command::new(k.bindir.join("psql"))
        .args(["-X", "-v", "ON_ERROR_STOP=1", "-At", "-h", "127.0.0.1", "-p", &k.c.port().to_string(), "-U", "postgres", "-d", "postgres"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start psql");
    {
        use std::io::Write;
        child.stdin.take().expect("stdin").write_all(script.as_bytes()).expect("write to psql");
    }
    let out = child.wait_with_output().expect("psql");
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn duplicates(checks: &mut Checks, k: &Citus) {
    let c = &k.c;
    checks.note("-- duplicates: 12 clients, 40 keys of 8 users, through the coordinator");
    let mut bench = k.pgbench("dup", DUP_PGBENCH, &["-c", "12", "-j", "4", "-t", "40"]);
    let _ = bench.wait();
    let log = k.session_log("dup");
    checks.check("every client transaction succeeded (no error, no unexpected outcome)", ensure(log.contains("processed: 480/480"), crate::sh::tail(&log, 10)));
    checks.note(&log.lines().filter(|l| l.contains("processed") || l.contains("failed") || l.contains("tps")).collect::<Vec<_>>().join(";"));
    checks.check(
        "exactly one business row per executed key, and every executed key is SUCCESS",
        eq(
            format!(
                "{}|{}",
                c.run("SELECT count(*) FILTER (WHERE n <> 1) || ' ' || count(*) FROM (SELECT user_id, key, count(*) AS n FROM charges WHERE key LIKE 'dup-%' GROUP BY 1, 2) AS c"),
                c.run("SELECT count(*) FROM idem_records WHERE operation = 'dup' AND status = 'SUCCESS'")
            ),
            "0 40|40",
        ),
    );
    checks.check("no reservation left PROCESSING", eq(c.run("SELECT count(*) FROM idem_records WHERE operation = 'dup' AND status <> 'SUCCESS'"), "0"));
}

fn tokens(checks: &mut Checks, k: &Citus, u1: &str) {
    let c = &k.c;
    checks.note("-- tokens");
    // Delegated calls (one per statement) issue tokens on the workers; calls inside a larger
    // query are not delegated and run on the coordinator, whose tokens come from its own sequence.
    let script: String = (1..=20).map(|i| format!("SELECT idem_reserve('tok', 'u-{i}', 'k', 'h');\n")).collect();
    let _ = c.stdin(&script, &[]);
    c.run("SELECT count(*) FROM (SELECT idem_reserve('tok', 'u-' || i, 'k', 'h') FROM generate_series(21, 40) AS i) AS s");
    checks.check(
        "tokens issued on the coordinator and both workers are unique, each node in its own range",
        eq(c.run("SELECT count(DISTINCT token) = count(*) AND count(*) = 40 AND count(DISTINCT token >> 48) = 3 FROM idem_records WHERE operation = 'tok'"), "t"),
    );
    // A stale token: the lease runs out, recovery releases the key, a new attempt takes it over.
    let stale = c.run(&format!("SELECT token FROM idem_reserve('pay', '{u1}', 'k-stale', 'h', lease => '1 second')"));
    sleep(1.2);
    c.run("SELECT idem_recover_stuck(batch_size => 1000, action => 'release')");
    let new_token = c.run(&format!("SELECT token FROM idem_reserve('pay', '{u1}', 'k-stale', 'h')"));
    checks.check("a stale token never completes", eq(c.q(&format!("SELECT idem_complete('pay', '{u1}', 'k-stale', {stale}, '{{}}')")).unwrap_or_else(|e| e), "f"));
    checks.check("the new token does", eq(c.q(&format!("SELECT idem_complete('pay', '{u1}', 'k-stale', {new_token}, '{{}}')")).unwrap_or_else(|e| e), "t"));
}

fn maintenance(checks: &mut Checks, k: &Citus, u1: &str, coordinator: &Server) {
    let c = &k.c;
    let q = |sql: &str| c.q(sql).unwrap_or_else(|e| e);
    checks.note("-- maintenance across shards");
    c.run("SELECT count(*) FROM (SELECT idem_reserve('stuck', 's-' || i % 10, 'k' || i, 'h', lease => '1 second') FROM generate_series(1, 30) AS i) AS s");
    c.run("SELECT count(*) FROM (SELECT idem_complete('old', 'o-' || i % 10, 'k' || i, (idem_reserve('old', 'o-' || i % 10, 'k' || i, 'h', ttl => '1 second')).token, '{}') FROM generate_series(1, 25) AS i) AS s");
    let mut nodes: Vec<String> = (0..10).map(|i| k.node_of(&format!("s-{i}"))).collect();
    nodes.sort();
    nodes.dedup();
    checks.check("the stuck records are on both workers", eq(nodes.len().to_string(), "2"));
    sleep(1.2);
    let batches: Vec<String> = (0..4).map(|_| q("SELECT idem_recover_stuck(batch_size => 10)")).collect();
    checks.check("idem_recover_stuck works in batches across shards: 10, 10, 10, 0 (the earlier test's keys aside)", eq(batches.join(" "), "10 10 10 0"));
    checks.check("every stuck record is FAILED", eq(q("SELECT string_agg(DISTINCT status, ',') FROM idem_records WHERE operation = 'stuck'"), "FAILED"));
    c.run("SELECT count(*) FROM (SELECT idem_reserve('rel', 's-' || i % 10, 'k' || i, 'h', lease => '1 second') FROM generate_series(1, 6) AS i) AS s");
    sleep(1.2);
    checks.check(
        "action 'release' counts a transient failure per key and deletes the records",
        eq(
            format!(
                "{}|{}|{}",
                q("SELECT idem_recover_stuck(action => 'release')"),
                q("SELECT count(*) FROM idem_records WHERE operation = 'rel'"),
                q("SELECT count(*) FROM idem_retries WHERE operation = 'rel' AND attempts = 1")
            ),
            "6|0|6",
        ),
    );
    let sweep = [
        q("SELECT idem_sweep(batch_size => 20)"),
        q("SELECT count(*) FROM idem_records WHERE operation = 'old'"),
        q("SELECT idem_sweep(batch_size => 20) >= 5"),
        q("SELECT count(*) FROM idem_records WHERE operation = 'old'"),
    ];
    checks.check("idem_sweep deletes the expired results in batches across shards: 20 then 5", eq(sweep.join(" "), "20 5 t 0"));
    c.run("UPDATE idem_retries SET expires_at = now() - interval '1 second' WHERE operation = 'rel'");
    checks.check(
        "and the expired retry counters no record needs",
        eq(format!("{}|{}", q("SELECT idem_sweep() >= 6"), q("SELECT count(*) FROM idem_retries WHERE operation = 'rel'")), "t|0"),
    );
    checks.check("live records are untouched", eq(q("SELECT count(*) FROM idem_records WHERE operation = 'dup' AND status = 'SUCCESS'"), "40"));

    // A row a live transaction holds is skipped, not waited for.
    c.run(&format!("SELECT idem_reserve('held', '{u1}', 'k', 'h', lease => '1 second')"));
    sleep(1.2);
    let lock = format!("SELECT 1 FROM idem_records WHERE operation = 'held' AND user_id = '{u1}' FOR UPDATE");
    let mut locker = k.background("locker", &["-c", "BEGIN", "-c", &lock, "-c", "SELECT pg_sleep(30) /* locker */", "-c", "COMMIT"], None);
    k.until_active("SELECT pg_sleep(30) /* locker */");
    checks.check("idem_recover_stuck skips a record a live transaction holds (no wait)", eq(q("SET statement_timeout = '5s'; SELECT idem_recover_stuck()"), "0"));
    c.run("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(30) /* locker */%'");
    let _ = locker.wait();

    checks.note("-- the maintenance worker on the coordinator");
    c.run("SELECT idem_reserve('bg', 'b-' || i, 'k', 'h', lease => '1 second') FROM generate_series(1, 10) AS i");
    c.run("SELECT idem_complete('bg', 'b-' || i, 'done', (idem_reserve('bg', 'b-' || i, 'done', 'h', ttl => '1 second')).token, '{}') FROM generate_series(1, 10) AS i");
    c.run("ALTER SYSTEM SET idempotency.maintenance_interval = 1");
    c.run("SELECT pg_reload_conf()");
    checks.check(
        "the worker recovers the stuck records of every shard, with no call",
        c.until_equal(60, "SELECT string_agg(DISTINCT status, ',') FROM idem_records WHERE operation = 'bg' AND key = 'k'", "FAILED"),
    );
    checks.check("and sweeps the expired ones", c.until_equal(60, "SELECT count(*) FROM idem_records WHERE operation = 'bg' AND key = 'done'", "0"));
    c.run("ALTER SYSTEM SET idempotency.maintenance_interval = 0");
    c.run("SELECT pg_reload_conf()");
    let log = coordinator.log();
    let errors = log
        .lines()
        .filter(|l| l.split_once("idempotency maintenance").is_some_and(|(_, r)| r.split_once(": ").is_some_and(|(_, m)| m.starts_with("ERROR") || m.starts_with("FATAL"))))
        .count();
    checks.check("the maintenance worker logged no error", eq(errors.to_string(), "0"));
    for l in log.lines().filter(|l| l.contains("idempotency maintenance in database")).take(3) {
        checks.note(l);
    }
}

fn shard_move(checks: &mut Checks, k: &Citus) {
    let c = &k.c;
    checks.note("-- a shard move under load");
    let mut bench = k.pgbench("move", MOVE_PGBENCH, &["-c", "6", "-j", "3", "-T", "20"]);
    sleep(3.0);
    let shard = c.run("SELECT get_shard_id_for_distribution_column('idem_records', 'm-1')");
    let from = c.run(&format!("SELECT nodeid FROM pg_dist_node WHERE nodeport = {}", k.node_of("m-1")));
    let to = c.run(&format!("SELECT nodeid FROM pg_dist_node WHERE noderole = 'primary' AND groupid > 0 AND nodeid <> {from} LIMIT 1"));
    let before = c.run("SELECT count(*) FROM idem_records WHERE operation = 'move'");
    // Citus's distributed deadlock detection may cancel the move when its final lock meets an
    // open client transaction on the shard (a cancelled move changes nothing): retry it, as an
    // operator would.
    let mut errors = Vec::new();
    let mut moved = Err(String::new());
    for attempt in 1..=5 {
        match c.q(&format!("SELECT citus_move_shard_placement({shard}, {from}, {to})")) {
            Ok(_) => {
                let why = if attempt > 1 { format!(": {}", errors.join(" ")) } else { String::new() };
                checks.note(&format!("moved on attempt {attempt}{why}"));
                moved = Ok(());
                break;
            }
            Err(e) => errors.push(e),
        }
        sleep(0.5);
    }
    if moved.is_err() {
        moved = Err(errors.join("\n"));
    }
    checks.check("citus_move_shard_placement of the records' shard (and its co-located shards) under load", moved);
    let _ = bench.wait();
    let log = k.session_log("move");
    checks.note(&log.lines().filter(|l| l.contains("processed") || l.contains("failed") || l.contains("tps")).collect::<Vec<_>>().join(";"));
    checks.check("the shard is on the other worker now", eq(c.run(&format!("SELECT nodeid FROM pg_dist_node WHERE nodeport = {}", k.node_of("m-1"))), &to));
    let after = c.run("SELECT count(*) FROM idem_records WHERE operation = 'move'");
    checks.note(&format!("records of the load: {before} before the move, {after} after the load"));
    checks.check(
        "no record lost: every committed record is there, SUCCESS, with exactly one business row",
        eq(
            c.run(&format!(
                "SELECT count(*) FILTER (WHERE r.status <> 'SUCCESS' OR c.n IS DISTINCT FROM 1) || ' ' || (count(*) >= {before})::int
                   FROM idem_records AS r
                   LEFT JOIN (SELECT user_id, key, count(*) AS n FROM charges WHERE key LIKE 'move-%' GROUP BY 1, 2) AS c
                     ON c.user_id = r.user_id AND c.key = 'move-' || substr(r.key, 3)
                  WHERE r.operation = 'move'"
            )),
            "0 1",
        ),
    );
    checks.check(
        "no business row without its record",
        eq(
            c.run(
                "SELECT count(*) FROM charges AS c WHERE c.key LIKE 'move-%' AND NOT EXISTS (
                    SELECT FROM idem_records AS r WHERE r.operation = 'move' AND r.user_id = c.user_id AND r.key = 'k-' || substr(c.key, 6))",
            ),
            "0",
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::servers_in;

    #[test]
    fn reads_the_remote_servers() {
        let log = "NOTICE:  issuing SELECT x\nDETAIL:  on server postgres@127.0.0.1:55446 connectionId: 1\n\
                   NOTICE:  issuing PREPARE TRANSACTION 'a'\nDETAIL:  on server postgres@127.0.0.1:55447 connectionId: 2\n";
        assert_eq!(servers_in(log, false), "55446 55447 ");
        assert_eq!(servers_in(log, true), "55447 ");
    }
}
