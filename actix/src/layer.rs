//! [`IdempotencyLayer`]: idempotency-tower's layer as an actix-web `Transform` (the middleware
//! is `middleware.rs`'s), built by the same [`Builder`](crate::Builder).

use idempotency_client::{postgres_by_default, Driver};

postgres_by_default! {
/// Makes an actix-web resource or scope idempotent: `.wrap(layer)`. Built as idempotency-tower's
/// layer is, with the same [`Builder`](crate::Builder) (one configuration for every stack); from one of those
/// with `From`.
pub struct IdempotencyLayer<D: Driver = Postgres>(pub(crate) idempotency_tower::IdempotencyLayer<D>);
}

idempotency_tower::layer_builders!(IdempotencyLayer);

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
