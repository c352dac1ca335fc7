//! The cancel request of a dropped guard (tx.rs): PostgreSQL takes it on a connection of its
//! own, so it must be opened as the pool's connections are, through the same TLS connector under
//! the same `sslmode`. tokio-postgres's `CancelToken` keeps what the connection was made with
//! (its host, port and `sslmode`); [`CancelTls`] brings the connector, and with it the
//! certificate rules. A cancel request sent with a connector that cannot do TLS to a server that
//! must be reached over TLS (`require`, the verify modes) is never sent, and the backend goes on
//! waiting, holding its transaction, its reservation and its key lock.

use futures_util::future::BoxFuture;
use std::sync::Arc;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{CancelToken, Socket};

/// How a driver's cancel requests reach the server: the TLS connector of its pool's connections.
#[derive(Clone)]
pub(crate) struct CancelTls(Arc<dyn Fn(CancelToken) -> BoxFuture<'static, ()> + Send + Sync>);

impl CancelTls {
    /// Cancel requests through `tls` (what deadpool's `Manager` accepts, it accepts).
    pub(crate) fn new<T>(tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
        T::Stream: Sync + Send,
        T::TlsConnect: Sync + Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        CancelTls(Arc::new(move |token: CancelToken| {
            let tls = tls.clone();
            Box::pin(async move {
                // Nothing to tell anyone: the connection is closed whatever the answer, and the
                // server ends the transaction when the running statement ends at the latest.
                let _ = token.cancel_query(tls).await;
            })
        }))
    }

    /// Through the connector a handle made from a URL connects with (`crate::tls`).
    pub(crate) fn of(connector: crate::tls::Connector) -> Self {
        match connector {
            crate::tls::Connector::NoTls(tls) => CancelTls::new(tls),
            #[cfg(feature = "tls")]
            crate::tls::Connector::Rustls(tls) => CancelTls::new(tls),
        }
    }

    /// For a pool made elsewhere, whose connector is not known: with the `tls` feature, rustls
    /// without checking the certificate (encrypted whenever the connection's `sslmode` asks for
    /// TLS, as `require` does), else plain text (which a connection made with `require` refuses
    /// to send).
    pub(crate) fn unknown() -> Self {
        CancelTls::of(crate::tls::unverified_connector())
    }

    /// The request for `token`, to be spawned.
    pub(crate) fn send(&self, token: CancelToken) -> BoxFuture<'static, ()> {
        (self.0)(token)
    }
}
