//! `sslmode` end to end against a server that accepts TLS only
//! (`idempotency_testkit::tls_server`), one test per mode and per refusal, each success checked
//! on the server side (`pg_stat_ssl` says the session is encrypted).
//!
//! - The top level: the handle of the driver under test, from its own constructor
//!   (`Idempotency::connect_with`, and `connect_sqlx_with`: `over_postgres::`, `over_sqlx::`), runs the flow
//!   over the URL's `sslmode`: one source, both drivers.
//! - `connector` (tokio-postgres only, once): the client's TLS connector (client/src/tls) given to
//!   tokio-postgres and deadpool directly, SCRAM with channel binding over each mode, and a handle
//!   over such a pool of your own cancelling a dropped call over TLS (the cancellation suite,
//!   tests/tests/cancellation.rs, drops calls of the URL-made handles over this server).

idempotency_testkit::for_each_driver! {
    use idempotency_client::{Error, Fingerprint, Outcome, Settings, StoredResponse, TxFuture};

    use idempotency_testkit::tls_server::TlsServer;
    use idempotency_testkit::{unique_key};

    /// What the handle of the driver under test makes of `url`: the flow runs (executed, then
    /// replayed) and `Ok(true)` when the connection it ran on is encrypted; else the error's kind
    /// (`Configuration`, `StoreUnavailable`, `Database`, ...) and its text with every source.
    async fn through_the_handle(url: &str) -> Result<bool, String> {
        fn work<'t>(tx: &'t mut Conn) -> TxFuture<'t, StoredResponse, DbError> {
            Box::pin(async move {
                let sql = "SELECT ssl::int4::int8 FROM pg_catalog.pg_stat_ssl WHERE pid = pg_catalog.pg_backend_pid()";
                let ssl = query_i64(tx, sql, &[]).await?;
                Ok(StoredResponse::json(201, serde_json::json!({ "ssl": ssl == 1 })))
            })
        }
        let idem = try_connect_with(url, 2, Settings::default()).map_err(|e| explain(&e))?;
        let key = unique_key("tls.handle");
        let fp = Fingerprint::of_bytes(b"tls");
        let ssl = match idem.run(&key, &fp, work).await.map_err(|e| explain(&e))? {
            Outcome::Executed(response) => response.body_json().and_then(|b| b["ssl"].as_bool()).expect("the stored body"),
            other => panic!("{NAME}: a fresh key must run, got {other:?}"),
        };
        match idem.run(&key, &fp, work).await.map_err(|e| explain(&e))? {
            Outcome::Replayed(response) => assert_eq!(response.body_json().and_then(|b| b["ssl"].as_bool()), Some(ssl)),
            other => panic!("{NAME}: the second call must replay, got {other:?}"),
        }
        Ok(ssl)
    }

    /// The error's kind, then its text and its sources' (the TLS reason is in the source chain).
    fn explain<E: idempotency_client::HandlerError + std::error::Error + 'static>(e: &Error<E>) -> String {
        let kind = match e {
            Error::Configuration { .. } => "Configuration",
            Error::StoreUnavailable(_) => "StoreUnavailable",
            Error::Database(_) => "Database",
            _ => "other",
        };
        let mut text = format!("{kind}: {e}");
        let mut next = std::error::Error::source(e);
        while let Some(source) = next {
            text.push_str(": ");
            text.push_str(&source.to_string());
            next = source.source();
        }
        text
    }

    /// The server's URL through `host` alone (see [`TlsServer::direct_url`]).
    fn url(host: &str, params: &str) -> String {
        TlsServer::shared().direct_url(host, params)
    }

    /// `sslrootcert=` the test CA, or the CA that signed nothing.
    fn root(other: bool) -> String {
        let server = TlsServer::shared();
        format!("sslrootcert={}", if other { &server.other_ca } else { &server.ca }.display())
    }

    /// A TLS refusal: the driver could not connect (`StoreUnavailable`), the reason `reason`.
    #[track_caller]
    fn assert_refused(result: Result<bool, String>, reason: &str) {
        match result {
            Ok(ssl) => panic!("{NAME}: connected (encrypted: {ssl}), expected a refusal for {reason}"),
            Err(e) => assert!(e.starts_with("StoreUnavailable") && e.contains(reason), "{NAME}: {e}"),
        }
    }

    #[tokio::test]
    async fn disable_is_refused_by_a_hostssl_only_server() {
        let e = through_the_handle(&url("127.0.0.1", "sslmode=disable")).await.expect_err("plain text must be refused");
        assert!(e.contains("no pg_hba.conf entry") && e.contains("no encryption"), "{NAME}: {e}");
    }

    #[tokio::test]
    async fn prefer_connects_encrypted() {
        assert_eq!(through_the_handle(&url("127.0.0.1", "sslmode=prefer")).await, Ok(true), "{NAME}");
        // No sslmode means prefer, as in libpq.
        assert_eq!(through_the_handle(&url("127.0.0.1", "")).await, Ok(true), "{NAME}");
    }

    #[tokio::test]
    async fn require_connects_encrypted_without_checking_the_certificate() {
        // The test CA is in no trust store, and the certificate does not name 127.0.0.1.
        assert_eq!(through_the_handle(&url("127.0.0.1", "sslmode=require")).await, Ok(true), "{NAME}");
    }

    #[tokio::test]
    async fn require_with_sslrootcert_checks_the_ca_as_libpq_does() {
        assert_eq!(through_the_handle(&url("127.0.0.1", &format!("sslmode=require&{}", root(false)))).await, Ok(true), "{NAME}");
        assert_refused(through_the_handle(&url("localhost", &format!("sslmode=require&{}", root(true)))).await, "UnknownIssuer");
    }

    #[tokio::test]
    async fn verify_ca_accepts_the_right_ca_under_any_host_name() {
        for host in ["localhost", "127.0.0.1"] {
            assert_eq!(through_the_handle(&url(host, &format!("sslmode=verify-ca&{}", root(false)))).await, Ok(true), "{NAME} {host}");
        }
    }

    #[tokio::test]
    async fn verify_ca_refuses_a_certificate_from_another_ca() {
        assert_refused(through_the_handle(&url("localhost", &format!("sslmode=verify-ca&{}", root(true)))).await, "UnknownIssuer");
    }

    #[tokio::test]
    async fn verify_ca_without_sslrootcert_trusts_only_the_system_roots() {
        match through_the_handle(&url("localhost", "sslmode=verify-ca")).await {
            Ok(ssl) => panic!("{NAME}: the test CA is no system root, yet the flow ran (encrypted: {ssl})"),
            // Refused by the handshake, or no system roots on this machine at all: both refuse.
            Err(e) => assert!(
                (e.starts_with("StoreUnavailable") && e.contains("UnknownIssuer"))
                    || (e.starts_with("Configuration") && e.contains("no system root certificate")),
                "{NAME}: {e}"
            ),
        }
    }

    #[tokio::test]
    async fn verify_full_accepts_the_right_ca_and_host_name() {
        assert_eq!(through_the_handle(&url("localhost", &format!("sslmode=verify-full&{}", root(false)))).await, Ok(true), "{NAME}");
    }

    #[tokio::test]
    async fn verify_full_refuses_a_host_the_certificate_does_not_name() {
        assert_refused(through_the_handle(&url("127.0.0.1", &format!("sslmode=verify-full&{}", root(false)))).await, "not valid for name");
    }

    #[tokio::test]
    async fn verify_full_refuses_a_certificate_from_another_ca() {
        assert_refused(through_the_handle(&url("localhost", &format!("sslmode=verify-full&{}", root(true)))).await, "UnknownIssuer");
    }

    #[tokio::test]
    async fn an_unreadable_sslrootcert_is_a_configuration_error() {
        for mode in ["require", "verify-ca", "verify-full"] {
            let e = through_the_handle(&url("localhost", &format!("sslmode={mode}&sslrootcert=/nonexistent/ca.pem"))).await.unwrap_err();
            assert!(e.starts_with("Configuration") && e.contains("sslrootcert=/nonexistent/ca.pem: cannot read"), "{NAME} {mode}: {e}");
        }
    }
}

