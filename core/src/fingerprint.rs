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
//!
//! # Cost
//!
//! Time and memory are linear in the text's length (sorting an object's keys adds its
//! `log(members)` factor). Only a number can make the canonical form longer than its text
//! (`1e6` is `1000000`; strings, whitespace and duplicate keys only shorten it), so the canonical
//! form is bounded by the text's length: at most [`CANONICAL_BYTES_PER_BYTE`] bytes per byte of
//! the text plus [`CANONICAL_EXTRA_BYTES`] ([`max_canonical_len`]).
//!
//! Each number's written length (sign included) is computed from its digits and exponent before
//! a digit is written and charged against that bound; a number's expansion counts even when a
//! duplicate key drops it, and a number written shorter than its text gives no credit to the
//! others. Once the numbers would pass the bound nothing more is written, the text is read to its
//! end, and it is refused with [`FingerprintError::TooLarge`] if it is JSON (a text that is not
//! is [`FingerprintError::InvalidJson`], one nested too deep [`FingerprintError::TooDeep`], as
//! without the bound).
//!
//! The bound keeps any `f64` on its own in any spelling (at most 326 digits) and a number up to
//! 10^8000 on its own, and caps a 1 MiB request at 16 MiB of canonical text, whose fingerprint
//! costs about twice an ordinary 1 MiB request's (docs/performance.md has the measured figures).
//!
//! [`Fingerprint::of_json_text`] never holds the canonical form: it hashes it as it is written,
//! and a long run of zeros is hashed from a constant buffer, so its memory is that of the parse.

use sha2::{Digest, Sha256};
use std::fmt;
use std::ops::Range;

/// Objects and arrays nested deeper than this are refused rather than risking the stack.
pub const MAX_DEPTH: usize = 1024;

/// The canonical form may be at most this many bytes per byte of its text, plus
/// [`CANONICAL_EXTRA_BYTES`]: see [`max_canonical_len`].
pub const CANONICAL_BYTES_PER_BYTE: usize = 16;

/// What the canonical form may hold beyond [`CANONICAL_BYTES_PER_BYTE`] per byte of its text, so
/// a short text may still carry a number such as `1e8000`.
pub const CANONICAL_EXTRA_BYTES: usize = 8 << 10;

/// The longest canonical form a JSON text of `text_len` bytes may have:
/// `16 × text_len + 8192`. A text whose numbers, written out in full, would exceed it is refused
/// with [`FingerprintError::TooLarge`] before they are written.
pub const fn max_canonical_len(text_len: usize) -> usize {
    text_len.saturating_mul(CANONICAL_BYTES_PER_BYTE).saturating_add(CANONICAL_EXTRA_BYTES)
}

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
    /// The canonical form would be longer than [`max_canonical_len`] of the text: a number with
    /// a large exponent (`1e60000000`), or many of them.
    #[error(
        "request's canonical form would exceed {limit} bytes, the limit for a text of {text_len} bytes \
         ({CANONICAL_BYTES_PER_BYTE} bytes per byte plus {CANONICAL_EXTRA_BYTES}): its numbers' exponents \
         write out too many digits"
    )]
    TooLarge {
        /// The text's length in bytes.
        text_len: usize,
        /// [`max_canonical_len`] of that length.
        limit: usize,
    },
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
        Fingerprint(hex(Sha256::digest(bytes).as_slice()))
    }

    /// The SHA-256 of the canonical form of a JSON text; equals `idem_fingerprint(text::jsonb)`.
    /// The canonical form is hashed as it is written, never held whole.
    pub fn of_json_text(text: &str) -> Result<Self, FingerprintError> {
        let parsed = Parsed::parse(text)?;
        let mut sink = HashSink { sha: Sha256::new(), pending: Vec::with_capacity(HASH_CHUNK) };
        parsed.emit(&mut sink);
        sink.flush();
        Ok(Fingerprint(hex(sink.sha.finalize().as_slice())))
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

/// Lowercase hex of a digest (the fingerprint's and the derived key's spelling).
pub(crate) fn hex(digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * digest.len());
    for &b in digest {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
    out
}

/// The canonical serialisation of a JSON text (see the module docs for the rules and the bound).
pub fn canonical_json(text: &str) -> Result<String, FingerprintError> {
    let parsed = Parsed::parse(text)?;
    if parsed.marks.is_empty() {
        // No object to reorder and no run of zeros left out: the text is already canonical.
        return utf8(parsed.text);
    }
    let mut out = Vec::with_capacity(parsed.text.len());
    parsed.emit(&mut out);
    utf8(out)
}

fn utf8(bytes: Vec<u8>) -> Result<String, FingerprintError> {
    // Everything written is copied from the &str input, escaped by serde_json, or ASCII.
    String::from_utf8(bytes).map_err(|e| FingerprintError::Serialize(e.to_string()))
}

/// Where the canonical form goes: a buffer, or the hash.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
    fn zeros(&mut self, count: usize);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn zeros(&mut self, count: usize) {
        self.resize(self.len() + count, b'0');
    }
}

