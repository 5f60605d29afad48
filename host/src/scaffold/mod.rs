//! Node projects outside this repository: `wf-host new` writes one from a
//! template embedded in the binary, `wf-host build` builds it by its language,
//! and `wf-host wit` writes the WIT package.
//!
//! Every template is a minimal node that calls the fixture's `echo` tool
//! ([`Kind::Echo`]), or a durable one that asks for approval, waits for a
//! signal and tells the decision ([`Kind::Durable`]), with the WIT package in
//! `wit/`, a `wf.toml` that grants it `fixture.echo`, a test case in `cases/`,
//! a `.gitignore` and a README with the commands that build, run and test it.
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use wf_host::scaffold::{self, Kind, Language};
//!
//! let project =
//!     scaffold::new_project(Language::Python, Kind::Echo, "my-node", "my-node".as_ref(), None)?;
//! let built = scaffold::build(&project.dir)?;
//! println!("built {}", built.component.display()); // my-node/my-node.wasm
//! # Ok(()) }
//! ```

mod build;
mod templates;

use std::fmt;
use std::path::{Path, PathBuf};

pub use build::{BuildError, Built, build, output_file};

/// The WIT package every node is built against (`wf:node`).
pub const WIT: &[(&str, &str)] = &[("node.wit", include_str!("../../../wit/node.wit"))];

/// A language `wf-host new` has a template for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Rust,
    Python,
    Js,
    C,
}

impl Language {
    /// Every language, in the order the docs list them.
    pub const ALL: [Language; 4] = [Language::Rust, Language::Python, Language::Js, Language::C];

    /// The name on the command line: `rust`, `python`, `js`, `c`.
    pub fn name(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Python => "python",
            Language::Js => "js",
            Language::C => "c",
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Language {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "rust" | "rs" => Ok(Language::Rust),
            "python" | "py" => Ok(Language::Python),
            "js" | "javascript" => Ok(Language::Js),
            "c" => Ok(Language::C),
            _ => Err(format!(
                "no template for `{s}`; there are: rust, python, js, c"
            )),
        }
    }
}

/// What a new node does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Calls the fixture's `echo` tool with the text it gets.
    Echo,
    /// A durable node: asks for approval, waits for the `approve` signal,
    /// tells the decision.
    Durable,
}

/// Why a project or the WIT could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    #[error(
        "`{0}` is not a valid node name: use lowercase letters, digits and `-`, starting with a letter"
    )]
    InvalidName(String),
    #[error("`{}` exists and is not empty; pick another name or --dir", .0.display())]
    NotEmpty(PathBuf),
    #[error("cannot write `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--sdk `{}` is not the wf-sdk crate (no Cargo.toml naming `wf-sdk` there)", .0.display())]
    NotAnSdk(PathBuf),
}

/// A project `wf-host new` wrote.
#[derive(Debug)]
pub struct Project {
    /// The project's folder.
    pub dir: PathBuf,
    /// The file `wf-host build` writes there, e.g. `my-node.wasm`.
    pub component: String,
    /// Every file written, relative to `dir`.
    pub files: Vec<PathBuf>,
    /// The commands that build, run and test it, as its README gives them.
    pub tries: Vec<String>,
}

/// Writes a new node project for `language` named `name` into `dir`, which
/// must not exist or be empty. For Rust, the SDK is copied into `wf-sdk/`
/// unless `sdk` names a wf-sdk crate to depend on by path instead.
///
/// # Errors
///
/// An invalid name, a non-empty `dir`, an `sdk` that is not wf-sdk, or a file
/// that cannot be written.
pub fn new_project(
    language: Language,
    kind: Kind,
    name: &str,
    dir: &Path,
    sdk: Option<&Path>,
) -> Result<Project, ScaffoldError> {
    check_name(name)?;
    if std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(ScaffoldError::NotEmpty(dir.to_owned()));
    }
    let sdk = sdk.map(sdk_dependency).transpose()?;
    let component = output_file(dir);
    let vars = templates::Vars {
        name,
        file: component.trim_end_matches(".wasm"),
        sdk: sdk.as_deref(),
    };
    let mut files = Vec::new();
    for (path, text) in templates::files(language, kind, &vars) {
        write(&dir.join(&path), &text)?;
        files.push(path);
    }
    Ok(Project {
        dir: dir.to_owned(),
        tries: kind.tries(vars.file),
        component,
        files,
    })
}

/// Writes the WIT package into `dir` (created if needed); returns the files.
///
/// # Errors
///
/// A file that cannot be written.
pub fn write_wit(dir: &Path) -> Result<Vec<PathBuf>, ScaffoldError> {
    WIT.iter()
        .map(|(name, text)| {
            let path = dir.join(name);
            write(&path, text)?;
            Ok(path)
        })
        .collect()
}

fn write(path: &Path, text: &str) -> Result<(), ScaffoldError> {
    let err = |source| ScaffoldError::Write {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    std::fs::write(path, text).map_err(err)
}

/// A name that is valid for a Cargo package, an npm package and a workflow.
fn check_name(name: &str) -> Result<(), ScaffoldError> {
    let ok = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(ScaffoldError::InvalidName(name.to_owned()))
    }
}

