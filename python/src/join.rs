//! The Spark job's distributed join: a join design as a typed object that
//! travels to the executors (pickled as its JSON, parsed once per process
//! that unpickles it), each fingerprint's keys, and the pairs of a sorted key
//! group, by core's [`JoinKeys`] rule.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use neardup_core::index::{Bits, JoinKeys, TableDesign, plan_join};
use neardup_core::{Width, with_bits};

use crate::index::words_to;
use crate::{bytemuck_bytes, err};

/// A join design for the Spark job.
#[pyclass(name = "_JoinDesign", module = "neardup._neardup", frozen)]
pub struct PyJoinDesign {
    design: TableDesign,
}

#[pymethods]
impl PyJoinDesign {
    /// Tables, that is, keys per fingerprint.
    #[getter]
    fn tables(&self) -> usize {
        self.design.tables.len()
    }

    #[getter]
    fn bits(&self) -> u32 {
        self.design.bits
    }

    /// Pickled as its JSON (Spark ships it to the executors).
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let json = serde_json::to_string(&self.design).expect("a design serialises");
        let rebuild = py
            .import("neardup._neardup")?
            .getattr("join_design_from_json")?;
        PyTuple::new(
            py,
            [
                rebuild.unbind(),
                PyTuple::new(py, [json])?.into_any().unbind(),
            ],
        )
    }
}

/// The join design for n fingerprints of `bits` at k.
#[pyfunction]
pub fn join_design(bits: u32, k: u32, n: f64) -> PyResult<PyJoinDesign> {
    Ok(PyJoinDesign {
        design: plan_join(bits, k, n.max(1.0)).map_err(err)?,
    })
}

/// A design from its JSON (unpickling).
#[pyfunction]
pub fn join_design_from_json(json: &str) -> PyResult<PyJoinDesign> {
    Ok(PyJoinDesign {
        design: serde_json::from_str(json).map_err(err)?,
    })
}

/// One key per design table for each fingerprint: (table, key high, key low)
/// words for row i at 3i..3i+3, as bytes.
#[pyfunction]
pub fn table_keys<'py>(
    py: Python<'py>,
    design: &PyJoinDesign,
    data: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    fn keys<B: Bits>(d: &TableDesign, data: &[u8]) -> PyResult<Vec<u64>> {
        let keys = JoinKeys::<B>::new(d).map_err(err)?;
        let fps = words_to::<B>(data)?;
        let mut out = Vec::with_capacity(fps.len() * keys.tables() * 3);
        for &f in &fps {
            for t in 0..keys.tables() {
                let key = keys.key(t, f).to_u128();
                out.extend([t as u64, (key >> 64) as u64, key as u64]);
            }
        }
        Ok(out)
    }
    let width = Width::from_bits(design.design.bits).map_err(err)?;
    let out = with_bits!(width, B => keys::<B>(&design.design, data)?);
    Ok(PyBytes::new(py, bytemuck_bytes(&out)))
}

fn i64s(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// Pairs within key groups, for the Spark job. The rows (columns as
/// little-endian i64 bytes) are sorted by group: (table, key high, key low,
/// block i, block j). Within a group, row x in block `block[x]` is compared
/// with row y when their blocks are (i, j) (or both i when i == j: a skewed
/// group is split into block pairs, each its own group), and kept when the
/// group's table reports it ([`JoinKeys::reports`]: within k, and the first
/// table where both share the prefix), so each pair comes out of exactly one
/// group. Returns (pos a, pos b, distance) rows as i64 bytes, a < b.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn sorted_group_pairs<'py>(
    py: Python<'py>,
    design: &PyJoinDesign,
    k: u32,
    table: &[u8],
    key_hi: &[u8],
    key_lo: &[u8],
    block_i: &[u8],
    block_j: &[u8],
    block: &[u8],
    pos: &[u8],
    fp_hi: &[u8],
    fp_lo: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    let cols = [
        table, key_hi, key_lo, block_i, block_j, block, pos, fp_hi, fp_lo,
    ]
    .map(i64s);
    let n = cols[0].len();
    if cols.iter().any(|c| c.len() != n) {
        return Err(err("sorted_group_pairs: columns differ in length"));
    }
    fn run<B: Bits>(keys: &JoinKeys<B>, k: u32, c: &[Vec<i64>; 9]) -> Vec<i64> {
        let [table, key_hi, key_lo, bi, bj, block, pos, hi, lo] = c;
        let fp =
            |x: usize| B::from_u128((u128::from(hi[x] as u64) << 64) | u128::from(lo[x] as u64));
        let same = |x: usize, y: usize| {
            table[x] == table[y]
                && key_hi[x] == key_hi[y]
                && key_lo[x] == key_lo[y]
                && bi[x] == bi[y]
                && bj[x] == bj[y]
        };
        let mut out = Vec::new();
        let mut start = 0;
        while start < table.len() {
            let mut end = start + 1;
            while end < table.len() && same(start, end) {
                end += 1;
            }
            let t = table[start] as usize;
            let (gi, gj) = (bi[start], bj[start]);
            let fps: Vec<B> = (start..end).map(fp).collect();
            for x in 0..fps.len() {
                for y in x + 1..fps.len() {
                    let (bx, by) = (block[start + x], block[start + y]);
                    let wanted = if gi == gj {
                        bx == gi && by == gi
                    } else {
                        (bx == gi && by == gj) || (bx == gj && by == gi)
                    };
                    if !wanted {
                        continue;
                    }
                    if let Some(dist) = keys.reports(t, fps[x], fps[y], k) {
                        let (a, b) = (pos[start + x], pos[start + y]);
                        out.extend([a.min(b), a.max(b), i64::from(dist)]);
                    }
                }
            }
            start = end;
        }
        out
    }
    let d = &design.design;
    let out = with_bits!(Width::from_bits(d.bits).map_err(err)?, B => {
        let keys = JoinKeys::<B>::new(d).map_err(err)?;
        py.detach(|| run(&keys, k, &cols))
    });
    Ok(PyBytes::new(py, bytemuck::cast_slice(&out)))
}
