//! Writes the WASI preview1 reactor adapter to the path given as the only argument.
use wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER;

fn main() {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: wasi-reactor-adapter <OUT.wasm>");
        std::process::exit(2);
    };
    if let Err(e) = std::fs::write(&path, WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER) {
        eprintln!("cannot write {}: {e}", path.to_string_lossy());
        std::process::exit(1);
    }
}
