//! `neardup eval`: precision, recall and F1 of found pairs against ground truth,
//! overall, per edit type and per similarity band.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::Value;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "PAIRS: JSON Lines with \"a\" and \"b\" (as `neardup dedup --pairs` writes); \
other fields are ignored. TRUTH: JSON Lines with \"a\", \"b\" and either \"jaccard\" (a \
duplicate when at least --threshold) or \"duplicate\" (true or false), and optionally \"edit\" \
(how the pair was made). Pairs are unordered. A found pair that is not in TRUTH is a false \
positive, so TRUTH must list every duplicate pair (as `neardup truth` does).

Examples:
  neardup dedup corpus.jsonl --pairs found.jsonl
  neardup eval --found found.jsonl --truth truth.jsonl
  neardup eval --found found.jsonl --truth my-labels.jsonl --json"
)]
pub struct Args {
    /// Pairs found, e.g. by `neardup dedup --pairs`.
    #[arg(long, value_name = "PAIRS")]
    pub found: PathBuf,

    /// Ground truth pairs, e.g. from `neardup truth`.
    #[arg(long, value_name = "TRUTH")]
    pub truth: PathBuf,

    /// A truth pair with "jaccard" at least this is a duplicate.
    #[arg(long, default_value_t = 0.8)]
    pub threshold: f64,

    /// Print the figures as one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

type Key = (String, String);

struct Truth {
    positive: bool,
    jaccard: Option<f64>,
    edit: Option<String>,
}

fn key(a: &Value, b: &Value) -> Key {
    let (a, b) = (a.to_string(), b.to_string());
    if a <= b { (a, b) } else { (b, a) }
}

/// Reads a pair file: (a, b) and the rest of each line.
fn read_pairs(
    path: &Path,
    what: &str,
    mut f: impl FnMut(Key, &serde_json::Map<String, Value>, &dyn Fn() -> String) -> Result<()>,
) -> Result<()> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot open the {what} file {}", path.display()))?;
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let place = || format!("{}:{}", path.display(), n + 1);
        let line = line.with_context(|| format!("cannot read {}", place()))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line)
            .with_context(|| format!("{}: not JSON: each line must be a JSON object", place()))?;
        let Some(obj) = v.as_object() else {
            bail!("{}: not a JSON object", place());
        };
        let (Some(a), Some(b)) = (obj.get("a"), obj.get("b")) else {
            bail!("{}: a pair needs \"a\" and \"b\" (document ids)", place());
        };
        f(key(a, b), obj, &place)?;
    }
    Ok(())
}

#[derive(Serialize, Default)]
struct Counts {
    tp: u64,
    fp: u64,
    #[serde(rename = "fn")]
    fn_: u64,
    precision: f64,
    recall: f64,
    f1: f64,
}

impl Counts {
    fn finish(mut self) -> Self {
        let found = self.tp + self.fp;
        let truth = self.tp + self.fn_;
        self.precision = if found == 0 {
            1.0
        } else {
            self.tp as f64 / found as f64
        };
        self.recall = if truth == 0 {
            1.0
        } else {
            self.tp as f64 / truth as f64
        };
        let (p, r) = (self.precision, self.recall);
        self.f1 = if p + r == 0.0 {
            0.0
        } else {
            2.0 * p * r / (p + r)
        };
        self
    }
}

#[derive(Serialize, Default)]
struct EditRow {
    positives: u64,
    found_positives: u64,
    recall: f64,
    negatives: u64,
    false_positives: u64,
}

#[derive(Serialize)]
struct BandRow {
    band: String,
    duplicates: bool,
    pairs: u64,
    found: u64,
}

#[derive(Serialize)]
struct Report {
    threshold: f64,
    true_pairs: u64,
    found: u64,
    #[serde(flatten)]
    overall: Counts,
    by_edit: BTreeMap<String, EditRow>,
    by_band: Vec<BandRow>,
}

const BANDS: [(f64, f64); 6] = [
    (0.95, 1.0),
    (0.9, 0.95),
    (0.8, 0.9),
    (0.7, 0.8),
    (0.5, 0.7),
    (0.0, 0.5),
];

