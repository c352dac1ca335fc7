//! The sqlx pool a handle makes from a URL (`Idempotency::<Sqlx>::from_url`): one host, its
//! TLS options read as the tokio-postgres pool reads them, its waits bounded and its
//! `statement_timeout` set by the [`Settings`] where the URL does not name them. sqlx reads
//! neither `connect_timeout` nor the keepalives: the first is taken out of the URL and read
//! here, the others are refused (sqlx opens its sockets with no keepalive option).
//!
//! sqlx sends no cancel request (it keeps no cancel key one could use), so a dropped guard can
//! only close its connection (tx.rs), and a server that runs a statement reads nothing from the
//! client until it ends: a statement waiting on a lock would wait on, holding its transaction,
//! its reservation and its key's lock. Each connection of this pool therefore sets
//! `client_connection_check_interval` ([`CHECK_STATEMENT`], where the URL's `options` do not
//! name it): the server looks at the socket that often while a statement runs, and ends a
//! backend whose client has gone, over TLS as in plain text.

use crate::error::Error;
use crate::settings::Settings;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::str::FromStr;
use std::time::Duration;

/// The keepalive options of libpq, which sqlx cannot honour.
const KEEPALIVES: [&str; 4] = ["keepalives", "keepalives_idle", "keepalives_interval", "keepalives_retries"];

/// How often the server checks, while a statement runs, that the client of a connection of this
/// pool is still there (`client_connection_check_interval`, 1 s): the bound on how long the
/// backend of a dropped call goes on after its connection was closed. Sent on each new connection
/// as a statement of its own whose error is ignored (a server that cannot check, as on Windows,
/// refuses any value but 0, and the connection is kept).
const CHECK_STATEMENT: &str = "SET client_connection_check_interval = 1000";

/// A pool of `pool_size` connections to `url`, nothing connected yet (call it inside a tokio
/// runtime); a malformed URL, a host list, an `sslmode` this build cannot honour or a
/// keepalive option is a [`Error::Configuration`] error.
pub(crate) fn pool(url: &str, pool_size: u32, settings: &Settings) -> Result<PgPool, Error> {
    use crate::tls::{RootCerts, SslMode, SslParams};
    use sqlx::postgres::PgSslMode;
    // A host list (failover) is refused with its reason, not sqlx's "invalid port number".
    super::hosts::one_host(url).map_err(|reason| Error::Configuration { reason, source: None })?;
    let ssl = SslParams::parse(url)
        .and_then(|ssl| ssl.check().map(|()| ssl))
        .map_err(|reason| Error::Configuration { reason, source: None })?;
    let (rest, connect) = bounds(&ssl.rest, settings).map_err(|reason| Error::Configuration { reason, source: None })?;
    let mut options = PgConnectOptions::from_str(&rest).map_err(|e| Error::Configuration {
        reason: format!("cannot read the connection URL: {e}"),
        source: Some(Box::new(e)),
    })?;
    options = options.ssl_mode(match ssl.mode {
        SslMode::Disable => PgSslMode::Disable,
        SslMode::Prefer => PgSslMode::Prefer,
        SslMode::Require => PgSslMode::Require,
        SslMode::VerifyCa => PgSslMode::VerifyCa,
        SslMode::VerifyFull => PgSslMode::VerifyFull,
    });
    if let RootCerts::File(path) = &ssl.roots {
        options = options.ssl_root_cert(path);
    }
    if let Some(limit) = settings.statement_timeout {
        if !options.get_options().unwrap_or("").contains("statement_timeout") {
            options = options.options([("statement_timeout", limit.as_millis())]);
        }
    }
    let check = !options.get_options().unwrap_or("").contains("client_connection_check_interval");
    // No test on acquire (sqlx's default: a ping each call waits for, its cost measured by
    // `bench --sqlx-acquire`, docs/performance.md): sqlx already checks every connection when it
    // is given back. sqlx bounds the wait for a free connection and the opening of a new one
    // together.
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(settings.pool_timeout + connect)
        .test_before_acquire(false)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if check {
                    let _ = sqlx::raw_sql(CHECK_STATEMENT).execute(&mut *conn).await;
                }
                Ok(())
            })
        })
        .connect_lazy_with(options);
    Ok(pool)
}

