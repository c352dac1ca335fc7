//! The rustls connector of an sslmode (feature `tls`): the verifier of each mode and the trusted roots.

use super::RootCerts;
#[cfg(feature = "postgres")]
use super::{Connector, SslMode};

/// The connector of `mode` with the trusted `roots` (read for the verify modes only).
#[cfg(feature = "postgres")]
pub(super) fn connector(mode: SslMode, roots: &RootCerts) -> Result<Connector, String> {
    use rustls::ClientConfig;
    use std::sync::Arc;

    if mode == SslMode::Disable {
        return Ok(Connector::NoTls(tokio_postgres::NoTls));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("the TLS provider has no usable protocol version: {e}"))?;
    let config = match mode {
        SslMode::VerifyFull => builder.with_root_certificates(root_store(roots)?).with_no_client_auth(),
        SslMode::VerifyCa => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verify::Verifier {
                roots: Some(Arc::new(root_store(roots)?)),
                provider,
            }))
            .with_no_client_auth(),
        _ => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verify::Verifier { roots: None, provider }))
            .with_no_client_auth(),
    };
    Ok(Connector::Rustls(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
}

/// The trusted roots, read now so a wrong path fails at configuration, not at every connection.
pub(super) fn root_store(roots: &RootCerts) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    let mut store = rustls::RootCertStore::empty();
    match roots {
        RootCerts::File(path) => {
            let shown = path.display();
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("sslrootcert={shown}: cannot read PEM certificates: {e}"))?;
            for cert in certs {
                store.add(cert).map_err(|e| format!("sslrootcert={shown}: not a usable CA certificate: {e}"))?;
            }
            if store.is_empty() {
                return Err(format!("sslrootcert={shown}: the file holds no certificate"));
            }
        }
        RootCerts::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
                return Err(format!(
                    "no system root certificate could be loaded for sslmode verification ({}); name a file \
                     with sslrootcert",
                    if errors.is_empty() { "none found".to_owned() } else { errors.join("; ") }
                ));
            }
        }
    }
    Ok(store)
}

#[cfg(feature = "postgres")]
mod verify {
    //! The verifier of `require` (no certificate check) and `verify-ca` (the chain, no name).
    //! Both check the handshake signature, so the server holds the certificate's key.

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, Error, RootCertStore, SignatureScheme};
    use std::sync::Arc;

    #[derive(Debug)]
    pub(super) struct Verifier {
        /// `Some` for verify-ca.
        pub(super) roots: Option<Arc<RootCertStore>>,
        pub(super) provider: Arc<CryptoProvider>,
    }

    impl ServerCertVerifier for Verifier {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            if let Some(roots) = &self.roots {
                let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
                rustls::client::verify_server_cert_signed_by_trust_anchor(
                    &cert,
                    roots,
                    intermediates,
                    now,
                    self.provider.signature_verification_algorithms.all,
                )?;
            }
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.provider.signature_verification_algorithms.supported_schemes()
        }
    }
}

