//! The sqlx driver (feature `sqlx`): a `sqlx::PgPool`, statements prepared once per connection
//! (sqlx's persistent statements). sqlx sends a statement and waits for its answer, so nothing
//! is pipelined: `BEGIN`, each statement and `COMMIT` cost a round trip each, where the
//! tokio-postgres driver sends them together. Transactions are begun and ended through sqlx's
//! own transaction manager, so the depth sqlx tracks is right: a `conn.begin()` inside your
//! closure is a savepoint of yours, as sqlx always makes it.

use super::{Driver, Reservations, Sealed};
use crate::error::{DatabaseError, Error};
use crate::ops::{secs, ReleaseOutcome, ReserveOptions, Reservation, Status, Token};
use crate::settings::{Isolation, Settings};
use crate::sql::{Schema, EXTENSION_SQL, LEASE_LOST_MARK};
use crate::Idempotency;
use idempotency_core::{Fingerprint, Key};
use serde_json::Value;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgDatabaseError, PgPoolOptions, PgRow, PgTransactionManager};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row, SqlSafeStr};
use sqlx_core::transaction::TransactionManager;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// sqlx over a `sqlx::PgPool`.
#[derive(Clone, Debug)]
pub struct Sqlx {
    pool: PgPool,
}

impl Sqlx {
    /// A driver over `pool`.
    pub fn new(pool: PgPool) -> Self {
        Sqlx { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn get(&self) -> Result<PoolConnection<sqlx::Postgres>, Error> {
        Ok(self.pool.acquire().await?)
    }
}

impl Sealed for Sqlx {}

/// An open transaction of the sqlx driver: a pooled connection inside the transaction that holds
/// the reservation. Your closure gets its `&mut sqlx::PgConnection`. Unless the transaction is
/// seen to end (sqlx's transaction depth back at 0 after a `COMMIT` or `ROLLBACK` the server
/// answered), dropping it closes the connection instead of returning it to the pool.
pub struct SqlxTx {
    conn: Option<PoolConnection<sqlx::Postgres>>,
}

impl SqlxTx {
    fn conn(&mut self) -> Result<&mut PgConnection, Error> {
        self.conn.as_deref_mut().ok_or_else(|| {
            Error::protocol("the request's transaction was not given back: a handler kept its Transaction locked after returning")
        })
    }
}

impl std::fmt::Debug for SqlxTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqlxTx")
    }
}

impl Drop for SqlxTx {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.conn {
            if PgTransactionManager::get_transaction_depth(conn) > 0 {
                // The server rolls the transaction back when the connection closes.
                conn.close_on_drop();
            }
        }
    }
}

/// The request's transaction as an in-transaction route's handler gets it over [`Sqlx`] (the
/// layer's `Transaction` dereferences to it): lock it for the `sqlx::PgConnection` to run your
/// queries on, and drop the guard before the handler returns.
///
/// ```no_run
/// # async fn demo(tx: idempotency_client::SharedConnection) -> Result<(), sqlx::Error> {
/// let mut conn = tx.lock().await?;
/// sqlx::query("INSERT INTO charges (user_id, amount) VALUES ($1, $2)").bind("u").bind(1i64).execute(&mut *conn).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SharedConnection(Arc<tokio::sync::Mutex<SqlxTx>>);

impl SharedConnection {
    /// The connection, inside the request's transaction; an error once the request is over.
    pub async fn lock(&self) -> Result<tokio::sync::MappedMutexGuard<'_, PgConnection>, sqlx::Error> {
        let guard = self.0.lock().await;
        tokio::sync::MutexGuard::try_map(guard, |tx| tx.conn.as_deref_mut())
            .map_err(|_| sqlx::Error::Protocol("the idempotency transaction of this request has ended".into()))
    }
}

impl std::fmt::Debug for SharedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedConnection")
    }
}

/// A statement of `sql.rs`.
fn statement(sql: &str) -> Query<'_, sqlx::Postgres, PgArguments> {
    sqlx::query(AssertSqlSafe(sql))
}

/// `sql` with the key's three columns bound as $1-$3.
fn keyed<'q>(sql: &'q str, key: &'q Key) -> Query<'q, sqlx::Postgres, PgArguments> {
    statement(sql).bind(key.operation()).bind(key.user_id()).bind(key.key())
}

