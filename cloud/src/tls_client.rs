//! TLS settings for the cloud's outbound connections (the proof endpoint,
//! an `https://` ClickHouse): the platform's roots, or only the CAs of a
//! configured PEM file. Each config carries its own ring provider, so
//! nothing process-wide has to be installed first.
//!
//! Reading the roots is blocking file I/O: async callers run this on the
//! blocking pool.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// A client config trusting `ca_file`'s certificates, or the platform's
/// roots when there is none; `Err` is a sentence naming `what` (the
/// setting the file came from).
pub fn client_config(what: &str, ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let problem = |e: &dyn std::fmt::Display| format!("{what} {}: {e}", path.display());
            let pem = std::fs::read(path).map_err(|e| problem(&e))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| problem(&e))?;
                roots.add(cert).map_err(|e| problem(&e))?;
            }
            if roots.is_empty() {
                return Err(problem(&"holds no PEM certificate"));
            }
        }
        None => {
            // Unreadable entries are skipped, as every TLS client does: one
            // broken file in /etc/ssl must not cut the cloud off.
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_ca_file_without_certificates_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = client_config("store.clickhouse_ca_file", Some(&empty)).unwrap_err();
        assert!(err.starts_with("store.clickhouse_ca_file "), "{err}");
        assert!(err.contains("holds no PEM certificate"), "{err}");
        let missing = dir.path().join("missing.pem");
        let err = client_config("store.clickhouse_ca_file", Some(&missing)).unwrap_err();
        assert!(err.contains("missing.pem"), "{err}");
    }

    #[test]
    fn a_ca_file_with_a_certificate_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, ca.cert.pem()).unwrap();
        assert!(client_config("store.clickhouse_ca_file", Some(&path)).is_ok());
    }
}
