//! The tonic twin of [`charges`](crate::charges): a gRPC service `charges.v1.Charges`
//! (proto/charges.proto) whose unary `Create` is idempotent through the layer's
//! [`GrpcLayer`](idempotency_tonic::GrpcLayer), over either driver, in either mode.
//!
//! Served by the binary `tonic_charges` (`src/bin/tonic_charges.rs`; this crate's feature
//! `tonic`), over tokio-postgres, or over sqlx with `IDEM_DRIVER=sqlx`; `IDEM_MODE=two_phase`
//! for the two-phase mode, `IDEM_KEY=request_id` to take the key from the message's `request_id`
//! field (AIP-155) instead of the `idempotency-key` metadata:
//!
//! ```sh
//! DATABASE_URL=postgresql://postgres@127.0.0.1:55415/postgres BIND=127.0.0.1:50051 \
//!     cargo run -p idempotency-examples --features tonic --bin tonic_charges
//! ```
//!
//! What a client sees: the first call's answer (`Charge`, or the error the handler returned);
//! a retry with the same key and message gets the stored answer byte for byte, with the metadata
//! `idempotent-replayed: true`; while another call holds the key, ABORTED (with `retry-after`);
//! the key with another message, INVALID_ARGUMENT; no key, INVALID_ARGUMENT; no `x-user`,
//! UNAUTHENTICATED; the store down, UNAVAILABLE. The streaming `Watch` is refused with
//! FAILED_PRECONDITION: the layer covers unary methods only.

use crate::store::Charges;
use idempotency_tonic::{Connection, GrpcLayer, Mode, TransactionRejection};
use idempotency_client::{Driver, Idempotency};
use prost::Message;
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore};
use tonic::{Request, Response, Status};

/// The code generated from proto/charges.proto.
#[allow(missing_docs, unreachable_pub, unused_qualifications, clippy::all)]
pub mod proto {
    tonic::include_proto!("charges.v1");
}

use proto::charges_server::{Charges as ChargesRpc, ChargesServer};
use proto::{Charge, CreateCharge};

/// The SQL the service needs next to the extension.
pub const SCHEMA: &str = crate::charges::SCHEMA;

/// Where the key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFrom {
    /// The `idempotency-key` metadata.
    Metadata,
    /// The message's `request_id` field (AIP-155).
    RequestId,
}

/// Test levers: a call whose message says `hold` reports that it started and waits for a permit
/// of `gate` (the binary has none).
#[derive(Debug)]
pub struct Hold {
    /// Told once per held call that started.
    pub started: mpsc::UnboundedSender<()>,
    /// One permit per held call to let go.
    pub gate: Semaphore,
}

/// The service: charges `amount` for the `x-user` metadata.
pub struct ChargeService<D: Driver> {
    idem: Idempotency<D>,
    mode: Mode,
    hold: Option<Arc<Hold>>,
}

impl<D: Driver> ChargeService<D> {
    /// The service over `idem` in `mode` (its writes: through the request's transaction
    /// in-transaction, on a connection of its own two-phase), with the test levers of `hold`.
    pub fn new(idem: Idempotency<D>, mode: Mode, hold: Option<Arc<Hold>>) -> Self {
        ChargeService { idem, mode, hold }
    }
}

