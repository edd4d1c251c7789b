//! [`SimHasher`]: documents, feature lists and vectors to fingerprints.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use jieba_rs::{KeywordExtract, TextRank, TfIdf};

use crate::accumulate::{UnitSums, WeightedSums};
use crate::config::{Features, FingerprintConfig, HashFunction, Profile, Tokenizer, Weights};
use crate::error::Error;
use crate::fingerprint::{Fingerprint, Width};
use crate::hash::FeatureHasher;
use crate::idf::IdfTable;
use crate::normalize::{is_invariant, normalize_into};
use crate::rng::SplitMix64;
use crate::tokenize::{for_each_token, jieba};
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
    counts: HashMap<u128, (f64, f64)>,
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
        if self.config.profile == Profile::PythonSimhash {
            let mut sums = UnitSums::new(Width::W64);
            python_simhash::for_each_feature(text, &mut scratch.norm, &mut |f| {
                sums.add(self.hasher.hash(f.as_bytes()))
            });
            return sums.finish();
        }
        if self.uses_jieba_keywords() {
            normalize_into(
                &self.config.normalize,
                text,
                &mut scratch.norm,
                &mut scratch.tmp,
            );
            let mut sums = WeightedSums::new(self.width());
            for (word, weight) in self.jieba_keywords(&scratch.norm) {
                sums.add(self.hasher.hash(word.as_bytes()), weight);
            }
            return sums.finish();
        }
        let needs_aggregation =
            self.config.top.is_some() || !matches!(self.config.weights, Weights::Tf);
        if !needs_aggregation && self.can_skip_normalisation(text) {
            // Words of text that normalisation leaves alone (up to ASCII case):
            // tokenize the text itself and lower-case features as they go.
            let (shingle, lower) = (&mut scratch.shingle, &mut scratch.tmp);
            return self.unit_fingerprint_lowering(text, shingle, lower);
        }
        normalize_into(
            &self.config.normalize,
            text,
            &mut scratch.norm,
            &mut scratch.tmp,
        );
        if !needs_aggregation {
            // Term frequency: every occurrence adds weight 1; no counting needed.
            // The hash function is chosen once, outside the loop, so that the whole
            // chain from tokenizer to sums inlines.
            let (norm, shingle) = (&scratch.norm, &mut scratch.shingle);
            return match (self.config.hash, self.width()) {
                (HashFunction::Xxh3, Width::W64) => {
                    let seed = self.config.seed;
                    self.unit_fingerprint(norm, shingle, |f| {
                        xxhash_rust::xxh3::xxh3_64_with_seed(f, seed) as u128
                    })
                }
                _ => self.unit_fingerprint(norm, shingle, |f| self.hasher.hash(f)),
            };
        }
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
        sums.finish()
    }

    /// Whether `text`'s tokens are the same with and without normalisation, up to
    /// ASCII case: word tokens, no HTML, no stop words (their list is lower-case),
    /// and only characters normalisation leaves alone. (Shingles are faster on
    /// normalised text, where they are zero-copy slices: measured, 8% slower here.)
    fn can_skip_normalisation(&self, text: &str) -> bool {
        matches!(self.config.tokenizer, Tokenizer::Words | Tokenizer::Auto)
            && self.config.features == Features::Tokens
            && !self.config.normalize.html
            && self.stopwords.is_none()
            && (text.is_ascii() || text.chars().all(is_invariant))
    }

    /// Term-frequency fingerprint of the raw text's features, lower-cased (when
    /// case folding) as they are emitted.
    fn unit_fingerprint_lowering(
        &self,
        text: &str,
        shingle: &mut String,
        lower: &mut String,
    ) -> Fingerprint {
        let casefold = self.config.normalize.casefold;
        let seed = self.config.seed;
        let xxh3_64 = matches!(
            (self.config.hash, self.width()),
            (HashFunction::Xxh3, Width::W64)
        );
        let mut sums = UnitSums::new(self.width());
        let mut add = |f: &str| {
            let f = if casefold && f.bytes().any(|b| b.is_ascii_uppercase()) {
                lower.clear();
                lower.push_str(f);
                lower.make_ascii_lowercase();
                lower.as_str()
            } else {
                f
            };
            sums.add(if xxh3_64 {
                xxhash_rust::xxh3::xxh3_64_with_seed(f.as_bytes(), seed) as u128
            } else {
                self.hasher.hash(f.as_bytes())
            });
        };
        self.for_each_feature(text, shingle, &mut add);
        sums.finish()
    }

    #[inline]
    fn unit_fingerprint(
        &self,
        norm: &str,
        shingle: &mut String,
        hash: impl Fn(&[u8]) -> u128,
    ) -> Fingerprint {
        let mut sums = UnitSums::new(self.width());
        self.for_each_feature(norm, shingle, &mut |f| sums.add(hash(f.as_bytes())));
        sums.finish()
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
                // spaced[i]: token i follows the previous one after exactly one space.
                let mut spaced = [false; MAX_WIDTH];
                let mut seen = 0usize;
                let mut prev_end = usize::MAX;
                for_each_token(tokenizer, norm, &mut |t| {
                    if stop(t) {
                        return;
                    }
                    let start = t.as_ptr() as usize - base;
                    let end = start + t.len();
                    spaced[seen % w] =
                        prev_end != usize::MAX && start == prev_end + 1 && bytes[prev_end] == b' ';
                    prev_end = end;
                    ring[seen % w] = (start, end);
                    seen += 1;
                    if seen < w {
                        return;
                    }
                    let first = seen % w; // the oldest token of the window
                    if (1..w).all(|j| spaced[(first + j) % w]) {
                        emit(&norm[ring[first].0..end]);
                        return;
                    }
                    shingle.clear();
                    for j in 0..w {
                        if j > 0 {
                            shingle.push(' ');
                        }
                        let (s, e) = ring[(first + j) % w];
                        shingle.push_str(&norm[s..e]);
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
            normalize_into(
                &self.config.normalize,
                text,
                &mut scratch.norm,
                &mut scratch.tmp,
            );
            for (word, weight) in self.jieba_keywords(&scratch.norm) {
                out.push(Feature {
                    hash: self.hasher.hash(word.as_bytes()),
                    text: word,
                    weight,
                });
            }
        } else {
            normalize_into(
                &self.config.normalize,
                text,
                &mut scratch.norm,
                &mut scratch.tmp,
            );
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
    /// angle between vectors, θ ≈ π·h/f (Charikar 2002). The hyperplanes' entries
    /// for dimension j come from a generator seeded by (seed, j): made on the fly,
    /// never stored, the same on every machine.
    pub fn fingerprint_dense(&self, vector: &[f32]) -> Result<Fingerprint, Error> {
        let bits = self.width().bits() as usize;
        let mut v = [0f64; 128];
        for (j, &x) in vector.iter().enumerate() {
            check_weight(x as f64)?;
            if x == 0.0 {
                continue;
            }
            let mut rng = SplitMix64(xxhash_rust::xxh3::xxh3_64_with_seed(
                &(j as u64).to_le_bytes(),
                self.config.seed,
            ));
            for pair in v[..bits].chunks_exact_mut(2) {
                let (g0, g1) = gaussian_pair(&mut rng);
                pair[0] += x as f64 * g0;
                pair[1] += x as f64 * g1;
            }
        }
        let mut value = 0u128;
        for (i, &x) in v[..bits].iter().enumerate() {
            if x > 0.0 {
                value |= 1 << i;
            }
        }
        Ok(Fingerprint::new(value, self.width()))
    }
}

/// Two independent standard normal values (Box–Muller).
fn gaussian_pair(rng: &mut SplitMix64) -> (f64, f64) {
    let r = (-2.0 * rng.unit().ln()).sqrt();
    let t = std::f64::consts::TAU * rng.unit();
    (r * t.cos(), r * t.sin())
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
