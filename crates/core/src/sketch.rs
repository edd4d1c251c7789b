//! A fixed-size summary of a document's verification features from which the
//! Jaccard similarity of two documents is estimated, for where the features
//! themselves cannot be kept: the online service stores one per document.
//!
//! One-permutation MinHash (Li, Owen & Zhang 2012) with b-bit minima (Li &
//! König 2010): the feature hashes fall into [`BINS`] bins by their top bits,
//! each bin keeps its smallest hash, and one byte of that is stored. Two sets'
//! bins agree about as often as their Jaccard similarity J (the union's
//! smallest hash in a bin is in the intersection with probability J), plus one
//! time in 255 by a byte collision, which the estimate removes. Bins empty in
//! both sets say nothing and are left out. The estimate's standard error is
//! about √(J(1−J)/m) over the m bins the sets fill: 0.018 at J = 0.8 for sets
//! of a thousand features or more (0.025 with 256 bins), exactly 1 for
//! identical sets.

use crate::rng::SplitMix64;

/// Bins of a [`Sketch`], one byte each.
pub const BINS: usize = 512;

/// The byte of an empty bin (stored minima are 0..=254).
const EMPTY: u8 = u8::MAX;

/// A document's verification sketch: [`BINS`] bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Sketch(pub [u8; BINS]);

impl std::fmt::Debug for Sketch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let filled = self.0.iter().filter(|&&b| b != EMPTY).count();
        write!(f, "Sketch({filled} of {BINS} bins filled)")
    }
}

impl Sketch {
    /// The sketch of a set of uniformly distributed feature hashes (as
    /// [`crate::jaccard::shingles`] gives).
    pub fn of(set: &[u64]) -> Sketch {
        let mut mins = [u64::MAX; BINS];
        for &h in set {
            let bin = (h >> (64 - BINS.trailing_zeros())) as usize;
            mins[bin] = mins[bin].min(h);
        }
        let mut out = [EMPTY; BINS];
        for (o, &m) in out.iter_mut().zip(&mins) {
            if m != u64::MAX {
                *o = (SplitMix64(m).next() % 255) as u8;
            }
        }
        Sketch(out)
    }

    /// The sketch stored as bytes, or None when they are not one.
    pub fn from_bytes(bytes: &[u8]) -> Option<Sketch> {
        Some(Sketch(bytes.try_into().ok()?))
    }

    /// Is this the sketch of an empty set (no features)?
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&b| b == EMPTY)
    }

    /// The estimated Jaccard similarity of the two sets, in [0, 1]; 0 when
    /// either set is empty (a document without features is similar to
    /// nothing, as in verification).
    pub fn jaccard(&self, other: &Sketch) -> f64 {
        let (mut agree, mut filled) = (0u32, 0u32);
        let (mut empty_a, mut empty_b) = (true, true);
        for (&a, &b) in self.0.iter().zip(&other.0) {
            empty_a &= a == EMPTY;
            empty_b &= b == EMPTY;
            filled += u32::from(a != EMPTY || b != EMPTY);
            agree += u32::from(a == b && a != EMPTY);
        }
        if empty_a || empty_b {
            return 0.0;
        }
        let p = f64::from(agree) / f64::from(filled);
        let c = 1.0 / 255.0;
        ((p - c) / (1.0 - c)).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sets of `n` uniformly random hashes with Jaccard similarity about
    /// `j` (their exact value returned too).
    fn pair(n: usize, j: f64, seed: u64) -> (Vec<u64>, Vec<u64>, f64) {
        let mut rng = SplitMix64(seed);
        // |A ∩ B| = s, |A| = |B| = n: J = s / (2n - s).
        let s = ((2.0 * j * n as f64) / (1.0 + j)).round() as usize;
        let shared: Vec<u64> = (0..s).map(|_| rng.next()).collect();
        let mut a = shared.clone();
        let mut b = shared;
        a.extend((s..n).map(|_| rng.next()));
        b.extend((s..n).map(|_| rng.next()));
        a.sort_unstable();
        b.sort_unstable();
        let exact = crate::jaccard::jaccard(&a, &b);
        (a, b, exact)
    }

    #[test]
    fn estimates_are_unbiased_and_within_their_standard_error() {
        for &(n, j) in &[
            (1000, 0.5),
            (1000, 0.8),
            (400, 0.8),
            (3000, 0.9),
            (1000, 0.95),
        ] {
            let trials = 200;
            let (mut sum, mut sq) = (0.0, 0.0);
            for t in 0..trials {
                let (a, b, exact) = pair(n, j, 1000 * n as u64 + t);
                let e = Sketch::of(&a).jaccard(&Sketch::of(&b)) - exact;
                sum += e;
                sq += e * e;
            }
            let (bias, rmse) = (sum / trials as f64, (sq / trials as f64).sqrt());
            // Standard error with the bins the sets fill (fewer for 400).
            let bins = (BINS as f64) * (1.0 - (-(n as f64) * 2.0 / BINS as f64).exp());
            let se = (j * (1.0 - j) / bins).sqrt();
            assert!(bias.abs() < 0.01, "n {n} J {j}: bias {bias}");
            assert!(
                rmse < 1.5 * se + 0.005,
                "n {n} J {j}: error {rmse} against {se}"
            );
        }
    }

    #[test]
    fn identical_disjoint_and_empty_sets() {
        let (a, b, _) = pair(500, 0.0, 7);
        let (sa, sb) = (Sketch::of(&a), Sketch::of(&b));
        assert_eq!(sa.jaccard(&sa), 1.0);
        assert!(sa.jaccard(&sb) < 0.05);
        let empty = Sketch::of(&[]);
        assert!(empty.is_empty() && !sa.is_empty());
        assert_eq!(empty.jaccard(&empty), 0.0);
        assert_eq!(sa.jaccard(&empty), 0.0);
        assert_eq!(Sketch::from_bytes(&sa.0), Some(sa.clone()));
        assert_eq!(Sketch::from_bytes(&sa.0[1..]), None);
    }
}
