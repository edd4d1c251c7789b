//! Bit streams of the coded blocks: writers least significant bit first (the
//! chains read upwards) and most significant bit first (downwards), and the
//! 57-bit windows that readers take from either end.

use crate::index::bits::Bits;

/// Bits written least significant first: the chains read upwards.
#[derive(Default)]
pub(super) struct BitWriter {
    pub(super) bytes: Vec<u8>,
    pub(super) acc: u64,
    pub(super) n: u32,
}

impl BitWriter {
    /// A writer that appends to `bytes`.
    pub(super) fn on(bytes: Vec<u8>) -> BitWriter {
        BitWriter {
            bytes,
            ..BitWriter::default()
        }
    }

    pub(super) fn put(&mut self, value: u64, bits: u32) {
        debug_assert!(bits <= 57);
        if bits == 0 {
            return;
        }
        self.acc |= (value & ((1u64 << bits) - 1)) << self.n;
        self.n += bits;
        while self.n >= 8 {
            self.bytes.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }
    pub(super) fn put_wide<B: Bits>(&mut self, value: B, bits: u32) {
        let mut done = 0;
        while done < bits {
            let take = (bits - done).min(32);
            self.put(value.field(done, take).to_u128() as u64, take);
            done += take;
        }
    }
    pub(super) fn align(&mut self) {
        if self.n > 0 {
            self.bytes.push(self.acc as u8);
            self.acc = 0;
            self.n = 0;
        }
    }
}

/// Bits written most significant first: the chains read downwards, whose bytes
/// are stored in reverse order, so that they end where their anchor's forward
/// chain starts.
#[derive(Default)]
pub(super) struct MsbWriter {
    pub(super) bytes: Vec<u8>,
    pub(super) acc: u64,
    pub(super) n: u32,
}

impl MsbWriter {
    pub(super) fn put(&mut self, value: u64, bits: u32) {
        debug_assert!(bits <= 32);
        if bits == 0 {
            return;
        }
        self.acc = (self.acc << bits) | (value & ((1u64 << bits) - 1));
        self.n += bits;
        while self.n >= 8 {
            self.bytes.push((self.acc >> (self.n - 8)) as u8);
            self.n -= 8;
        }
    }
    /// The low `bits` bits of `value`, most significant first.
    pub(super) fn put_wide<B: Bits>(&mut self, value: B, bits: u32) {
        let mut left = bits;
        while left > 0 {
            let take = left.min(32);
            left -= take;
            self.put(value.field(left, take).to_u128() as u64, take);
        }
    }
    /// The bytes, last first.
    pub(super) fn finish_reversed(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.bytes.push((self.acc << (8 - self.n)) as u8);
        }
        self.bytes.reverse();
        self.bytes
    }
}

/// The 8 bytes at `at` as a little-endian word. A stream has 8 zero bytes at
/// each end; past them (a damaged file) this reads zeros, never out of bounds.
#[inline(always)]
pub(super) fn word_at(data: &[u8], at: usize) -> u64 {
    data.get(at..at.wrapping_add(8))
        .map_or(0, |w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
}

/// At least 57 bits upwards from bit `pos`, the first in the lowest bit.
#[inline(always)]
pub(super) fn window_up(data: &[u8], pos: usize) -> u64 {
    word_at(data, pos / 8) >> (pos % 8)
}

/// At least 57 bits downwards from just below bit `end`, the first in the
/// highest bit.
#[inline(always)]
pub(super) fn window_down(data: &[u8], end: usize) -> u64 {
    word_at(data, (end.wrapping_add(7) / 8).wrapping_sub(8)) << (end.wrapping_neg() & 7)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn low(v: u64, bits: u32) -> u64 {
        if bits == 0 {
            0
        } else {
            v & (u64::MAX >> (64 - bits))
        }
    }

    proptest! {
        /// What the writers put, the windows give back: upwards from the
        /// start, and downwards from the end of a reversed stream, each
        /// between the 8 zero bytes a stream has at either end.
        #[test]
        fn windows_read_back_what_the_writers_put(
            up in prop::collection::vec((any::<u64>(), 0u32..=57), 0..200),
            down in prop::collection::vec((any::<u64>(), 0u32..=32), 0..200),
        ) {
            let mut w = BitWriter::on(vec![0; 8]);
            for &(v, bits) in &up {
                w.put(v, bits);
            }
            w.align();
            let mut data = w.bytes;
            data.extend_from_slice(&[0; 8]);
            let mut pos = 64;
            for &(v, bits) in &up {
                prop_assert_eq!(low(window_up(&data, pos), bits), low(v, bits));
                pos += bits as usize;
            }

            let mut m = MsbWriter::default();
            for &(v, bits) in &down {
                m.put(v, bits);
            }
            let mut data = vec![0; 8];
            data.extend_from_slice(&m.finish_reversed());
            let mut end = data.len() * 8;
            data.extend_from_slice(&[0; 8]);
            for &(v, bits) in &down {
                let got = if bits == 0 { 0 } else { window_down(&data, end) >> (64 - bits) };
                prop_assert_eq!(got, low(v, bits));
                end -= bits as usize;
            }
        }

        /// Wide values go in 32-bit pieces, in the order each reader expects.
        #[test]
        fn wide_values_round_trip(v: u128, bits in 1u32..=128) {
            let want = if bits == 128 { v } else { v & ((1u128 << bits) - 1) };
            let mut w = BitWriter::on(vec![0; 8]);
            w.put_wide(v, bits);
            w.align();
            let mut data = w.bytes;
            data.extend_from_slice(&[0; 8]);
            let (mut got, mut done, mut pos) = (0u128, 0, 64);
            while done < bits {
                let take = (bits - done).min(32);
                got |= u128::from(low(window_up(&data, pos), take)) << done;
                pos += take as usize;
                done += take;
            }
            prop_assert_eq!(got, want);

            let mut m = MsbWriter::default();
            m.put_wide(v, bits);
            let mut data = vec![0; 8];
            data.extend_from_slice(&m.finish_reversed());
            let mut end = data.len() * 8;
            data.extend_from_slice(&[0; 8]);
            let (mut got, mut left) = (0u128, bits);
            while left > 0 {
                let take = left.min(32);
                left -= take;
                got |= u128::from(window_down(&data, end) >> (64 - take)) << left;
                end -= take as usize;
            }
            prop_assert_eq!(got, want);
        }
    }
}
