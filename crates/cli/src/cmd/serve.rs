//! `neardup serve`: the online near-duplicate service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use neardup_core::index::plan;
use neardup_server::{App, Options, Protect, ServiceError, Settings};

use crate::pipeline_args::PipelineArgs;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "The collection's fingerprint configuration, maximum k and table design are \
fixed when it is created (the pipeline flags, --max-k and --expected-documents apply then only).

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

    /// At creation: the largest k a request may ask for.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=16))]
    pub max_k: Option<u32>,

    /// At creation: how many documents the table design is planned for.
    #[arg(long, value_name = "N")]
    pub expected_documents: Option<f64>,

    /// Bearer token that protects writes (or everything, with --protect all).
    #[arg(long, env = "NEARDUP_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// What the token protects.
    #[arg(long, value_parser = ["writes", "all"], default_value = "writes")]
    pub protect: String,

    /// Largest request body, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    pub max_body: usize,

    #[command(flatten)]
    pub pipeline: PipelineArgs,
}

/// Default maximum k of a new collection.
const DEFAULT_MAX_K: u32 = 3;
/// Default planned size of a new collection.
const DEFAULT_EXPECTED: f64 = 1e7;

pub fn run(args: Args) -> Result<ExitCode> {
    let creating_flags = args.max_k.is_some()
        || args.expected_documents.is_some()
        || args.pipeline.config.is_some()
        || args.pipeline.profile.is_some()
        || args.pipeline.bits.is_some()
        || args.pipeline.tokenizer.is_some()
        || args.pipeline.features.is_some()
        || args.pipeline.weights.is_some();
    let create = || -> Result<Settings, ServiceError> {
        let (config, idf) = args
            .pipeline
            .resolve()
            .map_err(|e| ServiceError::Config(format!("{e:#}")))?;
        if idf.is_some() {
            return Err(ServiceError::Config(
                "a service collection cannot use an IDF table file yet: use --weights tf or binary"
                    .into(),
            ));
        }
        let max_k = args.max_k.unwrap_or(DEFAULT_MAX_K);
        let n = args.expected_documents.unwrap_or(DEFAULT_EXPECTED).max(1.0);
        let p = plan(config.bits.bits(), max_k, n, None)
            .map_err(|e| ServiceError::Config(e.to_string()))?;
        Ok(Settings {
            config,
            max_k,
            design: p.options[p.chosen].design.clone(),
            version: 1,
        })
    };
    let options = Options {
        token: args.token.clone().filter(|t| !t.is_empty()),
        protect: if args.protect == "all" {
            Protect::All
        } else {
            Protect::Writes
        },
        max_body: args.max_body,
    };
    let app = App::open(&args.data, create, options)
        .with_context(|| format!("cannot open the collection in {}", args.data.display()))?;
    if creating_flags && app.loaded > 0 {
        let wanted = create()?;
        if wanted.config != app.settings.config || wanted.max_k != app.settings.max_k {
            bail!(
                "the collection in {} was created with other settings (fixed at creation): \
                 drop the pipeline and --max-k flags, or give an empty folder",
                args.data.display()
            );
        }
    }
    eprintln!(
        "neardup: {} documents loaded from {} in {:.2} s; {}; max k = {}, {} tables",
        app.loaded,
        args.data.display(),
        app.open_seconds,
        app.settings.config.summary(),
        app.settings.max_k,
        app.settings.design.tables.len()
    );
    if !args.addr.ip().is_loopback() && args.token.is_none() {
        eprintln!(
            "neardup: warning: listening on {} without a token: anyone who can reach it can write",
            args.addr
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime
        .block_on(neardup_server::serve(
            app,
            args.addr,
            neardup_server::shutdown_signal(),
            |addr| eprintln!("neardup: listening on http://{addr}"),
        ))
        .with_context(|| format!("cannot serve on {}", args.addr))?;
    eprintln!("neardup: stopped; every acknowledged write is committed");
    Ok(ExitCode::SUCCESS)
}
