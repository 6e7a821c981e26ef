//! The shape ARCHITECTURE.md promises for this crate, checked on its sources: no file over
//! 500 lines, no circle of imports between its modules (nor between the coordinator's),
//! and modules import their neighbours by path, never through the crate root's re-exports.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn sources() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = fs::read_to_string(&path).unwrap();
                out.push((path, text));
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut out);
    assert!(out.len() > 20, "the sources were found");
    out
}

/// `src/coordinator/drive.rs` → `["coordinator", "drive"]`; `mod.rs` names its folder.
fn module_of(path: &Path) -> Vec<String> {
    let rel = path
        .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
        .unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and without its test module.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names that follow `prefix` (`crate::`, `super::`) in `code`.
fn references<'a>(code: &'a str, prefix: &str) -> impl Iterator<Item = &'a str> {
    code.match_indices(prefix).map(move |(i, _)| {
        let rest = &code[i + prefix.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        &rest[..end]
    })
}

/// A circle in `graph`, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_source_file_is_over_500_lines() {
    let long: Vec<String> = sources()
        .iter()
        .filter(|(_, text)| text.lines().count() > 500)
        .map(|(p, text)| format!("{} ({} lines)", p.display(), text.lines().count()))
        .collect();
    assert!(long.is_empty(), "{long:?}");
}

#[test]
fn the_modules_import_one_another_without_a_circle() {
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut coordinator: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in sources() {
        let module = module_of(&path);
        if module == ["lib"] {
            continue;
        }
        let code = code(&text);
        let own = module[0].clone();
        let uses = top.entry(own.clone()).or_default();
        for name in references(&code, "crate::") {
            if name != own && name.starts_with(|c: char| c.is_ascii_lowercase()) {
                uses.insert(name.to_string());
            }
        }
        // Inside the coordinator: its files' imports of one another (`super::x`).
        if own == "coordinator" && module.len() == 2 {
            let uses = coordinator.entry(module[1].clone()).or_default();
            for name in references(&code, "super::") {
                if name.starts_with(|c: char| c.is_ascii_lowercase()) {
                    uses.insert(name.to_string());
                }
            }
        }
    }
    assert!(
        top.len() > 10 && coordinator.len() > 4,
        "{top:?} {coordinator:?}"
    );
    assert_eq!(circle(&top), None, "a circle between the crate's modules");
    assert_eq!(
        circle(&coordinator),
        None,
        "a circle between the coordinator's files"
    );
}

#[test]
fn modules_import_their_neighbours_by_path_not_through_the_root() {
    let through_root: Vec<String> = sources()
        .iter()
        .filter(|(p, _)| module_of(p) != ["lib"])
        .flat_map(|(p, text)| {
            references(&code(text), "crate::")
                .filter(|name| {
                    name.is_empty() || name.starts_with(|c: char| c.is_ascii_uppercase())
                })
                .map(|name| format!("{}: crate::{name}", p.display()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(through_root.is_empty(), "{through_root:?}");
}

/// The checks can fail: a circle is found where there is one.
#[test]
fn a_circle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), ["b".to_string()].into()),
        ("b".to_string(), ["c".to_string()].into()),
        ("c".to_string(), ["a".to_string()].into()),
    ]
    .into();
    assert_eq!(
        circle(&graph).unwrap(),
        ["a", "b", "c", "a"].map(String::from)
    );
}
