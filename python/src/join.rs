//! The Spark job's distributed join (core's [`Pigeonhole`]): each
//! fingerprint's k + 1 group keys, and the pairs of sorted groups, screened
//! by the documents' summaries as `neardup dedup` screens them.

use std::borrow::Cow;

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use neardup_core::index::{Bits, OnlineIndex, Pigeonhole, plan_online};
use neardup_core::jaccard::{SetFeature, jaccard_at_least};
use neardup_core::{Width, with_bits};

use crate::spark::{
    Components, Decision, SUMMARY_BYTES, Screen, Triage, TriageBytes, decide_summaries,
};
use crate::{err, features_of, i64s, u64s};

/// Fingerprints from words, two u64 per document (high, then low: high 0 at
/// 64 bits).
fn fingerprints(fp: &[u8]) -> Vec<u128> {
    u64s(fp)
        .chunks_exact(2)
        .map(|w| (u128::from(w[0]) << 64) | u128::from(w[1]))
        .collect()
}

/// The k + 1 group keys of each fingerprint (words `fp`, two u64 each, high
/// then low) of width `bits`: row i's keys at i(k+1)..(i+1)(k+1), as i64
/// bytes.
#[pyfunction]
pub fn pigeonhole_keys<'py>(
    py: Python<'py>,
    fp: &[u8],
    bits: u32,
    k: u32,
) -> PyResult<Bound<'py, PyBytes>> {
    let ph = Pigeonhole::new(bits, k).map_err(err)?;
    let fps = fingerprints(fp);
    let mut out = Vec::with_capacity(fps.len() * ph.parts());
    for &f in &fps {
        out.extend((0..ph.parts()).map(|b| ph.key(b, f)));
    }
    Ok(PyBytes::new(py, bytemuck::cast_slice(&out)))
}

/// The candidate rows of one map batch for one task of the join, as they
/// cross the shuffle (little-endian): the counts of rows and documents
/// (u32 each), then each row ([`RECORD_BYTES`]: group key i64, block pair
/// (i, j) and salt u32 each, the row's document in this buffer u32), then
/// each document once ([`DOC_BYTES`]: position i64, fingerprint high and
/// low u64; then its summary, SUMMARY_BYTES, when pairs are screened). A
/// document's summary crosses once per task, not once per row.
pub(crate) const RECORD_BYTES: usize = 24;

/// A document of a routed buffer, before its summary ([`RECORD_BYTES`]).
pub(crate) const DOC_BYTES: usize = 24;

/// One candidate row: its group, block pair, salt and document.
#[derive(Clone, Copy)]
struct Record {
    key: i64,
    bi: u32,
    bj: u32,
    salt: u32,
    doc: u32,
}

impl Record {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.key.to_le_bytes());
        for v in [self.bi, self.bj, self.salt, self.doc] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn read(b: &[u8]) -> Self {
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        Record {
            key: i64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            bi: u32_at(8),
            bj: u32_at(12),
            salt: u32_at(16),
            doc: u32_at(20),
        }
    }
}

/// A routed buffer being written: its rows, and its documents (each once).
#[derive(Default)]
struct Routed {
    rows: Vec<u8>,
    docs: Vec<u8>,
    n_rows: u32,
    n_docs: u32,
}

impl Routed {
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.rows.len() + self.docs.len());
        out.extend_from_slice(&self.n_rows.to_le_bytes());
        out.extend_from_slice(&self.n_docs.to_le_bytes());
        out.extend_from_slice(&self.rows);
        out.extend_from_slice(&self.docs);
        out
    }
}

/// A document of a routed buffer: position, fingerprint, summary.
fn write_doc(out: &mut Vec<u8>, pos: i64, fp: u128, summary: Option<&[u8]>) {
    out.extend_from_slice(&pos.to_le_bytes());
    out.extend_from_slice(&((fp >> 64) as u64).to_le_bytes());
    out.extend_from_slice(&(fp as u64).to_le_bytes());
    if let Some(s) = summary {
        out.extend_from_slice(s);
    }
}

/// The rows and documents of routed buffers, read back: every row's
/// document numbered across the buffers.
struct Parsed {
    rows: Vec<Record>,
    pos: Vec<i64>,
    fps: Vec<u128>,
    /// Each document's summary (`summary_bytes` each, none without a
    /// screen), one after another.
    summaries: Vec<u8>,
    summary_bytes: usize,
}

impl Parsed {
    fn new(summary_bytes: usize) -> Self {
        Parsed {
            rows: Vec::new(),
            pos: Vec::new(),
            fps: Vec::new(),
            summaries: Vec::new(),
            summary_bytes,
        }
    }

