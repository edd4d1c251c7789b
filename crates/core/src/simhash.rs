//! [`SimHasher`]: documents, feature lists and vectors to fingerprints.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use jieba_rs::{KeywordExtract, TextRank, TfIdf};

use crate::accumulate::{UnitSums, WeightedSums};
use crate::centre::BitShares;
use crate::config::{
    Features, FingerprintConfig, HashFunction, Input as InputKind, NormalizeConfig, Profile,
    Tokenizer, Weights,
};
use crate::error::Error;
use crate::fingerprint::{Fingerprint, Width};
use crate::floor::{let_go_if_long, let_go_if_long_string};
use crate::hash::FeatureHasher;
use crate::idf::IdfTable;
use crate::jaccard::{
    SHINGLE, SetFeature, ShingleKey, ShingleScratch, WordShingles, narrow, shingles_of_normalized,
    unsorted_shingles_keyed,
};
use crate::normalize::{all_invariant, any_non_ascii, is_spaceless_script, normalize_into};
use crate::tokenize::{for_each_token, jieba};
use crate::vector::Hyperplanes;
use crate::{MAX_WIDTH, python_simhash};

/// One weighted feature of a document, as [`SimHasher::features`] lists them.
#[derive(Clone, Debug, PartialEq)]
pub struct Feature {
    /// The feature's text (a token, a shingle, an n-gram or a keyword).
    pub text: String,
    /// Its hash, `f` bits.
    pub hash: u128,
    /// Its weight in the document.
    pub weight: f64,
}

/// Reusable buffers, so that fingerprinting allocates nothing per document in
/// the steady state. [`SimHasher::fingerprint`] keeps one per thread.
#[derive(Debug, Default)]
pub struct Scratch {
    norm: String,
    tmp: String,
    shingle: String,
    joined: Vec<u8>,
    counts: HashMap<u128, (f64, f64)>,
    shingles: ShingleScratch,
    /// The words' hashes, in order, when the fingerprint shares them.
    word_hashes: Vec<u64>,
    /// A document's shingle hashes, before [`narrow`] makes them features.
    wide: Vec<u64>,
}

/// Makes fingerprints as a [`FingerprintConfig`] says.
///
/// ```
/// use neardup_core::{FingerprintConfig, SimHasher};
/// let hasher = SimHasher::new(FingerprintConfig::default()).unwrap();
/// let a = hasher.fingerprint("The quick brown fox jumps over the lazy dog, again and again.");
/// let b = hasher.fingerprint("The quick brown fox jumps over the lazy dog, again and again!");
/// assert_eq!(a.distance(b).unwrap(), 0);
/// ```
#[derive(Clone, Debug)]
pub struct SimHasher {
    config: FingerprintConfig,
    hasher: FeatureHasher,
    idf: Option<Arc<IdfTable>>,
    stopwords: Option<&'static HashSet<&'static str>>,
    /// Dense vectors' hyperplanes, drawn at the first vector.
    planes: OnceLock<Arc<Hyperplanes>>,
}

impl Scratch {
    /// Normalises `text` into `self.norm`.
    fn normalize(&mut self, config: &NormalizeConfig, text: &str) {
        normalize_into(config, text, &mut self.norm, &mut self.tmp);
    }

    /// Lets go of the buffers that one very long document grew past
    /// [`LONG_BUFFER`](crate::floor::LONG_BUFFER) bytes (its normal form, its words' hashes), so
    /// that they are not held beside the buffers its verification features
    /// take next, nor for the rest of the run.
    fn let_go_of_long(&mut self) {
        let Scratch {
            norm,
            tmp,
            shingle,
            joined,
            counts: _,
            shingles,
            word_hashes,
            wide,
        } = self;
        for s in [norm, tmp, shingle] {
            let_go_if_long_string(s);
        }
        let_go_if_long(joined);
        let_go_if_long(word_hashes);
        let_go_if_long(wide);
        shingles.let_go_of_long();
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn stopwords() -> &'static HashSet<&'static str> {
    static SET: OnceLock<HashSet<&'static str>> = OnceLock::new();
    SET.get_or_init(|| {
        include_str!("../data/stopwords-en.txt")
            .split_whitespace()
            .chain(include_str!("../data/stopwords-zh.txt").split_whitespace())
            .collect()
    })
}

fn tfidf_extractor() -> &'static TfIdf {
    static X: OnceLock<TfIdf> = OnceLock::new();
    X.get_or_init(TfIdf::default)
}

fn textrank_extractor() -> &'static TextRank {
    static X: OnceLock<TextRank> = OnceLock::new();
    X.get_or_init(TextRank::default)
}

impl SimHasher {
    /// A hasher for `config`. A configuration that names an IDF table needs
    /// [`SimHasher::with_idf`].
    pub fn new(config: FingerprintConfig) -> Result<SimHasher, Error> {
        if config.idf.is_some() {
            return Err(Error::InvalidConfig(
                "this configuration uses a learned IDF table: load it and use SimHasher::with_idf (CLI: --idf FILE)".into(),
            ));
        }
        Self::build(config, None)
    }

    /// A hasher for `config` with the IDF table it names (its digest must match).
    pub fn with_idf(mut config: FingerprintConfig, idf: IdfTable) -> Result<SimHasher, Error> {
        match &config.idf {
            Some(r) if r.digest != idf.digest() => {
                return Err(Error::ConfigMismatch(format!(
                    "the configuration names IDF table {} but the table given is {}",
                    r.digest,
                    idf.digest()
                )));
            }
            Some(_) => {}
            None => {
                config.idf = Some(crate::config::IdfRef {
                    path: None,
                    digest: idf.digest().to_owned(),
                })
            }
        }
        Self::build(config, Some(Arc::new(idf)))
    }

