//! `neardup dedup`: near-duplicate pairs, clusters, and the deduplicated corpus.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use clap::ValueEnum;
use neardup_core::dedup::{Dedup, PairScore, Policy, centred_k, clusters, default_k};
use neardup_core::index::{
    Bits, JoinDesign, RadiusDesign, SelfJoin, TableDesign, join_max_k, plan_join_for,
};
use neardup_core::jaccard::{SHORT_TEXT_WORDS, Verify};
use neardup_core::spill::Spill;
use neardup_core::vector::{cosine as cosine_similarity, default_vector_k, recall_at};
use neardup_core::{Fingerprint, FingerprintConfig, InputKind, Width, with_bits};

use crate::fpfile::{IdList, Values};
use crate::gather::{Gathered, Keep, centre_fingerprints, gather};
use crate::input::{DocReader, Record};
use crate::output::NamedOutput;
use crate::run::{RunArgs, for_each_batch, init_threads, with_spinner};
use crate::source::SourceArgs;
use crate::table_out::{ClustersWriter, Format, PairsWriter};
use crate::vector_store::VectorStore;
use neardup_core::keep_by::KeepBy;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Union-find over the pairs: clusters are connected components; each keeps
    /// its first document.
    Components,
    /// In input order, keep a document unless it is within k of one already kept
    /// (clusters never chain).
    Incremental,
}

impl PolicyArg {
    fn policy(self) -> Policy {
        match self {
            PolicyArg::Components => Policy::Components,
            PolicyArg::Incremental => Policy::Incremental,
        }
    }
}

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  neardup dedup corpus.jsonl --pairs pairs.jsonl --keep clean.jsonl
  neardup dedup docs/ --k 4 --clusters clusters.jsonl --policy incremental
  neardup fingerprint corpus.jsonl -o fps.jsonl && neardup dedup --fingerprints fps.jsonl --pairs pairs.jsonl")]
pub struct Args {
    #[command(flatten)]
    pub source: SourceArgs,

    /// Candidates: Hamming distance at most K (up to 8 for 64-bit fingerprints,
    /// 16 for 128-bit; 12 and 24 for centred candidates). Default with
    /// verification 19 for 128 bits, 10 for 64, on centred candidates (15 and
    /// 7 with --no-centre; wide, for recall: verification decides); without,
    /// 3 for 64 bits, 6 for 128.
    #[arg(short, long, value_parser = clap::value_parser!(u32).range(0..=24))]
    pub k: Option<u32>,

    /// Confirm each candidate pair by the exact Jaccard similarity of the two
    /// documents' word 3-shingles (character 3-grams for Chinese). On by
    /// default, as jaccard:0.8, whenever the documents' texts are read (not with
    /// --fingerprints). Candidates then come from 128-bit fingerprints of single
    /// tokens, UAX #29 words with each Han character one (pipeline flags adjust
    /// this; --config or --profile replace it).
    #[arg(long, value_name = "jaccard:T")]
    pub verify: Option<Verify>,

    /// Skip verification: pairs are decided by Hamming distance alone (faster,
    /// less precise).
    #[arg(long, conflicts_with = "verify")]
    pub no_verify: bool,

    /// With verification, candidates come from fingerprints centred on the
    /// corpus: each bit set where the document leans further than the
    /// corpus's mean, not further than one half (unrelated documents then lie
    /// about 64 of 128 bits apart instead of 45, and the join compares far
    /// fewer pairs). This flag makes plain fingerprints instead, as `neardup
    /// fingerprint` does. Only for the candidate configuration (not with
    /// --config or --profile).
    #[arg(long)]
    pub no_centre: bool,

    /// Keep only pairs whose similarity estimated from the fingerprints,
    /// cos(pi * d / f), is at least S: for when only fingerprints are available.
    /// Sets k to the largest distance that qualifies (or lowers --k to it).
    #[arg(long, value_name = "S")]
    pub min_similarity: Option<f64>,

    /// How pairs become kept and dropped documents.
    #[arg(long, value_enum, default_value_t = PolicyArg::Components)]
    pub policy: PolicyArg,

    /// Deduplicate INPUT against these documents (a corpus already cleaned:
    /// files or folders, read with the same flags): pairs within INPUT and
    /// between INPUT and OLD are reported, and only INPUT's documents are
    /// ever dropped (OLD's are preferred to every new one).
    #[arg(long, value_name = "OLD", num_args = 1.., conflicts_with = "fingerprints")]
    pub against: Vec<PathBuf>,

    /// Which document of a cluster survives: first (in input order), longest
    /// (text in bytes), or field:NAME[:asc|desc], the smallest (asc, the
    /// default) or largest value of a JSON field (numbers before strings,
    /// records without it last). Ties go to the first in input order.
    #[arg(long, value_name = "RULE", default_value = "first")]
    pub keep_by: KeepBy,

