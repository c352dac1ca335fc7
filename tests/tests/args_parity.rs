//! The argument rules exist twice by necessity: natively in the extension (extension/src/args.rs,
//! on the client crate's key rules) and in PL/pgSQL for the portable install
//! (sql/portable/args.sql). On thousands of generated inputs both answer the same value, or
//! raise the same SQLSTATE with the same message.
//!
//! The native side is always the extension, in a database of its own (`CREATE EXTENSION
//! idempotency`, whatever `IDEM_INSTALL` says). The portable side is, with the extension
//! (`IDEM_INSTALL` unset), sql/portable/args.sql loaded from the sources into a schema of that
//! database; with the portable install (`IDEM_INSTALL=portable`), the rules of the live portable
//! install in the test database, as its users have them. Each side's language is checked first
//! (C on the native side, SQL or PL/pgSQL on the other), so the test can never compare one
//! implementation with itself.

use idempotency_testkit::{admin, admin_at, cluster_url, database_url, root};
use rand::rngs::StdRng;
use std::collections::BTreeSet;
use rand::{Rng, SeedableRng};

const CASES: usize = 3000;

fn text(rng: &mut StdRng) -> Option<String> {
    Some(match rng.random_range(0..10) {
        0 => return None,
        1 => String::new(),
        2 => "x".repeat(rng.random_range(250..260)),
        3 => "é".repeat(rng.random_range(126..130)),
        4 => format!("k{}z", char::from_u32(rng.random_range(1..0x20)).unwrap_or('\u{1}')),
        5 => format!("ab{}", char::from_u32(rng.random_range(0x7f..0xa2)).unwrap_or('\u{85}')),
        6 => "😀\u{a0}\u{200b}".into(),
        _ => (0..rng.random_range(1..12)).map(|_| char::from_u32(rng.random_range(0x20..0x250)).unwrap_or('?')).collect(),
    })
}

fn interval(rng: &mut StdRng) -> Option<String> {
    Some(match rng.random_range(0..9) {
        0 => return None,
        1 => "0".into(),
        2 => format!("{} seconds", rng.random_range(-100..100)),
        3 => format!("{} minutes", rng.random_range(1..600)),
        4 => format!("{} days {} hours", rng.random_range(-3..40), rng.random_range(-30..30)),
        5 => format!("{} mons", rng.random_range(-2..30)),
        6 => format!("{} years", [999, 1000, 1001, 5000][rng.random_range(0..4)]),
        7 => "1000 years 1 microsecond".into(),
        _ => "1 year -360 days".into(),
    })
}

/// The value as text, or the error as "SQLSTATE: message".
async fn answer(db: &deadpool_postgres::Client, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> String {
    match db.query_one(sql, params).await {
        Ok(row) => row.get::<_, Option<String>>(0).unwrap_or_else(|| "NULL".into()),
        Err(e) => match e.as_db_error() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => panic!("{sql}: {e}"),
        },
    }
}

/// The names of the rules compared (the `_idem_` functions of sql/portable/args.sql).
const RULES: [&str; 7] =
    ["_idem_check_scope", "_idem_check_request_hash", "_idem_require", "_idem_ttl", "_idem_lease", "_idem_max_retries", "_idem_check_step"];

/// The language of each rule in `schema`, as `name=language`.
async fn languages(db: &deadpool_postgres::Client, schema: &str) -> BTreeSet<String> {
    let rows = db
        .query(
            "SELECT p.proname || '=' || l.lanname FROM pg_catalog.pg_proc AS p
               JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang
              WHERE p.pronamespace = $1::text::regnamespace AND p.proname = ANY ($2)",
            &[&schema, &RULES.to_vec()],
        )
        .await
        .expect("the rules' languages");
    rows.iter().map(|r| r.get(0)).collect()
}

