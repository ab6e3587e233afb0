//! The certificate of `--tls-cert`/`--tls-key`, reloaded when its files change (a renewal),
//! without a restart.

use crate::settings::TlsFiles;
use axum_server::tls_rustls::RustlsConfig;
use std::time::Duration;

/// How often the certificate files are looked at for a renewal.
const TLS_RELOAD_CHECK: Duration = Duration::from_secs(2);

/// The files' modification times, to notice a renewed certificate.
fn modified(files: &TlsFiles) -> Option<(std::time::SystemTime, std::time::SystemTime)> {
    let m = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(&files.cert)?, m(&files.key)?))
}

/// Reloads the certificate when its files change (a renewal), without a restart; new
/// connections get the new one. A pair that does not load keeps the old one in service.
pub async fn reload_on_change(config: RustlsConfig, files: TlsFiles) {
    let mut seen = modified(&files);
    let mut every = tokio::time::interval(TLS_RELOAD_CHECK);
    loop {
        every.tick().await;
        let now = modified(&files);
        if now.is_none() || now == seen {
            continue;
        }
        match config.reload_from_pem_file(&files.cert, &files.key).await {
            Ok(()) => {
                seen = now;
                tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
            }
            // Half-written (the key renewed before the certificate): try again next tick.
            Err(e) => {
                tracing::warn!(error = %e, "TLS certificate not reloaded; keeping the old one")
            }
        }
    }
}
