//! The [`Fingerprint`] type: an f-bit SimHash value, f = 64 or 128.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Fingerprint width in bits. Part of the configuration: one code path serves both.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(try_from = "u32", into = "u32")]
pub enum Width {
    /// 64-bit fingerprints (the paper's choice and the default).
    #[default]
    W64,
    /// 128-bit fingerprints.
    W128,
}

impl Width {
    /// Every accepted spelling (the number of bits), for help texts.
    pub const NAMES: &'static [&'static str] = &["64", "128"];

    /// The number of bits, 64 or 128.
    pub const fn bits(self) -> u32 {
        match self {
            Width::W64 => 64,
            Width::W128 => 128,
        }
    }

    /// A mask of the low `bits()` bits.
    pub const fn mask(self) -> u128 {
        match self {
            Width::W64 => u64::MAX as u128,
            Width::W128 => u128::MAX,
        }
    }

    /// The width with this many bits, if it is 64 or 128.
    pub fn from_bits(bits: u32) -> Result<Width, Error> {
        match bits {
            64 => Ok(Width::W64),
            128 => Ok(Width::W128),
            other => Err(Error::InvalidConfig(format!(
                "fingerprint width {other} is not supported: use 64 or 128"
            ))),
        }
    }
}

impl std::str::FromStr for Width {
    type Err = Error;
    fn from_str(s: &str) -> Result<Width, Error> {
        match s.parse::<u32>() {
            Ok(bits) => Width::from_bits(bits),
            Err(_) => Err(Error::InvalidConfig(format!(
                "fingerprint width {s:?} is not a number: use 64 or 128"
            ))),
        }
    }
}

impl TryFrom<u32> for Width {
    type Error = Error;
    fn try_from(bits: u32) -> Result<Width, Error> {
        Width::from_bits(bits)
    }
}

impl From<Width> for u32 {
    fn from(w: Width) -> u32 {
        w.bits()
    }
}

impl fmt::Display for Width {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bits())
    }
}

/// An f-bit SimHash fingerprint (f = 64 or 128), stored in the low bits of a `u128`.
///
/// Displayed as fixed-width lower-case hex (16 or 32 digits); parsed from hex
/// (with or without `0x`) or, with [`Fingerprint::parse_decimal`], from decimal.
///
/// ```
/// use neardup_core::{Fingerprint, Width};
/// let a = Fingerprint::new(0b1011, Width::W64);
/// let b: Fingerprint = "0000000000000001".parse().unwrap();
/// assert_eq!(a.distance(b).unwrap(), 2);
/// assert_eq!(a.to_string(), "000000000000000b");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint {
    value: u128,
    width: Width,
}

impl Fingerprint {
    /// A fingerprint of the given width; bits above the width are dropped.
    pub const fn new(value: u128, width: Width) -> Fingerprint {
        Fingerprint {
            value: value & width.mask(),
            width,
        }
    }

    /// A 64-bit fingerprint.
    pub const fn from_u64(value: u64) -> Fingerprint {
        Fingerprint {
            value: value as u128,
            width: Width::W64,
        }
    }

    /// The value, in the low `width().bits()` bits.
    pub const fn value(self) -> u128 {
        self.value
    }

    /// The low 64 bits (the whole value for a 64-bit fingerprint).
    pub const fn as_u64(self) -> u64 {
        self.value as u64
    }

    /// The width.
    pub const fn width(self) -> Width {
        self.width
    }

    /// Bit `i` (0 = least significant).
    pub const fn bit(self, i: u32) -> bool {
        (self.value >> i) & 1 == 1
    }

    /// Hamming distance; an error if the widths differ.
    pub fn distance(self, other: Fingerprint) -> Result<u32, Error> {
        if self.width != other.width {
            return Err(Error::WidthMismatch {
                expected: self.width.bits(),
                got: other.width.bits(),
            });
        }
        Ok((self.value ^ other.value).count_ones())
    }

    /// Estimated cosine similarity of the weighted feature vectors behind two
    /// fingerprints at Hamming distance `distance`: cos(pi * h / f).
    pub fn similarity_from_distance(distance: u32, width: Width) -> f64 {
        (std::f64::consts::PI * distance as f64 / width.bits() as f64).cos()
    }

    /// The widest Hamming distance whose estimated similarity is at least
    /// `similarity`: cos(pi * h / f) >= s  <=>  h <= f * acos(s) / pi (the
    /// inverse of [`Fingerprint::similarity_from_distance`]).
    pub fn distance_for_similarity(similarity: f64, width: Width) -> u32 {
        let f = f64::from(width.bits());
        (f * similarity.clamp(-1.0, 1.0).acos() / std::f64::consts::PI + 1e-9).floor() as u32
    }

