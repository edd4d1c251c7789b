//! The fingerprint pipeline flags shared by every command that fingerprints text.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use neardup_core::config::relative_to;
use neardup_core::{
    Features, FingerprintConfig, HashFunction, IdfRef, IdfTable, InputKind, Overrides, Profile,
    SimHasher, Tokenizer, Weights, Width,
};

use crate::input::InputArgs;

/// The hasher for the pipeline flags and what the inputs say the documents
/// are (vectors, features, text); `input` then reads documents of that kind.
pub fn hasher_for(pipeline: &PipelineArgs, input: &mut InputArgs) -> Result<SimHasher> {
    let mut p = pipeline.clone();
    p.hint = p.hint.or(input.hint());
    let hasher = p.hasher()?;
    input.read_as(hasher.config());
    Ok(hasher)
}

/// Refuses vector and feature inputs, for commands that work on text only.
pub fn text_only(input: &InputArgs, command: &str) -> Result<()> {
    if let Some(kind) = input.hint().filter(|&k| k != InputKind::Text) {
        bail!("{command} works on texts, not on {}", kind.plural());
    }
    Ok(())
}

/// How text becomes a fingerprint.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Fingerprint pipeline")]
pub struct PipelineArgs {
    /// Load a saved configuration (JSON, as `neardup config` prints); flags given
    /// as well override its settings.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// A compatibility profile. `python-simhash` reproduces PyPI simhash's
    /// fingerprints bit for bit and fixes every other pipeline setting.
    #[arg(long, value_name = "NAME", value_parser = keyword::<Profile>(Profile::NAMES),
          conflicts_with_all = ["bits", "tokenizer", "features", "weights", "top", "hash", "seed", "stopwords", "html", "idf"])]
    pub profile: Option<Profile>,

    /// Fingerprint width.
    #[arg(long, value_name = "BITS", value_parser = keyword::<Width>(Width::NAMES))]
    pub bits: Option<Width>,

    /// How text is cut into tokens: auto (jieba for Chinese runs, Unicode words
    /// otherwise), words (UAX #29), jieba, chars.
    #[arg(long, value_name = "NAME", value_parser = keyword::<Tokenizer>(Tokenizer::NAMES))]
    pub tokenizer: Option<Tokenizer>,

    /// What a feature is: tokens, shingles:W (W consecutive tokens) or ngrams:N
    /// (N consecutive characters), with W and N from 1 to 16.
    #[arg(long, value_name = "KIND", value_parser = parse_features)]
    pub features: Option<Features>,

    /// Feature weights: tf, binary, tfidf (with --idf FILE, or jieba's built-in
    /// table through its keyword extractor), textrank (jieba).
    #[arg(long, value_name = "NAME", value_parser = keyword::<Weights>(Weights::NAMES))]
    pub weights: Option<Weights>,

    /// Keep only the N heaviest features of each document.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub top: Option<u64>,

    /// Feature hash function.
    #[arg(long, value_name = "NAME", value_parser = keyword::<HashFunction>(HashFunction::NAMES))]
    pub hash: Option<HashFunction>,

    /// Seed of the hash function (xxh3, siphash) and of vector hyperplanes.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Remove English and Chinese stop words before making features.
    #[arg(long)]
    pub stopwords: bool,

    /// Strip HTML tags, comments, scripts and styles, and decode entities.
    #[arg(long)]
    pub html: bool,

    /// An IDF table learned with `neardup idf build` (implies --weights tfidf).
    #[arg(long, value_name = "FILE")]
    pub idf: Option<PathBuf>,

    /// Documents are dense vectors of this dimension (embeddings); every
    /// vector must have it. Without it, vectors take the first one's.
    #[arg(long, value_name = "D", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub dim: Option<u64>,

    /// What a document is: text, vector (a dense vector, with --dim or the
    /// first vector's dimension) or features (feature -> weight). Commands
    /// that read inputs tell it from them (--vector-field, --features-field,
    /// .npy); `serve` and `config` take it here.
    #[arg(long, value_name = "KIND", value_parser = keyword::<InputKind>(InputKind::NAMES))]
    pub kind: Option<InputKind>,

    /// What the inputs say the documents are, set by commands.
    #[arg(skip)]
    pub hint: Option<InputKind>,

    /// A configuration to start from (an index's own), set by commands.
    #[arg(skip)]
    pub preset: Option<FingerprintConfig>,
}

