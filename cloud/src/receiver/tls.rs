//! Certificates of the receivers: configured PEM files, or a self-signed
//! certificate made on first start and kept in the data directory, so a
//! fresh install speaks TLS from the start and gateways can pin it.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::ReceiverConfig;

pub const SELF_SIGNED_CERT: &str = "receiver-cert.pem";
const SELF_SIGNED_KEY: &str = "receiver-key.pem";

/// PEM text of the certificate chain and key, and of the client CA.
pub struct TlsMaterial {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Option<Vec<u8>>,
}

fn read(path: &Path, key: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow::anyhow!("{key} {}: {e}", path.display()))
}

impl TlsMaterial {
    pub fn load(config: &ReceiverConfig, data_dir: &Path) -> anyhow::Result<TlsMaterial> {
        let (cert_pem, key_pem) = match (&config.tls_cert_file, &config.tls_key_file) {
            (Some(cert), Some(key)) => {
                (read(cert, "receivers.tls_cert_file")?, read(key, "receivers.tls_key_file")?)
            }
            (None, None) => self_signed(data_dir)?,
            _ => anyhow::bail!("receivers: set both tls_cert_file and tls_key_file, or neither"),
        };
        let client_ca_pem = match &config.client_ca_file {
            Some(path) => Some(read(path, "receivers.client_ca_file")?),
            None => None,
        };
        let material = TlsMaterial { cert_pem, key_pem, client_ca_pem };
        // Parse once now, so a bad file is a start-up error, not a per-
        // connection one.
        material.rustls_server_config(Vec::new())?;
        Ok(material)
    }

    /// A rustls server config (QUIC uses it directly).
    pub fn rustls_server_config(&self, alpn: Vec<Vec<u8>>) -> anyhow::Result<rustls::ServerConfig> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&self.cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("receivers.tls_cert_file: {e}"))?;
        if certs.is_empty() {
            anyhow::bail!("receivers.tls_cert_file: no certificate in the file");
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem)
            .map_err(|e| anyhow::anyhow!("receivers.tls_key_file: {e}"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])?;
        let builder = match &self.client_ca_pem {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(ca) {
                    let cert =
                        cert.map_err(|e| anyhow::anyhow!("receivers.client_ca_file: {e}"))?;
                    roots.add(cert)?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(certs, key)?;
        config.alpn_protocols = alpn;
        Ok(config)
    }
}

fn self_signed(data_dir: &Path) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let cert_path = data_dir.join(SELF_SIGNED_CERT);
    let key_path = data_dir.join(SELF_SIGNED_KEY);
    if cert_path.exists() && key_path.exists() {
        return Ok((read(&cert_path, "self-signed cert")?, read(&key_path, "self-signed key")?));
    }
    std::fs::create_dir_all(data_dir)?;
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let certified = rcgen::generate_simple_self_signed(names)?;
    let cert = certified.cert.pem();
    let key = certified.signing_key.serialize_pem();
    crate::server::write_secret(&key_path, &key)?;
    std::fs::write(&cert_path, &cert)?;
    tracing::info!(cert = %cert_path.display(), "generated a self-signed receiver certificate");
    Ok((cert.into_bytes(), key.into_bytes()))
}
