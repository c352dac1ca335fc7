//! Issue 9's client defects, one test each (written against the API before the fix, to show
//! that each fails there).

use deadpool_postgres::Transaction;
use futures_util::future::BoxFuture;
use idempotency_client::ops;
use idempotency_client::{Config, Error, Fingerprint, Idempotency, Outcome, StoredResponse, Work};
use idempotency_tests::{admin, charges_for, handle, unique_key};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Raises a real SQLSTATE 40001 from a statement.
const SERIALIZATION_FAILURE: &str =
    "DO $$ BEGIN RAISE EXCEPTION 'forced serialization failure' USING ERRCODE = 'serialization_failure'; END $$";

fn fp() -> Fingerprint {
    Fingerprint::of_json(&json!({"amount": 1})).unwrap()
}

/// Defect 1: a 40001 raised inside the closure retries the whole transaction and never counts
/// as a transient failure of the key.
#[tokio::test]
async fn serialization_failure_inside_the_closure_retries_the_transaction_without_counting() {
    let idem = handle(Config { max_retries: Some(3), ..Config::default() }).await;
    let key = unique_key("defect.closure_40001");
    let runs = Arc::new(AtomicUsize::new(0));
    let out = idem
        .run(&key, &fp(), {
            let (runs, tag) = (runs.clone(), key.to_string());
            move |tx| {
                let (runs, tag) = (runs.clone(), tag.clone());
                Box::pin(async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst);
                    tx.execute("INSERT INTO charges (user_id, amount, k) VALUES ('u', 1, $1)", &[&tag]).await?;
                    if n < 3 {
                        tx.batch_execute(SERIALIZATION_FAILURE).await?;
                    }
                    Ok(StoredResponse::json(201, json!({"run": n})))
                }) as Work<'_, _, tokio_postgres::Error>
            }
        })
        .await;
    assert!(matches!(&out, Ok(Outcome::Executed(_))), "{out:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 4, "three serialization failures, then the run that commits");
    let admin = admin().await;
    assert_eq!(charges_for(&admin, &key).await, 1, "only the committed run's write is kept");
    let again = ops::reserve(&admin, &key, fp().as_str(), &ops::ReserveOptions::default()).await.unwrap();
    assert_eq!(again.attempts, 0, "a serialization failure is not a failure of the key");
}

/// Defect 2: an undefined function in the caller's own SQL is a database error, not
/// `ExtensionMissing`.
#[tokio::test]
async fn an_undefined_function_in_the_callers_sql_is_not_extension_missing() {
    let admin = admin().await;
    let db_error = admin.query_one("SELECT no_such_function_in_your_schema()", &[]).await.unwrap_err();
    let err: Error = db_error.into();
    assert!(!matches!(err, Error::ExtensionMissing(_)), "{err:?}");
    assert_eq!(err.sqlstate(), Some(&tokio_postgres::error::SqlState::UNDEFINED_FUNCTION));
}

/// The local write of the two-phase flow: one row tagged with the key; its first `failures`
/// runs then raise a serialization failure (`usize::MAX`: every run fails with 42P01).
fn record(
    tag: String,
    runs: Arc<AtomicUsize>,
    failures: usize,
) -> impl for<'t> FnOnce(&'t Transaction<'_>, &'t StoredResponse) -> BoxFuture<'t, Result<(), tokio_postgres::Error>> + Send {
    move |tx, _response| {
        Box::pin(async move {
            if failures == usize::MAX {
                tx.batch_execute("INSERT INTO no_such_table VALUES (1)").await?;
            }
            tx.execute("INSERT INTO charges (user_id, amount, k) VALUES ('u', 1, $1)", &[&tag]).await?;
            if runs.fetch_add(1, Ordering::SeqCst) < failures {
                tx.batch_execute(SERIALIZATION_FAILURE).await?;
            }
            Ok(())
        })
    }
}

