//! Feature hashing: bytes to 64 or 128 bits.

use std::hash::Hasher as _;

use md5::{Digest, Md5};
use siphasher::sip::SipHasher24;
use siphasher::sip128::{Hasher128 as _, SipHasher24 as SipHasher24x128};

use crate::config::HashFunction;
use crate::fingerprint::Width;

/// A feature hash function of a fixed width. 64-bit hashes are returned in the
/// low half of the `u128`.
#[derive(Clone, Copy, Debug)]
pub struct FeatureHasher {
    function: HashFunction,
    width: Width,
    seed: u64,
}

const FNV64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV64_PRIME: u64 = 0x0000_0100_0000_01b3;
const FNV128_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV128_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

impl FeatureHasher {
    /// A hasher for `function` producing `width` bits.
    pub fn new(function: HashFunction, width: Width, seed: u64) -> Self {
        FeatureHasher {
            function,
            width,
            seed,
        }
    }

    /// The hash of `bytes`.
    #[inline]
    pub fn hash(&self, bytes: &[u8]) -> u128 {
        match (self.function, self.width) {
            (HashFunction::Xxh3, Width::W64) => {
                xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.seed) as u128
            }
            (HashFunction::Xxh3, Width::W128) => {
                xxhash_rust::xxh3::xxh3_128_with_seed(bytes, self.seed)
            }
            (HashFunction::Fnv1a, Width::W64) => {
                let mut h = FNV64_OFFSET;
                for &b in bytes {
                    h = (h ^ b as u64).wrapping_mul(FNV64_PRIME);
                }
                h as u128
            }
            (HashFunction::Fnv1a, Width::W128) => {
                let mut h = FNV128_OFFSET;
                for &b in bytes {
                    h = (h ^ b as u128).wrapping_mul(FNV128_PRIME);
                }
                h
            }
            (HashFunction::Md5, width) => {
                let digest: [u8; 16] = Md5::digest(bytes).into();
                let full = u128::from_be_bytes(digest);
                // For 64 bits, the last 8 bytes big-endian: what PyPI `simhash` takes.
                full & width.mask()
            }
            (HashFunction::SipHash, Width::W64) => {
                let mut h = SipHasher24::new_with_keys(self.seed, 0);
                h.write(bytes);
                h.finish() as u128
            }
            (HashFunction::SipHash, Width::W128) => {
                let mut h = SipHasher24x128::new_with_keys(self.seed, 0);
                h.write(bytes);
                h.finish128().as_u128()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Published test vectors, not outputs of this code.
    #[test]
    fn fnv1a_known_vectors() {
        let h64 = FeatureHasher::new(HashFunction::Fnv1a, Width::W64, 0);
        assert_eq!(h64.hash(b""), 0xcbf29ce484222325);
        assert_eq!(h64.hash(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(h64.hash(b"foobar"), 0x85944171f73967e8);
        let h128 = FeatureHasher::new(HashFunction::Fnv1a, Width::W128, 0);
        assert_eq!(h128.hash(b""), FNV128_OFFSET);
        assert_eq!(h128.hash(b"a"), 0xd228cb696f1a8caf78912b704e4a8964);
    }

    #[test]
    fn md5_known_vector_and_low_half() {
        // md5("abc") = 900150983cd24fb0d6963f7d28e17f72 (RFC 1321).
        let h128 = FeatureHasher::new(HashFunction::Md5, Width::W128, 0);
        assert_eq!(h128.hash(b"abc"), 0x900150983cd24fb0d6963f7d28e17f72);
        let h64 = FeatureHasher::new(HashFunction::Md5, Width::W64, 0);
        assert_eq!(h64.hash(b"abc"), 0xd6963f7d28e17f72);
    }

    #[test]
    fn widths_stay_in_range_and_seeds_matter() {
        for f in [
            HashFunction::Xxh3,
            HashFunction::Fnv1a,
            HashFunction::Md5,
            HashFunction::SipHash,
        ] {
            let h = FeatureHasher::new(f, Width::W64, 0).hash(b"hello");
            assert_eq!(h >> 64, 0, "{f}");
        }
        let a = FeatureHasher::new(HashFunction::Xxh3, Width::W64, 0).hash(b"x");
        let b = FeatureHasher::new(HashFunction::Xxh3, Width::W64, 1).hash(b"x");
        assert_ne!(a, b);
    }
}
