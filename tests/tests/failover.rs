//! Failover to a streaming standby, on the major of `PG_CONFIG` (the extension installed in it):
//! a primary and a standby made with `pg_basebackup -R` on 127.0.0.1 (synchronous replication),
//! the in-transaction flow under load from several sessions, the primary killed (`immediate`)
//! mid-load, the standby promoted. Proves:
//!
//! - on the standby: a new key, complete, release, heartbeat, recovery and sweep raise 25006
//!   saying the server is in recovery; replays, failed and mismatch answers and idem_lookup
//!   still answer; the maintenance worker does not run;
//! - after promotion: every acknowledged key kept its record; every completed record has its
//!   business row and every business row its record; a retry of every key leaves exactly one
//!   execution per key; every new token exceeds every earlier one; the maintenance worker starts
//!   and recovers and sweeps rows written on the old primary.
//!
//! Ports: `IDEM_SERVERS_PORT` (default 55900) and the next one. Ignored in the plain e2e run (it
//! starts servers of its own and does not depend on the install under test): run it with
//! `cargo test -p idempotency-tests --test failover -- --ignored`.

use idempotency_testkit::pg_config;
use idempotency_testkit::server::{eventually, extension_installed, Server, Stop};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::{Client, NoTls};

const DB: &str = "idem_failover";
const OP: &str = "failover.charge";
const SESSIONS: usize = 8;
/// Acknowledged keys before the primary is killed.
const BEFORE_KILL: usize = 400;

fn port_base() -> u16 {
    std::env::var("IDEM_SERVERS_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(55900)
}

async fn connect(url: &str) -> Result<Client, String> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.map_err(|e| format!("connect {url}: {e}"))?;
    tokio::spawn(conn);
    Ok(client)
}

/// Prints a check that held (the test panics on the first that does not).
fn ok(what: &str) {
    println!("ok: {what}");
}

/// SQLSTATE, message and hint of a failed statement.
fn db_error(e: &tokio_postgres::Error) -> (String, String, String) {
    match e.as_db_error() {
        Some(d) => (d.code().code().to_owned(), d.message().to_owned(), d.hint().unwrap_or_default().to_owned()),
        None => ("none".to_owned(), e.to_string(), String::new()),
    }
}

/// One key through the in-transaction flow: reserve; if created, the business row and the
/// completion; commit. Answers the outcome and the token (created only).
async fn charge(client: &Client, user: &str, key: &str) -> Result<(String, Option<i64>), tokio_postgres::Error> {
    client.batch_execute("BEGIN").await?;
    let row = client.query_one("SELECT outcome, token FROM idem_reserve($1, $2, $3, 'h')", &[&OP, &user, &key]).await?;
    let (outcome, token): (String, Option<i64>) = (row.get(0), row.get(1));
    if let Some(token) = token {
        let tag = format!("{user}/{key}");
        client.execute("INSERT INTO charges (k, amount) VALUES ($1, 1)", &[&tag]).await?;
        let done: bool = client
            .query_one("SELECT idem_complete($1, $2, $3, $4, jsonb_build_object('charge', $5::text))", &[&OP, &user, &key, &token, &tag])
            .await?
            .get(0);
        assert!(done, "{tag}: idem_complete with the fresh token answered false");
    }
    client.batch_execute("COMMIT").await?;
    Ok((outcome, token))
}

async fn one_i64(client: &Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
}

