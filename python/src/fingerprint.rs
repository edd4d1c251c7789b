//! Fingerprints of texts (one, a list, an Arrow column), of vectors and of
//! weighted features, and the verification features and exact similarities of
//! pairs.

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::PyBytes;
use rayon::prelude::*;

use neardup_core::centre::{BitShares, Centre};
use neardup_core::jaccard::{SetFeature, narrow, shingles_for};
use neardup_core::{Fingerprint, Input, Width};

use crate::config::PyConfig;
use crate::{bytemuck_bytes, err, fp_to_int, run_parallel, words_of};

/// The fingerprint of one text, as an int.
#[pyfunction]
pub(crate) fn fingerprint(py: Python<'_>, config: &PyConfig, text: PyBackedStr) -> u128 {
    if text.len() > 1 << 16 {
        py.detach(|| fp_to_int(config.hasher.fingerprint(&text)))
    } else {
        fp_to_int(config.hasher.fingerprint(&text))
    }
}

/// Fingerprints of many texts, in parallel with the GIL released; the words
/// as little-endian bytes.
#[pyfunction]
#[pyo3(signature = (config, texts, threads=None))]
pub(crate) fn fingerprints_list<'py>(
    py: Python<'py>,
    config: &PyConfig,
    texts: Vec<PyBackedStr>,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    let width = config.config.bits;
    let words = py.detach(|| {
        run_parallel(threads, || {
            let fps: Vec<Fingerprint> = texts
                .par_iter()
                .with_min_len(64)
                .map(|t| config.hasher.fingerprint(t))
                .collect();
            words_of(&fps, width)
        })
    })?;
    Ok(PyBytes::new(py, bytemuck_bytes(&words)))
}

/// Where the bits of each text's fingerprint lean (one byte per bit), in
/// parallel with the GIL released: the first step of fingerprints centred on
/// a corpus, as `neardup dedup` makes its candidates.
#[pyfunction]
pub(crate) fn bit_shares<'py>(
    py: Python<'py>,
    config: &PyConfig,
    texts: Vec<PyBackedStr>,
) -> Bound<'py, PyBytes> {
    let bytes: Vec<u8> = py.detach(|| {
        let shares: Vec<BitShares> = texts
            .par_iter()
            .with_min_len(64)
            .map(|t| config.hasher.shares(t))
            .collect();
        shares.iter().flat_map(|s| s.as_bytes().to_vec()).collect()
    });
    PyBytes::new(py, &bytes)
}

/// The centre of documents' shares (`bits` bytes each, as [`bit_shares`]
/// gives them): their count and sums as little-endian u64 words, which add
/// up word by word across parts of a corpus.
#[pyfunction]
pub(crate) fn centre_of<'py>(
    py: Python<'py>,
    shares: &[u8],
    bits: u32,
) -> PyResult<Bound<'py, PyBytes>> {
    let width = Width::from_bits(bits).map_err(err)?;
    let stride = bits as usize;
    if !shares.len().is_multiple_of(stride) {
        return Err(err(format!(
            "{} bytes of shares are not a whole number of {bits}-byte rows",
            shares.len()
        )));
    }
    let mut centre = Centre::new(width);
    for row in shares.chunks_exact(stride) {
        centre.add(row);
    }
    Ok(PyBytes::new(py, &centre.to_bytes()))
}

/// The centred fingerprints of documents' shares on a centre (as
/// [`centre_of`] gives it, possibly summed over parts): words as
/// [`fingerprints_list`] gives them.
#[pyfunction]
pub(crate) fn centred_words<'py>(
    py: Python<'py>,
    shares: &[u8],
    centre: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    let centre = Centre::from_bytes(centre)
        .ok_or_else(|| err("not a centre: use the bytes centre_of gives"))?;
    let width = centre.width();
    let stride = width.bits() as usize;
    if !shares.len().is_multiple_of(stride) {
        return Err(err(format!(
            "{} bytes of shares are not a whole number of {stride}-byte rows",
            shares.len()
        )));
    }
    let words = py.detach(|| {
        let fps: Vec<Fingerprint> = shares
            .par_chunks_exact(stride)
            .with_min_len(1024)
            .map(|row| centre.fingerprint(row))
            .collect();
        words_of(&fps, width)
    });
    Ok(PyBytes::new(py, bytemuck_bytes(&words)))
}

