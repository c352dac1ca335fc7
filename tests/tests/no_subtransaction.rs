//! No subtransaction, proven two ways.
//!
//! **Counted, for every function of the API** (`every_function_runs_without_a_subtransaction`):
//! on a throwaway server of its own with default settings (`target/servers/nosubxact-NN`, port
//! private cluster's + 41; nothing else runs there, so the transaction ID counter moves only for
//! the test), each case runs in one transaction between two transactions that read
//! `pg_current_xact_id()`. The difference minus one is every transaction ID the case used: its
//! top-level one (if it wrote: `pg_current_xact_id_if_assigned()` at its end says) plus one per
//! subtransaction that got one (a PL/pgSQL EXCEPTION block around a write, a SAVEPOINT). From 16
//! on, `pg_stat_get_backend_subxact` of the backend is read at the end of the case too (its cached
//! subtransaction IDs and whether the cache overflowed). Every case must use none. The cases: one
//! key and 200 keys by single calls (past the lock budget), 1,000 keys by the batch functions,
//! with `wait` false and true; every outcome of `idem_reserve` (created, a takeover, replay,
//! failed, in_progress, mismatch); `idem_complete` (SUCCESS, FAILED, stale); `idem_release`
//! (released, poisoned); `idem_heartbeat`; `idem_recover_stuck` (fail, release); `idem_sweep`;
//! `idem_lookup`; `idem_stats`; the three `idem_fingerprint`; and `idem_maintain`, whose
//! transactions are counted from outside (one transaction ID for each that wrote, no more). Not
//! here: `idem_metrics` (reads shared memory, raises unless the library is preloaded) and
//! `idem_distribute` (needs Citus: the citus layer). 100,000 keys in one transaction are counted
//! the same way by tests/tests/lock_budget_default.rs. Controls prove the count sees what it
//! must: a SAVEPOINT around a write counts one, and a per-key EXCEPTION block around an insert
//! (0.4.0's portable `idem_reserve`) counts one per key. Runs on both installs (`IDEM_INSTALL`)
//! and every major (the e2e layers' core run includes this binary).
//!
//! **The one bounded exception** (`portable_fallback_is_bounded`): the portable install's insert
//! that gives up instead of waiting (`_idem_write_nowait`, an EXCEPTION block) runs only with
//! `wait => false` while another transaction is past its lock budget (sql/reserve.sql): then at
//! most one subtransaction per new key; none once that transaction ended; none ever on the
//! extension. And no other function of either install has an EXCEPTION block but the two batch
//! functions of the update from 0.6.0 (`_idem_legacy_batch`, `idem_move_records`: the
//! maintenance calls them, never a request), whose block is entered only while `idem_records_060`
//! exists (sql/internal.sql). `_idem_adopt`, which every keyed call makes while it exists (once
//! per key of a batch), holds an advisory lock instead of catching the table's drop.
//!
//! **No statement text** (`no_outcome_takes_a_savepoint`): no path of `run`, `run_batch`,
//! `run_external` or the layer sends a SAVEPOINT: every outcome runs against a database whose
//! statements pg_stat_statements tracks, and none of them is a SAVEPOINT, RELEASE or ROLLBACK
//! TO. A control transaction with a savepoint proves the counting sees one when it happens.

use idempotency_client::{
    BatchItem, BatchOutcome, Disposition, Error, Fingerprint, HandlerError, Outcome, Settings,
    StoredResponse, TxFuture,
};
use idempotency_testkit::cluster::install_into;
use idempotency_testkit::server::{major_of, pg_config, Server};
use idempotency_testkit::{
    batch, connect_with, exec, fresh_database, unique_key, Charge, Conn, DbError,
};
use serde_json::json;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

/// A throwaway server with default settings for the counted cases: nothing else uses it, so the
/// transaction ID counter moves only for the test. Autovacuum is off: an automatic ANALYZE of a
/// table the cases fill takes a transaction ID of its own, which would be counted. Stopped when
/// dropped.
fn counting_server(name: &str, offset: u16) -> Server {
    let config = pg_config();
    let port = Server::private(&config).port() + offset;
    let server = Server::new(&format!("{name}-{}", major_of(&config)), &config, port);
    server.initdb(&[]);
    server.configure("autovacuum = off");
    server.start();
    server
}

