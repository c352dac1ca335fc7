//! Fingerprints pinned across versions: each expected value below was computed by the
//! canonicaliser of 0.5.0 (before the canonical form was bounded by its input's length, and
//! before it was rewritten to cost time and memory linear in it) and committed unchanged, so an
//! upgrade keeps the fingerprint of every key in flight. Numbers with large exponents that the
//! bound still allows are among them, one exactly at the bound.

use idempotency_core::fingerprint::{canonical_json, Fingerprint};

/// A JSON text, written out or built (the long ones).
enum Input {
    Text(&'static str),
    /// 30 numbers, `1e300` to `30e271`: 8.6 KB of canonical digits from 202 bytes.
    ManyExponents,
    /// A 3,000-byte string and two numbers of 9,001 and 3,002 digits.
    PaddedExponents,
    /// Every escape, 100 times.
    Escapes,
    /// A 100,000-byte string and a number of 1,500,001 digits.
    LongPadded,
    /// 1,024 nested objects, the deepest allowed.
    DeepObject,
    /// 1,024 nested arrays.
    DeepArray,
}

impl Input {
    fn text(&self) -> String {
        match self {
            Input::Text(t) => (*t).to_owned(),
            Input::ManyExponents => {
                let many: Vec<String> = (0..30).map(|i| format!("{}e{}", i + 1, 300 - i)).collect();
                format!("[{}]", many.join(","))
            }
            Input::PaddedExponents => format!(r#"{{"pad": "{}", "n": 1e9000, "m": -2.5e-3000}}"#, "x".repeat(3000)),
            Input::Escapes => {
                let esc = "\\n\\u00e9\\\"\\\\\\/\\ud83d\\ude00\\u001f".repeat(100);
                format!(r#"{{"s": "{esc}", "k\u0000": [true, false, null, {{}}, []]}}"#)
            }
            Input::LongPadded => format!(r#"{{"pad": "{}", "n": 1e1500000, "m": -3e-5000}}"#, "x".repeat(100_000)),
            Input::DeepObject => "{\"a\":".repeat(1024) + "1" + &"}".repeat(1024),
            Input::DeepArray => "[".repeat(1024) + &"]".repeat(1024),
        }
    }
}

/// (input, length of its canonical form, fingerprint), as 0.5.0 computed them.
const PINNED: &[(Input, usize, &str)] = &[
    (Input::Text(r#"{"amount": 100, "currency": "EUR"}"#), 31, "f50d36c1739463e571da8e929fdeb3bc35c5bf86051c653d6a61deedcb10944e"),
    (Input::Text(r#"{"b": [1, 2.50, -0], "a": null}"#), 24, "09a01684635028fd671d9eab10202524a661cd63f984ba00117ce7ecfd14e7d8"),
    (Input::Text(r#"{"b": 1, "aa": 2, "é": 3, "z": 4, "B": 5, "\u0061": 6, "a": 7}"#), 39, "3f018438be05c399b9e549df9d5037174710fa85296e577321afa06f33bdce53"),
    (Input::Text(r#"{"a": 1, "b": 2, "a": 3}"#), 13, "493df656a590967c84d643bdd55ee956fb53262c51b154115083c9bcc4c992e3"),
    (Input::Text("12345678901234567890.000000000000000001"), 39, "457b592e22e41347dc71b4d2fa8b090e9cf74361324cd5a74cb2f4dd5394e40c"),
    (Input::Text("0.00000000000000000000000000001"), 31, "122956002da91d22c855853e8526f51d5e5f8a8fb758c22ae6526b4b7aa3936d"),
    (Input::Text("-0.0e-5"), 1, "5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9"),
    (Input::Text("123.456e-1"), 7, "4eef8581cc0b6bcddcc4cc07b15cc2c4e6369d223bae56cdc225e89cdac15823"),
    (Input::Text("1e1000"), 1001, "4d20ea8840f0be06124aa54cac837707b5259196832785a09391d1f15fda98f9"),
    (Input::Text("1E400"), 401, "397fc6671f9e77a223078bf9d335b890a1f4cabb25d4aec954f70ef3a84788ee"),
    (Input::Text("1e-400"), 402, "d561a5cedcc14bd7b39b3dd2e38e67337b9877369a5053ab22985cc1b93e86c8"),
    (Input::Text("1e5000"), 5001, "d4e22924ae5b055f946dfeea48d109a17a5aa86b2edbc2340fcdb5361c19ed90"),
    (Input::Text("-1.5e-5000"), 5004, "b17415a5d89693193699030cee474ca874525d3861021ce4f5bca131f36dc0f9"),
    (Input::Text("9.99e999"), 1000, "6aa5668b789a16432c4a6f95a1d6c3ffcc1d1a117e1bf7626790f0fe572ec7ca"),
    (Input::Text("1e8000"), 8001, "b2932768ab39649124dc485ed3b196525d4370c6942416a009bbf8c094d494b6"),
    (Input::Text("-7e-8000"), 8003, "397d288414c26857220fb96bdb2f2fdc6331f3c48abef6fa4d95ef10946859cf"),
    // Exactly at the bound: 16 × 6 + 8192 bytes; and a negative one, its sign counted: 16 × 8 + 8192.
    (Input::Text("1e8287"), 8288, "c0b28d818fcee3cc582d37271377975a790fa90d336ca57e82f05c2c2c17dc2f"),
    (Input::Text("-1e-8317"), 8320, "6d8efaef8cb288cf205dad04a52551c8401a6bb30731253aa3c492dd5d3116d0"),
    (Input::LongPadded, 1605024, "8e46576f1a746df3cb3baea7af8cb91d0504af141f57f2bca968663e84525229"),
    (Input::Text("[1e300, 1e-300, 5e-324, 1.7976931348623157e308]"), 1243, "600b2c439db608cd1cfb13ea0d2c85c30d33d00ec078edcf66e9e553b8f219fb"),
    (Input::ManyExponents, 8647, "62499bcf73be5d7bd42cadf01dcfbffc40a788bf2ed4af0986be054a6daf4498"),
    (Input::PaddedExponents, 15025, "64afa2c1559fbb827854fc74517b620daeb6f268ed8e7de9665b37d6cbae322c"),
    (Input::Escapes, 1942, "2dcfb9bbce44763dd5790ee54ef42f4818ba0c5698c24d7f4d6b692cf5555bf1"),
    (Input::DeepObject, 6145, "9e35e7ae246e162934f2fbf81aad008803006903a1a26da4ec7e3fc869336b5b"),
    (Input::DeepArray, 2048, "c3ef522e5b94c7464f45e3c3e90bdbab0554957a4a76d4db58c61769d875bef5"),
    (Input::Text(r#"{"z": 123456789012345678901234567890e-40, "y": "\u00e9\ud83d\ude00\n\"", "x": [true, false, null, {}, []]}"#), 92, "6e23780755f0034b9e7f36845beeabd43d3d7ff79260d7d24de5e1cac3993a9b"),
];

#[test]
fn fingerprints_of_0_5_0_are_unchanged() {
    for (i, (input, canonical_len, fingerprint)) in PINNED.iter().enumerate() {
        let text = input.text();
        let canonical = canonical_json(&text).unwrap_or_else(|e| panic!("vector {i}: {e}"));
        assert_eq!(canonical.len(), *canonical_len, "vector {i}: canonical length");
        let got = Fingerprint::of_json_text(&text).unwrap_or_else(|e| panic!("vector {i}: {e}"));
        assert_eq!(got.as_str(), *fingerprint, "vector {i}");
    }
}