const HASH_CHUNK: usize = 8 << 10;
static ZEROS: [u8; HASH_CHUNK] = [b'0'; HASH_CHUNK];

/// Hashes the canonical form in chunks, so the many small pieces of a document cost one
/// `update` per chunk.
struct HashSink {
    sha: Sha256,
    pending: Vec<u8>,
}

impl HashSink {
    fn flush(&mut self) {
        self.sha.update(&self.pending);
        self.pending.clear();
    }
}

impl Sink for HashSink {
    fn put(&mut self, bytes: &[u8]) {
        if self.pending.len() + bytes.len() > HASH_CHUNK {
            self.flush();
            if bytes.len() >= HASH_CHUNK {
                self.sha.update(bytes);
                return;
            }
        }
        self.pending.extend_from_slice(bytes);
    }

    fn zeros(&mut self, mut count: usize) {
        while count > 0 {
            let n = count.min(HASH_CHUNK);
            self.put(&ZEROS[..n]);
            count -= n;
        }
    }
}

/// A run of zeros at most this long is written into the text; a longer one is left out and
/// marked, and written (or hashed) only when the canonical form is emitted.
const INLINE_ZEROS: usize = 32;

/// A position in [`Parsed::text`] where emission does something other than copy.
enum Mark {
    /// `count` zeros go here.
    Zeros { at: usize, count: usize },
    /// An object: its members are `text[at..end]` in input order; emission writes them sorted,
    /// separated by commas, in braces. `next` is the first mark after the object's own.
    Object { at: usize, end: usize, members: Range<usize>, next: usize },
}

/// An object member: its escaped key, `:` and its canonical value, with the value's marks.
struct Member {
    /// The decoded key in `Parser::keys`, while the object is open.
    key: Range<usize>,
    text: Range<usize>,
    marks: Range<usize>,
    /// False for a duplicated key but the last (jsonb keeps the last).
    keep: bool,
}

/// A parsed text: its canonical pieces, in input order, and how to put them in canonical order.
/// Every byte of `text` is emitted at most once, so emission is linear in the input too.
struct Parsed {
    text: Vec<u8>,
    marks: Vec<Mark>,
    members: Vec<Member>,
}

impl Parsed {
    fn parse(input: &str) -> Result<Self, FingerprintError> {
        let mut parser = Parser {
            input: input.as_bytes(),
            pos: 0,
            budget: max_canonical_len(input.len()) - input.len(),
            over: false,
            out: Parsed { text: Vec::with_capacity(input.len()), marks: Vec::new(), members: Vec::new() },
            open: Vec::new(),
            keys: Vec::new(),
            scratch: String::new(),
        };
        parser.skip_whitespace();
        parser.value(0)?;
        parser.skip_whitespace();
        if parser.pos != parser.input.len() {
            return Err(parser.invalid("trailing characters after the value"));
        }
        if parser.over {
            return Err(FingerprintError::TooLarge { text_len: input.len(), limit: max_canonical_len(input.len()) });
        }
        Ok(parser.out)
    }

    fn emit(&self, sink: &mut impl Sink) {
        self.emit_range(sink, 0..self.text.len(), 0..self.marks.len());
    }

