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
pub mod mem;
mod radix;
pub mod slab;
pub(crate) mod table;

use rayon::prelude::*;

pub use bits::Bits;
pub use bundle::{AnyIndex, Bundle};
pub use compressed::{Coding, CompressedIndex};
pub use design::{Plan, PlanOption, Segment, Table, TableDesign, plan, plan_join};
pub use file::IndexFile;
pub use ids::{IdRef, IdTable};
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

    fn check_k(&self, k: u32) -> Result<(), Error> {
        if k > self.design.k {
            return Err(Error::KTooLarge {
                k,
                max: self.design.k,
            });
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

/// Fingerprints grouped by value: the distinct ones in ascending order, and the
/// documents holding each.
#[derive(Clone, Debug)]
pub struct Collapsed<B: Bits> {
    /// Distinct fingerprints, ascending.
    pub distinct: Vec<B>,
    /// Documents sorted by (fingerprint, document).
    pub order: Vec<u32>,
    /// `order[starts[g]..starts[g + 1]]` are the documents of `distinct[g]`, ascending.
    pub starts: Vec<u32>,
    /// The distinct index of each document.
    pub group_of: Vec<u32>,
}

/// Large buffers one stage of a self-join hands to the next, so that each does not
/// fault in fresh pages (the kernel zeroing them was a fifth of a 100-million join).
#[derive(Debug, Default)]
pub struct JoinScratch<B> {
    bufs: Vec<Vec<B>>,
}

impl<B: Bits> Collapsed<B> {
    /// Groups `fps` (document i has `fps[i]`) by value: one parallel sort.
    pub fn new(fps: &[B]) -> Self {
        Self::with_scratch(fps).0
    }

    /// [`Collapsed::new`], and its sort's buffers for [`join_sorted_unique_with`].
    pub fn with_scratch(fps: &[B]) -> (Self, JoinScratch<B>) {
        Self::sorted(Self::pairs_of(fps), mem::with_huge_capacity(fps.len()))
    }

    /// [`Collapsed::with_scratch`] that takes the fingerprints' own allocation
    /// for the distinct list, rather than faulting in fresh memory for it.
    pub fn from_vec(mut fps: Vec<B>) -> (Self, JoinScratch<B>) {
        let pairs = Self::pairs_of(&fps);
        fps.clear();
        Self::sorted(pairs, fps)
    }

    /// (fingerprint, document) for every document.
    fn pairs_of(fps: &[B]) -> Vec<(B, u32)> {
        // Written in parallel, so that both cores fault in the fresh pages.
        let mut pairs: Vec<(B, u32)> = mem::with_huge_capacity(fps.len());
        pairs.par_extend(fps.par_iter().enumerate().map(|(i, &f)| (f, i as u32)));
        pairs
    }

    /// Sorts `pairs` and groups them, writing the distinct fingerprints into
    /// `distinct` (empty).
    fn sorted(mut pairs: Vec<(B, u32)>, mut distinct: Vec<B>) -> (Self, JoinScratch<B>) {
        let n = pairs.len();
        // Radix by the top bits, then the (small) groups of equal top bits.
        let d = table::dir_bits_for(pairs.len(), B::BITS).min(26);
        let mut tmp = Vec::new();
        radix::sort_by_top(&mut pairs, &mut tmp, d);
        let mut lo = 0;
        while lo < pairs.len() {
            let top = pairs[lo].0.top(d);
            let mut hi = lo + 1;
            while hi < pairs.len() && pairs[hi].0.top(d) == top {
                hi += 1;
            }
            if hi - lo > 1 {
                pairs[lo..hi].sort_unstable();
            }
            lo = hi;
        }
        debug_assert!(distinct.is_empty());
        // Fresh pages faulted in by both cores (see `mem::filled_huge`).
        let mut starts = mem::filled_huge(n + 1, 0u32);
        let mut group_of = mem::filled_huge(n, 0u32);
        let mut groups = 0;
        for (pos, &(f, doc)) in pairs.iter().enumerate() {
            if pos == 0 || pairs[pos - 1].0 != f {
                distinct.push(f);
                starts[groups] = pos as u32;
                groups += 1;
            }
            group_of[doc as usize] = groups as u32 - 1;
        }
        starts[groups] = n as u32;
        starts.truncate(groups + 1);
        let mut order = mem::with_huge_capacity(n);
        order.par_extend(pairs.par_iter().map(|&(_, d)| d));
        let collapsed = Collapsed {
            distinct,
            order,
            starts,
            group_of,
        };
        let scratch = JoinScratch {
            bufs: vec![mem::recycle(pairs), mem::recycle(tmp)],
        };
        (collapsed, scratch)
    }

    /// The documents of group `g`, ascending.
    pub fn members(&self, g: u32) -> &[u32] {
        &self.order[self.starts[g as usize] as usize..self.starts[g as usize + 1] as usize]
    }
}

/// Every pair `(i, j, distance)` with `i < j` and `fps[i]`, `fps[j]` within `k`,
/// each pair once, sorted. Identical fingerprints are collapsed first and their
/// pairs listed from the groups (see [`join_sorted_unique`]).
pub fn self_join<B: Bits>(
    fps: &[B],
    k: u32,
    design: &TableDesign,
) -> Result<Vec<(u32, u32, u32)>, Error> {
    let (c, scratch) = Collapsed::with_scratch(fps);
    let mut out = Vec::new();
    for g in 0..c.distinct.len() as u32 {
        let m = c.members(g);
        for (x, &a) in m.iter().enumerate() {
            for &b in &m[x + 1..] {
                out.push((a, b, 0));
            }
        }
    }
    for (u, v, d) in join_sorted_unique_with(&c.distinct, k, design, scratch)? {
        for &a in c.members(u) {
            for &b in c.members(v) {
                out.push((a.min(b), a.max(b), d));
            }
        }
    }
    out.par_sort_unstable();
    Ok(out)
}

/// Every pair `(i, j, distance)`, `i < j`, of `sorted` (distinct fingerprints in
/// ascending order) within `k`, each pair once, sorted.
///
/// Per table (tables in parallel): the permuted keys alone are radix-sorted by
/// their top bits (8 or 16 bytes per fingerprint, twice, while sorting), and each
/// group of equal top bits is compared pairwise. A pair is reported only by the
/// first table whose prefix it shares, checked in O(tables) per pair without any
/// set of pairs. Reported keys are un-permuted and found again in `sorted` by
/// binary search.
pub fn join_sorted_unique<B: Bits>(
    sorted: &[B],
    k: u32,
    design: &TableDesign,
) -> Result<Vec<(u32, u32, u32)>, Error> {
    join_sorted_unique_with(sorted, k, design, JoinScratch::default())
}

/// [`join_sorted_unique`], sorting in the buffers of `scratch` where they are
/// large enough.
pub fn join_sorted_unique_with<B: Bits>(
    sorted: &[B],
    k: u32,
    design: &TableDesign,
    scratch: JoinScratch<B>,
) -> Result<Vec<(u32, u32, u32)>, Error> {
    check_join(sorted, k, design)?;
    let masks: Vec<B> = design.tables.iter().map(|t| t.prefix_mask::<B>()).collect();
    // One chunk of tables per thread, each with its scratch reused from table to
    // table (`map_init` would make new scratch per split: fresh pages each time).
    let tables: Vec<(usize, &Table)> = design.tables.iter().enumerate().collect();
    let per_thread = tables.len().div_ceil(rayon::current_num_threads().max(1));
    let chunks: Vec<&[(usize, &Table)]> = tables.chunks(per_thread.max(1)).collect();
    let mut bufs = scratch.bufs;
    bufs.resize_with(chunks.len(), Vec::new);
    let n = sorted.len();
    let per_table: Vec<Vec<(B, B, u32)>> = chunks
        .into_par_iter()
        .zip(bufs)
        .flat_map_iter(|(chunk, mut buf)| {
            // Keys and radix scratch, n words each, reused from table to table.
            if buf.capacity() < 2 * n {
                buf = mem::with_huge_capacity(2 * n);
            }
            buf.clear();
            buf.resize(2 * n, B::zero());
            let (keys, tmp) = buf.split_at_mut(n);
            chunk
                .iter()
                .map(|&(ti, t)| {
                    let mut out = Vec::new();
                    join_table(sorted, t, &masks[..ti], k, keys, tmp, |a, b, d| {
                        out.push((a, b, d))
                    });
                    out
                })
                .collect::<Vec<_>>()
        })
        .collect();
    // Fingerprints back to their positions.
    let position = positions(sorted);
    let mut pairs: Vec<(u32, u32, u32)> = per_table
        .into_par_iter()
        .flatten()
        .map(|(a, b, d)| {
            let (ia, ib) = (position(a), position(b));
            (ia.min(ib), ia.max(ib), d)
        })
        .collect();
    pairs.par_sort_unstable();
    Ok(pairs)
}

/// [`join_sorted_unique_with`] a few tables at a time: `sink` gets the pairs of
/// each round of tables (as many tables as threads, joined in parallel) before
/// the next round starts, so that memory holds one round's pairs rather than
/// all of them. Every pair `(i, j, distance)`, `i < j`, reaches `sink` exactly
/// once, in an order fixed by the design (not by the thread count's timing).
pub fn join_sorted_unique_each<B: Bits>(
    sorted: &[B],
    k: u32,
    design: &TableDesign,
    scratch: JoinScratch<B>,
    mut sink: impl FnMut(Vec<(u32, u32, u32)>),
) -> Result<(), Error> {
    check_join(sorted, k, design)?;
    let masks: Vec<B> = design.tables.iter().map(|t| t.prefix_mask::<B>()).collect();
    let n = sorted.len();
    let position = positions(sorted);
    let tables: Vec<(usize, &Table)> = design.tables.iter().enumerate().collect();
    let threads = rayon::current_num_threads().max(1);
    let mut bufs = scratch.bufs;
    bufs.resize_with(threads.min(tables.len()), Vec::new);
    for round in tables.chunks(threads) {
        let per_table: Vec<Vec<(u32, u32, u32)>> = round
            .par_iter()
            .zip(bufs.par_iter_mut())
            .map(|(&(ti, t), buf)| {
                if buf.capacity() < 2 * n {
                    *buf = mem::with_huge_capacity(2 * n);
                }
                buf.clear();
                buf.resize(2 * n, B::zero());
                let (keys, tmp) = buf.split_at_mut(n);
                let mut out = Vec::new();
                join_table(sorted, t, &masks[..ti], k, keys, tmp, |a, b, d| {
                    let (ia, ib) = (position(a), position(b));
                    out.push((ia.min(ib), ia.max(ib), d));
                });
                out
            })
            .collect();
        per_table.into_iter().for_each(&mut sink);
    }
    Ok(())
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

/// Finds a fingerprint of `sorted` (distinct, ascending) again: a directory on
/// the top bits narrows each search to a few entries (two cache misses, not a
/// binary search's twenty-odd over gigabytes).
fn positions<B: Bits>(sorted: &[B]) -> impl Fn(B) -> u32 + Sync + '_ {
    let dir_bits = table::dir_bits_for(sorted.len(), B::BITS);
    let dir = table::directory(sorted.iter().copied(), dir_bits);
    move |f: B| {
        let b = f.top(dir_bits) as usize;
        let (from, to) = (dir[b] as usize, dir[b + 1] as usize);
        let i = from + sorted[from..to].partition_point(|&x| x < f);
        debug_assert_eq!(sorted[i], f, "a stored fingerprint");
        i as u32
    }
}

fn check_join<B: Bits>(sorted: &[B], k: u32, design: &TableDesign) -> Result<(), Error> {
    if design.bits != B::BITS {
        return Err(Error::WidthMismatch {
            expected: design.bits,
            got: B::BITS,
        });
    }
    if k > design.k {
        return Err(Error::KTooLarge { k, max: design.k });
    }
    debug_assert!(
        sorted.windows(2).all(|w| w[0] < w[1]),
        "input must be sorted and distinct"
    );
    Ok(())
}

/// One table's pairs, as fingerprint values, each given to `emit(a, b, distance)`.
/// `keys` and `tmp`, as long as `fps`, are scratch reused from table to table.
///
/// The fingerprints are grouped by the table's prefix but never permuted:
/// distances do not depend on the bit order, so only the few bits that pick
/// a bucket are gathered (at 128 bits and large k a design cuts 18 blocks,
/// and a whole permutation per fingerprint and table dominated the join).
fn join_table<B: Bits>(
    fps: &[B],
    t: &Table,
    earlier_masks: &[B],
    k: u32,
    keys: &mut [B],
    tmp: &mut [B],
    mut emit: impl FnMut(B, B, u32),
) {
    let d = table::dir_bits_for(fps.len(), t.prefix_bits());
    let pieces = t.top_pieces(d);
    let top = |x: &B| design::top_of(&pieces, *x);
    radix::sort_by_key_into(fps, top, keys, tmp, d);
    // Prefixes can be longer than 64 bits at f = 128: compare masked words.
    let prefix = t.prefix_mask::<B>();
    let same_prefix = |a: B, b: B| a.xor(b).and(prefix) == B::zero();
    let mut lo = 0;
    while lo < keys.len() {
        let bucket_top = top(&keys[lo]);
        let hi = lo
            + keys[lo..]
                .iter()
                .take_while(|x| top(x) == bucket_top)
                .count();
        let bucket = &mut keys[lo..hi];
        lo = hi;
        if bucket.len() < 2 {
            continue;
        }
        // Large buckets are sorted so that equal prefixes form runs; small ones
        // are compared whole, checking the prefix per pair.
        let small = bucket.len() <= 32;
        if !small {
            bucket.sort_unstable_by_key(|&x| x.and(prefix));
        }
        let mut run_start = 0;
        while run_start < bucket.len() {
            let run_end = if small {
                bucket.len()
            } else {
                let first = bucket[run_start];
                run_start
                    + bucket[run_start..]
                        .iter()
                        .take_while(|&&e| same_prefix(e, first))
                        .count()
            };
            let run = &bucket[run_start..run_end];
            for (x, &a) in run.iter().enumerate() {
                for &b in &run[x + 1..] {
                    let diff = a.xor(b);
                    let dist = diff.distance(B::zero());
                    if dist > k || (small && diff.and(prefix) != B::zero()) {
                        continue;
                    }
                    if earlier_masks.iter().any(|&m| diff.and(m) == B::zero()) {
                        continue; // an earlier table reports it
                    }
                    emit(a, b, dist);
                }
            }
            run_start = run_end;
        }
    }
}
