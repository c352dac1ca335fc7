//! A handler's HTTP response as the layer stores and replays it: a [`StoredResponse`] (the one
//! stored form, shared with `run`) of the status, the allow-listed headers and the exact body
//! bytes, plus the live response of the attempt that ran.

use crate::response::{Body, Replayable, StoredResponse, Verdict};
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The stored form, plus (never stored) the live response of this attempt and the verdict the
/// layer's status policy gave it.
#[derive(Debug)]
pub(crate) struct HttpRecord {
    stored: StoredResponse,
    live: Option<(HeaderMap, Bytes)>,
    verdict: Verdict,
}

impl Serialize for HttpRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.stored.serialize(s)
    }
}

impl<'de> Deserialize<'de> for HttpRecord {
    /// A replayed record: its verdict is the stored one's (replays are successes or failures
    /// already recorded).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(HttpRecord { stored: StoredResponse::deserialize(d)?, live: None, verdict: Verdict::Success })
    }
}

impl Replayable for HttpRecord {
    fn verdict(&self) -> Verdict {
        self.verdict
    }
}

impl HttpRecord {
    /// Records a response: `stored` names the headers kept for replays, `verdict` is the status
    /// policy's.
    pub(crate) fn new(status: StatusCode, headers: HeaderMap, body: Bytes, stored: &[HeaderName], verdict: Verdict) -> Self {
        let kept = stored
            .iter()
            .flat_map(|name| headers.get_all(name).iter().map(move |v| (name, v)))
            .filter_map(|(name, v)| Some((name.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        let stored = StoredResponse { status: status.as_u16(), headers: kept, body: Body::exact(&body) };
        HttpRecord { stored, live: Some((headers, body)), verdict }
    }

    /// The response of the attempt that ran (every header the handler set), or the replay of the
    /// stored one (its allow-listed headers and `Idempotent-Replayed: true`).
    pub(crate) fn into_response<B: From<Bytes>>(self) -> Response<B> {
        let status = StatusCode::from_u16(self.stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if let Some((headers, body)) = self.live {
            let mut response = Response::new(B::from(body));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            return response;
        }
        let mut response = Response::new(B::from(Bytes::from(self.stored.body.to_bytes())));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        for (name, value) in self.stored.headers {
            if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                headers.append(name, value);
            }
        }
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{CONTENT_TYPE, LOCATION, SET_COOKIE};

    fn replay(record: HttpRecord) -> Response<Bytes> {
        let stored = serde_json::to_value(&record).unwrap();
        serde_json::from_value::<HttpRecord>(stored).unwrap().into_response()
    }

    #[test]
    fn replays_status_allow_listed_headers_and_exact_bytes() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(LOCATION, HeaderValue::from_static("/charges/7"));
        headers.insert(SET_COOKIE, HeaderValue::from_static("session=abc"));
        headers.insert("x-other", HeaderValue::from_static("1"));
        let body = Bytes::from_static(b"{\"z\": 1, \"a\": 2}");
        let record = HttpRecord::new(StatusCode::CREATED, headers, body.clone(), &[CONTENT_TYPE, LOCATION], Verdict::Success);
        let response = replay(record);
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.body(), &body);
        let names: Vec<_> = response.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "location", "idempotent-replayed"]);
    }

    #[test]
    fn binary_bodies_round_trip() {
        let body = Bytes::from_static(&[0, 159, 146, 150, 255]);
        let record = HttpRecord::new(StatusCode::OK, HeaderMap::new(), body.clone(), &[], Verdict::Success);
        assert_eq!(replay(record).body(), &body);
    }

    #[test]
    fn the_attempt_that_ran_answers_with_every_header() {
        let mut headers = HeaderMap::new();
        headers.insert(SET_COOKIE, HeaderValue::from_static("session=abc"));
        let record = HttpRecord::new(StatusCode::OK, headers, Bytes::new(), &[], Verdict::Success);
        let response: Response<Bytes> = record.into_response();
        assert!(response.headers().contains_key(SET_COOKIE));
        assert!(!response.headers().contains_key("idempotent-replayed"));
    }
}
