//! 100,000 keys in one transaction on a server with default settings.
//!
//! The isolation spec lock_budget runs on the private cluster, whose max_connections = 200
//! doubles the shared lock table; here a throwaway server (`target/servers/lockbudget-NN`, port
//! private cluster's + 42) keeps initdb's defaults, max_connections = 100 and
//! max_locks_per_transaction = 64, so a transaction that kept a lock per key would exhaust the
//! table ("out of shared memory") long before 100,000. One session reserves 100,000 keys with
//! `idem_reserve_many` in one transaction; while it is open another session reserves and
//! completes a batch of 3,000 keys in one transaction, creates and completes single keys, and
//! finds a key of the big transaction in_progress; then the big transaction completes its
//! 100,000 keys with `idem_complete_many` and commits. Every key is created once and completed
//! once. The big transaction keeps at most half of max_locks_per_transaction advisory locks, and
//! every row it wrote carries its own transaction ID (no subtransaction wrote one). Both
//! installs (`IDEM_INSTALL`), every major (the e2e layers' core run includes this binary).

use idempotency_testkit::cluster::install_into;
use idempotency_testkit::server::{major_of, pg_config, Server};
use std::time::Instant;
use tokio_postgres::{Client, NoTls};

const BIG: i64 = 100_000;
const BATCH: i64 = 3_000;
const SINGLES: i64 = 10;

async fn connect(url: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(conn);
    c
}

async fn count(c: &Client, sql: &str) -> i64 {
    c.query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .get(0)
}

