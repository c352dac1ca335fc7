//! The client's imports run one way (CONTRIBUTING.md, "Layout"): among the top-level modules of
//! `client/src` (a folder counts as one module), the graph of `crate::` paths has no circle.
//! Checked by a unit test of the unit layer; the graph is read from the sources, so a new
//! circle fails it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level module of each `crate::` path in `text`: `crate::a::b` and `crate::{a::b, c}`
/// give `a` (and `c`); a name the crate root re-exports (`crate::Outcome`) gives the module it
/// comes from (`roots`). Comments and a trailing `mod tests` are not read.
fn targets(text: &str, roots: &BTreeMap<String, String>) -> BTreeSet<String> {
    let code: String = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("").lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let heads = match rest.strip_prefix('{') {
            Some(group) => top_level_items(group),
            None => vec![rest],
        };
        for head in heads {
            let name: String = head.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.insert(roots.get(&name).cloned().unwrap_or(name));
            }
        }
    }
    out
}

/// The items of a `{...}` group (`group` starts after its brace), split at its own commas.
fn top_level_items(group: &str) -> Vec<&str> {
    let (mut depth, mut start, mut items) = (0, 0, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
}

/// The names `lib.rs` re-exports (`pub use module::{A, B}` / `pub use module::A`) and the
/// top-level module each comes from.
fn root_exports(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for statement in lib.split("pub use ").skip(1) {
        let statement = statement.split(';').next().unwrap_or("");
        let module = statement.split("::").next().unwrap_or("").trim().to_owned();
        let names = match statement.split_once('{') {
            Some((_, group)) => group.trim_end_matches('}').split(',').map(str::to_owned).collect(),
            None => vec![statement.rsplit("::").next().unwrap_or("").to_owned()],
        };
        for name in names {
            let name = name.rsplit(" as ").next().unwrap_or("").trim().to_owned();
            if !name.is_empty() {
                out.insert(name, module.clone());
            }
        }
    }
    out
}

/// The graph of `src`'s top-level modules: each module's `crate::` targets among them (itself
/// left out).
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let roots = root_exports(&lib);
    let mut files = BTreeMap::<String, String>::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && path.file_name().is_some_and(|n| n != "tests.rs" && n != "lib.rs") {
                let relative = path.strip_prefix(src).expect("under src");
                let top = relative.components().next().expect("a component").as_os_str().to_string_lossy().trim_end_matches(".rs").to_owned();
                files.entry(top).or_default().push_str(&std::fs::read_to_string(&path).expect("a source file"));
            }
        }
    }
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(module, text)| {
            let to = targets(text, &roots).into_iter().filter(|t| t != module && modules.contains(t)).collect();
            (module.clone(), to)
        })
        .collect()
}

/// A circle of `graph`, if it has one (the modules on it, in order).
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(node: &str, graph: &BTreeMap<String, BTreeSet<String>>, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            return Some(path[at..].iter().cloned().chain([node.to_owned()]).collect());
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_modules_import_one_way() {
        let graph = graph(Path::new("../client/src"));
        assert!(graph.len() > 10 && graph["handle"].contains("flow"), "the graph was read: {graph:?}");
        if let Some(found) = circle(&graph) {
            panic!("an import circle in client/src: {}", found.join(" -> "));
        }
    }

    #[test]
    fn a_circle_is_found_and_paths_are_read() {
        let roots = root_exports("pub use outcome::{decision, Outcome};\npub use handle::Idempotency;");
        let text = "use crate::{flow::{self, X}, sql::Schema};\nuse crate::Outcome; // crate::ignored\nfn f() { crate::trace::call() }";
        let found: Vec<String> = targets(text, &roots).into_iter().collect();
        assert_eq!(found, ["flow", "outcome", "sql", "trace"]);
        let edges = |pairs: &[(&str, &str)]| {
            let mut g = BTreeMap::<String, BTreeSet<String>>::new();
            for (a, b) in pairs {
                g.entry((*a).to_owned()).or_default().insert((*b).to_owned());
            }
            g
        };
        assert_eq!(circle(&edges(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
        assert_eq!(circle(&edges(&[("a", "b"), ("b", "c"), ("c", "a")])), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
    }
}
