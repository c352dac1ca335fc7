//! The frozen configuration every request of a layer reads (the [`Builder`](crate::Builder)
//! makes it).

use crate::extract::{KeySource, PolicyFn, ReplayHook, Scope};
use crate::limits::ResponseLimit;
use crate::mode::Mode;
use crate::pointer::Pointer;
use http::header::HeaderName;
use http::Method;
use idempotency_client::{postgres_by_default, Driver, Idempotency};

/// The user id of [`Builder::anonymous`](crate::Builder::anonymous) routes.
pub const ANONYMOUS_USER: &str = "anonymous";

postgres_by_default! {
/// The frozen configuration every request of a layer reads. Hidden: an adapter reads its
/// `mode` and `body_limit` and hands it to the core.
#[doc(hidden)]
pub struct Config<D: Driver = Postgres> {
    pub(crate) idem: Idempotency<D>,
    /// The route's mode.
    pub mode: Mode,
    pub(crate) key: KeySource,
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: bool,
    pub(crate) scope: Scope,
    pub(crate) namespace: Option<String>,
    pub(crate) operation: Option<String>,
    /// The largest request body read, in bytes.
    pub body_limit: usize,
    pub(crate) response_limit: ResponseLimit,
    pub(crate) subset: Option<Vec<Pointer>>,
    pub(crate) query_in_fingerprint: bool,
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) policy: PolicyFn,
    pub(crate) on_replay: Option<ReplayHook>,
    pub(crate) log_keys: bool,
}
}
