//! The vectors `dedup` verifies candidates with: only those of documents that
//! have candidates, read again from the inputs after the join (or kept from
//! the first pass for standard input, which cannot be read twice).

use anyhow::{Result, bail};

use crate::input::Body;
use crate::run::for_each_batch;
use crate::source::SourceArgs;

/// The vectors verification reads: `slot[doc]` into `data`, `dim` entries each.
pub struct VectorStore {
    dim: usize,
    slot: Vec<u32>,
    data: Vec<f32>,
}

impl VectorStore {
    /// An empty store for `documents` documents.
    pub fn new(documents: usize) -> VectorStore {
        VectorStore {
            dim: 0,
            slot: vec![u32::MAX; documents],
            data: Vec::new(),
        }
    }

    /// Keeps `vector` as document `doc`'s.
    pub fn insert(&mut self, doc: usize, vector: &[f32]) {
        if doc >= self.slot.len() {
            self.slot.resize(doc + 1, u32::MAX);
        }
        self.dim = vector.len();
        self.slot[doc] = (self.data.len() / self.dim.max(1)) as u32;
        self.data.extend_from_slice(vector);
    }

    pub fn get(&self, doc: u32) -> &[f32] {
        let s = self.slot[doc as usize] as usize;
        &self.data[s * self.dim..(s + 1) * self.dim]
    }

    pub fn digest(&self, doc: u32) -> u128 {
        neardup_core::vector::digest(self.get(doc))
    }

    /// Reads the inputs again, keeping the vectors of `wanted` (sorted).
    pub fn read(source: &SourceArgs, wanted: &[u32], documents: usize) -> Result<VectorStore> {
        let mut store = VectorStore::new(documents);
        let mut input = source.input.clone();
        crate::pipeline_args::hasher_for(&source.pipeline, &mut input)?;
        let mut next = wanted.iter().peekable();
        let mut doc = 0usize;
        for_each_batch(
            &input,
            false,
            true,
            |_| (),
            |docs, _| {
                for d in docs {
                    if next.peek().is_some_and(|&&w| w as usize == doc) {
                        next.next();
                        if let Body::Vector(v) = &d.body {
                            store.insert(doc, v);
                        }
                    }
                    doc += 1;
                }
                Ok(())
            },
        )?;
        if doc != documents {
            bail!(
                "the input changed while it was being deduplicated ({documents} records, then {doc})"
            );
        }
        Ok(store)
    }
}
