//! Where a command's fingerprints come from: documents, fingerprinted with
//! the pipeline flags, or a ready fingerprint file.

use std::path::PathBuf;

use crate::input::InputArgs;
use crate::pipeline_args::PipelineArgs;

/// Where fingerprints come from: documents, fingerprinted with the pipeline
/// flags, or a ready fingerprint file.
#[derive(clap::Args, Debug, Clone)]
pub struct SourceArgs {
    #[command(flatten)]
    pub input: InputArgs,

    #[command(flatten)]
    pub pipeline: PipelineArgs,

    /// Read ready fingerprints (`{"id", "simhash"}` JSON Lines or TSV, as
    /// `neardup fingerprint` writes) instead of documents.
    #[arg(long, value_name = "FILE", conflicts_with = "inputs")]
    pub fingerprints: Option<PathBuf>,
}
