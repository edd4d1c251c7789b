//! The core crate's integration tests, one binary: each module tests one
//! part through the public API.

mod index;
mod index_file;
mod jaccard;
mod properties;
mod python_simhash;
