//! The self-join at large k by multi-index hashing (Norouzi, Punjani &
//! Fleet, CVPR 2012): the bits are cut into m blocks, block i with a radius
//! r_i, where Σ (r_i + 1) > k. Two fingerprints within k then lie within r_i
//! of each other on at least one block i (were every block r_i + 1 or more
//! bits apart, the whole would be more than k apart). One table per block
//! groups the fingerprints by that block's value; a fingerprint is compared
//! with those of its own bucket and of the buckets within the block's radius
//! of it, and a pair is reported by the first block on which it lies within
//! the radius.
//!
//! The permuted tables of [`super::TableDesign`] with b − k = 1 are the case
//! r_i = 0. At 128 bits and k near 19 permuted tables have prefixes of 6
//! bits (20 tables) or 12-14 (210 tables), and crowded text fills their
//! buckets; seven blocks of 18-19 bits searched within a radius of 1 or 2
//! compare about a tenth as many pairs in all, and a pair of near copies is
//! found by a few tables rather than dozens (docs/dedup.md).

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::bits::Bits;
use super::join::{JoinScratch, check_join_of, join_beside_sink};
use super::mem;
use crate::error::Error;

/// One block: bits `[start, start + len)` searched within `radius`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    /// First bit (bit 0 is the least significant).
    pub start: u32,
    /// Bits (at most [`MAX_BLOCK_BITS`]).
    pub len: u32,
    /// Largest distance searched on this block.
    pub radius: u32,
}

/// Widest block: a table's directory has 2^len + 1 entries.
pub const MAX_BLOCK_BITS: u32 = 22;

/// A multi-index design for the self-join: its blocks, in the order whose
/// first match reports a pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RadiusDesign {
    /// Fingerprint width.
    pub bits: u32,
    /// The largest distance the design finds exactly.
    pub k: u32,
    /// The blocks, one table each.
    pub blocks: Vec<Block>,
}

impl RadiusDesign {
    /// `bits` cut into `m` contiguous blocks of nearly equal length, with
    /// the smallest radii whose `r_i + 1` add up to `k + 1` (the wider blocks
    /// take the larger radius).
    pub fn new(bits: u32, k: u32, m: u32) -> Result<RadiusDesign, Error> {
        let bad = |msg: String| Err(Error::InvalidConfig(msg));
        if bits != 64 && bits != 128 {
            return bad(format!("fingerprint width {bits}: use 64 or 128"));
        }
        if m == 0 || m > k + 1 || m > bits {
            return bad(format!(
                "{m} blocks for k = {k}: use 1 to {} blocks",
                (k + 1).min(bits)
            ));
        }
        let (short, wide) = (bits / m, bits % m);
        if short + u32::from(wide > 0) > MAX_BLOCK_BITS {
            return bad(format!(
                "{m} blocks of {bits} bits are wider than {MAX_BLOCK_BITS} bits: use more blocks"
            ));
        }
        let (base, extra) = ((k + 1) / m, (k + 1) % m);
        let mut start = 0;
        let blocks = (0..m)
            .map(|i| {
                let len = short + u32::from(i < wide);
                let radius = base - 1 + u32::from(i < extra);
                let b = Block { start, len, radius };
                start += len;
                b
            })
            .collect();
        Ok(RadiusDesign { bits, k, blocks })
    }

    /// A one-line description.
    pub fn describe(&self) -> String {
        let span = |of: fn(&Block) -> u32| {
            let values = self.blocks.iter().map(of);
            let lo = values.clone().min().unwrap_or(0);
            super::design::span(lo, values.max().unwrap_or(0))
        };
        format!(
            "{} multi-index blocks of {} bits, searched within {}",
            self.blocks.len(),
            span(|b| b.len),
            span(|b| b.radius)
        )
    }

    /// Bucket keys a search of block `b` looks at besides its own: every
    /// xor mask of 1 to `radius` bits of `len`.
    pub fn neighbours(b: &Block) -> usize {
        (1..=b.radius.min(b.len))
            .map(|r| binomial(b.len, r) as usize)
            .sum()
    }

