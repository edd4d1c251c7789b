//! The `python-simhash` compatibility profile: the features of PyPI `simhash`
//! (`Simhash(text)` with its defaults), so that its fingerprints are reproduced
//! bit for bit.
//!
//! That library lower-cases the text, keeps the characters matched by
//! `[\w\u4e00-\u9fcc]+` (Python 3 `re`, Unicode `\w`) concatenated, and takes the
//! character 4-grams `s[i:i+4]` for `i in range(max(len(s) - 3, 1))`, so a text of
//! fewer than four such characters is one feature, the whole string, even empty.
//! Each feature is hashed with MD5, keeping the last 8 bytes big-endian, and
//! weighted by its count. [`crate::SimHasher`] does the hashing and weighting.

use unicode_general_category::{GeneralCategory as G, get_general_category};

const WIDTH: usize = 4;

/// Python's `\w` for `str` patterns: `str.isalnum()` or `_`. `isalnum` is true
/// for letters (categories L*) and for characters with a numeric value
/// (categories Nd, Nl, No; the Han numerals among them are letters already).
pub fn is_python_word_char(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphanumeric() || c == '_';
    }
    if ('\u{4e00}'..='\u{9fcc}').contains(&c) {
        return true;
    }
    matches!(
        get_general_category(c),
        G::UppercaseLetter
            | G::LowercaseLetter
            | G::TitlecaseLetter
            | G::ModifierLetter
            | G::OtherLetter
            | G::DecimalNumber
            | G::LetterNumber
            | G::OtherNumber
    )
}

/// Calls `emit` for each feature occurrence (a 4-gram, or the whole kept string
/// when it has fewer than four characters). `buf` is scratch space.
pub fn for_each_feature(text: &str, buf: &mut String, emit: &mut dyn FnMut(&str)) {
    buf.clear();
    // Python lower-cases the whole text first (final sigma depends on context),
    // then filters.
    if text.is_ascii() {
        buf.extend(
            text.bytes()
                .filter(|b| b.is_ascii_alphanumeric() || *b == b'_')
                .map(|b| b.to_ascii_lowercase() as char),
        );
    } else {
        buf.extend(
            text.to_lowercase()
                .chars()
                .filter(|&c| is_python_word_char(c)),
        );
    }
    // A text of fewer than four kept characters is one feature, even empty.
    if buf.is_empty() {
        emit("");
    } else {
        crate::tokenize::char_ngrams(buf, WIDTH, emit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(s: &str) -> Vec<String> {
        let mut v = Vec::new();
        for_each_feature(s, &mut String::new(), &mut |f| v.push(f.to_owned()));
        v
    }

    #[test]
    fn slides_like_the_python_library() {
        // 'How are you? I am fine.' -> 'howareyouiamfine' -> 13 4-grams.
        let f = features("How are you? I am fine.");
        assert_eq!(f.len(), "howareyouiamfine".len() - 3);
        assert_eq!(f[0], "howa");
        assert_eq!(f.last().unwrap(), "fine");
    }

    #[test]
    fn short_and_empty_texts_are_one_feature() {
        assert_eq!(features("ab!"), ["ab"]);
        assert_eq!(features("abcd"), ["abcd"]);
        assert_eq!(features("?!"), [""]);
        assert_eq!(features(""), [""]);
    }

    #[test]
    fn word_characters() {
        assert!(is_python_word_char('é'));
        assert!(is_python_word_char('中'));
        assert!(is_python_word_char('٣')); // Arabic-Indic digit (Nd)
        assert!(is_python_word_char('½')); // No
        assert!(!is_python_word_char('-'));
        assert!(!is_python_word_char('\u{0301}')); // combining acute (Mn)
        assert!(!is_python_word_char('。'));
    }
}
