//! Compressed tables (Manku, Jain & Das Sarma §3.2).
//!
//! In a sorted table successive keys share their top bits. Keys are stored in
//! blocks of about `block_bytes`: the block's first key whole, then for every
//! next key the position h of its highest bit that differs from the previous key
//! (the key has a 1 there, the previous a 0), Huffman-coded with one code per
//! table, followed by the key's h bits below it. Each block's first key is kept
//! apart for the search; a query decodes only the blocks that can hold its prefix.
//! Tables store keys only: an entry's ids are found once, from its fingerprint,
//! in a primary array sorted by fingerprint.

use rayon::prelude::*;

use super::Match;
use super::bits::Bits;
use super::design::{Table, TableDesign};
use super::file::{
    COMPRESSED_FORMAT_VERSION, CompressedMeta, IndexFile, corrupt, directory_is_sound,
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
        // Codes are written LSB first, so store them bit-reversed.
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

/// Bits written least significant first.
#[derive(Default)]
struct BitWriter {
    bytes: Vec<u8>,
    acc: u64,
    n: u32,
}

impl BitWriter {
    fn put(&mut self, value: u64, bits: u32) {
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
    fn put_wide<B: Bits>(&mut self, value: B, bits: u32) {
        let mut done = 0;
        while done < bits {
            let take = (bits - done).min(32);
            self.put(value.field(done, take).to_u128() as u64, take);
            done += take;
        }
    }
    fn align(&mut self) {
        if self.n > 0 {
            self.bytes.push(self.acc as u8);
            self.acc = 0;
            self.n = 0;
        }
    }
}

/// Reads bits least significant first; the data has 8 bytes of zero padding.
struct BitReader<'a> {
    bytes: &'a [u8],
    pos: usize, // in bits
}

impl BitReader<'_> {
    #[inline]
    fn peek(&self, bits: u32) -> u64 {
        // The stream ends with 8 bytes of padding; past the end (a damaged
        // file) it reads zeros rather than out of bounds.
        let at = self.pos / 8;
        let word = self
            .bytes
            .get(at..at + 8)
            .map_or(0, |w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
        (word >> (self.pos % 8)) & (u64::MAX >> (64 - bits.max(1)))
    }
    #[inline]
    fn take(&mut self, bits: u32) -> u64 {
        let v = self.peek(bits);
        self.pos += bits as usize;
        v
    }
    #[inline]
    fn take_wide<B: Bits>(&mut self, bits: u32) -> B {
        if bits <= 56 {
            return B::from_u128(self.take(bits) as u128);
        }
        let mut v = B::zero();
        let mut done = 0;
        while done < bits {
            let take = (bits - done).min(32);
            v = v.or(B::from_u128(self.take(take) as u128).shl(done));
            done += take;
        }
        v
    }
}

/// A block's header, kept apart from the coded stream for the search: its first
/// key whole, and in one more word where its codes start in the stream (bytes,
/// low 32 bits) and how many keys it holds (the next 16). One struct, so that
/// finding the block also fetches where it starts; two words of one type, so
/// that it has no padding and files hold it as it is.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Head<B> {
    first: B,
    at: B,
}

// SAFETY: `Head` is `repr(C)` with two fields of the same `Pod` type, so it has
// no padding, and every bit pattern of it is valid.
unsafe impl<B: Bits> bytemuck::Zeroable for Head<B> {}
// SAFETY: as above.
unsafe impl<B: Bits> bytemuck::Pod for Head<B> {}

impl<B: Bits> Head<B> {
    fn new(first: B, start: u32, len: u16) -> Self {
        Head {
            first,
            at: B::from_u128(u128::from(start) | u128::from(len) << 32),
        }
    }
    #[inline]
    fn start(&self) -> usize {
        self.at.to_u128() as u32 as usize
    }
    #[inline]
    fn len(&self) -> u16 {
        (self.at.to_u128() >> 32) as u16
    }
}

/// One compressed table.
#[derive(Clone, Debug)]
pub struct CompressedTable<B: Bits> {
    table: Table,
    /// The key bits of the table's prefix, and the bits below it.
    prefix: B,
    rest: B,
    heads: Slab<Head<B>>,
    /// `block_dir[v]`: the first block whose first key's top `dir_bits` bits are >= v.
    block_dir: Slab<u32>,
    dir_bits: u32,
    data: Slab<u8>,
    code: Huffman,
}

