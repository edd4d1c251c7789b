//! [`FingerprintConfig`]: one serialisable description of how fingerprints are made.
//!
//! Every file and answer that carries fingerprints also carries the configuration
//! that made them (or its [`FingerprintConfig::digest`]), so that fingerprints made
//! differently are never compared by mistake.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::fingerprint::Width;

/// How text becomes a fingerprint. The default is the measured default of `neardup`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FingerprintConfig {
    /// Fingerprint width (64 or 128).
    pub bits: Width,
    /// A compatibility profile; when set, it alone decides the pipeline.
    pub profile: Profile,
    /// Text normalisation.
    pub normalize: NormalizeConfig,
    /// How text is cut into tokens.
    pub tokenizer: Tokenizer,
    /// What a feature is: a token, a shingle of tokens, or a character n-gram.
    pub features: Features,
    /// Remove English and Chinese stop words from the token stream.
    pub stopwords: bool,
    /// How features are weighted.
    pub weights: Weights,
    /// The IDF table used by `weights = tfidf`, if one learned from a corpus.
    pub idf: Option<IdfRef>,
    /// Keep only the `top` heaviest features.
    pub top: Option<usize>,
    /// The hash function applied to each feature.
    pub hash: HashFunction,
    /// Seed of the hash function (xxh3, SipHash) and of vector hyperplanes.
    pub seed: u64,
    /// What a document is: text (through the pipeline above), a dense vector
    /// (an embedding), or a list of weighted features.
    #[serde(skip_serializing_if = "Input::is_text")]
    pub input: Input,
    /// For dense vectors: the dimension every vector must have.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dim: Option<usize>,
}

impl Default for FingerprintConfig {
    fn default() -> Self {
        FingerprintConfig {
            bits: Width::W64,
            profile: Profile::Native,
            normalize: NormalizeConfig::default(),
            tokenizer: Tokenizer::Auto,
            features: Features::Shingles(3),
            stopwords: false,
            weights: Weights::Tf,
            idf: None,
            top: None,
            hash: HashFunction::Xxh3,
            seed: 0,
            input: Input::Text,
            dim: None,
        }
    }
}

/// The IDF table a configuration uses: its content digest (checked when loaded)
/// and where it was found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdfRef {
    /// Where the table was loaded from (a hint for tools; the digest decides).
    pub path: Option<String>,
    /// The table's content digest, as [`crate::IdfTable::digest`] gives it.
    pub digest: String,
}

impl FingerprintConfig {
    /// The configuration that finds candidates for verification (`neardup
    /// dedup` with `--verify`, its default): single tokens with term frequency,
    /// 128 bits. Measured in docs/quality.md: near-duplicates at Jaccard 0.8 of
    /// 3-shingles sit within a small distance of each other in this space, so
    /// a wide k finds nearly all of them, and the 128 bits keep unrelated
    /// documents of one vocabulary far apart, so the candidates stay few.
    /// The tokens are UAX #29 words, which makes each Han character one: for
    /// Chinese, made in about half the time jieba's words take, and (since
    /// verification compares character 3-grams) about as good as candidates:
    /// better on copies with character edits, a little worse on inserted
    /// boilerplate (docs/quality.md has both).
    pub fn candidates() -> Self {
        FingerprintConfig {
            bits: Width::W128,
            features: Features::Tokens,
            tokenizer: Tokenizer::Words,
            ..FingerprintConfig::default()
        }
    }

    /// The configuration of the `python-simhash` compatibility profile.
    pub fn python_simhash() -> Self {
        FingerprintConfig {
            bits: Width::W64,
            profile: Profile::PythonSimhash,
            normalize: NormalizeConfig {
                html: false,
                nfkc: false,
                casefold: true,
                whitespace: false,
            },
            tokenizer: Tokenizer::Chars,
            features: Features::Ngrams(4),
            stopwords: false,
            weights: Weights::Tf,
            idf: None,
            top: None,
            hash: HashFunction::Md5,
            seed: 0,
            input: Input::Text,
            dim: None,
        }
    }

    /// The configuration for dense vectors of `dim` dimensions (or any, if
    /// `None`) at `bits` bits: random hyperplanes drawn from `seed`.
    pub fn vectors(bits: Width, dim: Option<usize>, seed: u64) -> Self {
        FingerprintConfig {
            bits,
            input: Input::Vector,
            dim,
            seed,
            ..FingerprintConfig::default()
        }
    }