/// The client's connector given to tokio-postgres and deadpool directly.
mod connector {
    use idempotency_testkit::tls_server::{TlsServer, SCRAM_PASSWORD};
    use std::time::Duration;
    use idempotency_client::tls::{connect_params, Connector};

    /// Every connection attempt's bound (an awaited condition, not a timing).
    const DEADLINE: Duration = Duration::from_secs(30);

    /// Connects through the connector `url` asks for; `Ok(true)` when the session is encrypted.
    async fn connect(url: &str) -> Result<bool, String> {
        let params = connect_params(url)?;
        let config = params.options.config;
        let client = match params.connector {
            Connector::NoTls(tls) => {
                let (client, conn) = tokio::time::timeout(DEADLINE, config.connect(tls)).await.map_err(|_| "timed out")?.map_err(|e| describe(&e))?;
                tokio::spawn(conn);
                client
            }
            Connector::Rustls(tls) => {
                let (client, conn) = tokio::time::timeout(DEADLINE, config.connect(tls)).await.map_err(|_| "timed out")?.map_err(|e| describe(&e))?;
                tokio::spawn(conn);
                client
            }
        };
        let row = client
            .query_one("SELECT ssl FROM pg_catalog.pg_stat_ssl WHERE pid = pg_catalog.pg_backend_pid()", &[])
            .await
            .map_err(|e| describe(&e))?;
        Ok(row.get::<_, bool>("ssl"))
    }