/// A new database `db` on `server` (a fresh one) with idempotency installed (`IDEM_INSTALL`).
async fn database_on(server: &Server, db: &str) -> String {
    let (admin, conn) = tokio_postgres::connect(&server.url("postgres"), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .expect("create the database");
    let url = server.url(db);
    install_into(&url).await;
    url
}

/// What one transaction used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Used {
    /// Transaction IDs used between the transaction before and the one after, less those two.
    xids: i64,
    /// Whether the transaction had one at its end (the extension's write-once reservations get
    /// theirs at COMMIT).
    top: bool,
    /// From 16 on: the backend's cached subtransaction IDs at the end, and whether they overflowed.
    cache: Option<(i32, bool)>,
}

impl Used {
    /// Subtransactions that got a transaction ID: all but the top-level one (a subtransaction
    /// gets one only after its parent has one, so a transaction that used any used two or more).
    fn subtransactions(&self) -> i64 {
        (self.xids - 1).max(0)
    }
}

async fn next_xid(c: &tokio_postgres::Client) -> i64 {
    c.query_one("SELECT pg_current_xact_id()::text::bigint", &[])
        .await
        .expect("pg_current_xact_id")
        .get(0)
}

/// Runs `body` (statements) in one transaction and counts what it used (see the module doc).
async fn used(c: &tokio_postgres::Client, major: u32, body: &str) -> Used {
    let before = next_xid(c).await;
    c.batch_execute("BEGIN").await.expect("BEGIN");
    c.batch_execute(body)
        .await
        .unwrap_or_else(|e| panic!("{body}: {e:?}"));
    let top: bool = c
        .query_one("SELECT pg_current_xact_id_if_assigned() IS NOT NULL", &[])
        .await
        .expect("top xid")
        .get(0);
    let cache = if major >= 16 {
        c.batch_execute("SELECT pg_stat_clear_snapshot()")
            .await
            .expect("clear the stats snapshot");
        let row = c
            .query_one(
                "SELECT s.subxact_count, s.subxact_overflowed \
                   FROM pg_stat_get_backend_idset() AS b(id), pg_stat_get_backend_subxact(b.id) AS s \
                  WHERE pg_stat_get_backend_pid(b.id) = pg_backend_pid()",
                &[],
            )
            .await
            .expect("pg_stat_get_backend_subxact");
        Some((row.get(0), row.get(1)))
    } else {
        None
    };
    c.batch_execute("COMMIT").await.expect("COMMIT");
    let after = next_xid(c).await;
    Used {
        xids: after - before - 1,
        top,
        cache,
    }
}

/// `n` keys `p1` .. `pn` of operation `op` reserved (and committed) so a case finds them.
fn reserved(op: &str, n: u32) -> String {
    format!("SELECT count(*) FROM generate_series(1, {n}) AS g, idem_reserve('{op}', 'u', 'p' || g, 'h') AS r;")
}

/// The statements of a case that reserve keys k1 .. kn of `op` one call at a time into the
/// temporary table `got` (key, token), `wait` as given.
fn single_reserves(op: &str, n: u32, wait: bool) -> String {
    format!(
        "CREATE TEMP TABLE got ON COMMIT DROP AS \
           SELECT 'k' || g AS key, (idem_reserve('{op}', 'u', 'k' || g, 'h', wait => {wait})).token AS token \
             FROM generate_series(1, {n}) AS g; \
         DO $$ BEGIN IF (SELECT count(token) FROM got) <> {n} THEN RAISE EXCEPTION 'not all created'; END IF; END $$;"
    )
}

fn single_completes(op: &str) -> String {
    format!(
        "DO $$ BEGIN IF EXISTS (SELECT FROM got WHERE NOT idem_complete('{op}', 'u', got.key, got.token, '{{\"ok\": 1}}')) THEN \
           RAISE EXCEPTION 'not all completed'; END IF; END $$;"
    )
}

