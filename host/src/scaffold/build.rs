//! `wf-host build`: builds the node in a folder by its language, with the same
//! toolchains, versions and flags as `plugins/build.sh`.
//!
//! | language | found by | build |
//! |---|---|---|
//! | Rust | `Cargo.toml` | `cargo build --release --target wasm32-wasip2` |
//! | JavaScript | `package.json` | `npm ci` once, then `jco componentize app.js --backend qjs --backend-qjs-disable-async` |
//! | Python | `app.py` | `componentize-py -d wit -w node componentize app` |
//! | C | `*.c` | `wit-bindgen c`, `clang --target=wasm32-wasi -mexec-model=reactor`, `wasm-tools component new --adapt` |
//!
//! The component is written to `<folder>/<folder name>.wasm`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::Language;

/// The toolchain versions this repository is tested with (as in `plugins/build.sh`).
const COMPONENTIZE_PY_VERSION: &str = "0.25.1";
const WIT_BINDGEN_VERSION: &str = "0.63.0";
const WASM_TOOLS_VERSION: &str = "1.263.0";

/// Why a node could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(
        "`{}` is not a node project: it has no Cargo.toml (Rust), package.json (JavaScript), app.py (Python) or .c file (C); start one with `wf-host new`",
        .0.display()
    )]
    NotAProject(PathBuf),
    #[error("`{}` has no wit/ folder; write it with `wf-host wit --out {}`", .0.display(), .0.join("wit").display())]
    NoWit(PathBuf),
    #[error("{what}; install it with:  {install}")]
    MissingTool { what: String, install: String },
    #[error("`{command}` failed ({status}){output}")]
    Failed {
        command: String,
        status: String,
        /// What the tool printed, when it was captured.
        output: String,
    },
    #[error(
        "cargo built no cdylib component; is `crate-type = [\"cdylib\"]` in `[lib]` of Cargo.toml?"
    )]
    NoArtifact,
    #[error("cannot {what} `{}`", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A built node.
#[derive(Debug)]
pub struct Built {
    pub language: Language,
    /// The component file.
    pub component: PathBuf,
    /// Its size in bytes.
    pub size: u64,
}

/// The file name `wf-host build` gives the component of the project in `dir`:
/// the folder's name with `.wasm`.
pub fn output_file(dir: &Path) -> String {
    let name = std::fs::canonicalize(dir)
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "node".to_owned());
    format!("{name}.wasm")
}

/// The language of the project in `dir`, from the files it has.
///
/// # Errors
///
/// [`BuildError::NotAProject`] when none matches.
pub fn detect(dir: &Path) -> Result<Language, BuildError> {
    if dir.join("Cargo.toml").is_file() {
        Ok(Language::Rust)
    } else if dir.join("package.json").is_file() {
        Ok(Language::Js)
    } else if dir.join("app.py").is_file() {
        Ok(Language::Python)
    } else if !c_sources(dir).is_empty() {
        Ok(Language::C)
    } else {
        Err(BuildError::NotAProject(dir.to_owned()))
    }
}

/// Builds the node in `dir` into `dir/<folder name>.wasm`. The tools' progress
/// goes to stderr.
///
/// # Errors
///
/// Not a project, a missing toolchain (with the command that installs it), or
/// a failed build step (with what the tool printed).
pub fn build(dir: &Path) -> Result<Built, BuildError> {
    let language = detect(dir)?;
    let out = dir.join(output_file(dir));
    match language {
        Language::Rust => build_rust(dir, &out)?,
        Language::Python => build_python(dir, &out)?,
        Language::Js => build_js(dir, &out)?,
        Language::C => build_c(dir, &out)?,
    }
    let size = std::fs::metadata(&out)
        .map_err(|source| BuildError::Io {
            what: "read the built component",
            path: out.clone(),
            source,
        })?
        .len();
    Ok(Built {
        language,
        component: out,
        size,
    })
}

fn build_rust(dir: &Path, out: &Path) -> Result<(), BuildError> {
    need("cargo", "cargo is not installed", || {
        "curl https://sh.rustup.rs -sSf | sh   # see https://rustup.rs".into()
    })?;
    if on_path("rustup") {
        let installed = capture(Command::new("rustup").args(["target", "list", "--installed"]))?;
        if !String::from_utf8_lossy(&installed.stdout)
            .lines()
            .any(|l| l.trim() == "wasm32-wasip2")
        {
            return Err(missing(
                "the wasm32-wasip2 target is missing",
                "rustup target add wasm32-wasip2",
            ));
        }
    }
    // The JSON messages on stdout name the artifact, wherever the target
    // directory is (CARGO_TARGET_DIR, a workspace); progress stays on stderr.
    let mut cargo = Command::new("cargo");
    cargo
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .args(["--message-format", "json-render-diagnostics"])
        .current_dir(dir);
    let output = run(&mut cargo, Stderr::Shown)?;
    let artifact = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "cdylib"))
        })
        .flat_map(|m| {
            m["filenames"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|f| f.as_str().map(PathBuf::from))
        })
        .rfind(|f| f.extension() == Some(OsStr::new("wasm")))
        .ok_or(BuildError::NoArtifact)?;
    copy(&artifact, out)
}

