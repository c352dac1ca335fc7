//! [`IdempotencyLayer`]: a layer's frozen configuration, shared by every request and every
//! stack's adapter (the tower [`Layer`](tower_layer::Layer) impl is the tower adapter's, in
//! `service.rs`; its builders are in `builder.rs`).

use crate::config::Config;
use idempotency_client::{postgres_by_default, Driver};
use std::sync::Arc;

postgres_by_default! {
/// Makes a tower HTTP service idempotent; see the [crate documentation](crate).
pub struct IdempotencyLayer<D: Driver = Postgres> {
    config: Arc<Config<D>>,
}
}

impl<D: Driver> Clone for IdempotencyLayer<D> {
    fn clone(&self) -> Self {
        IdempotencyLayer { config: self.config.clone() }
    }
}

impl<D: Driver> std::fmt::Debug for IdempotencyLayer<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer").field("mode", &self.config.mode).finish_non_exhaustive()
    }
}

impl<D: Driver> IdempotencyLayer<D> {
    /// The layer of a frozen configuration (what [`Builder::build`](crate::Builder::build) makes).
    pub(crate) fn new(config: Config<D>) -> Self {
        IdempotencyLayer { config: Arc::new(config) }
    }

    /// The frozen configuration, for an adapter's service (tower's, actix-web's, tonic's).
    #[doc(hidden)]
    pub fn config(&self) -> &Arc<Config<D>> {
        &self.config
    }
}