/// A database of its own with the extension installed (always the extension: the native side).
async fn native_database() -> deadpool_postgres::Client {
    let name = "idem_args_native";
    let (cluster, conn) = tokio_postgres::connect(cluster_url(), tokio_postgres::NoTls).await.expect("connect to the private cluster");
    tokio::spawn(conn);
    for sql in [format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"), format!("CREATE DATABASE {name}")] {
        cluster.batch_execute(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let db = admin_at(&database_url(name)).await;
    db.batch_execute("CREATE EXTENSION idempotency")
        .await
        .expect("CREATE EXTENSION idempotency (the native side needs the extension installed, also under IDEM_INSTALL=portable)");
    db
}

#[tokio::test]
async fn native_and_portable_argument_rules_agree() {
    let native = native_database().await;
    let native_languages = languages(&native, "public").await;
    let all_c: BTreeSet<String> = RULES.iter().map(|r| format!("{r}=c")).collect();
    assert_eq!(native_languages, all_c, "the native side is the extension's C");

    // The portable side, and the schema its rules are called in.
    let live_portable = std::env::var("IDEM_INSTALL").as_deref() == Ok("portable");
    let (portable, schema) = if live_portable {
        (admin().await, "public")
    } else {
        let source = std::fs::read_to_string(root().join("sql/portable/args.sql")).expect("sql/portable/args.sql");
        native
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS portable_args CASCADE; CREATE SCHEMA portable_args; {}",
                // The twins go into their own schema; the PL/pgSQL helpers they call are the
                // extension's (sql/internal.sql, loaded by the portable install too).
                source.replace("CREATE FUNCTION @extschema@.", "CREATE FUNCTION portable_args.").replace("@extschema@", "public")
            ))
            .await
            .expect("load the portable argument rules");
        (admin_at(&database_url("idem_args_native")).await, "portable_args")
    };
    let portable_languages = languages(&portable, schema).await;
    assert_eq!(portable_languages.len(), RULES.len(), "every rule on the portable side: {portable_languages:?}");
    assert!(
        portable_languages.iter().all(|l| l.ends_with("=sql") || l.ends_with("=plpgsql")),
        "the portable side is SQL and PL/pgSQL, not the extension's C: {portable_languages:?}"
    );
    let prefix = if schema == "public" { String::new() } else { format!("{schema}.") };

    let mut rng = StdRng::seed_from_u64(0xa895);
    let (mut same_ok, mut same_err) = (0, 0);
    for case in 0..CASES {
        // Settings change now and then: set, emptied, reset (on both sides).
        if case % 200 == 0 {
            let setting = ["SET idempotency.ttl = '36h'", "SET idempotency.lease = '90s'", "SET idempotency.ttl = '2d'",
                           "RESET idempotency.ttl", "RESET idempotency.lease", "SET idempotency.max_retries = 7",
                           "RESET idempotency.max_retries"][case / 200 % 7];
            native.batch_execute(setting).await.expect(setting);
            portable.batch_execute(setting).await.expect(setting);
        }
        let (a, b, c, h) = (text(&mut rng), text(&mut rng), text(&mut rng), text(&mut rng));
        let (ttl, lease) = (interval(&mut rng), interval(&mut rng));
        let retries: Option<i32> = [None, Some(0), Some(-5), Some(1), Some(3), Some(i32::MAX)][rng.random_range(0..6)];
        let is_null: Option<bool> = [None, Some(true), Some(false)][rng.random_range(0..3)];
        // A recovery point's step: NULL, below 0, 0, and above.
        let step: Option<i32> = [None, Some(-1), Some(i32::MIN), Some(0), Some(1), Some(rng.random_range(2..1000)), Some(i32::MAX)]
            [rng.random_range(0..7)];
        let calls: [(&str, Vec<&(dyn tokio_postgres::types::ToSql + Sync)>); 8] = [
            ("_idem_check_scope($1, $2, $3)::text", vec![&a, &b, &c]),
            ("_idem_check_request_hash($1)::text", vec![&h]),
            ("_idem_require('wait', $1)::text", vec![&is_null]),
            ("_idem_ttl($1::text::interval)::text", vec![&ttl]),
            ("_idem_lease($1::text::interval, _idem_ttl($2::text::interval))::text", vec![&lease, &ttl]),
            ("_idem_lease($1::text::interval, NULL)::text", vec![&lease]),
            ("_idem_max_retries($1)::text", vec![&retries]),
            ("_idem_check_step($1)::text", vec![&step]),
        ];
        for (call, params) in calls {
            let native_answer = answer(&native, &format!("SELECT {call}"), &params).await;
            let portable_answer = answer(&portable, &format!("SELECT {}", call.replace("_idem_", &format!("{prefix}_idem_"))), &params).await;
            assert_eq!(native_answer, portable_answer, "{call} with {params:?}");
            if native_answer.contains(": ") { same_err += 1 } else { same_ok += 1 }
        }
    }
    // Both sides of every rule were reached.
    assert!(same_ok > 2000 && same_err > 2000, "agreed on {same_ok} values and {same_err} errors");
}
