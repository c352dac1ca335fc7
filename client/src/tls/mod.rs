//! TLS for the connections the client opens itself, from the connection URL as libpq reads it.
//!
//! `sslmode` (default `prefer`):
//!
//! | `sslmode` | encrypted | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` | when the server offers it, else plain | not checked |
//! | `require` | always | not checked (checked as `verify-ca` when `sslrootcert` is given, as libpq does) |
//! | `verify-ca` | always | chains to a trusted root; any host name |
//! | `verify-full` | always | chains to a trusted root and names the host (`host`, not `hostaddr`) |
//!
//! The trusted roots are the PEM certificates of the file `sslrootcert` names, or the system's
//! roots when it is absent or `system`. [`SslParams::parse`] is the one reading of both options,
//! for both drivers, and [`usable`] the one rule of what this build can honour. tokio-postgres
//! knows only `disable`, `prefer` and `require` and no `sslrootcert`, so [`connect_params`]
//! hands back a `tokio_postgres::Config` with the matching tokio-postgres mode and the
//! connector that enforces the rest; the sqlx driver hands the mode and the root file to sqlx,
//! whose own rustls does the handshake (see `Idempotency::from_url` for where it
//! differs). TLS is rustls with the ring provider, behind the `tls` feature; without it
//! `disable` and `prefer` connect in plain text (as a libpq built without SSL does) and the other
//! modes are refused with a reason. Client certificates (`sslcert`, `sslkey`) are not supported,
//! and are refused rather than ignored.

use std::path::PathBuf;

/// The `sslmode` of a connection URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain text only.
    Disable,
    /// TLS when the server offers it, without checking its certificate; plain text otherwise.
    Prefer,
    /// TLS, without checking the server's certificate.
    Require,
    /// TLS; the certificate chains to a trusted root.
    VerifyCa,
    /// TLS; the certificate chains to a trusted root and is valid for the host name.
    VerifyFull,
}

