//! A route's answer as the layer stores and replays it: a [`StoredResponse`] (the one stored
//! form, shared with `run`) of the status, the allow-listed headers and the exact body bytes,
//! the trailers when there are any (a gRPC answer's `grpc-status`, `grpc-message` and the rest),
//! plus the live answer of the attempt that ran.

use crate::reply::Reply;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, SET_COOKIE};
use http::StatusCode;
use idempotency_client::{Body, Replayable, StoredResponse, Verdict};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The stored form, plus (never stored) the live answer of this attempt and the verdict the
/// layer's status policy gave it.
#[derive(Debug)]
pub(crate) struct HttpRecord {
    stored: StoredResponse,
    /// The trailers, in order (stored as `"trailers"`, a list of `[name, value]`, when present).
    trailers: Option<Vec<(String, String)>>,
    live: Option<Reply>,
    verdict: Verdict,
}

impl Serialize for HttpRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Some(trailers) = &self.trailers else { return self.stored.serialize(s) };
        let mut value = serde_json::to_value(&self.stored).map_err(serde::ser::Error::custom)?;
        if let Some(members) = value.as_object_mut() {
            members.insert("trailers".to_owned(), serde_json::to_value(trailers).map_err(serde::ser::Error::custom)?);
        }
        value.serialize(s)
    }
}

impl<'de> Deserialize<'de> for HttpRecord {
    /// A replayed record: its verdict is the stored one's (replays are successes or failures
    /// already recorded).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut value = serde_json::Value::deserialize(d)?;
        let trailers = match value.as_object_mut().and_then(|m| m.remove("trailers")) {
            Some(t) => Some(serde_json::from_value(t).map_err(serde::de::Error::custom)?),
            None => None,
        };
        let stored = StoredResponse::deserialize(value).map_err(serde::de::Error::custom)?;
        Ok(HttpRecord { stored, trailers, live: None, verdict: Verdict::Success })
    }
}

impl Replayable for HttpRecord {
    fn verdict(&self) -> Verdict {
        self.verdict
    }
}

impl HttpRecord {
    /// Records an answer: `stored` names the headers kept for replays (every trailer is kept but
    /// `Set-Cookie` and `Authorization`), `verdict` is the status policy's.
    pub(crate) fn new(reply: Reply, stored: &[HeaderName], verdict: Verdict) -> Self {
        let kept = stored
            .iter()
            .flat_map(|name| reply.headers.get_all(name).iter().map(move |v| (name, v)))
            .filter_map(|(name, v)| Some((name.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        let trailers = reply.trailers.as_ref().map(|trailers| {
            trailers
                .iter()
                .filter(|(name, _)| **name != SET_COOKIE && **name != AUTHORIZATION)
                .filter_map(|(name, v)| Some((name.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                .collect()
        });
        let stored = StoredResponse { status: reply.status.as_u16(), headers: kept, body: Body::exact(&reply.body) };
        HttpRecord { stored, trailers, live: Some(reply), verdict }
    }

    /// Whether this is a stored answer read back (not the attempt that ran).
    pub(crate) fn is_replay(&self) -> bool {
        self.live.is_none()
    }

    /// The answer of the attempt that ran (every header the handler set), or the replay of the
    /// stored one (its allow-listed headers, its trailers and `Idempotent-Replayed: true`).
    pub(crate) fn into_reply(self) -> Reply {
        if let Some(live) = self.live {
            return live;
        }
        let status = StatusCode::from_u16(self.stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut headers = HeaderMap::new();
        for (name, value) in self.stored.headers {
            if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                headers.append(name, value);
            }
        }
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
        let trailers = self.trailers.map(|stored| {
            let mut trailers = HeaderMap::new();
            for (name, value) in stored {
                if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                    trailers.append(name, value);
                }
            }
            trailers
        });
        Reply { status, headers, body: Bytes::from(self.stored.body.to_bytes()), trailers }
    }

    /// [`HttpRecord::into_reply`] as an HTTP response of any body built from bytes.
    #[cfg(test)]
    pub(crate) fn into_response<B: From<Bytes>>(self) -> http::Response<B> {
        self.into_reply().into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{CONTENT_TYPE, LOCATION, SET_COOKIE};
    use http::Response;


    fn reply(status: StatusCode, headers: HeaderMap, body: Bytes, trailers: Option<HeaderMap>) -> Reply {
        Reply { status, headers, body, trailers }
    }

    #[test]
    fn trailers_are_stored_and_replayed_in_order() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("5"));
        trailers.insert("grpc-message", HeaderValue::from_static("no%20such%20account"));
        trailers.insert("x-detail-bin", HeaderValue::from_static("AAEC"));
        trailers.insert(SET_COOKIE, HeaderValue::from_static("session=abc"));
        let record = HttpRecord::new(reply(StatusCode::OK, HeaderMap::new(), Bytes::new(), Some(trailers)), &[], Verdict::Failure);
        let stored = serde_json::to_value(&record).unwrap();
        let replayed = serde_json::from_value::<HttpRecord>(stored).unwrap().into_reply();
        let replayed = replayed.trailers.expect("trailers replayed");
        let names: Vec<_> = replayed.iter().map(|(k, v)| (k.as_str(), v.to_str().unwrap())).collect();
        assert_eq!(names, [("grpc-status", "5"), ("grpc-message", "no%20such%20account"), ("x-detail-bin", "AAEC")]);
        // Without trailers the stored form is exactly a StoredResponse's.
        let plain = HttpRecord::new(reply(StatusCode::OK, HeaderMap::new(), Bytes::new(), None), &[], Verdict::Success);
        assert!(serde_json::to_value(&plain).unwrap().get("trailers").is_none());
    }

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
        let record = HttpRecord::new(reply(StatusCode::CREATED, headers, body.clone(), None), &[CONTENT_TYPE, LOCATION], Verdict::Success);
        let response = replay(record);
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.body(), &body);
        let names: Vec<_> = response.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "location", "idempotent-replayed"]);
    }

    #[test]
    fn binary_bodies_round_trip() {
        let body = Bytes::from_static(&[0, 159, 146, 150, 255]);
        let record = HttpRecord::new(reply(StatusCode::OK, HeaderMap::new(), body.clone(), None), &[], Verdict::Success);
        assert_eq!(replay(record).body(), &body);
    }

    #[test]
    fn the_attempt_that_ran_answers_with_every_header() {
        let mut headers = HeaderMap::new();
        headers.insert(SET_COOKIE, HeaderValue::from_static("session=abc"));
        let record = HttpRecord::new(reply(StatusCode::OK, headers, Bytes::new(), None), &[], Verdict::Success);
        let response: Response<Bytes> = record.into_response();
        assert!(response.headers().contains_key(SET_COOKIE));
        assert!(!response.headers().contains_key("idempotent-replayed"));
    }
}
