//! `neardup serve`: the online near-duplicate service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use neardup_core::dedup::{centred_k, default_k};
use neardup_core::index::{ONLINE_BYTES_PER_DOCUMENT, plan_online};
use neardup_core::vector::default_vector_k;
use neardup_core::{FingerprintConfig, InputKind, Width};
use neardup_server::store::Centring;
use neardup_server::{App, Options, Protect, ServiceError, Settings};

use crate::pipeline_args::PipelineArgs;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "The collection's fingerprint configuration, maximum k, verification and index \
design are fixed when it is created (the pipeline flags, --max-k, --verify, --no-verify and \
--no-centre, --centre-from and --expected-documents apply then only). By default a collection of \
texts verifies as `neardup dedup` decides: candidates within k = 19 of 128-bit token \
fingerprints centred on the collection's corpus (the mean learned from its first 1000 \
documents; plain fingerprints until then), searched through multi-index blocks, kept when the \
Jaccard similarity of the texts reaches 0.8. --no-centre keeps plain fingerprints (k = 15). \
--no-verify creates the paper's collection instead: 64-bit fingerprints, Hamming distance within \
k = 3 alone.

API (see /openapi.json, or crates/server/openapi.json):
  POST /v1/documents   {\"documents\": [{\"id\", \"text\" | \"simhash\", \"meta\"}], \"mode\": \"insert\" | \"insert_if_new\" | \"check\", \"k\"}
  POST /v1/query       {\"text\" | \"simhash\", \"k\", \"limit\"}
  GET|DELETE /v1/documents/{id}    GET /v1/stats    GET /healthz    GET /metrics

Examples:
  neardup serve --data /var/lib/neardup
  NEARDUP_TOKEN=s3cret neardup serve --data ./col --addr 127.0.0.1:7700 --protect all
  curl -s localhost:7700/v1/documents -H 'content-type: application/json' \\
    -d '{\"documents\": [{\"id\": \"u1\", \"text\": \"some page\"}], \"mode\": \"insert_if_new\"}'"
)]
pub struct Args {
    /// The collection's folder: opened, or created when empty.
    #[arg(long, value_name = "DIR")]
    pub data: PathBuf,

    /// Address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub addr: SocketAddr,

    /// At creation: the largest k a request may ask for (default, as
    /// `neardup dedup`: 19 at 128 bits and 10 at 64 when verified and centred,
    /// 15 and 7 with --no-centre; 3 with --no-verify).
    #[arg(long, visible_alias = "k", value_parser = clap::value_parser!(u32).range(0..=32))]
    pub max_k: Option<u32>,

    /// At creation: the verification threshold (default jaccard:0.8): a match
    /// of texts is kept when the Jaccard similarity of the texts' verification
    /// features (kept per document in the store) reaches T; in a collection of
    /// vectors (default 0.95), when the exact cosine of the stored vectors
    /// does. Requests may set their own ("verify": {"jaccard": T} or
    /// {"cosine": S}).
    #[arg(long, value_name = "jaccard:T", conflicts_with = "no_verify")]
    pub verify: Option<neardup_core::jaccard::Verify>,

    /// At creation: decide by Hamming distance alone (the paper's regime:
    /// 64-bit fingerprints, k = 3 by default), without verification.
    #[arg(long)]
    pub no_verify: bool,

    /// At creation: plain fingerprints for texts. By default a verified
    /// collection centres them on its corpus, as `neardup dedup` does (each
    /// bit set where a document leans further than the corpus's mean, not
    /// further than one half: unrelated documents then lie about 64 of 128
    /// bits apart instead of 45, so the wide k finds far fewer candidates),
    /// with the mean learned from the first documents stored.
    #[arg(long)]
    pub no_centre: bool,

    /// At creation: how many documents stored by text the centre is learned
    /// from (default 1000). Until then fingerprints are plain; when the
    /// centre is learned, those documents' fingerprints are rewritten in one
    /// transaction.
    #[arg(long, value_name = "N", conflicts_with = "no_centre", value_parser = clap::value_parser!(u64).range(1..))]
    pub centre_from: Option<u64>,

    /// At creation: how many documents the table design is planned for.
    #[arg(long, value_name = "N")]
    pub expected_documents: Option<f64>,

