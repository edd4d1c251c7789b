//! `FingerprintConfig`: the pipeline's configuration and its ready hasher,
//! and the configurations the package builds for vectors, weighted features and
//! dedup's candidates.

use pyo3::prelude::*;

use neardup_core::{
    Features, FingerprintConfig, HashFunction, Profile, SimHasher, Tokenizer, Weights, Width,
};

use crate::err;

/// A fingerprint configuration and its ready hasher.
#[pyclass(name = "FingerprintConfig", module = "neardup", frozen)]
pub(crate) struct PyConfig {
    pub(crate) config: FingerprintConfig,
    pub(crate) hasher: SimHasher,
}

impl PyConfig {
    pub(crate) fn from_config(config: FingerprintConfig) -> PyResult<Self> {
        let hasher = SimHasher::new(config.clone()).map_err(err)?;
        Ok(PyConfig { config, hasher })
    }
}

#[pymethods]
impl PyConfig {
    #[new]
    #[pyo3(signature = (*, profile=None, bits=None, tokenizer=None, features=None, weights=None,
                        top=None, hash=None, seed=None, stopwords=None, html=None, nfkc=None,
                        casefold=None, whitespace=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        profile: Option<&str>,
        bits: Option<u32>,
        tokenizer: Option<&str>,
        features: Option<&str>,
        weights: Option<&str>,
        top: Option<usize>,
        hash: Option<&str>,
        seed: Option<u64>,
        stopwords: Option<bool>,
        html: Option<bool>,
        nfkc: Option<bool>,
        casefold: Option<bool>,
        whitespace: Option<bool>,
    ) -> PyResult<Self> {
        let mut c = match profile {
            None | Some("native") => FingerprintConfig::default(),
            Some("python-simhash") => {
                if bits.is_some() || tokenizer.is_some() || features.is_some() || weights.is_some()
                {
                    return Err(err(
                        "profile='python-simhash' fixes every pipeline setting: give no other option",
                    ));
                }
                FingerprintConfig::python_simhash()
            }
            Some(p) => {
                return Err(err(format!(
                    "unknown profile {p:?}: use 'native' or 'python-simhash'"
                )));
            }
        };
        if let Some(b) = bits {
            c.bits = Width::from_bits(b).map_err(err)?;
        }
        if let Some(t) = tokenizer {
            c.tokenizer = t.parse::<Tokenizer>().map_err(err)?;
        }
        if let Some(f) = features {
            c.features = f.parse::<Features>().map_err(err)?;
        }
        if let Some(w) = weights {
            c.weights = w.parse::<Weights>().map_err(err)?;
        }
        if top.is_some() {
            c.top = top;
        }
        if let Some(h) = hash {
            c.hash = h.parse::<HashFunction>().map_err(err)?;
        }
        if let Some(s) = seed {
            c.seed = s;
        }
        if let Some(s) = stopwords {
            c.stopwords = s;
        }
        if let Some(v) = html {
            c.normalize.html = v;
        }
        if let Some(v) = nfkc {
            c.normalize.nfkc = v;
        }
        if let Some(v) = casefold {
            c.normalize.casefold = v;
        }
        if let Some(v) = whitespace {
            c.normalize.whitespace = v;
        }
        c.validate().map_err(err)?;
        PyConfig::from_config(c)
    }

    /// The configuration as JSON (the same text `neardup config` prints).
    fn to_json(&self) -> String {
        serde_json::to_string(&self.config).expect("configuration serialises")
    }

    /// A configuration from JSON (e.g. `neardup config` output or an index's).
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Self> {
        let c: FingerprintConfig = serde_json::from_str(text).map_err(err)?;
        c.validate().map_err(err)?;
        PyConfig::from_config(c)
    }

    /// A short digest identifying the configuration.
    fn digest(&self) -> String {
        self.config.digest()
    }

    #[getter]
    fn bits(&self) -> u32 {
        self.config.bits.bits()
    }

    /// What a document is: "text", "vector" or "features".
    #[getter]
    fn input(&self) -> String {
        self.config.input.to_string()
    }

    /// For dense vectors: the dimension every vector must have, if fixed.
    #[getter]
    fn dim(&self) -> Option<usize> {
        self.config.dim
    }

    #[getter]
    fn profile(&self) -> &'static str {
        match self.config.profile {
            Profile::PythonSimhash => "python-simhash",
            _ => "native",
        }
    }

    fn __repr__(&self) -> String {
        format!("FingerprintConfig({})", self.config.summary())
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyConfig>()
            .is_ok_and(|o| o.get().config == self.config)
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.config.digest().hash(&mut h);
        h.finish()
    }
}

/// The configuration of dense vectors of `dim` dimensions (or any).
#[pyfunction]
#[pyo3(signature = (bits=64, dim=None, seed=0))]
pub(crate) fn vector_config(bits: u32, dim: Option<usize>, seed: u64) -> PyResult<PyConfig> {
    let width = Width::from_bits(bits).map_err(err)?;
    PyConfig::from_config(FingerprintConfig::vectors(width, dim, seed))
}

/// The configuration of weighted features (`feature -> weight`).
#[pyfunction]
#[pyo3(signature = (bits=64, hash="xxh3", seed=0))]
pub(crate) fn features_config(bits: u32, hash: &str, seed: u64) -> PyResult<PyConfig> {
    let width = Width::from_bits(bits).map_err(err)?;
    let hash: HashFunction = hash.parse().map_err(err)?;
    PyConfig::from_config(FingerprintConfig::weighted_features(width, hash, seed))
}

/// The candidate configuration used with verification (as `neardup dedup`).
#[pyfunction]
pub(crate) fn candidate_config() -> PyResult<PyConfig> {
    PyConfig::from_config(FingerprintConfig::candidates())
}
