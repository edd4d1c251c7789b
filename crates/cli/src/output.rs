//! Output files written atomically: to a temporary file beside the target, renamed
//! into place only when everything was written. An error or a kill leaves nothing
//! half-written behind.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tempfile::NamedTempFile;

/// Standard output, or a file replaced atomically on [`Output::finish`].
pub struct Output {
    writer: BufWriter<Box<dyn Write + Send>>,
    pending: Option<(NamedTempFile, PathBuf)>,
}

impl Output {
    /// `None` or `-` is standard output.
    pub fn create(path: Option<&Path>) -> Result<Output> {
        match path {
            None => Ok(Self::stdout()),
            Some(p) if p.as_os_str() == "-" => Ok(Self::stdout()),
            Some(p) => {
                let dir = p
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                let temp = NamedTempFile::new_in(dir).with_context(|| {
                    format!(
                        "cannot create a temporary file in {} for {}",
                        dir.display(),
                        p.display()
                    )
                })?;
                let file = temp.reopen()?;
                Ok(Output {
                    writer: BufWriter::with_capacity(1 << 16, Box::new(file)),
                    pending: Some((temp, p.to_path_buf())),
                })
            }
        }
    }

    fn stdout() -> Output {
        Output {
            writer: BufWriter::with_capacity(1 << 16, Box::new(io::stdout())),
            pending: None,
        }
    }

    /// Flushes and, for a file, syncs it and renames it into place.
    pub fn finish(mut self) -> Result<()> {
        self.writer.flush()?;
        if let Some((temp, path)) = self.pending.take() {
            temp.as_file().sync_all()?;
            temp.persist(&path)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(())
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.writer.write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.writer.write_all(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut out = Output::create(Some(path))?;
    out.write_all(bytes)?;
    out.finish()
}
