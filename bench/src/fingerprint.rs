//! The fingerprint rows: the canonical fingerprint (`Fingerprint::of_json_text`, what the
//! extension's `idem_fingerprint`, the client's `Fingerprint::of_json` and the layer compute) of
//! adversarial JSON bodies against ordinary bodies of the same size, in µs per KiB.
//!
//! For each size (1 KiB, 64 KiB, 1 MiB) the ordinary body and every adversarial one are timed
//! interleaved, in one order and then the reverse, each call on its own; a row's tps are KiB
//! fingerprinted per second, so its ratio is ordinary µs per KiB / adversarial µs per KiB and the
//! goal "at most 4× the cost" is a ratio of at least 0.25. No database: CPU only.
//!
//! The adversarial bodies:
//! - big exponents: one number whose exponent takes the canonical form to its bound (16 bytes
//!   per byte of the body plus 8 KiB), beside a string that fills the body;
//! - many exponents: `[1e75,1e75,...]`, each number 76 digits from 5 bytes (the bound allows
//!   any number of them);
//! - deep nesting: objects nested to the 1,024-level limit (as deep as the size allows), each
//!   level with a member of its own before the next level (the shape that cost 0.5.0 a copy of
//!   the rest at every level);
//! - escapes: one string of `\u00e9`, `\n`, `\"`, `\\` and surrogate pairs;
//! - shared-prefix keys: one object whose keys share a 64-byte prefix, in reverse order (the
//!   most expensive sort).

use crate::pgbench::Measure;
use crate::Row;
use idempotency_client::Fingerprint;
use std::time::{Duration, Instant};

const SIZES: [(usize, &str); 3] = [(1 << 10, "1 KiB"), (64 << 10, "64 KiB"), (1 << 20, "1 MiB")];