    fn build(config: FingerprintConfig, idf: Option<Arc<IdfTable>>) -> Result<SimHasher, Error> {
        config.validate()?;
        let hasher = FeatureHasher::new(config.hash, config.bits, config.seed);
        let stopwords = config.stopwords.then(stopwords);
        Ok(SimHasher {
            config,
            hasher,
            idf,
            stopwords,
            planes: OnceLock::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FingerprintConfig {
        &self.config
    }

    /// The fingerprint width.
    pub fn width(&self) -> Width {
        self.config.bits
    }

    /// The hash of one feature.
    #[inline]
    pub fn hash_feature(&self, feature: &[u8]) -> u128 {
        self.hasher.hash(feature)
    }

    /// The fingerprint of a document. An empty document (no features) has the
    /// all-zero fingerprint.
    pub fn fingerprint(&self, text: &str) -> Fingerprint {
        SCRATCH.with(|s| self.fingerprint_with(text, &mut s.borrow_mut()))
    }

    /// [`SimHasher::fingerprint`] with caller-owned buffers.
    pub fn fingerprint_with(&self, text: &str, scratch: &mut Scratch) -> Fingerprint {
        self.sums_with(text, scratch).finish()
    }

    /// The document's SimHash vector, before its bits are decided.
    fn sums_with(&self, text: &str, scratch: &mut Scratch) -> Sums {
        if self.config.profile == Profile::PythonSimhash {
            let mut sums = UnitSums::new(Width::W64);
            python_simhash::for_each_feature(text, &mut scratch.norm, &mut |f| {
                sums.add(self.hasher.hash(f.as_bytes()))
            });
            return Sums::Unit(sums);
        }
        if self.uses_jieba_keywords() {
            scratch.normalize(&self.config.normalize, text);
            let mut sums = WeightedSums::new(self.width());
            for (word, weight) in self.jieba_keywords(&scratch.norm) {
                sums.add(self.hasher.hash(word.as_bytes()), weight);
            }
            return Sums::Weighted(sums);
        }
        let needs_aggregation =
            self.config.top.is_some() || !matches!(self.config.weights, Weights::Tf);
        if !needs_aggregation {
            // Term frequency: every occurrence adds weight 1; no counting needed.
            let Scratch {
                norm, tmp, joined, ..
            } = scratch;
            let view = self.unit_view(text, norm, tmp);
            let (view, lower) = (view.text, view.lower);
            return Sums::Unit(with_hash!(self, |h| self.unit_fingerprint(view, lower, joined, h)));
        }
        self.normalize_for_tokens(text, scratch);
        let counts = &mut scratch.counts;
        counts.clear();
        self.for_each_feature(&scratch.norm, &mut scratch.shingle, &mut |f| {
            let h = self.hasher.hash(f.as_bytes());
            counts
                .entry(h)
                .or_insert_with(|| (0.0, self.idf.as_ref().map_or(1.0, |t| t.idf(f))))
                .0 += 1.0;
        });
        let mut weighted: Vec<(u128, f64)> = counts
            .iter()
            .map(|(&h, &(tf, idf))| (h, self.weight(tf, idf)))
            .collect();
        self.cut_top(&mut weighted, |&(h, w)| (h, w));
        let mut sums = WeightedSums::new(self.width());
        for (h, w) in weighted {
            sums.add(h, w);
        }
        Sums::Weighted(sums)
    }

    /// Where each bit of `text`'s fingerprint leans, before a threshold
    /// decides it: the first step of fingerprints centred on a corpus
    /// ([`crate::centre`]).
    pub fn shares(&self, text: &str) -> BitShares {
        SCRATCH.with(|s| self.sums_with(text, &mut s.borrow_mut()).shares())
    }

    /// The plain fingerprint of `text` ([`SimHasher::fingerprint`]) and
    /// where each of its bits leans ([`SimHasher::shares`]), from one
    /// reading of the text: what a collection that learns its corpus's
    /// centre from its first documents keeps of each.
    pub fn fingerprint_and_shares(&self, text: &str) -> (Fingerprint, BitShares) {
        SCRATCH.with(|s| self.sums_with(text, &mut s.borrow_mut()).both())
    }

    /// How [`SimHasher::fingerprint_and_set`] hashes word shingles:
    /// each word by xxh3 with the configuration's seed and width (its low
    /// 64 bits), the three mixed ([`ShingleKey::Words`]). A fingerprint of
    /// xxh3-hashed words hashes each word once for both.
    pub fn shingle_key(&self) -> ShingleKey {
        ShingleKey::Words {
            seed: self.config.seed,
            wide: self.width() == Width::W128,
        }
    }

    /// `text`'s verification features alone ([`SetFeature`]s), into `features`,
    /// as [`SimHasher::fingerprint_and_set`] makes them (the same key).
    pub fn verification_set(&self, text: &str, features: &mut Vec<SetFeature>) {
        SCRATCH.with(|s| {
            let scratch = &mut *s.borrow_mut();
            unsorted_shingles_keyed(
                text,
                &self.config.normalize,
                self.shingle_key(),
                &mut scratch.shingles,
                &mut scratch.wide,
            );
            narrow(&scratch.wide, features);
        })
    }

    /// The fingerprint of `text` and, into `features`, its verification
    /// features, with this thread's buffers
    /// ([`SimHasher::fingerprint_and_set_with`]).
    pub fn fingerprint_and_set(&self, text: &str, features: &mut Vec<SetFeature>) -> Fingerprint {
        SCRATCH.with(|s| self.fingerprint_and_set_with(text, &mut s.borrow_mut(), features))
    }

    /// The fingerprint of `text` ([`SimHasher::fingerprint_with`]) and, into
    /// `features`, its verification features: exactly what [`narrow`] makes
    /// of what [`crate::jaccard::shingles_keyed`] makes with the configuration's
    /// normalisation and [`SimHasher::shingle_key`]. Where the fingerprint
    /// reads the words the shingles are made of (term-frequency UAX #29 words
    /// or word 3-shingles, text without a character of a script written
    /// without spaces), the text is normalised and cut into words once, and a
    /// fingerprint of 3-shingles hashed by 64-bit xxh3 gives its own hashes;
    /// otherwise the shingles are made apart.
    pub fn fingerprint_and_set_with(
        &self,
        text: &str,
        scratch: &mut Scratch,
        features: &mut Vec<SetFeature>,
    ) -> Fingerprint {
        self.sums_and_set_with(text, scratch, features).finish()
    }

    /// Where each bit of `text`'s fingerprint leans ([`BitShares`]) and,
    /// into `features`, its verification features, as
    /// [`SimHasher::fingerprint_and_set`] makes them, with this thread's
    /// buffers: the first step of fingerprints centred on a corpus
    /// ([`crate::centre`]).
    pub fn shares_and_set(&self, text: &str, features: &mut Vec<SetFeature>) -> BitShares {
        SCRATCH.with(|s| {
            self.sums_and_set_with(text, &mut s.borrow_mut(), features)
                .shares()
        })
    }

    /// [`SimHasher::fingerprint_and_shares`] and, into `shingles`, the
    /// text's verification shingles' 64-bit hashes (unsorted, with
    /// repeats), as [`crate::jaccard::shingles_keyed`] makes them with the
    /// configuration's normalisation and [`SimHasher::shingle_key`]: all the
    /// service keeps of a text (its fingerprint, centred or not, and its
    /// signature), from one reading of it where the fingerprint reads the
    /// shingles' words ([`SimHasher::fingerprint_and_set_with`]).
    pub fn fingerprint_shares_and_shingles(
        &self,
        text: &str,
        shingles: &mut Vec<u64>,
    ) -> (Fingerprint, BitShares) {
        SCRATCH.with(|s| {
            let scratch = &mut *s.borrow_mut();
            let sums = self.sums_and_shingles_with(text, scratch, shingles);
            scratch.let_go_of_long();
            sums.both()
        })
    }

    /// [`SimHasher::fingerprint_and_set_with`], up to the SimHash vector.
    fn sums_and_set_with(
        &self,
        text: &str,
        scratch: &mut Scratch,
        features: &mut Vec<SetFeature>,
    ) -> Sums {
        let mut wide = std::mem::take(&mut scratch.wide);
        let sums = self.sums_and_shingles_with(text, scratch, &mut wide);
        scratch.let_go_of_long();
        narrow(&wide, features);
        let_go_if_long(&mut wide);
        scratch.wide = wide;
        sums
    }

    /// [`SimHasher::sums_and_set_with`] with the shingles' 64-bit
    /// hashes (in any order, with repeats: [`narrow`] sorts) into `shingles`.
    fn sums_and_shingles_with(
        &self,
        text: &str,
        scratch: &mut Scratch,
        shingles: &mut Vec<u64>,
    ) -> Sums {
        shingles.clear();
        let (normalize, key) = (&self.config.normalize, self.shingle_key());
        let Some(features) = self.shared_words() else {
            let fingerprint = self.sums_with(text, scratch);
            unsorted_shingles_keyed(text, normalize, key, &mut scratch.shingles, shingles);
            return fingerprint;
        };
        let Scratch {
            norm,
            tmp,
            joined,
            shingles: shingle_scratch,
            word_hashes,
            ..
        } = scratch;
        // The text `fingerprint_with` cuts into words for this configuration.
        let UnitView {
            text: view,
            lower,
            normalised,
        } = self.unit_view(text, norm, tmp);
        // (Text left alone by normalisation holds no spaceless script.)
        if normalised && any_non_ascii(view, is_spaceless_script) {
            // Chinese or Japanese: jieba's words, or character shingles.
            let fingerprint = match features {
                Shares::Shingles => {
                    let batch = UnitBatch::new(Width::W64, Xxh3x64(self.config.seed));
                    self.unit_shingles(view, false, SHINGLE, joined, batch)
                }
                Shares::Tokens => {
                    with_hash!(self, |h| self.unit_fingerprint(view, false, joined, h))
                }
            };
            shingles_of_normalized(view, key, shingle_scratch, shingles);
            return Sums::Unit(fingerprint);
        }
        match features {
            Shares::Shingles => {
                // The fingerprint's shingles are hashed whole; the
                // verification features are made apart (from the text: this
                // view may still be lower-cased word by word).
                let batch = UnitBatch::new(Width::W64, Xxh3x64(self.config.seed));
                let fingerprint = self.unit_shingles(view, lower, SHINGLE, joined, batch);
                unsorted_shingles_keyed(text, normalize, key, shingle_scratch, shingles);
                Sums::Unit(fingerprint)
            }
            Shares::Tokens => {
                let fingerprint = with_hash!(self, |h| {
                    let batch = UnitBatch::new(self.width(), h);
                    self.unit_tokens_and_shingles(view, batch, word_hashes, shingles)
                });
                Sums::Unit(fingerprint)
            }
        }
    }

    /// Term-frequency fingerprint of `norm`'s words, and their 3-shingles'
    /// hashes (as [`SimHasher::shingle_key`] makes them, unsorted) into `out`.
    /// With xxh3, the words' hashes for the fingerprint (in batches, out of
    /// order) are kept in `word_hashes` and the shingles mixed from them.
    fn unit_tokens_and_shingles<H: HashBytes>(
        &self,
        norm: &str,
        mut batch: UnitBatch<H>,
        word_hashes: &mut Vec<u64>,
        out: &mut Vec<u64>,
    ) -> UnitSums {
        let ShingleKey::Words { seed, wide } = self.shingle_key() else {
            unreachable!("dedup's shingles are keyed by words");
        };
        let mut shingles = WordShingles::new(seed, wide);
        let base = norm.as_ptr() as usize;
        let bytes = norm.as_bytes();
        if self.config.hash != HashFunction::Xxh3 {
            for_each_token(self.config.tokenizer, norm, &mut |t| {
                batch.add(t.as_ptr() as usize - base, t.len(), bytes);
                shingles.word(t.as_bytes(), out);
            });
            shingles.finish(out);
            return batch.finish(bytes);
        }
        word_hashes.clear();
        batch.keep = Some(std::mem::take(word_hashes));
        for_each_token(self.config.tokenizer, norm, &mut |t| {
            batch.add(t.as_ptr() as usize - base, t.len(), bytes);
        });
        let (sums, kept) = batch.finish_kept(bytes);
        out.reserve(kept.len());
        for &h in &kept {
            shingles.hashed(h, out);
        }
        shingles.finish(out);
        *word_hashes = kept;
        sums
    }

    /// Which features are made of the words the verification shingles are,
    /// if they are: term frequency, UAX #29 words (`words`, or `auto`, which
    /// cuts only Han with jieba), no stop words, all features kept; the
    /// words themselves or their 3-shingles hashed by 64-bit xxh3.
    fn shared_words(&self) -> Option<Shares> {
        let c = &self.config;
        let words = c.profile == Profile::Native
            && c.input == InputKind::Text
            && matches!(c.weights, Weights::Tf)
            && c.top.is_none()
            && matches!(c.tokenizer, Tokenizer::Words | Tokenizer::Auto)
            && self.stopwords.is_none();
        match c.features {
            _ if !words => None,
            Features::Tokens => Some(Shares::Tokens),
            Features::Shingles(SHINGLE)
                if c.hash == HashFunction::Xxh3 && self.width() == Width::W64 =>
            {
                Some(Shares::Shingles)
            }
            _ => None,
        }
    }

    /// The text a term-frequency fingerprint cuts into tokens: `text` itself
    /// (or a lower-cased copy in `tmp`) where normalisation would leave its
    /// tokens alone up to ASCII case, else its normal form in `norm`.
    fn unit_view<'a>(
        &self,
        text: &'a str,
        norm: &'a mut String,
        tmp: &'a mut String,
    ) -> UnitView<'a> {
        if !self.can_skip_normalisation(text) {
            self.normalize_for_tokens_into(text, norm, tmp);
            return UnitView {
                text: norm,
                lower: false,
                normalised: true,
            };
        }
        let casefold = self.config.normalize.casefold;
        // Shingles copy their tokens anyway, and lower-case them on the way.
        if matches!(self.config.features, Features::Shingles(_)) {
            return UnitView {
                text,
                lower: casefold,
                normalised: false,
            };
        }
        let text = if casefold && text.bytes().any(|b| b.is_ascii_uppercase()) {
            tmp.clear();
            tmp.push_str(text);
            tmp.make_ascii_lowercase();
            tmp
        } else {
            text
        };
        UnitView {
            text,
            lower: false,
            normalised: false,
        }
    }

    /// Normalises `text` into `scratch.norm`, without whitespace folding
    /// when it cannot change the features: word tokens (or shingles of them,
    /// which join their words with single spaces whatever separated them) of
    /// text whose words folding cannot join.
    fn normalize_for_tokens(&self, text: &str, scratch: &mut Scratch) {
        self.normalize_for_tokens_into(text, &mut scratch.norm, &mut scratch.tmp)
    }

    /// [`SimHasher::normalize_for_tokens`] into `norm`, with `tmp` for its work.
    fn normalize_for_tokens_into(&self, text: &str, norm: &mut String, tmp: &mut String) {
        let config = &self.config.normalize;
        let words = matches!(self.config.tokenizer, Tokenizer::Words | Tokenizer::Auto)
            && matches!(
                self.config.features,
                Features::Tokens | Features::Shingles(_)
            );
        // (HTML entities could spell any character: checked on the raw text,
        // the shortcut needs text without markup.)
        if config.whitespace
            && !config.html
            && words
            && !crate::normalize::folding_may_change_words(text)
        {
            let unfolded = NormalizeConfig {
                whitespace: false,
                ..*config
            };
            normalize_into(&unfolded, text, norm, tmp);
        } else {
            normalize_into(config, text, norm, tmp);
        }
    }

    /// Whether `text`'s word tokens are the same with and without normalisation,
    /// up to ASCII case: words (or shingles of them, which join their words with
    /// single spaces whatever separated them), no HTML, no stop words, and only
    /// characters normalisation leaves alone.
    fn can_skip_normalisation(&self, text: &str) -> bool {
        matches!(self.config.tokenizer, Tokenizer::Words | Tokenizer::Auto)
            && matches!(
                self.config.features,
                Features::Tokens | Features::Shingles(_)
            )
            && !self.config.normalize.html
            && self.stopwords.is_none()
            && all_invariant(text)
    }

    /// The term-frequency fingerprint of normalised text (or text that
    /// normalisation would leave alone, up to ASCII case when `lower`: only
    /// shingles, whose tokens are copied, take such text).
    #[inline]
    fn unit_fingerprint(
        &self,
        norm: &str,
        lower: bool,
        joined: &mut Vec<u8>,
        hash: impl HashBytes,
    ) -> UnitSums {
        let mut batch = UnitBatch::new(self.width(), hash);
        if let Features::Shingles(w) = self.config.features {
            return self.unit_shingles(norm, lower, w, joined, batch);
        }
        debug_assert!(!lower, "only shingles lower-case as they go");
        let base = norm.as_ptr() as usize;
        let bytes = norm.as_bytes();
        // Tokens and n-grams are slices of `norm`.
        self.for_each_feature(norm, &mut String::new(), &mut |f| {
            batch.add(f.as_ptr() as usize - base, f.len(), bytes)
        });
        batch.finish(bytes)
    }

    /// Term-frequency fingerprint of w-shingles. The tokens are copied into
    /// `joined`, one space apart, as each arrives, so that every shingle (its
    /// tokens joined by single spaces) is a slice of `joined` and joins a batch,
    /// whatever separated its tokens in the text; lower-cased (ASCII) when `lower`.
    #[inline]
    fn unit_shingles<H: HashBytes>(
        &self,
        norm: &str,
        lower: bool,
        w: usize,
        joined: &mut Vec<u8>,
        mut batch: UnitBatch<H>,
    ) -> UnitSums {
        joined.clear();
        joined.reserve(norm.len() + 1);
        // Where each of the last w tokens starts in `joined`; `slot` is where the
        // next one goes, and once w tokens have come, the window's oldest.
        let mut starts = [0usize; MAX_WIDTH];
        let mut slot = 0usize;
        let mut seen = 0usize;
        let stop = |t: &str| self.stopwords.is_some_and(|s| s.contains(t));
        for_each_token(self.config.tokenizer, norm, &mut |t| {
            if stop(t) {
                return;
            }
            if seen > 0 {
                joined.push(b' ');
            }
            starts[slot] = joined.len();
            append_short(joined, t.as_bytes(), norm, lower);
            slot = if slot + 1 == w { 0 } else { slot + 1 };
            seen += 1;
            if seen >= w {
                let start = starts[slot];
                batch.add(start, joined.len() - start, joined);
            }
        });
        // A document shorter than one shingle is one feature: all its tokens.
        if seen > 0 && seen < w {
            batch.add(0, joined.len(), joined);
        }
        batch.finish(joined)
    }

    fn uses_jieba_keywords(&self) -> bool {
        match self.config.weights {
            Weights::TextRank => true,
            Weights::TfIdf => self.idf.is_none(),
            _ => false,
        }
    }

    fn jieba_keywords(&self, text: &str) -> Vec<(String, f64)> {
        let top = self.config.top.unwrap_or(usize::MAX);
        let keywords = match self.config.weights {
            Weights::TextRank => textrank_extractor().extract_keywords(jieba(), text, top, vec![]),
            _ => tfidf_extractor().extract_keywords(jieba(), text, top, vec![]),
        };
        keywords
            .into_iter()
            .map(|k| (k.keyword, k.weight))
            .collect()
    }

    #[inline]
    fn weight(&self, tf: f64, idf: f64) -> f64 {
        match self.config.weights {
            Weights::Binary => 1.0,
            Weights::TfIdf => tf * idf,
            Weights::Tf | Weights::TextRank => tf,
        }
    }

    /// Keeps the `top` heaviest items; ties go to the smaller hash, so the cut is
    /// deterministic.
    fn cut_top<T>(&self, items: &mut Vec<T>, key: impl Fn(&T) -> (u128, f64)) {
        let Some(top) = self.config.top else { return };
        if items.len() <= top {
            return;
        }
        let order = |a: &T, b: &T| {
            let (ha, wa) = key(a);
            let (hb, wb) = key(b);
            wb.total_cmp(&wa).then(ha.cmp(&hb))
        };
        items.select_nth_unstable_by(top - 1, order);
        items.truncate(top);
    }

    /// Calls `emit` for every feature occurrence of normalised text, in order.
    #[inline]
    fn for_each_feature<F: FnMut(&str)>(&self, norm: &str, shingle: &mut String, emit: &mut F) {
        let tokenizer = self.config.tokenizer;
        let stop = |t: &str| self.stopwords.is_some_and(|s| s.contains(t));
        match self.config.features {
            Features::Ngrams(n) => crate::tokenize::char_ngrams(norm, n, emit),
            Features::Tokens => for_each_token(tokenizer, norm, &mut |t| {
                if !stop(t) {
                    emit(t)
                }
            }),
            Features::Shingles(w) => {
                // Tokens are slices of `norm`: keep their byte ranges. A shingle whose
                // tokens are separated by single spaces is already a slice of `norm`
                // (the usual case after whitespace folding); others are built.
                let base = norm.as_ptr() as usize;
                let bytes = norm.as_bytes();
                let mut ring = [(0usize, 0usize); MAX_WIDTH];
                // Where the next token goes in the ring; once it is full, the slot
                // of the window's oldest token.
                let mut slot = 0usize;
                let mut seen = 0usize;
                // How many tokens in a row, up to the last, follow the one before
                // after exactly one space.
                let mut spaced_run = 0usize;
                let mut prev_end = usize::MAX;
                for_each_token(tokenizer, norm, &mut |t| {
                    if stop(t) {
                        return;
                    }
                    let start = t.as_ptr() as usize - base;
                    let end = start + t.len();
                    let spaced =
                        prev_end != usize::MAX && start == prev_end + 1 && bytes[prev_end] == b' ';
                    spaced_run = if spaced { spaced_run + 1 } else { 0 };
                    prev_end = end;
                    ring[slot] = (start, end);
                    slot = if slot + 1 == w { 0 } else { slot + 1 };
                    seen += 1;
                    if seen < w {
                        return;
                    }
                    if spaced_run + 1 >= w {
                        emit(&norm[ring[slot].0..end]);
                        return;
                    }
                    shingle.clear();
                    let mut k = slot;
                    for j in 0..w {
                        if j > 0 {
                            shingle.push(' ');
                        }
                        let (s, e) = ring[k];
                        shingle.push_str(&norm[s..e]);
                        k = if k + 1 == w { 0 } else { k + 1 };
                    }
                    emit(shingle);
                });
                // A document shorter than one shingle is one feature: all its tokens.
                if seen > 0 && seen < w {
                    shingle.clear();
                    for (j, &(s, e)) in ring[..seen].iter().enumerate() {
                        if j > 0 {
                            shingle.push(' ');
                        }
                        shingle.push_str(&norm[s..e]);
                    }
                    emit(shingle);
                }
            }
        }
    }

    /// The document's features with their weights, heaviest first (ties by hash):
    /// what the fingerprint is made of. Slower than [`SimHasher::fingerprint`]; for
    /// explanations and tests.
    pub fn features(&self, text: &str) -> Vec<Feature> {
        let mut scratch = Scratch::default();
        let mut out: Vec<Feature> = Vec::new();
        if self.config.profile == Profile::PythonSimhash {
            let mut counts: HashMap<String, f64> = HashMap::new();
            python_simhash::for_each_feature(text, &mut scratch.norm, &mut |f| {
                *counts.entry(f.to_owned()).or_default() += 1.0
            });
            out.extend(counts.into_iter().map(|(text, weight)| Feature {
                hash: self.hasher.hash(text.as_bytes()),
                text,
                weight,
            }));
        } else if self.uses_jieba_keywords() {
            scratch.normalize(&self.config.normalize, text);
            for (word, weight) in self.jieba_keywords(&scratch.norm) {
                out.push(Feature {
                    hash: self.hasher.hash(word.as_bytes()),
                    text: word,
                    weight,
                });
            }
        } else {
            scratch.normalize(&self.config.normalize, text);
            let mut counts: HashMap<String, f64> = HashMap::new();
            self.for_each_feature(&scratch.norm, &mut scratch.shingle, &mut |f| {
                *counts.entry(f.to_owned()).or_default() += 1.0
            });
            for (text, tf) in counts {
                let idf = self.idf.as_ref().map_or(1.0, |t| t.idf(&text));
                out.push(Feature {
                    hash: self.hasher.hash(text.as_bytes()),
                    weight: self.weight(tf, idf),
                    text,
                });
            }
            self.cut_top(&mut out, |f| (f.hash, f.weight));
        }
        out.sort_by(|a, b| b.weight.total_cmp(&a.weight).then(a.hash.cmp(&b.hash)));
        out
    }

    /// The fingerprint of an explicit list of weighted features (a weighted sparse
    /// vector keyed by strings). The same feature given twice adds up.
    /// Weights may be negative; they must be finite.
    pub fn fingerprint_weighted<S: AsRef<str>>(
        &self,
        features: impl IntoIterator<Item = (S, f64)>,
    ) -> Result<Fingerprint, Error> {
        let mut sums = WeightedSums::new(self.width());
        for (f, w) in features {
            check_weight(w)?;
            sums.add(self.hasher.hash(f.as_ref().as_bytes()), w);
        }
        Ok(sums.finish())
    }

    /// The fingerprint of a list of features of weight 1 each.
    pub fn fingerprint_tokens<S: AsRef<str>>(
        &self,
        features: impl IntoIterator<Item = S>,
    ) -> Fingerprint {
        let mut sums = UnitSums::new(self.width());
        for f in features {
            sums.add(self.hasher.hash(f.as_ref().as_bytes()));
        }
        sums.finish()
    }

    /// The fingerprint of a sparse vector keyed by integer ids: random-hyperplane
    /// LSH whose hyperplanes are the hashes of the ids (little-endian bytes),
    /// generated on the fly from the configured hash and seed, never stored.
    pub fn fingerprint_sparse(
        &self,
        entries: impl IntoIterator<Item = (u64, f64)>,
    ) -> Result<Fingerprint, Error> {
        let mut sums = WeightedSums::new(self.width());
        for (id, w) in entries {
            check_weight(w)?;
            sums.add(self.hasher.hash(&id.to_le_bytes()), w);
        }
        Ok(sums.finish())
    }

    /// The fingerprint of a dense vector (an embedding): sign random projection
    /// on f Gaussian hyperplanes, so that the Hamming distance h estimates the
    /// angle between vectors, θ ≈ π·h/f (Charikar 2002); see [`crate::vector`].
    /// The hyperplanes are drawn once per hasher, for the configured dimension
    /// or the first vector's, the same on every machine. Refuses a vector with
    /// an entry that is not finite, an all-zero vector, and, when the
    /// configuration fixes a dimension, a vector of another.
    pub fn fingerprint_dense(&self, vector: &[f32]) -> Result<Fingerprint, Error> {
        if let Some(dim) = self.config.dim
            && vector.len() != dim
        {
            return Err(Error::InvalidVector(format!(
                "{} dimensions, but this configuration's vectors have {dim}",
                vector.len()
            )));
        }
        let planes = self.planes.get_or_init(|| {
            let dim = self.config.dim.unwrap_or(vector.len());
            Arc::new(Hyperplanes::new(dim, self.width(), self.config.seed))
        });
        if vector.len() <= planes.dim() {
            planes.fingerprint(vector)
        } else {
            // Longer than the first vector: the same rows, drawn for this one.
            Hyperplanes::new(vector.len(), self.width(), self.config.seed).fingerprint(vector)
        }
    }

    /// The fingerprint of one document of the kind the configuration says
    /// ([`FingerprintConfig::input`]); a document of another kind is refused.
    pub fn fingerprint_input(&self, input: Input<'_>) -> Result<Fingerprint, Error> {
        let kind = self.config.input;
        match input {
            Input::Text(text) if kind == InputKind::Text => Ok(self.fingerprint(text)),
            Input::Vector(v) if kind == InputKind::Vector => self.fingerprint_dense(v),
            Input::Features(f) if kind == InputKind::Features => {
                // In name order, so that the sums (and a tie's rounding) do not
                // depend on the order the caller listed the features in.
                let mut sorted: Vec<&(String, f64)> = f.iter().collect();
                sorted.sort_by(|a, b| a.0.cmp(&b.0));
                self.fingerprint_weighted(sorted.into_iter().map(|(name, w)| (name.as_str(), *w)))
            }
            other => Err(Error::WrongKind(format!(
                "got {}, but this configuration fingerprints {}",
                other.kind().plural(),
                kind.plural()
            ))),
        }
    }
}

/// One document, of any of the kinds a configuration can fingerprint.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// Text, for the text pipeline.
    Text(&'a str),
    /// A dense vector.
    Vector(&'a [f32]),
    /// Features and their weights.
    Features(&'a [(String, f64)]),
}

impl Input<'_> {
    /// The kind of document.
    pub fn kind(&self) -> InputKind {
        match self {
            Input::Text(_) => InputKind::Text,
            Input::Vector(_) => InputKind::Vector,
            Input::Features(_) => InputKind::Features,
        }
    }
}

/// Features of weight 1 on their way to the sums, hashed in groups of similar
/// length. Hashes such as xxh3 branch on the input's length, and feature lengths
/// are random: hashed in document order, those branches mispredict about once a
/// feature. The sums do not depend on the order, so features (byte ranges of one
/// buffer) wait in a group for their length class and are hashed together.
struct UnitBatch<H> {
    hash: H,
    sums: UnitSums,
    groups: [[(usize, usize); BATCH_GROUP]; 4],
    len: [usize; 4],
    /// When set, each feature's hash (its low 64 bits) in the order the
    /// features came, and where in it each waiting feature's goes.
    keep: Option<Vec<u64>>,
    slots: [[u32; BATCH_GROUP]; 4],
}

/// What [`SimHasher::unit_view`] gives: the text to cut into tokens, whether
/// shingles lower-case its tokens as they copy them, and whether it is the
/// normal form (else the text as given, which holds no spaceless script).
struct UnitView<'a> {
    text: &'a str,
    lower: bool,
    normalised: bool,
}

/// A document's SimHash vector, of unit or real weights.
enum Sums {
    Unit(UnitSums),
    Weighted(WeightedSums),
}

impl Sums {
    fn finish(self) -> Fingerprint {
        match self {
            Sums::Unit(s) => s.finish(),
            Sums::Weighted(s) => s.finish(),
        }
    }

