//! Candidate fingerprints centred on their corpus.
//!
//! Bit i of a SimHash fingerprint is 1 when the features whose hash has bit
//! i set carry more than half of the document's weight. In text of one
//! language the words every document uses pull every document's bits the
//! same way: in term-frequency fingerprints of English or Chinese pages a
//! bit is 1 in about 25% or 75% of documents, not 50%, so unrelated
//! documents differ in 44-49 of 128 bits instead of 64, a few in ten
//! thousand of them lie within the wide k that verification searches, and
//! the self-join's tables compare tens of times more pairs than for random
//! bits (docs/dedup.md).
//!
//! Centring moves each bit's threshold from one half to the corpus's mean
//! share: a document's bit i is 1 when its share of weight on bit i exceeds
//! the mean share over all the corpus's documents. This is Charikar's
//! random-hyperplane hash of the document's weight vector minus the corpus
//! mean (the hyperplanes offset to pass through the data's centre): near
//! duplicates still differ only where their shares straddle a threshold,
//! while unrelated documents' bits become independent coin flips.
//!
//! A document's shares are kept as one byte per bit ([`BitShares`]) until
//! the whole corpus has been read; [`Centre`] sums them (in integers, so the
//! mean is the same whatever the order or the number of threads) and then
//! decides each document's bits.

use crate::fingerprint::{Fingerprint, Width};

/// The share a [`BitShares`] byte of 0 stands for; 255 stands for 3/4.
const LOW: f64 = 0.25;
/// Bytes per unit of share: 255 steps over [1/4, 3/4]. Shares outside that
/// range are clamped to it: they lie far from any corpus's mean (means are
/// 0.37-0.6 on text), so their bit is decided all the same.
const SCALE: f64 = 510.0;

/// Where each bit of one document's fingerprint leans: the share of the
/// document's feature weight on features whose hash has that bit set,
/// quantised to a byte (0 for 1/4 or less, 255 for 3/4 or more, a step of
/// 1/510 between). One byte per fingerprint bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BitShares {
    q: [u8; 128],
    width: Width,
}

impl BitShares {
    /// The shares of `counts[i]` of `total` unit weights.
    pub(crate) fn of_counts(counts: &[u64], total: u64, width: Width) -> BitShares {
        let mut q = [0u8; 128];
        let counts = &counts[..width.bits() as usize];
        // round(510 c / t - 127.5), halves up, in integers:
        // floor((1020 c - 255 t + t) / 2t).
        if total > 0 && total < 1 << 40 {
            // Without a division a bit: a floating-point quotient (of
            // integers below 2^51, off by at most one) corrected exactly.
            let t = total as i64;
            let (d, inverse) = (2 * t, 1.0 / (2 * t) as f64);
            for (q, &c) in q.iter_mut().zip(counts) {
                let x = 1020 * c as i64 - 254 * t;
                let mut f = (x as f64 * inverse).floor() as i64;
                f -= i64::from(f * d > x);
                f += i64::from((f + 1) * d <= x);
                *q = f.clamp(0, 255) as u8;
            }
        } else if total > 0 {
            let t = i128::from(total);
            for (q, &c) in q.iter_mut().zip(counts) {
                let x = 1020 * i128::from(c) - 254 * t;
                *q = x.div_euclid(2 * t).clamp(0, 255) as u8;
            }
        }
        BitShares { q, width }
    }

    /// The shares of real weights `sums[i]` of `total`.
    pub(crate) fn of_sums(sums: &[f64], total: f64, width: Width) -> BitShares {
        let mut q = [0u8; 128];
        if total > 0.0 {
            for (q, &s) in q.iter_mut().zip(&sums[..width.bits() as usize]) {
                *q = ((s / total - LOW) * SCALE + 0.5).floor().clamp(0.0, 255.0) as u8;
            }
        }
        BitShares { q, width }
    }

    /// One byte per bit of the fingerprint, bit 0 first.
    pub fn as_bytes(&self) -> &[u8] {
        &self.q[..self.width.bits() as usize]
    }
}

