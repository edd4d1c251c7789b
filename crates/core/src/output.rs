//! Output files written atomically: to a temporary file beside the target, renamed
//! into place only when everything was written. An error or a kill leaves nothing
//! half-written behind. Special files (FIFOs, devices) are written through.
//!
//! A file is written in blocks of up to 4 MiB, by direct I/O where
//! the file system allows it (Linux's `O_DIRECT`): a large output (the kept
//! records of a corpus) goes from the process's buffer to the disk without
//! filling the page cache, which keeps the input and the spill instead, and
//! costs the kernel neither the copy nor new pages (on a VM, fresh pages are
//! what writing a large file costs most). The last, partial block is written
//! through the page cache: a file no larger than a block goes through it whole.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

/// `e` with what was being done, keeping its kind.
fn context(e: io::Error, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Standard output, or a file replaced atomically on [`Output::finish`].
pub struct Output {
    writer: Writer,
    pending: Option<(NamedTempFile, PathBuf)>,
    /// The path given, named in every error (None: standard output).
    name: Option<PathBuf>,
}

/// Files finished while a [`Deferred`] is open: renamed into place together
/// when it commits, deleted if it is dropped instead.
static DEFERRED: std::sync::Mutex<Option<Vec<(NamedTempFile, PathBuf)>>> =
    std::sync::Mutex::new(None);

/// Holds back the renames of every [`Output`] finished while it is open, so
/// that a command writing several files leaves all of them or none: call
/// [`Deferred::commit`] once the whole run has succeeded; dropped without it
/// (an error, a panic), the temporary files are deleted and no target is
/// touched. One at a time per process.
#[derive(Debug)]
#[must_use = "commit it once the run has succeeded"]
pub struct Deferred(());

impl Deferred {
    pub fn begin() -> Deferred {
        *DEFERRED.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
        Deferred(())
    }

    /// Renames every finished file into place.
    pub fn commit(self) -> io::Result<()> {
        let files = DEFERRED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default();
        for (temp, path) in files {
            temp.persist(&path)
                .map_err(|e| context(e.error, format_args!("cannot write {}", path.display())))?;
        }
        Ok(())
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        // Not committed: the temporary files go (NamedTempFile deletes on drop).
        drop(DEFERRED.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

enum Writer {
    /// Standard output, or a special file written through.
    Through(BufWriter<Box<dyn Write + Send>>),
    /// The temporary file of a regular one.
    Blocks(BlockWriter),
}

/// Bytes written between starts of a buffered file's write-back (see
/// [`Disk::written`]).
const WRITE_BACK_EVERY: u64 = 32 << 20;

/// The largest block written at once.
const BLOCK: usize = 4 << 20;

/// Alignment of a direct write's buffer, offset and length: a page, a
/// multiple of disks' logical block sizes (512 or 4096 bytes).
const ALIGN: usize = 4096;

/// One aligned unit of [`BlockWriter`]'s buffer.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Page([u8; ALIGN]);

/// Writes a new file in whole blocks from an aligned buffer, by direct I/O
/// when the file system takes it, and its last partial block (and every
/// block, where direct I/O is refused) through the page cache. Full blocks
/// are written by a thread of their own while the next one fills (one more
/// may wait for it), so that a large output's writes to the disk overlap
/// with the work that makes it.
struct BlockWriter {
    /// The buffer being filled: whole pages, aligned as direct I/O needs.
    pages: Vec<Page>,
    /// Bytes of `pages` in use.
    len: usize,
    /// Bytes handed to the disk so far (a multiple of [`BLOCK`]).
    offset: u64,
    /// The file, until its first full block starts the writer thread.
    disk: Option<Disk>,
    /// The writer thread, once started.
    writer: Option<Writing>,
}

/// The file's descriptors, and its writes.
struct Disk {
    /// The file, buffered.
    file: File,
    /// The same file opened for direct I/O, while the file system takes it.
    direct: Option<File>,
    /// Bytes written through the page cache since its write-back was last
    /// started.
    unsynced: u64,
}

/// The thread that writes full blocks, and the buffers it hands back.
struct Writing {
    blocks: std::sync::mpsc::SyncSender<(Vec<Page>, u64)>,
    free: std::sync::mpsc::Receiver<Vec<Page>>,
    thread: std::thread::JoinHandle<io::Result<Disk>>,
}

/// `pages` as bytes.
#[inline]
fn bytes(pages: &[Page]) -> &[u8] {
    // SAFETY: `Page` is a plain array of bytes, so the pages are contiguous
    // initialised bytes.
    unsafe { std::slice::from_raw_parts(pages.as_ptr().cast::<u8>(), pages.len() * ALIGN) }
}

/// `pages` as bytes, mutably.
#[inline]
fn bytes_mut(pages: &mut [Page]) -> &mut [u8] {
    // SAFETY: as in `bytes`, borrowed mutably with `pages`.
    unsafe { std::slice::from_raw_parts_mut(pages.as_mut_ptr().cast::<u8>(), pages.len() * ALIGN) }
}

impl Disk {
    /// Writes `data` at `offset`: directly if the file system takes it (the
    /// first refusal turns direct I/O off for the file), else through the
    /// page cache. Direct writes need `data`, `offset` and the length
    /// aligned to [`ALIGN`].
    fn write_at(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        if let Some(direct) = &self.direct {
            match direct.write_all_at(data, offset) {
                Ok(()) => return Ok(()),
                // Refused (a file system without direct I/O, or with larger
                // blocks): through the page cache from here on.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                    self.direct = None
                }
                Err(e) => return Err(e),
            }
        }
        self.file.write_all_at(data, offset)?;
        self.written(data.len());
        Ok(())
    }

    /// Counts `n` bytes written through the page cache. Every
    /// [`WRITE_BACK_EVERY`] bytes, the file's write-back to disk is started
    /// (Linux's `sync_file_range`, which does not wait for it), so that the
    /// sync before the rename in [`Output::finish`] waits for the last
    /// stretch only, not for a whole large output written back at once.
    fn written(&mut self, n: usize) {
        self.unsynced += n as u64;
        if self.unsynced < WRITE_BACK_EVERY {
            return;
        }
        self.unsynced = 0;
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // A hint: its failure changes nothing but when pages are written.
            // SAFETY: the descriptor is the open file's.
            unsafe {
                libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
            }
        }
    }
}

impl Writing {
    fn start(mut disk: Disk) -> io::Result<Writing> {
        // One block waits while one is written.
        let (blocks, to_write) = std::sync::mpsc::sync_channel::<(Vec<Page>, u64)>(1);
        let (give_back, free) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("neardup-output".into())
            .spawn(move || {
                for (pages, offset) in to_write {
                    disk.write_at(bytes(&pages), offset)?;
                    // The writer may have finished: then nobody needs it.
                    let _ = give_back.send(pages);
                }
                Ok(disk)
            })?;
        Ok(Writing {
            blocks,
            free,
            thread,
        })
    }

    /// Waits for the blocks handed over to be written; the file back.
    fn finish(self) -> io::Result<Disk> {
        drop(self.blocks);
        self.thread
            .join()
            .map_err(|_| io::Error::other("the output's writer thread panicked"))?
    }
}

impl BlockWriter {
    /// Writes `file`, whole blocks through `direct` if given (the same file
    /// opened for direct I/O).
    fn new(file: File, direct: Option<File>) -> BlockWriter {
        BlockWriter {
            pages: Vec::new(),
            len: 0,
            offset: 0,
            disk: Some(Disk {
                file,
                direct,
                unsynced: 0,
            }),
            writer: None,
        }
    }

    /// Hands the full buffer (a whole block) to the writer thread, and
    /// takes an empty one.
    fn write_block(&mut self) -> io::Result<()> {
        if self.writer.is_none() {
            let disk = self
                .disk
                .take()
                .expect("the file is here until the writer starts");
            self.writer = Some(Writing::start(disk)?);
        }
        let writer = self.writer.as_ref().expect("started above");
        let next = writer.free.try_recv().unwrap_or_default();
        let full = std::mem::replace(&mut self.pages, next);
        if writer.blocks.send((full, self.offset)).is_err() {
            // The thread stopped at an error: it says which.
            let writer = self.writer.take().expect("started above");
            return Err(match writer.finish() {
                Err(e) => e,
                Ok(_) => io::Error::other("the output's writer thread stopped"),
            });
        }
        self.offset += BLOCK as u64;
        self.len = 0;
        self.pages.resize(BLOCK / ALIGN, Page([0; ALIGN]));
        Ok(())
    }

    /// Writes what is left (through the page cache) and syncs the file.
    fn finish(mut self) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let disk = match self.writer.take() {
            Some(writer) => writer.finish()?,
            None => self
                .disk
                .take()
                .expect("the file is here until the writer starts"),
        };
        disk.file
            .write_all_at(&bytes(&self.pages)[..self.len], self.offset)?;
        disk.file.sync_all()
    }
}

impl Write for BlockWriter {
    #[inline]
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.len == self.pages.len() * ALIGN && !data.is_empty() {
            if self.len == BLOCK {
                self.write_block()?;
            } else {
                // Grown by doubling: a small file takes a small buffer.
                let pages = (2 * self.pages.len()).clamp(16, BLOCK / ALIGN);
                self.pages.resize(pages, Page([0; ALIGN]));
            }
        }
        let start = self.len;
        let n = data.len().min(self.pages.len() * ALIGN - start);
        bytes_mut(&mut self.pages)[start..start + n].copy_from_slice(&data[..n]);
        self.len += n;
        Ok(n)
    }

    /// Nothing: the file is read by nobody until [`Output::finish`] writes
    /// the rest of it, and a direct write must be whole blocks.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `path` opened again for direct writes, if the system and its file system
/// take them.
fn open_direct(path: &Path) -> Option<File> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        if std::env::var_os("NEARDUP_NO_DIRECT_IO").is_some() {
            return None;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        None
    }
}

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
                writer: Writer::Through(BufWriter::with_capacity(1 << 16, Box::new(file))),
                pending: None,
                name: Some(p.to_path_buf()),
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
        let file = temp
            .reopen()
            .map_err(|e| context(e, format_args!("cannot write {}", p.display())))?;
        Ok(Output {
            writer: Writer::Blocks(BlockWriter::new(file, open_direct(temp.path()))),
            pending: Some((temp, target)),
            name: Some(p.to_path_buf()),
        })
    }

    fn stdout() -> Output {
        Output {
            writer: Writer::Through(BufWriter::with_capacity(1 << 16, Box::new(io::stdout()))),
            pending: None,
            name: None,
        }
    }

    /// Flushes and, for a file, syncs it and renames it into place (or,
    /// while a [`Deferred`] is open, leaves the rename to its commit).
    pub fn finish(mut self) -> io::Result<()> {
        let name = self.name.take();
        let named = |e: io::Error| named(e, name.as_deref());
        match self.writer {
            Writer::Through(mut w) => w.flush().map_err(named)?,
            Writer::Blocks(w) => w.finish().map_err(named)?,
        }
        if let Some((temp, path)) = self.pending.take() {
            if let Some(later) = DEFERRED.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                later.push((temp, path));
                return Ok(());
            }
            temp.persist(&path)
                .map_err(|e| context(e.error, format_args!("cannot write {}", path.display())))?;
        }
        Ok(())
    }
}