    fn shares(self) -> BitShares {
        match self {
            Sums::Unit(s) => s.shares(),
            Sums::Weighted(s) => s.shares(),
        }
    }

    fn both(self) -> (Fingerprint, BitShares) {
        match self {
            Sums::Unit(s) => (s.clone().finish(), s.shares()),
            Sums::Weighted(s) => (s.clone().finish(), s.shares()),
        }
    }
}

/// Which of a configuration's features are made of the verification
/// shingles' words ([`SimHasher::fingerprint_and_set_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shares {
    /// The words themselves.
    Tokens,
    /// Their 3-shingles, hashed as the verification shingles are.
    Shingles,
}

/// Appends `piece`, a slice of `whole`, to `out`, ASCII-lower-cased if `lower`:
/// with one fixed-size copy when it is short and 32 bytes can be read from its
/// start inside `whole` (a call to `memcpy` per word cost 9% of the shingle
/// pipeline).
#[inline(always)]
fn append_short(out: &mut Vec<u8>, piece: &[u8], whole: &str, lower: bool) {
    const WIDE: usize = 32;
    let len = out.len();
    let readable = whole.as_ptr() as usize + whole.len() - piece.as_ptr() as usize;
    if piece.len() > WIDE || readable < WIDE {
        out.extend_from_slice(piece);
        if lower {
            out[len..].make_ascii_lowercase();
        }
        return;
    }
    out.reserve(WIDE);
    // SAFETY: `piece` lies inside `whole`, which has at least WIDE readable bytes
    // from its start; `out` has room for WIDE more bytes after `len`, which the
    // copy does not overlap and then initialises. Only the piece's own bytes
    // become part of `out`.
    unsafe {
        let dst = out.as_mut_ptr().add(len);
        std::ptr::copy_nonoverlapping(piece.as_ptr(), dst, WIDE);
        if lower {
            std::slice::from_raw_parts_mut(dst, WIDE).make_ascii_lowercase();
        }
        out.set_len(len + piece.len());
    }
}

