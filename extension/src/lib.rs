//! The `idempotency` PostgreSQL extension.
//!
//! The schema and the PL/pgSQL state machine are in `sql/` (the portable implementation); this
//! crate holds the native hot path that replaces `idem_reserve`, `idem_complete`,
//! `idem_release` and `idem_heartbeat` ([`native`], declared in `sql/native.sql`), the GUCs,
//! the argument rules (shared with the client crate), request fingerprinting, and, when the
//! library is preloaded, the shared-memory counters and the maintenance worker. Every Rust
//! function here is declared by hand in `sql/`, so the install script is exactly the reviewed
//! SQL, qualified with `@extschema@` throughout. Every text argument is read as UTF-8 whatever
//! the database's encoding (`encoding`), no SQL-callable function panics on any input (the
//! pg_test `no_function_panics_on_any_input`, over `fuzz`), and no error's detail carries a
//! Rust backtrace (`backtrace`).

use pgrx::prelude::*;

mod args;
mod backtrace;
mod encoding;
mod fingerprint;
#[cfg(any(test, feature = "pg_test"))]
mod fuzz;
mod guc;
mod metrics;
mod native;
mod record;
mod vacuum;
mod worker;

pgrx::pg_module_magic!();

pgrx::extension_sql_file!("../../sql/schema.sql", name = "schema", bootstrap);
pgrx::extension_sql_file!("../../sql/internal.sql", name = "internal", requires = ["schema"]);
pgrx::extension_sql_file!("../../sql/reserve.sql", name = "reserve", requires = ["internal"]);
pgrx::extension_sql_file!("../../sql/finish.sql", name = "finish", requires = ["reserve"]);
pgrx::extension_sql_file!("../../sql/maintenance.sql", name = "maintenance", requires = ["finish"]);
pgrx::extension_sql_file!("../../sql/helpers.sql", name = "helpers", requires = ["maintenance"]);
pgrx::extension_sql_file!("../../sql/operations.sql", name = "operations", requires = ["helpers"]);
// The native hot path replaces the PL/pgSQL idem_reserve/complete/release/heartbeat (the
// portable install leaves this file out).
pgrx::extension_sql_file!("../../sql/native.sql", name = "native", requires = ["operations"]);
// idem_await, the bounded wait for a key's holder: PL/pgSQL over idem_reserve, both installs.
pgrx::extension_sql_file!("../../sql/wait.sql", name = "wait", requires = ["native"]);
// idem_replay, the read-only first step of idem_reserve (native; sql/portable/replay.sql).
pgrx::extension_sql_file!("../../sql/replay.sql", name = "replay", requires = ["wait"]);
pgrx::extension_sql_file!("../../sql/privileges.sql", name = "privileges", finalize);

