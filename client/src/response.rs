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
/// kept byte for byte) or `"hex"` (any other body, in lowercase hex).
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
    /// The body of exactly these bytes: text when they are UTF-8.
    pub fn exact(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => Body::Text(text.to_owned()),
            Err(_) => Body::Bytes(bytes.to_vec()),
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

impl StoredResponse {
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

/// The stored form, field by field.
#[derive(Serialize, Deserialize)]
struct Form {
    status: u16,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hex: Option<String>,
}

impl Serialize for StoredResponse {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let headers = self.headers.iter().filter(|(name, _)| stored_header(name)).cloned().collect();
        let (mut body, mut text, mut hex) = (None, None, None);
        match &self.body {
            Body::Json(v) => body = Some(v.clone()),
            Body::Text(t) => text = Some(t.clone()),
            Body::Bytes(b) => hex = Some(b.iter().map(|b| format!("{b:02x}")).collect()),
        }
        Form { status: self.status, headers, body, text, hex }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for StoredResponse {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let form = Form::deserialize(d)?;
        let body = match (form.text, form.hex, form.body) {
            (Some(text), _, _) => Body::Text(text),
            (None, Some(hex), _) => Body::Bytes(from_hex(&hex).ok_or_else(|| serde::de::Error::custom("hex: not hex digits"))?),
            (None, None, body) => Body::Json(body.unwrap_or(serde_json::Value::Null)),
        };
        Ok(StoredResponse { status: form.status, headers: form.headers, body })
    }
}

fn from_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| hex.get(i..i + 2).and_then(|pair| u8::from_str_radix(pair, 16).ok())).collect()
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
    fn plain_values_are_successes() {
        assert_eq!(Json(json!({"a": 1})).verdict(), Verdict::Success);
        assert_eq!(to_stored(&Json(vec![1, 2])).unwrap(), json!([1, 2]));
    }
}
