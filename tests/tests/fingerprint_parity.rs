//! The client's fingerprint equals the server's `idem_fingerprint` for generated JSON: nested
//! objects and arrays, duplicate keys, unicode and escapes, and numbers in every spelling.

use idempotency_client::Fingerprint;
use idempotency_testkit::admin;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VALUES: usize = 1500;

fn ws(rng: &mut StdRng) -> &'static str {
    ["", "", " ", "\n", "\t ", "\r\n  "][rng.random_range(0..6)]
}

fn number(rng: &mut StdRng) -> String {
    let sign = if rng.random_bool(0.3) { "-" } else { "" };
    let int = match rng.random_range(0..5) {
        0 => "0".to_string(),
        1 => rng.random_range(1..10).to_string(),
        2 => rng.random_range(1..u64::MAX).to_string(),
        // Beyond f64 and i64: must stay exact on both sides.
        3 => format!("{}{:018}", rng.random_range(1..1000), rng.random_range(0..u64::MAX / 100)),
        _ => rng.random_range(10..100_000).to_string(),
    };
    let frac = match rng.random_range(0..4) {
        0 => String::new(),
        1 => format!(".{}", rng.random_range(0..1000)),
        2 => format!(".{}000", rng.random_range(0..100)), // trailing zeros
        _ => format!(".{:030}", rng.random_range(0..u64::MAX)),
    };
    let exp = match rng.random_range(0..4) {
        0 | 1 => String::new(),
        2 => format!("e{}", rng.random_range(-20..20)),
        _ => format!("E+{}", rng.random_range(0..20)),
    };
    format!("{sign}{int}{frac}{exp}")
}

fn string(rng: &mut StdRng) -> String {
    const PIECES: [&str; 16] = [
        "a", "payment", "é", "ü", "日本", "😀", "\\n", "\\t", "\\\"", "\\\\", "\\/", "\\u00e9", "\\ud83d\\ude00",
        "\\u001f", " ", "\u{7f}",
    ];
    let n = rng.random_range(0..6);
    let body: String = (0..n).map(|_| PIECES[rng.random_range(0..PIECES.len())]).collect();
    format!("\"{body}\"")
}

fn value(rng: &mut StdRng, depth: u32) -> String {
    let kind = if depth >= 4 { rng.random_range(0..5) } else { rng.random_range(0..8) };
    match kind {
        0 => number(rng),
        1 => string(rng),
        2 => ["true", "false", "null"][rng.random_range(0..3)].to_string(),
        3 | 4 => number(rng),
        5 => {
            let items: Vec<String> = (0..rng.random_range(0..5)).map(|_| value(rng, depth + 1)).collect();
            format!("[{}{}{}]", ws(rng), items.join(&format!("{},{}", ws(rng), ws(rng))), ws(rng))
        }
        _ => {
            let mut members = Vec::new();
            for _ in 0..rng.random_range(0..6) {
                // A small key alphabet, so duplicate keys (the last one wins) are common.
                let key = ["\"a\"", "\"b\"", "\"aa\"", "\"é\"", "\"B\"", "\"\\u0061\""][rng.random_range(0..6)];
                members.push(format!("{key}{}:{}{}", ws(rng), ws(rng), value(rng, depth + 1)));
            }
            format!("{{{}{}{}}}", ws(rng), members.join(","), ws(rng))
        }
    }
}

#[tokio::test]
async fn client_and_server_fingerprints_agree_on_generated_json() {
    let db = admin().await;
    let by_jsonb = db.prepare("SELECT idem_fingerprint($1::text::jsonb) AS f").await.unwrap();
    let by_text = db.prepare("SELECT idem_fingerprint($1::text) AS f").await.unwrap();
    let mut rng = StdRng::seed_from_u64(0x1de4_9071);
    let mut distinct = std::collections::HashSet::new();
    for i in 0..VALUES {
        let text = value(&mut rng, 0);
        let client = Fingerprint::of_json_text(&text).unwrap_or_else(|e| panic!("value {i} {text}: {e}"));
        let server: String = db.query_one(&by_jsonb, &[&text]).await.unwrap_or_else(|e| panic!("{text}: {e}")).get("f");
        assert_eq!(client.as_str(), server, "value {i}: {text}");
        let server_text: String = db.query_one(&by_text, &[&text]).await.unwrap().get("f");
        assert_eq!(server_text, server, "value {i}: the text form must equal the jsonb form: {text}");
        distinct.insert(server);
    }
    // The generator is not degenerate: most values differ.
    assert!(distinct.len() > VALUES / 2, "only {} distinct fingerprints", distinct.len());
}

#[tokio::test]
async fn serialised_rust_values_match_the_server() {
    let db = admin().await;
    let values = [
        serde_json::json!({"amount": 100, "currency": "EUR", "items": [{"sku": "a", "qty": 2}]}),
        serde_json::json!({"f": 0.1, "g": 1e20, "h": -0.0, "i": u64::MAX, "j": i64::MIN}),
        serde_json::json!(["😀", "\u{1}", "line\nbreak", null, true]),
    ];
    for v in values {
        let client = Fingerprint::of_json(&v).unwrap();
        // Sent as jsonb by tokio-postgres, exactly as the client sends stored values.
        let server: String = db.query_one("SELECT idem_fingerprint($1::jsonb) AS f", &[&v]).await.unwrap().get("f");
        assert_eq!(client.as_str(), server, "{v}");
    }
}
