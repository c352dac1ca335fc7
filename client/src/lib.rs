//! `idempotency-client`: the Rust side of the `idempotency` PostgreSQL extension.
//!
//! Built without default features, this crate is only the pure rules shared with the extension:
//! [`fingerprint`] (the canonical JSON hash that `idem_fingerprint` computes) and [`key`] (the
//! input rules of the SQL API).

pub mod fingerprint;
pub mod key;

pub use fingerprint::{Fingerprint, FingerprintError};
pub use key::{Key, KeyError};
