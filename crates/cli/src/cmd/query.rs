//! `neardup query INDEX`: every stored document within k of a text, a file, a
//! fingerprint, or each document of a batch.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use neardup_core::index::Match;
use neardup_core::jaccard::{Verify, jaccard, shingles_for};
use neardup_core::{Fingerprint, SimHasher};

use crate::index_file::open;
use crate::input::InputArgs;
use crate::output::Output;
use crate::pipeline_args::{PipelineArgs, hasher_for};
use crate::run::{RunArgs, for_each_batch, init_threads};
use neardup_core::record::Id;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Output: JSON, {\"query\": \"<hex>\", \"matches\": [{\"id\": ..., \"distance\": d}, ...]}
(one line per document with --batch, with its \"id\"). Nearest first.

Examples:
  neardup query corpus.ndx --text \"the harbour master opened the gates\"
  neardup query corpus.ndx --file page.txt --k 2
  neardup query corpus.ndx --simhash 3b8c0a4f9d2e6b71
  neardup query corpus.ndx --batch new.jsonl -o matches.jsonl
  neardup query corpus.ndx --file page.txt --verify jaccard:0.8 --corpus corpus.jsonl
  neardup query copied.ndx --batch new.jsonl --check     # every byte checked first

Damage: opening an index checks its header, metadata and the structure of
every table (work in proportion to the directories, not to the entries), so a
damaged file never crashes a query. Damage inside keys or ids can still give a
wrong answer with exit status 0: pass --check to verify every byte against the
file's checksums first (it reads the whole file), or run `neardup index verify`
once after copying an index."
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

    /// Query with this dense vector, a JSON array of numbers (for an index of
    /// vectors).
    #[arg(long, value_name = "JSON", group = "what")]
    pub vector: Option<String>,

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

    /// Confirm each match by the exact Jaccard similarity of word 3-shingles
    /// (character 3-grams for Chinese) between the query's text and the matched
    /// document's, read from --corpus; matches below T are dropped and the
    /// others carry their "jaccard". Needs a text query (not --simhash).
    #[arg(long, value_name = "jaccard:T", requires = "corpus")]
    pub verify: Option<Verify>,

    /// The documents the index was built from (any input format, read once),
    /// for --verify.
    #[arg(long, value_name = "FILE", requires = "verify")]
    pub corpus: Option<PathBuf>,

    /// Verify every byte of the index against its checksums before answering
    /// (reads the whole file; see Damage below).
    #[arg(long)]
    pub check: bool,

    /// --threads for --batch; -q: no progress bar and no summary.
    #[command(flatten)]
    pub run: RunArgs,
}

/// A query waiting for verification: its id (batch), fingerprint, candidate
/// matches and features.
type Pending = (Option<Id>, Fingerprint, Vec<Match>, Vec<u64>);

pub fn run(args: Args) -> Result<ExitCode> {
    init_threads(args.run.threads)?;
    let started = std::time::Instant::now();
    let quiet = args.run.quiet;
    let opened = open(&args.index)?;
    if args.check {
        opened.file.verify().with_context(|| {
            format!(
                "{} is damaged: rebuild it with `neardup index build`, or restore it from a copy",
                args.index.display()
            )
        })?;
    }
    let k = args.k.unwrap_or(opened.k());
    if k > opened.k() {
        bail!(
            "--k {k} is larger than the index's maximum k = {}: rebuild the index with --k {k}",
            opened.k()
        );
    }
    let index = &opened.bundle.index;
    let width = index.width();
    let mut input = args.input.clone();
    let mut hasher = || -> Result<SimHasher> {
        let Some(config) = opened.config() else {
            bail!(
                "the index was built from fingerprints without a configuration: query it with --simhash"
            );
        };
        // The flags given, on top of the index's own configuration: with none,
        // exactly the index's; with any, they must not change it.
        let mut flags = args.pipeline.clone();
        flags.preset = Some(config.clone());
        if args.vector.is_some() {
            flags.hint = Some(neardup_core::InputKind::Vector);
        }
        let hasher = hasher_for(&flags, &mut input)?;
        config
            .check_compatible(hasher.config())
            .context("the query's pipeline flags differ from the index's")?;
        Ok(hasher)
    };
    if args.verify.is_some() && (args.vector.is_some() || args.input.hint().is_some()) {
        bail!("--verify compares texts; vectors and features are matched by distance alone");
    }
    if args.verify.is_some() && args.simhash.is_some() {
        bail!(
            "--verify compares texts, and --simhash gives none: query with --text, --file or --batch"
        );
    }
    let mut out = Output::create(args.output.as_deref())?;
    let mut line = Vec::new();
    let (mut queried, mut matched) = (0u64, 0u64);
    let mut write = |id: Option<&Id>,
                     fp: Fingerprint,
                     matches: &[Match],
                     jaccard: Option<&[f64]>,
                     out: &mut Output|
     -> Result<()> {
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
            write!(line, ",\"distance\":{}", m.distance)?;
            if let Some(js) = jaccard {
                write!(line, ",\"jaccard\":{:.4}", js[j])?;
            }
            line.push(b'}');
        }
        line.extend_from_slice(b"]}\n");
        out.write_all(&line)?;
        queried += 1;
        matched += u64::from(!matches.is_empty());
        Ok(())
    };
    if let (Some(verify), Some(corpus)) = (args.verify, &args.corpus) {
        // Every query first, then one pass over the corpus for the matched
        // documents' features, then the verified answers.
        let h = hasher()?;
        let normalize = h.config().normalize;
        let shingles = |text: &str| shingles_for(text, &normalize);
        let mut queries: Vec<Pending> = Vec::new();
        if args.batch {
            for_each_batch(
                &input,
                false,
                quiet,
                |doc| {
                    let fp = h.fingerprint(doc.text());
                    (fp, index.query(fp, k), shingles(doc.text()))
                },
                |docs, results| {
                    for (doc, (fp, r, set)) in docs.into_iter().zip(results) {
                        queries.push((Some(doc.id), fp, r?, set));
                    }
                    Ok(())
                },
            )?;
        } else {
            let text = query_text(&args)?;
            let fp = h.fingerprint(&text);
            queries.push((None, fp, index.query(fp, k)?, shingles(&text)));
        }
        let wanted: HashSet<Id> = queries
            .iter()
            .flat_map(|q| q.2.iter().filter_map(|m| opened.id(m.id)))
            .collect();
        let mut sets: HashMap<Id, Vec<u64>> = HashMap::with_capacity(wanted.len());
        let corpus_args = InputArgs {
            inputs: vec![corpus.clone()],
            ..input.clone()
        };
        for_each_batch(
            &corpus_args,
            false,
            true,
            |doc| wanted.contains(&doc.id).then(|| shingles(doc.text())),
            |docs, results| {
                for (doc, set) in docs.into_iter().zip(results) {
                    if let Some(set) = set {
                        sets.insert(doc.id, set);
                    }
                }
                Ok(())
            },
        )?;
        if let Some(missing) = wanted.iter().find(|id| !sets.contains_key(*id)) {
            bail!(
                "indexed document {missing} is not in {}: give the documents the index was built from",
                corpus.display()
            );
        }
        for (id, fp, matches, set) in queries {
            let (kept, js): (Vec<Match>, Vec<f64>) = matches
                .into_iter()
                .filter_map(|m| {
                    let other = &sets[&opened.id(m.id)?];
                    let j = jaccard(&set, other);
                    (j >= verify.threshold).then_some((m, j))
                })
                .unzip();
            write(id.as_ref(), fp, &kept, Some(&js), &mut out)?;
        }
    } else if args.batch {
        let h = hasher()?;
        for_each_batch(
            &input,
            false,
            quiet,
            |doc| {
                let fp = doc.fingerprint(&h);
                (fp, index.query(fp, k))
            },
            |docs, results| {
                for (doc, (fp, r)) in docs.iter().zip(results) {
                    write(Some(&doc.id), fp, &r?, None, &mut out)?;
                }
                Ok(())
            },
        )?;
    } else {
        let fp = if let Some(hex) = &args.simhash {
            Fingerprint::parse_hex_width(hex, width)?
        } else if let Some(json) = &args.vector {
            let v: Vec<f32> = serde_json::from_str(json)
                .context("--vector takes a JSON array of numbers, e.g. [0.12, -0.5, 0.33]")?;
            hasher()?
                .fingerprint_dense(&v)
                .context("--vector cannot be fingerprinted")?
        } else {
            hasher()?.fingerprint(&query_text(&args)?)
        };
        let matches = index.query(fp, k)?;
        write(None, fp, &matches, None, &mut out)?;
    }
    out.finish()?;
    if args.batch && !quiet {
        let verified = match args.verify {
            Some(v) => format!(", verified by {v}"),
            None => String::new(),
        };
        eprintln!(
            "neardup: {queried} queries, {matched} with matches within k = {k}{verified}; {:.2} s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The text of --text or --file.
fn query_text(args: &Args) -> Result<String> {
    if let Some(t) = &args.text {
        return Ok(t.clone());
    }
    let Some(path) = &args.file else {
        bail!("give the query: --text, --file, --simhash, or --batch with inputs");
    };
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: invalid UTF-8 at byte offset {}",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}
