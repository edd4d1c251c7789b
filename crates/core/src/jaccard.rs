//! Exact set similarity: the features that confirm a candidate pair, Jaccard
//! similarity, and an exact all-pairs similarity join.
//!
//! A SimHash distance estimates the angle between two weighted feature vectors;
//! verification measures what people mean by a near-duplicate instead: the
//! Jaccard similarity of the two documents' sets of shingles, after the default
//! normalisation (NFKC, case folding, whitespace folding). Which shingles
//! depends on how the text is written:
//! - Text with spaces between words (English): word 3-shingles, words as UAX
//!   #29 finds them.
//! - Text of which at least one in fifty letters and digits is of a script
//!   written without spaces (Chinese, Japanese; about a tenth of its words, one
//!   such character carrying what a Latin word does; [`is_continuous`]):
//!   character 3-grams of its letters and digits, spaces, line breaks and
//!   punctuation left out. A break between two characters carries no meaning
//!   there, also inside the Latin words such text embeds: re-wrapping at a
//!   fixed width ("OPTION\nS"), joining lines without a space
//!   ("NAMEnetworkctl") or changing punctuation's width leaves the features as
//!   they are.
//!
//! Each shingle is hashed to 64 bits ([`shingles`]; the service's sketches
//! are made of these). Verification compares [`SetFeature`]s, the top 32
//! bits of those hashes ([`narrow`]), which halves what a corpus-scale dedup
//! writes to disk and reads back. Two documents of n and m shingles share a
//! feature by accident between shingles they do not share about n·m/2³²
//! times (0.02 for two documents of 10,000 shingles, some 60 KB of English
//! text each), and a document's own shingles merge into one feature about
//! n²/2³³ times; each accident moves the similarity by about 1/(n + m), so
//! the features' similarity differs from the shingles' by about
//! n·m/(2³²(n + m)) on average: 10⁻⁶ at 10,000 shingles each, 10⁻⁵ at
//! 100,000. Verification measures the features' similarity exactly; the
//! evaluation's ground truth (`neardup truth`) measures the 64-bit hashes'.

use std::fmt;
use std::str::FromStr;

use xxhash_rust::xxh3::{xxh3_64_with_seed, xxh3_128_with_seed};

use crate::config::NormalizeConfig;
use crate::error::Error;
use crate::normalize::{
    all_invariant, folding_may_change_words, is_spaceless_script, normalize_into,
};
use crate::tokenize::words;

/// Shingle width of the verification features.
pub const SHINGLE: usize = 3;

/// A verification feature: the top 32 bits of a shingle's 64-bit hash
/// ([`narrow`]; the module's documentation says what the width costs).
pub type SetFeature = u32;

/// The verification features of a set of shingle hashes (in any order,
/// repeats allowed), sorted and distinct, into `out` (cleared first): their
/// top 32 bits. Sorting the narrowed features, not the hashes, moves half
/// the bytes; the set is the same, since narrowing keeps the hashes' order.
pub fn narrow(shingles: &[u64], out: &mut Vec<SetFeature>) {
    out.clear();
    let n = shingles.len();
    let Some(bits) = spread_bits(n) else {
        out.extend(shingles.iter().map(|&h| (h >> 32) as SetFeature));
        sort_dedup_hashes(out);
        return;
    };
    // Narrowed as they are scattered: one pass less than narrowing first.
    HASH_SORT.with(|scratch| {
        let scratch = &mut *scratch.borrow_mut();
        let t = scratch.sorted(shingles, |h: &u64| (h >> 32) as SetFeature, bits);
        out.resize(n, 0);
        let kept = copy_distinct(t, out);
        out.truncate(kept);
        scratch.let_go_if_long();
    });
}

/// A verification rule: `jaccard:T` keeps a candidate pair when the Jaccard
/// similarity of the two documents' feature sets is at least T.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verify {
    pub threshold: f64,
}

impl Default for Verify {
    fn default() -> Self {
        Verify { threshold: 0.8 }
    }
}

impl FromStr for Verify {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || {
            Error::InvalidConfig(format!(
                "invalid verification {s:?}: expected jaccard:T with T between 0 and 1, e.g. jaccard:0.8"
            ))
        };
        // A bare threshold is Jaccard's, as the Python package takes it.
        let t = s.strip_prefix("jaccard:").unwrap_or(s);
        let threshold: f64 = t.parse().map_err(|_| bad())?;
        if !(0.0..=1.0).contains(&threshold) {
            return Err(bad());
        }
        Ok(Verify { threshold })
    }
}

impl fmt::Display for Verify {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "jaccard:{}", self.threshold)
    }
}

/// Texts of fewer words than this (Han characters count one each) are short:
/// a SimHash of a handful of features is unreliable, since one changed word
/// moves many bits.
pub const SHORT_TEXT_WORDS: usize = 25;

