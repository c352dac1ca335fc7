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
//!   and sweeps rows written on the old primary, and gives a two-phase reservation whose lease
//!   ran out during the failover one lease of grace: it is not recovered, and its attempt
//!   heartbeats and completes on the new primary.
//!
//! Then the same failover through the client, as users reach a pair: the example service of each
//! driver (`idempotency_examples::charges`, `charges_sqlx`) under HTTP load from
//! several clients, each retrying a key after an error until it is acknowledged, through one
//! URL naming both servers (`target_session_attrs=read-write`; tokio-postgres tries them in
//! order, sqlx refuses the URL, naming the alternatives) and through one endpoint that moves to
//! the standby (the test kit's forwarder, re-pointed when the primary is down). Proves, on the
//! promoted standby: every acknowledged key has its business row (the id of its first answer)
//! and its record, and ran once; a retry of every key replays its first answer; every error in
//! the window was a 503 (StoreUnavailable), nothing else; the service executes keys again after
//! the promotion (awaited, with [`BACK_DEADLINE`] as a hang guard only). Prints the figures, measured,
//! never asserted: keys acknowledged, 503s, the time from the kill to the first execution.
//!
//! Ports: `IDEM_SERVERS_PORT` (default 55900) and the next one, one test at a time. Ignored in
//! the plain e2e run (it starts servers of its own and does not depend on the install under
//! test): run it with `cargo test -p idempotency-tests --test failover -- --ignored` (both drivers'
//! cases: every build has both).

use idempotency_client::Sqlx;
use idempotency_client::{Fingerprint, Idempotency, Key, Outcome, Postgres, Settings, StoredResponse};
use idempotency_examples::charges as pg_app;
use idempotency_examples::charges_sqlx as sqlx_app;
use idempotency_testkit::forwarder::Forwarder;
use idempotency_testkit::pg_config;
use idempotency_testkit::server::{eventually, extension_installed, Server, Stop};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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

/// The tests of this file share the two ports: one runs at a time.
static PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A primary with the extension in database [`DB`] (and `setup` run there), and a streaming
/// standby made with `pg_basebackup -R` (with `standby_settings`), replicating synchronously
/// and caught up.
struct Pair {
    primary: Server,
    standby: Server,
}