    /// Write every pair within k: `{"a": id, "b": id, "distance": d}` per line.
    #[arg(long, value_name = "FILE")]
    pub pairs: Option<PathBuf>,

    /// Write each cluster of two or more: `{"representative": id, "size": n, "members": [ids]}`.
    #[arg(long, value_name = "FILE")]
    pub clusters: Option<PathBuf>,

    /// Format of --pairs and --clusters (default: by extension, Parquet for
    /// .parquet, else JSON Lines). --keep and --drop write records unchanged,
    /// in the inputs' format.
    #[arg(long, value_name = "FORMAT")]
    pub output_format: Option<crate::table_out::Format>,

    /// Write the input records that survive, unchanged.
    #[arg(long, value_name = "FILE")]
    pub keep: Option<PathBuf>,

    /// Write the input records that are removed, unchanged.
    #[arg(long, value_name = "FILE")]
    pub drop: Option<PathBuf>,

    /// Write every input record, kept or not, with three fields added, for
    /// review before removing: "cluster" (the id of its cluster's
    /// representative; its own id when it has no near-duplicate),
    /// "duplicate_of" (the representative it is a copy of; null when kept)
    /// and "similarity" (the highest similarity of its pairs: verified, else
    /// estimated from the distance as cos(pi d / f); null without pairs).
    /// JSON Lines records only.
    #[arg(long, value_name = "FILE")]
    pub annotate: Option<PathBuf>,

    /// Where verification spills each document's features (about 0.45 bytes
    /// per byte of English text and 1.1 of Chinese, a repeated set once;
    /// removed at exit); default: the system's temporary folder ($TMPDIR,
    /// else /tmp).
    #[arg(long, value_name = "DIR")]
    pub tmp_dir: Option<PathBuf>,

    #[command(flatten)]
    pub run: RunArgs,
}

/// Above this many pairs (or a million and a hundred per document), --pairs
/// warns of the size of its output.
const LOTS_OF_PAIRS: u64 = 50_000_000;

/// Cosine similarity that dense vectors must reach without --min-similarity.
const DEFAULT_COSINE: f64 = 0.95;

/// How candidate pairs are confirmed.
#[derive(Clone, Copy, Debug)]
enum Check {
    /// Exact Jaccard similarity of the texts' shingles.
    Jaccard(Verify),
    /// Exact cosine similarity of the vectors, at least this.
    Cosine(f64),
}

impl Check {
    fn threshold(self) -> f64 {
        match self {
            Check::Jaccard(v) => v.threshold,
            Check::Cosine(t) => t,
        }
    }

    /// The name of the similarity in the pairs' JSON.
    fn field(self) -> &'static str {
        match self {
            Check::Jaccard(_) => "jaccard",
            Check::Cosine(_) => "cosine",
        }
    }
}

/// Every output of the run (--pairs, --clusters, --keep, --drop) is written
/// under a temporary name and renamed into place only once the whole run
/// has succeeded: a failed run leaves none of them, and the files it would
/// have replaced as they were.
pub fn run(args: Args) -> Result<ExitCode> {
    check_outputs(&args)?;
    let outputs = neardup_core::output::Deferred::begin();
    let code = run_all(args)?;
    outputs.commit()?;
    Ok(code)
}

/// The checks on the outputs' names that need no work done first.
fn check_outputs(args: &Args) -> Result<()> {
    let inputs = &args.source.input.inputs;
    let from_stdin = inputs.is_empty() || inputs.iter().any(|p| p.as_os_str() == "-");
    if from_stdin || args.source.fingerprints.is_some() {
        return Ok(());
    }
    if (args.keep.is_some() || args.drop.is_some())
        && crate::input::parquet_files(&args.source.input)?.is_some()
    {
        for path in [&args.keep, &args.drop].into_iter().flatten() {
            if !crate::parquet_io::is_parquet(path) {
                bail!(
                    "the inputs are Parquet, so --keep and --drop write Parquet: name \
                     the output {}.parquet",
                    path.with_extension("").display()
                );
            }
        }
    }
    Ok(())
}

