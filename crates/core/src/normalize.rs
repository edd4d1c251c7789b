//! Text normalisation: HTML stripping, NFKC, case folding, whitespace.

use caseless::Caseless;
use unicode_normalization::UnicodeNormalization;

use crate::config::NormalizeConfig;

/// Normalises `text` into `out` (cleared first) as `config` says.
///
/// Characters that NFKC and case folding leave alone (ASCII, whose letters only
/// lower-case; CJK ideographs, kana, Hangul syllables and a few punctuation
/// marks) are copied as bytes. Only runs of other characters, with the character
/// before them (a combining mark may compose with it), take the full Unicode
/// path; a property test checks that this equals the full path on whole texts.
pub fn normalize_into(config: &NormalizeConfig, text: &str, out: &mut String, tmp: &mut String) {
    let text = if config.html {
        strip_html(text, tmp);
        tmp.as_str()
    } else {
        text
    };
    out.clear();
    out.reserve(text.len());
    let mut ws = WhitespaceFolder::new(config);
    let bytes = text.as_bytes();
    let n = bytes.len();
    let mut i = 0;
    while i < n {
        // A run of ASCII up to the next non-ASCII byte.
        let k = next_non_ascii(bytes, i).unwrap_or(n);
        if k > i {
            // The last ASCII character stays behind if what follows may compose with it.
            let end = if k < n && simple_map(config, char_at(text, k)).is_none() {
                k - 1
            } else {
                k
            };
            ws.push_ascii(&text[i..end], out);
            i = end;
            if i == n {
                break;
            }
        }
        // A run of stable non-ASCII characters (CJK text, mostly) is copied
        // whole, except a last one that a combining character may follow.
        let run = stable_run(text, i);
        if run > i {
            ws.push_stable(&text[i..run], out);
            i = run;
            continue;
        }
        // A simple non-ASCII character followed by a simple one (or the end).
        let c = char_at(text, i);
        let len = c.len_utf8();
        if let Some(mapped) = simple_map(config, c)
            && (i + len >= n || simple_map(config, char_at(text, i + len)).is_some())
        {
            ws.push(mapped, out);
            i += len;
            continue;
        }
        // A segment for the full Unicode path: up to the next simple character.
        let mut j = i + len;
        while j < n {
            let c2 = char_at(text, j);
            if simple_map(config, c2).is_some() {
                break;
            }
            j += c2.len_utf8();
        }
        normalize_slow(config, &text[i..j], &mut ws, out);
        i = j;
    }
}

/// The end of the longest run of [`is_stable`] non-ASCII characters from `i`
/// each followed by a stable character or the end of the text (so that nothing
/// after the run composes with it): `i` if there is none.
#[inline]
fn stable_run(text: &str, i: usize) -> usize {
    let b = text.as_bytes();
    // `last`: where the last character taken into the run starts.
    let (mut j, mut last) = (i, i);
    while j < b.len() {
        let lead = b[j];
        if (0xE5..=0xE9).contains(&lead) {
            // U+5000 to U+9FFF: CJK unified ideographs, the bulk of Chinese text.
            last = j;
            j += 3;
            continue;
        }
        if lead < 0x80 {
            return j;
        }
        let c = char_at(text, j);
        if !is_stable(c) {
            // It may compose with the run's last character: leave that one to
            // the careful path.
            return last;
        }
        last = j;
        j += c.len_utf8();
    }
    j
}

/// The first byte at or after `pos` that is not ASCII, eight bytes at a time.
#[inline]
pub(crate) fn next_non_ascii(b: &[u8], mut pos: usize) -> Option<usize> {
    while let Some(chunk) = b.get(pos..pos + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let high = word & 0x8080_8080_8080_8080;
        if high != 0 {
            return Some(pos + high.trailing_zeros() as usize / 8);
        }
        pos += 8;
    }
    b.get(pos..)?
        .iter()
        .position(|&c| c >= 0x80)
        .map(|p| pos + p)
}

#[inline]
fn char_at(text: &str, i: usize) -> char {
    text[i..]
        .chars()
        .next()
        .expect("i is a character boundary inside text")
}

