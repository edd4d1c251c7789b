//! [`MultiIndex`]: the online counterpart of the multi-index self-join
//! ([`RadiusDesign`], Norouzi, Punjani & Fleet 2012), for a large k.
//!
//! The bits are cut into m blocks, block i searched within a radius r_i,
//! where Σ (r_i + 1) = k + 1. A stored fingerprint within k of a query lies
//! within r_i of it on at least one block i (were every block r_i + 1 or
//! more bits apart, the whole would be more than k apart). Each block keeps
//! its stored fingerprints' slot numbers grouped by the block's value, as
//! bucket lists (a directory of offsets and one array of slots, CSR). A
//! query looks up, on every block, its own bucket and the buckets within
//! the block's radius of it, and measures the full distance of each
//! fingerprint found there. A match is reported by the first block on which
//! it lies within that block's radius, so each match comes out once, and the
//! answer is exact for every k up to the design's.
//!
//! **Memory.** Per stored fingerprint: the fingerprint itself (8 or 16
//! bytes), its id (8 bytes), a deletion bit, and per block its 4-byte slot
//! and the 64 bits of it outside the block (8 bytes); plus per block a
//! directory of 2^d + 1 offsets of 4 bytes, where d is the block's length,
//! or one bit less than log2(n) while the index is smaller (at most 2 bytes
//! per fingerprint per block). At 128 bits and k = 19 the planner's seven
//! blocks of 18-19 bits take 16 + 8 + 7 × 12 = 108 bytes per fingerprint,
//! plus the directories (9 MB in all once n passes 2^20) — where permuted
//! tables for the same k need 210 tables of 20 bytes each.
//!
//! **Cost of a query.** On block i, Σ_{j<=r_i} C(d_i, j) bucket look-ups
//! (every block's requested together, so that the misses overlap), and the
//! entries of those buckets: for n uniformly random fingerprints, n / 2^d_i
//! per bucket. Each entry's slot and 64 bits outside the block are read in
//! sequence with the bucket (its lines requested a few buckets ahead of
//! their reading), and their distance to the query's (a lower bound of the
//! whole distance) leaves only the few within k to be read from the
//! fingerprint array at random: at 128 bits, two unrelated fingerprints are
//! within 19 on 64 bits about once in 1,300. Block i reports only what no
//! earlier block does, so what it reports is more than r_j from the query on
//! each earlier block j: those its 64 bits leave out lower what the screen
//! allows them ([`credits`]), exactly. Crowded text fills some buckets
//! more (and more of their entries pass, being related); the planner
//! ([`super::plan_online`]) estimates candidates from a sample of the
//! fingerprints themselves. A query is bound by memory latency: the look-ups
//! and bucket lines are requested ahead so that many are in flight at once.
//!
//! **Growth.** Additions are searchable at once, scanned linearly until they
//! are an eighth of the indexed ones; then they are merged into each block
//! bucket by bucket (the old bucket copied as it is, the new slots after it),
//! without sorting what is indexed. A block's directory is rebuilt only when
//! the index has grown enough to want a wider one (at most once per
//! doubling). Deletions mark a bit; the blocks are rebuilt without the
//! deleted once they are a quarter of the slots.

use rayon::prelude::*;

use super::Match;
use super::bits::Bits;
use super::radius::{Block, RadiusDesign};
use super::table::prefetch;
use crate::error::Error;

/// One block's bucket lists over slots `0..indexed`.
#[derive(Clone, Debug)]
struct BlockTable {
    block: Block,
    /// Top bits of the block's value that pick a bucket (at most its length).
    dir_bits: u32,
    /// `entries[dir[b]..dir[b + 1]]` are the entries of bucket b.
    dir: Vec<u32>,
    entries: Vec<Entry>,
    /// Every xor mask of `dir_bits` bits with at most the radius's ones,
    /// 0 first: the buckets a query looks up.
    flips: Vec<u32>,
}

/// A stored fingerprint in a block's bucket: its slot, and beside it 64 bits
/// of the fingerprint outside the block ([`rest`]), read in sequence with the
/// bucket. Their distance to the query's is a lower bound of the whole
/// distance, so that the fingerprint itself (a random read) is fetched only
/// for the few within k on them. Twelve bytes: three 4-byte words, so that
/// the slot is read with the bits and costs no read of its own.
#[derive(Clone, Copy, Debug, Default)]
struct Entry([u32; 3]);

