//! [`IdempotencyLayer`]: idempotency-tower's layer as an actix-web `Transform` (the middleware
//! is `middleware.rs`'s), built by the same [`Builder`].

use idempotency_client::{postgres_by_default, Driver, Idempotency};
use idempotency_tower::{Builder, Mode};

postgres_by_default! {
/// Makes an actix-web resource or scope idempotent: `.wrap(layer)`. Built as idempotency-tower's
/// layer is, with the same [`Builder`] (one configuration for every stack); from one of those
/// with `From`.
pub struct IdempotencyLayer<D: Driver = Postgres>(pub(crate) idempotency_tower::IdempotencyLayer<D>);
}

impl<D: Driver> IdempotencyLayer<D> {
    /// A builder over the handle `idem`, in [`Mode::InTransaction`] unless
    /// [`Builder::mode`] says otherwise.
    pub fn builder(idem: Idempotency<D>) -> Builder<D, Self> {
        Builder::new(idem)
    }

    /// A builder for an in-transaction route: its handler writes through the [`crate::Connection`].
    pub fn in_transaction(idem: Idempotency<D>) -> Builder<D, Self> {
        Builder::new(idem).mode(Mode::InTransaction)
    }

    /// A builder for a two-phase route: its handler's effects leave the database.
    pub fn two_phase(idem: Idempotency<D>) -> Builder<D, Self> {
        Builder::new(idem).mode(Mode::TwoPhase)
    }
}

impl<D: Driver> From<idempotency_tower::IdempotencyLayer<D>> for IdempotencyLayer<D> {
    fn from(layer: idempotency_tower::IdempotencyLayer<D>) -> Self {
        IdempotencyLayer(layer)
    }
}

impl<D: Driver> Clone for IdempotencyLayer<D> {
    fn clone(&self) -> Self {
        IdempotencyLayer(self.0.clone())
    }
}

impl<D: Driver> std::fmt::Debug for IdempotencyLayer<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