/// A feature hash, chosen once per document and inlined into the loop.
trait HashBytes {
    fn hash(&self, bytes: &[u8]) -> u128;
}

/// xxh3 with 64 bits, the default, without the width and function dispatch.
struct Xxh3x64(u64);

impl HashBytes for Xxh3x64 {
    #[inline(always)]
    fn hash(&self, bytes: &[u8]) -> u128 {
        xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.0) as u128
    }
}

/// xxh3 with 128 bits (the candidate configuration's), without the dispatch.
struct Xxh3x128(u64);

/// Evaluates `$body` with `$h` bound to `$hasher`'s hash function as a
/// concrete type where there is one (xxh3 at 64 or 128 bits), else to its
/// [`FeatureHasher`]: the function is chosen once, outside the loops, so
/// that the chain from tokenizer to sums inlines.
macro_rules! with_hash {
    ($hasher:expr, |$h:ident| $body:expr) => {{
        let hasher: &SimHasher = $hasher;
        match (hasher.config.hash, hasher.width()) {
            (HashFunction::Xxh3, Width::W64) => {
                let $h = Xxh3x64(hasher.config.seed);
                $body
            }
            (HashFunction::Xxh3, Width::W128) => {
                let $h = Xxh3x128(hasher.config.seed);
                $body
            }
            _ => {
                let $h = hasher.hasher;
                $body
            }
        }
    }};
}
use with_hash;

