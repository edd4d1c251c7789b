//! [`Overrides`]: the pipeline settings a user gave, each one `None` unless
//! given, filled alike by every entry point (the command line's flags, the
//! Python keywords, the Spark job's arguments) and applied by one function.
//!
//! A setting is applied because it was given, never because it differs from
//! a default: `bits = 64` over the 128-bit candidate configuration of a
//! verified dedup gives 64 bits, although 64 is the library's default width.

use serde::{Deserialize, Serialize};

use crate::config::{Features, FingerprintConfig, HashFunction, Profile, Tokenizer, Weights};
use crate::error::Error;
use crate::fingerprint::Width;

/// Pipeline settings given by a user; `None` (or absent in JSON) is "not
/// given". The IDF table is not among them: it is a file, which each entry
/// point reads (and checks against the result) itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Overrides {
    /// A compatibility profile; `python-simhash` fixes every other setting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
    /// Fingerprint width.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bits: Option<Width>,
    /// How text is cut into tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<Tokenizer>,
    /// What a feature is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features: Option<Features>,
    /// How features are weighted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights: Option<Weights>,
    /// Keep only the `top` heaviest features.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top: Option<usize>,
    /// The feature hash function.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash: Option<HashFunction>,
    /// Seed of the hash function and of vector hyperplanes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Remove English and Chinese stop words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopwords: Option<bool>,
    /// Strip HTML.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub html: Option<bool>,
    /// Unicode NFKC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nfkc: Option<bool>,
    /// Unicode case folding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub casefold: Option<bool>,
    /// Whitespace collapsing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whitespace: Option<bool>,
}

impl Overrides {
    /// Whether no setting was given.
    pub fn is_empty(&self) -> bool {
        *self == Overrides::default()
    }

    /// Whether a setting other than the profile was given.
    fn any_setting(&self) -> bool {
        Overrides {
            profile: None,
            ..self.clone()
        } != Overrides::default()
    }

    /// `base` with every given setting applied (not validated: see
    /// [`Overrides::resolve`]). The `python-simhash` profile replaces `base`
    /// and takes no other setting.
    pub fn apply(&self, base: FingerprintConfig) -> Result<FingerprintConfig, Error> {
        if self.profile == Some(Profile::PythonSimhash) {
            if self.any_setting() {
                return Err(Error::InvalidConfig(
                    "the python-simhash profile fixes every pipeline setting (64 bits, md5, \
                     character 4-grams, counts): give no other pipeline setting with it"
                        .into(),
                ));
            }
            return Ok(FingerprintConfig::python_simhash());
        }
        let mut c = base;
        if let Some(p) = self.profile {
            c.profile = p;
        }
        let Overrides {
            profile: _,
            bits,
            tokenizer,
            features,
            weights,
            top,
            hash,
            seed,
            stopwords,
            html,
            nfkc,
            casefold,
            whitespace,
        } = *self;
        if let Some(v) = bits {
            c.bits = v;
        }
        if let Some(v) = tokenizer {
            c.tokenizer = v;
        }
        if let Some(v) = features {
            c.features = v;
        }
        if let Some(v) = weights {
            c.weights = v;
        }
        if let Some(v) = top {
            c.top = Some(v);
        }
        if let Some(v) = hash {
            c.hash = v;
        }
        if let Some(v) = seed {
            c.seed = v;
        }
        if let Some(v) = stopwords {
            c.stopwords = v;
        }
        if let Some(v) = html {
            c.normalize.html = v;
        }
        if let Some(v) = nfkc {
            c.normalize.nfkc = v;
        }
        if let Some(v) = casefold {
            c.normalize.casefold = v;
        }
        if let Some(v) = whitespace {
            c.normalize.whitespace = v;
        }
        Ok(c)
    }

    /// [`Overrides::apply`], then [`FingerprintConfig::validate`].
    pub fn resolve(&self, base: FingerprintConfig) -> Result<FingerprintConfig, Error> {
        let c = self.apply(base)?;
        c.validate()?;
        Ok(c)
    }

    /// Whether a dedup starts from the candidate configuration: verified,
    /// with neither a saved configuration (`given`) nor a profile.
    pub fn starts_from_candidates(&self, verified: bool, given: bool) -> bool {
        verified && !given && self.profile.is_none()
    }

