//! TLS material from files: a connection's extra trusted roots (`ca_file`)
//! and its client certificate and key (`client_cert`, `client_key`), read and
//! checked as PEM, and the process-wide rustls provider.
//!
//! A ground floor: [`crate::config`] checks the files when it loads, and
//! [`crate::pool`] builds its HTTP clients from them. It imports nothing from
//! the crate, so neither of them has to import the other.

use std::path::PathBuf;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A connection's TLS files, resolved against the config file's directory
/// (see [`crate::config::ConnectionConfig::tls_files`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct TlsFiles {
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

/// What the TLS files hold.
pub(crate) struct TlsMaterial {
    pub(crate) roots: Vec<CertificateDer<'static>>,
    pub(crate) identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
}

/// Reads and parses the TLS files.
///
/// # Errors
/// A message naming the key and the file: missing, unreadable, or no PEM of
/// the expected kind in it.
pub fn load_tls_files(files: &TlsFiles) -> Result<(), String> {
    load(files).map(drop)
}

pub(crate) fn load(files: &TlsFiles) -> Result<TlsMaterial, String> {
    let read = |key: &str, path: &PathBuf| {
        std::fs::read(path).map_err(|e| format!("`{key}` `{}`: {e}", path.display()))
    };
    let certs = |key: &str, path: &PathBuf| -> Result<Vec<CertificateDer<'static>>, String> {
        let pem = read(key, path)?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("`{key}` `{}`: not PEM: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "`{key}` `{}`: no PEM certificate in it",
                path.display()
            ));
        }
        Ok(certs)
    };
    let roots = match &files.ca_file {
        Some(path) => certs("ca_file", path)?,
        None => Vec::new(),
    };
    let identity = match (&files.client_cert, &files.client_key) {
        (Some(cert), Some(key)) => {
            let chain = certs("client_cert", cert)?;
            let pem = read("client_key", key)?;
            let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                format!("`client_key` `{}`: no PEM private key: {e}", key.display())
            })?;
            Some((chain, key))
        }
        (Some(_), None) => return Err("`client_cert` needs `client_key`".into()),
        (None, Some(_)) => return Err("`client_key` needs `client_cert`".into()),
        (None, None) => None,
    };
    Ok(TlsMaterial { roots, identity })
}

/// Makes ring the process-wide rustls provider. Our reqwest has rustls
/// without a built-in provider (aws-lc-rs is slow to build), so every
/// `reqwest::Client` built without an explicit TLS config (rmcp's default
/// transport client, its OAuth discovery client, a test's client) needs this
/// first; the pool calls it. Idempotent.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
