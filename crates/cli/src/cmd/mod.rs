//! One module per subcommand.

#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "bench")]
pub mod bench_dedup;
#[cfg(feature = "bench")]
pub mod bench_index;
#[cfg(feature = "bench")]
pub mod bench_serve;
#[cfg(feature = "bench")]
pub mod bench_text;
#[cfg(feature = "bench")]
pub mod bench_vectors;
pub mod compare;
pub mod config;
pub mod dedup;
pub mod eval;
pub mod fingerprint;
pub mod idf;
pub mod index;
pub mod plan;
pub mod query;
pub mod serve;
pub mod truth;
