//! The API's request and answer bodies (their JSON is the API: see
//! openapi.json), the JSON extractor that answers every rejection as a JSON
//! error, and the checks of request sizes.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Path, Request};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApiError;
use crate::writer::Mode;

use super::*;

#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    Json<T>: FromRequest<S, Rejection = JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(r) => Err(match &r {
                JsonRejection::JsonDataError(_) => {
                    ApiError::bad_request("invalid_request", r.body_text())
                }
                JsonRejection::JsonSyntaxError(_) => {
                    ApiError::new(StatusCode::BAD_REQUEST, "malformed_json", r.body_text())
                }
                JsonRejection::MissingJsonContentType(_) => ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    "send the body as JSON with Content-Type: application/json",
                ),
                _ if r.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!(
                        "{}: split the documents over several requests",
                        r.body_text()
                    ),
                ),
                _ => ApiError::new(StatusCode::BAD_REQUEST, "bad_body", r.body_text()),
            }),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocumentsRequest {
    pub documents: Vec<DocumentIn>,
    /// Absent or null: `insert_if_new`.
    #[serde(default = "default_mode", deserialize_with = "mode_or_default")]
    pub mode: Mode,
    pub k: Option<u32>,
    /// At most this many duplicates per document (default
    /// [`DEFAULT_DOCUMENT_MATCHES`], at most [`MAX_MATCHES`]).
    pub limit: Option<usize>,
    /// Keep a match only when the texts' Jaccard similarity reaches
    /// this (default: the collection's, set at creation).
    pub verify: Option<VerifyIn>,
}

/// `{"jaccard": T}`: verification of matches of texts by their Jaccard
/// similarity; `{"cosine": S}`: of vectors, by their exact cosine.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyIn {
    #[serde(default)]
    pub jaccard: Option<f64>,
    #[serde(default)]
    pub cosine: Option<f64>,
}

pub(super) fn default_mode() -> Mode {
    Mode::InsertIfNew
}

/// `"mode": null` is the default mode, as an absent one is.
pub(super) fn mode_or_default<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Mode, D::Error> {
    Ok(Option::<Mode>::deserialize(d)?.unwrap_or_else(default_mode))
}

/// A document id from the path, percent-decoded; one that does not decode to
/// UTF-8 is a JSON 400 like every other bad request.
#[derive(Debug)]
pub struct DocId(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for DocId {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(id)) => Ok(DocId(id)),
            Err(e) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_id",
                format!("{}: percent-encode the id's UTF-8 bytes", e.body_text()),
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocumentIn {
    pub id: String,
    pub text: Option<String>,
    pub simhash: Option<String>,
    /// A dense vector, for a collection of vectors.
    pub vector: Option<Vec<f32>>,
    /// Weighted features, for a collection of features.
    pub features: Option<std::collections::BTreeMap<String, f64>>,
    pub meta: Option<serde_json::Map<String, Value>>,
}

/// What a document or query carries: exactly one of these.
#[derive(Debug)]
pub struct BodyIn {
    pub text: Option<String>,
    pub simhash: Option<String>,
    /// A dense vector, for a collection of vectors.
    pub vector: Option<Vec<f32>>,
    /// Weighted features, for a collection of features.
    pub features: Option<std::collections::BTreeMap<String, f64>>,
}

/// A document's content, to fingerprint.
pub(super) enum Content {
    Text(String),
    Vector(Vec<f32>),
    Features(Vec<(String, f64)>),
}

impl BodyIn {
    /// The fingerprint given, or the content to fingerprint.
    pub(super) fn split(self) -> Result<Result<String, Content>, &'static str> {
        match (self.text, self.simhash, self.vector, self.features) {
            (Some(t), None, None, None) => Ok(Err(Content::Text(t))),
            (None, Some(h), None, None) => Ok(Ok(h)),
            (None, None, Some(v), None) => Ok(Err(Content::Vector(v))),
            (None, None, None, Some(f)) => Ok(Err(Content::Features(f.into_iter().collect()))),
            _ => Err("give exactly one of \"text\", \"simhash\", \"vector\" and \"features\""),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    pub text: Option<String>,
    pub simhash: Option<String>,
    pub vector: Option<Vec<f32>>,
    pub features: Option<std::collections::BTreeMap<String, f64>>,
    pub k: Option<u32>,
    pub limit: Option<usize>,
    pub verify: Option<VerifyIn>,
}

#[derive(Debug, Serialize)]
pub struct MatchOut {
    pub id: Arc<str>,
    pub distance: u32,
    /// The texts' Jaccard similarity (the vectors' cosine), when the match
    /// was verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub similarity: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
}

#[derive(Debug, Serialize)]
pub struct DocResult {
    pub id: String,
    pub simhash: String,
    pub stored: bool,
    pub duplicates: Vec<MatchOut>,
    /// More duplicates than `limit` were found (the nearest are listed).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// The number of matches a request asks for, checked against [`MAX_MATCHES`].
pub(super) fn match_limit(limit: Option<usize>, default: usize) -> Result<usize, ApiError> {
    match limit {
        None => Ok(default),
        Some(n) if n > MAX_MATCHES => Err(ApiError::bad_request(
            "limit_too_large",
            format!("limit {n} is larger than {MAX_MATCHES}: page through fewer matches"),
        )),
        Some(n) => Ok(n),
    }
}