    /// The configuration for lists of weighted features (`feature -> weight`),
    /// each feature hashed with `hash` and `seed`.
    pub fn weighted_features(bits: Width, hash: HashFunction, seed: u64) -> Self {
        FingerprintConfig {
            bits,
            input: Input::Features,
            hash,
            seed,
            ..FingerprintConfig::default()
        }
    }

    /// Checks that the settings are possible and agree with each other.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if self.dim.is_some() && self.input != Input::Vector {
            return bad("a dimension (--dim) is set only for dense vectors".into());
        }
        if self.dim == Some(0) {
            return bad("the vector dimension must be at least 1".into());
        }
        if self.input != Input::Text {
            // Only the width and seed (and, for features, the hash) apply.
            let text = FingerprintConfig {
                bits: self.bits,
                seed: self.seed,
                hash: self.hash,
                input: self.input,
                dim: self.dim,
                ..FingerprintConfig::default()
            };
            if *self != text {
                return bad(format!(
                    "the text pipeline settings (profile, --tokenizer, --features, --weights, \
                     --top, --stopwords, --html, --idf) do not apply to {}: remove them",
                    self.input.plural()
                ));
            }
            if self.input == Input::Vector && self.hash != HashFunction::Xxh3 {
                return bad(
                    "dense vectors are projected on random hyperplanes, not hashed: remove --hash"
                        .into(),
                );
            }
            return Ok(());
        }
        if self.profile == Profile::PythonSimhash {
            let expected = FingerprintConfig::python_simhash();
            if *self != expected {
                return bad(
                    "the python-simhash profile fixes every pipeline setting (64 bits, md5, \
                     character 4-grams, counts); remove the other pipeline options"
                        .into(),
                );
            }
            return Ok(());
        }
        match self.features {
            Features::Shingles(w) if !(1..=MAX_WIDTH).contains(&w) => {
                return bad(format!(
                    "shingle width {w} is out of range: use 1 to {MAX_WIDTH}"
                ));
            }
            Features::Ngrams(n) if !(1..=MAX_WIDTH).contains(&n) => {
                return bad(format!(
                    "n-gram width {n} is out of range: use 1 to {MAX_WIDTH}"
                ));
            }
            _ => {}
        }
        if self.top == Some(0) {
            return bad("--top must be at least 1 (or leave it out to keep every feature)".into());
        }
        let jieba_keywords = matches!(self.weights, Weights::TextRank)
            || (self.weights == Weights::TfIdf && self.idf.is_none());
        if jieba_keywords && self.features != Features::Tokens {
            return bad(if self.weights == Weights::TextRank {
                "--weights textrank weighs jieba's keywords, which are single tokens: use \
                 --features tokens, or --weights tfidf with a table learned for your features \
                 by `neardup idf build` (--idf FILE)"
                    .to_owned()
            } else {
                "--weights tfidf without a learned IDF table weighs jieba's keywords, which are \
                 single tokens: use --features tokens, or learn a table for your features \
                 with `neardup idf build` and pass it with --idf"
                    .to_owned()
            });
        }
        if self.weights == Weights::TextRank && self.idf.is_some() {
            return bad("an IDF table is used only with --weights tfidf".into());
        }
        if self.idf.is_some() && self.weights != Weights::TfIdf {
            return bad("an IDF table is used only with --weights tfidf".into());
        }
        Ok(())
    }

    /// A short stable digest of the configuration (16 hex digits), equal for equal
    /// configurations. Files record it so that mixed configurations are refused.
    pub fn digest(&self) -> String {
        let canonical = serde_json::to_vec(&self.canonical()).expect("config serialises");
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&canonical))
    }

    /// The digest of what decides the feature strings (not their weights or
    /// hashes): an IDF table records it, and is used only with configurations
    /// that match.
    pub fn features_digest(&self) -> String {
        FingerprintConfig {
            weights: Weights::Tf,
            idf: None,
            top: None,
            hash: HashFunction::Xxh3,
            seed: 0,
            bits: Width::W64,
            ..self.clone()
        }
        .digest()
    }

    /// The configuration with hints that do not change fingerprints removed.
    fn canonical(&self) -> FingerprintConfig {
        let mut c = self.clone();
        if let Some(idf) = &mut c.idf {
            idf.path = None;
        }
        c
    }

    /// Refuses to mix fingerprints made by `self` and `other`.
    pub fn check_compatible(&self, other: &FingerprintConfig) -> Result<(), Error> {
        if self.canonical() == other.canonical() {
            return Ok(());
        }
        Err(Error::ConfigMismatch(format!(
            "expected configuration {} ({}), got {} ({})",
            self.digest(),
            self.summary(),
            other.digest(),
            other.summary()
        )))
    }

    /// One line saying what the configuration does, for humans.
    pub fn summary(&self) -> String {
        if self.profile == Profile::PythonSimhash {
            return "profile python-simhash".into();
        }
        match self.input {
            Input::Text => {}
            Input::Vector => {
                let dim = self.dim.map_or_else(|| "any".into(), |d| d.to_string());
                return format!(
                    "dense vectors of dimension {dim}, {} bits, hyperplane seed {}",
                    self.bits, self.seed
                );
            }
            Input::Features => {
                return format!(
                    "weighted features, {} bits, hash {}, seed {}",
                    self.bits, self.hash, self.seed
                );
            }
        }
        let mut s = format!(
            "{} bits, tokenizer {}, features {}, weights {}, hash {}",
            self.bits, self.tokenizer, self.features, self.weights, self.hash
        );
        if let Some(top) = self.top {
            s.push_str(&format!(", top {top}"));
        }
        if self.stopwords {
            s.push_str(", stop words removed");
        }
        if self.normalize.html {
            s.push_str(", HTML stripped");
        }
        s
    }
}

