//! gRPC's framing of a unary message: a 5-byte header (compressed flag, length) and the message.

/// The message of a unary gRPC request or answer body: the bytes after its 5-byte frame header
/// (an uncompressed frame holding the whole body), for a [`Builder::key_from`](idempotency_tower::Builder::key_from) extractor
/// to decode (`CreateCharge::decode(message(body)?)`). `None` for a compressed frame or a body
/// that is not exactly one frame.
pub fn message(body: &[u8]) -> Option<&[u8]> {
    let (&[flag, a, b, c, d], rest) = body.split_first_chunk::<5>()?;
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    (flag == 0 && rest.len() == len).then_some(rest)
}

/// How many whole frames `body` holds; `None` when it is not a sequence of whole frames.
pub(crate) fn frames(mut body: &[u8]) -> Option<usize> {
    let mut count = 0;
    while !body.is_empty() {
        let (&[_, a, b, c, d], rest) = body.split_first_chunk::<5>()?;
        let len = u32::from_be_bytes([a, b, c, d]) as usize;
        body = rest.get(len..)?;
        count += 1;
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_messages() {
        let one = [&[0u8, 0, 0, 0, 2][..], b"hi"].concat();
        assert_eq!(message(&one), Some(&b"hi"[..]));
        assert_eq!(frames(&one), Some(1));
        let two = [one.clone(), one.clone()].concat();
        assert_eq!((message(&two), frames(&two)), (None, Some(2)));
        assert_eq!(frames(&one[..4]), None);
        assert_eq!(message(&[1, 0, 0, 0, 0]), None, "a compressed frame");
        assert_eq!(frames(b""), Some(0));
    }
}