/// The reservation statements ($1-$7).
fn reserving<'q>(sql: &'q str, key: &'q Key, fingerprint: &'q Fingerprint, options: &ReserveOptions) -> Query<'q, sqlx::Postgres, PgArguments> {
    keyed(sql, key).bind(fingerprint.as_str()).bind(secs(options.ttl)).bind(secs(options.lease)).bind(options.wait)
}

/// A column by name; a missing or mistyped column is a protocol error.
fn col<'r, T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>>(row: &'r PgRow, name: &str) -> Result<T, Error> {
    row.try_get(name)
        .map_err(|e| Error::Protocol { reason: format!("cannot read column {name:?}"), source: Some(Box::new(e)) })
}

fn reservation(row: &PgRow) -> Result<Reservation, Error> {
    Reservation::from_columns(
        &col::<String>(row, "outcome")?,
        col(row, "token")?,
        col(row, "response")?,
        col(row, "attempts")?,
        col(row, "expires_at")?,
    )
}

/// One statement of a failure path: roll back, then in a fresh transaction reserve again and
/// release or fail, and commit; the `answer` column (NULL when the key was not created again).
async fn again<'q, L>(tx: &mut SqlxTx, query: Query<'q, sqlx::Postgres, PgArguments>, last: L) -> Result<Option<String>, Error>
where
    L: sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + 'q,
{
    let conn = tx.conn()?;
    // ROLLBACK and BEGIN leave as one simple query: the depth sqlx tracks stays 1.
    sqlx::raw_sql("ROLLBACK; BEGIN").execute(&mut *conn).await?;
    let row = match query.bind(last).fetch_one(&mut *conn).await {
        Ok(row) => row,
        Err(e) => {
            let _ = PgTransactionManager::rollback(conn).await;
            return Err(ours(e));
        }
    };
    PgTransactionManager::commit(conn).await?;
    col(&row, "answer")
}

/// The end of a completion: `COMMIT` when it succeeded; otherwise roll back, and answer false
/// when it aborted the transaction because the key was lost.
async fn commit_if_completed(conn: &mut PgConnection, completed: Result<(), sqlx::Error>) -> Result<bool, Error> {
    match completed {
        Ok(()) => PgTransactionManager::commit(conn).await.map(|()| true).map_err(Error::from),
        Err(e) => {
            let lost = lease_lost(&e);
            let _ = PgTransactionManager::rollback(conn).await;
            if lost {
                Ok(false)
            } else {
                Err(ours(e))
            }
        }
    }
}

impl Driver for Sqlx {
    type Tx = SqlxTx;
    type Conn = PgConnection;
    type Shared = SharedConnection;

    fn conn(tx: &mut SqlxTx) -> &mut PgConnection {
        match tx.conn.as_deref_mut() {
            Some(conn) => conn,
            None => unreachable!("a flow lends a transaction only while it holds its connection"),
        }
    }

    fn share(tx: &mut SqlxTx) -> SharedConnection {
        SharedConnection(Arc::new(tokio::sync::Mutex::new(std::mem::replace(tx, SqlxTx { conn: None }))))
    }

    fn unshare(tx: &mut SqlxTx, shared: SharedConnection) {
        // A handler still holding the lock keeps the connection: the flow then reports it.
        if let Ok(mut lent) = shared.0.try_lock() {
            *tx = std::mem::replace(&mut *lent, SqlxTx { conn: None });
        }
    }

    async fn installed(&self) -> Result<(String, String), Error> {
        let Some(row) = statement(EXTENSION_SQL).fetch_optional(&self.pool).await? else {
            return Err(Error::IncompatibleExtension {
                reason: "the idempotency extension is not installed in this database (CREATE EXTENSION idempotency)".into(),
                source: None,
            });
        };
        let (schema, version): (String, String) = (col(&row, "schema")?, col(&row, "version")?);
        crate::sql::check_version(&version)?;
        Ok((schema, version))
    }