    fn n_docs(&self) -> usize {
        self.pos.len()
    }

    /// Document `x` as a routed buffer holds it ([`write_doc`]).
    fn write_doc(&self, x: usize, out: &mut Vec<u8>) {
        let b = self.summary_bytes;
        let summary = (b > 0).then(|| &self.summaries[x * b..(x + 1) * b]);
        write_doc(out, self.pos[x], self.fps[x], summary);
    }
}

/// The two counts (u32 each) a routed buffer opens with.
fn counts(b: &[u8]) -> Result<(usize, usize), String> {
    let count = |at: usize| {
        b.get(at..at + 4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")) as usize)
    };
    match (count(0), count(4)) {
        (Some(x), Some(y)) => Ok((x, y)),
        _ => Err("a routed buffer shorter than its counts".into()),
    }
}

fn parse_routed(buffers: &[&[u8]], summary_bytes: usize) -> Result<Parsed, String> {
    let doc_bytes = DOC_BYTES + summary_bytes;
    let mut out = Parsed::new(summary_bytes);
    for b in buffers {
        let (n_rows, n_docs) = counts(b)?;
        if b.len() != 8 + n_rows * RECORD_BYTES + n_docs * doc_bytes {
            return Err(format!(
                "a routed buffer of {} bytes for {n_rows} rows and {n_docs} documents of {doc_bytes} bytes \
                 (with a threshold, documents carry summaries)",
                b.len()
            ));
        }
        let first = out.n_docs() as u32;
        for r in b[8..8 + n_rows * RECORD_BYTES].chunks_exact(RECORD_BYTES) {
            let mut rec = Record::read(r);
            if rec.doc as usize >= n_docs {
                return Err("a routed row names a document its buffer does not hold".into());
            }
            rec.doc += first;
            out.rows.push(rec);
        }
        for d in b[8 + n_rows * RECORD_BYTES..].chunks_exact(doc_bytes) {
            let u64_at = |at: usize| u64::from_le_bytes(d[at..at + 8].try_into().expect("8 bytes"));
            out.pos.push(u64_at(0) as i64);
            out.fps
                .push((u128::from(u64_at(8)) << 64) | u128::from(u64_at(16)));
            out.summaries.extend_from_slice(&d[DOC_BYTES..]);
        }
    }
    Ok(out)
}

/// A lean routed buffer ([`pigeonhole_rows`]): the counts of plain and of
/// hot rows (u32 each), then each plain row ([`LEAN_ROW`]: position i64,
/// fingerprint high and low u64, part u8), then each row of a split group
/// ([`LEAN_HOT_ROW`]: the same, then its salt and the other block of its
/// block pair, u32 each). Every row holds its document: nothing in a
/// buffer depends on which other rows share its task, so a document costs
/// the shuffle k + 1 rows whatever the number of tasks.
pub(crate) const LEAN_ROW: usize = 25;

/// A lean row of a split group ([`LEAN_ROW`]).
pub(crate) const LEAN_HOT_ROW: usize = 33;

/// Lean buffers read back: each row's group from its part and fingerprint,
/// its documents numbered in position order (each once, however many rows
/// and buffers hold it), their summaries (`summary_bytes` each, in that
/// order) from `summaries_of` (given the positions, ascending, as i64).
fn parse_lean(
    ph: &Pigeonhole,
    buffers: &[&[u8]],
    summary_bytes: usize,
    summaries_of: impl FnOnce(&[i64]) -> Result<Vec<u8>, String>,
) -> Result<Parsed, String> {
    // Each buffer's plain and split-group rows, checked.
    let mut sections = Vec::with_capacity(buffers.len());
    let mut n_rows = 0;
    for b in buffers {
        let (n_plain, n_hot) = counts(b)?;
        n_rows += n_plain + n_hot;
        if b.len() != 8 + n_plain * LEAN_ROW + n_hot * LEAN_HOT_ROW {
            return Err(format!(
                "a lean routed buffer of {} bytes for {n_plain} rows and {n_hot} rows of split groups",
                b.len()
            ));
        }
        sections.push(b[8..].split_at(n_plain * LEAN_ROW));
    }
    let rows = || {
        sections.iter().flat_map(|(plain, hot)| {
            plain
                .chunks_exact(LEAN_ROW)
                .chain(hot.chunks_exact(LEAN_HOT_ROW))
        })
    };
    let u64_at = |r: &[u8], at: usize| u64::from_le_bytes(r[at..at + 8].try_into().expect("8"));
    let u32_at = |r: &[u8], at: usize| u32::from_le_bytes(r[at..at + 4].try_into().expect("4"));
    // The documents: every row's position, each once (read twice rather
    // than held: a task holds millions of rows).
    let mut out = Parsed::new(summary_bytes);
    out.pos = rows().map(|r| u64_at(r, 0) as i64).collect();
    out.pos.sort_unstable();
    out.pos.dedup();
    out.fps = vec![0; out.pos.len()];
    let mut seen = vec![false; out.pos.len()];
    out.rows.reserve(n_rows);
    for r in rows() {
        let (p, f, part) = (
            u64_at(r, 0) as i64,
            (u128::from(u64_at(r, 8)) << 64) | u128::from(u64_at(r, 16)),
            r[24],
        );
        if usize::from(part) >= ph.parts() {
            return Err(format!(
                "a routed row of part {part}; the join has {}",
                ph.parts()
            ));
        }
        let (salt, other) = if r.len() == LEAN_HOT_ROW {
            (u32_at(r, 25), u32_at(r, 29))
        } else {
            (0, 0)
        };
        let doc = out
            .pos
            .binary_search(&p)
            .expect("every row's position is listed");
        if std::mem::replace(&mut seen[doc], true) && out.fps[doc] != f {
            return Err(format!("the rows of position {p} carry two fingerprints"));
        }
        out.fps[doc] = f;
        out.rows.push(Record {
            key: ph.key(usize::from(part), f),
            bi: salt.min(other),
            bj: salt.max(other),
            salt,
            doc: doc as u32,
        });
    }
    if summary_bytes > 0 {
        out.summaries = summaries_of(&out.pos)?;
        if out.summaries.len() != out.pos.len() * summary_bytes {
            return Err(format!(
                "{} bytes of summaries for {} documents of {summary_bytes} bytes",
                out.summaries.len(),
                out.pos.len()
            ));
        }
    }
    Ok(out)
}

/// The task (0 to `parts` - 1) of group (`key`, `bi`, `bj`): every row of a
/// group has the same.
fn destination(key: i64, bi: u32, bj: u32, parts: usize) -> usize {
    let mut z = (key as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((u64::from(bi) << 32 | u64::from(bj)).wrapping_mul(0xC2B2_AE3D_27D4_EB4F));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % parts as u64) as usize
}

/// One candidate row as the router sends it.
struct Routing {
    doc: usize,
    part: usize,
    key: i64,
    salt: u32,
    other: u32,
    dest: usize,
}

/// Documents to route to the join's tasks ([`pigeonhole_route`],
/// [`pigeonhole_rows`]).
struct Router {
    ph: Pigeonhole,
    fps: Vec<u128>,
    pos: Vec<i64>,
    /// The hot groups' keys (sorted) and how many blocks each is split into.
    hot: Vec<i64>,
    splits: Vec<i64>,
    parts: usize,
}

impl Router {
    /// The arguments of router `name`: the join's (bits, k), fingerprint
    /// words `fp`, positions `pos`, the hot groups (keys, splits: i64 bytes
    /// each) and the tasks.
    fn new(
        name: &str,
        (bits, k): (u32, u32),
        fp: &[u8],
        pos: &[u8],
        (hot_keys, hot_splits): (&[u8], &[u8]),
        parts: usize,
    ) -> PyResult<Self> {
        let r = Router {
            ph: Pigeonhole::new(bits, k).map_err(err)?,
            fps: fingerprints(fp),
            pos: i64s(pos),
            hot: i64s(hot_keys),
            splits: i64s(hot_splits),
            parts,
        };
        if r.pos.len() != r.fps.len() || r.hot.len() != r.splits.len() || parts == 0 {
            return Err(err(format!(
                "{name}: one position per fingerprint, one split per hot key and a task are needed"
            )));
        }
        Ok(r)
    }

    /// Every candidate row, in document order: a row in each of a
    /// document's k + 1 groups, and a hot group a row in each block pair of
    /// the document's block (its salt, from its position); each sent to its
    /// group's task.
    fn each_row(&self, mut emit: impl FnMut(Routing)) {
        for (doc, (&f, &p)) in self.fps.iter().zip(&self.pos).enumerate() {
            for part in 0..self.ph.parts() {
                let key = self.ph.key(part, f);
                let split = self
                    .hot
                    .binary_search(&key)
                    .map_or(1, |at| self.splits[at].max(1) as u64);
                let salt = ((p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) % split;
                for other in 0..split {
                    let (bi, bj) = (salt.min(other) as u32, salt.max(other) as u32);
                    emit(Routing {
                        doc,
                        part,
                        key,
                        salt: salt as u32,
                        other: other as u32,
                        dest: destination(key, bi, bj, self.parts),
                    });
                }
            }
        }
    }
}

/// The candidate rows of documents as [`pigeonhole_route`] routes them, in
/// lean buffers ([`LEAN_ROW`]: each row holds its document's position and
/// fingerprint, and no summary), the non-empty ones packed as one binary
/// column: (the task of each buffer, i32; the buffers' offsets in `data`,
/// i32, one more than the buffers; `data`), ready to be an Arrow array
/// without a copy.
#[pyfunction]
#[pyo3(signature = (fp, pos, bits, k, hot_keys, hot_splits, parts))]
#[allow(clippy::too_many_arguments)]
pub fn pigeonhole_rows<'py>(
    py: Python<'py>,
    fp: &[u8],
    pos: &[u8],
    bits: u32,
    k: u32,
    hot_keys: &[u8],
    hot_splits: &[u8],
    parts: usize,
) -> PyResult<(
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
)> {
    let router = Router::new(
        "pigeonhole_rows",
        (bits, k),
        fp,
        pos,
        (hot_keys, hot_splits),
        parts,
    )?;
    let (fps, pos) = (&router.fps, &router.pos);
    let (tasks, offsets, data) = py
        .detach(|| {
            // Each task's plain and split-group rows.
            let mut out: Vec<(Vec<u8>, Vec<u8>)> = (0..parts).map(|_| Default::default()).collect();
            router.each_row(|row| {
                // A row of block pair (0, 0) reads as a plain one.
                let (plain, split) = &mut out[row.dest];
                let hot = row.salt != 0 || row.other != 0;
                let to = if hot { split } else { plain };
                to.extend_from_slice(&pos[row.doc].to_le_bytes());
                to.extend_from_slice(&((fps[row.doc] >> 64) as u64).to_le_bytes());
                to.extend_from_slice(&(fps[row.doc] as u64).to_le_bytes());
                to.push(row.part as u8);
                if hot {
                    to.extend_from_slice(&row.salt.to_le_bytes());
                    to.extend_from_slice(&row.other.to_le_bytes());
                }
            });
            let (mut tasks, mut offsets, mut data) = (Vec::new(), vec![0i32], Vec::new());
            for (task, (plain, split)) in out.iter().enumerate() {
                if plain.is_empty() && split.is_empty() {
                    continue;
                }
                data.extend_from_slice(&((plain.len() / LEAN_ROW) as u32).to_le_bytes());
                data.extend_from_slice(&((split.len() / LEAN_HOT_ROW) as u32).to_le_bytes());
                data.extend_from_slice(plain);
                data.extend_from_slice(split);
                tasks.push(task as i32);
                offsets.push(i32::try_from(data.len()).map_err(|_| {
                "pigeonhole_rows: over 2 GB of rows from one batch; give fewer documents at a time"
            })?);
            }
            Ok::<_, &str>((tasks, offsets, data))
        })
        .map_err(err)?;
    Ok((
        PyBytes::new(py, bytemuck::cast_slice(&tasks)),
        PyBytes::new(py, bytemuck::cast_slice(&offsets)),
        PyBytes::new(py, &data),
    ))
}

/// The candidate rows of documents (fingerprint words `fp`, two u64 each,
/// high then low, of width `bits`; positions `pos`, i64; `summaries`, one
/// each, when pairs are to be screened), routed to the `parts` tasks of the
/// join: one buffer per task ([`RECORD_BYTES`]), empty for a task with no
/// row. Each document has a row in each of its k + 1 groups; a hot group
/// (`hot_keys`, sorted i64, split into `hot_splits` blocks, i64) has the
/// row in each block pair of the document's block (its salt, from its
/// position), so that no task holds more than about two blocks of it.
#[pyfunction]
#[pyo3(signature = (fp, pos, bits, k, hot_keys, hot_splits, parts, summaries=None))]
#[allow(clippy::too_many_arguments)]
pub fn pigeonhole_route<'py>(
    py: Python<'py>,
    fp: &[u8],
    pos: &[u8],
    bits: u32,
    k: u32,
    hot_keys: &[u8],
    hot_splits: &[u8],
    parts: usize,
    summaries: Option<&[u8]>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let router = Router::new(
        "pigeonhole_route",
        (bits, k),
        fp,
        pos,
        (hot_keys, hot_splits),
        parts,
    )?;
    let (fps, pos) = (&router.fps, &router.pos);
    if summaries.is_some_and(|s| s.len() != fps.len() * SUMMARY_BYTES) {
        return Err(err(
            "pigeonhole_route: one summary per fingerprint is needed",
        ));
    }
    let out = py.detach(|| {
        let mut out: Vec<Routed> = (0..parts).map(|_| Routed::default()).collect();
        // The document each buffer holds last (each document is added once).
        let mut last = vec![usize::MAX; parts];
        router.each_row(|row| {
            let to = &mut out[row.dest];
            if last[row.dest] != row.doc {
                last[row.dest] = row.doc;
                let summary =
                    summaries.map(|s| &s[row.doc * SUMMARY_BYTES..(row.doc + 1) * SUMMARY_BYTES]);
                write_doc(&mut to.docs, pos[row.doc], fps[row.doc], summary);
                to.n_docs += 1;
            }
            let rec = Record {
                key: row.key,
                bi: row.salt.min(row.other),
                bj: row.salt.max(row.other),
                salt: row.salt,
                doc: to.n_docs - 1,
            };
            rec.write(&mut to.rows);
            to.n_rows += 1;
        });
        out
    });
    Ok(out
        .iter()
        .map(|r| {
            if r.n_rows == 0 {
                PyBytes::new(py, b"")
            } else {
                PyBytes::new(py, &r.bytes())
            }
        })
        .collect())
}