    fn emit_range(&self, sink: &mut impl Sink, text: Range<usize>, marks: Range<usize>) {
        let mut pos = text.start;
        let mut m = marks.start;
        while m < marks.end {
            match &self.marks[m] {
                Mark::Zeros { at, count } => {
                    sink.put(&self.text[pos..*at]);
                    sink.zeros(*count);
                    pos = *at;
                    m += 1;
                }
                Mark::Object { at, end, members, next } => {
                    sink.put(&self.text[pos..*at]);
                    sink.put(b"{");
                    let mut first = true;
                    for member in self.members[members.clone()].iter().filter(|m| m.keep) {
                        if !first {
                            sink.put(b",");
                        }
                        first = false;
                        self.emit_range(sink, member.text.clone(), member.marks.clone());
                    }
                    sink.put(b"}");
                    pos = *end;
                    m = *next;
                }
            }
        }
        sink.put(&self.text[pos..text.end]);
    }
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
    /// Bytes the output may still grow by beyond the input's own length (number expansion).
    budget: usize,
    /// The budget was exceeded: the text is refused with [`FingerprintError::TooLarge`] once it
    /// is read to its end and found to be JSON.
    over: bool,
    out: Parsed,
    /// The members of the open objects, innermost last.
    open: Vec<Member>,
    /// The decoded keys of the open objects' members.
    keys: Vec<u8>,
    /// The string being decoded.
    scratch: String,
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

