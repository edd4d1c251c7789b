//! Exact Hamming search: the permuted-table index of Manku, Jain & Das Sarma §3.
//!
//! [`Index`] answers "every stored fingerprint within k bits of this one", online
//! and in batches, and takes additions and deletions after it is built.
//! [`self_join`] finds every pair within k in one set, each pair once.

pub mod bits;
pub mod design;
pub(crate) mod table;

use rayon::prelude::*;

pub use bits::Bits;
pub use design::{Plan, PlanOption, Segment, Table, TableDesign, plan, plan_join};
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
    fps: Vec<B>,
    ids: Vec<u64>,
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
            return Err(Error::InvalidConfig(
                "an index holds fewer than 4,294,967,295 fingerprints: split the collection".into(),
            ));
        }
        let mut index = Index {
            deleted: vec![false; fps.len()],
            design,
            fps,
            ids,
            tables: Vec::new(),
            indexed: 0,
            deleted_count: 0,
        };
        index.rebuild_tables();
        Ok(index)
    }

    fn rebuild_tables(&mut self) {
        let fps = &self.fps;
        self.tables = self
            .design
            .tables
            .par_iter()
            .map(|t| SortedTable::build(t, fps))
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

    fn check_k(&self, k: u32) -> Result<(), Error> {
        if k > self.design.k {
            return Err(Error::InvalidConfig(format!(
                "k = {k} is larger than this index's maximum k = {}: rebuild the index with a larger --k",
                self.design.k
            )));
        }
        Ok(())
    }

    /// Every live entry within `k` of `query`, each once, nearest first (ties by id).
    pub fn query(&self, query: B, k: u32) -> Result<Vec<Match>, Error> {
        self.check_k(k)?;
        let mut found = Vec::new();
        self.query_into(query, k, &mut found);
        Ok(self.finish(found))
    }

    fn query_into(&self, query: B, k: u32, found: &mut Vec<(u32, u32)>) {
        // Touch every table's directory first, then the buckets, so that the
        // tables' cache misses overlap instead of queueing.
        let mut keys = [B::zero(); 64];
        let many = self.tables.len() <= keys.len();
        if many {
            for (t, key) in self.tables.iter().zip(keys.iter_mut()) {
                *key = t.table.permute(query);
                t.prefetch_dir(*key);
            }
            for (t, key) in self.tables.iter().zip(keys.iter()) {
                t.prefetch_keys(&t.bucket(*key));
            }
        }
        for t in &self.tables {
            t.probe(query, k, found);
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
        let mut out: Vec<Match> = found
            .into_iter()
            .filter(|&(item, _)| !self.deleted[item as usize])
            .map(|(item, distance)| Match {
                distance,
                id: self.ids[item as usize],
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// [`Index::query`] for many queries, in parallel; answers in query order.
    pub fn query_batch(&self, queries: &[B], k: u32) -> Result<Vec<Vec<Match>>, Error> {
        self.check_k(k)?;
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
            return Err(Error::InvalidConfig("the index is full".into()));
        }
        self.fps.push(fp);
        self.ids.push(id);
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
            .zip(&self.design.tables)
            .map(|(old, t)| merge(old, t, fps, start))
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
        let (ids, fps) = live.into_iter().unzip();
        self.ids = ids;
        self.fps = fps;
        self.deleted = vec![false; self.fps.len()];
        self.deleted_count = 0;
        self.rebuild_tables();
    }

    /// Every pair of live entries within `k`, each once: `(id_a, id_b, distance)`
    /// with `a` stored before `b`.
    pub fn self_join(&self, k: u32) -> Result<Vec<(u64, u64, u32)>, Error> {
        self.check_k(k)?;
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
fn merge<B: Bits>(old: &SortedTable<B>, t: &Table, fps: &[B], start: usize) -> SortedTable<B> {
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
        keys,
        items,
        dir_bits,
        dir,
    }
}

/// Every pair `(i, j, distance)` with `i < j` and `fps[i]`, `fps[j]` within `k`,
/// each pair once: a pair is reported only by the first table whose prefix it
/// shares, which is checked in O(tables) per pair without any set of pairs.
/// Tables run in parallel. Identical fingerprints are pairs too; callers with
/// many identical fingerprints should collapse them first (see [`crate::dedup`]).
pub fn self_join<B: Bits>(
    fps: &[B],
    k: u32,
    design: &TableDesign,
) -> Result<Vec<(u32, u32, u32)>, Error> {
    if design.bits != B::BITS {
        return Err(Error::WidthMismatch {
            expected: design.bits,
            got: B::BITS,
        });
    }
    if k > design.k {
        return Err(Error::InvalidConfig(format!(
            "k = {k} is larger than the design's k = {}",
            design.k
        )));
    }
    let masks: Vec<B> = design.tables.iter().map(|t| t.prefix_mask::<B>()).collect();
    let per_table: Vec<Vec<(u32, u32, u32)>> = design
        .tables
        .par_iter()
        .enumerate()
        .map(|(ti, t)| {
            let table = SortedTable::build(t, fps);
            // The earlier tables' prefix masks, in this table's key space.
            let earlier: Vec<B> = masks[..ti].iter().map(|&m| t.permute(m)).collect();
            let p = table.prefix_bits;
            // Prefixes can be longer than 64 bits at f = 128: compare masked words.
            let prefix = B::mask(B::BITS - p, p);
            let same_prefix = |a: B, b: B| a.xor(b).and(prefix) == B::zero();
            let mut out = Vec::new();
            let mut scratch: Vec<(B, u32)> = Vec::new();
            let nb = table.dir.len() - 1;
            for b in 0..nb {
                let (lo, hi) = (table.dir[b] as usize, table.dir[b + 1] as usize);
                if hi - lo < 2 {
                    continue;
                }
                scratch.clear();
                scratch.extend(
                    table.keys[lo..hi]
                        .iter()
                        .copied()
                        .zip(table.items[lo..hi].iter().copied()),
                );
                if scratch.len() > 32 {
                    scratch.sort_unstable();
                }
                // Runs of equal prefix within the bucket (a small bucket is one
                // "run" and the prefix is checked per pair).
                let small = scratch.len() <= 32;
                let mut run_start = 0;
                while run_start < scratch.len() {
                    let run_end = if small {
                        scratch.len()
                    } else {
                        let first = scratch[run_start].0;
                        run_start
                            + scratch[run_start..]
                                .iter()
                                .take_while(|e| same_prefix(e.0, first))
                                .count()
                    };
                    let run = &scratch[run_start..run_end];
                    for (x, &(ka, ia)) in run.iter().enumerate() {
                        for &(kb, ib) in &run[x + 1..] {
                            let diff = ka.xor(kb);
                            let d = diff.distance(B::zero());
                            if d > k || (small && !same_prefix(ka, kb)) {
                                continue;
                            }
                            if earlier.iter().any(|&m| diff.and(m) == B::zero()) {
                                continue; // an earlier table reports it
                            }
                            out.push((ia.min(ib), ia.max(ib), d));
                        }
                    }
                    run_start = run_end;
                }
            }
            out
        })
        .collect();
    let mut pairs: Vec<(u32, u32, u32)> = per_table.into_iter().flatten().collect();
    pairs.par_sort_unstable();
    Ok(pairs)
}
