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
//!   roles       another role sending a record's token is refused (42501) by idem_complete and
//!               idem_heartbeat, a wrong token is stale; the owner completes
//!   maintenance idem_recover_stuck (fail and release) and idem_sweep across shards, in
//!               batches; the maintenance worker preloaded on the coordinator does both
//!   move        a shard move under load loses no record and no business row
//!   budget      a batch of 50,000 keys in one transaction, delegated to a worker with the
//!               default max_locks_per_transaction, keeps at most half of it in key locks there
//!               (more keys than the worker's whole lock table: 0.5.0 kept one lock per key on
//!               Citus and failed with "out of shared memory"); a duplicate past the budget
//!               waits for the batch's commit, then answers in_progress (issue 34)
//!
//! The statements and pgbench scripts are tests/citus/*.sql (run by name) and *.pgbench.

use crate::ctx::Ctx;
use crate::psql::{Named, Psql};
use crate::report::{ensure, eq, Checks};
use idempotency_pgserver::Server;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

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

/// The nodes, how to reach them, and the layer's statements (tests/citus/*.sql).
struct Citus {
    work: PathBuf,
    c: Psql,
    w1: Psql,
    w2: Psql,
    sql: Named,
}

impl Citus {
    /// Statement `name` of tests/citus on node `on`, with psql variables `vars`.
    fn q(&self, on: &Psql, name: &str, vars: &[(&str, &str)]) -> Result<String, String> {
        self.sql.q(on, name, vars)
    }

    /// [`Citus::q`], panicking with the error (for set-up statements the checks rely on).
    fn run(&self, on: &Psql, name: &str, vars: &[(&str, &str)]) -> String {
        self.sql.run(on, name, vars)
    }

    /// Statement `name` in a session of its own on the coordinator, in the background, its
    /// output into `work/NAME.log`.
    fn background(&self, name: &str, vars: &[(&str, &str)]) -> Child {
        self.c.spawn(self.sql.get(name), vars, &self.work.join(format!("{name}.log")))
    }

    fn session_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.work.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// A pgbench run of tests/citus/NAME.pgbench through the coordinator, its output into
    /// `work/NAME.log`.
    fn pgbench(&self, name: &str, args: &[&str]) -> Child {
        let mut all = vec!["-M", "simple"];
        all.extend_from_slice(args);
        self.c.pgbench(&Path::new("tests/citus").join(format!("{name}.pgbench")), &all, &self.work.join(format!("{name}.log")))
    }

    /// Waits (at most 10 s) until a session runs a query starting with `prefix`.
    fn until_active(&self, prefix: &str) {
        let _ = self.c.until_script_equal(10, self.sql.get("active"), &[("prefix", prefix)], "1");
    }

