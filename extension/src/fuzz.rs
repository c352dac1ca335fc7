//! Test support (pg_test only): every SQL-callable function of this library called with
//! generated values of each argument type, to prove that none panics on any input (issue 40,
//! "panics never reach an answer"). A panic becomes an ERROR with SQLSTATE XX000 (pgrx's guard);
//! every call must instead return, or raise an ERROR with a real SQLSTATE and no backtrace in
//! its detail. Each call runs in a subtransaction of its own ([`error_of`]), so one refusal
//! leaves the next call a clean transaction. The values come from a seeded generator (the
//! same cases on every run): text (empty, long, control characters, every Unicode plane,
//! JSON-like and format-like words, the words the functions know), jsonb (deep, wide, exact
//! numbers, escapes), bytea, interval (zero, negative, month and day mixes, PostgreSQL's
//! extremes, `infinity` from 17), bigint, integer and boolean, each NULL too.

use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;

/// An ERROR caught by [`error_of`].
#[derive(Debug)]
pub(crate) struct Caught {
    pub(crate) code: PgSqlErrorCode,
    pub(crate) message: String,
    pub(crate) detail: Option<String>,
}

/// Runs `sql` in a subtransaction: its ERROR, or `None` when it succeeded (the subtransaction
/// then kept). The pattern of PostgreSQL's procedural languages (BeginInternalSubTransaction,
/// rolled back on error, memory context and resource owner restored).
pub(crate) fn error_of(sql: &str) -> Option<Caught> {
    // SAFETY: called inside a transaction (a pg_test's); the subtransaction is ended below on
    // both paths, and the caller's memory context and resource owner are restored.
    let (context, owner) = unsafe {
        let saved = (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner);
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(saved.0);
        saved
    };
    let caught = PgTryBuilder::new(|| {
        Spi::run(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        None
    })
    .catch_others(|e| {
        let report = match e {
            CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) | CaughtError::RustPanic { ereport: r, .. } => r,
        };
        Some(Caught { code: report.sql_error_code(), message: report.message().to_owned(), detail: report.detail().map(str::to_owned) })
    })
    .execute();
    // SAFETY: ends the subtransaction begun above, then restores what it changed.
    unsafe {
        if caught.is_some() {
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        } else {
            pg_sys::ReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
    }
    caught
}

/// A seeded generator (splitmix64): the same cases on every run, no dependency.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// The SQL argument types of the functions.
#[derive(Clone, Copy)]
pub(crate) enum Ty {
    Text,
    Jsonb,
    Bytea,
    Interval,
    Bigint,
    Int,
    Bool,
}

/// A SQL string literal of `s`.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn text(rng: &mut Rng) -> String {
    let word = match rng.below(12) {
        0 => String::new(),
        1 => (0..1 + rng.below(20)).map(|_| char::from(b'a' + rng.below(26) as u8)).collect(),
        2 => "x".repeat(250 + rng.below(10)),
        3 => "\u{e9}".repeat(125 + rng.below(6)),
        4 => format!("k{}z", char::from_u32(1 + rng.below(0x1f) as u32).unwrap_or('\u{1}')),
        5 => format!("ab{}", char::from_u32(0x7f + rng.below(0x23) as u32).unwrap_or('\u{85}')),
        6 => rng.pick(&["\u{1f600}", "\u{ffff}", "\u{10ffff}", "e\u{301}", "\u{200b}\u{a0}", "\u{3042}\u{30ab}", "\u{fffd}"]).into(),
        7 => rng
            .pick(&["{\"a\":1}", "[1,2", "1e999999", "-0", "\"\\ud800\"", "null", " ", "{\"a\":{\"a\":", "1.0e-400", "\"\\u0000\""])
            .into(),
        8 => rng.pick(&["[", "{\"a\":"]).repeat(1 + rng.below(1100)),
        9 => rng
            .pick(&[
                "SUCCESS", "FAILED", "PROCESSING", "swept", "reservations_created", "idempotency.ttl", "idempotency.lease",
                "idempotency.max_retries", "idempotency.nope", "search_path", "operation", "",
            ])
            .into(),
        10 => "y".repeat(100_000 + rng.below(10)),
        _ => rng.pick(&["o'clock\\", "%s %d %n %%", "\\x00", "$1", "E'\\n'", "--", "\u{7f}\u{9f}\u{a0}"]).into(),
    };
    literal(&word)
}

fn jsonb(rng: &mut Rng) -> String {
    match rng.below(9) {
        0 => literal(rng.pick(&["{}", "[]", "null", "true", "0", "-0", "\"\""])),
        1 => literal(rng.pick(&["12345678901234567890123456789.123", "1e1000", "-1e-1000", "1.000", "0.1e2"])),
        2 => {
            let depth = 1000 + rng.below(50);
            literal(&format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth)))
        }
        3 => {
            let depth = 1 + rng.below(1000);
            literal(&format!("{}1{}", "[".repeat(depth), "]".repeat(depth)))
        }
        4 => format!("(SELECT jsonb_object_agg('k' || i, i) FROM generate_series(1, {}) AS i)", 1 + rng.below(3000)),
        5 => literal(rng.pick(&["\"\\u00e9\\n\\t\\\"\"", "{\"b\":1,\"a\":2,\"a\":3}", "\"\u{1f600}\"", "{\"\":{\"\":[]}}"])),
        6 => format!("to_jsonb(repeat('z', {}))", rng.below(200_000)),
        7 => literal(&format!("{{\"n\":{}}}", rng.next() as i64)),
        _ => "NULL".into(),
    }
}

