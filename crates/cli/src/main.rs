//! `neardup`: near-duplicate detection with SimHash fingerprints.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod fpfile;
mod gather;
mod index_file;
mod input;
mod line_copy;
mod npy;
mod output;
mod parquet_io;
mod pipeline_args;
mod run;
mod source;
mod table_out;
mod units;
mod vector_store;

/// mimalloc serves every allocation. Dedup's records are allocated by the
/// reader thread, its documents and their buffers by the workers, and most of
/// them freed by the sink's thread; with glibc's allocator, `_int_malloc`
/// (mostly searching its large-chunk bins) took 2-4% of a 10 GB run's samples.
/// Faster in alternating runs at 1 GB and 10 GB, at 100-350 MB more peak
/// memory (docs/dedup.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Near-duplicate detection with SimHash fingerprints (Charikar; Manku, Jain &
/// Das Sarma, WWW 2007).
///
/// Fingerprint documents, compare them, plan indexes, and deduplicate corpora.
/// Exit status: 0 on success, 1 where a command says so (compare: not
/// near-duplicates), 2 on error.
#[derive(Parser, Debug)]
#[command(
    name = "neardup",
    version,
    propagate_version = true,
    max_term_width = 100
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Fingerprint documents: JSON Lines `{"id", "simhash"}` (or TSV) out.
    Fingerprint(cmd::fingerprint::Args),
    /// Compare two documents (or fingerprints): distance, similarity, verdict.
    Compare(cmd::compare::Args),
    /// Find near-duplicates in a corpus: pairs, clusters, kept and dropped records.
    Dedup(cmd::dedup::Args),
    /// Build, update and check an on-disk index.
    #[command(subcommand)]
    Index(cmd::index::Command),
    /// Find every indexed document within k of a text, file, fingerprint or batch.
    Query(cmd::query::Args),
    /// Choose a table design for N fingerprints and k, and explain it.
    Plan(cmd::plan::Args),
    /// Serve a durable collection over HTTP/JSON: insert, check, query, delete.
    Serve(cmd::serve::Args),
    /// Print the configuration that the pipeline flags describe (JSON), to save
    /// and reuse with --config.
    Config(cmd::config::Args),
    /// Inverse document frequency tables learned from your corpus.
    #[command(subcommand)]
    Idf(cmd::idf::Command),
    /// Score found pairs against ground truth: precision, recall, F1, per edit
    /// type and per similarity band.
    Eval(cmd::eval::Args),
    /// Exact ground truth: every pair of documents with Jaccard similarity at
    /// least a threshold (no sampling).
    Truth(cmd::truth::Args),
    /// Measure throughput on real text.
    #[command(subcommand)]
    #[cfg(feature = "bench")]
    Bench(cmd::bench::Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Fingerprint(a) => cmd::fingerprint::run(a),
        Command::Compare(a) => cmd::compare::run(a),
        Command::Config(a) => cmd::config::run(a),
        Command::Dedup(a) => cmd::dedup::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Index(c) => cmd::index::run(c),
        Command::Query(a) => cmd::query::run(a),
        Command::Idf(c) => cmd::idf::run(c),
        #[cfg(feature = "bench")]
        Command::Bench(c) => cmd::bench::run(c),
        Command::Eval(a) => cmd::eval::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Truth(a) => cmd::truth::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("neardup: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