fn batch_calls(op: &str, n: u32, wait: bool) -> String {
    format!(
        "CREATE TEMP TABLE got ON COMMIT DROP AS \
           SELECT key, token FROM idem_reserve_many('{op}', 'u', ARRAY(SELECT 'k' || g FROM generate_series(1, {n}) AS g), \
                                                    array_fill('h'::text, ARRAY[{n}]), wait => {wait}); \
         DO $$ BEGIN IF (SELECT count(token) FROM got) <> {n} THEN RAISE EXCEPTION 'not all created'; END IF; \
           IF (SELECT count(*) FILTER (WHERE completed) FROM idem_complete_many('{op}', 'u', \
                 (SELECT array_agg(key) FROM got), (SELECT array_agg(token) FROM got), \
                 array_fill('{{}}'::jsonb, ARRAY[{n}]))) <> {n} THEN RAISE EXCEPTION 'not all completed'; END IF; END $$;"
    )
}

/// The token of record `key` of `op` (the test connects as a superuser).
fn token(op: &str, key: &str) -> String {
    format!("(SELECT token FROM idem_records WHERE operation = '{op}' AND key = '{key}')")
}

/// Records of `op` expired (lease and ttl).
fn expire(op: &str) -> String {
    format!("UPDATE idem_records SET expires_at = now() - interval '1 s', lease_expires_at = now() - interval '1 s' WHERE operation = '{op}';")
}

/// PROCESSING records of `op` whose lease expired.
fn stuck(op: &str) -> String {
    format!("UPDATE idem_records SET lease_expires_at = now() - interval '1 s' WHERE operation = '{op}';")
}