/// The pairs of the candidate rows `records` ([`pigeonhole_route`]'s
/// buffers for one task: whole groups, in any order), as the group of each
/// pair's first shared block reports it. A group too large for one task is
/// split by salt (each row's block among the group's) into block pairs,
/// each its own group: the group (i, j) compares rows of blocks i and j (of
/// block i alone when i == j). With a `threshold` (the documents then carry
/// summaries), pairs are screened as `neardup dedup` screens them.
///
/// `spanning`: not every pair, only enough for the same components. Rows
/// with one fingerprint and one feature set (one summary digest; one
/// fingerprint without a screen) and one salt are joined as one, each of
/// the others paired with it alone (a cluster of m copies costs m pairs,
/// not m²/2). Within a group, a pair already connected by the group's kept
/// pairs is neither screened nor reported, and its undecided pairs are
/// reported at the group's end only if they join two of its components
/// (the components of what is reported are those of every pair). A group
/// of m rows with more than `cap` m such undecided pairs (the screen cannot
/// decide a crowd of near copies: m²/2 pairs) reports none of them: it is
/// returned instead, as a routed buffer of its own, to be joined again
/// with `sets`.
///
/// `sets` (spanning only: one feature set per document of the buffers, in
/// their order, sorted u64 hashes as bytes): the pairs the screen leaves
/// undecided are checked exactly here, so that a group of m near copies
/// costs at most m - 1 pairs and no undecided one.
///
/// `lean`: the buffers are [`pigeonhole_rows`]'s, their documents numbered
/// by position (ascending); with a `threshold`, `summaries_of(positions)`
/// (i64 bytes, ascending) gives their summaries, one after another.
///
/// Returns (`kept`, `scores`, `undecided`, `overflow`): rows of (pos a,
/// pos b, distance) i64 with a < b, a score per kept row (-1 without a
/// screen), the pairs only the features can decide, and a routed buffer
/// for each group over `cap`.
#[pyfunction]
#[pyo3(signature = (records, bits, k, threshold=None, spanning=false, cap=None, sets=None, lean=false, summaries_of=None))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn pigeonhole_pairs<'py>(
    py: Python<'py>,
    records: Vec<PyBackedBytes>,
    bits: u32,
    k: u32,
    threshold: Option<f64>,
    spanning: bool,
    cap: Option<usize>,
    sets: Option<Vec<PyBackedBytes>>,
    lean: bool,
    summaries_of: Option<Bound<'py, PyAny>>,
) -> PyResult<(
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Vec<Bound<'py, PyBytes>>,
)> {
    let ph = Pigeonhole::new(bits, k).map_err(err)?;
    let summary_bytes = threshold.map_or(0, |_| SUMMARY_BYTES);
    let buffers: Vec<&[u8]> = records.iter().map(|r| &r[..]).collect();
    let mut parsed = if lean {
        if summary_bytes > 0 && summaries_of.is_none() {
            return Err(err(
                "pigeonhole_pairs: lean buffers carry no summaries; give summaries_of",
            ));
        }
        parse_lean(&ph, &buffers, summary_bytes, |positions| {
            let f = summaries_of.as_ref().expect("checked above");
            let got = f
                .call1((PyBytes::new(py, bytemuck::cast_slice(positions)),))
                .map_err(|e| format!("summaries_of: {e}"))?;
            got.extract::<PyBackedBytes>()
                .map(|b| b.to_vec())
                .map_err(|e| format!("summaries_of gave no bytes: {e}"))
        })
    } else {
        parse_routed(&buffers, summary_bytes)
    }
    .map_err(|e| err(format!("pigeonhole_pairs: {e}")))?;
    match &sets {
        Some(_) if !spanning || threshold.is_none() => {
            return Err(err(
                "pigeonhole_pairs: feature sets check a spanning join's screened pairs",
            ));
        }
        Some(s) if s.len() != parsed.n_docs() => {
            return Err(err(
                "pigeonhole_pairs: one feature set per document is needed",
            ));
        }
        _ => {}
    }
    let width_of = Width::from_bits(bits).map_err(err)?;
    let (triage, overflow) = py.detach(|| {
        // The rows are read once more, sorted: not kept beside their copy.
        let rows = std::mem::take(&mut parsed.rows);
        let Parsed {
            ref pos,
            ref fps,
            ref summaries,
            ..
        } = parsed;
        // The rows by group (then position), as columns.
        let mut keyed: Vec<(u64, u64, i64, u32)> = rows
            .iter()
            .enumerate()
            .map(|(x, r)| {
                (
                    r.key as u64,
                    u64::from(r.bi) << 32 | u64::from(r.bj),
                    pos[r.doc as usize],
                    x as u32,
                )
            })
            .collect();
        keyed.sort_unstable();
        let sorted: Vec<Record> = keyed.iter().map(|e| rows[e.3 as usize]).collect();
        drop((keyed, rows));
        let col = |f: fn(&Record) -> i64| -> Vec<i64> { sorted.iter().map(f).collect() };
        let cols = [
            col(|r| r.key),
            col(|r| i64::from(r.bi)),
            col(|r| i64::from(r.bj)),
            col(|r| i64::from(r.salt)),
            sorted.iter().map(|r| pos[r.doc as usize]).collect(),
        ];
        let doc: Vec<u32> = sorted.iter().map(|r| r.doc).collect();
        let row_fps: Vec<u128> = sorted.iter().map(|r| fps[r.doc as usize]).collect();
        // The features in place when aligned (CPython's bytes usually are),
        // else copied.
        let sets: Option<Vec<Cow<'_, [SetFeature]>>> = sets.as_ref().map(|s| {
            s.iter()
                .map(|b| match bytemuck::try_cast_slice::<u8, SetFeature>(b) {
                    Ok(w) => Cow::Borrowed(w),
                    Err(_) => Cow::Owned(features_of(b)),
                })
                .collect()
        });
        let screen_by = Screen::of(
            "pigeonhole_pairs",
            parsed.n_docs(),
            threshold.map(|_| summaries.as_slice()),
            threshold,
        )?;
        let join = Join {
            ph: &ph,
            k,
            cols: &cols,
            doc: &doc,
            fps: &row_fps,
            screen_by,
            spanning,
            cap,
            sets: sets.as_deref(),
        };
        let (triage, ranges) = with_bits!(width_of, B => join.run::<B>()).map_err(err)?;
        // Each group over the cap as a routed buffer of its own.
        let overflow: Vec<Vec<u8>> = ranges
            .chunks_exact(2)
            .map(|r| {
                let mut out = Routed::default();
                let mut local: std::collections::HashMap<u32, u32> = Default::default();
                for rec in &sorted[r[0] as usize..r[1] as usize] {
                    let next = local.len() as u32;
                    let at = *local.entry(rec.doc).or_insert_with(|| {
                        parsed.write_doc(rec.doc as usize, &mut out.docs);
                        next
                    });
                    Record { doc: at, ..*rec }.write(&mut out.rows);
                    out.n_rows += 1;
                }
                out.n_docs = local.len() as u32;
                out.bytes()
            })
            .collect();
        Ok::<_, PyErr>((triage, overflow))
    })?;
    let (kept, scores, undecided) = triage.into_py(py);
    Ok((
        kept,
        scores,
        undecided,
        overflow.iter().map(|b| PyBytes::new(py, b)).collect(),
    ))
}