/// A flag whose values are a core type's own spellings (`names`): listed in
/// --help and in clap's errors, parsed by the type's `FromStr`, so that the
/// command line never keeps a second list of them.
fn keyword<T>(names: &'static [&'static str]) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
{
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(names.iter().copied()).map(|s: String| {
        s.parse::<T>()
            .unwrap_or_else(|_| unreachable!("{s} is one of the type's own names"))
    })
}

fn parse_features(s: &str) -> Result<Features, String> {
    s.parse().map_err(|e: neardup_core::Error| e.to_string())
}

impl PipelineArgs {
    /// Whether any pipeline flag was given (not counting what commands set).
    pub fn any_given(&self) -> bool {
        let PipelineArgs {
            config,
            profile,
            bits,
            tokenizer,
            features,
            weights,
            top,
            hash,
            seed,
            stopwords,
            html,
            idf,
            dim,
            kind,
            hint: _,
            preset: _,
        } = self;
        config.is_some()
            || profile.is_some()
            || bits.is_some()
            || tokenizer.is_some()
            || features.is_some()
            || weights.is_some()
            || top.is_some()
            || hash.is_some()
            || seed.is_some()
            || *stopwords
            || *html
            || idf.is_some()
            || dim.is_some()
            || kind.is_some()
    }

    /// The pipeline settings the flags give, as every entry point fills
    /// them (a switch given is `Some(true)`, one left out `None`).
    pub fn overrides(&self) -> Overrides {
        Overrides {
            profile: self.profile,
            bits: self.bits,
            tokenizer: self.tokenizer,
            features: self.features,
            weights: self.weights,
            top: self.top.map(|n| n as usize),
            hash: self.hash,
            seed: self.seed,
            stopwords: self.stopwords.then_some(true),
            html: self.html.then_some(true),
            ..Overrides::default()
        }
    }

    /// The configuration the flags describe, and the IDF table if one is used.
    pub fn resolve(&self) -> Result<(FingerprintConfig, Option<IdfTable>)> {
        let mut config = match (&self.config, &self.preset) {
            (Some(path), _) => read_config(path)?,
            (None, Some(preset)) => preset.clone(),
            (None, None) => FingerprintConfig::default(),
        };
        if self.profile == Some(Profile::PythonSimhash) {
            return Ok((FingerprintConfig::python_simhash(), None));
        }
        // Vectors and features keep only the width and seed of a text preset.
        let flag = self.kind;
        if let (Some(flag), Some(hint)) = (flag, self.hint)
            && flag != hint
        {
            bail!(
                "--kind {flag} contradicts the inputs, which are {}",
                hint.plural()
            );
        }
        let kind = flag
            .or(self.hint)
            .or(self.dim.map(|_| InputKind::Vector))
            .unwrap_or(config.input);
        if kind != config.input {
            if self.config.is_some() {
                bail!(
                    "the configuration fingerprints {}, but the inputs are {}",
                    config.input.plural(),
                    kind.plural()
                );
            }
            config = FingerprintConfig {
                bits: config.bits,
                seed: config.seed,
                input: kind,
                ..FingerprintConfig::default()
            };
        }
        if let Some(d) = self.dim {
            config.dim = Some(d as usize);
        }
        config = self.overrides().apply(config)?;

        // A saved configuration names its table relative to its own folder
        // (an absolute path is read as it is).
        let idf_path = self.idf.clone().or_else(|| {
            let named = PathBuf::from(config.idf.as_ref()?.path.as_ref()?);
            Some(match self.config.as_deref().and_then(Path::parent) {
                Some(folder) if named.is_relative() => folder.join(named),
                _ => named,
            })
        });
        let idf = match idf_path {
            Some(path) => {
                if self.weights.is_some() && config.weights != Weights::TfIdf {
                    bail!("--idf goes with --weights tfidf (or leave --weights out)");
                }
                config.weights = Weights::TfIdf;
                let table = read_idf(&path)?;
                if let Some(r) = &config.idf
                    && r.digest != table.digest()
                {
                    bail!(
                        "{}: this IDF table ({}) is not the one the configuration names ({}); \
                             pass the table the configuration was made with",
                        path.display(),
                        table.digest(),
                        r.digest
                    );
                }
                config.idf = Some(IdfRef {
                    // Absolute here; `neardup config` saves it relative to
                    // the file it writes.
                    path: Some(
                        std::path::absolute(&path)
                            .unwrap_or_else(|_| path.clone())
                            .display()
                            .to_string(),
                    ),
                    digest: table.digest().to_owned(),
                });
                Some(table)
            }
            None => {
                if config.idf.is_some() {
                    bail!("the configuration uses an IDF table: pass it with --idf FILE");
                }
                None
            }
        };
        let jieba_keywords = config.weights == Weights::TextRank
            || (config.weights == Weights::TfIdf && idf.is_none());
        if let (true, Some(t)) = (jieba_keywords, &self.tokenizer)
            && config.tokenizer != Tokenizer::Jieba
        {
            bail!(
                "--tokenizer {t} is not used by --weights {}: without an IDF table, jieba's \
                     keyword extractor cuts the text itself; leave --tokenizer out, or learn a \
                     table with `neardup idf build --tokenizer {t}` and pass it with --idf",
                config.weights
            );
        }
        config.validate()?;
        Ok((config, idf))
    }

