//! The project templates, embedded in the binary: `host/templates/<language>/`
//! plus the files every language shares (`host/templates/common/`, the WIT).
//! `{{name}}` is the node's name, `{{file}}` the component's file stem.

use std::path::PathBuf;

use super::{Language, WIT};

/// What the placeholders stand for.
pub(super) struct Vars<'a> {
    pub name: &'a str,
    pub file: &'a str,
    /// `--sdk`: the absolute path of a wf-sdk crate to depend on (Rust).
    pub sdk: Option<&'a str>,
}

macro_rules! template {
    ($path:literal) => {
        include_str!(concat!("../../templates/", $path))
    };
}

/// The files every project gets (the WIT is added from [`WIT`]).
const COMMON: &[(&str, &str)] = &[
    ("wf.toml", template!("common/wf.toml")),
    ("cases/echo.toml", template!("common/echo.toml")),
];

const RUST: &[(&str, &str)] = &[
    ("Cargo.toml", template!("rust/Cargo.toml.tmpl")),
    ("Cargo.lock", template!("rust/Cargo.lock.tmpl")),
    ("src/lib.rs", template!("rust/src/lib.rs")),
    (".gitignore", template!("rust/gitignore")),
    ("README.md", template!("rust/README.md")),
];

/// The SDK, copied into Rust projects unless `--sdk` points at one.
const RUST_SDK: &[(&str, &str)] = &[
    (
        "wf-sdk/Cargo.toml",
        template!("rust/wf-sdk/Cargo.toml.tmpl"),
    ),
    ("wf-sdk/src/lib.rs", include_str!("../../../sdk/src/lib.rs")),
];

const PYTHON: &[(&str, &str)] = &[
    ("app.py", template!("python/app.py")),
    (".gitignore", template!("python/gitignore")),
    ("README.md", template!("python/README.md")),
];

const JS: &[(&str, &str)] = &[
    ("app.js", template!("js/app.js")),
    ("package.json", template!("js/package.json")),
    ("package-lock.json", template!("js/package-lock.json")),
    (".gitignore", template!("js/gitignore")),
    ("README.md", template!("js/README.md")),
];

const C: &[(&str, &str)] = &[
    ("app.c", template!("c/app.c")),
    (".gitignore", template!("c/gitignore")),
    ("README.md", template!("c/README.md")),
];

const SDK_COPY: &str = "# The wf-host SDK, copied into this project by `wf-host new` (it reads the WIT\n\
                        # in wit/), so the project builds without a clone of wf-host.\n\
                        wf-sdk = { path = \"wf-sdk\" }";

/// The files of a `language` project: relative path and contents.
pub(super) fn files(language: Language, vars: &Vars<'_>) -> Vec<(PathBuf, String)> {
    let own = match language {
        Language::Rust => RUST,
        Language::Python => PYTHON,
        Language::Js => JS,
        Language::C => C,
    };
    let sdk = match (language, vars.sdk) {
        (Language::Rust, None) => RUST_SDK,
        _ => &[],
    };
    let sdk_dependency = match vars.sdk {
        Some(path) => format!("wf-sdk = {{ path = {} }}", toml::Value::from(path)),
        None => SDK_COPY.to_owned(),
    };
    let wit = WIT
        .iter()
        .map(|(name, text)| (format!("wit/{name}"), *text));
    own.iter()
        .chain(COMMON)
        .chain(sdk)
        .map(|(path, text)| ((*path).to_owned(), *text))
        .chain(wit)
        .map(|(path, text)| {
            let text = text
                .replace("{{name}}", vars.name)
                .replace("{{file}}", vars.file)
                .replace("{{sdk}}", &sdk_dependency)
                .replace("{{sdk_version}}", env!("CARGO_PKG_VERSION"));
            (PathBuf::from(path), text)
        })
        .collect()
}
