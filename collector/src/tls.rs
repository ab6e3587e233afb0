//! TLS for `wss://` hubs: the public web PKI roots, plus a private CA's certificates when the
//! options name a file (a lab's own CA, or a test's).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::path::Path;
use std::sync::Arc;

/// The client configuration every connection of a collector uses.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_file {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("cannot read the CA file {}: {e}", path.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("the CA file {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!("no certificate in the CA file {}", path.display()));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("the CA file {}: {e}", path.display()))?;
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}
