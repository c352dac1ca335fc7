//! The layer's traces and metrics: one span per covered request, events for its decisions, and
//! (feature `metrics`) `idempotency_requests_total` and `idempotency_duration_seconds` through
//! the `metrics` facade, both labelled with `operation` and `outcome`. The `operation` label is
//! bounded: the configured name or the matched route, never a raw path (a request that matched
//! no route is labelled with its method and `(unmatched)`), and never the namespace.

use crate::problem::Problem;
use idempotency_client::Decision;
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};
use tracing::field::Empty;
use tracing::Span;

/// The span and clock of one covered request.
pub(crate) struct Observed {
    span: Span,
    operation: String,
    started: Instant,
}

impl Observed {
    pub(crate) fn start(operation: &str, mode: &'static str) -> Self {
        let span = tracing::info_span!(
            "idempotency.request",
            operation = operation,
            mode = mode,
            key = Empty,
            outcome = Empty,
            status = Empty,
            duration_ms = Empty,
        );
        Observed { span, operation: operation.to_owned(), started: Instant::now() }
    }

    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// Records the key: a hash of it (the first 16 hex digits of its SHA-256) unless `raw`.
    pub(crate) fn key(&self, key: &str, raw: bool) {
        if raw {
            self.span.record("key", key);
        } else {
            self.span.record("key", key_hash(key).as_str());
        }
    }

    /// Closes a request answered before it reached the store (400, 401, 413) with `problem`,
    /// and gives the problem back.
    pub(crate) fn reject(self, problem: Problem) -> Problem {
        self.refused(&problem);
        problem
    }

    /// [`Observed::reject`] by reference.
    pub(crate) fn refused(self, problem: &Problem) {
        let status = problem.status();
        self.span.in_scope(|| tracing::info!(status, "idempotency request rejected"));
        self.finish(Decision::Rejected, status);
    }

    /// Closes the request: span fields, the decision event, the metrics.
    pub(crate) fn finish(self, outcome: Decision, status: u16) {
        let elapsed: Duration = self.started.elapsed();
        self.span.record("outcome", outcome.as_str());
        self.span.record("status", status);
        self.span.record("duration_ms", elapsed.as_secs_f64() * 1000.0);
        self.span.in_scope(|| tracing::info!(outcome = outcome.as_str(), status, "idempotency decision"));
        #[cfg(feature = "metrics")]
        {
            let labels = [("operation", self.operation.clone()), ("outcome", outcome.as_str().to_owned())];
            metrics::counter!("idempotency_requests_total", &labels).increment(1);
            metrics::histogram!("idempotency_duration_seconds", &labels).record(elapsed.as_secs_f64());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = &self.operation;
    }
}

/// The first 16 hex digits of the SHA-256 of a key: enough to correlate, not to recover it.
pub(crate) fn key_hash(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect()
}