/// The byte ranges of an Arrow string array's values in its data buffer
/// (None for a null), from its offsets (i32, or i64 when `large`), the array's
/// offset and length and its validity bitmap; checked against the buffers.
pub(crate) fn arrow_spans(
    offsets: &[u8],
    data_len: usize,
    offset: usize,
    length: usize,
    large: bool,
    validity: Option<&[u8]>,
) -> PyResult<Vec<Option<(usize, usize)>>> {
    let at = |i: usize| -> PyResult<usize> {
        let value = if large {
            let b = offsets.get(i * 8..i * 8 + 8);
            b.and_then(|b| usize::try_from(i64::from_le_bytes(b.try_into().ok()?)).ok())
        } else {
            let b = offsets.get(i * 4..i * 4 + 4);
            b.and_then(|b| usize::try_from(i32::from_le_bytes(b.try_into().ok()?)).ok())
        };
        value.ok_or_else(|| err("arrow offsets are shorter than the array"))
    };
    (offset..offset + length)
        .map(|i| {
            let valid =
                validity.is_none_or(|v| v.get(i / 8).is_some_and(|b| b >> (i % 8) & 1 == 1));
            let (s, e) = (at(i)?, at(i + 1)?);
            if s > e || e > data_len {
                return Err(err("arrow offsets point outside the data buffer"));
            }
            Ok(valid.then_some((s, e)))
        })
        .collect()
}

/// Fingerprints of an Arrow string array given by its buffers: offsets (i32,
/// or i64 when `large`), the UTF-8 data, the array's offset and length, and
/// the validity bitmap (nulls fingerprint as empty texts).
#[pyfunction]
#[pyo3(signature = (config, offsets, data, offset, length, large, validity=None, threads=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fingerprints_arrow<'py>(
    py: Python<'py>,
    config: &PyConfig,
    offsets: &[u8],
    data: &[u8],
    offset: usize,
    length: usize,
    large: bool,
    validity: Option<&[u8]>,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    let width = config.config.bits;
    let spans: Vec<(usize, usize)> =
        arrow_spans(offsets, data.len(), offset, length, large, validity)?
            .into_iter()
            .map(|span| span.unwrap_or((0, 0)))
            .collect();
    let words = py
        .detach(|| {
            run_parallel(threads, || {
                let fps: Result<Vec<Fingerprint>, String> = spans
                    .par_iter()
                    .with_min_len(64)
                    .map(|&(s, e)| {
                        let text = std::str::from_utf8(&data[s..e])
                            .map_err(|e| format!("invalid UTF-8 in the arrow data: {e}"))?;
                        Ok(config.hasher.fingerprint(text))
                    })
                    .collect();
                fps.map(|f| words_of(&f, width))
            })
        })?
        .map_err(err)?;
    Ok(PyBytes::new(py, bytemuck_bytes(&words)))
}

/// The verification features of each text (sorted, distinct 32-bit
/// features, `neardup_core::jaccard::narrow`) after the configuration's
/// normalisation, each as little-endian bytes.
#[pyfunction]
pub(crate) fn shingle_sets<'py>(
    py: Python<'py>,
    config: &PyConfig,
    texts: Vec<PyBackedStr>,
) -> Vec<Bound<'py, PyBytes>> {
    let normalize = config.config.normalize;
    let sets: Vec<Vec<SetFeature>> = py.detach(|| {
        texts
            .par_iter()
            .map(|t| {
                let mut set = Vec::new();
                narrow(&shingles_for(t, &normalize), &mut set);
                set
            })
            .collect()
    });
    sets.iter()
        .map(|s| PyBytes::new(py, bytemuck::cast_slice(s)))
        .collect()
}

/// Row-major vectors as single precision: `data` holds float32 entries, or
/// float64 when `f64`, `dim` per row.
pub(crate) fn vector_rows(data: &[u8], dim: usize, f64: bool) -> PyResult<Vec<f32>> {
    let size = if f64 { 8 } else { 4 };
    if dim == 0 || !data.len().is_multiple_of(dim * size) {
        return Err(err(format!(
            "{} bytes are not whole rows of {dim} {}-byte numbers",
            data.len(),
            size
        )));
    }
    Ok(if f64 {
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
            .collect()
    } else {
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect()
    })
}

