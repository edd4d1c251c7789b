//! Compressed tables (Manku, Jain & Das Sarma §3.2).
//!
//! In a sorted table successive keys share their top bits. Keys are stored in
//! blocks of about `block_bytes`, each with one key whole, and every other key
//! as the position h of the highest bit where it differs from its neighbour,
//! Huffman-coded with one code per table, followed by its h bits below it. The
//! paper keeps a block's first key whole and codes the others forwards; here a
//! block keeps its middle key whole (its anchor) and codes the keys above it
//! forwards and those below it backwards, with the same bits. The anchors are
//! kept apart for the search, and a query decodes the keys between two anchors
//! from whichever end is nearer its prefix: a quarter of a block on average
//! instead of a half. Tables store keys only: an entry's ids are found once,
//! from its fingerprint, in a primary array sorted by fingerprint.
//!
//! [`CompressedIndex`] holds its tables in one of two codings ([`Coding`]):
//! these codes (`Gaps`), or the same blocks with Elias–Fano codes
//! ([`super::ef`], `EliasFano`, the command line's default), which take fewer
//! bits and are read in place instead of decoded in order.

use rayon::prelude::*;

use super::Match;
use super::bits::Bits;
use super::design::{Table, TableDesign};
use super::ef::{self, EfHead, EfTable};
use super::file::{
    COMPRESSED_FORMAT_VERSION, CompressedMeta, EF_FORMAT_VERSION, IndexFile, corrupt,
    directory_is_sound,
};
use super::radix;
use super::slab::Slab;
use crate::error::Error;

/// Longest Huffman code, so decoding is one table lookup.
const MAX_CODE: u32 = 12;

/// A canonical, length-limited Huffman code over the symbols 0..128.
#[derive(Clone, Debug)]
struct Huffman {
    /// Code and length per symbol (length 0: unused).
    codes: Vec<(u32, u32)>,
    /// For every MAX_CODE-bit window (reversed code order: LSB first), the symbol
    /// and its length.
    decode: Vec<(u8, u8)>,
    /// The same for codes of at most FAST_CODE bits, small enough to stay in the
    /// L1 cache beside the other tables'; length 0 means "look in `decode`".
    fast: Box<[(u8, u8); 1 << FAST_CODE]>,
    /// Decoding tables for the streams read downwards (codes most significant
    /// bit first), indexed by the window's top bits.
    decode_msb: Vec<(u8, u8)>,
    fast_msb: Box<[(u8, u8); 1 << FAST_CODE]>,
}

/// Bits of the first-level decoding table.
const FAST_CODE: u32 = 8;

impl Huffman {
    fn new(freq: &[u64]) -> Huffman {
        let lengths: Vec<u8> = limited_lengths(freq, MAX_CODE)
            .into_iter()
            .map(|l| l as u8)
            .collect();
        Huffman::from_lengths(&lengths).expect("a valid length-limited code")
    }

    /// The canonical code of these lengths per symbol (0: unused), as a file
    /// stores it; None unless they make a prefix code of at most MAX_CODE bits.
    fn from_lengths(lengths: &[u8]) -> Option<Huffman> {
        let kraft: u64 = lengths
            .iter()
            .filter(|&&l| l > 0)
            .map(|&l| 1u64 << (MAX_CODE - u32::from(l).min(MAX_CODE)))
            .sum();
        if lengths.iter().any(|&l| u32::from(l) > MAX_CODE)
            || kraft == 0
            || kraft > 1 << MAX_CODE
            || lengths.len() > 256
        {
            return None;
        }
        let lengths: Vec<u32> = lengths.iter().map(|&l| u32::from(l)).collect();
        // Canonical codes: by (length, symbol).
        let mut order: Vec<usize> = (0..lengths.len()).filter(|&s| lengths[s] > 0).collect();
        order.sort_by_key(|&s| (lengths[s], s));
        let mut codes = vec![(0u32, 0u32); lengths.len()];
        let mut code = 0u32;
        let mut prev_len = 0;
        for &s in &order {
            code <<= lengths[s] - prev_len;
            prev_len = lengths[s];
            codes[s] = (code, lengths[s]);
            code += 1;
        }
        let mut decode_msb = vec![(0u8, 0u8); 1 << MAX_CODE];
        let mut fast_msb = Box::new([(0u8, 0u8); 1 << FAST_CODE]);
        for (s, &(c, len)) in codes.iter().enumerate() {
            if len == 0 {
                continue;
            }
            let from = (c << (MAX_CODE - len)) as usize;
            decode_msb[from..from + (1 << (MAX_CODE - len))].fill((s as u8, len as u8));
            if len <= FAST_CODE {
                let from = (c << (FAST_CODE - len)) as usize;
                fast_msb[from..from + (1 << (FAST_CODE - len))].fill((s as u8, len as u8));
            }
        }
        // Codes read upwards are LSB first, so store them bit-reversed.
        for c in codes.iter_mut().filter(|c| c.1 > 0) {
            c.0 = c.0.reverse_bits() >> (32 - c.1);
        }
        let mut decode = vec![(0u8, 0u8); 1 << MAX_CODE];
        for (s, &(c, len)) in codes.iter().enumerate() {
            if len == 0 {
                continue;
            }
            let mut fill = c as usize;
            while fill < decode.len() {
                decode[fill] = (s as u8, len as u8);
                fill += 1 << len;
            }
        }
        let mut fast = Box::new([(0u8, 0u8); 1 << FAST_CODE]);
        for (w, f) in fast.iter_mut().enumerate() {
            if u32::from(decode[w].1) <= FAST_CODE {
                *f = decode[w];
            }
        }
        Some(Huffman {
            codes,
            decode,
            fast,
            decode_msb,
            fast_msb,
        })
    }

