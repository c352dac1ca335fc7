//! What a handler returns, how it is stored, and which results are remembered.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// How a finished attempt is recorded: the verdict a [`Replayable`] result gives on itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Stored as `SUCCESS`; duplicates replay it.
    Success,
    /// A permanent failure: stored as `FAILED`; duplicates get [`crate::Error::Failed`] with it.
    Failure,
    /// Transient: the business writes are rolled back and the key released, so a retry runs again.
    Transient,
}

/// A result the client can store (as `jsonb`) and replay. Implement it for your response type
/// (`impl Replayable for Receipt {}` remembers every value as a success), or wrap a value in
/// [`Json`]. [`StoredResponse`] carries the HTTP policy.
pub trait Replayable: Serialize + DeserializeOwned {
    /// How this result is recorded; every value is a success unless you say otherwise.
    fn verdict(&self) -> Verdict {
        Verdict::Success
    }
}

/// Any serialisable value, always remembered as a success.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Json<T>(pub T);

impl<T: Serialize + DeserializeOwned> Replayable for Json<T> {}
impl Replayable for serde_json::Value {}
impl Replayable for String {}
impl Replayable for () {}
impl Replayable for i64 {}

/// Headers never stored, whatever the handler returns: they carry credentials or session state
/// that must not be replayed to whoever retries the key.
const UNSTORED_HEADERS: [&str; 2] = ["set-cookie", "authorization"];

/// An HTTP-shaped response, with the default policy of the contract: 2xx and 3xx are remembered
/// as successes, 4xx as permanent failures except 408, 409, 425 and 429 (released, like 5xx,
/// so the retry runs again). `Set-Cookie` and `Authorization` are never stored: they are left out
/// whenever the response is serialised, however they were added.
///
/// This is the one stored form of a response, for `run` and for the layer alike: `{"status",
/// "headers": [[name, value], ...]}` and one of `"body"` (a JSON body), `"text"` (a UTF-8 body,
/// kept byte for byte) or `"hex"` (any other body, in lowercase hex, encoded and decoded in one
/// pass; the form 0.5.0 stored, so its records replay and it reads these).
///
/// Its size counts against the server's `idempotency.max_response_bytes` (the bytes of its
/// jsonb text, so a binary body costs twice its length): a larger one is never stored, see
/// [`crate::Error::ResponseTooLarge`] and [`StoredResponse::too_large`].
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// The HTTP status code.
    pub status: u16,
    /// Header names and values, in order (never `Set-Cookie` or `Authorization` once stored).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Body,
}

/// The body of a [`StoredResponse`].
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// A JSON value (stored as `"body"`).
    Json(serde_json::Value),
    /// Exact UTF-8 text (stored as `"text"`).
    Text(String),
    /// Exact bytes (stored as `"hex"`).
    Bytes(Vec<u8>),
}

impl Body {
    /// The body of exactly these bytes: text when they are UTF-8 without a NUL (jsonb cannot
    /// hold `\u0000`; a gRPC message's frame header starts with NULs), bytes otherwise.
    pub fn exact(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) if !text.contains('\0') => Body::Text(text.to_owned()),
            _ => Body::Bytes(bytes.to_vec()),
        }
    }

    /// The bytes an HTTP response carries.
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            Body::Json(v) => v.to_string().into_bytes(),
            Body::Text(t) => t.clone().into_bytes(),
            Body::Bytes(b) => b.clone(),
        }
    }

    /// The JSON value: a JSON body, or a text body that parses as JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        match self {
            Body::Json(v) => Some(v.clone()),
            Body::Text(t) => serde_json::from_str(t).ok(),
            Body::Bytes(_) => None,
        }
    }
}