    /// Bearer token that protects writes (or everything, with --protect all).
    #[arg(long, env = "NEARDUP_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// What the token protects.
    #[arg(long, value_enum, default_value_t = ProtectArg::Writes)]
    pub protect: ProtectArg,

    /// Largest request body, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    pub max_body: usize,

    /// Seconds a connection has to send a request's headers; an idle
    /// keep-alive connection is closed after as long.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = positive_seconds)]
    pub header_timeout: f64,

    /// Seconds a request has to send its body once its headers are in (408).
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = positive_seconds)]
    pub body_timeout: f64,

    /// Seconds a reply may wait for a client that does not read it before
    /// its connection is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = positive_seconds)]
    pub write_timeout: f64,

    /// Connections served at once, at most seven eighths of them from one
    /// address (further ones are answered 503 with Retry-After and closed);
    /// at most the open-file limit less 64 (raised to its hard limit at
    /// start).
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_connections: usize,

    /// Seconds in-flight requests have to finish after SIGTERM or Ctrl-C
    /// before their connections are dropped (acknowledged writes are
    /// committed whatever happens).
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = positive_seconds)]
    pub shutdown_deadline: f64,

    #[command(flatten)]
    pub pipeline: PipelineArgs,
}

/// Default maximum k of a new collection.
const DEFAULT_MAX_K: u32 = 3;
/// Default cosine a verified collection of vectors keeps matches at (as
/// `neardup dedup` on vectors).
const DEFAULT_COSINE: f64 = 0.95;
/// Default number of documents a new collection learns its centre from.
const DEFAULT_CENTRE_FROM: u64 = 1000;
/// Default planned size of a new collection.
const DEFAULT_EXPECTED: f64 = 1e7;

/// `--protect`: which requests need the token.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtectArg {
    /// POST /v1/documents and DELETE.
    Writes,
    /// Every route but /healthz.
    All,
}

