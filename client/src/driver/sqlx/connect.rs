//! The sqlx pool a handle makes from a URL (`Idempotency::connect_sqlx_with`): one host, its
//! TLS options read as the tokio-postgres pool reads them, every wait bounded by
//! [`POOL_TIMEOUT`].

use crate::error::Error;
use crate::settings::POOL_TIMEOUT;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::str::FromStr;

/// A pool of `pool_size` connections to `url`, nothing connected yet (call it inside a tokio
/// runtime); a malformed URL, a host list or an `sslmode` this build cannot honour is a
/// [`Error::Configuration`] error.
pub(crate) fn pool(url: &str, pool_size: u32) -> Result<PgPool, Error> {
    use crate::tls::{RootCerts, SslMode, SslParams};
    use sqlx::postgres::PgSslMode;
    // A host list (failover) is refused with its reason, not sqlx's "invalid port number".
    super::hosts::one_host(url).map_err(|reason| Error::Configuration { reason, source: None })?;
    let ssl = SslParams::parse(url)
        .and_then(|ssl| ssl.check().map(|()| ssl))
        .map_err(|reason| Error::Configuration { reason, source: None })?;
    let mut options = PgConnectOptions::from_str(&ssl.rest).map_err(|e| Error::Configuration {
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
    // No test on acquire: sqlx already checks every connection when it is given back.
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(POOL_TIMEOUT)
        .test_before_acquire(false)
        .connect_lazy_with(options);
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use sqlx::postgres::PgSslMode;

    /// The configuration error's reason, or a panic naming what came instead.
    fn refusal(url: &str) -> String {
        match pool(url, 1) {
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
            let pool = pool(url, 1).unwrap_or_else(|e| panic!("{url}: {e:?}"));
            let options = pool.connect_options();
            // PgSslMode has no PartialEq: compared by name.
            let got = (format!("{:?}", options.get_ssl_mode()), options.get_host(), options.get_database());
            assert_eq!(got, (format!("{mode:?}"), "db", Some("x")), "{url}");
        }
    }
}
