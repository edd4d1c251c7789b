//! `Index`: core's [`Bundle`] (tables, ids, configuration) with the
//! verification sketches of the texts it was built from.

use std::path::Path;

use pyo3::exceptions::PyIOError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyList, PyTuple};
use rayon::prelude::*;

use neardup_core::index::{
    AnyIndex, Bits, Bundle, Coding, CompressedIndex, IdRef, IdTable, TableDesign, plan,
};
use neardup_core::jaccard::shingles_for;
use neardup_core::sketch::Sketch;
use neardup_core::{Fingerprint, Width, with_bits};

use crate::config::PyConfig;
use crate::{err, u64s};

/// Core's [`Bundle`] (tables of either width and kind, ids, configuration),
/// plus what only the Python package keeps.
#[pyclass(name = "_Index", module = "neardup")]
pub(crate) struct PyIndex {
    pub(crate) bundle: Bundle,
    /// Verification sketches by entry, for entries added with their text
    /// (not kept in index files).
    pub(crate) sketches: Vec<Option<Sketch>>,
}

pub(crate) fn words_to<B: Bits>(data: &[u8]) -> PyResult<Vec<B>> {
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

pub(crate) fn id_to_py(py: Python<'_>, id: Option<IdRef<'_>>) -> PyResult<Py<PyAny>> {
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

pub(crate) fn push_py_id(ids: &mut IdTable, id: &Bound<'_, PyAny>) -> PyResult<()> {
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
pub(crate) fn fingerprints_of(data: &[u8], width: Width) -> PyResult<Vec<Fingerprint>> {
    Ok(with_bits!(width, B => words_to::<B>(data)?
        .into_iter()
        .map(|w| Fingerprint::new(w.to_u128(), width))
        .collect()))
}

pub(crate) fn matches_to_py(
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
    #[pyo3(signature = (data, bits, k, ids=None, config=None, design=None, compressed=false, coding="elias-fano", block_bytes=1024))]
    #[allow(clippy::too_many_arguments)]
    fn build(
        py: Python<'_>,
        data: &[u8],
        bits: u32,
        k: u32,
        ids: Option<&Bound<'_, PyList>>,
        config: Option<&PyConfig>,
        design: Option<&str>,
        compressed: bool,
        coding: &str,
        block_bytes: usize,
    ) -> PyResult<Self> {
        let coding = match coding {
            "elias-fano" => Coding::EliasFano,
            "gaps" => Coding::Gaps,
            c => {
                return Err(crate::config_err(format!(
                    "coding={c:?}: use 'elias-fano' or 'gaps'"
                )));
            }
        };
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
        let entries = fps.into_iter().enumerate().map(|(i, f)| (i as u64, f));
        let index = py
            .detach(|| match (compressed, width) {
                (false, _) => AnyIndex::build(design, entries),
                // Compressed tables (`neardup index build --compressed`):
                // read-only, queried in place.
                (true, Width::W64) => Ok(AnyIndex::Compressed64(CompressedIndex::build(
                    design,
                    entries.map(|(i, f)| (i, f.value() as u64)),
                    block_bytes,
                    coding,
                )?)),
                (true, Width::W128) => Ok(AnyIndex::Compressed128(CompressedIndex::build(
                    design,
                    entries.map(|(i, f)| (i, f.value())),
                    block_bytes,
                    coding,
                )?)),
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
        // An id already in the index is replaced, as the service replaces it.
        let fp = self.fingerprint(fp)?;
        self.delete(&PyList::new(id.py(), [id])?)?;
        let entry = self.bundle.ids.len() as u64;
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
