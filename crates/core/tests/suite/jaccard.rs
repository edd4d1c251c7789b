//! Verification features and the exact similarity join, against brute force.

use std::collections::BTreeSet;

use neardup_core::NormalizeConfig;
use neardup_core::jaccard::{Verify, jaccard, shingles, similarity_join};
use proptest::prelude::*;
use unicode_segmentation::UnicodeSegmentation;

/// Shingles as strings: lower-cased ASCII text, UAX #29 words, 3 at a time.
fn string_shingles(text: &str) -> BTreeSet<String> {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower.unicode_words().collect();
    if words.is_empty() {
        return BTreeSet::new();
    }
    words
        .windows(3.min(words.len()))
        .map(|w| w.join(" "))
        .collect()
}

fn string_jaccard(a: &BTreeSet<String>, b: &BTreeSet<String>) -> f64 {
    if a.is_empty() && b.is_empty() {
        return 1.0;
    }
    a.intersection(b).count() as f64 / a.union(b).count() as f64
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "the", "cat", "sat", "on", "mat", "The", "dog", "ran", "far", "a", "it's", "3.14",
        ]),
        0..30,
    )
    .prop_map(|w| w.join(" "))
}

/// Sets over a small alphabet, so that overlaps are common.
fn sets() -> impl Strategy<Value = Vec<Vec<u64>>> {
    prop::collection::vec(prop::collection::btree_set(0u64..24, 0..12), 0..40)
        .prop_map(|v| v.into_iter().map(|s| s.into_iter().collect()).collect())
}

proptest! {
    #[test]
    fn shingle_jaccard_equals_string_jaccard(a in text(), b in text()) {
        let (sa, sb) = (shingles(&a), shingles(&b));
        prop_assert_eq!(sa.len(), string_shingles(&a).len());
        let expected = string_jaccard(&string_shingles(&a), &string_shingles(&b));
        prop_assert!((jaccard(&sa, &sb) - expected).abs() < 1e-12);
    }

    #[test]
    fn join_equals_brute_force(sets in sets(), t in prop::sample::select(vec![0.1, 0.3, 0.5, 0.8, 0.9, 1.0])) {
        let refs: Vec<&[u64]> = sets.iter().map(|s| s.as_slice()).collect();
        let got = similarity_join(&refs, t);
        let mut want = Vec::new();
        for a in 0..sets.len() {
            for b in a + 1..sets.len() {
                let j = jaccard(&sets[a], &sets[b]);
                if j >= t {
                    want.push((a as u32, b as u32, j));
                }
            }
        }
        prop_assert_eq!(got, want);
    }
}

#[test]
fn chinese_shingles_are_character_trigrams() {
    // Punctuation is not a word; each ideograph is one: two trigrams, the
    // same as without the punctuation, one of them shared with a text that
    // holds only the first.
    let s = shingles("中文，文本。");
    assert_eq!(s.len(), 2);
    assert_eq!(s, shingles("中文文本"));
    assert!((jaccard(&s, &shingles("中文文")) - 0.5).abs() < 1e-12);
    // Hard-wrapped Chinese is the same text.
    assert_eq!(shingles("重复数据\n删除"), shingles("重复数据删除"));
}

