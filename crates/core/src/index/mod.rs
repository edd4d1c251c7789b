//! Exact Hamming search: the permuted-table index of Manku, Jain & Das Sarma §3.
//!
//! [`Index`] answers "every stored fingerprint within k bits of this one", online
//! and in batches, and takes additions and deletions after it is built.
//! [`self_join`] finds every pair within k in one set, each pair once.

pub mod bits;
pub mod bundle;
pub mod compressed;
pub mod design;
mod file;
pub mod ids;
mod join;
pub mod mem;
mod multi;
mod near;
mod online;
mod pigeonhole;
mod plan;
pub mod radius;
pub(crate) mod radix;
mod self_join;
pub mod slab;
pub(crate) mod table;

use rayon::prelude::*;

pub use bits::Bits;
pub use bundle::{AnyIndex, Bundle};
pub use compressed::{Coding, CompressedIndex};
pub use design::{Segment, Table, TableDesign};
pub use file::IndexFile;
pub use ids::{IdRef, IdTable};
pub use join::{
    Collapsed, JoinScratch, join_sorted_unique, join_sorted_unique_each, join_sorted_unique_with,
    self_join,
};
pub use multi::{MultiIndex, QueryWork};
pub use online::OnlineIndex;
pub use pigeonhole::Pigeonhole;
pub use plan::{
    ONLINE_BYTES_PER_DOCUMENT, ONLINE_MIN_SAMPLE, OnlineDesign, OnlineOption, OnlinePlan, Plan,
    PlanOption, join_max_k, plan, plan_join, plan_join_for, plan_join_sampled, plan_online,
};
pub use radius::{Block, RadiusDesign};
pub use self_join::{JoinDesign, SelfJoin};
pub use slab::{SharedBytes, Slab};
pub use table::SortedTable;

use crate::error::Error;

/// A stored fingerprint within the query's distance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Match {
    /// Distance to the query.
    pub distance: u32,
    /// The stored item's id.
    pub id: u64,
}

/// An in-memory index of `(id, fingerprint)` entries. Several ids may share a
/// fingerprint; all are kept and all are returned.
#[derive(Clone, Debug)]
pub struct Index<B: Bits> {
    design: TableDesign,
    fps: Slab<B>,
    ids: Slab<u64>,
    /// Tables over items `0..indexed`; later items are scanned linearly until
    /// the next merge.
    tables: Vec<SortedTable<B>>,
    indexed: usize,
    deleted: Vec<bool>,
    deleted_count: usize,
}

impl<B: Bits> Index<B> {
    /// Builds the tables of `design` over `entries`.
    pub fn build(
        design: TableDesign,
        entries: impl IntoIterator<Item = (u64, B)>,
    ) -> Result<Self, Error> {
        if design.bits != B::BITS {
            return Err(Error::WidthMismatch {
                expected: design.bits,
                got: B::BITS,
            });
        }
        let (ids, fps): (Vec<u64>, Vec<B>) = entries.into_iter().unzip();
        if fps.len() >= u32::MAX as usize {
            return Err(Error::Full(
                "an index holds fewer than 4,294,967,295 fingerprints: split the collection".into(),
            ));
        }
        let mut index = Index {
            deleted: vec![false; fps.len()],
            design,
            fps: fps.into(),
            ids: ids.into(),
            tables: Vec::new(),
            indexed: 0,
            deleted_count: 0,
        };
        index.rebuild_tables();
        Ok(index)
    }

    fn rebuild_tables(&mut self) {
        let fps = &self.fps;
        let per_thread = self
            .design
            .tables
            .len()
            .div_ceil(rayon::current_num_threads().max(1));
        self.tables = self
            .design
            .tables
            .par_chunks(per_thread.max(1))
            .flat_map_iter(|chunk| {
                let (mut entries, mut tmp) = (Vec::new(), Vec::new());
                chunk
                    .iter()
                    .map(|t| SortedTable::build_with(t, fps, &mut entries, &mut tmp))
                    .collect::<Vec<_>>()
            })
            .collect();
        self.indexed = self.fps.len();
    }

    /// The design.
    pub fn design(&self) -> &TableDesign {
        &self.design
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.fps.len() - self.deleted_count
    }

    /// Whether no live entry is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory held by the tables and entries.
    pub fn memory(&self) -> usize {
        self.tables.iter().map(SortedTable::memory).sum::<usize>()
            + self.fps.len() * (std::mem::size_of::<B>() + 8 + 1)
    }

