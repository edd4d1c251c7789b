//! The Spark job's per-batch work (python/neardup/spark.py): whole Arrow
//! batches of records in, columns out, so that no Python code runs per row.

use std::borrow::Cow;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rayon::prelude::*;

use neardup_core::centre::BitShares;
use neardup_core::dedup::{Policy, for_each_pair_streamed, representatives_of_pairs};
use neardup_core::index::{Bits, plan_join_for};
use neardup_core::jaccard::{SetFeature, jaccard_at_least};
use neardup_core::keep_by::{KeepBy, SortKey};
use neardup_core::record;
use neardup_core::spill::Summary;
use neardup_core::{Fingerprint, IdfTable, SimHasher, Weights, Width, with_bits};

use crate::fingerprint::arrow_spans;
use crate::{PyConfig, bytemuck_bytes, err, features_of, parse_policy, u64s};

/// Bytes of a document's verification summary: its feature count (u32), the
/// set's digest (u128) and its MinHash sketch, little-endian.
pub(crate) const SUMMARY_BYTES: usize = 4 + 16 + neardup_core::spill::SKETCH_BYTES;

fn summary_bytes(set: &[SetFeature], out: &mut Vec<u8>) {
    let s = Summary::of(set);
    out.extend_from_slice(&(set.len().min(u32::MAX as usize) as u32).to_le_bytes());
    out.extend_from_slice(&s.digest.to_le_bytes());
    out.extend_from_slice(&s.sketch.0);
}

struct SummaryRef<'a>(&'a [u8]);

impl SummaryRef<'_> {
    fn len(&self) -> u32 {
        u32::from_le_bytes(self.0[..4].try_into().expect("4 bytes"))
    }
    fn digest(&self) -> &[u8] {
        &self.0[4..20]
    }
    fn sketch(&self) -> neardup_core::spill::Sketch {
        neardup_core::spill::Sketch(self.0[20..SUMMARY_BYTES].try_into().expect("a sketch"))
    }
}

/// What the summaries of a candidate pair say: `Some(score)` when they decide
/// it (a score below `threshold` drops it), `None` when only the features can.
/// The same decisions as `neardup dedup`'s verification (`Spill::jaccard_with`
/// and the collapsing of documents with one digest).
fn screen(a: SummaryRef<'_>, b: SummaryRef<'_>, threshold: f64) -> Option<f64> {
    if a.len() > 0 && a.digest() == b.digest() {
        return Some(1.0);
    }
    neardup_core::spill::screen(a.len(), &a.sketch(), b.len(), &b.sketch(), threshold)
}

/// The summaries that screen one join's candidate pairs, and the threshold.
#[derive(Clone, Copy)]
pub(crate) struct Screen<'a> {
    summaries: &'a [u8],
    threshold: f64,
}

/// What becomes of a candidate pair.
pub(crate) enum Decision {
    /// Kept with this score (-1 without verification).
    Kept(f64),
    /// Below the threshold.
    Dropped,
    /// Only the features can decide.
    Undecided,
}

impl<'a> Screen<'a> {
    /// The screen of `caller`'s arguments for `n` documents: both summaries
    /// and a threshold, or neither.
    pub(crate) fn of(
        caller: &str,
        n: usize,
        summaries: Option<&'a [u8]>,
        threshold: Option<f64>,
    ) -> PyResult<Option<Screen<'a>>> {
        if let Some(s) = summaries
            && s.len() != n * SUMMARY_BYTES
        {
            return Err(err(format!(
                "{caller}: one summary per fingerprint is needed"
            )));
        }
        match (summaries, threshold) {
            (Some(summaries), Some(threshold)) => Ok(Some(Screen {
                summaries,
                threshold,
            })),
            (None, None) => Ok(None),
            _ => Err(err(format!(
                "{caller}: give both summaries and a threshold, or neither"
            ))),
        }
    }

    /// Document `x`'s feature count and digest: equal for documents with
    /// one feature set.
    pub(crate) fn identity(&self, x: u32) -> &'a [u8] {
        &self.summary(x).0[..20]
    }

    /// The similarity a pair must reach.
    pub(crate) fn threshold(&self) -> f64 {
        self.threshold
    }

    fn summary(&self, x: u32) -> SummaryRef<'a> {
        let at = x as usize * SUMMARY_BYTES;
        SummaryRef(&self.summaries[at..at + SUMMARY_BYTES])
    }

    /// The decision on documents `a` and `b`; every pair is kept without a
    /// screen.
    pub(crate) fn decide(screen_by: Option<Self>, a: u32, b: u32) -> Decision {
        let Some(s) = screen_by else {
            return Decision::Kept(-1.0);
        };
        Decision::of(screen(s.summary(a), s.summary(b), s.threshold), s.threshold)
    }
}