/// A table's arrays for one query or walk: slices resolved once, so that the
/// decoding loop does not go through [`Slab`] at every key.
#[derive(Clone, Copy)]
struct View<'a, B: Bits> {
    table: &'a Table,
    prefix: B,
    rest: B,
    heads: &'a [Head<B>],
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
        let mut w = BitWriter::default();
        // (first key, start, keys) per block.
        let mut blocks: Vec<(B, u32, u16)> = Vec::new();
        let mut prev = B::zero();
        for &key in sorted {
            let full = blocks.last().is_none_or(|&(_, start, len)| {
                w.bytes.len() - start as usize >= block_bytes || len == u16::MAX
            });
            if full {
                w.align();
                blocks.push((key, w.bytes.len() as u32, 0));
            } else {
                let h = high_bit(prev.xor(key));
                let (c, len) = code.codes[h as usize];
                w.put(c as u64, len);
                w.put_wide(key, h);
            }
            blocks.last_mut().expect("a block").2 += 1;
            prev = key;
        }
        w.align();
        w.bytes.extend_from_slice(&[0u8; 8]);
        let heads: Vec<Head<B>> = blocks
            .into_iter()
            .map(|(first, start, len)| Head::new(first, start, len))
            .collect();
        let p = table.prefix_bits();
        let dir_bits = super::table::dir_bits_for(heads.len(), p);
        let block_dir = super::table::directory(heads.iter().map(|h| h.first), dir_bits);
        CompressedTable {
            table: table.clone(),
            prefix: B::mask(B::BITS - p, p),
            rest: B::mask(0, B::BITS - p),
            heads: heads.into(),
            block_dir: block_dir.into(),
            dir_bits,
            data: w.bytes.into(),
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
            heads: &self.heads,
            block_dir: &self.block_dir,
            dir_bits: self.dir_bits,
            data: &self.data,
            code: &self.code,
        }
    }

    /// Bits per key: the coded stream, and with the block headers and the
    /// directory as memory holds them.
    pub fn bits_per_key(&self, n: usize) -> (f64, f64) {
        // Less the stream's 8 bytes of padding.
        let stream = self.data.len().saturating_sub(8) as f64 * 8.0;
        let n = n.max(1) as f64;
        (stream / n, self.memory().saturating_sub(8) as f64 * 8.0 / n)
    }

    /// Bytes held.
    pub fn memory(&self) -> usize {
        self.data.len()
            + self.heads.len() * std::mem::size_of::<Head<B>>()
            + self.block_dir.len() * 4
    }
}