#[test]
fn chinese_text_is_read_character_by_character() {
    // The Latin words inside Chinese text too: a line break inside a word, a
    // line joined without a space, full-width punctuation and CRLF line ends
    // leave the features as they are.
    let base =
        shingles("名称：networkctl 用于查询和修改网络设备 systemd-networkd 的 OPTIONS，状态。");
    for same in [
        "名称：\nnetworkctl 用于查询和修改网络设备 systemd-\nnetworkd 的 OPTION\nS，状态。",
        "名称:networkctl用于查询和修改网络设备systemd-networkd的OPTIONS,状态.",
        "名称：\r\nnetworkctl 用于查询和\r\n修改网络设备 systemd-networkd 的 ＯＰＴＩＯＮＳ，状态。",
    ] {
        assert_eq!(shingles(same), base, "{same:?}");
    }
    // 48 letters and digits, 46 trigrams, of which 5 repeat (net, etw, two,
    // wor, ork). A character changed: three of the 41 trigrams change.
    let edited =
        shingles("名称：networkctl 用于查询和修改网络设备 systemd-networkd 的 OPTIONZ，状态。");
    assert_eq!(base.len(), 41);
    assert!((jaccard(&base, &edited) - 38.0 / 44.0).abs() < 1e-12);
    // English keeps word shingles: a line break inside a word is a change,
    // also with one Chinese character in more than fifty letters.
    assert_ne!(
        shingles("the OPTIONS of the command"),
        shingles("the OPTION\nS of the command")
    );
    let english = "the options of the command are read from the configuration file first, 中";
    assert_ne!(
        shingles(english),
        shingles(&english.replace("options", "opt\nions"))
    );
    let mixed = "the options of the command are read from the file, 中文";
    assert_eq!(
        shingles(mixed),
        shingles(&mixed.replace("options", "opt\nions"))
    );
}

/// Text mostly in Chinese, with Latin words, digits, spaces, line breaks and
/// punctuation of both widths.
fn chinese() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "中", "文", "本", "网", "络", "设", "备", "的", "用", "于", "ls", "-la", "OPTIONS",
            "x86", "42", " ", "\n", "\r\n", "，", ",", "。", ".", "：", "（", ")",
        ]),
        1..40,
    )
    .prop_map(|w| w.concat())
}

/// Character 3-grams as strings, by the rule's own definition: the lower-cased
/// letters and digits, nothing else.
fn char_trigrams(text: &str) -> BTreeSet<String> {
    let letters: Vec<char> = text
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric())
        .collect();
    if letters.is_empty() {
        return BTreeSet::new();
    }
    letters
        .windows(3.min(letters.len()))
        .map(|w| w.iter().collect())
        .collect()
}

/// Is at least one in fifty of `t`'s letters and digits Chinese or
/// Japanese (Han, kana)?
fn continuous(t: &str) -> bool {
    let letters: Vec<char> = t.chars().filter(|c| c.is_alphanumeric()).collect();
    let han = letters
        .iter()
        .filter(|&&c| {
            ('\u{4e00}'..='\u{9fff}').contains(&c)
                || ('\u{3040}'..='\u{30ff}').contains(&c)
                || ('\u{f900}'..='\u{faff}').contains(&c)
                || ('\u{20000}'..='\u{3ffff}').contains(&c)
        })
        .count();
    han > 0 && han * 50 >= letters.len()
}

/// The words of `t`'s normal form (default normalisation), unless it is read
/// character by character.
fn words_of_normal_form(t: &str) -> Option<Vec<String>> {
    let (mut norm, mut tmp) = (String::new(), String::new());
    neardup_core::normalize::normalize_into(&NormalizeConfig::default(), t, &mut norm, &mut tmp);
    if continuous(&norm) {
        return None;
    }
    let mut words = Vec::new();
    neardup_core::tokenize::words(&norm, &mut |w: &str| words.push(w.to_owned()));
    Some(words)
}