impl Decision {
    /// What a screen's answer (`screen`) means against `threshold`.
    pub(crate) fn of(score: Option<f64>, threshold: f64) -> Decision {
        match score {
            Some(j) if j >= threshold => Decision::Kept(j),
            Some(_) => Decision::Dropped,
            None => Decision::Undecided,
        }
    }
}

/// Candidate pairs by their decision: the kept (a, b, distance) rows and
/// their scores, and the undecided rows (dropped ones are not kept).
#[derive(Default)]
pub(crate) struct Triage {
    kept: Vec<i64>,
    scores: Vec<f64>,
    undecided: Vec<i64>,
}

/// A [`Triage`] as Python bytes: kept rows, scores, undecided rows.
pub(crate) type TriageBytes<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);

impl Triage {
    pub(crate) fn push(&mut self, row: [i64; 3], decision: Decision) {
        match decision {
            Decision::Kept(j) => {
                self.kept.extend(row);
                self.scores.push(j);
            }
            Decision::Dropped => {}
            Decision::Undecided => self.undecided.extend(row),
        }
    }

    /// The rows and scores as little-endian bytes (i64 rows, f64 scores).
    pub(crate) fn into_py(self, py: Python<'_>) -> TriageBytes<'_> {
        (
            PyBytes::new(py, bytemuck::cast_slice(&self.kept)),
            PyBytes::new(py, bytemuck::cast_slice(&self.scores)),
            PyBytes::new(py, bytemuck::cast_slice(&self.undecided)),
        )
    }
}

/// The decision on two documents' summaries (SUMMARY_BYTES each), as
/// [`Screen::decide`] makes it for documents of one array.
pub(crate) fn decide_summaries(a: &[u8], b: &[u8], threshold: f64) -> Decision {
    Decision::of(screen(SummaryRef(a), SummaryRef(b), threshold), threshold)
}

/// Calls `f(a, b, distance)` for each candidate pair of fingerprint words
/// `words` (two u64 per document, high then low) of width `bits`, as
/// `neardup dedup` finds them.
fn each_candidate(
    words: &[u64],
    bits: u32,
    k: u32,
    f: impl FnMut(u32, u32, u32),
) -> Result<(), neardup_core::Error> {
    fn run<B: Bits>(
        fps: Vec<B>,
        k: u32,
        f: impl FnMut(u32, u32, u32),
    ) -> Result<(), neardup_core::Error> {
        let design = plan_join_for(k, &fps)?;
        for_each_pair_streamed(fps, k, &design, f)
    }
    // Two words per document, high then low (high 0 at 64 bits).
    let fps = words
        .chunks_exact(2)
        .map(|w| (u128::from(w[0]) << 64) | u128::from(w[1]));
    with_bits!(Width::from_bits(bits)?, B => run::<B>(fps.map(B::from_u128).collect(), k, f))
}

/// A document's body: a text, or weighted features (`--features-field`).
enum Doc<'a> {
    Text(Cow<'a, str>),
    Features(Vec<(String, f64)>),
}

/// A JSON Lines record's body, id (as JSON text) and keep-by key.
struct Record<'a> {
    body: Doc<'a>,
    id: String,
    key: SortKey,
}