    fn value(&mut self, depth: usize) -> Result<(), FingerprintError> {
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string(false),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal("true"),
            Some(b'f') => self.literal("false"),
            Some(b'n') => self.literal("null"),
            Some(_) => Err(self.invalid("expected a value")),
            None => Err(self.invalid("unexpected end of input")),
        }
    }

    fn literal(&mut self, word: &'static str) -> Result<(), FingerprintError> {
        if self.input[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            self.out.text.extend_from_slice(word.as_bytes());
            Ok(())
        } else {
            Err(self.invalid("expected true, false or null"))
        }
    }

    fn array(&mut self, depth: usize) -> Result<(), FingerprintError> {
        if depth > MAX_DEPTH {
            return Err(FingerprintError::TooDeep);
        }
        self.pos += 1; // '['
        self.out.text.push(b'[');
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            self.out.text.push(b']');
            return Ok(());
        }
        loop {
            self.skip_whitespace();
            self.value(depth)?;
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.out.text.push(b',');
                }
                Some(b']') => {
                    self.pos += 1;
                    self.out.text.push(b']');
                    return Ok(());
                }
                _ => return Err(self.invalid("expected ',' or ']' in an array")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<(), FingerprintError> {
        if depth > MAX_DEPTH {
            return Err(FingerprintError::TooDeep);
        }
        self.pos += 1; // '{'
        let mark = self.out.marks.len();
        let at = self.out.text.len();
        self.out.marks.push(Mark::Object { at, end: at, members: 0..0, next: mark + 1 });
        let open_from = self.open.len();
        let keys_from = self.keys.len();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                self.skip_whitespace();
                if self.peek() != Some(b'"') {
                    return Err(self.invalid("expected a string key in an object"));
                }
                let text_from = self.out.text.len();
                let marks_from = self.out.marks.len();
                let key_from = self.keys.len();
                self.string(true)?;
                let key = key_from..self.keys.len();
                self.skip_whitespace();
                self.expect(b':', "expected ':' after an object key")?;
                self.out.text.push(b':');
                self.skip_whitespace();
                self.value(depth)?;
                let (text, marks) = (text_from..self.out.text.len(), marks_from..self.out.marks.len());
                self.open.push(Member { key, text, marks, keep: true });
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
        let keys = &self.keys;
        let members = &mut self.open[open_from..];
        members.sort_by(|a, b| keys[a.key.clone()].cmp(&keys[b.key.clone()]));
        for i in 1..members.len() {
            if keys[members[i - 1].key.clone()] == keys[members[i].key.clone()] {
                members[i - 1].keep = false;
            }
        }
        // This object's keys (and its closed children's) are the last ones: no longer needed.
        self.keys.truncate(keys_from);
        let first = self.out.members.len();
        self.out.members.extend(self.open.drain(open_from..));
        let end = self.out.text.len();
        self.out.marks[mark] = Mark::Object { at, end, members: first..self.out.members.len(), next: self.out.marks.len() };
        Ok(())
    }

    /// A string token, decoded into `scratch`, then written as serde_json escapes it (and, for a
    /// key, kept decoded for sorting). The cursor is on the opening quote.
    fn string(&mut self, key: bool) -> Result<(), FingerprintError> {
        let mut s = std::mem::take(&mut self.scratch);
        s.clear();
        let decoded = self.decode_string(&mut s);
        let written = decoded.and_then(|()| {
            serde_json::to_writer(&mut self.out.text, s.as_str()).map_err(|e| FingerprintError::Serialize(e.to_string()))
        });
        if key {
            self.keys.extend_from_slice(s.as_bytes());
        }
        self.scratch = s;
        written
    }

    fn decode_string(&mut self, s: &mut String) -> Result<(), FingerprintError> {
        self.pos += 1;
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
                    return Ok(());
                }
                Some(b'\\') => {
                    self.pos += 1;
                    self.escape(s)?;
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

    /// A number token, written as its exact value in plain decimal. Its length is computed, and
    /// charged to the budget, before a digit is written.
    fn number(&mut self) -> Result<(), FingerprintError> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        // The significant digits are the integer part then the fraction:
        // value = digits × 10^exponent.
        let int_start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        let int = int_start..self.pos;
        if int.is_empty() || (int.len() > 1 && self.input[int_start] == b'0') {
            return Err(self.invalid("invalid number"));
        }
        let mut frac = self.pos..self.pos;
        let mut exponent: i64 = 0;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            let frac_start = self.pos;
            while let Some(b'0'..=b'9') = self.peek() {
                self.pos += 1;
            }
            if self.pos == frac_start {
                return Err(self.invalid("invalid number"));
            }
            frac = frac_start..self.pos;
            exponent = -(frac.len() as i64);
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

        // Strip leading and trailing zeros of the significand (digit i of int ++ frac).
        let input = self.input;
        let digits = Digits { int: &input[int], frac: &input[frac] };
        let Some(first) = (0..digits.len()).find(|&i| digits.at(i) != b'0') else {
            self.out.text.push(b'0');
            return Ok(());
        };
        let last = (first..digits.len()).rev().find(|&i| digits.at(i) != b'0').unwrap_or(first);
        exponent = exponent.saturating_add((digits.len() - 1 - last) as i64);
        let sig_len = (last + 1 - first) as i64;

        // The written length, sign included (the token's length includes it too).
        let plain_len = i64::from(negative).saturating_add(if exponent >= 0 {
            sig_len.saturating_add(exponent)
        } else if sig_len + exponent > 0 {
            sig_len + 1
        } else {
            2i64.saturating_add(exponent.saturating_neg())
        });
        let growth = usize::try_from(plain_len).unwrap_or(usize::MAX).saturating_sub(token_len);
        if self.over || growth > self.budget {
            // Nothing more is written; the rest is still read, so that a text that is not JSON
            // is reported as such.
            self.over = true;
            return Ok(());
        }
        self.budget -= growth;

        // Within the budget, every count below fits in usize.
        if negative {
            self.out.text.push(b'-');
        }
        if exponent >= 0 {
            digits.write(&mut self.out.text, first..last + 1);
            self.zeros(exponent as usize);
        } else {
            let point = sig_len + exponent; // digits before the decimal point
            if point > 0 {
                let point = first + point as usize;
                digits.write(&mut self.out.text, first..point);
                self.out.text.push(b'.');
                digits.write(&mut self.out.text, point..last + 1);
            } else {
                self.out.text.extend_from_slice(b"0.");
                self.zeros(point.unsigned_abs() as usize);
                digits.write(&mut self.out.text, first..last + 1);
            }
        }
        Ok(())
    }

    /// `count` zeros: written now when few, else marked and written at emission.
    fn zeros(&mut self, count: usize) {
        if count <= INLINE_ZEROS {
            self.out.text.resize(self.out.text.len() + count, b'0');
        } else {
            self.out.marks.push(Mark::Zeros { at: self.out.text.len(), count });
        }
    }
}

/// A number's digits before and after its decimal point, read as one string.
struct Digits<'a> {
    int: &'a [u8],
    frac: &'a [u8],
}