/// Is `text` shorter than [`SHORT_TEXT_WORDS`]? Counts runs of alphanumeric
/// characters, each Han character as one, and stops as soon as it knows.
/// ASCII is read a byte at a time without decoding; a character outside it
/// is decoded and classified on its own.
pub fn is_short(text: &str) -> bool {
    let bytes = text.as_bytes();
    let (mut words, mut in_word, mut i) = (0, false, 0);
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii() {
            let alphanumeric = b.is_ascii_alphanumeric();
            words += usize::from(alphanumeric && !in_word);
            in_word = alphanumeric;
            i += 1;
        } else {
            let c = text[i..].chars().next().expect("a character starts here");
            i += c.len_utf8();
            if crate::normalize::is_han(c) {
                words += 1;
                in_word = false;
            } else if crate::normalize::is_alphanumeric(c) {
                words += usize::from(!in_word);
                in_word = true;
            } else {
                in_word = false;
            }
        }
        if words >= SHORT_TEXT_WORDS {
            return false;
        }
    }
    true
}

/// Reusable buffers for [`shingles_with`].
#[derive(Debug, Default)]
pub struct ShingleScratch {
    norm: String,
    tmp: String,
    words: Vec<(usize, usize)>,
    key: Vec<u8>,
}

impl ShingleScratch {
    /// Lets go of the buffers one very long document grew (see
    /// `floor::let_go_if_long`).
    pub(crate) fn let_go_of_long(&mut self) {
        crate::floor::let_go_if_long_string(&mut self.norm);
        crate::floor::let_go_if_long_string(&mut self.tmp);
        crate::floor::let_go_if_long(&mut self.words);
        crate::floor::let_go_if_long(&mut self.key);
    }
}

/// The sorted, distinct hashes of `text`'s word 3-shingles (character 3-grams
/// of letters and digits for Chinese or Japanese text, see the module's
/// documentation). A text of one or two words (characters) has one shingle,
/// the whole text; an empty text has none.
pub fn shingles(text: &str) -> Vec<u64> {
    shingles_for(text, &NormalizeConfig::default())
}

/// [`shingles`] after the given normalisation (a pipeline's own, so that
/// `html: true` compares the pages' text, not their markup).
pub fn shingles_for(text: &str, normalize: &NormalizeConfig) -> Vec<u64> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<ShingleScratch> = Default::default();
    }
    let mut out = Vec::new();
    SCRATCH.with(|s| shingles_with(text, normalize, &mut s.borrow_mut(), &mut out));
    out
}

/// [`shingles_for`] into `out` (cleared first), reusing `scratch`.
pub fn shingles_with(
    text: &str,
    normalize: &NormalizeConfig,
    scratch: &mut ShingleScratch,
    out: &mut Vec<u64>,
) {
    shingles_keyed(text, normalize, ShingleKey::STORED, scratch, out)
}

/// How a word shingle becomes its hash. Only sets made with one key are
/// comparable; the key changes no similarity (a word holds neither joiner,
/// and 64-bit hashes of distinct shingles do not collide in practice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShingleKey {
    /// Its words joined by `joiner`, hashed by xxh3 with `seed`.
    Joined { joiner: u8, seed: u64 },
    /// Each word hashed by xxh3 with `seed` (64 bits, or the low 64 of its
    /// 128-bit form when `wide`), the shingle's word hashes then mixed in
    /// order ([`mix_words`]): a word is hashed once, not once in each of the
    /// three shingles that hold it, and no shingle is copied together
    /// (dedup's verification features; a fingerprint of xxh3-hashed words
    /// of the same width shares the words' hashes).
    Words { seed: u64, wide: bool },
}

impl ShingleKey {
    /// The key of [`shingles`] and [`shingles_for`], which the service's
    /// stored sketches were made with.
    pub const STORED: ShingleKey = ShingleKey::Joined {
        joiner: 0x1f,
        seed: 0,
    };
}

/// The word 3-shingles of [`ShingleKey::Words`], a word at a time: each
/// word hashed once, each shingle mixed from its three words' hashes.
pub(crate) struct WordShingles {
    seed: u64,
    wide: bool,
    last: [u64; 2],
    seen: usize,
}

impl WordShingles {
    /// The shingles of key [`ShingleKey::Words`] with `seed` and `wide`.
    pub(crate) fn new(seed: u64, wide: bool) -> Self {
        // Three words a shingle (a text of fewer words is one shingle).
        const _: () = assert!(SHINGLE == 3);
        WordShingles {
            seed,
            wide,
            last: [0; 2],
            seen: 0,
        }
    }

    /// The next word; the shingle it ends, if any, onto `out`.
    #[inline]
    pub(crate) fn word(&mut self, word: &[u8], out: &mut Vec<u64>) {
        let h = if self.wide {
            xxh3_128_with_seed(word, self.seed) as u64
        } else {
            xxh3_64_with_seed(word, self.seed)
        };
        self.hashed(h, out);
    }

