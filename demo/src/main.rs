//! The demo: N concurrent duplicates of one "charge" request against (a) a naive check-then-run
//! implementation and (b) `Idempotency::run`; then a replay, a mismatch and a transient failure.
//! Run it with `bash scripts/demo.sh`.

use idempotency_client::{Error, Fingerprint, Idempotency, Key, Outcome, StoredResponse, Tx, TxFuture};
use idempotency_testkit::Charge;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const DUPLICATES: usize = 32;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = idempotency_testkit::fresh_database("idem_demo").await;
    let idem = Idempotency::connect(&url, DUPLICATES + 4)?;
    let version = idem.check_extension().await?;
    let db = idem.pool().get().await?;
    // The naive implementation's own key table, without a constraint: check, then run. Both
    // implementations charge the card by writing a `charges` row (user_id says which one).
    db.batch_execute("CREATE TABLE naive_keys (key text, response jsonb)").await?;

    println!("idempotency {version}: {DUPLICATES} concurrent retries of one POST /charges {{\"amount\": 100}}\n");

    // (a) naive: look the key up, charge if absent, then remember the key.
    let mut tasks = Vec::new();
    for _ in 0..DUPLICATES {
        let pool = idem.pool().clone();
        tasks.push(tokio::spawn(async move {
            let db = pool.get().await?;
            let seen = db.query_opt("SELECT response FROM naive_keys WHERE key = 'k-1' LIMIT 1", &[]).await?;
            if seen.is_none() {
                db.execute("INSERT INTO charges (user_id, amount, k) VALUES ('naive', 100, 'k-1')", &[]).await?;
                tokio::time::sleep(Duration::from_millis(50)).await; // the card network
                db.execute("INSERT INTO naive_keys VALUES ('k-1', '{\"status\": 201}')", &[]).await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await?.map_err(|e| e.to_string())?;
    }
    let naive = count(&db, "naive").await?;
    println!("(a) naive check-then-run      card charged {naive:>2} times  {}", verdict(naive == 1));

    // (b) the extension: the reservation and the charge commit together.
    let runs = Arc::new(AtomicUsize::new(0)); // the handler counts its runs; the rows are what we report
    let key = Key::new("charges.create", "user-42", "k-1")?;
    let fingerprint = Fingerprint::of_json(&json!({"amount": 100}))?;
    let mut tasks = Vec::new();
    for _ in 0..DUPLICATES {
        let (idem, key, fingerprint, runs) = (idem.clone(), key.clone(), fingerprint.clone(), runs.clone());
        tasks.push(tokio::spawn(async move { idem.run(&key, &fingerprint, charge(&runs, &key, 100, 201)).await }));
    }
    let (mut executed, mut busy, mut replayed) = (0, 0, 0);
    for t in tasks {
        match t.await? {
            Ok(Outcome::Executed(_)) => executed += 1,
            Ok(Outcome::Replayed(_)) => replayed += 1,
            Err(Error::InProgress { .. }) => busy += 1,
            other => println!("    unexpected: {other:?}"),
        }
    }
    let ours = count(&db, "idempotency").await?;
    let ran = runs.load(Ordering::SeqCst);
    println!("(b) Idempotency::run          card charged {ours:>2} time   {}", verdict(ours == 1 && ran == 1));
    println!("    {executed} executed, {busy} answered 409 in_progress, {replayed} replayed the stored 201\n");

    // A later retry replays, a different payload is refused.
    let replay = idem.run(&key, &fingerprint, charge(&runs, &key, 100, 201)).await;
    match replay {
        Ok(Outcome::Replayed(r)) => println!(
            "replay     same key, same body     → {} {{\"charged\":{}}} (Idempotent-Replayed: true), card untouched",
            r.status, r.body["charged"]
        ),
        other => println!("replay     unexpected: {other:?}"),
    }
    let other = Fingerprint::of_json(&json!({"amount": 200}))?;
    match idem.run(&key, &other, charge(&runs, &key, 200, 201)).await {
        Err(e @ Error::Mismatch) => println!("mismatch   same key, amount 200    → {} ({e})", e.http_status()),
        other => println!("mismatch   unexpected: {other:?}"),
    }

    // A transient failure is released and retried; the charge happens once.
    let flaky = Key::new("charges.create", "user-42", "k-2")?;
    let first = idem.run(&flaky, &fingerprint, charge(&runs, &flaky, 100, 503)).await;
    let second = idem.run(&flaky, &fingerprint, charge(&runs, &flaky, 100, 201)).await;
    let charged = idempotency_testkit::charges_for(&db, &flaky).await;
    match (first, second) {
        (Ok(Outcome::Released(a)), Ok(Outcome::Executed(b))) => println!(
            "transient  upstream 503, retried   → {} released (writes rolled back), then {} executed: charged {charged} time",
            a.status, b.status
        ),
        other => println!("transient  unexpected: {other:?}"),
    }
    Ok(())
}

/// The handler: charges the card (a `charges` row tagged with the key) while the card network
/// takes 50 ms, and answers `status`.
fn charge(
    runs: &Arc<AtomicUsize>,
    key: &Key,
    amount: i64,
    status: u16,
) -> impl for<'t> FnMut(&'t Tx<'_>) -> TxFuture<'t, StoredResponse, tokio_postgres::Error> + Send {
    Charge::of(key).user("idempotency").amount(amount).status(status).delay(Duration::from_millis(50)).handler(runs)
}

async fn count(db: &deadpool_postgres::Client, via: &str) -> Result<i64, tokio_postgres::Error> {
    db.query_one("SELECT count(*) AS n FROM charges WHERE user_id = $1", &[&via]).await?.try_get("n")
}

fn verdict(ok: bool) -> &'static str {
    if ok { "✓" } else { "✗ (double charge)" }
}
