//! UAX #29 words of ASCII text (and the typographic punctuation of
//! [`super::known_punct`]) 64 bytes at a time, with bit masks instead of a
//! branch per byte.
//!
//! A byte-at-a-time tokenizer mispredicts a branch at almost every word start
//! and end, since word lengths are random; on English that was most of its cost.
//! Here each 64-byte block becomes bit masks of byte classes (AVX2 when the CPU
//! has it, chosen at run time; a portable loop otherwise). The word bytes are
//! then one mask, computed with shifts, and the words are its runs, found by
//! walking the mask's transitions with `trailing_zeros`.
//!
//! Inside a word, ASCII letters, digits and `_` continue it by themselves; a
//! single `:` joins two letters; `.` and `'` join two letters or two digits; `,`
//! and `;` join two digits; `‘` and `’` (three bytes) join like `'`. Every other
//! byte ends a word. The input must hold only ASCII and the characters of
//! [`super::known_punct`] (all of them `E2 80 xx`, where only `‘ ’` have
//! `xx` = `98` or `99`): [`super::fast_words`] guarantees it.

/// Bit i of each mask describes byte i of a 64-byte block.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Masks {
    /// ASCII letters.
    letter: u64,
    /// ASCII digits.
    digit: u64,
    /// `_`.
    underscore: u64,
    /// `:`, `.`, `'`: join two letters.
    mid_letter: u64,
    /// `,`, `;`, `.`, `'`: join two digits.
    mid_num: u64,
    /// `E2`, the first byte of `‘` and `’` (and of the other known punctuation).
    e2: u64,
    /// `98` or `99`, the last byte of `‘` and `’`.
    quote_end: u64,
}

/// The byte masks of one block, one byte at a time.
fn classify_scalar(block: &[u8; 64]) -> Masks {
    let mut m = Masks::default();
    for (i, &b) in block.iter().enumerate() {
        let bit = 1u64 << i;
        match b {
            b'a'..=b'z' | b'A'..=b'Z' => m.letter |= bit,
            b'0'..=b'9' => m.digit |= bit,
            b'_' => m.underscore |= bit,
            b':' => m.mid_letter |= bit,
            b'.' | b'\'' => {
                m.mid_letter |= bit;
                m.mid_num |= bit;
            }
            b',' | b';' => m.mid_num |= bit,
            0xE2 => m.e2 |= bit,
            0x98 | 0x99 => m.quote_end |= bit,
            _ => {}
        }
    }
    m
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::Masks;

    /// The byte masks of one block, 32 bytes per instruction.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) unsafe fn classify(block: &[u8; 64]) -> Masks {
        // SAFETY: the two 32-byte loads stay inside the 64-byte block (unaligned
        // loads are allowed); AVX2 is the caller's promise.
        unsafe {
            let lo = _mm256_loadu_si256(block.as_ptr().cast());
            let hi = _mm256_loadu_si256(block.as_ptr().add(32).cast());
            let mask = |v: __m256i| _mm256_movemask_epi8(v) as u32 as u64;
            let both = |f: &dyn Fn(__m256i) -> __m256i| mask(f(lo)) | mask(f(hi)) << 32;
            // x in [start, start + len) as unsigned bytes: shift the range down to
            // the bottom of the signed range and compare once.
            let in_range = |x: __m256i, start: u8, len: u8| {
                let shifted =
                    _mm256_add_epi8(x, _mm256_set1_epi8(0x80u8.wrapping_sub(start) as i8));
                _mm256_cmpgt_epi8(_mm256_set1_epi8((0x80u8.wrapping_add(len)) as i8), shifted)
            };
            let eq = |x: __m256i, b: u8| _mm256_cmpeq_epi8(x, _mm256_set1_epi8(b as i8));
            let non_ascii = both(&|x| x);
            let (e2, quote_end) = if non_ascii == 0 {
                (0, 0)
            } else {
                (
                    both(&|x| eq(x, 0xE2)),
                    both(&|x| eq(_mm256_and_si256(x, _mm256_set1_epi8(0xFEu8 as i8)), 0x98)),
                )
            };
            let dot_or_quote = |x| _mm256_or_si256(eq(x, b'.'), eq(x, b'\''));
            Masks {
                letter: both(&|x| in_range(_mm256_or_si256(x, _mm256_set1_epi8(0x20)), b'a', 26)),
                digit: both(&|x| in_range(x, b'0', 10)),
                underscore: both(&|x| eq(x, b'_')),
                mid_letter: both(&|x| _mm256_or_si256(dot_or_quote(x), eq(x, b':'))),
                mid_num: both(&|x| {
                    _mm256_or_si256(dot_or_quote(x), _mm256_or_si256(eq(x, b','), eq(x, b';')))
                }),
                e2,
                quote_end,
            }
        }
    }
}

