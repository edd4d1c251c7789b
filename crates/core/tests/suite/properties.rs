//! Property tests of the public fingerprinting API against slow, independent
//! reference implementations written here.

use neardup_core::{
    Features, Fingerprint, FingerprintConfig, HashFunction, SimHasher, Tokenizer, Weights, Width,
};
use proptest::prelude::*;
use std::collections::BTreeSet;
use unicode_segmentation::UnicodeSegmentation;

/// The textbook SimHash: V[i] += w if bit i of the feature's hash is 1, else -= w;
/// bit i is V[i] > 0.
fn textbook(features: &[(u128, f64)], width: Width) -> Fingerprint {
    let bits = width.bits() as usize;
    let mut v = vec![0.0f64; bits];
    for &(h, w) in features {
        for (i, vi) in v.iter_mut().enumerate() {
            if (h >> i) & 1 == 1 {
                *vi += w;
            } else {
                *vi -= w;
            }
        }
    }
    let mut value = 0u128;
    for (i, &x) in v.iter().enumerate() {
        if x > 0.0 {
            value |= 1 << i;
        }
    }
    Fingerprint::new(value, width)
}

fn reference_hash(bytes: &[u8], width: Width) -> u128 {
    match width {
        Width::W64 => xxhash_rust::xxh3::xxh3_64(bytes) as u128,
        Width::W128 => xxhash_rust::xxh3::xxh3_128(bytes),
    }
}

/// An independent pipeline for ASCII text: lower-case, UAX #29 words, shingles
/// joined by one space, term-frequency weights, xxh3.
fn reference_fingerprint(text: &str, features: Features, width: Width) -> Fingerprint {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower.unicode_words().collect();
    let feats: Vec<String> = match features {
        Features::Tokens => words.iter().map(|w| w.to_string()).collect(),
        Features::Shingles(w) if words.len() < w => {
            if words.is_empty() {
                vec![]
            } else {
                vec![words.join(" ")]
            }
        }
        Features::Shingles(w) => words.windows(w).map(|win| win.join(" ")).collect(),
        Features::Ngrams(n) => {
            let folded = lower.split_whitespace().collect::<Vec<_>>().join(" ");
            let chars: Vec<char> = folded.chars().collect();
            if chars.is_empty() {
                vec![]
            } else if chars.len() <= n {
                vec![folded]
            } else {
                chars.windows(n).map(|c| c.iter().collect()).collect()
            }
        }
    };
    let hashed: Vec<(u128, f64)> = feats
        .iter()
        .map(|f| (reference_hash(f.as_bytes(), width), 1.0))
        .collect();
    textbook(&hashed, width)
}

fn hasher(tokenizer: Tokenizer, features: Features, weights: Weights, width: Width) -> SimHasher {
    SimHasher::new(FingerprintConfig {
        tokenizer,
        features,
        weights,
        bits: width,
        ..Default::default()
    })
    .unwrap()
}

fn width_of(wide: bool) -> Width {
    if wide { Width::W128 } else { Width::W64 }
}

fn features_strategy() -> impl Strategy<Value = Features> {
    prop_oneof![
        Just(Features::Tokens),
        (1usize..5).prop_map(Features::Shingles),
        (1usize..6).prop_map(Features::Ngrams),
    ]
}

/// English-like text: words, punctuation, irregular spacing and line breaks.
fn english() -> impl Strategy<Value = String> {
    prop::collection::vec(
        (
            prop::sample::select(vec![
                "the",
                "The",
                "cat",
                "sat",
                "on",
                "a",
                "mat",
                "don't",
                "3.14",
                "U.S.A",
                "e-mail",
                "x_y",
                "_",
                "it's",
                "42",
                "Rust",
                "fast",
                "SLOW",
                "Pneumonoultramicroscopicsilicovolcanoconiosis",
                "antidisestablishmentarianism",
            ]),
            prop::sample::select(vec![
                " ",
                " ",
                " ",
                "  ",
                ", ",
                ".\n",
                "\t",
                "; ",
                " - ",
                "\r\n",
                // Scraped pages: no-break spaces and runs of layout whitespace.
                "\u{a0}",
                " \u{a0}\n   \n",
                "\n\n      ",
            ]),
        ),
        0..60,
    )
    .prop_map(|parts| parts.into_iter().flat_map(|(w, s)| [w, s]).collect())
}

