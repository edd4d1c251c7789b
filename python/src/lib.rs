//! `neardup._neardup`: the Rust core for Python. The public, documented API is
//! the `neardup` package (python/neardup/__init__.py), which wraps this.

mod config;
mod dedup;
mod fingerprint;
mod index;
mod join;
mod lines;
mod spark;

use config::*;
use dedup::*;
use fingerprint::*;
use index::*;
use join::*;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use neardup_core::dedup::Policy;
use neardup_core::{Fingerprint, Width};

pyo3::create_exception!(
    neardup,
    NeardupError,
    pyo3::exceptions::PyValueError,
    "An error from neardup's Rust core; the message says what to do."
);

pyo3::create_exception!(
    neardup,
    ConfigError,
    NeardupError,
    "A pipeline or dedup setting that is unknown, out of range or contradicts another."
);

pyo3::create_exception!(
    neardup,
    InputError,
    NeardupError,
    "Input that cannot be read: a missing or malformed file, record or value."
);

fn config_err(e: impl std::fmt::Display) -> PyErr {
    ConfigError::new_err(e.to_string())
}

fn input_err(e: impl std::fmt::Display) -> PyErr {
    InputError::new_err(e.to_string())
}

fn err(e: impl std::fmt::Display) -> PyErr {
    NeardupError::new_err(e.to_string())
}

fn fp_to_int(fp: Fingerprint) -> u128 {
    fp.value()
}

/// Little-endian words: one u64 per text (64 bits), or (high, low) per text.
fn words_of(fps: &[Fingerprint], width: Width) -> Vec<u64> {
    match width {
        Width::W64 => fps.iter().map(|f| f.value() as u64).collect(),
        Width::W128 => fps
            .iter()
            .flat_map(|f| [(f.value() >> 64) as u64, f.value() as u64])
            .collect(),
    }
}

fn run_parallel<T: Send>(threads: Option<usize>, f: impl FnOnce() -> T + Send) -> PyResult<T> {
    match threads {
        None | Some(0) => Ok(f()),
        Some(n) => {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(err)?;
            Ok(pool.install(f))
        }
    }
}

fn bytemuck_bytes(words: &[u64]) -> &[u8] {
    bytemuck::cast_slice(words)
}

/// Verification features from their little-endian bytes (as
/// `shingle_sets` and the Spark job's rows give them).
fn features_of(bytes: &[u8]) -> Vec<neardup_core::jaccard::SetFeature> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

fn i64s(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

fn parse_policy(policy: &str) -> PyResult<Policy> {
    match policy {
        "components" => Ok(Policy::Components),
        "incremental" => Ok(Policy::Incremental),
        p => Err(PyValueError::new_err(format!(
            "policy {p:?}: use 'components' or 'incremental'"
        ))),
    }
}

#[pymodule]
fn _neardup(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyConfig>()?;
    m.add_class::<PyIndex>()?;
    m.add_class::<join::BatchIndex>()?;
    m.add("NeardupError", m.py().get_type::<NeardupError>())?;
    m.add("ConfigError", m.py().get_type::<ConfigError>())?;
    m.add("InputError", m.py().get_type::<InputError>())?;
    m.add_function(wrap_pyfunction!(dedup_config, m)?)?;
    m.add_function(wrap_pyfunction!(config_from_parts, m)?)?;
    m.add_function(wrap_pyfunction!(keep_by_preference, m)?)?;
    m.add_function(wrap_pyfunction!(dedup::plan, m)?)?;
    m.add_function(wrap_pyfunction!(lines::write_kept_lines, m)?)?;
    m.add_function(wrap_pyfunction!(lines::range_lines, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(distance, m)?)?;
    m.add_function(wrap_pyfunction!(similarity, m)?)?;
    m.add_function(wrap_pyfunction!(verify_threshold, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprints_list, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprints_arrow, m)?)?;
    m.add_function(wrap_pyfunction!(shingle_sets, m)?)?;
    m.add_function(wrap_pyfunction!(dedup_positions, m)?)?;
    m.add_function(wrap_pyfunction!(clusters_of, m)?)?;
    m.add_function(wrap_pyfunction!(candidate_config, m)?)?;
    m.add_function(wrap_pyfunction!(default_k, m)?)?;
    m.add_function(wrap_pyfunction!(centred_k, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::bit_shares, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::centre_of, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::centred_words, m)?)?;
    m.add_function(wrap_pyfunction!(pigeonhole_keys, m)?)?;
    m.add_function(wrap_pyfunction!(pigeonhole_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(join::pigeonhole_route, m)?)?;
    m.add_function(wrap_pyfunction!(join::pigeonhole_rows, m)?)?;
    m.add(
        "PIGEONHOLE_RECORD",
        (join::RECORD_BYTES, join::DOC_BYTES, spark::SUMMARY_BYTES),
    )?;
    m.add_function(wrap_pyfunction!(spark::spark_rows, m)?)?;
    m.add_function(wrap_pyfunction!(spark::config_with_idf, m)?)?;
    m.add_function(wrap_pyfunction!(spark::spark_join, m)?)?;
    m.add_function(wrap_pyfunction!(spark::spark_span, m)?)?;
    m.add_function(wrap_pyfunction!(spark::exact_indexed, m)?)?;
    m.add_function(wrap_pyfunction!(spark::resolve_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(vector_config, m)?)?;
    m.add_function(wrap_pyfunction!(features_config, m)?)?;
    m.add_function(wrap_pyfunction!(features_dedup_config, m)?)?;
    m.add_function(wrap_pyfunction!(spark::spark_annotate, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprints_vectors, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint_input, m)?)?;
    m.add_function(wrap_pyfunction!(dedup_vectors, m)?)?;
    m.add_function(wrap_pyfunction!(vector_k, m)?)?;
    m.add_function(wrap_pyfunction!(default_vector_k, m)?)?;
    m.add_function(wrap_pyfunction!(cosine_pairs, m)?)?;
    Ok(())
}
