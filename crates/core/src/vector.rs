//! Random-hyperplane SimHash of dense vectors (Charikar 2002): bit i of a
//! vector's fingerprint is the sign of its projection on hyperplane i, so the
//! Hamming distance h between two fingerprints estimates the angle between the
//! vectors, θ ≈ π·h/f, and each bit differs with probability exactly θ/π.
//!
//! The hyperplanes' entries for dimension j are standard normal values drawn
//! from a generator seeded by (seed, j): the same on every machine, for every
//! vector length (a 384-dimension vector uses the first 384 rows of the 768-row
//! matrix), and never stored in any file. [`Hyperplanes`] makes the matrix once
//! (f × d single-precision values, 192 KiB at d = 768 and 64 bits) and projects
//! vectors with fused multiply-adds, eight lanes at a time where AVX2 and FMA
//! are present. Every path computes the same correctly rounded fused
//! multiply-adds in the same order, so a vector has the same fingerprint on
//! every machine and from every entry point.

use crate::error::Error;
use crate::fingerprint::{Fingerprint, Width};
use crate::rng::SplitMix64;

/// The hyperplanes of `width` bits for vectors of up to `dim` dimensions.
#[derive(Clone, Debug)]
pub struct Hyperplanes {
    dim: usize,
    width: Width,
    seed: u64,
    /// Row j holds the `width` hyperplanes' entries for dimension j.
    rows: Vec<f32>,
}

/// Projections are accumulated this many hyperplanes at a time (eight AVX2
/// registers of eight lanes).
const LANES: usize = 64;

impl Hyperplanes {
    /// The hyperplanes for dimensions `0..dim`.
    pub fn new(dim: usize, width: Width, seed: u64) -> Hyperplanes {
        let bits = width.bits() as usize;
        let mut rows = Vec::with_capacity(dim * bits);
        for j in 0..dim {
            rows.extend(row(j, bits, seed));
        }
        Hyperplanes {
            dim,
            width,
            seed,
            rows,
        }
    }

    /// The largest dimension these hyperplanes cover.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The fingerprint width.
    pub fn width(&self) -> Width {
        self.width
    }

    /// The seed the entries were drawn with.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The fingerprint of `vector`, which must have at most [`Self::dim`]
    /// dimensions, finite entries, and not be all zeros ([`check_vector`]).
    pub fn fingerprint(&self, vector: &[f32]) -> Result<Fingerprint, Error> {
        check_vector(vector)?;
        if vector.len() > self.dim {
            return Err(Error::InvalidVector(format!(
                "{} dimensions, more than the {} these hyperplanes cover",
                vector.len(),
                self.dim
            )));
        }
        Ok(self.project(vector))
    }

    /// The sign pattern of `vector`'s projections, unchecked.
    fn project(&self, vector: &[f32]) -> Fingerprint {
        let bits = self.width.bits() as usize;
        let mut value = 0u128;
        for half in 0..bits / LANES {
            let sums = project64(&self.rows[half * LANES..], bits, vector);
            for (i, &s) in sums.iter().enumerate() {
                if s > 0.0 {
                    value |= 1 << (half * LANES + i);
                }
            }
        }
        Fingerprint::new(value, self.width)
    }
}

/// The entries of dimension `j` for `bits` hyperplanes: pairs of standard
/// normal values (Box–Muller) from SplitMix64 seeded by xxh3(j, seed).
fn row(j: usize, bits: usize, seed: u64) -> impl Iterator<Item = f32> {
    let mut rng = SplitMix64(xxhash_rust::xxh3::xxh3_64_with_seed(
        &(j as u64).to_le_bytes(),
        seed,
    ));
    (0..bits / 2).flat_map(move |_| {
        let r = (-2.0 * rng.unit().ln()).sqrt();
        let t = std::f64::consts::TAU * rng.unit();
        [(r * t.cos()) as f32, (r * t.sin()) as f32]
    })
}