impl<B: Bits> View<'_, B> {
    /// Starts a probe for `query`: its permuted key and directory slot, with the
    /// slot prefetched.
    #[inline]
    fn start(&self, query: B) -> Cursor<B> {
        let key = self.table.permute(query);
        let slot = key.top(self.dir_bits) as usize;
        super::table::prefetch(&self.block_dir[slot]);
        Cursor {
            key,
            lo: key.and(self.prefix),
            slot,
            ..Cursor::default()
        }
    }

    /// Prefetches the block headers the directory slot points at.
    #[inline]
    fn touch(&self, p: &Cursor<B>) {
        let (from, to) = (
            self.block_dir[p.slot] as usize,
            self.block_dir[p.slot + 1] as usize,
        );
        if let Some(h) = self.heads.get(from.saturating_sub(1)) {
            super::table::prefetch(h);
        }
        if let Some(h) = self.heads.get(to.saturating_sub(1)) {
            super::table::prefetch(h);
        }
    }

    /// The last block whose first key is <= `lo` (the smallest key with its
    /// prefix), or 0: among the blocks whose first keys share lo's top bits (the
    /// directory slot `slot`), or the one just before them.
    #[inline]
    fn block_for(&self, lo: B, slot: usize) -> usize {
        let (from, to) = (
            self.block_dir[slot] as usize,
            self.block_dir[slot + 1] as usize,
        );
        let within = self.heads[from..to].partition_point(|h| h.first <= lo);
        (from + within).saturating_sub(1)
    }

    /// Finds the first block to decode, and prefetches the part of its data that
    /// the probe will read.
    #[inline]
    fn locate(&self, p: &mut Cursor<B>) {
        let lo = p.lo;
        p.block = self.block_for(lo, p.slot);
        let Some(head) = self.heads.get(p.block) else {
            return;
        };
        // Keys are close to uniform within a block, so decoding stops about where
        // the prefix's last key falls between this block's first key and the
        // next one's: fetch the block's data up to there, and a line more.
        let at = head.start();
        let reach = match self.heads.get(p.block + 1) {
            Some(next) => {
                let first = head.first.to_u128() as f64;
                let last = lo.or(self.rest).to_u128() as f64;
                let span = next.first.to_u128() as f64 - first;
                let bytes = next.start().saturating_sub(head.start()) as f64;
                (((last - first) / span).min(1.0) * bytes) as usize + 64
            }
            None => self.data.len() - at,
        };
        let end = (at + reach).min(self.data.len());
        let mut line = at;
        while line < end {
            super::table::prefetch(&self.data[line]);
            line += 64;
        }
    }

    /// Enters block `b` for the probe's key: false if there is none, or if it
    /// starts past the key's prefix.
    #[inline]
    fn enter(&self, c: &mut Cursor<B>, b: usize) -> bool {
        match self.heads.get(b) {
            Some(head) if head.first.and(self.prefix) <= c.lo => {
                c.block = b;
                c.pos = head.start() * 8;
                c.cur = head.first;
                c.left = head.len();
                true
            }
            _ => false,
        }
    }

    /// Checks the cursor's key against the query and decodes the next one: false
    /// once the keys are past the query's prefix.
    #[inline]
    fn step(&self, c: &mut Cursor<B>, k: u32, out: &mut Vec<(B, u32)>) -> bool {
        let prefix = c.cur.and(self.prefix);
        if prefix > c.lo {
            return false;
        }
        if prefix == c.lo {
            let d = c.cur.distance(c.key);
            if d <= k {
                out.push((self.table.unpermute(c.cur), d));
            }
        }
        self.advance(c)
    }

    /// Decodes the cursor's next key: false at the end of the table, or when the
    /// next block starts past the cursor's prefix.
    #[inline(always)]
    fn advance(&self, c: &mut Cursor<B>) -> bool {
        c.left = c.left.saturating_sub(1);
        if c.left == 0 {
            return self.enter(c, c.block + 1);
        }
        // One 64-bit window (at least 57 valid bits) holds the code and, usually,
        // the bits below h too: one load per key, not two.
        let mut r = BitReader {
            bytes: self.data,
            pos: c.pos,
        };
        let window = r.peek(57);
        let (h, len) = match self.code.fast[(window & ((1 << FAST_CODE) - 1)) as usize] {
            (_, 0) => self.code.decode[(window & ((1 << MAX_CODE) - 1)) as usize],
            e => e,
        };
        let (h, len) = (h as u32, len as u32);
        let low = if len + h <= 57 {
            r.pos += (len + h) as usize;
            B::from_u128(((window >> len) & ((1u64 << h) - 1)) as u128)
        } else {
            r.pos += len as usize;
            r.take_wide::<B>(h)
        };
        c.pos = r.pos;
        // Above h: as before (h is a 0 in the previous key); at h: 1; below: the
        // stored bits.
        c.cur = c.cur.shr(h).or(B::from_u128(1)).shl(h).or(low);
        true
    }

    /// Every key within `k` of the queries `sorted` (permuted keys with their
    /// query numbers, ascending), as (query, fingerprint, distance): one walk
    /// along the table, decoding each block the queries need once, and jumping
    /// over the blocks they do not.
    fn scan(&self, sorted: &[(B, u32)], k: u32) -> Vec<(u32, B, u32)> {
        let mut out = Vec::new();
        let mut run: Vec<B> = Vec::new();
        let mut c = Cursor::default();
        let mut live = false;
        let mut i = 0;
        while i < sorted.len() {
            let lo = sorted[i].0.and(self.prefix);
            let same = sorted[i..].partition_point(|q| q.0.and(self.prefix) == lo);
            // The walk stands at the first key past the previous prefix; jump
            // ahead when the block that holds this prefix is further on.
            c.lo = lo;
            let b = self.block_for(lo, lo.top(self.dir_bits) as usize);
            if !live || b > c.block {
                live = self.enter(&mut c, b);
            }
            run.clear();
            while live {
                let p = c.cur.and(self.prefix);
                if p > lo {
                    break;
                }
                if p == lo {
                    run.push(c.cur);
                }
                live = self.advance(&mut c);
            }
            for &(key, q) in &sorted[i..i + same] {
                for &cur in &run {
                    let d = cur.distance(key);
                    if d <= k {
                        out.push((q, self.table.unpermute(cur), d));
                    }
                }
            }
            i += same;
        }
        out
    }
}

