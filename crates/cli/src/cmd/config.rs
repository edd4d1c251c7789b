//! `neardup config`: the configuration the pipeline flags describe.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use crate::output::write_atomic;
use crate::pipeline_args::PipelineArgs;

#[derive(clap::Args, Debug)]
#[command(after_help = "Example:
  neardup config --features shingles:4 --bits 128 -o my.json
  neardup fingerprint --config my.json corpus.jsonl")]
pub struct Args {
    #[command(flatten)]
    pub pipeline: PipelineArgs,

    /// Save to this file (atomically) instead of printing.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let (config, _) = args.pipeline.resolve()?;
    let mut json = serde_json::to_string_pretty(&config)?;
    json.push('\n');
    match &args.output {
        Some(path) => write_atomic(path, json.as_bytes())?,
        None => write!(out, "{json}")?,
    }
    Ok(ExitCode::SUCCESS)
}