    /// Live entries, in storage order.
    pub fn entries(&self) -> impl Iterator<Item = (u64, B)> + '_ {
        (0..self.fps.len())
            .filter(|&i| !self.deleted[i])
            .map(|i| (self.ids[i], self.fps[i]))
    }

    /// Every live entry within `k` of `query`, each once, nearest first (ties by id).
    pub fn query(&self, query: B, k: u32) -> Result<Vec<Match>, Error> {
        self.design.check_k(k)?;
        let mut found = Vec::new();
        self.query_into(query, k, &mut found);
        Ok(self.finish(found))
    }

    /// [`Index::query`] with its work bounded whatever the data: at most
    /// `scan` entries of each table's bucket (and of the entries not yet in
    /// the tables) are examined, and the tables are no longer probed once
    /// `enough` matches are in hand. `true` with the matches when either
    /// bound cut the search short (a match may then be missing); the matches
    /// are those examined, nearest first (ties by id).
    pub fn query_capped(
        &self,
        query: B,
        k: u32,
        scan: usize,
        enough: usize,
    ) -> Result<(Vec<Match>, bool), Error> {
        const CHUNK: usize = 256;
        self.design.check_k(k)?;
        let mut found = Vec::new();
        let mut capped = false;
        'tables: for t in &self.tables {
            let key = t.table.permute(query);
            let r = t.bucket(key);
            capped |= r.len() > scan;
            let end = r.start + r.len().min(scan);
            let mut at = r.start;
            while at < end {
                let next = (at + CHUNK).min(end);
                t.probe(key, at..next, k, &mut found);
                at = next;
                if found.len() >= enough {
                    capped = true;
                    break 'tables;
                }
            }
        }
        if !capped || found.len() < enough {
            let tail = self.indexed..self.fps.len();
            capped |= tail.len() > scan;
            for item in tail.take(scan) {
                let d = self.fps[item].distance(query);
                if d <= k {
                    found.push((item as u32, d));
                }
            }
        }
        Ok((self.finish(found), capped))
    }

    fn query_into(&self, query: B, k: u32, found: &mut Vec<(u32, u32)>) {
        // Touch every table's directory first, then the buckets, so that the
        // tables' cache misses overlap instead of queueing. Each table's key and
        // bucket are computed once.
        const MAX: usize = 64;
        if self.tables.len() <= MAX {
            let mut keys = [B::zero(); MAX];
            let mut buckets = [(0usize, 0usize); MAX];
            for (t, key) in self.tables.iter().zip(keys.iter_mut()) {
                *key = t.table.permute(query);
                t.prefetch_dir(*key);
            }
            for ((t, &key), bucket) in self.tables.iter().zip(&keys).zip(buckets.iter_mut()) {
                let r = t.bucket(key);
                t.prefetch_keys(&r);
                *bucket = (r.start, r.end);
            }
            for ((t, &key), &(lo, hi)) in self.tables.iter().zip(&keys).zip(&buckets) {
                t.probe(key, lo..hi, k, found);
            }
        } else {
            for t in &self.tables {
                let key = t.table.permute(query);
                t.probe(key, t.bucket(key), k, found);
            }
        }
        for item in self.indexed..self.fps.len() {
            let d = self.fps[item].distance(query);
            if d <= k {
                found.push((item as u32, d));
            }
        }
    }

    fn finish(&self, mut found: Vec<(u32, u32)>) -> Vec<Match> {
        found.sort_unstable();
        found.dedup();
        // `get`: an item number from a damaged file is skipped, never a panic.
        let mut out: Vec<Match> = found
            .into_iter()
            .filter(|&(item, _)| self.deleted.get(item as usize) == Some(&false))
            .filter_map(|(item, distance)| {
                self.ids
                    .get(item as usize)
                    .map(|&id| Match { distance, id })
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// [`Index::query`] for many queries, in parallel; answers in query order.
    pub fn query_batch(&self, queries: &[B], k: u32) -> Result<Vec<Vec<Match>>, Error> {
        self.design.check_k(k)?;
        Ok(queries
            .par_iter()
            .map_init(Vec::new, |found, &q| {
                found.clear();
                self.query_into(q, k, found);
                self.finish(std::mem::take(found))
            })
            .collect())
    }

    /// Adds an entry. It is searchable at once (scanned linearly); the tables
    /// absorb recent additions once they are an eighth of the indexed entries.
    pub fn add(&mut self, id: u64, fp: B) -> Result<(), Error> {
        if self.fps.len() + 1 >= u32::MAX as usize {
            return Err(Error::Full(
                "the index is full (4,294,967,294 entries): split the collection".into(),
            ));
        }
        self.fps.to_mut().push(fp);
        self.ids.to_mut().push(id);
        self.deleted.push(false);
        let pending = self.fps.len() - self.indexed;
        if pending > 4096.max(self.indexed / 8) {
            self.merge_pending();
        }
        Ok(())
    }

    /// Merges the pending additions into every table: a linear merge per table,
    /// no re-sort of what is already indexed.
    fn merge_pending(&mut self) {
        let fps = &self.fps;
        let start = self.indexed;
        self.tables = self
            .tables
            .par_iter()
            .map(|old| merge(old, fps, start))
            .collect();
        self.indexed = self.fps.len();
    }

    /// Deletes every entry whose id satisfies `remove`; returns how many. Space is
    /// reclaimed when deleted entries reach a quarter of the index.
    pub fn delete(&mut self, mut remove: impl FnMut(u64) -> bool) -> usize {
        let mut n = 0;
        for i in 0..self.fps.len() {
            if !self.deleted[i] && remove(self.ids[i]) {
                self.deleted[i] = true;
                n += 1;
            }
        }
        self.deleted_count += n;
        if self.deleted_count > 0 && self.deleted_count * 4 >= self.fps.len() {
            self.compact();
        }
        n
    }

    fn compact(&mut self) {
        let live: Vec<(u64, B)> = self.entries().collect();
        let (ids, fps): (Vec<u64>, Vec<B>) = live.into_iter().unzip();
        self.ids = ids.into();
        self.fps = fps.into();
        self.deleted = vec![false; self.fps.len()];
        self.deleted_count = 0;
        self.rebuild_tables();
    }

    /// Writes the index file (see [`IndexFile`]): live entries, with the caller's
    /// `extra` metadata and named `sections`. Returns the bytes written.
    pub fn write_to<W: std::io::Write>(
        &self,
        extra: &serde_json::Value,
        sections: &[(&str, &[u8])],
        w: W,
    ) -> Result<u64, Error> {
        file::write(self, extra, sections, w)
    }

    /// Every pair of live entries within `k`, each once: `(id_a, id_b, distance)`
    /// with `a` stored before `b`.
    pub fn self_join(&self, k: u32) -> Result<Vec<(u64, u64, u32)>, Error> {
        self.design.check_k(k)?;
        let live: Vec<usize> = (0..self.fps.len()).filter(|&i| !self.deleted[i]).collect();
        let fps: Vec<B> = live.iter().map(|&i| self.fps[i]).collect();
        let pairs = self_join(&fps, k, &self.design)?;
        Ok(pairs
            .into_iter()
            .map(|(a, b, d)| (self.ids[live[a as usize]], self.ids[live[b as usize]], d))
            .collect())
    }
}

/// Merges items `start..` into a table: each old bucket is copied as it is, followed
/// by the new entries of that bucket; only the new entries are permuted and
/// counted. When the index has grown enough to want a larger directory, the table
/// is rebuilt instead (at most once per doubling).
fn merge<B: Bits>(old: &SortedTable<B>, fps: &[B], start: usize) -> SortedTable<B> {
    let t = &old.table;
    let n = fps.len();
    let dir_bits = table::dir_bits_for(n, old.prefix_bits);
    if dir_bits != old.dir_bits {
        return SortedTable::build(t, fps);
    }
    let buckets = old.dir.len() - 1;
    let new: Vec<(B, u32)> = (start..n).map(|i| (t.permute(fps[i]), i as u32)).collect();
    let mut added = vec![0u32; buckets + 1];
    for (k, _) in &new {
        added[k.top(dir_bits) as usize + 1] += 1;
    }
    for b in 0..buckets {
        added[b + 1] += added[b];
    }
    let mut grouped = vec![(B::zero(), 0u32); new.len()];
    let mut fill = added[..buckets].to_vec();
    for &(k, i) in &new {
        let slot = &mut fill[k.top(dir_bits) as usize];
        grouped[*slot as usize] = (k, i);
        *slot += 1;
    }
    let mut keys = Vec::with_capacity(n);
    let mut items = Vec::with_capacity(n);
    let mut dir = Vec::with_capacity(buckets + 1);
    for b in 0..buckets {
        dir.push(keys.len() as u32);
        let (lo, hi) = (old.dir[b] as usize, old.dir[b + 1] as usize);
        keys.extend_from_slice(&old.keys[lo..hi]);
        items.extend_from_slice(&old.items[lo..hi]);
        for &(k, i) in &grouped[added[b] as usize..added[b + 1] as usize] {
            keys.push(k);
            items.push(i);
        }
    }
    dir.push(keys.len() as u32);
    SortedTable {
        table: old.table.clone(),
        prefix_bits: old.prefix_bits,
        keys: keys.into(),
        items: items.into(),
        dir_bits,
        dir: dir.into(),
    }
}

impl IndexFile {
    /// Opens an index file's bytes: checks header, footer, metadata and the
    /// structure of every table (not every byte: see [`IndexFile::verify`]),
    /// so that queries never go astray.
    pub fn open(data: SharedBytes) -> Result<IndexFile, Error> {
        let file = IndexFile::open_container(data)?;
        match (file.bits(), file.is_compressed()) {
            (64, false) => drop(file.index::<u64>()?),
            (_, false) => drop(file.index::<u128>()?),
            (64, true) => drop(file.compressed_index::<u64>()?),
            (_, true) => drop(file.compressed_index::<u128>()?),
        }
        Ok(file)
    }
}
