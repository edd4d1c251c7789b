//! LSD radix sort on the top bits of a key: one or two counting passes, each
//! with at most 2^13 write streams, so the scatter stays within the caches and
//! the TLB (a single pass over 2^22 buckets is a cache miss per element).

use super::bits::Bits;

/// Something sorted by the top bits of a fingerprint word.
pub trait TopBits: Copy + Default + Send + Sync {
    /// The top `d` bits (0 < d <= 64).
    fn top_bits(&self, d: u32) -> u64;
}

impl<B: Bits> TopBits for B {
    #[inline(always)]
    fn top_bits(&self, d: u32) -> u64 {
        self.top(d)
    }
}

impl<B: Bits> TopBits for (B, u32) {
    #[inline(always)]
    fn top_bits(&self, d: u32) -> u64 {
        self.0.top(d)
    }
}

/// Sorts `v` by the top `bits` bits (bits <= 26), stably; `tmp` is scratch space,
/// grown when needed and reused across calls.
pub fn sort_by_top<T: TopBits>(v: &mut [T], tmp: &mut Vec<T>, bits: u32) {
    debug_assert!((1..=26).contains(&bits));
    if tmp.len() < v.len() {
        *tmp = super::mem::filled_huge(v.len(), T::default());
    }
    let tmp = &mut tmp[..v.len()];
    if bits <= 13 {
        pass(v, tmp, bits, 0, bits);
        v.copy_from_slice(tmp);
        return;
    }
    let lo = bits / 2;
    pass(v, tmp, bits, 0, lo);
    pass(tmp, v, bits, lo, bits - lo);
}

/// Copies `src` into `out` sorted by `key` (a `bits`-bit integer, bits <=
/// 26), stably; `tmp` (scratch) is as long as `src`. The key is computed per
/// pass rather than stored: cheaper than a third array when it is a few shifts.
pub fn sort_by_key_into<T: Copy>(
    src: &[T],
    key: impl Fn(&T) -> u64 + Copy,
    out: &mut [T],
    tmp: &mut [T],
    bits: u32,
) {
    debug_assert!((1..=26).contains(&bits));
    assert!(out.len() == src.len() && tmp.len() == src.len());
    if bits <= 13 {
        pass_by(src, out, |x| key(x) as usize);
        return;
    }
    let lo = bits / 2;
    let low_mask = (1u64 << lo) - 1;
    pass_by(src, tmp, |x| (key(x) & low_mask) as usize);
    pass_by(tmp, out, |x| (key(x) >> lo) as usize);
}

/// One stable counting pass by `digit` (under 2^13 distinct values).
fn pass_by<T: Copy>(src: &[T], dst: &mut [T], digit: impl Fn(&T) -> usize) {
    scatter_by(src, dst, 1 << 13, digit, &mut Vec::new());
}

/// One stable counting pass on digit `(top(d) >> shift) & (2^width - 1)`.
fn pass<T: TopBits>(src: &[T], dst: &mut [T], d: u32, shift: u32, width: u32) {
    let mask = (1u64 << width) - 1;
    let digit = |x: &T| ((x.top_bits(d) >> shift) & mask) as usize;
    scatter_by(src, dst, 1 << width, digit, &mut Vec::new());
}

/// Copies `src` into `dst` (as long) grouped by `digit` (below `buckets`),
/// stably: one counting pass, `offsets` its scratch.
#[inline]
pub(crate) fn scatter_by<T: Copy>(
    src: &[T],
    dst: &mut [T],
    buckets: usize,
    digit: impl Fn(&T) -> usize,
    offsets: &mut Vec<usize>,
) {
    offsets.clear();
    offsets.resize(buckets + 1, 0);
    for x in src {
        offsets[digit(x) + 1] += 1;
    }
    for b in 0..buckets {
        offsets[b + 1] += offsets[b];
    }
    for x in src {
        let slot = &mut offsets[digit(x)];
        dst[*slot] = *x;
        *slot += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn key_sort_is_a_stable_sort_by_key(v in prop::collection::vec(any::<u64>(), 0..500), bits in 1u32..27) {
            let key = |x: &u64| (x.rotate_left(13) ^ 0x5555) >> (64 - bits);
            let mut got = vec![0u64; v.len()];
            sort_by_key_into(&v, key, &mut got, &mut vec![0u64; v.len()], bits);
            let mut expected = v;
            expected.sort_by_key(key); // stable
            prop_assert_eq!(got, expected);
        }

        #[test]
        fn sorts_stably_by_top_bits(v in prop::collection::vec((any::<u64>(), any::<u32>()), 0..500), bits in 1u32..27) {
            let mut got = v.clone();
            sort_by_top(&mut got, &mut Vec::new(), bits);
            let mut expected = v;
            expected.sort_by_key(|x| x.0 >> (64 - bits)); // stable
            prop_assert_eq!(got, expected);
        }
    }
}
