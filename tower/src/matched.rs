//! [`MatchedRoute`]: the route a request matched, as a stack's adapter found it. Plain data.

/// The route a request matched, as a stack's adapter found it (actix-web's match pattern, the
/// gRPC method's path): a request extension the layer reads for the operation (axum's `MatchedPath` becomes one, in
/// the tower adapter).
#[derive(Debug, Clone)]
pub struct MatchedRoute(pub String);
