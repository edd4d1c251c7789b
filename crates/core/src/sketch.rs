//! The online service's verification signatures: a document's features kept
//! compactly ([`Signature::write_compact`], Rice-coded, compared exactly), and
//! a fixed-size summary of them from which the Jaccard similarity of two
//! documents is estimated ([`Sketch`]), which stores before version 7 keep
//! beside the features, or alone.
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
        estimate(&self.0, &other.0).0
    }
}

/// [`Sketch::jaccard`] of two sketches' bytes, and the number of bins
/// either fills (0 when either is empty).
fn estimate(a: &[u8; BINS], b: &[u8; BINS]) -> (f64, u32) {
    let (mut agree, mut filled) = (0u32, 0u32);
    let (mut empty_a, mut empty_b) = (true, true);
    for (&a, &b) in a.iter().zip(b) {
        empty_a &= a == EMPTY;
        empty_b &= b == EMPTY;
        filled += u32::from(a != EMPTY || b != EMPTY);
        agree += u32::from(a == b && a != EMPTY);
    }
    if empty_a || empty_b {
        return (0.0, 0);
    }
    let p = f64::from(agree) / f64::from(filled);
    let c = 1.0 / 255.0;
    (((p - c) / (1.0 - c)).clamp(0.0, 1.0), filled)
}

