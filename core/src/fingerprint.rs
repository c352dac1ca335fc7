//! Request fingerprints: the lowercase hex SHA-256 that `idem_reserve` compares as `request_hash`.
//!
//! A JSON request is hashed in a canonical form, so two equal JSON values always give the same
//! fingerprint whatever their key order, whitespace or number spelling. The rules:
//!
//! - object keys sorted by their UTF-8 bytes; a duplicated key keeps its last value (as `jsonb` does);
//! - no insignificant whitespace;
//! - strings escaped as `serde_json` escapes them;
//! - numbers as their exact value in plain decimal: no exponent, no leading `+`, no trailing
//!   fractional zeros, `-0` as `0` (`1.0`, `1e0` and `1` are one number).
//!
//! This module is the only implementation: the extension's `idem_fingerprint(jsonb)` calls
//! [`canonical_json`] on the `jsonb` text, so the client and the server always agree.

use sha2::{Digest, Sha256};
use std::fmt;

/// Objects and arrays nested deeper than this are refused rather than risking the stack.
pub const MAX_DEPTH: usize = 1024;

/// The canonical text may grow past its input only through exponents (`1e100000`); past this many
/// bytes it is refused, so a small hostile document cannot make the hasher work for minutes.
pub const MAX_CANONICAL_BYTES: usize = 64 << 20;

/// Why a JSON text has no fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FingerprintError {
    /// The text is not JSON.
    #[error("request is not valid JSON at byte {offset}: {reason}")]
    InvalidJson {
        /// The byte offset of the error in the text.
        offset: usize,
        /// What is wrong there.
        reason: &'static str,
    },
    /// Objects and arrays nest deeper than [`MAX_DEPTH`].
    #[error("request nests objects and arrays deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// The canonical form would exceed [`MAX_CANONICAL_BYTES`] (a number with a huge exponent).
    #[error("request's canonical form would exceed {MAX_CANONICAL_BYTES} bytes")]
    TooLarge,
    /// The value could not be serialised to JSON at all (a map with non-string keys, say).
    #[error("request cannot be serialised as JSON: {0}")]
    Serialize(String),
}

/// A request fingerprint: 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The SHA-256 of raw bytes; equals `idem_fingerprint(bytea)`.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Fingerprint(hex_sha256(bytes))
    }

    /// The SHA-256 of the canonical form of a JSON text; equals `idem_fingerprint(text::jsonb)`.
    pub fn of_json_text(text: &str) -> Result<Self, FingerprintError> {
        Ok(Self::of_bytes(canonical_json(text)?.as_bytes()))
    }

    /// The fingerprint of any serialisable value, as `serde_json` writes it.
    pub fn of_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Self, FingerprintError> {
        let text =
            serde_json::to_string(value).map_err(|e| FingerprintError::Serialize(e.to_string()))?;
        Self::of_json_text(&text)
    }

    /// The 64 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Fingerprint {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

fn hex_sha256(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
    out
}

/// The canonical serialisation of a JSON text (see the module docs for the rules).
pub fn canonical_json(text: &str) -> Result<String, FingerprintError> {
    let mut parser = Parser { input: text.as_bytes(), pos: 0, budget: MAX_CANONICAL_BYTES };
    let mut out = String::with_capacity(text.len());
    parser.skip_whitespace();
    parser.value(&mut out, 0)?;
    parser.skip_whitespace();
    if parser.pos != parser.input.len() {
        return Err(parser.invalid("trailing characters after the value"));
    }
    Ok(out)
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
    /// Bytes the output may still grow by beyond the input's own length (exponent expansion).
    budget: usize,
}