/// `f` of every window of three items (of all of them when fewer), sorted
/// and distinct.
fn sorted_windows<T, U: Ord>(items: &[T], f: impl Fn(&[T]) -> U) -> Vec<U> {
    if items.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<U> = items.windows(3.min(items.len())).map(f).collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Latin text (accents; with or without typographic punctuation and
/// arrows, whose bytes also start characters of spaceless scripts) with a
/// few Chinese or Japanese characters, about as many as make one in fifty
/// letters.
fn latin_quoting_chinese() -> impl Strategy<Value = String> {
    let latin = |typographic: bool| {
        let mut pool = vec![
            "the ",
            "options ",
            "naïve ",
            "café ",
            "x86 ",
            "ｆｕｌｌ ",
            "\\n",
        ];
        if typographic {
            pool.extend(["— ", "→ ", "“quoted” ", "…", "①"]);
        }
        prop::collection::vec(prop::sample::select(pool), 0..300)
    };
    let spaceless = prop::sample::select(vec!["中", "文", "网", "ひ", "カ", "𠀀", "豈"]);
    (
        any::<bool>().prop_flat_map(latin),
        prop::collection::vec((any::<prop::sample::Index>(), spaceless), 0..12),
    )
        .prop_map(|(mut words, spaceless)| {
            for (at, c) in spaceless {
                let at = at.index(words.len() + 1);
                words.insert(at, c);
            }
            words.concat()
        })
}

proptest! {
    /// Whether text is read character by character is the one-in-fifty
    /// rule, also where Latin text quotes Chinese near that share.
    #[test]
    fn continuity_is_the_share_of_spaceless_letters(t in latin_quoting_chinese()) {
        let (mut norm, mut tmp) = (String::new(), String::new());
        neardup_core::normalize::normalize_into(&NormalizeConfig::default(), &t, &mut norm, &mut tmp);
        prop_assert_eq!(neardup_core::jaccard::is_continuous(&norm), continuous(&norm));
        if !continuous(&t) {
            let words = words_of_normal_form(&t).unwrap();
            prop_assert_eq!(shingles(&t).len(), sorted_windows(&words, |w| w.join(" ")).len());
        }
    }

    /// In text at least one in fifty of whose letters is Chinese, the features are character
    /// trigrams of letters and digits, whatever the spaces and punctuation.
    #[test]
    fn continuous_text_jaccard_equals_character_trigram_jaccard(a in chinese(), b in chinese()) {
        prop_assume!(continuous(&a) && continuous(&b));
        let (sa, sb) = (shingles(&a), shingles(&b));
        prop_assert_eq!(sa.len(), char_trigrams(&a).len());
        let expected = string_jaccard(&char_trigrams(&a), &char_trigrams(&b));
        prop_assert!((jaccard(&sa, &sb) - expected).abs() < 1e-12);
    }

    /// Line breaks and spaces put anywhere, or taken away, change nothing.
    #[test]
    fn continuous_text_ignores_where_lines_break(t in chinese(), cuts in prop::collection::vec((0usize..64, prop::sample::select(vec!["\n", " ", "\r\n", ""])), 0..6)) {
        prop_assume!(continuous(&t));
        let mut chars: Vec<String> = t.chars().filter(|c| !c.is_whitespace()).map(String::from).collect();
        let plain = chars.concat();
        for (at, ws) in cuts {
            let at = at % (chars.len() + 1);
            chars.insert(at, ws.to_owned());
        }
        prop_assert_eq!(shingles(&chars.concat()), shingles(&plain));
        prop_assert_eq!(shingles(&t), shingles(&plain));
    }
}

#[test]
fn verify_parses_and_rejects() {
    assert_eq!("jaccard:0.8".parse::<Verify>().unwrap().threshold, 0.8);
    // A bare threshold is Jaccard's, as every door takes it.
    assert_eq!("0.8".parse::<Verify>().unwrap().threshold, 0.8);
    for bad in ["jaccard:1.5", "cosine:0.8", "jaccard:", "1.5", "jaccard:x"] {
        let err = bad.parse::<Verify>().unwrap_err().to_string();
        assert!(err.contains("jaccard:0.8"), "{err}");
    }
}

/// Scraped-looking text: ASCII of both cases, runs of spaces, tabs and line
/// ends, typographic punctuation, accents, and characters that normalisation
/// changes (no-break space, full-width letters, a ligature) or that join lines
/// (Han).
fn messy() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "The",
            "quick",
            "BROWN",
            "fox",
            "  ",
            "\n",
            "\t",
            "\r\n",
            "’",
            "“",
            "”",
            "—",
            "→",
            "café",
            "naïve",
            "\u{a0}",
            "Ｆｕｌｌ",
            "ﬁle",
            "中文",
            "北京",
            "it's",
            "x86-64",
            "3.14",
        ]),
        0..40,
    )
    .prop_map(|w| w.join(" "))
}