/// One call's groups and how their pairs are reported
/// ([`pigeonhole_pairs`]).
struct Join<'a> {
    ph: &'a Pigeonhole,
    k: u32,
    /// key, block i, block j, salt, position: one per row.
    cols: &'a [Vec<i64>; 5],
    /// Each row's document: its summary and feature set.
    doc: &'a [u32],
    fps: &'a [u128],
    screen_by: Option<Screen<'a>>,
    spanning: bool,
    cap: Option<usize>,
    sets: Option<&'a [Cow<'a, [SetFeature]>]>,
}

impl Join<'_> {
    fn run<B: Bits>(&self) -> Result<(Triage, Vec<i64>), neardup_core::Error> {
        let (fps, screen_by, doc) = (self.fps, self.screen_by, self.doc);
        let [key, bi, bj, salt, pos] = self.cols;
        let same = |x: usize, y: usize| key[x] == key[y] && bi[x] == bi[y] && bj[x] == bj[y];
        let row =
            |x: usize, y: usize, d: u32| [pos[x].min(pos[y]), pos[x].max(pos[y]), i64::from(d)];
        let mut triage = Triage::default();
        let mut overflow = Vec::new();
        let mut start = 0;
        while start < fps.len() {
            let mut end = start + 1;
            while end < fps.len() && same(start, end) {
                end += 1;
            }
            let (gi, gj) = (bi[start], bj[start]);
            let part = Pigeonhole::part_of(key[start]);
            // Spanning: the group's components by its kept pairs (rows
            // numbered from the group's start), and its undecided pairs.
            let mut joined = self.spanning.then(|| Components::new(end - start));
            let mut pending: Vec<(usize, usize, u32)> = Vec::new();
            let mut over = false;
            let mut decide = |x: usize, y: usize, d: u32| {
                let Some(c) = joined.as_mut() else {
                    triage.push(row(x, y, d), Screen::decide(screen_by, doc[x], doc[y]));
                    return true;
                };
                let (lx, ly) = ((x - start) as u32, (y - start) as u32);
                if c.find(lx) == c.find(ly) {
                    return true;
                }
                let decision = match (Screen::decide(screen_by, doc[x], doc[y]), self.sets) {
                    (Decision::Undecided, Some(sets)) => {
                        let t = screen_by.map_or(0.0, |s| s.threshold());
                        let (a, b) = (doc[x] as usize, doc[y] as usize);
                        Decision::of(Some(jaccard_at_least(&sets[a], &sets[b], t)), t)
                    }
                    (Decision::Undecided, None) => {
                        pending.push((x, y, d));
                        if self
                            .cap
                            .is_some_and(|cap| pending.len() > cap.saturating_mul(end - start))
                        {
                            over = true; // the group is joined again: stop
                            pending = Vec::new();
                        }
                        return !over;
                    }
                    (decision, _) => decision,
                };
                if let Decision::Kept(_) = decision {
                    c.union(lx, ly);
                }
                triage.push(row(x, y, d), decision);
                true
            };
            // The rows joined: all, or (spanning) one per class of rows with
            // one fingerprint, one feature set and one salt, the others
            // linked to it (by the group of part 0, which every copy shares;
            // a class is within one salt, so its block pair (s, s) holds it).
            let mut rows: Vec<usize> = (start..end).collect();
            let mut going = true;
            if self.spanning {
                let identity = |x: usize| screen_by.map_or(&[][..], |s| s.identity(doc[x]));
                rows.sort_unstable_by(|&x, &y| {
                    (fps[x], identity(x), salt[x], pos[x]).cmp(&(
                        fps[y],
                        identity(y),
                        salt[y],
                        pos[y],
                    ))
                });
                let mut reps = Vec::new();
                let mut at = 0;
                while at < rows.len() {
                    let r = rows[at];
                    let mut next = at + 1;
                    while next < rows.len()
                        && (fps[rows[next]], identity(rows[next]), salt[rows[next]])
                            == (fps[r], identity(r), salt[r])
                    {
                        // Once: in part 0's group, in its block pair (s, s).
                        if part == 0 && gi == gj && going {
                            going = decide(r, rows[next], 0);
                        }
                        next += 1;
                    }
                    reps.push(r);
                    at = next;
                }
                rows = reps;
            }
            let group: Vec<B> = rows.iter().map(|&x| B::from_u128(fps[x])).collect();
            // A block pair (i, i) holds rows of block i alone, and (i, j)
            // rows of both: its pairs are those across (by group order, so
            // that a pair found reads no row far away).
            let first_block: Vec<bool> = rows.iter().map(|&x| salt[x] == gi).collect();
            if going {
                self.ph.group_pairs_while(part, &group, self.k, |x, y, d| {
                    gi != gj && first_block[x as usize] == first_block[y as usize]
                        || decide(rows[x as usize], rows[y as usize], d)
                })?;
            }
            if over {
                overflow.extend([start as i64, end as i64]);
            } else if let Some(c) = joined.as_mut() {
                for (x, y, d) in pending {
                    if c.find((x - start) as u32) != c.find((y - start) as u32) {
                        triage.push(row(x, y, d), Decision::Undecided);
                    }
                }
            }
            start = end;
        }
        Ok((triage, overflow))
    }
}

