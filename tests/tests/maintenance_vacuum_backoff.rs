//! The maintenance worker's VACUUM backs off while the xmin horizon is pinned: a VACUUM that
//! left dead rows it could not remove is not repeated until the horizon moves.
//!
//! A throwaway preloaded server (`target/servers/vacuumbackoff-NN`, port private cluster's + 45,
//! autovacuum off) with 2,000 expired records and a REPEATABLE READ transaction whose snapshot
//! was taken before the worker swept them, so none of the swept rows can be removed. Proves,
//! by counting the worker's passes (`idem_metrics()`, never by timing): over the pass that swept
//! and three more, exactly one VACUUM is logged, and it says the next one waits for the
//! horizon; once the transaction ends, the next VACUUM comes and removes them all. 0.5.0
//! vacuumed on every pass to no effect. Needs the extension whatever `IDEM_INSTALL` says: the
//! test creates it itself.

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

const PASSES: &str = "SELECT value FROM idem_metrics() WHERE name = 'worker_passes'";

fn vacuum_lines(server: &Server) -> Vec<String> {
    server
        .log()
        .lines()
        .filter(|l| l.contains("idempotency maintenance in database \"backoff\": vacuumed "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vacuum_that_removed_nothing_waits_for_the_horizon() {
    let config = pg_config();
    let port = Server::private(&config).port() + 45;
    let server = Server::new(&format!("vacuumbackoff-{}", major_of(&config)), &config, port);
    server.initdb(&[]);
    server.configure(
        "shared_preload_libraries = 'idempotency'\n\
         idempotency.maintenance_databases = 'backoff'\n\
         idempotency.maintenance_interval = 0\n\
         idempotency.maintenance_batch_size = 1000\n\
         autovacuum = off\n",
    );
    server.start();
    let admin = connect(&server.url("postgres")).await;
    admin.batch_execute("CREATE DATABASE backoff").await.expect("create database");
    let db = connect(&server.url("backoff")).await;
    db.batch_execute(
        "CREATE EXTENSION idempotency;
         INSERT INTO idem_records (id, operation, user_id, key, request_hash, status, token, response,
                                   lease_expires_at, expires_at, created_at, updated_at, attempts)
         SELECT _idem_id('backoff', 'u', 'k' || i), 'backoff', 'u', 'k' || i, _idem_hash('h'), 's', nextval('idem_token_seq'), '{}',
                now() - interval '2 days', now() - interval '1 day', now() - interval '2 days', now() - interval '2 days', 0
           FROM generate_series(1, 2000) AS i;
         ANALYZE idem_records;",
    )
    .await
    .expect("fill");
    // The pin: a snapshot older than every delete the sweep will make.
    let pin = connect(&server.url("backoff")).await;
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM idem_records;").await.expect("pin");

    for sql in ["ALTER SYSTEM SET idempotency.maintenance_interval = 1", "SELECT pg_reload_conf()"] {
        admin.batch_execute(sql).await.expect("turn maintenance on");
    }
    eventually("the worker sweeps the 2,000 records and vacuums", Duration::from_secs(120), || async {
        let left = count(&db, "SELECT count(*) FROM idem_records").await;
        let vacuums = vacuum_lines(&server).len();
        if left == 0 && vacuums >= 1 { Ok(()) } else { Err(format!("{left} records left, {vacuums} VACUUM lines")) }
    })
    .await;
    let passes = count(&db, PASSES).await;
    eventually("three more passes", Duration::from_secs(120), || async {
        let now = count(&db, PASSES).await;
        if now >= passes + 3 { Ok(()) } else { Err(format!("{} passes since", now - passes)) }
    })
    .await;
    let lines = vacuum_lines(&server);
    for l in &lines {
        println!("    {}", l.split_once("\"backoff\": ").map_or(l.as_str(), |(_, r)| r));
    }
    assert_eq!(lines.len(), 1, "one VACUUM while the horizon stays pinned, however many passes");
    assert!(
        lines[0].contains("2000 left not yet removable: the next VACUUM waits for the xmin horizon to move"),
        "the VACUUM removed nothing and says the next waits: {}",
        lines[0]
    );

    // The pin ends: the horizon moves, and the next pass vacuums what is now removable.
    pin.batch_execute("COMMIT").await.expect("unpin");
    eventually("a VACUUM once the horizon moved", Duration::from_secs(120), || async {
        let lines = vacuum_lines(&server);
        if lines.len() >= 2 { Ok(()) } else { Err(format!("{} VACUUM lines", lines.len())) }
    })
    .await;
    let lines = vacuum_lines(&server);
    println!("    {}", lines[1].split_once("\"backoff\": ").map_or(lines[1].as_str(), |(_, r)| r));
    assert!(lines[1].contains(", 0 left not yet removable)"), "the VACUUM after the pin removed them: {}", lines[1]);
    server.stop(Stop::Fast);
}