/// One JSON Lines record, parsed by core's record parser (the one
/// `neardup dedup` reads with); `Ok(None)` for a blank line (skipped, as
/// `neardup dedup` skips it).
fn parse_line<'a>(
    line: &'a str,
    fields: record::Fields<'_>,
    keep_by: Option<&KeepBy>,
) -> Result<Option<Record<'a>>, String> {
    let Some(r) = record::parse_record(line, fields)? else {
        return Ok(None);
    };
    let id = r.id.ok_or_else(|| {
        format!(
            "no {:?} field (the Spark job needs an id in every record: choose it with --id-field)",
            fields.id
        )
    })?;
    let body = match r.body {
        record::Body::Text(text) => Doc::Text(text),
        record::Body::Features(f) => Doc::Features(f),
        record::Body::Vector(_) => unreachable!("the Spark job reads texts or features here"),
    };
    let key = match (keep_by, &body) {
        (Some(KeepBy::Longest), Doc::Text(text)) => SortKey::Num(text.len() as f64),
        _ => r.key,
    };
    Ok(Some(Record {
        body,
        id: id.to_json(),
        key,
    }))
}

/// Weighted features given as a JSON object of feature -> weight (a column
/// of the Spark job's DataFrame, as JSON text), read as the command line reads
/// a record's `--features-field`: by name, a repeated name once.
fn parse_features(text: &str) -> Result<Vec<(String, f64)>, String> {
    serde_json::from_str::<std::collections::BTreeMap<String, f64>>(text)
        .map(|m| m.into_iter().collect())
        .map_err(|e| format!("the features are not a JSON object of feature -> weight: {e}"))
}

/// What one row gives: its fingerprint, id, key, and verification data.
struct Row {
    fp: Fingerprint,
    id: String,
    key: SortKey,
    set: Option<Vec<SetFeature>>,
    shares: Option<BitShares>,
}