    /// The next word by its hash (as [`WordShingles::word`] makes it).
    #[inline]
    pub(crate) fn hashed(&mut self, h: u64, out: &mut Vec<u64>) {
        if self.seen >= 2 {
            out.push(mix_words(&[self.last[0], self.last[1], h]));
        }
        self.last = [self.last[1], h];
        self.seen += 1;
    }

    /// A text of fewer words than a shingle is one shingle: all of them.
    pub(crate) fn finish(self, out: &mut Vec<u64>) {
        match self.seen {
            1 => out.push(mix_words(&self.last[1..])),
            2 => out.push(mix_words(&self.last)),
            _ => {}
        }
    }
}

/// A shingle's hash from its words' hashes, in order ([`ShingleKey::Words`]).
/// Each step (xor a word in, multiply by an odd constant, fold the high bits
/// down) is a bijection of the state, so shingles that differ in one word
/// never collide; a final avalanche spreads every input bit.
#[inline]
pub fn mix_words(words: &[u64]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15 ^ words.len() as u64;
    for &w in words {
        h = (h ^ w).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// [`shingles_with`], word shingles hashed with `key` (character shingles do
/// not depend on it).
pub fn shingles_keyed(
    text: &str,
    normalize: &NormalizeConfig,
    key_of: ShingleKey,
    scratch: &mut ShingleScratch,
    out: &mut Vec<u64>,
) {
    unsorted_shingles_keyed(text, normalize, key_of, scratch, out);
    sort_dedup_hashes(out);
}

/// [`shingles_keyed`]'s hashes as they are made: in text order, with
/// repeats (for [`narrow`], which sorts the narrowed features instead).
pub(crate) fn unsorted_shingles_keyed(
    text: &str,
    normalize: &NormalizeConfig,
    key_of: ShingleKey,
    scratch: &mut ShingleScratch,
    out: &mut Vec<u64>,
) {
    out.clear();
    let ShingleScratch {
        norm,
        tmp,
        words: spans,
        key,
    } = scratch;
    norm.clear();
    // Text that normalisation leaves alone up to ASCII case (and whitespace,
    // which words ignore) has the same words as its normal form: lower-case a
    // copy instead of normalising (as fingerprinting does). Neither that text
    // nor text whose folding cannot change its words has a character of a
    // spaceless script, so neither is read character by character.
    if !normalize.html && all_invariant(text) {
        norm.push_str(text);
        if normalize.casefold {
            norm.make_ascii_lowercase();
        }
    } else if normalize.whitespace && !normalize.html && !folding_may_change_words(text) {
        let unfolded = NormalizeConfig {
            whitespace: false,
            ..*normalize
        };
        normalize_into(&unfolded, text, norm, tmp);
    } else {
        normalize_into(normalize, text, norm, tmp);
        if char_shingles_if_continuous(norm, out) {
            return;
        }
    }
    word_shingles(norm, key_of, spans, key, out);
}

/// [`unsorted_shingles_keyed`] of a text normalised as it normalises it (as
/// the fingerprint of word features does, too), into `out` (cleared first).
pub(crate) fn shingles_of_normalized(
    norm: &str,
    key_of: ShingleKey,
    scratch: &mut ShingleScratch,
    out: &mut Vec<u64>,
) {
    out.clear();
    // Text normalised without whitespace folding, or left alone, has no
    // character of a spaceless script: the test holds for every branch.
    if char_shingles_if_continuous(norm, out) {
        return;
    }
    word_shingles(norm, key_of, &mut scratch.words, &mut scratch.key, out);
}

/// The hashes of the word 3-shingles of `norm`, in text order, onto `out`.
fn word_shingles(
    norm: &str,
    key_of: ShingleKey,
    spans: &mut Vec<(usize, usize)>,
    key: &mut Vec<u8>,
    out: &mut Vec<u64>,
) {
    let (joiner, seed) = match key_of {
        ShingleKey::Joined { joiner, seed } => (joiner, seed),
        ShingleKey::Words { seed, wide } => {
            let mut shingles = WordShingles::new(seed, wide);
            words(norm, &mut |w: &str| shingles.word(w.as_bytes(), out));
            shingles.finish(out);
            return;
        }
    };
    spans.clear();
    let base = norm.as_ptr() as usize;
    words(norm, &mut |w: &str| {
        let start = w.as_ptr() as usize - base;
        spans.push((start, start + w.len()));
    });
    let n = spans.len();
    if n == 0 {
        return;
    }
    let width = SHINGLE.min(n);
    out.reserve(n + 1 - width);
    for window in spans.windows(width) {
        key.clear();
        for (j, &(s, e)) in window.iter().enumerate() {
            if j > 0 {
                key.push(joiner);
            }
            key.extend_from_slice(&norm.as_bytes()[s..e]);
        }
        out.push(xxh3_64_with_seed(key, seed));
    }
}

/// [`sort_dedup_hashes`]' scratch, per thread: the scattered hashes (of
/// either width) and the buckets' offsets.
#[derive(Default)]
struct HashSort {
    scattered64: Vec<u64>,
    scattered32: Vec<u32>,
    offsets: Vec<u32>,
}

thread_local! {
    static HASH_SORT: std::cell::RefCell<HashSort> = Default::default();
}

/// The hashes [`sort_dedup_hashes`] sorts: shingle hashes and the features
/// narrowed from them, both spread evenly over their range.
trait SpreadHash: Copy + Ord + std::ops::Not<Output = Self> + Default + Into<u64> {
    /// Bits of a hash.
    const WIDTH: u32;

    /// This width's buffer in `scratch`.
    fn scattered(scratch: &mut HashSort) -> &mut Vec<Self>;

    /// The top `bits` bits (1 to 32).
    #[inline(always)]
    fn top(self, bits: u32) -> usize {
        (self.into() >> (Self::WIDTH - bits)) as usize
    }
}

impl SpreadHash for u64 {
    const WIDTH: u32 = 64;
    fn scattered(scratch: &mut HashSort) -> &mut Vec<u64> {
        &mut scratch.scattered64
    }
}

impl SpreadHash for u32 {
    const WIDTH: u32 = 32;
    fn scattered(scratch: &mut HashSort) -> &mut Vec<u32> {
        &mut scratch.scattered32
    }
}

/// Bits of the counting pass that sorts `n` spread hashes (a bucket or more
/// a hash, at most 2^14 of them: 64 KB of offsets), or `None` for
/// sets `sort_unstable` takes: small ones, and ones too large for the
/// offsets.
fn spread_bits(n: usize) -> Option<u32> {
    /// Buckets of the counting pass at most.
    const MAX_BITS: u32 = 14;
    if n < 64 || n > u32::MAX as usize {
        return None;
    }
    Some((usize::BITS - (n - 1).leading_zeros()).min(MAX_BITS))
}

impl HashSort {
    /// `map(x)` for each x of `src`, sorted, in this thread's
    /// buffer: one counting pass on the mapped values' top `bits` bits
    /// ([`spread_bits`]) leaves them nearly sorted, each out of place by a
    /// few positions within its bucket, and one insertion sort over the
    /// whole set finishes them. `map` must keep the order (a hash's top
    /// bits, a narrowing, keep it). Values that are not spread (one moved
    /// further than a few places) fall back to `sort_unstable`, which stays
    /// correct.
    fn sorted<S, T: SpreadHash>(&mut self, src: &[S], map: impl Fn(&S) -> T, bits: u32) -> &[T] {
        /// How far the insertion sort moves a hash before giving up on spread.
        const MAX_MOVE: usize = 32;
        let n = src.len();
        let mut offsets = std::mem::take(&mut self.offsets);
        offsets.clear();
        offsets.resize((1 << bits) + 1, 0);
        for x in src {
            offsets[map(x).top(bits) + 1] += 1;
        }
        for b in 0..1 << bits {
            offsets[b + 1] += offsets[b];
        }
        let scattered = T::scattered(self);
        if scattered.len() < n {
            scattered.resize(n, T::default());
        }
        let t = &mut scattered[..n];
        for x in src {
            let value = map(x);
            let slot = &mut offsets[value.top(bits)];
            t[*slot as usize] = value;
            *slot += 1;
        }
        self.offsets = offsets;
        let t = &mut T::scattered(self)[..n];
        for i in 1..n {
            let x = t[i];
            if t[i - 1] <= x {
                continue;
            }
            let mut j = i;
            while j > 0 && t[j - 1] > x && i - j < MAX_MOVE {
                t[j] = t[j - 1];
                j -= 1;
            }
            t[j] = x;
            if j > 0 && t[j - 1] > x {
                t.sort_unstable();
                break;
            }
        }
        t
    }

    /// Lets go of buffers one very long document grew, rather than keep
    /// them for the rest of the run.
    fn let_go_if_long(&mut self) {
        crate::floor::let_go_if_long(&mut self.scattered64);
        crate::floor::let_go_if_long(&mut self.scattered32);
    }
}

/// Copies sorted `t` into `out` (as long) without repeats; the count kept.
fn copy_distinct<T: Copy + PartialEq + std::ops::Not<Output = T>>(t: &[T], out: &mut [T]) -> usize {
    // Branch-free: about one hash in five of a document's shingles is a
    // repeat, at random.
    let mut kept = 0;
    let Some(&first) = t.first() else {
        return 0;
    };
    let mut last = !first;
    for &x in t {
        out[kept] = x;
        kept += usize::from(x != last);
        last = x;
    }
    kept
}

/// Sorts a document's feature hashes and removes repeats: [`HashSort::sorted`]
/// (about 0.4 of `sort_unstable`'s time on sets of 64 to 16,384 random
/// hashes), then a copy back that skips the repeats.
fn sort_dedup_hashes<T: SpreadHash>(v: &mut Vec<T>) {
    let n = v.len();
    let Some(bits) = spread_bits(n) else {
        v.sort_unstable();
        v.dedup();
        return;
    };
    HASH_SORT.with(|scratch| {
        let scratch = &mut *scratch.borrow_mut();
        let t = scratch.sorted(v, |&x: &T| x, bits);
        let kept = copy_distinct(t, v);
        v.truncate(kept);
        scratch.let_go_if_long();
    });
}

/// Is `norm` (normalised text) read character by character: is at least one
/// in [`CONTINUOUS_SHARE`] of its letters and digits in a script written
/// without spaces between words (Chinese, Japanese)? One such character
/// carries about what a word of five or six Latin letters does, so that is
/// about a tenth of the text's words. In such text a line break or a missing
/// space between two characters carries no meaning, also inside the Latin
/// words and paragraphs it embeds (commands, options, file names, English
/// passages typeset with the Chinese), so words are not a stable unit. The
/// share counts letters, not words, so that re-wrapping or joining lines,
/// which splits or merges words, never changes how a text is read.
pub fn is_continuous(norm: &str) -> bool {
    may_be_continuous(norm) && for_each_letter(norm, |_| {})
}

/// Calls `on_letter` with each of `norm`'s letters and digits, and says
/// whether it is continuous ([`is_continuous`]).
#[inline(always)]
fn for_each_letter(norm: &str, mut on_letter: impl FnMut(char)) -> bool {
    let (mut letters, mut spaceless) = (0usize, 0usize);
    for c in norm.chars() {
        // Every code point of the two main blocks of ideographs is a letter:
        // no table lookup for them, nor for ASCII.
        let (letter, of_spaceless) = match c as u32 {
            0..=0x7f => (c.is_ascii_alphanumeric(), false),
            0x3400..=0x4DBF | 0x4E00..=0x9FFF => (true, true),
            _ => {
                let letter = c.is_alphanumeric();
                (letter, letter && is_spaceless_script(c))
            }
        };
        if letter {
            on_letter(c);
            letters += 1;
            spaceless += usize::from(of_spaceless);
        }
    }
    spaceless > 0 && spaceless * CONTINUOUS_SHARE >= letters
}

/// False when `norm` cannot be continuous ([`is_continuous`]), judged from
/// its bytes in one vectorised pass: every character of a spaceless script
/// ([`is_spaceless_script`]) starts with a byte E2 to E9, EF or F0, and
/// every ASCII letter or digit is a letter or digit. Most text in a script
/// with spaces quotes a few Chinese or Japanese characters, if any, which
/// the exact count, character by character, need not look at.
fn may_be_continuous(norm: &str) -> bool {
    let (mut leads, mut ascii_letters) = (0usize, 0usize);
    for &b in norm.as_bytes() {
        leads += usize::from(matches!(b, 0xE2..=0xE9 | 0xEF | 0xF0));
        ascii_letters += usize::from(b.is_ascii_alphanumeric());
    }
    leads > 0 && leads * CONTINUOUS_SHARE >= ascii_letters
}

/// Text is read character by character when at least one in this many of its
/// letters and digits is of a script written without spaces.
pub const CONTINUOUS_SHARE: usize = 50;

/// If `norm` is continuous ([`is_continuous`]), the hashes (in text order)
/// of the [`SHINGLE`]-grams of its letters and digits onto `out` (empty),
/// everything else (spaces, line breaks, punctuation of any width) left
/// out: a re-wrap, a line joined without a space or a change of
/// punctuation leaves them as they are. A text of fewer letters than a
/// shingle is one shingle; none, none. Else `out` is left empty.
///
/// A shingle's code points (21 bits each) are packed into 63 bits, which a
/// bijective mix turns into its hash: distinct shingles never share one.
/// The shingles are made in the pass that decides (text with a character
/// of a spaceless script is nearly always continuous).
fn char_shingles_if_continuous(norm: &str, out: &mut Vec<u64>) -> bool {
    const _: () = assert!(SHINGLE * 21 <= 63);
    const MASK: u64 = (1 << (SHINGLE * 21)) - 1;
    debug_assert!(out.is_empty());
    if !may_be_continuous(norm) {
        return false;
    }
    let hash = |packed: u64| crate::rng::SplitMix64(packed).next();
    // (At most one letter a byte; most such text is three bytes a letter.)
    out.reserve(norm.len() / 3);
    let (mut packed, mut seen) = (0u64, 0usize);
    let continuous = for_each_letter(norm, |c| {
        packed = ((packed << 21) | u64::from(c)) & MASK;
        seen += 1;
        if seen >= SHINGLE {
            out.push(hash(packed));
        }
    });
    if !continuous {
        out.clear();
        return false;
    }
    if (1..SHINGLE).contains(&seen) {
        out.push(hash(packed));
    }
    true
}

/// The elements of the sets this module measures: shingle hashes (`u64`)
/// and verification features (`u32`, [`SetFeature`]), each merged eight or
/// sixteen at a time where the CPU has AVX-512.
pub trait SetElement: Copy + Ord + sealed::Sealed {
    /// The merge behind [`intersection`] (see [`merge`]).
    #[doc(hidden)]
    fn merge(a: &[Self], b: &[Self], need: usize) -> (usize, bool);
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
}

impl SetElement for u64 {
    fn merge(a: &[u64], b: &[u64], need: usize) -> (usize, bool) {
        #[cfg(target_arch = "x86_64")]
        if a.len() >= 8 && b.len() >= 8 && crate::floor::avx512_popcnt() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { x86::merge64(a, b, need) };
        }
        merge_from(a, b, (0, 0, 0), need)
    }
}

impl SetElement for u32 {
    fn merge(a: &[u32], b: &[u32], need: usize) -> (usize, bool) {
        #[cfg(target_arch = "x86_64")]
        if a.len() >= 16 && b.len() >= 16 && crate::floor::avx512_popcnt() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { x86::merge32(a, b, need) };
        }
        merge_from(a, b, (0, 0, 0), need)
    }
}