fn stored_header(name: &str) -> bool {
    !UNSTORED_HEADERS.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// The SQLSTATE of a completion whose response is larger than `idempotency.max_response_bytes`
/// (program_limit_exceeded).
pub(crate) const TOO_LARGE_SQLSTATE: &str = "54000";

/// A problem details body (RFC 9457): the one shape of the layer's answers and of the
/// too-large marker.
pub fn problem_body(kind: &str, title: &str, status: u16, detail: &str) -> serde_json::Value {
    serde_json::json!({"type": kind, "title": title, "status": status, "detail": detail})
}

impl StoredResponse {
    /// The `type` of the too-large answers: the marker ([`StoredResponse::too_large`]) and the
    /// layer's in-transaction refusal.
    pub const TOO_LARGE_TYPE: &'static str = "urn:idempotency:problem:response-too-large";
    /// The status of the too-large answers (Bad Gateway: the route's response cannot be relayed).
    pub const TOO_LARGE_STATUS: u16 = 502;
    /// The title of the too-large answers.
    pub const TOO_LARGE_TITLE: &'static str = "Response too large";
    /// The detail of the marker: the request ran, its response was not stored.
    pub const TOO_LARGE_DETAIL: &'static str =
        "the request was performed, but its response is larger than the idempotency store's limit and was not stored";

    /// The marker stored instead of a two-phase result larger than the server's
    /// `idempotency.max_response_bytes` (the outside effect happened, so the key is completed,
    /// never left `PROCESSING` or released): stored `FAILED` and answered to every retry
    /// ([`crate::Error::Failed`] with it; the layer replays it). A 502 problem details body
    /// (`application/problem+json`, type [`StoredResponse::TOO_LARGE_TYPE`]).
    pub fn too_large() -> Self {
        let body = problem_body(Self::TOO_LARGE_TYPE, Self::TOO_LARGE_TITLE, Self::TOO_LARGE_STATUS, Self::TOO_LARGE_DETAIL);
        StoredResponse::json(Self::TOO_LARGE_STATUS, body).with_header("content-type", "application/problem+json")
    }

    /// A response with a JSON body and no headers.
    pub fn json(status: u16, body: serde_json::Value) -> Self {
        StoredResponse { status, headers: Vec::new(), body: Body::Json(body) }
    }

    /// Adds a header, unless it is one that is never stored.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        let name = name.into();
        if stored_header(&name) {
            self.headers.push((name, value.into()));
        }
        self
    }

    /// The JSON value of the body, if it has one (see [`Body::json`]).
    pub fn body_json(&self) -> Option<serde_json::Value> {
        self.body.json()
    }
}

/// The stored form, field by field, as read.
#[derive(Deserialize)]
struct Form {
    status: u16,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    body: Option<serde_json::Value>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    hex: Option<String>,
}

/// The stored form as written: borrowed, so the body is not copied before it is serialised.
#[derive(Serialize)]
struct FormRef<'a> {
    status: u16,
    headers: Vec<&'a (String, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hex: Option<String>,
}

impl Serialize for StoredResponse {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let headers = self.headers.iter().filter(|(name, _)| stored_header(name)).collect();
        let (mut body, mut text, mut hex) = (None, None, None);
        match &self.body {
            Body::Json(v) => body = Some(v),
            Body::Text(t) => text = Some(t.as_str()),
            Body::Bytes(b) => hex = Some(to_hex(b)),
        }
        FormRef { status: self.status, headers, body, text, hex }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for StoredResponse {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let form = Form::deserialize(d)?;
        let body = match (form.text, form.hex, form.body) {
            (Some(text), _, _) => Body::Text(text),
            (None, Some(hex), _) => Body::Bytes(from_hex(&hex).ok_or_else(|| serde::de::Error::custom("hex: not an even number of hex digits"))?),
            (None, None, body) => Body::Json(body.unwrap_or(serde_json::Value::Null)),
        };
        Ok(StoredResponse { status: form.status, headers: form.headers, body })
    }
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Lowercase hex, in one pass into a buffer allocated once.
fn to_hex(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(HEX_DIGITS[usize::from(b >> 4)]);
        out.push(HEX_DIGITS[usize::from(b & 0x0f)]);
    }
    // Only ASCII hex digits were pushed.
    String::from_utf8(out).unwrap_or_default()
}

/// The bytes of hex digits (either case), in one pass; None for an odd length or a non-digit.
fn from_hex(hex: &str) -> Option<Vec<u8>> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let digits = hex.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits.chunks_exact(2).map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?)).collect()
}

impl Replayable for StoredResponse {
    fn verdict(&self) -> Verdict {
        match self.status {
            408 | 409 | 425 | 429 => Verdict::Transient,
            200..=399 => Verdict::Success,
            400..=499 => Verdict::Failure,
            _ => Verdict::Transient,
        }
    }
}

