//! `neardup fingerprint`: documents in, `{"id", "simhash"}` out.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;

use crate::fpfile;
use crate::input::InputArgs;
use crate::output::Output;
use crate::pipeline_args::{PipelineArgs, hasher_for};
use crate::run::{RunArgs, for_each_batch, init_threads, summary};

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  neardup fingerprint docs/                       # every file of a directory, one document each
  neardup fingerprint --lines titles.txt          # one document per line
  neardup fingerprint corpus.jsonl -o fps.jsonl   # JSON Lines with \"id\" and \"text\"
  neardup fingerprint --profile python-simhash a.txt
  cat page.html | neardup fingerprint --html")]
pub struct Args {
    #[command(flatten)]
    pub input: InputArgs,

    #[command(flatten)]
    pub pipeline: PipelineArgs,

    /// Write here (atomically) instead of standard output; the configuration is
    /// saved beside it as FILE.config.json.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Write `id<TAB>simhash` lines instead of JSON Lines.
    #[arg(long)]
    pub tsv: bool,

    #[command(flatten)]
    pub run: RunArgs,
}

pub fn run(args: Args) -> Result<ExitCode> {
    init_threads(args.run.threads)?;
    let mut input = args.input.clone();
    let hasher = hasher_for(&args.pipeline, &mut input)?;
    let started = Instant::now();
    let mut out = Output::create(args.output.as_deref())?;
    let mut line = Vec::with_capacity(256);
    let stats = for_each_batch(
        &input,
        false,
        args.run.quiet,
        |doc| doc.fingerprint(&hasher),
        |docs, fps| {
            for (doc, fp) in docs.iter().zip(fps) {
                line.clear();
                fpfile::write_line(&doc.id, fp, args.tsv, &mut line);
                out.write_all(&line)?;
            }
            Ok(())
        },
    )?;
    out.finish()?;
    if let Some(path) = &args.output {
        fpfile::save_config_beside(path, hasher.config())?;
    }
    if !args.run.quiet && (args.output.is_some() || !std::io::stdout().is_terminal()) {
        eprintln!("neardup: {}", summary(&stats, started.elapsed()));
    }
    Ok(ExitCode::SUCCESS)
}
