//! Major-version upgrades with pg_upgrade: 14 → 18 and 15 → 17, each of a cluster holding
//! records in every state and a two-phase reservation in flight (reserved and committed, not
//! completed). Proves, on the new major: every record and retry counter reads as before and every
//! reservation answers as before; the in-flight token completes; new tokens exceed every old one;
//! a released key's retry count survived; the maintenance worker recovers and sweeps the old rows;
//! the native hot path runs the whole in-transaction flow.
//!
//! The trees of the majors come from `scripts/pg-env.sh tree NN`, each with the extension
//! installed (`cargo pgrx install --release --pg-config <tree's pg_config> --no-default-features
//! --features pgNN`, then `scripts/sqlbuild.py install-files`); a tree that cannot be obtained
//! fails the case (the trees install from PyPI, so a missing one is a broken setup). 18's initdb enables data checksums and pg_upgrade needs
//! both sides alike: 14 → 18 enables them on the old cluster with pg_checksums (offline), 15 → 17
//! has them off on both sides. The 15 → 17 case first runs `pg_upgrade --check` against a tree
//! of 17 without the extension and checks what it reports.
//!
//! Ports: `IDEM_SERVERS_PORT` (default 55900) + 2 to + 5. Ignored in the plain e2e run (the
//! majors are fixed, whatever `PG_CONFIG` says): run it once with
//! `cargo test -p idempotency-tests --test pg_upgrade -- --ignored`.

use idempotency_testkit::server::{eventually, extension_installed, tree, Server, Stop};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_postgres::{Client, NoTls};

const DB: &str = "idem_upgrade";

fn port_base() -> u16 {
    std::env::var("IDEM_SERVERS_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(55900)
}

async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap_or_else(|e| panic!("connect {url}: {e}"));
    tokio::spawn(conn);
    client
}

async fn one<T: for<'a> tokio_postgres::types::FromSql<'a>>(client: &Client, sql: &str) -> T {
    client.query_one(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e:?}")).get(0)
}

