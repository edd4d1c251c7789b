//! `neardup fingerprint`: documents in, `{"id", "simhash"}` out.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use neardup_core::FingerprintConfig;

use crate::input::{Id, InputArgs};
use crate::output::{Output, write_atomic};
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
                if args.tsv {
                    write_tsv_id(&doc.id, &mut line);
                    writeln!(line, "\t{fp}")?;
                } else {
                    line.extend_from_slice(b"{\"id\":");
                    doc.id.write_json(&mut line);
                    writeln!(line, ",\"simhash\":\"{fp}\"}}")?;
                }
                out.write_all(&line)?;
            }
            Ok(())
        },
    )?;
    out.finish()?;
    if let Some(path) = &args.output {
        save_config_beside(path, hasher.config())?;
    }
    if !args.run.quiet && (args.output.is_some() || !std::io::stdout().is_terminal()) {
        eprintln!("neardup: {}", summary(&stats, started.elapsed()));
    }
    Ok(ExitCode::SUCCESS)
}

/// `FILE.config.json`, read back by commands that take fingerprint files.
pub fn config_path_for(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".config.json");
    PathBuf::from(name)
}

fn save_config_beside(path: &Path, config: &FingerprintConfig) -> Result<()> {
    if path.as_os_str() == "-" {
        return Ok(());
    }
    let mut json = serde_json::to_vec_pretty(config)?;
    json.push(b'\n');
    Ok(write_atomic(&config_path_for(path), &json)?)
}

fn write_tsv_id(id: &Id, out: &mut Vec<u8>) {
    match id {
        Id::Int(n) => {
            let _ = write!(out, "{n}");
        }
        Id::Str(s) => {
            for c in s.chars() {
                match c {
                    '\t' => out.extend_from_slice(b"\\t"),
                    '\n' => out.extend_from_slice(b"\\n"),
                    '\r' => out.extend_from_slice(b"\\r"),
                    '\\' => out.extend_from_slice(b"\\\\"),
                    c => {
                        let mut buf = [0; 4];
                        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
        }
    }
}
