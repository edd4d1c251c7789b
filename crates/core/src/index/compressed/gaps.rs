//! Tables in the paper's codes (Manku, Jain & Das Sarma §3.2): each key as
//! the position of its highest bit differing from its neighbour, Huffman-coded,
//! then the bits below it; a block keeps its middle key whole and codes the
//! keys above it forwards and those below it backwards.

use super::bitio::{BitWriter, MsbWriter, window_down, window_up};
use super::blocks::{GROUP_SHIFT, MAX_BLOCK_KEYS, TableParts, match_run};
use super::huffman::{FAST_CODE, Huffman, MAX_CODE};
use crate::index::bits::Bits;
use crate::index::design::Table;
use crate::index::slab::Slab;

/// A block's header, kept apart from the coded stream for the search: its
/// anchor (middle key) whole, and where its two chains meet in the stream
/// (bytes from the start of its group of blocks, see [`GROUP_SHIFT`]). Packed,
/// so that it costs 96 bits per block at 64 bits, not 128.
#[derive(Clone, Copy)]
#[repr(C, packed)]
pub(super) struct Head<B> {
    pub(super) anchor: B,
    pub(super) at: u32,
}

// SAFETY: `Head` is `repr(C, packed)` over `Pod` fields, so it has no padding,
// and every bit pattern of it is valid.
unsafe impl<B: Bits> bytemuck::Zeroable for Head<B> {}
// SAFETY: as above.
unsafe impl<B: Bits> bytemuck::Pod for Head<B> {}

/// One compressed table.
///
/// Keys are cut into blocks of `block_keys` (the last may hold fewer). A
/// block's middle key, its anchor, is kept whole in its header. The keys below
/// it form its back chain: from the anchor down, each key is coded against the
/// one above it, most significant bit first, in bytes that end at the block's
/// meeting point `at`. The keys above it form its forward chain: from the
/// anchor up, each against the one below it, least significant bit first, from
/// `at` on. So the keys between two anchors fill the stream between their
/// meeting points, and a query decodes them from whichever end is nearer its
/// prefix: a quarter of a block on average, not half.
#[derive(Clone, Debug)]
pub struct CompressedTable<B: Bits> {
    pub(super) table: Table,
    /// The key bits of the table's prefix, and the bits below it.
    pub(super) prefix: B,
    pub(super) rest: B,
    /// Keys per block, and in the table.
    pub(super) block_keys: usize,
    pub(super) keys: usize,
    pub(super) heads: Slab<Head<B>>,
    /// Where each group of blocks starts in the stream (bytes).
    pub(super) bases: Slab<u64>,
    /// `block_dir[v]`: the first block whose anchor's top `dir_bits` bits are >= v.
    pub(super) block_dir: Slab<u32>,
    pub(super) dir_bits: u32,
    pub(super) data: Slab<u8>,
    pub(super) code: Huffman,
}

/// A table's arrays for one query or walk: slices resolved once, so that the
/// decoding loop does not go through [`Slab`] at every key.
#[derive(Clone, Copy)]
pub(super) struct View<'a, B: Bits> {
    pub(super) table: &'a Table,
    pub(super) prefix: B,
    pub(super) rest: B,
    pub(super) block_keys: usize,
    pub(super) keys: usize,
    pub(super) heads: &'a [Head<B>],
    pub(super) bases: &'a [u64],
    pub(super) block_dir: &'a [u32],
    pub(super) dir_bits: u32,
    pub(super) data: &'a [u8],
    pub(super) code: &'a Huffman,
}