impl Digits<'_> {
    fn len(&self) -> usize {
        self.int.len() + self.frac.len()
    }

    fn at(&self, i: usize) -> u8 {
        match self.int.get(i) {
            Some(&d) => d,
            None => self.frac[i - self.int.len()],
        }
    }

    fn write(&self, out: &mut Vec<u8>, range: Range<usize>) {
        let split = self.int.len();
        out.extend_from_slice(&self.int[range.start.min(split)..range.end.min(split)]);
        out.extend_from_slice(&self.frac[range.start.max(split) - split..range.end.max(split) - split]);
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
    fn nesting_deeper_than_the_limit_is_an_error_not_a_crash() {
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(canonical_json(&deep), Err(FingerprintError::TooDeep));
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(canonical_json(&ok).is_ok());
        let deep = "{\"a\":".repeat(MAX_DEPTH + 1) + "1" + &"}".repeat(MAX_DEPTH + 1);
        assert_eq!(canonical_json(&deep), Err(FingerprintError::TooDeep));
    }

    fn too_large(text: &str) -> FingerprintError {
        FingerprintError::TooLarge { text_len: text.len(), limit: 16 * text.len() + 8192 }
    }

    #[test]
    fn the_bound_is_16_bytes_per_byte_plus_8_kib() {
        assert_eq!(max_canonical_len(0), 8192);
        assert_eq!(max_canonical_len(1 << 20), (16 << 20) + 8192);
        assert_eq!(max_canonical_len(usize::MAX), usize::MAX);
        let e = too_large("1e60000000");
        assert_eq!(
            e.to_string(),
            "request's canonical form would exceed 8352 bytes, the limit for a text of 10 bytes \
             (16 bytes per byte plus 8192): its numbers' exponents write out too many digits"
        );
    }

    #[test]
    fn adversarial_numbers_are_refused_before_they_are_written() {
        for text in [
            "1e60000000",
            "-1e-60000000",
            "1.5e999999999",
            "{\"a\":1e60000000}",
            "1e999999999999999999999",
            "1e-999999999999999999999",
            "[0.1e-99999999999999999999999999999999]",
        ] {
            assert_eq!(canonical_json(text), Err(too_large(text)), "{text}");
            assert_eq!(Fingerprint::of_json_text(text), Err(too_large(text)), "{text}");
        }
        // Only JSON is refused for its size: a text that is not JSON is reported as such.
        assert!(matches!(canonical_json("{\"a\":1e60000000,}"), Err(FingerprintError::InvalidJson { offset: 16, .. })));
        assert!(matches!(canonical_json("[1e60000000"), Err(FingerprintError::InvalidJson { offset: 11, .. })));
        let deep = "[1e60000000,".to_owned() + &"[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(canonical_json(&deep), Err(FingerprintError::TooDeep));
        // Zeros never count, however written.
        assert_eq!(canon("0e999999999999999999999"), "0");
        assert_eq!(canon("-0.000e-60000000"), "0");
    }

    #[test]
    fn the_edge_of_the_bound_on_both_sides() {
        // 1eN is N+1 digits from a 2+digits(N)-byte text.
        let edge = max_canonical_len(6) - 1; // 8287: a 6-byte text, exactly the limit
        let at = format!("1e{edge}");
        assert_eq!(canon(&at).len(), max_canonical_len(at.len()));
        let over = format!("1e{}", edge + 1);
        assert_eq!(canonical_json(&over), Err(too_large(&over)));
        // The same in a document, a negative exponent: "[-0.", N-1 zeros, "1]" from "[-1e-N]".
        let fits = |e: usize| {
            let t = format!("[-1e-{e}]");
            (t.clone(), e + 5 <= max_canonical_len(t.len()))
        };
        let mut e = 8000;
        while fits(e + 1).1 {
            e += 1;
        }
        let (at, _) = fits(e);
        assert_eq!(canon(&at).len(), max_canonical_len(at.len()), "{at}");
        let (over, _) = fits(e + 1);
        assert_eq!(canonical_json(&over), Err(too_large(&over)));
        // A long text may carry a proportionally long number: 16 bytes per byte.
        let pad = "x".repeat(100_000);
        let allowed = format!("[\"{pad}\",1e1500000]");
        assert_eq!(canon(&allowed).len(), pad.len() + 3 + 1_500_001 + 2);
        let refused = format!("[\"{pad}\",1e1700000]");
        assert_eq!(canonical_json(&refused), Err(too_large(&refused)));
    }

    #[test]
    fn many_numbers_share_one_bound() {
        // Each alone is allowed; together they exceed the document's bound.
        assert_eq!(canon("[1e8000]").len(), 8003);
        assert_eq!(canonical_json("[1e8000,1e8000]"), Err(too_large("[1e8000,1e8000]")));
        // 1e90 grows by 87 bytes from 5 (with its comma): more than 15 per byte, so enough of
        // them exceed the bound, each near its own share.
        let many = format!("[{}]", vec!["1e90"; 10_000].join(","));
        assert_eq!(canonical_json(&many), Err(too_large(&many)));
        // 1e60 grows by 57: within 15 per byte, so any number of them is allowed.
        let many = format!("[{}]", vec!["1e60"; 100_000].join(","));
        assert_eq!(canon(&many).len(), 2 + 100_000 * 61 + 99_999);
        // f64 in any spelling: at most 326 digits each.
        assert_eq!(canon("[5e-324]").len(), 2 + 2 + 323 + 1);
        // The longest doubles written in full precision are within 16 per byte, any number of
        // them; the shortest spelling of the smallest, 5e-324, is not: 50 pairs of the two
        // extremes (1.5 kB, 32 kB written out) are allowed, 100 are not.
        let doubles = format!("[{}]", vec!["1.7976931348623157e308"; 10_000].join(","));
        assert_eq!(canon(&doubles).len(), 2 + 10_000 * 309 + 9_999);
        let doubles = format!("[{}]", vec!["1.7976931348623157e308,5e-324"; 50].join(","));
        assert_eq!(canon(&doubles).len(), 2 + 50 * (309 + 1 + 326) + 49);
        let doubles = format!("[{}]", vec!["1.7976931348623157e308,5e-324"; 100].join(","));
        assert_eq!(canonical_json(&doubles), Err(too_large(&doubles)));
    }

    #[test]
    fn long_digit_strings_are_copied_not_expanded() {
        let digits = "123456789".repeat(100_000);
        assert_eq!(canon(&digits), digits);
        let fraction = format!("0.{}1", "0".repeat(1_000_000));
        assert_eq!(canon(&fraction), fraction);
        let trailing = format!("1.{}", "0".repeat(1_000_000));
        assert_eq!(canon(&trailing), "1");
        let shifted = format!("{digits}e-900000");
        assert_eq!(canon(&shifted), format!("0.{digits}"));
        let shifted = format!("{digits}e-899999");
        assert_eq!(canon(&shifted), format!("1.{}", &digits[1..]));
    }

    #[test]
    fn nested_objects_are_sorted_at_every_level_with_their_numbers_in_place() {
        let text = r#"{"b": {"d": 1e40, "c": [1e-40, {"f": 2, "e": 1e33}]}, "a": -1.5e34, "b": {"y": 1e35, "x": {}}}"#;
        let want = format!(
            r#"{{"a":-15{},"b":{{"x":{{}},"y":1{}}}}}"#,
            "0".repeat(33),
            "0".repeat(35)
        );
        assert_eq!(canon(text), want);
        // The dropped duplicate's numbers and objects are not written.
        assert!(!canon(text).contains("\"d\""));
        let text = r#"[{"z": 1e50, "a": [{"k": 1e-45, "j": 0}]}, 7e40]"#;
        let want = format!(r#"[{{"a":[{{"j":0,"k":0.{}1}}],"z":1{}}},7{}]"#, "0".repeat(44), "0".repeat(50), "0".repeat(40));
        assert_eq!(canon(text), want);
    }

    #[test]
    fn the_hash_of_the_written_form_equals_the_streamed_hash() {
        let long_zeros = format!("{{\"b\": [1e20000, {{\"y\": 1e-9000, \"x\": \"{}\"}}], \"a\": 1e100}}", "é\\n".repeat(5000));
        for text in [r#"{"b": 1, "a": [1, 2.50, {"d": null, "c": "\u00e9"}]}"#, "1e8000", long_zeros.as_str(), "[]", "\"\""] {
            let streamed = Fingerprint::of_json_text(text).unwrap();
            assert_eq!(streamed, Fingerprint::of_bytes(canon(text).as_bytes()), "{}", &text[..text.len().min(40)]);
        }
    }

    #[test]
    fn strings_never_grow() {
        // Every escape, raw unicode and surrogate pairs: the canonical form is never longer.
        let text = format!("\"{}\"", r#"\n\u00e9\"\\\/\ud83d\ude00\u001f é😀"#.repeat(10_000));
        assert!(canon(&text).len() <= text.len());
    }
}