    /// The error with its sources (the TLS reason is in the source chain).
    fn describe(e: &tokio_postgres::Error) -> String {
        let mut text = e.to_string();
        let mut next = std::error::Error::source(e);
        while let Some(source) = next {
            text.push_str(": ");
            text.push_str(&source.to_string());
            next = source.source();
        }
        text
    }

    fn ca(server: &TlsServer) -> String {
        format!("sslrootcert={}", server.ca.display())
    }

    #[tokio::test]
    async fn disable_is_refused_by_a_hostssl_only_server() {
        let server = TlsServer::shared();
        let e = connect(&server.url("localhost", "sslmode=disable")).await.expect_err("plain text must be refused");
        assert!(e.contains("no pg_hba.conf entry") && e.contains("no encryption"), "{e}");
    }

    #[tokio::test]
    async fn prefer_connects_encrypted() {
        let server = TlsServer::shared();
        assert_eq!(connect(&server.url("localhost", "sslmode=prefer")).await, Ok(true));
        // No sslmode means prefer, as in libpq.
        assert_eq!(connect(&server.url("localhost", "")).await, Ok(true));
    }

    #[tokio::test]
    async fn require_connects_encrypted_without_checking_the_certificate() {
        let server = TlsServer::shared();
        // The test CA is in no trust store, and the host name is wrong: neither is checked.
        assert_eq!(connect(&server.url("wrong.test", "sslmode=require")).await, Ok(true));
    }

    #[tokio::test]
    async fn require_with_sslrootcert_checks_the_ca_as_libpq_does() {
        let server = TlsServer::shared();
        assert_eq!(connect(&server.url("wrong.test", &format!("sslmode=require&{}", ca(server)))).await, Ok(true));
        let other = format!("sslmode=require&sslrootcert={}", server.other_ca.display());
        let e = connect(&server.url("localhost", &other)).await.expect_err("a certificate from another CA must be refused");
        assert!(e.contains("UnknownIssuer"), "{e}");
    }

    #[tokio::test]
    async fn verify_ca_accepts_the_right_ca_under_any_host_name() {
        let server = TlsServer::shared();
        let params = format!("sslmode=verify-ca&{}", ca(server));
        assert_eq!(connect(&server.url("localhost", &params)).await, Ok(true));
        assert_eq!(connect(&server.url("wrong.test", &params)).await, Ok(true));
    }