/// Fingerprints (and ids, keep-by keys, verification summaries or feature
/// sets) of a batch of rows of an Arrow string column: JSON Lines records
/// (`json`) or bare texts (ids and keys then come from other columns).
///
/// Returns a dict: `rows` (u32 indices of the documents, blank lines left
/// out), `fp` (two u64 per document: high and low words; high 0 at 64 bits),
/// `ids` (JSON text of each id, JSON Lines only), `key_kind`/`key_num`/
/// `key_str` (with `keep_by`), `summaries` (SUMMARY_BYTES each), `features`
/// (a list of bytes, the sorted verification features as little-endian
/// u32; with `packed`, one bytes of them all and `feature_ends`, the end of
/// each document's in it as u64), `errors` ((row, message) of invalid records; the caller fails or
/// skips them). With `fingerprints=False` (the exact check, which needs the
/// features only) `fp` is all zeros and no fingerprint is made (its tokens
/// are not cut). With
/// `shares=True`, fingerprints to be centred on the corpus: `shares` holds
/// where each document's bits lean (one byte per bit, as `bit_shares`) and
/// `fp` is all zeros.
#[pyfunction]
#[pyo3(signature = (config, offsets, data, offset, length, large, validity, json, text_field, id_field, keep_by=None, summaries=false, features=false, fingerprints=true, shares=false, weighted=false, packed=false))]
#[allow(clippy::too_many_arguments)]
pub fn spark_rows<'py>(
    py: Python<'py>,
    config: &PyConfig,
    offsets: &[u8],
    data: &[u8],
    offset: usize,
    length: usize,
    large: bool,
    validity: Option<&[u8]>,
    json: bool,
    text_field: &str,
    id_field: &str,
    keep_by: Option<&str>,
    summaries: bool,
    features: bool,
    fingerprints: bool,
    shares: bool,
    weighted: bool,
    packed: bool,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    if weighted && (summaries || features || shares || !fingerprints) {
        return Err(err(
            "spark_rows: weighted features are fingerprinted only (no verification, no centring)",
        ));
    }
    let keep_by: Option<KeepBy> = keep_by
        .map(|k| k.parse::<KeepBy>())
        .transpose()
        .map_err(err)?
        .filter(|k| *k != KeepBy::First);
    let fields = record::Fields {
        body: text_field,
        kind: match weighted {
            true => neardup_core::InputKind::Features,
            false => neardup_core::InputKind::Text,
        },
        id: id_field,
        key: keep_by.as_ref().and_then(KeepBy::field),
    };
    let spans = arrow_spans(offsets, data.len(), offset, length, large, validity)?;
    let hasher: &SimHasher = &config.hasher;
    let results: Vec<Result<Option<Row>, String>> = py.detach(|| {
        spans
            .par_iter()
            .with_min_len(32)
            .map(|span| {
                let Some((s, e)) = *span else {
                    return Err(if json {
                        "the line is null".to_owned()
                    } else {
                        "the text is null".to_owned()
                    });
                };
                let line = simdutf8::compat::from_utf8(&data[s..e]).map_err(|e| {
                    format!("invalid UTF-8 at byte {} of the record", e.valid_up_to())
                })?;
                let rec = if json {
                    match parse_line(line, fields, keep_by.as_ref())? {
                        Some(r) => r,
                        None => return Ok(None),
                    }
                } else {
                    Record {
                        body: match weighted {
                            true => Doc::Features(parse_features(line)?),
                            false => Doc::Text(Cow::Borrowed(line)),
                        },
                        id: String::new(),
                        key: match &keep_by {
                            Some(KeepBy::Longest) => SortKey::Num(line.len() as f64),
                            _ => SortKey::Missing,
                        },
                    }
                };
                let text = match &rec.body {
                    Doc::Text(text) => text,
                    Doc::Features(f) => {
                        let fp = hasher
                            .fingerprint_input(neardup_core::Input::Features(f))
                            .map_err(|e| e.to_string())?;
                        return Ok(Some(Row {
                            fp,
                            id: rec.id,
                            key: rec.key,
                            set: None,
                            shares: None,
                        }));
                    }
                };
                // The verification features from the fingerprint's own pass
                // where they share words (one key for every row of the job).
                let sets = summaries || features;
                let mut leaning = None;
                let (fp, set) = match (fingerprints, sets) {
                    (true, _) if shares => {
                        let mut set = Vec::new();
                        leaning = Some(match sets {
                            true => hasher.shares_and_set(text, &mut set),
                            false => hasher.shares(text),
                        });
                        (hasher.fingerprint(""), sets.then_some(set))
                    }
                    (true, true) => {
                        let mut set = Vec::new();
                        let fp = hasher.fingerprint_and_set(text, &mut set);
                        (fp, Some(set))
                    }
                    (true, false) => (hasher.fingerprint(text), None),
                    (false, _) => {
                        let mut set = Vec::new();
                        if sets {
                            hasher.verification_set(text, &mut set);
                        }
                        (hasher.fingerprint(""), sets.then_some(set))
                    }
                };
                Ok(Some(Row {
                    fp,
                    id: rec.id,
                    key: rec.key,
                    set,
                    shares: leaning,
                }))
            })
            .collect()
    });
    let out = pyo3::types::PyDict::new(py);
    let mut rows: Vec<u32> = Vec::new();
    let mut fps: Vec<u64> = Vec::new();
    let mut ids: Vec<String> = Vec::new();
    let (mut kinds, mut nums, mut strs): (Vec<u8>, Vec<f64>, Vec<Option<String>>) =
        Default::default();
    let mut sums: Vec<u8> = Vec::new();
    let mut leanings: Vec<u8> = Vec::new();
    let mut sets: Vec<Bound<'py, PyBytes>> = Vec::new();
    let (mut all_sets, mut set_ends): (Vec<u8>, Vec<u64>) = Default::default();
    let mut errors: Vec<(usize, String)> = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Err(msg) => errors.push((i, msg)),
            Ok(None) => {}
            Ok(Some(row)) => {
                rows.push(i as u32);
                let v = row.fp.value();
                fps.extend([(v >> 64) as u64, v as u64]);
                if let Some(s) = &row.shares {
                    leanings.extend_from_slice(s.as_bytes());
                }
                if json {
                    ids.push(row.id);
                }
                if keep_by.is_some() {
                    let (k, n, s) = match row.key {
                        SortKey::Num(x) => (0, x, None),
                        SortKey::Str(s) => (1, 0.0, Some(s.into())),
                        SortKey::Missing => (2, 0.0, None),
                    };
                    kinds.push(k);
                    nums.push(n);
                    strs.push(s);
                }
                if let Some(set) = &row.set {
                    if summaries {
                        summary_bytes(set, &mut sums);
                    }
                    if features && packed {
                        all_sets.extend_from_slice(bytemuck::cast_slice(set));
                        set_ends.push(all_sets.len() as u64);
                    } else if features {
                        sets.push(PyBytes::new(py, bytemuck::cast_slice(set)));
                    }
                }
            }
        }
    }
    out.set_item("rows", PyBytes::new(py, bytemuck::cast_slice(&rows)))?;
    out.set_item("fp", PyBytes::new(py, bytemuck_bytes(&fps)))?;
    if json {
        out.set_item("ids", ids)?;
    }
    if keep_by.is_some() {
        out.set_item("key_kind", PyBytes::new(py, &kinds))?;
        out.set_item("key_num", PyBytes::new(py, bytemuck::cast_slice(&nums)))?;
        out.set_item("key_str", strs)?;
    }
    if summaries {
        out.set_item("summaries", PyBytes::new(py, &sums))?;
    }
    if shares {
        out.set_item("shares", PyBytes::new(py, &leanings))?;
    }
    if features && packed {
        out.set_item("features", PyBytes::new(py, &all_sets))?;
        out.set_item("feature_ends", PyBytes::new(py, bytemuck_bytes(&set_ends)))?;
    } else if features {
        out.set_item("features", sets)?;
    }
    out.set_item("errors", errors)?;
    Ok(out)
}

