//! `pg_dump` of a database using the extension, restored into a new database, keeps every record
//! and retry counter, and tokens issued after the restore exceed every earlier token.

use idempotency_client::ops::{self, ReserveOptions, ReserveOutcome, Status};
use idempotency_client::{Fingerprint, Idempotency, Key, Postgres, Settings};
use idempotency_testkit::{database_url, fresh_database, pg_bin, root};
use serde_json::json;
use std::process::Command;

const COLUMNS: &str = "operation, user_id, key, request_hash, status, token, response::text, \
    lease_expires_at, expires_at, created_at, updated_at";

async fn dump_rows(client: &deadpool_postgres::Client) -> (Vec<String>, Vec<String>) {
    let records = client
        .query(&format!("SELECT ({COLUMNS})::text AS r FROM idem_records ORDER BY operation, user_id, key"), &[])
        .await
        .unwrap();
    let counters = client.query("SELECT (t.*)::text AS r FROM idem_retries t ORDER BY 1", &[]).await.unwrap();
    (records.iter().map(|r| r.get("r")).collect(), counters.iter().map(|r| r.get("r")).collect())
}

#[tokio::test]
async fn dump_and_restore_keep_records_counters_and_token_order() {
    let src_url = fresh_database("idem_dump_src").await;
    let src = Idempotency::<Postgres>::from_url(&src_url, 4, Settings::default()).unwrap();
    let client = src.pool().get().await.unwrap();
    let schema = src.schema().await.unwrap();
    let fp = Fingerprint::of_json(&json!({"a": 1})).unwrap();
    let opts = ReserveOptions::default();
    // One key in each state, plus a retry counter.
    for (i, end) in ["success", "failed", "processing", "released"].iter().enumerate() {
        let key = Key::new("dump", "u", format!("k{i}")).unwrap();
        let ReserveOutcome::Created(token) = ops::reserve(&client, &schema, &key, &fp, &opts).await.unwrap().outcome else {
            panic!("created")
        };
        match *end {
            "success" => assert!(ops::complete(&client, &schema, &key, token, Some(&json!({"n": 12.50})), Status::Success).await.unwrap()),
            "failed" => assert!(ops::complete(&client, &schema, &key, token, Some(&json!({"status": 402})), Status::Failed).await.unwrap()),
            "released" => {
                ops::release(&client, &schema, &key, token, None).await.unwrap();
            }
            _ => {}
        }
    }
    let max_token: i64 = client.query_one("SELECT max(token) AS t FROM idem_records", &[]).await.unwrap().get("t");
    let before = dump_rows(&client).await;
    assert_eq!(before.1.len(), 1, "one retry counter");

    let file = root().join("target/idem_dump.pgc");
    let out = Command::new(pg_bin("pg_dump")).args(["-Fc", "-d", &src_url, "-f"]).arg(&file).output().unwrap();
    assert!(out.status.success(), "pg_dump: {}", String::from_utf8_lossy(&out.stderr));
    // An empty target database (no extension yet): the dump recreates it with its rows.
    let admin = Idempotency::<Postgres>::from_url(idempotency_testkit::cluster_url(), 1, Settings::default()).unwrap();
    let admin = admin.pool().get().await.unwrap();
    admin.batch_execute("DROP DATABASE IF EXISTS idem_dump_dst WITH (FORCE)").await.unwrap();
    admin.batch_execute("CREATE DATABASE idem_dump_dst").await.unwrap();
    let dst_url = database_url("idem_dump_dst");
    let out = Command::new(pg_bin("pg_restore")).args(["--exit-on-error", "-d", &dst_url]).arg(&file).output().unwrap();
    assert!(out.status.success(), "pg_restore: {}", String::from_utf8_lossy(&out.stderr));

    let dst = Idempotency::<Postgres>::from_url(&dst_url, 4, Settings::default()).unwrap();
    let restored = dst.pool().get().await.unwrap();
    assert_eq!(dump_rows(&restored).await, before, "every record and counter, byte for byte");

    // Tokens keep increasing after the restore, and the restored keys behave.
    let key = Key::new("dump", "u", "after-restore").unwrap();
    let ReserveOutcome::Created(token) = ops::reserve(&restored, &schema, &key, &fp, &opts).await.unwrap().outcome else {
        panic!("created")
    };
    assert!(token.0 > max_token, "token {} after restore must exceed {max_token}", token.0);
    let replay = ops::reserve(&restored, &schema, &Key::new("dump", "u", "k0").unwrap(), &fp, &opts).await.unwrap();
    assert_eq!(replay.outcome, ReserveOutcome::Replay(Some(json!({"n": 12.50}))));
    let retried = ops::reserve(&restored, &schema, &Key::new("dump", "u", "k3").unwrap(), &fp, &opts).await.unwrap();
    assert!(matches!(retried.outcome, ReserveOutcome::Created(_)));
    assert_eq!(retried.attempts, 1, "the retry counter survived the restore");
}
