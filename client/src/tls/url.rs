//! Connection strings as libpq reads them: options taken out of a URL or a key=value string.

use super::UNSUPPORTED;

/// Takes the options `names` out of a connection string; returns the rest (still a valid
/// connection string of the same form) and the options found, values decoded, in order.
pub(super) fn take_options(url: &str, names: &[&str]) -> Result<(String, Vec<(String, String)>), String> {
    let mut found = Vec::new();
    let refuse = |name: &str| -> Result<(), String> {
        if UNSUPPORTED.contains(&name) {
            Err(format!("{name} is not supported by this client (client certificates and CRLs are not implemented)"))
        } else {
            Ok(())
        }
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else { return Ok((url.to_owned(), found)) };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = percent_decode(name)?;
            refuse(&name)?;
            if names.contains(&name.as_str()) {
                found.push((name, percent_decode(value)?));
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        return Ok((rest, found));
    }
    // key=value form: values bare or single-quoted with backslash escapes.
    let mut rest = String::new();
    let mut chars = url.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut name = String::new();
        while let Some(&(_, c)) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            name.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|&(_, c)| c.is_whitespace()) {
            chars.next();
        }
        if chars.next().map(|(_, c)| c) != Some('=') {
            return Err(format!("the connection string has no '=' after {name:?}"));
        }
        while chars.peek().is_some_and(|&(_, c)| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek().is_some_and(|&(_, c)| c == '\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, c)) => value.push(c),
                        None => return Err(format!("the value of {name} ends in a backslash")),
                    },
                    Some((_, '\'')) => break,
                    Some((_, c)) => value.push(c),
                    None => return Err(format!("the value of {name} has no closing quote")),
                }
            }
        } else {
            while let Some(&(_, c)) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        let end = chars.peek().map_or(url.len(), |&(i, _)| i);
        refuse(&name)?;
        if names.contains(&name.as_str()) {
            found.push((name, value));
        } else {
            if !rest.is_empty() {
                rest.push(' ');
            }
            rest.push_str(&url[start..end]);
        }
    }
    Ok((rest, found))
}

/// Decodes `%XX` escapes (a URL's query values).
fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(byte) = hex else { return Err(format!("bad percent escape in the connection URL: {s:?}")) };
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("the connection URL option {s:?} is not UTF-8 once decoded"))
}