/// One table's probe: the permuted query and its prefix, the directory slot,
/// the block, where in the stream, the current key and how many keys the block
/// has left.
#[derive(Clone, Copy, Default)]
struct Cursor<B> {
    key: B,
    lo: B,
    slot: usize,
    block: usize,
    pos: usize,
    cur: B,
    left: u16,
}

/// Batches from this size are answered by walking the tables (see
/// [`CompressedIndex::query_batch`]); smaller ones query by query.
const SCAN_FROM: usize = 4096;

/// Tables probed together, so that their cache misses overlap.
const MAX_TABLES: usize = 32;

/// Appends every key within `k` of `query` in `tables` (at most [`MAX_TABLES`])
/// to `found`, in phases over all tables so that their cache misses overlap:
/// directory slots, block headers, block data, then decoding.
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
    // Decoding is a chain of dependent loads per table: step the tables in turn,
    // one key each, so that the chains overlap instead of running one by one.
    let mut active = [0u8; MAX_TABLES];
    let mut live = 0;
    for (i, (t, c)) in tables.iter().zip(cursors.iter_mut()).enumerate() {
        if t.enter(c, c.block) {
            active[live] = i as u8;
            live += 1;
        }
    }
    while live > 0 {
        let mut kept = 0;
        for a in 0..live {
            let i = active[a] as usize;
            if tables[i].step(&mut cursors[i], k, found) {
                active[kept] = i as u8;
                kept += 1;
            }
        }
        live = kept;
    }
}

/// The position of the highest set bit of a non-zero word.
#[inline]
fn high_bit<B: Bits>(x: B) -> u32 {
    127 - x.to_u128().leading_zeros()
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
    tables: Vec<CompressedTable<B>>,
}

