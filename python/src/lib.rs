//! `neardup._neardup`: the Rust core for Python. The public, documented API is
//! the `neardup` package (python/neardup/__init__.py), which wraps this.

use std::path::Path;

mod spark;

use pyo3::exceptions::{PyIOError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyBytes, PyList, PyTuple};
use rayon::prelude::*;

use neardup_core::dedup::{Dedup, Policy, clusters};
use neardup_core::index::{AnyIndex, Bits, Bundle, IdRef, IdTable, TableDesign, plan, plan_join};
use neardup_core::jaccard::{shingles_for, verified_jaccard};
use neardup_core::sketch::Sketch;
use neardup_core::{
    Features, Fingerprint, FingerprintConfig, HashFunction, Input, Profile, SimHasher, Tokenizer,
    Weights, Width,
};

pyo3::create_exception!(
    neardup,
    NeardupError,
    pyo3::exceptions::PyValueError,
    "An error from neardup's Rust core; the message says what to do."
);

fn err(e: impl std::fmt::Display) -> PyErr {
    NeardupError::new_err(e.to_string())
}

/// A fingerprint configuration and its ready hasher.
#[pyclass(name = "FingerprintConfig", module = "neardup", frozen)]
struct PyConfig {
    config: FingerprintConfig,
    hasher: SimHasher,
}

