//! The paper's codes of a table's keys: a canonical, length-limited Huffman
//! code of the highest differing bit, decoded a table lookup at a time.

/// Longest Huffman code, so decoding is one table lookup.
pub(super) const MAX_CODE: u32 = 12;

/// A canonical, length-limited Huffman code over the symbols 0..128.
#[derive(Clone, Debug)]
pub(super) struct Huffman {
    /// Code and length per symbol (length 0: unused).
    pub(super) codes: Vec<(u32, u32)>,
    /// For every MAX_CODE-bit window (reversed code order: LSB first), the symbol
    /// and its length.
    pub(super) decode: Vec<(u8, u8)>,
    /// The same for codes of at most FAST_CODE bits, small enough to stay in the
    /// L1 cache beside the other tables'; length 0 means "look in `decode`".
    pub(super) fast: Box<[(u8, u8); 1 << FAST_CODE]>,
    /// Decoding tables for the streams read downwards (codes most significant
    /// bit first), indexed by the window's top bits.
    pub(super) decode_msb: Vec<(u8, u8)>,
    pub(super) fast_msb: Box<[(u8, u8); 1 << FAST_CODE]>,
}

/// Bits of the first-level decoding table.
pub(super) const FAST_CODE: u32 = 8;

impl Huffman {
    pub(super) fn new(freq: &[u64]) -> Huffman {
        let lengths: Vec<u8> = limited_lengths(freq, MAX_CODE)
            .into_iter()
            .map(|l| l as u8)
            .collect();
        Huffman::from_lengths(&lengths).expect("a valid length-limited code")
    }

    /// The canonical code of these lengths per symbol (0: unused), as a file
    /// stores it; None unless they make a prefix code of at most MAX_CODE bits.
    pub(super) fn from_lengths(lengths: &[u8]) -> Option<Huffman> {
        let kraft: u64 = lengths
            .iter()
            .filter(|&&l| l > 0)
            .map(|&l| 1u64 << (MAX_CODE - u32::from(l).min(MAX_CODE)))
            .sum();
        if lengths.iter().any(|&l| u32::from(l) > MAX_CODE)
            || kraft == 0
            || kraft > 1 << MAX_CODE
            || lengths.len() > 256
        {
            return None;
        }
        let lengths: Vec<u32> = lengths.iter().map(|&l| u32::from(l)).collect();
        // Canonical codes: by (length, symbol).
        let mut order: Vec<usize> = (0..lengths.len()).filter(|&s| lengths[s] > 0).collect();
        order.sort_by_key(|&s| (lengths[s], s));
        let mut codes = vec![(0u32, 0u32); lengths.len()];
        let mut code = 0u32;
        let mut prev_len = 0;
        for &s in &order {
            code <<= lengths[s] - prev_len;
            prev_len = lengths[s];
            codes[s] = (code, lengths[s]);
            code += 1;
        }
        let mut decode_msb = vec![(0u8, 0u8); 1 << MAX_CODE];
        let mut fast_msb = Box::new([(0u8, 0u8); 1 << FAST_CODE]);
        for (s, &(c, len)) in codes.iter().enumerate() {
            if len == 0 {
                continue;
            }
            let from = (c << (MAX_CODE - len)) as usize;
            decode_msb[from..from + (1 << (MAX_CODE - len))].fill((s as u8, len as u8));
            if len <= FAST_CODE {
                let from = (c << (FAST_CODE - len)) as usize;
                fast_msb[from..from + (1 << (FAST_CODE - len))].fill((s as u8, len as u8));
            }
        }
        // Codes read upwards are LSB first, so store them bit-reversed.
        for c in codes.iter_mut().filter(|c| c.1 > 0) {
            c.0 = c.0.reverse_bits() >> (32 - c.1);
        }
        let mut decode = vec![(0u8, 0u8); 1 << MAX_CODE];
        for (s, &(c, len)) in codes.iter().enumerate() {
            if len == 0 {
                continue;
            }
            let mut fill = c as usize;
            while fill < decode.len() {
                decode[fill] = (s as u8, len as u8);
                fill += 1 << len;
            }
        }
        let mut fast = Box::new([(0u8, 0u8); 1 << FAST_CODE]);
        for (w, f) in fast.iter_mut().enumerate() {
            if u32::from(decode[w].1) <= FAST_CODE {
                *f = decode[w];
            }
        }
        Some(Huffman {
            codes,
            decode,
            fast,
            decode_msb,
            fast_msb,
        })
    }

    /// The code length of every symbol.
    pub(super) fn lengths(&self) -> Vec<u8> {
        self.codes.iter().map(|&(_, l)| l as u8).collect()
    }
}

