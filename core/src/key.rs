//! The scope of an idempotency key, validated with the SQL API's own rules (the extension links
//! this module and applies them natively), so bad input fails before a round trip.
//!
//! `operation`, `user_id` and `key` are each 1 to 255 bytes with no control characters
//! (U+0000–U+001F, U+007F–U+009F); `request_hash` is 1 to 255 bytes. The messages are the ones
//! the extension raises with SQLSTATE 22023.

use std::fmt;

/// The longest `operation`, `user_id`, `key` or `request_hash`, in bytes.
pub(crate) const MAX_PART_BYTES: usize = 255;

/// Why a key part was refused. The message names the argument and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Empty, or longer than 255 bytes.
    #[error("{name} must be 1 to {MAX_PART_BYTES} bytes, got {len}")]
    Length {
        /// The argument (`operation`, `user_id`, `key` or `request_hash`).
        name: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// Contains a control character.
    #[error("{name} must not contain control characters (U+0000-U+001F, U+007F-U+009F), found one at byte {offset}")]
    ControlCharacter {
        /// The argument (`operation`, `user_id` or `key`).
        name: &'static str,
        /// The byte offset of the first control character.
        offset: usize,
    },
}

impl KeyError {
    /// The argument the error is about (`operation`, `user_id`, `key` or `request_hash`).
    pub fn argument(&self) -> &'static str {
        match self {
            KeyError::Length { name, .. } | KeyError::ControlCharacter { name, .. } => name,
        }
    }
}

/// Whether `c` is a control character by the SQL API's rule.
fn is_control(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

/// Checks one of `operation`, `user_id`, `key` (`name` says which): 1 to 255 bytes, no control
/// characters. The extension applies exactly this function to its arguments.
pub fn check_part(name: &'static str, value: &str) -> Result<(), KeyError> {
    check_length(name, value)?;
    match value.char_indices().find(|&(_, c)| is_control(c)) {
        Some((offset, _)) => Err(KeyError::ControlCharacter { name, offset }),
        None => Ok(()),
    }
}

/// Checks `request_hash`: 1 to 255 bytes (any text is allowed). The extension applies exactly
/// this function to its argument.
pub fn check_request_hash(value: &str) -> Result<(), KeyError> {
    check_length("request_hash", value)
}

fn check_length(name: &'static str, value: &str) -> Result<(), KeyError> {
    if value.is_empty() || value.len() > MAX_PART_BYTES {
        return Err(KeyError::Length { name, len: value.len() });
    }
    Ok(())
}

/// A validated `(operation, user_id, key)`: the scope of one idempotent request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    operation: String,
    user_id: String,
    key: String,
}

impl Key {
    /// Validates the three parts of a key's scope (1 to 255 bytes each, no control characters).
    pub fn new(
        operation: impl Into<String>,
        user_id: impl Into<String>,
        key: impl Into<String>,
    ) -> Result<Self, KeyError> {
        let (operation, user_id, key) = (operation.into(), user_id.into(), key.into());
        check_part("operation", &operation)?;
        check_part("user_id", &user_id)?;
        check_part("key", &key)?;
        Ok(Key { operation, user_id, key })
    }

    /// The operation, such as `payments.create`.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// The user (or tenant) the key belongs to.
    pub fn user_id(&self) -> &str {
        &self.user_id
    }

    /// The idempotency key itself, as the client sent it.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.operation, self.user_id, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_keys_are_accepted() {
        let k = Key::new("payments.create", "user-42", "k-1").unwrap();
        assert_eq!((k.operation(), k.user_id(), k.key()), ("payments.create", "user-42", "k-1"));
        assert!(Key::new("op", "ü", "x".repeat(255)).is_ok());
        assert!(Key::new("op", "u", "é".repeat(127)).is_ok()); // 254 bytes
    }

    #[test]
    fn length_is_counted_in_bytes() {
        assert_eq!(Key::new("op", "u", "").unwrap_err(), KeyError::Length { name: "key", len: 0 });
        assert_eq!(Key::new("op", "u", "x".repeat(256)).unwrap_err().to_string(), "key must be 1 to 255 bytes, got 256");
        assert_eq!(Key::new("op", "é".repeat(128), "k").unwrap_err(), KeyError::Length { name: "user_id", len: 256 });
        assert_eq!(check_request_hash("").unwrap_err().argument(), "request_hash");
    }

    #[test]
    fn control_characters_are_refused() {
        for bad in ["a\u{0}b", "\n", "tab\t", "del\u{7f}", "c1\u{85}", "\u{9f}"] {
            let err = Key::new("op", "u", bad).unwrap_err();
            assert!(matches!(err, KeyError::ControlCharacter { name: "key", .. }), "{bad:?}");
        }
        assert!(Key::new("op\u{1f}", "u", "k").unwrap_err().to_string().starts_with("operation must not contain control characters"));
        // U+00A0 (no-break space) is past the C1 range and allowed.
        assert!(Key::new("op", "u", "\u{a0}").is_ok());
        assert!(check_request_hash("any\ttext").is_ok());
    }
}
