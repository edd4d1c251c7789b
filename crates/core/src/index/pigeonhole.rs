//! A self-join split into independent groups, for a join spread across
//! machines (the Spark job).
//!
//! The fingerprint is cut into k + 1 parts, paired into blocks (parts 0 and
//! 1, 2 and 3, ...; an odd last part alone). Two fingerprints within k
//! differ in at most k bits, so some block holds at most one of them, or
//! the lone part none (two per block and one more would make k + 1): within
//! that block one part is equal, and its partner within one bit. Each
//! document is sent to k + 1 groups, one per part, keyed by (part, the
//! part's value); a group is joined on its own
//! ([`Pigeonhole::group_pairs`]), its documents bucketed by their partner
//! part's value and each compared with the buckets within one bit of its
//! own (the multi-index of Manku et al. §3.1.1, ten blocks searched within
//! radius one at k = 19), so that a document is compared with as many as
//! `neardup dedup`'s join would compare it with, and no machine holds more
//! than a group. A pair is reported by one group only: that of the first
//! part it shares whose partner is within one bit. Exact: no pair within k
//! is missed, none is reported twice.

use crate::error::Error;
use crate::index::Bits;

/// Bits of a key that hold the part's value; the part's index is above
/// them. A wider value is mixed down to this many bits (groups may then
/// share a key; each pair is still reported once, by its first group).
const VALUE_BITS: u32 = 56;

/// The k + 1 parts of a fingerprint width.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pigeonhole {
    /// (first bit, length) of each part, from the least significant bit.
    parts: Vec<(u32, u32)>,
    /// Each part's bits, and its partner's (none without one).
    masks: Vec<(u128, u128)>,
}

impl Pigeonhole {
    /// The parts for fingerprints of `bits` searched within `k`.
    pub fn new(bits: u32, k: u32) -> Result<Self, Error> {
        let n = k + 1;
        if n > bits || n >= 128 {
            return Err(Error::InvalidConfig(format!(
                "k = {k} at {bits} bits: a distributed join needs k + 1 parts of at least one bit \
                 (and at most 127 parts); lower k"
            )));
        }
        let parts: Vec<(u32, u32)> = (0..n)
            .map(|b| {
                let start = b * bits / n;
                (start, (b + 1) * bits / n - start)
            })
            .collect();
        let bits_of = |(start, len): (u32, u32)| (u128::MAX >> (128 - len)) << start;
        let masks: Vec<(u128, u128)> = (0..parts.len())
            .map(|p| {
                let partner = p ^ 1;
                let theirs = if partner < parts.len() {
                    bits_of(parts[partner])
                } else {
                    0
                };
                (bits_of(parts[p]), theirs)
            })
            .collect();
        Ok(Self { parts, masks })
    }

    /// Parts, that is, groups per document.
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    fn value(&self, part: usize, fp: u128) -> u128 {
        let (start, len) = self.parts[part];
        (fp >> start) & (u128::MAX >> (128 - len))
    }

