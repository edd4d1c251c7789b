//! The HTTP/JSON API: the service every request reaches, and the router that
//! ties the routes (handlers.rs) to their bodies (dto.rs) and to what runs
//! around them (middleware.rs).

use std::sync::{Arc, RwLock};
use std::time::Instant;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use neardup_core::SimHasher;
use neardup_core::index::Bits;

use crate::collection::Collection;
use crate::metrics::Metrics;
use crate::store::{Settings, Store};
use crate::writer::JobSender;

/// The OpenAPI document, kept in the repository beside the code.
pub const OPENAPI: &str = include_str!("../../openapi.json");

/// Most documents in one request.
pub const MAX_DOCUMENTS: usize = 10_000;
/// Most dimensions of a vector in a collection whose dimension is not yet
/// fixed (by `--dim` or its first vector).
pub const MAX_DIMENSION: usize = 65_536;

/// Longest document id, in bytes.
pub const MAX_ID_BYTES: usize = 1024;

pub use crate::writer::MAX_MATCHES;

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
    /// The writer's state (closing, stopped).
    pub control: Arc<crate::writer::Control>,
    /// Largest request body, and largest reply, in bytes.
    pub max_body: usize,
    /// Kilobytes of replies not yet taken by their clients, at most
    /// [`REPLY_MEMORY_BODIES`] times `max_body`: a reply that would go over
    /// is answered 503 `busy` with Retry-After.
    pub replies: Arc<tokio::sync::Semaphore>,
    /// The threads that search for writes' documents ahead of the writer
    /// ([`crate::writer::predecide`]): a few, so that a burst of writes
    /// costs neither a thread (and its allocator's memory) a request nor
    /// more than the cores.
    pub searchers: rayon::ThreadPool,
}

/// The threads of [`Service::searchers`], twice the cores (a search may
/// wait on a read of the store).
pub fn searchers() -> Result<rayon::ThreadPool, crate::ServiceError> {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    rayon::ThreadPoolBuilder::new()
        .num_threads((2 * cores).clamp(2, 32))
        .thread_name(|i| format!("neardup-search-{i}"))
        .panic_handler(|_| tracing::error!("a search ahead of the writer failed"))
        .build()
        .map_err(|e| crate::ServiceError::Config(format!("cannot start the search threads: {e}")))
}

/// Replies of the largest size that may wait for their clients at once.
pub const REPLY_MEMORY_BODIES: usize = 8;

/// The reply memory of a service taking bodies of `max_body` bytes, in KiB
/// (at least a MiB).
pub fn reply_memory_kib(max_body: usize) -> u32 {
    (max_body.saturating_mul(REPLY_MEMORY_BODIES) >> 10).clamp(1 << 10, u32::MAX as usize >> 4)
        as u32
}

impl<B: Bits> std::fmt::Debug for Service<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// JSON bodies, with every rejection answered as a JSON error.
mod dto;
mod handlers;
mod middleware;

pub use dto::*;
use handlers::*;
use middleware::*;

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
        .layer(axum::middleware::from_fn_with_state(
            (max_body, body_timeout),
            read_body,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&service),
            authorise::<B>,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&service),
            hold_replies::<B>,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&service),
            measure::<B>,
        ))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(service)
}