/// The batch mode's index (`--against` on the distributed path): the new
/// batch's fingerprints, with their summaries, built once per Python worker
/// and queried by the documents of the existing set a partition at a time,
/// so that the existing set is read, never shuffled.
#[pyclass(name = "_BatchIndex", module = "neardup", frozen)]
pub struct BatchIndex {
    index: BatchTables,
    k: u32,
    summaries: Option<Vec<u8>>,
    threshold: Option<f64>,
}

/// The index in its fingerprints' width.
enum BatchTables {
    B64(OnlineIndex<u64>),
    B128(OnlineIndex<u128>),
}

/// Document `x`'s summary in `all` (SUMMARY_BYTES each).
fn summary(all: &[u8], x: usize) -> &[u8] {
    &all[x * SUMMARY_BYTES..(x + 1) * SUMMARY_BYTES]
}

/// Index memory per batch document the design may spend (the batch is a
/// share of the corpus, and the existing set's every document queries it).
const BATCH_BYTES_PER_DOCUMENT: f64 = 256.0;

fn batch_index<B: Bits>(fps: &[u128], k: u32) -> PyResult<OnlineIndex<B>> {
    let fps: Vec<B> = fps.iter().map(|&f| B::from_u128(f)).collect();
    let sample = &fps[..fps.len().min(100_000)];
    let plan =
        plan_online::<B>(k, fps.len() as f64, sample, BATCH_BYTES_PER_DOCUMENT).map_err(err)?;
    let design = plan.options[plan.chosen].design.clone();
    OnlineIndex::build(
        design,
        fps.into_iter().enumerate().map(|(i, f)| (i as u64, f)),
    )
    .map_err(err)
}