    /// The group key of `fp`'s part `part`: the part's index in the top
    /// bits, its value below (mixed down when wider than 56 bits).
    pub fn key(&self, part: usize, fp: u128) -> i64 {
        let v = self.value(part, fp);
        let low = if self.parts[part].1 <= VALUE_BITS {
            v as u64
        } else {
            // SplitMix64's finaliser over both halves.
            let mut z =
                ((v >> 64) as u64 ^ (v as u64).rotate_left(29)).wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) >> (64 - VALUE_BITS)
        };
        (((part as u64) << VALUE_BITS) | low) as i64
    }

    /// The part a key is of.
    pub fn part_of(key: i64) -> usize {
        (key as u64 >> VALUE_BITS) as usize
    }

    /// The partner of part `part`, if it has one.
    fn partner(&self, part: usize) -> Option<usize> {
        let p = part ^ 1;
        (p < self.parts.len()).then_some(p)
    }

    /// Whether the group of part `part` finds `a` and `b`: the part equal,
    /// its partner (if any) within one bit.
    fn finds(&self, part: usize, x: u128) -> bool {
        let (mine, partner) = self.masks[part];
        x & mine == 0 && (x & partner).count_ones() <= 1
    }

    /// The group that reports `a` and `b` (within k): the first part whose
    /// group finds them.
    pub fn first_shared(&self, a: u128, b: u128) -> Option<usize> {
        let x = a ^ b;
        (0..self.parts.len()).find(|&part| self.finds(part, x))
    }

    /// Calls `f(x, y, distance)` (x < y, indices into `fps`) for every pair
    /// of one group of part `part` within `k` that this group reports
    /// ([`Pigeonhole::first_shared`]). Identical fingerprints are compared
    /// once; the others are bucketed by their partner part.
    pub fn group_pairs<B: Bits>(
        &self,
        part: usize,
        fps: &[B],
        k: u32,
        mut f: impl FnMut(u32, u32, u32),
    ) -> Result<(), Error> {
        self.group_pairs_while(part, fps, k, |x, y, d| {
            f(x, y, d);
            true
        })
    }

    /// [`Pigeonhole::group_pairs`], until `f` returns false (the group's
    /// other pairs are not sought).
    pub fn group_pairs_while<B: Bits>(
        &self,
        part: usize,
        fps: &[B],
        k: u32,
        mut f: impl FnMut(u32, u32, u32) -> bool,
    ) -> Result<(), Error> {
        let partner = self.partner(part);
        let key = |fp: B| partner.map_or(0, |p| self.value(p, fp.to_u128()));
        // Identical fingerprints collapsed; the distinct ones sorted by their
        // partner's value (then fingerprint): `order` the rows, `runs` where
        // each distinct fingerprint's rows start.
        let mut order: Vec<u32> = (0..fps.len() as u32).collect();
        order.sort_unstable_by_key(|&x| (key(fps[x as usize]), fps[x as usize]));
        let mut runs: Vec<usize> = Vec::new();
        for (at, w) in order.iter().enumerate() {
            if at == 0 || fps[*w as usize] != fps[order[at - 1] as usize] {
                runs.push(at);
            }
        }
        runs.push(order.len());
        let members = |u: usize| &order[runs[u]..runs[u + 1]];
        let mut emit = |a: u32, b: u32, d: u32| f(a.min(b), a.max(b), d);
        // Copies share every part: part 0 reports them.
        if part == 0 {
            for u in 0..runs.len() - 1 {
                let m = members(u);
                for (x, &a) in m.iter().enumerate() {
                    for &b in &m[x + 1..] {
                        if !emit(a, b, 0) {
                            return Ok(());
                        }
                    }
                }
            }
        }
        let distinct: Vec<B> = (0..runs.len() - 1)
            .map(|u| fps[order[runs[u]] as usize])
            .collect();
        let keys: Vec<u128> = distinct.iter().map(|&fp| key(fp)).collect();
        let width = partner.map_or(0, |p| self.parts[p].1);
        // Where each bucket starts in `distinct`: a dense table for narrow
        // partners, else found by binary search.
        let dense = (width <= 16).then(|| {
            let mut starts = vec![0u32; (1usize << width) + 1];
            for &v in &keys {
                starts[v as usize + 1] += 1;
            }
            for x in 1..starts.len() {
                starts[x] += starts[x - 1];
            }
            starts
        });
        let bucket = |v: u128| match &dense {
            Some(starts) => (starts[v as usize] as usize, starts[v as usize + 1] as usize),
            None => {
                let lo = keys.partition_point(|&x| x < v);
                (lo, lo + keys[lo..].partition_point(|&x| x == v))
            }
        };
        let mut hits = Vec::new();
        for u in 0..distinct.len() {
            for flip in 0..=width {
                let v = if flip == width {
                    keys[u]
                } else {
                    keys[u] ^ (1u128 << flip)
                };
                let (lo, hi) = bucket(v);
                // Each pair once: from its first distinct fingerprint.
                let from = lo.max(u + 1);
                if from >= hi {
                    continue;
                }
                hits.clear();
                distinct[u].within(&distinct[from..hi], k, &mut hits);
                for &h in &hits {
                    let v = from + h as usize;
                    if self.first_shared(distinct[u].to_u128(), distinct[v].to_u128()) != Some(part)
                    {
                        continue;
                    }
                    let d = distinct[u].distance(distinct[v]);
                    for &a in members(u) {
                        for &b in members(v) {
                            if !emit(a, b, d) {
                                return Ok(());
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// Every pair within k, each once, from the groups of every part,
    /// against all pairs compared one by one.
    fn check<B: Bits>(fps: &[B], k: u32) {
        let ph = Pigeonhole::new(B::BITS, k).unwrap();
        let mut groups: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
        for (x, f) in fps.iter().enumerate() {
            for b in 0..ph.parts() {
                groups
                    .entry(ph.key(b, f.to_u128()))
                    .or_default()
                    .push(x as u32);
            }
        }
        let mut got = Vec::new();
        for (key, rows) in &groups {
            let sub: Vec<B> = rows.iter().map(|&x| fps[x as usize]).collect();
            ph.group_pairs(Pigeonhole::part_of(*key), &sub, k, |x, y, d| {
                let (a, b) = (rows[x as usize], rows[y as usize]);
                got.push((a.min(b), a.max(b), d));
            })
            .unwrap();
        }
        let found: BTreeSet<_> = got.iter().copied().collect();
        assert_eq!(found.len(), got.len(), "a pair reported twice");
        let mut want = BTreeSet::new();
        for a in 0..fps.len() {
            for b in a + 1..fps.len() {
                let d = fps[a].distance(fps[b]);
                if d <= k {
                    want.insert((a as u32, b as u32, d));
                }
            }
        }
        assert_eq!(found, want);
    }

    /// Fingerprints near a few centres (so that groups hold pairs within k,
    /// copies and pairs just beyond it), from seeds.
    fn clustered(centres: &[u128], picks: &[(usize, u128, u8)], mask: u128) -> Vec<u128> {
        picks
            .iter()
            .map(|&(c, noise, flips)| {
                let mut f = centres[c % centres.len()];
                let mut n = noise;
                for _ in 0..flips {
                    f ^= 1u128 << (n % 128);
                    n = n.rotate_left(7) ^ 0x9E37_79B9;
                }
                f & mask
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn groups_report_every_pair_within_k_once_128(
            centres in prop::collection::vec(any::<u128>(), 1..6),
            picks in prop::collection::vec((0usize..6, any::<u128>(), 0u8..24), 2..220),
            k in 0u32..24,
        ) {
            let fps = clustered(&centres, &picks, u128::MAX);
            check::<u128>(&fps, k);
        }

        #[test]
        fn groups_report_every_pair_within_k_once_64(
            centres in prop::collection::vec(any::<u128>(), 1..6),
            picks in prop::collection::vec((0usize..6, any::<u128>(), 0u8..10), 2..220),
            k in 0u32..9,
        ) {
            let fps: Vec<u64> = clustered(&centres, &picks, u64::MAX as u128).into_iter().map(|f| f as u64).collect();
            check::<u64>(&fps, k);
        }
    }

    #[test]
    fn a_large_group_is_joined_by_a_plan() {
        // Hundreds of fingerprints in a group, with copies among them.
        let centres: Vec<u128> = (0..4u128)
            .map(|c| c.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835))
            .collect();
        let picks: Vec<(usize, u128, u8)> = (0..600u128)
            .map(|x| {
                (
                    (x % 4) as usize,
                    x.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ x,
                    (x % 23) as u8,
                )
            })
            .collect();
        let mut fps = clustered(&centres, &picks, u128::MAX);
        fps.extend_from_within(..40);
        check::<u128>(&fps, 19);
    }

    #[test]
    fn a_group_stops_when_asked() {
        let fps: Vec<u128> = (0..50u128).map(|x| x << 100).collect();
        let ph = Pigeonhole::new(128, 19).unwrap();
        let mut all = 0;
        ph.group_pairs(0, &fps, 19, |_, _, _| all += 1).unwrap();
        assert!(all > 100);
        let mut seen = 0;
        ph.group_pairs_while(0, &fps, 19, |_, _, _| {
            seen += 1;
            seen < 7
        })
        .unwrap();
        assert_eq!(seen, 7);
    }

    #[test]
    fn parts_cover_the_width() {
        let ph = Pigeonhole::new(128, 19).unwrap();
        assert_eq!(ph.parts(), 20);
        assert_eq!(ph.parts.iter().map(|b| b.1).sum::<u32>(), 128);
        assert!(ph.parts.iter().all(|b| b.1 == 6 || b.1 == 7));
        assert!(Pigeonhole::new(64, 64).is_err());
        // Keys of different parts differ even for equal values.
        assert_ne!(ph.key(0, 0), ph.key(1, 0));
        assert_eq!(Pigeonhole::part_of(ph.key(7, u128::MAX)), 7);
        // A 64-bit part (k = 1) is mixed into the key's 56 bits.
        let wide = Pigeonhole::new(128, 1).unwrap();
        assert_eq!(Pigeonhole::part_of(wide.key(1, u128::MAX)), 1);
    }
}
