//! Hostile input: every SQL function, called directly with random, huge, unicode, control-character
//! and NULL arguments, either succeeds or raises a documented SQLSTATE (22004, 22023, 54000) —
//! never XX000, never a crash, never an error message that echoes an oversized payload. The same
//! inputs through the client are judged exactly as the server judges them.

use idempotency_client::{Fingerprint, Key};
use idempotency_testkit::admin;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::error::SqlState;

const CALLS_PER_FUNCTION: usize = 300;
/// A marker inside every oversized value: an error message containing it echoed the payload.
const MARKER: &str = "ECHO-MARKER";

fn text(rng: &mut StdRng) -> Option<String> {
    Some(match rng.random_range(0..12) {
        0 => return None,
        1 => String::new(),
        2 => format!("{MARKER}{}", "x".repeat(rng.random_range(250..20_000))),
        3 => "é".repeat(rng.random_range(100..200)),
        4 => format!("k{}", char::from_u32(rng.random_range(1..0x20)).unwrap_or('\u{1}')),
        5 => format!("k{}", char::from_u32(rng.random_range(0x7f..0xa0)).unwrap_or('\u{85}')),
        6 => "😀🇫🇷\u{200b}\u{feff}".into(),
        7 => "'; DROP TABLE idem_records; --".into(),
        8 => "\\x00 %s %n {}".into(),
        9 => (0..rng.random_range(1..40)).map(|_| char::from_u32(rng.random_range(0x20..0x3000)).unwrap_or('?')).collect(),
        _ => format!("ok-{}", rng.random_range(0..1000)),
    })
}

fn interval(rng: &mut StdRng) -> Option<&'static str> {
    const VALUES: [Option<&str>; 10] = [
        None, Some("0"), Some("-1 hour"), Some("1 microsecond"), Some("5 minutes"), Some("1 day"),
        Some("1000000 hours"), Some("-10 years"), Some("3 mons"), Some("200000 years"),
    ];
    VALUES[rng.random_range(0..VALUES.len())]
}

fn int(rng: &mut StdRng) -> Option<i32> {
    [None, Some(0), Some(-1), Some(1), Some(3), Some(i32::MAX), Some(i32::MIN), Some(100)][rng.random_range(0..8)]
}

fn bigint(rng: &mut StdRng) -> Option<i64> {
    [None, Some(0), Some(-1), Some(1), Some(i64::MAX), Some(i64::MIN)][rng.random_range(0..6)]
}

fn json_text(rng: &mut StdRng) -> Option<String> {
    Some(match rng.random_range(0..7) {
        0 => return None,
        1 => "{}".into(),
        2 => format!("{{\"{MARKER}\": \"{}\"}}", "y".repeat(rng.random_range(1000..1_200_000))),
        3 => "[".repeat(2000) + &"]".repeat(2000),
        4 => "\"\\u00e9\\ud83d\\ude00\"".into(),
        5 => "12345678901234567890.000000001e-5".into(),
        _ => "{\"status\": 201, \"body\": {\"id\": 7}}".into(),
    })
}

