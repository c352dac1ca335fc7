//! The handle over sqlx: made from a `sqlx::PgPool` or from a URL (`driver::sqlx::connect`
//! builds the pool).

use super::{Connect, Idempotency};
use crate::driver::sqlx::connect;
use crate::driver::Sqlx;
use crate::error::Error;
use crate::settings::Settings;
use sqlx::PgPool;

#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
impl Connect for Sqlx {
    type Pool = PgPool;

    fn open(url: &str, pool_size: u32, settings: &Settings) -> Result<Self, Error> {
        Ok(Sqlx::new(connect::pool(url, pool_size, settings)?))
    }

    fn over(pool: PgPool) -> Self {
        Sqlx::new(pool)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
impl Idempotency<Sqlx> {
    /// A handle over the sqlx pool `pool` with `settings`.
    ///
    /// The same as [`Idempotency::from_pool`], the shape every driver shares.
    ///
    /// # Errors
    ///
    /// None: the pool is used as it is.
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn from_sqlx(pool: PgPool, settings: Settings) -> Self {
        Idempotency::with_driver(Sqlx::new(pool), settings)
    }

    /// A sqlx pool of `pool_size` connections to `url` with default [`Settings`]; see
    /// [`Idempotency::connect_sqlx_with`].
    ///
    /// # Errors
    ///
    /// Those of [`Idempotency::connect_sqlx_with`].
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn connect_sqlx(url: &str, pool_size: u32) -> Result<Self, Error> {
        Self::connect_sqlx_with(url, pool_size, Settings::default())
    }

    /// A sqlx pool of `pool_size` connections to `url` whose waits are bounded by `settings`:
    /// sqlx bounds the wait for a free connection and the opening of a new one together, by
    /// [`Settings::pool_timeout`] plus [`Settings::connect_timeout`] (10 s by default; the URL's
    /// `connect_timeout`, in seconds, replaces the second), and a server
    /// [`Settings::statement_timeout`] is sent when connecting if set (a `statement_timeout` in
    /// the URL's `options` wins), so an unreachable or exhausted store is a
    /// [`Error::StoreUnavailable`] error, never a hang; every call is bounded besides by
    /// [`Settings::call_timeout`]. sqlx sets no TCP keepalive and has no option for one: a URL
    /// naming `keepalives` (other than `keepalives=0`), `keepalives_idle`,
    /// `keepalives_interval` or `keepalives_retries` is a [`Error::Configuration`] error. Nothing
    /// is connected yet (call [`Idempotency::check_extension`] to fail fast); call it inside a
    /// tokio runtime. A malformed URL or schema name, or a zero bound, is a
    /// [`Error::Configuration`] error. The URL is sqlx's URL
    /// form (`postgres://...`; sqlx reads no key=value string), with one host: a host list
    /// (`postgresql://a,b/db`, for failover) is a [`Error::Configuration`] error naming the alternatives.
    ///
    /// The URL's `sslmode` and `sslrootcert` are read as `Idempotency::connect_with` reads them
    /// (`disable`, `prefer` — the default, `PGSSLMODE` is not read —, `require`, `verify-ca`,
    /// `verify-full`; `require` with an `sslrootcert` file verifies the CA, as libpq does; see
    /// [`crate::tls`]) and handed to sqlx, whose TLS is rustls with ring and the system roots
    /// when the client's `tls` feature is on. Without it `require` and the verify modes are a
    /// [`Error::Configuration`] error naming the mode and the feature, and `prefer` connects in
    /// plain text (encrypted if your build turns on one of sqlx's own TLS features). A verify mode's roots are read here: an unreadable `sslrootcert` is a
    /// configuration error. Where sqlx differs from the tokio-postgres handle: with an
    /// `sslrootcert` file, `verify-ca` and `verify-full` trust the system roots as well as the
    /// file's (libpq and `Idempotency::connect_with` trust only the file); `hostaddr` replaces
    /// the host, so `verify-full` checks the certificate against that address, not the `host`
    /// name; and without `sslrootcert` in the URL sqlx reads `PGSSLROOTCERT` (and `PGSSLCERT`,
    /// `PGSSLKEY`) from the environment. `sslcert`, `sslkey` are refused, as for tokio-postgres.
    ///
    /// [`Idempotency::from_url`] is the same, the shape every driver shares.
    ///
    /// # Errors
    ///
    /// [`Error::Configuration`], as said above; nothing is connected, so an unreachable server
    /// is the first call's [`Error::StoreUnavailable`] (the repository's docs/rust-client.md,
    /// "Errors").
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn connect_sqlx_with(url: &str, pool_size: u32, settings: Settings) -> Result<Self, Error> {
        settings.check()?;
        Ok(Self::from_sqlx(connect::pool(url, pool_size, &settings)?, settings))
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        self.driver().pool()
    }
}
