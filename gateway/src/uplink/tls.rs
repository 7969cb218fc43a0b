//! TLS material of the uplinks: which server certificates to trust and the
//! optional client certificate, read once from PEM files at start-up.
//!
//! Both transports use rustls on ring (the workspace's one crypto
//! provider): QUIC through [`ClientTls::rustls_config`], gRPC through
//! tonic's `ClientTlsConfig` fed with the same roots and identity.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::UplinkConfig;
use crate::error::{Error, Result};

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

fn problem(key: &str, path: &Path, why: impl std::fmt::Display) -> Error {
    Error::InvalidConfig { problems: vec![format!("uplink.{key}: {}: {why}", path.display())] }
}

fn read(key: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| problem(key, path, e))
}

fn certs(key: &str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| problem(key, path, e))?;
    if certs.is_empty() {
        return Err(problem(key, path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

impl ClientTls {
    /// Reads `ca_file` (or the platform roots) and the client certificate.
    pub fn load(config: &UplinkConfig) -> Result<ClientTls> {
        let mut roots = RootCertStore::empty();
        match &config.ca_file {
            Some(path) => {
                let pem = read("ca_file", path)?;
                for cert in certs("ca_file", path, &pem)? {
                    roots.add(cert).map_err(|e| problem("ca_file", path, e))?;
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                for e in &native.errors {
                    tracing::warn!(error = %e, "reading a platform root certificate failed");
                }
                let (added, _) = roots.add_parsable_certificates(native.certs);
                if added == 0 {
                    return Err(Error::InvalidConfig {
                        problems: vec![
                            "uplink.ca_file: unset and the platform has no root certificates: \
                             set ca_file"
                                .to_owned(),
                        ],
                    });
                }
            }
        }
        let identity = match (&config.client_cert_file, &config.client_key_file) {
            (Some(cert_path), Some(key_path)) => {
                let cert_pem = read("client_cert_file", cert_path)?;
                let key_pem = read("client_key_file", key_path)?;
                let certs = certs("client_cert_file", cert_path, &cert_pem)?;
                let key = PrivateKeyDer::from_pem_slice(&key_pem)
                    .map_err(|e| problem("client_key_file", key_path, e))?;
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
