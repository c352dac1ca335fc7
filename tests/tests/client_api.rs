//! The client's promises about the wire and the pool: round trips per call (counted by a proxy
//! as client writes that follow an answer from the server), the schema option, and what the
//! pool does under pressure.

use deadpool_postgres::{PoolConfig, Runtime, Timeouts};
use idempotency_client::ops::{self, ReserveOutcome};
use idempotency_client::{Error, Fingerprint, Idempotency, Key, Outcome, Postgres, Settings, StoredResponse, Tx, TxFuture};
use idempotency_testkit::proxy::Proxy;
use idempotency_testkit::trips;
use idempotency_testkit::{charges_for, cluster_addr, cluster_url, database_url, fresh_database, unique_key};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const INSERT: &str = "INSERT INTO charges (user_id, amount, k) VALUES ('rt', 1, $1)";

fn fp() -> Fingerprint {
    Fingerprint::of_json(&json!({"amount": 1})).unwrap()
}

/// A closure that writes one business row with a cached statement (one round trip), or none.
fn insert(tag: String, statements: usize) -> impl for<'t> FnMut(&'t mut Tx) -> TxFuture<'t, StoredResponse, tokio_postgres::Error> + Send {
    move |tx| {
        let tag = tag.clone();
        Box::pin(async move {
            for _ in 0..statements {
                let stmt = tx.prepare_cached(INSERT).await?;
                tx.execute(&stmt, &[&tag]).await?;
            }
            Ok(StoredResponse::json(201, json!({})))
        })
    }
}

/// The local write of `run_external`: one business row (one round trip), or nothing.
fn record(tag: Option<String>) -> impl for<'t> FnMut(&'t mut Tx, &'t StoredResponse) -> TxFuture<'t, (), tokio_postgres::Error> + Send {
    move |tx, _response| {
        let tag = tag.clone();
        Box::pin(async move {
            if let Some(tag) = tag {
                let stmt = tx.prepare_cached(INSERT).await?;
                tx.execute(&stmt, &[&tag]).await?;
            }
            Ok(())
        })
    }
}

/// Whether the connection is inside a transaction block (a savepoint can only be set in one).
async fn in_transaction(client: &deadpool_postgres::Client) -> bool {
    match client.batch_execute("SAVEPOINT probe").await {
        Ok(()) => true,
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::NO_ACTIVE_SQL_TRANSACTION) => false,
        Err(e) => panic!("{e}"),
    }
}

/// Round trips of `f`, after one warm-up call (connection, schema, prepared statements).
async fn trips_of<F, Fut>(proxy: &Proxy, mut f: F) -> u64
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    f(0).await;
    let before = proxy.round_trips();
    f(1).await;
    proxy.round_trips() - before
}

