//! The `wf-host` command. See `wf-host --help`.

mod cli;

fn main() -> std::process::ExitCode {
    // Every HTTP client of the process (the pool's, OAuth's, rmcp's) uses it.
    wf_host::pool::install_tls_provider();
    match cli::run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(code) => code,
    }
}