impl PyConfig {
    fn from_config(config: FingerprintConfig) -> PyResult<Self> {
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

fn fp_to_int(fp: Fingerprint) -> u128 {
    fp.value()
}

/// The fingerprint of one text, as an int.
#[pyfunction]
fn fingerprint(py: Python<'_>, config: &PyConfig, text: PyBackedStr) -> u128 {
    if text.len() > 1 << 16 {
        py.detach(|| fp_to_int(config.hasher.fingerprint(&text)))
    } else {
        fp_to_int(config.hasher.fingerprint(&text))
    }
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

/// Fingerprints of many texts, in parallel with the GIL released; the words
/// as little-endian bytes.
#[pyfunction]
#[pyo3(signature = (config, texts, threads=None))]
fn fingerprints_list<'py>(
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

fn bytemuck_bytes(words: &[u64]) -> &[u8] {
    bytemuck::cast_slice(words)
}

/// Fingerprints of an Arrow string array given by its buffers: offsets (i32,
/// or i64 when `large`), the UTF-8 data, the array's offset and length, and
/// the validity bitmap (nulls fingerprint as empty texts).
#[pyfunction]
#[pyo3(signature = (config, offsets, data, offset, length, large, validity=None, threads=None))]
#[allow(clippy::too_many_arguments)]
fn fingerprints_arrow<'py>(
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
    let at = |i: usize| -> Option<usize> {
        if large {
            let b = offsets.get(i * 8..i * 8 + 8)?;
            usize::try_from(i64::from_le_bytes(b.try_into().ok()?)).ok()
        } else {
            let b = offsets.get(i * 4..i * 4 + 4)?;
            usize::try_from(i32::from_le_bytes(b.try_into().ok()?)).ok()
        }
    };
    let mut spans = Vec::with_capacity(length);
    for i in offset..offset + length {
        let valid = validity.is_none_or(|v| v.get(i / 8).is_some_and(|b| b >> (i % 8) & 1 == 1));
        let (s, e) = (
            at(i).ok_or_else(|| err("arrow offsets are shorter than the array"))?,
            at(i + 1).ok_or_else(|| err("arrow offsets are shorter than the array"))?,
        );
        if s > e || e > data.len() {
            return Err(err("arrow offsets point outside the data buffer"));
        }
        spans.push(if valid { (s, e) } else { (0, 0) });
    }
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

/// The verification features of each text (sorted 64-bit shingle hashes)
/// after the configuration's normalisation, each as little-endian bytes.
#[pyfunction]
fn shingle_sets<'py>(
    py: Python<'py>,
    config: &PyConfig,
    texts: Vec<PyBackedStr>,
) -> Vec<Bound<'py, PyBytes>> {
    let normalize = config.config.normalize;
    let sets: Vec<Vec<u64>> = py.detach(|| {
        texts
            .par_iter()
            .map(|t| shingles_for(t, &normalize))
            .collect()
    });
    sets.iter()
        .map(|s| PyBytes::new(py, bytemuck_bytes(s)))
        .collect()
}

fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// Jaccard similarity of pairs of feature sets given as bytes.
#[pyfunction]
fn jaccard_pairs(py: Python<'_>, a: Vec<Vec<u8>>, b: Vec<Vec<u8>>) -> PyResult<Vec<f64>> {
    if a.len() != b.len() {
        return Err(err("jaccard_pairs: the two lists differ in length"));
    }
    Ok(py.detach(|| {
        a.par_iter()
            .zip(b.par_iter())
            .map(|(x, y)| verified_jaccard(&u64s(x), &u64s(y)))
            .collect()
    }))
}

// ---------------------------------------------------------------- index ---

/// Core's [`Bundle`] (tables of either width and kind, ids, configuration),
/// plus what only the Python package keeps.
#[pyclass(name = "_Index", module = "neardup")]
struct PyIndex {
    bundle: Bundle,
    /// Verification sketches by entry, for entries added with their text
    /// (not kept in index files).
    sketches: Vec<Option<Sketch>>,
}

fn words_to<B: Bits>(data: &[u8]) -> PyResult<Vec<B>> {
    let w = u64s(data);
    Ok(match B::BITS {
        64 => w.into_iter().map(|x| B::from_u128(x as u128)).collect(),
        _ => {
            if !w.len().is_multiple_of(2) {
                return Err(err("128-bit fingerprints come as (high, low) pairs"));
            }
            w.chunks_exact(2)
                .map(|p| B::from_u128(((p[0] as u128) << 64) | p[1] as u128))
                .collect()
        }
    })
}

fn id_to_py(py: Python<'_>, id: Option<IdRef<'_>>) -> PyResult<Py<PyAny>> {
    match id {
        Some(IdRef::Int(n)) => Ok(n.into_pyobject(py)?.into_any().unbind()),
        Some(IdRef::Json(b)) => match serde_json::from_slice(b).map_err(err)? {
            serde_json::Value::String(s) => Ok(s.into_pyobject(py)?.into_any().unbind()),
            serde_json::Value::Number(n) if n.is_i64() => Ok(n
                .as_i64()
                .expect("i64")
                .into_pyobject(py)?
                .into_any()
                .unbind()),
            other => Err(err(format!("unexpected id {other} in the index"))),
        },
        None => Ok(py.None()),
    }
}

fn push_py_id(ids: &mut IdTable, id: &Bound<'_, PyAny>) -> PyResult<()> {
    if let Ok(n) = id.extract::<i64>() {
        ids.push_int(n);
    } else if let Ok(s) = id.extract::<String>() {
        ids.push_json(serde_json::to_string(&s).expect("a string").as_bytes());
    } else {
        return Err(err("ids are ints or strs"));
    }
    Ok(())
}

/// Fingerprints from words as bytes (`words_to`), in the index's width.
fn fingerprints_of(data: &[u8], width: Width) -> PyResult<Vec<Fingerprint>> {
    Ok(match width {
        Width::W64 => words_to::<u64>(data)?
            .into_iter()
            .map(Fingerprint::from_u64)
            .collect(),
        Width::W128 => words_to::<u128>(data)?
            .into_iter()
            .map(|w| Fingerprint::new(w, Width::W128))
            .collect(),
    })
}

fn matches_to_py(
    py: Python<'_>,
    ids: &IdTable,
    ms: &[neardup_core::Match],
) -> PyResult<Py<PyList>> {
    let items: PyResult<Vec<Bound<'_, PyTuple>>> = ms
        .iter()
        .map(|m| {
            let id = id_to_py(py, ids.get(m.id))?;
            PyTuple::new(py, [id, m.distance.into_pyobject(py)?.into_any().unbind()])
        })
        .collect();
    Ok(PyList::new(py, items?)?.unbind())
}

impl PyIndex {
    /// The normalisation of the index's configuration, which verification
    /// features share.
    fn normalize(&self) -> PyResult<neardup_core::NormalizeConfig> {
        self.bundle
            .config
            .as_ref()
            .map(|c| c.normalize)
            .ok_or_else(|| err("this index has no configuration: give config= to compare texts"))
    }

