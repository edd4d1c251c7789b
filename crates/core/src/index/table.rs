//! One permuted, sorted table with a directory on its top bits.

use super::bits::Bits;
use super::design::Table;
use super::slab::Slab;

/// Fingerprints of one table, permuted, grouped by their top `dir_bits` bits
/// (a counting sort, which also yields the directory), with the item number of
/// each. Buckets are a superset of the prefix runs: queries check every entry's
/// distance, so nothing is missed.
#[derive(Clone, Debug)]
pub struct SortedTable<B: Bits> {
    pub(crate) table: Table,
    pub(crate) prefix_bits: u32,
    pub(crate) keys: Slab<B>,
    pub(crate) items: Slab<u32>,
    pub(crate) dir_bits: u32,
    /// `dir[b]..dir[b + 1]` are the entries whose key's top `dir_bits` bits are `b`.
    pub(crate) dir: Slab<u32>,
}

/// The directory of keys sorted by their top `dir_bits` bits: `dir[b]` is the
/// first entry of bucket `b`, `dir[2^dir_bits]` the number of entries.
pub(crate) fn directory<B: Bits>(sorted_keys: impl Iterator<Item = B>, dir_bits: u32) -> Vec<u32> {
    let buckets = 1usize << dir_bits;
    let mut dir = super::mem::with_huge_capacity(buckets + 1);
    dir.resize(buckets + 1, 0u32);
    for k in sorted_keys {
        dir[k.top(dir_bits) as usize + 1] += 1;
    }
    for b in 0..buckets {
        dir[b + 1] += dir[b];
    }
    dir
}

/// The directory of a compressed table's block anchors (ascending), and its
/// bits: about eight blocks per slot, never more than the prefix.
pub(crate) fn anchor_directory<B: Bits>(anchors: &[B], prefix_bits: u32) -> (u32, Vec<u32>) {
    let bits = dir_bits_for(anchors.len(), prefix_bits);
    (bits, directory(anchors.iter().copied(), bits))
}

pub(crate) use super::design::dir_bits_for;

impl<B: Bits> SortedTable<B> {
    /// Builds the table over `fps[i]` for every item `i`.
    pub fn build(table: &Table, fps: &[B]) -> Self {
        Self::build_with(table, fps, &mut Vec::new(), &mut Vec::new())
    }

    /// [`SortedTable::build`] with scratch buffers reused from table to table, so
    /// that their pages are faulted in once rather than per table.
    pub fn build_with(
        table: &Table,
        fps: &[B],
        entries: &mut Vec<(B, u32)>,
        tmp: &mut Vec<(B, u32)>,
    ) -> Self {
        let prefix_bits = table.prefix_bits();
        let dir_bits = dir_bits_for(fps.len(), prefix_bits);
        if entries.capacity() < fps.len() {
            *entries = super::mem::with_huge_capacity(fps.len());
        }
        entries.clear();
        entries.extend(
            fps.iter()
                .enumerate()
                .map(|(i, &f)| (table.permute(f), i as u32)),
        );
        super::radix::sort_by_top(entries, tmp, dir_bits);
        let dir = directory(entries.iter().map(|e| e.0), dir_bits);
        let mut keys = super::mem::with_huge_capacity(entries.len());
        keys.extend(entries.iter().map(|e| e.0));
        let mut items = super::mem::with_huge_capacity(entries.len());
        items.extend(entries.iter().map(|e| e.1));
        SortedTable {
            table: table.clone(),
            prefix_bits,
            keys: keys.into(),
            items: items.into(),
            dir_bits,
            dir: dir.into(),
        }
    }

    /// The entries of `key`'s bucket.
    #[inline]
    pub fn bucket(&self, key: B) -> std::ops::Range<usize> {
        let b = key.top(self.dir_bits) as usize;
        self.dir[b] as usize..self.dir[b + 1] as usize
    }

    /// Appends `(item, distance)` for every entry of `bucket` (as [`Self::bucket`]
    /// gives it for `key`, the permuted query) within `k` of `key`.
    #[inline]
    pub fn probe(&self, key: B, bucket: std::ops::Range<usize>, k: u32, out: &mut Vec<(u32, u32)>) {
        for (kk, &item) in self.keys[bucket.clone()].iter().zip(&self.items[bucket]) {
            let d = kk.distance(key);
            if d <= k {
                out.push((item, d));
            }
        }
    }

    /// Hints the CPU to fetch the directory slot of `query`'s bucket.
    #[inline]
    pub fn prefetch_dir(&self, key: B) {
        prefetch(&self.dir[key.top(self.dir_bits) as usize]);
    }

    /// Hints the CPU to fetch the first keys of a bucket.
    #[inline]
    pub fn prefetch_keys(&self, range: &std::ops::Range<usize>) {
        if let Some(k) = self.keys.get(range.start) {
            prefetch(k);
        }
    }

    /// Bytes of memory held.
    pub fn memory(&self) -> usize {
        self.keys.len() * std::mem::size_of::<B>() + self.items.len() * 4 + self.dir.len() * 4
    }
}

/// Hints the CPU to fetch every cache line of `bytes`.
#[inline]
pub(crate) fn prefetch_all(bytes: &[u8]) {
    for line in (0..bytes.len())
        .step_by(64)
        .chain([bytes.len().saturating_sub(1)])
    {
        if let Some(b) = bytes.get(line) {
            prefetch(b);
        }
    }
}

#[inline]
pub(crate) fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: prefetch is a hint: it never faults and reads or writes nothing
        // visible to the program; `r` is a valid reference anyway. SSE is part of
        // every x86-64 CPU.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                (r as *const T).cast::<i8>(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}