fn interval(rng: &mut Rng, infinity: bool) -> String {
    let mut choices = vec![
        "0", "1 second", "-1 second", "1 microsecond", "5 minutes", "1 day", "1 mon -30 days", "1 year -360 days",
        "1000 years", "1000 years 1 microsecond", "999 years 11 mons 30 days", "178000000 years", "-178000000 years",
        "2147483647 days", "-2147483648 days", "2147483647 mons", "-2147483647 mons",
        "2562047788 hours", "-2562047788 hours",
    ];
    if infinity {
        choices.extend(["infinity", "-infinity"]);
    }
    match rng.below(10) {
        0 => "NULL".into(),
        1 => literal(&format!("{} seconds", rng.next() as i32)),
        _ => literal(rng.pick(&choices)),
    }
}

/// A value of type `ty` as a SQL expression, cast to the type.
pub(crate) fn value(rng: &mut Rng, ty: Ty, infinity: bool) -> String {
    let (expr, cast) = match ty {
        Ty::Text if rng.below(10) == 0 => ("NULL".into(), "text"),
        Ty::Text => (text(rng), "text"),
        Ty::Jsonb => (jsonb(rng), "jsonb"),
        Ty::Bytea => (
            match rng.below(5) {
                0 => "NULL".into(),
                1 => "''".into(),
                2 => format!("decode(repeat('ab', {}), 'hex')", rng.below(100_000)),
                _ => format!("'\\x{:016x}'", rng.next()),
            },
            "bytea",
        ),
        Ty::Interval => (interval(rng, infinity), "interval"),
        Ty::Bigint => (
            match rng.below(8) {
                0 => "NULL".into(),
                1 => i64::MIN.to_string(),
                2 => i64::MAX.to_string(),
                3 => rng.pick(&["0", "1", "-1"]).into(),
                _ => (rng.next() as i64).to_string(),
            },
            "bigint",
        ),
        Ty::Int => (
            match rng.below(8) {
                0 => "NULL".into(),
                1 => i32::MIN.to_string(),
                2 => i32::MAX.to_string(),
                3 => rng.pick(&["0", "1", "-1", "2"]).into(),
                _ => (rng.next() as i32).to_string(),
            },
            "integer",
        ),
        Ty::Bool => (rng.pick(&["NULL", "true", "false"]).into(), "boolean"),
    };
    format!("({expr})::{cast}")
}

/// Every SQL-callable function of this library (its SQL name, the statement around the call,
/// its argument types): the native functions of sql/native.sql and sql/helpers.sql, and the
/// internal ones the PL/pgSQL functions call.
pub(crate) const FUNCTIONS: &[(&str, &str, &[Ty])] = {
    use Ty::*;
    &[
        ("idem_fingerprint", "SELECT {}", &[Jsonb]),
        ("idem_fingerprint", "SELECT {}", &[Text]),
        ("idem_fingerprint", "SELECT {}", &[Bytea]),
        ("idem_reserve", "SELECT {}::text", &[Text, Text, Text, Text, Interval, Interval, Bool]),
        ("idem_complete", "SELECT {}", &[Text, Text, Text, Bigint, Jsonb, Text]),
        ("idem_release", "SELECT {}", &[Text, Text, Text, Bigint, Int]),
        ("idem_heartbeat", "SELECT {}", &[Text, Text, Text, Bigint, Interval]),
        ("_idem_write_pending", "SELECT {}::text", &[Text, Text, Text]),
        ("_idem_check_scope", "SELECT {}", &[Text, Text, Text]),
        ("_idem_check_request_hash", "SELECT {}", &[Text]),
        ("_idem_require", "SELECT {}", &[Text, Bool]),
        ("_idem_check_step", "SELECT {}", &[Int]),
        ("_idem_ttl", "SELECT {}", &[Interval]),
        ("_idem_lease", "SELECT {}", &[Interval, Interval]),
        ("_idem_max_retries", "SELECT {}", &[Int]),
        ("_idem_setting", "SELECT {}", &[Text]),
        ("_idem_max_response_bytes", "SELECT {}", &[]),
        ("_idem_count", "SELECT {}", &[Text, Bigint]),
        ("idem_metrics", "SELECT count(*) FROM {}", &[]),
    ]
};

/// The statement calling `name` with `args`, as `template` wraps it.
pub(crate) fn call(template: &str, name: &str, args: &[String]) -> String {
    template.replace("{}", &format!("{name}({})", args.join(", ")))
}
