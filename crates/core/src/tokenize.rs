//! Tokenizers: Unicode words (UAX #29), jieba, characters, and `auto`.

use std::sync::OnceLock;

use jieba_rs::Jieba;
use unicode_segmentation::UnicodeSegmentation;

use crate::config::{MAX_WIDTH, Tokenizer};
use crate::normalize::{is_alphanumeric, is_han, next_non_ascii};

mod scan;

/// The shared jieba segmenter, loaded once (about a quarter of a second) on first use.
pub fn jieba() -> &'static Jieba {
    static JIEBA: OnceLock<Jieba> = OnceLock::new();
    JIEBA.get_or_init(Jieba::new)
}

/// Calls `emit` for each token of `text`, in order.
pub fn for_each_token<'a, F: FnMut(&'a str)>(tokenizer: Tokenizer, text: &'a str, emit: &mut F) {
    match tokenizer {
        Tokenizer::Words => words(text, emit),
        Tokenizer::Jieba => jieba_words(text, emit),
        Tokenizer::Chars => chars(text, emit),
        Tokenizer::Auto => auto(text, emit),
    }
}

/// Unicode words (UAX #29 word boundaries, keeping the segments that hold a
/// letter or digit, as `unicode_words` does), with an exact fast path for ASCII.
pub fn words<'a, F: FnMut(&'a str)>(text: &'a str, emit: &mut F) {
    if text.is_ascii() {
        ascii_words(text, emit);
        return;
    }
    // UAX #29 always breaks between a space and a following ASCII character that
    // is not a space (no rule joins across it: ASCII has no Extend, Format or ZWJ
    // characters), and no rule looks past such a space. So the text splits there
    // into pieces segmented independently: long stretches of ASCII and common
    // punctuation on the fast path, and around each other character the piece
    // between two such breaks through `unicode-segmentation`.
    //
    // A Han character (Word_Break Other) is a word by itself, with the
    // Extend, Format and ZWJ characters after it (WB4): every rule breaks
    // before one, and after one unless such a character follows, and no rule
    // that looks two characters away matches across one. So the text also
    // splits before each Han character, and after one followed by ASCII,
    // another Han character or a known punctuation mark: Chinese text is
    // cut a character at a time without `unicode-segmentation`.
    let b = text.as_bytes();
    let n = b.len();
    let is_break = |i: usize| {
        i > 0
            && i < n
            && ((b[i - 1] == b' ' && b[i].is_ascii() && b[i] != b' ') || han_at(text, i).is_some())
    };
    let mut pos = 0;
    while pos < n {
        let Some(k) = next_unknown(b, pos) else {
            fast_words(&text[pos..], emit);
            return;
        };
        let start = match han_at(text, k) {
            Some(c) => {
                if k > pos {
                    fast_words(&text[pos..k], emit);
                    pos = k;
                }
                let after = k + c.len_utf8();
                let plain = after == n
                    || b[after].is_ascii()
                    || known_punct(&b[after..])
                    || han_at(text, after).is_some();
                if plain {
                    if is_alphanumeric(c) {
                        emit(&text[k..after]);
                    }
                    pos = after;
                    continue;
                }
                k
            }
            // The last break at or before k.
            None => (pos + 1..=k).rev().find(|&i| is_break(i)).unwrap_or(pos),
        };
        if start > pos {
            fast_words(&text[pos..start], emit);
        }
        // The first break after k.
        let end = (k + 1..n).find(|&i| is_break(i)).unwrap_or(n);
        text[start..end].unicode_words().for_each(&mut *emit);
        pos = end;
    }
}

/// The Han character starting at byte `i` of `text`, if one does.
#[inline]
fn han_at(text: &str, i: usize) -> Option<char> {
    // Han characters are three or four bytes long, from lead byte 0xE3.
    let lead = *text.as_bytes().get(i)?;
    if lead < 0xE3 || !text.is_char_boundary(i) {
        return None;
    }
    text[i..].chars().next().filter(|&c| is_han(c))
}