/// Code lengths for `freq` of at most `limit` bits: plain Huffman lengths, with
/// frequencies flattened until the longest fits.
pub(super) fn limited_lengths(freq: &[u64], limit: u32) -> Vec<u32> {
    let used: Vec<usize> = (0..freq.len()).filter(|&s| freq[s] > 0).collect();
    let mut lengths = vec![0u32; freq.len()];
    if used.len() == 1 {
        lengths[used[0]] = 1;
        return lengths;
    }
    let mut f: Vec<u64> = freq.to_vec();
    loop {
        // Huffman by repeatedly merging the two lightest nodes.
        let mut nodes: Vec<(u64, Vec<usize>)> = used.iter().map(|&s| (f[s], vec![s])).collect();
        lengths.iter_mut().for_each(|l| *l = 0);
        while nodes.len() > 1 {
            nodes.sort_by_key(|n| std::cmp::Reverse(n.0));
            let (wa, a) = nodes.pop().expect("two nodes");
            let (wb, b) = nodes.pop().expect("two nodes");
            for &s in a.iter().chain(&b) {
                lengths[s] += 1;
            }
            nodes.push((wa + wb, a.into_iter().chain(b).collect()));
        }
        if lengths.iter().all(|&l| l <= limit) {
            return lengths;
        }
        for s in &used {
            f[*s] = f[*s] / 2 + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::bitio::{BitWriter, MsbWriter, window_down, window_up};
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A code from any frequencies is a prefix code within MAX_CODE bits
        /// that gives back every symbol written, read upwards (LSB first) and
        /// downwards (MSB first), through the fast and the full tables; its
        /// lengths rebuild the same code.
        #[test]
        fn codes_round_trip(
            freq in prop::collection::vec(prop_oneof![Just(0u64), 1u64..1_000_000], 1..128),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 1..300),
        ) {
            let used: Vec<usize> = (0..freq.len()).filter(|&s| freq[s] > 0).collect();
            prop_assume!(!used.is_empty());
            let code = Huffman::new(&freq);
            let lengths = code.lengths();
            for (s, &l) in lengths.iter().enumerate() {
                prop_assert_eq!(l > 0, freq[s] > 0, "symbol {}", s);
                prop_assert!(u32::from(l) <= MAX_CODE);
            }
            let again = Huffman::from_lengths(&lengths).expect("its own lengths are valid");
            prop_assert_eq!(&again.codes, &code.codes);
            let symbols: Vec<usize> = picks.iter().map(|i| used[i.index(used.len())]).collect();

            let mut w = BitWriter::on(vec![0; 8]);
            for &s in &symbols {
                let (c, len) = code.codes[s];
                w.put(u64::from(c), len);
            }
            w.align();
            let mut data = w.bytes;
            data.extend_from_slice(&[0; 8]);
            let mut pos = 64;
            for &s in &symbols {
                let window = window_up(&data, pos);
                let full = code.decode[(window & ((1 << MAX_CODE) - 1)) as usize];
                prop_assert_eq!(full, (s as u8, lengths[s]));
                let fast = code.fast[(window & ((1 << FAST_CODE) - 1)) as usize];
                prop_assert!(fast.1 == 0 || fast == full);
                pos += usize::from(full.1);
            }

            let mut m = MsbWriter::default();
            for &s in &symbols {
                let (c, len) = code.codes[s];
                m.put(u64::from(c.reverse_bits() >> (32 - len)), len);
            }
            let mut data = vec![0; 8];
            data.extend_from_slice(&m.finish_reversed());
            let mut end = data.len() * 8;
            data.extend_from_slice(&[0; 8]);
            for &s in &symbols {
                let window = window_down(&data, end);
                let full = code.decode_msb[(window >> (64 - MAX_CODE)) as usize];
                prop_assert_eq!(full, (s as u8, lengths[s]));
                let fast = code.fast_msb[(window >> (64 - FAST_CODE)) as usize];
                prop_assert!(fast.1 == 0 || fast == full);
                end -= usize::from(full.1);
            }
        }
    }

    #[test]
    fn lengths_beyond_the_limit_or_over_full_are_refused() {
        assert!(Huffman::from_lengths(&[MAX_CODE as u8 + 1, 1]).is_none());
        assert!(Huffman::from_lengths(&[1, 1, 1]).is_none()); // Kraft sum 3/2
        assert!(Huffman::from_lengths(&[0, 0]).is_none());
        assert!(Huffman::from_lengths(&[1, 1]).is_some());
    }
}