/// The records, retry counters and the answers of every reservation that writes nothing, as
/// text: what must read the same after the upgrade.
async fn answers(client: &Client) -> Vec<String> {
    let mut all = Vec::new();
    for sql in [
        "SELECT row_to_json(r)::text FROM idem_records AS r WHERE r.key IN ('success', 'failed', 'poisoned', 'inflight') ORDER BY r.key",
        "SELECT row_to_json(t)::text FROM idem_retries AS t ORDER BY t.key",
        "SELECT 'lookup ' || k || ' ' || coalesce((SELECT row_to_json(l)::text FROM idem_lookup('up', 'u', k) AS l), 'none')
           FROM unnest(ARRAY['success', 'failed', 'poisoned', 'inflight', 'released']) AS k ORDER BY k",
        "SELECT 'reserve ' || k || ' ' || h || ' ' || row_to_json(x)::text
           FROM (VALUES ('success', 'h'), ('success', 'other'), ('failed', 'h'), ('poisoned', 'h'), ('inflight', 'h')) AS v (k, h),
                LATERAL idem_reserve('up', 'u', k, h) AS x ORDER BY k, h",
    ] {
        let rows = client.query(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        all.extend(rows.iter().map(|r| r.get::<_, String>(0)));
    }
    all
}

/// The old cluster's content: a record in every state, a retry counter, an in-flight two-phase
/// reservation; answers its token and the highest token issued.
async fn fill(client: &Client) -> (i64, i64) {
    client
        .batch_execute(
            "CREATE EXTENSION idempotency;
             CREATE TABLE charges (id bigserial PRIMARY KEY, k text NOT NULL);
             SELECT idem_complete('up', 'u', 'success', (SELECT token FROM idem_reserve('up', 'u', 'success', 'h')), '{\"id\": 1}');
             SELECT idem_complete('up', 'u', 'failed', (SELECT token FROM idem_reserve('up', 'u', 'failed', 'h')), '{\"error\": \"declined\"}', 'FAILED');
             SELECT idem_release('up', 'u', 'poisoned', (SELECT token FROM idem_reserve('up', 'u', 'poisoned', 'h')), max_retries => 1);
             SELECT idem_release('up', 'u', 'released', (SELECT token FROM idem_reserve('up', 'u', 'released', 'h')), max_retries => 3);
             SELECT idem_complete('up', 'u', 'expired', (SELECT token FROM idem_reserve('up', 'u', 'expired', 'h', ttl => '1 second')), '{}');
             SELECT token FROM idem_reserve('up', 'u', 'stuck', 'h', ttl => '1 hour', lease => '1 second');",
        )
        .await
        .unwrap_or_else(|e| panic!("filling the old cluster: {e:?}"));
    // The two-phase flow's first transaction: reserved and committed, the work still running.
    let inflight: i64 = one(client, "SELECT token FROM idem_reserve('up', 'u', 'inflight', 'h', ttl => '1 day', lease => '1 day')").await;
    let max: i64 = one(client, "SELECT max(token) FROM idem_records").await;
    (inflight, max.max(inflight))
}

fn need(pg_config: &std::path::Path) {
    assert!(
        extension_installed(pg_config),
        "the idempotency extension is not installed in {}: cargo pgrx install --release --pg-config {0} --no-default-features --features pgNN, then python3 scripts/sqlbuild.py install-files \"$({0} --sharedir)/extension\"",
        pg_config.display()
    );
}

async fn upgrade(from: u32, to: u32, port: u16) {
    let started = Instant::now();
    // The trees install from PyPI (scripts/pg-env.sh): one that cannot be obtained is a failure
    // of the machine's setup, never a reason to pass.
    let (old_config, new_config) = match (tree(from), tree(to)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => panic!("pg_upgrade {from} -> {to} cannot run: no PostgreSQL tree ({e}); scripts/pg-env.sh tree NN installs it"),
    };
    need(&old_config);
    need(&new_config);
    println!("pg_upgrade {from} -> {to} (ports {port}, {})", port + 1);
    let old = Server::new(&format!("upgrade-{from}-{to}-old"), &old_config, port);
    old.initdb(&[]);
    old.start();
    let admin = connect(&old.url("postgres")).await;
    admin.batch_execute(&format!("CREATE DATABASE {DB}")).await.unwrap();
    let db = connect(&old.url(DB)).await;
    let (inflight, old_max) = fill(&db).await;
    // Let the short lease and ttl run out on the old server (awaited, not slept).
    eventually("the stuck lease and the expired record run out", Duration::from_secs(30), || async {
        let n: i64 = one(&db, "SELECT count(*) FROM idem_records WHERE key = 'stuck' AND lease_expires_at <= clock_timestamp()
                                   OR key = 'expired' AND expires_at <= clock_timestamp()").await;
        if n == 2 { Ok(()) } else { Err(format!("{n} of 2")) }
    })
    .await;
    let before = answers(&db).await;
    assert_eq!(before.len(), 4 + 2 + 5 + 5, "{before:#?}"); // records, counters, lookups, reservations
    drop(db);
    drop(admin);
    old.stop(Stop::Fast);

    // Checksums alike on both sides: 18's initdb enables them by default.
    let new = Server::new(&format!("upgrade-{from}-{to}-new"), &new_config, port + 1);
    new.initdb(&[]);
    let (old_data, new_data) = (old.data(), new.data());
    let (old_bin, new_bin) = (old.bin(""), new.bin(""));
    let (old_port, new_port) = (old.port().to_string(), new.port().to_string());
    let args = [
        "-b",
        old_bin.to_str().unwrap(),
        "-B",
        new_bin.to_str().unwrap(),
        "-d",
        old_data.to_str().unwrap(),
        "-D",
        new_data.to_str().unwrap(),
        "-p",
        &old_port,
        "-P",
        &new_port,
        "-U",
        "postgres",
    ];
    let mut check = args.to_vec();
    check.push("--check");
    if to >= 18 {
        let out = new.run_in(&new.bin(""), "pg_upgrade", &check);
        let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let refusal = "old cluster does not use data checksums but the new one does";
        assert!(!out.status.success() && report.contains(refusal), "pg_upgrade --check with checksums only on {to}:\n{report}");
        println!("ok: pg_upgrade --check refuses checksums on {to} only: \"{refusal}\"");
        old.run("pg_checksums", &["--enable", "-D", old_data.to_str().unwrap()]);
        println!("ok: data checksums enabled on the {from} cluster with pg_checksums, as 18's initdb has them");
    }
    if to == 17 {
        missing_extension_is_reported(&old, &check).await;
    }
    let out = new.run("pg_upgrade", &check);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("Clusters are compatible"), "pg_upgrade --check:\n{report}");
    println!("ok: pg_upgrade --check: clusters are compatible (the extension is installed on {to})");
    tokio::task::block_in_place(|| new.run("pg_upgrade", &args));
    println!("ok: pg_upgrade {from} -> {to} ran");

    // The worker is configured after the upgrade (not while pg_upgrade restores the schema).
    new.configure(&format!(
        "shared_preload_libraries = 'idempotency'\nidempotency.maintenance_databases = '{DB}'\nidempotency.maintenance_interval = 1\n"
    ));
    new.start();
    let db = connect(&new.url(DB)).await;
    let version: String = one(&db, "SELECT current_setting('server_version_num')").await;
    assert!(version.starts_with(&to.to_string()), "server_version_num {version}");
    let checksums: String = one(&db, "SHOW data_checksums").await;
    assert_eq!(checksums, if to >= 18 { "on" } else { "off" });
    let after = answers(&db).await;
    assert_eq!(after, before, "answers after the upgrade");
    println!("ok: every record, retry counter and non-writing reservation answers as before ({} answers)", after.len());

    // The in-flight two-phase reservation completes with its old token.
    let done: bool = db
        .query_one("SELECT idem_complete('up', 'u', 'inflight', $1, '{\"id\": 2}')", &[&inflight])
        .await
        .unwrap()
        .get(0);
    assert!(done, "idem_complete of the in-flight token {inflight}");
    let replay: String = one(&db, "SELECT outcome FROM idem_reserve('up', 'u', 'inflight', 'h')").await;
    assert_eq!(replay, "replay");
    println!("ok: the in-flight reservation (token {inflight}) completes on {to} and then replays");

    // The released key: its retry count survived; its new token exceeds every old one.
    let row = db.query_one("SELECT outcome, token, attempts FROM idem_reserve('up', 'u', 'released', 'h')", &[]).await.unwrap();
    let (outcome, token, attempts): (String, Option<i64>, i32) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((outcome.as_str(), attempts), ("created", 1), "the released key after the upgrade");
    let token = token.unwrap();
    assert!(token > old_max, "new token {token} not above the old maximum {old_max}");
    println!("ok: the released key is created again with attempts 1 (its counter survived), token {token} > every old token (max {old_max})");

    // The native hot path: the C functions of the new major's library, the whole flow.
    let languages: String = one(
        &db,
        "SELECT string_agg(DISTINCT l.lanname, ',') FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
          WHERE p.proname IN ('idem_reserve', 'idem_complete', 'idem_release', 'idem_heartbeat')",
    )
    .await;
    assert_eq!(languages, "c");
    db.batch_execute("BEGIN").await.unwrap();
    let token: i64 = one(&db, "SELECT token FROM idem_reserve('up', 'u', 'fresh', 'h')").await;
    db.execute("INSERT INTO charges (k) VALUES ('fresh')", &[]).await.unwrap();
    let done: bool = db.query_one("SELECT idem_complete('up', 'u', 'fresh', $1, '{\"id\": 3}')", &[&token]).await.unwrap().get(0);
    db.batch_execute("COMMIT").await.unwrap();
    let replay: String = one(&db, "SELECT outcome FROM idem_reserve('up', 'u', 'fresh', 'h')").await;
    assert!(done && replay == "replay" && token > old_max);
    println!("ok: the native hot path runs the in-transaction flow on {to} (reserve, business row, complete, replay)");

    // The worker recovers the stuck reservation and sweeps the expired record of the old major.
    eventually("the worker handles the old rows", Duration::from_secs(60), || async {
        let stuck: Option<String> = db
            .query_opt("SELECT _idem_status_word(status) AS status FROM idem_records WHERE key = 'stuck'", &[])
            .await
            .map_err(|e| e.to_string())?
            .map(|r| r.get(0));
        let expired: i64 = one(&db, "SELECT count(*) FROM idem_records WHERE key = 'expired'").await;
        if stuck.as_deref() == Some("FAILED") && expired == 0 { Ok(()) } else { Err(format!("stuck {stuck:?}, expired rows {expired}")) }
    })
    .await;
    let log = new.log();
    let line = log
        .lines()
        .find(|l| l.contains(&format!("idempotency maintenance in database \"{DB}\"")))
        .expect("a maintenance summary in the log");
    println!("    {}", line.split_once(": ").map_or(line, |(_, rest)| rest));
    println!("ok: the maintenance worker on {to} fails the stuck reservation and sweeps the expired record written on {from}");
    new.stop(Stop::Fast);
    println!("pg_upgrade {from} -> {to}: passed in {} s", started.elapsed().as_secs());
}

/// `pg_upgrade --check` against a tree of the new major without the extension (a fresh copy
/// from `scripts/pg-env.sh unpack`) fails at "Checking for presence of required libraries",
/// naming the library in loadable_libraries.txt: what docs/upgrading.md quotes. `check` holds the
/// arguments of the real run; the bare tree's own binaries and cluster replace the new ones.
async fn missing_extension_is_reported(old: &Server, check: &[&str]) {
    let dir = idempotency_testkit::root().join("target/servers/bare-17-tree");
    let out = std::process::Command::new("bash")
        .arg(idempotency_testkit::root().join("scripts/pg-env.sh"))
        .args(["unpack", "17"])
        .arg(&dir)
        .output()
        .expect("scripts/pg-env.sh unpack");
    assert!(out.status.success(), "unpacking a bare 17 tree: {}", String::from_utf8_lossy(&out.stderr));
    let bare_config = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(!extension_installed(&bare_config));
    let bare = Server::new("upgrade-bare-17", &bare_config, old.port() + 1); // started by pg_upgrade on -P only
    bare.initdb(&[]);
    let (bin, data) = (bare.bin(""), bare.data());
    let mut args: Vec<&str> = check.to_vec();
    args[3] = bin.to_str().unwrap(); // -B
    args[7] = data.to_str().unwrap(); // -D
    let out = bare.run_in(&bare.bin(""), "pg_upgrade", &args);
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!out.status.success(), "pg_upgrade --check passed without the extension on 17:\n{report}");
    let line = report.lines().find(|l| l.starts_with("Checking for presence of required libraries")).unwrap_or_default();
    assert!(line.ends_with("fatal"), "pg_upgrade --check without the extension:\n{report}");
    let listed = walk(&bare.data()).into_iter().find(|p| p.ends_with("loadable_libraries.txt")).expect("loadable_libraries.txt");
    let listed = std::fs::read_to_string(listed).unwrap();
    assert!(listed.contains("could not load library \"$libdir/idempotency\""), "{listed}");
    println!("ok: without the extension on 17, pg_upgrade --check fails at \"{}\" and lists: {}", line.split_whitespace().collect::<Vec<_>>().join(" "), listed.lines().next().unwrap_or_default());
    drop(bare);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "its own layer (servers of four majors): cargo test -p idempotency-tests --test pg_upgrade -- --ignored"]
async fn pg_upgrade_14_to_18_keeps_every_record_and_the_in_flight_token() {
    upgrade(14, 18, port_base() + 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "its own layer (servers of four majors): cargo test -p idempotency-tests --test pg_upgrade -- --ignored"]
async fn pg_upgrade_15_to_17_keeps_every_record_and_the_in_flight_token() {
    upgrade(15, 17, port_base() + 4).await;
}
