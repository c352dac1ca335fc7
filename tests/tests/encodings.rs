//! Databases that are not UTF-8 (issue 40). The SQL API reads every text argument as UTF-8, as
//! the client does, converted from the database's encoding by PostgreSQL
//! (extension/src/encoding.rs, `_idem_utf8` in sql/internal.sql): in a LATIN1, WIN1252 or
//! EUC_JP database every fingerprint, key rule, flow and response answer equals the UTF-8
//! database's for the same characters (docs/sql-reference.md, "Databases that are not UTF-8"),
//! and so does every other server encoding with characters of its own (Latin, Cyrillic, Greek,
//! Hebrew, Arabic, Thai, Korean, Chinese, JIS X 0213).
//! SQL_ASCII converts nothing: valid UTF-8 answers as in a UTF-8 database, and bytes that are
//! not UTF-8 are refused naming the argument (22021), so two of them never read as one and
//! nothing panics.
//!
//! Each case runs in a database of the encoding and in a UTF-8 database, both made for the test
//! with the install under test (`IDEM_INSTALL`: the e2e layer runs this binary against the
//! extension, e2e_portable against the portable install), and the answers are compared: the
//! value, or the error as "SQLSTATE: message". `CREATE EXTENSION` itself must succeed in each
//! (the install script is ASCII). One case goes through the client, over each driver (each sets
//! client_encoding UTF8), against a LATIN1 database.

use idempotency_testkit::cluster::install_into;
use idempotency_testkit::{admin_at, cluster_url, database_url};

/// A database `name` in `encoding` (C collation, from template0) with the install under test.
async fn database(name: &str, encoding: &str) -> String {
    let admin = admin_at(cluster_url()).await;
    for sql in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"),
    ] {
        admin.batch_execute(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let url = database_url(name);
    install_into(&url).await;
    url
}

/// The answer of `sql` (one text value): the value, or the error as "SQLSTATE: message".
async fn answer(db: &deadpool_postgres::Client, sql: &str) -> String {
    match db.query_one(sql, &[]).await {
        Ok(row) => row.get::<_, Option<String>>(0).unwrap_or_else(|| "NULL".into()),
        Err(e) => match e.as_db_error() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => panic!("{sql}: {e}"),
        },
    }
}

fn quoted(s: &str) -> String {
    s.replace('\'', "''")
}