    /// A ready hasher for these flags.
    pub fn hasher(&self) -> Result<SimHasher> {
        let (config, idf) = self.resolve()?;
        let feature_digest = config.features_digest();
        Ok(match idf {
            Some(table) => {
                if table.config_digest() != feature_digest {
                    // A table learned with another tokenizer (`idf build`'s
                    // default is auto; dedup's candidates cut words) is named.
                    let other = Tokenizer::NAMES
                        .iter()
                        .filter_map(|name| name.parse::<Tokenizer>().ok())
                        .find(|&tokenizer| {
                            let c = FingerprintConfig {
                                tokenizer,
                                ..config.clone()
                            };
                            c.features_digest() == table.config_digest()
                        });
                    if let Some(learned) = other {
                        bail!(
                            "the IDF table was learned from features made with another \
                             configuration: tokens cut by --tokenizer {learned}, where these \
                             flags cut them with --tokenizer {}; pass --tokenizer {learned}, \
                             or learn the table again with `neardup idf build --tokenizer {}`",
                            config.tokenizer,
                            config.tokenizer
                        );
                    }
                    bail!(
                        "the IDF table was learned from features made with another configuration \
                         ({} here, {} in the table): use the same --tokenizer, --features, \
                         --stopwords and normalisation as `neardup idf build` did",
                        feature_digest,
                        table.config_digest()
                    );
                }
                SimHasher::with_idf(config, table)?
            }
            None => SimHasher::new(config)?,
        })
    }
}

/// Saves `config` to `path` (atomically) as JSON, its IDF table named
/// relative to `path`'s folder, so that the two can move together.
pub fn save_config(path: &Path, config: &FingerprintConfig) -> Result<()> {
    let mut config = config.clone();
    if let Some(table) = config.idf.as_mut().and_then(|r| r.path.as_mut()) {
        let folder = match path.parent() {
            Some(f) if !f.as_os_str().is_empty() => f,
            _ => Path::new("."),
        };
        *table = relative_to(Path::new(table.as_str()), folder)
            .display()
            .to_string();
    }
    let mut json = serde_json::to_vec_pretty(&config)?;
    json.push(b'\n');
    Ok(crate::output::write_atomic(path, &json)?)
}

pub fn read_config(path: &Path) -> Result<FingerprintConfig> {
    let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let config: FingerprintConfig = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "{}: not a valid neardup configuration (see `neardup config` for the format)",
            path.display()
        )
    })?;
    config
        .validate()
        .with_context(|| format!("{}", path.display()))?;
    Ok(config)
}

fn read_idf(path: &Path) -> Result<IdfTable> {
    let file = fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    IdfTable::read(std::io::BufReader::new(file)).with_context(|| format!("{}", path.display()))
}