    async fn begin_and_reserve(
        &self,
        schema: &Schema,
        isolation: Option<Isolation>,
        key: &Key,
        fingerprint: &Fingerprint,
        options: &ReserveOptions,
    ) -> Result<(SqlxTx, Reservation), Error> {
        let mut tx = SqlxTx { conn: Some(self.get().await?) };
        let conn = tx.conn()?;
        let begin = isolation.map(|_| Isolation::begin_sql(isolation).into_sql_str());
        PgTransactionManager::begin(conn, begin).await?;
        let answered = reserving(&schema.sql().reserve, key, fingerprint, options).fetch_one(&mut *conn).await;
        match answered.map_err(ours).and_then(|row| reservation(&row)) {
            Ok(reservation) => Ok((tx, reservation)),
            Err(e) => {
                Self::rollback(&mut tx).await;
                Err(e)
            }
        }
    }

    fn abandon(mut tx: SqlxTx) {
        // The ROLLBACK is queued on the connection, which goes back to the pool at once; sqlx
        // flushes it when the pool takes the connection back.
        if let Some(conn) = &mut tx.conn {
            PgTransactionManager::start_rollback(conn);
        }
    }

    async fn complete_and_commit(
        tx: &mut SqlxTx,
        schema: &Schema,
        key: &Key,
        token: Token,
        response: Option<&Value>,
        status: Status,
    ) -> Result<bool, Error> {
        let conn = tx.conn()?;
        let completed = keyed(&schema.sql().complete_or_abort, key)
            .bind(token.0)
            .bind(response)
            .bind(status.as_str())
            .fetch_one(&mut *conn)
            .await;
        commit_if_completed(conn, completed.map(drop)).await
    }

    async fn rollback_and_release(
        tx: &mut SqlxTx,
        schema: &Schema,
        key: &Key,
        fingerprint: &Fingerprint,
        options: &ReserveOptions,
        max_retries: Option<i32>,
    ) -> Result<Option<ReleaseOutcome>, Error> {
        let options = ReserveOptions { wait: false, ..options.clone() };
        let query = reserving(&schema.sql().reserve_and_release, key, fingerprint, &options);
        let answer = again(tx, query, max_retries).await?;
        answer.map(|a| ReleaseOutcome::parse(&a).map_err(|e| Error::protocol(e.to_string()))).transpose()
    }

    async fn rollback_and_fail(
        tx: &mut SqlxTx,
        schema: &Schema,
        key: &Key,
        fingerprint: &Fingerprint,
        options: &ReserveOptions,
        response: Option<&Value>,
    ) -> Result<bool, Error> {
        let options = ReserveOptions { wait: false, ..options.clone() };
        let query = reserving(&schema.sql().reserve_and_fail, key, fingerprint, &options);
        let answer = again(tx, query, response.cloned()).await?;
        Ok(answer.as_deref() == Some("true"))
    }

    async fn begin_and_reserve_many(&self, isolation: Option<Isolation>, reserve_many: &str) -> Result<(SqlxTx, Reservations), Error> {
        // BEGIN through sqlx's transaction manager (so its depth is right for the closure), then
        // the reservations as a simple query: sqlx waits for each, so two round trips.
        let mut tx = self.open().await?;
        let conn = tx.conn()?;
        let begin = isolation.map(|_| Isolation::begin_sql(isolation).into_sql_str());
        PgTransactionManager::begin(conn, begin).await?;
        let answered = sqlx::raw_sql(AssertSqlSafe(reserve_many)).fetch_all(&mut *conn).await;
        let rows = answered
            .map_err(ours)
            .and_then(|rows| rows.iter().map(|row| Ok((col::<String>(row, "key")?, reservation(row)?))).collect::<Result<Vec<_>, Error>>());
        match rows {
            Ok(rows) => Ok((tx, rows)),
            Err(e) => {
                Self::rollback(&mut tx).await;
                Err(e)
            }
        }
    }

    async fn complete_many_and_commit(tx: &mut SqlxTx, complete_many: &str) -> Result<bool, Error> {
        let conn = tx.conn()?;
        let completed = sqlx::raw_sql(AssertSqlSafe(complete_many)).execute(&mut *conn).await;
        commit_if_completed(conn, completed.map(drop)).await
    }