fn word(rng: &mut StdRng, words: &[&'static str]) -> Option<String> {
    match rng.random_range(0..words.len() + 3) {
        0 => None,
        1 => Some(format!("{MARKER}{}", "z".repeat(5000))),
        2 => Some(words[0].to_lowercase()),
        n => Some(words[n - 3].to_string()),
    }
}

/// What an allowed failure looks like; anything else fails the test.
fn check(name: &str, result: Result<(), tokio_postgres::Error>, counts: &mut [usize; 2]) {
    match result {
        Ok(()) => counts[0] += 1,
        Err(e) => {
            let db = e.as_db_error().unwrap_or_else(|| panic!("{name}: not a database error: {e}"));
            let allowed = [SqlState::NULL_VALUE_NOT_ALLOWED, SqlState::INVALID_PARAMETER_VALUE, SqlState::PROGRAM_LIMIT_EXCEEDED];
            assert!(allowed.contains(db.code()), "{name}: undocumented SQLSTATE {:?}: {}", db.code(), db.message());
            assert!(!db.message().contains(MARKER), "{name}: the message echoes the payload: {}", &db.message()[..200.min(db.message().len())]);
            assert!(db.message().len() < 300, "{name}: a {}-byte message", db.message().len());
            counts[1] += 1;
        }
    }
}

#[tokio::test]
async fn every_function_answers_hostile_input_with_a_documented_sqlstate() {
    let db = admin().await;
    let mut rng = StdRng::seed_from_u64(0xbad_1a9);
    let mut counts = [0usize; 2]; // succeeded, refused

    let reserve = db
        .prepare("SELECT (idem_reserve($1, $2, $3, $4, $5::text::interval, $6::text::interval, $7)).outcome")
        .await
        .unwrap();
    let complete = db.prepare("SELECT idem_complete($1, $2, $3, $4, $5::text::jsonb, $6)").await.unwrap();
    let release = db.prepare("SELECT idem_release($1, $2, $3, $4, $5)").await.unwrap();
    let heartbeat = db.prepare("SELECT idem_heartbeat($1, $2, $3, $4, $5::text::interval)").await.unwrap();
    let lookup = db.prepare("SELECT count(*) FROM idem_lookup($1, $2, $3)").await.unwrap();
    let recover = db.prepare("SELECT idem_recover_stuck($1, $2, $3)").await.unwrap();
    let sweep = db.prepare("SELECT idem_sweep($1)").await.unwrap();
    let fp_text = db.prepare("SELECT idem_fingerprint($1::text)").await.unwrap();
    let fp_jsonb = db.prepare("SELECT idem_fingerprint($1::text::jsonb)").await.unwrap();
    let fp_bytea = db.prepare("SELECT idem_fingerprint($1::bytea)").await.unwrap();

    for _ in 0..CALLS_PER_FUNCTION {
        let (op, user, key) = (text(&mut rng), text(&mut rng), text(&mut rng));
        let wait: Option<bool> = [None, Some(false)][rng.random_range(0..2)];
        let r = db
            .query_one(&reserve, &[&op, &user, &key, &text(&mut rng), &interval(&mut rng), &interval(&mut rng), &wait])
            .await;
        check("idem_reserve", r.map(drop), &mut counts);
        let status = word(&mut rng, &["SUCCESS", "FAILED"]);
        let r = db.query_one(&complete, &[&op, &user, &key, &bigint(&mut rng), &json_text(&mut rng), &status]).await;
        check("idem_complete", r.map(drop), &mut counts);
        let r = db.query_one(&release, &[&op, &user, &key, &bigint(&mut rng), &int(&mut rng)]).await;
        check("idem_release", r.map(drop), &mut counts);
        let r = db.query_one(&heartbeat, &[&op, &user, &key, &bigint(&mut rng), &interval(&mut rng)]).await;
        check("idem_heartbeat", r.map(drop), &mut counts);
        let r = db.query_one(&lookup, &[&op, &user, &key]).await;
        check("idem_lookup", r.map(drop), &mut counts);
        let action = word(&mut rng, &["fail", "release"]);
        let r = db.query_one(&recover, &[&int(&mut rng), &action, &int(&mut rng)]).await;
        check("idem_recover_stuck", r.map(drop), &mut counts);
        let r = db.query_one(&sweep, &[&int(&mut rng)]).await;
        check("idem_sweep", r.map(drop), &mut counts);
        let doc = json_text(&mut rng);
        check("idem_fingerprint(text)", db.query_one(&fp_text, &[&doc]).await.map(drop), &mut counts);
        check("idem_fingerprint(text)", db.query_one(&fp_text, &[&op]).await.map(drop), &mut counts);
        check("idem_fingerprint(jsonb)", db.query_one(&fp_jsonb, &[&doc]).await.map(drop), &mut counts);
        let bytes: Option<Vec<u8>> = op.as_ref().map(|s| s.as_bytes().to_vec());
        check("idem_fingerprint(bytea)", db.query_one(&fp_bytea, &[&bytes]).await.map(drop), &mut counts);
    }
    // The generator reached both sides of the rules.
    assert!(counts[0] > 500 && counts[1] > 500, "succeeded {}, refused {}", counts[0], counts[1]);
}

#[tokio::test]
async fn the_client_judges_keys_and_fingerprints_exactly_as_the_server() {
    // The same generators as above: the client refuses exactly the scopes the server refuses
    // (without a round trip: `Key::new` is local), and fingerprints what the server fingerprints.
    let db = admin().await;
    let lookup = db.prepare("SELECT count(*) FROM idem_lookup($1, $2, $3)").await.unwrap();
    let fp_text = db.prepare("SELECT idem_fingerprint($1::text) AS f").await.unwrap();
    let mut rng = StdRng::seed_from_u64(0xc11e);
    let (mut keys, mut prints) = ([0usize; 2], [0usize; 2]); // [accepted, refused] on both sides
    for _ in 0..CALLS_PER_FUNCTION {
        let (op, user, key) = (text(&mut rng), text(&mut rng), text(&mut rng));
        let server = db.query_one(&lookup, &[&op, &user, &key]).await;
        if let (Some(op), Some(user), Some(key)) = (&op, &user, &key) {
            let client = Key::new(op.as_str(), user.as_str(), key.as_str());
            assert_eq!(client.is_ok(), server.is_ok(), "{op:?} {user:?} {key:?}: client {client:?}, server {server:?}");
            keys[usize::from(client.is_err())] += 1;
        }
        let Some(doc) = json_text(&mut rng) else { continue };
        let server = db.query_one(&fp_text, &[&doc]).await.map(|r| r.get::<_, String>("f"));
        match Fingerprint::of_json_text(&doc) {
            Ok(fp) => {
                assert_eq!(Ok(fp.as_str()), server.as_deref().map_err(|e| e.to_string()).as_deref(), "{}", &doc[..doc.len().min(80)]);
                prints[0] += 1;
            }
            // Nesting deeper than the canonicaliser allows (the 2000-deep array): a clean error
            // on both sides, never a stack overflow.
            Err(e) => {
                assert!(server.is_err(), "the client refused ({e}) what the server took: {}", &doc[..doc.len().min(80)]);
                prints[1] += 1;
            }
        }
    }
    // The generator reached both sides of the rules.
    assert!(keys[0] > 20 && keys[1] > 20, "keys accepted {}, refused {}", keys[0], keys[1]);
    assert!(prints[0] > 50 && prints[1] > 5, "fingerprints equal {}, refused {}", prints[0], prints[1]);
    // A valid key goes through.
    assert!(Key::new("hostile.ok", "u", "k").is_ok());
}