impl Entry {
    #[inline]
    fn new(rest: u64, slot: u32) -> Entry {
        Entry([rest as u32, (rest >> 32) as u32, slot])
    }

    #[inline]
    fn rest(self) -> u64 {
        u64::from(self.0[1]) << 32 | u64::from(self.0[0])
    }

    #[inline]
    fn slot(self) -> u32 {
        self.0[2]
    }
}

/// The 64 bits of `fp` that follow `block` (wrapping around the width),
/// none of the block's own (those of a 64-bit fingerprint are zeroed; blocks
/// are at most 64 bits wide). Their distance to the same bits of another
/// fingerprint plus the distance on the block is at most the whole distance.
#[inline]
fn rest<B: Bits>(block: &Block, fp: B) -> u64 {
    let shift = (block.start + block.len) % B::BITS;
    let v = fp.to_u128();
    if B::BITS == 64 {
        // The block's bits are now the top ones.
        (v as u64).rotate_right(shift) & u64::MAX.checked_shr(block.len).unwrap_or(0)
    } else {
        v.rotate_right(shift) as u64
    }
}

/// Directory bits for `n` fingerprints on a block of `len` bits: about two
/// fingerprints per bucket until the block's own length caps it.
pub(crate) fn dir_bits_for(n: usize, len: u32) -> u32 {
    let log = usize::BITS - n.max(2).leading_zeros() - 1;
    log.saturating_sub(1).clamp(1, len)
}

/// Every mask of `bits` bits with at most `ones` ones, ascending by ones.
fn masks(bits: u32, ones: u32) -> Vec<u32> {
    fn extend(from: u32, bits: u32, left: u32, acc: u32, out: &mut Vec<u32>) {
        if left == 0 {
            out.push(acc);
            return;
        }
        for b in from..bits {
            extend(b + 1, bits, left - 1, acc | 1 << b, out);
        }
    }
    let mut out = Vec::new();
    for r in 0..=ones.min(bits) {
        extend(0, bits, r, 0, &mut out);
    }
    out
}

impl BlockTable {
    #[inline]
    fn bucket<B: Bits>(block: &Block, dir_bits: u32, fp: B) -> usize {
        (fp.field(block.start, block.len).to_u128() >> (block.len - dir_bits)) as usize
    }

    /// The block's buckets over every slot of `fps` (a counting sort).
    fn build<B: Bits>(block: Block, fps: &[B]) -> BlockTable {
        let dir_bits = dir_bits_for(fps.len(), block.len);
        let buckets = 1usize << dir_bits;
        let mut dir = super::mem::with_huge_capacity(buckets + 1);
        dir.resize(buckets + 1, 0u32);
        for &f in fps {
            dir[Self::bucket(&block, dir_bits, f) + 1] += 1;
        }
        for b in 0..buckets {
            dir[b + 1] += dir[b];
        }
        let mut fill = dir[..buckets].to_vec();
        let mut entries = super::mem::with_huge_capacity(fps.len());
        entries.resize(fps.len(), Entry::default());
        for (i, &f) in fps.iter().enumerate() {
            let at = &mut fill[Self::bucket(&block, dir_bits, f)];
            entries[*at as usize] = Entry::new(rest(&block, f), i as u32);
            *at += 1;
        }
        BlockTable {
            block,
            dir_bits,
            dir,
            entries,
            flips: masks(dir_bits, block.radius),
        }
    }

