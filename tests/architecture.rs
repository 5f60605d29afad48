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

/// The floors table's rows: room → its floor (`| 3 | `pool/`, `store/` |`).
fn floors(doc: &str) -> BTreeMap<String, u32> {
    let mut floors = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, floor, rooms, _] = cells.as_slice() else {
            continue;
        };
        let Ok(floor) = floor.parse::<u32>() else {
            continue;
        };
        for name in ticked(rooms) {
            floors.insert(module(name), floor);
        }
    }
    floors
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

/// The map says what is and no more: a room's "may import" cell names only
/// rooms its code imports, so a room cannot widen what it may reach by a
/// line in the table that nothing uses yet.
#[test]
fn every_room_imports_all_that_the_map_names() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let src = root.join("host/src");
    let mut stale = Vec::new();
    for (room, allowed) in &rules(&doc) {
        let used: BTreeSet<String> = files(&src, room)
            .iter()
            .flat_map(|file| imports(&std::fs::read_to_string(file).unwrap()))
            .collect();
        for name in allowed.difference(&used) {
            stale.push(format!(
                "room `{room}` may import `{name}` but does not: take it out of its cell"
            ));
        }
    }
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}

/// The house is layered: every room has a floor, and every room it may
/// import stands on a lower one. Widening a room's cell upward or sideways
/// fails here, whatever the code does.
#[test]
fn every_room_imports_only_rooms_below_it() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let floors = floors(&doc);
    assert!(
        floors.len() >= 20,
        "the floors table was not read: {floors:?}"
    );
    let mut wrong = Vec::new();
    for (room, allowed) in &rules(&doc) {
        let Some(&floor) = floors.get(room) else {
            wrong.push(format!("room `{room}` is on no floor"));
            continue;
        };
        for name in allowed {
            match floors.get(name) {
                Some(&below) if below < floor => {}
                Some(&other) => wrong.push(format!(
                    "room `{room}` (floor {floor}) may import `{name}` (floor {other}), which is not below it"
                )),
                None => wrong.push(format!("`{name}`, which `{room}` may import, is on no floor")),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_floors_are_read_from_their_table() {
    let doc = "| floor | rooms |\n|---|---|\n| 2 | `rpc/`, `mcp.rs` |\n| 0 | `domain/` |\n| `a.rs` | x | `c` |";
    let floors = floors(doc);
    assert_eq!(floors["rpc"], 2);
    assert_eq!(floors["mcp"], 2);
    assert_eq!(floors["domain"], 0);
    assert_eq!(floors.len(), 3);
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

/// The module path of a source file under `src`: `pool/http.rs` →
/// `["pool", "http"]`, `pool/mod.rs` → `["pool"]`, `lib.rs` → `[]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The files `text` (the code of module `at`) refers to, by module path:
/// each `super::…` and `crate::…` path, resolved to the longest prefix that
/// is a file of `modules`. Comments and the tests module (from
/// `#[cfg(test)]` on) are left out.
fn file_imports(
    text: &str,
    at: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let code = line.split("//").next().unwrap_or_default();
        for (prefix, base) in [
            ("super::", &at[..at.len().saturating_sub(1)]),
            ("crate::", &[][..]),
        ] {
            let mut rest = code;
            while let Some(i) = rest.find(prefix) {
                // Not the tail of a longer path (`self::super::`).
                let before = rest[..i].chars().last();
                rest = &rest[i + prefix.len()..];
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let mut path = base.to_vec();
                let names: Vec<&str> = rest
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                    .next()
                    .unwrap_or_default()
                    .split("::")
                    .filter(|n| !n.is_empty())
                    .collect();
                let mut best = modules.contains(&path).then(|| path.clone());
                for name in names {
                    path.push(name.to_owned());
                    if modules.contains(&path) {
                        best = Some(path.clone());
                    }
                }
                if let Some(best) = best {
                    found.insert(best);
                }
            }
        }
    }
    found
}

#[test]
fn no_two_files_import_each_other_even_through_others() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let src = root.join("host/src");
    let files = files(&src, "");
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_path(&src, f)).collect();
    // Edges between files; a file's use of an ancestor module's items (its
    // `mod.rs`) is how a room shares its own types, not a cycle.
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let at = module_path(&src, file);
        let text = std::fs::read_to_string(file).unwrap();
        let to = file_imports(&text, &at, &modules)
            .into_iter()
            .filter(|m| *m != at && !at.starts_with(m) && !m.starts_with(&at))
            .collect();
        edges.insert(at, to);
    }
    // Depth-first; a grey node reached again closes a cycle.
    fn visit(
        node: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
        cycles: &mut Vec<String>,
    ) {
        state.insert(node.clone(), 1);
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next).copied().unwrap_or(0) {
                0 => visit(next, edges, state, stack, cycles),
                1 => {
                    let from = stack.iter().position(|n| n == next).unwrap_or(0);
                    let cycle: Vec<String> = stack[from..]
                        .iter()
                        .chain([next])
                        .map(|m| m.join("::"))
                        .collect();
                    cycles.push(cycle.join(" -> "));
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.clone(), 2);
    }
    let mut state = BTreeMap::new();
    let mut cycles = Vec::new();
    for node in edges.keys() {
        if !state.contains_key(node) {
            visit(node, &edges, &mut state, &mut Vec::new(), &mut cycles);
        }
    }
    assert!(edges.len() > 50, "the files were not read: {}", edges.len());
    assert!(
        cycles.is_empty(),
        "files that import each other:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_cycle_checker_resolves_paths_to_files() {
    let modules: BTreeSet<Vec<String>> = [
        vec![],
        vec!["pool".into()],
        vec!["pool".into(), "http".into()],
        vec!["pool".into(), "oauth".into()],
    ]
    .into_iter()
    .collect();
    let at = vec!["pool".to_owned(), "http".to_owned()];
    let found = file_imports(
        "use super::oauth::OAuth;\nlet x = crate::pool::http::client(); // super::nothing\n#[cfg(test)]\nuse super::oauth::x;",
        &at,
        &modules,
    );
    assert_eq!(
        found,
        [vec!["pool".to_owned(), "oauth".to_owned()], at.clone()]
            .into_iter()
            .collect()
    );
}