impl Parser<'_> {
    fn invalid(&self, reason: &'static str) -> FingerprintError {
        FingerprintError::InvalidJson { offset: self.pos, reason }
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn expect(&mut self, byte: u8, reason: &'static str) -> Result<(), FingerprintError> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.invalid(reason))
        }
    }

    fn value(&mut self, out: &mut String, depth: usize) -> Result<(), FingerprintError> {
        match self.peek() {
            Some(b'{') => self.object(out, depth + 1),
            Some(b'[') => self.array(out, depth + 1),
            Some(b'"') => {
                let s = self.string()?;
                write_string(out, &s);
                Ok(())
            }
            Some(b'-' | b'0'..=b'9') => self.number(out),
            Some(b't') => self.literal(out, "true"),
            Some(b'f') => self.literal(out, "false"),
            Some(b'n') => self.literal(out, "null"),
            Some(_) => Err(self.invalid("expected a value")),
            None => Err(self.invalid("unexpected end of input")),
        }
    }

    fn literal(&mut self, out: &mut String, word: &'static str) -> Result<(), FingerprintError> {
        if self.input[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            out.push_str(word);
            Ok(())
        } else {
            Err(self.invalid("expected true, false or null"))
        }
    }

    fn array(&mut self, out: &mut String, depth: usize) -> Result<(), FingerprintError> {
        if depth > MAX_DEPTH {
            return Err(FingerprintError::TooDeep);
        }
        self.pos += 1; // '['
        out.push('[');
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            out.push(']');
            return Ok(());
        }
        loop {
            self.skip_whitespace();
            self.value(out, depth)?;
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    out.push(',');
                }
                Some(b']') => {
                    self.pos += 1;
                    out.push(']');
                    return Ok(());
                }
                _ => return Err(self.invalid("expected ',' or ']' in an array")),
            }
        }
    }

    fn object(&mut self, out: &mut String, depth: usize) -> Result<(), FingerprintError> {
        if depth > MAX_DEPTH {
            return Err(FingerprintError::TooDeep);
        }
        self.pos += 1; // '{'
        let mut members: Vec<(String, String)> = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                self.skip_whitespace();
                if self.peek() != Some(b'"') {
                    return Err(self.invalid("expected a string key in an object"));
                }
                let key = self.string()?;
                self.skip_whitespace();
                self.expect(b':', "expected ':' after an object key")?;
                self.skip_whitespace();
                let mut value = String::new();
                self.value(&mut value, depth)?;
                members.push((key, value));
                self.skip_whitespace();
                match self.peek() {
                    Some(b',') => self.pos += 1,
                    Some(b'}') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(self.invalid("expected ',' or '}' in an object")),
                }
            }
        }
        // A stable sort keeps duplicates in input order; the last of each run wins, as in jsonb.
        members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        out.push('{');
        let mut first = true;
        for (i, (key, value)) in members.iter().enumerate() {
            if members.get(i + 1).is_some_and(|next| next.0 == *key) {
                continue;
            }
            if !first {
                out.push(',');
            }
            first = false;
            write_string(out, key);
            out.push(':');
            out.push_str(value);
        }
        out.push('}');
        Ok(())
    }

    /// A string token, decoded. The cursor is on the opening quote.
    fn string(&mut self) -> Result<String, FingerprintError> {
        self.pos += 1;
        let mut s = String::new();
        loop {
            let start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // The input is a &str and we stopped on ASCII bytes, so this slice is valid UTF-8.
            s.push_str(std::str::from_utf8(&self.input[start..self.pos]).map_err(|_| self.invalid("invalid UTF-8"))?);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(s);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    self.escape(&mut s)?;
                }
                Some(_) => return Err(self.invalid("control character in a string")),
                None => return Err(self.invalid("unterminated string")),
            }
        }
    }

    fn escape(&mut self, s: &mut String) -> Result<(), FingerprintError> {
        let c = self.peek().ok_or_else(|| self.invalid("unterminated escape"))?;
        self.pos += 1;
        let decoded = match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = self.hex4()?;
                let code = if (0xD800..0xDC00).contains(&hi) {
                    if !(self.peek() == Some(b'\\') && self.input.get(self.pos + 1) == Some(&b'u')) {
                        return Err(self.invalid("high surrogate without a low surrogate"));
                    }
                    self.pos += 2;
                    let lo = self.hex4()?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return Err(self.invalid("high surrogate without a low surrogate"));
                    }
                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                } else if (0xDC00..0xE000).contains(&hi) {
                    return Err(self.invalid("low surrogate without a high surrogate"));
                } else {
                    hi
                };
                char::from_u32(code).ok_or_else(|| self.invalid("invalid unicode escape"))?
            }
            _ => return Err(self.invalid("invalid escape")),
        };
        s.push(decoded);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, FingerprintError> {
        let digits = self.input.get(self.pos..self.pos + 4).ok_or_else(|| self.invalid("short unicode escape"))?;
        let mut v = 0u32;
        for &d in digits {
            let n = (d as char).to_digit(16).ok_or_else(|| self.invalid("invalid unicode escape"))?;
            v = v * 16 + n;
        }
        self.pos += 4;
        Ok(v)
    }

    /// A number token, written as its exact value in plain decimal.
    fn number(&mut self, out: &mut String) -> Result<(), FingerprintError> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        // All significant digits, integer part then fraction; value = digits × 10^exponent.
        let mut digits = Vec::new();
        let int_start = self.pos;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            digits.push(d);
            self.pos += 1;
        }
        let int_len = self.pos - int_start;
        if int_len == 0 || (int_len > 1 && self.input[int_start] == b'0') {
            return Err(self.invalid("invalid number"));
        }
        let mut exponent: i64 = 0;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            let frac_start = self.pos;
            while let Some(d @ b'0'..=b'9') = self.peek() {
                digits.push(d);
                self.pos += 1;
            }
            if self.pos == frac_start {
                return Err(self.invalid("invalid number"));
            }
            exponent = -((self.pos - frac_start) as i64);
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            let exp_negative = match self.peek() {
                Some(b'-') => {
                    self.pos += 1;
                    true
                }
                Some(b'+') => {
                    self.pos += 1;
                    false
                }
                _ => false,
            };
            let exp_start = self.pos;
            let mut e: i64 = 0;
            while let Some(d @ b'0'..=b'9') = self.peek() {
                // Saturate: anything this large is refused by the size budget below.
                e = e.saturating_mul(10).saturating_add(i64::from(d - b'0'));
                self.pos += 1;
            }
            if self.pos == exp_start {
                return Err(self.invalid("invalid number"));
            }
            exponent = exponent.saturating_add(if exp_negative { -e } else { e });
        }
        let token_len = self.pos - int_start + usize::from(negative);

        // Strip leading and trailing zeros of the significand.
        let first = digits.iter().position(|&d| d != b'0');
        let Some(first) = first else {
            out.push('0');
            return Ok(());
        };
        let last = digits.iter().rposition(|&d| d != b'0').unwrap_or(first);
        exponent = exponent.saturating_add((digits.len() - 1 - last) as i64);
        let sig = &digits[first..=last];

        let sig_len = sig.len() as i64;
        let plain_len = if exponent >= 0 {
            sig_len.saturating_add(exponent)
        } else if sig_len + exponent > 0 {
            sig_len + 1
        } else {
            2i64.saturating_add(exponent.saturating_neg())
        };
        let growth = usize::try_from(plain_len).unwrap_or(usize::MAX).saturating_sub(token_len);
        if growth > self.budget {
            return Err(FingerprintError::TooLarge);
        }
        self.budget -= growth;

        if negative {
            out.push('-');
        }
        let sig = std::str::from_utf8(sig).map_err(|_| self.invalid("invalid number"))?;
        if exponent >= 0 {
            out.push_str(sig);
            out.extend(std::iter::repeat_n('0', exponent as usize));
        } else {
            let point = sig_len + exponent; // digits before the decimal point
            if point > 0 {
                out.push_str(&sig[..point as usize]);
                out.push('.');
                out.push_str(&sig[point as usize..]);
            } else {
                out.push_str("0.");
                out.extend(std::iter::repeat_n('0', (-point) as usize));
                out.push_str(sig);
            }
        }
        Ok(())
    }
}

