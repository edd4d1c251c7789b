//! `neardup query INDEX`: every stored document within k of a text, a file, a
//! fingerprint, or each document of a batch.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use neardup_core::index::{Bits, Index, Match};
use neardup_core::{Fingerprint, SimHasher, Width};

use super::index::{Opened, open};
use crate::input::{Id, InputArgs};
use crate::output::Output;
use crate::pipeline_args::PipelineArgs;
use crate::run::{for_each_batch, init_threads};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Output: JSON, {\"query\": \"<hex>\", \"matches\": [{\"id\": ..., \"distance\": d}, ...]}
(one line per document with --batch, with its \"id\"). Nearest first.

Examples:
  neardup query corpus.ndx --text \"the harbour master opened the gates\"
  neardup query corpus.ndx --file page.txt --k 2
  neardup query corpus.ndx --simhash 3b8c0a4f9d2e6b71
  neardup query corpus.ndx --batch new.jsonl -o matches.jsonl"
)]
pub struct Args {
    /// The index file.
    pub index: PathBuf,

    /// Query with this text.
    #[arg(long, group = "what")]
    pub text: Option<String>,

    /// Query with this file's text.
    #[arg(long, value_name = "PATH", group = "what")]
    pub file: Option<PathBuf>,

    /// Query with this fingerprint (hex).
    #[arg(long, value_name = "HEX", group = "what")]
    pub simhash: Option<String>,

    /// Query with every document of these inputs (same formats as `fingerprint`).
    #[arg(long, group = "what")]
    pub batch: bool,

    #[command(flatten)]
    pub input: InputArgs,

    /// Largest distance (at most the index's k; default: the index's k).
    #[arg(short, long)]
    pub k: Option<u32>,

    /// At most this many matches per query.
    #[arg(long)]
    pub limit: Option<usize>,

    /// Write here (atomically) instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Pipeline flags, if given, must describe the index's own configuration.
    #[command(flatten)]
    pub pipeline: PipelineArgs,

    /// Worker threads for --batch (default: all cores).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub threads: usize,
}

enum Loaded {
    W64(Index<u64>),
    W128(Index<u128>),
}

impl Loaded {
    fn query(&self, fp: Fingerprint, k: u32) -> Result<Vec<Match>> {
        Ok(match self {
            Loaded::W64(i) => i.query(neardup_core::index::bits::word_of(fp)?, k)?,
            Loaded::W128(i) => i.query(neardup_core::index::bits::word_of(fp)?, k)?,
        })
    }
}

fn load<B: Bits>(o: &Opened) -> Result<Index<B>> {
    Ok(o.file.index::<B>()?)
}

pub fn run(args: Args) -> Result<ExitCode> {
    init_threads(args.threads)?;
    let opened = open(&args.index)?;
    let k = args.k.unwrap_or(opened.k);
    if k > opened.k {
        bail!(
            "--k {k} is larger than the index's maximum k = {}: rebuild the index with --k {k}",
            opened.k
        );
    }
    let width = Width::from_bits(opened.file.bits())?;
    let index = match width {
        Width::W64 => Loaded::W64(load(&opened)?),
        Width::W128 => Loaded::W128(load(&opened)?),
    };
    let hasher = || -> Result<SimHasher> {
        let Some(config) = &opened.config else {
            bail!(
                "the index was built from fingerprints without a configuration: query it with --simhash"
            );
        };
        // The flags given, on top of the index's own configuration: with none,
        // exactly the index's; with any, they must not change it.
        let mut flags = args.pipeline.clone();
        flags.preset = Some(config.clone());
        let hasher = flags.hasher()?;
        config
            .check_compatible(hasher.config())
            .context("the query's pipeline flags differ from the index's")?;
        Ok(hasher)
    };
    let mut out = Output::create(args.output.as_deref())?;
    let mut line = Vec::new();
    let mut write =
        |id: Option<&Id>, fp: Fingerprint, matches: &[Match], out: &mut Output| -> Result<()> {
            line.clear();
            line.push(b'{');
            if let Some(id) = id {
                line.extend_from_slice(b"\"id\":");
                id.write_json(&mut line);
                line.push(b',');
            }
            write!(line, "\"query\":\"{fp}\",\"matches\":[")?;
            for (j, m) in matches
                .iter()
                .take(args.limit.unwrap_or(usize::MAX))
                .enumerate()
            {
                if j > 0 {
                    line.push(b',');
                }
                line.extend_from_slice(b"{\"id\":");
                match opened.id(m.id) {
                    Some(id) => id.write_json(&mut line),
                    None => line.extend_from_slice(b"null"),
                }
                write!(line, ",\"distance\":{}}}", m.distance)?;
            }
            line.extend_from_slice(b"]}\n");
            out.write_all(&line)?;
            Ok(())
        };
    if args.batch {
        let h = hasher()?;
        for_each_batch(
            &args.input,
            false,
            true,
            |doc| {
                let fp = h.fingerprint(&doc.text);
                (fp, index.query(fp, k))
            },
            |docs, results| {
                for (doc, (fp, r)) in docs.iter().zip(results) {
                    write(Some(&doc.id), fp, &r?, &mut out)?;
                }
                Ok(())
            },
        )?;
    } else {
        let fp = if let Some(hex) = &args.simhash {
            Fingerprint::parse_hex_width(hex, width)?
        } else if let Some(t) = &args.text {
            hasher()?.fingerprint(t)
        } else if let Some(path) = &args.file {
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let text = String::from_utf8(bytes).map_err(|e| {
                anyhow::anyhow!(
                    "{}: invalid UTF-8 at byte offset {}",
                    path.display(),
                    e.utf8_error().valid_up_to()
                )
            })?;
            hasher()?.fingerprint(&text)
        } else {
            bail!("give the query: --text, --file, --simhash, or --batch with inputs");
        };
        let matches = index.query(fp, k)?;
        write(None, fp, &matches, &mut out)?;
    }
    out.finish()?;
    Ok(ExitCode::SUCCESS)
}
