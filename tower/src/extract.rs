//! The layer's extractors: where a request's key and user come from, and what a route's answer
//! does to the key. Each is a closure that may hold state (a pool, a verifier) and, for the key and
//! the user, may be async: it gets the request's head (and the key extractor its body) and returns
//! a `'static` future, so clone what the future needs out of the request first.

use crate::reply::Reply;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::request::Parts;
use idempotency_client::Verdict;
use std::future::Future;
use std::sync::Arc;

/// Finds the user a request acts for (the authenticated principal), or `None` (answered 401).
pub type UserFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// An async user extractor, as the layer keeps it.
pub(crate) type AsyncUserFn = Arc<dyn Fn(&Parts) -> BoxFuture<'static, Option<String>> + Send + Sync>;

/// An async key extractor (head and body), as the layer keeps it.
pub(crate) type AsyncKeyFn = Arc<dyn Fn(&Parts, &Bytes) -> BoxFuture<'static, Option<String>> + Send + Sync>;

/// The status policy, as the layer keeps it.
pub(crate) type PolicyFn = Arc<dyn Fn(u16) -> Verdict + Send + Sync>;

/// The hook a replayed answer passes through before it is sent.
pub(crate) type ReplayHook = Arc<dyn Fn(&mut Reply) + Send + Sync>;

/// Boxes an async user extractor.
pub(crate) fn user_fn<F, Fut>(f: F) -> AsyncUserFn
where
    F: Fn(&Parts) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<String>> + Send + 'static,
{
    Arc::new(move |parts: &Parts| Box::pin(f(parts)) as BoxFuture<'static, Option<String>>)
}

/// Boxes an async key extractor.
pub(crate) fn key_fn<F, Fut>(f: F) -> AsyncKeyFn
where
    F: Fn(&Parts, &Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<String>> + Send + 'static,
{
    Arc::new(move |parts: &Parts, body: &Bytes| Box::pin(f(parts, body)) as BoxFuture<'static, Option<String>>)
}

/// Whose records a route's keys live in.
#[derive(Clone)]
pub(crate) enum Scope {
    /// The user a request acts for.
    User(AsyncUserFn),
    /// Every caller shares one scope (routes without authentication must say so).
    Anonymous,
}

/// Where the key comes from.
#[derive(Clone)]
pub(crate) enum KeySource {
    /// A request header (an sf-string or a bare token), read before the body.
    Header(http::HeaderName),
    /// A closure over the request's head and body, called once the body is read.
    Extractor(AsyncKeyFn),
}
