//! `wf-host auth login`: the OAuth authorization-code sign-in.

use std::path::PathBuf;

use anyhow::anyhow;

use super::{EXIT_RUN_FAILED, Failure, load_config, usage};

/// Signs in to `connection` of `config`: the authorization URL alone on the
/// first line of stdout, progress on stderr.
pub(super) async fn login(connection: String, config: PathBuf) -> Result<(), Failure> {
    let config = load_config(Some(&config))?;
    let conn = config
        .connections
        .get(&connection)
        .ok_or_else(|| usage(anyhow!("connection `{connection}` is not configured")))?;
    let tokens = config.tokens_path();
    wf_host::pool::login(&connection, conn, &config.base_dir, &tokens, |url| {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{url}");
        let _ = out.flush();
        eprintln!("Open the URL above to sign in; waiting for the redirect…");
    })
    .await
    .map_err(|e| Failure {
        code: EXIT_RUN_FAILED,
        error: anyhow!(e),
    })?;
    eprintln!(
        "signed in: tokens for `{connection}` stored in {}",
        tokens.display()
    );
    Ok(())
}
