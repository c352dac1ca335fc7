//! The maintenance worker is fair between databases: a pass runs at most 100 batches of each
//! function in one database, then the launcher visits the others before it comes back.
//!
//! A throwaway preloaded server (`target/servers/fairness-NN`, port private cluster's + 44) with
//! two databases listed, `fair_a` first: `fair_a` holds 25,000 expired records, `fair_b` 10, and
//! the batch size is 100, so `fair_a` needs 250 sweep batches. Proves, from the worker's summary
//! lines (their order in the log, never their timing): the first pass in `fair_a` sweeps
//! exactly 100 batches and says it stopped at its bound; `fair_b` is swept before `fair_a`'s
//! next pass; every expired record of both is gone in the end. 0.5.0 swept all 25,000 of
//! `fair_a` in its first pass before visiting `fair_b`. Needs the extension (the worker is the
//! library's) whatever `IDEM_INSTALL` says: the test creates it itself.

use idempotency_testkit::server::{eventually, major_of, pg_config, Server, Stop};
use std::time::Duration;
use tokio_postgres::{Client, NoTls};

async fn connect(url: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(conn);
    c
}

async fn count(c: &Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e:?}")).get(0)
}

/// The summary lines of the worker's passes that did work, in log order: (database, line).
fn summaries(log: &str) -> Vec<(String, String)> {
    log.lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once("idempotency maintenance in database \"")?;
            let (db, tail) = rest.split_once('"')?;
            tail.starts_with(": recovered ").then(|| (db.to_owned(), tail.to_owned()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_in_one_database_does_not_hold_back_the_next() {
    let config = pg_config();
    let port = Server::private(&config).port() + 44;
    let server = Server::new(&format!("fairness-{}", major_of(&config)), &config, port);
    server.initdb(&[]);
    server.configure(
        "shared_preload_libraries = 'idempotency'\n\
         idempotency.maintenance_databases = 'fair_a, fair_b'\n\
         idempotency.maintenance_interval = 0\n\
         idempotency.maintenance_batch_size = 100\n",
    );
    server.start();
    let admin = connect(&server.url("postgres")).await;
    for (db, rows) in [("fair_a", 25_000), ("fair_b", 10)] {
        admin.batch_execute(&format!("CREATE DATABASE {db}")).await.expect("create database");
        let c = connect(&server.url(db)).await;
        c.batch_execute(&format!(
            "CREATE EXTENSION idempotency;
             INSERT INTO idem_records (id, operation, user_id, key, request_hash, status, token, response,
                                       lease_expires_at, expires_at, created_at, updated_at, attempts)
             SELECT _idem_id('fair', 'u', 'k' || i), 'fair', 'u', 'k' || i, _idem_hash('h'), 's', nextval('idem_token_seq'), '{{}}',
                    now() - interval '2 days', now() - interval '1 day', now() - interval '2 days', now() - interval '2 days', 0
               FROM generate_series(1, {rows}) AS i;"
        ))
        .await
        .expect("fill");
    }
    // Maintenance on: the launcher's next pass starts at once.
    for sql in ["ALTER SYSTEM SET idempotency.maintenance_interval = 1", "SELECT pg_reload_conf()"] {
        admin.batch_execute(sql).await.expect("turn maintenance on");
    }
    let (a, b) = (connect(&server.url("fair_a")).await, connect(&server.url("fair_b")).await);
    eventually("both databases swept", Duration::from_secs(120), || async {
        let left = count(&a, "SELECT count(*) FROM idem_records").await + count(&b, "SELECT count(*) FROM idem_records").await;
        if left == 0 { Ok(()) } else { Err(format!("{left} records left")) }
    })
    .await;

    let lines = summaries(&server.log());
    for (db, l) in &lines {
        println!("    {db}{l}");
    }
    let first_a = lines.iter().position(|(db, _)| db == "fair_a").expect("a summary line of fair_a");
    assert!(
        lines[first_a].1.contains("swept 10000, in 101 transactions")
            && lines[first_a].1.contains("stopped at the pass's bound"),
        "fair_a's first pass: 100 sweep batches of 100, then it stops: {}",
        lines[first_a].1
    );
    let first_b = lines.iter().position(|(db, _)| db == "fair_b").expect("a summary line of fair_b");
    let second_a = lines.iter().skip(first_a + 1).position(|(db, _)| db == "fair_a").map(|i| i + first_a + 1);
    assert!(
        second_a.is_some_and(|second_a| first_a < first_b && first_b < second_a),
        "fair_b is swept between fair_a's first and second pass (lines: fair_a {first_a}, fair_b {first_b}, fair_a {second_a:?})"
    );
    let swept_a: i64 = lines
        .iter()
        .filter(|(db, _)| db == "fair_a")
        .filter_map(|(_, l)| l.split(", swept ").nth(1)?.split(',').next()?.parse::<i64>().ok())
        .sum();
    assert_eq!(swept_a, 25_000, "fair_a's passes together swept its backlog");
    server.stop(Stop::Fast);
}