#[cfg(test)]
fn to_stored<T: Replayable>(value: &T) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::to_value(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn http_policy_remembers_2xx_to_4xx_except_408_409_425_429() {
        let class = |s| StoredResponse::json(s, json!(null)).verdict();
        assert_eq!(class(200), Verdict::Success);
        assert_eq!(class(201), Verdict::Success);
        assert_eq!(class(302), Verdict::Success);
        assert_eq!(class(400), Verdict::Failure);
        assert_eq!(class(404), Verdict::Failure);
        assert_eq!(class(422), Verdict::Failure);
        for released in [408, 409, 425, 429] {
            assert_eq!(class(released), Verdict::Transient, "{released}");
        }
        assert_eq!(class(500), Verdict::Transient);
        assert_eq!(class(503), Verdict::Transient);
    }

    #[test]
    fn credentials_are_never_stored() {
        let r = StoredResponse::json(201, json!({"id": 7}))
            .with_header("Set-Cookie", "session=abc")
            .with_header("Location", "/charges/7");
        assert_eq!(r.headers, vec![("Location".to_string(), "/charges/7".to_string())]);
        // Even when pushed directly, storage drops them, also inside a wrapper.
        let mut r = r;
        r.headers.push(("authorization".into(), "Bearer x".into()));
        r.headers.push(("SET-COOKIE".into(), "a=b".into()));
        let stored = to_stored(&r).unwrap();
        assert_eq!(stored, json!({"status": 201, "headers": [["Location", "/charges/7"]], "body": {"id": 7}}));
        let back: StoredResponse = serde_json::from_value(stored).unwrap();
        assert_eq!(back.headers.len(), 1);
        assert_eq!(to_stored(&Json(vec![r.clone()])).unwrap()[0]["headers"], json!([["Location", "/charges/7"]]));
    }

    #[test]
    fn bodies_round_trip_in_the_one_stored_form() {
        for body in [Body::Json(json!({"id": 7})), Body::Text("{\"z\": 1,  \"a\": 2}".into()), Body::Bytes(vec![0, 159, 255])] {
            let r = StoredResponse { status: 201, headers: vec![("Location".into(), "/c/7".into())], body };
            let back: StoredResponse = serde_json::from_value(to_stored(&r).unwrap()).unwrap();
            assert_eq!(back, r);
        }
        assert!(serde_json::from_value::<StoredResponse>(json!({"status": 200, "hex": "0g"})).is_err());
        assert_eq!(Body::Text("{\"a\":1}".into()).json(), Some(json!({"a": 1})));
    }

    #[test]
    fn every_byte_round_trips_through_hex() {
        let every: Vec<u8> = (0..=255).collect();
        let r = StoredResponse { status: 200, headers: vec![], body: Body::Bytes(every.clone()) };
        let stored = to_stored(&r).unwrap();
        let hex = stored["hex"].as_str().unwrap();
        assert_eq!(hex.len(), 512);
        assert!(hex.starts_with("000102") && hex.ends_with("fdfeff"), "{hex}");
        assert_eq!(serde_json::from_value::<StoredResponse>(stored).unwrap().body, Body::Bytes(every));
        // 0.5.0 wrote the same form; its records (any case of digit) still read.
        let old = json!({"status": 200, "headers": [["content-type", "application/octet-stream"]], "hex": "00ff9F"});
        assert_eq!(serde_json::from_value::<StoredResponse>(old).unwrap().body, Body::Bytes(vec![0, 255, 159]));
        assert!(serde_json::from_value::<StoredResponse>(json!({"status": 200, "hex": "abc"})).is_err());
    }

    #[test]
    fn the_too_large_marker_is_a_stored_problem() {
        let marker = StoredResponse::too_large();
        assert_eq!(marker.verdict(), Verdict::Transient, "a 502: only ever stored on purpose, as FAILED");
        let stored = to_stored(&marker).unwrap();
        assert_eq!(stored["status"], json!(502));
        assert_eq!(stored["headers"], json!([["content-type", "application/problem+json"]]));
        assert_eq!(stored["body"]["type"], json!(StoredResponse::TOO_LARGE_TYPE));
        assert_eq!(serde_json::from_value::<StoredResponse>(stored).unwrap(), marker);
    }

    #[test]
    fn plain_values_are_successes() {
        assert_eq!(Json(json!({"a": 1})).verdict(), Verdict::Success);
        assert_eq!(to_stored(&Json(vec![1, 2])).unwrap(), json!([1, 2]));
    }
}