/// Text in several scripts.
fn mixed() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "the ",
            "Cat ",
            "中华人民共和国",
            "成立了",
            "，",
            "。",
            "\n",
            "北京 ",
            "Café ",
            "naïve ",
            "ＡＢＣ ",
            "ﬁne ",
            "’s ",
            "“quoted” ",
            "— ",
            "東京",
            "かな",
            "한국어 ",
            "42 ",
            " ",
        ]),
        0..40,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// The whole fast pipeline equals an independent slow one on English text,
    /// at 64 and 128 bits.
    #[test]
    fn fast_pipeline_matches_independent_reference(
        text in english(), features in features_strategy(), wide: bool,
    ) {
        let width = width_of(wide);
        let h = hasher(Tokenizer::Words, features, Weights::Tf, width);
        prop_assert_eq!(h.fingerprint(&text), reference_fingerprint(&text, features, width));
    }

    /// `fingerprint` equals the textbook sum over the features `features` lists,
    /// for every tokenizer, feature kind, weighting and width.
    #[test]
    fn fingerprint_equals_its_listed_features(
        text in mixed(),
        tokenizer in prop::sample::select(vec![Tokenizer::Auto, Tokenizer::Words, Tokenizer::Jieba, Tokenizer::Chars]),
        features in features_strategy(),
        weights in prop::sample::select(vec![Weights::Tf, Weights::Binary]),
        top in prop::option::of(1usize..20),
        stopwords: bool,
        wide: bool,
    ) {
        let width = width_of(wide);
        let h = SimHasher::new(FingerprintConfig {
            tokenizer, features, weights, top, stopwords, bits: width, ..Default::default()
        }).unwrap();
        let listed: Vec<(u128, f64)> = h.features(&text).iter().map(|f| (f.hash, f.weight)).collect();
        prop_assert_eq!(h.fingerprint(&text), textbook(&listed, width));
        // And the listed hashes are the hashes of the listed texts.
        for f in h.features(&text) {
            prop_assert_eq!(f.hash, h.hash_feature(f.text.as_bytes()));
        }
    }

    /// Feature order does not matter; duplicates add up.
    #[test]
    fn weighted_features_order_does_not_matter(
        mut feats in prop::collection::vec(("[a-z]{1,6}", 1u32..10), 0..40), wide: bool, seed: u64,
    ) {
        let h = hasher(Tokenizer::Words, Features::Tokens, Weights::Tf, width_of(wide));
        let a = h.fingerprint_weighted(feats.iter().map(|(f, w)| (f.as_str(), *w as f64))).unwrap();
        // A deterministic shuffle.
        let n = feats.len();
        for i in (1..n).rev() {
            let j = (seed.wrapping_mul(i as u64 + 1) >> 7) as usize % (i + 1);
            feats.swap(i, j);
        }
        let b = h.fingerprint_weighted(feats.iter().map(|(f, w)| (f.as_str(), *w as f64))).unwrap();
        prop_assert_eq!(a, b);
        // Splitting a weight into two entries changes nothing either.
        let split = h.fingerprint_weighted(
            feats.iter().flat_map(|(f, w)| [(f.as_str(), *w as f64 / 2.0), (f.as_str(), *w as f64 / 2.0)])
        ).unwrap();
        prop_assert_eq!(a, split);
    }

    /// Scaling every weight by a positive constant changes nothing.
    #[test]
    fn scaling_weights_changes_nothing(
        feats in prop::collection::vec(("[a-z]{1,6}", 1u32..100), 0..40),
        scale in prop::sample::select(vec![0.5f64, 2.0, 3.0, 1024.0]),
        wide: bool,
    ) {
        let h = hasher(Tokenizer::Words, Features::Tokens, Weights::Tf, width_of(wide));
        let a = h.fingerprint_weighted(feats.iter().map(|(f, w)| (f.as_str(), *w as f64))).unwrap();
        let b = h.fingerprint_weighted(feats.iter().map(|(f, w)| (f.as_str(), *w as f64 * scale))).unwrap();
        prop_assert_eq!(a, b);
    }

    /// Deterministic, and a document is at distance 0 from itself and from a
    /// copy, whatever the configuration.
    #[test]
    fn deterministic_and_identical_inputs_give_zero(
        text in mixed(),
        hash in prop::sample::select(vec![HashFunction::Xxh3, HashFunction::Fnv1a, HashFunction::Md5, HashFunction::SipHash]),
        features in features_strategy(),
        wide: bool,
    ) {
        let config = FingerprintConfig { hash, features, bits: width_of(wide), ..Default::default() };
        let a = SimHasher::new(config.clone()).unwrap().fingerprint(&text);
        let b = SimHasher::new(config).unwrap().fingerprint(&text.clone());
        prop_assert_eq!(a.distance(b).unwrap(), 0);
        prop_assert_eq!(a.width(), width_of(wide));
    }

    /// Token weights of 1 each equal term-frequency features.
    #[test]
    fn token_list_equals_unit_weights(feats in prop::collection::vec("[a-z]{1,4}", 0..50), wide: bool) {
        let h = hasher(Tokenizer::Words, Features::Tokens, Weights::Tf, width_of(wide));
        let a = h.fingerprint_tokens(&feats);
        let b = h.fingerprint_weighted(feats.iter().map(|f| (f.as_str(), 1.0))).unwrap();
        prop_assert_eq!(a, b);
    }

    /// Random-hyperplane LSH on dense vectors: scale-invariant, and the negated
    /// vector has the complementary fingerprint (ties aside, which random
    /// real-valued vectors do not produce).
    #[test]
    fn dense_vectors_are_scale_invariant_and_negation_complements(
        v in prop::collection::vec(-1.0f32..1.0, 8..64), wide: bool,
    ) {
        let width = width_of(wide);
        let h = hasher(Tokenizer::Words, Features::Tokens, Weights::Tf, width);
        let a = h.fingerprint_dense(&v).unwrap();
        let scaled: Vec<f32> = v.iter().map(|x| x * 4.0).collect();
        prop_assert_eq!(a, h.fingerprint_dense(&scaled).unwrap());
        let neg: Vec<f32> = v.iter().map(|x| -x).collect();
        let b = h.fingerprint_dense(&neg).unwrap();
        prop_assert_eq!(a.distance(b).unwrap(), width.bits());
    }
}