    /// The code length of every symbol.
    fn lengths(&self) -> Vec<u8> {
        self.codes.iter().map(|&(_, l)| l as u8).collect()
    }
}

/// Code lengths for `freq` of at most `limit` bits: plain Huffman lengths, with
/// frequencies flattened until the longest fits.
fn limited_lengths(freq: &[u64], limit: u32) -> Vec<u32> {
    let used: Vec<usize> = (0..freq.len()).filter(|&s| freq[s] > 0).collect();
    let mut lengths = vec![0u32; freq.len()];
    if used.len() == 1 {
        lengths[used[0]] = 1;
        return lengths;
    }
    let mut f: Vec<u64> = freq.to_vec();
    loop {
        // Huffman by repeatedly merging the two lightest nodes.
        let mut nodes: Vec<(u64, Vec<usize>)> = used.iter().map(|&s| (f[s], vec![s])).collect();
        lengths.iter_mut().for_each(|l| *l = 0);
        while nodes.len() > 1 {
            nodes.sort_by_key(|n| std::cmp::Reverse(n.0));
            let (wa, a) = nodes.pop().expect("two nodes");
            let (wb, b) = nodes.pop().expect("two nodes");
            for &s in a.iter().chain(&b) {
                lengths[s] += 1;
            }
            nodes.push((wa + wb, a.into_iter().chain(b).collect()));
        }
        if lengths.iter().all(|&l| l <= limit) {
            return lengths;
        }
        for s in &used {
            f[*s] = f[*s] / 2 + 1;
        }
    }
}

/// Bits written least significant first: the chains read upwards.
#[derive(Default)]
pub(super) struct BitWriter {
    pub(super) bytes: Vec<u8>,
    acc: u64,
    n: u32,
}

impl BitWriter {
    /// A writer that appends to `bytes`.
    pub(super) fn on(bytes: Vec<u8>) -> BitWriter {
        BitWriter {
            bytes,
            ..BitWriter::default()
        }
    }

    pub(super) fn put(&mut self, value: u64, bits: u32) {
        debug_assert!(bits <= 57);
        if bits == 0 {
            return;
        }
        self.acc |= (value & ((1u64 << bits) - 1)) << self.n;
        self.n += bits;
        while self.n >= 8 {
            self.bytes.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }
    pub(super) fn put_wide<B: Bits>(&mut self, value: B, bits: u32) {
        let mut done = 0;
        while done < bits {
            let take = (bits - done).min(32);
            self.put(value.field(done, take).to_u128() as u64, take);
            done += take;
        }
    }
    pub(super) fn align(&mut self) {
        if self.n > 0 {
            self.bytes.push(self.acc as u8);
            self.acc = 0;
            self.n = 0;
        }
    }
}

/// Bits written most significant first: the chains read downwards, whose bytes
/// are stored in reverse order, so that they end where their anchor's forward
/// chain starts.
#[derive(Default)]
struct MsbWriter {
    bytes: Vec<u8>,
    acc: u64,
    n: u32,
}

impl MsbWriter {
    fn put(&mut self, value: u64, bits: u32) {
        debug_assert!(bits <= 32);
        if bits == 0 {
            return;
        }
        self.acc = (self.acc << bits) | (value & ((1u64 << bits) - 1));
        self.n += bits;
        while self.n >= 8 {
            self.bytes.push((self.acc >> (self.n - 8)) as u8);
            self.n -= 8;
        }
    }
    /// The low `bits` bits of `value`, most significant first.
    fn put_wide<B: Bits>(&mut self, value: B, bits: u32) {
        let mut left = bits;
        while left > 0 {
            let take = left.min(32);
            left -= take;
            self.put(value.field(left, take).to_u128() as u64, take);
        }
    }
    /// The bytes, last first.
    fn finish_reversed(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.bytes.push((self.acc << (8 - self.n)) as u8);
        }
        self.bytes.reverse();
        self.bytes
    }
}

