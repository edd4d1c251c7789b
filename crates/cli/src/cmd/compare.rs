//! `neardup compare A B`: distance, estimated similarity, verdict, explanation.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use neardup_core::{Feature, Fingerprint, SimHasher};
use serde_json::json;

use crate::pipeline_args::PipelineArgs;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Exit status: 0 if A and B are near-duplicates (distance <= k), 1 if not, 2 on error.

Examples:
  neardup compare a.txt b.txt --explain
  neardup compare --text \"the cat sat on the mat\" \"the cat sat on a mat\"
  neardup compare --simhash 3b8c0a4f9d2e6b71 3b8c0a4f9d2e6b70"
)]
pub struct Args {
    /// First document: a file (`-` for standard input), or text with --text, or a
    /// hex fingerprint with --simhash.
    pub a: String,
    /// Second document, likewise.
    pub b: String,

    /// A and B are the texts themselves, not file names.
    #[arg(long, conflicts_with = "simhash")]
    pub text: bool,

    /// A and B are hex fingerprints.
    #[arg(long)]
    pub simhash: bool,

    /// Near-duplicate threshold: Hamming distance at most K.
    #[arg(short, long, default_value_t = 3)]
    pub k: u32,

    /// Also list the features that pulled the differing bits most.
    #[arg(long, conflicts_with = "simhash")]
    pub explain: bool,

    /// How many features --explain lists.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub explain_top: usize,

    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,

    /// Replace invalid UTF-8 instead of failing.
    #[arg(long)]
    pub lossy: bool,

    #[command(flatten)]
    pub pipeline: PipelineArgs,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let (fa, fb, explained) = if args.simhash {
        let a = Fingerprint::parse_hex(&args.a).context("first fingerprint")?;
        let b = Fingerprint::parse_hex(&args.b).context("second fingerprint")?;
        if a.width() != b.width() {
            bail!(
                "the fingerprints have different widths ({} and {} bits): compare fingerprints \
                 made with the same --bits",
                a.width(),
                b.width()
            );
        }
        (a, b, None)
    } else {
        let hasher = args.pipeline.hasher()?;
        let ta = load(&args.a, args.text, args.lossy)?;
        let tb = load(&args.b, args.text, args.lossy)?;
        let (fa, fb) = (hasher.fingerprint(&ta), hasher.fingerprint(&tb));
        let explained = args
            .explain
            .then(|| explain(&hasher, &ta, &tb, fa, fb, args.explain_top));
        (fa, fb, explained)
    };
    let mut out = std::io::stdout().lock();
    let distance = fa.distance(fb)?;
    let similarity = fa.similarity(fb)?;
    let near = distance <= args.k;
    let bits = fa.width().bits();
    if args.json {
        let mut v = json!({
            "a": fa.to_string(), "b": fb.to_string(), "bits": bits,
            "distance": distance, "similarity": similarity, "k": args.k, "near_duplicate": near,
        });
        if let Some(rows) = &explained {
            v["explain"] = rows
                .iter()
                .map(|r| json!({"feature": r.feature, "weight_a": r.weight_a, "weight_b": r.weight_b, "pull": r.pull}))
                .collect();
        }
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "a           {fa}")?;
        writeln!(out, "b           {fb}")?;
        writeln!(out, "distance    {distance} of {bits} bits")?;
        writeln!(
            out,
            "similarity  {similarity:.4} (estimated cosine, cos(pi*{distance}/{bits}))"
        )?;
        writeln!(
            out,
            "verdict     {} (k = {})",
            if near { "near-duplicates" } else { "different" },
            args.k
        )?;
        if let Some(rows) = &explained {
            writeln!(out)?;
            if rows.is_empty() {
                writeln!(
                    out,
                    "no feature pulls the differing bits (the documents have the same features)"
                )?;
            } else {
                writeln!(
                    out,
                    "features that pulled the {distance} differing bits most:"
                )?;
                writeln!(
                    out,
                    "{:>9} {:>9} {:>9}  feature",
                    "pull", "weight A", "weight B"
                )?;
                for r in rows {
                    writeln!(
                        out,
                        "{:>9.2} {:>9.2} {:>9.2}  {}",
                        r.pull, r.weight_a, r.weight_b, r.feature
                    )?;
                }
            }
        }
    }
    Ok(if near {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn load(arg: &str, literal: bool, lossy: bool) -> Result<String> {
    if literal {
        return Ok(arg.to_owned());
    }
    let bytes = if arg == "-" {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)?;
        v
    } else {
        std::fs::read(Path::new(arg)).with_context(|| {
            format!("cannot read {arg} (to compare texts given on the command line, pass --text)")
        })?
    };
    match String::from_utf8(bytes) {
        Ok(s) => Ok(s),
        Err(e) if lossy => Ok(String::from_utf8_lossy(e.as_bytes()).into_owned()),
        Err(e) => bail!(
            "{arg}: invalid UTF-8 at byte offset {}; fix the encoding or pass --lossy",
            e.utf8_error().valid_up_to()
        ),
    }
}

/// A feature's part in the difference between two fingerprints.
pub struct Pull {
    pub feature: String,
    pub weight_a: f64,
    pub weight_b: f64,
    /// How much the feature's weight difference pushed the differing bits the
    /// way they went: sum over differing bits of (wA - wB) * (±1 from its hash) *
    /// (±1 from the direction A - B).
    pub pull: f64,
}

/// The features whose weight differences pulled the differing bits most.
pub fn explain(
    h: &SimHasher,
    a: &str,
    b: &str,
    fa: Fingerprint,
    fb: Fingerprint,
    top: usize,
) -> Vec<Pull> {
    let diff = fa.value() ^ fb.value();
    let mut weights: HashMap<String, (u128, f64, f64)> = HashMap::new();
    for (side, Feature { text, hash, weight }) in h
        .features(a)
        .into_iter()
        .map(|f| (0, f))
        .chain(h.features(b).into_iter().map(|f| (1, f)))
    {
        let e = weights.entry(text).or_insert((hash, 0.0, 0.0));
        if side == 0 {
            e.1 += weight
        } else {
            e.2 += weight
        }
    }
    let mut rows: Vec<Pull> = weights
        .into_iter()
        .filter_map(|(feature, (hash, wa, wb))| {
            let delta = wa - wb;
            if delta == 0.0 {
                return None;
            }
            let mut pull = 0.0;
            for i in 0..fa.width().bits() {
                if (diff >> i) & 1 == 0 {
                    continue;
                }
                let sign = if (hash >> i) & 1 == 1 { 1.0 } else { -1.0 };
                let direction = if fa.bit(i) { 1.0 } else { -1.0 };
                pull += delta * sign * direction;
            }
            (pull > 0.0).then_some(Pull {
                feature,
                weight_a: wa,
                weight_b: wb,
                pull,
            })
        })
        .collect();
    rows.sort_by(|x, y| {
        y.pull
            .total_cmp(&x.pull)
            .then_with(|| x.feature.cmp(&y.feature))
    });
    rows.truncate(top);
    rows
}
