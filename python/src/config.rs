//! `FingerprintConfig`: the pipeline's configuration and its ready hasher,
//! and the configurations the package builds for vectors, weighted features and
//! dedup's candidates.

use std::path::{Path, PathBuf};

use pyo3::prelude::*;

use neardup_core::{
    FingerprintConfig, HashFunction, IdfRef, IdfTable, Overrides, Profile, SimHasher, Weights,
    Width,
};

use neardup_core::config::relative_to;

use crate::{config_err, err, input_err};

/// A fingerprint configuration and its ready hasher.
#[pyclass(name = "FingerprintConfig", module = "neardup", frozen)]
pub(crate) struct PyConfig {
    pub(crate) config: FingerprintConfig,
    pub(crate) hasher: SimHasher,
    /// Where the IDF table was read from, if the configuration has one.
    pub(crate) idf_path: Option<PathBuf>,
}

impl PyConfig {
    pub(crate) fn from_config(config: FingerprintConfig) -> PyResult<Self> {
        let hasher = SimHasher::new(config.clone()).map_err(config_err)?;
        Ok(PyConfig {
            config,
            hasher,
            idf_path: None,
        })
    }

    fn copy(&self) -> PyConfig {
        PyConfig {
            config: self.config.clone(),
            hasher: self.hasher.clone(),
            idf_path: self.idf_path.clone(),
        }
    }
}

/// `base` with the settings `o` gives, and the IDF table `idf` (or, if the
/// configuration names one, the table at the path it names, relative to
/// `folder`), as the command line's `--config`, flags and `--idf` make it.
pub(crate) fn with_overrides(
    base: FingerprintConfig,
    o: &Overrides,
    idf: Option<&Path>,
    folder: Option<&Path>,
) -> PyResult<PyConfig> {
    let mut c = o.apply(base).map_err(config_err)?;
    let named = c
        .idf
        .as_ref()
        .and_then(|r| r.path.as_ref())
        .map(PathBuf::from)
        .map(|p| match folder {
            Some(f) if p.is_relative() => f.join(p),
            _ => p,
        });
    let Some(path) = idf.map(Path::to_path_buf).or(named) else {
        if c.idf.is_some() {
            return Err(config_err(
                "the configuration uses a learned IDF table: pass its file with idf=PATH",
            ));
        }
        c.validate().map_err(config_err)?;
        return PyConfig::from_config(c);
    };
    if o.weights.is_some_and(|w| w != Weights::TfIdf) {
        return Err(config_err(
            "an IDF table goes with weights='tfidf' (or leave weights out)",
        ));
    }
    let file = std::fs::File::open(&path)
        .map_err(|e| input_err(format!("cannot open the IDF table {}: {e}", path.display())))?;
    let table = IdfTable::read(std::io::BufReader::new(file))
        .map_err(|e| input_err(format!("{}: {e}", path.display())))?;
    if let Some(r) = &c.idf
        && r.digest != table.digest()
    {
        return Err(config_err(format!(
            "{}: this IDF table ({}) is not the one the configuration names ({}); pass the \
             table the configuration was made with",
            path.display(),
            table.digest(),
            r.digest
        )));
    }
    c.weights = Weights::TfIdf;
    if table.config_digest() != c.features_digest() {
        return Err(config_err(format!(
            "{}: the IDF table was learned from features made with another configuration \
             ({} here, {} in the table): use the same tokenizer, features, stopwords and \
             normalisation as `neardup idf build` did",
            path.display(),
            c.features_digest(),
            table.config_digest()
        )));
    }
    let absolute = std::path::absolute(&path).unwrap_or(path);
    c.idf = Some(IdfRef {
        path: Some(absolute.display().to_string()),
        digest: table.digest().to_owned(),
    });
    c.validate().map_err(config_err)?;
    let hasher = SimHasher::with_idf(c.clone(), table).map_err(config_err)?;
    Ok(PyConfig {
        config: c,
        hasher,
        idf_path: Some(absolute),
    })
}

/// The configuration a dedup fingerprints with, and whether it is the
/// candidate configuration (centred on the corpus): core's
/// [`Overrides::dedup_config`], the settings given as JSON (`None` or absent
/// is "not given"), with the IDF table `idf` if any.
#[pyfunction]
#[pyo3(signature = (verified, config, overrides, idf=None))]
pub(crate) fn dedup_config(
    verified: bool,
    config: Option<&PyConfig>,
    overrides: &str,
    idf: Option<PathBuf>,
) -> PyResult<(PyConfig, bool)> {
    let o = parse_overrides(overrides)?;
    let candidates = o.starts_from_candidates(verified, config.is_some());
    if let Some(c) = config
        && o.is_empty()
        && idf.is_none()
    {
        return Ok((c.copy(), false));
    }
    let base = match config {
        Some(c) => c.config.clone(),
        None if candidates => FingerprintConfig::candidates(),
        None => FingerprintConfig::default(),
    };
    let idf = idf.or_else(|| config.and_then(|c| c.idf_path.clone()));
    Ok((with_overrides(base, &o, idf.as_deref(), None)?, candidates))
}

