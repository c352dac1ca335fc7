//! What the native functions work on, resolved once per backend: the OIDs of the extension's
//! relations (in the schema of the function being called), the column numbers they read, the
//! `idem_reservation` row type, and the kept SPI plans of the schema ([`Plans`], which know only
//! the schema's quoted name).
//!
//! PostgreSQL tells every backend when a relation changes or goes away (relcache invalidation);
//! [`invalidated`] marks the cache stale when that concerns one of these relations (or all
//! relations), and the next call resolves everything again. A call in progress keeps the
//! catalog it started with (an `Rc`), so nothing is freed under it.

use super::plans::Plans;
use crate::args::raise;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::{self, AttrNumber, Oid};
use pgrx::spi::Spi;
use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::rc::Rc;

/// Column numbers of `idem_records` that the probe reads.
pub(crate) struct RecordColumns {
    pub(crate) request_hash: AttrNumber,
    pub(crate) status: AttrNumber,
    pub(crate) response: AttrNumber,
    pub(crate) lease_expires_at: AttrNumber,
    pub(crate) expires_at: AttrNumber,
    pub(crate) created_at: AttrNumber,
    /// The role the record belongs to (0.6.0, guarantee 8); `None` on a schema of an older
    /// version still running this library (before its update), which has no owners to check.
    pub(crate) owner: Option<AttrNumber>,
    /// The step of the record's last recovery point (0.7.0); `None` on a schema of an older
    /// version still running this library, which has no recovery points.
    pub(crate) step: Option<AttrNumber>,
}

/// Column numbers of `idem_retries` that the probe reads.
pub(crate) struct RetryColumns {
    pub(crate) attempts: AttrNumber,
    pub(crate) expires_at: AttrNumber,
    /// The role the counter belongs to (0.7.0, as `RecordColumns::owner`); `None` on a schema
    /// of an older version still running this library.
    pub(crate) owner: Option<AttrNumber>,
}

pub(crate) struct Catalog {
    /// The extension's schema.
    pub(crate) schema: Oid,
    pub(crate) records: Oid,
    pub(crate) records_pkey: Oid,
    pub(crate) retries: Oid,
    pub(crate) retries_pkey: Oid,
    pub(crate) token_seq: Oid,
    /// The `idem_reservation` composite type: its pg_class entry and its tuple descriptor
    /// (a copy in TopMemoryContext, freed with the catalog).
    reservation_rel: Oid,
    pub(crate) reservation: pg_sys::TupleDesc,
    pub(crate) rec: RecordColumns,
    pub(crate) ret: RetryColumns,
    pub(crate) plans: Plans,
    /// `idem_records` is a Citus distributed (or reference) table: the rows live in shards, and
    /// the table here is an empty shell, so every read goes through the planner ([`probe`]
    /// reads by a kept SPI plan instead of the direct index probe).
    ///
    /// [`probe`]: super::probe
    pub(crate) distributed: bool,
    /// Added to every token this node issues: the Citus node group times 2^48 (0 without Citus
    /// and on the coordinator, group 0). Each node has its own `idem_token_seq`; the offsets
    /// keep their tokens disjoint, so tokens stay unique across the cluster (and increase per
    /// node only), a node added later included, with nothing to configure.
    pub(crate) token_base: i64,
    /// Citus's `pg_dist_local_group` (InvalidOid without Citus): a change to this node's group
    /// invalidates it, and with it this catalog, so `token_base` follows.
    local_group: Oid,
}

impl Catalog {
    fn concerns(&self, relid: Oid) -> bool {
        relid != pg_sys::InvalidOid
            && [
                self.records,
                self.records_pkey,
                self.retries,
                self.retries_pkey,
                self.token_seq,
                self.reservation_rel,
                self.local_group,
            ]
            .contains(&relid)
    }
}

impl Drop for Catalog {
    fn drop(&mut self) {
        if super::exiting() {
            return;
        }
        // SAFETY: the descriptor was copied into TopMemoryContext by `resolve` and nothing else
        // holds it: the last `Rc` is going away.
        unsafe { pg_sys::FreeTupleDesc(self.reservation) };
    }
}

thread_local! {
    /// The functions known to live in the cached catalog's schema, and the catalog.
    static CURRENT: RefCell<Option<(Vec<Oid>, Rc<Catalog>)>> = const { RefCell::new(None) };
    /// Set by [`invalidated`]; the next call resolves again.
    static STALE: Cell<bool> = const { Cell::new(false) };
}

