//! The answers in actix-web's response type: a [`Reply`] as an `HttpResponse`, and the client's
//! [`Error`] as a `ResponseError` ([`ErrorResponse`]).

use actix_web::body::BoxBody;
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use idempotency_client::Error;
use idempotency_tower::adapter::error_reply;
use idempotency_tower::{http_status, Reply};

/// An answer as an actix-web response.
pub(crate) fn response_of(reply: Reply) -> HttpResponse<BoxBody> {
    let status = StatusCode::from_u16(reply.status.as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::with_body(status, reply.body).map_into_boxed_body();
    let headers = response.headers_mut();
    for (name, value) in &reply.headers {
        if let (Ok(name), Ok(value)) = (
            actix_web::http::header::HeaderName::from_bytes(name.as_str().as_bytes()),
            actix_web::http::header::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            headers.append(name, value);
        }
    }
    response
}

/// The client's [`Error`] as an actix-web answer, for a handler that calls `run` (or
/// `run_statement`, `run_external`) itself: return `Result<HttpResponse, ErrorResponse>` and `?`
/// the client's calls. The answer is the layer's problem+json for the error (its status from
/// [`http_status`], `Retry-After` where it has one), or, for [`Error::Failed`] holding a stored
/// response, that response replayed (with `Idempotent-Replayed: true`). A 5xx never carries the
/// error's text.
#[derive(Debug)]
pub struct ErrorResponse<E = std::convert::Infallible>(pub Error<E>);

impl<E> From<Error<E>> for ErrorResponse<E> {
    fn from(error: Error<E>) -> Self {
        ErrorResponse(error)
    }
}

impl<E: std::fmt::Display> std::fmt::Display for ErrorResponse<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<E: std::fmt::Debug + std::fmt::Display> ResponseError for ErrorResponse<E> {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(http_status(&self.0)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        response_of(error_reply(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorResponse;
    use actix_web::ResponseError;
    use idempotency_client::Error;

    #[test]
    fn errors_answer_problem_json_on_actix_too() {
        let error: Error = Error::InProgress { retry_after: std::time::Duration::from_secs(2) };
        let response = ErrorResponse(error).error_response();
        assert_eq!(response.status().as_u16(), 409);
        assert_eq!(response.headers().get("content-type").unwrap(), "application/problem+json");
        assert_eq!(response.headers().get("retry-after").unwrap(), "2");
        let stored = idempotency_client::StoredResponse::json(402, serde_json::json!({"error": "card declined"}));
        let error: ErrorResponse = ErrorResponse::from(Error::Failed { response: Some(serde_json::to_value(stored).unwrap()) });
        assert_eq!(error.status_code().as_u16(), 402);
        let response = error.error_response();
        assert_eq!((response.status().as_u16(), response.headers().get("idempotent-replayed").unwrap().to_str().unwrap()), (402, "true"));
    }
}
