//! What runs around every handler: metrics by route, the whole body read
//! within a time limit, the bearer token, and the JSON answers of unknown
//! routes and methods.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use neardup_core::index::Bits;

use crate::error::ApiError;

use super::*;

pub(super) async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such route: see /openapi.json",
    )
}

pub(super) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method: see /openapi.json",
    )
}

pub(super) async fn measure<B: Bits>(
    State(s): State<Arc<Service<B>>>,
    req: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_owned();
    let method = req.method().as_str().to_owned();
    let resp = next.run(req).await;
    s.metrics
        .record(&route, &method, resp.status().as_u16(), started.elapsed());
    resp
}

/// Reads the whole body, at most `max_body` bytes within `timeout` of the
/// headers, before any handler runs: a client that stops sending mid-body
/// gets 408 instead of holding its connection and a task forever.
pub(super) async fn read_body(
    State((max_body, timeout)): State<(usize, std::time::Duration)>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    use http_body_util::BodyExt;
    // A declared length over the limit is refused before the body is asked
    // for (so a client waiting on `Expect: 100-continue` gets 413, not 100).
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return Err(too_large(max_body));
    }
    let (parts, body) = req.into_parts();
    let limited = http_body_util::Limited::new(body, max_body);
    let bytes = match tokio::time::timeout(timeout, limited.collect()).await {
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request's body did not arrive within {} s of its headers",
                    timeout.as_secs_f64()
                ),
            ));
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(too_large(max_body));
        }
        Ok(Err(e)) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "unreadable_body",
                format!("cannot read the request's body: {e}"),
            ));
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    // A byte-order mark before the JSON is not part of it.
    let bytes = match bytes.strip_prefix(b"\xef\xbb\xbf") {
        Some(_) => bytes.slice(3..),
        None => bytes,
    };
    Ok(next
        .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await)
}

fn too_large(max_body: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!(
            "the body is larger than {max_body} bytes: split the documents over several requests"
        ),
    )
}

pub(super) async fn authorise<B: Bits>(
    State(s): State<Arc<Service<B>>>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Some(token) = &s.token else {
        return Ok(next.run(req).await);
    };
    let path = req.uri().path();
    let is_write = req.method() == axum::http::Method::DELETE
        || (req.method() == axum::http::Method::POST && path == "/v1/documents");
    let needed = match s.protect {
        Protect::Writes => is_write,
        Protect::All => path != "/healthz" && path != "/readyz",
    };
    if needed {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim_start());
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this route needs the service's token: send Authorization: Bearer TOKEN",
            ));
        }
    }
    Ok(next.run(req).await)
}

pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A reply's bytes with their share of the reply memory: released when the
/// connection has written them (or is closed), not when the handler returns.
struct Held {
    bytes: bytes::Bytes,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Bounds the memory of replies waiting for their clients: a reply of more
/// than 64 KiB takes its size from the service's reply memory until it is
/// written; one that does not fit is answered 503 `busy` with Retry-After.
/// Clients that never read hold it until --write-timeout closes them.
pub(super) async fn hold_replies<B: Bits>(
    State(s): State<Arc<Service<B>>>,
    req: Request,
    next: Next,
) -> Response {
    use axum::response::IntoResponse;
    use http_body_util::BodyExt;
    let resp = next.run(req).await;
    let (parts, body) = resp.into_parts();
    // The routes' bodies are built whole in memory: collecting copies nothing.
    let bytes = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            return ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("the reply could not be built: {e}"),
            )
            .into_response();
        }
    };
    if bytes.len() <= 64 << 10 {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    }
    // A reply larger than the whole reply memory waits for it all.
    let kib = u32::try_from(bytes.len().div_ceil(1024))
        .unwrap_or(u32::MAX)
        .min(reply_memory_kib(s.max_body));
    match Arc::clone(&s.replies).try_acquire_many_owned(kib) {
        Ok(permit) => {
            let held = bytes::Bytes::from_owner(Held {
                bytes,
                _permit: permit,
            });
            Response::from_parts(parts, axum::body::Body::from(held))
        }
        Err(_) => {
            let mut r = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "too many large replies are waiting for their clients to read them: retry shortly",
            )
            .into_response();
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            r
        }
    }
}