/// Calls `emit(start, end)` for the byte range of every word of `text` (see the
/// module documentation for what `text` may hold), in order, including words
/// made only of `_` (the caller drops those).
#[inline]
pub(super) fn for_each_word_span(text: &[u8], emit: &mut impl FnMut(usize, usize)) {
    #[cfg(target_arch = "x86_64")]
    if crate::floor::avx2() {
        // SAFETY: AVX2 was just detected.
        unsafe { scan_avx2(text, emit) };
        return;
    }
    scan(text, classify_scalar, emit);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scan_avx2(text: &[u8], emit: &mut impl FnMut(usize, usize)) {
    // SAFETY: this function runs only on CPUs with AVX2.
    scan(text, |b| unsafe { avx2::classify(b) }, emit);
}

/// The word spans of `text`, classifying blocks with `classify`.
#[inline(always)]
fn scan(text: &[u8], classify: impl Fn(&[u8; 64]) -> Masks, emit: &mut impl FnMut(usize, usize)) {
    let n = text.len();
    let blocks = n.div_ceil(64);
    // Block k's masks; the last, partial block is padded with zeros (not a word
    // byte, not a joiner), and blocks past the end are empty.
    let block = |k: usize| -> Masks {
        let start = k * 64;
        if start + 64 <= n {
            classify(text[start..start + 64].try_into().expect("64 bytes"))
        } else if start < n {
            let mut padded = [0u8; 64];
            padded[..n - start].copy_from_slice(&text[start..]);
            classify(&padded)
        } else {
            Masks::default()
        }
    };
    let (mut prev, mut cur) = (Masks::default(), block(0));
    // The previous block's word mask (its top bit continues into this block) and
    // the bits of this block that a `’` at the end of the previous one covers.
    let (mut prev_word, mut quote_carry) = (0u64, 0u64);
    let mut in_word = false;
    let mut start = 0usize;
    for k in 0..blocks {
        let next = block(k + 1);
        // Letters and digits just before and just after each byte.
        let letter_before = cur.letter << 1 | prev.letter >> 63;
        let letter_after = cur.letter >> 1 | next.letter << 63;
        let digit_before = cur.digit << 1 | prev.digit >> 63;
        let digit_after = cur.digit >> 1 | next.digit << 63;
        let joins = cur.mid_letter & letter_before & letter_after
            | cur.mid_num & digit_before & digit_after;
        // `‘`/`’` at p (bytes p..p+3) join the letters or digits at p-1 and p+3.
        let quote = cur.e2 & (cur.quote_end >> 2 | next.quote_end << 62);
        let letter_3_after = cur.letter >> 3 | next.letter << 61;
        let digit_3_after = cur.digit >> 3 | next.digit << 61;
        let quote_joins = quote & (letter_before & letter_3_after | digit_before & digit_3_after);
        let word = cur.letter
            | cur.digit
            | cur.underscore
            | joins
            | quote_joins
            | quote_joins << 1
            | quote_joins << 2
            | quote_carry;
        // A quote at bit 62 covers bit 0 of the next block; one at 63, bits 0 and 1.
        let q62 = quote_joins >> 62 & 1;
        let q63 = quote_joins >> 63;
        quote_carry = (q62 | q63) | q63 << 1;
        // Bits where the mask changes: alternately a word's start and its end.
        let mut changes = word ^ (word << 1 | prev_word >> 63);
        let base = k * 64;
        while changes != 0 {
            let pos = base + changes.trailing_zeros() as usize;
            if in_word {
                emit(start, pos);
            } else {
                start = pos;
            }
            in_word = !in_word;
            changes &= changes - 1;
        }
        prev_word = word;
        prev = cur;
        cur = next;
    }
    if in_word {
        emit(start, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spans_with(text: &str, classify: fn(&[u8; 64]) -> Masks) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        scan(text.as_bytes(), classify, &mut |s, e| v.push((s, e)));
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// The AVX2 classification equals the byte-at-a-time one on every byte.
        #[test]
        fn avx2_classes_match_scalar(block in prop::array::uniform32(any::<u8>()), block2 in prop::array::uniform32(any::<u8>())) {
            let mut b = [0u8; 64];
            b[..32].copy_from_slice(&block);
            b[32..].copy_from_slice(&block2);
            #[cfg(target_arch = "x86_64")]
            if crate::floor::avx2() {
                // SAFETY: AVX2 was just detected.
                prop_assert_eq!(unsafe { avx2::classify(&b) }, classify_scalar(&b));
            }
        }

        /// Both classifications give the same spans on long texts, across blocks.
        #[test]
        fn scans_agree(s in "[a-c0-2_:.',; \\-\n‘’–]{0,300}") {
            let scalar = spans_with(&s, classify_scalar);
            let mut fast = Vec::new();
            for_each_word_span(s.as_bytes(), &mut |a, b| fast.push((a, b)));
            prop_assert_eq!(fast, scalar);
        }
    }

    #[test]
    fn every_byte_value_is_classified_alike() {
        let mut b = [0u8; 64];
        for chunk in 0..4u8 {
            for (i, x) in b.iter_mut().enumerate() {
                *x = chunk * 64 + i as u8;
            }
            #[cfg(target_arch = "x86_64")]
            if crate::floor::avx2() {
                // SAFETY: AVX2 was just detected.
                assert_eq!(unsafe { avx2::classify(&b) }, classify_scalar(&b));
            }
        }
    }
}