pub fn run(args: Args) -> Result<ExitCode> {
    // The service's own events (failed commits, refused connections, a slow
    // shutdown) on stderr; NEARDUP_LOG=debug and the like for more.
    let filter = tracing_subscriber::EnvFilter::try_from_env("NEARDUP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
    // Every pipeline flag counts (the destructuring in any_given lists them
    // all): one left out would silently be ignored on an existing collection.
    let creating_flags = args.max_k.is_some()
        || args.verify.is_some()
        || args.no_verify
        || args.no_centre
        || args.centre_from.is_some()
        || args.expected_documents.is_some()
        || args.pipeline.any_given();
    if args.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
        bail!(
            "the token is empty (--token or NEARDUP_TOKEN): an empty token would turn \
             authentication off; give a secret, or unset NEARDUP_TOKEN and drop --token \
             to serve without one"
        );
    }
    if args.protect == ProtectArg::All && args.token.is_none() {
        bail!("--protect all needs a token: give --token or set NEARDUP_TOKEN");
    }
    if let Some(t) = &args.token
        && t.trim() != t
    {
        eprintln!(
            "neardup: warning: the token has leading or trailing whitespace; clients must \
             send it exactly, spaces included (drop them if they are not meant)"
        );
    }
    let options = Options {
        token: args.token.clone(),
        protect: match args.protect {
            ProtectArg::All => Protect::All,
            ProtectArg::Writes => Protect::Writes,
        },
        max_body: args.max_body,
        body_timeout: Duration::from_secs_f64(args.body_timeout),
        opener: Default::default(),
        writer_fault: None,
    };
    // The address first: one in use fails before a collection is created.
    let listener = std::net::TcpListener::bind(args.addr).with_context(|| {
        format!(
            "cannot listen on {}: is another service using it? give another --addr",
            args.addr
        )
    })?;
    let addr = args.addr;
    let local = listener
        .local_addr()
        .with_context(|| format!("cannot listen on {addr}"))?;
    if !addr.ip().is_loopback() && args.token.is_none() {
        eprintln!(
            "neardup: warning: listening on {addr} without a token: anyone who can reach it can write"
        );
    }
    let files = raise_open_file_limit();
    let max_connections = args
        .max_connections
        .min(files.saturating_sub(64) as usize)
        .max(1);
    if max_connections < args.max_connections {
        eprintln!(
            "neardup: serving at most {max_connections} connections at once \
             (the open-file limit is {files}; raise it with ulimit -n)"
        );
    }
    let limits = neardup_server::Limits {
        header_timeout: Duration::from_secs_f64(args.header_timeout),
        write_timeout: Duration::from_secs_f64(args.write_timeout),
        max_connections,
        shutdown_deadline: Duration::from_secs_f64(args.shutdown_deadline),
    };
    // Opened while the address already answers (503 "loading" until done).
    let open = move || -> Result<App> {
        let idf_copy = args.data.join(neardup_server::IDF_FILE);
        let create = || {
            let (settings, idf_source) = create_settings(&args)?;
            if let Some(from) = idf_source {
                copy_idf_table(&from, &idf_copy)?;
            }
            Ok(settings)
        };
        let db = args.data.join(neardup_server::store::DB_FILE);
        let (creating, new_folder) = (!db.exists(), !args.data.exists());
        let app = App::open(&args.data, create, options).inspect_err(|_| {
            // A refused creation leaves the folder as it was.
            if creating && !db.exists() {
                let _ = std::fs::remove_file(&idf_copy);
                if new_folder {
                    let _ = std::fs::remove_dir(&args.data);
                }
            }
        });
        let app =
            app.with_context(|| format!("cannot open the collection in {}", args.data.display()))?;
        if creating_flags {
            let (wanted, _) = create_settings(&args)?;
            if wanted.config != app.settings.config
                || wanted.max_k != app.settings.max_k
                || ((args.verify.is_some() || args.no_verify)
                    && wanted.verify != app.settings.verify)
                || ((args.no_centre || args.centre_from.is_some())
                    && wanted.centring.is_some() != app.settings.centring.is_some())
            {
                bail!(
                    "the collection in {} was created with other settings (fixed at creation: {}): \
                     drop the pipeline, --max-k, --verify, --no-verify, --no-centre and \
                     --centre-from flags, or give an empty folder",
                    args.data.display(),
                    app.settings.summary()
                );
            }
        }
        eprintln!(
            "neardup: {} documents loaded from {} in {:.2} s; {}; {}",
            app.loaded,
            args.data.display(),
            app.open_seconds,
            app.settings.config.summary(),
            app.settings.summary()
        );
        // Said once requests reach the collection (clients wait for it).
        Ok(app.when_serving(move || eprintln!("neardup: listening on http://{local}")))
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(neardup_server::serve_opening(
        listener,
        limits,
        open,
        neardup_server::shutdown_signal(),
        |addr| {
            eprintln!("neardup: opening the collection; http://{addr} answers 503 until it is open")
        },
    ))?;
    eprintln!("neardup: stopped; every acknowledged write is committed");
    Ok(ExitCode::SUCCESS)
}

/// Copies the IDF table the flags name into the new collection's folder
/// (through a temporary file: a copy is whole or absent).
fn copy_idf_table(from: &str, to: &std::path::Path) -> Result<(), ServiceError> {
    let tmp = to.with_extension("tsv.tmp");
    std::fs::copy(from, &tmp)
        .and_then(|_| std::fs::rename(&tmp, to))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            ServiceError::Storage(format!(
                "cannot copy the IDF table {from} into {}: {e}",
                to.display()
            ))
        })
}

/// The settings of a collection created by these arguments: by default
/// verified as `neardup dedup` is (the candidate configuration, its k, the
/// Jaccard threshold), on the online design the planner picks for k.
fn create_settings(args: &Args) -> Result<(Settings, Option<String>), ServiceError> {
    settings_for(
        &args.pipeline,
        args.max_k,
        args.verify,
        (
            args.no_verify,
            args.no_centre.then_some(0).or(args.centre_from),
        ),
        args.expected_documents,
    )
}

/// The settings `neardup serve` gives a collection created with no flags
/// (or with `--no-verify` alone), planned for `expected` documents
/// (`neardup bench serve` creates these).
#[cfg(feature = "bench")]
pub fn default_settings(expected: f64, no_verify: bool) -> Result<Settings, ServiceError> {
    settings_for(
        &PipelineArgs::default(),
        None,
        None,
        (no_verify, None),
        Some(expected),
    )
    .map(|(s, _)| s)
}

