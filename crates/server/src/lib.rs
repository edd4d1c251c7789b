//! # neardup-server
//!
//! The online near-duplicate service behind `neardup serve`: "have I already
//! got a near-duplicate of this page?", answered in microseconds, durably.
//!
//! - [`store`]: the source of truth, an embedded redb database (crash-safe,
//!   one durable transaction per write batch).
//! - [`collection`]: the in-memory index derived from it (permuted tables or
//!   multi-index blocks, as the collection's design says; main, mid and
//!   recent levels, merged in the background).
//! - [`writer`]: the single writer thread doing group commit, which also makes
//!   `insert_if_new` atomic.
//! - [`api`]: the axum router.

pub mod api;
pub mod collection;
pub mod error;
pub mod metrics;
pub mod signature_log;
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
    /// Called by the writer with each document's id; tests make it panic.
    #[doc(hidden)]
    pub writer_fault: Option<fn(&str)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: None,
            protect: Protect::Writes,
            max_body: 16 << 20,
            body_timeout: Duration::from_secs(30),
            opener: store::Opener::default(),
            writer_fault: None,
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
    /// Called once requests reach the collection (see [`App::when_serving`]).
    serving: Option<Box<dyn FnOnce() + Send>>,
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
        let hasher = hasher_for(dir, &settings)?;
        neardup_core::with_bits!(settings.config.bits, B => start::<B>(store, settings, hasher, options, started))
    }

    /// Calls `f` once requests reach the collection, no longer answered 503
    /// "loading" (at once when the collection opened before serving began).
    pub fn when_serving(mut self, f: impl FnOnce() + Send + 'static) -> App {
        self.serving = Some(Box::new(f));
        self
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

/// A collection whose fingerprints weigh features by a learned IDF table
/// keeps a copy of the table in its folder under this name; the settings
/// hold its digest, checked when the collection opens.
pub const IDF_FILE: &str = "idf.tsv";

/// The collection's fingerprinting, with its IDF table if it has one.
fn hasher_for(dir: &Path, settings: &Settings) -> Result<SimHasher, ServiceError> {
    if settings.config.idf.is_none() {
        return SimHasher::new(settings.config.clone())
            .map_err(|e| ServiceError::Config(e.to_string()));
    }
    let path = dir.join(IDF_FILE);
    let damaged = |e: String| {
        ServiceError::Storage(format!(
            "{}: {e}: the collection's IDF table is missing or damaged; restore the data \
             folder from a backup",
            path.display()
        ))
    };
    let file = std::fs::File::open(&path).map_err(|e| damaged(e.to_string()))?;
    let table = neardup_core::IdfTable::read(std::io::BufReader::new(file))
        .map_err(|e| damaged(e.to_string()))?;
    SimHasher::with_idf(settings.config.clone(), table).map_err(|e| damaged(e.to_string()))
}

fn start<B: Bits>(
    store: store::Store,
    settings: Settings,
    hasher: SimHasher,
    options: Options,
    started: Instant,
) -> Result<App, ServiceError> {
    let read_started = Instant::now();
    let expected = store.document_count()? as usize;
    let mut read_seconds = 0.0;
    let centre = match &settings.centring {
        Some(c) => c.centre(settings.config.bits)?,
        None => None,
    };
    let collection = Arc::new(
        collection::Collection::new(
            settings.design.clone(),
            |add| {
                let r = store.for_each(|id, fp| add(id, B::read_le(fp)));
                read_seconds = read_started.elapsed().as_secs_f64();
                r
            },
            expected,
        )?
        .with_centre(
            centre,
            settings
                .centring
                .as_ref()
                .map(|_| neardup_core::dedup::default_k(settings.config.bits, true)),
        ),
    );
    let loaded = collection.levels().documents as u64;
    // Reading the store and filling the id table happen together; the rest is
    // building the tables.
    let build_seconds = read_started.elapsed().as_secs_f64() - read_seconds;
    let store = Arc::new(store);
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
    let dim = match settings.config.dim {
        Some(d) => Some(d),
        None => store.dimension()?,
    };
    let control = Arc::new(writer::Control {
        fault: options.writer_fault,
        dim: dim.unwrap_or(0).into(),
        ..Default::default()
    });
    let writer = {
        let (s, c, w, set) = (
            Arc::clone(&store),
            Arc::clone(&collection),
            Arc::clone(&control),
            settings.clone(),
        );
        std::thread::Builder::new()
            .name("neardup-writer".into())
            .spawn(move || writer::run::<B>(s, c, rx, w, set))
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
        control: Arc::clone(&control),
        max_body: options.max_body,
        replies: Arc::new(tokio::sync::Semaphore::new(
            api::reply_memory_kib(options.max_body) as usize,
        )),
        searchers: api::searchers()?,
    });
    let router = api::router(Arc::clone(&service), options.max_body, options.body_timeout);
    let closer = move || {
        // Whatever the writer has not decided yet is refused: closing waits
        // for one commit at most, however much was queued.
        control.closing.store(true, Ordering::SeqCst);
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
        serving: None,
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
    /// Time a reply may wait for a client that does not read it: the
    /// connection is then closed (and the reply's memory freed).
    pub write_timeout: Duration,
    /// Connections served at once. One client address gets at most seven
    /// eighths of them; a connection over either limit is answered 503 with
    /// `Retry-After` and closed.
    pub max_connections: usize,
    /// After the shutdown signal: how long in-flight requests have to finish
    /// before their connections are dropped.
    pub shutdown_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
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
    app: App,
    listener: std::net::TcpListener,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    serve_inner(listener, limits, Ok(app), shutdown, on_bound).await
}

/// An open collection, or how to open it.
type Opening<E> = Result<App, Box<dyn FnOnce() -> Result<App, E> + Send>>;

/// [`serve`], answering while `open` opens the collection (on a blocking
/// thread): until it is open every request is answered 503 (`/readyz`:
/// `{"status": "loading"}`) with `Retry-After`. An error of `open` stops
/// the server and is returned.
pub async fn serve_opening<E>(
    listener: std::net::TcpListener,
    limits: Limits,
    open: impl FnOnce() -> Result<App, E> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(SocketAddr),
) -> Result<(), E>
where
    E: From<std::io::Error> + Send + 'static,
{
    serve_inner(listener, limits, Err(Box::new(open)), shutdown, on_bound).await
}

async fn serve_inner<E>(
    listener: std::net::TcpListener,
    limits: Limits,
    open: Opening<E>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(SocketAddr),
) -> Result<(), E>
where
    E: From<std::io::Error> + Send + 'static,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    on_bound(listener.local_addr()?);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let max = limits.max_connections.max(1);
    let per_client = (max - max / 8).max(1);
    let slots = Arc::new(tokio::sync::Semaphore::new(max));
    let clients: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>> =
        Arc::default();
    // Refusals being written; beyond these, over-limit connections are
    // closed without a word.
    let refusals = Arc::new(tokio::sync::Semaphore::new(256));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut refused_logged = false;
    let router: Arc<std::sync::OnceLock<Router>> = Arc::default();
    let (mut app, mut opening) = match open {
        Ok(mut a) => {
            let _ = router.set(a.router.clone());
            if let Some(f) = a.serving.take() {
                f();
            }
            (Some(a), None)
        }
        Err(open) => (None, Some(tokio::task::spawn_blocking(open))),
    };
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            opened = async { opening.as_mut().expect("still opening").await },
                if opening.is_some() =>
            {
                opening = None;
                match opened {
                    Ok(Ok(mut a)) => {
                        let _ = router.set(a.router.clone());
                        if let Some(f) = a.serving.take() {
                            f();
                        }
                        app = Some(a);
                        continue;
                    }
                    Ok(Err(e)) => return Err(e),
                    Err(join) => return Err(std::io::Error::other(join).into()),
                }
            }
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: wait for
                    // connections to close rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let ip = peer.ip();
        let admitted = {
            let mut c = clients.lock().expect("clients lock");
            let n = c.entry(ip).or_insert(0);
            if *n < per_client {
                Arc::clone(&slots)
                    .try_acquire_owned()
                    .ok()
                    .inspect(|_| *n += 1)
            } else {
                None
            }
        };
        let Some(slot) = admitted else {
            if !refused_logged {
                tracing::warn!(
                    "{max} connections open (at most {per_client} from one address): \
                     answering new ones 503 until some finish"
                );
                refused_logged = true;
            }
            if let Ok(permit) = Arc::clone(&refusals).try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(stream).await;
                    drop(permit);
                });
            }
            continue;
        };
        refused_logged = false;
        let _ = stream.set_nodelay(true);
        let router = Arc::clone(&router);
        let service =
            tower::service_fn(move |req: axum::extract::Request<hyper::body::Incoming>| {
                let router = router.get().cloned();
                async move {
                    use tower::ServiceExt;
                    match router {
                        Some(r) => r.oneshot(req.map(axum::body::Body::new)).await,
                        None => Ok(loading()),
                    }
                }
            });
        let io = TokioIo::new(WriteTimeout::new(stream, limits.write_timeout));
        let conn = graceful.watch(http.serve_connection(io, TowerToHyperService::new(service)));
        let clients = Arc::clone(&clients);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(slot);
            let mut c = clients.lock().expect("clients lock");
            if let Some(n) = c.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    c.remove(&ip);
                }
            }
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
    let app = match (app, opening) {
        (Some(a), _) => Some(a),
        // Stopped while opening: let the opening finish, then close it.
        (None, Some(o)) => match o.await {
            Ok(Ok(a)) => Some(a),
            Ok(Err(e)) => return Err(e),
            Err(join) => return Err(std::io::Error::other(join).into()),
        },
        (None, None) => None,
    };
    if let Some(mut app) = app {
        tokio::task::spawn_blocking(move || app.close())
            .await
            .map_err(std::io::Error::other)?;
    }
    Ok(())
}

