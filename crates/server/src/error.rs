//! Errors: what went wrong inside the service, and what an HTTP client is told.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A failure of the service itself (storage, settings).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("storage: {0}")]
    Storage(String),
    #[error("{0}")]
    Config(String),
    #[error("the service is shutting down")]
    ShuttingDown,
    /// A request the writer refused (a vector of another dimension).
    #[error("{0}")]
    Invalid(String),
    #[error("the service's writer has stopped: writes are refused until it is restarted")]
    WriterStopped,
}

/// An error answer: `{"error": {"code", "message"}}` with its HTTP status.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }
}

impl From<ServiceError> for ApiError {
    /// The client is told what kind of failure it met; the details (paths,
    /// the storage engine's own words) go to the log, not over the wire.
    fn from(e: ServiceError) -> Self {
        if let ServiceError::Invalid(m) = e {
            return ApiError::bad_request("invalid_document", m);
        }
        let (code, message) = match e {
            ServiceError::ShuttingDown => ("shutting_down", e.to_string()),
            ServiceError::WriterStopped => ("writer_stopped", e.to_string()),
            _ => {
                tracing::error!("request failed: {e}");
                (
                    "storage_unavailable",
                    "the collection's storage failed; the operator's log says why: retry later"
                        .to_string(),
                )
            }
        };
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response()
    }
}