/// The records of a batch (an Arrow string column of JSON Lines records, as
/// read) with the fields `neardup dedup --annotate` adds, by core's
/// `record::annotate`, as the command line adds them: per row, the id of its
/// cluster's representative and the id it is a duplicate of (JSON text;
/// `None`: its own id, and kept) and its best similarity (`similarity`: f64
/// little-endian, NaN for none). Each record's own id is read with core's
/// record parser (the body in `text_field`, weighted features when
/// `weighted`). Returns the annotated records' bytes and their i32 offsets
/// (each record ending in a newline when `newline`), and the first invalid
/// row with its message, if any.
#[pyfunction]
#[pyo3(signature = (offsets, data, offset, length, large, validity, text_field, id_field, weighted, clusters, duplicates, similarity, newline=true))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn spark_annotate<'py>(
    py: Python<'py>,
    offsets: &[u8],
    data: &[u8],
    offset: usize,
    length: usize,
    large: bool,
    validity: Option<&[u8]>,
    text_field: &str,
    id_field: &str,
    weighted: bool,
    clusters: Vec<Option<String>>,
    duplicates: Vec<Option<String>>,
    similarity: &[u8],
    newline: bool,
) -> PyResult<(
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Option<(usize, String)>,
)> {
    let spans = arrow_spans(offsets, data.len(), offset, length, large, validity)?;
    let sims: Vec<f64> = similarity
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    if clusters.len() != spans.len() || duplicates.len() != spans.len() || sims.len() != spans.len()
    {
        return Err(err(
            "spark_annotate: one cluster, duplicate and similarity per row",
        ));
    }
    let fields = record::Fields {
        body: text_field,
        kind: match weighted {
            true => neardup_core::InputKind::Features,
            false => neardup_core::InputKind::Text,
        },
        id: id_field,
        key: None,
    };
    let lines: Vec<Result<Vec<u8>, String>> = py.detach(|| {
        spans
            .par_iter()
            .enumerate()
            .with_min_len(64)
            .map(|(i, span)| {
                let (s, e) = span.ok_or("the line is null")?;
                let line = simdutf8::compat::from_utf8(&data[s..e]).map_err(|e| {
                    format!("invalid UTF-8 at byte {} of the record", e.valid_up_to())
                })?;
                let r =
                    record::parse_record(line, fields)?.ok_or("a blank line is not a record")?;
                let id = r.id.ok_or_else(|| {
                    format!(
                        "no {id_field:?} field (the Spark job needs an id in every record: \
                         choose it with --id-field)"
                    )
                })?;
                let own = id.to_json();
                let cluster = clusters[i].as_deref().unwrap_or(&own);
                let mut out = Vec::with_capacity(line.len() + 64);
                record::annotate(
                    line.as_bytes(),
                    cluster.as_bytes(),
                    duplicates[i].as_deref().map(str::as_bytes),
                    Some(sims[i]),
                    &id,
                    &mut out,
                )?;
                if !newline {
                    out.pop();
                }
                Ok(out)
            })
            .collect()
    });
    let mut bytes = Vec::new();
    let mut ends: Vec<i32> = vec![0];
    let mut error = None;
    for (i, line) in lines.into_iter().enumerate() {
        match line {
            Ok(l) => {
                bytes.extend_from_slice(&l);
                ends.push(
                    i32::try_from(bytes.len())
                        .map_err(|_| err("spark_annotate: a batch of more than 2 GB of records"))?,
                );
            }
            Err(msg) => {
                error = Some((i, msg));
                break;
            }
        }
    }
    Ok((
        PyBytes::new(py, &bytes),
        PyBytes::new(py, bytemuck::cast_slice(&ends)),
        error,
    ))
}