fn build_python(dir: &Path, out: &Path) -> Result<(), BuildError> {
    need(
        "componentize-py",
        "componentize-py is not installed",
        || format!("python3 -m pip install componentize-py=={COMPONENTIZE_PY_VERSION}"),
    )?;
    let wit = wit_dir(dir)?;
    // Run from the node's folder so that only it is on the Python path.
    let mut command = Command::new("componentize-py");
    command
        .arg("-d")
        .arg(&wit)
        .args(["-w", "node", "componentize", "app", "-o"])
        .arg(absolute(out))
        .current_dir(dir);
    run(&mut command, Stderr::Shown).map(drop)
}

fn build_js(dir: &Path, out: &Path) -> Result<(), BuildError> {
    for tool in ["node", "npm"] {
        need(tool, "node and npm are not installed", || {
            "apt-get install -y nodejs npm   # Node.js 18 or newer".into()
        })?;
    }
    let wit = wit_dir(dir)?;
    // jco is pinned by the project's package-lock.json; `npm ci` installs it
    // into node_modules/ when that is missing or older than the lock file.
    let lock = dir.join("package-lock.json");
    let installed = dir.join("node_modules/.package-lock.json");
    let stale = match (modified(&lock), modified(&installed)) {
        (_, None) => true,
        (Some(lock), Some(installed)) => lock > installed,
        (None, Some(_)) => false,
    };
    if stale {
        let install = if lock.is_file() { "ci" } else { "install" };
        let mut npm = Command::new("npm");
        npm.args([install, "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(dir);
        run(&mut npm, Stderr::Shown)?;
    }
    let jco = dir.join("node_modules/.bin/jco");
    if !jco.is_file() {
        return Err(missing(
            "jco is not in node_modules/",
            "npm install --save-dev --save-exact @bytecodealliance/jco@1.35.0",
        ));
    }
    let mut command = Command::new(absolute(&jco));
    command
        .args(["componentize", "app.js", "--wit"])
        .arg(&wit)
        .args([
            "-n",
            "node",
            "--backend",
            "qjs",
            "--backend-qjs-disable-async",
        ])
        .arg("-o")
        .arg(absolute(out))
        .current_dir(dir);
    run(&mut command, Stderr::Shown).map(drop)
}

fn build_c(dir: &Path, out: &Path) -> Result<(), BuildError> {
    let clang = clang()?;
    need("wit-bindgen", "wit-bindgen is not installed", || {
        format!(
            "cargo install --locked --no-default-features --features c wit-bindgen-cli@{WIT_BINDGEN_VERSION}"
        )
    })?;
    need("wasm-tools", "wasm-tools is not installed", || {
        format!(
            "cargo install --locked --no-default-features --features component,validate,print wasm-tools@{WASM_TOOLS_VERSION}"
        )
    })?;
    let wit = wit_dir(dir)?;
    let build = dir.join("build");
    let gen_dir = build.join("gen");
    let _ = std::fs::remove_dir_all(&gen_dir);
    std::fs::create_dir_all(&gen_dir).map_err(|source| BuildError::Io {
        what: "create",
        path: gen_dir.clone(),
        source,
    })?;
    let mut bindgen = Command::new("wit-bindgen");
    bindgen
        .args(["c"])
        .arg(&wit)
        .args(["--world", "node", "--out-dir"])
        .arg(&gen_dir);
    // It names every file it writes on stderr: kept for a failure only.
    run(&mut bindgen, Stderr::Captured)?;

    // A reactor: a library with exports and no `main`.
    let core = build.join("node.core.wasm");
    let mut cc = Command::new(&clang);
    cc.args([
        "--target=wasm32-wasi",
        "-mexec-model=reactor",
        "-Os",
        "-s",
        "-Wall",
    ])
    .arg(format!("-I{}", gen_dir.display()))
    .arg("-o")
    .arg(&core)
    .args(c_sources(dir))
    .arg(gen_dir.join("node.c"))
    .arg(gen_dir.join("node_component_type.o"));
    run(&mut cc, Stderr::Shown)?;

    // wasi-libc speaks WASI preview 1; the reactor adapter (of the host's
    // wasmtime version, embedded in wf-host) maps it to preview 2.
    let adapter = build.join("wasi_snapshot_preview1.reactor.wasm");
    std::fs::write(
        &adapter,
        wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
    )
    .map_err(|source| BuildError::Io {
        what: "write",
        path: adapter.clone(),
        source,
    })?;
    let mut component = Command::new("wasm-tools");
    component
        .args(["component", "new"])
        .arg(&core)
        .arg("--adapt")
        .arg(format!("wasi_snapshot_preview1={}", adapter.display()))
        .arg("-o")
        .arg(out);
    run(&mut component, Stderr::Shown).map(drop)
}

/// `$CC`, else `clang-16` (Debian's), else `clang`; checked to link for wasm32-wasi.
fn clang() -> Result<String, BuildError> {
    let install = "apt-get install -y clang-16 lld-16 wasi-libc libclang-rt-16-dev-wasm32";
    let clang = std::env::var("CC")
        .ok()
        .filter(|cc| !cc.is_empty())
        .or_else(|| {
            ["clang-16", "clang"]
                .into_iter()
                .find(|c| on_path(c))
                .map(str::to_owned)
        })
        .ok_or_else(|| missing("clang is not installed", install))?;
    let probe = tempfile::Builder::new()
        .suffix(".c")
        .tempfile()
        .and_then(|mut f| {
            use std::io::Write;
            f.write_all(b"int f(void) { return 0; }\n")?;
            Ok(f)
        })
        .map_err(|source| BuildError::Io {
            what: "write a probe file in",
            path: std::env::temp_dir(),
            source,
        })?;
    let linked = Command::new(&clang)
        .args([
            "--target=wasm32-wasi",
            "-mexec-model=reactor",
            "-o",
            "/dev/null",
        ])
        .arg(probe.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !linked {
        return Err(missing(
            &format!(
                "`{clang}` cannot link for wasm32-wasi (wasi-libc, lld or the wasm32 compiler-rt is missing)"
            ),
            install,
        ));
    }
    Ok(clang)
}

/// The `.c` files directly in `dir`, sorted.
fn c_sources(dir: &Path) -> Vec<PathBuf> {
    let mut sources: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension() == Some(OsStr::new("c")) && p.is_file())
        .collect();
    sources.sort();
    sources
}

fn wit_dir(dir: &Path) -> Result<PathBuf, BuildError> {
    let wit = dir.join("wit");
    if wit.is_dir() {
        Ok(absolute(&wit))
    } else {
        Err(BuildError::NoWit(dir.to_owned()))
    }
}

fn missing(what: &str, install: &str) -> BuildError {
    BuildError::MissingTool {
        what: what.to_owned(),
        install: install.to_owned(),
    }
}

fn need(tool: &str, what: &str, install: impl FnOnce() -> String) -> Result<(), BuildError> {
    if on_path(tool) {
        Ok(())
    } else {
        Err(missing(what, &install()))
    }
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            let candidate = dir.join(tool);
            std::fs::metadata(&candidate).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            })
        })
    })
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

