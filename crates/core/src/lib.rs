//! # neardup-core
//!
//! SimHash fingerprints (Charikar, STOC 2002) for near-duplicate detection, as in
//! Manku, Jain & Das Sarma, *Detecting Near-Duplicates for Web Crawling* (WWW 2007).
//!
//! A document goes through a configurable pipeline, described by one serialisable
//! [`FingerprintConfig`]: normalisation (NFKC, case folding, optional HTML
//! stripping, whitespace), tokenisation (Unicode words, jieba for Chinese,
//! characters, or `auto` per script run), features (tokens, word shingles or
//! character n-grams), weights (term frequency, binary, TF-IDF, TextRank), and a
//! feature hash (xxh3, FNV-1a, MD5, SipHash). Each feature's f-bit hash votes on
//! every bit with its weight; bit i of the fingerprint is set when the features
//! with bit i set outweigh the others. Hamming distance between fingerprints then
//! estimates the angle between the weighted feature vectors.
//!
//! ```
//! use neardup_core::{FingerprintConfig, SimHasher, Fingerprint};
//!
//! let hasher = SimHasher::new(FingerprintConfig::default())?;
//! let a = hasher.fingerprint("Detecting near-duplicates for web crawling is a hard problem at scale.");
//! let b = hasher.fingerprint("Detecting near-duplicates for web crawling is a hard problem at Google scale.");
//! let far = hasher.fingerprint("Completely different words about cooking pasta with fresh tomatoes.");
//! assert!(a.distance(b)? < a.distance(far)?);
//! println!("{a} {:.3}", a.similarity(b)?);
//! # Ok::<(), neardup_core::Error>(())
//! ```
//!
//! Input reaches the library as `&str` and `&[u8]`, output leaves through
//! `io::Write`; it opens files in three places only: [`output`] (output files
//! written atomically, as every edge writes them), [`spill`] (the temporary
//! file of verification features a large dedup keeps on disk) and
//! [`index::Bundle`] (index files, memory-mapped). It never prints or exits.
//!
//! Where things live: Fingerprinting in [`SimHasher`] (and
//! [`config`], [`normalize`], [`tokenize`], [`hash`]); exact Hamming search,
//! the self-join and their planner in [`index`]; verification in [`jaccard`],
//! [`spill`] and [`sketch`]; the batch policies in [`dedup`]; JSON Lines
//! records in [`record`], cut from line files by [`lines`]; vectors in
//! [`vector`].

mod accumulate;
pub mod centre;
pub mod config;
pub mod dedup;
mod error;
mod fingerprint;
mod floor;
pub mod hash;
mod idf;
pub mod index;
pub mod jaccard;
pub mod keep_by;
pub mod lines;
pub mod normalize;
pub mod output;
pub mod overrides;
pub mod python_simhash;
pub mod record;
pub mod rng;
mod simhash;
pub mod sketch;
pub mod spill;
pub mod tokenize;
pub mod vector;

pub use config::{
    Features, FingerprintConfig, HashFunction, IdfRef, Input as InputKind, MAX_WIDTH,
    NormalizeConfig, Profile, Tokenizer, Weights,
};
pub use dedup::{Dedup, PairScore, Policy};
pub use error::{Error, Result};
pub use fingerprint::{Fingerprint, Width};
pub use idf::{IdfBuilder, IdfTable};
pub use index::{Index, Match, TableDesign};
pub use overrides::Overrides;
pub use simhash::{Feature, Input, Scratch, SimHasher};
