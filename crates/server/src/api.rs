//! The HTTP/JSON API: routes, request and answer types, errors, authorisation,
//! metrics.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, MatchedPath, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use neardup_core::index::Bits;
use neardup_core::index::bits::word_of;
use neardup_core::{Fingerprint, Input, SimHasher};

use crate::collection::{Collection, Found};
use crate::error::{ApiError, ServiceError};
use crate::metrics::Metrics;
use crate::store::{Settings, Store};
use crate::writer::{Job, JobSender, Mode, NewDoc, Outcome, verify_found};
use neardup_core::jaccard::shingles_for;
use neardup_core::sketch::Sketch;

/// The OpenAPI document, kept in the repository beside the code.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// Most documents in one request.
pub const MAX_DOCUMENTS: usize = 10_000;
/// Longest document id, in bytes.
pub const MAX_ID_BYTES: usize = 1024;

/// The most matches one document or query answers with (`limit`), so that a
/// request against a large cluster of copies is bounded in work and reply.
pub const MAX_MATCHES: usize = 1000;

/// Matches per document of `/v1/documents` when the request sets no `limit`
/// (up to 10,000 documents a request: at most a million matches).
pub const DEFAULT_DOCUMENT_MATCHES: usize = 100;

/// Which requests need the bearer token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protect {
    /// Writes only: POST /v1/documents and DELETE.
    Writes,
    /// Every route but /healthz.
    All,
}

/// Everything a request can reach.
pub struct Service<B: Bits> {
    pub settings: Settings,
    pub hasher: SimHasher,
    pub collection: Arc<Collection<B>>,
    pub store: Arc<Store>,
    /// The writer's queue; `None` once shutting down.
    pub jobs: RwLock<Option<JobSender<B>>>,
    pub metrics: Metrics,
    pub token: Option<String>,
    pub protect: Protect,
    pub started: Instant,
}

impl<B: Bits> std::fmt::Debug for Service<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// JSON bodies, with every rejection answered as a JSON error.
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
    /// Keep a match only when the texts' estimated Jaccard similarity reaches
    /// this (default: the collection's, set at creation).
    pub verify: Option<VerifyIn>,
}

/// `{"jaccard": T}`: verification of matches by estimated Jaccard similarity.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyIn {
    pub jaccard: f64,
}

fn default_mode() -> Mode {
    Mode::InsertIfNew
}

/// `"mode": null` is the default mode, as an absent one is.
fn mode_or_default<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Mode, D::Error> {
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
enum Content {
    Text(String),
    Vector(Vec<f32>),
    Features(Vec<(String, f64)>),
}

impl BodyIn {
    /// The fingerprint given, or the content to fingerprint.
    fn split(self) -> Result<Result<String, Content>, &'static str> {
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
    /// The texts' estimated Jaccard similarity, when the match was verified.
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
fn match_limit(limit: Option<usize>, default: usize) -> Result<usize, ApiError> {
    match limit {
        None => Ok(default),
        Some(n) if n > MAX_MATCHES => Err(ApiError::bad_request(
            "limit_too_large",
            format!("limit {n} is larger than {MAX_MATCHES}: page through fewer matches"),
        )),
        Some(n) => Ok(n),
    }
}

/// The router over a service.
pub fn router<B: Bits>(
    service: Arc<Service<B>>,
    max_body: usize,
    body_timeout: std::time::Duration,
) -> Router {
    Router::new()
        .route("/v1/documents", post(post_documents::<B>))
        .route(
            "/v1/documents/{id}",
            get(get_document::<B>).delete(delete_document::<B>),
        )
        .route("/v1/query", post(post_query::<B>))
        .route("/v1/stats", get(stats::<B>))
        .route("/healthz", get(healthz::<B>))
        .route("/readyz", get(readyz::<B>))
        .route("/metrics", get(metrics::<B>))
        .route("/openapi.json", get(openapi))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            (max_body, body_timeout),
            read_body,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&service),
            authorise::<B>,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&service),
            measure::<B>,
        ))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(service)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such route: see /openapi.json",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method: see /openapi.json",
    )
}

async fn measure<B: Bits>(State(s): State<Arc<Service<B>>>, req: Request, next: Next) -> Response {
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
async fn read_body(
    State((max_body, timeout)): State<(usize, std::time::Duration)>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    use http_body_util::BodyExt;
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
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "the body is larger than {max_body} bytes: split the documents over \
                     several requests"
                ),
            ));
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
    Ok(next
        .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await)
}