#[test]
fn dense_fingerprints_estimate_angles() {
    // Two vectors at a known angle: the Hamming distance over 128 bits estimates
    // theta / pi; averaged over many seeds it is close.
    let theta = std::f64::consts::PI / 6.0;
    let dims = 64;
    let mut total = 0u32;
    let trials = 200;
    for seed in 0..trials {
        let h = SimHasher::new(FingerprintConfig {
            bits: Width::W128,
            seed,
            ..Default::default()
        })
        .unwrap();
        let mut a = vec![0f32; dims];
        let mut b = vec![0f32; dims];
        a[0] = 1.0;
        b[0] = theta.cos() as f32;
        b[1] = theta.sin() as f32;
        total += h
            .fingerprint_dense(&a)
            .unwrap()
            .distance(h.fingerprint_dense(&b).unwrap())
            .unwrap();
    }
    let estimate = total as f64 / (trials as f64 * 128.0) * std::f64::consts::PI;
    assert!(
        (estimate - theta).abs() < 0.05,
        "estimated angle {estimate}, true {theta}"
    );
}

#[test]
fn non_finite_weights_are_refused() {
    let h = SimHasher::new(FingerprintConfig::default()).unwrap();
    assert!(h.fingerprint_dense(&[1.0, f32::NAN]).is_err());
    assert!(h.fingerprint_weighted([("a", f64::INFINITY)]).is_err());
}