impl<B: Bits> CompressedTable<B> {
    /// Compresses `sorted` (distinct keys, ascending) in blocks of about `block_bytes`.
    pub(super) fn build(table: &Table, sorted: &[B], block_bytes: usize) -> Self {
        let mut freq = vec![0u64; B::BITS as usize];
        for w in sorted.windows(2) {
            freq[high_bit(w[0].xor(w[1])) as usize] += 1;
        }
        if freq.iter().all(|&f| f == 0) {
            freq[0] = 1;
        }
        let code = Huffman::new(&freq);
        // Keys per block, from the code's mean bits per key.
        let (pairs, bits) = freq
            .iter()
            .enumerate()
            .fold((0u64, 0u64), |(p, b), (h, &f)| {
                (p + f, b + f * u64::from(code.codes[h].1 + h as u32))
            });
        let mean = (bits as f64 / pairs.max(1) as f64).max(1.0);
        let block_keys =
            ((block_bytes as f64 * 8.0 / mean).round() as usize).clamp(1, MAX_BLOCK_KEYS);
        // Room for the whole stream at once, in huge pages where the kernel
        // allows: queries land anywhere in it, and TLB misses add to cache misses.
        let blocks = sorted.len().div_ceil(block_keys);
        let mut data =
            crate::index::mem::with_huge_capacity(bits.div_ceil(8) as usize + 64 * blocks + 64);
        data.extend_from_slice(&[0u8; 8]);
        let mut heads: Vec<Head<B>> = crate::index::mem::with_huge_capacity(blocks);
        let mut bases: Vec<u64> = Vec::new();
        for (b, block) in sorted.chunks(block_keys).enumerate() {
            let mid = block.len() / 2;
            let mut back = MsbWriter::default();
            for i in (0..mid).rev() {
                let h = high_bit(block[i].xor(block[i + 1]));
                // Most significant bit first: the canonical code, unreversed.
                let (c, len) = code.codes[h as usize];
                back.put(u64::from(c.reverse_bits() >> (32 - len)), len);
                back.put_wide(block[i], h);
            }
            data.extend_from_slice(&back.finish_reversed());
            if b & ((1 << GROUP_SHIFT) - 1) == 0 {
                bases.push(data.len() as u64);
            }
            let base = *bases.last().expect("a group");
            heads.push(Head {
                anchor: block[mid],
                at: u32::try_from(data.len() as u64 - base).expect("a group spans under 4 GiB"),
            });
            let mut w = BitWriter {
                bytes: data,
                ..BitWriter::default()
            };
            for i in mid + 1..block.len() {
                let h = high_bit(block[i - 1].xor(block[i]));
                let (c, len) = code.codes[h as usize];
                w.put(u64::from(c), len);
                w.put_wide(block[i], h);
            }
            w.align();
            data = w.bytes;
        }
        data.extend_from_slice(&[0u8; 8]);
        let anchors: Vec<B> = heads.iter().map(|h| h.anchor).collect();
        let (dir_bits, block_dir) =
            crate::index::table::anchor_directory(&anchors, table.prefix_bits());
        let (prefix, rest) = table.prefix_masks();
        CompressedTable {
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
            code,
        }
    }

    /// The arrays, resolved for a query.
    #[inline]
    pub(super) fn view(&self) -> View<'_, B> {
        View {
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
            code: &self.code,
        }
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
            code_lengths: self.code.lengths(),
        }
    }

    /// Bits per key: the coded stream, and with the block headers and the
    /// directory as memory holds them.
    pub fn bits_per_key(&self, n: usize) -> (f64, f64) {
        // Less the stream's 16 bytes of padding.
        let stream = self.data.len().saturating_sub(16) as f64 * 8.0;
        let n = n.max(1) as f64;
        (
            stream / n,
            self.memory().saturating_sub(16) as f64 * 8.0 / n,
        )
    }

    /// Bytes held.
    pub fn memory(&self) -> usize {
        self.data.len()
            + self.heads.len() * std::mem::size_of::<Head<B>>()
            + self.bases.len() * 8
            + self.block_dir.len() * 4
    }
}

