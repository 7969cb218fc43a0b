//! Certificate files and trusted roots, as every TLS endpoint of the
//! gateway reads them: the uplinks, the MQTT client and the MQTT ingest
//! listener. One reader, so that all of them accept and refuse the same
//! files with the same messages. Problems are `key: path: reason`, for
//! the caller to put under its config table.

use std::path::Path;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The bytes of the file at `path`.
pub fn read(key: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{key}: {}: {e}", path.display()))
}

/// Every certificate in `pem` (read from `path`); at least one.
pub fn certificates(
    key: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{key}: {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{key}: {}: no PEM certificate in the file", path.display()));
    }
    Ok(certs)
}

/// The private key in `pem` (read from `path`).
pub fn private_key(key: &str, path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("{key}: {}: {e}", path.display()))
}

/// The server certificates to trust: every one in `ca_file`, or the
/// platform's when it is unset (logging the ones that fail to load).
pub fn trusted_roots(ca_file: Option<&Path>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in certificates("ca_file", path, &read("ca_file", path)?)? {
                roots.add(cert).map_err(|e| format!("ca_file: {}: {e}", path.display()))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for e in &native.errors {
                tracing::warn!(error = %e, "reading a platform root certificate failed");
            }
            let (added, _) = roots.add_parsable_certificates(native.certs);
            if added == 0 {
                return Err(
                    "ca_file: unset and the platform has no root certificates: set ca_file"
                        .to_owned(),
                );
            }
        }
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_without_certificates_are_refused_with_their_key_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let err = trusted_roots(Some(&path)).unwrap_err();
        assert_eq!(err, format!("ca_file: {}: no PEM certificate in the file", path.display()));
        let missing = dir.path().join("missing.pem");
        let err = trusted_roots(Some(&missing)).unwrap_err();
        assert!(err.starts_with(&format!("ca_file: {}: ", missing.display())), "{err}");
    }
}
