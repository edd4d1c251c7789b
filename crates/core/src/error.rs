//! The one error type of the core library.

/// Everything that can go wrong in `neardup-core`. Messages say what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is impossible or two settings contradict each other.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),

    /// A fingerprint string could not be parsed.
    #[error("invalid fingerprint {input:?}: {reason}")]
    InvalidFingerprint {
        /// The offending text (shortened).
        input: String,
        /// Why it was refused.
        reason: String,
    },

    /// Two fingerprints (or a fingerprint and an index) have different widths.
    #[error(
        "fingerprint width mismatch: expected {expected} bits, got {got}; \
         use fingerprints made with the same --bits"
    )]
    WidthMismatch {
        /// The width required.
        expected: u32,
        /// The width found.
        got: u32,
    },

    /// Two configurations differ where they must agree.
    #[error(
        "fingerprint configuration mismatch: {0}; fingerprints made with different \
         settings cannot be compared: re-fingerprint with the same configuration"
    )]
    ConfigMismatch(String),

    /// An IDF table file is malformed.
    #[error("invalid IDF table at line {line}: {reason}")]
    InvalidIdf {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },

    /// A document of another kind (text, vector, features) than the
    /// configuration fingerprints.
    #[error("{0}")]
    WrongKind(String),

    /// A dense or sparse vector input is unusable.
    #[error("invalid vector: {0}")]
    InvalidVector(String),

    /// An index file is damaged or not an index file.
    #[error(
        "index file is corrupt: {0}; rebuild it with `neardup index build` (or restore a copy)"
    )]
    CorruptIndex(String),

    /// An index file has a format version this code does not read.
    #[error(
        "index file format version {got} is not supported (this neardup reads versions 1 to {expected}); \
         rebuild the index with this neardup"
    )]
    IndexVersion {
        /// The newest version read here.
        expected: u32,
        /// The file's version.
        got: u32,
    },

    /// A distance larger than an index (or join design) was built to find.
    #[error(
        "k = {k} is larger than the index's maximum k = {max}: rebuild the index with a larger --k"
    )]
    KTooLarge {
        /// The distance asked for.
        k: u32,
        /// The largest distance the tables find.
        max: u32,
    },

    /// A change to an index whose tables cannot change (compressed tables).
    #[error("{0}")]
    ReadOnly(String),

    /// An index or batch at the limit of its 32-bit entry numbers.
    #[error("{0}")]
    Full(String),

    /// An I/O error while writing or reading a stream given by the caller.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Result with the core [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
