//! Output files written atomically: core's [`neardup_core::output`], shared
//! with the Python package.

pub use neardup_core::output::{Output, write_atomic};
