//! The `wf-host` command. See `wf-host --help`.

mod cli;

fn main() -> std::process::ExitCode {
    match cli::run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(code) => code,
    }
}
