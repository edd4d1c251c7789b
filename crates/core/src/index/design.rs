//! Table designs (Manku, Jain & Das Sarma §3.1) and the planner that picks one.
//!
//! Two f-bit fingerprints within k bits of each other, with the bits cut into
//! b > k blocks, agree exactly on at least b − k blocks. A table for each choice of
//! b − k blocks, storing fingerprints permuted so those blocks come first, sorted,
//! finds every such pair among the entries sharing the query's prefix. Designs
//! nest: after choosing blocks, the remaining bits (which still hold all k
//! differences) are cut again.

use serde::{Deserialize, Serialize};

use super::bits::Bits;
use crate::error::Error;

/// A run of bits `[start, start + len)` of the fingerprint (bit 0 is the least
/// significant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// First bit.
    pub start: u32,
    /// Number of bits.
    pub len: u32,
}

/// One table: the fingerprint's segments in key order (most significant first),
/// the first `prefix_segments` of them forming the sorted prefix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table {
    /// Every bit of the fingerprint, as segments in key order.
    pub order: Vec<Segment>,
    /// How many of the first segments make the prefix.
    pub prefix_segments: usize,
}

impl Table {
    /// Bits in the prefix.
    pub fn prefix_bits(&self) -> u32 {
        self.order[..self.prefix_segments]
            .iter()
            .map(|s| s.len)
            .sum()
    }

    /// Masks of a permuted key's prefix bits and of the bits below them.
    pub(crate) fn prefix_masks<B: Bits>(&self) -> (B, B) {
        let p = self.prefix_bits();
        (B::mask(B::BITS - p, p), B::mask(0, B::BITS - p))
    }

    /// The key: the fingerprint's bits in this table's order. A bit permutation,
    /// so Hamming distances between keys equal those between fingerprints.
    #[inline]
    pub fn permute<B: Bits>(&self, x: B) -> B {
        let mut key = B::zero();
        let mut pos = B::BITS;
        for s in &self.order {
            pos -= s.len;
            key = key.or(x.field(s.start, s.len).shl(pos));
        }
        key
    }

    /// The inverse of [`Table::permute`].
    #[inline]
    pub fn unpermute<B: Bits>(&self, key: B) -> B {
        let mut x = B::zero();
        let mut pos = B::BITS;
        for s in &self.order {
            pos -= s.len;
            x = x.or(key.field(pos, s.len).shl(s.start));
        }
        x
    }

    /// The runs of fingerprint bits `(start, len)` that make the top `d` bits
    /// of a key (d <= 64), most significant first: with [`top_of`], a key's
    /// top bits without the whole permutation.
    pub(crate) fn top_pieces(&self, d: u32) -> Vec<(u32, u32)> {
        let mut pieces = Vec::new();
        let mut have = 0;
        for s in &self.order {
            if have == d {
                break;
            }
            let take = s.len.min(d - have);
            pieces.push((s.start + s.len - take, take));
            have += take;
        }
        pieces
    }

    /// The prefix bits, in the fingerprint's own bit positions.
    pub fn prefix_mask<B: Bits>(&self) -> B {
        self.order[..self.prefix_segments]
            .iter()
            .fold(B::zero(), |m, s| m.or(B::mask(s.start, s.len)))
    }
}

/// The top bits of `x`'s key from [`Table::top_pieces`]: equal to
/// `table.permute(x).top(d)`.
#[inline]
pub(crate) fn top_of<B: Bits>(pieces: &[(u32, u32)], x: B) -> u64 {
    pieces.iter().fold(0u64, |acc, &(start, len)| {
        (acc << len) | x.field(start, len).to_u128() as u64
    })
}

/// A complete design: which tables an index keeps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableDesign {
    /// Fingerprint width.
    pub bits: u32,
    /// The largest distance the design finds exactly.
    pub k: u32,
    /// Blocks cut at each level (each level picks blocks − k of them).
    pub levels: Vec<u32>,
    /// The tables.
    pub tables: Vec<Table>,
}

/// Most tables a design may have.
pub const MAX_TABLES: usize = 1024;

impl TableDesign {
    /// Refuses a query distance beyond the one the design finds exactly.
    pub fn check_k(&self, k: u32) -> Result<(), Error> {
        if k > self.k {
            return Err(Error::KTooLarge { k, max: self.k });
        }
        Ok(())
    }