/// Each action a standby must refuse, and the words of its message.
const REFUSED: [(&str, &str); 6] = [
    ("SELECT idem_reserve('failover.charge', 'seen', 'new-key', 'h')", "reserve a key"),
    ("SELECT idem_complete('failover.charge', 'maint', 'stuck', 1, '{}')", "complete a key"),
    ("SELECT idem_release('failover.charge', 'maint', 'stuck', 1)", "release a key"),
    ("SELECT idem_heartbeat('failover.charge', 'maint', 'stuck', 1)", "extend a lease"),
    ("SELECT idem_recover_stuck()", "recover stuck reservations"),
    ("SELECT idem_sweep()", "sweep expired records"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "its own layer (two servers of their own): cargo test -p idempotency-tests --test failover -- --ignored"]
async fn failover_to_a_promoted_standby_keeps_every_key_once() {
    let pgc = pg_config();
    assert!(
        extension_installed(&pgc),
        "the idempotency extension is not installed in {} (cargo pgrx install --release --pg-config ...)",
        pgc.display()
    );
    let base = port_base();
    let primary = Server::new("failover-primary", &pgc, base);
    println!("failover on PostgreSQL {} (ports {base}, {})", primary.major(), base + 1);
    primary.initdb(&[]);
    primary.configure("shared_preload_libraries = 'idempotency'\nmax_connections = 50\nwal_keep_size = '512MB'\n");
    primary.start();
    let admin = connect(&primary.url("postgres")).await.unwrap();
    admin.batch_execute(&format!("CREATE DATABASE {DB}")).await.unwrap();
    let db = connect(&primary.url(DB)).await.unwrap();
    db.batch_execute(
        "CREATE EXTENSION idempotency;
         CREATE TABLE charges (id bigserial PRIMARY KEY, k text NOT NULL, amount bigint NOT NULL);
         -- For the standby: a finished key of each kind.
         SELECT idem_complete('failover.charge', 'seen', 'done', (SELECT token FROM idem_reserve('failover.charge', 'seen', 'done', 'h')), '{\"id\": 1}');
         SELECT idem_complete('failover.charge', 'seen', 'failed', (SELECT token FROM idem_reserve('failover.charge', 'seen', 'failed', 'h')), '{\"error\": 1}', 'FAILED');
         SELECT token FROM idem_reserve('failover.charge', 'seen', 'busy', 'h', ttl => '1 day', lease => '1 day');
         -- For the worker after promotion: 20 finished records that expire in a second, and a
         -- two-phase reservation whose lease runs out in a second and is never completed.
         SELECT idem_complete('failover.charge', 'maint', 'expired-' || i, (SELECT token FROM idem_reserve('failover.charge', 'maint', 'expired-' || i, 'h', ttl => '1 second')), '{}')
           FROM generate_series(1, 20) AS i;
         SELECT token FROM idem_reserve('failover.charge', 'maint', 'stuck', 'h', ttl => '1 hour', lease => '1 second');",
    )
    .await
    .unwrap();

    // The standby: configured to run the maintenance worker on the database (the primary is not),
    // so its silence in recovery and its start at promotion are what is watched.
    let standby = Server::standby_of(&primary, "failover-standby", base + 1);
    standby.configure(&format!("idempotency.maintenance_databases = '{DB}'\nidempotency.maintenance_interval = 1\n"));
    standby.start();
    for sql in [r#"ALTER SYSTEM SET synchronous_standby_names = '"failover-standby"'"#, "SELECT pg_reload_conf()"] {
        admin.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }
    eventually("the standby replicates synchronously and has replayed everything", Duration::from_secs(60), || async {
        let row = admin
            .query_opt(
                "SELECT sync_state, coalesce(replay_lsn >= pg_current_wal_lsn(), false) FROM pg_stat_replication WHERE application_name = 'failover-standby'",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?;
        match row {
            Some(r) if r.get::<_, String>(0) == "sync" && r.get::<_, bool>(1) => Ok(()),
            Some(r) => Err(format!("sync_state {}, caught up {}", r.get::<_, String>(0), r.get::<_, bool>(1))),
            None => Err("no walsender for failover-standby".into()),
        }
    })
    .await;
    ok("a streaming standby made with pg_basebackup -R replicates synchronously");

    // On the standby.
    let sb = connect(&standby.url(DB)).await.unwrap();
    assert!(sb.query_one("SELECT pg_is_in_recovery()", &[]).await.unwrap().get::<_, bool>(0));
    for (key, hash, want) in [("done", "h", "replay"), ("failed", "h", "failed"), ("done", "other", "mismatch"), ("busy", "h", "in_progress")] {
        let row = sb.query_one("SELECT outcome, response FROM idem_reserve($1, 'seen', $2, $3)", &[&OP, &key, &hash]).await.unwrap();
        let outcome: String = row.get(0);
        assert_eq!(outcome, want, "idem_reserve of the {key} key with hash {hash} on the standby");
    }
    let replay: serde_json::Value =
        sb.query_one("SELECT response FROM idem_reserve($1, 'seen', 'done', 'h')", &[&OP]).await.unwrap().get(0);
    assert_eq!(replay, serde_json::json!({"id": 1}), "the replayed response on the standby");
    let status: String = sb.query_one("SELECT status FROM idem_lookup($1, 'seen', 'done')", &[&OP]).await.unwrap().get(0);
    assert_eq!(status, "SUCCESS");
    let processing = one_i64(&sb, "SELECT processing FROM idem_stats()").await;
    assert!(processing >= 2, "idem_stats() on the standby: {processing} processing");
    let counted = one_i64(&sb, "SELECT value FROM idem_metrics() WHERE name = 'reservations_replay'").await;
    assert!(counted >= 2, "the standby's own replay counter: {counted}");
    let fingerprint: String = sb.query_one("SELECT idem_fingerprint('{\"a\": 1}'::jsonb)", &[]).await.unwrap().get(0);
    assert_eq!(fingerprint.len(), 64);
    ok("the standby answers replay (with the stored response), failed, mismatch, in_progress, idem_lookup, idem_stats, idem_metrics and idem_fingerprint");
    for (sql, action) in REFUSED {
        let e = sb.batch_execute(sql).await.expect_err(sql);
        let (code, message, hint) = db_error(&e);
        assert_eq!(code, "25006", "{sql}: {message}");
        assert_eq!(message, format!("idempotency: cannot {action} on a server in recovery (a standby)"), "{sql}");
        assert!(hint.contains("primary") && hint.contains("failover"), "{sql}: hint {hint:?}");
        if action == "reserve a key" {
            println!("    the client sees: SQLSTATE {code}, message {message:?}, hint {hint:?}");
        }
    }
    ok("on the standby, a new key, complete, release, heartbeat, recover and sweep raise 25006 naming recovery, with a hint naming the primary");
    let expired = eventually("the 20 expired records are expired on the standby", Duration::from_secs(30), || async {
        let n = one_i64(&sb, "SELECT count(*) FROM idem_records WHERE user_id = 'maint' AND key LIKE 'expired-%' AND expires_at <= clock_timestamp()").await;
        if n == 20 { Ok(n) } else { Err(format!("{n} expired")) }
    })
    .await;
    assert_eq!(expired, 20);

    // The load: the in-transaction flow from SESSIONS sessions; the primary dies mid-load.
    let acked: Arc<Mutex<BTreeMap<String, i64>>> = Arc::default();
    let in_doubt: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let mut sessions = Vec::new();
    for s in 0..SESSIONS {
        let (acked, in_doubt, url) = (acked.clone(), in_doubt.clone(), primary.url(DB));
        sessions.push(tokio::spawn(async move {
            let client = connect(&url).await.unwrap();
            let user = format!("u{s}");
            for i in 0.. {
                let key = format!("k{i}");
                match charge(&client, &user, &key).await {
                    Ok((outcome, token)) => {
                        assert_eq!(outcome, "created", "{user}/{key} on the primary before the kill");
                        acked.lock().unwrap().insert(format!("{user}/{key}"), token.expect("created has a token"));
                    }
                    Err(_) => {
                        // The primary is gone: this key's commit may or may not have happened.
                        in_doubt.lock().unwrap().insert(format!("{user}/{key}"));
                        return i + 1;
                    }
                }
            }
            unreachable!()
        }));
    }
    eventually("the load acknowledges enough keys", Duration::from_secs(180), || async {
        let n = acked.lock().unwrap().len();
        if n >= BEFORE_KILL { Ok(()) } else { Err(format!("{n} acknowledged")) }
    })
    .await;
    tokio::task::block_in_place(|| primary.stop(Stop::Immediate));
    let mut attempted = BTreeSet::new();
    for (s, session) in sessions.into_iter().enumerate() {
        let tried = session.await.expect("session");
        // Every key a session tried, and the next 5 it never reached.
        attempted.extend((0..tried + 5).map(|i| format!("u{s}/k{i}")));
    }
    let acked = acked.lock().unwrap().clone();
    let in_doubt = in_doubt.lock().unwrap().clone();
    println!("    killed the primary after {} acknowledged keys, {} in doubt", acked.len(), in_doubt.len());

    // Before promotion the worker has done nothing on the standby.
    let launchers = one_i64(&sb, "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency maintenance%'").await;
    assert_eq!(launchers, 0, "maintenance processes on the standby");
    let still = one_i64(&sb, "SELECT count(*) FROM idem_records WHERE user_id = 'maint'").await;
    assert_eq!(still, 21, "the expired and stuck records are all still on the standby");
    assert!(!standby.log().contains("idempotency maintenance launcher started"), "the standby's log shows a launcher");
    ok("in recovery the maintenance worker stays quiet: no launcher, the 20 expired and the stuck record untouched");

    tokio::task::block_in_place(|| standby.promote());
    let db = connect(&standby.url(DB)).await.unwrap();
    assert!(!db.query_one("SELECT pg_is_in_recovery()", &[]).await.unwrap().get::<_, bool>(0));
    ok("the standby is promoted");

    // Every acknowledged key kept its record, with its token.
    let rows = db
        .query("SELECT user_id || '/' || key, token, status FROM idem_records WHERE operation = $1 AND user_id LIKE 'u%'", &[&OP])
        .await
        .unwrap();
    let records: BTreeMap<String, (i64, String)> = rows.iter().map(|r| (r.get(0), (r.get(1), r.get(2)))).collect();
    for (key, token) in &acked {
        assert_eq!(records.get(key), Some(&(*token, "SUCCESS".to_owned())), "acknowledged key {key}");
    }
    ok(&format!("all {} acknowledged keys survived the failover as SUCCESS with their tokens (synchronous replication)", acked.len()));
    assert!(records.values().all(|(_, s)| s == "SUCCESS"), "a load key is not SUCCESS after the failover");
    let orphans = one_i64(&db, "SELECT count(*) FROM charges c WHERE NOT EXISTS (SELECT FROM idem_records r WHERE r.user_id || '/' || r.key = c.k AND r.status = 'SUCCESS')").await;
    let unbacked = one_i64(&db, "SELECT count(*) FROM idem_records r WHERE r.user_id LIKE 'u%' AND (SELECT count(*) FROM charges c WHERE c.k = r.user_id || '/' || r.key) <> 1").await;
    assert_eq!((orphans, unbacked), (0, 0), "business rows without a record, records without exactly one business row");
    ok(&format!("every completed record ({}) has its business row and every business row its record", records.len()));

    // A retry of every key on the promoted node.
    let old_max = one_i64(&db, "SELECT max(token) FROM idem_records").await;
    assert!(acked.values().all(|t| *t <= old_max));
    let mut executed = 0;
    let mut new_tokens = Vec::new();
    for tag in &attempted {
        let (user, key) = tag.split_once('/').unwrap();
        let (outcome, token) = charge(&db, user, key).await.unwrap_or_else(|e| panic!("retry of {tag}: {e}"));
        match outcome.as_str() {
            "created" => {
                assert!(!records.contains_key(tag), "{tag} had a record but was created again");
                executed += 1;
                new_tokens.push(token.unwrap());
            }
            "replay" => assert!(records.contains_key(tag), "{tag} replayed without a record"),
            other => panic!("retry of {tag}: {other}"),
        }
    }
    let per_key = db
        .query("SELECT k, count(*) FROM charges GROUP BY k HAVING count(*) <> 1", &[])
        .await
        .unwrap();
    assert!(per_key.is_empty(), "keys executed other than once: {:?}", per_key.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>());
    let distinct = one_i64(&db, "SELECT count(DISTINCT k) FROM charges").await;
    assert_eq!(distinct as usize, attempted.len());
    ok(&format!(
        "a retry of all {} keys: {} replayed, {} executed now (never committed before), exactly one execution per key",
        attempted.len(),
        attempted.len() - executed,
        executed
    ));
    assert!(!new_tokens.is_empty(), "no key was left to execute after the failover");
    assert!(new_tokens.iter().all(|t| *t > old_max), "a token issued after promotion is not above {old_max}: {new_tokens:?}");
    ok(&format!("every token issued after promotion ({} of them, from {}) exceeds every earlier one (max {old_max})", new_tokens.len(), new_tokens.iter().min().unwrap()));

    // The worker on the promoted node.
    eventually("the worker recovers and sweeps on the promoted node", Duration::from_secs(60), || async {
        let left = one_i64(&db, "SELECT count(*) FROM idem_records WHERE user_id = 'maint' AND key LIKE 'expired-%'").await;
        let stuck: Option<String> = db
            .query_opt("SELECT status FROM idem_records WHERE user_id = 'maint' AND key = 'stuck'", &[])
            .await
            .map_err(|e| e.to_string())?
            .map(|r| r.get(0));
        if left == 0 && stuck.as_deref() == Some("FAILED") { Ok(()) } else { Err(format!("{left} expired left, stuck is {stuck:?}")) }
    })
    .await;
    let log = standby.log();
    assert!(log.contains("idempotency maintenance launcher started"), "no launcher start in the promoted server's log");
    let line = log
        .lines()
        .find(|l| l.contains(&format!("idempotency maintenance in database \"{DB}\"")))
        .expect("a maintenance summary line");
    println!("    {}", line.split_once(": ").map_or(line, |(_, rest)| rest));
    ok("after promotion the maintenance worker starts, fails the stuck reservation and sweeps the 20 expired records of the old primary");
    standby.stop(Stop::Fast);
}