impl HashBytes for Xxh3x128 {
    #[inline(always)]
    fn hash(&self, bytes: &[u8]) -> u128 {
        xxhash_rust::xxh3::xxh3_128_with_seed(bytes, self.0)
    }
}

impl HashBytes for FeatureHasher {
    #[inline(always)]
    fn hash(&self, bytes: &[u8]) -> u128 {
        FeatureHasher::hash(self, bytes)
    }
}

/// Features per length group of a [`UnitBatch`].
const BATCH_GROUP: usize = 32;

impl<H: HashBytes> UnitBatch<H> {
    fn new(width: Width, hash: H) -> Self {
        UnitBatch {
            hash,
            sums: UnitSums::new(width),
            groups: [[(0, 0); BATCH_GROUP]; 4],
            len: [0; 4],
            keep: None,
            slots: [[0; BATCH_GROUP]; 4],
        }
    }

    /// The feature `bytes[offset..offset + len]`; `bytes` must be the same buffer
    /// (or a longer version of it) at every call.
    #[inline(always)]
    fn add(&mut self, offset: usize, len: usize, bytes: &[u8]) {
        // xxh3's length classes: up to 3, 4 to 8, 9 to 16, longer.
        let class = match len {
            0..=3 => 0,
            4..=8 => 1,
            9..=16 => 2,
            _ => 3,
        };
        let n = self.len[class];
        self.groups[class][n] = (offset, len);
        if let Some(kept) = &mut self.keep {
            self.slots[class][n] = kept.len() as u32;
            kept.push(0);
        }
        self.len[class] = n + 1;
        if n + 1 == BATCH_GROUP {
            self.flush(class, bytes);
        }
    }