/// The largest shingle or n-gram width accepted.
pub const MAX_WIDTH: usize = 16;

/// Text normalisation steps, applied in this order: HTML, NFKC, case folding, whitespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NormalizeConfig {
    /// Strip HTML tags, comments, scripts and styles; decode entities.
    pub html: bool,
    /// Unicode NFKC (full-width forms, ligatures, compatibility characters).
    pub nfkc: bool,
    /// Unicode default case folding.
    pub casefold: bool,
    /// Collapse whitespace runs to one space, and remove whitespace between two
    /// CJK characters (so hard-wrapped Chinese equals unwrapped Chinese).
    pub whitespace: bool,
}

impl Default for NormalizeConfig {
    fn default() -> Self {
        NormalizeConfig {
            html: false,
            nfkc: true,
            casefold: true,
            whitespace: true,
        }
    }
}

macro_rules! keyword_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            /// Every accepted spelling, for help texts.
            pub const NAMES: &'static [&'static str] = &[$($text),+];
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self { $($name::$variant => $text),+ })
            }
        }

        impl FromStr for $name {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self, Error> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(Error::InvalidConfig(format!(
                        "unknown {} {s:?}: use one of {}",
                        stringify!($name).to_lowercase(),
                        Self::NAMES.join(", ")
                    ))),
                }
            }
        }
    };
}

keyword_enum!(
    /// What a document is.
    Input {
        /// Text, made into features by the pipeline.
        #[default]
        Text = "text",
        /// A dense vector (an embedding), fingerprinted by random hyperplanes.
        Vector = "vector",
        /// Features with their weights, given by the caller.
        Features = "features",
    }
);

impl Input {
    fn is_text(&self) -> bool {
        *self == Input::Text
    }

    /// The kind of document in the plural, for messages.
    pub fn plural(self) -> &'static str {
        match self {
            Input::Text => "texts",
            Input::Vector => "dense vectors",
            Input::Features => "weighted features",
        }
    }
}

keyword_enum!(
    /// A compatibility profile.
    Profile {
        /// neardup's own pipeline, configured by the other settings.
        #[default]
        Native = "native",
        /// Bit-for-bit the fingerprints of the PyPI `simhash` library.
        PythonSimhash = "python-simhash",
    }
);

keyword_enum!(
    /// How text is cut into tokens.
    Tokenizer {
        /// Per script run: jieba for Han text, Unicode words for the rest.
        #[default]
        Auto = "auto",
        /// Unicode words (UAX #29).
        Words = "words",
        /// Chinese words with jieba (mixed Chinese/English handled in one pass).
        Jieba = "jieba",
        /// Every letter or digit is a token.
        Chars = "chars",
    }
);

keyword_enum!(
    /// How features are weighted.
    Weights {
        /// Term frequency: each occurrence counts once.
        #[default]
        Tf = "tf",
        /// Every distinct feature weighs 1.
        Binary = "binary",
        /// Term frequency times inverse document frequency.
        TfIdf = "tfidf",
        /// TextRank keyword scores (jieba).
        TextRank = "textrank",
    }
);

keyword_enum!(
    /// The hash function applied to each feature.
    HashFunction {
        /// xxh3 (64- or 128-bit output): the fastest, the default.
        #[default]
        Xxh3 = "xxh3",
        /// FNV-1a (64- or 128-bit variant).
        Fnv1a = "fnv1a",
        /// MD5: the 128-bit digest, or its last 8 bytes for 64 bits (as PyPI `simhash`).
        Md5 = "md5",
        /// SipHash-2-4 keyed with (seed, 0): 64- or 128-bit output.
        SipHash = "siphash",
    }
);

