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

/// What the selection holds at one place: a value's text, or members selected below it.
enum Node<'a> {
    Leaf(&'a RawValue),
    Object(BTreeMap<String, Node<'a>>),
}

/// The selected values of `text` as one JSON object text whose members nest as the pointers do
/// (`/customer/id` becomes `{"customer":{"id":...}}`; an array index is a member named by its
/// digits), each value its own text. A pointer that resolves to nothing is left out (so a
/// missing member differs from a `null` one). `None` when `text` is not JSON.
pub(crate) fn select(text: &str, pointers: &[Pointer]) -> Option<String> {
    let root: &RawValue = serde_json::from_str(text).ok()?;
    let mut tree: BTreeMap<String, Node<'_>> = BTreeMap::new();
    for pointer in pointers {
        if pointer.0.is_empty() {
            return Some(root.get().to_owned());
        }
        let Some(value) = resolve(root, &pointer.0) else { continue };
        insert(&mut tree, &pointer.0, value);
    }
    let mut out = String::new();
    write_object(&tree, &mut out);
    Some(out)
}

/// The value at `tokens` below `value`, re-reading only the containers on the path.
fn resolve<'a>(mut value: &'a RawValue, tokens: &[String]) -> Option<&'a RawValue> {
    for token in tokens {
        let text = value.get().trim_start();
        value = if text.starts_with('{') {
            let members: BTreeMap<String, &'a RawValue> = serde_json::from_str(value.get()).ok()?;
            members.get(token).copied()?
        } else if text.starts_with('[') {
            let index: usize = token.parse().ok().filter(|_| token == "0" || !token.starts_with('0'))?;
            let items: Vec<&'a RawValue> = serde_json::from_str(value.get()).ok()?;
            items.get(index).copied()?
        } else {
            return None;
        };
    }
    Some(value)
}

/// Puts `value` at `tokens` in the tree; a value already selected above it wins (it holds the
/// whole subtree), and what was selected below it is replaced by it.
fn insert<'a>(tree: &mut BTreeMap<String, Node<'a>>, tokens: &[String], value: &'a RawValue) {
    let (first, rest) = tokens.split_first().expect("a pointer with a token");
    if rest.is_empty() {
        tree.insert(first.clone(), Node::Leaf(value));
        return;
    }
    let node = tree.entry(first.clone()).or_insert_with(|| Node::Object(BTreeMap::new()));
    if let Node::Object(children) = node {
        insert(children, rest, value);
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
        match node {
            Node::Leaf(value) => out.push_str(value.get()),
            Node::Object(children) => write_object(children, out),
        }
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
        assert_eq!(selected, r#"{"amount":1.50,"customer":{"id":"c-1"},"items":{"0":{"sku":"s"}}}"#);
        assert_eq!(select(body, &pointers(&["/items/01"])).unwrap(), "{}", "no leading zeros in an index");
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
