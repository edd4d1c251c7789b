//! The join's inner loop: which of a run of fingerprints lie within k of one.
//!
//! Crowded corpora (one language, one subject: documentation, forums, a
//! product catalogue) put thousands of fingerprints in the same bucket of a
//! table while few of them are within k of each other, so the join spends
//! most of its time measuring distances that fail. On CPUs with AVX-512's
//! per-lane population count (VPOPCNTDQ: Intel since Ice Lake, AMD since
//! Zen 4) eight 64-bit words are measured per instruction, chosen at run time;
//! elsewhere the scalar loop uses the hardware `popcnt` of x86-64-v2.

/// Pushes onto `hits` the index of every `others[i]` within `k` of `a`
/// (distances are measured again by the caller for the few that pass).
pub(crate) fn within_u128(a: u128, others: &[u128], k: u32, hits: &mut Vec<u32>) {
    #[cfg(target_arch = "x86_64")]
    if others.len() >= 8 && avx512() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { x86::within_u128(a, others, k, hits) };
    }
    scalar(a, others, k, 0, hits);
}

/// [`within_u128`] for 64-bit fingerprints.
pub(crate) fn within_u64(a: u64, others: &[u64], k: u32, hits: &mut Vec<u32>) {
    #[cfg(target_arch = "x86_64")]
    if others.len() >= 16 && avx512() {
        // SAFETY: as above.
        return unsafe { x86::within_u64(a, others, k, hits) };
    }
    scalar(a, others, k, 0, hits);
}

/// The portable loop, over `others` whose first element is index `base`.
#[inline]
fn scalar<B: super::Bits>(a: B, others: &[B], k: u32, base: usize, hits: &mut Vec<u32>) {
    for (i, &b) in others.iter().enumerate() {
        if a.distance(b) <= k {
            hits.push((base + i) as u32);
        }
    }
}

/// Nanoseconds of one core per comparison of two fingerprints in a join's
/// run, on this CPU: 0.15 with AVX-512 VPOPCNTDQ, 0.35 with the scalar
/// `popcnt` (fitted to the joins of docs/dedup.md; the planners' one figure
/// for it).
pub(crate) fn compare_ns() -> f64 {
    if avx512() { 0.15 } else { 0.35 }
}

/// Whether distances are measured eight words per instruction (AVX-512
/// VPOPCNTDQ, unless `NEARDUP_NO_AVX512` is set).
pub(crate) use crate::floor::avx512_popcnt as avx512;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Pushes the set bits of `mask` (lane i at bit `i * step`) as indices
    /// from `base`.
    #[inline(always)]
    fn push_lanes(mut mask: u32, step: u32, base: usize, hits: &mut Vec<u32>) {
        while mask != 0 {
            hits.push((base + (mask.trailing_zeros() / step) as usize) as u32);
            mask &= mask - 1;
        }
    }

    /// # Safety
    /// The CPU must have AVX-512F and AVX-512 VPOPCNTDQ.
    #[target_feature(enable = "avx512f,avx512vpopcntdq")]
    pub(super) unsafe fn within_u128(a: u128, others: &[u128], k: u32, hits: &mut Vec<u32>) {
        // Little-endian u128s: the low word in even lanes, the high in odd.
        let (lo, hi) = (a as u64 as i64, (a >> 64) as u64 as i64);
        let av = _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo);
        let kv = _mm512_set1_epi64(i64::from(k));
        let chunks = others.chunks_exact(8);
        let tail = chunks.remainder();
        for (c, chunk) in chunks.enumerate() {
            let p = chunk.as_ptr().cast::<__m512i>();
            // SAFETY: `chunk` holds 8 u128, two 64-byte loads (unaligned).
            let (x0, x1) = unsafe { (_mm512_loadu_si512(p), _mm512_loadu_si512(p.add(1))) };
            let c0 = _mm512_popcnt_epi64(_mm512_xor_si512(x0, av));
            let c1 = _mm512_popcnt_epi64(_mm512_xor_si512(x1, av));
            // Each lane plus its neighbour in the pair: both lanes of a
            // fingerprint then hold its distance; the even lanes are read.
            let d0 = _mm512_add_epi64(c0, _mm512_shuffle_epi32::<0x4E>(c0));
            let d1 = _mm512_add_epi64(c1, _mm512_shuffle_epi32::<0x4E>(c1));
            let m = u32::from(_mm512_cmple_epu64_mask(d0, kv))
                | u32::from(_mm512_cmple_epu64_mask(d1, kv)) << 8;
            push_lanes(m & 0x5555, 2, c * 8, hits);
        }
        super::scalar(a, tail, k, others.len() - tail.len(), hits);
    }

    /// # Safety
    /// As [`within_u128`].
    #[target_feature(enable = "avx512f,avx512vpopcntdq")]
    pub(super) unsafe fn within_u64(a: u64, others: &[u64], k: u32, hits: &mut Vec<u32>) {
        let av = _mm512_set1_epi64(a as i64);
        let kv = _mm512_set1_epi64(i64::from(k));
        let chunks = others.chunks_exact(16);
        let tail = chunks.remainder();
        for (c, chunk) in chunks.enumerate() {
            let p = chunk.as_ptr().cast::<__m512i>();
            // SAFETY: `chunk` holds 16 u64, two 64-byte loads (unaligned).
            let (x0, x1) = unsafe { (_mm512_loadu_si512(p), _mm512_loadu_si512(p.add(1))) };
            let d0 = _mm512_popcnt_epi64(_mm512_xor_si512(x0, av));
            let d1 = _mm512_popcnt_epi64(_mm512_xor_si512(x1, av));
            let m = u32::from(_mm512_cmple_epu64_mask(d0, kv))
                | u32::from(_mm512_cmple_epu64_mask(d1, kv)) << 8;
            push_lanes(m, 1, c * 16, hits);
        }
        super::scalar(a, tail, k, others.len() - tail.len(), hits);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::Bits;

    /// `a.within(others)` against the definition, for `others` made of
    /// values a few bits from `a` (`near`: `a` with the bits of `x & y &
    /// (x >> 7)` flipped) and random ones, so that both sides of every
    /// threshold are met, in slices of every length around the vector widths.
    /// Where the CPU has AVX-512 VPOPCNTDQ this checks the vector loop; elsewhere
    /// the scalar one.
    fn matches_the_definition<B: Bits>(
        a: B,
        flips: &[(B, B, bool)],
        k: u32,
    ) -> Result<(), TestCaseError> {
        let others: Vec<B> = flips
            .iter()
            .map(|&(x, y, near)| {
                if near {
                    a.xor(x.and(y).and(x.shr(7)))
                } else {
                    x
                }
            })
            .collect();
        let mut hits = Vec::new();
        a.within(&others, k, &mut hits);
        let expected: Vec<u32> = (0..others.len() as u32)
            .filter(|&i| a.distance(others[i as usize]) <= k)
            .collect();
        prop_assert_eq!(hits, expected);
        Ok(())
    }

    proptest! {
        #[test]
        fn wide_words_match_the_definition(
            a in any::<u128>(),
            flips in proptest::collection::vec((any::<u128>(), any::<u128>(), any::<bool>()), 0..70),
            k in 0u32..130,
        ) {
            matches_the_definition(a, &flips, k)?;
        }

        #[test]
        fn narrow_words_match_the_definition(
            a in any::<u64>(),
            flips in proptest::collection::vec((any::<u64>(), any::<u64>(), any::<bool>()), 0..70),
            k in 0u32..66,
        ) {
            matches_the_definition(a, &flips, k)?;
        }
    }
}
