//! Compressed tables in Elias–Fano coded blocks.
//!
//! The blocks of [`super::gaps`], coded otherwise. A block keeps its first
//! key whole (its anchor, kept apart for the search) and stores every other key
//! as its difference v from the anchor, cut at a bit L chosen per block: the
//! low L bits of every v at a fixed width, one after another, then the high
//! parts v >> L as a unary bit string (for each key in turn, the growth of its
//! high part in zeros, then a one). That is the Elias–Fano code (Elias 1974,
//! Fano 1971): at most 2 + log2(span / keys) bits per key, fewer than the
//! paper's codes of highest differing bits on near-uniform keys (42.5 against
//! 43.9 at N = 10 million), and it needs no decoding in order: a query counts
//! zeros in the unary string, a word at a time, to the first key of its prefix,
//! and reads that key's low bits where they lie.

use super::bitio::{BitWriter, window_up};
use super::blocks::{GROUP_SHIFT, MAX_BLOCK_KEYS, TableParts, match_run};
use crate::error::Error;
use crate::index::bits::Bits;
use crate::index::design::Table;
use crate::index::file::corrupt;
use crate::index::slab::Slab;
use crate::index::table::prefetch;

/// A block's header: its first key whole, where its bytes start (from the start
/// of its group of blocks), and how many low bits each of its keys stores.
/// Packed: 104 bits per block at 64 bits.
#[derive(Clone, Copy)]
#[repr(C, packed)]
pub(super) struct EfHead<B> {
    anchor: B,
    at: u32,
    low: u8,
}

// SAFETY: `EfHead` is `repr(C, packed)` over `Pod` fields, so it has no
// padding, and every bit pattern of it is valid.
unsafe impl<B: Bits> bytemuck::Zeroable for EfHead<B> {}
// SAFETY: as above.
unsafe impl<B: Bits> bytemuck::Pod for EfHead<B> {}

/// Bits read from one window: [`window_up`] gives at least 57.
const CHUNK: usize = 56;
const CHUNK_MASK: u64 = (1 << CHUNK) - 1;

/// One table in Elias–Fano coded blocks.
#[derive(Clone, Debug)]
pub struct EfTable<B: Bits> {
    pub(super) table: Table,
    prefix: B,
    rest: B,
    pub(super) block_keys: usize,
    keys: usize,
    pub(super) heads: Slab<EfHead<B>>,
    /// Where each group of blocks starts in `data` (bytes).
    bases: Slab<u64>,
    /// `block_dir[v]`: the first block whose anchor's top `dir_bits` bits are >= v.
    block_dir: Slab<u32>,
    dir_bits: u32,
    data: Slab<u8>,
}

impl<B: Bits> std::fmt::Debug for EfHead<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (anchor, at, low) = (self.anchor, self.at, self.low);
        write!(f, "EfHead({anchor:?}, {at}, {low})")
    }
}

/// The low bits to store per key of a block whose last key is `span` above its
/// anchor, with `m` keys besides the anchor: floor(log2(span / m)), so that the
/// unary string holds at most 2m zeros.
fn low_bits(span: u128, m: usize) -> u32 {
    let per = span / (m.max(1) as u128);
    if per <= 1 {
        0
    } else {
        127 - per.leading_zeros()
    }
}

/// `len` bits (at most 128) from bit `pos`, least significant first.
#[inline(always)]
fn read_bits<B: Bits>(data: &[u8], pos: usize, len: u32) -> B {
    if len as usize <= CHUNK {
        let w = window_up(data, pos) & ((1u64 << len) - 1);
        return B::from_u128(u128::from(w));
    }
    let mut v = 0u128;
    let mut done = 0usize;
    while done < len as usize {
        let take = (len as usize - done).min(CHUNK);
        let w = window_up(data, pos + done) & ((1u64 << take) - 1);
        v |= u128::from(w) << done;
        done += take;
    }
    B::from_u128(v)
}

