//! Imports run one way (CONTRIBUTING.md, "Layout"), in every crate of the workspace that has a
//! `src/` (the members of the root Cargo.toml, so a new crate is covered when it is added):
//! among the modules of each folder (the crate's top-level modules, and the files of every
//! folder below), the graph of paths has no circle. A path is `crate::..`, `super::..` (any
//! number of them) or `self::..`, in a `use` or in the code, and it leads to the deepest module
//! it names, through the names a module brings in with `use` (`pub use core::Reply` in
//! `layer/mod.rs` makes `super::Reply` a path to `layer::core`). A reference from a module into
//! a sibling's subtree is an edge between the two siblings; a module's references to its own
//! ancestors or descendants are not edges (a folder's `mod.rs` declares its children). Checked
//! by a unit test of the unit layer; the graph is read from the sources, so a new circle fails
//! it. Comments, a trailing `mod tests` and files named `tests.rs` are not read; an inline
//! `mod` is read as part of its file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The edges of circles the check tolerates for now, each `(crate, from, to)`: one edge of each
/// circle, the one that points down the order the folder is meant to have. An entry whose edge
/// no longer exists fails the check, so none outlives its edge.
const ALLOWED: &[(&str, &str, &str)] = &[
    // Found when the check began to follow `super::` and to read every crate (0.7.0), not yet
    // untangled: tls/rustls_connector.rs builds the `Connector` that tls/postgres.rs defines and
    // postgres.rs calls rustls_connector's `connector`.
    ("idempotency-client", "tls::rustls_connector", "tls::postgres"),
    // The extension: args.rs (whose `raise` encoding, metrics, fingerprint and native use)
    // calls encoding's readers and native::call's `v1_function_info`; vacuum.rs uses
    // worker/handshake.rs while worker.rs calls vacuum's `after_sweep`.
    ("idempotency", "args", "encoding"),
    ("idempotency", "args", "native"),
    ("idempotency", "vacuum", "worker"),
];

/// Where the start of a path leads: `crate`, `super` repeated n times, or `self`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Base {
    Crate,
    Super(usize),
    Current,
}

/// A path: where it starts and the names after it (`super::core::Reply`: `Super(1)`,
/// `["core", "Reply"]`).
type PathRef = (Base, Vec<String>);

/// One crate's modules: each module's path (`""` the root, `layer`, `layer::core`) and its code.
type Modules = BTreeMap<String, String>;

/// An edge between two sibling modules, and the crate it is in.
type Edge = (String, String, String);

