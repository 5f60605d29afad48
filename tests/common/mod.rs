//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use wf_host::capability::{CapabilityBackend, NoBackend};
use wf_host::runtime::{Runtime, RuntimeConfig};

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

/// A built example node, `plugins/<name>.wasm`.
pub fn plugin(name: &str) -> PathBuf {
    let path = repo_root().join("plugins").join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing; build the guests with ./plugins/build.sh",
        path.display()
    );
    path
}

/// A built test guest, `tests/guests/<name>.wasm`.
pub fn guest(name: &str) -> PathBuf {
    let path = repo_root()
        .join("tests/guests")
        .join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing; build the guests with ./plugins/build.sh",
        path.display()
    );
    path
}

/// The `wf-host` binary built for these tests.
pub fn wf_host_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_wf-host"))
}

/// A runtime with its own empty cache directory (kept alive by the returned guard).
pub fn runtime_with(
    config: RuntimeConfig,
    backend: Arc<dyn CapabilityBackend>,
) -> (Runtime, tempfile::TempDir) {
    let cache = tempfile::tempdir().expect("temp dir");
    let config = RuntimeConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        ..config
    };
    (Runtime::new(config, backend).expect("runtime"), cache)
}

pub fn runtime() -> (Runtime, tempfile::TempDir) {
    runtime_with(RuntimeConfig::default(), Arc::new(NoBackend))
}

/// Asserts that a run succeeded, showing the guest's stdio if it did not.
pub fn expect_ok(report: &wf_host::runtime::RunReport) -> &str {
    match &report.result {
        Ok(out) => out,
        Err(e) => panic!(
            "run {} failed: {e}\n--- guest stdout ---\n{}\n--- guest stderr ---\n{}",
            report.run_id, report.stdout, report.stderr
        ),
    }
}

pub mod chaos;
pub mod fixture;
pub mod interop;
pub mod serve;

/// An HTTP client for tests. The host's reqwest has TLS with rustls but no
/// built-in crypto provider (ring is installed process-wide instead of
/// building aws-lc-rs), so a test process installs ring before its first
/// client.
pub fn http_client() -> reqwest::Client {
    wf_host::pool::install_tls_provider();
    reqwest::Client::new()
}

/// Sends `tracing` output to the test's captured output; `RUST_LOG` selects it.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}
pub mod postgres;
pub mod remote;
