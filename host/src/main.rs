//! The `wf-host` command. See `wf-host --help`.

mod cli;

/// mimalloc instead of the system allocator: a run allocates and frees many
/// small objects across threads (JSON values, futures, wasm instance state),
/// where glibc's malloc spent a fifth of the cycles of a `workflow.start`
/// load test (`bench/rpc/run.sh`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // Every HTTP client of the process (the pool's, OAuth's, rmcp's) uses it.
    wf_host::pool::install_tls_provider();
    match cli::run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(code) => code,
    }
}