impl Pair {
    async fn start(name: &str, setup: &str, standby_settings: &str) -> Pair {
        let pgc = pg_config();
        assert!(
            extension_installed(&pgc),
            "the idempotency extension is not installed in {} (cargo pgrx install --release --pg-config ...)",
            pgc.display()
        );
        let base = port_base();
        let primary = Server::new(&format!("{name}-primary"), &pgc, base);
        println!("{name} on PostgreSQL {} (ports {base}, {})", primary.major(), base + 1);
        primary.initdb(&[]);
        primary.configure("shared_preload_libraries = 'idempotency'\nmax_connections = 50\nwal_keep_size = '512MB'\n");
        primary.start();
        let admin = connect(&primary.url("postgres")).await.unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {DB}")).await.unwrap();
        let db = connect(&primary.url(DB)).await.unwrap();
        db.batch_execute(&format!("CREATE EXTENSION idempotency;\n{setup}")).await.unwrap();
        let standby_name = format!("{name}-standby");
        let standby = Server::standby_of(&primary, &standby_name, base + 1);
        standby.configure(standby_settings);
        standby.start();
        for sql in [format!(r#"ALTER SYSTEM SET synchronous_standby_names = '"{standby_name}"'"#), "SELECT pg_reload_conf()".into()] {
            admin.batch_execute(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        }
        eventually("the standby replicates synchronously and has replayed everything", Duration::from_secs(60), || async {
            let row = admin
                .query_opt(
                    "SELECT sync_state, coalesce(replay_lsn >= pg_current_wal_lsn(), false) FROM pg_stat_replication WHERE application_name = $1",
                    &[&standby_name],
                )
                .await
                .map_err(|e| e.to_string())?;
            match row {
                Some(r) if r.get::<_, String>(0) == "sync" && r.get::<_, bool>(1) => Ok(()),
                Some(r) => Err(format!("sync_state {}, caught up {}", r.get::<_, String>(0), r.get::<_, bool>(1))),
                None => Err(format!("no walsender for {standby_name}")),
            }
        })
        .await;
        Pair { primary, standby }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "its own layer (two servers of their own): cargo test -p idempotency-tests --test failover -- --ignored"]
async fn failover_to_a_promoted_standby_keeps_every_key_once() {
    let _ports = PORTS.lock().await;
    let setup = "CREATE TABLE charges (id bigserial PRIMARY KEY, k text NOT NULL, amount bigint NOT NULL);
         -- For the standby: a finished key of each kind.
         SELECT idem_complete('failover.charge', 'seen', 'done', (SELECT token FROM idem_reserve('failover.charge', 'seen', 'done', 'h')), '{\"id\": 1}');
         SELECT idem_complete('failover.charge', 'seen', 'failed', (SELECT token FROM idem_reserve('failover.charge', 'seen', 'failed', 'h')), '{\"error\": 1}', 'FAILED');
         SELECT token FROM idem_reserve('failover.charge', 'seen', 'busy', 'h', ttl => '1 day', lease => '1 day');
         -- For the worker after promotion: 20 finished records that expire in a second, and a
         -- two-phase reservation whose lease runs out in a second and is never completed.
         SELECT idem_complete('failover.charge', 'maint', 'expired-' || i, (SELECT token FROM idem_reserve('failover.charge', 'maint', 'expired-' || i, 'h', ttl => '1 second')), '{}')
           FROM generate_series(1, 20) AS i;
         SELECT token FROM idem_reserve('failover.charge', 'maint', 'stuck', 'h', ttl => '1 hour', lease => '1 second');";
    // The standby: configured to run the maintenance worker on the database (the primary is not),
    // so its silence in recovery and its start at promotion are what is watched. Its lease
    // setting (1 hour) is the grace after promotion: longer than the test, so the stuck
    // reservation must outlive every pass the test sees.
    let standby_settings =
        format!("idempotency.maintenance_databases = '{DB}'\nidempotency.maintenance_interval = 1\nidempotency.lease = 3600\n");
    let Pair { primary, standby } = Pair::start("failover", setup, &standby_settings).await;
    ok("a streaming standby made with pg_basebackup -R replicates synchronously");

    // On the standby.
    let sb = connect(&standby.url(DB)).await.unwrap();
    assert!(sb.query_one("SELECT pg_is_in_recovery()", &[]).await.unwrap().get::<_, bool>(0));
    for (key, hash, want) in [("done", "h", "replay"), ("failed", "h", "failed"), ("done", "other", "mismatch"), ("busy", "h", "in_progress")] {
        let row = sb.query_one("SELECT outcome, response FROM idem_reserve($1, 'seen', $2, $3)", &[&OP, &key, &hash]).await.unwrap();
        let outcome: String = row.get(0);
        assert_eq!(outcome, want, "idem_reserve of the {key} key with hash {hash} on the standby");
    }
    let replay: Value =
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

    // The worker on the promoted node: it sweeps at once, and its passes (the sweep's among them)
    // leave the two-phase reservation whose lease ran out during the failover alone.
    eventually("the worker sweeps on the promoted node", Duration::from_secs(60), || async {
        let left = one_i64(&db, "SELECT count(*) FROM idem_records WHERE user_id = 'maint' AND key LIKE 'expired-%'").await;
        if left == 0 { Ok(()) } else { Err(format!("{left} expired left")) }
    })
    .await;
    let passes = one_i64(&db, "SELECT value FROM idem_metrics() WHERE name = 'worker_passes'").await;
    eventually("two more passes of the worker", Duration::from_secs(60), || async {
        let now = one_i64(&db, "SELECT value FROM idem_metrics() WHERE name = 'worker_passes'").await;
        if now >= passes + 2 { Ok(()) } else { Err(format!("{} passes since", now - passes)) }
    })
    .await;
    let (status, lease_over): (String, bool) = {
        let row = db
            .query_one("SELECT status, lease_expires_at < clock_timestamp() FROM idem_records WHERE user_id = 'maint' AND key = 'stuck'", &[])
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert!(lease_over, "the stuck reservation's lease has run out");
    assert_eq!(status, "PROCESSING", "a reservation whose lease ran out during the failover, within the grace after promotion");
    let log = standby.log();
    assert!(log.contains("idempotency maintenance launcher started"), "no launcher start in the promoted server's log");
    assert!(
        log.contains("the server was promoted; idem_recover_stuck waits one lease (3600 s"),
        "no grace logged at promotion"
    );
    let line = log
        .lines()
        .find(|l| l.contains(&format!("idempotency maintenance in database \"{DB}\"")))
        .expect("a maintenance summary line");
    println!("    {}", line.split_once(": ").map_or(line, |(_, rest)| rest));
    let token = one_i64(&db, "SELECT token FROM idem_records WHERE user_id = 'maint' AND key = 'stuck'").await;
    let alive: bool = db
        .query_one("SELECT idem_heartbeat($1, 'maint', 'stuck', $2) AND idem_complete($1, 'maint', 'stuck', $2, '{\"late\": true}')", &[&OP, &token])
        .await
        .unwrap()
        .get(0);
    assert!(alive, "the two-phase attempt heartbeats and completes after the promotion");
    ok("after promotion the maintenance worker starts and sweeps the 20 expired records of the old primary; the two-phase reservation whose lease ran out in the failover gets one lease of grace (not recovered over 2 passes), then heartbeats and completes");
    standby.stop(Stop::Fast);
}

// Failover through the client: the example services of both drivers under HTTP load while the
// primary is killed and the standby promoted.

/// Concurrent clients of the service (half over HTTP, half calling its handle), each charging
/// its own keys one after another.
const CLIENTS: usize = 8;
/// Keys acknowledged before the primary is killed.
const ACKED_BEFORE_KILL: usize = 200;
/// Keys executed on the promoted standby before the load stops.
const EXECUTED_AFTER_KILL: usize = 100;
/// A client's pause before it retries a key after an error (short, so that the first success
/// after the promotion measures the service, not the client's patience).
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// A hang guard on one key's retries: counted from its first attempt, or from the promotion for
/// a key that met the window in which the pair was down (how long that lasts is the test's doing,
/// and the promotion has bounds of its own), so how fast the machine is never decides the outcome.
const KEY_DEADLINE: Duration = Duration::from_secs(120);
/// A hang guard on "the service executes keys again on the promoted standby" (an awaited
/// condition; the time it took is printed as a figure, not asserted).
const BACK_DEADLINE: Duration = Duration::from_secs(180);

/// How the service reaches the pair.
#[derive(Clone, Copy, Debug)]
enum Way {
    /// One URL naming both servers, `target_session_attrs=read-write`.
    HostList,
    /// One endpoint (a [`Forwarder`]) that moves to the standby when the primary is down.
    Endpoint,
}

/// The driver, and so the example service, under test.
#[derive(Clone, Copy, Debug)]
enum Drv {
    TokioPostgres,
    Sqlx,
}

/// The handle of a service, called directly, as a service calling `run` itself does: the same
/// charge as the example's handler, under operation `failover.direct`.
#[derive(Clone)]
enum Direct {
    TokioPostgres(Idempotency<Postgres>),
    Sqlx(Idempotency<Sqlx>),
}

/// How a load client charges a key: the example service over HTTP, or the handle directly.
#[derive(Clone)]
enum Caller {
    Http(reqwest::Client, String),
    Direct(Direct),
}

/// What one attempt answered.
enum Answer {
    /// The first answer's body, and whether it was a replay.
    Acked(Value, bool),
    /// 503, or `Error::StoreUnavailable` from the handle.
    Unavailable,
    /// Anything else.
    Wrong(String),
}

/// The answer of a direct call.
fn answer<E: std::fmt::Debug>(result: Result<Outcome<StoredResponse>, idempotency_client::Error<E>>) -> Answer {
    match result {
        Ok(Outcome::Executed(r)) if r.status == 201 => Answer::Acked(r.body.json().unwrap_or(Value::Null), false),
        Ok(Outcome::Replayed(r)) if r.status == 201 => Answer::Acked(r.body.json().unwrap_or(Value::Null), true),
        Ok(other) => Answer::Wrong(format!("{other:?}")),
        Err(idempotency_client::Error::StoreUnavailable(_)) => Answer::Unavailable,
        Err(e) => Answer::Wrong(format!("{e:?}")),
    }
}

const INSERT: &str = "INSERT INTO charges (user_id, amount) VALUES ($1, $2) RETURNING id";

impl Caller {
    /// One attempt at key `k{n}` of `user` (amount n + 1).
    async fn charge(&self, user: &str, n: u64) -> Answer {
        let amount = n as i64 + 1;
        match self {
            Caller::Http(http, url) => {
                let sent = http
                    .post(url)
                    .header("idempotency-key", format!("k{n}"))
                    .header("x-user", user)
                    .body(json!({"amount": amount}).to_string())
                    .send()
                    .await;
                match sent {
                    Ok(resp) => {
                        let (status, replayed) = (resp.status(), resp.headers().get("idempotent-replayed").is_some_and(|v| v == "true"));
                        let body = resp.text().await.unwrap_or_default();
                        match status {
                            reqwest::StatusCode::CREATED => Answer::Acked(serde_json::from_str(&body).unwrap_or(Value::Null), replayed),
                            reqwest::StatusCode::SERVICE_UNAVAILABLE => Answer::Unavailable,
                            _ => Answer::Wrong(format!("{status} {body}")),
                        }
                    }
                    Err(e) => Answer::Wrong(e.to_string()),
                }
            }
            Caller::Direct(direct) => {
                let key = Key::new("failover.direct", user, format!("k{n}")).unwrap();
                let fp = Fingerprint::of_json(&json!({"amount": amount})).unwrap();
                let user = user.to_owned();
                let respond = move |id: i64| StoredResponse::json(201, json!({"id": id, "amount": amount}));
                match direct {
                    Direct::TokioPostgres(idem) => answer(
                        idem.run(&key, &fp, |tx| {
                            let user = user.clone();
                            Box::pin(async move {
                                let id: i64 = tx.query_one(INSERT, &[&user, &amount]).await?.try_get(0)?;
                                Ok::<_, tokio_postgres::Error>(respond(id))
                            })
                        })
                        .await,
                    ),
                    Direct::Sqlx(idem) => answer(
                        idem.run(&key, &fp, |conn| {
                            let user = user.clone();
                            Box::pin(async move {
                                let id: i64 = sqlx::query_scalar(INSERT).bind(&user).bind(amount).fetch_one(&mut *conn).await?;
                                Ok::<_, sqlx::Error>(respond(id))
                            })
                        })
                        .await,
                    ),
                }
            }
        }
    }
}

/// The example service of `drv` on `url`, served on loopback: its `/charges` URL, and its handle
/// (a clone) for direct calls.
async fn serve(drv: Drv, url: &str) -> (String, Direct) {
    let (router, direct) = match drv {
        Drv::TokioPostgres => {
            let idem = Idempotency::<Postgres>::from_url(url, u32::try_from(pg_app::POOL_SIZE).expect("the pool size"), Settings::default()).expect("the handle");
            (pg_app::router(idem.clone()), Direct::TokioPostgres(idem))
        }
        Drv::Sqlx => {
            let idem = Idempotency::<Sqlx>::from_url(url, 16, Settings::default()).expect("the handle");
            (sqlx_app::router(idem.clone()), Direct::Sqlx(idem))
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (format!("http://{addr}/charges"), direct)
}

/// What the clients saw, shared.
#[derive(Default)]
struct Seen {
    /// The first acknowledged answer (a 201's body) of each key, by (user, key number).
    acked: BTreeMap<(String, u64), Value>,
    /// Keys executed (a 201 that is not a replay) by requests sent after the kill.
    executed_after_kill: usize,
    /// When the primary was down (`pg_ctl stop -m immediate` returned).
    dead: Option<Instant>,
    /// When the standby's promotion returned.
    promoted: Option<Instant>,
    /// The first execution of a request sent after `dead`: when it was answered.
    first_after_kill: Option<Instant>,
    /// Answers 503 / StoreUnavailable, the only error expected.
    unavailable: usize,
    /// Anything else: another status or error, a retry whose answer differs from the key's first
    /// acknowledged one or is not marked as a replay, a transport error.
    wrong: Vec<String>,
    /// The most attempts one key took.
    max_attempts: u32,
}

type Shared = Arc<Mutex<Seen>>;

/// Charges key `k{n}` of `user` until it is acknowledged, retrying after each error as a client
/// does; the first answer's body and whether it was a replay.
async fn charge_until_acked(caller: &Caller, user: &str, n: u64, seen: &Shared) -> (Value, bool) {
    let started = Instant::now();
    for attempt in 1.. {
        // No deadline while the pair is down on purpose (killed, not yet promoted); else from the
        // key's first attempt or the promotion, whichever came later.
        let (dead, promoted) = {
            let seen = seen.lock().unwrap();
            (seen.dead, seen.promoted)
        };
        let from = match (dead, promoted) {
            (Some(_), None) => None,
            (_, Some(promoted)) => Some(started.max(promoted)),
            (None, None) => Some(started),
        };
        if let Some(from) = from {
            assert!(from.elapsed() < KEY_DEADLINE, "{user}/k{n}: not acknowledged within {} s", KEY_DEADLINE.as_secs());
        }
        let sent = Instant::now();
        let answer = caller.charge(user, n).await;
        let answered = Instant::now();
        {
            let mut seen = seen.lock().unwrap();
            seen.max_attempts = seen.max_attempts.max(attempt);
            match answer {
                Answer::Acked(body, replayed) => {
                    if !replayed && seen.dead.is_some_and(|dead| sent >= dead) {
                        seen.executed_after_kill += 1;
                        seen.first_after_kill.get_or_insert(answered);
                    }
                    return (body, replayed);
                }
                Answer::Unavailable => seen.unavailable += 1,
                Answer::Wrong(what) => seen.wrong.push(format!("{user}/k{n}: {what}")),
            }
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
    unreachable!()
}

/// One client: keys k0, k1, ... each until acknowledged (a first answer may be a replay: the
/// attempt before it committed and its answer was lost), and every fifth key a retry of the key
/// five before it; stops at `stop`, answering how many keys it charged.
async fn client(caller: Caller, user: String, seen: Shared, stop: Arc<AtomicBool>) -> u64 {
    for n in 0.. {
        if stop.load(Ordering::Relaxed) {
            return n;
        }
        let (body, _) = charge_until_acked(&caller, &user, n, &seen).await;
        seen.lock().unwrap().acked.insert((user.clone(), n), body);
        if n >= 5 && n % 5 == 0 {
            let (again, replayed) = charge_until_acked(&caller, &user, n - 5, &seen).await;
            let mut seen = seen.lock().unwrap();
            let first = &seen.acked[&(user.clone(), n - 5)];
            if again != *first || !replayed {
                let wrong = format!("{user}/k{}: the retry answered {again} (replayed: {replayed}), first {first}", n - 5);
                seen.wrong.push(wrong);
            }
        }
    }
    unreachable!()
}

/// The pair under load through the example service of `drv` (over HTTP and its handle's `run`), reached `way`; the primary
/// killed and the standby promoted mid-load. Checks everything on the promoted standby.
async fn service_rides_over_failover(drv: Drv, way: Way) {
    let _ports = PORTS.lock().await;
    let name = format!("failover-{drv:?}-{way:?}").to_lowercase();
    let schema = match drv {
        Drv::TokioPostgres => pg_app::SCHEMA,
        Drv::Sqlx => sqlx_app::SCHEMA,
    };
    let Pair { primary, standby } = Pair::start(&name, schema, "").await;
    let (p1, p2) = (primary.port(), standby.port());
    let standby_addr: std::net::SocketAddr = ([127, 0, 0, 1], p2).into();
    let forwarder = match way {
        Way::HostList => None,
        Way::Endpoint => Some(Forwarder::start(([127, 0, 0, 1], p1).into()).await),
    };
    let db_url = match &forwarder {
        None => format!("postgresql://postgres@127.0.0.1:{p1},127.0.0.1:{p2}/{DB}?target_session_attrs=read-write"),
        Some(f) => format!("postgresql://postgres@{}/{DB}", f.addr()),
    };
    println!("    {drv:?} service on {db_url}");
    let (url, direct) = serve(drv, &db_url).await;

    // Half the clients call the service over HTTP (users h0, h1, ...), half call its handle's
    // `run` directly (users d0, d1, ...).
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let callers = [("HTTP", "h", Caller::Http(http, url.clone())), ("run", "d", Caller::Direct(direct))];
    let seen: Vec<Shared> = callers.iter().map(|_| Shared::default()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for ((_, prefix, caller), seen) in callers.iter().zip(&seen) {
        for c in 0..CLIENTS / 2 {
            let user = format!("{prefix}{c}");
            clients.push((user.clone(), tokio::spawn(client(caller.clone(), user, seen.clone(), stop.clone()))));
        }
    }
    let acked = || seen.iter().map(|s| s.lock().unwrap().acked.len()).sum::<usize>();
    eventually("the load acknowledges enough keys", Duration::from_secs(180), || async {
        let n = acked();
        if n >= ACKED_BEFORE_KILL { Ok(()) } else { Err(format!("{n} acknowledged")) }
    })
    .await;

    let killing = Instant::now();
    tokio::task::block_in_place(|| primary.stop(Stop::Immediate));
    let dead = Instant::now();
    for s in &seen {
        s.lock().unwrap().dead = Some(dead);
    }
    let acked_at_kill = acked();
    // The endpoint moves as soon as the primary is down, as a health check would move it: until
    // the promotion ends, the standby answers 25006, which the client reports as unavailable.
    if let Some(f) = &forwarder {
        f.point_to(standby_addr);
    }
    tokio::task::block_in_place(|| standby.promote());
    let promoted = Instant::now();
    for s in &seen {
        s.lock().unwrap().promoted = Some(promoted);
    }
    eventually("both kinds of clients execute keys on the promoted standby", BACK_DEADLINE, || async {
        let n: Vec<usize> = seen.iter().map(|s| s.lock().unwrap().executed_after_kill).collect();
        if n.iter().all(|n| *n >= EXECUTED_AFTER_KILL / 2) { Ok(()) } else { Err(format!("{n:?} executed since the kill")) }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut charged = BTreeSet::new();
    for (user, client) in clients {
        let n = client.await.expect("a client");
        charged.extend((0..n).map(|n| (user.clone(), n)));
    }
    let seen: Vec<Seen> = seen.into_iter().map(|s| Arc::try_unwrap(s).ok().expect("the clients are done").into_inner().unwrap()).collect();
    let all: BTreeMap<(String, u64), Value> = seen.iter().flat_map(|s| s.acked.clone()).collect();
    for ((via, ..), seen) in callers.iter().zip(&seen) {
        assert!(seen.wrong.is_empty(), "{via}: {} wrong answers, the first: {:?}", seen.wrong.len(), &seen.wrong[..seen.wrong.len().min(5)]);
    }
    ok(&format!(
        "{drv:?}, {way:?}: every error during the failover was a 503 over HTTP ({}) or StoreUnavailable from run ({}), no other answer",
        seen[0].unavailable, seen[1].unavailable
    ));
    assert_eq!(all.keys().cloned().collect::<BTreeSet<_>>(), charged, "the keys the clients charged");

    // On the promoted standby: every acknowledged key has its business row (the id of its first
    // answer, its user and amount) and its record, and ran once.
    let db = connect(&standby.url(DB)).await.unwrap();
    assert!(!db.query_one("SELECT pg_is_in_recovery()", &[]).await.unwrap().get::<_, bool>(0));
    let rows = db.query("SELECT user_id, amount, count(*), min(id) FROM charges GROUP BY 1, 2", &[]).await.unwrap();
    let charges: BTreeMap<(String, i64), (i64, i64)> = rows.iter().map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3)))).collect();
    let records = db.query("SELECT user_id, key FROM idem_records WHERE status = 'SUCCESS'", &[]).await.unwrap();
    let records: BTreeSet<(String, String)> = records.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut lost = Vec::new();
    for ((user, n), body) in &all {
        let business = charges.get(&(user.clone(), *n as i64 + 1));
        let ran_once = business.is_some_and(|(count, id)| *count == 1 && body["id"] == json!(id));
        if !ran_once || !records.contains(&(user.clone(), format!("k{n}"))) {
            lost.push(format!("{user}/k{n}: answered {body}, rows {business:?}"));
        }
    }
    assert!(lost.is_empty(), "acknowledged keys without their one business row or their record: {lost:?}");
    assert_eq!((charges.len(), records.len()), (all.len(), all.len()), "business rows and records beyond the acknowledged keys");
    let max_attempts = seen.iter().map(|s| s.max_attempts).max().unwrap_or(0);
    ok(&format!(
        "{drv:?}, {way:?}: all {} acknowledged keys ({acked_at_kill} before the kill) have their business row and record on the promoted standby, each executed once (at most {max_attempts} attempts for a key)",
        all.len(),
    ));

    // A retry of every key on the promoted standby replays its first answer.
    let replays = Shared::default();
    for ((via, prefix, caller), seen) in callers.iter().zip(&seen) {
        for ((user, n), first) in &seen.acked {
            assert!(user.starts_with(prefix));
            let (again, replayed) = charge_until_acked(caller, user, *n, &replays).await;
            assert!(replayed && again == *first, "{via} {user}/k{n}: the retry answered {again} (replayed {replayed}), first {first}");
        }
    }
    assert!(replays.lock().unwrap().wrong.is_empty());
    ok(&format!("{drv:?}, {way:?}: a retry of every key replays its first acknowledged answer, over HTTP and from run"));

    let ms = |d: Duration| d.as_millis();
    for ((via, ..), seen) in callers.iter().zip(&seen) {
        let first = seen.first_after_kill.expect("an execution after the kill");
        println!(
            "    failover figures, {drv:?} through {way:?}, {via}: acknowledged {} (of {} in all, {acked_at_kill} before the kill), lost 0, \
             executions per key 1, errors {} (all 503 / StoreUnavailable), at most {} attempts for a key; the kill took {} ms; \
             from the primary down: the promotion returned at {} ms, the first execution at {} ms",
            seen.acked.len(),
            all.len(),
            seen.unavailable,
            seen.max_attempts,
            ms(dead - killing),
            ms(promoted - dead),
            ms(first - dead),
        );
    }
    standby.stop(Stop::Fast);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "its own layer (two servers of their own): cargo test -p idempotency-tests --test failover -- --ignored"]
async fn tokio_postgres_service_rides_over_failover_through_a_host_list() {
    service_rides_over_failover(Drv::TokioPostgres, Way::HostList).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "its own layer (two servers of their own): cargo test -p idempotency-tests --test failover -- --ignored"]
async fn tokio_postgres_service_rides_over_failover_through_a_moving_endpoint() {
    service_rides_over_failover(Drv::TokioPostgres, Way::Endpoint).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "its own layer (two servers of their own): cargo test -p idempotency-tests --test failover -- --ignored"]
async fn sqlx_service_rides_over_failover_through_a_moving_endpoint() {
    service_rides_over_failover(Drv::Sqlx, Way::Endpoint).await;
}

/// sqlx reads one host: the URL of the host-list way is refused, saying so and naming the
/// alternatives (the moving endpoint above, or the tokio-postgres driver).
#[tokio::test]
#[ignore = "its own layer: cargo test -p idempotency-tests --test failover -- --ignored"]
async fn sqlx_refuses_a_host_list_naming_the_alternatives() {
    let url = format!("postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/{DB}?target_session_attrs=read-write", port_base(), port_base() + 1);
    match Idempotency::<Sqlx>::from_url(&url, 1, Settings::default()) {
        Err(idempotency_client::Error::Configuration { reason, .. }) => {
            assert!(reason.contains("the sqlx driver connects to one") && reason.contains("one endpoint that follows the primary"), "{reason}");
            assert!(reason.contains("tokio-postgres driver"), "{reason}");
            ok(&format!("sqlx refuses the host list: {reason}"));
        }
        Err(other) => panic!("not a configuration error: {other:?}"),
        Ok(_) => panic!("sqlx accepted a host list"),
    }
}

/// A server that closes the connection without answering (one shutting down, or a proxy whose
/// server just went away, as seen under this file's failovers): the client reports the store
/// unavailable (503), on either driver. sqlx reads the missing answer to its SSLRequest as the
/// byte 0x00, a protocol error, which the client must not report as a database error (500).
#[tokio::test]
#[ignore = "its own layer: cargo test -p idempotency-tests --test failover -- --ignored"]
async fn a_server_that_hangs_up_before_answering_is_store_unavailable() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        while let Ok((mut conn, _)) = listener.accept().await {
            // Read the client's first message, then close: the client sees the end of the stream.
            let _ = conn.read(&mut [0; 64]).await;
        }
    });
    let url = format!("postgresql://postgres@{addr}/{DB}");
    let seen = Idempotency::<Postgres>::from_url(&url, 1, Settings::default()).unwrap().check_extension().await;
    assert!(matches!(seen, Err(idempotency_client::Error::StoreUnavailable(_))), "tokio-postgres: {seen:?}");
    {
        let seen = Idempotency::<Sqlx>::from_url(&url, 1, Settings::default()).unwrap().check_extension().await;
        assert!(matches!(seen, Err(idempotency_client::Error::StoreUnavailable(_))), "sqlx: {seen:?}");
    }
    ok("a server that closes the connection before answering is StoreUnavailable on tokio-postgres and sqlx");
}