/// The configuration `config` with the IDF table `table` (the bytes of a
/// `neardup idf build` file): weights tfidf, checked against the features
/// the table was learned from, as `neardup dedup --idf` does.
#[pyfunction]
pub fn config_with_idf(config: &PyConfig, table: &[u8]) -> PyResult<PyConfig> {
    let table = IdfTable::read(table).map_err(err)?;
    let mut c = config.config.clone();
    if table.config_digest() != c.features_digest() {
        return Err(err(format!(
            "the IDF table was learned from features made with another configuration ({} \
             here, {} in the table): use the same tokenizer, features, stopwords and \
             normalisation as `neardup idf build` did",
            c.features_digest(),
            table.config_digest()
        )));
    }
    if let Some(r) = &c.idf
        && r.digest != table.digest()
    {
        return Err(err(format!(
            "this IDF table ({}) is not the one the configuration names ({})",
            table.digest(),
            r.digest
        )));
    }
    c.weights = Weights::TfIdf;
    c.idf = Some(neardup_core::config::IdfRef {
        path: None,
        digest: table.digest().to_owned(),
    });
    c.validate().map_err(err)?;
    let hasher = SimHasher::with_idf(c.clone(), table).map_err(err)?;
    Ok(PyConfig {
        config: c,
        hasher,
        idf_path: config.idf_path.clone(),
    })
}

/// Candidate pairs of documents `0..n` (fingerprint words as `fp`: two u64
/// each, high then low), found on one machine as `neardup dedup` finds them,
/// and screened by the documents' summaries when `threshold` is given.
///
/// Returns (`kept`, `undecided`): `kept` as rows of (a, b, distance) i64 and
/// a matching f64 score column (-1 without verification); `undecided` as (a,
/// b, distance) rows, the pairs only the features can decide.
#[pyfunction]
#[pyo3(signature = (fp, bits, k, summaries=None, threshold=None))]
pub fn spark_join<'py>(
    py: Python<'py>,
    fp: &[u8],
    bits: u32,
    k: u32,
    summaries: Option<&[u8]>,
    threshold: Option<f64>,
) -> PyResult<TriageBytes<'py>> {
    let words = u64s(fp);
    let screen_by = Screen::of("spark_join", words.len() / 2, summaries, threshold)?;
    let out = py.detach(|| {
        let mut triage = Triage::default();
        each_candidate(&words, bits, k, |a, b, dist| {
            let row = [i64::from(a), i64::from(b), i64::from(dist)];
            triage.push(row, Screen::decide(screen_by, a, b));
        })
        .map(|()| triage)
    });
    Ok(out.map_err(err)?.into_py(py))
}

/// Union-find over documents, from a labelling whose labels are roots.
pub(crate) struct Components(Vec<u32>);

impl Components {
    /// `n` documents, each its own component.
    pub(crate) fn new(n: usize) -> Self {
        Components((0..n as u32).collect())
    }

    pub(crate) fn find(&mut self, mut x: u32) -> u32 {
        loop {
            let up = self.0[x as usize];
            let top = self.0[up as usize];
            if top == up {
                return up; // no write where the path is already short
            }
            self.0[x as usize] = top;
            x = top;
        }
    }