fn run_all(args: Args) -> Result<ExitCode> {
    init_threads(args.run.threads)?;
    let started = Instant::now();
    let wants_records = args.keep.is_some() || args.drop.is_some() || args.annotate.is_some();
    let inputs = &args.source.input.inputs;
    let from_stdin = inputs.is_empty() || inputs.iter().any(|p| p.as_os_str() == "-");
    let keep_raw = wants_records && from_stdin;
    if let Some(s) = args.min_similarity
        && !(-1.0..=1.0).contains(&s)
    {
        bail!("--min-similarity {s} is out of range: use a similarity in [-1, 1], e.g. 0.9");
    }
    let kind = match &args.source.fingerprints {
        Some(_) => InputKind::Text,
        None => {
            let mut p = args.source.pipeline.clone();
            p.hint = p.hint.or(args.source.input.hint());
            p.resolve()?.0.input
        }
    };
    if kind != InputKind::Text {
        return run_vectors(args, kind, started, keep_raw || from_stdin);
    }
    let verify = match (args.verify, args.no_verify, &args.source.fingerprints) {
        (_, true, _) => None,
        (Some(_), _, Some(_)) => bail!(
            "--verify needs the documents' texts, and --fingerprints has none: give the \
             documents instead, or use --min-similarity to filter by estimated similarity"
        ),
        (None, false, Some(_)) => None,
        (v, false, None) => Some(v.unwrap_or_default()),
    };
    // Verification starts from the candidate configuration, unless the
    // pipeline is given whole (--config, --profile); single flags adjust it.
    let mut source = args.source.clone();
    let preset = source
        .pipeline
        .overrides()
        .starts_from_candidates(verify.is_some(), source.pipeline.config.is_some());
    if preset {
        source.pipeline.preset = Some(FingerprintConfig::candidates());
    }
    let centre = preset && !args.no_centre;
    let keep = Keep {
        records: wants_records,
        raw: keep_raw,
        verify: verify.is_some(),
        tmp_dir: args.tmp_dir.clone(),
        keep_by: args.keep_by.clone(),
        centre,
    };
    if args.keep_by != KeepBy::First && args.source.fingerprints.is_some() {
        bail!(
            "--keep-by {} reads the documents, and --fingerprints has none: give the \
             documents instead",
            args.keep_by
        );
    }
    let mut phases = Phases::default();
    // With --against: the old documents first, then the new ones.
    let mut old = match args.against.is_empty() {
        true => None,
        false => {
            let mut old_source = source.clone();
            old_source.input.inputs = args.against.clone();
            let old_keep = Keep {
                verify: keep.verify,
                tmp_dir: keep.tmp_dir.clone(),
                centre,
                ..Keep::default()
            };
            Some(gather(&old_source, &old_keep, args.run.quiet)?)
        }
    };
    let mut g = gather(&source, &keep, args.run.quiet)?;
    if centre {
        // On the mean of old and new documents alike.
        let mut parts: Vec<&mut Gathered> = old.iter_mut().collect();
        parts.push(&mut g);
        centre_fingerprints(&mut parts);
    }
    let first = old.as_ref().map_or(0, |o| o.values.len());
    let mut old_spill = None;
    if let Some(mut o) = old {
        if o.width != g.width {
            bail!("the old documents' fingerprints and the new ones' differ in width");
        }
        let new_values = std::mem::take(&mut g.values);
        o.values.append(new_values);
        g.values = std::mem::take(&mut o.values);
        let new_ids = std::mem::replace(&mut g.ids, IdList::Ints(Vec::new()));
        o.ids.append(new_ids);
        g.ids = std::mem::replace(&mut o.ids, IdList::Ints(Vec::new()));
        let n_new = (g.values.len() - first) as u32;
        let mut preference: Vec<u32> = (0..first as u32).collect();
        match &g.preference {
            Some(p) => preference.extend(p.iter().map(|&d| d + first as u32)),
            None => preference.extend(first as u32..first as u32 + n_new),
        }
        g.preference = Some(preference);
        g.blank += o.blank;
        g.short += o.short;
        g.bytes += o.bytes;
        old_spill = o.spill;
    }
    phases.mark("fingerprint");
    let bits = g.width.bits();
    let max = match centre {
        true => join_max_k(bits),
        false => bits / 8,
    };
    let mut k = match centre {
        true => args.k.unwrap_or(centred_k(g.width)),
        false => args.k.unwrap_or(default_k(g.width, verify.is_some())),
    };
    if let Some(s) = args.min_similarity {
        let most = Fingerprint::distance_for_similarity(s, g.width);
        k = if args.k.is_some() {
            k.min(most)
        } else {
            most.min(max)
        };
    }
    if k > max {
        bail!(
            "--k {k} is too large for {}-bit fingerprints: use at most {max}",
            g.width
        );
    }
    let policy = args.policy.policy();
    let values = std::mem::take(&mut g.values);
    let message = format!(
        "finding every pair within k = {k} among {} fingerprints{}",
        values.len(),
        if verify.is_some() {
            ", and verifying them"
        } else {
            ""
        }
    );
    // --annotate gives each record its best similarity: every pair verified.
    let spanning = args.pairs.is_none() && args.annotate.is_none() && policy == Policy::Components;
    let check = verify.map(|v| {
        (
            v.threshold,
            Features {
                old: old_spill.as_ref(),
                new: g.spill.as_ref().expect("features gathered"),
                first: first as u32,
            },
        )
    });
    let (dedup, reps) = with_spinner(&message, args.run.quiet, || {
        with_bits!(g.width, B => join::<B>(
            values,
            k,
            policy,
            check,
            spanning,
            g.preference.as_deref(),
            &mut phases,
        ))
    })?;
    let spilled = g.spill.as_ref().map_or(0, Spill::disk_bytes)
        + old_spill.as_ref().map_or(0, Spill::disk_bytes);
    // Closing the spill, the kernel frees its pages (about 60 ms a GB):
    // beside the writing rather than before it.
    let spills = (g.spill.take(), old_spill);
    let closing = std::thread::spawn(move || drop(spills));
    let written = write_outputs(&args, &g, &dedup, &reps, verify.map(Check::Jaccard), first);
    let _ = closing.join();
    written?;
    phases.mark("write");
    if !args.run.quiet {
        eprintln!("neardup: phases: {phases}");
        if let Some(join) = &phases.join {
            eprintln!("neardup: join: {join}");
        }
    }
    report(
        &args,
        &g,
        &dedup,
        (&reps, first),
        started,
        match verify {
            Some(v) => format!(
                "within k = {k} and verified by {v}{} (features spilled to disk: {:.0} MB)",
                if spanning {
                    " (a spanning set: pairs already connected are not verified; --pairs \
                     verifies and lists every one)"
                } else {
                    ""
                },
                spilled as f64 / 1e6
            ),
            None => format!("within k = {k}, not verified"),
        },
    );
    if !args.run.quiet && g.blank > 0 {
        eprintln!(
            "neardup: {} documents have no words (empty, or only spaces and punctuation): \
             they are kept and paired with nothing",
            g.blank
        );
    }
    if !args.run.quiet && g.short > 0 {
        let advice = if verify.is_some() {
            "their pairs are still confirmed by verification, but candidates may be missed: \
             see docs/quality.md, \"Short texts\""
        } else {
            "SimHash is unreliable on them: verify pairs (drop --no-verify, or give the \
             documents instead of fingerprints), or see docs/quality.md, \"Short texts\""
        };
        eprintln!(
            "neardup: warning: {} of {} documents have fewer than {} words; {advice}",
            g.short,
            dedup.documents(),
            SHORT_TEXT_WORDS
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The summary line: documents, pairs by `rule`, clusters, time, memory.
/// `reps` and the first new document (documents before it are --against's).
fn report(
    args: &Args,
    g: &Gathered,
    dedup: &Dedup,
    (reps, first): (&[u32], usize),
    started: Instant,
    rule: String,
) {
    let removed = reps
        .iter()
        .enumerate()
        .skip(first)
        .filter(|&(i, &r)| r as usize != i)
        .count();
    // Clusters that remove a (new) document.
    let cluster_count = {
        let mut has = vec![false; reps.len()];
        for (i, &r) in reps.iter().enumerate().skip(first) {
            if r as usize != i {
                has[r as usize] = true;
            }
        }
        has.iter().filter(|&&h| h).count()
    };
    if args.run.quiet {
        return;
    }
    let secs = started.elapsed().as_secs_f64();
    if first > 0 {
        eprintln!(
            "neardup: {} new documents against {first} old ones (old ones are never removed)",
            dedup.documents() - first
        );
    }
    eprintln!(
        "neardup: {} documents ({} distinct), {} pairs {rule}, {} clusters, {} removed, {} kept; {:.2} s ({:.0} docs/s, {:.1} MB/s){}",
        dedup.documents(),
        dedup.distinct(),
        dedup.pair_count(),
        cluster_count,
        removed,
        dedup.documents() - first - removed,
        secs,
        dedup.documents() as f64 / secs.max(1e-9),
        g.bytes as f64 / 1e6 / secs.max(1e-9),
        peak_memory()
            .map(|mb| format!(", peak memory {mb:.0} MB"))
            .unwrap_or_default(),
    );
}

/// `dedup` of dense vectors or weighted features. Vectors' candidates are
/// confirmed by exact cosine similarity (unless --no-verify): the vectors of
/// the documents that have candidates are read in a second pass (or kept from
/// the first, for standard input), so memory holds only those.
fn run_vectors(args: Args, kind: InputKind, started: Instant, keep_all: bool) -> Result<ExitCode> {
    if args.verify.is_some() {
        bail!(
            "--verify jaccard:T compares texts; {} are confirmed by exact cosine \
             similarity at --min-similarity S (default {DEFAULT_COSINE})",
            kind.plural()
        );
    }
    if !args.against.is_empty() {
        bail!(
            "--against takes texts; deduplicate {} without it",
            kind.plural()
        );
    }
    let cosine = args.min_similarity.unwrap_or(DEFAULT_COSINE);
    let check = (kind == InputKind::Vector && !args.no_verify).then_some(Check::Cosine(cosine));
    let mut source = args.source.clone();
    if source.pipeline.config.is_none() && source.pipeline.bits.is_none() {
        // 128 bits: candidates within a wider k relative to the angle's spread.
        source.pipeline.preset = Some(FingerprintConfig::vectors(Width::W128, None, 0));
    }
    let wants_records = args.keep.is_some() || args.drop.is_some() || args.annotate.is_some();
    if wants_records
        && args
            .source
            .input
            .inputs
            .iter()
            .any(|p| p.extension().is_some_and(|e| e == "npy"))
    {
        bail!(
            "--keep and --drop copy input records, and .npy rows are not records: write \
             --clusters (or --pairs) and select the rows by id, e.g. with NumPy"
        );
    }
    let keep_vectors = keep_all && check.is_some();
    let keep = Keep {
        records: wants_records,
        raw: keep_all && wants_records,
        verify: keep_vectors,
        tmp_dir: args.tmp_dir.clone(),
        keep_by: args.keep_by.clone(),
        centre: false,
    };
    if args.keep_by == KeepBy::Longest {
        bail!(
            "--keep-by longest compares texts' lengths; use first or field:NAME for {}",
            kind.plural()
        );
    }
    let mut g = gather(&source, &keep, args.run.quiet)?;
    let mut kept: Option<VectorStore> = None;
    if keep_vectors {
        // Standard input cannot be read twice: the first pass kept every vector.
        kept = g.vectors.take();
    }
    let bits = g.width.bits();
    let max = bits / 8;
    let k = args
        .k
        .unwrap_or_else(|| default_vector_k(g.width, cosine, check.is_some()));
    if k > max {
        bail!("--k {k} is too large for {bits}-bit fingerprints: use at most {max}");
    }
    if check.is_some() && !args.run.quiet {
        let recall = recall_at(bits, k, cosine);
        if recall < 0.9 {
            eprintln!(
                "neardup: warning: pairs of cosine similarity {cosine} are within k = {k} of \
                 each other's {bits}-bit fingerprints with probability {recall:.2} only (more \
                 similar pairs more often); see docs/vectors.md for the bits and k a threshold needs"
            );
        }
    }
    let policy = args.policy.policy();
    let values = std::mem::take(&mut g.values);
    let message = format!(
        "finding every pair within k = {k} among {} fingerprints",
        values.len()
    );
    let mut dedup = with_spinner(&message, args.run.quiet, || -> Result<Dedup> {
        with_bits!(g.width, B => join_only::<B>(values, k))
    })?;
    let mut verified = 0usize;
    if let Some(c) = check {
        let wanted = dedup.candidate_documents();
        verified = wanted.len();
        let store = match kept {
            Some(store) => store,
            None => VectorStore::read(&source, &wanted, dedup.documents())?,
        };
        dedup = dedup.verify_by(
            c.threshold(),
            |doc| Some(store.digest(doc)),
            |a, b| cosine_similarity(store.get(a), store.get(b)),
        );
    }
    let reps = match &g.preference {
        Some(p) => dedup.representatives_by(policy, p),
        None => dedup.representatives(policy),
    };
    write_outputs(&args, &g, &dedup, &reps, check, 0)?;
    let rule = match check {
        Some(_) => format!(
            "within k = {k} and of cosine similarity at least {cosine} ({verified} vectors read to verify)"
        ),
        None => format!("within k = {k}, not verified"),
    };
    report(&args, &g, &dedup, (&reps, 0), started, rule);
    Ok(ExitCode::SUCCESS)
}

/// The self-join's design: planned from the fingerprints themselves, or,
/// for measuring one design against another, imposed by
/// `NEARDUP_JOIN_LEVELS`, the levels of blocks of permuted tables (`17` for
/// 17 blocks picking 17 − k, `16,16` for two levels; see `neardup plan`), or
/// `NEARDUP_JOIN_BLOCKS`, the number of multi-index blocks (`7` for seven
/// blocks searched within radii adding up to k + 1).
fn join_design<B: Bits>(k: u32, fps: &[B]) -> Result<JoinDesign> {
    if let Some(blocks) = std::env::var_os("NEARDUP_JOIN_BLOCKS") {
        let blocks = blocks.to_string_lossy();
        let m: u32 = blocks.trim().parse().map_err(|e| {
            anyhow!(
                "NEARDUP_JOIN_BLOCKS={blocks:?}: {e}; give a number of blocks (such as 7), \
                 or unset it to let the join plan its design"
            )
        })?;
        let design = RadiusDesign::new(B::BITS, k, m)
            .with_context(|| format!("NEARDUP_JOIN_BLOCKS={blocks:?}: no such design"))?;
        return Ok(JoinDesign::Radius(design));
    }
    let Some(levels) = std::env::var_os("NEARDUP_JOIN_LEVELS") else {
        return Ok(plan_join_for(k, fps)?);
    };
    let levels = levels.to_string_lossy();
    let levels: Vec<u32> = levels
        .split(',')
        .map(|b| b.trim().parse())
        .collect::<Result<_, _>>()
        .map_err(|e| {
            anyhow!(
                "NEARDUP_JOIN_LEVELS={levels:?}: {e}; give block counts separated by commas \
                 (such as 17 or 16,16), or unset it to let the join plan its tables"
            )
        })?;
    let design = TableDesign::new(B::BITS, k, &levels)
        .with_context(|| format!("NEARDUP_JOIN_LEVELS={levels:?}: no such design"))?;
    Ok(JoinDesign::Tables(design))
}

/// The join alone, for verification by another measure.
fn join_only<B: Bits>(values: Values, k: u32) -> Result<Dedup> {
    let fps: Vec<B> = values.into_words();
    let design = join_design(k, &fps)?;
    Ok(Dedup::from_vec(fps, k, &design)?)
}

/// The process's peak resident memory in MB (Linux: VmHWM), if known.
fn peak_memory() -> Option<f64> {
    Some(crate::gather::proc_kib("/proc/self/status", "VmHWM:")? as f64 / 1024.0)
}

/// Takes the values: already in their width, they become the join's words.
/// `verify`: the Jaccard threshold and every document's features.
fn join<B: Bits>(
    values: Values,
    k: u32,
    policy: Policy,
    verify: Option<(f64, Features)>,
    spanning: bool,
    preference: Option<&[u32]>,
    phases: &mut Phases,
) -> Result<(Dedup, Vec<u32>)> {
    let fps: Vec<B> = values.into_words();
    let design = join_design(k, &fps)?;
    phases.join = Some(design.describe());
    let dedup = match &verify {
        // Joined and verified a round of tables at a time; without --pairs,
        // the components need only a spanning set of pairs.
        Some((threshold, features)) => {
            let digest = |doc| features.digest(doc);
            let score = SpillScore {
                features: *features,
                threshold: *threshold,
            };
            let dedup = Dedup::verified(fps, k, &design, *threshold, digest, score, spanning)?;
            features.check()?;
            phases.mark("join and verify");
            dedup
        }
        None => {
            let dedup = Dedup::from_vec(fps, k, &design)?;
            phases.mark("join");
            dedup
        }
    };
    let reps = match preference {
        Some(p) => dedup.representatives_by(policy, p),
        None => dedup.representatives(policy),
    };
    phases.mark("clusters");
    Ok((dedup, reps))
}

/// The verification features of a run: the new documents' spill, after the
/// old ones' (--against), numbered on from them.
#[derive(Debug, Clone, Copy)]
struct Features<'a> {
    old: Option<&'a Spill>,
    new: &'a Spill,
    first: u32,
}

impl Features<'_> {
    fn place(&self, doc: u32) -> (&Spill, u32) {
        match self.old {
            Some(old) if doc < self.first => (old, doc),
            _ => (self.new, doc - self.first),
        }
    }

    fn digest(&self, doc: u32) -> Option<u128> {
        let (spill, d) = self.place(doc);
        spill.digest(d)
    }

    fn jaccard(&self, a: u32, b: u32, threshold: f64) -> f64 {
        let ((sa, da), (sb, db)) = (self.place(a), self.place(b));
        sa.jaccard_with(da, sb, db, threshold)
    }

    fn check(&self) -> Result<()> {
        for spill in self.old.into_iter().chain([self.new]) {
            spill
                .check()
                .context("cannot read the verification features' spill file back")?;
        }
        Ok(())
    }
}

/// Verification's score: the exact Jaccard similarity from the spills, told
/// which documents come next.
struct SpillScore<'a> {
    features: Features<'a>,
    threshold: f64,
}