/// What NFKC and case folding make of `c`, for characters where that is one
/// character found without tables and `c` never composes with the character
/// before it: the [`is_stable`] ones (unchanged), full-width ASCII forms (their
/// ASCII character) and the ideographic space. `None` for all others.
#[inline]
fn simple_map(config: &NormalizeConfig, c: char) -> Option<char> {
    if is_stable(c) {
        return Some(c);
    }
    if !config.nfkc {
        return None;
    }
    match c as u32 {
        0xFF01..=0xFF5E => {
            let a = char::from_u32(c as u32 - 0xFEE0).expect("ASCII");
            Some(if config.casefold {
                a.to_ascii_lowercase()
            } else {
                a
            })
        }
        0x3000 => Some(' '),
        _ => None,
    }
}

/// Is `c` unchanged by NFKC and by case folding (ASCII letters aside, which only
/// lower-case), and never the second character of a canonical composition?
#[inline]
fn is_stable(c: char) -> bool {
    matches!(c as u32,
        0x00..=0x7F             // ASCII
        | 0x3001..=0x3002       // 、。
        | 0x300C..=0x300F       // 「」『』
        | 0x3041..=0x3096       // Hiragana letters (not the combining voicing marks)
        | 0x30A1..=0x30FA       // Katakana letters
        | 0x3400..=0x4DBF       // CJK extension A
        | 0x4E00..=0x9FFF       // CJK unified ideographs
        | 0xAC00..=0xD7A3       // Hangul syllables
        | 0x2010 | 0x2012..=0x2016 | 0x2018..=0x2023 | 0x2027 // dashes, quotes, bullets
        | 0x2190..=0x21FF       // arrows
        | 0x2500..=0x25FF       // box drawing, block elements, geometric shapes
        | 0x2600..=0x26FF       // miscellaneous symbols
    )
}

/// Is `c` left alone by normalisation (NFKC, case folding; ASCII letters aside,
/// which only lower-case) and outside the scripts whose whitespace folding joins
/// lines? Text made only of such characters tokenizes into words the same before
/// and after normalisation, up to ASCII case.
#[inline]
pub fn is_invariant(c: char) -> bool {
    c.is_ascii() || (is_stable(c) && !is_spaceless_script(c))
}

/// Is every character of `text` left alone by normalisation, up to ASCII case
/// ([`is_invariant`])? ASCII is skipped eight bytes at a time.
pub fn all_invariant(text: &str) -> bool {
    !any_non_ascii(text, |c| !is_invariant(c))
}

/// Does `pred` hold for a non-ASCII character of `text`? ASCII is skipped
/// eight bytes at a time.
#[inline]
pub(crate) fn any_non_ascii(text: &str, mut pred: impl FnMut(char) -> bool) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(k) = next_non_ascii(b, i) {
        let c = char_at(text, k);
        if pred(c) {
            return true;
        }
        i = k + c.len_utf8();
    }
    false
}

fn normalize_slow(
    config: &NormalizeConfig,
    text: &str,
    ws: &mut WhitespaceFolder,
    out: &mut String,
) {
    match (config.nfkc, config.casefold) {
        (true, true) => {
            // NFKC_Casefold in effect: NFKC, fold, NFKC again where folding
            // produced a decomposable sequence.
            text.chars()
                .nfkc()
                .default_case_fold()
                .nfkc()
                .for_each(|c| ws.push(c, out))
        }
        (true, false) => text.chars().nfkc().for_each(|c| ws.push(c, out)),
        (false, true) => text
            .chars()
            .default_case_fold()
            .for_each(|c| ws.push(c, out)),
        (false, false) => text.chars().for_each(|c| ws.push(c, out)),
    }
}

/// Is `c` a character of a script written without spaces between words, so that
/// whitespace between two of them is layout (a hard line break), not a separator?
pub fn is_spaceless_script(c: char) -> bool {
    matches!(c as u32,
        0x2E80..=0x2FDF      // CJK radicals, Kangxi
        | 0x3000..=0x303F    // CJK symbols and punctuation
        | 0x3040..=0x30FF    // Hiragana, Katakana
        | 0x3100..=0x312F    // Bopomofo
        | 0x31F0..=0x31FF    // Katakana extensions
        | 0x3400..=0x4DBF    // CJK extension A
        | 0x4E00..=0x9FFF    // CJK unified ideographs
        | 0xF900..=0xFAFF    // CJK compatibility ideographs
        | 0xFE30..=0xFE4F    // CJK compatibility forms
        | 0xFF00..=0xFF60    // full-width forms (punctuation left after NFKC)
        | 0x20000..=0x3FFFF  // CJK extensions B onwards
    )
}

