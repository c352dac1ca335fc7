//! The seam the adapter crates (idempotency-tower, idempotency-actix, idempotency-tonic) build
//! on: what their HTTP layer needs of the client that a user never calls. Hidden from the docs;
//! those crates depend on this one at exactly their own version (`=`), so it may change in any
//! release. The rest of what they use is the public API (the handle, the flows, the errors) and
//! the driver's hidden machinery (`Driver::share`, `Driver::connection`, `Lease`).

use crate::driver::{Driver, Step};
use crate::error::Error;
use crate::row::{only, Row};
use crate::sql::MAX_RESPONSE_BYTES_SQL;

pub use crate::response::problem_body;

/// The server's `idempotency.max_response_bytes` as `current_setting` shows it (`1MB`), read on
/// `tx` (a connection the caller holds: no second one is taken); `None` where it is not defined
/// (a portable install whose setting was never set).
pub async fn max_response_bytes<D: Driver>(tx: &mut D::Tx) -> Result<Option<String>, Error> {
    let row = only(D::send(tx, &[Step::Query(MAX_RESPONSE_BYTES_SQL, vec![])]).await?)?;
    row.text("max_response_bytes")
}