#[pymethods]
impl BatchIndex {
    /// The index of fingerprint words `fp` (two u64 each, high then low) of
    /// width `bits`, searched within `k`; with `summaries` (one per
    /// fingerprint) and a `threshold`, pairs are screened as `neardup dedup`
    /// screens them.
    #[new]
    #[pyo3(signature = (fp, bits, k, summaries=None, threshold=None))]
    fn new(
        py: Python<'_>,
        fp: &[u8],
        bits: u32,
        k: u32,
        summaries: Option<Vec<u8>>,
        threshold: Option<f64>,
    ) -> PyResult<Self> {
        let fps = fingerprints(fp);
        Screen::of("_BatchIndex", fps.len(), summaries.as_deref(), threshold)?;
        let index = py.detach(|| match Width::from_bits(bits).map_err(err)? {
            Width::W64 => batch_index::<u64>(&fps, k).map(BatchTables::B64),
            Width::W128 => batch_index::<u128>(&fps, k).map(BatchTables::B128),
        })?;
        Ok(BatchIndex {
            index,
            k,
            summaries,
            threshold,
        })
    }

    /// The pairs of the documents `fp` (words as for the index; with their
    /// `summaries` when the index has a threshold) with the indexed ones
    /// within k: (kept, scores, undecided) as `pigeonhole_pairs` returns them,
    /// rows of (query row, indexed row, distance).
    #[pyo3(signature = (fp, summaries=None))]
    fn pairs<'py>(
        &self,
        py: Python<'py>,
        fp: &[u8],
        summaries: Option<&[u8]>,
    ) -> PyResult<TriageBytes<'py>> {
        let queries = fingerprints(fp);
        let screen = match (&self.summaries, self.threshold, summaries) {
            (Some(mine), Some(t), Some(theirs)) => {
                if theirs.len() != queries.len() * SUMMARY_BYTES {
                    return Err(err(
                        "_BatchIndex.pairs: one summary per fingerprint is needed",
                    ));
                }
                Some((mine.as_slice(), theirs, t))
            }
            (None, None, None) => None,
            _ => {
                return Err(err(
                    "_BatchIndex.pairs: give summaries exactly when the index has them",
                ));
            }
        };
        let k = self.k;
        let out = py.detach(|| {
            let matches = match &self.index {
                BatchTables::B64(i) => {
                    let q: Vec<u64> = queries.iter().map(|&f| u64::from_u128(f)).collect();
                    i.query_batch(&q, k)
                }
                BatchTables::B128(i) => i.query_batch(&queries, k),
            }?;
            let mut triage = Triage::default();
            for (q, ms) in matches.iter().enumerate() {
                for m in ms {
                    let decision = match screen {
                        None => Decision::Kept(-1.0),
                        Some((mine, theirs, t)) => {
                            decide_summaries(summary(theirs, q), summary(mine, m.id as usize), t)
                        }
                    };
                    triage.push([q as i64, m.id as i64, i64::from(m.distance)], decision);
                }
            }
            Ok::<_, neardup_core::Error>(triage)
        });
        Ok(out.map_err(err)?.into_py(py))
    }

    /// Documents indexed.
    fn __len__(&self) -> usize {
        match &self.index {
            BatchTables::B64(i) => i.len(),
            BatchTables::B128(i) => i.len(),
        }
    }
}