/// Can whitespace folding change `text`'s words? Only by joining lines
/// between characters of scripts written without spaces
/// ([`is_spaceless_script`]), so text with no character of such a script, and
/// none that NFKC maps into one (enclosed and compatibility CJK, vertical and
/// half-width forms), has the same UAX #29 words (and word shingles) with and
/// without folding, which can then be skipped: it costs most of normalisation
/// on scraped text, whose whitespace comes in runs. (A superset is checked.)
pub fn folding_may_change_words(text: &str) -> bool {
    any_non_ascii(text, |c| {
        matches!(c as u32,
            0x2E80..=0xA4CF
            | 0xF900..=0xFAFF
            | 0xFE10..=0xFE1F
            | 0xFE30..=0xFE4F
            | 0xFF00..=0xFFEF
            | 0x1F200..=0x1F2FF
            | 0x20000..=0x3FFFF)
    })
}

/// `c.is_alphanumeric()`, without its table look-up for ASCII and for the
/// two main blocks of ideographs, every code point of which is a letter
/// (the look-up is a binary search, and Chinese text is mostly these).
#[inline]
pub fn is_alphanumeric(c: char) -> bool {
    match c as u32 {
        0..=0x7F => c.is_ascii_alphanumeric(),
        0x3400..=0x4DBF | 0x4E00..=0x9FFF => true,
        _ => c.is_alphanumeric(),
    }
}

/// Is `c` a Han ideograph?
pub fn is_han(c: char) -> bool {
    matches!(c as u32,
        0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0x20000..=0x3FFFF)
}

/// Folds whitespace runs into one space, dropping them at the ends and between
/// a character of a spaceless script and another or a punctuation mark; lower-cases
/// ASCII when case folding.
struct WhitespaceFolder {
    enabled: bool,
    casefold: bool,
    pending: bool,
    last: Option<char>,
}

impl WhitespaceFolder {
    fn new(config: &NormalizeConfig) -> Self {
        WhitespaceFolder {
            enabled: config.whitespace,
            casefold: config.casefold,
            pending: false,
            last: None,
        }
    }

    /// Before a non-space character `c`: the pending space, unless it is a hard
    /// wrap between CJK characters (or CJK and punctuation: full-width
    /// punctuation is ASCII after NFKC).
    #[inline]
    fn flush_pending(&mut self, c: char, out: &mut String) {
        if self.pending {
            self.pending = false;
            let last = self.last.unwrap_or(' ');
            let cjk_or_punct = |c: char| is_spaceless_script(c) || !is_alphanumeric(c);
            let joined = (is_spaceless_script(last) || is_spaceless_script(c))
                && cjk_or_punct(last)
                && cjk_or_punct(c);
            if !joined {
                out.push(' ');
            }
        }
    }

    /// ASCII text, the common case. Whitespace at either end of the run may touch
    /// CJK text and goes through [`Self::flush_pending`]; in the middle, chunks
    /// with only single spaces are copied whole and the others folded byte by byte.
    #[inline]
    fn push_ascii(&mut self, run: &str, out: &mut String) {
        let start = out.len();
        self.fold_ascii(run, out);
        if self.casefold {
            out[start..].make_ascii_lowercase();
        }
    }

