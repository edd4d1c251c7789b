//! The shared floor: helpers that several modules need and none owns
//! (scratch buffers let go after a very long document, the CPU features
//! chosen at run time). It imports nothing of the crate, so that two
//! modules that need the same helper never import each other.

use std::sync::OnceLock;

/// Bytes past which a scratch buffer is not kept for the next document.
pub(crate) const LONG_BUFFER: usize = 16 << 20;

/// Replaces `v` by an empty vector if it holds more than [`LONG_BUFFER`]
/// bytes.
pub(crate) fn let_go_if_long<T>(v: &mut Vec<T>) {
    if v.capacity() * std::mem::size_of::<T>() > LONG_BUFFER {
        *v = Vec::new();
    }
}

/// [`let_go_if_long`] for a string.
pub(crate) fn let_go_if_long_string(s: &mut String) {
    if s.capacity() > LONG_BUFFER {
        *s = String::new();
    }
}

/// Whether `NEARDUP_NO_AVX512` asks for the AVX-512 paths to be left out
/// (read once).
fn avx512_allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| std::env::var_os("NEARDUP_NO_AVX512").is_none())
}

/// Whether the CPU has AVX2.
#[inline]
pub(crate) fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU has AVX2 and FMA.
#[inline]
pub(crate) fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether population counts run eight words an instruction (AVX-512F and
/// VPOPCNTDQ), unless `NEARDUP_NO_AVX512` is set.
#[inline]
pub(crate) fn avx512_popcnt() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512_allowed()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vpopcntdq");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether byte masks of 64 lanes are available (AVX-512 BW), unless
/// `NEARDUP_NO_AVX512` is set.
#[inline]
pub(crate) fn avx512bw() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512_allowed() && std::arch::is_x86_feature_detected!("avx512bw");
    #[cfg(not(target_arch = "x86_64"))]
    false
}