/// The position of the `r`-th set bit of `x` (from 0; `r` < popcount(x)).
#[inline(always)]
fn select_in_word(mut x: u64, mut r: u32) -> u32 {
    let mut base = 0;
    loop {
        let c = (x & 0xff).count_ones();
        if r < c {
            break;
        }
        r -= c;
        x >>= 8;
        base += 8;
    }
    for _ in 0..r {
        x &= x - 1;
    }
    base + x.trailing_zeros()
}

impl<B: Bits> EfTable<B> {
    /// Codes `sorted` (distinct keys, ascending) in blocks of about `block_bytes`.
    pub(super) fn build(table: &Table, sorted: &[B], block_bytes: usize) -> Self {
        // Bits per key: about log2(2^BITS / N) low bits and 2 of unary.
        let n = sorted.len().max(2) as f64;
        let mean = (f64::from(B::BITS) - n.log2()).max(0.0) + 2.0;
        let block_keys =
            ((block_bytes as f64 * 8.0 / mean).round() as usize).clamp(1, MAX_BLOCK_KEYS);
        let blocks = sorted.len().div_ceil(block_keys);
        let mut w = BitWriter::on(crate::index::mem::with_huge_capacity(
            (sorted.len() as f64 * mean / 8.0) as usize + 2 * blocks + 64,
        ));
        let mut heads: Vec<EfHead<B>> = crate::index::mem::with_huge_capacity(blocks);
        let mut bases: Vec<u64> = Vec::new();
        for (b, block) in sorted.chunks(block_keys).enumerate() {
            if b & ((1 << GROUP_SHIFT) - 1) == 0 {
                bases.push(w.bytes.len() as u64);
            }
            let base = *bases.last().expect("a group");
            let anchor = block[0];
            let m = block.len() - 1;
            let span = block[m].sub(anchor).to_u128();
            let low = low_bits(span, m);
            heads.push(EfHead {
                anchor,
                at: u32::try_from(w.bytes.len() as u64 - base).expect("a group spans under 4 GiB"),
                low: low as u8,
            });
            for &key in &block[1..] {
                w.put_wide(key.sub(anchor), low);
            }
            let mut high = 0u128;
            for &key in &block[1..] {
                let h = key.sub(anchor).to_u128() >> low;
                let mut zeros = h - high;
                while zeros > 0 {
                    let take = zeros.min(32) as u32;
                    w.put(0, take);
                    zeros -= u128::from(take);
                }
                w.put(1, 1);
                high = h;
            }
            w.align();
        }
        let mut data = w.bytes;
        data.extend_from_slice(&[0u8; 8]);
        let anchors: Vec<B> = heads.iter().map(|h| h.anchor).collect();
        let (dir_bits, block_dir) =
            crate::index::table::anchor_directory(&anchors, table.prefix_bits());
        let (prefix, rest) = table.prefix_masks();
        EfTable {
            table: table.clone(),
            prefix,
            rest,
            block_keys,
            keys: sorted.len(),
            heads: heads.into(),
            bases: bases.into(),
            block_dir: block_dir.into(),
            dir_bits,
            data: data.into(),
        }
    }