/// Rows of `op` in idem_records that a subtransaction of the calling transaction wrote (their
/// xmin is not the transaction's own ID).
fn written_by_subtransactions(op: &str) -> String {
    format!(
        "SELECT count(*) FROM idem_records WHERE operation = '{op}' \
            AND xmin::text::bigint <> pg_current_xact_id()::text::bigint % 4294967296"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_keys_in_one_transaction_on_default_settings() {
    let started = Instant::now();
    let config = pg_config();
    let port = Server::private(&config).port() + 42;
    let server = Server::new(&format!("lockbudget-{}", major_of(&config)), &config, port);
    server.initdb(&[]);
    server.start();
    let admin = connect(&server.url("postgres")).await;
    let settings: (String, String) = {
        let row = admin
            .query_one("SELECT current_setting('max_connections'), current_setting('max_locks_per_transaction')", &[])
            .await
            .expect("settings");
        (row.get(0), row.get(1))
    };
    assert_eq!(
        settings,
        ("100".to_owned(), "64".to_owned()),
        "the server keeps the defaults (max_connections, max_locks_per_transaction)"
    );
    admin
        .batch_execute("CREATE DATABASE idem_budget")
        .await
        .expect("create the database");
    let url = server.url("idem_budget");
    install_into(&url).await;
    let install = std::env::var("IDEM_INSTALL").unwrap_or_else(|_| "extension".into());

    // The big transaction: 100,000 keys reserved in one statement.
    let big = connect(&url).await;
    big.batch_execute("BEGIN").await.unwrap();
    big.batch_execute(&format!(
        "CREATE TEMP TABLE big_keys ON COMMIT DROP AS \
           SELECT key, outcome, token FROM idem_reserve_many('budget.big', 'u', \
             ARRAY(SELECT 'k' || g FROM generate_series(1, {BIG}) AS g), array_fill('h'::text, ARRAY[{BIG}]))"
    ))
    .await
    .expect("reserve 100,000 keys in one transaction");
    let reserved_at = started.elapsed();
    assert_eq!(
        count(
            &big,
            "SELECT count(*) FROM big_keys WHERE outcome = 'created' AND token IS NOT NULL"
        )
        .await,
        BIG,
        "every key created"
    );
    let locks = count(
        &big,
        "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'",
    )
    .await;
    assert!(locks <= 32, "the big transaction keeps at most half of max_locks_per_transaction advisory locks, got {locks}");
    // Read before the completion rewrites every row under the transaction's own ID.
    assert_eq!(
        count(&big, &written_by_subtransactions("budget.big")).await,
        0,
        "no row of the big transaction was written by a subtransaction"
    );

    // Meanwhile, another session: a batch of 3,000 keys reserved and completed in one
    // transaction, single keys created and completed, and a key of the big transaction busy.
    let other = connect(&url).await;
    other.batch_execute("BEGIN").await.unwrap();
    other
        .batch_execute(&format!(
            "CREATE TEMP TABLE o_keys ON COMMIT DROP AS \
               SELECT key, outcome, token FROM idem_reserve_many('budget.other', 'u', \
                 ARRAY(SELECT 'k' || g FROM generate_series(1, {BATCH}) AS g), array_fill('h'::text, ARRAY[{BATCH}]))"
        ))
        .await
        .expect("the other session's batch");
    assert_eq!(
        count(
            &other,
            "SELECT count(*) FROM o_keys WHERE outcome = 'created'"
        )
        .await,
        BATCH,
        "the other batch: every key created"
    );
    // Rows written by subtransactions: none on the extension; on the portable install each new key's
    // insert gives up instead of waiting while the big transaction is past its budget (the one
    // bounded fallback, sql/reserve.sql), so its row (read before the completion rewrites it) carries a subtransaction's ID.
    let by_subtransactions = count(&other, &written_by_subtransactions("budget.other")).await;
    if install != "portable" {
        assert_eq!(
            by_subtransactions, 0,
            "the extension writes no row in a subtransaction"
        );
    }
    let completed = count(
        &other,
        &format!(
            "SELECT count(*) FILTER (WHERE completed) FROM idem_complete_many('budget.other', 'u', \
               (SELECT array_agg(key) FROM o_keys), (SELECT array_agg(token) FROM o_keys), array_fill('{{}}'::jsonb, ARRAY[{BATCH}]))"
        ),
    )
    .await;
    assert_eq!(completed, BATCH, "the other batch: every key completed");
    other
        .batch_execute("COMMIT")
        .await
        .expect("the other batch commits");
    for i in 1..=SINGLES {
        let row = other
            .query_one(
                "SELECT r.outcome, idem_complete('budget.single', 'u', $1, r.token, '{}') AS done \
                   FROM idem_reserve('budget.single', 'u', $1, 'h') AS r",
                &[&format!("k{i}")],
            )
            .await
            .expect("a single call");
        let (outcome, done): (String, Option<bool>) = (row.get(0), row.get(1));
        assert_eq!(
            (outcome.as_str(), done),
            ("created", Some(true)),
            "single key k{i}"
        );
    }
    for key in ["k1", "k99999"] {
        let outcome: String = other
            .query_one(
                "SELECT outcome FROM idem_reserve('budget.big', 'u', $1, 'h')",
                &[&key],
            )
            .await
            .expect("a key of the big transaction")
            .get(0);
        assert_eq!(
            outcome, "in_progress",
            "{key}, held by the open big transaction"
        );
    }

    // The big transaction completes its keys and commits.
    let done = count(
        &big,
        &format!(
            "SELECT count(*) FILTER (WHERE completed) FROM idem_complete_many('budget.big', 'u', \
               (SELECT array_agg(key) FROM big_keys), (SELECT array_agg(token) FROM big_keys), array_fill('{{}}'::jsonb, ARRAY[{BIG}]))"
        ),
    )
    .await;
    assert_eq!(done, BIG, "every key of the big transaction completed");
    big.batch_execute("COMMIT")
        .await
        .expect("the big transaction commits");

    let success = count(
        &connect(&url).await,
        "SELECT count(*) FROM idem_records WHERE status = 's'",
    )
    .await;
    assert_eq!(
        success,
        BIG + BATCH + SINGLES,
        "every key of both sessions completed once"
    );
    println!(
        "{install} pg{}: {BIG} keys reserved in {:.1} s, everything done in {:.1} s (server start included); \
         rows of the other session's {BATCH}-key batch written by subtransactions: {by_subtransactions}",
        server.major(),
        reserved_at.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