async fn authorise<B: Bits>(
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

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl<B: Bits> Service<B> {
    fn check_k(&self, k: Option<u32>) -> Result<u32, ApiError> {
        let max = self.settings.max_k;
        match k {
            None => Ok(max),
            Some(k) if k <= max => Ok(k),
            Some(k) => Err(ApiError::bad_request(
                "k_too_large",
                format!("k = {k} is larger than this collection's maximum k = {max}"),
            )),
        }
    }

    fn parse_simhash(&self, hex: &str) -> Result<B, ApiError> {
        let width = self.settings.config.bits;
        let digits = width.bits() as usize / 4;
        if hex.len() != digits || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ApiError::bad_request(
                "invalid_simhash",
                format!(
                    "simhash {:?} is not {digits} hex digits (0-9, a-f, no prefix or sign): \
                     this collection holds {}-bit fingerprints",
                    hex.chars().take(40).collect::<String>(),
                    width.bits()
                ),
            ));
        }
        Fingerprint::parse_hex_width(hex, width)
            .and_then(word_of::<B>)
            .map_err(|e| {
                ApiError::bad_request(
                    "invalid_simhash",
                    format!(
                        "{e}: this collection holds {}-bit fingerprints ({} hex digits)",
                        width.bits(),
                        width.bits() / 4
                    ),
                )
            })
    }

    fn hex(&self, fp: B) -> String {
        Fingerprint::new(fp.to_u128(), self.settings.config.bits).to_string()
    }

    /// Matches with their stored metadata.
    fn with_meta(&self, found: Vec<Found>) -> Result<Vec<MatchOut>, ApiError> {
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = found.iter().map(|f| &*f.id).collect();
        let metas = self.store.metas(&ids)?;
        Ok(found
            .into_iter()
            .zip(metas)
            .map(|(f, m)| MatchOut {
                id: f.id,
                distance: f.distance,
                similarity: f.similarity.map(|j| (j * 1e4).round() / 1e4),
                meta: m.and_then(|bytes| serde_json::from_slice(&bytes).ok()),
            })
            .collect())
    }

    /// The verification threshold of a request: its own, else the
    /// collection's default, else none.
    fn threshold(&self, asked: Option<VerifyIn>) -> Result<Option<f64>, ApiError> {
        match asked {
            None => Ok(self.settings.verify),
            Some(VerifyIn { jaccard }) if jaccard > 0.0 && jaccard <= 1.0 => Ok(Some(jaccard)),
            Some(VerifyIn { jaccard }) => Err(ApiError::bad_request(
                "invalid_verify",
                format!(
                    "verify.jaccard {jaccard} is out of range: use a similarity in (0, 1], e.g. 0.8"
                ),
            )),
        }
    }

    fn sender(&self) -> Result<JobSender<B>, ApiError> {
        self.jobs
            .read()
            .expect("jobs lock")
            .clone()
            .ok_or_else(|| ServiceError::ShuttingDown.into())
    }
}

/// Fingerprints of documents' contents, with a text's verification sketch,
/// off the async threads when there is real work; a content the collection
/// cannot fingerprint (a vector of another dimension, a text for a collection
/// of vectors, a NaN) is a 400 naming it.
async fn fingerprint_contents<B: Bits>(
    s: &Arc<Service<B>>,
    contents: Vec<(usize, Content)>,
    place: fn(usize) -> String,
) -> Result<Vec<(usize, B, Option<Sketch>)>, ApiError> {
    let work: usize = contents
        .iter()
        .map(|(_, c)| match c {
            Content::Text(t) => t.len(),
            Content::Vector(v) => v.len() * 64,
            Content::Features(f) => f.len() * 64,
        })
        .sum();
    let s2 = Arc::clone(s);
    let job = move || {
        contents
            .into_iter()
            .map(|(i, c)| {
                let input = match &c {
                    Content::Text(t) => Input::Text(t),
                    Content::Vector(v) => Input::Vector(v),
                    Content::Features(f) => Input::Features(f),
                };
                let fp = s2.hasher.fingerprint_input(input).map_err(|e| {
                    ApiError::bad_request("invalid_document", format!("{}: {e}", place(i)))
                })?;
                let sketch = match &c {
                    Content::Text(t) => {
                        let normalize = &s2.hasher.config().normalize;
                        Some(Sketch::of(&shingles_for(t, normalize)))
                    }
                    _ => None,
                };
                Ok((
                    i,
                    word_of::<B>(fp).expect("the hasher's width is the collection's"),
                    sketch,
                ))
            })
            .collect::<Result<Vec<_>, ApiError>>()
    };
    if work < 64 * 1024 {
        job()
    } else {
        tokio::task::spawn_blocking(job).await.map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "fingerprinting was interrupted",
            )
        })?
    }
}