    /// A table from a file's sections, its structure checked: directory,
    /// block starts in order and each block's bytes long enough for its keys.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn from_parts(
        i: usize,
        table: &Table,
        keys: usize,
        block_keys: usize,
        heads: Slab<EfHead<B>>,
        bases: Slab<u64>,
        block_dir: Slab<u32>,
        dir_bits: u32,
        data: Slab<u8>,
    ) -> Result<Self, Error> {
        let damaged = || corrupt(format!("table {i}'s block headers are damaged"));
        if data.len() < 8 || bases.len() != heads.len().div_ceil(1 << GROUP_SHIFT) {
            return Err(corrupt(format!("table {i}'s stream is cut short")));
        }
        let end = data.len() as u64 - 8;
        let (prefix, rest) = table.prefix_masks();
        let t = EfTable {
            table: table.clone(),
            prefix,
            rest,
            block_keys,
            keys,
            heads,
            bases,
            block_dir,
            dir_bits,
            data,
        };
        let v = t.view();
        let mut last = 0u64;
        for (b, &h) in v.heads.iter().enumerate() {
            let m = v.block_len(b) - 1;
            let start = v.bases[b >> GROUP_SHIFT]
                .checked_add(u64::from(h.at))
                .ok_or_else(damaged)?;
            if start < last || u32::from(h.low) >= B::BITS {
                return Err(damaged());
            }
            // The low bits and at least one unary bit per key.
            last = start + (m as u64 * (u64::from(h.low) + 1)).div_ceil(8);
            if last > end {
                return Err(damaged());
            }
        }
        if !crate::index::file::directory_is_sound(v.block_dir, v.heads.len() as u64) {
            return Err(corrupt(format!("table {i}'s blocks are damaged")));
        }
        Ok(t)
    }

    /// Bits per key: the coded data, and with the block headers and the
    /// directory as memory holds them.
    pub fn bits_per_key(&self, n: usize) -> (f64, f64) {
        let data = self.data.len().saturating_sub(8) as f64 * 8.0;
        let n = n.max(1) as f64;
        (data / n, self.memory().saturating_sub(8) as f64 * 8.0 / n)
    }

    /// Bytes held.
    pub fn memory(&self) -> usize {
        self.data.len()
            + self.heads.len() * std::mem::size_of::<EfHead<B>>()
            + self.bases.len() * 8
            + self.block_dir.len() * 4
    }

    /// What the index file stores of it.
    pub(super) fn parts(&self) -> TableParts<'_> {
        TableParts {
            heads: bytemuck::cast_slice(&self.heads),
            bases: &self.bases,
            block_dir: &self.block_dir,
            data: &self.data,
            dir_bits: self.dir_bits,
            blocks: self.heads.len(),
            block_keys: self.block_keys,
            code_lengths: Vec::new(),
        }
    }

    /// The arrays, resolved once for a query or a walk, so that reading them
    /// does not go through [`Slab`] at every step.
    #[inline]
    pub(super) fn view(&self) -> EfView<'_, B> {
        EfView {
            table: &self.table,
            prefix: self.prefix,
            rest: self.rest,
            block_keys: self.block_keys,
            keys: self.keys,
            heads: &self.heads,
            bases: &self.bases,
            block_dir: &self.block_dir,
            dir_bits: self.dir_bits,
            data: &self.data,
        }
    }
}

/// A table's arrays for one query or walk (see [`EfTable::view`]).
#[derive(Clone, Copy)]
pub(super) struct EfView<'a, B: Bits> {
    table: &'a Table,
    prefix: B,
    rest: B,
    block_keys: usize,
    keys: usize,
    heads: &'a [EfHead<B>],
    bases: &'a [u64],
    block_dir: &'a [u32],
    dir_bits: u32,
    data: &'a [u8],
}