impl<B: Bits> View<'_, B> {
    /// Block `b`'s anchor.
    #[inline]
    pub(super) fn anchor(&self, b: usize) -> B {
        self.heads[b].anchor
    }

    /// Where block `b`'s chains meet in the stream (bytes).
    #[inline]
    pub(super) fn meet(&self, b: usize) -> usize {
        let base = self.bases.get(b >> GROUP_SHIFT).copied().unwrap_or(0);
        (base as usize).wrapping_add(self.heads[b].at as usize)
    }

    /// Keys in block `b`'s back and forward chains.
    #[inline]
    pub(super) fn chain_keys(&self, b: usize) -> (usize, usize) {
        let len = self
            .keys
            .saturating_sub(b * self.block_keys)
            .clamp(1, self.block_keys);
        (len / 2, len - len / 2 - 1)
    }

    /// The region of `lo`: how many anchors are <= lo.
    #[inline]
    pub(super) fn region_of(&self, lo: B, slot: usize) -> usize {
        let (from, to) = (
            self.block_dir[slot] as usize,
            self.block_dir[slot + 1] as usize,
        );
        from + self.heads[from..to].partition_point(|h| { h.anchor } <= lo)
    }

    /// Starts a probe for `query`: its permuted key, prefix range and directory
    /// slot, with the slot prefetched.
    #[inline]
    pub(super) fn start(&self, query: B) -> Cursor<B> {
        let key = self.table.permute(query);
        let slot = key.top(self.dir_bits) as usize;
        crate::index::table::prefetch(&self.block_dir[slot]);
        let lo = key.and(self.prefix);
        Cursor {
            key,
            lo,
            hi: lo.or(self.rest),
            slot,
            ..Cursor::default()
        }
    }

    /// Prefetches the block headers the directory slot points at.
    #[inline]
    pub(super) fn touch(&self, c: &Cursor<B>) {
        let slot = c.slot;
        let (from, to) = (
            self.block_dir[slot] as usize,
            self.block_dir[slot + 1] as usize,
        );
        // Every line of them, and of the anchors on either side.
        let heads = &self.heads[from.saturating_sub(1)..(to + 1).min(self.heads.len())];
        crate::index::table::prefetch_all(bytemuck::cast_slice(heads));
    }

    /// Finds the probe's region and the end to decode it from, and prefetches
    /// the part of the stream that the probe will read.
    #[inline]
    pub(super) fn locate(&self, c: &mut Cursor<B>) {
        let r = self.region_of(c.lo, c.slot);
        c.region = r;
        let blocks = self.heads.len();
        if blocks == 0 {
            return;
        }
        // The region's keys fill the stream between the two meeting points; keys
        // are close to uniform, so the prefix sits about as far into it as lo
        // sits between the two anchors.
        let (from, to, frac) = match r {
            0 => (8, self.meet(0).min(self.data.len()), 1.0),
            _ if r == blocks => (self.meet(r - 1), self.data.len() - 8, 0.0),
            _ => {
                let (a, z) = (self.anchor(r - 1).to_u128(), self.anchor(r).to_u128());
                let gap = z.wrapping_sub(a).max(1) as f64;
                let frac = (c.lo.to_u128().wrapping_sub(a) as f64 / gap).min(1.0);
                (self.meet(r - 1), self.meet(r), frac)
            }
        };
        c.back_first = match r {
            0 => true,
            _ if r == blocks => false,
            _ => {
                let (forward, back) = (self.chain_keys(r - 1).1, self.chain_keys(r).0);
                frac * (forward + back) as f64 >= forward as f64
            }
        };
        let span = to.saturating_sub(from) as f64;
        let (first, last) = if c.back_first {
            let reach = ((1.0 - frac) * span) as usize + PREFETCH_MARGIN;
            (to.saturating_sub(reach).max(from), to)
        } else {
            (
                from,
                (from + (frac * span) as usize + PREFETCH_MARGIN).min(to),
            )
        };
        // In the order decoding reads them.
        let lines = last.saturating_sub(first).div_ceil(64);
        for i in 0..lines {
            let at = if c.back_first {
                last.saturating_sub(1 + 64 * i)
            } else {
                first + 64 * i
            };
            if let Some(b) = self.data.get(at) {
                crate::index::table::prefetch(b);
            }
        }
    }

    /// Every key within `k` of the probe's key, if `key` is in its prefix range.
    #[inline(always)]
    pub(super) fn visit(&self, c: &Cursor<B>, key: B, k: u32, out: &mut Vec<(B, u32)>) {
        if key >= c.lo && key <= c.hi {
            let d = key.distance(c.key);
            if d <= k {
                out.push((self.table.unpermute(key), d));
            }
        }
    }

    /// Begins decoding: the anchor just below the region (which may be the
    /// prefix's first key), then the region's nearer chain.
    #[inline]
    pub(super) fn enter(&self, c: &mut Cursor<B>, k: u32, out: &mut Vec<(B, u32)>) {
        if c.region > 0 {
            self.visit(c, self.anchor(c.region - 1), k, out);
        }
        c.second = false;
        self.chain(c, c.back_first);
    }

    /// Sets the cursor on one of its region's chains: the back chain of block
    /// `region`, read down from its anchor, or the forward chain of block
    /// `region - 1`, read up from its anchor (none past either end).
    #[inline]
    pub(super) fn chain(&self, c: &mut Cursor<B>, down: bool) {
        c.down = down;
        c.left = 0;
        let b = if down {
            c.region
        } else {
            c.region.wrapping_sub(1)
        };
        if b < self.heads.len() {
            let (back, forward) = self.chain_keys(b);
            c.left = if down { back } else { forward };
            c.pos = self.meet(b) * 8;
            c.cur = self.anchor(b);
        }
    }

    /// Decodes the probe's keys to the end of its prefix, visiting each.
    #[inline]
    pub(super) fn run(&self, mut c: Cursor<B>, k: u32, out: &mut Vec<(B, u32)>) {
        while self.step(&mut c, k, out) {}
    }

    /// Decodes the probe's next key and visits it: false once the probe has
    /// seen every key of its prefix.
    #[inline(always)]
    pub(super) fn step(&self, c: &mut Cursor<B>, k: u32, out: &mut Vec<(B, u32)>) -> bool {
        if c.left == 0 {
            return self.chain_done(c, k, out);
        }
        c.left -= 1;
        if c.down {
            self.down(c);
            if c.cur < c.lo {
                return self.region_done(c, k, out);
            }
        } else {
            self.up(c);
            if c.cur > c.hi {
                return self.region_done(c, k, out);
            }
        }
        self.visit(c, c.cur, k, out);
        true
    }

    /// A chain is decoded to its end: on to the region's other chain, or past it.
    #[inline]
    pub(super) fn chain_done(&self, c: &mut Cursor<B>, k: u32, out: &mut Vec<(B, u32)>) -> bool {
        if c.second {
            return self.region_done(c, k, out);
        }
        c.second = true;
        self.chain(c, !c.back_first);
        true
    }

    /// The region holds no more keys of the prefix: go on to the next one if
    /// the anchor between them is still in the prefix.
    #[inline]
    pub(super) fn region_done(&self, c: &mut Cursor<B>, k: u32, out: &mut Vec<(B, u32)>) -> bool {
        let r = c.region;
        if r >= self.heads.len() || self.anchor(r) > c.hi {
            return false;
        }
        self.visit(c, self.anchor(r), k, out);
        c.region = r + 1;
        c.back_first = false;
        c.second = false;
        self.chain(c, false);
        true
    }

    /// Decodes the next key upwards: the key has a 1 at h, where the one below
    /// has a 0; above h they agree; below h are the stored bits.
    #[inline(always)]
    pub(super) fn up(&self, c: &mut Cursor<B>) {
        // One 64-bit window holds the code and, usually, the bits below h too.
        let window = window_up(self.data, c.pos);
        let (h, len) = match self.code.fast[(window & ((1 << FAST_CODE) - 1)) as usize] {
            (_, 0) => self.code.decode[(window & ((1 << MAX_CODE) - 1)) as usize],
            e => e,
        };
        let (h, len) = (u32::from(h), u32::from(len));
        let low = if len + h <= 57 {
            c.pos += (len + h) as usize;
            B::from_u128(u128::from((window >> len) & ((1u64 << h) - 1)))
        } else {
            c.pos += len as usize;
            let mut v = B::zero();
            let mut done = 0;
            while done < h {
                let take = (h - done).min(32);
                let bits = window_up(self.data, c.pos) & ((1u64 << take) - 1);
                v = v.or(B::from_u128(u128::from(bits)).shl(done));
                c.pos += take as usize;
                done += take;
            }
            v
        };
        c.cur = c.cur.above(h, low);
    }

    /// Decodes the next key downwards: the key has a 0 at h, where the one
    /// above has a 1; above h they agree; below h are the stored bits.
    #[inline(always)]
    pub(super) fn down(&self, c: &mut Cursor<B>) {
        let window = window_down(self.data, c.pos);
        let (h, len) = match self.code.fast_msb[(window >> (64 - FAST_CODE)) as usize] {
            (_, 0) => self.code.decode_msb[(window >> (64 - MAX_CODE)) as usize],
            e => e,
        };
        let (h, len) = (u32::from(h), u32::from(len));
        let low = if len + h <= 57 {
            c.pos = c.pos.wrapping_sub((len + h) as usize);
            B::from_u128(u128::from((window << len) >> 1 >> (63 - h)))
        } else {
            c.pos = c.pos.wrapping_sub(len as usize);
            let mut v = B::zero();
            let mut left = h;
            while left > 0 {
                let take = left.min(32);
                let bits = window_down(self.data, c.pos) >> (64 - take);
                v = v.shl(take).or(B::from_u128(u128::from(bits)));
                c.pos = c.pos.wrapping_sub(take as usize);
                left -= take;
            }
            v
        };
        c.cur = c.cur.below(h, low);
    }

    /// Region `r`'s keys, ascending, into `out`: its two chains decoded a key
    /// of each in turn, so that their chains of loads overlap.
    pub(super) fn decode_region(&self, r: usize, out: &mut Vec<B>) {
        // A walk decodes the next region next, most likely: fetch its stream
        // now, which its two chains, read from both ends, would wait for.
        if r + 1 < self.heads.len() {
            let (from, to) = (self.meet(r), self.meet(r + 1).min(self.data.len()));
            for line in (from..to).step_by(64) {
                crate::index::table::prefetch(&self.data[line]);
            }
        }
        let mut up = Cursor {
            region: r,
            ..Cursor::default()
        };
        let mut down = up;
        self.chain(&mut up, false);
        self.chain(&mut down, true);
        let (ups, downs) = (up.left, down.left);
        out.clear();
        out.resize(ups + downs, B::zero());
        let (below, above) = out.split_at_mut(ups);
        for i in 0..ups.max(downs) {
            if i < ups {
                self.up(&mut up);
                below[i] = up.cur;
            }
            if i < downs {
                self.down(&mut down);
                above[downs - 1 - i] = down.cur;
            }
        }
    }

    /// Every key within `k` of the queries `sorted` (permuted keys with their
    /// query numbers, ascending), as (query, fingerprint, distance): one walk
    /// along the table, decoding each region the queries need once, and
    /// jumping over the regions they do not.
    pub(super) fn scan(&self, sorted: &[(B, u32)], k: u32) -> Vec<(u32, B, u32)> {
        let mut out = Vec::new();
        let mut run: Vec<B> = Vec::new();
        let mut region: Vec<B> = Vec::new();
        let mut decoded = usize::MAX;
        let mut i = 0;
        while i < sorted.len() {
            let lo = sorted[i].0.and(self.prefix);
            let hi = lo.or(self.rest);
            let same = sorted[i..].partition_point(|q| q.0.and(self.prefix) == lo);
            run.clear();
            let mut r = self.region_of(lo, lo.top(self.dir_bits) as usize);
            if r > 0 && self.anchor(r - 1) >= lo {
                run.push(self.anchor(r - 1));
            }
            loop {
                if decoded != r {
                    self.decode_region(r, &mut region);
                    decoded = r;
                }
                let from = region.partition_point(|&x| x < lo);
                let to = region.partition_point(|&x| x <= hi);
                run.extend_from_slice(region.get(from..to).unwrap_or_default());
                match self.heads.get(r) {
                    Some(h) if { h.anchor } <= hi => {
                        run.push(h.anchor);
                        r += 1;
                    }
                    _ => break,
                }
            }
            match_run(self.table, &run, &sorted[i..i + same], k, &mut out);
            i += same;
        }
        out
    }
}

