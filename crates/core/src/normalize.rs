//! Text normalisation: HTML stripping, NFKC, case folding, whitespace.

use caseless::Caseless;
use unicode_normalization::UnicodeNormalization;

use crate::config::NormalizeConfig;

/// Normalises `text` into `out` (cleared first) as `config` says.
///
/// ASCII text takes a fast path: NFKC is the identity on ASCII and case folding
/// is `to_ascii_lowercase`.
pub fn normalize_into(config: &NormalizeConfig, text: &str, out: &mut String, tmp: &mut String) {
    out.clear();
    let text = if config.html {
        strip_html(text, tmp);
        tmp.as_str()
    } else {
        text
    };
    if text.is_ascii() {
        normalize_ascii(config, text, out);
        return;
    }
    let mut ws = WhitespaceFolder::new(config.whitespace);
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

fn normalize_ascii(config: &NormalizeConfig, text: &str, out: &mut String) {
    let bytes = text.as_bytes();
    if !config.whitespace {
        out.push_str(text);
        if config.casefold {
            out.make_ascii_lowercase();
        }
        return;
    }
    let mut buf = std::mem::take(out).into_bytes();
    buf.reserve(bytes.len());
    let mut pending_space = false;
    for &b in bytes {
        if b.is_ascii_whitespace() || b == 0x0b {
            pending_space = !buf.is_empty();
            continue;
        }
        if pending_space {
            buf.push(b' ');
            pending_space = false;
        }
        buf.push(if config.casefold {
            b.to_ascii_lowercase()
        } else {
            b
        });
    }
    // Only ASCII bytes were pushed.
    *out = String::from_utf8(buf).expect("ASCII is UTF-8");
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

/// Is `c` a Han ideograph?
pub fn is_han(c: char) -> bool {
    matches!(c as u32,
        0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0x20000..=0x3FFFF)
}

/// Folds whitespace runs into one space, dropping them at the ends and between
/// a character of a spaceless script and another or a punctuation mark.
struct WhitespaceFolder {
    enabled: bool,
    pending: bool,
    last: Option<char>,
}

impl WhitespaceFolder {
    fn new(enabled: bool) -> Self {
        WhitespaceFolder {
            enabled,
            pending: false,
            last: None,
        }
    }

    #[inline]
    fn push(&mut self, c: char, out: &mut String) {
        if !self.enabled {
            out.push(c);
            return;
        }
        if c.is_whitespace() {
            self.pending = self.last.is_some();
            return;
        }
        if self.pending {
            self.pending = false;
            // Joined when one side is CJK and the other CJK or punctuation
            // (full-width punctuation is ASCII after NFKC): a hard wrap.
            let last = self.last.unwrap_or(' ');
            let cjk_or_punct = |c: char| is_spaceless_script(c) || !c.is_alphanumeric();
            let joined = (is_spaceless_script(last) || is_spaceless_script(c))
                && cjk_or_punct(last)
                && cjk_or_punct(c);
            if !joined {
                out.push(' ');
            }
        }
        out.push(c);
        self.last = Some(c);
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
