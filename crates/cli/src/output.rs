//! Output files written atomically: core's [`neardup_core::output`], shared
//! with the Python package; and [`NamedOutput`], compressed as its name says.

use std::io::{self, Write};
use std::path::Path;

pub use neardup_core::output::{Output, write_atomic};

/// An output file compressed as its name announces, as inputs are read:
/// gzip for `.gz` (or `.gzip`), zstd for `.zst` (or `.zstd`), else plain;
/// written atomically as [`Output`] is. Standard output (`-`) is plain.
pub enum NamedOutput {
    Plain(Output),
    Gzip(flate2::write::GzEncoder<Output>),
    Zstd(zstd::stream::write::Encoder<'static, Output>),
}

impl NamedOutput {
    pub fn create(path: &Path) -> io::Result<NamedOutput> {
        let out = Output::create(Some(path))?;
        Ok(match path.extension().and_then(|e| e.to_str()) {
            Some("gz" | "gzip") => {
                NamedOutput::Gzip(flate2::write::GzEncoder::new(out, Default::default()))
            }
            Some("zst" | "zstd") => NamedOutput::Zstd(zstd::stream::write::Encoder::new(out, 0)?),
            _ => NamedOutput::Plain(out),
        })
    }

    /// Ends the compressed stream, then writes the file into place.
    pub fn finish(self) -> io::Result<()> {
        match self {
            NamedOutput::Plain(out) => out.finish(),
            NamedOutput::Gzip(e) => e.finish()?.finish(),
            NamedOutput::Zstd(e) => e.finish()?.finish(),
        }
    }
}

impl Write for NamedOutput {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            NamedOutput::Plain(o) => o.write(buf),
            NamedOutput::Gzip(o) => o.write(buf),
            NamedOutput::Zstd(o) => o.write(buf),
        }
    }
    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            NamedOutput::Plain(o) => o.write_all(buf),
            NamedOutput::Gzip(o) => o.write_all(buf),
            NamedOutput::Zstd(o) => o.write_all(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            NamedOutput::Plain(o) => o.flush(),
            NamedOutput::Gzip(o) => o.flush(),
            NamedOutput::Zstd(o) => o.flush(),
        }
    }
}