/// The projections of `v` on 64 hyperplanes: `rows[j * stride + i]` is
/// hyperplane i's entry for dimension j.
fn project64(rows: &[f32], stride: usize, v: &[f32]) -> [f32; LANES] {
    #[cfg(target_arch = "x86_64")]
    if crate::floor::avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA, checked just above.
        return unsafe { project64_avx2(rows, stride, v) };
    }
    project64_generic(rows, stride, v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn project64_avx2(rows: &[f32], stride: usize, v: &[f32]) -> [f32; LANES] {
    project64_generic(rows, stride, v)
}

/// One fused multiply-add per entry, dimension by dimension: the compiler
/// vectorises the 64 lanes (eight independent chains on AVX2), and the result
/// does not depend on how it does so.
#[inline(always)]
fn project64_generic(rows: &[f32], stride: usize, v: &[f32]) -> [f32; LANES] {
    let mut acc = [0f32; LANES];
    for (j, &x) in v.iter().enumerate() {
        let row: &[f32; LANES] = rows[j * stride..j * stride + LANES]
            .try_into()
            .expect("a row of 64 entries");
        for i in 0..LANES {
            acc[i] = x.mul_add(row[i], acc[i]);
        }
    }
    acc
}

/// Refuses vectors whose fingerprint means nothing: an entry that is not a
/// finite number, or no dimension at all, or all zeros (no angle to any vector).
pub fn check_vector(vector: &[f32]) -> Result<(), Error> {
    if vector.is_empty() {
        return Err(Error::InvalidVector("the vector is empty".into()));
    }
    if let Some((i, x)) = vector.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        return Err(Error::InvalidVector(format!(
            "entry {i} is {x}, not a finite number"
        )));
    }
    if vector.iter().all(|&x| x == 0.0) {
        return Err(Error::InvalidVector(
            "the vector is all zeros: it has no direction, so no fingerprint".into(),
        ));
    }
    Ok(())
}

/// The cosine similarity of two vectors of the same dimension, computed in
/// double precision; 0 if either is all zeros.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    debug_assert_eq!(a.len(), b.len());
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    (ab / (aa.sqrt() * bb.sqrt())).clamp(-1.0, 1.0)
}

/// A digest of a vector's entries: equal for equal vectors.
pub fn digest(v: &[f32]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(bytemuck::cast_slice(v))
}

/// The probability that one bit differs between the fingerprints of two
/// vectors of cosine similarity `cos`: θ/π.
pub fn bit_flip_probability(cos: f64) -> f64 {
    cos.clamp(-1.0, 1.0).acos() / std::f64::consts::PI
}

/// The probability that two vectors of cosine similarity `cos` have
/// fingerprints of `bits` bits within Hamming distance `k`: P[Bin(bits, θ/π) ≤ k].
pub fn recall_at(bits: u32, k: u32, cos: f64) -> f64 {
    let p = bit_flip_probability(cos);
    let n = bits as usize;
    if p <= 0.0 {
        return 1.0;
    }
    if p >= 1.0 {
        return if k >= bits { 1.0 } else { 0.0 };
    }
    // Sum the binomial terms in log space (bits <= 128, no overflow concerns).
    let ln_choose = |i: usize| -> f64 {
        (1..=i)
            .map(|m| ((n - i + m) as f64).ln() - (m as f64).ln())
            .sum()
    };
    (0..=(k as usize).min(n))
        .map(|i| (ln_choose(i) + i as f64 * p.ln() + (n - i) as f64 * (1.0 - p).ln()).exp())
        .sum::<f64>()
        .min(1.0)
}

/// The smallest k at which pairs of cosine similarity `cos` are within k with
/// probability at least `recall`, or `None` if even `max_k` falls short.
pub fn k_for_recall(bits: u32, cos: f64, recall: f64, max_k: u32) -> Option<u32> {
    (0..=max_k).find(|&k| recall_at(bits, k, cos) >= recall)
}