/// Defect 3: after the outside call succeeded, a transient failure of the local transaction is
/// retried; the outside call never runs twice and its result is recorded.
#[tokio::test]
async fn run_external_retries_the_local_transaction_after_a_transient_error() {
    let idem = handle(Config { lease: Some(Duration::from_secs(5)), ..Config::default() }).await;
    let key = unique_key("defect.record_40001");
    let calls = Arc::new(AtomicUsize::new(0));
    let call = {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, json!({"network_ref": "ch_1"})))
        }
    };
    let attempts = Arc::new(AtomicUsize::new(0));
    let out = idem.run_external(&key, &fp(), call, record(key.to_string(), attempts.clone(), 1)).await;
    assert!(matches!(&out, Ok(Outcome::Executed(_))), "{out:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let admin = admin().await;
    assert_eq!(charges_for(&admin, &key).await, 1);
    assert_eq!(ops::lookup(&admin, &key).await.unwrap().unwrap().status, "SUCCESS");
}

/// Defect 3: when the local write fails for good, the key is not left to be recovered as a
/// failure: it holds the outside result, so a retry replays it and never calls out again.
#[tokio::test]
async fn run_external_keeps_the_outside_result_when_the_local_write_fails() {
    let idem = handle(Config { lease: Some(Duration::from_secs(5)), ..Config::default() }).await;
    let key = unique_key("defect.record_fails");
    let call = async { Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, json!({"network_ref": "ch_2"}))) };
    let err = idem.run_external(&key, &fp(), call, record(key.to_string(), Arc::default(), usize::MAX)).await.unwrap_err();
    let admin = admin().await;
    let stored = ops::lookup(&admin, &key).await.unwrap().unwrap();
    assert_eq!(stored.status, "SUCCESS", "{err:?}: the outside call happened; its result is kept");
    assert_eq!(stored.response.unwrap()["body"]["network_ref"], "ch_2");
}

/// Defect 4: the transient result that poisons the key is not reported as released.
#[tokio::test]
async fn the_transient_result_that_poisons_the_key_is_not_reported_as_released() {
    let idem = handle(Config { max_retries: Some(1), ..Config::default() }).await;
    let key = unique_key("defect.poison_outcome");
    let out = idem
        .run(&key, &fp(), |_tx| Box::pin(async { Ok(StoredResponse::json(503, json!({}))) }) as Work<'_, _, tokio_postgres::Error>)
        .await
        .unwrap();
    assert_eq!(ops::lookup(&admin().await, &key).await.unwrap().unwrap().status, "FAILED");
    assert!(!matches!(out, Outcome::Released(_)), "a poisoned key reported as released: {out:?}");
}

/// Defect 5: a malformed URL is a configuration error, and errors keep their sources.
#[tokio::test]
async fn errors_keep_their_sources_and_a_bad_url_is_a_configuration_error() {
    use std::error::Error as _;
    let bad = Idempotency::connect("postgresql://127.0.0.1:not-a-port/db", 2);
    assert!(!matches!(bad, Err(Error::StoreUnavailable(_))), "a malformed URL is not the store being down: {:?}", bad.err());

    let down = Idempotency::connect("postgresql://postgres@127.0.0.1:1/postgres?connect_timeout=2", 2).unwrap();
    let err = down.check_extension().await.unwrap_err();
    assert!(matches!(err, Error::StoreUnavailable(_)), "{err:?}");
    assert!(err.source().is_some(), "StoreUnavailable keeps its source: {err:?}");

    // A stored response that does not decode as the caller's type.
    let idem = handle(Config::default()).await;
    let key = unique_key("defect.decode");
    idem.run(&key, &fp(), |_tx| Box::pin(async { Ok(StoredResponse::json(201, json!({}))) }) as Work<'_, _, tokio_postgres::Error>)
        .await
        .unwrap();
    let err = idem
        .run(&key, &fp(), |_tx| Box::pin(async { Ok(7i64) }) as Work<'_, i64, tokio_postgres::Error>)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Decode(_)), "{err:?}");
    assert!(err.source().is_some_and(|s| s.is::<serde_json::Error>()), "Decode keeps the serde error: {err:?}");
}