/// The cases of one word (`i` keeps its keys apart): fingerprints (both forms, and an invalid
/// JSON text whose error names a byte offset), the key length rule at its boundary, a reserve
/// and complete, the replay with its response, a release counted, a heartbeat, the response
/// size limit at its boundary, a mismatch against every other word (the collision the lossy
/// decoding made).
fn cases(i: usize, word: &str, others: &[&str]) -> Vec<String> {
    let q = quoted(word);
    let (op, user, key) = (format!("pay.{q}"), format!("u-{q}"), format!("k{i}-{q}"));
    let hash = format!(r#"idem_fingerprint('{{"p":"{q}"}}'::jsonb)"#);
    let fits = 255 / word.len();
    let mut out = vec![
        format!(r#"SELECT idem_fingerprint('{{"p":"{q}"}}'::jsonb)"#),
        format!(r#"SELECT idem_fingerprint('{{"{q}":["{q}", 1.50, {{"b":"{q}","a":null}}]}}'::text)"#),
        format!(r#"SELECT idem_fingerprint('["{q}", "{q}'::text)"#),
        format!("SELECT (idem_reserve('len', 'u', repeat('{q}', {fits}), 'h{i}')).outcome"),
        format!("SELECT (idem_reserve('len', 'u', repeat('{q}', {}), 'h{i}')).outcome", fits + 1),
        format!(
            "WITH r AS (SELECT * FROM idem_reserve('{op}', '{user}', '{key}', {hash})) \
             SELECT r.outcome || ' ' || idem_complete('{op}', '{user}', '{key}', r.token, '{{\"name\":\"{q}\"}}'::jsonb)::text FROM r"
        ),
        format!(
            "SELECT r.outcome || ' ' || r.attempts || ' ' || coalesce(r.response::text, '-') \
             FROM idem_reserve('{op}', '{user}', '{key}', {hash}) r"
        ),
        format!(
            "WITH r AS (SELECT * FROM idem_reserve('{op}', '{user}', 'r{i}', 'h')) \
             SELECT idem_release('{op}', '{user}', 'r{i}', r.token) FROM r"
        ),
        format!("SELECT r.outcome || ' ' || r.attempts FROM idem_reserve('{op}', '{user}', 'r{i}', 'h') r"),
        format!(
            "WITH r AS (SELECT * FROM idem_reserve('{op}', '{user}', 'b{i}', 'h')) \
             SELECT idem_heartbeat('{op}', '{user}', 'b{i}', r.token, '1 minute')::text FROM r"
        ),
    ];
    // The response limit counts the UTF-8 bytes of the response's jsonb text, in any database:
    // one byte short of this one's refuses it, its size stores it.
    let size = format!(r#"{{"name": "{word}"}}"#).len();
    for (limit, k) in [(size - 1, "z"), (size, "y")] {
        out.push(format!("SELECT set_config('idempotency.max_response_bytes', '{limit}', false)"));
        out.push(format!(
            "WITH r AS (SELECT * FROM idem_reserve('{op}', '{user}', '{k}{i}', 'h')) \
             SELECT idem_complete('{op}', '{user}', '{k}{i}', r.token, '{{\"name\":\"{q}\"}}'::jsonb)::text FROM r"
        ));
        out.push(format!(
            "SELECT string_agg(key || ' ' || completed, ',') FROM idem_complete_many('{op}', '{user}', \
             ARRAY['m{i}'], ARRAY[1::bigint], ARRAY['{{\"name\":\"{q}\"}}'::jsonb])"
        ));
    }
    out.push("SELECT set_config('idempotency.max_response_bytes', '1MB', false)".into());
    for other in others.iter().filter(|o| **o != word) {
        let o = quoted(other);
        out.push(format!(
            r#"SELECT r.outcome FROM idem_reserve('{op}', '{user}', '{key}', idem_fingerprint('{{"p":"{o}"}}'::jsonb)) r"#
        ));
    }
    out
}

/// Every case of `words` in a database of `encoding` and in a UTF-8 one: equal answers, and in
/// the database of `encoding` no two words share a fingerprint.
async fn answers_equal_utf8(encoding: &str, words: &[&str]) {
    let short = encoding.to_lowercase();
    let (name, reference) = (format!("idem_enc_{short}"), format!("idem_enc_{short}_utf8"));
    let (url, reference) = tokio::join!(database(&name, encoding), database(&reference, "UTF8"));
    let (db, utf8) = (admin_at(&url).await, admin_at(&reference).await);
    let mut compared = 0;
    for (i, word) in words.iter().enumerate() {
        for sql in cases(i, word, words) {
            let (got, want) = (answer(&db, &sql).await, answer(&utf8, &sql).await);
            assert_eq!(got, want, "{encoding}: {sql}");
            compared += 1;
        }
    }
    let mut fingerprints = std::collections::BTreeSet::new();
    for word in words {
        let fp = answer(&db, &format!(r#"SELECT idem_fingerprint('{{"p":"{}"}}'::jsonb)"#, quoted(word))).await;
        assert!(fingerprints.insert(fp.clone()), "{encoding}: {word:?} shares its fingerprint {fp} with another word");
    }
    assert!(compared > 10 * words.len(), "{encoding}: {compared} cases");
}

#[tokio::test]
async fn latin1_answers_equal_utf8() {
    // U+0085 is a control character LATIN1 can store: refused at the same byte.
    answers_equal_utf8("LATIN1", &["Müller", "Mäller", "paiement.créer", "ÿß", "o'clock", "k\u{85}x", "plain"]).await;
}

#[tokio::test]
async fn win1252_answers_equal_utf8() {
    // The euro sign and the ellipsis are 0x80 and 0x85 in WIN1252: not control characters.
    answers_equal_utf8("WIN1252", &["Müller", "Mäller", "paiement.créer", "€5", "wait…", "œuvre"]).await;
}

#[tokio::test]
async fn euc_jp_answers_equal_utf8() {
    // Kanji and kana (two bytes in EUC_JP, three in UTF-8) and half-width kana (SS2).
    answers_equal_utf8("EUC_JP", &["日本語", "日本人", "カタカナ", "ｶﾀｶﾅ", "ascii"]).await;
}

#[tokio::test]
async fn sql_ascii_answers_equal_utf8_for_utf8_text() {
    // SQL_ASCII stores the client's UTF-8 bytes unconverted: they answer as in UTF-8.
    answers_equal_utf8("SQL_ASCII", &["Müller", "Mäller", "日本語", "plain"]).await;
}

/// Every other server encoding with characters of its own: the same cases, each encoding against
/// a UTF-8 database of its own, all at once.
#[tokio::test]
async fn every_other_server_encoding_answers_equal_utf8() {
    const OTHERS: &[(&str, &[&str])] = &[
        ("LATIN2", &["Łódź", "żółw"]),
        ("LATIN5", &["İstanbul", "ğüş"]),
        ("LATIN7", &["Ąžuolas", "ąžuolas"]),
        ("LATIN9", &["€uro", "Œuvre"]),
        ("WIN1250", &["Łódź", "€5"]),
        ("WIN1251", &["Привет", "Привес"]),
        ("WIN1253", &["Αθήνα", "Αθηνά"]),
        ("WIN1255", &["שלום", "שלוש"]),
        ("WIN1256", &["سلام", "سلم"]),
        ("WIN866", &["Привет", "Пока"]),
        ("KOI8R", &["Привет", "Привес"]),
        ("KOI8U", &["Україна", "Їжак"]),
        ("ISO_8859_5", &["Привет", "Пока"]),
        ("ISO_8859_7", &["Αθήνα", "Αθηνά"]),
        ("WIN874", &["สวัสดี", "สวัสดิ์"]),
        ("EUC_KR", &["한국어", "한국인"]),
        ("EUC_CN", &["中文", "中国"]),
        ("EUC_TW", &["臺灣", "台灣"]),
        ("EUC_JIS_2004", &["日本語", "カタカナ"]),
    ];
    let mut all = tokio::task::JoinSet::new();
    for (encoding, words) in OTHERS {
        let words: Vec<&'static str> = words.iter().copied().chain(["plain"]).collect();
        all.spawn(async move { answers_equal_utf8(encoding, &words).await });
    }
    while let Some(done) = all.join_next().await {
        done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    }
}

/// The error of `sql`, which must name `argument` (22021, or 22023 where the install checks a
/// rule before reading the value as UTF-8), never 22000/XX000 (a panic) nor a value.
async fn refused(db: &deadpool_postgres::Client, sql: &str, argument: &str) -> String {
    let got = answer(db, sql).await;
    let named = got.starts_with(&format!("22021: {argument} must")) || got.starts_with(&format!("22023: {argument} must"));
    assert!(named, "{sql}: {got}");
    got
}

/// Bytes that are not UTF-8 in a SQL_ASCII database: every text argument of every API function
/// refuses them naming itself, two different ones never share a fingerprint (both refused), and
/// nothing panics.
#[tokio::test]
async fn sql_ascii_refuses_bytes_that_are_not_utf8() {
    let db = admin_at(&database("idem_enc_sql_ascii_bytes", "SQL_ASCII").await).await;
    let bad = |hex: &str| format!("convert_from('\\x{hex}'::bytea, 'SQL_ASCII')");
    let (e9, e8) = (bad("4de96c6c6572"), bad("4de86c6c6572"));
    for b in [&e9, &e8] {
        let json = format!(r#"('{{"p":"' || {b} || '"}}')"#);
        // The byte offset in the text read: jsonb's text form has a space after the colon.
        let got = refused(&db, &format!("SELECT idem_fingerprint({json}::jsonb)"), "request").await;
        assert!(got.ends_with("at byte 8"), "{got}");
        let got = refused(&db, &format!("SELECT idem_fingerprint({json}::text)"), "request").await;
        assert!(got.ends_with("at byte 7"), "{got}");
    }
    let args = ["'op'", "'u'", "'k'", "'h'"];
    for (n, name) in ["operation", "user_id", "key", "request_hash"].iter().enumerate() {
        let mut a = args.map(String::from);
        a[n] = e9.clone();
        refused(&db, &format!("SELECT (idem_reserve({}, {}, {}, {})).outcome", a[0], a[1], a[2], a[3]), name).await;
        if n < 3 {
            for f in ["idem_release", "idem_heartbeat"] {
                refused(&db, &format!("SELECT {f}({}, {}, {}, 1)::text", a[0], a[1], a[2]), name).await;
            }
            refused(&db, &format!("SELECT idem_complete({}, {}, {}, 1, '{{}}')::text", a[0], a[1], a[2]), name).await;
        }
    }
    refused(&db, &format!("SELECT idem_complete('op', 'u', 'k', 1, '{{}}', {e9})::text"), "status").await;
    // The internal functions too (each install's own answer): a value or a real SQLSTATE,
    // never XX000 (a panic).
    for sql in [
        format!("SELECT _idem_check_scope('op', {e9}, 'k')::text"),
        format!("SELECT _idem_check_request_hash({e9})::text"),
        format!("SELECT _idem_require({e9}, true)::text"),
        format!("SELECT _idem_count({e9}, 1)::text"),
        format!("SELECT _idem_setting({e9})"),
        format!("SELECT (idem_lookup('op', 'u', {e9})).status"),
        format!("SELECT _idem_echo({e9})"),
    ] {
        let got = answer(&db, &sql).await;
        assert!(!got.starts_with("XX000"), "{sql}: {got}");
    }
}

/// A rejected value is quoted in an error message only where the message can carry it: in a
/// database that converts text, a non-ASCII value is shown by its size in UTF-8 bytes, as a
/// value over 32 bytes always is; an ASCII one is quoted as in a UTF-8 database.
#[tokio::test]
async fn a_rejected_value_is_echoed_by_its_size_where_it_is_not_ascii() {
    let (latin1, utf8) = tokio::join!(database("idem_enc_echo_latin1", "LATIN1"), database("idem_enc_echo_utf8", "UTF8"));
    let (latin1, utf8) = (admin_at(&latin1).await, admin_at(&utf8).await);
    let sql = |status: &str| format!("SELECT idem_complete('op', 'u', 'k', 1, NULL, '{status}')::text");
    let message = |shown: &str| format!("22023: status must be 'SUCCESS' or 'FAILED', got {shown}");
    assert_eq!(answer(&utf8, &sql("Müller")).await, message("'Müller'"));
    assert_eq!(answer(&latin1, &sql("Müller")).await, message("a 7-byte value"));
    assert_eq!(answer(&latin1, &sql("done")).await, message("'done'"));
    assert_eq!(answer(&latin1, &sql("done")).await, answer(&utf8, &sql("done")).await);
}

idempotency_testkit::for_each_driver! {
    use super::database;
    use idempotency_client::{Error, Fingerprint, Key, Outcome, Settings, StoredResponse, TxFuture};
    use serde_json::json;

    fn handler(name: &'static str) -> impl for<'t> FnMut(&'t mut Conn) -> TxFuture<'t, StoredResponse, DbError> + Send {
        move |_conn| Box::pin(async move { Ok(StoredResponse::json(201, json!({"name": name}))) })
    }

    /// The client end to end against a LATIN1 database: a key with non-ASCII characters
    /// executes, replays its response, and a request that differs in one accented letter is a
    /// mismatch. (The driver sets client_encoding UTF8; the server converts.)
    #[tokio::test]
    async fn the_client_runs_a_non_ascii_key_in_a_latin1_database() {
        let url = database(&db("idem_enc_client_latin1"), "LATIN1").await;
        let idem = connect_with(&url, 2, Settings::default());
        let key = Key::new("paiement.créer", "utilisateur-é", "clé-1").unwrap();
        let fp = |name: &str| Fingerprint::of_json(&json!({"name": name})).unwrap();
        let first = idem.run(&key, &fp("Müller"), handler("Müller")).await.unwrap();
        let second = idem.run(&key, &fp("Müller"), handler("other")).await.unwrap();
        assert!(matches!(first, Outcome::Executed(_)), "{NAME}: {first:?}");
        assert!(second.is_replayed(), "{NAME}: {second:?}");
        assert_eq!(first.value().body_json(), Some(json!({"name": "Müller"})));
        assert_eq!(second.value().body_json(), first.value().body_json());
        let err = idem.run(&key, &fp("Mäller"), handler("Mäller")).await.unwrap_err();
        assert!(matches!(err, Error::Mismatch), "{NAME}: {err:?}");
    }
}

/// The current version's scripts are ASCII, so they read alike in every encoding: the sources
/// (an install script is their concatenation), the portable install and the update script from
/// the previous release, as scripts/sqlbuild.py writes them. (0.6.0's comments held dashes
/// and a micro sign: `CREATE EXTENSION` failed in EUC_JP.)
#[test]
fn the_current_version_scripts_are_ascii() {
    let root = idempotency_testkit::root();
    let sqlbuild = |args: &[&str]| {
        let out = std::process::Command::new("python3").arg(root.join("scripts/sqlbuild.py")).args(args).current_dir(&root).output().unwrap();
        assert!(out.status.success(), "sqlbuild.py {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    let versions = String::from_utf8(sqlbuild(&["versions"])).unwrap();
    let chain: Vec<&str> = versions.lines().collect();
    let [.., previous, current] = chain[..] else { panic!("no previous release in {chain:?}") };
    let mut scripts = vec![
        (format!("sqlbuild.py upgrade {previous} {current}"), sqlbuild(&["upgrade", previous, current])),
        ("sqlbuild.py portable".to_string(), sqlbuild(&["portable"])),
    ];
    for dir in ["sql", "sql/portable"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "sql") {
                scripts.push((path.display().to_string(), std::fs::read(&path).unwrap()));
            }
        }
    }
    assert!(scripts.len() > 10, "{} scripts", scripts.len());
    for (name, bytes) in scripts {
        if let Some(at) = bytes.iter().position(|b| !b.is_ascii()) {
            let line = bytes[..at].iter().filter(|&&b| b == b'\n').count() + 1;
            panic!("{name}: a byte that is not ASCII on line {line}");
        }
    }
}