    fn fold_ascii(&mut self, run: &str, out: &mut String) {
        if !self.enabled {
            out.push_str(run);
            return;
        }
        let is_ws = |b: u8| b == b' ' || (0x09..=0x0d).contains(&b);
        let b = run.as_bytes();
        let lead = b.iter().take_while(|&&c| is_ws(c)).count();
        if lead == b.len() {
            if lead > 0 {
                self.pending = self.last.is_some();
            }
            return;
        }
        let trail = b.iter().rev().take_while(|&&c| is_ws(c)).count();
        let mid = &run[lead..run.len() - trail];
        let mb = mid.as_bytes();
        if lead > 0 {
            self.pending = self.last.is_some();
        }
        if self.pending {
            self.flush_pending(mb[0] as char, out);
        }
        const CHUNK: usize = 16;
        let mut prev_ws = false;
        let mut k = 0;
        while k + CHUNK <= mb.len() {
            let chunk: &[u8; CHUNK] = mb[k..k + CHUNK].try_into().expect("exact chunk");
            let mut irregular = prev_ws && chunk[0] == b' ';
            for &c in chunk {
                irregular |= (0x09..=0x0d).contains(&c);
            }
            for j in 0..CHUNK - 1 {
                irregular |= chunk[j] == b' ' && chunk[j + 1] == b' ';
            }
            if irregular {
                fold_bytes(chunk, &mut prev_ws, out);
            } else {
                out.push_str(&mid[k..k + CHUNK]);
                prev_ws = chunk[CHUNK - 1] == b' ';
            }
            k += CHUNK;
        }
        fold_bytes(&mb[k..], &mut prev_ws, out);
        self.last = Some(mb[mb.len() - 1] as char);
        self.pending = trail > 0;
    }

    /// A run of stable non-ASCII characters, none of them whitespace, already
    /// normalised.
    #[inline]
    fn push_stable(&mut self, run: &str, out: &mut String) {
        let mut chars = run.chars();
        let first = chars.next().expect("a non-empty run");
        self.flush_pending(first, out);
        out.push_str(run);
        self.last = Some(chars.next_back().unwrap_or(first));
    }

    /// Any character, already normalised.
    #[inline]
    fn push(&mut self, c: char, out: &mut String) {
        if c.is_ascii() {
            let mut utf8 = [0u8; 1];
            // Case folding already happened on the paths that call this.
            self.fold_ascii(c.encode_utf8(&mut utf8), out);
            return;
        }
        if self.enabled && c.is_whitespace() {
            self.pending = self.last.is_some();
            return;
        }
        self.flush_pending(c, out);
        out.push(c);
        self.last = Some(c);
    }
}

/// Appends ASCII bytes with whitespace runs folded to one space.
#[inline]
fn fold_bytes(bytes: &[u8], prev_ws: &mut bool, out: &mut String) {
    debug_assert!(bytes.is_ascii());
    // SAFETY: only ASCII bytes are appended, so `out` stays UTF-8.
    let out = unsafe { out.as_mut_vec() };
    out.reserve(bytes.len());
    for &c in bytes {
        let ws = c == b' ' || (0x09..=0x0d).contains(&c);
        if !(ws && *prev_ws) {
            out.push(if ws { b' ' } else { c });
        }
        *prev_ws = ws;
    }
}

