//! The database's encoding, at the boundary of every SQL-callable function.
//!
//! The rules (the client crate's key and fingerprint modules) read UTF-8, as the client does;
//! PostgreSQL hands text over in the database's encoding. So every text argument a rule reads
//! is converted to UTF-8 first ([`utf8`]), by PostgreSQL's own conversion: a database in
//! LATIN1, WIN1252, EUC_JP or any other encoding answers exactly as a UTF-8 database does for
//! the same characters (the same fingerprint, the same key lengths in bytes, the same refusals).
//! SQL_ASCII has no conversion: its bytes are read as they are when they are valid UTF-8 and
//! refused (22021, naming the argument) when they are not, so two different byte strings never
//! read as one. The bytes the functions compare with and write to the tables stay the
//! database's own. docs/sql-reference.md, "Databases that are not UTF-8", is the user's side.
//!
//! Messages go the other way: PostgreSQL reads an error message in the database's encoding, and
//! pgrx raises it from a Rust `String` (UTF-8). In a database that converts, a message keeps
//! only ASCII ([`message`]); the one place a rejected value is shown, [`crate::native::call::echo`],
//! shows a non-ASCII value by its size in every database that is not UTF-8 (in SQL_ASCII too,
//! as the portable install must: its bytes need not be UTF-8 there).

use crate::args::raise;
use pgrx::pg_sys;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;

/// The database's encoding, as PostgreSQL numbers them (`pg_enc`).
fn database() -> u32 {
    // SAFETY: reads the encoding the backend fixed when it connected to its database.
    let encoding = unsafe { pg_sys::GetDatabaseEncoding() };
    u32::try_from(encoding).unwrap_or(u32::MAX)
}

/// Whether the database's encoding is UTF8.
pub(crate) fn utf8_database() -> bool {
    database() == pg_sys::pg_enc::PG_UTF8
}

/// Whether text in this database is UTF-8 without a conversion: UTF8, and SQL_ASCII (which
/// stores bytes as the client sent them; [`utf8`] refuses those that are not UTF-8).
pub(crate) fn unconverted() -> bool {
    matches!(database(), pg_sys::pg_enc::PG_UTF8 | pg_sys::pg_enc::PG_SQL_ASCII)
}

/// The text argument `name`, given as `bytes` in the database's encoding, as UTF-8: the same
/// bytes in a UTF8 or SQL_ASCII database and for ASCII text (every server encoding extends
/// ASCII), otherwise PostgreSQL's conversion, whose result lives in the current memory context
/// (for the rest of the call). A character without a UTF-8 equivalent is PostgreSQL's own
/// error (22P05); bytes that are not UTF-8 in a SQL_ASCII database are 22021 naming `name`.
pub(crate) fn utf8<'a>(name: &str, bytes: &'a [u8]) -> &'a str {
    let converted = if bytes.is_ascii() || unconverted() {
        bytes
    } else {
        // A text value is at most 1 GB, so its length fits; the conversion cannot grow it past
        // what PostgreSQL allocates (it raises 54000 itself otherwise).
        let len = i32::try_from(bytes.len())
            .unwrap_or_else(|_| raise(PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED, format!("{name} is too long")));
        // SAFETY: `bytes` is `len` readable bytes in the database's encoding. The function
        // returns its argument when nothing changes, or a palloc'd, NUL-terminated string in
        // the current memory context (text holds no NUL, so its C length is its length).
        unsafe {
            let out = pg_sys::pg_server_to_any(bytes.as_ptr().cast(), len, pg_sys::pg_enc::PG_UTF8 as i32);
            if out.cast_const() == bytes.as_ptr().cast() {
                bytes
            } else {
                std::ffi::CStr::from_ptr(out).to_bytes()
            }
        }
    };
    std::str::from_utf8(converted).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_CHARACTER_NOT_IN_REPERTOIRE,
            format!(
                "{name} must be valid UTF-8 (SQL_ASCII text is not converted), found an invalid byte sequence at byte {}",
                e.valid_up_to()
            ),
        )
    })
}

/// The length in UTF-8 bytes of `bytes`, text in the database's encoding (a response's size, as
/// `_idem_utf8_length` measures it for the PL/pgSQL functions): its own length where text is
/// not converted ([`unconverted`]; SQL_ASCII bytes counted as they are), else its conversion's.
pub(crate) fn utf8_len(bytes: &[u8]) -> usize {
    if unconverted() || bytes.is_ascii() {
        bytes.len()
    } else {
        utf8("response", bytes).len()
    }
}

/// An error message as PostgreSQL may read it in this database: unchanged where text is UTF-8
/// ([`unconverted`]) or the message is ASCII; otherwise each non-ASCII character as `\uXXXX`
/// (`\UXXXXXXXX` beyond the BMP), which reads the same in every encoding. Only a message that
/// quotes a value could carry one, and those show a non-ASCII value by its size here.
pub(crate) fn message(message: String) -> String {
    if message.is_ascii() || unconverted() {
        return message;
    }
    let mut out = String::with_capacity(message.len() + 16);
    for c in message.chars() {
        match u32::from(c) {
            0..=0x7f => out.push(c),
            n @ 0x80..=0xffff => out.push_str(&format!("\\u{n:04x}")),
            n => out.push_str(&format!("\\U{n:08x}")),
        }
    }
    out
}