/// How far below a threshold the sketches' estimate may lie before
/// [`Signature::jaccard_stored`] computes the exact similarity: eight
/// standard errors of the estimate at its widest (J = 1/2) over the bins
/// filled, 0.18 when all 512 are. A pair whose exact similarity reaches
/// the threshold is screened out with a probability below one in 10^15.
fn screen_margin(filled: u32) -> f64 {
    4.0 / f64::from(filled.max(1)).sqrt()
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
    /// The signature of a set of uniformly distributed feature hashes (as
    /// [`crate::jaccard::shingles`] gives), in any order, repeats allowed.
    pub fn of(set: &[u64]) -> Signature {
        // Their top halves sorted by a counting pass (they are spread
        // evenly), then narrowed: the order stays.
        let mut features = Vec::with_capacity(set.len());
        crate::jaccard::narrow(set, &mut features);
        for f in &mut features {
            *f >>= 32 - FEATURE_BITS;
        }
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

    /// [`Signature::jaccard`] with the signature stored as `stored`
    /// ([`Signature::write`]), read in place, for a caller that keeps a
    /// match only when it reaches `threshold`: where the sketches' estimate
    /// lies far below it (a margin of eight standard errors), the estimate
    /// is the answer and the features are not read. None when `stored` is
    /// not a signature. The features are compared as they are decoded: no
    /// allocation.
    pub fn jaccard_stored(&self, stored: &[u8], threshold: f64) -> Option<f64> {
        let sketch: &[u8; BINS] = stored.get(..BINS)?.try_into().ok()?;
        let mut rest = &stored[BINS..];
        let (estimated, filled) = estimate(&self.sketch.0, sketch);
        let Some(a) = self.features.as_deref().filter(|_| !rest.is_empty()) else {
            // A sketch alone, here or there: the estimate, once the stored
            // form is checked whole.
            return Signature::from_bytes(stored).map(|_| estimated);
        };
        if estimated < threshold - screen_margin(filled) {
            return Some(estimated);
        }
        let n = usize::try_from(read_leb128(&mut rest)?).ok()?;
        if n > rest.len() {
            return None;
        }
        let mut shared = Shared::new(a);
        let mut last = 0u32;
        for k in 0..n {
            let gap = u32::try_from(read_leb128(&mut rest)?).ok()?;
            if k > 0 && gap == 0 {
                return None;
            }
            last = last.checked_add(gap)?;
            shared.see(last);
        }
        rest.is_empty().then(|| shared.jaccard(n))
    }

    /// The Jaccard similarity of the two documents' features: exact when both
    /// keep them, else the sketches' estimate; 0 when either set is empty.
    pub fn jaccard(&self, other: &Signature) -> f64 {
        let (Some(a), Some(b)) = (&self.features, &other.features) else {
            return self.sketch.jaccard(&other.sketch);
        };
        let mut shared = Shared::new(a);
        for &f in b {
            shared.see(f);
        }
        shared.jaccard(b.len())
    }

    /// Appends the compact stored form: a tag byte, then, for a signature
    /// with its features, the features alone Rice-coded (see `rice_write`:
    /// about 2 + log2(2^24 / n) bits a feature, 2 bytes for the ~700 of a
    /// 4 KB text, where [`Signature::write`] takes 3 and the sketch's 512
    /// bytes besides); a signature without features keeps the form of
    /// [`Signature::write`] after its tag. The exact similarity needs no
    /// screen: the features are read in sequence with the comparison.
    pub fn write_compact(&self, out: &mut Vec<u8>) {
        match &self.features {
            Some(f) => {
                out.push(COMPACT_FEATURES);
                rice_write(f, out);
            }
            None => {
                out.push(COMPACT_FULL);
                self.write(out);
            }
        }
    }

    /// Whether `stored` is a compact stored form ([`Signature::write_compact`]),
    /// checked whole.
    pub fn compact_is_valid(stored: &[u8]) -> bool {
        match stored.split_first() {
            Some((&COMPACT_FEATURES, rest)) => rice_for_each(rest, |_| true).is_some(),
            Some((&COMPACT_FULL, rest)) => Signature::from_bytes(rest).is_some(),
            _ => false,
        }
    }

    /// [`Signature::jaccard_stored`] of a compact stored form
    /// ([`Signature::write_compact`]): the exact similarity of the features
    /// where both keep them (this signature as [`Signature::of`] gives it),
    /// compared as they are decoded, for a caller that keeps a match only
    /// when it reaches `threshold`. Once the features read so far show that
    /// the similarity cannot reach it (or the sets' sizes do, before any is
    /// read), the largest it could still be is the answer and the rest is
    /// not read: below `threshold`, at least the exact value. With a
    /// threshold of 0 every byte is read and checked; above it a damaged
    /// tail may go unread (the store checks each record's checksum before
    /// its bytes reach this). None when `stored` is not a compact signature,
    /// or holds features this signature, without its own, cannot be compared
    /// with.
    pub fn jaccard_compact(&self, stored: &[u8], threshold: f64) -> Option<f64> {
        let (&tag, rest) = stored.split_first()?;
        match tag {
            COMPACT_FULL => self.jaccard_stored(rest, threshold),
            COMPACT_FEATURES => {
                let a = self.features.as_deref()?;
                let n = usize::try_from(read_leb128(&mut &rest[..])?).ok()?;
                let (small, large) = (a.len().min(n), a.len().max(n));
                // Jaccard is at most the smaller set's share of the larger.
                if small > 0 && (small as f64) < threshold * large as f64 {
                    return Some(small as f64 / large as f64);
                }
                let mut shared = Shared::new(a);
                let mut bound = None;
                rice_for_each(rest, |f| {
                    shared.see(f);
                    if !shared.seen.is_multiple_of(64) {
                        return true;
                    }
                    let most = shared.most(n);
                    if most < threshold {
                        bound = Some(most);
                    }
                    bound.is_none()
                })?;
                Some(bound.unwrap_or_else(|| shared.jaccard(n)))
            }
            _ => None,
        }
    }
}

/// Features shared between a sorted set and another one seen in ascending
/// order, counted as they are seen: the stored forms' similarity without
/// decoding them into a set.
struct Shared<'a> {
    a: &'a [u32],
    i: usize,
    shared: usize,
    /// Features of the other set seen.
    seen: usize,
}

impl<'a> Shared<'a> {
    fn new(a: &'a [u32]) -> Self {
        Shared {
            a,
            i: 0,
            shared: 0,
            seen: 0,
        }
    }