/// Fingerprints of row-major vectors (`first` is the first row's number, for
/// messages), in parallel with the GIL released; the words as little-endian
/// bytes. A row that is not finite or all zeros is an error naming it.
#[pyfunction]
#[pyo3(signature = (config, data, dim, f64=false, first=0, threads=None))]
pub(crate) fn fingerprints_vectors<'py>(
    py: Python<'py>,
    config: &PyConfig,
    data: &[u8],
    dim: usize,
    f64: bool,
    first: usize,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    let width = config.config.bits;
    let words = py.detach(|| {
        run_parallel(threads, || -> PyResult<Vec<u64>> {
            let rows = vector_rows(data, dim, f64)?;
            let fps: Result<Vec<Fingerprint>, String> = rows
                .par_chunks_exact(dim)
                .enumerate()
                .with_min_len(64)
                .map(|(i, v)| {
                    config
                        .hasher
                        .fingerprint_input(Input::Vector(v))
                        .map_err(|e| format!("row {}: {e}", first + i))
                })
                .collect();
            Ok(words_of(&fps.map_err(err)?, width))
        })
    })??;
    Ok(PyBytes::new(py, bytemuck_bytes(&words)))
}

/// The fingerprint of one document of the configuration's kind: a str, a
/// list of floats (a vector) or a list of (feature, weight) pairs.
#[pyfunction]
pub(crate) fn fingerprint_input(config: &PyConfig, doc: &Bound<'_, PyAny>) -> PyResult<u128> {
    let fp = if let Ok(text) = doc.extract::<PyBackedStr>() {
        config.hasher.fingerprint_input(Input::Text(&text))
    } else if let Ok(features) = doc.extract::<Vec<(String, f64)>>() {
        config.hasher.fingerprint_input(Input::Features(&features))
    } else if let Ok(v) = doc.extract::<Vec<f32>>() {
        config.hasher.fingerprint_input(Input::Vector(&v))
    } else {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "a document is a str, a sequence of numbers (a vector) or of (feature, weight) pairs",
        ));
    };
    fp.map(fp_to_int).map_err(err)
}

/// The cosine similarity of each pair of vectors (float32 little-endian bytes).
#[pyfunction]
pub(crate) fn cosine_pairs(py: Python<'_>, a: Vec<Vec<u8>>, b: Vec<Vec<u8>>) -> PyResult<Vec<f64>> {
    if a.len() != b.len() {
        return Err(err("two lists of the same length are needed"));
    }
    py.detach(|| {
        a.iter()
            .zip(&b)
            .map(|(x, y)| {
                let (x, y): (&[f32], &[f32]) = (
                    bytemuck::try_cast_slice(x).map_err(|_| err("vector bytes are misaligned"))?,
                    bytemuck::try_cast_slice(y).map_err(|_| err("vector bytes are misaligned"))?,
                );
                if x.len() != y.len() {
                    return Err(err("two vectors of different dimensions"));
                }
                Ok(neardup_core::vector::cosine(x, y))
            })
            .collect()
    })
}

/// The fingerprints `a` and `b` of `bits` bits, as core's (each masked to
/// the width).
fn pair(a: u128, b: u128, bits: u32) -> PyResult<(Fingerprint, Fingerprint)> {
    let w = Width::from_bits(bits).map_err(err)?;
    Ok((Fingerprint::new(a, w), Fingerprint::new(b, w)))
}

/// Hamming distance of two fingerprints of `bits` bits.
#[pyfunction]
pub(crate) fn distance(a: u128, b: u128, bits: u32) -> PyResult<u32> {
    let (a, b) = pair(a, b, bits)?;
    a.distance(b).map_err(err)
}

/// Estimated cosine similarity of the feature vectors behind two
/// fingerprints of `bits` bits: cos(pi * d / f).
#[pyfunction]
pub(crate) fn similarity(a: u128, b: u128, bits: u32) -> PyResult<f64> {
    let (a, b) = pair(a, b, bits)?;
    a.similarity(b).map_err(err)
}

/// The threshold of a `jaccard:T` verification rule, as the command line
/// parses `--verify`.
#[pyfunction]
pub(crate) fn verify_threshold(rule: &str) -> PyResult<f64> {
    rule.parse::<neardup_core::jaccard::Verify>()
        .map(|v| v.threshold)
        .map_err(err)
}