/// Every case: a name, statements committed before it, one transaction each (the extension
/// writes a reservation's record at COMMIT), and its statements.
fn cases() -> Vec<(&'static str, Vec<String>, String)> {
    let completed = |op: &str, status: &str| {
        format!(
            "SELECT idem_complete('{op}', 'u', 'p1', {}, '{{}}', '{status}');",
            token(op, "p1")
        )
    };
    vec![
        ("idem_reserve, a new key", vec![], "SELECT idem_reserve('c.one', 'u', 'k1', 'h');".into()),
        ("idem_reserve wait => true, a new key", vec![], "SELECT idem_reserve('c.one_wait', 'u', 'k1', 'h', wait => true);".into()),
        ("idem_reserve and idem_complete, one key", vec![], format!("{}{}", single_reserves("c.pair", 1, false), single_completes("c.pair"))),
        ("200 idem_reserve and 200 idem_complete calls (past the lock budget)", vec![], format!("{}{}", single_reserves("c.200", 200, false), single_completes("c.200"))),
        ("200 idem_reserve wait => true and 200 idem_complete calls", vec![], format!("{}{}", single_reserves("c.200w", 200, true), single_completes("c.200w"))),
        ("idem_reserve_many and idem_complete_many, 1,000 keys", vec![], batch_calls("c.many", 1000, false)),
        ("idem_reserve_many wait => true and idem_complete_many, 1,000 keys", vec![], batch_calls("c.many_wait", 1000, true)),
        ("idem_reserve, a takeover of an expired key", vec![reserved("c.takeover", 1), completed("c.takeover", "SUCCESS"), expire("c.takeover")], "SELECT idem_reserve('c.takeover', 'u', 'p1', 'h');".into()),
        ("idem_reserve, a replay", vec![reserved("c.replay", 1), completed("c.replay", "SUCCESS")], "SELECT idem_reserve('c.replay', 'u', 'p1', 'h');".into()),
        ("idem_reserve, failed", vec![reserved("c.failed", 1), completed("c.failed", "FAILED")], "SELECT idem_reserve('c.failed', 'u', 'p1', 'h');".into()),
        ("idem_reserve, in_progress", vec![reserved("c.busy", 1)], "SELECT idem_reserve('c.busy', 'u', 'p1', 'h');".into()),
        ("idem_reserve, mismatch", vec![reserved("c.mismatch", 1)], "SELECT idem_reserve('c.mismatch', 'u', 'p1', 'other');".into()),
        ("idem_complete, FAILED", vec![reserved("c.complete_failed", 1)], completed("c.complete_failed", "FAILED")),
        ("idem_complete, a stale token", vec![reserved("c.stale", 1)], "SELECT idem_complete('c.stale', 'u', 'p1', -1, '{}');".into()),
        ("idem_release, released", vec![reserved("c.release", 1)], format!("SELECT idem_release('c.release', 'u', 'p1', {});", token("c.release", "p1"))),
        ("idem_release, poisoned", vec![reserved("c.poison", 1)], format!("SELECT idem_release('c.poison', 'u', 'p1', {}, max_retries => 1);", token("c.poison", "p1"))),
        ("idem_heartbeat", vec![reserved("c.heartbeat", 1)], format!("SELECT idem_heartbeat('c.heartbeat', 'u', 'p1', {});", token("c.heartbeat", "p1"))),
        ("idem_recover_stuck, fail, 50 keys", vec![reserved("c.recover_fail", 50), stuck("c.recover_fail")], "SELECT idem_recover_stuck(batch_size => 100);".into()),
        ("idem_recover_stuck, release, 50 keys", vec![reserved("c.recover_release", 50), stuck("c.recover_release")], "SELECT idem_recover_stuck(batch_size => 100, action => 'release');".into()),
        ("idem_sweep, 50 expired records and counters", vec![reserved("c.sweep", 50), expire("c.sweep")], "UPDATE idem_retries SET expires_at = now() - interval '1 s'; SELECT idem_sweep();".into()),
        ("idem_lookup", vec![reserved("c.lookup", 1)], "SELECT * FROM idem_lookup('c.lookup', 'u', 'p1');".into()),
        ("idem_stats", vec![], "SELECT * FROM idem_stats();".into()),
        ("idem_fingerprint (jsonb, text, bytea)", vec![], "SELECT idem_fingerprint('{\"a\": 1}'::jsonb), idem_fingerprint('{\"a\": 1}'::text), idem_fingerprint('\\x01'::bytea);".into()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_function_runs_without_a_subtransaction() {
    let server = counting_server("nosubxact", 41);
    let major = server.major();
    let url = database_on(&server, "idem_counted").await;
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    c.batch_execute("CREATE TABLE control (k integer PRIMARY KEY)")
        .await
        .expect("the controls' table");
    let install = std::env::var("IDEM_INSTALL").unwrap_or_else(|_| "extension".into());

    // The controls: the count sees a subtransaction when one writes.
    let savepoint = used(&c, major, "INSERT INTO control VALUES (0); SAVEPOINT s; INSERT INTO control VALUES (1); RELEASE SAVEPOINT s;").await;
    assert_eq!(
        savepoint.subtransactions(),
        1,
        "control, a SAVEPOINT around a write: {savepoint:?}"
    );
    let per_key = used(
        &c,
        major,
        "DO $$ BEGIN FOR i IN 2..4 LOOP BEGIN INSERT INTO control VALUES (i); EXCEPTION WHEN lock_not_available THEN NULL; END; END LOOP; END $$;",
    )
    .await;
    assert_eq!(
        per_key.subtransactions(),
        3,
        "control, a per-key EXCEPTION block around 3 inserts: {per_key:?}"
    );
    if major >= 16 {
        assert_eq!(
            per_key.cache,
            Some((3, false)),
            "control: pg_stat_get_backend_subxact sees the 3: {per_key:?}"
        );
    }

    let mut wrong = Vec::new();
    for (name, setup, body) in cases() {
        for sql in &setup {
            c.batch_execute(sql)
                .await
                .unwrap_or_else(|e| panic!("{name}: setup {sql}: {e:?}"));
        }
        let u = used(&c, major, &body).await;
        println!(
            "{install} pg{major}: {name}: {} transaction IDs ({} subtransactions), cache {:?}",
            u.xids,
            u.subtransactions(),
            u.cache
        );
        if u.subtransactions() != 0 || u.cache.is_some_and(|(n, over)| n != 0 || over) {
            wrong.push(format!("{name}: {u:?}"));
        }
    }

    // idem_maintain commits batch by batch: one transaction ID for each of its two transactions
    // that write (50 stuck keys recovered, then 50 expired records swept, batches of 100), no more.
    // A database of its own, so that nothing else is stuck or expired there.
    let url = database_on(&server, "idem_counted_maintain").await;
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    // The operation's records first (OFFSET 0 keeps the filter below the call): the table has no
    // index on operation, and a sequential scan may evaluate the call before the filter.
    let complete_all = "SELECT count(*) FROM (SELECT * FROM idem_records WHERE operation = 'c.maintain_sweep' OFFSET 0) AS r \
                        WHERE idem_complete(r.operation, r.user_id, r.key, r.token, '{}')";
    for sql in [
        reserved("c.maintain", 50),
        stuck("c.maintain"),
        reserved("c.maintain_sweep", 50),
        complete_all.into(),
        expire("c.maintain_sweep"),
    ] {
        c.batch_execute(&sql).await.expect("idem_maintain's setup");
    }
    let before = next_xid(&c).await;
    c.batch_execute("CALL idem_maintain(batch_size => 100)")
        .await
        .expect("CALL idem_maintain");
    let xids = next_xid(&c).await - before - 1;
    println!(
        "{install} pg{major}: idem_maintain: {xids} transaction IDs (its 2 writing transactions)"
    );
    if xids != 2 {
        wrong.push(format!(
            "idem_maintain: {xids} transaction IDs for its 2 writing transactions"
        ));
    }
    assert!(
        wrong.is_empty(),
        "cases that used a subtransaction ({install}, PostgreSQL {major}):\n{}",
        wrong.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portable_fallback_is_bounded() {
    let server = counting_server("nosubxact-bound", 43);
    let major = server.major();
    let url = database_on(&server, "idem_bound").await;
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let portable = std::env::var("IDEM_INSTALL").as_deref() == Ok("portable");

    // No function but the portable fallback and the update's two batch functions (their block
    // entered only while idem_records_060 exists, by the maintenance) has an EXCEPTION block.
    let blocks: Vec<String> = c
        .query(
            "SELECT p.proname::text FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace \
              WHERE n.nspname = 'public' AND p.prosrc ~* '\\mEXCEPTION\\s+WHEN' ORDER BY 1",
            &[],
        )
        .await
        .expect("pg_proc")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        blocks,
        [
            "_idem_legacy_batch",
            "_idem_write_nowait",
            "idem_move_records"
        ],
        "functions with an EXCEPTION block"
    );

    // Another transaction past its lock budget (40 keys: past half of max_locks_per_transaction).
    let (holder, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .batch_execute("SELECT count(*) FROM idem_reserve_many('b.holder', 'u', ARRAY(SELECT 'k' || g FROM generate_series(1, 40) AS g), array_fill('h'::text, ARRAY[40]))")
        .await
        .unwrap();
    // Meanwhile: 10 new keys, one call each, with wait => false; and one of the holder's keys.
    let during = used(
        &c,
        major,
        &format!(
            "{} SELECT idem_reserve('b.holder', 'u', 'k40', 'h');",
            single_reserves("b.during", 10, false)
        ),
    )
    .await;
    let busy: String = c
        .query_one(
            "SELECT outcome FROM idem_reserve('b.holder', 'u', 'k40', 'h')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        busy, "in_progress",
        "a key the holder holds by its row alone"
    );
    holder.batch_execute("COMMIT").await.unwrap();
    let after = used(&c, major, &single_reserves("b.after", 10, false)).await;
    println!("while another transaction is past its budget: {during:?}; after it ended: {after:?}");
    if portable {
        // One per new key at most, plus the holder's key (its insert gave up).
        assert!(
            during.subtransactions() <= 11,
            "at most one subtransaction per new key: {during:?}"
        );
        assert!(
            during.subtransactions() >= 1,
            "the fallback ran (the bound is what this proves): {during:?}"
        );
    } else {
        assert_eq!(
            during.subtransactions(),
            0,
            "the extension: none, whatever another transaction does: {during:?}"
        );
    }
    assert_eq!(
        after.subtransactions(),
        0,
        "none once that transaction ended: {after:?}"
    );
}

#[derive(Debug, Clone)]
struct Failure(Option<serde_json::Value>);

impl HandlerError for Failure {
    fn disposition(&self) -> Disposition {
        match &self.0 {
            Some(response) => Disposition::Permanent(Some(response.clone())),
            None => Disposition::Transient,
        }
    }
}

impl From<DbError> for Failure {
    fn from(_: DbError) -> Self {
        Failure(None)
    }
}

fn fp(n: i64) -> Fingerprint {
    Fingerprint::of_json(&json!({"amount": n})).unwrap()
}

/// The tracked statements of the database that open, end or roll back to a subtransaction, and
/// how many statements were tracked in all.
async fn subtransactions(admin: &tokio_postgres::Client, db: &str) -> (Vec<String>, i64) {
    let rows = admin
        .query(
            "SELECT s.query, s.calls FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
              WHERE d.datname = $1",
            &[&db],
        )
        .await
        .expect("read pg_stat_statements");
    let mut found = Vec::new();
    let mut calls = 0;
    for row in rows {
        let (query, n): (String, i64) = (row.get(0), row.get(1));
        calls += n;
        let q = query.trim_start().to_ascii_uppercase();
        if q.starts_with("SAVEPOINT") || q.starts_with("RELEASE") || q.starts_with("ROLLBACK TO") {
            found.push(format!("{query} ({n} calls)"));
        }
    }
    (found, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_outcome_takes_a_savepoint() {
    let name = "idem_no_subtransaction";
    let url = fresh_database(name).await;
    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    admin.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.expect("pg_stat_statements (preloaded by the private cluster: idempotency_pgserver::PRIVATE_SETTINGS)");
    admin
        .batch_execute(&format!("ALTER DATABASE {name} SET pg_stat_statements.track = 'all'; ALTER DATABASE {name} SET pg_stat_statements.track_utility = on"))
        .await
        .expect("track every statement of the database");

    // The control: a savepoint in a fresh session of the database is seen.
    let (control, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    admin
        .execute("SELECT pg_stat_statements_reset()", &[])
        .await
        .expect("reset");
    control.batch_execute("BEGIN; SAVEPOINT control; ROLLBACK TO SAVEPOINT control; RELEASE SAVEPOINT control; COMMIT").await.unwrap();
    let (seen, _) = subtransactions(&admin, name).await;
    assert_eq!(
        seen.len(),
        3,
        "the control's SAVEPOINT, ROLLBACK TO and RELEASE are counted: {seen:?}"
    );
    admin
        .execute("SELECT pg_stat_statements_reset()", &[])
        .await
        .expect("reset");

    let idem = connect_with(
        &url,
        4,
        Settings::builder()
            .max_retries(2)
            .lease(Duration::from_secs(5)),
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let mut seen = Vec::new();

    // In-transaction: success, then its replay and a mismatch.
    let key = unique_key("nosub.success");
    seen.push(
        idem.run(&key, &fp(1), Charge::of(&key).handler::<Failure>(&runs))
            .await
            .map(|o| o.decision()),
    );
    seen.push(
        idem.run(&key, &fp(1), Charge::of(&key).handler::<Failure>(&runs))
            .await
            .map(|o| o.decision()),
    );
    seen.push(
        idem.run(&key, &fp(2), Charge::of(&key).handler::<Failure>(&runs))
            .await
            .map(|o| o.decision()),
    );
    // A transient result (503), then a transient error that poisons the key (max_retries 2).
    let key = unique_key("nosub.transient");
    seen.push(
        idem.run(
            &key,
            &fp(1),
            Charge::of(&key).status(503).handler::<Failure>(&runs),
        )
        .await
        .map(|o| o.decision()),
    );
    let poisoned = idem
        .run(&key, &fp(1), Charge::of(&key).failing(&runs, Failure(None)))
        .await;
    assert!(
        matches!(poisoned, Err(Error::Poisoned { .. })),
        "{poisoned:?}"
    );
    // A permanent error, stored.
    let key = unique_key("nosub.permanent");
    let permanent = idem
        .run(
            &key,
            &fp(1),
            Charge::of(&key).failing(&runs, Failure(Some(json!({"status": 402})))),
        )
        .await;
    assert!(
        matches!(permanent, Err(Error::Handler { .. })),
        "{permanent:?}"
    );
    let replayed = idem
        .run(&key, &fp(1), Charge::of(&key).handler::<Failure>(&runs))
        .await;
    assert!(
        matches!(replayed, Err(Error::Failed { response: Some(_) })),
        "{replayed:?}"
    );
    // A serialization failure inside the closure: the whole transaction is retried.
    let key = unique_key("nosub.retry");
    let tries = Arc::new(AtomicUsize::new(0));
    let retried = idem
        .run(&key, &fp(1), {
            let tries = tries.clone();
            move |tx: &mut Conn| {
                let tries = tries.clone();
                Box::pin(async move {
                    if tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                        batch(tx, "DO $$ BEGIN RAISE EXCEPTION 'forced' USING ERRCODE = 'serialization_failure'; END $$").await?;
                    }
                    Ok(StoredResponse::json(201, json!({})))
                }) as TxFuture<'_, _, DbError>
            }
        })
        .await;
    assert!(matches!(retried, Ok(Outcome::Executed(_))), "{retried:?}");
    // A lost lease: the closure moves the record to another token, so the completion fails.
    let key = unique_key("nosub.lease");
    let scope = [
        key.operation().to_owned(),
        key.user_id().to_owned(),
        key.key().to_owned(),
    ];
    let lost = idem
        .run(&key, &fp(1), move |tx: &mut Conn| {
            let scope = scope.clone();
            Box::pin(async move {
                exec(
                    tx,
                    "SELECT FROM idem_lookup($1, $2, $3)",
                    &[&scope[0], &scope[1], &scope[2]],
                )
                .await?;
                exec(
                    tx,
                    "UPDATE idem_records SET token = token + 1000000 WHERE key = $1",
                    &[&scope[2]],
                )
                .await?;
                Ok(StoredResponse::json(201, json!({})))
            }) as TxFuture<'_, _, DbError>
        })
        .await;
    assert!(matches!(lost, Err(Error::LeaseLost { .. })), "{lost:?}");
    // A closure that panics: its task dies, the connection is closed, the server rolls back.
    let key = unique_key("nosub.panic");
    let panicked = tokio::spawn({
        let (idem, key) = (idem.clone(), key.clone());
        async move {
            idem.run(&key, &fp(1), |tx: &mut Conn| {
                Box::pin(async move {
                    batch(tx, "SELECT 1").await?;
                    if std::hint::black_box(false) {
                        return Ok(StoredResponse::json(200, json!({})));
                    }
                    panic!("the handler panicked");
                }) as TxFuture<'_, StoredResponse, DbError>
            })
            .await
        }
    })
    .await;
    assert!(panicked.is_err_and(|e| e.is_panic()));

    // Batches: executed (a success and a permanent failure), replayed, a closure error, a lost
    // lease.
    let items: Vec<BatchItem> = (0..3)
        .map(|i| BatchItem {
            key: format!("nosub-b{i}"),
            fingerprint: fp(i),
        })
        .collect();
    let done = idem
        .run_batch("nosub.batch", "u", &items, answers)
        .await
        .unwrap();
    assert!(
        done.iter()
            .all(|(_, o)| matches!(o, BatchOutcome::Executed(_))),
        "{done:?}"
    );
    let again = idem
        .run_batch("nosub.batch", "u", &items, answers)
        .await
        .unwrap();
    assert!(matches!(again[2].1, BatchOutcome::Failed(_)), "{again:?}");
    let failed = idem
        .run_batch(
            "nosub.batch",
            "u",
            &[BatchItem {
                key: "nosub-bx".into(),
                fingerprint: fp(1),
            }],
            |conn: &mut Conn, _: &[String]| {
                Box::pin(async move {
                    batch(conn, "SELECT 1").await?;
                    Err::<Vec<StoredResponse>, _>(Failure(None))
                }) as TxFuture<'_, _, Failure>
            },
        )
        .await;
    assert!(matches!(failed, Err(Error::Handler { .. })), "{failed:?}");
    let lost = idem
        .run_batch(
            "nosub.batch",
            "u",
            &[BatchItem {
                key: "nosub-bl".into(),
                fingerprint: fp(1),
            }],
            |conn: &mut Conn, keys: &[String]| {
                let n = keys.len();
                Box::pin(async move {
                    exec(
                        conn,
                        "SELECT FROM idem_lookup('nosub.batch', 'u', 'nosub-bl')",
                        &[],
                    )
                    .await?;
                    exec(
                        conn,
                        "UPDATE idem_records SET token = token + 1000000 WHERE key = 'nosub-bl'",
                        &[],
                    )
                    .await?;
                    Ok(vec![StoredResponse::json(201, json!({})); n])
                }) as TxFuture<'_, _, DbError>
            },
        )
        .await;
    assert!(matches!(lost, Err(Error::LeaseLost { .. })), "{lost:?}");

    // Two-phase: success, a transient result, a permanent error.
    let key = unique_key("nosub.external");
    let ok = idem
        .run_external(
            &key,
            &fp(1),
            async { Ok::<_, Failure>(StoredResponse::json(201, json!({}))) },
            nothing,
        )
        .await;
    assert!(matches!(ok, Ok(Outcome::Executed(_))), "{ok:?}");
    let key = unique_key("nosub.external_transient");
    let released = idem
        .run_external(
            &key,
            &fp(1),
            async { Ok::<_, Failure>(StoredResponse::json(503, json!({}))) },
            nothing,
        )
        .await;
    assert!(matches!(released, Ok(Outcome::Released(_))), "{released:?}");
    let key = unique_key("nosub.external_permanent");
    let failed = idem
        .run_external(
            &key,
            &fp(1),
            async { Err::<StoredResponse, _>(Failure(Some(json!({"status": 402})))) },
            nothing,
        )
        .await;
    assert!(matches!(failed, Err(Error::Handler { .. })), "{failed:?}");

    let labels: Vec<_> = seen
        .iter()
        .map(|r| {
            r.as_ref()
                .map(|d| d.as_str())
                .map_err(|e| e.decision().as_str())
        })
        .collect();
    assert_eq!(
        labels,
        [
            Ok("executed"),
            Ok("replayed"),
            Err("mismatch"),
            Ok("released")
        ]
    );

    let (found, calls) = subtransactions(&admin, name).await;
    assert!(
        calls > 20,
        "pg_stat_statements tracked the flows' statements ({calls} calls)"
    );
    assert!(
        found.is_empty(),
        "statements that open a subtransaction: {found:?}"
    );
}

/// A batch's closure: one statement, 201 for every created key but the last, 402 for it.
fn answers<'t>(
    conn: &'t mut Conn,
    keys: &'t [String],
) -> TxFuture<'t, Vec<StoredResponse>, DbError> {
    let n = keys.len();
    Box::pin(async move {
        batch(conn, "SELECT 1").await?;
        let mut out = vec![StoredResponse::json(201, json!({})); n];
        out[n - 1] = StoredResponse::json(402, json!({}));
        Ok(out)
    })
}

fn nothing<'t>(_: &'t mut Conn, _: &'t StoredResponse) -> TxFuture<'t, (), Failure> {
    Box::pin(std::future::ready(Ok(())))
}