    /// `fp` as a fingerprint of the index's width.
    fn fingerprint(&self, fp: u128) -> PyResult<Fingerprint> {
        let width = self.bundle.index.width();
        if fp & !width.mask() != 0 {
            return Err(err(format!(
                "a {}-bit index takes {}-bit fingerprints",
                width.bits(),
                width.bits()
            )));
        }
        Ok(Fingerprint::new(fp, width))
    }
}

#[pymethods]
impl PyIndex {
    /// Builds an index of `data` (fingerprint words as bytes) with `ids`
    /// (a list of ints or strs, or None for 0..n).
    #[staticmethod]
    #[pyo3(signature = (data, bits, k, ids=None, config=None, design=None))]
    fn build(
        py: Python<'_>,
        data: &[u8],
        bits: u32,
        k: u32,
        ids: Option<&Bound<'_, PyList>>,
        config: Option<&PyConfig>,
        design: Option<&str>,
    ) -> PyResult<Self> {
        let n = data.len() / (bits as usize / 8);
        let design: TableDesign = match design {
            Some(json) => serde_json::from_str(json).map_err(err)?,
            None => {
                let p = plan(bits, k, n.max(1) as f64, None).map_err(err)?;
                p.options[p.chosen].design.clone()
            }
        };
        let mut table = IdTable::default();
        match ids {
            Some(list) => {
                if list.len() != n {
                    return Err(err(format!("{} ids for {n} fingerprints", list.len())));
                }
                for id in list.iter() {
                    push_py_id(&mut table, &id)?;
                }
            }
            None => (0..n as i64).for_each(|i| table.push_int(i)),
        }
        let width = Width::from_bits(bits).map_err(err)?;
        let fps = fingerprints_of(data, width)?;
        let index = py
            .detach(|| {
                AnyIndex::build(
                    design,
                    fps.into_iter().enumerate().map(|(i, f)| (i as u64, f)),
                )
            })
            .map_err(err)?;
        Ok(PyIndex {
            bundle: Bundle {
                index,
                ids: table,
                config: config.map(|c| c.config.clone()),
            },
            sketches: Vec::new(),
        })
    }

    /// Opens an index file (as `neardup index build` writes, plain or
    /// compressed), memory-mapped.
    #[staticmethod]
    fn load(path: &str) -> PyResult<Self> {
        let bundle = Bundle::open(Path::new(path)).map_err(|e| match e {
            neardup_core::Error::Io(io) => PyIOError::new_err(io.to_string()),
            e => err(format!("{path}: {e}")),
        })?;
        Ok(PyIndex {
            bundle,
            sketches: Vec::new(),
        })
    }

    /// Writes the index file atomically (a synced temporary file, then rename).
    fn save(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        py.detach(|| self.bundle.save(Path::new(path)))
            .map(drop)
            .map_err(|e| match e {
                neardup_core::Error::Io(io) => PyIOError::new_err(format!("{path}: {io}")),
                e => err(format!("{path}: {e}")),
            })
    }

    #[getter]
    fn bits(&self) -> u32 {
        self.bundle.index.width().bits()
    }

    #[getter]
    fn k(&self) -> u32 {
        self.bundle.index.design().k
    }

    #[getter]
    fn compressed(&self) -> bool {
        self.bundle.index.is_compressed()
    }

    #[getter]
    fn config(&self) -> PyResult<Option<PyConfig>> {
        self.bundle
            .config
            .clone()
            .map(PyConfig::from_config)
            .transpose()
    }

    fn __len__(&self) -> usize {
        self.bundle.index.len()
    }

    /// Matches of one fingerprint: [(id, distance)], nearest first.
    fn query(&self, py: Python<'_>, fp: u128, k: u32) -> PyResult<Py<PyList>> {
        let ms = self
            .bundle
            .index
            .query(self.fingerprint(fp)?, k)
            .map_err(err)?;
        matches_to_py(py, &self.bundle.ids, &ms)
    }