    #[tokio::test]
    async fn verify_ca_refuses_a_certificate_from_another_ca() {
        let server = TlsServer::shared();
        let params = format!("sslmode=verify-ca&sslrootcert={}", server.other_ca.display());
        let e = connect(&server.url("localhost", &params)).await.expect_err("another CA must be refused");
        assert!(e.contains("UnknownIssuer"), "{e}");
    }

    #[tokio::test]
    async fn verify_ca_without_sslrootcert_trusts_only_the_system_roots() {
        let server = TlsServer::shared();
        match connect(&server.url("localhost", "sslmode=verify-ca")).await {
            Ok(encrypted) => panic!("the test CA is no system root, yet the connection was made (encrypted: {encrypted})"),
            // Refused by the handshake, or no system roots on this machine at all: both refuse.
            Err(e) => assert!(e.contains("UnknownIssuer") || e.starts_with("no system root certificate"), "{e}"),
        }
    }

    #[tokio::test]
    async fn verify_full_accepts_the_right_ca_and_host_name() {
        let server = TlsServer::shared();
        assert_eq!(connect(&server.url("localhost", &format!("sslmode=verify-full&{}", ca(server)))).await, Ok(true));
    }

    #[tokio::test]
    async fn verify_full_refuses_a_wrong_host_name() {
        let server = TlsServer::shared();
        let e = connect(&server.url("wrong.test", &format!("sslmode=verify-full&{}", ca(server))))
            .await
            .expect_err("a certificate for localhost must not pass for wrong.test");
        assert!(e.contains("certificate not valid for name \"wrong.test\""), "{e}");
    }

    #[tokio::test]
    async fn verify_full_refuses_a_certificate_from_another_ca() {
        let server = TlsServer::shared();
        let params = format!("sslmode=verify-full&sslrootcert={}", server.other_ca.display());
        let e = connect(&server.url("localhost", &params)).await.expect_err("another CA must be refused");
        assert!(e.contains("UnknownIssuer"), "{e}");
    }

    #[tokio::test]
    async fn scram_with_channel_binding_required_works_over_each_encrypting_mode() {
        let server = TlsServer::shared();
        let scram = |host: &str, params: &str| {
            server.url(host, params).replacen("postgres@", &format!("idem_scram:{SCRAM_PASSWORD}@"), 1) + "&channel_binding=require"
        };
        for params in ["sslmode=require".to_owned(), format!("sslmode=verify-ca&{}", ca(server)), format!("sslmode=verify-full&{}", ca(server))] {
            assert_eq!(connect(&scram("localhost", &params)).await, Ok(true), "{params}");
        }
        let e = connect(&scram("localhost", "sslmode=require").replace(SCRAM_PASSWORD, "wrong")).await.expect_err("a wrong password");
        assert!(e.contains("password authentication failed"), "{e}");
    }

    #[tokio::test]
    async fn a_deadpool_pool_connects_through_the_connector() {
        // What Idempotency::connect_with does with the connector.
        use deadpool_postgres::{Manager, ManagerConfig, Pool, Runtime};
        let server = TlsServer::shared();
        let params = connect_params(&server.url("localhost", &format!("sslmode=verify-full&{}", ca(server)))).unwrap();
        let manager = match params.connector {
            Connector::NoTls(tls) => Manager::from_config(params.options.config, tls, ManagerConfig::default()),
            Connector::Rustls(tls) => Manager::from_config(params.options.config, tls, ManagerConfig::default()),
        };
        let pool = Pool::builder(manager).max_size(2).runtime(Runtime::Tokio1).wait_timeout(Some(DEADLINE)).build().unwrap();
        let client = pool.get().await.expect("a pooled TLS connection");
        let row = client.query_one("SELECT ssl FROM pg_catalog.pg_stat_ssl WHERE pid = pg_catalog.pg_backend_pid()", &[]).await.unwrap();
        assert!(row.get::<_, bool>("ssl"));
    }