impl PairScore for SpillScore<'_> {
    fn score(&self, a: u32, b: u32) -> f64 {
        self.features.jaccard(a, b, self.threshold)
    }

    fn prefetch(&self, doc: u32) {
        let (spill, d) = self.features.place(doc);
        spill.prefetch(d);
    }

    fn size(&self, doc: u32) -> Option<u32> {
        let (spill, d) = self.features.place(doc);
        Some(spill.set_len(d) as u32)
    }
}

/// Wall time per phase of a run, for the summary.
#[derive(Debug)]
struct Phases {
    last: Instant,
    done: Vec<(&'static str, f64)>,
    /// The self-join's design, described.
    join: Option<String>,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            last: Instant::now(),
            done: Vec::new(),
            join: None,
        }
    }
}

impl Phases {
    /// Ends phase `name` now (a phase started at the previous mark).
    fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.done
            .push((name, now.duration_since(self.last).as_secs_f64()));
        self.last = now;
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, secs)) in self.done.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name} {secs:.2} s")?;
        }
        Ok(())
    }
}

fn write_outputs(
    args: &Args,
    g: &Gathered,
    dedup: &Dedup,
    reps: &[u32],
    check: Option<Check>,
    first: usize,
) -> Result<()> {
    let field = check.map_or("jaccard", Check::field);
    let mut line = Vec::with_capacity(256);
    if let Some(path) = &args.pairs {
        // Heavy clusters make the listing quadratic: say so before writing.
        let count = dedup.pair_count();
        if count
            > LOTS_OF_PAIRS
                .min(100 * dedup.documents() as u64)
                .max(1_000_000)
            && !args.run.quiet
        {
            eprintln!(
                "neardup: warning: writing {count} pairs to {} (about {:.0} GB): clusters of many \
                 copies list every pair of members; --clusters lists each cluster once",
                path.display(),
                count as f64 * 60.0 / 1e9
            );
        }
        if Format::of(path, args.output_format) == Format::Parquet {
            let mut w = PairsWriter::create(path, &g.ids, check.map(Check::field))?;
            dedup.for_each_scored_pair(|a, b, d, j| {
                if (b as usize) >= first {
                    w.push(a as usize, b as usize, d, j)?;
                }
                Ok::<(), anyhow::Error>(())
            })?;
            w.finish()?;
        } else {
            let mut out = NamedOutput::create(path)?;
            dedup.for_each_scored_pair(|a, b, d, j| {
                if (b as usize) < first {
                    return Ok(()); // two old documents
                }
                line.clear();
                line.extend_from_slice(b"{\"a\":");
                g.ids.write_json(a as usize, &mut line);
                line.extend_from_slice(b",\"b\":");
                g.ids.write_json(b as usize, &mut line);
                write!(line, ",\"distance\":{d}")?;
                if let Some(j) = j {
                    write!(line, ",\"{field}\":{j:.4}")?;
                }
                line.extend_from_slice(b"}\n");
                out.write_all(&line)
            })?;
            out.finish()?;
        }
    }
    if let Some(path) = args
        .clusters
        .as_ref()
        .filter(|p| Format::of(p, args.output_format) == Format::Parquet)
    {
        let mut w = ClustersWriter::create(path, &g.ids)?;
        for (rep, members) in clusters(reps) {
            if members.last().is_some_and(|&m| (m as usize) >= first) {
                w.push(rep as usize, &members)?;
            }
        }
        w.finish()?;
    } else if let Some(path) = &args.clusters {
        let mut out = NamedOutput::create(path)?;
        for (rep, members) in clusters(reps) {
            if members.last().is_some_and(|&m| (m as usize) < first) {
                continue; // old documents only
            }
            line.clear();
            line.extend_from_slice(b"{\"representative\":");
            g.ids.write_json(rep as usize, &mut line);
            write!(line, ",\"size\":{},\"members\":[", members.len())?;
            for (j, m) in members.iter().enumerate() {
                if j > 0 {
                    line.push(b',');
                }
                g.ids.write_json(*m as usize, &mut line);
            }
            line.extend_from_slice(b"]}\n");
            out.write_all(&line)?;
        }
        out.finish()?;
    }
    if args.keep.is_none() && args.drop.is_none() && args.annotate.is_none() {
        return Ok(());
    }
    // Each document's best similarity, for --annotate.
    let best: Vec<f64> = match &args.annotate {
        None => Vec::new(),
        Some(_) => {
            let mut best = vec![f64::NAN; reps.len()];
            let bits = f64::from(g.width.bits());
            dedup.for_each_scored_pair(|a, b, d, j| {
                let s = j.unwrap_or_else(|| (std::f64::consts::PI * f64::from(d) / bits).cos());
                for x in [a as usize, b as usize] {
                    if best[x].is_nan() || s > best[x] {
                        best[x] = s;
                    }
                }
                Ok::<(), anyhow::Error>(())
            })?;
            best
        }
    };
    if g.file.is_none()
        && g.raw.is_none()
        && let Some(files) = crate::input::parquet_files(&args.source.input)?
    {
        if args.annotate.is_some() {
            bail!(
                "--annotate adds fields to JSON Lines records, and the inputs are Parquet: \
                 write --clusters (or --pairs) and join them to the rows by id"
            );
        }
        // Parquet rows, every column, into Parquet files.
        for path in [&args.keep, &args.drop].into_iter().flatten() {
            if !crate::parquet_io::is_parquet(path) {
                bail!(
                    "the inputs are Parquet, so --keep and --drop write Parquet: name \
                         the output {}.parquet",
                    path.with_extension("").display()
                );
            }
        }
        let input = &args.source.input;
        let body = match input.hint() {
            Some(InputKind::Vector) => input.vector_field(),
            _ => &input.text_field,
        };
        let n = crate::parquet_io::split_rows(
            &files,
            body,
            first,
            |doc| reps[doc] as usize == doc,
            args.keep.as_deref(),
            args.drop.as_deref(),
        )?;
        if n != reps.len() - first {
            bail!(
                "the input changed while it was being deduplicated ({} records, then {n})",
                reps.len() - first
            );
        }
        return Ok(());
    }
    let mut keep = args.keep.as_deref().map(NamedOutput::create).transpose()?;
    let mut drop = args.drop.as_deref().map(NamedOutput::create).transpose()?;
    let mut annotate = args
        .annotate
        .as_deref()
        .map(NamedOutput::create)
        .transpose()?;
    let mut annotated = Vec::with_capacity(256);
    // `doc` counts the new documents, which follow the old ones.
    let mut emit = |doc: usize, bytes: &[u8]| -> Result<()> {
        let doc = first + doc;
        let kept = reps[doc] as usize == doc;
        if let Some(out) = annotate.as_mut() {
            annotated.clear();
            annotate_record(bytes, doc, reps, &g.ids, best[doc], &mut annotated)?;
            out.write_all(&annotated)?;
        }
        let target = if kept { keep.as_mut() } else { drop.as_mut() };
        if let Some(out) = target {
            out.write_all(bytes)?;
            if !bytes.ends_with(b"\n") {
                out.write_all(b"\n")?;
            }
        }
        Ok(())
    };
    if let Some((lines, bytes)) = g.file.as_ref().and_then(|f| f.records.as_ref()) {
        for (doc, &(s, e)) in lines.iter().enumerate() {
            emit(doc, &bytes[s..e])?;
        }
    } else if let Some(raw) = &g.raw {
        for (doc, bytes) in raw.iter().enumerate() {
            emit(doc, bytes)?;
        }
    } else {
        // Read the inputs again: the same records in the same order.
        let mut input = args.source.input.clone();
        if let Some(config) = &g.config {
            input.read_as(config);
        }
        let mut doc = 0usize;
        let plain = match input.skip_invalid || args.annotate.is_some() {
            false => crate::line_copy::plain_line_files(&input)?,
            true => None,
        };
        if let Some(files) = plain {
            // Every record was parsed and checked by the first read: the
            // files are split in blocks, records unparsed.
            doc = crate::line_copy::split_records(
                &files,
                |d| reps[first + d] as usize == first + d,
                keep.as_mut(),
                drop.as_mut(),
            )?;
        } else {
            let mut reader = DocReader::new(&input)?;
            if !input.skip_invalid && reader.text_records_only() {
                // Every record was parsed and checked by the first read: only
                // blank lines are not documents, and the bytes go out unparsed.
                while let Some(batch) = reader.next_batch()? {
                    for bytes in batch.into_iter().filter_map(Record::into_document_bytes) {
                        emit(doc, &bytes)?;
                        doc += 1;
                    }
                }
            } else {
                for_each_batch(
                    &input,
                    true,
                    true,
                    |_| (),
                    |docs, _| {
                        for d in docs {
                            emit(doc, d.raw.as_deref().unwrap_or_default())?;
                            doc += 1;
                        }
                        Ok(())
                    },
                )?;
            }
        }
        if doc != reps.len() - first {
            bail!(
                "the input changed while it was being deduplicated ({} records, then {doc})",
                reps.len() - first
            );
        }
    }
    if let Some(o) = keep {
        o.finish()?;
    }
    if let Some(o) = drop {
        o.finish()?;
    }
    if let Some(o) = annotate {
        o.finish()?;
    }
    Ok(())
}

/// `record` (a JSON object) with document `doc`'s annotations added, and a
/// newline, into `out` (core's `record::annotate`, which the Spark job uses too).
fn annotate_record(
    record: &[u8],
    doc: usize,
    reps: &[u32],
    ids: &IdList,
    best: f64,
    out: &mut Vec<u8>,
) -> Result<()> {
    let rep = reps[doc] as usize;
    let mut cluster = Vec::with_capacity(16);
    ids.write_json(rep, &mut cluster);
    let duplicate_of = (rep != doc).then_some(cluster.as_slice());
    neardup_core::record::annotate(
        record,
        &cluster,
        duplicate_of,
        Some(best),
        &ids.get(doc),
        out,
    )
    .map_err(|e| anyhow!(e))
}