/// The answer to every request while the collection is opening.
fn loading() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        [(axum::http::header::RETRY_AFTER, "1")],
        axum::Json(serde_json::json!({
            "status": "loading",
            "error": {"code": "loading", "message": "the collection is being opened: retry shortly"},
        })),
    )
        .into_response()
}

/// Answers a connection over the limits 503 with `Retry-After`, then closes
/// it (reading what the client sent, briefly, so that the answer is not lost
/// to a reset).
async fn refuse(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const BODY: &str = r#"{"error":{"code":"too_many_connections","message":"too many connections are open: retry shortly"}}"#;
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let answer = async {
        stream.write_all(reply.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        for _ in 0..16 {
            if stream.read(&mut sink).await? == 0 {
                break;
            }
        }
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answer).await;
}

/// A connection whose writes fail once one has waited `timeout` for the
/// client to read: a client that never reads its reply cannot hold the
/// connection (and the reply's memory) for longer.
struct WriteTimeout<S> {
    inner: S,
    timeout: Duration,
    waiting: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteTimeout<S> {
    fn new(inner: S, timeout: Duration) -> Self {
        WriteTimeout {
            inner,
            timeout,
            waiting: None,
        }
    }

    /// After the inner write was pending: Ready(Err) once waited too long.
    fn expired<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::future::Future;
        let timeout = self.timeout;
        let sleep = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client did not read its reply",
            ))),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteTimeout<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match std::pin::Pin::new(&mut self.inner).poll_write(cx, buf) {
            std::task::Poll::Pending => self.expired(cx),
            done => {
                self.waiting = None;
                done
            }
        }
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            std::task::Poll::Pending => self.expired(cx),
            done => {
                self.waiting = None;
                done
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match std::pin::Pin::new(&mut self.inner).poll_flush(cx) {
            std::task::Poll::Pending => self.expired(cx),
            done => {
                self.waiting = None;
                done
            }
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
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