    /// The design cutting the bits into `levels[0]` blocks, picking `levels[0] − k`,
    /// then cutting the remaining bits into `levels[1]` blocks, and so on.
    pub fn new(bits: u32, k: u32, levels: &[u32]) -> Result<TableDesign, Error> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if bits != 64 && bits != 128 {
            return bad(format!("fingerprint width {bits}: use 64 or 128"));
        }
        if levels.is_empty() {
            return bad("a design needs at least one level of blocks".into());
        }
        let mut count = 1usize;
        let mut remaining = bits;
        for &b in levels {
            if b <= k {
                return bad(format!(
                    "{b} blocks cannot find distance {k}: a level needs more than k blocks"
                ));
            }
            if b > remaining {
                return bad(format!("cannot cut {remaining} bits into {b} blocks"));
            }
            count = count.saturating_mul(binomial(b, b - k));
            if count > MAX_TABLES {
                return bad(format!("the design has more than {MAX_TABLES} tables"));
            }
            // The remaining bits after this level, for the next level's check:
            // at least the smallest choice leaves this many.
            let small = remaining / b;
            remaining -= small * (b - k);
        }
        let all = vec![Segment {
            start: 0,
            len: bits,
        }];
        let mut tables = Vec::with_capacity(count);
        build(&all, levels, k, &mut Vec::new(), &mut tables);
        Ok(TableDesign {
            bits,
            k,
            levels: levels.to_vec(),
            tables,
        })
    }

    /// Smallest and largest prefix over the tables.
    pub fn prefix_range(&self) -> (u32, u32) {
        let ps = self.tables.iter().map(Table::prefix_bits);
        (ps.clone().min().unwrap_or(0), ps.max().unwrap_or(0))
    }

    /// Expected candidates a query inspects over all tables, for `n` uniformly
    /// random fingerprints.
    pub fn expected_candidates(&self, n: f64) -> f64 {
        self.tables
            .iter()
            .map(|t| n / 2f64.powi(t.prefix_bits() as i32))
            .sum()
    }

    /// The rule that makes each pair within k come out of one table only:
    /// see [`FirstTable`].
    pub(crate) fn first_table<B: Bits>(&self) -> FirstTable<B> {
        let prefixes: Vec<B> = self.tables.iter().map(Table::prefix_mask::<B>).collect();
        let [b] = self.levels[..] else {
            // Nested designs: every earlier table's prefix.
            return FirstTable::earlier_prefixes(prefixes);
        };
        // One level: the tables are the (b − k)-subsets of b blocks in
        // lexicographic order, so the first one a pair shares is made of the
        // smallest blocks it agrees on. A pair that shares table t's blocks
        // is t's exactly when it differs in every block before t's last one
        // that t leaves out (one such block it agrees on would make an
        // earlier subset).
        let blocks: Vec<B> = split(
            &[Segment {
                start: 0,
                len: self.bits,
            }],
            b,
        )
        .iter()
        .map(|part| {
            part.iter()
                .fold(B::zero(), |m, s| m.or(B::mask(s.start, s.len)))
        })
        .collect();
        let combos = combinations(b as usize, (b - self.k) as usize);
        let built_here = combos.len() == prefixes.len()
            && combos.iter().zip(&prefixes).all(|(combo, &prefix)| {
                combo.iter().fold(B::zero(), |m, &j| m.or(blocks[j])) == prefix
            });
        if !built_here {
            // Tables in another order (a design read from elsewhere): the
            // general rule.
            return FirstTable::earlier_prefixes(prefixes);
        }
        let mut masks = Vec::new();
        let mut ranges = Vec::with_capacity(self.tables.len());
        for combo in combos {
            let from = masks.len();
            let last = *combo.last().expect("a table picks at least one block");
            masks.extend((0..last).filter(|j| !combo.contains(j)).map(|j| blocks[j]));
            ranges.push(from..masks.len());
        }
        FirstTable { masks, ranges }
    }

    /// A one-line description, as the paper writes them.
    pub fn describe(&self) -> String {
        let (lo, hi) = self.prefix_range();
        let levels: Vec<String> = self
            .levels
            .iter()
            .map(|b| format!("{b} blocks pick {}", b - self.k))
            .collect();
        format!(
            "{} tables ({}), prefix {} bits",
            self.tables.len(),
            levels.join(", then "),
            span(lo, hi)
        )
    }
}