impl SslMode {
    /// Parses the value of `sslmode` (as libpq spells it). The error names the option and the
    /// accepted values.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            // libpq's `allow` tries plain text first; nothing here would honour that order.
            other => Err(format!(
                "sslmode must be one of disable, prefer, require, verify-ca, verify-full; got {other:?}"
            )),
        }
    }

    /// How libpq names it.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether a plain-text connection is unacceptable.
    pub fn requires_tls(self) -> bool {
        matches!(self, SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

/// Where the trusted roots of `verify-ca` / `verify-full` come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// The PEM certificates of this file (`sslrootcert=PATH`).
    File(PathBuf),
    /// The system's trusted roots (no `sslrootcert`, or `sslrootcert=system`).
    System,
}

/// The TLS options of a connection string, read the same way for both drivers: `sslmode` and
/// `sslrootcert` (and sqlx's spellings `ssl-mode`, `ssl-root-cert`, `ssl-ca`) taken out, the
/// rest of the string kept for the driver to read.
#[derive(Debug, Clone)]
pub struct SslParams {
    /// The mode, after libpq's rule that `require` with an explicit `sslrootcert` verifies the CA.
    pub mode: SslMode,
    /// The trusted roots.
    pub roots: RootCerts,
    /// The connection string without its TLS options (same form: URL or key=value).
    pub rest: String,
}

/// Options tokio-postgres does not know and this client does not support: refused, never ignored.
const UNSUPPORTED: &[&str] = &[
    "sslcert", "ssl-cert", "sslkey", "ssl-key", "sslpassword", "sslcrl", "sslcrldir", "sslsni", "sslnegotiation",
];

impl SslParams {
    /// Parses a connection string, in URL form (`postgresql://...?sslmode=verify-full`) or
    /// key=value form (`host=db sslmode=require`). No `sslmode` means `prefer`, whatever the
    /// environment says (`PGSSLMODE` is not read).
    pub fn parse(url: &str) -> Result<Self, String> {
        let (rest, found) = take_options(url, &["sslmode", "ssl-mode", "sslrootcert", "ssl-root-cert", "ssl-ca"])?;
        let mut mode = None;
        let mut roots = RootCerts::System;
        let mut explicit_root = false;
        for (name, value) in found {
            match name.as_str() {
                "sslmode" | "ssl-mode" => mode = Some(SslMode::parse(&value)?),
                _ if value == "system" => roots = RootCerts::System,
                _ if value.is_empty() => return Err(format!("{name} must name a file or be \"system\", got \"\"")),
                _ => {
                    roots = RootCerts::File(PathBuf::from(value));
                    explicit_root = true;
                }
            }
        }
        let mut mode = mode.unwrap_or(SslMode::Prefer);
        if mode == SslMode::Require && explicit_root {
            mode = SslMode::VerifyCa;
        }
        Ok(SslParams { mode, roots, rest })
    }

    /// [`usable`] for these options.
    pub fn check(&self) -> Result<(), String> {
        usable(self.mode, &self.roots)
    }
}

/// Whether this build can honour `mode`, and `roots` can be read for it (read now, so a wrong
/// path fails at configuration, not at every connection). Without the `tls` feature, `require`
/// and the verify modes are refused with a reason naming the mode and the feature; `disable`
/// and `prefer` pass (`prefer` then connects in plain text). The one home of that rule, for
/// both drivers.
pub fn usable(mode: SslMode, roots: &RootCerts) -> Result<(), String> {
    #[cfg(not(feature = "tls"))]
    if mode.requires_tls() {
        let _ = roots;
        return Err(format!(
            "sslmode={} needs TLS, and idempotency-client was built without its `tls` feature \
             (enable it, or use sslmode=disable or prefer)",
            mode.as_str()
        ));
    }
    #[cfg(feature = "tls")]
    if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) {
        rustls_connector::root_store(roots)?;
    }
    Ok(())
}

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{connect_params, ConnectParams, Connector, TlsOptions};
#[cfg(feature = "postgres")]
pub(crate) use postgres::unverified_connector;
#[cfg(feature = "tls")]
mod rustls_connector;
mod url;
use url::take_options;

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::*;
    use tokio_postgres::config::SslMode as PgMode;

    #[test]
    fn every_libpq_mode_parses_and_others_are_refused_by_name() {
        for (text, mode) in [
            ("disable", SslMode::Disable),
            ("prefer", SslMode::Prefer),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            assert_eq!(SslMode::parse(text), Ok(mode));
            assert_eq!(mode.as_str(), text);
        }
        for bad in ["allow", "REQUIRE", "verify_full", ""] {
            let e = SslMode::parse(bad).unwrap_err();
            assert!(e.starts_with("sslmode must be one of") && e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn url_form_takes_out_sslmode_and_sslrootcert_and_keeps_the_rest() {
        let o = TlsOptions::parse("postgresql://app@db.example:5433/shop?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca%201.pem")
            .unwrap();
        assert_eq!(o.mode, SslMode::VerifyFull);
        assert_eq!(o.roots, RootCerts::File(PathBuf::from("/etc/ca 1.pem")));
        assert_eq!(o.config.get_ssl_mode(), PgMode::Require);
        assert_eq!(o.config.get_application_name(), Some("x"));
        assert_eq!(o.config.get_dbname(), Some("shop"));
        assert_eq!(o.config.get_ports(), &[5433]);
    }

    #[test]
    fn key_value_form_with_quoted_values() {
        let o = TlsOptions::parse("host=db user=app sslrootcert='/ca dir/it\\'s.pem' sslmode = verify-ca dbname=shop").unwrap();
        assert_eq!(o.mode, SslMode::VerifyCa);
        assert_eq!(o.roots, RootCerts::File(PathBuf::from("/ca dir/it's.pem")));
        assert_eq!(o.config.get_dbname(), Some("shop"));
        assert_eq!(o.config.get_ssl_mode(), PgMode::Require);
        let e = TlsOptions::parse("host=db sslmode='require").unwrap_err();
        assert!(e.contains("no closing quote"), "{e}");
    }

    #[test]
    fn the_default_is_prefer_and_modes_map_to_tokio_postgres() {
        for (url, mode, pg) in [
            ("postgresql://db/x", SslMode::Prefer, PgMode::Prefer),
            ("postgresql://db/x?sslmode=disable", SslMode::Disable, PgMode::Disable),
            ("postgresql://db/x?sslmode=prefer", SslMode::Prefer, PgMode::Prefer),
            ("postgresql://db/x?sslmode=require", SslMode::Require, PgMode::Require),
            ("host=db", SslMode::Prefer, PgMode::Prefer),
        ] {
            let o = TlsOptions::parse(url).unwrap();
            assert_eq!((o.mode, o.config.get_ssl_mode(), o.roots), (mode, pg, RootCerts::System), "{url}");
        }
    }

    #[test]
    fn require_with_an_explicit_root_certificate_verifies_the_ca_as_libpq_does() {
        let o = TlsOptions::parse("postgresql://db/x?sslmode=require&sslrootcert=/ca.pem").unwrap();
        assert_eq!(o.mode, SslMode::VerifyCa);
        // `system` is not a file: require stays require.
        assert_eq!(TlsOptions::parse("postgresql://db/x?sslmode=require&sslrootcert=system").unwrap().mode, SslMode::Require);
    }

    #[test]
    fn sqlx_spellings_are_read_the_same_and_the_rest_is_kept() {
        let p = SslParams::parse("postgres://db/x?statement-cache-capacity=10&ssl-mode=require&ssl-ca=/ca.pem").unwrap();
        assert_eq!((p.mode, p.roots), (SslMode::VerifyCa, RootCerts::File(PathBuf::from("/ca.pem"))));
        assert_eq!(p.rest, "postgres://db/x?statement-cache-capacity=10");
        let p = SslParams::parse("postgres://db/x?ssl-root-cert=system&sslmode=verify-full").unwrap();
        assert_eq!((p.mode, p.roots, p.rest.as_str()), (SslMode::VerifyFull, RootCerts::System, "postgres://db/x"));
    }

    #[test]
    fn client_certificates_and_bad_options_are_refused_with_a_reason() {
        let e = TlsOptions::parse("postgresql://db/x?sslmode=require&sslcert=/c.pem").unwrap_err();
        assert!(e.starts_with("sslcert is not supported"), "{e}");
        let e = TlsOptions::parse("host=db sslkey=/k.pem").unwrap_err();
        assert!(e.starts_with("sslkey is not supported"), "{e}");
        let e = TlsOptions::parse("postgresql://db/x?sslmode=verify").unwrap_err();
        assert!(e.starts_with("sslmode must be one of"), "{e}");
        let e = TlsOptions::parse("postgresql://db/x?sslrootcert=").unwrap_err();
        assert!(e.starts_with("sslrootcert must name a file"), "{e}");
        let e = TlsOptions::parse("postgresql://db/x?nosuchoption=1").unwrap_err();
        assert!(e.starts_with("the connection URL does not parse"), "{e}");
        let e = TlsOptions::parse("postgresql://db/x?sslrootcert=%zz").unwrap_err();
        assert!(e.contains("percent escape"), "{e}");
    }

    #[test]
    fn disable_needs_no_tls() {
        let p = connect_params("postgresql://db/x?sslmode=disable").unwrap();
        assert!(matches!(p.connector, Connector::NoTls(_)));
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn without_the_feature_tls_modes_are_a_configuration_error_and_prefer_is_plain() {
        for mode in ["require", "verify-ca", "verify-full"] {
            let e = connect_params(&format!("postgresql://db/x?sslmode={mode}")).unwrap_err();
            assert!(e.starts_with(&format!("sslmode={mode} needs TLS")) && e.contains("`tls` feature"), "{e}");
        }
        assert!(matches!(connect_params("postgresql://db/x").unwrap().connector, Connector::NoTls(_)));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn with_the_feature_every_encrypting_mode_gets_rustls_and_a_bad_root_file_is_refused() {
        for mode in ["prefer", "require"] {
            let p = connect_params(&format!("postgresql://db/x?sslmode={mode}")).unwrap();
            assert!(matches!(p.connector, Connector::Rustls(_)), "{mode}");
        }
        let e = connect_params("postgresql://db/x?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem").unwrap_err();
        assert!(e.starts_with("sslrootcert=/nonexistent/ca.pem: cannot read"), "{e}");
        let empty = std::env::temp_dir().join(format!("idem-empty-{}.pem", std::process::id()));
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = connect_params(&format!("postgresql://db/x?sslmode=verify-ca&sslrootcert={}", empty.display())).unwrap_err();
        let _ = std::fs::remove_file(&empty);
        assert!(e.ends_with("the file holds no certificate"), "{e}");
    }
}