    /// Matches of many fingerprints (words as bytes), in parallel.
    fn query_batch(&self, py: Python<'_>, data: &[u8], k: u32) -> PyResult<Vec<Py<PyList>>> {
        let fps = fingerprints_of(data, self.bundle.index.width())?;
        let all = py
            .detach(|| self.bundle.index.query_batch(&fps, k))
            .map_err(err)?;
        all.iter()
            .map(|ms| matches_to_py(py, &self.bundle.ids, ms))
            .collect()
    }

    fn add(&mut self, id: &Bound<'_, PyAny>, fp: u128) -> PyResult<()> {
        let entry = self.bundle.ids.len() as u64;
        let fp = self.fingerprint(fp)?;
        self.bundle.index.add(entry, fp).map_err(err)?;
        push_py_id(&mut self.bundle.ids, id)
    }

    /// Keeps the verification sketch of every entry's text (texts in entry
    /// order, as the index was built).
    fn set_sketches(&mut self, py: Python<'_>, texts: Vec<PyBackedStr>) -> PyResult<()> {
        if texts.len() != self.bundle.ids.len() {
            return Err(err(format!(
                "{} texts for {} entries",
                texts.len(),
                self.bundle.ids.len()
            )));
        }
        let normalize = self.normalize()?;
        let texts: Vec<&str> = texts.iter().map(|t| &**t).collect();
        self.sketches = py.detach(|| {
            texts
                .par_iter()
                .map(|t| Some(Sketch::of(&shingles_for(t, &normalize))))
                .collect()
        });
        Ok(())
    }

    /// Keeps the sketch of the text of the entry added last.
    fn add_sketch(&mut self, text: &str) -> PyResult<()> {
        let normalize = self.normalize()?;
        let entry = self.bundle.ids.len() - 1;
        self.sketches.resize(entry, None);
        self.sketches
            .push(Some(Sketch::of(&shingles_for(text, &normalize))));
        Ok(())
    }

    /// Matches of a text's fingerprint whose estimated Jaccard similarity to
    /// the text reaches `threshold`: [(id, distance, similarity)], nearest
    /// first; an entry added without its text is kept by distance alone, with
    /// similarity None.
    fn query_verified(
        &self,
        py: Python<'_>,
        fp: u128,
        text: &str,
        k: u32,
        threshold: f64,
    ) -> PyResult<Py<PyList>> {
        if self.sketches.iter().all(Option::is_none) {
            return Err(err(
                "this index holds no verification sketches (loaded from a file, or built from \
                 fingerprints): build it with Index.build(texts=..., config=...) to verify",
            ));
        }
        let ms = self
            .bundle
            .index
            .query(self.fingerprint(fp)?, k)
            .map_err(err)?;
        let q = Sketch::of(&shingles_for(text, &self.normalize()?));
        let mut items: Vec<Bound<'_, PyTuple>> = Vec::new();
        for m in &ms {
            let similarity = match self.sketches.get(m.id as usize).and_then(Option::as_ref) {
                Some(s) => {
                    let j = q.jaccard(s);
                    if j < threshold {
                        continue;
                    }
                    Some(j)
                }
                None => None,
            };
            items.push(PyTuple::new(
                py,
                [
                    id_to_py(py, self.bundle.ids.get(m.id))?,
                    m.distance.into_pyobject(py)?.into_any().unbind(),
                    similarity.into_pyobject(py)?.into_any().unbind(),
                ],
            )?);
        }
        Ok(PyList::new(py, items)?.unbind())
    }

    /// Deletes every entry whose id is in `ids`; returns how many.
    fn delete(&mut self, ids: &Bound<'_, PyList>) -> PyResult<usize> {
        // Every id as its JSON text, the form both kinds of table can give.
        let mut wanted = std::collections::HashSet::new();
        for id in ids.iter() {
            if let Ok(n) = id.extract::<i64>() {
                wanted.insert(n.to_string().into_bytes());
            } else if let Ok(s) = id.extract::<String>() {
                wanted.insert(serde_json::to_string(&s).expect("a string").into_bytes());
            }
        }
        let table = &self.bundle.ids;
        let remove = |entry: u64| match table.get(entry) {
            Some(IdRef::Int(n)) => wanted.contains(n.to_string().as_bytes()),
            Some(IdRef::Json(b)) => wanted.contains(b),
            None => false,
        };
        self.bundle.index.delete(remove).map_err(err)
    }

