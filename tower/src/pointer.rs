//! The payload subset a fingerprint covers: JSON Pointers (RFC 6901) into a JSON body, nested
//! paths included, read from the body's own text so numbers keep every digit.

use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// A parsed JSON Pointer: its reference tokens, unescaped (`~1` is `/`, `~0` is `~`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pointer(Vec<String>);

impl Pointer {
    /// Parses `text` (`""` is the whole document, otherwise it starts with `/`).
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Ok(Pointer(Vec::new()));
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!("the JSON Pointer {text:?} must be empty or start with '/'"));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                match (c, c == '~') {
                    (_, true) => match chars.next() {
                        Some('0') => token.push('~'),
                        Some('1') => token.push('/'),
                        _ => return Err(format!("the JSON Pointer {text:?} has a '~' not followed by 0 or 1")),
                    },
                    (c, false) => token.push(c),
                }
            }
            tokens.push(token);
        }
        Ok(Pointer(tokens))
    }

    /// A top-level member's pointer.
    pub(crate) fn member(name: &str) -> Self {
        Pointer(vec![name.to_owned()])
    }
}

/// What the selection holds at one place: a value's text, or what was selected below it in an
/// object (by member name) or in an array (by index).
enum Node<'a> {
    Leaf(&'a RawValue),
    Object(BTreeMap<String, Node<'a>>),
    Array(BTreeMap<usize, Node<'a>>),
}

/// The kind of container a pointer's token was resolved in.
#[derive(Clone, Copy)]
enum Container {
    Object,
    Array(usize),
}

/// The selected values of `text` as one JSON object text whose members nest as the pointers do
/// (`/customer/id` becomes `{"customer":{"id":...}}`), each value its own text. What is selected
/// inside an array is written as an array of `[index, selection]` pairs in index order
/// (`/items/0/sku` in `{"items":[{"sku":"s"}]}` becomes `{"items":[[0,{"sku":"s"}]]}`), so an
/// array never reads as an object whose members are named by digits (`{"items":{"0":..}}`).
/// A pointer that resolves to nothing is left out (so a missing member differs from a `null`
/// one). `None` when `text` is not JSON.
///
/// A selection through objects only is written as 0.6.0 wrote it, so its fingerprint is
/// unchanged; one through an array changed in 0.7.0 (0.6.0 wrote the index as a member name).
pub(crate) fn select(text: &str, pointers: &[Pointer]) -> Option<String> {
    let root: &RawValue = serde_json::from_str(text).ok()?;
    let mut tree: Option<Node<'_>> = None;
    for pointer in pointers {
        if pointer.0.is_empty() {
            return Some(root.get().to_owned());
        }
        let Some((path, value)) = resolve(root, &pointer.0) else { continue };
        let node = tree.get_or_insert_with(|| empty(path[0].1));
        insert_below(node, &path, value);
    }
    let mut out = String::new();
    match &tree {
        Some(node) => write_node(node, &mut out),
        None => out.push_str("{}"),
    }
    Some(out)
}

/// The value at `tokens` below `value`, re-reading only the containers on the path, with the
/// kind of container each token was found in.
fn resolve<'a, 't>(mut value: &'a RawValue, tokens: &'t [String]) -> Option<(Vec<(&'t str, Container)>, &'a RawValue)> {
    let mut path = Vec::with_capacity(tokens.len());
    for token in tokens {
        let text = value.get().trim_start();
        value = if text.starts_with('{') {
            let members: BTreeMap<String, &'a RawValue> = serde_json::from_str(value.get()).ok()?;
            path.push((token.as_str(), Container::Object));
            members.get(token).copied()?
        } else if text.starts_with('[') {
            let index: usize = token.parse().ok().filter(|_| token == "0" || !token.starts_with('0'))?;
            let items: Vec<&'a RawValue> = serde_json::from_str(value.get()).ok()?;
            path.push((token.as_str(), Container::Array(index)));
            items.get(index).copied()?
        } else {
            return None;
        };
    }
    Some((path, value))
}

/// Puts `value` at `name` and then `rest` below an object's members; a value already selected
/// above it wins (it holds the whole subtree), and what was selected below it is replaced by it.
fn insert_member<'a>(members: &mut BTreeMap<String, Node<'a>>, name: &str, rest: &[(&str, Container)], value: &'a RawValue) {
    match rest.first() {
        None => {
            members.insert(name.to_owned(), Node::Leaf(value));
        }
        Some(&(_, kind)) => {
            let node = members.entry(name.to_owned()).or_insert_with(|| empty(kind));
            insert_below(node, rest, value);
        }
    }
}

/// [`insert_member`] for an array's item at `index`.
fn insert_item<'a>(items: &mut BTreeMap<usize, Node<'a>>, index: usize, rest: &[(&str, Container)], value: &'a RawValue) {
    match rest.first() {
        None => {
            items.insert(index, Node::Leaf(value));
        }
        Some(&(_, kind)) => {
            let node = items.entry(index).or_insert_with(|| empty(kind));
            insert_below(node, rest, value);
        }
    }
}

/// Descends into `node` along `rest` (its first token names the place in `node`); a leaf above
/// holds its whole subtree, so nothing is put below it.
fn insert_below<'a>(node: &mut Node<'a>, rest: &[(&str, Container)], value: &'a RawValue) {
    let Some((&(token, kind), below)) = rest.split_first() else { return };
    match (node, kind) {
        (Node::Object(members), Container::Object) => insert_member(members, token, below, value),
        (Node::Array(items), Container::Array(index)) => insert_item(items, index, below, value),
        // A leaf holds the subtree; one body's container is always of one kind.
        _ => {}
    }
}