/// `--sdk PATH`: the absolute path of a wf-sdk crate, for a path dependency.
fn sdk_dependency(path: &Path) -> Result<String, ScaffoldError> {
    let not_sdk = || ScaffoldError::NotAnSdk(path.to_owned());
    let manifest = std::fs::read_to_string(path.join("Cargo.toml")).map_err(|_| not_sdk())?;
    let manifest: toml::Table = manifest.parse().map_err(|_| not_sdk())?;
    let name = manifest
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str());
    if name != Some("wf-sdk") {
        return Err(not_sdk());
    }
    let path = std::fs::canonicalize(path).map_err(|_| not_sdk())?;
    Ok(path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["my-node", "a", "node2", "snake_case"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "My-Node", "2node", "-x", "a b", "a/b", "../x"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_language_writes_a_complete_project() {
        for language in Language::ALL {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("hello-node");
            let project = new_project(language, Kind::Echo, "hello-node", &dir, None).unwrap();
            assert_eq!(project.component, "hello-node.wasm");
            for file in [
                "README.md",
                ".gitignore",
                "wf.toml",
                "cases/echo.toml",
                "wit/node.wit",
            ] {
                assert!(dir.join(file).is_file(), "{language}: {file}");
            }
            for file in &project.files {
                let text = std::fs::read_to_string(dir.join(file)).unwrap();
                assert!(
                    !text.contains("{{"),
                    "{language}: {} keeps a placeholder",
                    file.display()
                );
            }
            let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
            assert!(readme.contains("wf-host build"), "{language}");
            assert!(readme.contains("wf-host run hello-node.wasm"), "{language}");
            assert!(
                readme.contains("wf-host test hello-node.wasm"),
                "{language}"
            );
            // A second `new` into the same folder refuses.
            assert!(matches!(
                new_project(language, Kind::Echo, "hello-node", &dir, None),
                Err(ScaffoldError::NotEmpty(_))
            ));
        }
    }

    #[test]
    fn every_language_writes_a_durable_project() {
        for language in Language::ALL {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("ok");
            let project = new_project(language, Kind::Durable, "ok", &dir, None).unwrap();
            assert!(dir.join("cases/approved.toml").is_file());
            assert!(!dir.join("cases/echo.toml").exists());
            let case: toml::Table = std::fs::read_to_string(dir.join("cases/approved.toml"))
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(case["signals"]["approve"]["approved"].as_bool(), Some(true));
            let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
            assert!(readme.contains("durable node"), "{language}: {readme}");
            assert!(!readme.contains("{{"), "{language}: {readme}");
            for command in &project.tries {
                assert!(readme.contains(command.as_str()), "{language}: {command}");
            }
            assert_eq!(
                project.tries,
                [
                    "wf-host build",
                    "wf-host test ok.wasm --case cases/approved.toml"
                ]
            );
        }
    }

    #[test]
    fn the_rust_template_has_the_sdk_and_a_small_release_profile() {
        let tmp = tempfile::tempdir().unwrap();
        new_project(Language::Rust, Kind::Echo, "tiny", tmp.path(), None).unwrap();
        let manifest: toml::Table = std::fs::read_to_string(tmp.path().join("Cargo.toml"))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(manifest["package"]["name"].as_str(), Some("tiny"));
        assert_eq!(
            manifest["profile"]["release"]["opt-level"].as_str(),
            Some("s")
        );
        assert_eq!(
            manifest["dependencies"]["wf-sdk"]["path"].as_str(),
            Some("wf-sdk")
        );
        let sdk = std::fs::read_to_string(tmp.path().join("wf-sdk/src/lib.rs")).unwrap();
        assert_eq!(sdk, include_str!("../../../sdk/src/lib.rs"));
        // The copy depends on what the real SDK depends on.
        let copy: toml::Table = std::fs::read_to_string(tmp.path().join("wf-sdk/Cargo.toml"))
            .unwrap()
            .parse()
            .unwrap();
        let real: toml::Table = include_str!("../../../sdk/Cargo.toml").parse().unwrap();
        assert_eq!(
            copy["dependencies"]["wit-bindgen"],
            real["dependencies"]["wit-bindgen"]
        );
    }

    /// The Rust template pins the crates the example nodes are built and
    /// tested with (`plugins/Cargo.lock`), so a new node builds with them and
    /// reuses their compiled artifacts in a shared target directory.
    #[test]
    fn the_rust_template_locks_the_versions_the_plugins_use() {
        let versions = |lock: &str| -> std::collections::BTreeMap<String, String> {
            let lock: toml::Table = lock.parse().unwrap();
            lock["package"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p.get("source").is_some())
                .map(|p| {
                    let field = |k: &str| p[k].as_str().unwrap().to_owned();
                    (field("name"), field("version"))
                })
                .collect()
        };
        let template = versions(include_str!("../../templates/rust/Cargo.lock.tmpl"));
        let plugins = versions(include_str!("../../../plugins/Cargo.lock"));
        assert_eq!(
            template, plugins,
            "regenerate host/templates/rust/Cargo.lock.tmpl from plugins/Cargo.lock"
        );
    }

    #[test]
    fn sdk_option_makes_a_path_dependency() {
        let tmp = tempfile::tempdir().unwrap();
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk");
        new_project(Language::Rust, Kind::Echo, "tiny", tmp.path(), Some(&sdk)).unwrap();
        let manifest = std::fs::read_to_string(tmp.path().join("Cargo.toml")).unwrap();
        let expected = std::fs::canonicalize(&sdk).unwrap();
        assert!(manifest.contains(&format!("path = {:?}", expected.display().to_string())));
        assert!(!tmp.path().join("wf-sdk").exists());
        assert!(matches!(
            new_project(
                Language::Rust,
                Kind::Echo,
                "x",
                &tmp.path().join("other"),
                Some(tmp.path())
            ),
            Err(ScaffoldError::NotAnSdk(_))
        ));
    }
}