/// The 8 bytes at `at` as a little-endian word. A stream has 8 zero bytes at
/// each end; past them (a damaged file) this reads zeros, never out of bounds.
#[inline(always)]
fn word_at(data: &[u8], at: usize) -> u64 {
    data.get(at..at.wrapping_add(8))
        .map_or(0, |w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
}

/// At least 57 bits upwards from bit `pos`, the first in the lowest bit.
#[inline(always)]
pub(super) fn window_up(data: &[u8], pos: usize) -> u64 {
    word_at(data, pos / 8) >> (pos % 8)
}

/// At least 57 bits downwards from just below bit `end`, the first in the
/// highest bit.
#[inline(always)]
fn window_down(data: &[u8], end: usize) -> u64 {
    word_at(data, (end.wrapping_add(7) / 8).wrapping_sub(8)) << (end.wrapping_neg() & 7)
}

/// A block's header, kept apart from the coded stream for the search: its
/// anchor (middle key) whole, and where its two chains meet in the stream
/// (bytes from the start of its group of blocks, see [`GROUP_SHIFT`]). Packed,
/// so that it costs 96 bits per block at 64 bits, not 128.
#[derive(Clone, Copy)]
#[repr(C, packed)]
struct Head<B> {
    anchor: B,
    at: u32,
}

// SAFETY: `Head` is `repr(C, packed)` over `Pod` fields, so it has no padding,
// and every bit pattern of it is valid.
unsafe impl<B: Bits> bytemuck::Zeroable for Head<B> {}
// SAFETY: as above.
unsafe impl<B: Bits> bytemuck::Pod for Head<B> {}

/// Blocks per group: a group's offsets fit in 32 bits, each group has a 64-bit base.
pub(super) const GROUP_SHIFT: u32 = 10;

/// Most keys per block: with the longest code and a 128-bit key, a group of
/// blocks stays under 4 GiB.
pub(super) const MAX_BLOCK_KEYS: usize = 16_384;

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
    table: Table,
    /// The key bits of the table's prefix, and the bits below it.
    prefix: B,
    rest: B,
    /// Keys per block, and in the table.
    block_keys: usize,
    keys: usize,
    heads: Slab<Head<B>>,
    /// Where each group of blocks starts in the stream (bytes).
    bases: Slab<u64>,
    /// `block_dir[v]`: the first block whose anchor's top `dir_bits` bits are >= v.
    block_dir: Slab<u32>,
    dir_bits: u32,
    data: Slab<u8>,
    code: Huffman,
}

/// What an index file stores of one compressed table, in either coding.
pub(super) struct TableParts<'a> {
    pub(super) heads: &'a [u8],
    pub(super) bases: &'a [u64],
    pub(super) block_dir: &'a [u32],
    pub(super) data: &'a [u8],
    pub(super) dir_bits: u32,
    pub(super) blocks: usize,
    pub(super) block_keys: usize,
    /// The Huffman code's length per symbol (none for Elias–Fano codes).
    pub(super) code_lengths: Vec<u8>,
}

/// A table's arrays for one query or walk: slices resolved once, so that the
/// decoding loop does not go through [`Slab`] at every key.
#[derive(Clone, Copy)]
struct View<'a, B: Bits> {
    table: &'a Table,
    prefix: B,
    rest: B,
    block_keys: usize,
    keys: usize,
    heads: &'a [Head<B>],
    bases: &'a [u64],
    block_dir: &'a [u32],
    dir_bits: u32,
    data: &'a [u8],
    code: &'a Huffman,
}

impl<B: Bits> CompressedTable<B> {
    /// Compresses `sorted` (distinct keys, ascending) in blocks of about `block_bytes`.
    fn build(table: &Table, sorted: &[B], block_bytes: usize) -> Self {
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
        let mut data = super::mem::with_huge_capacity(bits.div_ceil(8) as usize + 64 * blocks + 64);
        data.extend_from_slice(&[0u8; 8]);
        let mut heads: Vec<Head<B>> = super::mem::with_huge_capacity(blocks);
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
        let (dir_bits, block_dir) = super::table::anchor_directory(&anchors, table.prefix_bits());
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
    fn view(&self) -> View<'_, B> {
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
    fn parts(&self) -> TableParts<'_> {
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
    fn anchor(&self, b: usize) -> B {
        self.heads[b].anchor
    }

    /// Where block `b`'s chains meet in the stream (bytes).
    #[inline]
    fn meet(&self, b: usize) -> usize {
        let base = self.bases.get(b >> GROUP_SHIFT).copied().unwrap_or(0);
        (base as usize).wrapping_add(self.heads[b].at as usize)
    }

    /// Keys in block `b`'s back and forward chains.
    #[inline]
    fn chain_keys(&self, b: usize) -> (usize, usize) {
        let len = self
            .keys
            .saturating_sub(b * self.block_keys)
            .clamp(1, self.block_keys);
        (len / 2, len - len / 2 - 1)
    }

    /// The region of `lo`: how many anchors are <= lo.
    #[inline]
    fn region_of(&self, lo: B, slot: usize) -> usize {
        let (from, to) = (
            self.block_dir[slot] as usize,
            self.block_dir[slot + 1] as usize,
        );
        from + self.heads[from..to].partition_point(|h| { h.anchor } <= lo)
    }

    /// Starts a probe for `query`: its permuted key, prefix range and directory
    /// slot, with the slot prefetched.
    #[inline]
    fn start(&self, query: B) -> Cursor<B> {
        let key = self.table.permute(query);
        let slot = key.top(self.dir_bits) as usize;
        super::table::prefetch(&self.block_dir[slot]);
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
    fn touch(&self, c: &Cursor<B>) {
        let slot = c.slot;
        let (from, to) = (
            self.block_dir[slot] as usize,
            self.block_dir[slot + 1] as usize,
        );
        // Every line of them, and of the anchors on either side.
        let heads = &self.heads[from.saturating_sub(1)..(to + 1).min(self.heads.len())];
        super::table::prefetch_all(bytemuck::cast_slice(heads));
    }

    /// Finds the probe's region and the end to decode it from, and prefetches
    /// the part of the stream that the probe will read.
    #[inline]
    fn locate(&self, c: &mut Cursor<B>) {
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
                super::table::prefetch(b);
            }
        }
    }