fn empty<'a>(kind: Container) -> Node<'a> {
    match kind {
        Container::Object => Node::Object(BTreeMap::new()),
        Container::Array(_) => Node::Array(BTreeMap::new()),
    }
}

fn write_node(node: &Node<'_>, out: &mut String) {
    match node {
        Node::Leaf(value) => out.push_str(value.get()),
        Node::Object(members) => write_object(members, out),
        Node::Array(items) => {
            out.push('[');
            for (i, (index, item)) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push('[');
                out.push_str(&index.to_string());
                out.push(',');
                write_node(item, out);
                out.push(']');
            }
            out.push(']');
        }
    }
}

fn write_object(tree: &BTreeMap<String, Node<'_>>, out: &mut String) {
    out.push('{');
    for (i, (name, node)) in tree.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::Value::String(name.clone()).to_string());
        out.push(':');
        write_node(node, out);
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointers(texts: &[&str]) -> Vec<Pointer> {
        texts.iter().map(|t| Pointer::parse(t).unwrap()).collect()
    }

    #[test]
    fn parses_and_unescapes() {
        assert_eq!(Pointer::parse("/a~1b/c~0d").unwrap(), Pointer(vec!["a/b".into(), "c~d".into()]));
        assert_eq!(Pointer::parse("").unwrap(), Pointer(vec![]));
        assert!(Pointer::parse("a").is_err());
        assert!(Pointer::parse("/a~2").is_err());
    }

    #[test]
    fn selects_nested_members_and_array_items() {
        let body = r#"{"amount": 1.50, "customer": {"id": "c-1", "name": "x"}, "items": [{"sku": "s"}, 2], "trace": 9}"#;
        let selected = select(body, &pointers(&["/amount", "/customer/id", "/items/0/sku", "/missing/x"])).unwrap();
        assert_eq!(selected, r#"{"amount":1.50,"customer":{"id":"c-1"},"items":[[0,{"sku":"s"}]]}"#);
        assert_eq!(select(body, &pointers(&["/items/01"])).unwrap(), "{}", "no leading zeros in an index");
    }

    #[test]
    fn arrays_and_objects_with_digit_members_select_apart() {
        let ptrs = pointers(&["/items/0/sku"]);
        let array = select(r#"{"items":[{"sku":"s"}]}"#, &ptrs).unwrap();
        let object = select(r#"{"items":{"0":{"sku":"s"}}}"#, &ptrs).unwrap();
        assert_ne!(array, object);
        assert_eq!(object, r#"{"items":{"0":{"sku":"s"}}}"#, "a selection through objects is written as 0.6.0 wrote it");
        // At the root too, and with several items in index order (not the digits' order).
        let root = pointers(&["/0/sku", "/10/sku", "/2"]);
        let items: Vec<String> = (0..11).map(|i| format!(r#"{{"sku":"s{i}"}}"#)).collect();
        let as_array = select(&format!("[{}]", items.join(",")), &root).unwrap();
        assert_eq!(as_array, r#"[[0,{"sku":"s0"}],[2,{"sku":"s2"}],[10,{"sku":"s10"}]]"#);
        let members: Vec<String> = items.iter().enumerate().map(|(i, v)| format!(r#""{i}":{v}"#)).collect();
        assert_ne!(as_array, select(&format!("{{{}}}", members.join(",")), &root).unwrap());
        // An item holds its whole subtree when it is selected itself.
        let body = r#"{"a":[{"b":1,"c":2}]}"#;
        assert_eq!(select(body, &pointers(&["/a/0/b", "/a/0"])).unwrap(), r#"{"a":[[0,{"b":1,"c":2}]]}"#);
        assert_eq!(select(body, &pointers(&["/a/0", "/a/0/b"])).unwrap(), r#"{"a":[[0,{"b":1,"c":2}]]}"#);
    }

    #[test]
    fn an_ancestor_holds_its_whole_subtree() {
        let body = r#"{"a": {"b": 1, "c": 2}}"#;
        assert_eq!(select(body, &pointers(&["/a/b", "/a"])).unwrap(), r#"{"a":{"b": 1, "c": 2}}"#);
        assert_eq!(select(body, &pointers(&["/a", "/a/b"])).unwrap(), r#"{"a":{"b": 1, "c": 2}}"#);
    }

    #[test]
    fn not_json_is_none() {
        assert!(select("{", &pointers(&["/a"])).is_none());
    }
}