/// Removes HTML markup from `html` into `out`: tags and comments become
/// whitespace, `<script>` and `<style>` contents are dropped, entities are decoded.
/// Lenient, like a browser: unclosed tags and stray `<` never fail.
pub fn strip_html(html: &str, out: &mut String) {
    out.clear();
    let mut text = String::with_capacity(html.len());
    let bytes = html.as_bytes();
    let mut i = 0;
    let mut copied = 0;
    while let Some(off) = memchr::memchr(b'<', &bytes[i..]) {
        let start = i + off;
        let rest = &html[start..];
        // Only `<` followed by a letter, `/`, `!` or `?` opens markup.
        let opens = rest[1..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || matches!(c, '/' | '!' | '?'));
        if !opens {
            i = start + 1;
            continue;
        }
        text.push_str(&html[copied..start]);
        let end = if rest.starts_with("<!--") {
            rest.find("-->").map_or(html.len(), |e| start + e + 3)
        } else {
            let tag_end = rest.find('>').map_or(html.len(), |e| start + e + 1);
            let name: String = rest[1..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .map(|c| c.to_ascii_lowercase())
                .collect();
            if name == "script" || name == "style" {
                let close = format!("</{name}");
                find_ascii_case_insensitive(&html[tag_end..], &close)
                    .map(|e| {
                        let close_at = tag_end + e;
                        html[close_at..]
                            .find('>')
                            .map_or(html.len(), |g| close_at + g + 1)
                    })
                    .unwrap_or(html.len())
            } else {
                tag_end
            }
        };
        text.push(' ');
        i = end;
        copied = end;
    }
    text.push_str(&html[copied..]);
    out.push_str(&html_escape::decode_html_entities(&text));
}

fn find_ascii_case_insensitive(hay: &str, needle: &str) -> Option<usize> {
    let n = needle.len();
    hay.as_bytes()
        .windows(n)
        .position(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(config: NormalizeConfig, s: &str) -> String {
        let (mut out, mut tmp) = (String::new(), String::new());
        normalize_into(&config, s, &mut out, &mut tmp);
        out
    }

    #[test]
    fn ascii_and_unicode_paths_agree_on_ascii_semantics() {
        let c = NormalizeConfig::default();
        assert_eq!(norm(c, "  Hello,\n\tWORLD  "), "hello, world");
        // The same text with one non-ASCII character goes the slow way.
        assert_eq!(norm(c, "  Hello,\n\tWORLD é "), "hello, world é");
    }

    /// The shortcut agrees with the standard library on every code point.
    #[test]
    fn alphanumeric_shortcut_agrees_with_the_standard_library() {
        for c in (0..=0x10FFFF).filter_map(char::from_u32) {
            assert_eq!(is_alphanumeric(c), c.is_alphanumeric(), "{:04X}", c as u32);
        }
    }

    /// The reference: the whole text through the Unicode iterators.
    fn slow(config: NormalizeConfig, s: &str) -> String {
        let mut out = String::new();
        let mut ws = WhitespaceFolder::new(&config);
        normalize_slow(&config, s, &mut ws, &mut out);
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]
        #[test]
        fn fast_path_equals_full_unicode_path(
            s in "[a-zA-Z \n\u{300}\u{301}\u{308}éÉﬁＡ１中文か\u{3099}\u{309a}ｶﾞ가\u{11a8}Σς…\u{a0}“”—–、。，：（）！\u{3000}ｂ]{0,90}",
            nfkc: bool, casefold: bool, whitespace: bool,
        ) {
            let c = NormalizeConfig { html: false, nfkc, casefold, whitespace };
            proptest::prop_assert_eq!(norm(c, &s), slow(c, &s));
        }

        /// Long ASCII runs take the chunked path.
        #[test]
        fn chunked_ascii_equals_full_unicode_path(
            s in "([a-zA-Z,.]{1,9}( |  |\n|\t \r\n)){0,30}(é|中)?[a-zA-Z ]{0,40}",
            casefold: bool, whitespace: bool,
        ) {
            let c = NormalizeConfig { html: false, nfkc: true, casefold, whitespace };
            proptest::prop_assert_eq!(norm(c, &s), slow(c, &s));
        }
    }

    /// Every character `is_stable` accepts really is left alone by NFKC and case
    /// folding (ASCII only lower-cases): checked exhaustively.
    #[test]
    fn stable_characters_are_stable() {
        for c in (0..=0x10FFFFu32)
            .filter_map(char::from_u32)
            .filter(|&c| is_stable(c))
        {
            let s: String = std::iter::once(c)
                .nfkc()
                .default_case_fold()
                .nfkc()
                .collect();
            assert_eq!(s, c.to_ascii_lowercase().to_string(), "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn nfkc_and_case_folding() {
        let c = NormalizeConfig::default();
        // Full-width letters, a ligature, sharp s.
        assert_eq!(norm(c, "ＡＢＣ ﬁne Straße"), "abc fine strasse");
    }

    #[test]
    fn chinese_hard_wraps_vanish() {
        let c = NormalizeConfig::default();
        let wrapped = "中华人民共和国\n成立于一九四九年，\n  首都北京。";
        let flat = "中华人民共和国成立于一九四九年，首都北京。";
        assert_eq!(norm(c, wrapped), norm(c, flat));
        // Between a Han character and a Latin word the break stays a space.
        assert_eq!(norm(c, "使用\nRust 语言"), "使用 rust 语言");
    }

    #[test]
    fn html_is_stripped() {
        let mut out = String::new();
        strip_html(
            "<html><head><style>p{color:red}</style><script>var a=1<2;</script></head>\
             <body><p>Fish &amp; chips</p><!-- hidden --> a < b</body>",
            &mut out,
        );
        let c = NormalizeConfig::default();
        assert_eq!(norm(c, &out), "fish & chips a < b");
    }

    #[test]
    fn unclosed_markup_never_panics() {
        let mut out = String::new();
        for s in ["<", "<a", "<!--", "<script>x", "<p>é<", "&", "&#xZZ;"] {
            strip_html(s, &mut out);
        }
    }
}
