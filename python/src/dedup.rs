//! Batch dedup over positions (texts' fingerprints and feature sets, or
//! vectors), clusters from representatives, and the default k.

use pyo3::prelude::*;

use neardup_core::dedup::{Dedup, Policy, clusters};
use neardup_core::index::{Bits, plan_join_for};
use neardup_core::{Width, with_bits};

use crate::fingerprint::vector_rows;
use crate::index::words_to;
use crate::{err, features_of, parse_policy};
use neardup_core::jaccard::SetFeature;

/// Batch dedup of fingerprints (and optionally feature sets): pairs as
/// (a, b, distance, jaccard or -1) over positions, and each position's
/// representative.
/// `preference`: the positions, most preferred first, that clusters keep
/// (`--keep-by`, `--against`); default input order.
#[pyfunction]
#[pyo3(signature = (data, bits, k, policy, threshold=None, sets=None, preference=None))]
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub(crate) fn dedup_positions(
    py: Python<'_>,
    data: &[u8],
    bits: u32,
    k: u32,
    policy: &str,
    threshold: Option<f64>,
    sets: Option<Vec<Vec<u8>>>,
    preference: Option<Vec<u32>>,
) -> PyResult<(Vec<(u32, u32, u32, f64)>, Vec<u32>)> {
    let policy = parse_policy(policy)?;
    let sets: Option<Vec<Vec<SetFeature>>> =
        sets.map(|s| s.iter().map(|b| features_of(b)).collect());
    let preference = preference.as_deref();
    fn run<B: Bits>(
        fps: Vec<B>,
        k: u32,
        policy: Policy,
        verify: Option<(f64, &[Vec<SetFeature>])>,
        preference: Option<&[u32]>,
    ) -> Result<(Vec<(u32, u32, u32, f64)>, Vec<u32>), neardup_core::Error> {
        if let Some(p) = preference
            && p.len() != fps.len()
        {
            return Err(neardup_core::Error::InvalidConfig(format!(
                "a preference of {} positions for {} documents",
                p.len(),
                fps.len()
            )));
        }
        let design = plan_join_for(k, &fps)?;
        let mut d = Dedup::new(&fps, k, &design)?;
        if let Some((t, sets)) = verify {
            d = d.verify(t, |i| sets[i as usize].as_slice());
        }
        let mut pairs = Vec::new();
        d.for_each_scored_pair(|a, b, dist, j| {
            pairs.push((a, b, dist, j.unwrap_or(-1.0)));
            Ok::<(), ()>(())
        })
        .expect("collecting");
        let reps = match preference {
            Some(p) => d.representatives_by(policy, p),
            None => d.representatives(policy),
        };
        Ok((pairs, reps))
    }
    let verify = match (threshold, &sets) {
        (Some(t), Some(s)) => Some((t, s.as_slice())),
        (None, _) => None,
        (Some(_), None) => return Err(err("verification needs the feature sets")),
    };
    let out = with_bits!(Width::from_bits(bits).map_err(err)?, B => {
        let fps = words_to::<B>(data)?;
        py.detach(|| run(fps, k, policy, verify, preference))
    });
    out.map_err(err)
}

/// Batch dedup of fingerprints verified by the exact cosine similarity of
/// their row-major float32 vectors: pairs as (a, b, distance, cosine) over
/// positions, and each position's representative.
#[pyfunction]
#[pyo3(signature = (data, bits, k, policy, threshold, vectors, dim))]
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub(crate) fn dedup_vectors(
    py: Python<'_>,
    data: &[u8],
    bits: u32,
    k: u32,
    policy: &str,
    threshold: f64,
    vectors: &[u8],
    dim: usize,
) -> PyResult<(Vec<(u32, u32, u32, f64)>, Vec<u32>)> {
    let policy = parse_policy(policy)?;
    let rows = vector_rows(vectors, dim, false)?;
    fn run<B: Bits>(
        fps: Vec<B>,
        k: u32,
        policy: Policy,
        threshold: f64,
        rows: &[f32],
        dim: usize,
    ) -> Result<(Vec<(u32, u32, u32, f64)>, Vec<u32>), neardup_core::Error> {
        let design = plan_join_for(k, &fps)?;
        let row = |i: u32| &rows[i as usize * dim..(i as usize + 1) * dim];
        let d = Dedup::new(&fps, k, &design)?.verify_by(
            threshold,
            |i| Some(neardup_core::vector::digest(row(i))),
            |a, b| neardup_core::vector::cosine(row(a), row(b)),
        );
        let mut pairs = Vec::new();
        d.for_each_scored_pair(|a, b, dist, c| {
            pairs.push((a, b, dist, c.unwrap_or(-1.0)));
            Ok::<(), ()>(())
        })
        .expect("collecting");
        Ok((pairs, d.representatives(policy)))
    }
    let out = with_bits!(Width::from_bits(bits).map_err(err)?, B => {
        let fps = words_to::<B>(data)?;
        if fps.len() * dim != rows.len() {
            return Err(err("one vector per fingerprint is needed"));
        }
        py.detach(|| run(fps, k, policy, threshold, &rows, dim))
    });
    out.map_err(err)
}