    async fn rollback(tx: &mut SqlxTx) {
        if let Some(conn) = &mut tx.conn {
            let _ = PgTransactionManager::rollback(conn).await;
        }
    }

    async fn open(&self) -> Result<SqlxTx, Error> {
        Ok(SqlxTx { conn: Some(self.get().await?) })
    }

    async fn begin(tx: &mut SqlxTx) -> Result<(), Error> {
        Ok(PgTransactionManager::begin(tx.conn()?, None).await?)
    }

    async fn reserve(&self, schema: &Schema, key: &Key, fingerprint: &Fingerprint, options: &ReserveOptions) -> Result<Reservation, Error> {
        let row = reserving(&schema.sql().reserve, key, fingerprint, options).fetch_one(&self.pool).await.map_err(ours)?;
        reservation(&row)
    }

    async fn release(&self, schema: &Schema, key: &Key, token: Token, max_retries: Option<i32>) -> Result<ReleaseOutcome, Error> {
        let row = keyed(&schema.sql().release, key).bind(token.0).bind(max_retries).fetch_one(&self.pool).await.map_err(ours)?;
        let answer: String = col(&row, "released")?;
        ReleaseOutcome::parse(&answer).map_err(|e| Error::protocol(e.to_string()))
    }

    async fn complete(&self, schema: &Schema, key: &Key, token: Token, response: Option<&Value>, status: Status) -> Result<bool, Error> {
        let row = keyed(&schema.sql().complete, key)
            .bind(token.0)
            .bind(response)
            .bind(status.as_str())
            .fetch_one(&self.pool)
            .await
            .map_err(ours)?;
        col(&row, "completed")
    }

    async fn heartbeat(&self, schema: &Schema, key: &Key, token: Token, lease: Duration) -> Result<bool, Error> {
        let row = keyed(&schema.sql().heartbeat, key).bind(token.0).bind(secs(Some(lease))).fetch_one(&self.pool).await.map_err(ours)?;
        col(&row, "extended")
    }
}

/// The bound of every wait of a pool made by [`Idempotency::connect_sqlx`]: for a free
/// connection (connecting included).
const POOL_TIMEOUT: Duration = Duration::from_secs(5);

impl Idempotency<Sqlx> {
    /// A handle over the sqlx pool `pool` with `settings`.
    pub fn from_sqlx(pool: PgPool, settings: Settings) -> Self {
        Idempotency::with_driver(Sqlx::new(pool), settings)
    }

    /// A sqlx pool of `pool_size` connections to `url` with default [`Settings`]; see
    /// [`Idempotency::connect_sqlx_with`].
    pub fn connect_sqlx(url: &str, pool_size: u32) -> Result<Self, Error> {
        Self::connect_sqlx_with(url, pool_size, Settings::default())
    }

    /// A sqlx pool of `pool_size` connections to `url` whose waits are bounded (5 s to get a
    /// connection, connecting included), so an unreachable or exhausted store is a
    /// [`Error::StoreUnavailable`] error, never a hang. Nothing is connected yet (call
    /// [`Idempotency::check_extension`] to fail fast); call it inside a tokio runtime. A
    /// malformed URL or schema name is a [`Error::Configuration`] error. The URL is sqlx's URL
    /// form (`postgres://...`; sqlx reads no key=value string), with one host: a host list
    /// (`postgresql://a,b/db`, for failover) is a [`Error::Configuration`] error naming the alternatives.
    ///
    /// The URL's `sslmode` and `sslrootcert` are read as [`Idempotency::connect_with`] reads them
    /// (`disable`, `prefer` — the default, `PGSSLMODE` is not read —, `require`, `verify-ca`,
    /// `verify-full`; `require` with an `sslrootcert` file verifies the CA, as libpq does; see
    /// [`crate::tls`]) and handed to sqlx, whose TLS is rustls with ring and the system roots
    /// when the client's `tls` feature is on. Without it `require` and the verify modes are a
    /// [`Error::Configuration`] error naming the mode and the feature, and `prefer` connects in
    /// plain text (encrypted if your build turns on one of sqlx's own TLS features). A verify mode's roots are read here: an unreadable `sslrootcert` is a
    /// configuration error. Where sqlx differs from the tokio-postgres handle: with an
    /// `sslrootcert` file, `verify-ca` and `verify-full` trust the system roots as well as the
    /// file's (libpq and [`Idempotency::connect_with`] trust only the file); `hostaddr` replaces
    /// the host, so `verify-full` checks the certificate against that address, not the `host`
    /// name; and without `sslrootcert` in the URL sqlx reads `PGSSLROOTCERT` (and `PGSSLCERT`,
    /// `PGSSLKEY`) from the environment. `sslcert`, `sslkey` are refused, as for tokio-postgres.
    pub fn connect_sqlx_with(url: &str, pool_size: u32, settings: Settings) -> Result<Self, Error> {
        use crate::tls::{RootCerts, SslMode, SslParams};
        use sqlx::postgres::PgSslMode;
        if let Some(name) = &settings.schema {
            Schema::named(name.as_str())?;
        }
        // A host list (failover) is refused with its reason, not sqlx's "invalid port number".
        super::sqlx_hosts::one_host(url).map_err(|reason| Error::Configuration { reason, source: None })?;
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
        Ok(Self::from_sqlx(pool, settings))
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        self.driver().pool()
    }
}