/// The relcache invalidation callback (registered in `_PG_init`): marks the cache stale when
/// the invalidation concerns one of its relations, all relations, or arrives while no catalog
/// is cached (it may be for relations being resolved right now). Never frees anything: it can
/// run in the middle of a call, whenever PostgreSQL processes invalidation messages.
///
/// # Safety
/// Called by PostgreSQL's invalidation machinery with a relation OID (or InvalidOid).
pub(crate) unsafe extern "C-unwind" fn invalidated(_arg: pg_sys::Datum, relid: Oid) {
    let concerned = CURRENT.with(|current| match current.try_borrow() {
        Ok(current) => match current.as_ref() {
            Some((_, catalog)) => relid == pg_sys::InvalidOid || catalog.concerns(relid),
            None => true,
        },
        Err(_) => true,
    });
    if concerned {
        STALE.with(|stale| stale.set(true));
    }
}

/// Registers [`invalidated`]; called once, from `_PG_init`.
pub(crate) fn register_invalidation() {
    // SAFETY: a static function pointer; PostgreSQL keeps it for the life of the backend.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(invalidated), pg_sys::Datum::from(0)) };
}

/// The catalog of the schema that holds function `fn_oid` (one of the extension's functions).
pub(crate) fn for_function(fn_oid: Oid) -> Rc<Catalog> {
    // Lock the cached records table first (every call reads it under this lock anyway): a
    // transaction that changed it under a stronger lock (a DROP, Citus distributing it) has sent
    // its invalidations before its lock is released, and taking the lock reads them, so a stale
    // cache is found stale now rather than one call later (the change can be visible before its
    // invalidations are sent).
    let cached = CURRENT.with(|current| current.try_borrow().ok().and_then(|c| c.as_ref().map(|(_, catalog)| catalog.records)));
    if let Some(records) = cached {
        // SAFETY: a relation lock by OID inside a transaction (held to its end, as the probe's).
        unsafe { pg_sys::LockRelationOid(records, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
    }
    if STALE.with(|stale| stale.replace(false)) {
        CURRENT.with(|current| current.borrow_mut().take());
    }
    let known = CURRENT.with(|current| {
        current.borrow().as_ref().and_then(|(functions, catalog)| functions.contains(&fn_oid).then(|| Rc::clone(catalog)))
    });
    if let Some(catalog) = known {
        return catalog;
    }
    // SAFETY: a syscache lookup of an OID; InvalidOid if there is no such function.
    let schema = unsafe { pg_sys::get_func_namespace(fn_oid) };
    let same_schema = CURRENT.with(|current| {
        let mut current = current.borrow_mut();
        match current.as_mut() {
            Some((functions, catalog)) if catalog.schema == schema => {
                functions.push(fn_oid);
                Some(Rc::clone(catalog))
            }
            _ => None,
        }
    });
    if let Some(catalog) = same_schema {
        return catalog;
    }
    let catalog = Rc::new(resolve(schema));
    CURRENT.with(|current| *current.borrow_mut() = Some((vec![fn_oid], Rc::clone(&catalog))));
    catalog
}

fn missing(what: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
        format!("the idempotency extension's {what} is missing from its schema: reinstall the extension"),
    )
}

fn relation(schema: Oid, name: &str) -> Oid {
    let Ok(c) = CString::new(name) else { missing(name) };
    // SAFETY: a valid C string and a namespace OID; InvalidOid when there is no such relation.
    let oid = unsafe { pg_sys::get_relname_relid(c.as_ptr(), schema) };
    if oid == pg_sys::InvalidOid {
        missing(name);
    }
    oid
}

fn column(rel: Oid, table: &str, name: &str) -> AttrNumber {
    let Ok(c) = CString::new(name) else { missing(name) };
    // SAFETY: a valid C string and a relation OID; InvalidAttrNumber (0) when there is none.
    let attnum = unsafe { pg_sys::get_attnum(rel, c.as_ptr()) };
    if attnum <= 0 {
        missing(&format!("column {table}.{name}"));
    }
    attnum
}

/// A column that older versions of the schema lack: `None` there.
fn optional_column(rel: Oid, name: &str) -> Option<AttrNumber> {
    let c = CString::new(name).ok()?;
    // SAFETY: a valid C string and a relation OID; InvalidAttrNumber (0) when there is none.
    let attnum = unsafe { pg_sys::get_attnum(rel, c.as_ptr()) };
    (attnum > 0).then_some(attnum)
}

fn resolve(schema: Oid) -> Catalog {
    // SAFETY: a syscache lookup; NULL if the schema is gone.
    let name = unsafe { pg_sys::get_namespace_name(schema) };
    if name.is_null() {
        missing("schema");
    }
    // SAFETY: a non-NULL palloc'd C string; quote_identifier returns it or a palloc'd copy.
    let schema_sql = unsafe { std::ffi::CStr::from_ptr(pg_sys::quote_identifier(name)) }.to_string_lossy().into_owned();
    let records = relation(schema, "idem_records");
    let retries = relation(schema, "idem_retries");
    let reservation_rel = relation(schema, "idem_reservation");
    let records_pkey = relation(schema, "idem_records_pkey");
    let retries_pkey = relation(schema, "idem_retries_pkey");
    let token_seq = relation(schema, "idem_token_seq");
    let rec = RecordColumns {
        request_hash: column(records, "idem_records", "request_hash"),
        status: column(records, "idem_records", "status"),
        response: column(records, "idem_records", "response"),
        lease_expires_at: column(records, "idem_records", "lease_expires_at"),
        expires_at: column(records, "idem_records", "expires_at"),
        created_at: column(records, "idem_records", "created_at"),
        owner: optional_column(records, "owner"),
        step: optional_column(records, "step"),
    };
    let owned = rec.owner.is_some();
    let stepped = rec.step.is_some();
    let ret = RetryColumns {
        attempts: column(retries, "idem_retries", "attempts"),
        expires_at: column(retries, "idem_retries", "expires_at"),
        owner: optional_column(retries, "owner"),
    };
    let counters_owned = ret.owner.is_some();
    // SAFETY: a pg_class OID of a composite type; InvalidOid if it has no row type.
    let reservation_type = unsafe { pg_sys::get_rel_type_id(reservation_rel) };
    if reservation_type == pg_sys::InvalidOid {
        missing("type idem_reservation");
    }
    // The descriptor last, once nothing else can fail: it is copied into TopMemoryContext so it
    // lives as long as the catalog (freed in Drop); the previous context is restored at once.
    // SAFETY: see above; lookup_rowtype_tupdesc_copy raises only for a missing type, checked.
    let reservation = unsafe {
        let previous = pg_sys::CurrentMemoryContext;
        pg_sys::CurrentMemoryContext = pg_sys::TopMemoryContext;
        let desc = pg_sys::lookup_rowtype_tupdesc_copy(reservation_type, -1);
        pg_sys::CurrentMemoryContext = previous;
        desc
    };
    let (distributed, token_base, local_group) = citus(records);
    Catalog {
        distributed,
        token_base,
        local_group,
        schema,
        records,
        records_pkey,
        retries,
        retries_pkey,
        token_seq,
        reservation_rel,
        reservation,
        rec,
        ret,
        plans: Plans::new(schema_sql, owned, counters_owned, stepped, distributed),
    }
}

/// Bits of a token left to a node's own sequence; the Citus node group goes above them.
const TOKEN_GROUP_SHIFT: u32 = 48;

/// Whether `records` is distributed by Citus, this node's token offset, and the OID of Citus's
/// `pg_dist_local_group` ([`Catalog`]).
///
/// The cheap check first: without Citus's catalog `pg_dist_partition` (a syscache lookup of a
/// name in pg_catalog) there is nothing to ask. With Citus, one query reads both facts; a
/// change to `pg_dist_partition` invalidates the distributed table's relcache entry (Citus's
/// trigger), which marks this catalog stale, so the next call sees a table distributed since.
fn citus(records: Oid) -> (bool, i64, Oid) {
    // SAFETY: a syscache lookup of a constant name in pg_catalog; InvalidOid if Citus is absent.
    let partition = unsafe { pg_sys::get_relname_relid(c"pg_dist_partition".as_ptr(), Oid::from(pg_sys::PG_CATALOG_NAMESPACE)) };
    if partition == pg_sys::InvalidOid {
        return (false, 0, pg_sys::InvalidOid);
    }
    // SAFETY: as above.
    let local_group = unsafe { pg_sys::get_relname_relid(c"pg_dist_local_group".as_ptr(), Oid::from(pg_sys::PG_CATALOG_NAMESPACE)) };
    // The OID is a number formatted into constant text, nothing a caller supplies.
    let sql = format!(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition AS p \
                         WHERE p.logicalrelid OPERATOR(pg_catalog.=) {}::pg_catalog.oid), \
                (SELECT g.groupid FROM pg_catalog.pg_dist_local_group AS g)",
        records.to_u32()
    );
    // A read-only SPI call (select): Spi::get_two would assign a transaction ID, which a standby
    // refuses.
    match Spi::connect(|client| client.select(sql.as_str(), Some(1), &[])?.first().get_two::<bool, i32>()) {
        Ok((distributed, group)) => {
            (distributed.unwrap_or(false), i64::from(group.unwrap_or(0).max(0)) << TOKEN_GROUP_SHIFT, local_group)
        }
        Err(e) => raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("reading Citus's catalog failed: {e}")),
    }
}