/// The URL without `connect_timeout` (sqlx does not read it) and the bound of opening a
/// connection: the URL's `connect_timeout` (whole seconds, as libpq reads it), else the
/// settings'. A keepalive option other than `keepalives=0` is refused with its reason.
fn bounds(url: &str, settings: &Settings) -> Result<(String, Duration), String> {
    let Some((base, query)) = url.split_once('?') else { return Ok((url.to_owned(), settings.connect_timeout)) };
    let mut connect = settings.connect_timeout;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name == "connect_timeout" {
            let secs: u64 = value.parse().map_err(|_| format!("connect_timeout must be a whole number of seconds, got {value:?}"))?;
            // libpq: zero (or nothing) waits for ever; a bound is kept here, as for tokio-postgres.
            if secs > 0 {
                connect = Duration::from_secs(secs);
            }
        } else if KEEPALIVES.contains(&name) && !(name == "keepalives" && value == "0") {
            return Err(format!(
                "{name} is not supported by the sqlx driver: sqlx opens its connections with no TCP keepalive and has \
                 no option for one; remove it (Settings::call_timeout bounds every call on a server that stopped \
                 answering) or use the tokio-postgres driver (Idempotency::<Postgres>::from_url), which honours it"
            ));
        } else if name != "keepalives" {
            kept.push(pair);
        }
    }
    let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    Ok((rest, connect))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use sqlx::postgres::PgSslMode;

    /// The configuration error's reason, or a panic naming what came instead.
    fn refusal(url: &str) -> String {
        match pool(url, 1, &Settings::default()) {
            Err(Error::Configuration { reason, .. }) => reason,
            Err(other) => panic!("{url}: not a configuration error: {other:?}"),
            Ok(_) => panic!("{url}: accepted"),
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn without_the_tls_feature_the_encrypting_modes_are_a_configuration_error() {
        for mode in ["require", "verify-ca", "verify-full"] {
            let e = refusal(&format!("postgres://app@db.example/shop?sslmode={mode}"));
            assert!(e.starts_with(&format!("sslmode={mode} needs TLS")) && e.contains("`tls` feature"), "{e}");
        }
        // sqlx's own spelling of the option is read by the same rule.
        let e = refusal("postgres://db/x?ssl-mode=require");
        assert!(e.starts_with("sslmode=require needs TLS"), "{e}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn with_the_tls_feature_a_verify_modes_root_file_is_read_at_configuration() {
        for mode in ["verify-ca", "verify-full"] {
            let e = refusal(&format!("postgres://db/x?sslmode={mode}&sslrootcert=/nonexistent/ca.pem"));
            assert!(e.starts_with("sslrootcert=/nonexistent/ca.pem: cannot read"), "{mode}: {e}");
        }
        // require with a root file is verify-ca (as libpq reads it): its file is read too.
        let e = refusal("postgres://db/x?sslmode=require&sslrootcert=/nonexistent/ca.pem");
        assert!(e.starts_with("sslrootcert=/nonexistent/ca.pem: cannot read"), "{e}");
    }

    #[test]
    fn the_tls_options_are_refused_as_for_tokio_postgres() {
        let e = refusal("postgres://db/x?sslmode=allow");
        assert!(e.starts_with("sslmode must be one of"), "{e}");
        let e = refusal("postgres://db/x?sslmode=require&sslcert=/c.pem");
        assert!(e.starts_with("sslcert is not supported"), "{e}");
        let e = refusal("postgres://db/x?ssl-key=/k.pem");
        assert!(e.starts_with("ssl-key is not supported"), "{e}");
        let e = refusal("postgres://db/x?sslrootcert=");
        assert!(e.starts_with("sslrootcert must name a file"), "{e}");
    }

    #[tokio::test]
    async fn the_urls_sslmode_is_the_pools() {
        let mut cases = vec![
            ("postgres://db/x", PgSslMode::Prefer),
            ("postgres://db/x?sslmode=disable", PgSslMode::Disable),
            ("postgres://db/x?sslmode=prefer&application_name=a", PgSslMode::Prefer),
        ];
        if cfg!(feature = "tls") {
            cases.extend([
                ("postgres://db/x?sslmode=require", PgSslMode::Require),
                // `system` is not a file: require stays require.
                ("postgres://db/x?sslmode=require&sslrootcert=system", PgSslMode::Require),
            ]);
        }
        for (url, mode) in cases {
            let pool = pool(url, 1, &Settings::default()).unwrap_or_else(|e| panic!("{url}: {e:?}"));
            let options = pool.connect_options();
            // PgSslMode has no PartialEq: compared by name.
            let got = (format!("{:?}", options.get_ssl_mode()), options.get_host(), options.get_database());
            assert_eq!(got, (format!("{mode:?}"), "db", Some("x")), "{url}");
        }
    }

    #[tokio::test]
    async fn the_bounds_are_the_urls_or_the_settings() {
        let settings = Settings::builder()
            .pool_timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(3))
            .statement_timeout(Some(Duration::from_millis(1500)))
            .build();
        let p = pool("postgres://db/x?application_name=a", 1, &settings).expect("a pool");
        assert_eq!(p.options().get_acquire_timeout(), Duration::from_secs(5));
        assert_eq!(p.connect_options().get_options(), Some("-c statement_timeout=1500"));
        // No ping per acquire (sqlx's default): docs/rust-client.md, "The pool's checks".
        assert!(!p.options().get_test_before_acquire(), "from_url's pool tests no connection on acquire");
        // The URL's connect_timeout and statement_timeout win; keepalives=0 is what sqlx does.
        let p = pool("postgres://db/x?connect_timeout=9&keepalives=0&options=-c%20statement_timeout%3D3s", 1, &settings).expect("a pool");
        assert_eq!(p.options().get_acquire_timeout(), Duration::from_secs(11));
        assert_eq!(p.connect_options().get_options(), Some("-c statement_timeout=3s"));
        // The defaults: 5 s + 5 s, the server's statement_timeout.
        let p = pool("postgres://db/x", 1, &Settings::default()).expect("a pool");
        assert_eq!(p.options().get_acquire_timeout(), Duration::from_secs(10));
        assert_eq!(p.connect_options().get_options(), None);
    }

    #[test]
    fn keepalives_and_a_bad_connect_timeout_are_refused_by_name() {
        for option in ["keepalives=1", "keepalives_idle=30", "keepalives_interval=5", "keepalives_retries=3"] {
            let e = refusal(&format!("postgres://db/x?{option}"));
            let name = option.split('=').next().unwrap_or_default();
            assert!(e.starts_with(&format!("{name} is not supported by the sqlx driver")) && e.contains("call_timeout"), "{e}");
        }
        let e = refusal("postgres://db/x?connect_timeout=2.5");
        assert!(e.starts_with("connect_timeout must be a whole number of seconds"), "{e}");
    }
}
