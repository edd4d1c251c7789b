//! `neardup config`: the configuration the pipeline flags describe.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;

use crate::pipeline_args::{PipelineArgs, save_config};
use neardup_core::config::relative_to;

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
    let (config, _) = args.pipeline.resolve()?;
    match &args.output {
        Some(path) => save_config(path, &config)?,
        None => {
            // Named relative to the current folder, where `> FILE` puts it.
            let mut config = config;
            if let Some(table) = config.idf.as_mut().and_then(|r| r.path.as_mut()) {
                *table = relative_to(Path::new(table.as_str()), Path::new("."))
                    .display()
                    .to_string();
            }
            let mut json = serde_json::to_string_pretty(&config)?;
            json.push('\n');
            write!(std::io::stdout().lock(), "{json}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