/// Which table reports a pair that several tables find: the first, in the
/// design's order, whose prefix the pair shares. Per table, a list of masks
/// (fingerprint positions): a pair sharing the table's prefix is the table's
/// when its difference has a bit in every one. For any design the list is
/// every earlier table's prefix; for one level of blocks it is the few
/// blocks the table skips before its last one (at most k, against up to
/// hundreds of earlier tables: a crowded join checks this for every pair
/// within k in every table that finds it).
#[derive(Clone, Debug)]
pub(crate) struct FirstTable<B> {
    masks: Vec<B>,
    ranges: Vec<std::ops::Range<usize>>,
}

impl<B: Bits> FirstTable<B> {
    /// The rule for any design: every earlier table's prefix (`prefixes`,
    /// in table order).
    fn earlier_prefixes(prefixes: Vec<B>) -> Self {
        FirstTable {
            ranges: (0..prefixes.len()).map(|t| 0..t).collect(),
            masks: prefixes,
        }
    }

    /// The masks of table `t`.
    pub(crate) fn of(&self, t: usize) -> &[B] {
        &self.masks[self.ranges[t].clone()]
    }
}

/// Whether a pair differing in `diff`, found by a table whose
/// [`FirstTable::of`] masks are `masks`, is that table's to report.
#[inline]
pub(crate) fn reported_by<B: Bits>(masks: &[B], diff: B) -> bool {
    masks.iter().all(|&m| diff.and(m) != B::zero())
}

fn build(
    remaining: &[Segment],
    levels: &[u32],
    k: u32,
    chosen: &mut Vec<Segment>,
    out: &mut Vec<Table>,
) {
    let Some((&b, rest_levels)) = levels.split_first() else {
        let mut order = chosen.clone();
        order.extend_from_slice(remaining);
        out.push(Table {
            order,
            prefix_segments: chosen.len(),
        });
        return;
    };
    let parts = split(remaining, b);
    for combo in combinations(b as usize, (b - k) as usize) {
        let before = chosen.len();
        let mut rest = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            if combo.contains(&i) {
                chosen.extend_from_slice(part);
            } else {
                rest.extend_from_slice(part);
            }
        }
        build(&rest, rest_levels, k, chosen, out);
        chosen.truncate(before);
    }
}

/// Cuts the bits of `segments` (most significant first) into `b` consecutive parts
/// of near-equal size, the larger ones first (13,13,13,13,12 for 64 bits in 5).
fn split(segments: &[Segment], b: u32) -> Vec<Vec<Segment>> {
    // Walk bits from the most significant; segments are given in that order.
    let total: u32 = segments.iter().map(|s| s.len).sum();
    let (q, r) = (total / b, total % b);
    let mut parts = Vec::with_capacity(b as usize);
    let mut queue: Vec<Segment> = segments.to_vec();
    queue.reverse(); // pop() yields the most significant segment first
    for i in 0..b {
        let mut need = q + u32::from(i < r);
        let mut part = Vec::new();
        while need > 0 {
            let s = queue.pop().expect("enough bits");
            if s.len <= need {
                need -= s.len;
                part.push(s);
            } else {
                // Take the top `need` bits of this segment.
                part.push(Segment {
                    start: s.start + s.len - need,
                    len: need,
                });
                queue.push(Segment {
                    start: s.start,
                    len: s.len - need,
                });
                need = 0;
            }
        }
        parts.push(part);
    }
    parts
}

fn binomial(n: u32, k: u32) -> usize {
    let k = k.min(n - k) as usize;
    let mut r = 1usize;
    for i in 0..k {
        r = r * (n as usize - i) / (i + 1);
    }
    r
}

/// All k-subsets of 0..n in lexicographic order.
fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut c: Vec<usize> = (0..k).collect();
    loop {
        out.push(c.clone());
        let Some(i) = (0..k).rev().find(|&i| c[i] != i + n - k) else {
            return out;
        };
        c[i] += 1;
        for j in i + 1..k {
            c[j] = c[j - 1] + 1;
        }
    }
}

/// A range of values as a description writes it: `6` or `6-7`.
pub(crate) fn span(lo: u32, hi: u32) -> String {
    if lo == hi {
        format!("{lo}")
    } else {
        format!("{lo}-{hi}")
    }
}

/// Directory bits for a table of `n` entries (the same rule the tables use).
pub fn directory_bits(prefix_bits: u32, n: f64) -> u32 {
    dir_bits_for(n.min(usize::MAX as f64) as usize, prefix_bits)
}

