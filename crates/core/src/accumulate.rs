//! The SimHash vector V: per-bit sums of feature weights.
//!
//! Bit i of the fingerprint is 1 iff the weight of the features whose hash has
//! bit i set is strictly greater than half the total weight (V[i] > 0 in the
//! paper's ±w formulation, and exactly PyPI `simhash`'s rule).

use crate::centre::BitShares;
use crate::fingerprint::{Fingerprint, Width};

/// `SPREAD[b]` has byte j equal to bit j of `b`: adding it to a u64 adds bit j
/// of `b` to the j-th of eight byte-wide counters.
static SPREAD: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut j = 0;
        while j < 8 {
            if b >> j & 1 == 1 {
                t[b] |= 1 << (8 * j);
            }
            j += 1;
        }
        b += 1;
    }
    t
};

/// Sums for features of weight 1 (term frequency counts every occurrence once):
/// counts in byte lanes, eight bits per `u64` add, flushed before a lane can overflow.
#[derive(Clone, Debug)]
pub(crate) struct UnitSums {
    width: Width,
    lanes: [u64; 16],
    pending: u32,
    counts: [u64; 128],
    total: u64,
}

impl UnitSums {
    pub(crate) fn new(width: Width) -> Self {
        UnitSums {
            width,
            lanes: [0; 16],
            pending: 0,
            counts: [0; 128],
            total: 0,
        }
    }

    #[inline]
    pub(crate) fn add(&mut self, hash: u128) {
        let bytes = hash.to_le_bytes();
        let n = self.width.bits() as usize / 8;
        for (lane, &b) in self.lanes[..n].iter_mut().zip(&bytes[..n]) {
            *lane += SPREAD[b as usize];
        }
        self.pending += 1;
        self.total += 1;
        if self.pending == 255 {
            self.flush();
        }
    }

    /// Adds up to 255 hashes at once, with the counters in registers.
    #[inline]
    pub(crate) fn add_all(&mut self, hashes: &[u128]) {
        debug_assert!(hashes.len() <= 255);
        if self.pending as usize + hashes.len() > 255 {
            self.flush();
        }
        let wide = self.width == Width::W128;
        #[cfg(target_arch = "x86_64")]
        if crate::floor::avx512bw() {
            // SAFETY: the CPU has AVX-512 BW.
            unsafe { x86::spread(&mut self.lanes, hashes, wide) };
        } else if wide {
            Self::spread_into::<16>(&mut self.lanes, hashes);
        } else {
            Self::spread_into::<8>(&mut self.lanes, hashes);
        }
        #[cfg(not(target_arch = "x86_64"))]
        match wide {
            true => Self::spread_into::<16>(&mut self.lanes, hashes),
            false => Self::spread_into::<8>(&mut self.lanes, hashes),
        }
        self.pending += hashes.len() as u32;
        self.total += hashes.len() as u64;
    }

    #[inline(always)]
    fn spread_into<const N: usize>(lanes: &mut [u64; 16], hashes: &[u128]) {
        let mut local: [u64; N] = lanes[..N].try_into().expect("N lanes");
        for &h in hashes {
            let bytes = h.to_le_bytes();
            for (lane, &b) in local.iter_mut().zip(&bytes[..N]) {
                *lane += SPREAD[b as usize];
            }
        }
        lanes[..N].copy_from_slice(&local);
    }

    fn flush(&mut self) {
        let n = self.width.bits() as usize / 8;
        for (m, lane) in self.lanes[..n].iter_mut().enumerate() {
            for j in 0..8 {
                self.counts[8 * m + j] += (*lane >> (8 * j)) & 0xff;
            }
            *lane = 0;
        }
        self.pending = 0;
    }

    pub(crate) fn finish(mut self) -> Fingerprint {
        self.flush();
        let mut value = 0u128;
        for i in 0..self.width.bits() as usize {
            if 2 * self.counts[i] > self.total {
                value |= 1 << i;
            }
        }
        Fingerprint::new(value, self.width)
    }