/// Called by PostgreSQL when it loads the library: registers the settings.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    backtrace::off();
    guc::register();
    native::catalog::register_invalidation();
    native::pending::register();
    // Shared memory and background workers can only be set up while the server starts.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        metrics::init();
        worker::register();
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::pg_sys::errcodes::PgSqlErrorCode;
    use pgrx::prelude::*;

    fn one<T: IntoDatum + FromDatum + std::fmt::Debug>(sql: &str) -> T {
        match Spi::get_one::<T>(sql) {
            Ok(Some(v)) => v,
            other => panic!("{sql}: {other:?}"),
        }
    }

    #[pg_test]
    fn jsonb_fingerprint_uses_the_client_canonical_form() {
        let sql = r#"SELECT idem_fingerprint('{"b": [1.0, 2e1], "a": "x"}'::jsonb)"#;
        let want = idempotency_core::Fingerprint::of_json_text(r#"{"a":"x","b":[1,20]}"#).unwrap();
        assert_eq!(one::<String>(sql), want.as_str());
    }

    #[pg_test]
    fn jsonb_fingerprint_keeps_numbers_exact() {
        // Beyond f64: a lossy parse would make these two equal.
        let a: String = one("SELECT idem_fingerprint('12345678901234567890123456789.1'::jsonb)");
        let b: String = one("SELECT idem_fingerprint('12345678901234567890123456789.2'::jsonb)");
        assert_ne!(a, b);
        let c: String = one("SELECT idem_fingerprint('123456789012345678901234567891e-1'::jsonb)");
        assert_eq!(a, c);
    }

    #[pg_test]
    fn bytea_fingerprint_is_sha256() {
        let got: String = one("SELECT idem_fingerprint('abc'::bytea)");
        assert_eq!(got, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[pg_test]
    fn gucs_are_registered_with_their_defaults() {
        for (name, want) in [
            ("idempotency.ttl", "1d"),
            ("idempotency.lease", "5min"),
            ("idempotency.max_retries", "3"),
            ("idempotency.max_response_bytes", "1MB"),
            ("idempotency.max_response_bytes_limit", "64MB"),
            ("idempotency.ttl_limit", "0"),
            ("idempotency.lease_limit", "0"),
        ] {
            let got: String = one(&format!("SELECT current_setting('{name}')"));
            assert_eq!(got, want, "{name}");
        }
    }

    #[pg_test(error = "0 is outside the valid range for parameter \"idempotency.max_retries\" (1 .. 2147483647)")]
    fn guc_bounds_are_enforced() {
        Spi::run("SET idempotency.max_retries = 0").unwrap();
    }

    #[pg_test]
    fn maintenance_gucs_are_registered_with_their_defaults() {
        for (name, want) in [
            ("idempotency.maintenance_databases", ""),
            ("idempotency.maintenance_interval", "1min"),
            ("idempotency.maintenance_batch_size", "10000"),
            ("idempotency.recover_action", "fail"),
        ] {
            let got: String = one(&format!("SELECT current_setting('{name}')"));
            assert_eq!(got, want, "{name}");
        }
    }

    // The test server does not preload the library: counting is a no-op, metrics refuse.
    #[pg_test]
    fn counting_without_preloading_is_a_no_op() {
        let got = Spi::get_one::<bool>("SELECT _idem_count('swept', 5)");
        assert_eq!(got, Ok(Some(false)));
    }

    #[pg_test(error = "event must be one of reservations_created, reservations_replay, reservations_in_progress, reservations_mismatch, reservations_failed, reservations_resume, completions_success, completions_failed, releases, poisonings, stale_tokens, recovered, swept, worker_passes, got \"nope\"")]
    fn counting_an_unknown_event_is_an_error() {
        Spi::run("SELECT _idem_count('nope', 1)").unwrap();
    }

    #[pg_test(error = "idem_metrics() needs the idempotency library preloaded: its counters live in shared memory reserved at server start")]
    fn metrics_without_preloading_raise() {
        Spi::run("SELECT * FROM idem_metrics()").unwrap();
    }

    /// The maintenance worker's VACUUM rule (vacuum.rs): after a VACUUM that left dead rows, no
    /// other VACUUM while the xmin horizon stays where it ran, however many rows are counted;
    /// one as soon as the horizon moves; the threshold as before.
    #[pg_test]
    fn vacuum_waits_for_the_horizon_after_leaving_rows() {
        use crate::vacuum::due;
        use crate::worker::handshake::Vacuumed;
        let left = Some(Vacuumed { horizon: 1000, left: 5000 });
        assert!(due(6000, 100.0, None, Some(1000)), "no VACUUM before: due");
        assert!(!due(6000, 100.0, left, Some(1000)), "the horizon has not moved: not due");
        assert!(!due(60_000, 100.0, left, Some(1000)), "more dead rows, same horizon: not due");
        assert!(due(6000, 100.0, left, Some(1001)), "the horizon moved: due");
        assert!(due(6000, 100.0, left, None), "horizon unknown: due");
        assert!(!due(50, 100.0, None, Some(1000)), "below the threshold: not due");
        assert!(!due(0, 0.0, None, None), "nothing dead: not due");
    }

    /// A deliberate panic, for [`a_panic_carries_no_backtrace_in_its_detail`] only.
    #[pg_extern]
    fn deliberate_panic() -> bool {
        panic!("a deliberate panic")
    }

    /// A panic reaches the client as an ERROR with its message and no backtrace in its detail,
    /// even where the server's environment asks for backtraces: the variable is set here, in
    /// this backend, before its first panic (std reads it at the first capture, which
    /// `backtrace::off` already made in _PG_init; without it, dozens of frames).
    #[pg_test]
    fn a_panic_carries_no_backtrace_in_its_detail() {
        std::env::set_var("RUST_BACKTRACE", "1");
        let caught = crate::fuzz::error_of("SELECT tests.deliberate_panic()").expect("a panic is an ERROR");
        assert_eq!(caught.code, PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "{caught:?}");
        assert_eq!(caught.message, "a deliberate panic");
        assert_eq!(caught.detail, None, "no backtrace");
    }

    /// Issue 40, "panics never reach an answer": every SQL-callable function of the library,
    /// called with generated values of each of its argument types (crate::fuzz), returns or
    /// raises an ERROR with a real SQLSTATE: never XX000 (what a panic becomes), never a
    /// backtrace in the detail.
    #[pg_test]
    fn no_function_panics_on_any_input() {
        use crate::fuzz::{call, error_of, value, Rng, FUNCTIONS};
        const CASES: usize = 150;
        let infinity = one::<i32>("SELECT current_setting('server_version_num')::int") >= 170_000;
        let mut rng = Rng::new(40);
        let (mut calls, mut refused) = (0, 0);
        for (name, template, types) in FUNCTIONS {
            for _ in 0..CASES {
                let args: Vec<String> = types.iter().map(|&ty| value(&mut rng, ty, infinity)).collect();
                let sql = call(template, name, &args);
                calls += 1;
                let Some(e) = error_of(&sql) else { continue };
                refused += 1;
                let shown: String = sql.chars().take(300).collect();
                assert_ne!(e.code, PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "{shown}: {e:?}");
                assert!(e.detail.as_deref().is_none_or(|d| !d.contains("panicking") && !d.contains("rust_begin_unwind")), "{shown}: {e:?}");
            }
        }
        assert!(refused > calls / 10 && refused < calls, "{refused} of {calls} calls refused: the values reach both paths");
    }

    #[cfg(not(feature = "pg14"))]
    #[pg_test(error = "invalid configuration parameter name \"idempotency.no_such_setting\"")]
    fn guc_prefix_is_reserved() {
        Spi::run("SET idempotency.no_such_setting = 1").unwrap();
    }

    /// 14 cannot reserve a prefix: a misspelt name becomes a placeholder (documented difference).
    #[cfg(feature = "pg14")]
    #[pg_test]
    fn guc_prefix_is_not_reserved_on_14() {
        Spi::run("SET idempotency.no_such_setting = 1").unwrap();
        let got: String = one("SELECT current_setting('idempotency.no_such_setting')");
        assert_eq!(got, "1");
    }
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    /// Runs once before the tests; nothing to prepare.
    pub fn setup(_options: Vec<&str>) {}

    /// Extra `postgresql.conf` lines for the test server: none.
    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