    /// Every pair `(i, j, distance)`, `i < j`, of `sorted` (distinct
    /// fingerprints, ascending) within `k`, each exactly once, handed to
    /// `sink` a slice of buckets at a time, in an order fixed by the design
    /// (not by the threads). Pairs `(i, j)` for which `keep(i, j)` is false are left out, screened
    /// by the threads that find them.
    pub fn join_each_where<B: Bits>(
        &self,
        sorted: &[B],
        k: u32,
        scratch: JoinScratch<B>,
        keep: &(impl Fn(u32, u32) -> bool + Sync),
        mut sink: impl FnMut(Vec<(u32, u32, u32)>),
    ) -> Result<(), Error> {
        check_join_of(sorted, k, self.bits, self.k)?;
        let n = sorted.len();
        let mut keys = scratch.into_largest();
        if keys.capacity() < n {
            keys = mem::with_huge_capacity(n);
        }
        keys.clear();
        keys.resize(n, B::zero());
        let mut ids = vec![0u32; n];
        let mut starts = Vec::new();
        let masks: Vec<(B, u32)> = self
            .blocks
            .iter()
            .map(|b| (B::mask(b.start, b.len), b.radius))
            .collect();
        // A round's pairs go to the sink while the threads join the next.
        let mut pending: Vec<Vec<(u32, u32, u32)>> = Vec::new();
        for (t, block) in self.blocks.iter().enumerate() {
            bucket_sort(sorted, block, &mut keys, &mut ids, &mut starts);
            let table = Table {
                keys: &keys,
                ids: &ids,
                starts: &starts,
                flips: flips(block),
                earlier: &masks[..t],
                k,
            };
            let slices = table.slices(SLICES);
            for round in slices.chunks(ROUND) {
                let table = &table;
                join_beside_sink(&mut pending, &mut sink, move || {
                    round
                        .par_iter()
                        .map(|range| {
                            let mut pairs = table.join(range.clone());
                            pairs.retain(|&(i, j, _)| keep(i, j));
                            pairs
                        })
                        .collect()
                });
            }
        }
        pending.into_iter().for_each(&mut sink);
        Ok(())
    }
}

/// Slices of buckets a table is cut into, and how many are joined at once
/// (as in the permuted tables' join).
const SLICES: usize = 256;
const ROUND: usize = 16;
/// Buckets with more comparisons than this share their rows among the threads.
const PARALLEL_WORK: usize = 1 << 22;

/// Sorts `sorted`'s fingerprints by `block`'s value into `keys` (with their
/// positions in `ids`): `keys[starts[v]..starts[v + 1]]` hold value v.
fn bucket_sort<B: Bits>(
    sorted: &[B],
    block: &Block,
    keys: &mut [B],
    ids: &mut [u32],
    starts: &mut Vec<u32>,
) {
    let value = |x: B| x.field(block.start, block.len).to_u128() as usize;
    let buckets = 1usize << block.len;
    // Counts shifted by two, summed: `starts[v + 1]` is then where bucket v
    // starts, and filling it moves it on to where bucket v + 1 starts.
    starts.clear();
    starts.resize(buckets + 2, 0);
    for &x in sorted {
        starts[value(x) + 2] += 1;
    }
    for v in 0..=buckets {
        starts[v + 1] += starts[v];
    }
    for (i, &x) in sorted.iter().enumerate() {
        let slot = &mut starts[value(x) + 1];
        keys[*slot as usize] = x;
        ids[*slot as usize] = i as u32;
        *slot += 1;
    }
    starts.pop();
}

/// Every xor mask of 1 to `radius` bits within `len` bits, ascending.
fn flips(block: &Block) -> Vec<u32> {
    (1u32..1 << block.len)
        .filter(|e| e.count_ones() <= block.radius)
        .collect()
}

fn binomial(n: u32, r: u32) -> u64 {
    (0..r).fold(1u64, |acc, i| acc * u64::from(n - i) / u64::from(i + 1))
}

/// One block's table, sorted by the block's value.
struct Table<'a, B> {
    keys: &'a [B],
    ids: &'a [u32],
    starts: &'a [u32],
    flips: Vec<u32>,
    /// Earlier blocks' masks and radii: a pair within one of them is theirs.
    earlier: &'a [(B, u32)],
    k: u32,
}

