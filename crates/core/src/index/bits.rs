//! [`Bits`]: the fingerprint word of an index, `u64` or `u128`, so that one
//! generic code path serves both widths.

use std::fmt::Debug;
use std::hash::Hash;

use crate::fingerprint::{Fingerprint, Width};

/// Runs `$body` with `$B` the fingerprint word of `$width` (a [`Width`]):
/// `u64` for 64 bits, `u128` for 128. The one place where a width chosen at
/// run time becomes a type, so that the code it runs is monomorphic.
///
/// ```
/// use neardup_core::index::Bits;
/// use neardup_core::{Width, with_bits};
///
/// fn ones<B: Bits>() -> u32 {
///     B::BITS
/// }
/// assert_eq!(with_bits!(Width::W128, B => ones::<B>()), 128);
/// ```
#[macro_export]
macro_rules! with_bits {
    ($width:expr, $B:ident => $body:expr) => {
        match $width {
            $crate::Width::W64 => {
                type $B = u64;
                $body
            }
            $crate::Width::W128 => {
                type $B = u128;
                $body
            }
        }
    };
}

/// An unsigned word holding a fingerprint.
pub trait Bits: bytemuck::Pod + Ord + Eq + Hash + Debug + Default + Send + Sync + 'static {
    /// The width.
    const WIDTH: Width;
    /// Number of bits.
    const BITS: u32;
    /// Hamming distance.
    fn distance(self, other: Self) -> u32;
    /// Pushes onto `hits` the index of every `others[i]` within `k` of
    /// `self`, in order (vectorised where the CPU allows).
    fn within(self, others: &[Self], k: u32, hits: &mut Vec<u32>);
    /// The low 128 bits as a u128.
    fn to_u128(self) -> u128;
    /// From the low bits of a u128.
    fn from_u128(v: u128) -> Self;
    /// The top `n` bits as an integer (0 < n <= 64).
    fn top(self, n: u32) -> u64;
    /// Bits `[start, start + len)` (from the least significant), in the low bits.
    fn field(self, start: u32, len: u32) -> Self;
    /// Shift left.
    fn shl(self, n: u32) -> Self;
    /// Shift right.
    fn shr(self, n: u32) -> Self;
    /// Bitwise or.
    fn or(self, other: Self) -> Self;
    /// Bitwise and.
    fn and(self, other: Self) -> Self;
    /// Bitwise xor.
    fn xor(self, other: Self) -> Self;
    /// All ones in `[start, start + len)`.
    fn mask(start: u32, len: u32) -> Self;
    /// `self` with bit `h` set and the bits below it replaced by `low`, where
    /// bit `h` of `self` is 0 (h < BITS; `low` < 2^h): the key above a key in
    /// a compressed table. Branch-free.
    fn above(self, h: u32, low: Self) -> Self;
    /// `self` with bits `h` and below replaced by `low` (h < BITS; `low` <
    /// 2^h): the key below a key in a compressed table. Branch-free.
    fn below(self, h: u32, low: Self) -> Self;
    /// Wrapping sum.
    fn add(self, other: Self) -> Self;
    /// Wrapping difference.
    fn sub(self, other: Self) -> Self;
    /// Zero.
    fn zero() -> Self;
    /// Little-endian bytes (8 or 16).
    fn write_le(self, out: &mut Vec<u8>);
    /// From little-endian bytes.
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! impl_bits {
    ($t:ty, $width:expr, $within:path) => {
        impl Bits for $t {
            const WIDTH: Width = $width;
            const BITS: u32 = <$t>::BITS;
            #[inline]
            fn distance(self, other: Self) -> u32 {
                (self ^ other).count_ones()
            }
            #[inline]
            fn within(self, others: &[Self], k: u32, hits: &mut Vec<u32>) {
                $within(self, others, k, hits)
            }
            #[inline]
            fn to_u128(self) -> u128 {
                self as u128
            }
            #[inline]
            fn from_u128(v: u128) -> Self {
                v as $t
            }
            #[inline]
            fn top(self, n: u32) -> u64 {
                debug_assert!(n > 0 && n <= 64);
                (self >> (Self::BITS - n)) as u64
            }
            #[inline]
            fn field(self, start: u32, len: u32) -> Self {
                if len == Self::BITS {
                    return self;
                }
                (self >> start) & ((1 << len) - 1)
            }
            #[inline]
            fn shl(self, n: u32) -> Self {
                if n >= Self::BITS { 0 } else { self << n }
            }
            #[inline]
            fn shr(self, n: u32) -> Self {
                if n >= Self::BITS { 0 } else { self >> n }
            }
            #[inline]
            fn or(self, other: Self) -> Self {
                self | other
            }
            #[inline]
            fn and(self, other: Self) -> Self {
                self & other
            }
            #[inline]
            fn xor(self, other: Self) -> Self {
                self ^ other
            }
            #[inline]
            fn mask(start: u32, len: u32) -> Self {
                if len == 0 {
                    return 0;
                }
                let ones: $t = if len == Self::BITS {
                    !0
                } else {
                    (1 << len) - 1
                };
                ones << start
            }
            #[inline(always)]
            fn above(self, h: u32, low: Self) -> Self {
                // Ones below h, plus one, carry into bit h (a 0) and clear them.
                (self | (1 as $t).wrapping_shl(h).wrapping_sub(1)).wrapping_add(1) | low
            }
            #[inline(always)]
            fn below(self, h: u32, low: Self) -> Self {
                // 2 << h is 0 for the top bit: the mask is then all ones.
                (self & !((2 as $t).wrapping_shl(h).wrapping_sub(1))) | low
            }
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            #[inline(always)]
            fn sub(self, other: Self) -> Self {
                self.wrapping_sub(other)
            }
            #[inline]
            fn zero() -> Self {
                0
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("right length"))
            }
        }
    };
}

impl_bits!(u64, Width::W64, super::near::within_u64);
impl_bits!(u128, Width::W128, super::near::within_u128);

/// The word of a fingerprint, checking its width.
pub fn word_of<B: Bits>(fp: Fingerprint) -> Result<B, crate::Error> {
    if fp.width() != B::WIDTH {
        return Err(crate::Error::WidthMismatch {
            expected: B::BITS,
            got: fp.width().bits(),
        });
    }
    Ok(B::from_u128(fp.value()))
}
