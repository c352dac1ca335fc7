//! How the layer composes a name from parts: one rule, so that two different sets of parts never
//! give one name.

/// The one rule that joins a namespace and an operation name into the operation a key is scoped
/// to, so that two different pairs never give one name: `namespace:name`, each part with `\`
/// written `\\` and `:` written `\:`, so the one unescaped `:` is the separator; a name
/// without a namespace is written with the same escapes, so it has no unescaped `:` and never
/// equals a namespaced one. A part without `:` or `\` is written as it is, so every name that
/// has neither (`billing:POST /charges`, `POST /charges/{id}`) is the name 0.6.0 wrote: keys in
/// flight across the update keep their scope.
pub(crate) fn scoped(namespace: Option<&str>, name: &str) -> String {
    fn escaped(part: &str, out: &mut String) {
        for c in part.chars() {
            if c == '\\' || c == ':' {
                out.push('\\');
            }
            out.push(c);
        }
    }
    let mut out = String::with_capacity(name.len() + namespace.map_or(0, |n| n.len() + 1));
    if let Some(namespace) = namespace {
        escaped(namespace, &mut out);
        out.push(':');
    }
    escaped(name, &mut out);
    out
}