// A current-thread runtime: a replay's background ROLLBACK cannot leave before the test has
// read the count at the moment the answer arrives.
#[tokio::test]
async fn run_takes_three_round_trips_and_a_replay_one() {
    let name = "idem_client_round_trips";
    fresh_database(name).await;
    let proxy = Proxy::start(cluster_addr(), None).await;
    let idem = Idempotency::<Postgres>::from_url(&proxy.url(name), 1, Settings::default()).unwrap();
    let user = "rt-user";

    let one = trips_of(&proxy, |i| {
        let idem = idem.clone();
        async move {
            let key = Key::new("rt.one", user, format!("k{i}")).unwrap();
            let out = idem.run(&key, &fp(), insert(key.to_string(), 1)).await.unwrap();
            assert!(out.is_executed());
        }
    })
    .await;
    assert_eq!(one, 3, "BEGIN+reserve, the INSERT, complete+COMMIT");

    let empty = trips_of(&proxy, |i| {
        let idem = idem.clone();
        async move {
            let key = Key::new("rt.empty", user, format!("k{i}")).unwrap();
            idem.run(&key, &fp(), insert(key.to_string(), 0)).await.unwrap();
        }
    })
    .await;
    assert_eq!(empty, 2, "BEGIN+reserve, complete+COMMIT: no savepoint to send");

    // A replay: answered after one round trip; its ROLLBACK is queued on the connection without
    // waiting, and the connection is back in the pool at once, outside any transaction for
    // whoever uses it next.
    let key = Key::new("rt.one", user, "k1").unwrap();
    let before = proxy.round_trips();
    let out = idem.run(&key, &fp(), insert("never".into(), 1)).await.unwrap();
    assert!(out.is_replayed());
    assert_eq!(proxy.round_trips() - before, 1, "the answer path of a replay");
    assert_eq!(idem.pool().status().available, 1, "the connection is back in the pool");
    let client = idem.pool().get().await.unwrap();
    assert!(!in_transaction(&client).await, "the next user is outside any transaction");
    drop(client);

    // run_external: reserve (1), then BEGIN with the record's INSERT (1), complete+COMMIT (1).
    let external = trips_of(&proxy, |i| {
        let idem = idem.clone();
        async move {
            let key = Key::new("rt.external", user, format!("k{i}")).unwrap();
            let call = async { Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, json!({}))) };
            let out = idem.run_external(&key, &fp(), call, record(Some(key.to_string()))).await.unwrap();
            assert!(out.is_executed());
        }
    })
    .await;
    assert_eq!(external, 3);
    let client = idem.pool().get().await.unwrap();
    assert_eq!(charges_for(&client, &Key::new("rt.external", user, "k1").unwrap()).await, 1);
}

// The benchmark's own count (idempotency_testkit::trips), made as a service makes its calls:
// from tasks spawned on a multi-threaded runtime, one after another and from 8 loops at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_multi_threaded_runtime_pipelined_requests_leave_together() {
    let name = "idem_client_trips";
    fresh_database(name).await;
    let t = trips::count(cluster_addr(), name, INSERT, 50, 8).await;
    assert_eq!((t.raw, t.run, t.empty), (3.0, 3.0, 2.0), "raw, run, run with an empty closure: {t:?}");
    assert!(t.concurrent <= 3.0, "run from 8 loops at once: {t:?}");
    assert_eq!(t.replay_answer, 1.0, "the answer path of a replay: {t:?}");
    assert_eq!((t.reserve, t.record), (1.0, 2.0), "run_external's reservation and record: {t:?}");
}

#[tokio::test]
async fn calls_are_qualified_with_the_extensions_schema_not_the_search_path() {
    let name = "idem_client_schema";
    let (admin, conn) = tokio_postgres::connect(cluster_url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    for sql in [format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"), format!("CREATE DATABASE {name}")] {
        admin.batch_execute(&sql).await.unwrap();
    }
    let url = database_url(name);
    let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    db.batch_execute(
        "CREATE SCHEMA idem; CREATE EXTENSION idempotency SCHEMA idem;
         CREATE TABLE charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL, k text);",
    )
    .await
    .unwrap();

    // Default: the schema comes from pg_extension; the search_path stays as it is.
    let found = Idempotency::<Postgres>::from_url(&url, 2, Settings::default()).unwrap();
    assert_eq!(found.check_extension().await.unwrap(), env!("CARGO_PKG_VERSION"));
    assert_eq!(found.schema().await.unwrap().name(), "idem");
    let key = unique_key("schema.default");
    let out = found.run(&key, &fp(), insert(key.to_string(), 1)).await.unwrap();
    assert!(out.is_executed());
    let client = found.pool().get().await.unwrap();
    let path: String = client.query_one("SHOW search_path", &[]).await.unwrap().get(0);
    assert_eq!(path, "\"$user\", public", "never edited");
    assert!(ops::lookup(&client, &found.schema().await.unwrap(), &key).await.unwrap().is_some());

    // Configured explicitly.
    let named = Idempotency::<Postgres>::from_url(&url, 2, Settings::builder().schema("idem")).unwrap();
    assert!(named.run(&key, &fp(), insert(key.to_string(), 1)).await.unwrap().is_replayed());

    // Configured wrongly: our own statements say the extension is missing there.
    let wrong = Idempotency::<Postgres>::from_url(&url, 2, Settings::builder().schema("public")).unwrap();
    let err = wrong.run(&key, &fp(), insert(key.to_string(), 1)).await.unwrap_err();
    assert!(matches!(err, Error::IncompatibleExtension { .. }), "{err:?}");
    let err = wrong.check_extension().await.unwrap_err();
    assert!(matches!(&err, Error::IncompatibleExtension { reason, .. } if reason.contains("\"idem\"")), "{err:?}");

    // An invalid schema name is refused before anything is connected.
    let err = Idempotency::<Postgres>::from_url(&url, 2, Settings::builder().schema(String::new())).unwrap_err();
    assert!(matches!(err, Error::Configuration { .. }), "{err:?}");
}

