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
use super::radix;
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
}

impl Huffman {
    fn new(freq: &[u64]) -> Huffman {
        let lengths = limited_lengths(freq, MAX_CODE);
        // Canonical codes: by (length, symbol).
        let mut order: Vec<usize> = (0..freq.len()).filter(|&s| lengths[s] > 0).collect();
        order.sort_by_key(|&s| (lengths[s], s));
        let mut codes = vec![(0u32, 0u32); freq.len()];
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
        Huffman { codes, decode }
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
        let at = self.pos / 8;
        let word = u64::from_le_bytes(self.bytes[at..at + 8].try_into().expect("padded"));
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

/// One compressed table.
#[derive(Clone, Debug)]
pub struct CompressedTable<B: Bits> {
    table: Table,
    prefix: B,
    /// First key of each block, and where each block starts in `data` (bytes).
    block_first: Vec<B>,
    block_start: Vec<u32>,
    /// Entries in each block.
    block_len: Vec<u16>,
    /// `block_dir[v]`: the first block whose first key's top `dir_bits` bits are >= v.
    block_dir: Vec<u32>,
    dir_bits: u32,
    data: Vec<u8>,
    code: Huffman,
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
        let (mut block_first, mut block_start, mut block_len) =
            (Vec::new(), Vec::new(), Vec::new());
        let mut prev = B::zero();
        let mut in_block = 0usize;
        for &key in sorted {
            let full = in_block == 0
                || w.bytes.len() - *block_start.last().expect("a block") as usize >= block_bytes
                || in_block == u16::MAX as usize;
            if full {
                w.align();
                block_first.push(key);
                block_start.push(w.bytes.len() as u32);
                block_len.push(0);
                in_block = 0;
            } else {
                let h = high_bit(prev.xor(key));
                let (c, len) = code.codes[h as usize];
                w.put(c as u64, len);
                w.put_wide(key, h);
            }
            in_block += 1;
            *block_len.last_mut().expect("a block") += 1;
            prev = key;
        }
        w.align();
        w.bytes.extend_from_slice(&[0u8; 8]);
        let p = table.prefix_bits();
        let dir_bits = super::table::dir_bits_for(block_first.len(), p);
        let mut block_dir = vec![0u32; (1 << dir_bits) + 1];
        for f in &block_first {
            block_dir[f.top(dir_bits) as usize + 1] += 1;
        }
        for v in 0..1usize << dir_bits {
            block_dir[v + 1] += block_dir[v];
        }
        CompressedTable {
            table: table.clone(),
            prefix: B::mask(B::BITS - p, p),
            block_first,
            block_start,
            block_len,
            block_dir,
            dir_bits,
            data: w.bytes,
            code,
        }
    }

    /// Bits per key: the coded stream, and with the block directory.
    pub fn bits_per_key(&self, n: usize) -> (f64, f64) {
        let stream = (self.data.len() - 8) as f64 * 8.0;
        let dir = self.block_first.len() as f64 * (B::BITS as f64 + 32.0 + 16.0)
            + self.block_dir.len() as f64 * 32.0;
        let n = n.max(1) as f64;
        (stream / n, (stream + dir) / n)
    }

    /// Bytes held.
    pub fn memory(&self) -> usize {
        self.data.len()
            + self.block_first.len() * (std::mem::size_of::<B>() + 6)
            + self.block_dir.len() * 4
    }

    /// The permuted query and its directory slot, prefetched.
    #[inline]
    fn start(&self, query: B) -> (B, usize) {
        let key = self.table.permute(query);
        let v = key.and(self.prefix).top(self.dir_bits) as usize;
        super::table::prefetch(&self.block_dir[v]);
        (key, v)
    }

    /// Prefetches the block keys and offsets the directory slot `v` points at.
    #[inline]
    fn touch(&self, v: usize) {
        let from = (self.block_dir[v] as usize).saturating_sub(1);
        if let (Some(f), Some(s)) = (self.block_first.get(from), self.block_start.get(from)) {
            super::table::prefetch(f);
            super::table::prefetch(s);
        }
    }

    /// The first block to decode for `key`, its data prefetched.
    #[inline]
    fn locate(&self, key: B, v: usize) -> usize {
        let lo = key.and(self.prefix);
        // The last block whose first key is <= the smallest key with this prefix:
        // among the blocks whose first keys share lo's top bits (the directory),
        // or the one just before them.
        let (from, to) = (self.block_dir[v] as usize, self.block_dir[v + 1] as usize);
        let within = self.block_first[from..to].partition_point(|&f| f <= lo);
        let b = (from + within).saturating_sub(1);
        if let Some(&at) = self.block_start.get(b) {
            for line in (0..256).step_by(64) {
                if let Some(byte) = self.data.get(at as usize + line) {
                    super::table::prefetch(byte);
                }
            }
        }
        b
    }

    /// Keys within `k` of `key` (permuted), from block `b` on, as fingerprints.
    fn probe_from(&self, key: B, mut b: usize, k: u32, out: &mut Vec<(B, u32)>) {
        let lo = key.and(self.prefix);
        while b < self.block_first.len() {
            if self.block_first[b].and(self.prefix) > lo {
                return; // this block starts past the prefix
            }
            let mut r = BitReader {
                bytes: &self.data,
                pos: self.block_start[b] as usize * 8,
            };
            let mut cur = self.block_first[b];
            let mut j = 0;
            loop {
                let p = cur.and(self.prefix);
                if p > lo {
                    return;
                }
                if p == lo {
                    let d = cur.distance(key);
                    if d <= k {
                        out.push((self.table.unpermute(cur), d));
                    }
                }
                j += 1;
                if j == self.block_len[b] as usize {
                    break;
                }
                // One 64-bit window (at least 57 valid bits) holds the code and,
                // usually, the bits below h too: one load per key, not two.
                let window = r.peek(57);
                let (h, len) = self.code.decode[(window & ((1 << MAX_CODE) - 1)) as usize];
                let (h, len) = (h as u32, len as u32);
                let low = if len + h <= 57 {
                    r.pos += (len + h) as usize;
                    let below = if h == 0 { 0 } else { u64::MAX >> (64 - h) };
                    B::from_u128(((window >> len) & below) as u128)
                } else {
                    r.pos += len as usize;
                    r.take_wide::<B>(h)
                };
                // Above h: as before; at h: 1; below: the stored bits.
                let above = if h + 1 >= B::BITS {
                    B::zero()
                } else {
                    cur.and(B::mask(h + 1, B::BITS - h - 1))
                };
                cur = above.or(B::mask(h, 1)).or(low);
            }
            b += 1;
        }
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
    fps: Vec<B>,
    starts: Vec<u32>,
    ids: Vec<u64>,
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
        let ids = pairs.into_iter().map(|(_, id)| id).collect();
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
        Ok(CompressedIndex {
            design,
            fps,
            starts,
            ids,
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
            + self.ids.len() * 8
    }

    /// Every entry within `k` of `query`, each once, nearest first (ties by id).
    pub fn query(&self, query: B, k: u32) -> Result<Vec<Match>, Error> {
        if k > self.design.k {
            return Err(Error::InvalidConfig(format!(
                "k = {k} is larger than this index's maximum k = {}",
                self.design.k
            )));
        }
        // In phases over all tables, so that their cache misses overlap:
        // directory slots, block keys, block data, then decoding.
        let mut found = Vec::new();
        let starts: Vec<(B, usize)> = self.tables.iter().map(|t| t.start(query)).collect();
        for (t, &(_, v)) in self.tables.iter().zip(&starts) {
            t.touch(v);
        }
        let blocks: Vec<usize> = self
            .tables
            .iter()
            .zip(&starts)
            .map(|(t, &(key, v))| t.locate(key, v))
            .collect();
        for ((t, &(key, _)), &b) in self.tables.iter().zip(&starts).zip(&blocks) {
            t.probe_from(key, b, k, &mut found);
        }
        found.sort_unstable();
        found.dedup();
        let mut out = Vec::new();
        for (fp, distance) in found {
            if let Ok(g) = self.fps.binary_search(&fp) {
                for &id in &self.ids[self.starts[g] as usize..self.starts[g + 1] as usize] {
                    out.push(Match { distance, id });
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// [`CompressedIndex::query`] for many queries, in parallel.
    pub fn query_batch(&self, queries: &[B], k: u32) -> Result<Vec<Vec<Match>>, Error> {
        queries.par_iter().map(|&q| self.query(q, k)).collect()
    }
}