/// Size of the intersection of two sorted, distinct slices.
pub fn intersection<T: SetElement>(a: &[T], b: &[T]) -> usize {
    merge(a, b, 0).0
}

/// The merge behind [`intersection`]: returns the intersection size, or stops
/// early once the intersection cannot reach `need` and returns an upper bound
/// on it below `need`. The second value says whether the count is exact.
/// Where the CPU has AVX-512, a block of each side at a time.
fn merge<T: SetElement>(a: &[T], b: &[T], need: usize) -> (usize, bool) {
    T::merge(a, b, need)
}

/// [`merge`] from positions `i` of `a` and `j` of `b`, `n` common elements
/// counted before them, without branches on the data (a mispredicted branch
/// per element costs more than the comparison).
fn merge_from<T: Ord + Copy>(
    a: &[T],
    b: &[T],
    (mut i, mut j, mut n): (usize, usize, usize),
    need: usize,
) -> (usize, bool) {
    loop {
        // Check the bound once per stretch of 64 steps (cheap next to them).
        let most = n + (a.len() - i).min(b.len() - j);
        if most < need {
            return (most, false);
        }
        let stop = (i + 64).min(a.len());
        let stop_b = (j + 64).min(b.len());
        if i == stop || j == stop_b {
            return (n, true);
        }
        while i < stop && j < stop_b {
            let (x, y) = (a[i], b[j]);
            n += usize::from(x == y);
            i += usize::from(x <= y);
            j += usize::from(y <= x);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// A block merge for one element width: `$lanes` elements of each side
    /// at a time, every element of one block against every element of the
    /// other (the second block and its rotations), then past the block whose
    /// last element is the smaller (both when equal). Each set's elements
    /// being distinct, a common element is counted once, when the two blocks
    /// holding it meet, and they do meet: a block is passed only once the
    /// other side's block ends at or beyond it. The tails shorter than a
    /// block go to the scalar merge.
    macro_rules! block_merge {
        ($(#[$doc:meta])* $name:ident, $t:ty, $lanes:literal, $cmpeq:ident, $alignr:ident, [$($r:literal),*]) => {
            $(#[$doc])*
            ///
            /// # Safety
            /// The CPU must have AVX-512F.
            #[target_feature(enable = "avx512f")]
            pub(super) unsafe fn $name(a: &[$t], b: &[$t], need: usize) -> (usize, bool) {
                let (mut i, mut j, mut n) = (0usize, 0usize, 0usize);
                while i + $lanes <= a.len() && j + $lanes <= b.len() {
                    let most = n + (a.len() - i).min(b.len() - j);
                    if most < need {
                        return (most, false);
                    }
                    // SAFETY: a block from `i` and from `j` is in bounds.
                    let (x, y) = unsafe {
                        (
                            _mm512_loadu_si512(a.as_ptr().add(i).cast()),
                            _mm512_loadu_si512(b.as_ptr().add(j).cast()),
                        )
                    };
                    let equal = $cmpeq(x, y) $(| $cmpeq(x, $alignr::<$r>(y, y)))*;
                    n += equal.count_ones() as usize;
                    let (last_a, last_b) = (a[i + $lanes - 1], b[j + $lanes - 1]);
                    i += $lanes * usize::from(last_a <= last_b);
                    j += $lanes * usize::from(last_b <= last_a);
                }
                super::merge_from(a, b, (i, j, n), need)
            }
        };
    }

    block_merge!(
        /// [`super::merge`] of 64-bit hashes, eight of each side at a time
        /// (the second block and its seven rotations).
        merge64, u64, 8, _mm512_cmpeq_epu64_mask, _mm512_alignr_epi64,
        [1, 2, 3, 4, 5, 6, 7]
    );

    block_merge!(
        /// [`super::merge`] of 32-bit features, sixteen of each side at a
        /// time (the second block and its fifteen rotations).
        merge32, u32, 16, _mm512_cmpeq_epu32_mask, _mm512_alignr_epi32,
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    );
}

/// [`verified_jaccard`] when it is at least `threshold`; otherwise some value
/// below `threshold` (an upper bound, found without finishing the merge once
/// the threshold is out of reach, or from the sizes alone).
pub fn jaccard_at_least<T: SetElement>(a: &[T], b: &[T], threshold: f64) -> f64 {
    if a.is_empty() || b.is_empty() {
        return 0.0;
    }
    let (la, lb) = (a.len(), b.len());
    let by_size = la.min(lb) as f64 / la.max(lb) as f64;
    if by_size < threshold {
        return by_size;
    }
    // J = i / (la + lb - i) >= t  <=>  i >= t (la + lb) / (1 + t); one less
    // than that, rounded down, keeps the bound safe from rounding.
    let need =
        ((threshold * (la + lb) as f64 / (1.0 + threshold)).floor() as usize).saturating_sub(1);
    let (i, exact) = merge(a, b, need);
    let j = i as f64 / (la + lb - i) as f64;
    if exact || j < threshold {
        j
    } else {
        // Unreachable: the bound stopped below `need`, hence below the threshold.
        jaccard(a, b)
    }
}

/// Jaccard similarity |A ∩ B| / |A ∪ B| of two sorted, distinct slices; two
/// empty sets are identical (1.0).
pub fn jaccard<T: SetElement>(a: &[T], b: &[T]) -> f64 {
    if a.is_empty() && b.is_empty() {
        return 1.0;
    }
    let i = intersection(a, b);
    i as f64 / (a.len() + b.len() - i) as f64
}

/// The similarity verification uses: [`jaccard`], except that a document
/// without features (empty, or only spaces and punctuation) is similar to
/// nothing, not even to another such document, so that blank records are never
/// reported as near-duplicates.
pub fn verified_jaccard<T: SetElement>(a: &[T], b: &[T]) -> f64 {
    if a.is_empty() || b.is_empty() {
        0.0
    } else {
        jaccard(a, b)
    }
}

/// Every pair of sets with Jaccard similarity at least `threshold` (> 0), exact:
/// prefix filtering (Chaudhuri et al. 2006; Bayardo et al. 2007, "All-pairs")
/// only skips pairs that provably fall below the threshold, and each candidate
/// is measured exactly. Returns `(a, b, jaccard)` with `a < b`, sorted.
pub fn similarity_join(sets: &[&[u64]], threshold: f64) -> Vec<(u32, u32, f64)> {
    assert!(threshold > 0.0 && threshold <= 1.0, "threshold in (0, 1]");
    // Rank features rarest first, so that prefixes hold rare features.
    let mut all: Vec<u64> = sets.iter().flat_map(|s| s.iter().copied()).collect();
    all.sort_unstable();
    let mut freq: Vec<(u64, u32)> = Vec::new();
    for x in all {
        match freq.last_mut() {
            Some((v, c)) if *v == x => *c += 1,
            _ => freq.push((x, 1)),
        }
    }
    let mut by_rarity: Vec<usize> = (0..freq.len()).collect();
    by_rarity.sort_unstable_by_key(|&i| (freq[i].1, freq[i].0));
    let mut rank = vec![0u32; freq.len()];
    for (r, &i) in by_rarity.iter().enumerate() {
        rank[i] = r as u32;
    }
    let rank_of = |x: u64| rank[freq.binary_search_by_key(&x, |&(v, _)| v).unwrap()];
    let ranked: Vec<Vec<u32>> = sets
        .iter()
        .map(|s| {
            let mut r: Vec<u32> = s.iter().map(|&x| rank_of(x)).collect();
            r.sort_unstable();
            r
        })
        .collect();
    // Smaller sets first: each set then only needs the ones indexed before it.
    let mut order: Vec<u32> = (0..sets.len() as u32).collect();
    order.sort_by_key(|&i| (ranked[i as usize].len(), i));
    let mut postings: Vec<Vec<u32>> = vec![Vec::new(); freq.len()];
    let mut seen: Vec<u32> = vec![u32::MAX; sets.len()];
    let mut pairs = Vec::new();
    let mut empties: Vec<u32> = Vec::new();
    for &x in &order {
        let rx = &ranked[x as usize];
        if rx.is_empty() {
            // Empty sets are identical to each other and to nothing else.
            for &e in &empties {
                pairs.push((e.min(x), e.max(x), 1.0));
            }
            empties.push(x);
            continue;
        }
        // |x ∩ y| >= t|x ∪ y| >= t|x| needs a shared feature in the first
        // |x| - ceil(t|x|) + 1 features of x (and likewise of y).
        let prefix = rx.len() - (threshold * rx.len() as f64 - 1e-9).ceil() as usize + 1;
        let min_len = (threshold * rx.len() as f64 - 1e-9).ceil() as usize;
        for &feature in &rx[..prefix.min(rx.len())] {
            for &y in &postings[feature as usize] {
                if seen[y as usize] == x {
                    continue;
                }
                seen[y as usize] = x;
                if ranked[y as usize].len() < min_len {
                    continue;
                }
                let j = jaccard(sets[x as usize], sets[y as usize]);
                if j >= threshold {
                    pairs.push((x.min(y), x.max(y), j));
                }
            }
            postings[feature as usize].push(x);
        }
    }
    pairs.sort_unstable_by_key(|p| (p.0, p.1));
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn oracle(v: &[u64]) -> Vec<u64> {
        let mut w = v.to_vec();
        w.sort();
        w.dedup();
        w
    }

    proptest! {
        /// [`is_short`] against its definition, word by word: runs of
        /// letters and digits, each Han character one word of its own.
        #[test]
        fn is_short_counts_words_as_defined(
            pieces in prop::collection::vec(
                prop_oneof![
                    "[a-zA-Z0-9]{1,6}",
                    "[ ,.;_\\-\n\t]{1,3}",
                    "[\u{4e00}-\u{4e10}\u{3400}\u{f900}\u{20000}]{1,3}",
                    "[éßΩж٣ǅ〇ⅷ]{1,3}",
                    "[\u{2019}\u{201c}\u{3000}\u{ff0c}\u{1f600}]{1,2}",
                ],
                0..40,
            ),
        ) {
            let text: String = pieces.concat();
            let mut words = 0;
            let mut in_word = false;
            for c in text.chars() {
                if crate::normalize::is_han(c) {
                    words += 1;
                    in_word = false;
                } else if c.is_alphanumeric() {
                    words += usize::from(!in_word);
                    in_word = true;
                } else {
                    in_word = false;
                }
            }
            prop_assert_eq!(is_short(&text), words < SHORT_TEXT_WORDS, "{:?}", text);
        }
    }

    proptest! {
        // Shingles that differ in any one word, or only in order or length,
        // get different hashes (one word: never, the steps being bijections).
        #[test]
        fn mixed_word_hashes_tell_shingles_apart(a: u64, b: u64, c: u64, d: u64) {
            if c != d {
                prop_assert_ne!(mix_words(&[a, b, c]), mix_words(&[a, b, d]));
                prop_assert_ne!(mix_words(&[a, c, b]), mix_words(&[a, d, b]));
                prop_assert_ne!(mix_words(&[c, a, b]), mix_words(&[d, a, b]));
            }
            if a != b {
                prop_assert_ne!(mix_words(&[a, b, c]), mix_words(&[b, a, c]));
            }
            prop_assert_ne!(mix_words(&[a, b]), mix_words(&[a, b, c]));
            prop_assert_ne!(mix_words(&[a]), mix_words(&[a, b]));
        }
    }

    proptest! {
        /// Spread hashes, repeats, and values crowded into one bucket (small
        /// integers, one repeated value) all come out sorted and distinct.
        #[test]
        fn sort_dedup_hashes_sorts_and_dedups(
            spread in prop::collection::vec(any::<u64>(), 0..3000),
            small in prop::collection::vec(0u64..50, 0..400),
            repeats in 0usize..300,
        ) {
            let mut v = spread.clone();
            v.extend(&small);
            v.extend(spread.iter().take(repeats));
            v.extend(std::iter::repeat_n(u64::MAX, repeats));
            let want = oracle(&v);
            sort_dedup_hashes(&mut v);
            prop_assert_eq!(v, want);
        }
    }

    proptest! {
        /// Narrowing keeps the top halves, sorted and distinct, of hashes
        /// in any order and with repeats, however many hashes share one
        /// (small values all narrow to 0; a set crowded into few values
        /// takes the sort's fallback).
        #[test]
        fn narrow_keeps_distinct_top_halves(
            spread in prop::collection::vec(any::<u64>(), 0..2000),
            shared in prop::collection::vec((0u64..40, any::<u32>()), 0..200),
            repeats in 0usize..100,
        ) {
            let mut v = spread;
            v.extend(shared.iter().map(|&(hi, lo)| hi << 32 | u64::from(lo)));
            v.extend_from_within(..repeats.min(v.len()));
            let want: Vec<SetFeature> = v
                .iter()
                .map(|&h| (h >> 32) as u32)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let mut got = vec![7];
            narrow(&v, &mut got);
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn sort_dedup_hashes_handles_a_set_that_is_all_one_bucket() {
        let mut v: Vec<u64> = (0..5000u64).rev().chain(0..5000).collect();
        sort_dedup_hashes(&mut v);
        assert_eq!(v, (0..5000).collect::<Vec<_>>());
    }
}