/// The code of a source file without its comments and its trailing `mod tests`.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The identifier at the start of `s` (after spaces) and what follows it.
fn ident(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
    (&s[..end], &s[end..])
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

/// Every path a use tree `s` names, each with the name it brings into scope (its last name, its
/// `as` name, or the prefix's last name for `self` in a group; `None` for a glob):
/// `a::{b::{self, C}, d as e}` → `[a, b] b`, `[a, b, C] C`, `[a, d] e`.
fn expand(s: &str) -> Vec<(Vec<String>, Option<String>)> {
    let (first, rest) = ident(s);
    if first.is_empty() {
        return vec![];
    }
    let rest = rest.trim_start();
    let Some(after) = rest.strip_prefix("::") else {
        let alias = rest.strip_prefix("as ").map(|r| ident(r).0.to_owned());
        let name = if first == "self" { None } else { Some(alias.unwrap_or_else(|| first.to_owned())) };
        let path = if first == "self" { vec![] } else { vec![first.to_owned()] };
        return vec![(path, name)];
    };
    let after = after.trim_start();
    let tails = if let Some(group) = after.strip_prefix('{') {
        top_level_items(group).into_iter().flat_map(expand_in_group).collect()
    } else if after.starts_with('*') {
        vec![(vec![], None)]
    } else {
        expand(after)
    };
    tails
        .into_iter()
        .map(|(tail, name)| {
            let name = name.or_else(|| tail.is_empty().then(|| first.to_owned()).filter(|_| !after.starts_with('*')));
            (std::iter::once(first.to_owned()).chain(tail).collect(), name)
        })
        .collect()
}

/// [`expand`] of an item of a group, where `self` names the prefix itself.
fn expand_in_group(item: &str) -> Vec<(Vec<String>, Option<String>)> {
    let (first, rest) = ident(item);
    if first == "self" {
        let alias = rest.trim_start().strip_prefix("as ").map(|r| ident(r).0.to_owned());
        return vec![(vec![], alias)];
    }
    if item.trim_start().starts_with('*') {
        return vec![(vec![], None)];
    }
    expand(item)
}

/// A path's start (`crate`, `super::super`, `self`, or a child module's name of `children`) and
/// the names after it; `None` for another crate's path.
fn based(path: &[String], children: &BTreeSet<String>) -> Option<PathRef> {
    let supers = path.iter().take_while(|s| *s == "super").count();
    match path.first().map(String::as_str) {
        Some("crate") => Some((Base::Crate, path[1..].to_vec())),
        Some("self") => Some((Base::Current, path[1..].to_vec())),
        Some("super") => Some((Base::Super(supers), path[supers..].to_vec())),
        Some(first) if children.contains(first) => Some((Base::Current, path.to_vec())),
        _ => None,
    }
}

/// The names a module's `use` statements bring into scope, each with its path.
fn uses(code: &str, children: &BTreeSet<String>) -> BTreeMap<String, PathRef> {
    let mut out = BTreeMap::new();
    for (i, _) in code.match_indices("use ") {
        if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let statement = code[i + "use ".len()..].split(';').next().unwrap_or("");
        for (path, name) in expand(statement.trim_start_matches("::")) {
            if let (Some(based), Some(name)) = (based(&path, children), name) {
                out.insert(name, based);
            }
        }
    }
    out
}

/// Every path in `code` that starts with `crate`, `super` or `self` (a `$crate` too), in a `use`
/// or anywhere else.
fn references(code: &str) -> Vec<PathRef> {
    let mut out = Vec::new();
    let no = BTreeSet::new();
    for start in ["crate::", "super::", "self::"] {
        for (i, _) in code.match_indices(start) {
            let before = code[..i].trim_end();
            if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') || before.ends_with("::") {
                continue;
            }
            out.extend(expand(&code[i..]).into_iter().filter_map(|(path, _)| based(&path, &no)));
        }
    }
    out
}

/// The module's path joined with a name.
fn join(module: &str, name: &str) -> String {
    if module.is_empty() {
        name.to_owned()
    } else {
        format!("{module}::{name}")
    }
}

/// The module `n` levels above `module` (the root above the top).
fn ancestor(module: &str, n: usize) -> String {
    let segments: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
    segments[..segments.len().saturating_sub(n)].join("::")
}

/// The crate's view used to resolve paths: its modules, each module's children and its names
/// brought in by `use`.
struct Resolver<'a> {
    modules: &'a Modules,
    uses: BTreeMap<String, BTreeMap<String, PathRef>>,
}

impl<'a> Resolver<'a> {
    fn new(modules: &'a Modules) -> Self {
        let uses = modules.iter().map(|(m, code)| (m.clone(), uses(code, &children(modules, m)))).collect();
        Resolver { modules, uses }
    }

    /// The deepest module `path`, seen from module `from`, leads to.
    fn resolve(&self, from: &str, path: &PathRef, depth: u32) -> String {
        let (base, names) = path;
        let mut at = match base {
            Base::Crate => String::new(),
            Base::Super(n) => ancestor(from, *n),
            Base::Current => from.to_owned(),
        };
        for (i, name) in names.iter().enumerate() {
            let child = join(&at, name);
            if self.modules.contains_key(&child) {
                at = child;
                continue;
            }
            if let Some((b, p)) = self.uses.get(&at).and_then(|u| u.get(name)).filter(|_| depth < 8) {
                let through: PathRef = (*b, p.iter().chain(&names[i + 1..]).cloned().collect());
                return self.resolve(&at, &through, depth + 1);
            }
            break;
        }
        at
    }
}

/// The names of `module`'s child modules.
fn children(modules: &Modules, module: &str) -> BTreeSet<String> {
    let prefix = if module.is_empty() { String::new() } else { format!("{module}::") };
    modules.keys().filter_map(|m| m.strip_prefix(&prefix)).filter(|rest| !rest.is_empty() && !rest.contains("::")).map(str::to_owned).collect()
}

