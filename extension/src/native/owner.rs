//! Guarantee 8: a record belongs to the role that reserved it (the `owner` column of
//! `idem_records`, from 0.6.0). The caller is the session's role, `GetOuterUserId()` (SET ROLE's,
//! else the login role): inside these SECURITY DEFINER functions `GetUserId()` is the extension's
//! owner. As sql/internal.sql's `_idem_caller`, `_idem_owns` and `_idem_check_owner`.

use crate::args::raise;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::{self, Datum, Oid};

/// The session's role, whom a new record belongs to.
pub(crate) fn caller() -> Oid {
    // SAFETY: reads the backend's outer user, set at connection and by SET ROLE.
    unsafe { pg_sys::GetOuterUserId() }
}

/// An `owner` column's value (a regrole datum is an OID).
pub(crate) fn from_datum(value: Datum) -> Oid {
    Oid::from(value.value() as u32)
}

/// Whether the caller may act on a record owned by `owner`: no owner (a record from before
/// 0.6.0), or the caller is that role or a member of it (superusers are members of every role),
/// as `pg_has_role(.., 'MEMBER')`.
pub(crate) fn may_act(owner: Option<Oid>) -> bool {
    match owner {
        None => true,
        // SAFETY: a catalog lookup (cached per backend) inside a transaction.
        Some(owner) => unsafe { pg_sys::is_member_of_role(caller(), owner) },
    }
}

/// 42501 unless the caller may act on a record owned by `owner`; `action` says what was refused.
pub(crate) fn require(owner: Option<Oid>, action: &str) {
    let Some(role) = owner.filter(|_| !may_act(owner)) else { return };
    // As regrole prints it: the quoted name, or the OID of a role dropped since.
    // SAFETY: a syscache lookup; NULL (noerr) for a dropped role; quote_identifier returns its
    // argument or a palloc'd copy.
    let name = unsafe {
        let name = pg_sys::GetUserNameFromId(role, true);
        if name.is_null() {
            role.to_u32().to_string()
        } else {
            std::ffi::CStr::from_ptr(pg_sys::quote_identifier(name)).to_string_lossy().into_owned()
        }
    };
    raise(
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        format!("permission denied to {action}: the key belongs to role {name} (only that role and its members may act on it)"),
    )
}
