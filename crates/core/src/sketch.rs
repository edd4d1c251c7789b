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

/// Bits of each feature hash a [`Signature`] keeps.
pub const FEATURE_BITS: u32 = 24;

/// A document's verification signature as the service stores it: its
/// [`Sketch`], and its features themselves as the top [`FEATURE_BITS`] bits
/// of each feature hash, sorted and distinct. Two signatures with features
/// give the Jaccard similarity of the feature sets, exactly but for
/// collisions of those bits: two distinct features collide once in 16
/// million pairs, so two documents of a thousand features each share about
/// 0.06 features by chance, which moves their similarity by about 0.00006.
/// A signature without features (a sketch alone, stored by an older store)
/// gives the sketch's estimate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// The sketch: an estimate with any other signature.
    pub sketch: Sketch,
    /// The features, when kept.
    pub features: Option<Vec<u32>>,
}

impl Signature {
    /// The signature of a sorted set of uniformly distributed feature
    /// hashes (as [`crate::jaccard::shingles`] gives).
    pub fn of(set: &[u64]) -> Signature {
        let mut features: Vec<u32> = set
            .iter()
            .map(|&h| (h >> (64 - FEATURE_BITS)) as u32)
            .collect();
        features.sort_unstable();
        features.dedup();
        Signature {
            sketch: Sketch::of(set),
            features: Some(features),
        }
    }

    /// Appends the stored form to `out`: the sketch's [`BINS`] bytes, then,
    /// when the features are kept, their count and the gaps between them
    /// as LEB128 varints (2 to 3 bytes a feature for a few hundred to a few
    /// thousand features).
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.sketch.0);
        if let Some(f) = &self.features {
            leb128(f.len() as u64, out);
            let mut last = 0u32;
            for &x in f {
                leb128(u64::from(x - last), out);
                last = x;
            }
        }
    }

    /// The signature stored as `bytes` (a sketch alone is one without
    /// features), or None when they are not one.
    pub fn from_bytes(bytes: &[u8]) -> Option<Signature> {
        let sketch = Sketch::from_bytes(bytes.get(..BINS)?)?;
        let mut rest = &bytes[BINS..];
        if rest.is_empty() {
            return Some(Signature {
                sketch,
                features: None,
            });
        }
        let n = usize::try_from(read_leb128(&mut rest)?).ok()?;
        // Each feature takes at least a byte: a damaged count asks no more.
        if n > rest.len() {
            return None;
        }
        let mut features = Vec::with_capacity(n);
        let mut last = 0u32;
        for i in 0..n {
            let gap = u32::try_from(read_leb128(&mut rest)?).ok()?;
            if i > 0 && gap == 0 {
                return None;
            }
            last = last.checked_add(gap)?;
            features.push(last);
        }
        rest.is_empty().then_some(Signature {
            sketch,
            features: Some(features),
        })
    }

    /// The Jaccard similarity of the two documents' features: exact when both
    /// keep them, else the sketches' estimate; 0 when either set is empty.
    pub fn jaccard(&self, other: &Signature) -> f64 {
        let (Some(a), Some(b)) = (&self.features, &other.features) else {
            return self.sketch.jaccard(&other.sketch);
        };
        if a.is_empty() || b.is_empty() {
            return 0.0;
        }
        let (mut i, mut j, mut shared) = (0, 0, 0usize);
        while i < a.len() && j < b.len() {
            match a[i].cmp(&b[j]) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    shared += 1;
                    i += 1;
                    j += 1;
                }
            }
        }
        shared as f64 / (a.len() + b.len() - shared) as f64
    }
}

fn leb128(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn read_leb128(bytes: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Exact where both keep their features (against sets of the full
        /// hashes, counted here), the sketch's estimate where one does not;
        /// the stored form reads back as it was, and damage to it is refused
        /// or read as other valid data, never a panic.
        #[test]
        fn signatures_are_exact_and_read_back(
            n in 0usize..1500, j in 0.0f64..=1.0, seed in any::<u64>(), flip in any::<(usize, u8)>()
        ) {
            let (a, b, _) = pair(n, j, seed);
            let (sa, sb) = (Signature::of(&a), Signature::of(&b));
            let (x, y): (std::collections::BTreeSet<u64>, std::collections::BTreeSet<u64>) =
                (a.iter().copied().collect(), b.iter().copied().collect());
            let shared = x.intersection(&y).count();
            let want = if x.is_empty() || y.is_empty() { 0.0 } else {
                shared as f64 / (x.len() + y.len() - shared) as f64
            };
            // Collisions of the kept bits are rare: a feature or two at most.
            let got = sa.jaccard(&sb);
            prop_assert!((got - want).abs() <= 3.0 / (x.len() + y.len()).max(1) as f64,
                "{got} against {want}");
            let mut bytes = Vec::new();
            sa.write(&mut bytes);
            prop_assert_eq!(Signature::from_bytes(&bytes), Some(sa.clone()));
            let old = Signature::from_bytes(&sa.sketch.0).unwrap();
            prop_assert_eq!(old.features.as_ref(), None);
            prop_assert_eq!(old.jaccard(&sb), sa.sketch.jaccard(&sb.sketch));
            prop_assert_eq!(Signature::from_bytes(&bytes[..BINS - 1]), None);
            if bytes.len() > BINS + 1 {
                prop_assert_eq!(Signature::from_bytes(&bytes[..bytes.len() - 1]), None);
            }
            let (at, x) = (BINS + flip.0 % (bytes.len() - BINS).max(1), flip.1 | 1);
            if at < bytes.len() {
                bytes[at] ^= x;
                let _ = Signature::from_bytes(&bytes);
            }
        }
    }

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
