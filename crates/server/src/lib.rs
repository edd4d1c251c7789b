//! # neardup-server
//!
//! The online near-duplicate service behind `neardup serve`: "have I already
//! got a near-duplicate of this page?", answered in microseconds, durably.
//!
//! - [`store`]: the source of truth, an embedded redb database (crash-safe,
//!   one durable transaction per write batch).
//! - [`collection`]: the in-memory permuted-table index derived from it
//!   (main, mid and recent levels; merges in the background).
//! - [`writer`]: the single writer thread doing group commit, which also makes
//!   `insert_if_new` atomic.
//! - [`api`]: the axum router.

pub mod api;
pub mod collection;
pub mod error;
pub mod metrics;
pub mod store;
pub mod writer;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axum::Router;
use neardup_core::SimHasher;
use neardup_core::index::Bits;

pub use api::Protect;
pub use error::ServiceError;
pub use store::Settings;

/// Requests waiting for the writer before senders block.
const QUEUE: usize = 1024;

/// How to run the service.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bearer token; `None`: no authorisation.
    pub token: Option<String>,
    pub protect: Protect,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// Time a request has to send its body once its headers are in (408).
    pub body_timeout: Duration,
    /// How the store's database file is opened (and reopened after a failed
    /// commit).
    pub opener: store::Opener,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: None,
            protect: Protect::Writes,
            max_body: 16 << 20,
            body_timeout: Duration::from_secs(30),
            opener: store::Opener::default(),
        }
    }
}

/// An open collection and its router; [`App::close`] stops it cleanly.
pub struct App {
    pub router: Router,
    pub settings: Settings,
    /// Documents loaded at start, and how long opening took.
    pub loaded: u64,
    pub open_seconds: f64,
    /// Of which: reading the store, and building the in-memory index.
    pub read_seconds: f64,
    pub build_seconds: f64,
    closer: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl App {
    /// Opens the collection in `dir` (or creates it with `create()`), loads
    /// every stored fingerprint into the in-memory index, and starts the
    /// writer and merger threads.
    pub fn open(
        dir: &Path,
        create: impl FnOnce() -> Result<Settings, ServiceError>,
        options: Options,
    ) -> Result<App, ServiceError> {
        let started = Instant::now();
        let (store, settings) = store::Store::open_with(dir, create, options.opener.clone())?;
        neardup_core::with_bits!(settings.config.bits, B => start::<B>(store, settings, options, started))
    }

    /// Stops taking writes, lets the writer commit and answer everything it
    /// received, and stops the merger. Call after the server has drained.
    pub fn close(&mut self) {
        if let Some(c) = self.closer.take() {
            c();
        }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.close();
    }
}

fn start<B: Bits>(
    store: store::Store,
    settings: Settings,
    options: Options,
    started: Instant,
) -> Result<App, ServiceError> {
    let hasher =
        SimHasher::new(settings.config.clone()).map_err(|e| ServiceError::Config(e.to_string()))?;
    let read_started = Instant::now();
    let expected = store.document_count()? as usize;
    let mut read_seconds = 0.0;
    let collection = Arc::new(collection::Collection::new(
        settings.design.clone(),
        |add| {
            let r = store.for_each(|id, fp| add(id, B::read_le(fp)));
            read_seconds = read_started.elapsed().as_secs_f64();
            r
        },
        expected,
    )?);
    let loaded = collection.levels().documents as u64;
    // Reading the store and filling the id table happen together; the rest is
    // building the tables.
    let build_seconds = read_started.elapsed().as_secs_f64() - read_seconds;
    let store = Arc::new(store);
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
    let writer = {
        let (s, c) = (Arc::clone(&store), Arc::clone(&collection));
        std::thread::Builder::new()
            .name("neardup-writer".into())
            .spawn(move || writer::run::<B>(s, c, rx))
            .map_err(|e| ServiceError::Config(format!("cannot start the writer: {e}")))?
    };
    let stop = Arc::new(AtomicBool::new(false));
    let merger = {
        let (c, stop) = (Arc::clone(&collection), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("neardup-merger".into())
            .spawn(move || c.merge_loop(&stop))
            .map_err(|e| ServiceError::Config(format!("cannot start the merger: {e}")))?
    };
    let service = Arc::new(api::Service {
        settings: settings.clone(),
        hasher,
        collection: Arc::clone(&collection),
        store,
        jobs: RwLock::new(Some(tx)),
        metrics: metrics::Metrics::default(),
        token: options.token,
        protect: options.protect,
        started: Instant::now(),
    });
    let router = api::router(Arc::clone(&service), options.max_body, options.body_timeout);
    let closer = move || {
        service.jobs.write().expect("jobs lock").take();
        join(writer);
        stop.store(true, Ordering::Relaxed);
        collection.stop_merging();
        join(merger);
    };
    Ok(App {
        router,
        settings,
        loaded,
        open_seconds: started.elapsed().as_secs_f64(),
        read_seconds,
        build_seconds,
        closer: Some(Box::new(closer)),
    })
}

fn join(h: JoinHandle<()>) {
    let _ = h.join();
}

/// What one connection may cost the service.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time a connection has to send a request's headers, counted from when
    /// the server starts waiting for them: an idle keep-alive connection is
    /// closed after it too.
    pub header_timeout: Duration,
    /// Connections served at once; further ones are closed as accepted.
    pub max_connections: usize,
    /// After the shutdown signal: how long in-flight requests have to finish
    /// before their connections are dropped.
    pub shutdown_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            max_connections: 4096,
            shutdown_deadline: Duration::from_secs(10),
        }
    }
}

/// Serves `app` on `listener` (bound before the collection is opened, so that
/// an address in use fails before anything is created) until `shutdown`
/// completes, then finishes in-flight requests (for at most
/// `limits.shutdown_deadline`) and closes the app (every acknowledged write
/// committed). `on_bound` gets the bound address (useful with port 0).
pub async fn serve(
    mut app: App,
    listener: std::net::TcpListener,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    on_bound(listener.local_addr()?);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut refused_logged = false;
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait for
                    // connections to close rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            if !refused_logged {
                tracing::warn!(
                    "{} connections open: closing new ones until some finish",
                    limits.max_connections
                );
                refused_logged = true;
            }
            continue; // dropped: closed at once
        };
        refused_logged = false;
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.router.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            let _ = conn.await;
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_deadline, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "requests still open {:?} after the shutdown signal: closing their connections",
            limits.shutdown_deadline
        );
    }
    tokio::task::spawn_blocking(move || app.close())
        .await
        .map_err(std::io::Error::other)?;
    Ok(())
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