    /// A handle over a deadpool pool of your own (`Idempotency::new`), made with the client's
    /// `verify-full` connector: the handle cannot read the pool's connector, so by default its
    /// cancel requests go through rustls without a certificate check, and with
    /// `Postgres::cancel_tls` through the connector given. Either way a call dropped while its
    /// closure waits for a lock this test holds has its backend ended, and its reservation
    /// rolled back, with the lock still held (0.6.0 sent the request without TLS: under
    /// `sslmode=require` or a verify mode it never left, and the backend waited for the lock).
    #[tokio::test]
    async fn a_handle_over_your_own_pool_cancels_a_dropped_call_over_tls() {
        use deadpool_postgres::{Manager, ManagerConfig, Pool, Runtime};
        use idempotency_client::{Fingerprint, Idempotency, Postgres, Settings, StoredResponse, Tx, TxFuture};
        use idempotency_testkit::server::eventually;
        let server = TlsServer::shared();
        let url = server.url("localhost", &format!("sslmode=verify-full&{}", ca(server)));
        for (lock, give_connector) in [(4_242_101_i64, false), (4_242_102, true)] {
            let params = connect_params(&url).unwrap();
            let Connector::Rustls(tls) = params.connector else { panic!("verify-full without rustls") };
            let manager = Manager::from_config(params.options.config.clone(), tls.clone(), ManagerConfig::default());
            let pool = Pool::builder(manager).max_size(1).runtime(Runtime::Tokio1).wait_timeout(Some(DEADLINE)).build().unwrap();
            let idem = if give_connector {
                Idempotency::with_driver(Postgres::new(pool).cancel_tls(tls.clone()), Settings::default())
            } else {
                Idempotency::<Postgres>::from_pool(pool, Settings::default())
            };
            let (blocker, conn) = params.options.config.connect(tls).await.expect("the blocker's session");
            tokio::spawn(conn);
            blocker.execute("SELECT pg_catalog.pg_advisory_lock($1)", &[&lock]).await.unwrap();
            let key = idempotency_testkit::unique_key("tls.cancel");
            let fp = Fingerprint::of_bytes(b"tls.cancel");
            let call = idem.run(&key, &fp, move |tx: &mut Tx| {
                Box::pin(async move {
                    tx.execute("SELECT pg_catalog.pg_advisory_xact_lock($1)", &[&lock]).await?;
                    Ok(StoredResponse::json(201, serde_json::json!({})))
                }) as TxFuture<'_, StoredResponse, tokio_postgres::Error>
            });
            // An advisory lock below 2^32 is objid in pg_locks.
            let waiting = "SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = $1::int8::oid";
            tokio::select! {
                _ = call => panic!("the call ended with the lock held"),
                _ = eventually("the call waits for the lock", DEADLINE, || async {
                    let n: i64 = blocker.query_one(waiting, &[&lock]).await.map_err(|e| e.to_string())?.get(0);
                    if n > 0 { Ok(()) } else { Err("nothing waits".to_owned()) }
                }) => {}
            }
            let what = format!("cancel_tls given: {give_connector}: the dropped call's backend ends with the lock still held");
            eventually(&what, Duration::from_secs(15), || async {
                let n: i64 = blocker.query_one(waiting, &[&lock]).await.map_err(|e| e.to_string())?.get(0);
                if n == 0 { Ok(()) } else { Err(format!("{n} waiting")) }
            })
            .await;
            let sql = "SELECT count(*) FROM idem_records WHERE operation = $1 AND user_id = $2 AND key = $3";
            let left: i64 = blocker.query_one(sql, &[&key.operation(), &key.user_id(), &key.key()]).await.unwrap().get(0);
            assert_eq!(left, 0, "cancel_tls given: {give_connector}: the dropped call's reservation was kept");
        }
    }
}