pub fn run(args: Args) -> Result<ExitCode> {
    if !(0.0..=1.0).contains(&args.threshold) {
        bail!(
            "--threshold {} is out of range: use a similarity in [0, 1]",
            args.threshold
        );
    }
    let mut truth: HashMap<Key, Truth> = HashMap::new();
    read_pairs(&args.truth, "truth", |k, obj, place| {
        let jaccard = obj.get("jaccard").and_then(Value::as_f64);
        let positive = match (obj.get("duplicate").and_then(Value::as_bool), jaccard) {
            (Some(d), _) => d,
            (None, Some(j)) => j >= args.threshold,
            (None, None) => bail!(
                "{}: a truth pair needs \"jaccard\" (a number) or \"duplicate\" (true or false)",
                place()
            ),
        };
        let edit = obj.get("edit").and_then(Value::as_str).map(str::to_owned);
        truth.insert(
            k,
            Truth {
                positive,
                jaccard,
                edit,
            },
        );
        Ok(())
    })?;
    let mut found: HashSet<Key> = HashSet::new();
    read_pairs(&args.found, "found pairs", |k, _, _| {
        found.insert(k);
        Ok(())
    })?;
    let report = evaluate(&truth, &found, args.threshold);
    if args.json {
        let mut json = serde_json::to_string_pretty(&report)?;
        json.push('\n');
        std::io::stdout().write_all(json.as_bytes())?;
    } else {
        std::io::stdout().write_all(format_report(&report).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn evaluate(truth: &HashMap<Key, Truth>, found: &HashSet<Key>, threshold: f64) -> Report {
    let mut overall = Counts::default();
    let mut by_edit: BTreeMap<String, EditRow> = BTreeMap::new();
    let mut bands: Vec<BandRow> = BANDS
        .iter()
        .map(|&(lo, hi)| BandRow {
            band: if hi >= 1.0 {
                format!("[{lo}, {hi}]")
            } else {
                format!("[{lo}, {hi})")
            },
            duplicates: lo >= threshold,
            pairs: 0,
            found: 0,
        })
        .collect();
    let band_of = |j: f64| {
        BANDS
            .iter()
            .position(|&(lo, hi)| j >= lo && (j < hi || hi >= 1.0))
            .unwrap_or(BANDS.len() - 1)
    };
    for (k, t) in truth {
        let hit = found.contains(k);
        match (t.positive, hit) {
            (true, true) => overall.tp += 1,
            (true, false) => overall.fn_ += 1,
            (false, true) => overall.fp += 1,
            (false, false) => {}
        }
        let edit = by_edit
            .entry(t.edit.clone().unwrap_or_else(|| "unlabelled".into()))
            .or_default();
        if t.positive {
            edit.positives += 1;
            edit.found_positives += u64::from(hit);
        } else {
            edit.negatives += 1;
            edit.false_positives += u64::from(hit);
        }
        if let Some(j) = t.jaccard {
            let b = &mut bands[band_of(j)];
            b.pairs += 1;
            b.found += u64::from(hit);
        }
    }
    let outside = found.iter().filter(|k| !truth.contains_key(*k)).count() as u64;
    overall.fp += outside;
    let last = bands.last_mut().expect("bands");
    last.band = format!("below {} or not in truth", BANDS[BANDS.len() - 2].0);
    last.found += outside;
    for row in by_edit.values_mut() {
        row.recall = if row.positives == 0 {
            1.0
        } else {
            row.found_positives as f64 / row.positives as f64
        };
    }
    let has_bands = truth.values().any(|t| t.jaccard.is_some());
    Report {
        threshold,
        true_pairs: overall.tp + overall.fn_,
        found: found.len() as u64,
        overall: overall.finish(),
        by_edit,
        by_band: if has_bands { bands } else { Vec::new() },
    }
}

/// The report as tables.
fn format_report(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let o = &r.overall;
    writeln!(
        s,
        "{} duplicate pairs in the truth (threshold {}), {} pairs found",
        r.true_pairs, r.threshold, r.found
    )
    .expect("writing to a String");
    writeln!(
        s,
        "precision {:.4}  recall {:.4}  F1 {:.4}  (true positives {}, false positives {}, false negatives {})",
        o.precision, o.recall, o.f1, o.tp, o.fp, o.fn_
    ).expect("writing to a String");
    s.push('\n');
    writeln!(
        s,
        "{:<22} {:>9} {:>7} {:>7} {:>9} {:>9}",
        "edit", "positive", "found", "recall", "negative", "found (FP)"
    )
    .expect("writing to a String");
    for (edit, row) in &r.by_edit {
        writeln!(
            s,
            "{:<22} {:>9} {:>7} {:>7.4} {:>9} {:>9}",
            edit,
            row.positives,
            row.found_positives,
            row.recall,
            row.negatives,
            row.false_positives
        )
        .expect("writing to a String");
    }
    if !r.by_band.is_empty() {
        s.push('\n');
        writeln!(
            s,
            "{:<28} {:>10} {:>8} {:>8}",
            "true Jaccard", "duplicate", "pairs", "found"
        )
        .expect("writing to a String");
        for b in &r.by_band {
            let pairs = if b.band.starts_with("below") {
                "-".to_string()
            } else {
                b.pairs.to_string()
            };
            writeln!(
                s,
                "{:<28} {:>10} {:>8} {:>8}",
                b.band,
                if b.duplicates { "yes" } else { "no" },
                pairs,
                b.found
            )
            .expect("writing to a String");
        }
    }
    s
}
