//! `neardup truth`: exact ground truth for evaluation, every pair of documents
//! whose verification features have Jaccard similarity at or above a threshold.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use neardup_core::NormalizeConfig;
use neardup_core::jaccard::{jaccard, shingles_for, similarity_join};

use crate::input::InputArgs;
use crate::output::Output;
use crate::run::{RunArgs, for_each_batch, init_threads, summary, with_spinner};
use neardup_core::record::Id;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Each line of the output: {\"a\": id, \"b\": id, \"jaccard\": J, \"edit\": E}, \
with \"edit\" only for pairs listed in --edits. The features are those of --verify: word \
3-shingles after NFKC, case folding and whitespace folding; for text of which one letter or digit \
in fifty is Chinese or Japanese, character 3-grams of its letters and digits (spaces, line breaks and punctuation left out).

Examples:
  neardup truth corpus.jsonl -o truth.jsonl
  neardup truth corpus.jsonl --edits edits.jsonl --threshold 0.5 -o truth.jsonl"
)]
pub struct Args {
    #[command(flatten)]
    pub input: InputArgs,

    /// Keep every pair with Jaccard similarity at least this (exact: no pair at or
    /// above it is missed). Lower than the duplicate threshold, so that an
    /// evaluation can say how close the false positives were.
    #[arg(long, default_value_t = 0.5)]
    pub threshold: f64,

    /// Labelled pairs (`{"a", "b", "edit"}` JSON Lines, as evalkit/build_corpus.py
    /// writes): each is kept whatever its similarity, with its label.
    #[arg(long, value_name = "FILE")]
    pub edits: Option<PathBuf>,

    /// Strip HTML before comparing (as the pipeline's --html does).
    #[arg(long)]
    pub html: bool,

    /// Output file (default: standard output).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(serde::Deserialize)]
struct Edit {
    a: Id,
    b: Id,
    edit: String,
}

pub fn run(args: Args) -> Result<ExitCode> {
    init_threads(args.run.threads)?;
    crate::pipeline_args::text_only(&args.input, "truth")?;
    if !(args.threshold > 0.0 && args.threshold <= 1.0) {
        bail!(
            "--threshold {} is out of range: use a similarity in (0, 1], e.g. 0.5",
            args.threshold
        );
    }
    let started = Instant::now();
    let normalize = NormalizeConfig {
        html: args.html,
        ..NormalizeConfig::default()
    };
    let mut ids: Vec<Id> = Vec::new();
    let mut sets: Vec<Vec<u64>> = Vec::new();
    let stats = for_each_batch(
        &args.input,
        false,
        args.run.quiet,
        |doc| shingles_for(doc.text(), &normalize),
        |docs, s| {
            ids.extend(docs.into_iter().map(|d| d.id));
            sets.extend(s);
            Ok(())
        },
    )?;
    let mut index: HashMap<&Id, u32> = HashMap::with_capacity(ids.len());
    for (i, id) in ids.iter().enumerate() {
        if index.insert(id, i as u32).is_some() {
            bail!(
                "document id {id} appears twice: ground truth needs unique ids (give each record its own id)"
            );
        }
    }
    let refs: Vec<&[u64]> = sets.iter().map(Vec::as_slice).collect();
    let message = format!(
        "every pair with Jaccard >= {} among {} documents",
        args.threshold,
        ids.len()
    );
    let mut pairs: HashMap<(u32, u32), (f64, Option<String>)> =
        with_spinner(&message, args.run.quiet, || {
            similarity_join(&refs, args.threshold)
                .into_iter()
                .map(|(a, b, j)| ((a, b), (j, None)))
                .collect()
        });
    if let Some(path) = &args.edits {
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        for (n, line) in BufReader::new(file).lines().enumerate() {
            let place = || format!("{}:{}", path.display(), n + 1);
            let line = line.with_context(|| format!("cannot read {}", place()))?;
            if line.trim().is_empty() {
                continue;
            }
            let e: Edit = serde_json::from_str(&line).with_context(|| {
                format!(
                    "{}: not a labelled pair: expected {{\"a\": id, \"b\": id, \"edit\": label}}",
                    place()
                )
            })?;
            let find = |id: &Id| {
                index
                    .get(id)
                    .copied()
                    .with_context(|| format!("{}: document {id} is not in the corpus", place()))
            };
            let (a, b) = (find(&e.a)?, find(&e.b)?);
            let key = (a.min(b), a.max(b));
            let j = jaccard(&sets[a as usize], &sets[b as usize]);
            pairs.entry(key).or_insert((j, None)).1 = Some(e.edit);
        }
    }
    let mut sorted: Vec<_> = pairs.into_iter().collect();
    sorted.sort_unstable_by_key(|&(k, _)| k);
    let mut out = Output::create(args.output.as_deref())?;
    let mut line = Vec::with_capacity(128);
    for ((a, b), (j, edit)) in &sorted {
        line.clear();
        line.extend_from_slice(b"{\"a\":");
        ids[*a as usize].write_json(&mut line);
        line.extend_from_slice(b",\"b\":");
        ids[*b as usize].write_json(&mut line);
        write!(line, ",\"jaccard\":{j}")?;
        if let Some(e) = edit {
            line.extend_from_slice(b",\"edit\":");
            serde_json::to_writer(&mut line, e)?;
        }
        line.extend_from_slice(b"}\n");
        out.write_all(&line)?;
    }
    out.finish()?;
    if !args.run.quiet {
        eprintln!(
            "neardup: {} pairs; read {}",
            sorted.len(),
            summary(&stats, started.elapsed())
        );
    }
    Ok(ExitCode::SUCCESS)
}