/// A configuration from its JSON and the bytes of the IDF table it names,
/// if any (the Spark job's executors rebuild the driver's this way).
#[pyfunction]
#[pyo3(signature = (json, idf=None))]
pub(crate) fn config_from_parts(json: &str, idf: Option<&[u8]>) -> PyResult<PyConfig> {
    let c: FingerprintConfig = serde_json::from_str(json).map_err(config_err)?;
    let Some(bytes) = idf else {
        return PyConfig::from_config(c);
    };
    let table = IdfTable::read(bytes).map_err(input_err)?;
    let hasher = SimHasher::with_idf(c.clone(), table).map_err(config_err)?;
    Ok(PyConfig {
        config: c,
        hasher,
        idf_path: None,
    })
}

/// The configuration `neardup dedup --features-field` fingerprints weighted
/// features with: `config` (which must read weighted features) or 128-bit
/// features hashed with xxh3 and seed 0, with the settings given as JSON
/// applied (`bits`, `hash`, `seed`; the text pipeline's are refused, as the
/// command line refuses them).
#[pyfunction]
#[pyo3(signature = (config, overrides))]
pub(crate) fn features_dedup_config(
    config: Option<&PyConfig>,
    overrides: &str,
) -> PyResult<PyConfig> {
    let o = parse_overrides(overrides)?;
    let base = match config {
        Some(c) if c.config.input != neardup_core::InputKind::Features => {
            return Err(config_err(format!(
                "the configuration fingerprints {}, but the inputs are weighted features",
                c.config.input.plural()
            )));
        }
        Some(c) => c.config.clone(),
        None => FingerprintConfig::weighted_features(Width::W128, HashFunction::Xxh3, 0),
    };
    with_overrides(base, &o, None, None)
}

/// Pipeline settings from JSON (the Python keywords, or the Spark job's flags).
fn parse_overrides(json: &str) -> PyResult<Overrides> {
    serde_json::from_str(json).map_err(|e| {
        config_err(format!(
            "{e}: the pipeline settings are profile, bits, tokenizer, features, weights, top, \
             hash, seed, stopwords, html, nfkc, casefold and whitespace"
        ))
    })
}

#[pymethods]
impl PyConfig {
    #[new]
    #[pyo3(signature = (*, profile=None, bits=None, tokenizer=None, features=None, weights=None,
                        top=None, hash=None, seed=None, stopwords=None, html=None, nfkc=None,
                        casefold=None, whitespace=None, idf=None))]
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
        idf: Option<PathBuf>,
    ) -> PyResult<Self> {
        let o = Overrides {
            profile: profile.map(str::parse).transpose().map_err(config_err)?,
            bits: bits.map(Width::from_bits).transpose().map_err(config_err)?,
            tokenizer: tokenizer.map(str::parse).transpose().map_err(config_err)?,
            features: features.map(str::parse).transpose().map_err(config_err)?,
            weights: weights.map(str::parse).transpose().map_err(config_err)?,
            top,
            hash: hash.map(str::parse).transpose().map_err(config_err)?,
            seed,
            stopwords,
            html,
            nfkc,
            casefold,
            whitespace,
        };
        with_overrides(FingerprintConfig::default(), &o, idf.as_deref(), None)
    }

    /// A configuration saved by `neardup config` (or `save`): an IDF table
    /// it names is read from the path it gives, relative to the file's
    /// folder, unless ``idf`` gives the table.
    #[staticmethod]
    #[pyo3(signature = (path, idf=None))]
    fn load(path: PathBuf, idf: Option<PathBuf>) -> PyResult<Self> {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| input_err(format!("cannot read {}: {e}", path.display())))?;
        let c: FingerprintConfig = serde_json::from_str(&text).map_err(|e| {
            config_err(format!(
                "{}: not a valid neardup configuration ({e}); see `neardup config` for the format",
                path.display()
            ))
        })?;
        with_overrides(c, &Overrides::default(), idf.as_deref(), path.parent())
    }

    /// The configuration as JSON (the same text `neardup config` prints).
    fn to_json(&self) -> String {
        serde_json::to_string(&self.config).expect("configuration serialises")
    }

    /// A configuration from JSON (e.g. `neardup config` output or an
    /// index's); ``idf``: the IDF table file, if the configuration names one
    /// (else the path it names is read).
    #[staticmethod]
    #[pyo3(signature = (text, idf=None))]
    fn from_json(text: &str, idf: Option<PathBuf>) -> PyResult<Self> {
        let c: FingerprintConfig = serde_json::from_str(text).map_err(config_err)?;
        with_overrides(c, &Overrides::default(), idf.as_deref(), None)
    }

    /// The IDF table's file, if the configuration uses one.
    #[getter]
    fn idf(&self) -> Option<String> {
        self.idf_path.as_ref().map(|p| p.display().to_string())
    }

    /// Saves the configuration as JSON (atomically), naming its IDF table,
    /// if any, relative to the file's folder: the two move together.
    fn save(&self, path: PathBuf) -> PyResult<()> {
        let mut c = self.config.clone();
        if let (Some(r), Some(table)) = (c.idf.as_mut(), &self.idf_path) {
            let folder = path
                .parent()
                .filter(|f| !f.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            r.path = Some(relative_to(table, folder).display().to_string());
        }
        let mut json = serde_json::to_string_pretty(&c).expect("configuration serialises");
        json.push('\n');
        neardup_core::output::write_atomic(&path, json.as_bytes()).map_err(err)
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
