//! tests/tests/layer_observability/suite.rs over sqlx, in a process of its own (the suite
//! installs the process's global tracing subscriber and metrics recorder).

mod kit {
    pub(crate) use idempotency_testkit::driver::over_sqlx::*;
}

#[path = "layer_observability/suite.rs"]
mod over_sqlx;
