//! `wf-host new`, `wf-host build` and `wf-host wit`: node projects outside
//! this repository (see [`wf_host::scaffold`]).

use std::path::PathBuf;

use clap::Args;
use wf_host::scaffold::{self, BuildError, Kind, Language};

use super::{EXIT_RUN_FAILED, Failure, usage};

#[derive(Args)]
#[command(after_help = "Example:
  wf-host new python my-node && cd my-node && wf-host build
  wf-host new rust approval --durable   (a node that waits for a signal)

The project holds the node, the WIT package (wit/), a wf.toml that runs it
against the fixture MCP server, a test case (cases/), a .gitignore and a README.")]
pub(super) struct NewArgs {
    /// The language: rust, python, js or c.
    language: Language,
    /// The node's name: lowercase letters, digits and `-`, e.g. `my-node`.
    name: String,
    /// Write the project here instead of ./NAME (must not exist or be empty).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Rust: depend on the wf-sdk crate at PATH (e.g. `wf-host/sdk` of a clone)
    /// instead of a copy of it in the project.
    #[arg(long, value_name = "PATH")]
    sdk: Option<PathBuf>,
    /// A durable node instead of the echo one: it asks for approval, waits
    /// for the `approve` signal (let go meanwhile), and tells the decision.
    #[arg(long)]
    durable: bool,
}

#[derive(Args)]
#[command(after_help = "Rust: cargo build --release --target wasm32-wasip2
Python: componentize-py componentize app
JavaScript: npm ci (once), then jco componentize app.js --backend qjs
C: wit-bindgen c, clang --target=wasm32-wasi, wasm-tools component new

A missing toolchain is named with the command that installs it.")]
pub(super) struct BuildArgs {
    /// The node project's folder.
    #[arg(default_value = ".")]
    dir: PathBuf,
}

#[derive(Args)]
pub(super) struct WitArgs {
    /// Write the WIT files into this folder.
    #[arg(long, value_name = "DIR", default_value = "wit")]
    out: PathBuf,
}

pub(super) fn new(args: NewArgs) -> Result<(), Failure> {
    if args.sdk.is_some() && args.language != Language::Rust {
        return Err(usage(anyhow::anyhow!(
            "--sdk is for Rust projects; {} nodes use the WIT in wit/",
            args.language
        )));
    }
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(&args.name));
    let kind = if args.durable {
        Kind::Durable
    } else {
        Kind::Echo
    };
    let project = scaffold::new_project(args.language, kind, &args.name, &dir, args.sdk.as_deref())
        .map_err(usage)?;
    println!(
        "created {} node `{}` in {}/",
        args.language,
        args.name,
        dir.display()
    );
    println!("\nNext:");
    println!("  cd {}", dir.display());
    for command in &project.tries {
        // What it prints is the README's to say.
        let command = command.split("   # ").next().unwrap_or(command);
        println!("  {command}");
    }
    Ok(())
}

pub(super) fn build(args: BuildArgs) -> Result<(), Failure> {
    let built = scaffold::build(&args.dir).map_err(|e| match e {
        BuildError::Failed { .. } => Failure {
            code: EXIT_RUN_FAILED,
            error: e.into(),
        },
        e => usage(e),
    })?;
    eprintln!(
        "built {} ({} node, {})",
        built.component.display(),
        built.language,
        bytesize::ByteSize::b(built.size).display().si()
    );
    Ok(())
}

pub(super) fn wit(args: WitArgs) -> Result<(), Failure> {
    for path in scaffold::write_wit(&args.out).map_err(usage)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}