    /// The configuration a dedup fingerprints with, the same at every entry
    /// point: `given` (a saved configuration) if any; else, with verification
    /// and no profile, the candidate configuration
    /// ([`FingerprintConfig::candidates`]); else the default; with the given
    /// settings applied over it. The flag says whether the candidate
    /// configuration was the base (only its fingerprints are centred on the
    /// corpus).
    pub fn dedup_config(
        &self,
        verified: bool,
        given: Option<FingerprintConfig>,
    ) -> Result<(FingerprintConfig, bool), Error> {
        let candidates = self.starts_from_candidates(verified, given.is_some());
        let base = match given {
            Some(c) => c,
            None if candidates => FingerprintConfig::candidates(),
            None => FingerprintConfig::default(),
        };
        Ok((self.resolve(base)?, candidates))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn given<T: Clone + std::fmt::Debug + 'static>(
        values: Vec<T>,
    ) -> impl Strategy<Value = Option<T>> {
        proptest::option::of(proptest::sample::select(values))
    }

    prop_compose! {
        fn overrides()(
            bits in given(vec![Width::W64, Width::W128]),
            tokenizer in given(vec![Tokenizer::Auto, Tokenizer::Words, Tokenizer::Chars]),
            features in given(vec![Features::Tokens, Features::Shingles(3), Features::Ngrams(4)]),
            weights in given(vec![Weights::Tf, Weights::Binary]),
            top in given(vec![8usize, 64]),
            hash in given(vec![HashFunction::Xxh3, HashFunction::Fnv1a]),
            seed in given(vec![0u64, 7]),
            stopwords in given(vec![false, true]),
            html in given(vec![false, true]),
        ) -> Overrides {
            Overrides { bits, tokenizer, features, weights, top, hash, seed, stopwords, html,
                        ..Overrides::default() }
        }
    }

    proptest! {
        /// Every given setting is in the result whatever the base, also when
        /// it equals the library's default; every setting not given is the
        /// base's.
        #[test]
        fn given_settings_win_and_the_rest_is_the_base(o in overrides(), verified: bool) {
            let (c, candidates) = o.dedup_config(verified, None).unwrap();
            let base = if verified { FingerprintConfig::candidates() } else { FingerprintConfig::default() };
            prop_assert_eq!(candidates, verified);
            prop_assert_eq!(c.bits, o.bits.unwrap_or(base.bits));
            prop_assert_eq!(c.tokenizer, o.tokenizer.unwrap_or(base.tokenizer));
            prop_assert_eq!(c.features, o.features.unwrap_or(base.features));
            prop_assert_eq!(c.weights, o.weights.unwrap_or(base.weights));
            prop_assert_eq!(c.top, o.top.or(base.top));
            prop_assert_eq!(c.hash, o.hash.unwrap_or(base.hash));
            prop_assert_eq!(c.seed, o.seed.unwrap_or(base.seed));
            prop_assert_eq!(c.stopwords, o.stopwords.unwrap_or(base.stopwords));
            prop_assert_eq!(c.normalize.html, o.html.unwrap_or(base.normalize.html));
            // Through JSON (as the Python and Spark entry points hand them
            // over), the same settings.
            let back: Overrides = serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
            prop_assert_eq!(back, o);
        }
    }

    /// The defect this type exists for: 64 bits given over the verified
    /// dedup's 128-bit candidates stays 64 bits.
    #[test]
    fn a_default_value_given_is_not_dropped() {
        let o: Overrides =
            serde_json::from_str(r#"{"bits": 64, "features": "shingles:3"}"#).unwrap();
        let (c, _) = o.dedup_config(true, None).unwrap();
        assert_eq!(c.bits, Width::W64);
        assert_eq!(c.features, Features::Shingles(3));
        assert_eq!(c.tokenizer, Tokenizer::Words);
    }

    #[test]
    fn profiles_and_unknown_settings() {
        let p = Overrides {
            profile: Some(Profile::PythonSimhash),
            ..Overrides::default()
        };
        let (c, candidates) = p.dedup_config(true, None).unwrap();
        assert_eq!(c, FingerprintConfig::python_simhash());
        assert!(!candidates, "a profile is not the candidate configuration");
        let both = Overrides {
            bits: Some(Width::W64),
            ..p
        };
        assert!(both.apply(FingerprintConfig::default()).is_err());
        assert!(serde_json::from_str::<Overrides>(r#"{"bitz": 64}"#).is_err());
        let given = FingerprintConfig {
            seed: 9,
            ..FingerprintConfig::default()
        };
        let (c, candidates) = Overrides::default()
            .dedup_config(true, Some(given.clone()))
            .unwrap();
        assert_eq!((c, candidates), (given, false));
    }
}