fn settings_for(
    pipeline: &PipelineArgs,
    max_k: Option<u32>,
    verify: Option<neardup_core::jaccard::Verify>,
    // --no-verify; the number of documents the centre is learned from
    // (Some(0): --no-centre).
    (no_verify, centre_from): (bool, Option<u64>),
    expected: Option<f64>,
) -> Result<(Settings, Option<String>), ServiceError> {
    let config_error = |e: String| ServiceError::Config(e);
    let given_verify = verify.is_some();
    let mut pipeline = pipeline.clone();
    let verify = match (verify, no_verify) {
        (_, true) => None,
        (v, false) => Some(v.unwrap_or_default()),
    };
    let preset = pipeline
        .overrides()
        .starts_from_candidates(verify.is_some(), pipeline.config.is_some());
    if preset {
        pipeline.preset = Some(FingerprintConfig::candidates());
    }
    let (mut config, _) = pipeline
        .resolve()
        .map_err(|e| config_error(format!("{e:#}")))?;
    // The collection keeps its own copy of a learned IDF table (`serve`
    // copies it in once the settings are accepted): its source is returned.
    let idf_source = config
        .idf
        .as_mut()
        .and_then(|r| r.path.replace(neardup_server::IDF_FILE.into()));
    // Verification compares texts (Jaccard) or vectors (exact cosine, at
    // dedup's threshold by default); weighted features have neither.
    let threshold = match (verify, config.input) {
        (Some(v), InputKind::Text) => Some(v.threshold),
        (Some(v), InputKind::Vector) if given_verify => Some(v.threshold),
        (Some(_), InputKind::Vector) => Some(DEFAULT_COSINE),
        (Some(_), kind) if given_verify => {
            return Err(config_error(format!(
                "--verify compares texts or vectors, and this collection holds {}: drop --verify",
                kind.plural()
            )));
        }
        _ => None,
    };
    let verify = verify.filter(|_| threshold.is_some());
    let width = config.bits;
    // Centred as `neardup dedup` centres: the candidate configuration, verified.
    let centring = match centre_from {
        Some(0) => None,
        _ if !(preset && verify.is_some() && config.input == InputKind::Text) => {
            if centre_from.is_some() {
                return Err(config_error(
                    "--centre-from centres the candidate fingerprints of a verified collection \
                     of texts: drop it (or --no-verify, --config, --profile)"
                        .into(),
                ));
            }
            None
        }
        from => Some(Centring::Learning {
            from: from.unwrap_or(DEFAULT_CENTRE_FROM),
        }),
    };
    let max_k = match (max_k, verify.is_some(), config.input) {
        (Some(k), _, _) => k,
        (None, true, InputKind::Vector) => {
            default_vector_k(width, threshold.unwrap_or(DEFAULT_COSINE), true)
        }
        (None, true, _) if centring.is_some() => centred_k(width),
        (None, true, _) => default_k(width, true),
        (None, false, InputKind::Text) => DEFAULT_MAX_K,
        (None, false, _) => DEFAULT_MAX_K.max(default_k(width, false)),
    };
    if let Some(v) = verify.filter(|_| config.input == InputKind::Text) {
        let least = default_k(width, true);
        if max_k < least {
            return Err(config_error(format!(
                "--max-k {max_k} is too narrow to verify at {} bits: candidates within \
                 {max_k} miss many pairs at Jaccard {}; use --max-k {least} or more (the \
                 default), or --no-verify to decide by Hamming distance alone",
                width.bits(),
                v.threshold
            )));
        }
    }
    let n = expected.unwrap_or(DEFAULT_EXPECTED).max(1.0);
    let planned = match width {
        Width::W64 => plan_online::<u64>(max_k, n, &[], ONLINE_BYTES_PER_DOCUMENT),
        Width::W128 => plan_online::<u128>(max_k, n, &[], ONLINE_BYTES_PER_DOCUMENT),
    };
    let p = planned.map_err(|e| config_error(format!("--max-k {max_k}: {e}")))?;
    let settings = Settings {
        config,
        max_k,
        design: p.design().clone(),
        version: neardup_server::store::STORE_VERSION,
        verify: threshold,
        centring,
        planned_for: Some(n),
    };
    Ok((settings, idf_source))
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a number of seconds between 0 and 86400"
        )),
    }
}

/// Raises the soft limit on open files to the hard one (idle clients each
/// hold a descriptor); returns the limit in force.
fn raise_open_file_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `lim`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        // An unlimited hard limit is not a value the kernel takes for files.
        let target = lim.rlim_max.min(1 << 20);
        if lim.rlim_cur < target {
            let raised = libc::rlimit {
                rlim_cur: target,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = target;
            }
        }
    }
    lim.rlim_cur
}