    /// The port of the worker that holds `user`'s shard of idem_records.
    fn node_of(&self, user: &str) -> String {
        self.run(&self.c, "node_of", &[("user", user)])
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
    let k = Citus { work: work.clone(), c: ctx.psql(cp), w1: ctx.psql(p1), w2: ctx.psql(p2), sql: Named::load(Path::new("tests/citus")) };
    for p in [&k.c, &k.w1, &k.w2] {
        k.run(p, "create_citus", &[]);
    }
    setup(checks, &k, cp, p1, p2);
    let (u1, u2) = (user_on(&k, p1), user_on(&k, p2));
    checks.note(&format!("users {u1} (worker {p1}) and {u2} (worker {p2})"));
    flow(checks, &k, &u1, &u2, p1, p2);
    duplicates(checks, &k);
    tokens(checks, &k, &u1);
    roles(checks, &k, &u1);
    maintenance(checks, &k, &u1, &nodes[0]);
    shard_move(checks, &k);
    lock_budget(checks, &k, p1, p2);
    for n in nodes {
        super::finish(n, checks);
    }
}

/// A user id whose shard is on the worker at `port`.
fn user_on(k: &Citus, port: u16) -> String {
    (1..=64).map(|i| format!("u-{i}")).find(|u| k.node_of(u) == port.to_string()).unwrap_or_else(|| panic!("no user of u-1..u-64 on worker {port}"))
}

fn setup(checks: &mut Checks, k: &Citus, cp: u16, p1: u16, p2: u16) {
    let c = &k.c;
    checks.note(&k.run(c, "citus_version", &[]));
    k.run(c, "coordinator_host", &[("port", &cp.to_string())]);
    k.run(c, "add_node", &[("port", &p1.to_string())]);
    k.run(c, "add_node", &[("port", &p2.to_string())]);
    checks.check("two workers are active", eq(k.run(c, "active_workers", &[]), "2"));

    // The previous release first, then the update: both reach the workers through the coordinator.
    let versions = crate::sh::versions();
    let current = versions.last().expect("a version").clone();
    let previous = versions.len().checked_sub(2).map_or(current.clone(), |i| versions[i].clone());
    let versions_on = || [&k.c, &k.w1, &k.w2].iter().map(|p| k.q(p, "extversion", &[]).unwrap_or_else(|e| e) + " ").collect::<String>();
    k.run(c, "create_extension", &[("version", &previous)]);
    checks.check(
        &format!("CREATE EXTENSION idempotency VERSION '{previous}' on the coordinator reaches both workers"),
        eq(versions_on(), format!("{previous} {previous} {previous} ")),
    );
    // Records written before the update, still local: the update keeps them (from 0.6.0 in
    // idem_records_060), idem_distribute carries them into the shards.
    let old_token = k.run(c, "before_update", &[]).lines().last().unwrap_or_default().to_owned();
    k.run(c, "update_extension", &[]);
    checks.check(
        &format!("ALTER EXTENSION idempotency UPDATE on the coordinator updates both workers to {current}"),
        eq(versions_on(), format!("{current} {current} {current} ")),
    );
    // The business table, distributed by its user_id first; then the records join it.
    k.run(c, "charges", &[]);
    k.run(c, "distribute_charges", &[]);
    // A session that used the API before the distribution (its native catalog cached: a local
    // table) keeps answering right afterwards, in its own backend.
    let mut early = k.background("early", &[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !k.session_log("early").lines().any(|l| l.starts_with("waiting")) && Instant::now() < deadline {
        sleep(0.1);
    }
    checks.check("idem_distribute('charges') runs", k.q(c, "distribute", &[]).map(drop));
    let _ = early.wait();
    let last2: Vec<String> = k.session_log("early").lines().rev().take(2).map(|l| format!("{l}|")).collect();
    checks.check(
        "a session that cached the local table before the distribution replays the moved record, then creates",
        eq(last2.into_iter().rev().collect::<String>(), "replay {\"early\": 1}|created|"),
    );
    checks.check(
        "idem_records and idem_retries are distributed by user_id, co-located with charges",
        eq(k.run(c, "distributed_tables", &[]), "charges:user_id idem_records:user_id idem_retries:user_id 1"),
    );
    checks.check(
        "idem_reserve, idem_replay, idem_complete, idem_release, idem_heartbeat, idem_checkpoint, idem_lookup and the batch functions are delegated by user_id with force_delegation",
        eq(
            k.run(c, "delegated_functions", &[]),
            "idem_checkpoint:1:true idem_complete:1:true idem_complete_many:1:true idem_heartbeat:1:true idem_lookup:1:true idem_release:1:true idem_replay:1:true idem_reserve:1:true idem_reserve_many:1:true",
        ),
    );
    checks.check("idem_distribute is idempotent (a second call changes nothing)", k.q(c, "distribute_again", &[]).map(drop));
    let legacy_on = || [&k.c, &k.w1, &k.w2].iter().map(|p| k.q(p, "legacy_table", &[]).unwrap_or_else(|e| e) + " ").collect::<String>();
    checks.check("no idem_records_060 is left on the coordinator or the workers (moved and dropped by idem_distribute)", eq(legacy_on(), "f f f "));
    checks.check(
        "the records written before the update are in the shards: the finished one replays, the one in flight completes with its token",
        eq(format!("{}|{}", k.q(c, "old_replay", &[]).unwrap_or_else(|e| e), k.q(c, "old_complete", &[("token", &old_token)]).unwrap_or_else(|e| e)), "replay {\"pre\": 1}|t"),
    );
    checks.check("the workers see idem_records as distributed (Citus metadata synced)", eq(k.run(&k.w1, "records_distributed", &[]), "1"));
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
    let users = [("u1", u1), ("u2", u2)];
    checks.note("-- flow: in-transaction through the coordinator, delegated");
    let flow_log = c.with_notices(k.sql.get("flow"), &users);
    std::fs::write(k.work.join("flow.log"), &flow_log).expect("write flow.log");
    checks.check("created, then completed, in one transaction", ensure(flow_log.lines().any(|l| l == "RESULT created t"), crate::sh::tail(&flow_log, 10)));
    checks.check("no two-phase commit: the transaction committed on one node", eq(flow_log.matches("PREPARE TRANSACTION").count().to_string(), "0"));
    checks.check(&format!("every statement ran on the worker of the user's shard ({p1})"), eq(servers_in(&flow_log, false), format!("{p1} ")));
    checks.check(
        "the reserve ran there as a delegated call",
        ensure(flow_log.lines().any(|l| l.contains("issuing SELECT ") && l.contains("idem_reserve")), "no `issuing SELECT ... idem_reserve` line"),
    );
    let rshard = k.run(c, "shard_of", &[("table", "idem_records"), ("user", u1)]);
    let cshard = k.run(c, "shard_of", &[("table", "charges"), ("user", u1)]);
    let (records_shard, charges_shard) = (format!("idem_records_{rshard}"), format!("charges_{cshard}"));
    let shards = [("u1", u1), ("records_shard", records_shard.as_str()), ("charges_shard", charges_shard.as_str())];
    checks.check(
        "the record and the business row are in that worker's shards",
        eq(
            format!(
                "{}|{}",
                k.q(&k.w1, "record_status", &shards).unwrap_or_else(|e| e),
                k.q(&k.w1, "business_rows_in_shard", &shards).unwrap_or_else(|e| e)
            ),
            "SUCCESS|1",
        ),
    );
    let q = |name: &str| k.q(c, name, &users).unwrap_or_else(|e| e);
    checks.check("a retry through the coordinator replays the stored response", eq(q("replay"), "replay {\"status\": 201}"));
    // idem_replay in autocommit: one delegated call on the user's worker, where the record is
    // read locally (undelegated, the coordinator read the record's and the counter's shards by
    // two remote statements).
    let replay_log = c.with_notices(k.sql.get("replay_first"), &users);
    let issued: Vec<&str> = replay_log.lines().filter(|l| l.contains("issuing ")).collect();
    checks.check(
        &format!("idem_replay through the coordinator answers the replay as one delegated call on the user's worker ({p1})"),
        eq(
            format!("{}|{}|{}", replay_log.lines().any(|l| l == "RESULT replay {\"status\": 201}"), issued.len(), issued.iter().all(|l| l.contains("idem_replay"))),
            "true|1|true",
        ),
    );
    checks.check("and nothing ran on the other worker", eq(servers_in(&replay_log, false), format!("{p1} ")));
    checks.check("the same key with another request is a mismatch", eq(q("mismatch"), "mismatch"));
    checks.check("keys are scoped per user: the other user's same key is new", eq(q("other_user"), "created"));
    checks.check("one business row", eq(q("business_rows"), "1"));

    // A holder with an open transaction: a duplicate answers in_progress at once.
    let mut holder = k.background("holder", &users);
    k.until_active("SELECT pg_sleep(4) /* holder */");
    checks.check("a concurrent duplicate through the coordinator answers in_progress without blocking", eq(q("open_duplicate"), "in_progress"));
    checks.check(
        "and so does one sent to the worker directly (the lock is on the shard's node)",
        eq(k.q(&k.w2, "open_duplicate", &users).unwrap_or_else(|e| e), "in_progress"),
    );
    let _ = holder.wait();
    checks.check("the holder committed its reservation", eq(q("open_status"), "PROCESSING"));

    // Without delegation the advisory lock is per node: a delegated duplicate waits on the
    // holder's uncommitted row and answers in_progress once it commits (the wait is printed).
    let mut holder = k.background("nodeleg", &users);
    k.until_active("SELECT pg_sleep(2) /* nodeleg */");
    let started = Instant::now();
    let dup = q("nodeleg_duplicate");
    let waited = started.elapsed().as_secs_f64();
    let _ = holder.wait();
    let first = k.session_log("nodeleg").lines().next().unwrap_or_default().to_owned();
    checks.check("a holder on the coordinator (not delegated): a delegated duplicate answers in_progress, never created", eq(format!("{first}|{dup}"), "created|in_progress"));
    checks.note(&format!("the duplicate waited {waited:.1} s for the holder's commit (the holder slept 2 s; with delegation it answers at once)"));

    // A transaction for users on two workers: two-phase commit on both.
    let multi = c.with_notices(k.sql.get("multi"), &users);
    std::fs::write(k.work.join("multi.log"), &multi).expect("write multi.log");
    checks.check("a transaction spanning users on two workers commits by two-phase commit on both", eq(servers_in(&multi, true), format!("{p1} {p2} ")));

    checks.check(
        "release after a transient failure, then the retry runs again with attempts 1",
        eq(format!("{}|{}", q("release"), q("retry_attempts")), "released|created 1"),
    );
    checks.check(
        "heartbeat through the coordinator extends the lease of the right token only",
        eq(format!("{}|{}", q("heartbeat"), q("heartbeat_wrong_token")), "t|f"),
    );
    checks.check("idem_stats counts the PROCESSING records of every shard exactly", eq(q("stats_processing"), q("processing")));
}

fn duplicates(checks: &mut Checks, k: &Citus) {
    let c = &k.c;
    checks.note("-- duplicates: 12 clients, 40 keys of 8 users, through the coordinator");
    let mut bench = k.pgbench("duplicates", &["-c", "12", "-j", "4", "-t", "40"]);
    let _ = bench.wait();
    let log = k.session_log("duplicates");
    checks.check("every client transaction succeeded (no error, no unexpected outcome)", ensure(log.contains("processed: 480/480"), crate::sh::tail(&log, 10)));
    checks.note(&log.lines().filter(|l| l.contains("processed") || l.contains("failed") || l.contains("tps")).collect::<Vec<_>>().join(";"));
    checks.check(
        "exactly one business row per executed key, and every executed key is SUCCESS",
        eq(format!("{}|{}", k.run(c, "dup_business_rows", &[]), k.run(c, "dup_success", &[])), "0 40|40"),
    );
    checks.check("no reservation left PROCESSING", eq(k.run(c, "dup_unfinished", &[]), "0"));
}

fn tokens(checks: &mut Checks, k: &Citus, u1: &str) {
    let c = &k.c;
    let user = [("u1", u1)];
    checks.note("-- tokens");
    // Delegated calls (one per statement) issue tokens on the workers; calls inside a larger
    // query are not delegated and run on the coordinator, whose tokens come from its own sequence.
    let _ = k.q(c, "tokens_delegated", &[]);
    k.run(c, "tokens_on_coordinator", &[]);
    checks.check("tokens issued on the coordinator and both workers are unique, each node in its own range", eq(k.run(c, "tokens_unique", &[]), "t"));
    // A stale token: the lease runs out, recovery releases the key, a new attempt takes it over.
    let stale = k.run(c, "stale_reserve", &user);
    sleep(1.2);
    k.run(c, "stale_recover", &[]);
    let new_token = k.run(c, "stale_new_reserve", &user);
    checks.check("a stale token never completes", eq(k.q(c, "stale_complete", &[("u1", u1), ("token", &stale)]).unwrap_or_else(|e| e), "f"));
    checks.check("the new token does", eq(k.q(c, "stale_complete", &[("u1", u1), ("token", &new_token)]).unwrap_or_else(|e| e), "t"));
}

fn roles(checks: &mut Checks, k: &Citus, u1: &str) {
    checks.note("-- roles");
    k.run(&k.c, "roles_create", &[]);
    let (alice, bob) = (k.c.user("idem_alice"), k.c.user("idem_bob"));
    let token = k.run(&alice, "roles_reserve", &[("u1", u1)]);
    let (own, wrong) = ([("u1", u1), ("token", token.as_str())], [("u1", u1), ("token", "1")]);
    // An error naming the owner as 42501 (psql prints no SQLSTATE), any other as it is.
    let out = |r: Result<String, String>| {
        r.unwrap_or_else(|e| if e.contains("permission denied") && e.contains("the key belongs to role idem_alice") { "42501".to_owned() } else { e })
    };
    checks.check(
        "another role sending the record's token: idem_complete and idem_heartbeat refuse (42501), a wrong token is stale",
        eq(
            format!(
                "{}|{}|{}",
                out(k.q(&bob, "roles_complete", &own)),
                out(k.q(&bob, "roles_heartbeat", &own)),
                out(k.q(&bob, "roles_complete", &wrong))
            ),
            "42501|42501|f",
        ),
    );
    checks.check(
        "the owner extends its lease and completes",
        eq(format!("{}|{}", out(k.q(&alice, "roles_heartbeat", &own)), out(k.q(&alice, "roles_complete", &own))), "t|t"),
    );
}

fn maintenance(checks: &mut Checks, k: &Citus, u1: &str, coordinator: &Server) {
    let c = &k.c;
    let q = |name: &str| k.q(c, name, &[]).unwrap_or_else(|e| e);
    checks.note("-- maintenance across shards");
    k.run(c, "stuck_fill", &[]);
    k.run(c, "old_fill", &[]);
    let mut nodes: Vec<String> = (0..10).map(|i| k.node_of(&format!("s-{i}"))).collect();
    nodes.sort();
    nodes.dedup();
    checks.check("the stuck records are on both workers", eq(nodes.len().to_string(), "2"));
    sleep(1.2);
    let batches: Vec<String> = (0..4).map(|_| q("recover_batch")).collect();
    checks.check("idem_recover_stuck works in batches across shards: 10, 10, 10, 0 (the earlier test's keys aside)", eq(batches.join(" "), "10 10 10 0"));
    checks.check("every stuck record is FAILED", eq(q("stuck_statuses"), "FAILED"));
    k.run(c, "rel_fill", &[]);
    sleep(1.2);
    checks.check(
        "action 'release' counts a transient failure per key and deletes the records",
        eq(format!("{}|{}|{}", q("recover_release"), q("rel_records"), q("rel_retries_once")), "6|0|6"),
    );
    let sweep = [q("sweep_batch"), q("old_records"), q("sweep_batch_rest"), q("old_records")];
    checks.check("idem_sweep deletes the expired results in batches across shards: 20 then 5", eq(sweep.join(" "), "20 5 t 0"));
    k.run(c, "rel_retries_expire", &[]);
    checks.check("and the expired retry counters no record needs", eq(format!("{}|{}", q("sweep_retries"), q("rel_retries")), "t|0"));
    checks.check("live records are untouched", eq(q("dup_success"), "40"));

    // A row a live transaction holds is skipped, not waited for.
    k.run(c, "held_reserve", &[("u1", u1)]);
    sleep(1.2);
    let locker_query = "SELECT pg_sleep(30) /* locker */";
    let mut locker = k.background("locker", &[("u1", u1)]);
    k.until_active(locker_query);
    checks.check("idem_recover_stuck skips a record a live transaction holds (no wait)", eq(q("recover_no_wait"), "0"));
    k.run(c, "cancel", &[("prefix", locker_query)]);
    let _ = locker.wait();

    checks.note("-- the maintenance worker on the coordinator");
    k.run(c, "bg_stuck", &[]);
    k.run(c, "bg_expired", &[]);
    k.run(c, "maintenance_interval", &[("interval", "1")]);
    checks.check("the worker recovers the stuck records of every shard, with no call", c.until_script_equal(60, k.sql.get("bg_stuck_statuses"), &[], "FAILED"));
    checks.check("and sweeps the expired ones", c.until_script_equal(60, k.sql.get("bg_expired_left"), &[], "0"));
    k.run(c, "maintenance_interval", &[("interval", "0")]);
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
    let mut bench = k.pgbench("move", &["-c", "6", "-j", "3", "-T", "20"]);
    sleep(3.0);
    let shard = k.run(c, "shard_of", &[("table", "idem_records"), ("user", "m-1")]);
    let from = k.run(c, "nodeid", &[("port", &k.node_of("m-1"))]);
    let to = k.run(c, "other_worker", &[("from", &from)]);
    let before = k.run(c, "move_records", &[]);
    // Citus's distributed deadlock detection may cancel the move when its final lock meets an
    // open client transaction on the shard (a cancelled move changes nothing): retry it, as an
    // operator would.
    let mut errors = Vec::new();
    let mut moved = Err(String::new());
    for attempt in 1..=5 {
        match k.q(c, "move_shard", &[("shard", &shard), ("from", &from), ("to", &to)]) {
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
    checks.check("the shard is on the other worker now", eq(k.run(c, "nodeid", &[("port", &k.node_of("m-1"))]), &to));
    let after = k.run(c, "move_records", &[]);
    checks.note(&format!("records of the load: {before} before the move, {after} after the load"));
    checks.check("no record lost: every committed record is there, SUCCESS, with exactly one business row", eq(k.run(c, "no_record_lost", &[("before", &before)]), "0 1"));
    checks.check("no business row without its record", eq(k.run(c, "orphan_business_rows", &[]), "0"));
}

/// Keys of the batch in [`lock_budget`]: more than twice the worker's lock table (22,144 locks
/// with the layer's settings), so 0.5.0, which kept a lock per key on Citus, runs out of it;
/// the 100,000 of issue 34 took 82 s to reserve here, these 50,000 25 to 33 s.
const BUDGET_KEYS: u32 = 50_000;

fn lock_budget(checks: &mut Checks, k: &Citus, p1: u16, p2: u16) {
    let c = &k.c;
    checks.note(&format!("-- the lock budget: {BUDGET_KEYS} keys of one user in one transaction, delegated"));
    // A user on worker 1 now (the shard move may have moved u1's shard).
    let user = user_on(k, p1);
    let (w, other) = (&k.w1, &k.w2);
    let table = k.run(w, "budget_lock_table", &[]);
    let (max_locks, slots) = table.split_once(' ').unwrap_or((&table, "0"));
    let budget = (max_locks.parse::<i64>().unwrap_or(0) / 2).max(1);
    checks.check(
        &format!("the worker keeps the default max_locks_per_transaction, and its lock table ({slots} locks) is smaller than the batch"),
        ensure(max_locks == "64" && slots.parse::<u32>().is_ok_and(|s| s < BUDGET_KEYS), format!("max_locks_per_transaction and lock table: {table}")),
    );
    let n = BUDGET_KEYS.to_string();
    let vars = [("u1", user.as_str()), ("n", n.as_str())];
    let started = Instant::now();
    let mut big = k.background("budget_big", &vars);
    let deadline = Instant::now() + Duration::from_secs(600);
    let reserved = loop {
        let log = k.session_log("budget_big");
        if let Some(line) = log.lines().find(|l| l.starts_with("created ") || l.contains("ERROR")) {
            break line.to_owned();
        }
        if Instant::now() >= deadline {
            break format!("no answer in 600 s: {}", crate::sh::tail(&log, 5));
        }
        sleep(0.2);
    };
    let took = started.elapsed().as_secs_f64();
    checks.check(&format!("one transaction reserves {BUDGET_KEYS} keys of one user through the coordinator, every key created"), eq(&reserved, format!("created {n}")));
    checks.note(&format!("the batch answered in {took:.1} s"));
    k.until_active("SELECT pg_sleep(5) /* budget */");
    // The locks of the open batch, on the worker that ran it (and none on the other).
    let locks = k.q(w, "budget_locks", &[]).unwrap_or_else(|e| e);
    let others = k.q(other, "budget_locks", &[]).unwrap_or_else(|e| e);
    let key_locks = locks.split_whitespace().next().and_then(|l| l.parse::<i64>().ok()).unwrap_or(-1);
    checks.check(
        &format!("the open batch holds at most half of max_locks_per_transaction ({budget}) key locks on its worker, and some (the call ran there)"),
        ensure((1..=budget).contains(&key_locks), format!("key locks and other advisory locks on worker {p1}: [{locks}]")),
    );
    checks.note(&format!("advisory locks on worker {p1}: {locks} (keys, Citus's); on worker {p2}: {others}"));
    let dup = |key: &str| k.q(c, "budget_duplicate", &[("u1", user.as_str()), ("key", key)]).unwrap_or_else(|e| e);
    // The first key kept its lock: a duplicate answers at once. The last, past the budget, gave
    // its lock back: a duplicate meets its row in the primary key and waits for the commit.
    let first = dup("b-1");
    let at = Instant::now();
    let past = dup(&format!("b-{BUDGET_KEYS}"));
    let waited = at.elapsed().as_secs_f64();
    let _ = big.wait();
    let log = k.session_log("budget_big");
    checks.check(
        "a duplicate of a key within the budget answers in_progress; one past it waits for the batch's commit, then answers in_progress (never created)",
        eq(format!("{first}|{past}"), "in_progress|in_progress"),
    );
    checks.note(&format!("the duplicate past the budget waited {waited:.1} s (the batch held its transaction open 5 s)"));
    checks.check("the batch commits", ensure(log.lines().any(|l| l == "committed") && !log.contains("ERROR"), crate::sh::tail(&log, 10)));
    checks.check(&format!("{BUDGET_KEYS} records, each PROCESSING"), eq(k.run(c, "budget_records", &[("u1", user.as_str())]), format!("{n} {n}")));
}

#[cfg(test)]
mod tests {
    use super::servers_in;
    use crate::psql::Named;
    use std::path::Path;

    #[test]
    fn reads_the_remote_servers() {
        let log = "NOTICE:  issuing SELECT x\nDETAIL:  on server postgres@127.0.0.1:55446 connectionId: 1\n\
                   NOTICE:  issuing PREPARE TRANSACTION 'a'\nDETAIL:  on server postgres@127.0.0.1:55447 connectionId: 2\n";
        assert_eq!(servers_in(log, false), "55446 55447 ");
        assert_eq!(servers_in(log, true), "55447 ");
    }

    /// Every statement the layer runs by name is in tests/citus, and every one there is run (the
    /// layer cannot run here: this is what keeps its statements and its code together).
    #[test]
    fn every_named_statement_exists_and_is_used() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let named = Named::load(&root.join("tests/citus"));
        let used = crate::psql::named_in(include_str!("citus.rs"));
        let missing: Vec<&String> = used.iter().filter(|n| !named.names().any(|m| m == n.as_str())).collect();
        assert!(missing.is_empty(), "named in citus.rs, not in tests/citus: {missing:?}");
        let unused: Vec<&str> = named.names().filter(|m| !used.iter().any(|n| n == m)).collect();
        assert!(unused.is_empty(), "in tests/citus, never run: {unused:?}");
    }
}
