//! `docs/architecture.md` stays true: every room in its table exists, and
//! no room's code imports (`crate::…`) a room its "may import" cell does not
//! name. Comments are not code: a doc line that names another room is fine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The table's rows: room (module name) → the rooms it may import.
fn rules(doc: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut rules = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | room | job | may import |
        let [_, room, _job, imports, _] = cells.as_slice() else {
            continue;
        };
        if !room.starts_with('`') {
            continue;
        }
        let allowed: BTreeSet<String> = ticked(imports).into_iter().map(module).collect();
        for name in ticked(room) {
            rules.insert(module(name), allowed.clone());
        }
    }
    rules
}

/// The `backticked` names of a cell.
fn ticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// `pool/` and `config.rs` → `pool`, `config`.
fn module(name: &str) -> String {
    name.trim_end_matches('/')
        .trim_end_matches(".rs")
        .to_owned()
}

/// The source files of module `room`: `<room>.rs` and everything under
/// `<room>/`.
fn files(src: &Path, room: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let file = src.join(format!("{room}.rs"));
    if file.is_file() {
        files.push(file);
    }
    let mut dirs = vec![src.join(room)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The rooms `text` imports: every `crate::<name>` outside comments.
fn imports(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

#[test]
fn every_room_imports_only_what_the_map_allows() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let src = root.join("host/src");
    let rules = rules(&doc);
    assert!(rules.len() >= 15, "the map's table was not read: {rules:?}");
    let mut wrong = Vec::new();
    for (room, allowed) in &rules {
        let files = files(&src, room);
        assert!(!files.is_empty(), "room `{room}` of the map has no code");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for import in imports(&text) {
                if import != *room && !allowed.contains(&import) {
                    wrong.push(format!(
                        "{}: imports `crate::{import}`, which room `{room}` may not",
                        file.strip_prefix(&root).unwrap_or(&file).display()
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_checker_sees_an_import_and_skips_a_comment() {
    let text = "use crate::pool::Pool; // crate::store\n/// see crate::mcp\nlet x = crate::trace::run_span();";
    assert_eq!(
        imports(text),
        ["pool", "trace"].map(String::from).into_iter().collect()
    );
    let doc = "| room | job | may import |\n|---|---|---|\n| `a.rs`, `b/` | x | `c`, `d.rs` |\n| `e.rs` | y | nothing of ours |";
    let rules = rules(doc);
    assert_eq!(
        rules["a"],
        ["c", "d"].map(String::from).into_iter().collect()
    );
    assert_eq!(rules["b"], rules["a"]);
    assert!(rules["e"].is_empty());
}