#[test]
fn empty_documents_have_the_zero_fingerprint() {
    for wide in [false, true] {
        let h = hasher(
            Tokenizer::Auto,
            Features::Shingles(3),
            Weights::Tf,
            width_of(wide),
        );
        for text in ["", "   \n\t", "!!! ??? ..."] {
            assert_eq!(h.fingerprint(text).value(), 0, "{text:?}");
        }
    }
}

#[test]
fn near_duplicates_are_closer_than_different_documents() {
    let h = SimHasher::new(FingerprintConfig::default()).unwrap();
    let base = "The harbour master opened the gates at dawn, and the fishing boats slipped out \
                one by one into the grey water. By noon the wind had turned, and the older captains \
                began to bring their crews home early.";
    let edited = base.replace("one by one", "one after another");
    let other = "To bake a simple loaf, mix five hundred grams of flour with ten grams of salt, \
                 seven grams of dried yeast and warm water, then knead the dough for ten minutes.";
    let (a, b, c) = (
        h.fingerprint(base),
        h.fingerprint(&edited),
        h.fingerprint(other),
    );
    assert!(a.distance(b).unwrap() < a.distance(c).unwrap());
    assert!(a.distance(c).unwrap() > 10);
}

/// Pairs of random unit vectors at exactly `theta` (Gaussian directions, the
/// second made orthogonal to the first, then rotated in by theta).
fn pairs_at(theta: f64, dims: usize, pairs: usize, seed: u64) -> Vec<(Vec<f64>, Vec<f64>)> {
    let mut rng = neardup_core::rng::SplitMix64(seed);
    let mut gauss = move || {
        let r = (-2.0 * rng.unit().ln()).sqrt();
        r * (std::f64::consts::TAU * rng.unit()).cos()
    };
    (0..pairs)
        .map(|_| {
            let a: Vec<f64> = (0..dims).map(|_| gauss()).collect();
            let mut r: Vec<f64> = (0..dims).map(|_| gauss()).collect();
            let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f64>();
            let proj = dot(&r, &a) / dot(&a, &a);
            r.iter_mut().zip(&a).for_each(|(x, y)| *x -= proj * y);
            let (na, nr) = (dot(&a, &a).sqrt(), dot(&r, &r).sqrt());
            let b = a
                .iter()
                .zip(&r)
                .map(|(x, y)| theta.cos() * x / na + theta.sin() * y / nr)
                .collect();
            (a.iter().map(|x| x / na).collect(), b)
        })
        .collect()
}

#[test]
fn mean_distance_is_within_three_standard_errors_of_the_angle() {
    // Each bit differs with probability theta / pi: over P pairs the mean
    // distance has standard error sqrt(f p (1 - p) / P).
    let pairs = 400;
    for degrees in [5.0f64, 30.0, 60.0, 90.0] {
        let theta = degrees.to_radians();
        let p = theta / std::f64::consts::PI;
        let set = pairs_at(theta, 256, pairs, degrees as u64);
        for width in [Width::W64, Width::W128] {
            let f = f64::from(width.bits());
            let se = (f * p * (1.0 - p) / pairs as f64).sqrt();
            let h = SimHasher::new(FingerprintConfig::vectors(width, None, 3)).unwrap();
            let dense: f64 = set
                .iter()
                .map(|(a, b)| {
                    let a: Vec<f32> = a.iter().map(|&x| x as f32).collect();
                    let b: Vec<f32> = b.iter().map(|&x| x as f32).collect();
                    let d = h
                        .fingerprint_dense(&a)
                        .unwrap()
                        .distance(h.fingerprint_dense(&b).unwrap());
                    f64::from(d.unwrap())
                })
                .sum::<f64>()
                / pairs as f64;
            assert!(
                (dense - f * p).abs() < 3.0 * se,
                "dense, {degrees} degrees, {f} bits: mean {dense}, expected {} +- {se}",
                f * p
            );
            let s = SimHasher::new(FingerprintConfig {
                bits: width,
                seed: 3,
                ..Default::default()
            })
            .unwrap();
            let sparse_fp = |v: &[f64]| {
                s.fingerprint_sparse(v.iter().enumerate().map(|(i, &x)| (i as u64 * 7919, x)))
                    .unwrap()
            };
            let sparse: f64 = set
                .iter()
                .map(|(a, b)| f64::from(sparse_fp(a).distance(sparse_fp(b)).unwrap()))
                .sum::<f64>()
                / pairs as f64;
            assert!(
                (sparse - f * p).abs() < 3.0 * se,
                "sparse, {degrees} degrees, {f} bits: mean {sparse}, expected {} +- {se}",
                f * p
            );
        }
    }
}

