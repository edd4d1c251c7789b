//! Large arrays whose pages the kernel may back with 2 MiB huge pages.
//!
//! Building tables touches gigabytes of fresh memory; with 4 KiB pages that is a
//! page fault (and a zeroed page) per 4 KiB, which dominated build time here.
//! Where transparent huge pages are in `madvise` mode (the common default),
//! advising `MADV_HUGEPAGE` before the first touch makes it one fault per 2 MiB
//! and fewer TLB misses for the random probes of queries afterwards.

/// An empty `Vec` with room for `n` elements, advised for huge pages when large.
pub fn with_huge_capacity<T>(n: usize) -> Vec<T> {
    let v: Vec<T> = Vec::with_capacity(n);
    advise_huge(v.as_ptr().cast(), n * std::mem::size_of::<T>());
    v
}

/// `n` copies of `value`, in memory advised for huge pages, written by every
/// thread. The kernel zeroes a fresh page in the thread that first touches it;
/// on a large buffer that zeroing is most of the cost of the first write, and
/// this spreads it over the cores instead of leaving it to one.
pub fn filled_huge<T: Copy + Send + Sync>(n: usize, value: T) -> Vec<T> {
    use rayon::prelude::*;
    let mut v = with_huge_capacity(n);
    v.par_extend(rayon::iter::repeat_n(value, n));
    v
}

#[cfg(target_os = "linux")]
fn advise_huge(ptr: *const u8, bytes: usize) {
    const HUGE: usize = 2 << 20;
    if bytes < 2 * HUGE {
        return;
    }
    let start = (ptr as usize).div_ceil(HUGE) * HUGE;
    let end = (ptr as usize + bytes) / HUGE * HUGE;
    if end > start {
        // SAFETY: madvise only advises the kernel about pages of this process's own
        // allocation (the range lies within the Vec's capacity); MADV_HUGEPAGE
        // changes no contents and cannot invalidate memory. Failure is harmless.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_ptr: *const u8, _bytes: usize) {}

/// The allocation of `v` (its elements dropped), as an empty `Vec<B>` with room
/// for as many bytes: large scratch space passed from one stage to the next, so
/// that the next one does not fault in (and the kernel zero) fresh pages. Empty
/// with no capacity if the two element types do not fit the same allocation.
pub fn recycle<T: Copy, B: Copy>(mut v: Vec<T>) -> Vec<B> {
    use std::mem::{align_of, size_of};
    v.clear();
    if size_of::<B>() == 0
        || !size_of::<T>().is_multiple_of(size_of::<B>())
        || align_of::<T>() != align_of::<B>()
    {
        return Vec::new();
    }
    let words = v.capacity() * (size_of::<T>() / size_of::<B>());
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: the allocation came from the global allocator with T's alignment,
    // which is B's, and its size, capacity * size_of::<T>(), is exactly
    // words * size_of::<B>(); so it is a valid allocation of `words` B's. The
    // length is 0: no element is read before being written.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<B>(), 0, words) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_buffers_hold_their_value() {
        let v = filled_huge(5_000_000, (7u64, 3u32));
        assert_eq!(v.len(), 5_000_000);
        assert!(v.iter().all(|&x| x == (7, 3)));
    }

    #[test]
    fn recycled_allocations_keep_their_bytes_of_room() {
        let v: Vec<(u64, u32)> = vec![(1, 2); 1000];
        let cap = v.capacity();
        let mut w: Vec<u64> = recycle(v);
        assert_eq!(w.capacity(), 2 * cap);
        w.extend(0..2 * cap as u64);
        assert_eq!(w[2 * cap - 1], 2 * cap as u64 - 1);
        let none: Vec<u64> = recycle(vec![0u32; 10]);
        assert_eq!(none.capacity(), 0);
    }
}