/// One table's probe: the permuted query and its prefix range; its directory
/// slot, and the region being decoded (the keys between anchors `region - 1`
/// and `region`); which chain first, whether on the second, and which way it
/// reads; the keys it has left, where in the stream (bits), and the current key.
#[derive(Clone, Copy, Default)]
pub(super) struct Cursor<B> {
    pub(super) key: B,
    pub(super) lo: B,
    pub(super) hi: B,
    pub(super) slot: usize,
    pub(super) region: usize,
    pub(super) back_first: bool,
    pub(super) second: bool,
    pub(super) down: bool,
    pub(super) left: usize,
    pub(super) pos: usize,
    pub(super) cur: B,
}

/// Tables probed together, so that their cache misses overlap.
pub(super) const MAX_TABLES: usize = 32;

/// Appends every key within `k` of `query` in `tables` (at most [`MAX_TABLES`])
/// to `found`, in phases over all tables so that their cache misses overlap:
/// directory slots, block headers, stream, then decoding.
pub(super) fn probe<B: Bits>(
    tables: &[CompressedTable<B>],
    query: B,
    k: u32,
    found: &mut Vec<(B, u32)>,
) {
    let tables: Vec<View<'_, B>> = tables.iter().map(CompressedTable::view).collect();
    let mut cursors = [Cursor::default(); MAX_TABLES];
    let cursors = &mut cursors[..tables.len()];
    for (t, c) in tables.iter().zip(cursors.iter_mut()) {
        *c = t.start(query);
    }
    for (t, c) in tables.iter().zip(cursors.iter()) {
        t.touch(c);
    }
    for (t, c) in tables.iter().zip(cursors.iter_mut()) {
        t.locate(c);
    }
    for (t, c) in tables.iter().zip(cursors.iter_mut()) {
        t.enter(c, k, found);
    }
    // Decoding is a chain of dependent loads: a few tables at a time, a key of
    // each in turn, so that their chains overlap.
    let mut at = 0;
    while tables.len() - at >= GANG {
        run_gang::<B, GANG>(&tables[at..at + GANG], &cursors[at..at + GANG], k, found);
        at += GANG;
    }
    if at < tables.len() {
        tables[at].run(cursors[at], k, found);
    }
}

/// Bytes of stream prefetched past where a probe's prefix should end, for
/// the estimate's error (measured: a line or three more is a little faster).
pub(super) const PREFETCH_MARGIN: usize = 192;

/// Tables decoded in turn by one probe.
pub(super) const GANG: usize = 2;

/// Runs N probes to their ends, a key of each in turn while all go on.
#[inline]
pub(super) fn run_gang<B: Bits, const N: usize>(
    tables: &[View<'_, B>],
    cursors: &[Cursor<B>],
    k: u32,
    found: &mut Vec<(B, u32)>,
) {
    let mut c: [Cursor<B>; N] = std::array::from_fn(|j| cursors[j]);
    let mut live = [true; N];
    while live.iter().all(|&l| l) {
        for j in 0..N {
            live[j] = tables[j].step(&mut c[j], k, found);
        }
    }
    for j in 0..N {
        if live[j] {
            tables[j].run(c[j], k, found);
        }
    }
}

/// The position of the highest set bit of a non-zero word.
#[inline]
pub(super) fn high_bit<B: Bits>(x: B) -> u32 {
    127 - x.to_u128().leading_zeros()
}