    /// The largest Jaccard similarity the sets can have, the other having
    /// `n` features: every feature of it still to be seen shared, as far as
    /// this set has features left past the ones passed.
    fn most(&self, n: usize) -> f64 {
        let shared = self.shared + (n - self.seen).min(self.a.len() - self.i);
        if shared == 0 {
            return 0.0;
        }
        shared as f64 / (self.a.len() + n - shared) as f64
    }

    /// The other set's next feature (greater than those seen before).
    #[inline]
    fn see(&mut self, f: u32) {
        self.seen += 1;
        while self.i < self.a.len() && self.a[self.i] < f {
            self.i += 1;
        }
        if self.i < self.a.len() && self.a[self.i] == f {
            self.shared += 1;
            self.i += 1;
        }
    }

    /// The Jaccard similarity, the other set having `n` features; 0 when
    /// either set is empty.
    fn jaccard(&self, n: usize) -> f64 {
        if self.a.is_empty() || n == 0 {
            return 0.0;
        }
        self.shared as f64 / (self.a.len() + n - self.shared) as f64
    }
}

/// Tags of [`Signature::write_compact`]: the form of [`Signature::write`]
/// follows, or the features alone, Rice-coded.
const COMPACT_FULL: u8 = 0;
const COMPACT_FEATURES: u8 = 1;

/// Appends sorted distinct `features` (below 2^[`FEATURE_BITS`]) Rice-coded:
/// their count (LEB128), the Rice parameter b (one byte: the floor of
/// log2 of the mean gap), then each gap (the first feature itself, then
/// the difference to the one before less one) as its quotient by 2^b in
/// unary (that many ones, then a zero) and its low b bits, least
/// significant bit first; zero bits pad the last byte.
fn rice_write(features: &[u32], out: &mut Vec<u8>) {
    leb128(features.len() as u64, out);
    let span = features.last().map_or(0, |&l| u64::from(l) + 1);
    let mean = span / (features.len() as u64).max(1);
    let b = if mean > 1 {
        63 - mean.leading_zeros()
    } else {
        0
    };
    out.push(b as u8);
    let (mut acc, mut n) = (0u64, 0u32);
    let mut put = |value: u64, count: u32, out: &mut Vec<u8>| {
        acc |= value << n;
        n += count;
        while n >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            n -= 8;
        }
    };
    let mut prev: Option<u32> = None;
    for &f in features {
        let gap = match prev {
            None => f,
            Some(p) => f - p - 1,
        };
        prev = Some(f);
        let mut q = gap >> b;
        while q > 0 {
            let c = q.min(32);
            put((1u64 << c) - 1, c, out);
            q -= c;
        }
        put(0, 1, out);
        put(u64::from(gap) & ((1u64 << b) - 1), b, out);
    }
    if n > 0 {
        out.push(acc as u8);
    }
}