    /// Joins the components of `a` and `b`; false if they were one.
    pub(crate) fn union(&mut self, a: u32, b: u32) -> bool {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra == rb {
            return false;
        }
        let (lo, hi) = (ra.min(rb), ra.max(rb));
        self.0[hi as usize] = lo;
        true
    }
}

/// One round of the spanning join, for clusters without the full list of
/// pairs: the candidate pairs are found again, and only those that can still
/// join two components of the verified pairs so far (`labels`: each
/// document's component, a root's label its own) are kept. Pairs the
/// summaries decide at or above the threshold are returned verified (and
/// joined at once); of the undecided ones, a spanning forest first (at most
/// one pair per component joined), then others up to `budget`. Pairs in
/// `failed` (sorted (a, b), verified below the threshold earlier) are
/// skipped. Returns kept (a, b, d) and scores, the undecided pairs (the
/// forest's first), how many of them form the forest, and whether every
/// undecided pair fitted the budget. No further round is needed when every
/// undecided pair fitted, or when every forest pair passes its exact check
/// (the pairs left out were inside the forest's components).
#[pyfunction]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn spark_span<'py>(
    py: Python<'py>,
    fp: &[u8],
    bits: u32,
    k: u32,
    summaries: Option<&[u8]>,
    threshold: Option<f64>,
    labels: &[u8],
    failed: &[u8],
    budget: usize,
) -> PyResult<(
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    usize,
    bool,
)> {
    let words = u64s(fp);
    let n = words.len() / 2;
    let labels: Vec<u32> = labels
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    if labels.len() != n
        || labels
            .iter()
            .any(|&l| l as usize >= n || labels[l as usize] != l)
    {
        return Err(err("spark_span: one label per document, each a root"));
    }
    let failed: Vec<(u32, u32)> = failed
        .chunks_exact(8)
        .map(|c| {
            (
                u32::from_le_bytes(c[..4].try_into().expect("4 bytes")),
                u32::from_le_bytes(c[4..].try_into().expect("4 bytes")),
            )
        })
        .collect();
    if failed.windows(2).any(|w| w[0] > w[1]) {
        return Err(err("spark_span: the failed pairs must be sorted"));
    }
    let screen_by = Screen::of("spark_span", n, summaries, threshold)?;
    struct Round {
        kept: Vec<i64>,
        scores: Vec<f64>,
        forest: Vec<i64>,
        extra: Vec<i64>,
        complete: bool,
    }
    let out = py.detach(|| {
        let mut verified = Components(labels.clone());
        let mut tentative = Components(labels);
        let mut r = Round {
            kept: Vec::new(),
            scores: Vec::new(),
            forest: Vec::new(),
            extra: Vec::new(),
            complete: true,
        };
        each_candidate(&words, bits, k, |a, b, dist| {
            if verified.find(a) == verified.find(b) || failed.binary_search(&(a, b)).is_ok() {
                return;
            }
            let row = [i64::from(a), i64::from(b), i64::from(dist)];
            match Screen::decide(screen_by, a, b) {
                Decision::Kept(j) => {
                    verified.union(a, b);
                    tentative.union(a, b);
                    r.kept.extend(row);
                    r.scores.push(j);
                }
                Decision::Dropped => {}
                Decision::Undecided if tentative.union(a, b) => r.forest.extend(row),
                Decision::Undecided if r.extra.len() / 3 < budget => r.extra.extend(row),
                Decision::Undecided => r.complete = false,
            }
        })
        .map(|()| r)
    });
    let mut r = out.map_err(err)?;
    let forest = r.forest.len() / 3;
    r.forest.extend_from_slice(&r.extra);
    Ok((
        PyBytes::new(py, bytemuck::cast_slice(&r.kept)),
        PyBytes::new(py, bytemuck::cast_slice(&r.scores)),
        PyBytes::new(py, bytemuck::cast_slice(&r.forest)),
        forest,
        r.complete,
    ))
}