#[tonic::async_trait]
impl<D: Charges> ChargesRpc for ChargeService<D> {
    async fn create(&self, mut request: Request<CreateCharge>) -> Result<Response<Charge>, Status> {
        let user = request.metadata().get("x-user").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let tx = match self.mode {
            Mode::InTransaction => Some(Connection::<D>::take(request.extensions_mut()).await),
            Mode::TwoPhase => None,
        };
        let message = request.into_inner();
        if let (true, Some(hold)) = (message.hold, &self.hold) {
            let _ = hold.started.send(());
            hold.gate.acquire().await.map_err(|_| Status::internal("gate closed"))?.forget();
        }
        if message.amount <= 0 {
            return Err(Status::invalid_argument("amount must be positive"));
        }
        let inserted = match tx {
            Some(Ok(mut tx)) => D::insert(&mut tx, &user, message.amount).await,
            Some(Err(e @ TransactionRejection::Missing)) => return Err(Status::internal(format!("{e}: this service needs the layer"))),
            Some(Err(e)) => return Err(Status::internal(e.to_string())),
            None => D::insert_own(&self.idem, &user, message.amount).await,
        };
        let id = inserted.map_err(Status::unavailable)?;
        if message.fail_code != 0 {
            // The charge is written, then the call fails: in-transaction it rolls back.
            let code = tonic::Code::from_i32(message.fail_code);
            return Err(match message.fail_metadata {
                true => Status::with_details_and_metadata(code, "failed after the write", FAIL_DETAILS.into(), fail_metadata()),
                false => Status::new(code, "failed after the write"),
            });
        }
        Ok(Response::new(Charge { id, amount: message.amount }))
    }

    type WatchStream = futures_util::stream::Iter<std::vec::IntoIter<Result<Charge, Status>>>;

    async fn watch(&self, request: Request<CreateCharge>) -> Result<Response<Self::WatchStream>, Status> {
        let amount = request.into_inner().amount;
        let charges = vec![Ok(Charge { id: 1, amount }), Ok(Charge { id: 2, amount })];
        Ok(Response::new(futures_util::stream::iter(charges)))
    }
}

/// The `grpc-status-details-bin` of a failure with `fail_metadata` (any bytes: a test lever).
pub const FAIL_DETAILS: &[u8] = b"\x08\x05\x12\x0bdetails\x00\xff";

/// The metadata of a failure with `fail_metadata`: `x-reason: card-declined` and the binary
/// `x-trace-bin` (bytes 0, 159, 255).
pub fn fail_metadata() -> tonic::metadata::MetadataMap {
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert("x-reason", tonic::metadata::MetadataValue::from_static("card-declined"));
    metadata.insert_bin("x-trace-bin", tonic::metadata::MetadataValue::from_bytes(&[0, 159, 255]));
    metadata
}

/// The layer: the user from the `x-user` metadata, the key from `key_from`.
pub fn layer<D: Driver>(idem: Idempotency<D>, mode: Mode, key_from: KeyFrom) -> GrpcLayer<D> {
    let builder = GrpcLayer::builder(idem).mode(mode).user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned));
    let builder = match key_from {
        KeyFrom::Metadata => builder,
        KeyFrom::RequestId => builder.key_from(|_, body| {
            let id = idempotency_tonic::message(body).and_then(|m| CreateCharge::decode(m).ok()).map(|m| m.request_id).filter(|id| !id.is_empty());
            std::future::ready(id)
        }),
    };
    builder.build().expect("a complete layer configuration")
}

/// The service behind its layer, ready for `Server::builder().add_service(..)`; it reads and
/// sends gzip (answers of the methods the layer covers are sent uncompressed: see the layer's
/// docs).
pub fn service<D: Charges>(idem: Idempotency<D>, mode: Mode, key_from: KeyFrom, hold: Option<Arc<Hold>>) -> idempotency_tonic::GrpcService<ChargesServer<ChargeService<D>>, D> {
    use tower_layer::Layer;
    use tonic::codec::CompressionEncoding::Gzip;
    let server = ChargesServer::new(ChargeService::new(idem.clone(), mode, hold)).accept_compressed(Gzip).send_compressed(Gzip);
    layer(idem, mode, key_from).layer(server)
}

/// Serves the service on `listener` until the process ends.
pub async fn serve<D: Charges>(
    idem: Idempotency<D>,
    mode: Mode,
    key_from: KeyFrom,
    hold: Option<Arc<Hold>>,
    listener: tokio::net::TcpListener,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(service(idem, mode, key_from, hold))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
        .await
}