impl<B: Bits> EfView<'_, B> {
    /// Keys in block `b`, its anchor included.
    #[inline]
    fn block_len(&self, b: usize) -> usize {
        self.keys
            .saturating_sub(b * self.block_keys)
            .clamp(1, self.block_keys)
    }

    /// Where block `b` starts in the data (bits).
    #[inline]
    fn start_bit(&self, b: usize) -> usize {
        let base = self.bases.get(b >> GROUP_SHIFT).copied().unwrap_or(0);
        (base as usize).wrapping_add(self.heads[b].at as usize) * 8
    }

    /// How many anchors are <= `lo`, searched from directory slot `slot`.
    #[inline]
    fn anchors_upto(&self, lo: B, slot: usize) -> usize {
        let (from, to) = (
            self.block_dir[slot] as usize,
            self.block_dir[slot + 1] as usize,
        );
        from + self.heads[from..to].partition_point(|h| { h.anchor } <= lo)
    }

    /// Starts a probe for `query`, prefetching its directory slot.
    #[inline]
    pub(super) fn start(&self, query: B) -> Probe<B> {
        let key = self.table.permute(query);
        let slot = key.top(self.dir_bits) as usize;
        prefetch(&self.block_dir[slot]);
        let lo = key.and(self.prefix);
        Probe {
            key,
            lo,
            hi: lo.or(self.rest),
            slot,
            block: 0,
        }
    }

    /// Prefetches the block headers the probe's directory slot points at.
    #[inline]
    pub(super) fn touch(&self, p: &Probe<B>) {
        let (from, to) = (
            self.block_dir[p.slot] as usize,
            self.block_dir[p.slot + 1] as usize,
        );
        let heads = &self.heads[from.saturating_sub(1)..(to + 1).min(self.heads.len())];
        crate::index::table::prefetch_all(bytemuck::cast_slice(heads));
    }

    /// Finds the probe's first block and prefetches the bytes it will read:
    /// the block's unary string, and the low bits about where its prefix
    /// should start (keys are close to uniform within a block).
    #[inline]
    pub(super) fn locate(&self, p: &mut Probe<B>) {
        p.block = self.anchors_upto(p.lo, p.slot).saturating_sub(1);
        let Some(&h) = self.heads.get(p.block) else {
            return;
        };
        let m = self.block_len(p.block) - 1;
        if m == 0 {
            return;
        }
        let start = self.start_bit(p.block);
        let unary = start + m * h.low as usize;
        let (from, to) = (unary / 8, (unary + 3 * m) / 8);
        for at in (from..to).step_by(64).chain([to]) {
            if let Some(b) = self.data.get(at) {
                prefetch(b);
            }
        }
        let anchor = h.anchor;
        let next = self
            .heads
            .get(p.block + 1)
            .map_or(anchor.or(B::mask(0, B::BITS)), |h| h.anchor);
        let gap = next.sub(anchor).to_u128().max(1) as f64;
        let frac = if p.lo > anchor {
            (p.lo.sub(anchor).to_u128() as f64 / gap).min(1.0)
        } else {
            0.0
        };
        let at = (start + (frac * m as f64) as usize * h.low as usize) / 8;
        for at in [at.saturating_sub(40), at + 24] {
            if let Some(b) = self.data.get(at) {
                prefetch(b);
            }
        }
    }

    /// Every key in the probe's prefix within `k` of its key, into `out` (as
    /// fingerprints, with their distances).
    #[inline]
    pub(super) fn run(&self, p: &Probe<B>, k: u32, out: &mut Vec<(B, u32)>) {
        self.for_each_in(p.block, p.lo, p.hi, |key| {
            let d = key.distance(p.key);
            if d <= k {
                out.push((self.table.unpermute(key), d));
            }
        });
    }

    /// Calls `f` on every key in `[lo, hi]`, ascending, reading from block
    /// `first` on (the last block whose anchor is <= lo, or block 0).
    #[inline]
    fn for_each_in(&self, first: usize, lo: B, hi: B, mut f: impl FnMut(B)) {
        let mut b = first;
        while let Some(&h) = self.heads.get(b) {
            let anchor = h.anchor;
            if anchor > hi {
                return;
            }
            if anchor >= lo {
                f(anchor);
            }
            if self.walk(lo, hi, b, h, &mut f) {
                return;
            }
            b += 1;
        }
    }

    /// Calls `f` on block `b`'s keys (its anchor aside) in `[lo, hi]`; true if
    /// the range ends in this block.
    #[inline]
    fn walk(&self, lo: B, hi: B, b: usize, h: EfHead<B>, f: &mut impl FnMut(B)) -> bool {
        let m = self.block_len(b) - 1;
        let (anchor, low) = (h.anchor, u32::from(h.low));
        let data: &[u8] = self.data;
        let start = self.start_bit(b);
        let limit = data.len() * 8;
        let mut pos = start + m * low as usize;
        // The first key of the prefix has a high part of at least t: skip t zeros.
        let t = if lo > anchor {
            lo.sub(anchor).to_u128() >> low
        } else {
            0
        };
        if t > 2 * m as u128 + 2 {
            return false;
        }
        let mut need = t as usize;
        let mut ones = 0usize;
        while need > 0 {
            let w = window_up(data, pos) & CHUNK_MASK;
            let zeros = CHUNK - w.count_ones() as usize;
            if zeros >= need {
                let at = select_in_word(!w & CHUNK_MASK, need as u32 - 1) as usize;
                ones += at + 1 - need;
                pos += at + 1;
                break;
            }
            need -= zeros;
            ones += CHUNK - zeros;
            pos += CHUNK;
            if ones >= m || pos > limit {
                return false;
            }
        }
        // Then each key in turn, its high part counted in zeros.
        let mut high = t as usize;
        let mut j = ones;
        while j < m && pos <= limit {
            let w = window_up(data, pos) & CHUNK_MASK;
            if w == 0 {
                high += CHUNK;
                pos += CHUNK;
                continue;
            }
            let tz = w.trailing_zeros() as usize;
            high += tz;
            pos += tz + 1;
            let v = B::from_u128(high as u128).shl(low).or(read_bits(
                data,
                start + j * low as usize,
                low,
            ));
            let key = anchor.add(v);
            if key > hi {
                return true;
            }
            if key >= lo {
                f(key);
            }
            j += 1;
        }
        false
    }

    /// Every key within `k` of the queries `sorted` (permuted keys with their
    /// query numbers, ascending), as (query, fingerprint, distance): one walk
    /// along the table, in order, reading each prefix's keys once for all the
    /// queries that share it, where they lie (a block is never decoded whole:
    /// at a few queries per block, reading a key or two each costs less).
    pub(super) fn scan(&self, sorted: &[(B, u32)], k: u32) -> Vec<(u32, B, u32)> {
        let mut out = Vec::new();
        let mut run: Vec<B> = Vec::new();
        let mut i = 0;
        while i < sorted.len() {
            let lo = sorted[i].0.and(self.prefix);
            let hi = lo.or(self.rest);
            let same = sorted[i..].partition_point(|q| q.0.and(self.prefix) == lo);
            run.clear();
            let first = self
                .anchors_upto(lo, lo.top(self.dir_bits) as usize)
                .saturating_sub(1);
            self.for_each_in(first, lo, hi, |key| run.push(key));
            match_run(self.table, &run, &sorted[i..i + same], k, &mut out);
            i += same;
        }
        out
    }
}