/// A kind of adversarial body: its name and how to make one of a size.
type Kind = (&'static str, fn(usize) -> String);
const MAX_DEPTH: usize = 1024;

/// An ordinary request: an array of small objects (ids, names, amounts, a nested list, flags).
fn ordinary(size: usize) -> String {
    let mut s = String::from("[");
    let mut i = 0u64;
    loop {
        let item = format!(
            r#"{{"id": {i}, "customer": "customer-{i}", "amount": {}.{:02}, "currency": "EUR", "tags": ["a", "b"], "paid": true, "note": null}}"#,
            i * 37 % 10_000,
            i % 100
        );
        if s.len() + item.len() + 2 > size {
            break;
        }
        if i > 0 {
            s.push(',');
        }
        s.push_str(&item);
        i += 1;
    }
    pad_to(s + "]", size)
}

/// Pads a JSON text to `size` bytes with trailing whitespace (insignificant, linear to skip).
fn pad_to(mut s: String, size: usize) -> String {
    while s.len() < size {
        s.push(' ');
    }
    s
}

/// A string filling the body, then one number at the canonical bound.
fn big_exponent(size: usize) -> String {
    let text = |pad: usize, e: usize| format!("[\"{}\",1e{e}]", "x".repeat(pad));
    // The bound is 16 × len + 8192 and the number writes e + 1 digits for its 2 + digits(e)
    // bytes: start near the bound and step down to the largest e that is allowed.
    let pad = size.saturating_sub(16);
    let len = text(pad, 0).len() + 6;
    let mut e = 16 * len + 8192 - (len - 8);
    let mut t = text(pad, e);
    while idempotency_client::canonical_json(&t).is_err() {
        e -= 1;
        t = text(pad, e);
    }
    pad_to(t, size)
}

fn many_exponents(size: usize) -> String {
    let n = (size - 2) / 5;
    pad_to(format!("[{}]", vec!["1e75"; n.max(1)].join(",")), size)
}

fn deep(size: usize) -> String {
    // Each level: {"k":"<filler>","a": ... }: 16 bytes of syntax plus the filler.
    let levels = (size / 24).clamp(1, MAX_DEPTH);
    let filler = (size / levels).saturating_sub(16).max(1);
    let mut s = String::with_capacity(size);
    for _ in 0..levels {
        s.push_str("{\"k\":\"");
        s.push_str(&"y".repeat(filler));
        s.push_str("\",\"a\":");
    }
    s.push('1');
    s.push_str(&"}".repeat(levels));
    pad_to(s, size)
}

fn escapes(size: usize) -> String {
    let unit = r#"\u00e9\n\"\\\ud83d\ude00\t"#;
    let n = (size - 2) / unit.len();
    pad_to(format!("\"{}\"", unit.repeat(n.max(1))), size)
}

fn shared_prefix_keys(size: usize) -> String {
    let prefix = "p".repeat(64);
    let mut members = Vec::new();
    let mut len = 2;
    let mut i = 0usize;
    while len + 80 < size {
        let member = format!("\"{prefix}{i:08}\":{i}");
        len += member.len() + 1;
        members.push(member);
        i += 1;
    }
    members.reverse();
    pad_to(format!("{{{}}}", members.join(",")), size)
}

/// Fingerprints `body` for about `budget`, each call timed; the KiB per second and the calls'
/// p50 and p99 in ms.
fn time(body: &str, budget: Duration) -> Measure {
    let mut calls = Vec::new();
    let started = Instant::now();
    while started.elapsed() < budget || calls.len() < 3 {
        let t = Instant::now();
        let f = Fingerprint::of_json_text(std::hint::black_box(body)).expect("within the bound");
        calls.push(t.elapsed());
        std::hint::black_box(f);
    }
    let total: Duration = calls.iter().sum();
    calls.sort();
    let at = |q: f64| calls[((calls.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    Measure {
        tps: calls.len() as f64 * (body.len() as f64 / 1024.0) / total.as_secs_f64(),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        transactions: calls.len() as u64,
        ..Measure::default()
    }
}

/// The rows: per size, every adversarial body against the ordinary body of that size.
pub(crate) fn rows(smoke: bool, reps: usize) -> Vec<Row> {
    let budget = Duration::from_millis(if smoke { 20 } else { 1000 });
    let kinds: [Kind; 5] = [
        ("big exponent at the bound", big_exponent),
        ("many exponents (1e75)", many_exponents),
        ("deep nesting", deep),
        ("escapes", escapes),
        ("shared-prefix keys", shared_prefix_keys),
    ];
    let mut rows = Vec::new();
    for (size, label) in SIZES {
        let base = ordinary(size);
        let bodies: Vec<(&str, String)> = kinds.iter().map(|(name, make)| (*name, make(size))).collect();
        for (name, body) in &bodies {
            assert_eq!(body.len(), size, "{name} at {label}: the bodies must be of one size");
        }
        // Interleaved: ordinary, each adversarial body, then the reverse, `reps` times.
        let mut ordinary_runs = Vec::new();
        let mut runs: Vec<Vec<Measure>> = vec![Vec::new(); bodies.len()];
        for rep in 0..reps.max(1) * 2 {
            let mut order: Vec<Option<usize>> = std::iter::once(None).chain((0..bodies.len()).map(Some)).collect();
            if rep % 2 == 1 {
                order.reverse();
            }
            for which in order {
                match which {
                    None => ordinary_runs.push(time(&base, budget)),
                    Some(i) => runs[i].push(time(&bodies[i].1, budget)),
                }
            }
        }
        let ordinary = Measure::mean(&ordinary_runs);
        for ((name, _), runs) in bodies.iter().zip(runs) {
            let ours = Measure::mean(&runs);
            let (us_ours, us_base) = (1e6 / ours.tps, 1e6 / ordinary.tps);
            rows.push(Row {
                figure: format!("fingerprint of an adversarial body ({name}) vs an ordinary body"),
                clients: label.to_owned(),
                baseline: "an array of small objects of the same size".into(),
                base: ordinary.clone(),
                ours,
                goal: Some(0.25),
                work: Some(format!("{us_ours:.2} / {us_base:.2} µs per KiB: {:.2}× the ordinary body's cost (goal ≤ 4×)", us_ours / us_base)),
            });
        }
    }
    rows
}