    /// This table with slots `start..fps.len()` added: each old bucket
    /// copied, then its new slots. Rebuilt instead when `fps` wants a wider
    /// directory.
    fn merged<B: Bits>(&self, fps: &[B], start: usize) -> BlockTable {
        let n = fps.len();
        if dir_bits_for(n, self.block.len) != self.dir_bits {
            return Self::build(self.block, fps);
        }
        let (block, dir_bits) = (&self.block, self.dir_bits);
        let buckets = self.dir.len() - 1;
        let mut added = vec![0u32; buckets + 1];
        for &f in &fps[start..] {
            added[Self::bucket(block, dir_bits, f) + 1] += 1;
        }
        for b in 0..buckets {
            added[b + 1] += added[b];
        }
        let mut grouped = vec![0u32; n - start];
        let mut fill = added[..buckets].to_vec();
        for (i, &f) in fps.iter().enumerate().skip(start) {
            let at = &mut fill[Self::bucket(block, dir_bits, f)];
            grouped[*at as usize] = i as u32;
            *at += 1;
        }
        let mut entries = super::mem::with_huge_capacity(n);
        let mut dir = super::mem::with_huge_capacity(buckets + 1);
        for b in 0..buckets {
            dir.push(entries.len() as u32);
            let old = self.dir[b] as usize..self.dir[b + 1] as usize;
            entries.extend_from_slice(&self.entries[old]);
            let new = &grouped[added[b] as usize..added[b + 1] as usize];
            entries.extend(
                new.iter()
                    .map(|&s| Entry::new(rest(block, fps[s as usize]), s)),
            );
        }
        dir.push(entries.len() as u32);
        BlockTable {
            block: self.block,
            dir_bits,
            dir,
            entries,
            flips: self.flips.clone(),
        }
    }

    fn memory(&self) -> usize {
        (self.dir.len() + self.flips.len()) * 4 + self.entries.len() * size_of::<Entry>()
    }
}

/// A query's buffers: the non-empty buckets of every block, and the positions
/// in one bucket within k on the bits outside the block.
#[derive(Default)]
struct Scratch {
    /// Each block's bucket of the query.
    buckets: Vec<usize>,
    /// A bucket's entries `lo..hi`, and how far from the query a
    /// fingerprint the block reports from it is at least, off the rest: its
    /// directory value's bits apart, and the block's credit.
    ranges: Vec<(u32, u32, u32)>,
    /// Where each block's ranges end.
    ends: Vec<usize>,
    /// A block's slots within k outside it.
    passed: Vec<u32>,
}

/// Bounds on one query's work: entries examined per bucket, and matches in
/// hand after which no further block is searched.
#[derive(Clone, Copy)]
struct Cap {
    scan: usize,
    enough: usize,
}

const NO_CAP: Cap = Cap {
    scan: usize::MAX,
    enough: usize::MAX,
};

/// What one query looked at: for the planner's cost model and the benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueryWork {
    /// Buckets looked up, over all blocks.
    pub probes: usize,
    /// Stored fingerprints whose distance was measured (bucket entries plus
    /// additions not yet merged).
    pub candidates: usize,
}

/// An online index of `(id, fingerprint)` entries searched by multi-index
/// blocks within their radii: every stored fingerprint within k of a query,
/// exactly, each once. Several ids may share a fingerprint; all are kept and
/// all are returned. See the module documentation for memory and costs.
#[derive(Clone, Debug)]
pub struct MultiIndex<B: Bits> {
    design: RadiusDesign,
    fps: Vec<B>,
    ids: Vec<u64>,
    /// One bit per slot.
    deleted: Vec<u64>,
    deleted_count: usize,
    /// Bucket lists over slots `0..indexed`; later slots are scanned linearly.
    blocks: Vec<BlockTable>,
    indexed: usize,
    /// The blocks' masks and radii, for the first-block rule.
    masks: Vec<(B, u32)>,
    /// Per block, the distance a fingerprint it reports has at least on the
    /// earlier blocks its [`rest`] leaves out ([`credits`]).
    credits: Vec<u32>,
}

/// Per block t, Σ (r_j + 1) over the blocks j before it that lie wholly
/// outside t's [`rest`]. Block t reports a match only when every earlier
/// block is more than its radius from the query (the first-block rule), so
/// a fingerprint it reports is at least that far from the query on those
/// bits, which are neither t's nor its rest's: the screen on the rest may
/// ask that much less of it, and stays exact.
fn credits<B: Bits>(design: &RadiusDesign) -> Vec<u32> {
    design
        .blocks
        .iter()
        .enumerate()
        .map(|(t, block)| {
            // The bits `rest` keeps: every bit whose value it moves there.
            let kept = (0..B::BITS).fold(B::zero(), |m, b| {
                let one = B::mask(b, 1);
                if rest(block, one) != 0 { m.xor(one) } else { m }
            });
            design.blocks[..t]
                .iter()
                .filter(|j| B::mask(j.start, j.len).and(kept).distance(B::zero()) == 0)
                .map(|j| j.radius + 1)
                .sum::<u32>()
        })
        .collect()
}