    /// Every key within `k` of the probe's key, if `key` is in its prefix range.
    #[inline(always)]
    fn visit(&self, c: &Cursor<B>, key: B, k: u32, out: &mut Vec<(B, u32)>) {
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
    fn enter(&self, c: &mut Cursor<B>, k: u32, out: &mut Vec<(B, u32)>) {
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
    fn chain(&self, c: &mut Cursor<B>, down: bool) {
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
    fn run(&self, mut c: Cursor<B>, k: u32, out: &mut Vec<(B, u32)>) {
        while self.step(&mut c, k, out) {}
    }

    /// Decodes the probe's next key and visits it: false once the probe has
    /// seen every key of its prefix.
    #[inline(always)]
    fn step(&self, c: &mut Cursor<B>, k: u32, out: &mut Vec<(B, u32)>) -> bool {
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
    fn chain_done(&self, c: &mut Cursor<B>, k: u32, out: &mut Vec<(B, u32)>) -> bool {
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
    fn region_done(&self, c: &mut Cursor<B>, k: u32, out: &mut Vec<(B, u32)>) -> bool {
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
    fn up(&self, c: &mut Cursor<B>) {
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
    fn down(&self, c: &mut Cursor<B>) {
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
    fn decode_region(&self, r: usize, out: &mut Vec<B>) {
        // A walk decodes the next region next, most likely: fetch its stream
        // now, which its two chains, read from both ends, would wait for.
        if r + 1 < self.heads.len() {
            let (from, to) = (self.meet(r), self.meet(r + 1).min(self.data.len()));
            for line in (from..to).step_by(64) {
                super::table::prefetch(&self.data[line]);
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
    fn scan(&self, sorted: &[(B, u32)], k: u32) -> Vec<(u32, B, u32)> {
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

/// For a walk: each of `queries` (permuted keys with their query numbers)
/// against the `run` of keys sharing their prefix, appending (query,
/// fingerprint, distance) for those within `k`.
#[inline]
pub(super) fn match_run<B: Bits>(
    table: &Table,
    run: &[B],
    queries: &[(B, u32)],
    k: u32,
    out: &mut Vec<(u32, B, u32)>,
) {
    for &(key, q) in queries {
        for &cur in run {
            let d = cur.distance(key);
            if d <= k {
                out.push((q, table.unpermute(cur), d));
            }
        }
    }
}

/// One table's probe: the permuted query and its prefix range; its directory
/// slot, and the region being decoded (the keys between anchors `region - 1`
/// and `region`); which chain first, whether on the second, and which way it
/// reads; the keys it has left, where in the stream (bits), and the current key.
#[derive(Clone, Copy, Default)]
struct Cursor<B> {
    key: B,
    lo: B,
    hi: B,
    slot: usize,
    region: usize,
    back_first: bool,
    second: bool,
    down: bool,
    left: usize,
    pos: usize,
    cur: B,
}

/// Batches from this size, and with at least [`SCAN_PER_BLOCK`] queries per
/// block, are answered by walking the tables (see
/// [`CompressedIndex::query_batch`]); others query by query. A walk decodes
/// every block it reaches whole, a query a quarter of one on average, plus its
/// cache misses: on random fingerprints the two cost the same at about two
/// queries per block.
const SCAN_FROM: usize = 4096;
const SCAN_PER_BLOCK: usize = 2;
/// [`SCAN_PER_BLOCK`] for Elias–Fano coded blocks.
const EF_SCAN_PER_BLOCK: usize = 8;

/// Tables probed together, so that their cache misses overlap.
const MAX_TABLES: usize = 32;

/// Appends every key within `k` of `query` in `tables` (at most [`MAX_TABLES`])
/// to `found`, in phases over all tables so that their cache misses overlap:
/// directory slots, block headers, stream, then decoding.
fn probe<B: Bits>(tables: &[CompressedTable<B>], query: B, k: u32, found: &mut Vec<(B, u32)>) {
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
const PREFETCH_MARGIN: usize = 192;

/// Tables decoded in turn by one probe.
const GANG: usize = 2;

/// Runs N probes to their ends, a key of each in turn while all go on.
#[inline]
fn run_gang<B: Bits, const N: usize>(
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
fn high_bit<B: Bits>(x: B) -> u32 {
    127 - x.to_u128().leading_zeros()
}

/// How a compressed index codes the keys of its blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Coding {
    /// The paper's §3.2: each key as its highest bit differing from its
    /// neighbour, Huffman-coded, and the bits below it (this module).
    #[default]
    Gaps,
    /// Each key's difference from its block's first key, Elias–Fano coded
    /// (see [`super::ef`]): fewer bits, and no decoding in order.
    EliasFano,
}

impl Coding {
    /// The format version of index files in this coding.
    pub fn format_version(self) -> u32 {
        match self {
            Coding::Gaps => COMPRESSED_FORMAT_VERSION,
            Coding::EliasFano => EF_FORMAT_VERSION,
        }
    }

    /// The name the command line and `index info` use.
    pub fn name(self) -> &'static str {
        match self {
            Coding::Gaps => "gaps",
            Coding::EliasFano => "elias-fano",
        }
    }
}

/// A compressed index's tables, in one coding.
#[derive(Clone, Debug)]
enum Tables<B: Bits> {
    Gaps(Vec<CompressedTable<B>>),
    Ef(Vec<EfTable<B>>),
}

/// A read-only index with compressed tables: the same answers as [`super::Index`]
/// in a fraction of the memory.
#[derive(Clone, Debug)]
pub struct CompressedIndex<B: Bits> {
    design: TableDesign,
    /// Distinct fingerprints, ascending, and the entries of each.
    fps: Slab<B>,
    /// `fps_dir[v]`: the first fingerprint whose top `fps_dir_bits` bits are >= v.
    fps_dir: Slab<u32>,
    fps_dir_bits: u32,
    starts: Slab<u32>,
    ids: Slab<u64>,
    tables: Tables<B>,
}

impl<B: Bits> CompressedIndex<B> {
    /// Builds the compressed tables of `design` over `entries`, in blocks of about
    /// `block_bytes` (the paper uses 1024; smaller blocks decode faster), with
    /// keys coded as `coding` says.
    pub fn build(
        design: TableDesign,
        entries: impl IntoIterator<Item = (u64, B)>,
        block_bytes: usize,
        coding: Coding,
    ) -> Result<Self, Error> {
        if design.bits != B::BITS {
            return Err(Error::WidthMismatch {
                expected: design.bits,
                got: B::BITS,
            });
        }
        let mut pairs: Vec<(B, u64)> = entries.into_iter().map(|(id, f)| (f, id)).collect();
        pairs.par_sort_unstable();
        let mut fps = super::mem::with_huge_capacity(pairs.len());
        let mut starts = super::mem::with_huge_capacity(pairs.len() + 1);
        for (i, &(f, _)) in pairs.iter().enumerate() {
            if i == 0 || pairs[i - 1].0 != f {
                fps.push(f);
                starts.push(i as u32);
            }
        }
        starts.push(pairs.len() as u32);
        let mut ids: Vec<u64> = super::mem::with_huge_capacity(pairs.len());
        ids.extend(pairs.into_iter().map(|(_, id)| id));
        let sorted = |t: &Table| {
            let mut keys: Vec<B> = fps.iter().map(|&f| t.permute(f)).collect();
            let d = super::table::dir_bits_for(keys.len(), t.prefix_bits()).min(26);
            radix::sort_by_top(&mut keys, &mut Vec::new(), d);
            keys.par_sort_unstable();
            keys
        };
        let tables = match coding {
            Coding::Gaps => Tables::Gaps(
                design
                    .tables
                    .par_iter()
                    .map(|t| CompressedTable::build(t, &sorted(t), block_bytes))
                    .collect(),
            ),
            Coding::EliasFano => Tables::Ef(
                design
                    .tables
                    .par_iter()
                    .map(|t| EfTable::build(t, &sorted(t), block_bytes))
                    .collect(),
            ),
        };
        let fps_dir_bits = super::table::dir_bits_for(fps.len(), B::BITS);
        let fps_dir = super::table::directory(fps.iter().copied(), fps_dir_bits);
        Ok(CompressedIndex {
            design,
            fps: fps.into(),
            fps_dir: fps_dir.into(),
            fps_dir_bits,
            starts: starts.into(),
            ids: ids.into(),
            tables,
        })
    }

    /// How the tables code their keys.
    pub fn coding(&self) -> Coding {
        match self.tables {
            Tables::Gaps(_) => Coding::Gaps,
            Tables::Ef(_) => Coding::EliasFano,
        }
    }

    /// Number of tables.
    pub fn table_count(&self) -> usize {
        match &self.tables {
            Tables::Gaps(t) => t.len(),
            Tables::Ef(t) => t.len(),
        }
    }

    /// Keys per block (the last block of a table may hold fewer).
    pub fn block_keys(&self) -> usize {
        match &self.tables {
            Tables::Gaps(t) => t.first().map_or(0, |t| t.block_keys),
            Tables::Ef(t) => t.first().map_or(0, |t| t.block_keys),
        }
    }

    /// Bits per distinct key and table, averaged over the tables: the coded
    /// keys alone, and with the block headers and directories.
    pub fn bits_per_key(&self) -> (f64, f64) {
        let n = self.fps.len();
        let per: Vec<(f64, f64)> = match &self.tables {
            Tables::Gaps(t) => t.iter().map(|t| t.bits_per_key(n)).collect(),
            Tables::Ef(t) => t.iter().map(|t| t.bits_per_key(n)).collect(),
        };
        let tables = per.len().max(1) as f64;
        let (a, b) = per
            .iter()
            .fold((0.0, 0.0), |acc, x| (acc.0 + x.0, acc.1 + x.1));
        (a / tables, b / tables)
    }

    /// Blocks per table.
    fn blocks(&self) -> usize {
        match &self.tables {
            Tables::Gaps(t) => t.first().map_or(0, |t| t.heads.len()),
            Tables::Ef(t) => t.first().map_or(0, |t| t.heads.len()),
        }
    }

    /// Distinct fingerprints stored.
    pub fn distinct(&self) -> usize {
        self.fps.len()
    }

    /// The table design.
    pub fn design(&self) -> &TableDesign {
        &self.design
    }

    /// Entries stored.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether it stores no entry.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Every entry as `(id, fingerprint)`, by fingerprint. A damaged file's
    /// out-of-range entry numbers are skipped.
    pub fn entries(&self) -> impl Iterator<Item = (u64, B)> + '_ {
        (0..self.fps.len()).flat_map(move |g| {
            let (from, to) = (self.starts[g] as usize, self.starts[g + 1] as usize);
            let ids = self.ids.get(from..to.min(self.ids.len())).unwrap_or(&[]);
            ids.iter().map(move |&id| (id, self.fps[g]))
        })
    }

    /// Every pair of entries within `k`, each once: `(id_a, id_b, distance)`.
    pub fn self_join(&self, k: u32) -> Result<Vec<(u64, u64, u32)>, Error> {
        self.check_k(k)?;
        let (ids, fps): (Vec<u64>, Vec<B>) = self.entries().unzip();
        let pairs = super::self_join(&fps, k, &self.design)?;
        Ok(pairs
            .into_iter()
            .map(|(a, b, d)| (ids[a as usize], ids[b as usize], d))
            .collect())
    }

    /// Bytes held.
    pub fn memory(&self) -> usize {
        let tables: usize = match &self.tables {
            Tables::Gaps(t) => t.iter().map(CompressedTable::memory).sum(),
            Tables::Ef(t) => t.iter().map(EfTable::memory).sum(),
        };
        tables
            + self.fps.len() * (std::mem::size_of::<B>() + 4)
            + self.fps_dir.len() * 4
            + self.ids.len() * 8
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

    /// Every entry within `k` of `query`, each once, nearest first (ties by id).
    pub fn query(&self, query: B, k: u32) -> Result<Vec<Match>, Error> {
        self.check_k(k)?;
        let mut found = Vec::new();
        match &self.tables {
            Tables::Gaps(t) => {
                for tables in t.chunks(MAX_TABLES) {
                    probe(tables, query, k, &mut found);
                }
            }
            Tables::Ef(t) => {
                for tables in t.chunks(ef::MAX_TABLES) {
                    ef::probe(tables, query, k, &mut found);
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        let mut out = Vec::new();
        for (fp, distance) in found {
            if let Some(g) = self.find(fp) {
                for &id in self.ids_of(g) {
                    out.push(Match { distance, id });
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// The position of `fp` among the distinct fingerprints.
    #[inline]
    fn find(&self, fp: B) -> Option<usize> {
        let fps: &[B] = &self.fps;
        let b = fp.top(self.fps_dir_bits) as usize;
        let (from, to) = (self.fps_dir[b] as usize, self.fps_dir[b + 1] as usize);
        let i = from + fps[from..to].partition_point(|&f| f < fp);
        (fps.get(i) == Some(&fp)).then_some(i)
    }

    /// The ids of distinct fingerprint `g` (none if a damaged file says so).
    #[inline]
    fn ids_of(&self, g: usize) -> &[u64] {
        // Entry g's ids start at starts[g] >= g, which is g itself until some
        // fingerprint has several ids: fetch that line while starts[g] loads.
        if let Some(id) = self.ids.get(g) {
            super::table::prefetch(id);
        }
        match (self.starts.get(g), self.starts.get(g + 1)) {
            (Some(&a), Some(&b)) => self.ids.get(a as usize..b as usize).unwrap_or_default(),
            _ => &[],
        }
    }

    /// [`CompressedIndex::query`] for many queries, in parallel; answers in
    /// query order. A large batch is sorted by each table's key and answered in
    /// one walk along each table, as the paper's batch mode does: every block is
    /// decoded at most once per walk, however many queries it serves.
    pub fn query_batch(&self, queries: &[B], k: u32) -> Result<Vec<Vec<Match>>, Error> {
        self.check_k(k)?;
        // The paper's codes walk a table by decoding each block it reaches
        // whole. Elias–Fano blocks are read in place by both ways, and a walk
        // only pays for its sorting from about 8 queries per block (measured
        // at N = 10 million: 1.3x faster than query by query at 19 per block,
        // 1.2x slower at 4).
        let per_block = match self.tables {
            Tables::Gaps(_) => SCAN_PER_BLOCK,
            Tables::Ef(_) => EF_SCAN_PER_BLOCK,
        };
        if queries.len() < SCAN_FROM.max(per_block * self.blocks()) {
            return queries.par_iter().map(|&q| self.query(q, k)).collect();
        }
        if queries.len() > u32::MAX as usize {
            return Err(Error::Full(
                "a batch holds fewer than 4,294,967,296 queries: split it".into(),
            ));
        }
        // Each table's sorted queries are cut into pieces walked in parallel.
        let piece = queries
            .len()
            .div_ceil(4 * rayon::current_num_threads())
            .max(SCAN_FROM / 4);
        let sorted = |t: &Table| {
            let mut keys: Vec<(B, u32)> = queries
                .iter()
                .zip(0u32..)
                .map(|(&q, i)| (t.permute(q), i))
                .collect();
            keys.par_sort_unstable();
            keys
        };
        // One table's walk, in pieces: its sorted queries, and how it scans a piece.
        type Scan<'s, B> = dyn Fn(&[(B, u32)]) -> Vec<(u32, B, u32)> + Sync + 's;
        let walk = |t: &Table, scan: &Scan<'_, B>| {
            sorted(t)
                .par_chunks(piece)
                .flat_map_iter(scan)
                .collect::<Vec<_>>()
        };
        let mut found: Vec<(u32, B, u32)> = match &self.tables {
            Tables::Gaps(tables) => tables
                .par_iter()
                .flat_map(|t| walk(&t.table, &|part| t.view().scan(part, k)))
                .collect(),
            Tables::Ef(tables) => tables
                .par_iter()
                .flat_map(|t| walk(&t.table, &|part| t.view().scan(part, k)))
                .collect(),
        };
        found.par_sort_unstable();
        found.dedup();
        // Each query's answers, built in parallel (the id lookups are cache
        // misses), then moved to their places.
        let answers: Vec<(u32, Vec<Match>)> = found
            .par_chunk_by(|a, b| a.0 == b.0)
            .map(|group| {
                let mut m = Vec::new();
                for &(_, fp, distance) in group {
                    if let Some(g) = self.find(fp) {
                        for &id in self.ids_of(g) {
                            m.push(Match { distance, id });
                        }
                    }
                }
                m.sort_unstable();
                (group[0].0, m)
            })
            .collect();
        let mut out = vec![Vec::new(); queries.len()];
        for (q, m) in answers {
            out[q as usize] = m;
        }
        Ok(out)
    }
}

impl<B: Bits> CompressedIndex<B> {
    /// Writes the index file (format version 2 for the paper's codes, 3 for
    /// Elias–Fano codes, see [`IndexFile`]) with the caller's `extra` metadata
    /// and named `sections`. Returns the bytes written.
    pub fn write_to<W: std::io::Write>(
        &self,
        extra: &serde_json::Value,
        sections: &[(&str, &[u8])],
        w: W,
    ) -> Result<u64, Error> {
        let mut own: Vec<(String, &[u8])> = vec![
            ("fps".into(), bytemuck::cast_slice(&self.fps)),
            ("fps.dir".into(), bytemuck::cast_slice(&self.fps_dir)),
            ("starts".into(), bytemuck::cast_slice(&self.starts)),
            ("ids".into(), bytemuck::cast_slice(&self.ids)),
        ];
        let parts: Vec<TableParts<'_>> = match &self.tables {
            Tables::Gaps(t) => t.iter().map(CompressedTable::parts).collect(),
            Tables::Ef(t) => t.iter().map(EfTable::parts).collect(),
        };
        for (i, t) in parts.iter().enumerate() {
            own.push((format!("t{i}.heads"), t.heads));
            own.push((format!("t{i}.bases"), bytemuck::cast_slice(t.bases)));
            own.push((format!("t{i}.dir"), bytemuck::cast_slice(t.block_dir)));
            own.push((format!("t{i}.data"), t.data));
        }
        let coding = self.coding();
        let head = super::file::Head {
            version: coding.format_version(),
            bits: B::BITS,
            entries: self.ids.len() as u64,
            design: &self.design,
            dir_bits: parts.iter().map(|p| p.dir_bits).collect(),
            compressed: Some(CompressedMeta {
                distinct: self.fps.len() as u64,
                fps_dir_bits: self.fps_dir_bits,
                blocks: parts.iter().map(|p| p.blocks as u64).collect(),
                block_keys: parts.iter().map(|p| p.block_keys as u32).collect(),
                code_lengths: parts.into_iter().map(|p| p.code_lengths).collect(),
                coding,
            }),
        };
        super::file::write_file(head, own, extra, sections, w)
    }
}

impl IndexFile {
    /// The compressed index of a version-2 or 3 file, using the file's bytes in place.
    /// Checks the structure (directories, block headers, codes: work in
    /// proportion to the blocks, not the keys), so that a damaged file gives an
    /// error or, past these checks, wrong bits in answers, never a crash;
    /// [`IndexFile::verify`] checks every byte.
    pub fn compressed_index<B: Bits>(&self) -> Result<CompressedIndex<B>, Error> {
        let Some(meta) = self.compressed_meta() else {
            return Err(Error::InvalidConfig(
                "this index file holds plain tables, not compressed ones".into(),
            ));
        };
        if B::BITS != self.bits() {
            return Err(Error::WidthMismatch {
                expected: B::BITS,
                got: self.bits(),
            });
        }
        let design = self.design().clone();
        let tables = design.tables.len();
        let dir_bits = self.dir_bits();
        if design.bits != B::BITS
            || dir_bits.len() != tables
            || meta.blocks.len() != tables
            || meta.code_lengths.len() != tables
            || meta.block_keys.len() != tables
        {
            return Err(corrupt("the design does not match the header"));
        }
        let (n, distinct) = (self.entries(), meta.distinct);
        if n >= u64::from(u32::MAX) || distinct > n {
            return Err(corrupt(format!("{distinct} distinct of {n} entries")));
        }
        if !(1..=26).contains(&meta.fps_dir_bits) {
            return Err(corrupt("the fingerprint directory's size"));
        }
        let fps: Slab<B> = self.slab("fps", distinct)?;
        let fps_dir: Slab<u32> = self.slab("fps.dir", (1u64 << meta.fps_dir_bits) + 1)?;
        let starts: Slab<u32> = self.slab("starts", distinct + 1)?;
        let ids: Slab<u64> = self.slab("ids", n)?;
        if !directory_is_sound(&fps_dir, distinct)
            || starts.first() != Some(&0)
            || starts.last().map(|&s| u64::from(s)) != Some(n)
        {
            return Err(corrupt("the fingerprint directory is damaged"));
        }
        let mut out = Vec::with_capacity(tables);
        let mut efs = Vec::with_capacity(tables);
        for (i, t) in design.tables.iter().enumerate() {
            let (bits, blocks) = (dir_bits[i], meta.blocks[i]);
            let p = t.prefix_bits();
            if !(1..=26).contains(&bits) || bits > p || blocks >= u64::from(u32::MAX) {
                return Err(corrupt(format!("table {i}'s directory or block count")));
            }
            let block_keys = meta.block_keys[i] as usize;
            if !(1..=MAX_BLOCK_KEYS).contains(&block_keys)
                || blocks != (distinct as usize).div_ceil(block_keys) as u64
            {
                return Err(corrupt(format!("table {i}'s block size")));
            }
            let groups = blocks.div_ceil(1 << GROUP_SHIFT);
            let bases: Slab<u64> = self.slab(&format!("t{i}.bases"), groups)?;
            let block_dir: Slab<u32> = self.slab(&format!("t{i}.dir"), (1u64 << bits) + 1)?;
            let data_len = self.section(&format!("t{i}.data")).map_or(0, <[u8]>::len);
            let data: Slab<u8> = self.slab(&format!("t{i}.data"), data_len as u64)?;
            if meta.coding == Coding::EliasFano {
                let heads: Slab<EfHead<B>> = self.slab(&format!("t{i}.heads"), blocks)?;
                efs.push(EfTable::from_parts(
                    i,
                    t,
                    distinct as usize,
                    block_keys,
                    heads,
                    bases,
                    block_dir,
                    bits,
                    data,
                )?);
                continue;
            }
            let heads: Slab<Head<B>> = self.slab(&format!("t{i}.heads"), blocks)?;
            let code = (meta.code_lengths[i].len() == B::BITS as usize)
                .then(|| Huffman::from_lengths(&meta.code_lengths[i]))
                .flatten()
                .ok_or_else(|| corrupt(format!("table {i}'s code")))?;
            if data_len < 16 {
                return Err(corrupt(format!("table {i}'s stream is cut short")));
            }
            // Meeting points in order, inside the stream's padding.
            let mut last = 8u64;
            for (b, h) in heads.iter().enumerate() {
                let meet = bases[b >> GROUP_SHIFT].checked_add(u64::from(h.at));
                match meet {
                    Some(m) if m >= last && m <= data_len as u64 - 8 => last = m,
                    _ => return Err(corrupt(format!("table {i}'s block headers are damaged"))),
                }
            }
            if !directory_is_sound(&block_dir, blocks) {
                return Err(corrupt(format!("table {i}'s blocks are damaged")));
            }
            let (prefix, rest) = t.prefix_masks();
            out.push(CompressedTable {
                table: t.clone(),
                prefix,
                rest,
                block_keys,
                keys: distinct as usize,
                heads,
                bases,
                block_dir,
                dir_bits: bits,
                data,
                code,
            });
        }
        Ok(CompressedIndex {
            design,
            fps,
            fps_dir,
            fps_dir_bits: meta.fps_dir_bits,
            starts,
            ids,
            tables: match meta.coding {
                Coding::Gaps => Tables::Gaps(out),
                Coding::EliasFano => Tables::Ef(efs),
            },
        })
    }
}