    /// Each bit's share of the weight, before a threshold decides it.
    pub(crate) fn shares(mut self) -> BitShares {
        self.flush();
        BitShares::of_counts(&self.counts, self.total, self.width)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::UnitSums::spread_into`] of `hashes` (their low 64 bits, or
    /// all 128 when `wide`): the byte counters of lanes 0 to 7 (8 to 15) are
    /// bits 0 to 63 (64 to 127) in order, so each 64 bits of a hash, as a
    /// mask of bytes set to -1, are subtracted from them at once.
    ///
    /// # Safety
    /// The CPU must have AVX-512 BW.
    #[target_feature(enable = "avx512bw")]
    pub(super) unsafe fn spread(lanes: &mut [u64; 16], hashes: &[u128], wide: bool) {
        let (low, high) = lanes.split_at_mut(8);
        let (low, high) = (
            low.as_mut_ptr().cast::<__m512i>(),
            high.as_mut_ptr().cast::<__m512i>(),
        );
        // SAFETY: each half is eight u64s, 64 bytes, read and written unaligned.
        unsafe {
            let mut lo = _mm512_loadu_si512(low);
            if wide {
                let mut hi = _mm512_loadu_si512(high);
                for &h in hashes {
                    lo = _mm512_sub_epi8(lo, _mm512_movm_epi8(h as u64));
                    hi = _mm512_sub_epi8(hi, _mm512_movm_epi8((h >> 64) as u64));
                }
                _mm512_storeu_si512(high, hi);
            } else {
                for &h in hashes {
                    lo = _mm512_sub_epi8(lo, _mm512_movm_epi8(h as u64));
                }
            }
            _mm512_storeu_si512(low, lo);
        }
    }
}

/// Sums for arbitrary real weights (possibly negative).
#[derive(Clone, Debug)]
pub(crate) struct WeightedSums {
    width: Width,
    sums: [f64; 128],
    total: f64,
}

impl WeightedSums {
    pub(crate) fn new(width: Width) -> Self {
        WeightedSums {
            width,
            sums: [0.0; 128],
            total: 0.0,
        }
    }

    #[inline]
    pub(crate) fn add(&mut self, hash: u128, weight: f64) {
        let n = self.width.bits() as usize;
        for (i, s) in self.sums[..n].iter_mut().enumerate() {
            if (hash >> i) & 1 == 1 {
                *s += weight;
            }
        }
        self.total += weight;
    }

    pub(crate) fn finish(self) -> Fingerprint {
        let mut value = 0u128;
        for i in 0..self.width.bits() as usize {
            if 2.0 * self.sums[i] > self.total {
                value |= 1 << i;
            }
        }
        Fingerprint::new(value, self.width)
    }

    /// Each bit's share of the weight, before a threshold decides it.
    pub(crate) fn shares(self) -> BitShares {
        BitShares::of_sums(&self.sums, self.total, self.width)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The textbook definition: V[i] += w if bit i of the hash is set, else -= w;
    /// bit i = V[i] > 0.
    fn textbook(hashes: &[(u128, i64)], width: Width) -> u128 {
        let mut v = vec![0i64; width.bits() as usize];
        for &(h, w) in hashes {
            for (i, vi) in v.iter_mut().enumerate() {
                if (h >> i) & 1 == 1 {
                    *vi += w
                } else {
                    *vi -= w
                }
            }
        }
        v.iter()
            .enumerate()
            .filter(|&(_, &x)| x > 0)
            .fold(0u128, |acc, (i, _)| acc | 1 << i)
    }

    proptest! {
        #[test]
        fn unit_sums_match_textbook(hashes in prop::collection::vec(any::<u128>(), 0..700), wide in any::<bool>()) {
            let width = if wide { Width::W128 } else { Width::W64 };
            let mut acc = UnitSums::new(width);
            for &h in &hashes { acc.add(h & width.mask()); }
            // The same hashes in groups, as the batched path adds them.
            let mut grouped = UnitSums::new(width);
            let masked: Vec<u128> = hashes.iter().map(|&h| h & width.mask()).collect();
            for group in masked.chunks(31) { grouped.add_all(group); }
            // The counts themselves, not only the bits they decide (added by
            // AVX-512 where the CPU has it, else eight bits an add).
            let (mut g, mut a) = (grouped.clone(), acc.clone());
            g.flush();
            a.flush();
            prop_assert_eq!(g.counts, a.counts);
            // Both ways of adding a group, whichever the CPU runs.
            for group in masked.chunks(255) {
                let mut scalar = [0u64; 16];
                match wide {
                    true => UnitSums::spread_into::<16>(&mut scalar, group),
                    false => UnitSums::spread_into::<8>(&mut scalar, group),
                }
                #[cfg(target_arch = "x86_64")]
                if crate::floor::avx512bw() {
                    let mut vector = [0u64; 16];
                    // SAFETY: the CPU has AVX-512 BW.
                    unsafe { x86::spread(&mut vector, group, wide) };
                    prop_assert_eq!(vector, scalar);
                }
            }
            prop_assert_eq!(grouped.finish().value(), acc.clone().finish().value());
            let pairs: Vec<(u128, i64)> = hashes.iter().map(|&h| (h & width.mask(), 1)).collect();
            prop_assert_eq!(acc.finish().value(), textbook(&pairs, width));
        }

        #[test]
        fn weighted_sums_match_textbook(pairs in prop::collection::vec((any::<u128>(), -50i64..50), 0..100), wide in any::<bool>()) {
            let width = if wide { Width::W128 } else { Width::W64 };
            let pairs: Vec<(u128, i64)> = pairs.into_iter().map(|(h, w)| (h & width.mask(), w)).collect();
            let mut acc = WeightedSums::new(width);
            for &(h, w) in &pairs { acc.add(h, w as f64); }
            prop_assert_eq!(acc.finish().value(), textbook(&pairs, width));
        }
    }
}