/// A handle over a pool of `size` connections whose wait for a free one ends after 300 ms
/// (connecting may take longer on a loaded machine).
fn small_pool(url: &str, size: usize) -> Idempotency {
    let mut cfg = deadpool_postgres::Config::new();
    cfg.url = Some(url.to_owned());
    let (wait, create) = (Some(Duration::from_millis(300)), Some(Duration::from_secs(10)));
    cfg.pool = Some(PoolConfig { max_size: size, timeouts: Timeouts { wait, create, recycle: create }, ..PoolConfig::default() });
    Idempotency::<Postgres>::from_pool(cfg.create_pool(Some(Runtime::Tokio1), tokio_postgres::NoTls).unwrap(), Settings::default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_exhausted_pool_answers_store_unavailable_and_runs_nothing() {
    let url = fresh_database("idem_client_pool_load").await;
    let idem = small_pool(&url, 2);
    let runs = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(6));
    // How many callers have given up; the two that got a connection hold it until four have.
    let (gave_up, given_up) = tokio::sync::watch::channel(0usize);
    let gave_up = Arc::new(gave_up);
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (idem, runs, start, gave_up, given_up) = (idem.clone(), runs.clone(), start.clone(), gave_up.clone(), given_up.clone());
        tasks.push(tokio::spawn(async move {
            let key = unique_key(&format!("pool.load.{i}"));
            start.wait().await;
            let result = idem
                .run(&key, &fp(), move |tx| {
                    let runs = runs.clone();
                    let mut given_up = given_up.clone();
                    Box::pin(async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tx.query_one("SELECT 1", &[]).await?;
                        // Hold the connection (in the transaction) until the four callers without
                        // one have given up: an unbounded wait would never let this end.
                        let four = tokio::time::timeout(Duration::from_secs(30), given_up.wait_for(|n| *n >= 4)).await;
                        assert!(matches!(four, Ok(Ok(_))), "the four callers without a connection never gave up");
                        Ok(StoredResponse::json(201, json!({})))
                    }) as TxFuture<'_, _, tokio_postgres::Error>
                })
                .await;
            if matches!(result, Err(Error::StoreUnavailable(_))) {
                gave_up.send_modify(|n| *n += 1);
            }
            (key, result)
        }));
    }
    let mut executed = 0;
    let mut unavailable = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (_, Ok(Outcome::Executed(_))) => executed += 1,
            (key, Err(err @ Error::StoreUnavailable(_))) => {
                let source = std::error::Error::source(&err).expect("the pool's error");
                let pool_error = source.downcast_ref::<deadpool_postgres::PoolError>().expect("a PoolError");
                assert!(matches!(pool_error, deadpool_postgres::PoolError::Timeout(_)), "{pool_error:?}");
                assert_eq!(idempotency_tower::http_status(&err), 503);
                unavailable.push(key);
            }
            (_, other) => panic!("{other:?}"),
        }
    }
    assert_eq!((executed, unavailable.len()), (2, 4), "two connections, two runs; the others waited and gave up");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a caller who got StoreUnavailable ran nothing");
    let client = idem.pool().get().await.unwrap();
    let schema = idem.schema().await.unwrap();
    for key in &unavailable {
        assert!(ops::lookup(&client, &schema, key).await.unwrap().is_none(), "nothing reserved: the retry is safe");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_external_holds_no_connection_during_the_outside_call() {
    let url = fresh_database("idem_client_pool_external").await;
    let idem = small_pool(&url, 1);
    let key = unique_key("pool.external");
    let call = {
        let idem = idem.clone();
        async move {
            // The pool's only connection is free: the outside call holds none.
            let client = idem.pool().get().await.expect("the only connection is free during the call");
            let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
            Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, json!({"one": one})))
        }
    };
    let out = idem.run_external(&key, &fp(), call, record(None)).await.unwrap();
    assert!(out.is_executed(), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_returns_no_connection_mid_transaction() {
    let url = fresh_database("idem_client_pool_cancel").await;
    let idem = small_pool(&url, 1);
    let key = unique_key("pool.cancel");
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let mut started_tx = Some(started_tx);
    let fingerprint = fp();
    let run = idem.run(&key, &fingerprint, move |tx| {
        let started_tx = started_tx.take();
        Box::pin(async move {
            tx.execute("INSERT INTO charges (user_id, amount, k) VALUES ('cancelled', 1, 'x')", &[]).await?;
            if let Some(s) = started_tx {
                let _ = s.send(());
            }
            std::future::pending::<()>().await;
            Ok(StoredResponse::json(201, json!({})))
        }) as TxFuture<'_, _, tokio_postgres::Error>
    });
    tokio::select! {
        _ = run => panic!("the closure never ends"),
        _ = started => {} // dropping `run` here cancels it mid-transaction
    }
    // The pool's only connection: a new one, outside any transaction; the cancelled attempt's
    // reservation and write rolled back with the closed connection.
    let client = idem.pool().get().await.unwrap();
    assert!(!in_transaction(&client).await);
    let schema = idem.schema().await.unwrap();
    drop(client);
    // The server may still be aborting the cut-off transaction (its reservation is never
    // visible, but the key is busy until the abort ends): in_progress until then, never stuck.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let out = loop {
        match idem.run(&key, &fp(), insert(key.to_string(), 1)).await {
            Err(Error::InProgress { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other.unwrap(),
        }
    };
    assert!(matches!(out, Outcome::Executed(_)));
    let client = idem.pool().get().await.unwrap();
    let rows: i64 = client.query_one("SELECT count(*) FROM charges WHERE user_id = 'cancelled'", &[]).await.unwrap().get(0);
    assert_eq!(rows, 0);
    assert!(matches!(
        ops::reserve(&client, &schema, &key, &fp(), &Default::default()).await.unwrap().outcome,
        ReserveOutcome::Replay(_)
    ));
}

#[tokio::test]
async fn a_commit_pipelined_behind_a_lost_completion_commits_nothing() {
    let url = fresh_database("idem_client_fenced_commit").await;
    let idem = Idempotency::<Postgres>::from_url(&url, 2, Settings::default()).unwrap();
    let key = unique_key("fenced.commit");
    let tag = key.to_string();
    // The closure writes a business row, then (as a takeover would) moves the record to another
    // token, so `idem_complete` answers false while COMMIT is already on its way. The lookup
    // first writes the reservation's record (the native hot path keeps a fresh one in memory
    // until it completes).
    let scope = [key.operation().to_owned(), key.user_id().to_owned(), key.key().to_owned()];
    let err = idem
        .run(&key, &fp(), move |tx| {
            let (tag, scope) = (tag.clone(), scope.clone());
            Box::pin(async move {
                tx.execute("INSERT INTO charges (user_id, amount, k) VALUES ('u', 1, $1)", &[&tag]).await?;
                tx.execute("SELECT FROM idem_lookup($1, $2, $3)", &[&scope[0], &scope[1], &scope[2]]).await?;
                tx.execute("UPDATE idem_records SET token = token + 1000000", &[]).await?;
                Ok(StoredResponse::json(201, json!({})))
            }) as TxFuture<'_, _, tokio_postgres::Error>
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    let client = idem.pool().get().await.unwrap();
    assert!(!in_transaction(&client).await);
    assert_eq!(charges_for(&client, &key).await, 0, "the business write rolled back with the COMMIT");
    assert!(ops::lookup(&client, &idem.schema().await.unwrap(), &key).await.unwrap().is_none());
}