/// What a feature is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Features {
    /// Each token is a feature.
    Tokens,
    /// Each run of W consecutive tokens (joined by one space) is a feature.
    Shingles(usize),
    /// Each run of N consecutive characters of the normalised text is a feature.
    Ngrams(usize),
}

impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Features::Tokens => f.write_str("tokens"),
            Features::Shingles(w) => write!(f, "shingles:{w}"),
            Features::Ngrams(n) => write!(f, "ngrams:{n}"),
        }
    }
}

impl FromStr for Features {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || {
            Error::InvalidConfig(format!(
                "unknown features {s:?}: use tokens, shingles:W or ngrams:N (W, N from 1 to {MAX_WIDTH})"
            ))
        };
        if s == "tokens" {
            return Ok(Features::Tokens);
        }
        let (kind, width) = s.split_once(':').ok_or_else(bad)?;
        let width: usize = width.parse().map_err(|_| bad())?;
        if !(1..=MAX_WIDTH).contains(&width) {
            return Err(bad());
        }
        match kind {
            "shingles" => Ok(Features::Shingles(width)),
            "ngrams" => Ok(Features::Ngrams(width)),
            _ => Err(bad()),
        }
    }
}

impl TryFrom<String> for Features {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        s.parse()
    }
}

impl From<Features> for String {
    fn from(f: Features) -> String {
        f.to_string()
    }
}

/// `path` relative to the folder `from` (both made absolute first), with
/// `..` where needed, or `path` made absolute if the two share no root: how
/// a saved configuration names its IDF table, so that the two move together.
pub fn relative_to(path: &std::path::Path, from: &std::path::Path) -> std::path::PathBuf {
    use std::path::Component;
    let (Ok(path), Ok(from)) = (std::path::absolute(path), std::path::absolute(from)) else {
        return path.to_path_buf();
    };
    let a: Vec<Component> = path.components().collect();
    let b: Vec<Component> = from.components().collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    if common == 0 {
        return path.clone();
    }
    let mut out: std::path::PathBuf = b[common..].iter().map(|_| Component::ParentDir).collect();
    out.extend(&a[common..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip() {
        let c = FingerprintConfig {
            features: Features::Ngrams(5),
            bits: Width::W128,
            top: Some(64),
            ..Default::default()
        };
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"ngrams:5\""), "{json}");
        assert!(json.contains("\"bits\":128"), "{json}");
        let back: FingerprintConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.digest(), c.digest());
    }

    #[test]
    fn unknown_fields_and_values_are_refused() {
        assert!(serde_json::from_str::<FingerprintConfig>(r#"{"bitz": 64}"#).is_err());
        assert!(serde_json::from_str::<FingerprintConfig>(r#"{"bits": 32}"#).is_err());
        assert!(
            serde_json::from_str::<FingerprintConfig>(r#"{"features": "shingles:0"}"#).is_err()
        );
        assert!(serde_json::from_str::<FingerprintConfig>(r#"{"hash": "crc"}"#).is_err());
    }

    #[test]
    fn digest_differs_when_fingerprints_would() {
        let a = FingerprintConfig::default();
        let b = FingerprintConfig {
            seed: 1,
            ..Default::default()
        };
        assert_ne!(a.digest(), b.digest());
        assert!(a.check_compatible(&b).is_err());
        assert!(a.check_compatible(&a.clone()).is_ok());
    }

    #[test]
    fn relative_paths() {
        use std::path::Path;
        let r = |p: &str, f: &str| relative_to(Path::new(p), Path::new(f));
        assert_eq!(r("/a/b/t.idf", "/a/b"), Path::new("t.idf"));
        assert_eq!(r("/a/b/t.idf", "/a/c/d"), Path::new("../../b/t.idf"));
        assert_eq!(r("/a/t.idf", "/"), Path::new("a/t.idf"));
    }

    #[test]
    fn contradictions_are_refused() {
        let c = FingerprintConfig {
            weights: Weights::TextRank,
            features: Features::Shingles(2),
            ..Default::default()
        };
        assert!(c.validate().is_err());
        let mut p = FingerprintConfig::python_simhash();
        assert!(p.validate().is_ok());
        p.bits = Width::W128;
        assert!(p.validate().is_err());
        assert!("shingles:17".parse::<Features>().is_err());
        assert!("ngrams:x".parse::<Features>().is_err());
        assert_eq!(
            "shingles:3".parse::<Features>().unwrap(),
            Features::Shingles(3)
        );
    }
}