/// One table's probe: the permuted query, its prefix range, its directory slot
/// and the first block to read.
#[derive(Clone, Copy, Default)]
pub(super) struct Probe<B> {
    key: B,
    lo: B,
    hi: B,
    slot: usize,
    block: usize,
}

/// Tables probed together, so that their cache misses overlap.
pub(super) const MAX_TABLES: usize = 32;

/// Appends every key within `k` of `query` in `tables` (at most [`MAX_TABLES`])
/// to `found`, in phases over all tables so that their cache misses overlap:
/// directory slots, block headers, the blocks' bytes, then the keys.
pub(super) fn probe<B: Bits>(tables: &[EfTable<B>], query: B, k: u32, found: &mut Vec<(B, u32)>) {
    // Each table's arrays and probe, on the stack.
    let mut views: [Option<(EfView<'_, B>, Probe<B>)>; MAX_TABLES] = [None; MAX_TABLES];
    for (v, t) in views.iter_mut().zip(tables) {
        let t = t.view();
        *v = Some((t, t.start(query)));
    }
    let views = &mut views[..tables.len()];
    for (t, p) in views.iter().flatten() {
        t.touch(p);
    }
    for (t, p) in views.iter_mut().flatten() {
        t.locate(p);
    }
    for (t, p) in views.iter().flatten() {
        t.run(p, k, found);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_in_word_matches_a_bit_by_bit_count() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200 {
            x = x.rotate_left(7).wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
            let ones: Vec<u32> = (0..64).filter(|&i| x >> i & 1 == 1).collect();
            for (r, &at) in ones.iter().enumerate() {
                assert_eq!(select_in_word(x, r as u32), at);
            }
        }
    }

    #[test]
    fn low_bits_keep_the_unary_string_within_twice_the_keys() {
        for &(span, m) in &[
            (0u128, 1usize),
            (1, 1),
            (1000, 10),
            (u64::MAX as u128, 186),
            (7, 100),
        ] {
            let low = low_bits(span, m);
            assert!(span >> low <= 2 * m as u128, "span {span} m {m} low {low}");
        }
    }
}