/// The sum of a corpus's [`BitShares`], and the centred fingerprints it
/// decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Centre {
    sums: [u64; 128],
    n: u64,
    width: Width,
}

impl Centre {
    /// No documents yet.
    pub fn new(width: Width) -> Centre {
        Centre {
            sums: [0; 128],
            n: 0,
            width,
        }
    }

    /// Adds one document's shares (bytes of [`BitShares::as_bytes`]).
    pub fn add(&mut self, shares: &[u8]) {
        debug_assert_eq!(shares.len(), self.width.bits() as usize);
        for (s, &q) in self.sums.iter_mut().zip(shares) {
            *s += u64::from(q);
        }
        self.n += 1;
    }

    /// Adds another part of the corpus.
    pub fn merge(&mut self, other: &Centre) {
        for (s, o) in self.sums.iter_mut().zip(&other.sums) {
            *s += o;
        }
        self.n += other.n;
    }

    /// The sums as bytes, to carry between processes: the number of
    /// documents, then one sum per bit, each a little-endian u64. Two such
    /// byte strings of one width add up word by word as [`Centre::merge`].
    pub fn to_bytes(&self) -> Vec<u8> {
        let bits = self.width.bits() as usize;
        std::iter::once(self.n)
            .chain(self.sums[..bits].iter().copied())
            .flat_map(u64::to_le_bytes)
            .collect()
    }

    /// Sums from [`Centre::to_bytes`] (of 64- or 128-bit fingerprints).
    pub fn from_bytes(bytes: &[u8]) -> Option<Centre> {
        if !bytes.len().is_multiple_of(8) {
            return None;
        }
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .collect();
        let (&n, sums) = words.split_first()?;
        let width = Width::from_bits(u32::try_from(sums.len()).ok()?).ok()?;
        let mut centre = Centre::new(width);
        centre.sums[..sums.len()].copy_from_slice(sums);
        centre.n = n;
        Some(centre)
    }

    /// The number of documents added.
    pub fn documents(&self) -> u64 {
        self.n
    }

    /// The fingerprints' width.
    pub fn width(&self) -> Width {
        self.width
    }

