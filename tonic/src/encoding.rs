//! Compression at the layer's boundary: a covered call is handled in the identity encoding.
//!
//! - A compressed request (`grpc-encoding: gzip` or `deflate`) is decompressed before anything
//!   else reads it, and handed on uncompressed (its `grpc-encoding` removed): the fingerprint
//!   and a [`key_from`](idempotency_tower::Builder::key_from) extractor see the message itself, so a
//!   retry that differs only in compression is the same request. The decompressed message is
//!   bounded by the layer's `body_limit` like an uncompressed one. Another encoding (`zstd`,
//!   `snappy`) is refused with UNIMPLEMENTED and `grpc-accept-encoding: gzip,deflate,identity`,
//!   as the gRPC spec says of an encoding the server cannot read; nothing is reserved.
//! - The request reaches the service without `grpc-accept-encoding`, so it answers
//!   uncompressed: the one stored answer decodes in every client, whatever encodings a retry
//!   accepts. An answer compressed all the same is decompressed before it is stored.

use crate::frame::frames;
use idempotency_client::Driver;
use idempotency_tower::adapter::{self, Config, Failure, Problem};
use idempotency_tower::problem::types;
use http::request::Parts;
use bytes::{BufMut, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName};
use std::io::Read;

const ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
const ACCEPT_ENCODING: HeaderName = HeaderName::from_static("grpc-accept-encoding");

/// The encodings the layer reads, as `grpc-accept-encoding` lists them.
pub(crate) const READABLE: &str = "gzip,deflate,identity";

/// Why a body could not be brought to the identity encoding.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unreadable {
    /// An encoding the layer does not read (its name).
    Unsupported(String),
    /// Decompressed, the message is longer than the limit (bytes).
    TooLarge(usize),
    /// The compressed bytes do not decompress (the decoder's error).
    Corrupt(String),
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreadable::Unsupported(name) => {
                write!(f, "grpc-encoding `{name}` is not one the idempotency layer reads ({READABLE}); send the request uncompressed or in one of those")
            }
            Unreadable::TooLarge(limit) => write!(f, "the decompressed message is larger than {limit} bytes"),
            Unreadable::Corrupt(e) => write!(f, "the compressed message does not decompress: {e}"),
        }
    }
}

/// The layer's answer to a request it cannot bring to the identity encoding (observed as
/// refused): UNIMPLEMENTED for an encoding it does not read, else what a body over the limit or
/// unreadable gets.
pub(crate) fn refused<D: Driver>(config: &Config<D>, parts: &Parts, unreadable: &Unreadable) -> Problem {
    match unreadable {
        Unreadable::Unsupported(_) => {
            let problem = Problem::new(415, types::ENCODING_UNSUPPORTED, "Unsupported grpc-encoding", unreadable.to_string());
            adapter::refused(config, parts, problem)
        }
        Unreadable::TooLarge(_) => adapter::unreadable(config, parts, true, unreadable),
        Unreadable::Corrupt(_) => adapter::unreadable(config, parts, false, unreadable),
    }
}

/// The covered request in the identity encoding: `body` decompressed (its frames' flags
/// cleared), `grpc-encoding` and `grpc-accept-encoding` removed from `headers`.
pub(crate) fn identity_request(headers: &mut HeaderMap, body: Bytes, limit: usize) -> Result<Bytes, Unreadable> {
    headers.remove(ACCEPT_ENCODING);
    let encoding = headers.remove(ENCODING);
    identity(encoding.as_ref().map(|v| v.as_bytes()), body, limit)
}

/// The answer in the identity encoding (`grpc-encoding` removed from `headers`); an answer
/// this layer cannot read is a body failure (the key is released).
pub(crate) fn identity_answer<SE>(headers: &mut HeaderMap, body: Bytes, limit: usize, effect_stands: bool) -> Result<Bytes, Failure<SE>> {
    let encoding = headers.remove(ENCODING);
    match identity(encoding.as_ref().map(|v| v.as_bytes()), body, limit) {
        Ok(body) => Ok(body),
        Err(Unreadable::TooLarge(limit)) => Err(Failure::TooLarge { limit, effect_stands }),
        Err(e) => Err(Failure::Body(format!("the answer is compressed and {e}").into())),
    }
}