/// The modules of the crate whose sources are `src` (`lib.rs`, else `main.rs`, is the root;
/// `src/bin` holds other crates).
fn modules(src: &Path) -> Modules {
    let root = if src.join("lib.rs").exists() { "lib.rs" } else { "main.rs" };
    let mut out = Modules::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("an entry").path();
            let relative = path.strip_prefix(src).expect("under src").to_path_buf();
            if path.is_dir() {
                if relative != Path::new("bin") {
                    stack.push(path);
                }
                continue;
            }
            let name = relative.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !name.ends_with(".rs") || name == "tests.rs" || (relative.parent() == Some(Path::new("")) && ["lib.rs", "main.rs"].contains(&name) && name != root) {
                continue;
            }
            let mut segments: Vec<String> = relative.iter().map(|s| s.to_string_lossy().trim_end_matches(".rs").to_owned()).collect();
            if name == "mod.rs" || relative == Path::new(root) {
                segments.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.entry(segments.join("::")).or_default().push_str(&code_of(&text));
        }
    }
    out
}

/// The edges between sibling modules of one crate: a reference from inside one sibling's
/// subtree into another's.
fn edges(modules: &Modules) -> BTreeSet<(String, String)> {
    let resolver = Resolver::new(modules);
    let mut out = BTreeSet::new();
    for (from, code) in modules {
        for path in references(code) {
            let to = resolver.resolve(from, &path, 0);
            let (a, b): (Vec<&str>, Vec<&str>) = (from.split("::").filter(|s| !s.is_empty()).collect(), to.split("::").filter(|s| !s.is_empty()).collect());
            let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            if common < a.len() && common < b.len() {
                out.insert((a[..=common].join("::"), b[..=common].join("::")));
            }
        }
    }
    out
}

/// Every circle of the graph `edges` (each once, from its smallest module, back to it).
fn circles(edges: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    fn walk(start: &str, at: &str, edges: &BTreeSet<(String, String)>, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        for (_, next) in edges.range((at.to_owned(), String::new())..).take_while(|(from, _)| from == at) {
            if next == start {
                out.push(path.iter().cloned().chain([start.to_owned()]).collect());
            } else if next.as_str() > start && !path.contains(next) && out.len() < 1000 {
                path.push(next.clone());
                walk(start, next, edges, path, out);
                path.pop();
            }
        }
    }
    let mut out = Vec::new();
    let nodes: BTreeSet<&String> = edges.iter().map(|(from, _)| from).collect();
    for start in nodes {
        walk(start, start, edges, &mut vec![start.clone()], &mut out);
    }
    out
}

/// The edges of every workspace crate with a `src/`, each with its crate.
fn workspace_edges(root: &Path) -> BTreeSet<Edge> {
    crate::workspace::members(root)
        .into_iter()
        .filter(|m| m.dir.join("src").is_dir())
        .flat_map(|m| edges(&modules(&m.dir.join("src"))).into_iter().map(move |(a, b)| (m.name.clone(), a, b)))
        .collect()
}

