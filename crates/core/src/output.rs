//! Output files written atomically: to a temporary file beside the target, renamed
//! into place only when everything was written. An error or a kill leaves nothing
//! half-written behind. Special files (FIFOs, devices) are written through.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

/// `e` with what was being done, keeping its kind.
fn context(e: io::Error, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Standard output, or a file replaced atomically on [`Output::finish`].
pub struct Output {
    writer: BufWriter<Box<dyn Write + Send>>,
    pending: Option<(NamedTempFile, PathBuf)>,
    /// Bytes written since the file's write-back was last started.
    unsynced: u64,
}

/// Bytes written between starts of the file's write-back (see [`Output::written`]).
const WRITE_BACK_EVERY: u64 = 32 << 20;

impl Output {
    /// `None` or `-` is standard output. A path naming anything but a regular
    /// file (a FIFO, a character device such as `/dev/stdout` or `/dev/null`)
    /// is written through, as a shell redirection would; a regular file, new
    /// or replaced, is written beside its target and renamed into place. A
    /// symbolic link to a regular file replaces the file it points to and stays
    /// a link. A new file gets the usual mode under the umask; a replaced one
    /// keeps its mode.
    pub fn create(path: Option<&Path>) -> io::Result<Output> {
        let p = match path {
            None => return Ok(Self::stdout()),
            Some(p) if p.as_os_str() == "-" => return Ok(Self::stdout()),
            Some(p) => p,
        };
        let existing = std::fs::metadata(p).ok();
        if let Some(m) = &existing
            && !m.is_file()
            && !m.is_dir()
        {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .map_err(|e| context(e, format_args!("cannot open {} for writing", p.display())))?;
            return Ok(Output {
                writer: BufWriter::with_capacity(1 << 16, Box::new(file)),
                pending: None,
                unsynced: 0,
            });
        }
        let is_link = std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
        let target = if is_link && existing.is_some() {
            std::fs::canonicalize(p)
                .map_err(|e| context(e, format_args!("cannot resolve the link {}", p.display())))?
        } else {
            p.to_path_buf()
        };
        let dir = target
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let mut builder = tempfile::Builder::new();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // Created with the mode's bits the umask lets through.
            builder.permissions(std::fs::Permissions::from_mode(0o666));
        }
        let temp = builder.tempfile_in(dir).map_err(|e| {
            context(
                e,
                format_args!(
                    "cannot create a temporary file in {} for {}",
                    dir.display(),
                    p.display()
                ),
            )
        })?;
        if let Some(m) = &existing {
            // fchmod is not masked: the replaced file's mode exactly.
            temp.as_file()
                .set_permissions(m.permissions())
                .map_err(|e| context(e, format_args!("cannot give {} its mode", p.display())))?;
        }
        let file = temp.reopen()?;
        Ok(Output {
            writer: BufWriter::with_capacity(1 << 16, Box::new(file)),
            pending: Some((temp, target)),
            unsynced: 0,
        })
    }

    fn stdout() -> Output {
        Output {
            writer: BufWriter::with_capacity(1 << 16, Box::new(io::stdout())),
            pending: None,
            unsynced: 0,
        }
    }

    /// Counts `n` bytes written. Every [`WRITE_BACK_EVERY`] bytes of a file,
    /// its write-back to disk is started (Linux's `sync_file_range`, which
    /// does not wait for it), so that the sync before the rename in
    /// [`Output::finish`] waits for the last stretch only, not for a whole
    /// large output written back at once.
    fn written(&mut self, n: usize) {
        self.unsynced += n as u64;
        if self.unsynced < WRITE_BACK_EVERY {
            return;
        }
        self.unsynced = 0;
        #[cfg(target_os = "linux")]
        if let Some((temp, _)) = &self.pending {
            use std::os::fd::AsRawFd;
            // A hint: its failure changes nothing but when pages are written.
            // SAFETY: the descriptor is the open temporary file's.
            unsafe {
                libc::sync_file_range(
                    temp.as_file().as_raw_fd(),
                    0,
                    0,
                    libc::SYNC_FILE_RANGE_WRITE,
                );
            }
        }
    }

    /// Flushes and, for a file, syncs it and renames it into place.
    pub fn finish(mut self) -> io::Result<()> {
        self.writer.flush()?;
        if let Some((temp, path)) = self.pending.take() {
            temp.as_file().sync_all()?;
            temp.persist(&path)
                .map_err(|e| context(e.error, format_args!("cannot write {}", path.display())))?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Output")
            .field("target", &self.pending.as_ref().map(|(_, p)| p))
            .finish_non_exhaustive()
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.writer.write(buf)?;
        self.written(n);
        Ok(n)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.writer.write_all(buf)?;
        self.written(buf.len());
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut out = Output::create(Some(path))?;
    out.write_all(bytes)?;
    out.finish()
}