/// `body` with every compressed frame decompressed under `encoding` (none, or `identity`:
/// nothing to do). The result, frame headers included, is at most `limit` bytes. A body that is
/// not whole frames is left as it is (the adapter refuses it on its own terms).
fn identity(encoding: Option<&[u8]>, body: Bytes, limit: usize) -> Result<Bytes, Unreadable> {
    let decode: fn(&[u8]) -> Box<dyn Read + '_> = match encoding {
        None | Some(b"identity") => return Ok(body),
        Some(b"gzip") => |b| Box::new(flate2::read::GzDecoder::new(b)),
        Some(b"deflate") => |b| Box::new(flate2::read::ZlibDecoder::new(b)),
        Some(other) => return Err(Unreadable::Unsupported(String::from_utf8_lossy(other).into_owned())),
    };
    if frames(&body).is_none() || !has_compressed_frame(&body) {
        return Ok(body);
    }
    let mut out = BytesMut::with_capacity(body.len().min(limit));
    let mut rest = &body[..];
    while let Some((&[flag, a, b, c, d], tail)) = rest.split_first_chunk::<5>() {
        let len = u32::from_be_bytes([a, b, c, d]) as usize;
        let (message, tail) = tail.split_at(len);
        rest = tail;
        let room = limit.saturating_sub(out.len() + 5);
        let mut plain = Vec::new();
        if flag == 0 {
            plain.extend_from_slice(message);
        } else {
            decode(message).take(room as u64 + 1).read_to_end(&mut plain).map_err(|e| Unreadable::Corrupt(e.to_string()))?;
        }
        if plain.len() > room {
            return Err(Unreadable::TooLarge(limit));
        }
        let len = u32::try_from(plain.len()).map_err(|_| Unreadable::TooLarge(limit))?;
        out.put_u8(0);
        out.put_u32(len);
        out.put_slice(&plain);
    }
    Ok(out.freeze())
}

/// Whether any frame of a body of whole frames says it is compressed.
fn has_compressed_frame(mut body: &[u8]) -> bool {
    while let Some((&[flag, a, b, c, d], rest)) = body.split_first_chunk::<5>() {
        if flag != 0 {
            return true;
        }
        body = rest.get(u32::from_be_bytes([a, b, c, d]) as usize..).unwrap_or_default();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::{GzEncoder, ZlibEncoder};
    use flate2::Compression;
    use http::HeaderValue;
    use std::io::Write;

    fn frame(flag: u8, message: &[u8]) -> Bytes {
        let mut out = vec![flag];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        Bytes::from(out)
    }

    fn gzip(message: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(message).unwrap();
        e.finish().unwrap()
    }

    fn zlib(message: &[u8]) -> Vec<u8> {
        let mut e = ZlibEncoder::new(Vec::new(), Compression::best());
        e.write_all(message).unwrap();
        e.finish().unwrap()
    }

    fn request(encoding: Option<&'static str>, body: Bytes, limit: usize) -> (HeaderMap, Result<Bytes, Unreadable>) {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        if let Some(e) = encoding {
            headers.insert(ENCODING, HeaderValue::from_static(e));
        }
        let body = identity_request(&mut headers, body, limit);
        (headers, body)
    }

    #[test]
    fn every_encoding_of_a_message_becomes_the_same_identity_frame() {
        let message = b"a message that compresses, a message that compresses".repeat(4);
        let plain = frame(0, &message);
        for (encoding, body) in [
            (None, plain.clone()),
            (Some("identity"), plain.clone()),
            (Some("gzip"), frame(1, &gzip(&message))),
            (Some("deflate"), frame(1, &zlib(&message))),
            // A client may send a message uncompressed under an encoding (flag 0).
            (Some("gzip"), plain.clone()),
        ] {
            let (headers, body) = request(encoding, body, 1 << 20);
            assert_eq!(body.as_ref(), Ok(&plain), "{encoding:?}");
            assert!(headers.is_empty(), "grpc-encoding and grpc-accept-encoding removed: {headers:?}");
        }
    }

    #[test]
    fn the_decompressed_message_is_bounded() {
        let bomb = vec![0u8; 1 << 20];
        let (_, body) = request(Some("gzip"), frame(1, &gzip(&bomb)), 4096);
        assert_eq!(body.map(|b| b.len()), Err(Unreadable::TooLarge(4096)));
        // The bound counts the frame header, as the body limit does on an uncompressed body.
        let (_, body) = request(Some("gzip"), frame(1, &gzip(&[7; 4092])), 4096);
        assert_eq!(body.map(|b| b.len()), Err(Unreadable::TooLarge(4096)));
        let (_, body) = request(Some("gzip"), frame(1, &gzip(&[7; 4091])), 4096);
        assert_eq!(body.map(|b| b.len()), Ok(4096));
    }

    #[test]
    fn an_unknown_encoding_or_broken_bytes_are_refused_with_the_rule() {
        let (_, body) = request(Some("zstd"), frame(1, b"\x28\xb5\x2f\xfd"), 4096);
        let e = body.unwrap_err();
        assert_eq!(e, Unreadable::Unsupported("zstd".into()));
        assert!(e.to_string().contains("gzip,deflate,identity"), "{e}");
        let (_, body) = request(Some("gzip"), frame(1, b"not gzip"), 4096);
        assert!(matches!(body, Err(Unreadable::Corrupt(_))), "{body:?}");
    }

    #[test]
    fn a_compressed_answer_is_stored_uncompressed() {
        let mut headers = HeaderMap::new();
        headers.insert(ENCODING, HeaderValue::from_static("gzip"));
        let body = identity_answer::<()>(&mut headers, frame(1, &gzip(b"charge")), 1024, false).ok();
        assert_eq!(body, Some(frame(0, b"charge")));
        assert!(headers.is_empty());
        let over = identity_answer::<()>(&mut HeaderMap::from_iter([(ENCODING, HeaderValue::from_static("gzip"))]), frame(1, &gzip(&[1; 100])), 50, true);
        assert!(matches!(over, Err(Failure::TooLarge { limit: 50, effect_stands: true })));
    }
}