proptest! {
    /// The shortcut for text that normalisation leaves alone gives the same
    /// shingles as normalising first, then splitting into words.
    #[test]
    fn shingles_equal_those_of_the_normalised_text(t in messy()) {
        use neardup_core::NormalizeConfig;
        use neardup_core::normalize::normalize_into;
        use xxhash_rust::xxh3::xxh3_64;
        let config = NormalizeConfig::default();
        let (mut norm, mut tmp) = (String::new(), String::new());
        normalize_into(&config, &t, &mut norm, &mut tmp);
        let mut words = Vec::new();
        neardup_core::tokenize::words(&norm, &mut |w: &str| words.push(w.to_owned()));
        let letters: Vec<char> = norm.chars().filter(|c| c.is_alphanumeric()).collect();
        let mut expected: Vec<u64> = if continuous(&norm) {
            // Read character by character: 3-grams of letters and digits, each
            // hashed as its code points packed 21 bits apart, SplitMix64-mixed.
            letters
                .windows(3.min(letters.len()))
                .map(|w| {
                    let packed = w.iter().fold(0u64, |p, &c| (p << 21) | c as u64);
                    let mut z = packed.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    z ^ (z >> 31)
                })
                .collect()
        } else if words.is_empty() {
            Vec::new()
        } else {
            words.windows(3.min(words.len())).map(|w| xxh3_64(w.join("\u{1f}").as_bytes())).collect()
        };
        expected.sort_unstable();
        expected.dedup();
        prop_assert_eq!(shingles(&t), expected);
    }

    /// With a joined key (words joined by a space, a seed), a word
    /// shingle's hash is xxh3 of its words joined by one space, whether or
    /// not the text already holds them that way.
    #[test]
    fn space_keyed_shingles_hash_the_words_joined_by_a_space(t in messy(), seed in any::<u64>()) {
        use neardup_core::jaccard::{ShingleKey, ShingleScratch, shingles_keyed};
        use xxhash_rust::xxh3::xxh3_64_with_seed;
        let words = words_of_normal_form(&t);
        prop_assume!(words.is_some());
        let words = words.unwrap();
        let expected = sorted_windows(&words, |w| xxh3_64_with_seed(w.join(" ").as_bytes(), seed));
        let mut got = Vec::new();
        let key = ShingleKey::Joined { joiner: b' ', seed };
        shingles_keyed(&t, &NormalizeConfig::default(), key, &mut ShingleScratch::default(), &mut got);
        prop_assert_eq!(got, expected);
    }

    /// With the pipeline's key (words hashed apart), a word shingle's hash
    /// is the mix of its words' xxh3 hashes (the low half of the 128-bit
    /// ones when wide), in order; and the sets hold the
    /// same shingles as with a joined key (one hash for one shingle).
    #[test]
    fn word_keyed_shingles_mix_the_words_hashes(t in messy(), seed in any::<u64>(), wide in any::<bool>()) {
        use neardup_core::jaccard::{ShingleKey, ShingleScratch, mix_words, shingles_keyed};
        use xxhash_rust::xxh3::{xxh3_64_with_seed, xxh3_128_with_seed};
        let words = words_of_normal_form(&t);
        prop_assume!(words.is_some());
        let words = words.unwrap();
        let hash = |w: &String| match wide {
            true => xxh3_128_with_seed(w.as_bytes(), seed) as u64,
            false => xxh3_64_with_seed(w.as_bytes(), seed),
        };
        let hashes: Vec<u64> = words.iter().map(hash).collect();
        let expected = sorted_windows(&hashes, mix_words);
        let mut got = Vec::new();
        let key = ShingleKey::Words { seed, wide };
        shingles_keyed(&t, &NormalizeConfig::default(), key, &mut ShingleScratch::default(), &mut got);
        prop_assert_eq!(&got, &expected);
        let distinct = sorted_windows(&words, |w| w.join(" "));
        prop_assert_eq!(got.len(), distinct.len());
    }
}
