//! The HTTP clients of remote connections: TLS (rustls with ring, the
//! system's roots plus a connection's `ca_file`, mTLS), keep-alive, and
//! whether they follow redirects. Used by the streamable-HTTP transport
//! (`http.rs`) and by OAuth's token requests (`oauth.rs`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::pki_types::CertificateDer;

use crate::tls::{self, TlsFiles, install_tls_provider};

/// How long an idle pooled connection is kept for reuse.
const POOL_IDLE: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The system's trusted roots, read once.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!("reading the system's trusted certificates: {e}");
        }
        found.certs
    })
}

/// An HTTP client trusting the system's roots and `files.ca_file`, presenting
/// `files.client_cert` when set.
///
/// # Errors
/// A message naming the TLS key that is wrong.
pub(crate) fn client(files: &TlsFiles) -> Result<reqwest::Client, String> {
    client_with(files, reqwest::redirect::Policy::default())
}

/// [`client`] that follows no redirect: for requests that carry a
/// credential, which a redirect would hand to another host.
///
/// # Errors
/// A message naming the TLS key that is wrong.
pub(crate) fn client_without_redirects(files: &TlsFiles) -> Result<reqwest::Client, String> {
    client_with(files, reqwest::redirect::Policy::none())
}

fn client_with(
    files: &TlsFiles,
    redirects: reqwest::redirect::Policy,
) -> Result<reqwest::Client, String> {
    install_tls_provider();
    let material = tls::load(files)?;
    let mut roots = rustls::RootCertStore::empty();
    let (_, ignored) = roots.add_parsable_certificates(system_roots().iter().cloned());
    if ignored > 0 {
        tracing::debug!(ignored, "unusable system root certificates skipped");
    }
    for cert in material.roots {
        roots
            .add(cert)
            .map_err(|e| format!("`ca_file`: unusable certificate: {e}"))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS setup: {e}"))?
    .with_root_certificates(roots);
    let mut tls = match material.identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("`client_cert`/`client_key`: {e}"))?,
        None => builder.with_no_client_auth(),
    };
    // Our reqwest speaks HTTP/1.1 only.
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(CONNECT_TIMEOUT)
        .pool_idle_timeout(POOL_IDLE)
        .redirect(redirects)
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}