/// `e` naming the file it happened to (standard output when `None`).
#[cold]
fn named(e: io::Error, path: Option<&Path>) -> io::Error {
    match path {
        Some(p) => context(e, format_args!("cannot write {}", p.display())),
        None => context(e, "cannot write to standard output"),
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
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.writer {
            Writer::Through(w) => w.write(buf),
            Writer::Blocks(w) => w.write(buf),
        }
        .map_err(|e| named(e, self.name.as_deref()))
    }
    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match &mut self.writer {
            Writer::Through(w) => w.write_all(buf),
            Writer::Blocks(w) => w.write_all(buf),
        }
        .map_err(|e| named(e, self.name.as_deref()))
    }
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.writer {
            Writer::Through(w) => w.flush(),
            Writer::Blocks(w) => w.flush(),
        }
        .map_err(|e| named(e, self.name.as_deref()))
    }
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut out = Output::create(Some(path))?;
    out.write_all(bytes)?;
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::os::unix::fs::FileExt;

    /// A new file in `dir`, and the same file opened for direct I/O where
    /// the file system takes it.
    fn new_file(dir: &Path, name: &str) -> (File, Option<File>, PathBuf) {
        let path = dir.join(name);
        let file = File::create(&path).unwrap();
        let direct = open_direct(&path);
        (file, direct, path)
    }

    /// Writes `pieces` (each of its length, all bytes from one counter) and
    /// returns what was written.
    fn write_pieces(w: &mut impl Write, pieces: &[usize]) -> Vec<u8> {
        let mut all = Vec::new();
        for (i, &n) in pieces.iter().enumerate() {
            let piece: Vec<u8> = (0..n).map(|j| (i * 31 + j * 7) as u8).collect();
            w.write_all(&piece).unwrap();
            all.extend_from_slice(&piece);
        }
        all
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Whatever the sizes of the writes (empty, tiny, around a page, a
        /// block, several blocks), the file holds exactly the bytes written,
        /// directly where the file system allows it and through the page
        /// cache otherwise.
        #[test]
        fn the_file_holds_what_was_written(
            pieces in prop::collection::vec(
                prop_oneof![
                    0usize..10,
                    ALIGN - 2..ALIGN + 2,
                    BLOCK - 3..BLOCK + 3,
                    0usize..3 * BLOCK,
                ],
                0..6,
            ),
            direct in any::<bool>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let (file, open, path) = new_file(dir.path(), "out");
            let mut w = BlockWriter::new(file, open.filter(|_| direct));
            let want = write_pieces(&mut w, &pieces);
            w.finish().unwrap();
            let got = std::fs::read(&path).unwrap();
            prop_assert_eq!(got.len(), want.len());
            prop_assert!(got == want);
        }
    }

    /// A direct write the file system refuses (here a misaligned one) turns
    /// direct I/O off for the file and still writes the bytes.
    #[test]
    fn a_refused_direct_write_goes_through_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let (file, direct, path) = new_file(dir.path(), "out");
        let had_direct = direct.is_some();
        let mut disk = Disk {
            file,
            direct,
            unsynced: 0,
        };
        let pages = vec![Page([7; ALIGN]); 2];
        // One byte in: neither the buffer nor the length is aligned.
        disk.write_at(&bytes(&pages)[1..ALIGN + 100], 0).unwrap();
        assert!(disk.direct.is_none(), "direct I/O stays on after a refusal");
        let mut got = vec![0; ALIGN + 99];
        disk.file.sync_all().unwrap();
        File::open(&path)
            .unwrap()
            .read_exact_at(&mut got, 0)
            .unwrap();
        assert!(got.iter().all(|&b| b == 7));
        // Where the test's file system has direct I/O, aligned writes went
        // through it first (the refusal above was a real one).
        if had_direct {
            let (file, direct, path) = new_file(dir.path(), "aligned");
            let mut disk = Disk {
                file,
                direct,
                unsynced: 0,
            };
            disk.write_at(bytes(&pages), 0).unwrap();
            assert!(disk.direct.is_some());
            assert_eq!(std::fs::read(path).unwrap(), bytes(&pages));
        }
    }

    /// A block the disk cannot take is the error of a later write, never
    /// lost: the thread stops at it, and the third block handed over after
    /// the one that failed cannot be.
    #[test]
    fn a_failed_block_write_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("read-only");
        std::fs::write(&path, b"").unwrap();
        let read_only = File::open(&path).unwrap();
        let mut w = BlockWriter::new(read_only, None);
        let piece = vec![1u8; BLOCK];
        let failed = (0..5).find(|_| w.write_all(&piece).is_err());
        assert!(failed.is_some(), "five blocks written to a read-only file");
    }
}
