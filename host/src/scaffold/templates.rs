//! The project templates, embedded in the binary: `host/templates/<language>/`
//! plus the files every language shares (`host/templates/common/`, the WIT).
//! `{{name}}` is the node's name, `{{file}}` the component's file stem; the
//! README's `{{does}}`, `{{try}}` and `{{notes}}` are the [`Kind`]'s.

use std::path::PathBuf;

use super::{Kind, Language, WIT};

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
const COMMON: &[(&str, &str)] = &[("wf.toml", template!("common/wf.toml"))];

/// What a kind of node does, how it is tried, and its test case.
struct KindFiles {
    /// The README's sentence on what the node does.
    does: &'static str,
    /// The README's commands (and `wf-host new`'s next steps).
    tries: &'static [&'static str],
    /// The README's notes on those commands.
    notes: &'static str,
    case: (&'static str, &'static str),
}

const ECHO: KindFiles = KindFiles {
    does: "calls the\nMCP tool `echo` of the connection `fixture` with the text it gets.",
    tries: &[
        "wf-host build",
        "wf-host run {{file}}.wasm --config wf.toml --input '{\"text\": \"hi\"}'   # prints {\"echoed\":\"hi\"}",
        "wf-host test {{file}}.wasm --case cases/echo.toml",
    ],
    notes: "- `wf-host run` runs the node once. `wf.toml` starts the fixture MCP server
  that ships inside `wf-host` and grants the node `fixture.echo`: a node
  reaches nothing unless granted.
- `wf-host test` runs each case file in `cases/` against a fresh fixture
  server and checks the output and the tool calls the node made.",
    case: ("cases/echo.toml", template!("common/echo.toml")),
};

const DURABLE: KindFiles = KindFiles {
    does: "is a durable node:\nit asks for approval (a call to `fixture.echo`), waits for the `approve`\nsignal, then tells the decision (a second call). While it waits, the host\nlets go of it; a restart does not lose it.",
    tries: &[
        "wf-host build",
        "wf-host test {{file}}.wasm --case cases/approved.toml",
    ],
    notes: "- `wf-host test` runs each case file in `cases/` against a fresh fixture
  server and checks the output and the tool calls the node made. The case
  answers the node's wait: `[signals]` gives the `approve` signal's payload.
- In a workflow, `wf-host serve --config wf.toml` runs it: start the workflow
  `{{name}}` with `workflow.start` (input `{\"request\": \"the release\"}`), and
  its step waits for `approve`, which `workflow.signal` (or the console's
  Approve button) sends. `wf.toml` starts the fixture MCP server that ships
  inside `wf-host` and grants the node `fixture.echo`: a node reaches
  nothing unless granted.",
    case: ("cases/approved.toml", template!("common/approved.toml")),
};

impl Kind {
    fn files(self) -> &'static KindFiles {
        match self {
            Kind::Echo => &ECHO,
            Kind::Durable => &DURABLE,
        }
    }

    /// The commands that build, run and test the new node, as its README
    /// gives them.
    pub(super) fn tries(self, file: &str) -> Vec<String> {
        self.files()
            .tries
            .iter()
            .map(|c| c.replace("{{file}}", file))
            .collect()
    }
}

/// A language's node source: its path, and its text for each [`Kind`].
struct Source {
    path: &'static str,
    echo: &'static str,
    durable: &'static str,
}

const RUST_SOURCE: Source = Source {
    path: "src/lib.rs",
    echo: template!("rust/src/lib.rs"),
    durable: template!("rust/src/durable.rs"),
};

const RUST: &[(&str, &str)] = &[
    ("Cargo.toml", template!("rust/Cargo.toml.tmpl")),
    ("Cargo.lock", template!("rust/Cargo.lock.tmpl")),
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

const PYTHON_SOURCE: Source = Source {
    path: "app.py",
    echo: template!("python/app.py"),
    durable: template!("python/durable.py"),
};

const PYTHON: &[(&str, &str)] = &[
    (".gitignore", template!("python/gitignore")),
    ("README.md", template!("python/README.md")),
];

const JS_SOURCE: Source = Source {
    path: "app.js",
    echo: template!("js/app.js"),
    durable: template!("js/durable.js"),
};

const JS: &[(&str, &str)] = &[
    ("package.json", template!("js/package.json")),
    ("package-lock.json", template!("js/package-lock.json")),
    (".gitignore", template!("js/gitignore")),
    ("README.md", template!("js/README.md")),
];

const C_SOURCE: Source = Source {
    path: "app.c",
    echo: template!("c/app.c"),
    durable: template!("c/durable.c"),
};

const C: &[(&str, &str)] = &[
    (".gitignore", template!("c/gitignore")),
    ("README.md", template!("c/README.md")),
];

const SDK_COPY: &str = "# The wf-host SDK, copied into this project by `wf-host new` (it reads the WIT\n\
                        # in wit/), so the project builds without a clone of wf-host.\n\
                        wf-sdk = { path = \"wf-sdk\" }";

/// The files of a `language` project of `kind`: relative path and contents.
pub(super) fn files(language: Language, kind: Kind, vars: &Vars<'_>) -> Vec<(PathBuf, String)> {
    let (own, source) = match language {
        Language::Rust => (RUST, RUST_SOURCE),
        Language::Python => (PYTHON, PYTHON_SOURCE),
        Language::Js => (JS, JS_SOURCE),
        Language::C => (C, C_SOURCE),
    };
    let node = match kind {
        Kind::Echo => (source.path, source.echo),
        Kind::Durable => (source.path, source.durable),
    };
    let kind = kind.files();
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
        .chain([&node, &kind.case])
        .chain(COMMON)
        .chain(sdk)
        .map(|(path, text)| ((*path).to_owned(), *text))
        .chain(wit)
        .map(|(path, text)| {
            let text = text
                .replace("{{does}}", kind.does)
                .replace("{{try}}", &kind.tries.join("\n"))
                .replace("{{notes}}", kind.notes)
                .replace("{{name}}", vars.name)
                .replace("{{file}}", vars.file)
                .replace("{{sdk}}", &sdk_dependency)
                .replace("{{sdk_version}}", env!("CARGO_PKG_VERSION"));
            (PathBuf::from(path), text)
        })
        .collect()
}