fn write_string(out: &mut String, s: &str) {
    // serde_json's escaping, by construction: serialising a &str cannot fail.
    match serde_json::to_string(s) {
        Ok(quoted) => out.push_str(&quoted),
        Err(_) => unreachable!("serialising a string to JSON cannot fail"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        canonical_json(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn numbers_are_plain_exact_decimals() {
        for (input, want) in [
            ("1", "1"),
            ("1.0", "1"),
            ("1e0", "1"),
            ("1E+0", "1"),
            ("-0", "0"),
            ("-0.000", "0"),
            ("0e10", "0"),
            ("10", "10"),
            ("1e2", "100"),
            ("1.5e1", "15"),
            ("1.50", "1.5"),
            ("-1.25e-3", "-0.00125"),
            ("123.456e-1", "12.3456"),
            ("0.1", "0.1"),
            ("100e-2", "1"),
            ("12345678901234567890123456789", "12345678901234567890123456789"),
            ("1.00000000000000000000000000001", "1.00000000000000000000000000001"),
        ] {
            assert_eq!(canon(input), want, "{input}");
        }
    }

    #[test]
    fn objects_sort_keys_by_bytes_and_keep_the_last_duplicate() {
        assert_eq!(canon(r#"{"b": 1, "a": [1, 2, {"d": null, "c": true}]}"#), r#"{"a":[1,2,{"c":true,"d":null}],"b":1}"#);
        assert_eq!(canon(r#"{"a": 1, "b": 2, "a": 3}"#), r#"{"a":3,"b":2}"#);
        // Byte order, not jsonb's length-first order: "aa" < "b".
        assert_eq!(canon(r#"{"b": 1, "aa": 2, "é": 3, "z": 4}"#), r#"{"aa":2,"b":1,"z":4,"é":3}"#);
        assert_eq!(canon(" { } "), "{}");
        assert_eq!(canon("[ ]"), "[]");
    }

    #[test]
    fn strings_are_escaped_as_serde_json_does() {
        assert_eq!(canon(r#""a\/b\u00e9\n\u0001\"""#), "\"a/bé\\n\\u0001\\\"\"");
        assert_eq!(canon(r#""\ud83d\ude00""#), "\"😀\"");
        assert_eq!(canon("\"\u{7f}\u{85}\""), "\"\u{7f}\u{85}\"");
    }

    #[test]
    fn equal_values_have_equal_fingerprints() {
        let a = Fingerprint::of_json_text(r#"{"amount": 100, "currency": "EUR"}"#).unwrap();
        let b = Fingerprint::of_json_text("{\"currency\":\"EUR\",\n\"amount\":1.00e2}").unwrap();
        let c = Fingerprint::of_json(&serde_json::json!({"currency": "EUR", "amount": 100})).unwrap();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_ne!(a, Fingerprint::of_json_text(r#"{"amount": 101, "currency": "EUR"}"#).unwrap());
        assert_eq!(a.as_str().len(), 64);
        assert!(a.as_str().bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }

    #[test]
    fn bytes_fingerprint_is_plain_sha256() {
        // SHA-256 of the empty string, a published test vector.
        assert_eq!(Fingerprint::of_bytes(b"").as_str(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn invalid_json_is_refused_with_an_offset() {
        for bad in ["", "{", "[1,]", "01", "1.", "1e", "+1", "\"\u{1}\"", "{\"a\" 1}", "tru", "\"\\ud800\"", "\"\\x\"", "1 2", "{1:2}"] {
            assert!(matches!(canonical_json(bad), Err(FingerprintError::InvalidJson { .. })), "{bad:?}");
        }
    }

    #[test]
    fn limits_are_errors_not_crashes() {
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(canonical_json(&deep), Err(FingerprintError::TooDeep));
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(canonical_json(&ok).is_ok());
        assert_eq!(canonical_json("1e999999999999999999999"), Err(FingerprintError::TooLarge));
        assert_eq!(canonical_json("1e-999999999999999999999"), Err(FingerprintError::TooLarge));
        assert_eq!(canon("1e1000").len(), 1001);
    }
}
