//! `neardup idf build`: learn inverse document frequencies from a corpus.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, bail};
use neardup_core::{IdfBuilder, SimHasher, Weights};

use crate::input::InputArgs;
use crate::output::Output;
use crate::pipeline_args::PipelineArgs;
use crate::run::{RunArgs, for_each_batch, init_threads, summary};

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Count in how many documents each feature occurs and write an IDF table,
    /// for `--weights tfidf --idf FILE`. Use the same tokenizer, features and
    /// normalisation flags here as when fingerprinting.
    #[command(after_help = "Example:
  neardup idf build corpus.jsonl --features shingles:2 -o corpus.idf
  neardup fingerprint corpus.jsonl --features shingles:2 --idf corpus.idf")]
    Build(BuildArgs),
}

#[derive(clap::Args, Debug)]
pub struct BuildArgs {
    #[command(flatten)]
    pub input: InputArgs,

    #[command(flatten)]
    pub pipeline: PipelineArgs,

    /// Where to write the table (atomically).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,

    /// Keep features seen in at least this many documents (rarer ones get the
    /// largest IDF anyway).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub min_df: u64,

    #[command(flatten)]
    pub run: RunArgs,
}

pub fn run(cmd: Command) -> Result<ExitCode> {
    let Command::Build(args) = cmd;
    init_threads(args.run.threads)?;
    if args.pipeline.idf.is_some() {
        bail!("--idf names a table to use; `idf build` makes one: leave --idf out");
    }
    crate::pipeline_args::text_only(&args.input, "idf build")?;
    let (mut config, _) = args.pipeline.resolve()?;
    // Count raw features: weights do not change which features there are.
    config.weights = Weights::Tf;
    config.top = None;
    let digest = config.features_digest();
    let hasher = SimHasher::new(config)?;
    let started = Instant::now();
    let mut builder = IdfBuilder::new();
    let stats = for_each_batch(
        &args.input,
        false,
        args.run.quiet,
        |doc| {
            let distinct: HashSet<String> = hasher
                .features(doc.text())
                .into_iter()
                .map(|f| f.text)
                .collect();
            distinct
        },
        |_docs, sets| {
            for set in &sets {
                builder.add_document(set.iter().map(String::as_str));
            }
            Ok(())
        },
    )?;
    let mut out = Output::create(Some(&args.output))?;
    builder.write(args.min_df, &digest, &mut out)?;
    out.finish()?;
    if !args.run.quiet {
        eprintln!("neardup: {}", summary(&stats, started.elapsed()));
        eprintln!("neardup: wrote {}", args.output.display());
    }
    Ok(ExitCode::SUCCESS)
}
