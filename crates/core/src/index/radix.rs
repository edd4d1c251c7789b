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

/// Sorts `f(x)` for every `x` of `src` into `out` by the top `bits` bits, stably,
/// without first materialising the mapped values: the first counting pass reads
/// `src` and maps on the fly. `out` and `tmp` (scratch) are as long as `src`.
pub fn sort_mapped_into<S: Copy + Sync, T: TopBits>(
    src: &[S],
    f: impl Fn(S) -> T + Copy,
    out: &mut [T],
    tmp: &mut [T],
    bits: u32,
) {
    debug_assert!((1..=26).contains(&bits));
    assert!(out.len() == src.len() && tmp.len() == src.len());
    if bits <= 13 {
        pass_mapped(src, f, out, bits, 0, bits);
        return;
    }
    let lo = bits / 2;
    pass_mapped(src, f, tmp, bits, 0, lo);
    pass(tmp, out, bits, lo, bits - lo);
}

/// [`pass`] over mapped values.
fn pass_mapped<S: Copy, T: TopBits>(
    src: &[S],
    f: impl Fn(S) -> T,
    dst: &mut [T],
    d: u32,
    shift: u32,
    width: u32,
) {
    let mask = (1u64 << width) - 1;
    let digit = |x: &T| ((x.top_bits(d) >> shift) & mask) as usize;
    let buckets = 1usize << width;
    let mut offsets = vec![0usize; buckets + 1];
    for &x in src {
        offsets[digit(&f(x)) + 1] += 1;
    }
    for b in 0..buckets {
        offsets[b + 1] += offsets[b];
    }
    for &x in src {
        let y = f(x);
        let slot = &mut offsets[digit(&y)];
        dst[*slot] = y;
        *slot += 1;
    }
}

/// One stable counting pass on digit `(top(d) >> shift) & (2^width - 1)`.
fn pass<T: TopBits>(src: &[T], dst: &mut [T], d: u32, shift: u32, width: u32) {
    let mask = (1u64 << width) - 1;
    let digit = |x: &T| ((x.top_bits(d) >> shift) & mask) as usize;
    let buckets = 1usize << width;
    let mut offsets = vec![0usize; buckets + 1];
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
        fn mapped_sort_equals_map_then_sort(v in prop::collection::vec(any::<u64>(), 0..500), bits in 1u32..27) {
            let f = |x: u64| x.rotate_left(13) ^ 0x5555;
            let mut got = vec![0u64; v.len()];
            sort_mapped_into(&v, f, &mut got, &mut vec![0u64; v.len()], bits);
            let mut expected: Vec<u64> = v.iter().map(|&x| f(x)).collect();
            expected.sort_by_key(|x| x >> (64 - bits));
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