/// Buckets between the one a query reads and the one whose lines it
/// requests; at most the first `AHEAD_ENTRIES` of a bucket's entries are
/// requested, a line (`LINE_ENTRIES` entries) each.
const AHEAD: usize = 16;
const AHEAD_ENTRIES: u32 = 32;
const LINE_ENTRIES: usize = 64 / size_of::<Entry>();

/// Largest number of slots: slot numbers are u32, `u32::MAX` excluded.
const MAX_SLOTS: usize = u32::MAX as usize - 1;

fn full() -> Error {
    Error::Full(format!(
        "an index holds at most {MAX_SLOTS} fingerprints: split the collection"
    ))
}

impl<B: Bits> MultiIndex<B> {
    /// Builds the blocks of `design` over `entries`.
    pub fn build(
        design: RadiusDesign,
        entries: impl IntoIterator<Item = (u64, B)>,
    ) -> Result<Self, Error> {
        if design.bits != B::BITS {
            return Err(Error::WidthMismatch {
                expected: design.bits,
                got: B::BITS,
            });
        }
        let entries = entries.into_iter();
        let (mut ids, mut fps) = (Vec::new(), Vec::new());
        if let (_, Some(n)) = entries.size_hint() {
            // Huge pages: queries read the fingerprints at random.
            fps = super::mem::with_huge_capacity(n);
            ids.reserve(n);
        }
        for (id, fp) in entries {
            ids.push(id);
            fps.push(fp);
        }
        if fps.len() > MAX_SLOTS {
            return Err(full());
        }
        let credits = credits::<B>(&design);
        let masks = design
            .blocks
            .iter()
            .map(|b| (B::mask(b.start, b.len), b.radius))
            .collect();
        let mut index = MultiIndex {
            deleted: vec![0; fps.len().div_ceil(64)],
            deleted_count: 0,
            design,
            fps,
            ids,
            blocks: Vec::new(),
            indexed: 0,
            masks,
            credits,
        };
        index.rebuild_blocks();
        Ok(index)
    }

    fn rebuild_blocks(&mut self) {
        let fps = &self.fps;
        self.blocks = self
            .design
            .blocks
            .par_iter()
            .map(|&b| BlockTable::build(b, fps))
            .collect();
        self.indexed = self.fps.len();
    }

    /// The design.
    pub fn design(&self) -> &RadiusDesign {
        &self.design
    }

    /// Refuses a query distance beyond the one the design finds exactly.
    pub fn check_k(&self, k: u32) -> Result<(), Error> {
        if k > self.design.k {
            return Err(Error::KTooLarge {
                k,
                max: self.design.k,
            });
        }
        Ok(())
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.fps.len() - self.deleted_count
    }

    /// Whether no live entry is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots, live or deleted (deleted ones are dropped by the next rebuild).
    pub fn slots(&self) -> usize {
        self.fps.len()
    }

    /// Bytes of memory held by the blocks and entries.
    pub fn memory(&self) -> usize {
        self.blocks.iter().map(BlockTable::memory).sum::<usize>()
            + self.fps.len() * (std::mem::size_of::<B>() + 8)
            + self.deleted.len() * 8
    }

    #[inline]
    fn is_deleted(&self, slot: usize) -> bool {
        self.deleted[slot / 64] >> (slot % 64) & 1 == 1
    }