impl<E> From<sqlx::Error> for Error<E> {
    /// Connection-level failures (I/O, TLS, a pool timeout or a closed pool, class 08, shutdown,
    /// too many connections) and a server that cannot take writes (25006) become
    /// `StoreUnavailable`, a configuration error `Configuration`, anything else `Database`. This
    /// is the mapping for your own statements too.
    fn from(e: sqlx::Error) -> Self {
        if is_unavailable(&e) {
            return Error::StoreUnavailable(Box::new(e));
        }
        if let sqlx::Error::Configuration(_) = e {
            return Error::Configuration { reason: e.to_string(), source: Some(Box::new(e)) };
        }
        let code = sqlstate(&e).map(str::to_owned);
        Error::Database(DatabaseError::new(code.as_deref(), e))
    }
}

/// The SQLSTATE of a database error.
pub(crate) fn sqlstate(e: &sqlx::Error) -> Option<&str> {
    match e {
        sqlx::Error::Database(db) => db.try_downcast_ref::<PgDatabaseError>().map(PgDatabaseError::code),
        _ => None,
    }
}

/// Whether the completion aborted because the key was lost (`complete_or_abort`).
fn lease_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db.try_downcast_ref::<PgDatabaseError>().is_some_and(|d| d.code() == "22P02" && d.message().contains(LEASE_LOST_MARK)),
        _ => false,
    }
}

/// Maps an error of one of this crate's own statements: a missing function, type or schema
/// means the extension is missing; anything else as [`From`] does.
fn ours(e: sqlx::Error) -> Error {
    if matches!(sqlstate(&e), Some("42883" | "42704" | "3F000")) {
        Error::IncompatibleExtension {
            reason: "the idempotency extension is not installed in the configured schema".into(),
            source: Some(Box::new(e)),
        }
    } else {
        Error::from(e)
    }
}

/// Whether an error means the store cannot be used now (and a retry, perhaps on another node,
/// may succeed).
pub(crate) fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        // A connection closed before the answer to sqlx's SSLRequest (a proxy whose server is
        // down) is read by sqlx as the byte 0x00: a failure to connect, not of the protocol.
        sqlx::Error::Protocol(m) => m.starts_with("unexpected response from SSLRequest: 0x00"),
        sqlx::Error::Database(_) => {
            sqlstate(e).is_some_and(|c| c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03" | "53300" | "25006"))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::postgres::PgSslMode;

    /// The configuration error's reason, or a panic naming what came instead.
    fn refusal(url: &str) -> String {
        match Idempotency::connect_sqlx(url, 1) {
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
            let idem = Idempotency::connect_sqlx(url, 1).unwrap_or_else(|e| panic!("{url}: {e:?}"));
            let options = idem.pool().connect_options();
            // PgSslMode has no PartialEq: compared by name.
            let got = (format!("{:?}", options.get_ssl_mode()), options.get_host(), options.get_database());
            assert_eq!(got, (format!("{mode:?}"), "db", Some("x")), "{url}");
        }
    }
}