/// Calls `f` with each feature of a Rice-coded set ([`rice_write`]), in
/// order, until it returns false (the rest is then not read); returns how
/// many the set holds, or None when `bytes` are not one (cut short,
/// trailing bytes or bits, a feature out of range or out of order).
fn rice_for_each(mut bytes: &[u8], mut f: impl FnMut(u32) -> bool) -> Option<usize> {
    let n = usize::try_from(read_leb128(&mut bytes)?).ok()?;
    let (&b, mut bytes) = bytes.split_first()?;
    let b = u32::from(b);
    if b > FEATURE_BITS || n > bytes.len() * 8 {
        return None;
    }
    let (mut acc, mut have) = (0u64, 0u32);
    let mut refill = |acc: &mut u64, have: &mut u32| {
        while *have <= 56 {
            let Some((&x, rest)) = bytes.split_first() else {
                break;
            };
            *acc |= u64::from(x) << *have;
            *have += 8;
            bytes = rest;
        }
    };
    let limit = 1u64 << FEATURE_BITS;
    let mut next = 0u64;
    for _ in 0..n {
        // The quotient: ones up to the first zero.
        let mut q = 0u64;
        loop {
            refill(&mut acc, &mut have);
            if have == 0 {
                return None;
            }
            let ones = acc.trailing_ones().min(have);
            q += u64::from(ones);
            if q >= limit {
                return None;
            }
            if ones < have {
                acc = acc.checked_shr(ones + 1).unwrap_or(0);
                have -= ones + 1;
                break;
            }
            acc = 0;
            have = 0;
        }
        refill(&mut acc, &mut have);
        if have < b {
            return None;
        }
        let low = acc & ((1u64 << b) - 1);
        acc = acc.checked_shr(b).unwrap_or(0);
        have -= b;
        let feature = next + (q << b | low);
        if feature >= limit {
            return None;
        }
        if !f(feature as u32) {
            return Some(n);
        }
        next = feature + 1;
    }
    // Only the last byte's zero padding may follow.
    (bytes.is_empty() && have < 8 && acc == 0).then_some(n)
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
            // Exact for the kept bits of each hash, counted here.
            let kept = |s: &std::collections::BTreeSet<u64>| -> std::collections::BTreeSet<u64> {
                s.iter().map(|h| h >> (64 - FEATURE_BITS)).collect()
            };
            let (kx, ky) = (kept(&x), kept(&y));
            let kept_shared = kx.intersection(&ky).count();
            let exact = if kx.is_empty() || ky.is_empty() { 0.0 } else {
                kept_shared as f64 / (kx.len() + ky.len() - kept_shared) as f64
            };
            let got = sa.jaccard(&sb);
            prop_assert!((got - exact).abs() <= 1e-12, "{got} against {exact}");
            // Collisions of the kept bits are rare (about 0.13 pairs of
            // features in two sets of 1,500): a few features at most.
            prop_assert!((got - want).abs() <= 10.0 / (x.len() + y.len()).max(1) as f64,
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

    proptest! {
        /// Read in place, a stored signature gives what it gives decoded
        /// wherever the answer reaches the threshold, never screens out a
        /// pair that reaches it, and refuses what decoding refuses.
        #[test]
        fn stored_signatures_screen_and_compare_as_decoded(
            n in 0usize..1500, m in 0usize..1500, j in 0.0f64..=1.0, t in 0.3f64..=0.95,
            seed in any::<u64>(), sketch_only in any::<bool>(), cut in any::<usize>(),
        ) {
            // Sets of other sizes too: `b` grown or cut to `m`.
            let (a, b) = pair_of_sizes(n, m, j, seed ^ 0x5151);
            let sa = Signature::of(&a);
            let mut sb = Signature::of(&b);
            if sketch_only {
                sb.features = None;
            }
            let mut bytes = Vec::new();
            sb.write(&mut bytes);
            let decoded = sa.jaccard(&sb);
            let got = sa.jaccard_stored(&bytes, t).unwrap();
            if got >= t || decoded >= t {
                prop_assert_eq!(got, decoded);
            } else {
                prop_assert!(got < t);
            }
            let at = cut % (bytes.len() + 1);
            prop_assert_eq!(
                sa.jaccard_stored(&bytes[..at], 0.0).is_some(),
                Signature::from_bytes(&bytes[..at]).is_some(),
                "cut at {}", at
            );
        }
    }

    proptest! {
        /// The compact form: the features read back exactly as kept, the
        /// similarity exact against sets compared one by one here, in about
        /// 2 + log2(2^24 / n) bits a feature; a signature without features
        /// keeps its full form; damage is refused or read as other valid
        /// data, never a panic.
        #[test]
        fn compact_signatures_are_exact_and_small(
            n in 0usize..2000, m in 0usize..2000, j in 0.0f64..=1.0,
            seed in any::<u64>(), flip in any::<(usize, u8)>(), cut in any::<usize>(),
        ) {
            let (a, b) = pair_of_sizes(n, m, j, seed ^ 0x7a7a);
            let (sa, sb) = (Signature::of(&a), Signature::of(&b));
            let mut bytes = Vec::new();
            sb.write_compact(&mut bytes);
            prop_assert!(Signature::compact_is_valid(&bytes));
            let mut read = Vec::new();
            prop_assert_eq!(rice_for_each(&bytes[1..], |f| {
                read.push(f);
                true
            }), Some(read.len()));
            let kept: std::collections::BTreeSet<u32> =
                b.iter().map(|h| (h >> (64 - FEATURE_BITS)) as u32).collect();
            prop_assert_eq!(&read, &kept.iter().copied().collect::<Vec<_>>());
            let mine: std::collections::BTreeSet<u32> =
                a.iter().map(|h| (h >> (64 - FEATURE_BITS)) as u32).collect();
            let shared = mine.intersection(&kept).count();
            let want = if mine.is_empty() || kept.is_empty() { 0.0 } else {
                shared as f64 / (mine.len() + kept.len() - shared) as f64
            };
            // Exact where it reaches the threshold; below it, a bound
            // between the exact value and the threshold.
            for t in [0.0, 0.5, 0.8, 0.95] {
                let got = sa.jaccard_compact(&bytes, t).unwrap();
                if want >= t {
                    prop_assert!((got - want).abs() <= 1e-12, "{} against {} at {}", got, want, t);
                } else {
                    prop_assert!(got < t && got >= want - 1e-12, "{} against {} at {}", got, want, t);
                }
            }
            if kept.len() >= 64 {
                let bits = 2.0 + (f64::from(1u32 << FEATURE_BITS) / kept.len() as f64).log2();
                prop_assert!(
                    (bytes.len() as f64) <= kept.len() as f64 * (bits + 1.0) / 8.0 + 8.0,
                    "{} bytes for {} features", bytes.len(), kept.len()
                );
            }
            // Without features: the full form behind its tag.
            let mut bare = sb.clone();
            bare.features = None;
            let mut full = Vec::new();
            bare.write_compact(&mut full);
            prop_assert!(Signature::compact_is_valid(&full));
            prop_assert_eq!(sa.jaccard_compact(&full, 0.0), Some(sa.sketch.jaccard(&sb.sketch)));
            // Cut short: refused. Damaged: refused, or other valid data.
            let at = cut % bytes.len();
            prop_assert_eq!(
                sa.jaccard_compact(&bytes[..at], 0.0).is_some(),
                Signature::compact_is_valid(&bytes[..at])
            );
            prop_assert!(!Signature::compact_is_valid(&bytes[..at]), "cut at {}", at);
            let (at, x) = (flip.0 % bytes.len(), flip.1 | 1);
            bytes[at] ^= x;
            prop_assert_eq!(
                sa.jaccard_compact(&bytes, 0.0).is_some(),
                Signature::compact_is_valid(&bytes)
            );
        }
    }

    /// The extremes of the Rice parameter: one feature at the top of the
    /// range (b = 24, nothing in unary), and features packed one apart (b = 0).
    #[test]
    fn compact_forms_at_the_extremes_read_back() {
        let top = (1u32 << FEATURE_BITS) - 1;
        for features in [vec![top], vec![0], (0..300).collect::<Vec<u32>>(), vec![]] {
            let s = Signature {
                sketch: Sketch([EMPTY; BINS]),
                features: Some(features.clone()),
            };
            let mut bytes = Vec::new();
            s.write_compact(&mut bytes);
            let mut read = Vec::new();
            assert_eq!(
                rice_for_each(&bytes[1..], |f| {
                    read.push(f);
                    true
                }),
                Some(features.len())
            );
            assert_eq!(read, features);
        }
    }

    /// [`pair`] with the second set cut or grown (by hashes drawn from
    /// `seed`) to `m`, sorted and distinct.
    fn pair_of_sizes(n: usize, m: usize, j: f64, seed: u64) -> (Vec<u64>, Vec<u64>) {
        let (a, mut b, _) = pair(n, j, seed);
        let mut r = SplitMix64(seed);
        b.truncate(m);
        while b.len() < m {
            b.push(r.next());
        }
        b.sort_unstable();
        b.dedup();
        (a, b)
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