/// The first non-ASCII character at or after `pos` that the fast tokenizer does
/// not know.
fn next_unknown(b: &[u8], mut pos: usize) -> Option<usize> {
    while let Some(k) = next_non_ascii(b, pos) {
        if !known_punct(&b[k..]) {
            return Some(k);
        }
        pos = k + 3;
    }
    None
}

/// Is `b` the start of a common typographic punctuation mark that the fast
/// tokenizer knows? ‘ ’ (UAX #29 MidNumLet, like `'`), and – — “ ” … (Other).
#[inline]
fn known_punct(b: &[u8]) -> bool {
    matches!(
        b,
        [
            0xE2,
            0x80,
            0x98 | 0x99 | 0x93 | 0x94 | 0x9C | 0x9D | 0xA6,
            ..
        ]
    )
}

fn jieba_words<'a, F: FnMut(&'a str)>(text: &'a str, emit: &mut F) {
    for chunk in Chunks::new(text, JIEBA_CHUNK) {
        for token in jieba().cut(chunk, true) {
            if token.word.chars().any(|c| is_han(c) || is_alphanumeric(c)) {
                emit(token.word);
            }
        }
    }
}

/// jieba returns a `Vec` of a whole input's tokens; feeding it pieces of about
/// this many bytes keeps memory flat on huge documents.
const JIEBA_CHUNK: usize = 1 << 16;

/// Pieces of `text` of about `target` bytes, cut after a character that is
/// neither a letter nor a digit (punctuation, a space) where one is near, so
/// that no word is cut in two; otherwise at a character boundary.
struct Chunks<'a> {
    rest: &'a str,
    target: usize,
}

impl<'a> Chunks<'a> {
    fn new(text: &'a str, target: usize) -> Self {
        Chunks { rest: text, target }
    }
}

impl<'a> Iterator for Chunks<'a> {
    type Item = &'a str;
    fn next(&mut self) -> Option<&'a str> {
        if self.rest.is_empty() {
            return None;
        }
        if self.rest.len() <= 2 * self.target {
            return Some(std::mem::take(&mut self.rest));
        }
        let mut cut = self.target;
        while !self.rest.is_char_boundary(cut) {
            cut += 1;
        }
        let window = &self.rest[cut..];
        let soft = window
            .char_indices()
            .take_while(|&(i, _)| i < self.target)
            .find(|&(_, c)| !is_alphanumeric(c))
            .map(|(i, c)| cut + i + c.len_utf8());
        let cut = soft.unwrap_or(cut);
        let (head, tail) = self.rest.split_at(cut);
        self.rest = tail;
        Some(head)
    }
}

fn chars<'a, F: FnMut(&'a str)>(text: &'a str, emit: &mut F) {
    for (i, c) in text.char_indices() {
        if is_alphanumeric(c) {
            emit(&text[i..i + c.len_utf8()]);
        }
    }
}

/// Per script run: Han runs go to jieba, everything else to Unicode words.
fn auto<'a, F: FnMut(&'a str)>(text: &'a str, emit: &mut F) {
    if text.is_ascii() {
        ascii_words(text, emit);
        return;
    }
    // Only non-ASCII characters can be Han: skip ASCII eight bytes at a time.
    let b = text.as_bytes();
    let mut run_start = 0;
    let mut in_han = false;
    let mut pos = 0;
    while let Some(k) = next_non_ascii(b, pos) {
        if in_han && k > pos {
            // ASCII between two non-ASCII characters ends a Han run.
            flush_run(&text[run_start..pos], true, emit);
            run_start = pos;
            in_han = false;
        }
        let c = text[k..].chars().next().expect("a character boundary");
        let han = is_han(c);
        if han != in_han {
            flush_run(&text[run_start..k], in_han, emit);
            run_start = k;
            in_han = han;
        }
        pos = k + c.len_utf8();
    }
    if in_han && pos < b.len() {
        flush_run(&text[run_start..pos], true, emit);
        run_start = pos;
        in_han = false;
    }
    flush_run(&text[run_start..], in_han, emit);
}

