//! One module per subcommand.

pub mod bench;
pub mod bench_dedup;
pub mod bench_index;
pub mod bench_serve;
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