/// Directory bits for `n` entries: about eight entries per bucket (a cache line
/// or two of keys), never more than the prefix.
pub(crate) fn dir_bits_for(n: usize, prefix_bits: u32) -> u32 {
    let log = usize::BITS - n.max(2).leading_zeros() - 1;
    log.saturating_sub(3).clamp(1, 26).min(prefix_bits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn top_pieces_give_the_permuted_keys_top_bits(
            x in any::<u128>(), k in 1u32..17, extra in 1u32..4, d in 1u32..27,
        ) {
            for bits in [64u32, 128] {
                let Ok(design) = TableDesign::new(bits, k.min(bits / 8), &[k.min(bits / 8) + extra]) else {
                    continue;
                };
                for t in &design.tables {
                    let d = d.min(t.prefix_bits());
                    let pieces = t.top_pieces(d);
                    if bits == 64 {
                        prop_assert_eq!(top_of(&pieces, x as u64), t.permute(x as u64).top(d));
                    } else {
                        prop_assert_eq!(top_of(&pieces, x), t.permute(x).top(d));
                    }
                }
            }
        }
    }

    proptest! {
        // The short rule of one-level designs against its definition: the
        // first table, in the design's order, whose prefix the pair shares.
        #[test]
        fn the_first_table_rule_picks_the_first_table_sharing_the_prefix(
            positions in prop::collection::vec(0u32..128, 0..24),
            clustered in any::<bool>(), k in 1u32..17, extra in 1u32..4, wide in any::<bool>(),
        ) {
            let bits = if wide { 128 } else { 64 };
            let k = k.min(bits / 8);
            // Differences spread over the word or packed into a few blocks.
            let diff = positions.iter().fold(0u128, |d, &p| {
                let p = if clustered { p % 24 } else { p % bits };
                d | 1u128 << p
            });
            let levels: &[&[u32]] = &[&[k + extra], &[k + 1, k + extra]];
            let designs = levels.iter().filter_map(|l| TableDesign::new(bits, k, l).ok());
            // Also with the tables in another order than built (a design
            // read from elsewhere): the general rule then.
            let designs = designs.flat_map(|d| {
                let mut reversed = d.clone();
                reversed.tables.reverse();
                [d, reversed]
            });
            for design in designs {
                let rule = design.first_table::<u128>();
                let prefixes: Vec<u128> = design.tables.iter().map(|t| t.prefix_mask::<u128>()).collect();
                let shares = |t: usize| diff & prefixes[t] == 0;
                let first = (0..prefixes.len()).find(|&t| shares(t));
                for t in (0..prefixes.len()).filter(|&t| shares(t)) {
                    prop_assert_eq!(reported_by(rule.of(t), diff), Some(t) == first,
                        "table {} of {}", t, design.describe());
                }
            }
        }
    }

    #[test]
    fn every_table_is_a_permutation_of_all_bits() {
        for (bits, k, levels) in [
            (64, 3, vec![5]),
            (64, 3, vec![4, 4]),
            (128, 6, vec![8, 7]),
            (64, 0, vec![2]),
        ] {
            let d = TableDesign::new(bits, k, &levels).unwrap();
            for t in &d.tables {
                let mut covered = vec![false; bits as usize];
                for s in &t.order {
                    for b in s.start..s.start + s.len {
                        assert!(!covered[b as usize], "bit {b} twice");
                        covered[b as usize] = true;
                    }
                }
                assert!(covered.iter().all(|&c| c));
            }
        }
    }

    #[test]
    fn permutation_preserves_distance_and_puts_the_prefix_on_top() {
        let d = TableDesign::new(64, 3, &[6]).unwrap();
        let (x, y) = (0x0123_4567_89ab_cdefu64, 0xfedc_ba98_7654_3210u64);
        for t in &d.tables {
            assert_eq!(t.permute(x).distance(t.permute(y)), x.distance(y));
            assert_eq!(t.unpermute(t.permute(x)), x);
            let p = t.prefix_bits();
            let m = t.prefix_mask::<u64>();
            // Equal under the prefix mask iff the permuted tops agree.
            let z = x ^ (!m & 0xffff);
            assert_eq!(t.permute(x).top(p), t.permute(z).top(p));
            assert_eq!(m.count_ones(), p);
        }
    }

    #[test]
    fn impossible_designs_are_refused() {
        assert!(TableDesign::new(64, 3, &[3]).is_err());
        assert!(TableDesign::new(64, 3, &[20]).is_err());
    }
}