impl<B: Bits> CompressedIndex<B> {
    /// Builds the compressed tables of `design` over `entries`, in blocks of about
    /// `block_bytes` (the paper uses 1024; smaller blocks decode faster).
    pub fn build(
        design: TableDesign,
        entries: impl IntoIterator<Item = (u64, B)>,
        block_bytes: usize,
    ) -> Result<Self, Error> {
        if design.bits != B::BITS {
            return Err(Error::WidthMismatch {
                expected: design.bits,
                got: B::BITS,
            });
        }
        let mut pairs: Vec<(B, u64)> = entries.into_iter().map(|(id, f)| (f, id)).collect();
        pairs.par_sort_unstable();
        let mut fps = Vec::new();
        let mut starts = Vec::new();
        for (i, &(f, _)) in pairs.iter().enumerate() {
            if i == 0 || pairs[i - 1].0 != f {
                fps.push(f);
                starts.push(i as u32);
            }
        }
        starts.push(pairs.len() as u32);
        let ids: Vec<u64> = pairs.into_iter().map(|(_, id)| id).collect();
        let tables = design
            .tables
            .par_iter()
            .map(|t| {
                let mut keys: Vec<B> = fps.iter().map(|&f| t.permute(f)).collect();
                let d = super::table::dir_bits_for(keys.len(), t.prefix_bits()).min(26);
                radix::sort_by_top(&mut keys, &mut Vec::new(), d);
                keys.par_sort_unstable();
                CompressedTable::build(t, &keys, block_bytes)
            })
            .collect();
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

    /// The tables.
    pub fn tables(&self) -> &[CompressedTable<B>] {
        &self.tables
    }

    /// Distinct fingerprints stored.
    pub fn distinct(&self) -> usize {
        self.fps.len()
    }

    /// Bytes held.
    pub fn memory(&self) -> usize {
        self.tables
            .iter()
            .map(CompressedTable::memory)
            .sum::<usize>()
            + self.fps.len() * (std::mem::size_of::<B>() + 4)
            + self.fps_dir.len() * 4
            + self.ids.len() * 8
    }

    fn check_k(&self, k: u32) -> Result<(), Error> {
        if k > self.design.k {
            return Err(Error::InvalidConfig(format!(
                "k = {k} is larger than this index's maximum k = {}",
                self.design.k
            )));
        }
        Ok(())
    }

    /// Every entry within `k` of `query`, each once, nearest first (ties by id).
    pub fn query(&self, query: B, k: u32) -> Result<Vec<Match>, Error> {
        self.check_k(k)?;
        let mut found = Vec::new();
        for tables in self.tables.chunks(MAX_TABLES) {
            probe(tables, query, k, &mut found);
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
        if queries.len() < SCAN_FROM {
            return queries.par_iter().map(|&q| self.query(q, k)).collect();
        }
        if queries.len() > u32::MAX as usize {
            return Err(Error::InvalidConfig(
                "a batch holds fewer than 4,294,967,296 queries: split it".into(),
            ));
        }
        // Each table's sorted queries are cut into pieces walked in parallel.
        let piece = queries
            .len()
            .div_ceil(4 * rayon::current_num_threads())
            .max(SCAN_FROM / 4);
        let mut found: Vec<(u32, B, u32)> = self
            .tables
            .par_iter()
            .flat_map(|t| {
                let mut keys: Vec<(B, u32)> = queries
                    .iter()
                    .zip(0u32..)
                    .map(|(&q, i)| (t.table.permute(q), i))
                    .collect();
                keys.par_sort_unstable();
                keys.par_chunks(piece)
                    .flat_map_iter(|part| t.view().scan(part, k))
                    .collect::<Vec<_>>()
            })
            .collect();
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
    /// Writes the index file (format version 2, see [`IndexFile`]) with the
    /// caller's `extra` metadata and named `sections`. Returns the bytes written.
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
        for (i, t) in self.tables.iter().enumerate() {
            own.push((format!("t{i}.heads"), bytemuck::cast_slice(&t.heads)));
            own.push((format!("t{i}.dir"), bytemuck::cast_slice(&t.block_dir)));
            own.push((format!("t{i}.data"), &t.data));
        }
        let head = super::file::Head {
            version: COMPRESSED_FORMAT_VERSION,
            bits: B::BITS,
            entries: self.ids.len() as u64,
            design: &self.design,
            dir_bits: self.tables.iter().map(|t| t.dir_bits).collect(),
            compressed: Some(CompressedMeta {
                distinct: self.fps.len() as u64,
                fps_dir_bits: self.fps_dir_bits,
                blocks: self.tables.iter().map(|t| t.heads.len() as u64).collect(),
                code_lengths: self.tables.iter().map(|t| t.code.lengths()).collect(),
            }),
        };
        super::file::write_file(head, own, extra, sections, w)
    }
}

impl IndexFile {
    /// The compressed index of a version-2 file, using the file's bytes in place.
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
        for (i, t) in design.tables.iter().enumerate() {
            let (bits, blocks) = (dir_bits[i], meta.blocks[i]);
            let p = t.prefix_bits();
            if !(1..=26).contains(&bits) || bits > p || blocks >= u64::from(u32::MAX) {
                return Err(corrupt(format!("table {i}'s directory or block count")));
            }
            let heads: Slab<Head<B>> = self.slab(&format!("t{i}.heads"), blocks)?;
            let block_dir: Slab<u32> = self.slab(&format!("t{i}.dir"), (1u64 << bits) + 1)?;
            let data_len = self.section(&format!("t{i}.data")).map_or(0, <[u8]>::len);
            let data: Slab<u8> = self.slab(&format!("t{i}.data"), data_len as u64)?;
            let code = (meta.code_lengths[i].len() == B::BITS as usize)
                .then(|| Huffman::from_lengths(&meta.code_lengths[i]))
                .flatten()
                .ok_or_else(|| corrupt(format!("table {i}'s code")))?;
            if data_len < 8 {
                return Err(corrupt(format!("table {i}'s stream is cut short")));
            }
            let mut keys = 0u64;
            let mut last = 0;
            for h in heads.iter() {
                if h.len() == 0 || h.start() < last || h.start() + 8 > data_len {
                    return Err(corrupt(format!("table {i}'s block headers are damaged")));
                }
                last = h.start();
                keys += u64::from(h.len());
            }
            if keys != distinct || !directory_is_sound(&block_dir, blocks) {
                return Err(corrupt(format!("table {i}'s blocks are damaged")));
            }
            out.push(CompressedTable {
                table: t.clone(),
                prefix: B::mask(B::BITS - p, p),
                rest: B::mask(0, B::BITS - p),
                heads,
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
            tables: out,
        })
    }
}