fn modified(path: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn copy(from: &Path, to: &Path) -> Result<(), BuildError> {
    std::fs::copy(from, to)
        .map(drop)
        .map_err(|source| BuildError::Io {
            what: "copy the component to",
            path: to.to_owned(),
            source,
        })
}

fn describe(command: &Command) -> String {
    let program = Path::new(command.get_program())
        .file_name()
        .unwrap_or(command.get_program())
        .to_string_lossy()
        .into_owned();
    std::iter::once(program)
        .chain(command.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Where a build step's stderr goes: tools show their progress there.
#[derive(Clone, Copy, PartialEq)]
enum Stderr {
    Shown,
    Captured,
}

/// Runs `command` with stdout captured; a failure carries what it printed on
/// the captured streams.
fn run(command: &mut Command, stderr: Stderr) -> Result<Output, BuildError> {
    let output = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(match stderr {
            Stderr::Shown => Stdio::inherit(),
            Stderr::Captured => Stdio::piped(),
        })
        .output()
        .map_err(|source| BuildError::Io {
            what: "start",
            path: PathBuf::from(command.get_program()),
            source,
        })?;
    if output.status.success() {
        Ok(output)
    } else {
        let stdout = String::from_utf8_lossy(&output.stdout);
        // Cargo's stdout is JSON messages; its errors are on stderr already.
        let stdout = if stdout.trim_start().starts_with('{') {
            ""
        } else {
            stdout.trim()
        };
        let stderr = String::from_utf8_lossy(&output.stderr);
        let printed = [stdout, stderr.trim()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        Err(BuildError::Failed {
            command: describe(command),
            status: output.status.to_string(),
            output: if printed.is_empty() {
                String::new()
            } else {
                format!(":\n{printed}")
            },
        })
    }
}

fn capture(command: &mut Command) -> Result<Output, BuildError> {
    command
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|source| BuildError::Io {
            what: "start",
            path: PathBuf::from(command.get_program()),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_are_found_by_their_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert!(matches!(detect(dir), Err(BuildError::NotAProject(_))));
        std::fs::write(dir.join("main.c"), "").unwrap();
        assert_eq!(detect(dir).unwrap(), Language::C);
        std::fs::write(dir.join("app.py"), "").unwrap();
        assert_eq!(detect(dir).unwrap(), Language::Python);
        std::fs::write(dir.join("package.json"), "{}").unwrap();
        assert_eq!(detect(dir).unwrap(), Language::Js);
        std::fs::write(dir.join("Cargo.toml"), "").unwrap();
        assert_eq!(detect(dir).unwrap(), Language::Rust);
    }

    #[test]
    fn the_component_is_named_after_the_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("my-node");
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(output_file(&dir), "my-node.wasm");
        assert_eq!(output_file(&dir.join(".")), "my-node.wasm");
    }

    #[test]
    fn a_project_without_wit_says_how_to_get_it() {
        let tmp = tempfile::tempdir().unwrap();
        let err = wit_dir(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("wf-host wit --out"), "{err}");
    }
}