    /// Every pair within k: [(id_a, id_b, distance)].
    fn self_join(&self, py: Python<'_>, k: u32) -> PyResult<Py<PyList>> {
        let index = &self.bundle.index;
        let pairs = py.detach(|| index.self_join(k)).map_err(err)?;
        let items: PyResult<Vec<Bound<'_, PyTuple>>> = pairs
            .iter()
            .map(|&(a, b, d)| {
                PyTuple::new(
                    py,
                    [
                        id_to_py(py, self.bundle.ids.get(a))?,
                        id_to_py(py, self.bundle.ids.get(b))?,
                        d.into_pyobject(py)?.into_any().unbind(),
                    ],
                )
            })
            .collect();
        Ok(PyList::new(py, items?)?.unbind())
    }
}

// ---------------------------------------------------------------- dedup ---

/// Batch dedup of fingerprints (and optionally feature sets): pairs as
/// (a, b, distance, jaccard or -1) over positions, and each position's
/// representative.
#[pyfunction]
#[pyo3(signature = (data, bits, k, policy, threshold=None, sets=None))]
#[allow(clippy::type_complexity)]
fn dedup_positions(
    py: Python<'_>,
    data: &[u8],
    bits: u32,
    k: u32,
    policy: &str,
    threshold: Option<f64>,
    sets: Option<Vec<Vec<u8>>>,
) -> PyResult<(Vec<(u32, u32, u32, f64)>, Vec<u32>)> {
    let policy = parse_policy(policy)?;
    let sets: Option<Vec<Vec<u64>>> = sets.map(|s| s.iter().map(|b| u64s(b)).collect());
    fn run<B: Bits>(
        fps: Vec<B>,
        k: u32,
        policy: Policy,
        verify: Option<(f64, &[Vec<u64>])>,
    ) -> Result<(Vec<(u32, u32, u32, f64)>, Vec<u32>), neardup_core::Error> {
        let design = plan_join(B::BITS, k, fps.len().max(1) as f64)?;
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
        Ok((pairs, d.representatives(policy)))
    }
    let verify = match (threshold, &sets) {
        (Some(t), Some(s)) => Some((t, s.as_slice())),
        (None, _) => None,
        (Some(_), None) => return Err(err("verification needs the feature sets")),
    };
    let out = match bits {
        64 => {
            let fps = words_to::<u64>(data)?;
            py.detach(|| run(fps, k, policy, verify))
        }
        128 => {
            let fps = words_to::<u128>(data)?;
            py.detach(|| run(fps, k, policy, verify))
        }
        b => return Err(err(format!("fingerprint width {b}: use 64 or 128"))),
    };
    out.map_err(err)
}

/// Row-major vectors as single precision: `data` holds float32 entries, or
/// float64 when `f64`, `dim` per row.
fn vector_rows(data: &[u8], dim: usize, f64: bool) -> PyResult<Vec<f32>> {
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

/// The configuration of dense vectors of `dim` dimensions (or any).
#[pyfunction]
#[pyo3(signature = (bits=64, dim=None, seed=0))]
fn vector_config(bits: u32, dim: Option<usize>, seed: u64) -> PyResult<PyConfig> {
    let width = Width::from_bits(bits).map_err(err)?;
    PyConfig::from_config(FingerprintConfig::vectors(width, dim, seed))
}

/// The configuration of weighted features (`feature -> weight`).
#[pyfunction]
#[pyo3(signature = (bits=64, hash="xxh3", seed=0))]
fn features_config(bits: u32, hash: &str, seed: u64) -> PyResult<PyConfig> {
    let width = Width::from_bits(bits).map_err(err)?;
    let hash: HashFunction = hash.parse().map_err(err)?;
    PyConfig::from_config(FingerprintConfig::weighted_features(width, hash, seed))
}

/// Fingerprints of row-major vectors (`first` is the first row's number, for
/// messages), in parallel with the GIL released; the words as little-endian
/// bytes. A row that is not finite or all zeros is an error naming it.
#[pyfunction]
#[pyo3(signature = (config, data, dim, f64=false, first=0, threads=None))]
fn fingerprints_vectors<'py>(
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
fn fingerprint_input(config: &PyConfig, doc: &Bound<'_, PyAny>) -> PyResult<u128> {
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

/// Batch dedup of fingerprints verified by the exact cosine similarity of
/// their row-major float32 vectors: pairs as (a, b, distance, cosine) over
/// positions, and each position's representative.
#[pyfunction]
#[pyo3(signature = (data, bits, k, policy, threshold, vectors, dim))]
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn dedup_vectors(
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
        let design = plan_join(B::BITS, k, fps.len().max(1) as f64)?;
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
    let out = match bits {
        64 => {
            let fps = words_to::<u64>(data)?;
            if fps.len() * dim != rows.len() {
                return Err(err("one vector per fingerprint is needed"));
            }
            py.detach(|| run(fps, k, policy, threshold, &rows, dim))
        }
        128 => {
            let fps = words_to::<u128>(data)?;
            if fps.len() * dim != rows.len() {
                return Err(err("one vector per fingerprint is needed"));
            }
            py.detach(|| run(fps, k, policy, threshold, &rows, dim))
        }
        b => return Err(err(format!("fingerprint width {b}: use 64 or 128"))),
    };
    out.map_err(err)
}

/// The cosine similarity of each pair of vectors (float32 little-endian bytes).
#[pyfunction]
fn cosine_pairs(py: Python<'_>, a: Vec<Vec<u8>>, b: Vec<Vec<u8>>) -> PyResult<Vec<f64>> {
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

/// The smallest k at which pairs of cosine similarity `cos` are within k
/// with probability `recall` (capped at bits / 8), and the probability then.
#[pyfunction]
fn vector_k(bits: u32, cos: f64, recall: f64) -> (u32, f64) {
    let max = bits / 8;
    let k = neardup_core::vector::k_for_recall(bits, cos, recall, max).unwrap_or(max);
    (k, neardup_core::vector::recall_at(bits, k, cos))
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

/// Cluster lists from representatives: [(representative, [members])].
#[pyfunction]
fn clusters_of(reps: Vec<u32>) -> Vec<(u32, Vec<u32>)> {
    clusters(&reps)
}

/// The default candidate distance of a dedup (as `neardup dedup`).
#[pyfunction]
fn default_k(bits: u32, verify: bool) -> PyResult<u32> {
    Ok(neardup_core::dedup::default_k(
        Width::from_bits(bits).map_err(err)?,
        verify,
    ))
}

/// The candidate configuration used with verification (as `neardup dedup`).
#[pyfunction]
fn candidate_config() -> PyResult<PyConfig> {
    PyConfig::from_config(FingerprintConfig::candidates())
}

// ---------------------------------------------------------------- spark ---

/// The join design for n fingerprints at k, as JSON.
#[pyfunction]
fn join_design(bits: u32, k: u32, n: f64) -> PyResult<String> {
    let d = plan_join(bits, k, n.max(1.0)).map_err(err)?;
    Ok(serde_json::to_string(&d).expect("design serialises"))
}

/// One key per design table for each fingerprint: (table, key high, key low)
/// words for row i at 3i..3i+3, as bytes.
#[pyfunction]
fn table_keys<'py>(
    py: Python<'py>,
    design: &str,
    data: &[u8],
    bits: u32,
) -> PyResult<Bound<'py, PyBytes>> {
    let d: TableDesign = serde_json::from_str(design).map_err(err)?;
    fn keys<B: Bits>(d: &TableDesign, fps: &[B]) -> Vec<u64> {
        let masks: Vec<B> = d.tables.iter().map(|t| t.prefix_mask::<B>()).collect();
        let mut out = Vec::with_capacity(fps.len() * d.tables.len() * 3);
        for &f in fps {
            for (t, m) in masks.iter().enumerate() {
                let key = f.and(*m).to_u128();
                out.extend([t as u64, (key >> 64) as u64, key as u64]);
            }
        }
        out
    }
    let words = match bits {
        64 => keys(&d, &words_to::<u64>(data)?),
        _ => keys(&d, &words_to::<u128>(data)?),
    };
    Ok(PyBytes::new(py, bytemuck_bytes(&words)))
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
/// group is split into block pairs, each its own group). A pair is kept when
/// within k and `table` is the first table where both share the prefix, so
/// each pair comes out of exactly one group. Returns (pos a, pos b, distance)
/// rows as i64 bytes, a < b.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn sorted_group_pairs<'py>(
    py: Python<'py>,
    design: &str,
    bits: u32,
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
    let d: TableDesign = serde_json::from_str(design).map_err(err)?;
    let cols = [
        table, key_hi, key_lo, block_i, block_j, block, pos, fp_hi, fp_lo,
    ]
    .map(i64s);
    let n = cols[0].len();
    if cols.iter().any(|c| c.len() != n) {
        return Err(err("sorted_group_pairs: columns differ in length"));
    }
    let [table, key_hi, key_lo, bi, bj, block, pos, hi, lo] = cols;
    fn run<B: Bits>(d: &TableDesign, k: u32, c: [&[i64]; 9]) -> Vec<i64> {
        let [table, key_hi, key_lo, bi, bj, block, pos, hi, lo] = c;
        let fp = |x: usize| B::from_u128(((hi[x] as u64 as u128) << 64) | lo[x] as u64 as u128);
        let masks: Vec<B> = d.tables.iter().map(|t| t.prefix_mask::<B>()).collect();
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
                    let dist = fps[x].distance(fps[y]);
                    if dist > k
                        || masks[..t.min(masks.len())]
                            .iter()
                            .any(|m| fps[x].and(*m) == fps[y].and(*m))
                    {
                        continue;
                    }
                    let (a, b) = (pos[start + x], pos[start + y]);
                    out.extend([a.min(b), a.max(b), i64::from(dist)]);
                }
            }
            start = end;
        }
        out
    }
    let c = [
        &table[..],
        &key_hi,
        &key_lo,
        &bi,
        &bj,
        &block,
        &pos,
        &hi,
        &lo,
    ];
    let out = py.detach(|| match bits {
        64 => run::<u64>(&d, k, c),
        _ => run::<u128>(&d, k, c),
    });
    Ok(PyBytes::new(py, bytemuck::cast_slice(&out)))
}