#[test]
fn vectors_and_features_refuse_other_documents() {
    use neardup_core::Input;
    let v = SimHasher::new(FingerprintConfig::vectors(Width::W64, Some(3), 0)).unwrap();
    assert!(v.fingerprint_input(Input::Vector(&[1.0, 2.0, 3.0])).is_ok());
    assert!(v.fingerprint_input(Input::Vector(&[1.0, 2.0])).is_err());
    assert!(
        v.fingerprint_input(Input::Text("three words here"))
            .is_err()
    );
    let f = SimHasher::new(FingerprintConfig::weighted_features(
        Width::W64,
        neardup_core::HashFunction::Xxh3,
        0,
    ))
    .unwrap();
    let a = [("x".to_string(), 1.0), ("y".to_string(), 2.0)];
    let b = [("y".to_string(), 2.0), ("x".to_string(), 1.0)];
    assert_eq!(
        f.fingerprint_input(Input::Features(&a)).unwrap(),
        f.fingerprint_input(Input::Features(&b)).unwrap()
    );
    assert!(f.fingerprint_input(Input::Vector(&[1.0])).is_err());
    // Text settings do not apply to vectors.
    let bad = FingerprintConfig {
        stopwords: true,
        ..FingerprintConfig::vectors(Width::W64, None, 0)
    };
    assert!(SimHasher::new(bad).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The early-stopping Jaccard (blocks of eight hashes or sixteen
    /// features where the CPU has AVX-512, the scalar merge elsewhere and for the tails) equals a
    /// textbook set computation whenever it reaches the threshold, and stays
    /// below the threshold whenever the exact value does.
    #[test]
    fn jaccard_at_least_agrees_with_sets(
        (a, b) in prop_oneof![
            (
                prop::collection::btree_set(0u64..400, 0..300),
                prop::collection::btree_set(0u64..400, 0..300),
            ),
            // Near copies (what verification mostly meets): one set, and the
            // same with a few hashes dropped and a few added, spread or not.
            (
                prop::collection::btree_set(prop_oneof![0u64..5000, any::<u64>()], 0..400),
                prop::collection::vec(any::<prop::sample::Index>(), 0..12),
                prop::collection::vec(prop_oneof![0u64..5000, any::<u64>()], 0..12),
            )
                .prop_map(|(a, drop, add)| {
                    let mut b = a.clone();
                    let listed: Vec<u64> = a.iter().copied().collect();
                    for d in drop {
                        if !listed.is_empty() {
                            b.remove(&listed[d.index(listed.len())]);
                        }
                    }
                    b.extend(add);
                    (a, b)
                }),
        ],
        t in prop::sample::select(vec![0.1, 0.5, 0.8, 0.95, 1.0]),
    ) {
        check_jaccard_at_least(&a, &b, t)?;
        // The same for 32-bit features (each hash's halves folded together,
        // so that the near copies' sets stay near copies).
        let fold = |s: &BTreeSet<u64>| -> BTreeSet<u32> {
            s.iter().map(|&x| x as u32 ^ (x >> 32) as u32).collect()
        };
        check_jaccard_at_least(&fold(&a), &fold(&b), t)?;
    }
}

/// [`jaccard_at_least_agrees_with_sets`] for one pair of sets.
fn check_jaccard_at_least<T: neardup_core::jaccard::SetElement + std::fmt::Debug>(
    a: &BTreeSet<T>,
    b: &BTreeSet<T>,
    t: f64,
) -> Result<(), TestCaseError> {
    use neardup_core::jaccard::{intersection, jaccard_at_least};
    let inter = a.intersection(b).count();
    let union = a.union(b).count();
    let (va, vb): (Vec<T>, Vec<T>) = (a.iter().copied().collect(), b.iter().copied().collect());
    prop_assert_eq!(intersection(&va, &vb), inter);
    let got = jaccard_at_least(&va, &vb, t);
    if va.is_empty() || vb.is_empty() {
        prop_assert_eq!(got, 0.0);
    } else {
        let exact = inter as f64 / union as f64;
        if exact >= t {
            prop_assert_eq!(got, exact);
        } else {
            prop_assert!(got < t, "{} for an exact {}", got, exact);
        }
    }
    Ok(())
}

/// A configuration from the parts that decide whether a fingerprint's features
/// are the verification shingles (the default pipeline) or not.
fn shingle_sharing_config() -> impl Strategy<Value = FingerprintConfig> {
    (
        prop::sample::select(vec![Tokenizer::Auto, Tokenizer::Words, Tokenizer::Jieba]),
        prop::sample::select(vec![
            Features::Shingles(3),
            Features::Shingles(2),
            Features::Tokens,
        ]),
        prop::sample::select(vec![Weights::Tf, Weights::Binary]),
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        (
            any::<bool>(),
            prop::sample::select(vec![0u64, 7]),
            // xxh3 hashes the words once for the fingerprint and shingles.
            prop::sample::select(vec![HashFunction::Xxh3, HashFunction::Fnv1a]),
        ),
    )
        .prop_map(
            |(
                tokenizer,
                features,
                weights,
                (casefold, whitespace, html, wide),
                (stop, seed, hash),
            )| {
                let mut config = FingerprintConfig {
                    tokenizer,
                    features,
                    weights,
                    stopwords: stop,
                    bits: width_of(wide),
                    seed,
                    hash,
                    ..Default::default()
                };
                config.normalize.casefold = casefold;
                config.normalize.whitespace = whitespace;
                config.normalize.html = html;
                config
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Fingerprinting and shingling in one pass gives the fingerprint alone
    /// and the shingles alone (narrowed to features), whichever
    /// configuration and script.
    #[test]
    fn fingerprint_and_shingles_equal_each_alone(
        config in shingle_sharing_config(),
        text in prop_oneof![english(), mixed()],
    ) {
        use neardup_core::jaccard::{ShingleScratch, narrow, shingles_keyed};
        let hasher = SimHasher::new(config.clone()).unwrap();
        let mut got = vec![1, 2, 3];
        let fp = hasher.fingerprint_and_set_with(&text, &mut Default::default(), &mut got);
        prop_assert_eq!(fp, hasher.fingerprint(&text));
        let mut wide = Vec::new();
        let key = hasher.shingle_key();
        shingles_keyed(&text, &config.normalize, key, &mut ShingleScratch::default(), &mut wide);
        let mut want = Vec::new();
        narrow(&wide, &mut want);
        prop_assert_eq!(&got, &want);
        let mut alone = vec![4];
        hasher.verification_set(&text, &mut alone);
        prop_assert_eq!(&alone, &want);
        // The service's reading: fingerprint, bit shares and the shingles
        // themselves, as each is made alone.
        let mut shingles = vec![5];
        let (fp, shares) = hasher.fingerprint_shares_and_shingles(&text, &mut shingles);
        let (fp_alone, shares_alone) = hasher.fingerprint_and_shares(&text);
        prop_assert_eq!(fp, fp_alone);
        prop_assert_eq!(shares.as_bytes(), shares_alone.as_bytes());
        let (mut a, mut b) = (shingles, wide.clone());
        a.sort_unstable();
        a.dedup();
        b.sort_unstable();
        b.dedup();
        prop_assert_eq!(a, b);
        // The key changes hashes, never which shingles there are.
        prop_assert_eq!(wide.len(), neardup_core::jaccard::shingles_for(&text, &config.normalize).len());
    }
}