async fn post_documents<B: Bits>(
    State(s): State<Arc<Service<B>>>,
    ApiJson(req): ApiJson<DocumentsRequest>,
) -> Result<Json<Value>, ApiError> {
    let k = s.check_k(req.k)?;
    let limit = match_limit(req.limit, DEFAULT_DOCUMENT_MATCHES)?;
    let verify = s.threshold(req.verify)?;
    if req.documents.len() > MAX_DOCUMENTS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_documents",
            format!(
                "{} documents in one request: send at most {MAX_DOCUMENTS}",
                req.documents.len()
            ),
        ));
    }
    let mut fps: Vec<Option<B>> = vec![None; req.documents.len()];
    let mut texts = Vec::new();
    let mut metas = Vec::with_capacity(req.documents.len());
    let mut ids = Vec::with_capacity(req.documents.len());
    for (i, d) in req.documents.into_iter().enumerate() {
        let place = format!("documents[{i}]");
        if d.id.is_empty() || d.id.len() > MAX_ID_BYTES {
            return Err(ApiError::bad_request(
                "invalid_id",
                format!("{place}: an id is 1 to {MAX_ID_BYTES} bytes of text"),
            ));
        }
        let body = BodyIn {
            text: d.text,
            simhash: d.simhash,
            vector: d.vector,
            features: d.features,
        };
        match body.split() {
            Ok(Err(content)) => texts.push((i, content)),
            Ok(Ok(_)) if req.verify.is_some() => {
                return Err(ApiError::bad_request(
                    "invalid_document",
                    format!("{place}: \"verify\" compares texts; send the document's \"text\""),
                ));
            }
            Ok(Ok(h)) => {
                fps[i] = Some(s.parse_simhash(&h).map_err(|mut e| {
                    e.message = format!("{place}: {}", e.message);
                    e
                })?)
            }
            Err(msg) => {
                return Err(ApiError::bad_request(
                    "invalid_document",
                    format!("{place}: {msg}"),
                ));
            }
        }
        metas.push(
            d.meta
                .map(|m| serde_json::to_vec(&m).expect("JSON serialises")),
        );
        ids.push(d.id);
    }
    let mut sketches: Vec<Option<Sketch>> = vec![None; fps.len()];
    for (i, fp, sketch) in fingerprint_contents(&s, texts, |i| format!("documents[{i}]")).await? {
        fps[i] = Some(fp);
        sketches[i] = sketch;
    }
    let fps: Vec<B> = fps
        .into_iter()
        .map(|f| f.expect("every document has one"))
        .collect();
    let outcomes: Vec<Outcome> = if req.mode == Mode::Check {
        let s2 = Arc::clone(&s);
        let fps2 = fps.clone();
        let run = move || {
            fps2.iter()
                .zip(&sketches)
                .map(|(&fp, sketch)| {
                    let found = s2.collection.query(fp, k);
                    let duplicates = match (verify, sketch) {
                        (Some(t), Some(sk)) => verify_found(&s2.store, found, sk, t, |_| None)?,
                        _ => found,
                    };
                    Ok(Outcome {
                        stored: false,
                        duplicates,
                    })
                })
                .collect::<Result<Vec<_>, ServiceError>>()
        };
        if fps.len() > 64 || verify.is_some() {
            tokio::task::spawn_blocking(run).await.map_err(|_| {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", "interrupted")
            })??
        } else {
            run()?
        }
    } else {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let docs = ids
            .iter()
            .zip(&fps)
            .zip(metas)
            .zip(sketches)
            .map(|(((id, &fp), meta), sketch)| NewDoc {
                id: id.clone(),
                fp,
                meta,
                sketch,
            })
            .collect();
        let sender = s.sender()?;
        let job = Job::Upsert {
            docs,
            mode: req.mode,
            k,
            verify,
            reply: tx,
        };
        // The queue is bounded: wait for room off the async threads.
        tokio::task::spawn_blocking(move || sender.send(job))
            .await
            .map_err(|_| ServiceError::ShuttingDown)?
            .map_err(|_| ServiceError::ShuttingDown)?;
        rx.await.map_err(|_| ServiceError::ShuttingDown)??
    };
    let mut results = Vec::with_capacity(ids.len());
    for ((id, fp), mut o) in ids.into_iter().zip(fps).zip(outcomes) {
        let truncated = o.duplicates.len() > limit;
        o.duplicates.truncate(limit);
        results.push(DocResult {
            id,
            simhash: s.hex(fp),
            stored: o.stored,
            duplicates: s.with_meta(o.duplicates)?,
            truncated,
        });
    }
    Ok(Json(serde_json::json!({ "results": results })))
}