/// The smallest k at which pairs of cosine similarity `cos` are within k
/// with probability `recall` (capped at bits / 8), and the probability then.
#[pyfunction]
pub(crate) fn vector_k(bits: u32, cos: f64, recall: f64) -> (u32, f64) {
    let max = bits / 8;
    let k = neardup_core::vector::k_for_recall(bits, cos, recall, max).unwrap_or(max);
    (k, neardup_core::vector::recall_at(bits, k, cos))
}

/// The candidate distance a vector dedup uses when none is given (as
/// `neardup dedup --vectors`): verified, the least k that finds 99% of the
/// pairs at cosine `cos`; unverified, the widest distance whose estimate
/// qualifies.
#[pyfunction]
pub(crate) fn default_vector_k(bits: u32, cos: f64, verified: bool) -> PyResult<u32> {
    Ok(neardup_core::vector::default_vector_k(
        Width::from_bits(bits).map_err(err)?,
        cos,
        verified,
    ))
}

/// Cluster lists from representatives: [(representative, [members])].
#[pyfunction]
pub(crate) fn clusters_of(reps: Vec<u32>) -> Vec<(u32, Vec<u32>)> {
    clusters(&reps)
}

/// The default candidate distance of a dedup (as `neardup dedup`).
#[pyfunction]
pub(crate) fn default_k(bits: u32, verify: bool) -> PyResult<u32> {
    Ok(neardup_core::dedup::default_k(
        Width::from_bits(bits).map_err(err)?,
        verify,
    ))
}

/// The default k of a verified dedup whose candidates are centred on the
/// corpus (`neardup dedup`'s default).
#[pyfunction]
pub(crate) fn centred_k(bits: u32) -> PyResult<u32> {
    Ok(neardup_core::dedup::centred_k(
        Width::from_bits(bits).map_err(err)?,
    ))
}

/// The positions, most preferred first, under a `--keep-by` rule: `first`
/// (None: input order), `longest` (the texts' lengths in bytes) or
/// `field:NAME[:asc|desc]` (the field of each JSON record; null or absent
/// last).
#[pyfunction]
#[pyo3(signature = (rule, texts=None, records=None))]
pub(crate) fn keep_by_preference(
    rule: &str,
    texts: Option<Vec<pyo3::pybacked::PyBackedStr>>,
    records: Option<Vec<pyo3::pybacked::PyBackedStr>>,
) -> PyResult<Option<Vec<u32>>> {
    use neardup_core::keep_by::KeepBy;
    let rule: KeepBy = rule.parse().map_err(crate::config_err)?;
    let keys = match (&rule, texts, records) {
        (KeepBy::First, _, _) => return Ok(None),
        (KeepBy::Longest, Some(texts), _) => texts
            .iter()
            .map(|t| rule.key(t, None))
            .collect::<Result<Vec<_>, _>>(),
        (KeepBy::Field { .. }, _, Some(records)) => records
            .iter()
            .map(|r| rule.key("", Some(r.as_bytes())))
            .collect::<Result<Vec<_>, _>>(),
        _ => {
            return Err(crate::config_err(format!(
                "keep_by={rule}: needs the documents' {}",
                if rule.field().is_some() {
                    "records (a DataFrame column, or records=)"
                } else {
                    "texts"
                }
            )));
        }
    }
    .map_err(crate::input_err)?;
    Ok(rule.preference(&keys))
}

/// `neardup plan`: the table design chosen for `n` fingerprints of `bits`
/// bits searched within `k` (within `memory` bytes, if given), why, and
/// every design considered, as dicts.
#[pyfunction]
#[pyo3(signature = (n, k=3, bits=64, memory=None))]
pub(crate) fn plan(
    py: Python<'_>,
    n: f64,
    k: u32,
    bits: u32,
    memory: Option<f64>,
) -> PyResult<Py<pyo3::types::PyDict>> {
    use pyo3::types::PyDict;
    Width::from_bits(bits).map_err(crate::config_err)?;
    if k > bits / 8 {
        return Err(crate::config_err(format!(
            "k = {k} is too large for {bits}-bit fingerprints: use k <= {}",
            bits / 8
        )));
    }
    if !(n.is_finite() && n >= 1.0) {
        return Err(crate::config_err(format!(
            "n = {n}: give the expected number of fingerprints, at least 1"
        )));
    }
    let p = neardup_core::index::plan(bits, k, n, memory).map_err(crate::config_err)?;
    let option = |o: &neardup_core::index::PlanOption| -> PyResult<Py<PyDict>> {
        let d = PyDict::new(py);
        d.set_item("design", o.design.describe())?;
        d.set_item("tables", o.design.tables.len())?;
        d.set_item("levels", o.design.levels.clone())?;
        d.set_item("candidates_per_query", o.candidates)?;
        d.set_item("query_ns", o.query_ns)?;
        d.set_item("bytes_per_fingerprint", o.bytes_per_fingerprint)?;
        d.set_item("memory_bytes", o.bytes_per_fingerprint * n)?;
        Ok(d.unbind())
    };
    let out = PyDict::new(py);
    out.set_item("n", n)?;
    out.set_item("k", k)?;
    out.set_item("bits", bits)?;
    out.set_item("chosen", option(&p.options[p.chosen])?)?;
    out.set_item("reason", p.reason.clone())?;
    let options: PyResult<Vec<Py<PyDict>>> = p.options.iter().map(option).collect();
    out.set_item("options", options?)?;
    Ok(out.unbind())
}
