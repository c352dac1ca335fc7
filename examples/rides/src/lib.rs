//! Brandur Leach's ride flow ("Implementing Stripe-like idempotency keys in Postgres",
//! `brandur/rocket-rides-atomic`) as a request of several steps under one key
//! (`Idempotency::run_steps`, the repository's docs/recovery-points.md):
//!
//! 1. `create_ride` (local): insert the ride, committed with its recovery point;
//! 2. `charge` (outside): charge the card through the card network's stub, with the derived key
//!    of the step as its `Idempotency-Key`;
//! 3. `receipt` (outside): send the receipt through the mailer's stub, the same way;
//! 4. finish: mark the ride done and answer, committed with the key's completion.
//!
//! The plan is written once over both drivers ([`store::Rides`]); [`stub`] is the outside
//! service (one effective call per `Idempotency-Key`, every call counted), served by the crash
//! test (tests/tests/steps.rs) and the benchmark (`bench --steps`). [`plan`] takes a hook called
//! at each boundary between and inside the steps: the crash test's child process aborts there.

pub mod store;
pub mod stub;

use idempotency_client::{HandlerError, Plan, StoredResponse};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;

pub use store::Rides;

/// The operation of the ride flow's keys.
pub const OPERATION: &str = "rides.create";

/// What the client asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RideRequest {
    /// The rider.
    pub user: String,
    /// The fare, in cents.
    pub amount: i64,
}

/// The state carried from step to step and saved with each recovery point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RideState {
    /// The request (recovery point 0).
    pub request: RideRequest,
    /// The ride's row, once `create_ride` committed.
    pub ride_id: Option<i64>,
    /// The card network's charge, once `charge` returned.
    pub charge_id: Option<String>,
    /// The mailer's receipt, once `receipt` returned.
    pub receipt_id: Option<String>,
}

impl From<RideRequest> for RideState {
    fn from(request: RideRequest) -> Self {
        RideState { request, ride_id: None, charge_id: None, receipt_id: None }
    }
}

/// A step's failure: transient (the default of [`HandlerError`]), so the key is released and
/// resumed at its last recovery point.
#[derive(Debug)]
pub struct RideError(pub String);

impl std::fmt::Display for RideError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RideError {}

impl HandlerError for RideError {}

/// The boundaries of the flow, in order, where a process may die (docs/recovery-points.md, "The
/// proof plan"); [`plan`]'s hook is called with each name as the flow reaches it.
pub const BOUNDARIES: [&str; 9] = [
    "before_reserve",
    "after_reserve",
    "in_ride",
    "after_ride",
    "after_charge_call",
    "after_charge",
    "after_receipt_call",
    "after_receipt",
    "in_finish",
];

/// Called at each boundary (the crash test's child aborts at one).
pub type Hook = Arc<dyn Fn(&str) + Send + Sync>;

/// A hook that does nothing.
pub fn no_hook() -> Hook {
    Arc::new(|_| {})
}

/// Where the outside services are.
#[derive(Debug, Clone)]
pub struct Services {
    /// The card network's stub (`POST`, answers `{"id": ..}`).
    pub charge: String,
    /// The mailer's stub.
    pub receipt: String,
    /// The HTTP client.
    pub http: reqwest::Client,
}

impl Services {
    /// The two stubs at these base URLs.
    pub fn new(charge: impl Into<String>, receipt: impl Into<String>) -> Self {
        Services { charge: charge.into(), receipt: receipt.into(), http: reqwest::Client::new() }
    }
}

/// The answer of a finished ride: the same for every run of a key, crashed or not (the ride's
/// row id is left out: it is the database's, not the request's).
pub fn response(state: &RideState) -> StoredResponse {
    StoredResponse::json(
        201,
        json!({
            "user": state.request.user,
            "amount": state.request.amount,
            "charge": state.charge_id,
            "receipt": state.receipt_id,
            "done": true,
        }),
    )
}

/// The ride flow's plan over driver `D`, calling `services`, with `hook` called at each of
/// [`BOUNDARIES`] but the first (which comes before `run_steps`).
pub fn plan<D: Rides>(services: Services, hook: Hook) -> Plan<RideState, StoredResponse, RideError, D> {
    let (charge, receipt) = (services.clone(), services);
    let (h1, h2, h3, h4) = (hook.clone(), hook.clone(), hook.clone(), hook);
    Plan::new()
        .local_boxed("create_ride", move |tx, mut s: RideState| {
            let hook = h1.clone();
            Box::pin(async move {
                hook("after_reserve");
                s.ride_id = Some(D::insert_ride(tx, &s.request).await?);
                hook("in_ride");
                Ok(s)
            })
        })
        .outside_boxed("charge", move |derived, mut s: RideState| {
            let (hook, services) = (h2.clone(), charge.clone());
            Box::pin(async move {
                hook("after_ride");
                s.charge_id = Some(stub::call(&services.http, &services.charge, derived.as_str(), json!({"amount": s.request.amount})).await?);
                hook("after_charge_call");
                Ok(s)
            })
        })
        .outside_boxed("receipt", move |derived, mut s: RideState| {
            let (hook, services) = (h3.clone(), receipt.clone());
            Box::pin(async move {
                hook("after_charge");
                s.receipt_id = Some(stub::call(&services.http, &services.receipt, derived.as_str(), json!({"user": s.request.user})).await?);
                hook("after_receipt_call");
                Ok(s)
            })
        })
        .finish_boxed(move |tx, s: RideState| {
            let hook = h4.clone();
            Box::pin(async move {
                hook("after_receipt");
                let ride = s.ride_id.ok_or_else(|| RideError("finish reached without a ride".into()))?;
                D::mark_done(tx, ride, s.charge_id.as_deref(), s.receipt_id.as_deref()).await?;
                hook("in_finish");
                Ok(response(&s))
            })
        })
}
