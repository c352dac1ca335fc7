//! The `Idempotency-Key` request header: an RFC 8941 sf-string (`"k-1"`), as the IETF draft
//! defines it, or a bare token (`k-1`) as most clients send it.

use http::header::{GetAll, HeaderValue};

/// What the header holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyHeader {
    /// No such header.
    Missing,
    /// One well-formed value: the key (unquoted, unescaped).
    Key(String),
    /// A header that breaks the syntax, with the rule it breaks.
    Malformed(&'static str),
}

/// Reads the key from every value of the header (exactly one is allowed).
pub(crate) fn parse(values: GetAll<'_, HeaderValue>) -> KeyHeader {
    let mut values = values.iter();
    let Some(value) = values.next() else { return KeyHeader::Missing };
    if values.next().is_some() {
        return KeyHeader::Malformed("the idempotency key header must appear once");
    }
    parse_value(value.as_bytes())
}

fn parse_value(raw: &[u8]) -> KeyHeader {
    let value = raw.trim_ascii();
    match value.first() {
        None => KeyHeader::Malformed("the idempotency key is empty"),
        Some(b'"') => sf_string(&value[1..]),
        Some(_) => bare(value),
    }
}

/// The rest of an sf-string after its opening quote: printable ASCII, `\` escaping only `"` and
/// `\`, a closing quote and nothing after it.
fn sf_string(rest: &[u8]) -> KeyHeader {
    let mut key = String::new();
    let mut bytes = rest.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => key.push(char::from(e)),
                _ => return KeyHeader::Malformed("a quoted idempotency key may only escape \" and \\"),
            },
            b'"' => {
                return if bytes.next().is_some() {
                    KeyHeader::Malformed("nothing may follow the closing quote of the idempotency key")
                } else if key.is_empty() {
                    KeyHeader::Malformed("the idempotency key is empty")
                } else {
                    KeyHeader::Key(key)
                };
            }
            0x20..=0x7e => key.push(char::from(b)),
            _ => return KeyHeader::Malformed("the idempotency key must be printable ASCII"),
        }
    }
    KeyHeader::Malformed("the quoted idempotency key has no closing quote")
}

/// A bare key: visible ASCII without quotes, backslashes, commas or spaces (which would make it
/// a list or a malformed sf-string).
fn bare(value: &[u8]) -> KeyHeader {
    if value.iter().all(|&b| (0x21..=0x7e).contains(&b) && !matches!(b, b'"' | b'\\' | b',')) {
        KeyHeader::Key(String::from_utf8_lossy(value).into_owned())
    } else {
        KeyHeader::Malformed("an unquoted idempotency key must be visible ASCII without spaces, quotes, backslashes or commas")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn key(raw: &[u8]) -> KeyHeader {
        parse_value(raw)
    }

    #[test]
    fn accepts_sf_strings_and_bare_tokens() {
        assert_eq!(key(b"\"k-1\""), KeyHeader::Key("k-1".into()));
        assert_eq!(key(b"  \"k 1\"  "), KeyHeader::Key("k 1".into()));
        assert_eq!(key(br#""a\"b\\c""#), KeyHeader::Key(r#"a"b\c"#.into()));
        assert_eq!(key(b"8e03978e-40d5-43e8-bc93-6894a57f9324"), KeyHeader::Key("8e03978e-40d5-43e8-bc93-6894a57f9324".into()));
    }

    #[test]
    fn rejects_what_breaks_the_syntax() {
        for raw in [&b""[..], b"\"\"", b"\"open", b"\"a\"b", b"\"a\\nb\"", b"a b", b"a,b", b"a\"", b"\"\x01\""] {
            assert!(matches!(key(raw), KeyHeader::Malformed(_)), "{:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn one_header_line_only() {
        let mut headers = HeaderMap::new();
        assert_eq!(parse(headers.get_all("idempotency-key")), KeyHeader::Missing);
        headers.append("idempotency-key", HeaderValue::from_static("a"));
        assert_eq!(parse(headers.get_all("idempotency-key")), KeyHeader::Key("a".into()));
        headers.append("idempotency-key", HeaderValue::from_static("b"));
        assert!(matches!(parse(headers.get_all("idempotency-key")), KeyHeader::Malformed(_)));
    }
}
