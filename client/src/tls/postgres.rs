//! The tokio-postgres side of TLS (feature `postgres`): the URL's options as a
//! `tokio_postgres::Config`, and the connector that enforces its `sslmode`.

#[cfg(not(feature = "tls"))]
use super::usable;
use super::{RootCerts, SslMode, SslParams};
#[cfg(feature = "tls")]
use super::rustls_connector::connector;

/// The TLS options of a connection URL, and the URL's other options as tokio-postgres reads them.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// The mode, after libpq's rule that `require` with an explicit `sslrootcert` verifies the CA.
    pub mode: SslMode,
    /// The trusted roots.
    pub roots: RootCerts,
    /// Everything else, with the tokio-postgres `ssl_mode` that matches `mode`.
    pub config: tokio_postgres::Config,
}

impl TlsOptions {
    /// [`SslParams::parse`], the rest read by tokio-postgres.
    pub fn parse(url: &str) -> Result<Self, String> {
        let SslParams { mode, roots, rest } = SslParams::parse(url)?;
        let mut config: tokio_postgres::Config =
            rest.parse().map_err(|e| format!("the connection URL does not parse: {e}"))?;
        config.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        Ok(TlsOptions { mode, roots, config })
    }
}

/// What a pool needs to connect: the tokio-postgres config and the connector for its `sslmode`.
#[derive(Debug)]
pub struct ConnectParams {
    /// The options: the URL's, with the tokio-postgres `ssl_mode` that matches.
    pub options: TlsOptions,
    /// The connector (give it to `deadpool_postgres::Manager::from_config` or
    /// `tokio_postgres::Config::connect`).
    pub connector: Connector,
}

/// The connector of a connection URL: plain text, or rustls with the URL's verification.
#[derive(Clone)]
pub enum Connector {
    /// `sslmode=disable`, or `prefer` without the `tls` feature.
    NoTls(tokio_postgres::NoTls),
    /// Every other mode, with the `tls` feature.
    #[cfg(feature = "tls")]
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connector::NoTls(_) => f.write_str("NoTls"),
            #[cfg(feature = "tls")]
            Connector::Rustls(_) => f.write_str("Rustls"),
        }
    }
}

/// The config and connector for `url`. The error is the reason, for a configuration error: a
/// malformed URL or option, an unreadable or empty `sslrootcert`, or TLS asked for without the
/// `tls` feature.
pub fn connect_params(url: &str) -> Result<ConnectParams, String> {
    let options = TlsOptions::parse(url)?;
    let connector = connector(options.mode, &options.roots)?;
    Ok(ConnectParams { options, connector })
}

/// The connector of `require` (with the `tls` feature: rustls, no certificate check), else the
/// plain one: what can reach a server over a connection made elsewhere, whose connector is not
/// known (the cancel requests of a handle over your own pool, `crate::Postgres::cancel_tls`).
pub(crate) fn unverified_connector() -> Connector {
    connector(SslMode::Require, &RootCerts::System).unwrap_or(Connector::NoTls(tokio_postgres::NoTls))
}

#[cfg(not(feature = "tls"))]
fn connector(mode: SslMode, roots: &RootCerts) -> Result<Connector, String> {
    usable(mode, roots)?;
    Ok(Connector::NoTls(tokio_postgres::NoTls))
}