/// The candidate distance a search for vectors of cosine at least `cosine`
/// uses when none is given: verified (candidates checked by their exact
/// cosine), the least k that finds 99% of such pairs; unverified, the widest
/// distance whose estimate qualifies; either way at most `bits / 8`.
pub fn default_vector_k(width: Width, cosine: f64, verified: bool) -> u32 {
    let (bits, max) = (width.bits(), width.bits() / 8);
    match verified {
        true => k_for_recall(bits, cosine, 0.99, max).unwrap_or(max),
        false => crate::Fingerprint::distance_for_similarity(cosine, width).min(max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_distance_is_the_widest_whose_estimate_qualifies() {
        for width in [Width::W64, Width::W128] {
            let bits = width.bits();
            for cos in [0.5, 0.8, 0.9, 0.95, 0.99, 1.0] {
                let k = default_vector_k(width, cos, false);
                // Brute force: every distance up to k estimates at least cos,
                // k + 1 does not (unless capped at bits / 8).
                let est = |h: u32| (std::f64::consts::PI * h as f64 / bits as f64).cos();
                assert!((0..=k).all(|h| est(h) >= cos - 1e-12), "{bits} {cos} {k}");
                assert!(k == bits / 8 || est(k + 1) < cos, "{bits} {cos} {k}");
                let verified = default_vector_k(width, cos, true);
                assert!(verified <= bits / 8);
                assert!(verified == bits / 8 || recall_at(bits, verified, cos) >= 0.99);
                assert!(verified == 0 || recall_at(bits, verified - 1, cos) < 0.99);
            }
        }
    }

    #[test]
    fn the_generic_and_dispatched_paths_agree() {
        let planes = Hyperplanes::new(300, Width::W128, 7);
        let mut rng = SplitMix64(3);
        for _ in 0..50 {
            let v: Vec<f32> = (0..300).map(|_| rng.unit() as f32 - 0.5).collect();
            for half in 0..2 {
                let rows = &planes.rows[half * LANES..];
                assert_eq!(
                    project64(rows, 128, &v).map(f32::to_bits),
                    project64_generic(rows, 128, &v).map(f32::to_bits)
                );
            }
        }
    }

    #[test]
    #[allow(clippy::needless_range_loop)] // bit i, hyperplane i, entry [j][i]
    fn projections_equal_the_textbook_sums() {
        // Each bit is the sign of the dot product with hyperplane i, computed
        // here entry by entry in double precision from freshly drawn rows.
        let (dim, seed) = (40, 11);
        let planes = Hyperplanes::new(dim, Width::W64, seed);
        let rows: Vec<Vec<f32>> = (0..dim).map(|j| row(j, 64, seed).collect()).collect();
        let mut rng = SplitMix64(5);
        for _ in 0..200 {
            let v: Vec<f32> = (0..dim).map(|_| rng.unit() as f32 * 2.0 - 1.0).collect();
            let fp = planes.fingerprint(&v).unwrap().value();
            for i in 0..64 {
                let dot: f64 = (0..dim)
                    .map(|j| f64::from(v[j]) * f64::from(rows[j][i]))
                    .sum();
                if dot.abs() > 1e-4 {
                    assert_eq!((fp >> i) & 1 == 1, dot > 0.0, "bit {i}, dot {dot}");
                }
            }
        }
    }

    #[test]
    fn a_shorter_vector_uses_the_first_rows() {
        let long = Hyperplanes::new(768, Width::W64, 0);
        let short = Hyperplanes::new(384, Width::W64, 0);
        let v: Vec<f32> = (0..384).map(|i| ((i * 37 % 101) as f32) - 50.0).collect();
        assert_eq!(
            long.fingerprint(&v).unwrap(),
            short.fingerprint(&v).unwrap()
        );
        let wide = Hyperplanes::new(384, Width::W128, 0);
        assert_eq!(
            wide.fingerprint(&v).unwrap().value() as u64,
            short.fingerprint(&v).unwrap().value() as u64,
            "the 64-bit fingerprint is the low half of the 128-bit one"
        );
    }

    #[test]
    fn bad_vectors_are_refused() {
        let planes = Hyperplanes::new(4, Width::W64, 0);
        assert!(planes.fingerprint(&[]).is_err());
        assert!(planes.fingerprint(&[0.0; 4]).is_err());
        assert!(planes.fingerprint(&[1.0, f32::NAN]).is_err());
        assert!(planes.fingerprint(&[1.0, f32::INFINITY]).is_err());
        assert!(planes.fingerprint(&[1.0; 5]).is_err());
        assert!(planes.fingerprint(&[1.0; 3]).is_ok());
    }

    #[test]
    fn recall_follows_the_binomial_model() {
        // Independently: P[Bin(4, 1/2) <= 1] = (1 + 4) / 16 (cos 0 -> p = 1/2).
        assert!((recall_at(4, 1, 0.0) - 5.0 / 16.0).abs() < 1e-12);
        assert!((recall_at(64, 64, 0.3) - 1.0).abs() < 1e-9);
        assert_eq!(recall_at(64, 0, 1.0), 1.0);
        // p = 1/3 at 60 degrees: P[Bin(3, 1/3) = 0] = 8/27.
        assert!((recall_at(3, 0, 0.5) - 8.0 / 27.0).abs() < 1e-9);
        let k = k_for_recall(128, 0.95, 0.99, 128).unwrap();
        assert!(recall_at(128, k, 0.95) >= 0.99 && recall_at(128, k - 1, 0.95) < 0.99);
        assert_eq!(k_for_recall(64, 0.0, 0.99, 8), None);
    }

    #[test]
    fn cosine_of_known_pairs() {
        assert!((cosine(&[1.0, 0.0], &[0.0, 2.0])).abs() < 1e-12);
        assert!((cosine(&[1.0, 1.0], &[2.0, 2.0]) - 1.0).abs() < 1e-12);
        assert!((cosine(&[1.0, 0.0], &[1.0, 1.0]) - 0.5f64.sqrt()).abs() < 1e-12);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 1.0]), 0.0);
    }
}
