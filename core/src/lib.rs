//! `idempotency-core`: the pure rules of the `idempotency` PostgreSQL extension, shared by the
//! extension (which links this crate into the server) and by its clients. No async stack, no
//! database driver.
//!
//! - [`key`]: the input rules of `operation`, `user_id`, `key` and `request_hash`, and the
//!   validated [`Key`];
//! - [`fingerprint`]: canonical JSON and the request [`Fingerprint`] that `idem_fingerprint`
//!   computes;
//! - [`record`]: how a record is keyed (the id digest of a key) and how its request hash is
//!   stored;
//! - [`vocabulary`]: the words of the SQL API (a record's [`Status`], the answers of
//!   `idem_reserve` and `idem_release`) and the [`Decision`] labels of the clients' traces and
//!   metrics.

#![deny(missing_docs)]

pub mod fingerprint;
pub mod key;
pub mod record;
pub mod vocabulary;

pub use fingerprint::{Fingerprint, FingerprintError};
pub use key::{Key, KeyError};
pub use vocabulary::{Decision, ReleaseOutcome, ReserveWord, Status, UnknownWord};
