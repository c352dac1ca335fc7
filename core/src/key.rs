//! The scope of an idempotency key, validated with the SQL API's own rules (the extension links
//! this module and applies them natively), so bad input fails before a round trip.
//!
//! `operation`, `user_id` and `key` are each 1 to 255 bytes with no control characters
//! (U+0000–U+001F, U+007F–U+009F); `request_hash` is 1 to 255 bytes. The messages are the ones
//! the extension raises with SQLSTATE 22023.
//!
//! [`Key::derive`] gives the idempotency key of one outside step of a request of several steps
//! (docs/recovery-points.md, "Derived keys"); `idem_derive_key` calls the same function.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::fingerprint::hex;

/// The longest `operation`, `user_id`, `key` or `request_hash`, in bytes.
pub(crate) const MAX_PART_BYTES: usize = 255;

/// The longest step name [`Key::derive`] takes, in bytes.
pub const MAX_STEP_NAME_BYTES: usize = 64;

/// The tag that opens every derivation: a new derivation takes a new tag, never this one.
const DERIVE_TAG: &str = "idempotency.derive.v1";

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
    /// The step of a recovery point (`idem_checkpoint`'s ordinal) below 0.
    #[error("step must be at least 0, got {got}")]
    NegativeStep {
        /// The step given.
        got: i32,
    },
    /// A step name given to [`Key::derive`] that is empty or longer than 64 bytes.
    #[error("step must be 1 to {MAX_STEP_NAME_BYTES} bytes, got {len}")]
    StepLength {
        /// Its length in bytes.
        len: usize,
    },
    /// A step name given to [`Key::derive`] with a character outside `[A-Za-z0-9_.-]`.
    #[error("step must contain only [A-Za-z0-9_.-], found another character at byte {offset}")]
    StepCharacter {
        /// The byte offset of the first character refused.
        offset: usize,
    },
}

impl KeyError {
    /// The argument the error is about (`operation`, `user_id`, `key` or `request_hash`).
    pub fn argument(&self) -> &'static str {
        match self {
            KeyError::Length { name, .. } | KeyError::ControlCharacter { name, .. } => name,
            KeyError::NegativeStep { .. } | KeyError::StepLength { .. } | KeyError::StepCharacter { .. } => "step",
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

    /// The idempotency key of the outside step `step` of this request, for the outside service:
    /// `step || "-" ||` the lowercase hex SHA-256 of the tag `idempotency.derive.v1`, the
    /// operation, the user, the key and `step`, each prefixed by its length in bytes (4 bytes,
    /// big-endian), so no two different tuples give the same input. Stable (the same parts give
    /// the same key on every retry, resume and version), distinct (different parts give different
    /// keys, barring a SHA-256 collision), at most 129 bytes and opaque (neither the user nor
    /// the key can be read from it).
    ///
    /// `step` is 1 to 64 bytes of `[A-Za-z0-9_.-]`.
    pub fn derive(&self, step: &str) -> Result<String, KeyError> {
        check_step_name(step)?;
        let mut sha = Sha256::new();
        for part in [DERIVE_TAG, &self.operation, &self.user_id, &self.key, step] {
            // Every part is at most 255 bytes (checked), so the length fits 4 bytes.
            sha.update((part.len() as u32).to_be_bytes());
            sha.update(part.as_bytes());
        }
        Ok(format!("{step}-{}", hex(sha.finalize().as_slice())))
    }
}

/// Checks the step of a recovery point (the ordinal `idem_checkpoint` records: 0 = started, 1..
/// the plan's steps in order): at least 0. The extension applies exactly this function.
pub fn check_recovery_step(step: i32) -> Result<(), KeyError> {
    if step < 0 {
        return Err(KeyError::NegativeStep { got: step });
    }
    Ok(())
}

/// Checks a step name for [`Key::derive`]: 1 to 64 bytes of `[A-Za-z0-9_.-]`.
pub fn check_step_name(step: &str) -> Result<(), KeyError> {
    if step.is_empty() || step.len() > MAX_STEP_NAME_BYTES {
        return Err(KeyError::StepLength { len: step.len() });
    }
    match step.bytes().position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))) {
        Some(offset) => Err(KeyError::StepCharacter { offset }),
        None => Ok(()),
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

    #[test]
    fn derive_is_the_documented_hash() {
        // The rule of docs/recovery-points.md, spelled out once more by hand.
        let k = Key::new("rides.create", "u-1", "k-1").unwrap();
        let mut input = Vec::new();
        for part in ["idempotency.derive.v1", "rides.create", "u-1", "k-1", "charge"] {
            input.extend_from_slice(&u32::try_from(part.len()).unwrap().to_be_bytes());
            input.extend_from_slice(part.as_bytes());
        }
        let expected = format!("charge-{}", hex(Sha256::digest(&input).as_slice()));
        assert_eq!(k.derive("charge").unwrap(), expected);
        // Stable: the same parts, the same key.
        assert_eq!(Key::new("rides.create", "u-1", "k-1").unwrap().derive("charge").unwrap(), expected);
    }

    #[test]
    fn derive_is_injective_on_the_parts() {
        // The doc's example: a plain join with "/" would give "u/a/b" twice.
        let a = Key::new("op", "u", "a/b").unwrap().derive("charge").unwrap();
        let b = Key::new("op", "u/a", "b").unwrap().derive("charge").unwrap();
        assert_ne!(a, b);
        let base = Key::new("op", "u", "k").unwrap();
        let others = [
            Key::new("op2", "u", "k").unwrap().derive("s").unwrap(),
            Key::new("op", "u2", "k").unwrap().derive("s").unwrap(),
            Key::new("op", "u", "k2").unwrap().derive("s").unwrap(),
            base.derive("s2").unwrap(),
        ];
        for other in &others {
            assert_ne!(&base.derive("s").unwrap(), other);
        }
    }

    #[test]
    fn derive_is_short_and_opaque() {
        let k = Key::new("o".repeat(255), "u".repeat(255), "k".repeat(255)).unwrap();
        let d = k.derive("charge").unwrap();
        assert_eq!(d.len(), 71);
        assert!(d.starts_with("charge-") && d[7..].bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(k.derive(&"s".repeat(64)).unwrap().len(), 129);
        assert!(!d.contains("uuu") && !d.contains("kkk"));
    }

    #[test]
    fn derive_checks_the_step_name() {
        let k = Key::new("op", "u", "k").unwrap();
        assert_eq!(k.derive("").unwrap_err(), KeyError::StepLength { len: 0 });
        assert_eq!(k.derive(&"s".repeat(65)).unwrap_err().to_string(), "step must be 1 to 64 bytes, got 65");
        let e = k.derive("charge card").unwrap_err();
        assert_eq!(e, KeyError::StepCharacter { offset: 6 });
        assert_eq!(e.argument(), "step");
        assert_eq!(e.to_string(), "step must contain only [A-Za-z0-9_.-], found another character at byte 6");
        assert!(k.derive("é").is_err());
        assert!(k.derive("A-z_0.9").is_ok());
    }

    #[test]
    fn recovery_steps_start_at_zero() {
        assert!(check_recovery_step(0).is_ok() && check_recovery_step(i32::MAX).is_ok());
        let e = check_recovery_step(-1).unwrap_err();
        assert_eq!((e.argument(), e.to_string().as_str()), ("step", "step must be at least 0, got -1"));
    }
}
