//! TLS material of the uplinks: which server certificates to trust and the
//! optional client certificate, read once from PEM files at start-up.
//!
//! Both transports use rustls on ring (the workspace's one crypto
//! provider): QUIC through [`ClientTls::rustls_config`], gRPC through
//! tonic's `ClientTlsConfig` fed with the same roots and identity.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::UplinkConfig;
use crate::error::{Error, Result};
use crate::tls;

/// The client certificate chain and key for mutual TLS, as PEM and parsed.
#[derive(Debug)]
pub struct ClientIdentity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

/// What the uplinks need for TLS.
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// Trusted roots: `ca_file`, or the platform's.
    pub roots: Arc<RootCertStore>,
    pub identity: Option<Arc<ClientIdentity>>,
}

/// A problem of `crate::tls`, under the `uplink` table.
fn invalid(problem: String) -> Error {
    Error::InvalidConfig { problems: vec![format!("uplink.{problem}")] }
}

impl ClientTls {
    /// Reads `ca_file` (or the platform roots) and the client certificate.
    pub fn load(config: &UplinkConfig) -> Result<ClientTls> {
        let roots = tls::trusted_roots(config.ca_file.as_deref()).map_err(invalid)?;
        let identity = match (&config.client_cert_file, &config.client_key_file) {
            (Some(cert_path), Some(key_path)) => {
                let cert_pem = tls::read("client_cert_file", cert_path).map_err(invalid)?;
                let key_pem = tls::read("client_key_file", key_path).map_err(invalid)?;
                let certs =
                    tls::certificates("client_cert_file", cert_path, &cert_pem).map_err(invalid)?;
                let key =
                    tls::private_key("client_key_file", key_path, &key_pem).map_err(invalid)?;
                Some(Arc::new(ClientIdentity { cert_pem, key_pem, certs, key }))
            }
            _ => None,
        };
        Ok(ClientTls { roots: Arc::new(roots), identity })
    }

    /// A rustls client configuration (TLS 1.3 only) offering `alpn`.
    pub fn rustls_config(&self, alpn: Vec<Vec<u8>>) -> Result<rustls::ClientConfig> {
        let invalid = |e: rustls::Error| Error::InvalidConfig {
            problems: vec![format!("uplink: TLS configuration: {e}")],
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(invalid)?
            .with_root_certificates(Arc::clone(&self.roots));
        let mut config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some(id) => builder
                .with_client_auth_cert(id.certs.clone(), id.key.clone_key())
                .map_err(invalid)?,
        };
        config.alpn_protocols = alpn;
        Ok(config)
    }
}