#[pymodule]
fn _neardup(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyConfig>()?;
    m.add_class::<PyIndex>()?;
    m.add("NeardupError", m.py().get_type::<NeardupError>())?;
    m.add_function(wrap_pyfunction!(fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprints_list, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprints_arrow, m)?)?;
    m.add_function(wrap_pyfunction!(shingle_sets, m)?)?;
    m.add_function(wrap_pyfunction!(jaccard_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(dedup_positions, m)?)?;
    m.add_function(wrap_pyfunction!(clusters_of, m)?)?;
    m.add_function(wrap_pyfunction!(candidate_config, m)?)?;
    m.add_function(wrap_pyfunction!(default_k, m)?)?;
    m.add_function(wrap_pyfunction!(join_design, m)?)?;
    m.add_function(wrap_pyfunction!(table_keys, m)?)?;
    m.add_function(wrap_pyfunction!(sorted_group_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(spark::spark_rows, m)?)?;
    m.add_function(wrap_pyfunction!(spark::config_with_idf, m)?)?;
    m.add_function(wrap_pyfunction!(spark::spark_join, m)?)?;
    m.add_function(wrap_pyfunction!(spark::spark_span, m)?)?;
    m.add_function(wrap_pyfunction!(spark::screen_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(spark::exact_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(spark::exact_indexed, m)?)?;
    m.add_function(wrap_pyfunction!(spark::resolve_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(vector_config, m)?)?;
    m.add_function(wrap_pyfunction!(features_config, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprints_vectors, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint_input, m)?)?;
    m.add_function(wrap_pyfunction!(dedup_vectors, m)?)?;
    m.add_function(wrap_pyfunction!(vector_k, m)?)?;
    m.add_function(wrap_pyfunction!(cosine_pairs, m)?)?;
    Ok(())
}