async fn post_query<B: Bits>(
    State(s): State<Arc<Service<B>>>,
    ApiJson(req): ApiJson<QueryRequest>,
) -> Result<Json<Value>, ApiError> {
    let k = s.check_k(req.k)?;
    let limit = match_limit(req.limit, MAX_MATCHES)?;
    let verify = s.threshold(req.verify)?;
    let body = BodyIn {
        text: req.text,
        simhash: req.simhash,
        vector: req.vector,
        features: req.features,
    };
    let (fp, sketch) = match body.split() {
        Ok(Err(content)) => {
            let (_, fp, sketch) =
                fingerprint_contents(&s, vec![(0, content)], |_| "the query".into())
                    .await?
                    .remove(0);
            (fp, sketch)
        }
        Ok(Ok(_)) if req.verify.is_some() => {
            return Err(ApiError::bad_request(
                "invalid_query",
                "\"verify\" compares texts; query with \"text\"",
            ));
        }
        Ok(Ok(h)) => (s.parse_simhash(&h)?, None),
        Err(msg) => return Err(ApiError::bad_request("invalid_query", msg)),
    };
    let mut found = s.collection.query(fp, k);
    if let (Some(t), Some(sk)) = (verify, sketch) {
        let s2 = Arc::clone(&s);
        found =
            tokio::task::spawn_blocking(move || verify_found(&s2.store, found, &sk, t, |_| None))
                .await
                .map_err(|_| {
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", "interrupted")
                })??;
    }
    let truncated = found.len() > limit;
    found.truncate(limit);
    let mut out = serde_json::json!({ "matches": s.with_meta(found)? });
    if truncated {
        out["truncated"] = Value::Bool(true);
    }
    Ok(Json(out))
}

async fn get_document<B: Bits>(
    State(s): State<Arc<Service<B>>>,
    DocId(id): DocId,
) -> Result<Json<Value>, ApiError> {
    let Some(r) = s.store.get(&id)? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no document with id {id:?}"),
        ));
    };
    let fp = B::read_le(&r.fingerprint);
    let mut out = serde_json::json!({"id": id, "simhash": s.hex(fp)});
    if let Some(m) = r
        .meta
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
    {
        out["meta"] = m;
    }
    Ok(Json(out))
}

async fn delete_document<B: Bits>(
    State(s): State<Arc<Service<B>>>,
    DocId(id): DocId,
) -> Result<Json<Value>, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sender = s.sender()?;
    let job = Job::Delete {
        id: id.clone(),
        reply: tx,
    };
    tokio::task::spawn_blocking(move || sender.send(job))
        .await
        .map_err(|_| ServiceError::ShuttingDown)?
        .map_err(|_| ServiceError::ShuttingDown)?;
    let existed = rx.await.map_err(|_| ServiceError::ShuttingDown)??;
    if !existed {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no document with id {id:?}"),
        ));
    }
    Ok(Json(serde_json::json!({"id": id, "deleted": true})))
}

async fn stats<B: Bits>(State(s): State<Arc<Service<B>>>) -> Json<Value> {
    let l = s.collection.levels();
    Json(serde_json::json!({
        "documents": l.documents,
        "fingerprints": l.main + l.mid + l.recent - l.tombstones.min(l.main + l.mid + l.recent),
        "design": {
            "bits": s.settings.design.bits,
            "max_k": s.settings.max_k,
            "tables": s.settings.design.tables.len(),
            "levels": s.settings.design.levels,
        },
        "config": s.settings.config,
        "index": {"main": l.main, "mid": l.mid, "recent": l.recent, "tombstones": l.tombstones},
        "memory_bytes": l.index_bytes,
        "disk_bytes": s.store.disk_bytes(),
        "uptime_seconds": s.started.elapsed().as_secs_f64(),
    }))
}

/// Liveness: always 200 while the process answers; `"writes": "failing"`
/// (status `degraded`) from a failed commit until one succeeds.
async fn healthz<B: Bits>(State(s): State<Arc<Service<B>>>) -> Json<Value> {
    Json(health(&s.store))
}

/// Readiness: 503 while writes are failing (the disk full, say); the next
/// write reopens the store and, if the disk has room again, clears it.
async fn readyz<B: Bits>(State(s): State<Arc<Service<B>>>) -> Response {
    let body = health(&s.store);
    let status = if body["writes"] == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

fn health(store: &crate::store::Store) -> Value {
    match store.write_failure() {
        None => serde_json::json!({"status": "ok", "writes": "ok"}),
        Some(_) => serde_json::json!({
            "status": "degraded",
            "writes": "failing",
            "message": "the last commit failed (the server's log says why); the next write retries",
        }),
    }
}

async fn metrics<B: Bits>(State(s): State<Arc<Service<B>>>) -> Response {
    let l = s.collection.levels();
    let body = s.metrics.render(&[
        ("neardup_documents", "Documents stored.", l.documents as f64),
        (
            "neardup_index_memory_bytes",
            "Memory held by the in-memory index.",
            l.index_bytes as f64,
        ),
        (
            "neardup_disk_bytes",
            "Size of the database file.",
            s.store.disk_bytes() as f64,
        ),
    ]);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}