    /// Live entries, in storage order.
    pub fn entries(&self) -> impl Iterator<Item = (u64, B)> + '_ {
        (0..self.fps.len())
            .filter(|&i| !self.is_deleted(i))
            .map(|i| (self.ids[i], self.fps[i]))
    }

    /// Every live entry within `k` of `query`, each once, nearest first (ties by id).
    pub fn query(&self, query: B, k: u32) -> Result<Vec<Match>, Error> {
        self.check_k(k)?;
        let (mut found, mut scratch) = (Vec::new(), Scratch::default());
        self.query_into(query, k, &mut scratch, &mut found, NO_CAP);
        Ok(self.finish(found))
    }

    /// [`MultiIndex::query`] with its work bounded whatever the data: at
    /// most `scan` entries of each bucket looked up (and of the additions not
    /// yet in the blocks) are examined, and no further block is searched once
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
        self.check_k(k)?;
        let (mut found, mut scratch) = (Vec::new(), Scratch::default());
        let capped = self.query_into(query, k, &mut scratch, &mut found, Cap { scan, enough });
        Ok((self.finish(found), capped))
    }

    /// [`MultiIndex::query`] for many queries, in parallel; answers in query order.
    pub fn query_batch(&self, queries: &[B], k: u32) -> Result<Vec<Vec<Match>>, Error> {
        self.check_k(k)?;
        Ok(queries
            .par_iter()
            .map_init(
                || (Vec::new(), Scratch::default()),
                |(found, scratch), &q| {
                    found.clear();
                    self.query_into(q, k, scratch, found, NO_CAP);
                    self.finish(std::mem::take(found))
                },
            )
            .collect())
    }

    /// The buckets and candidates a query of `query` looks at.
    pub fn work(&self, query: B) -> QueryWork {
        let mut w = QueryWork {
            probes: 0,
            candidates: self.fps.len() - self.indexed,
        };
        for t in &self.blocks {
            let v = BlockTable::bucket(&t.block, t.dir_bits, query);
            w.probes += t.flips.len();
            w.candidates += t
                .flips
                .iter()
                .map(|&e| {
                    let u = v ^ e as usize;
                    (t.dir[u + 1] - t.dir[u]) as usize
                })
                .sum::<usize>();
        }
        w
    }

    /// The block on which `diff` (a stored fingerprint xor the query) first
    /// lies within the block's radius; `masks.len()` if none does.
    #[inline]
    fn first_block(&self, diff: B) -> usize {
        self.masks
            .iter()
            .position(|&(m, r)| diff.and(m).distance(B::zero()) <= r)
            .unwrap_or(self.masks.len())
    }

    /// Pushes `(slot, distance)` of every slot within `k` (deleted ones
    /// included: [`Self::finish`] drops them), within the bounds of `cap`;
    /// `true` if they cut the search short.
    fn query_into(
        &self,
        query: B,
        k: u32,
        scratch: &mut Scratch,
        found: &mut Vec<(u32, u32)>,
        cap: Cap,
    ) -> bool {
        let Scratch {
            buckets,
            ranges,
            ends,
            passed,
        } = scratch;
        let mut capped = false;
        // Three passes over the blocks, so that each pass's memory reads
        // were requested a whole pass earlier and their misses overlap: every
        // bucket's directory entry; then every non-empty bucket's first bits
        // outside the block; then the buckets themselves.
        buckets.clear();
        buckets.extend(self.blocks.iter().map(|table| {
            let v = BlockTable::bucket(&table.block, table.dir_bits, query);
            for &e in &table.flips {
                prefetch(&table.dir[v ^ e as usize]);
            }
            v
        }));
        ranges.clear();
        ends.clear();
        for ((table, &v), &credit) in self.blocks.iter().zip(buckets.iter()).zip(&self.credits) {
            for &e in &table.flips {
                // At least this far from the query on the bits outside the
                // rest, for a fingerprint this block reports.
                let apart = e.count_ones() + credit;
                if apart > k {
                    continue;
                }
                let u = v ^ e as usize;
                let (lo, hi) = (table.dir[u], table.dir[u + 1]);
                if lo < hi {
                    prefetch(&table.entries[lo as usize]);
                    let len = (hi - lo) as usize;
                    capped |= len > cap.scan;
                    ranges.push((lo, lo + len.min(cap.scan) as u32, apart));
                }
            }
            ends.push(ranges.len());
        }
        let mut from = 0;
        for (t, (table, &end)) in self.blocks.iter().zip(ends.iter()).enumerate() {
            // The entries within k on the bits outside the block: their
            // slots (each bucket's lines requested some buckets ahead of its
            // reading), then their fingerprints (all requested first),
            // measured whole.
            let q = rest(&table.block, query);
            passed.clear();
            let mine = &ranges[from..end];
            for (i, &(lo, hi, apart)) in mine.iter().enumerate() {
                if let Some(&(lo, hi, _)) = mine.get(i + AHEAD) {
                    let ahead = &table.entries[lo as usize..hi.min(lo + AHEAD_ENTRIES) as usize];
                    for e in ahead.iter().step_by(LINE_ENTRIES) {
                        prefetch(e);
                    }
                }
                // What is left of k for the rest: the bucket is `apart`
                // bits from the query on the block's bits and the earlier
                // blocks' outside the rest, at least.
                let left = k - apart;
                for &e in &table.entries[lo as usize..hi as usize] {
                    if (e.rest() ^ q).count_ones() <= left {
                        prefetch(&self.fps[e.slot() as usize]);
                        passed.push(e.slot());
                    }
                }
            }
            for &s in passed.iter() {
                let diff = self.fps[s as usize].xor(query);
                let d = diff.distance(B::zero());
                // Reported by the first block within its radius; buckets
                // narrower than the block may hold slots outside it.
                if d <= k && self.first_block(diff) == t {
                    found.push((s, d));
                }
            }
            from = end;
            if found.len() >= cap.enough {
                return true;
            }
        }
        let tail = self.indexed..self.fps.len();
        capped |= tail.len() > cap.scan;
        for slot in tail.take(cap.scan) {
            let d = self.fps[slot].distance(query);
            if d <= k {
                found.push((slot as u32, d));
            }
        }
        capped
    }

    fn finish(&self, found: Vec<(u32, u32)>) -> Vec<Match> {
        let mut out: Vec<Match> = found
            .into_iter()
            .filter(|&(s, _)| !self.is_deleted(s as usize))
            .map(|(s, distance)| Match {
                distance,
                id: self.ids[s as usize],
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Adds an entry. It is searchable at once (scanned linearly); the blocks
    /// absorb recent additions once they are an eighth of the indexed entries.
    pub fn add(&mut self, id: u64, fp: B) -> Result<(), Error> {
        if self.fps.len() >= MAX_SLOTS {
            return Err(full());
        }
        self.fps.push(fp);
        self.ids.push(id);
        if self.deleted.len() * 64 < self.fps.len() {
            self.deleted.push(0);
        }
        let pending = self.fps.len() - self.indexed;
        if pending > 4096.max(self.indexed / 8) {
            self.merge_pending();
        }
        Ok(())
    }

    /// Merges the pending additions into every block, bucket by bucket.
    pub fn merge_pending(&mut self) {
        if self.indexed == self.fps.len() {
            return;
        }
        let (fps, start) = (&self.fps, self.indexed);
        self.blocks = self
            .blocks
            .par_iter()
            .map(|t| t.merged(fps, start))
            .collect();
        self.indexed = self.fps.len();
    }

    /// Deletes every entry whose id satisfies `remove`; returns how many.
    /// Space is reclaimed when deleted entries reach a quarter of the slots.
    pub fn delete(&mut self, mut remove: impl FnMut(u64) -> bool) -> usize {
        let mut n = 0;
        for i in 0..self.fps.len() {
            if !self.is_deleted(i) && remove(self.ids[i]) {
                self.deleted[i / 64] |= 1 << (i % 64);
                n += 1;
            }
        }
        self.finish_delete(n)
    }

    /// Deletes the entry in `slot` (its position in the order entries were
    /// built and added); returns whether it was live. Slots keep their
    /// numbers: the space is reclaimed by [`Self::compact`], which renumbers
    /// them, or by a [`Self::delete`] that finds a quarter of the slots dead.
    pub fn delete_slot(&mut self, slot: usize) -> bool {
        if slot >= self.fps.len() || self.is_deleted(slot) {
            return false;
        }
        self.deleted[slot / 64] |= 1 << (slot % 64);
        self.deleted_count += 1;
        true
    }

    /// Deleted slots, awaiting [`Self::compact`].
    pub fn deleted(&self) -> usize {
        self.deleted_count
    }

    fn finish_delete(&mut self, n: usize) -> usize {
        self.deleted_count += n;
        if self.deleted_count > 0 && self.deleted_count * 4 >= self.fps.len() {
            self.compact();
        }
        n
    }

    /// Drops the deleted entries and rebuilds the blocks: the live entries
    /// keep their order and take slots `0..len`.
    pub fn compact(&mut self) {
        let (ids, fps): (Vec<u64>, Vec<B>) = self.entries().unzip();
        self.ids = ids;
        self.fps = fps;
        self.deleted = vec![0; self.fps.len().div_ceil(64)];
        self.deleted_count = 0;
        self.rebuild_blocks();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use proptest::prelude::*;

    /// Brute force: every live entry within k, sorted as queries answer.
    pub(crate) fn scan<B: Bits>(live: &[(u64, B)], q: B, k: u32) -> Vec<Match> {
        let mut out: Vec<Match> = live
            .iter()
            .filter(|(_, f)| f.distance(q) <= k)
            .map(|&(id, f)| Match {
                distance: f.distance(q),
                id,
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// `x` with `flips` random bits flipped (possibly the same bit twice).
    pub(crate) fn near<B: Bits>(x: B, flips: u32, rng: &mut SplitMix64) -> B {
        (0..flips).fold(x, |x, _| {
            x.xor(B::mask((rng.next() % u64::from(B::BITS)) as u32, 1))
        })
    }

    pub(crate) fn random<B: Bits>(rng: &mut SplitMix64) -> B {
        B::from_u128(u128::from(rng.next()) << 64 | u128::from(rng.next()))
    }

    /// Random fingerprints, a third of them planted around k of an earlier one.
    fn corpus<B: Bits>(n: usize, k: u32, rng: &mut SplitMix64) -> Vec<B> {
        let mut v: Vec<B> = Vec::with_capacity(n);
        for i in 0..n {
            if i > 0 && rng.next().is_multiple_of(3) {
                let base = v[(rng.next() % i as u64) as usize];
                let d = (k + 2).saturating_sub((rng.next() % 5) as u32);
                v.push(near(base, d, rng));
            } else {
                v.push(random(rng));
            }
        }
        v
    }

    /// Builds over a first part, adds the rest one by one (through merges),
    /// deletes some by id and some by slot, and checks queries near stored
    /// fingerprints and random ones against the scan at every k up to the
    /// design's, after each step.
    fn check_against_scan<B: Bits>(seed: u64, n: usize, design_k: u32, m: u32) {
        let Ok(design) = RadiusDesign::new(B::BITS, design_k, m) else {
            return;
        };
        let mut rng = SplitMix64(seed);
        let fps: Vec<B> = corpus(n, design_k, &mut rng);
        // Built over a third (the merges then widen the directories) or
        // seven eighths (bucket-by-bucket merges into the same directories).
        let first = if seed.is_multiple_of(2) {
            n / 3
        } else {
            n * 7 / 8
        };
        let mut live: Vec<(u64, B)> = (0..first).map(|i| (i as u64 / 2, fps[i])).collect();
        let mut index = MultiIndex::build(design, live.clone()).unwrap();
        let check = |index: &MultiIndex<B>, live: &[(u64, B)], rng: &mut SplitMix64| {
            assert_eq!(index.len(), live.len());
            let queries: Vec<B> = (0..24)
                .map(|i| match (i % 3, live.is_empty()) {
                    (0, _) | (_, true) => random(rng),
                    _ => {
                        let x = live[(rng.next() % live.len() as u64) as usize].1;
                        near(x, (rng.next() % u64::from(design_k + 3)) as u32, rng)
                    }
                })
                .collect();
            let ks: Vec<u32> = if live.len() < 1000 {
                (0..=design_k).collect()
            } else {
                vec![0, design_k / 2, design_k.saturating_sub(1), design_k]
            };
            for k in ks {
                let batch = index.query_batch(&queries, k).unwrap();
                for (q, got) in queries.iter().zip(batch) {
                    let want = scan(live, *q, k);
                    assert_eq!(index.query(*q, k).unwrap(), want, "k = {k}");
                    assert_eq!(got, want, "k = {k}");
                    // Bounds wider than the data cut nothing; tight ones
                    // answer a subset of the matches, and say so when they
                    // left one out.
                    let (all, capped) = index.query_capped(*q, k, usize::MAX, usize::MAX).unwrap();
                    assert_eq!((all, capped), (want.clone(), false), "k = {k}");
                    let (scan, enough) = (1 + q.to_u128() as usize % 3, 1 + k as usize % 4);
                    let (some, capped) = index.query_capped(*q, k, scan, enough).unwrap();
                    assert!(some.iter().all(|m| want.contains(m)), "k = {k}");
                    assert!(
                        capped || some == want,
                        "k = {k}: left out matches unannounced"
                    );
                }
            }
        };
        check(&index, &live, &mut rng);
        for (i, &f) in fps.iter().enumerate().skip(first) {
            index.add(i as u64 / 2, f).unwrap();
            live.push((i as u64 / 2, f));
        }
        check(&index, &live, &mut rng);
        index.merge_pending();
        check(&index, &live, &mut rng);
        // Ids are shared by pairs of entries: deleting an id removes both.
        let gone = |id: u64| id % 5 == 1;
        let removed = index.delete(gone);
        assert_eq!(removed, live.iter().filter(|(id, _)| gone(*id)).count());
        live.retain(|(id, _)| !gone(*id));
        check(&index, &live, &mut rng);
        // By slot: the first live one.
        if let Some(slot) = (0..index.slots()).find(|&s| !index.is_deleted(s)) {
            let (id, fp) = (index.ids[slot], index.fps[slot]);
            let before = index.deleted();
            assert!(index.delete_slot(slot));
            assert!(!index.delete_slot(slot));
            let at = live.iter().position(|&e| e == (id, fp)).unwrap();
            live.remove(at);
            assert_eq!(index.deleted(), before + 1);
            check(&index, &live, &mut rng);
            index.compact();
            assert_eq!(index.deleted(), 0);
            assert_eq!(index.slots(), live.len());
            check(&index, &live, &mut rng);
        }
        // Enough deletions to compact.
        let removed = index.delete(|id| id % 2 == 0);
        live.retain(|(id, _)| id % 2 != 0);
        assert!(removed > 0 || live.is_empty() || n < 4);
        check(&index, &live, &mut rng);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn exact_at_64_bits(seed in any::<u64>(), n in 0usize..700, k in 2u32..=20, m in 3u32..=21) {
            check_against_scan::<u64>(seed, n, k, m);
        }

        #[test]
        fn exact_at_128_bits(seed in any::<u64>(), n in 0usize..700, k in 5u32..=20, m in 6u32..=21) {
            check_against_scan::<u128>(seed, n, k, m);
        }
    }

    /// Every k from 0 to 20 at both widths, with the fewest blocks a width
    /// allows (the widest buckets) and with k + 1 blocks (radius 0), over
    /// enough entries for merges into existing buckets.
    #[test]
    fn exact_for_every_k_through_merges() {
        for k in 0..=20 {
            for m in [6, k + 1] {
                check_against_scan::<u128>(u64::from(k) * 31 + u64::from(m), 6500, k, m);
                check_against_scan::<u64>(u64::from(k) * 37 + u64::from(m), 6500, k, m.min(4));
            }
        }
    }

    #[test]
    fn masks_are_every_combination_once() {
        let m = masks(6, 2);
        assert_eq!(m.len(), 1 + 6 + 15);
        assert_eq!(m[0], 0);
        let mut sorted = m.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), m.len());
        assert!(m.iter().all(|x| x.count_ones() <= 2 && *x < 64));
    }

    #[test]
    fn a_query_beyond_the_design_is_refused() {
        let design = RadiusDesign::new(128, 19, 7).unwrap();
        let index = MultiIndex::<u128>::build(design, [(1, 5u128)]).unwrap();
        assert!(matches!(
            index.query(5, 20),
            Err(Error::KTooLarge { k: 20, max: 19 })
        ));
        assert!(MultiIndex::<u64>::build(RadiusDesign::new(128, 19, 7).unwrap(), []).is_err());
    }

    #[test]
    fn memory_is_twelve_bytes_per_block_plus_the_entry() {
        let design = RadiusDesign::new(128, 19, 7).unwrap();
        let mut rng = SplitMix64(3);
        let n = 1 << 16;
        let index =
            MultiIndex::<u128>::build(design, (0..n).map(|i| (i, random(&mut rng)))).unwrap();
        let per = index.memory() as f64 / n as f64;
        // 16 + 8 + 7 × (4 + 8) = 108, plus directories of at most 2 bytes
        // per block.
        assert!(
            (108.0..=108.0 + 7.0 * 2.0 + 1.0).contains(&per),
            "{per} bytes"
        );
    }
}
