//! The Spark job's distributed join (core's [`Pigeonhole`]): each
//! fingerprint's k + 1 group keys, and the pairs of sorted groups, screened
//! by the documents' summaries as `neardup dedup` screens them.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use neardup_core::index::{Bits, Pigeonhole};
use neardup_core::{Width, with_bits};

use crate::spark::{Decision, Screen};
use crate::{err, u64s};

fn i64s(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

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

/// The pairs of whole groups of rows sorted by group (`key`, `block_i`,
/// `block_j`; i64 columns as little-endian bytes), as the group of each
/// pair's first shared block reports it. A group too large for one task is
/// split by `salt` (each row's block among the group's) into block pairs,
/// each its own group: the group (i, j) compares rows of blocks i and j (of
/// block i alone when i == j). With `summaries` (one per row) and a
/// `threshold`, pairs are screened as `neardup dedup` screens them.
///
/// `spanning`: not every pair, only enough for the same components: rows
/// with one fingerprint and one feature set (one summary digest; one
/// fingerprint without a screen) and one salt are joined as one, each of
/// the others paired with it alone (a cluster of m copies costs m pairs,
/// not m²/2).
///
/// Returns (`kept`, `scores`, `undecided`): rows of (pos a, pos b,
/// distance) i64 with a < b, a score per kept row (-1 without a screen),
/// and the pairs only the features can decide.
#[pyfunction]
#[pyo3(signature = (key, block_i, block_j, salt, pos, fp, bits, k, summaries=None, threshold=None, spanning=false))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn pigeonhole_pairs<'py>(
    py: Python<'py>,
    key: &[u8],
    block_i: &[u8],
    block_j: &[u8],
    salt: &[u8],
    pos: &[u8],
    fp: &[u8],
    bits: u32,
    k: u32,
    summaries: Option<&[u8]>,
    threshold: Option<f64>,
    spanning: bool,
) -> PyResult<(
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
)> {
    let ph = Pigeonhole::new(bits, k).map_err(err)?;
    let cols = [key, block_i, block_j, salt, pos].map(i64s);
    let fps = fingerprints(fp);
    let n = fps.len();
    if cols.iter().any(|c| c.len() != n) {
        return Err(err("pigeonhole_pairs: columns differ in length"));
    }
    let screen_by = Screen::of("pigeonhole_pairs", n, summaries, threshold)?;
    fn run<B: Bits>(
        ph: &Pigeonhole,
        k: u32,
        cols: &[Vec<i64>; 5],
        fps: &[u128],
        screen_by: Option<Screen<'_>>,
        spanning: bool,
    ) -> Result<(Vec<i64>, Vec<f64>, Vec<i64>), neardup_core::Error> {
        let [key, bi, bj, salt, pos] = cols;
        let same = |x: usize, y: usize| key[x] == key[y] && bi[x] == bi[y] && bj[x] == bj[y];
        let (mut kept, mut scores, mut undecided) = (Vec::new(), Vec::new(), Vec::new());
        let mut decide = |x: usize, y: usize, d: u32| {
            let row = [pos[x].min(pos[y]), pos[x].max(pos[y]), i64::from(d)];
            match Screen::decide(screen_by, x as u32, y as u32) {
                Decision::Kept(j) => {
                    kept.extend(row);
                    scores.push(j);
                }
                Decision::Dropped => {}
                Decision::Undecided => undecided.extend(row),
            }
        };
        let mut start = 0;
        while start < fps.len() {
            let mut end = start + 1;
            while end < fps.len() && same(start, end) {
                end += 1;
            }
            let (gi, gj) = (bi[start], bj[start]);
            let part = Pigeonhole::part_of(key[start]);
            // The rows joined: all, or (spanning) one per class of rows with
            // one fingerprint, one feature set and one salt, the others
            // linked to it (by the group of part 0, which every copy shares;
            // a class is within one salt, so its block pair (s, s) holds it).
            let mut rows: Vec<usize> = (start..end).collect();
            if spanning {
                let identity = |x: usize| screen_by.map_or(&[][..], |s| s.identity(x as u32));
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
                        if part == 0 && gi == gj {
                            decide(r, rows[next], 0);
                        }
                        next += 1;
                    }
                    reps.push(r);
                    at = next;
                }
                rows = reps;
            }
            let group: Vec<B> = rows.iter().map(|&x| B::from_u128(fps[x])).collect();
            ph.group_pairs(part, &group, k, |x, y, d| {
                let (x, y) = (rows[x as usize], rows[y as usize]);
                let (sx, sy) = (salt[x], salt[y]);
                let wanted = if gi == gj {
                    sx == gi && sy == gi
                } else {
                    (sx == gi && sy == gj) || (sx == gj && sy == gi)
                };
                if wanted {
                    decide(x, y, d);
                }
            })?;
            start = end;
        }
        Ok((kept, scores, undecided))
    }
    let width = Width::from_bits(bits).map_err(err)?;
    let (kept, scores, undecided) = py
        .detach(|| with_bits!(width, B => run::<B>(&ph, k, &cols, &fps, screen_by, spanning)))
        .map_err(err)?;
    Ok((
        PyBytes::new(py, bytemuck::cast_slice(&kept)),
        PyBytes::new(py, bytemuck::cast_slice(&scores)),
        PyBytes::new(py, bytemuck::cast_slice(&undecided)),
    ))
}