    /// Estimated cosine similarity to `other` (see [`Fingerprint::similarity_from_distance`]).
    pub fn similarity(self, other: Fingerprint) -> Result<f64, Error> {
        Ok(Self::similarity_from_distance(
            self.distance(other)?,
            self.width,
        ))
    }

    /// Parses hex (16 digits for 64 bits, 32 for 128, an optional `0x`).
    /// The width is taken from the digit count: up to 16 digits is 64 bits.
    pub fn parse_hex(s: &str) -> Result<Fingerprint, Error> {
        let digits = s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .unwrap_or(s);
        let bad = || Error::InvalidFingerprint {
            input: truncate_for_message(s),
            reason: "expected up to 16 hex digits (64-bit) or 17 to 32 (128-bit)".into(),
        };
        // Digits only: from_str_radix would also take a sign.
        if digits.is_empty() || digits.len() > 32 || !digits.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(bad());
        }
        let value = u128::from_str_radix(digits, 16).map_err(|_| bad())?;
        let width = if digits.len() <= 16 {
            Width::W64
        } else {
            Width::W128
        };
        Ok(Fingerprint::new(value, width))
    }

    /// Parses hex of a known width, checking that the value fits.
    pub fn parse_hex_width(s: &str, width: Width) -> Result<Fingerprint, Error> {
        let fp = Self::parse_hex(s)?;
        match (fp.width, width) {
            (a, b) if a == b => Ok(fp),
            (Width::W64, Width::W128) => Ok(Fingerprint::new(fp.value, Width::W128)),
            _ => Err(Error::WidthMismatch {
                expected: width.bits(),
                got: fp.width.bits(),
            }),
        }
    }

    /// Parses a decimal integer of the given width.
    pub fn parse_decimal(s: &str, width: Width) -> Result<Fingerprint, Error> {
        let value: u128 = s.parse().map_err(|_| Error::InvalidFingerprint {
            input: truncate_for_message(s),
            reason: "expected a non-negative decimal integer".into(),
        })?;
        if value & !width.mask() != 0 {
            return Err(Error::InvalidFingerprint {
                input: truncate_for_message(s),
                reason: format!("does not fit in {} bits", width.bits()),
            });
        }
        Ok(Fingerprint::new(value, width))
    }

    /// The decimal representation.
    pub fn to_decimal(self) -> String {
        self.value.to_string()
    }
}

fn truncate_for_message(s: &str) -> String {
    let mut out: String = s.chars().take(48).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.width {
            Width::W64 => write!(f, "{:016x}", self.value),
            Width::W128 => write!(f, "{:032x}", self.value),
        }
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self}/{})", self.width.bits())
    }
}

impl FromStr for Fingerprint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Fingerprint, Error> {
        Fingerprint::parse_hex(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_both_widths() {
        let a = Fingerprint::new(0xdead_beef, Width::W64);
        assert_eq!(a.to_string(), "00000000deadbeef");
        assert_eq!(a.to_string().parse::<Fingerprint>().unwrap(), a);
        let b = Fingerprint::new(1u128 << 100 | 7, Width::W128);
        assert_eq!(b.to_string().len(), 32);
        assert_eq!(b.to_string().parse::<Fingerprint>().unwrap(), b);
    }

    #[test]
    fn decimal_round_trip_and_overflow() {
        let a = Fingerprint::from_u64(u64::MAX);
        assert_eq!(
            Fingerprint::parse_decimal(&a.to_decimal(), Width::W64).unwrap(),
            a
        );
        assert!(Fingerprint::parse_decimal("18446744073709551616", Width::W64).is_err());
        assert!(Fingerprint::parse_decimal("18446744073709551616", Width::W128).is_ok());
        assert!(Fingerprint::parse_decimal("-1", Width::W64).is_err());
    }

    #[test]
    fn bad_hex_is_an_error() {
        for s in [
            "",
            "0x",
            "xyz",
            "123456789012345678901234567890123",
            "+1f",
            "0x+1f",
            "-1",
        ] {
            assert!(s.parse::<Fingerprint>().is_err(), "{s:?}");
        }
    }

    #[test]
    fn distance_and_similarity() {
        let a = Fingerprint::from_u64(0);
        let b = Fingerprint::from_u64(0b111);
        assert_eq!(a.distance(b).unwrap(), 3);
        assert!((a.similarity(a).unwrap() - 1.0).abs() < 1e-12);
        let c = Fingerprint::from_u64(u64::MAX);
        assert!((a.similarity(c).unwrap() + 1.0).abs() < 1e-12);
        let wide = Fingerprint::new(0, Width::W128);
        assert!(a.distance(wide).is_err());
    }

    #[test]
    fn parse_hex_width_widens_but_never_narrows() {
        let w = Fingerprint::parse_hex_width("ff", Width::W128).unwrap();
        assert_eq!(w.width(), Width::W128);
        assert!(Fingerprint::parse_hex_width(&"f".repeat(32), Width::W64).is_err());
    }
}
