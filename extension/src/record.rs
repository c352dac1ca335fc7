//! `_idem_id(operation, user_id, key)` and `_idem_hash(request_hash)`: how a record is keyed and
//! how its request hash is stored (docs/record-layout.md), computed by the core crate's
//! [`idempotency_core::record`] over the texts' bytes as the database stores them. The portable
//! install computes the same in SQL (sql/portable/record.sql); tests/tests/args_parity.rs proves
//! the two equal.

use idempotency_core::record;
use pgrx::prelude::*;

/// `_idem_id(operation text, user_id text, key text) RETURNS uuid` (STRICT).
#[pg_extern(sql = false, immutable, parallel_safe, strict)]
pub(crate) fn _idem_id(operation: &[u8], user_id: &[u8], key: &[u8]) -> pgrx::Uuid {
    pgrx::Uuid::from_bytes(record::id(operation, user_id, key))
}

/// `_idem_hash(request_hash text) RETURNS bytea` (STRICT).
#[pg_extern(sql = false, immutable, parallel_safe, strict)]
pub(crate) fn _idem_hash(request_hash: &[u8]) -> Vec<u8> {
    record::request_hash(request_hash).to_vec()
}