fn flush_run<'a, F: FnMut(&'a str)>(run: &'a str, han: bool, emit: &mut F) {
    if run.is_empty() {
        return;
    }
    if han {
        for chunk in Chunks::new(run, JIEBA_CHUNK) {
            for token in jieba().cut(chunk, true) {
                emit(token.word);
            }
        }
    } else {
        words(run, emit);
    }
}

/// UAX #29 words of ASCII text (rules WB5 to WB13b restricted to ASCII), keeping
/// only segments with a letter or digit. Checked against `unicode-segmentation`
/// by a property test.
#[inline]
pub fn ascii_words<'a, F: FnMut(&'a str)>(text: &'a str, emit: &mut F) {
    fast_words(text, emit)
}

/// UAX #29 words of text made of ASCII and [`known_punct`] characters.
#[inline]
fn fast_words<'a, F: FnMut(&'a str)>(text: &'a str, emit: &mut F) {
    let b = text.as_bytes();
    scan::for_each_word_span(b, &mut |start, end| {
        // Only a segment that starts with `_` can lack a letter or digit.
        if b[start] != b'_' || b[start..end].iter().any(|&c| c != b'_') {
            // A word starts at an ASCII byte and ends at the end of the text or
            // after an ASCII byte (`’` joins only when a letter or digit follows).
            debug_assert!(text.is_char_boundary(start) && text.is_char_boundary(end));
            // SAFETY: so both ends are character boundaries, and end <= len.
            emit(unsafe { text.get_unchecked(start..end) });
        }
    });
}

