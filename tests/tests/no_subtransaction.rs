//! No path of `run`, `run_batch`, `run_external` or the layer opens a subtransaction: every outcome runs
//! against a database whose statements pg_stat_statements tracks, and none of them is a
//! SAVEPOINT, RELEASE or ROLLBACK TO. A control transaction with a savepoint proves the
//! counting sees one when it happens.

use idempotency_client::{BatchItem, BatchOutcome, Disposition, Error, Fingerprint, HandlerError, Outcome, Settings, StoredResponse, TxFuture};
use idempotency_testkit::{batch, connect_with, exec, fresh_database, unique_key, Charge, Conn, DbError};
use serde_json::json;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

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
    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    admin.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.expect("pg_stat_statements (preloaded by the private cluster: idempotency_pgserver::PRIVATE_SETTINGS)");
    admin
        .batch_execute(&format!("ALTER DATABASE {name} SET pg_stat_statements.track = 'all'; ALTER DATABASE {name} SET pg_stat_statements.track_utility = on"))
        .await
        .expect("track every statement of the database");

    // The control: a savepoint in a fresh session of the database is seen.
    let (control, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    admin.execute("SELECT pg_stat_statements_reset()", &[]).await.expect("reset");
    control.batch_execute("BEGIN; SAVEPOINT control; ROLLBACK TO SAVEPOINT control; RELEASE SAVEPOINT control; COMMIT").await.unwrap();
    let (seen, _) = subtransactions(&admin, name).await;
    assert_eq!(seen.len(), 3, "the control's SAVEPOINT, ROLLBACK TO and RELEASE are counted: {seen:?}");
    admin.execute("SELECT pg_stat_statements_reset()", &[]).await.expect("reset");

    let idem = connect_with(&url, 4, Settings::builder().max_retries(2).lease(Duration::from_secs(5)));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut seen = Vec::new();

    // In-transaction: success, then its replay and a mismatch.
    let key = unique_key("nosub.success");
    seen.push(idem.run(&key, &fp(1), Charge::of(&key).handler::<Failure>(&runs)).await.map(|o| o.decision()));
    seen.push(idem.run(&key, &fp(1), Charge::of(&key).handler::<Failure>(&runs)).await.map(|o| o.decision()));
    seen.push(idem.run(&key, &fp(2), Charge::of(&key).handler::<Failure>(&runs)).await.map(|o| o.decision()));
    // A transient result (503), then a transient error that poisons the key (max_retries 2).
    let key = unique_key("nosub.transient");
    seen.push(idem.run(&key, &fp(1), Charge::of(&key).status(503).handler::<Failure>(&runs)).await.map(|o| o.decision()));
    let poisoned = idem.run(&key, &fp(1), Charge::of(&key).failing(&runs, Failure(None))).await;
    assert!(matches!(poisoned, Err(Error::Poisoned { .. })), "{poisoned:?}");
    // A permanent error, stored.
    let key = unique_key("nosub.permanent");
    let permanent = idem.run(&key, &fp(1), Charge::of(&key).failing(&runs, Failure(Some(json!({"status": 402}))))).await;
    assert!(matches!(permanent, Err(Error::Handler { .. })), "{permanent:?}");
    let replayed = idem.run(&key, &fp(1), Charge::of(&key).handler::<Failure>(&runs)).await;
    assert!(matches!(replayed, Err(Error::Failed { response: Some(_) })), "{replayed:?}");
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
    let scope = [key.operation().to_owned(), key.user_id().to_owned(), key.key().to_owned()];
    let lost = idem
        .run(&key, &fp(1), move |tx: &mut Conn| {
            let scope = scope.clone();
            Box::pin(async move {
                exec(tx, "SELECT FROM idem_lookup($1, $2, $3)", &[&scope[0], &scope[1], &scope[2]]).await?;
                exec(tx, "UPDATE idem_records SET token = token + 1000000 WHERE key = $1", &[&scope[2]]).await?;
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
    let items: Vec<BatchItem> = (0..3).map(|i| BatchItem { key: format!("nosub-b{i}"), fingerprint: fp(i) }).collect();
    let done = idem.run_batch("nosub.batch", "u", &items, answers).await.unwrap();
    assert!(done.iter().all(|(_, o)| matches!(o, BatchOutcome::Executed(_))), "{done:?}");
    let again = idem.run_batch("nosub.batch", "u", &items, answers).await.unwrap();
    assert!(matches!(again[2].1, BatchOutcome::Failed(_)), "{again:?}");
    let failed = idem
        .run_batch("nosub.batch", "u", &[BatchItem { key: "nosub-bx".into(), fingerprint: fp(1) }], |conn: &mut Conn, _: &[String]| {
            Box::pin(async move {
                batch(conn, "SELECT 1").await?;
                Err::<Vec<StoredResponse>, _>(Failure(None))
            }) as TxFuture<'_, _, Failure>
        })
        .await;
    assert!(matches!(failed, Err(Error::Handler { .. })), "{failed:?}");
    let lost = idem
        .run_batch("nosub.batch", "u", &[BatchItem { key: "nosub-bl".into(), fingerprint: fp(1) }], |conn: &mut Conn, keys: &[String]| {
            let n = keys.len();
            Box::pin(async move {
                exec(conn, "SELECT FROM idem_lookup('nosub.batch', 'u', 'nosub-bl')", &[]).await?;
                exec(conn, "UPDATE idem_records SET token = token + 1000000 WHERE key = 'nosub-bl'", &[]).await?;
                Ok(vec![StoredResponse::json(201, json!({})); n])
            }) as TxFuture<'_, _, DbError>
        })
        .await;
    assert!(matches!(lost, Err(Error::LeaseLost { .. })), "{lost:?}");

    // Two-phase: success, a transient result, a permanent error.
    let key = unique_key("nosub.external");
    let ok = idem.run_external(&key, &fp(1), async { Ok::<_, Failure>(StoredResponse::json(201, json!({}))) }, nothing).await;
    assert!(matches!(ok, Ok(Outcome::Executed(_))), "{ok:?}");
    let key = unique_key("nosub.external_transient");
    let released = idem.run_external(&key, &fp(1), async { Ok::<_, Failure>(StoredResponse::json(503, json!({}))) }, nothing).await;
    assert!(matches!(released, Ok(Outcome::Released(_))), "{released:?}");
    let key = unique_key("nosub.external_permanent");
    let failed = idem
        .run_external(&key, &fp(1), async { Err::<StoredResponse, _>(Failure(Some(json!({"status": 402})))) }, nothing)
        .await;
    assert!(matches!(failed, Err(Error::Handler { .. })), "{failed:?}");

    let labels: Vec<_> = seen.iter().map(|r| r.as_ref().map(|d| d.as_str()).map_err(|e| e.decision().as_str())).collect();
    assert_eq!(labels, [Ok("executed"), Ok("replayed"), Err("mismatch"), Ok("released")]);

    let (found, calls) = subtransactions(&admin, name).await;
    assert!(calls > 20, "pg_stat_statements tracked the flows' statements ({calls} calls)");
    assert!(found.is_empty(), "statements that open a subtransaction: {found:?}");
}

/// A batch's closure: one statement, 201 for every created key but the last, 402 for it.
fn answers<'t>(conn: &'t mut Conn, keys: &'t [String]) -> TxFuture<'t, Vec<StoredResponse>, DbError> {
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