/// Exact Jaccard similarity (where it reaches `threshold`, else a value
/// below it) of pairs of feature sets given by index: pair x is
/// `sets[a[x]]` and `sets[b[x]]` (`a`, `b`: u32 bytes; `sets`: sorted u64
/// hashes as bytes, not copied).
#[pyfunction]
pub fn exact_indexed(
    py: Python<'_>,
    sets: Vec<pyo3::pybacked::PyBackedBytes>,
    a: &[u8],
    b: &[u8],
    threshold: f64,
) -> PyResult<Vec<f64>> {
    let (a, b): (&[u32], &[u32]) = (
        bytemuck::try_cast_slice(a).map_err(err)?,
        bytemuck::try_cast_slice(b).map_err(err)?,
    );
    if a.len() != b.len() || a.iter().chain(b).any(|&x| x as usize >= sets.len()) {
        return Err(err("exact_indexed: pair indices outside the sets"));
    }
    // The features in place when aligned (CPython's bytes usually are), else copied.
    let words: Vec<Cow<'_, [SetFeature]>> = sets
        .iter()
        .map(|s| match bytemuck::try_cast_slice::<u8, SetFeature>(s) {
            Ok(w) => Cow::Borrowed(w),
            Err(_) => Cow::Owned(features_of(s)),
        })
        .collect();
    Ok(py.detach(|| {
        a.par_iter()
            .zip(b.par_iter())
            .with_min_len(64)
            .map(|(&x, &y)| jaccard_at_least(&words[x as usize], &words[y as usize], threshold))
            .collect()
    }))
}

/// Each document's representative (u32 bytes) from the pairs among
/// documents `0..n` (`a`, `b`: u32 bytes), as `neardup dedup --policy P
/// --keep-by R` resolves them. Documents `0..old` came from `--against`: they
/// are preferred to every new one, in input order; the new ones by `keep_by`
/// over their keys (`key_kind` 0 number, 1 string, 2 missing).
#[pyfunction]
#[pyo3(signature = (n, a, b, policy, keep_by=None, key_kind=None, key_num=None, key_str=None, old=0))]
#[allow(clippy::too_many_arguments)]
pub fn resolve_pairs<'py>(
    py: Python<'py>,
    n: usize,
    a: &[u8],
    b: &[u8],
    policy: &str,
    keep_by: Option<&str>,
    key_kind: Option<&[u8]>,
    key_num: Option<&[u8]>,
    key_str: Option<Vec<Option<String>>>,
    old: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    let policy: Policy = parse_policy(policy)?;
    let (a, b): (&[u32], &[u32]) = (
        bytemuck::try_cast_slice(a).map_err(err)?,
        bytemuck::try_cast_slice(b).map_err(err)?,
    );
    if a.len() != b.len() || old > n {
        return Err(err("resolve_pairs: mismatched inputs"));
    }
    let rule: KeepBy = keep_by.unwrap_or("first").parse().map_err(err)?;
    let preference = match (&rule, key_kind, key_num, key_str) {
        (KeepBy::First, ..) => None,
        (_, Some(kinds), Some(nums), Some(strs)) => {
            let nums: Vec<f64> = nums
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            let m = n - old;
            if kinds.len() != m || nums.len() != m || strs.len() != m {
                return Err(err("resolve_pairs: one key per new document is needed"));
            }
            let keys: Vec<SortKey> = (0..m)
                .map(|i| match kinds[i] {
                    0 => SortKey::Num(nums[i]),
                    1 => SortKey::Str(strs[i].clone().unwrap_or_default().into()),
                    _ => SortKey::Missing,
                })
                .collect();
            let mut order: Vec<u32> = (0..old as u32).collect();
            order.extend(
                rule.preference(&keys)
                    .expect("not first")
                    .into_iter()
                    .map(|d| d + old as u32),
            );
            Some(order)
        }
        _ => return Err(err("resolve_pairs: --keep-by needs the documents' keys")),
    };
    let pairs: Vec<(u32, u32)> = a.iter().copied().zip(b.iter().copied()).collect();
    let reps = py
        .detach(|| representatives_of_pairs(n, &pairs, policy, preference.as_deref()))
        .map_err(err)?;
    Ok(PyBytes::new(py, bytemuck::cast_slice(&reps)))
}