impl<B: Bits> Table<'_, B> {
    /// About `pieces` ranges of bucket values with similar numbers of keys.
    fn slices(&self, pieces: usize) -> Vec<std::ops::Range<usize>> {
        let buckets = self.starts.len() - 1;
        let target = (self.keys.len() / pieces.max(1)).max(1) as u32;
        let mut out = Vec::with_capacity(pieces + 1);
        let mut from = 0;
        while from < buckets {
            let goal = self.starts[from] + target;
            let to = from + 1 + self.starts[from + 1..].partition_point(|&s| s < goal);
            let to = to.min(buckets);
            out.push(from..to);
            from = to;
        }
        out
    }

    fn bucket(&self, v: usize) -> std::ops::Range<usize> {
        self.starts[v] as usize..self.starts[v + 1] as usize
    }

    /// The pairs of buckets `values`: within each bucket, and with the
    /// greater buckets within the radius.
    fn join(&self, values: std::ops::Range<usize>) -> Vec<(u32, u32, u32)> {
        let mut out = Vec::new();
        let (mut near_keys, mut near_ids, mut hits) = (Vec::new(), Vec::new(), Vec::new());
        for v in values {
            let own = self.bucket(v);
            if own.is_empty() {
                continue;
            }
            // The neighbouring buckets' keys, gathered into one run.
            near_keys.clear();
            near_ids.clear();
            for &e in &self.flips {
                let u = v ^ e as usize;
                if u > v {
                    let r = self.bucket(u);
                    near_keys.extend_from_slice(&self.keys[r.clone()]);
                    near_ids.extend_from_slice(&self.ids[r]);
                }
            }
            let rows = own.len();
            let work = rows * (rows / 2 + near_keys.len());
            if work < PARALLEL_WORK {
                for x in own.clone() {
                    self.row(x, own.end, (&near_keys, &near_ids), &mut hits, &mut out);
                }
                continue;
            }
            // A crowded bucket: its rows shared among the threads, their
            // pairs in row order.
            let parts: Vec<Vec<(u32, u32, u32)>> = own
                .clone()
                .into_par_iter()
                .with_min_len(16)
                .fold(
                    || (Vec::new(), Vec::new()),
                    |(mut part, mut hits), x| {
                        let near = (near_keys.as_slice(), near_ids.as_slice());
                        self.row(x, own.end, near, &mut hits, &mut part);
                        (part, hits)
                    },
                )
                .map(|(part, _)| part)
                .collect();
            parts.into_iter().for_each(|mut p| out.append(&mut p));
        }
        out
    }

    /// The pairs of key `x` with the keys after it in its bucket (up to
    /// `end`) and with `near`.
    fn row(
        &self,
        x: usize,
        end: usize,
        (near_keys, near_ids): (&[B], &[u32]),
        hits: &mut Vec<u32>,
        out: &mut Vec<(u32, u32, u32)>,
    ) {
        let a = self.keys[x];
        let ia = self.ids[x];
        let mut emit = |b: B, ib: u32| {
            let diff = a.xor(b);
            // Reported by the first block on which the two are within its radius.
            if self
                .earlier
                .iter()
                .all(|&(m, r)| diff.and(m).distance(B::zero()) > r)
            {
                out.push((ia.min(ib), ia.max(ib), diff.distance(B::zero())));
            }
        };
        hits.clear();
        a.within(&self.keys[x + 1..end], self.k, hits);
        for &i in hits.iter() {
            let y = x + 1 + i as usize;
            emit(self.keys[y], self.ids[y]);
        }
        hits.clear();
        a.within(near_keys, self.k, hits);
        for &i in hits.iter() {
            emit(near_keys[i as usize], near_ids[i as usize]);
        }
    }
}

/// The designs [`plan_join_for`](super::plan_join_for) weighs for `bits` and `k`: every count
/// of blocks from the fewest [`MAX_BLOCK_BITS`] allows to k + 1.
pub fn radius_options(bits: u32, k: u32) -> Vec<RadiusDesign> {
    let fewest = bits.div_ceil(MAX_BLOCK_BITS).max(1);
    (fewest..=(k + 1).min(bits))
        .filter_map(|m| RadiusDesign::new(bits, k, m).ok())
        .collect()
}

/// Estimated work of a radius design, in nanoseconds of one core, for `n`
/// distinct fingerprints: `compared` is the share of all pairs a table
/// compares (summed over the tables) and `found` the number of times pairs
/// within k are found (summed over tables), both measured on a sample.
pub fn radius_cost(d: &RadiusDesign, n: f64, compared: f64, found: f64) -> f64 {
    let pairs = n * (n - 1.0) / 2.0;
    let per_table: f64 = d
        .blocks
        .iter()
        .map(|b| {
            let buckets = 2f64.powi(b.len as i32);
            // Buckets holding at least one of n fingerprints spread at random.
            let nonempty = buckets * -(-n / buckets).exp_m1();
            let near = RadiusDesign::neighbours(b) as f64;
            // Sorting by the block; looking up each bucket's neighbours, and
            // gathering their keys (half of them: the greater ones).
            n * RADIUS_ENTRY_NS
                + buckets * RADIUS_BUCKET_NS
                + nonempty * near * RADIUS_PROBE_NS
                + nonempty * near / 2.0 * (n / buckets) * RADIUS_GATHER_NS
        })
        .sum();
    per_table + compared * pairs * super::near::compare_ns() + found * RADIUS_HIT_NS
}

/// Costs of the radius join in nanoseconds of one core, fitted to joins of
/// the 1.85 million centred 128-bit fingerprints of the 10 GB corpus with 6
/// to 20 blocks at k = 19 (docs/dedup.md): per fingerprint and table (the
/// counting sort), per bucket visited, per neighbouring bucket looked up, per
/// key gathered from it, and per pair within k found by a table; per
/// comparison, the same figure as the tables' join (`near::compare_ns`).
const RADIUS_ENTRY_NS: f64 = 8.0;
const RADIUS_BUCKET_NS: f64 = 1.0;
const RADIUS_PROBE_NS: f64 = 3.0;
const RADIUS_GATHER_NS: f64 = 4.0;
const RADIUS_HIT_NS: f64 = 5.0;

/// Of the pair differences `diffs`, how many times tables of `d` compare
/// them (a difference within a block's radius is compared by that block's
/// table).
pub fn compared_by<B: Bits>(d: &RadiusDesign, diffs: &[B]) -> usize {
    let masks: Vec<(B, u32)> = d
        .blocks
        .iter()
        .map(|b| (B::mask(b.start, b.len), b.radius))
        .collect();
    diffs
        .iter()
        .map(|&x| {
            masks
                .iter()
                .filter(|&&(m, r)| x.and(m).distance(B::zero()) <= r)
                .count()
        })
        .sum()
}