    /// Out of line, so that `add` stays small where it is inlined.
    #[inline(never)]
    fn flush(&mut self, class: usize, bytes: &[u8]) {
        let group = &self.groups[class][..self.len[class]];
        let mut hashes = [0u128; BATCH_GROUP];
        for (h, &(offset, len)) in hashes.iter_mut().zip(group) {
            *h = self.hash.hash(&bytes[offset..offset + len]);
        }
        self.sums.add_all(&hashes[..group.len()]);
        if let Some(kept) = &mut self.keep {
            for (&slot, &h) in self.slots[class].iter().zip(&hashes[..group.len()]) {
                kept[slot as usize] = h as u64;
            }
        }
        self.len[class] = 0;
    }

    fn finish(mut self, bytes: &[u8]) -> UnitSums {
        for class in 0..4 {
            self.flush(class, bytes);
        }
        self.sums
    }

    /// [`UnitBatch::finish`], and the kept hashes in the features' order.
    fn finish_kept(mut self, bytes: &[u8]) -> (UnitSums, Vec<u64>) {
        for class in 0..4 {
            self.flush(class, bytes);
        }
        (self.sums, self.keep.unwrap_or_default())
    }
}

fn check_weight(w: f64) -> Result<(), Error> {
    if w.is_finite() {
        Ok(())
    } else {
        Err(Error::InvalidVector(format!(
            "weight {w} is not a finite number"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::floor::LONG_BUFFER;

    /// Buffers one long document grew are let go, the others kept; and a
    /// document's fingerprint and features do not depend on which were.
    #[test]
    fn long_buffers_are_let_go_and_results_do_not_change() {
        let mut scratch = Scratch {
            norm: String::with_capacity(LONG_BUFFER + 1),
            tmp: String::with_capacity(1000),
            word_hashes: Vec::with_capacity(LONG_BUFFER / 8 + 1),
            wide: Vec::with_capacity(LONG_BUFFER / 8),
            ..Scratch::default()
        };
        scratch.let_go_of_long();
        assert_eq!(scratch.norm.capacity(), 0);
        assert_eq!(scratch.word_hashes.capacity(), 0);
        assert!(scratch.tmp.capacity() >= 1000);
        assert!(scratch.wide.capacity() >= LONG_BUFFER / 8);

        let hasher = SimHasher::new(FingerprintConfig::candidates()).unwrap();
        let text = "The quick brown fox jumps over the lazy dog, “again” and again. ";
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let fresh = hasher.fingerprint_and_set_with(text, &mut Scratch::default(), &mut a);
        let mut used = Scratch::default();
        hasher.fingerprint_and_set_with(&text.repeat(50), &mut used, &mut b);
        used.let_go_of_long();
        let again = hasher.fingerprint_and_set_with(text, &mut used, &mut b);
        assert_eq!((fresh, &a), (again, &b));
        assert!(!a.is_empty());
    }

    /// One reading gives what two give: the plain fingerprint and the
    /// shares, for unit (term frequency) and real (IDF) weights.
    #[test]
    fn fingerprint_and_shares_are_each_as_alone() {
        let text = "Near-duplicate pages differ in a few words, “quoted” or   spaced; \
                    网页的近似重复检测 and more words than one, again and again.";
        let mut idf = FingerprintConfig::candidates();
        idf.weights = crate::config::Weights::TfIdf;
        for config in [
            FingerprintConfig::candidates(),
            FingerprintConfig::default(),
            idf,
        ] {
            let hasher = SimHasher::new(config).unwrap();
            for t in [text, "", "one"] {
                let (fp, shares) = hasher.fingerprint_and_shares(t);
                assert_eq!(fp, hasher.fingerprint(t));
                assert_eq!(shares, hasher.shares(t));
            }
        }
    }
}