/// What is wrong with the workspace's imports: every circle (with its crate and its path of
/// modules) once the [`ALLOWED`] edges are left out, and every allowed edge that no longer
/// exists.
fn findings(all: &BTreeSet<Edge>, allowed: &[(&str, &str, &str)]) -> Vec<String> {
    let is_allowed = |(c, a, b): &Edge| allowed.iter().any(|(x, y, z)| (x, y, z) == (&c.as_str(), &a.as_str(), &b.as_str()));
    let mut out: Vec<String> = allowed
        .iter()
        .filter(|(c, a, b)| !all.contains(&((*c).to_owned(), (*a).to_owned(), (*b).to_owned())))
        .map(|(c, a, b)| format!("{c}: the allowed edge {a} -> {b} no longer exists: remove it from imports::ALLOWED"))
        .collect();
    let crates: BTreeSet<&String> = all.iter().map(|(c, _, _)| c).collect();
    for name in crates {
        let graph: BTreeSet<(String, String)> = all.iter().filter(|e| &e.0 == name && !is_allowed(e)).map(|(_, a, b)| (a.clone(), b.clone())).collect();
        out.extend(circles(&graph).into_iter().map(|c| format!("{name}: {}", c.join(" -> "))));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source tree under the temporary directory, removed when dropped.
    struct Tree(PathBuf);

    impl Tree {
        fn new(name: &str, files: &[(&str, &str)]) -> Tree {
            let dir = std::env::temp_dir().join(format!("xtask-imports-{name}-{}", std::process::id()));
            for (path, text) in files {
                let file = dir.join(path);
                std::fs::create_dir_all(file.parent().expect("a folder")).unwrap();
                std::fs::write(file, text).unwrap();
            }
            Tree(dir)
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_workspace_imports_one_way() {
        let all = workspace_edges(Path::new(".."));
        let crates: BTreeSet<&str> = all.iter().map(|(c, _, _)| c.as_str()).collect();
        assert!(crates.contains("idempotency-client") && crates.contains("xtask") && crates.contains("idempotency-testkit"), "the crates were read: {crates:?}");
        assert!(all.contains(&("idempotency-client".into(), "handle".into(), "flow".into())), "the client's graph was read");
        let found = findings(&all, ALLOWED);
        assert!(found.is_empty(), "import circles (crate: module -> .. -> module), or stale allowed edges:\n{}", found.join("\n"));
    }

    #[test]
    fn paths_are_read() {
        let text = "use crate::{flow::{self, X}, sql::Schema};\nuse crate::Outcome; // crate::ignored\nfn f() { crate::trace::call(); super::super::up::It }";
        let mut found: Vec<PathRef> = references(&code_of(text));
        found.sort();
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            found,
            [
                (Base::Crate, names(&["Outcome"])),
                (Base::Crate, names(&["flow"])),
                (Base::Crate, names(&["flow", "X"])),
                (Base::Crate, names(&["sql", "Schema"])),
                (Base::Crate, names(&["trace", "call"])),
                (Base::Super(2), names(&["up", "It"])),
            ]
        );
        let children: BTreeSet<String> = ["core".to_owned()].into();
        let scope = uses("pub use core::{Reply as R, Mode};\nuse self::core::*;\npub(crate) use crate::a::b::{self as bee};", &children);
        assert_eq!(scope["R"], (Base::Current, names(&["core", "Reply"])));
        assert_eq!(scope["Mode"], (Base::Current, names(&["core", "Mode"])));
        assert_eq!(scope["bee"], (Base::Crate, names(&["a", "b"])));
        assert_eq!(scope.len(), 3);
    }

    #[test]
    fn a_circle_is_found_with_its_path() {
        let edges = |pairs: &[(&str, &str)]| pairs.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect::<BTreeSet<_>>();
        assert!(circles(&edges(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
        let found = circles(&edges(&[("a", "b"), ("b", "c"), ("c", "a"), ("b", "a")]));
        assert_eq!(found, [vec!["a", "b", "a"], vec!["a", "b", "c", "a"]]);
    }

    #[test]
    fn a_circle_through_super_inside_a_folder_is_found() {
        let tree = Tree::new(
            "super",
            &[
                ("lib.rs", "mod layer;\nmod plain;\n"),
                ("plain.rs", "pub struct P;\n"),
                ("layer/mod.rs", "mod config;\nmod core;\nmod reply;\npub use reply::Reply;\n"),
                ("layer/core.rs", "use super::config::Config;\npub struct Core;\n"),
                ("layer/config.rs", "use super::{core::Core, Reply};\nuse crate::plain::P;\npub struct Config;\n"),
                ("layer/reply.rs", "pub struct Reply;\nfn f() -> super::super::layer::core::Core { todo!() }\n"),
            ],
        );
        let modules = modules(&tree.0);
        assert_eq!(modules.keys().map(String::as_str).collect::<Vec<_>>(), ["", "layer", "layer::config", "layer::core", "layer::reply", "plain"]);
        let all: BTreeSet<Edge> = edges(&modules).into_iter().map(|(a, b)| ("demo".to_owned(), a, b)).collect();
        let found = findings(&all, &[]);
        assert_eq!(found, ["demo: layer::config -> layer::core -> layer::config", "demo: layer::config -> layer::reply -> layer::core -> layer::config"]);
        // Allowing an edge that breaks both circles leaves none; an allowed edge that is not
        // there is reported.
        assert!(findings(&all, &[("demo", "layer::core", "layer::config")]).is_empty());
        assert_eq!(findings(&all, &[("demo", "layer::core", "layer::config"), ("demo", "plain", "layer")]), ["demo: the allowed edge plain -> layer no longer exists: remove it from imports::ALLOWED"]);
    }
}
