//! How a record is keyed and stored (docs/record-layout.md, "The chosen layout"): the fixed-width
//! id of a key and the 32 bytes a request hash is kept as. The extension computes both here; the
//! PL/pgSQL side computes the same in SQL (sql/schema.sql's `_idem_id` and `_idem_hash`), and
//! tests/tests/args_parity.rs proves the two equal.

use sha2::{Digest, Sha256};

/// The byte that separates the three key parts in the id's input (ASCII unit separator, a
/// control character no key part may contain).
pub const SEPARATOR: u8 = 0x1f;

/// The record's id: the first 16 bytes of SHA-256(operation ‖ 0x1F ‖ user_id ‖ 0x1F ‖ key),
/// over the parts' bytes as the database stores them (its encoding), stored as a `uuid`. Two
/// keys never answer as each other's record: every probe re-checks the three texts.
pub fn id(operation: &[u8], user_id: &[u8], key: &[u8]) -> [u8; 16] {
    let mut hasher = Sha256::new();
    hasher.update(operation);
    hasher.update([SEPARATOR]);
    hasher.update(user_id);
    hasher.update([SEPARATOR]);
    hasher.update(key);
    let digest = hasher.finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    id
}

/// The 32 bytes a request hash is stored as: the value of 64 lowercase hex digits (the
/// fingerprint clients send), else the SHA-256 of the text's bytes, so equal texts stay equal
/// and different ones differ.
pub fn request_hash(text: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    if text.len() == 64 && text.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        for (i, pair) in text.chunks(2).enumerate() {
            out[i] = (nibble(pair[0]) << 4) | nibble(pair[1]);
        }
    } else {
        out.copy_from_slice(&Sha256::digest(text));
    }
    out
}

fn nibble(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        _ => b - b'a' + 10,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn id_is_the_first_16_bytes_of_sha256_over_the_separated_parts() {
        let full = Sha256::digest(b"charge\x1fu1\x1fk1");
        assert_eq!(id(b"charge", b"u1", b"k1"), full[..16]);
        // The separator keeps the parts apart: moving a byte across it changes the id.
        assert_ne!(id(b"ab", b"c", b"k"), id(b"a", b"bc", b"k"));
    }

    #[test]
    fn a_hex_fingerprint_is_stored_as_its_bytes_and_any_other_text_as_its_sha256() {
        let fp = "00ff".repeat(16);
        assert_eq!(hex(&request_hash(fp.as_bytes())), fp);
        // Upper-case hex, another length, any text: hashed.
        let upper = fp.to_uppercase();
        assert_eq!(request_hash(upper.as_bytes())[..], Sha256::digest(upper.as_bytes())[..]);
        assert_eq!(request_hash(b"h1")[..], Sha256::digest(b"h1")[..]);
        assert_ne!(request_hash(b"h1"), request_hash(b"h2"));
    }
}