    /// The centred fingerprint of a document's shares: bit i is 1 when its
    /// share exceeds the mean of the documents added (q_i n > sum_i).
    pub fn fingerprint(&self, shares: &[u8]) -> Fingerprint {
        let mut value = 0u128;
        for (i, (&q, &s)) in shares.iter().zip(&self.sums).enumerate() {
            if u64::from(q) * self.n > s {
                value |= 1 << i;
            }
        }
        Fingerprint::new(value, self.width)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition, in exact rationals: round(510 (c/t - 1/4)), halves
    /// up, clamped to a byte.
    fn quantised(c: u64, t: u64) -> u8 {
        if t == 0 {
            return 0;
        }
        // 510 (c/t - 1/4) + 1/2 = (2040 c - 510 t + 2 t) / 4t.
        let num = 2040 * i128::from(c) - 508 * i128::from(t);
        let den = 4 * i128::from(t);
        num.div_euclid(den).clamp(0, 255) as u8
    }

    proptest! {
        #[test]
        fn counts_are_quantised_as_defined(
            t in 1u64..100_000,
            frac in prop::collection::vec(0.0f64..=1.0, 128),
        ) {
            let counts: Vec<u64> = frac.iter().map(|f| (f * t as f64) as u64).collect();
            let got = BitShares::of_counts(&counts, t, Width::W128);
            for (i, &c) in counts.iter().enumerate() {
                prop_assert_eq!(got.as_bytes()[i], quantised(c, t), "c {} t {}", c, t);
            }
            // Real weights of the same shares land on the same byte, but for
            // a share that floating point puts on the other side of a half.
            let sums: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
            let real = BitShares::of_sums(&sums, t as f64, Width::W128);
            for (i, &c) in counts.iter().enumerate() {
                let exact = (2040 * i128::from(c) - 508 * i128::from(t)).rem_euclid(4 * i128::from(t));
                if exact != 0 {
                    prop_assert_eq!(real.as_bytes()[i], got.as_bytes()[i]);
                }
            }
        }

        #[test]
        fn centred_bits_are_shares_above_the_mean(
            docs in prop::collection::vec(prop::collection::vec(any::<u8>(), 64), 1..40),
            split in 0usize..40,
        ) {
            let mut all = Centre::new(Width::W64);
            let (mut a, mut b) = (Centre::new(Width::W64), Centre::new(Width::W64));
            for (j, d) in docs.iter().enumerate() {
                all.add(d);
                if j < split { a.add(d) } else { b.add(d) }
            }
            a.merge(&b);
            prop_assert_eq!(&a, &all);
            let n = docs.len() as f64;
            for d in &docs {
                let fp = all.fingerprint(d).value();
                for i in 0..64 {
                    let mean = docs.iter().map(|e| f64::from(e[i])).sum::<f64>() / n;
                    // The mean is a multiple of 1/n: compare exactly, away
                    // from ties.
                    let above = f64::from(d[i]) * n > mean * n + 1e-6;
                    let tie = (f64::from(d[i]) * n - mean * n).abs() <= 1e-6;
                    if !tie {
                        prop_assert_eq!(fp >> i & 1 == 1, above);
                    } else {
                        prop_assert_eq!(fp >> i & 1, 0);
                    }
                }
            }
        }
    }

    #[test]
    fn sums_round_trip_through_bytes_and_add_as_words() {
        let mut a = Centre::new(Width::W64);
        a.add(&[7; 64]);
        let mut b = Centre::new(Width::W64);
        b.add(&[200; 64]);
        b.add(&[1; 64]);
        assert_eq!(Centre::from_bytes(&a.to_bytes()), Some(a.clone()));
        assert_eq!(a.to_bytes().len(), 8 * 65);
        let words = |c: &Centre| -> Vec<u64> {
            c.to_bytes()
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                .collect()
        };
        let added: Vec<u64> = words(&a)
            .iter()
            .zip(words(&b))
            .map(|(x, y)| x + y)
            .collect();
        a.merge(&b);
        assert_eq!(words(&a), added);
        assert_eq!(added[..2], [3, 208]);
        assert_eq!(Centre::from_bytes(&[0; 8 * 64]), None);
        assert_eq!(Centre::from_bytes(&[0; 13]), None);
    }

    /// Every count of small totals, halves (exact quotients) included, and
    /// a few large totals.
    #[test]
    fn every_small_count_is_quantised_as_defined() {
        let large = [1u64 << 39, (1 << 40) - 1, 1 << 40, 123_456_789_012_345];
        for t in (1..=400).chain(large) {
            let step = if t > 400 { t / 997 } else { 1 };
            let counts: Vec<u64> = (0..=t).step_by(step as usize).chain([t]).collect();
            for chunk in counts.chunks(128) {
                let mut padded = chunk.to_vec();
                padded.resize(128, 0);
                let got = BitShares::of_counts(&padded, t, Width::W128);
                for (i, &c) in chunk.iter().enumerate() {
                    assert_eq!(got.as_bytes()[i], quantised(c, t), "c {c} t {t}");
                }
            }
        }
    }

    #[test]
    fn shares_are_a_byte_per_bit() {
        let counts: Vec<u64> = (0..128).map(|i| i * 3).collect();
        let s = BitShares::of_counts(&counts, 400, Width::W128);
        assert_eq!(s.as_bytes().len(), 128);
        assert_eq!(
            BitShares::of_counts(&counts, 400, Width::W64)
                .as_bytes()
                .len(),
            64
        );
        // 0 of 400 is below 1/4: byte 0; 381 of 400 is above 3/4: 255;
        // 201 of 400 is 510 * 0.2525 = 128.775, rounded 129.
        assert_eq!(s.as_bytes()[0], 0);
        assert_eq!(s.as_bytes()[127], 255);
        assert_eq!(s.as_bytes()[67], 129);
    }
}