/// Character n-grams of `text`; a text shorter than `n` characters (but not
/// empty) is one feature.
pub fn char_ngrams<F: FnMut(&str) + ?Sized>(text: &str, n: usize, emit: &mut F) {
    if text.is_empty() {
        return;
    }
    if text.is_ascii() {
        let b = text.len();
        if b <= n {
            emit(text);
            return;
        }
        for i in 0..=b - n {
            emit(&text[i..i + n]);
        }
        return;
    }
    // A ring of the last n character starts: no allocation, whatever the size.
    let mut ring = [0usize; MAX_WIDTH];
    let mut count = 0usize;
    for (i, _) in text.char_indices() {
        if count >= n {
            emit(&text[ring[count % n]..i]);
        }
        ring[count % n] = i;
        count += 1;
    }
    if count >= n {
        emit(&text[ring[count % n]..]);
    } else {
        emit(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn collect(t: Tokenizer, s: &str) -> Vec<String> {
        let mut v = Vec::new();
        for_each_token(t, s, &mut |w| v.push(w.to_string()));
        v
    }

    /// A tokenizer under test.
    type Tokenize = fn(&str, &mut dyn FnMut(&str));

    /// `tokenize` gives exactly the words of `unicode-segmentation`.
    fn same_as_uax29(
        s: &str,
        tokenize: Tokenize,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let mut fast = Vec::new();
        tokenize(s, &mut |w| fast.push(w.to_owned()));
        let oracle: Vec<&str> = s.unicode_words().collect();
        prop_assert_eq!(fast, oracle);
        Ok(())
    }

    fn ascii(s: &str, f: &mut dyn FnMut(&str)) {
        ascii_words(s, &mut |w| f(w));
    }

    fn mixed(s: &str, f: &mut dyn FnMut(&str)) {
        words(s, &mut |w| f(w));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        /// The ASCII fast path, on UAX #29's interesting ASCII classes.
        #[test]
        fn ascii_words_match_uax29(s in "[a-cA-C0-2_:.',; \\-!\n\t]{0,40}") {
            same_as_uax29(&s, ascii)?;
        }

        /// The ASCII fast path on any printable ASCII.
        #[test]
        fn ascii_words_match_uax29_any_ascii(s in "[ -~\n\t]{0,60}") {
            same_as_uax29(&s, ascii)?;
        }

        /// Splitting mixed text at spaces never changes UAX #29 words.
        #[test]
        fn words_match_uax29_on_mixed_text(s in "[a-c0-1 .':\u{301}\u{200d}\u{a0}\u{3000}é中か😀\u{fe0f}\n‘’–—“”…]{0,30}") {
            same_as_uax29(&s, mixed)?;
        }

        /// Han text, cut a character at a time: ideographs of every range
        /// `is_han` takes (an unassigned one too), the marks that attach
        /// to one (WB4), Chinese punctuation, kana, Latin and digits.
        #[test]
        fn words_match_uax29_on_han_text(s in "[a-b0-1 .,'\u{301}\u{200d}\u{fe0f}\u{ad}中文\u{3400}\u{f900}\u{fa6e}\u{20000}\u{2fffd}，。「」カ😀‘”\n]{0,40}") {
            same_as_uax29(&s, mixed)?;
        }

        /// The fast tokenizer on ASCII with typographic punctuation.
        #[test]
        fn fast_words_match_uax29(s in "[a-b0-1.',:;_ ‘’–—“”…]{0,40}") {
            same_as_uax29(&s, mixed)?;
        }

        /// `auto` gives Han runs to jieba and the rest to words, as a character by
        /// character split does.
        #[test]
        fn auto_splits_runs_like_a_char_by_char_split(s in "[a-b .\n中文北京é’]{0,80}") {
            let mut fast = Vec::new();
            auto(&s, &mut |w| fast.push(w.to_owned()));
            let mut slow = Vec::new();
            let mut start = 0;
            let mut in_han = false;
            for (i, c) in s.char_indices() {
                if is_han(c) != in_han {
                    flush_run(&s[start..i], in_han, &mut |w: &str| slow.push(w.to_owned()));
                    start = i;
                    in_han = is_han(c);
                }
            }
            flush_run(&s[start..], in_han, &mut |w: &str| slow.push(w.to_owned()));
            prop_assert_eq!(fast, slow);
        }

        /// Long texts, whose words cross the tokenizer's 64-byte blocks.
        #[test]
        fn fast_words_match_uax29_across_blocks(s in "[a-bA0-1.',:;_ ‘’–—“”…\n]{0,400}") {
            same_as_uax29(&s, mixed)?;
        }
    }

    #[test]
    fn words_keep_contractions_and_numbers() {
        assert_eq!(
            collect(Tokenizer::Words, "Don't pay $3.50, e.g. at 10:30!"),
            ["Don't", "pay", "3.50", "e.g", "at", "10", "30"]
        );
    }

    #[test]
    fn jieba_cuts_chinese_and_keeps_english() {
        let t = collect(Tokenizer::Jieba, "我们中出了一个叛徒 rust 语言");
        assert!(t.contains(&"叛徒".to_string()), "{t:?}");
        assert!(t.contains(&"rust".to_string()), "{t:?}");
        assert!(!t.iter().any(|w| w.trim().is_empty()), "{t:?}");
    }

    #[test]
    fn auto_sends_han_runs_to_jieba_and_the_rest_to_words() {
        let t = collect(Tokenizer::Auto, "北京大学的 students' café 很好");
        assert!(t.contains(&"北京大学".to_string()), "{t:?}");
        assert!(t.contains(&"students".to_string()), "{t:?}");
        assert!(t.contains(&"café".to_string()), "{t:?}");
        assert!(
            t.contains(&"很".to_string()) || t.contains(&"很好".to_string()),
            "{t:?}"
        );
    }

    #[test]
    fn chunks_cover_the_text_and_respect_char_boundaries() {
        let text = "中文，English words; ".repeat(50);
        let parts: Vec<&str> = Chunks::new(&text, 37).collect();
        assert!(parts.len() > 5);
        assert_eq!(parts.concat(), text);
        for p in &parts[..parts.len() - 1] {
            assert!(!p.chars().last().unwrap().is_alphanumeric(), "{p:?}");
        }
    }

    #[test]
    fn chars_are_letters_and_digits() {
        assert_eq!(collect(Tokenizer::Chars, "a b,中1"), ["a", "b", "中", "1"]);
    }
}
