//! The signature log: the verification signatures of a collection's texts
//! (store version 9 on), appended to one file beside the database, the
//! `sketches` table holding where each one is.
//!
//! A signature (about 1.5 KB for a 4 KB text) kept as a value of the
//! database's B-tree took a 4 KB page with at most one other (pages split
//! in halves, copy-on-write leaving free pages behind): about 4.4 KB of file
//! per document. In the log it takes its own bytes and a checksum, and the
//! database keeps a 20-byte pointer.
//!
//! Durability: a commit appends its batch's signatures past the log's
//! committed length and makes them durable (`fdatasync`) before the
//! database transaction that points to them, and records the new length in
//! that transaction. After a crash, bytes past the committed length belong
//! to a batch that was never acknowledged: they are cut off at open.
//!
//! Space: a replaced or deleted signature's bytes stay as garbage, counted
//! in the committed state. Once the garbage is at least half of the log (and
//! [`Log::COMPACT_MIN`] or more), the store rewrites the live signatures
//! into the next generation's file (`signatures-G.log`), switches to it in
//! one transaction and deletes the old file; at open, a generation that is
//! not the committed one (a compaction cut short, or one whose deletion
//! was) is deleted.
//!
//! Damage: each record in the log carries the checksum of its document's id
//! and bytes, checked when it is read; a log shorter than its committed
//! length is refused at open.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::ServiceError;

/// The log's committed state, as the database's `meta` table records it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogState {
    /// The generation, named in the file's name.
    pub generation: u64,
    /// Bytes of committed records.
    pub len: u64,
    /// Bytes of those that no document points to any more.
    pub garbage: u64,
}

impl LogState {
    fn check(generation: u64, len: u64, garbage: u64) -> u64 {
        xxhash_rust::xxh3::xxh3_64(format!("signature log {generation} {len} {garbage}").as_bytes())
    }

    /// `generation len garbage checksum`, as stored.
    pub fn text(&self) -> String {
        format!(
            "{} {} {} {:016x}",
            self.generation,
            self.len,
            self.garbage,
            Self::check(self.generation, self.len, self.garbage)
        )
    }

    /// The state of [`LogState::text`], if its checksum agrees.
    pub fn parse(text: &str) -> Option<LogState> {
        let mut parts = text.split(' ');
        let generation = parts.next()?.parse().ok()?;
        let len = parts.next()?.parse().ok()?;
        let garbage = parts.next()?.parse().ok()?;
        let check = u64::from_str_radix(parts.next()?, 16).ok()?;
        (parts.next().is_none() && garbage <= len && check == Self::check(generation, len, garbage))
            .then_some(LogState {
                generation,
                len,
                garbage,
            })
    }
}

/// Where a signature is in the log: its offset and length, as the
/// `sketches` table stores them (12 bytes, little-endian).
pub fn pointer(offset: u64, len: u32) -> [u8; 12] {
    let mut p = [0; 12];
    p[..8].copy_from_slice(&offset.to_le_bytes());
    p[8..].copy_from_slice(&len.to_le_bytes());
    p
}

/// The offset and length of a [`pointer()`].
pub fn read_pointer(bytes: &[u8]) -> Option<(u64, u32)> {
    let bytes: &[u8; 12] = bytes.try_into().ok()?;
    Some((
        u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
        u32::from_le_bytes(bytes[8..].try_into().expect("4 bytes")),
    ))
}

/// The file of one generation of the log in `dir`.
pub fn log_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("signatures-{generation}.log"))
}

/// The generation a file name is of, if it is a log's.
fn generation_of(name: &str) -> Option<u64> {
    name.strip_prefix("signatures-")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

/// Bytes of every generation's log file in `dir`.
pub fn files_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().and_then(generation_of).is_some())
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// The open log of one generation.
#[derive(Debug)]
pub struct Log {
    dir: PathBuf,
    file: Arc<File>,
    state: LogState,
}

fn io_error(path: &Path, what: &str, e: std::io::Error) -> ServiceError {
    ServiceError::Storage(format!("{}: {what}: {e}", path.display()))
}

impl Log {
    /// Garbage below this many bytes is never compacted.
    pub const COMPACT_MIN: u64 = 64 << 20;

    /// A new, empty log of `generation` in `dir` (a file left there by an
    /// earlier attempt is emptied).
    pub fn create(dir: &Path, generation: u64) -> Result<Log, ServiceError> {
        let path = log_path(dir, generation);
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| io_error(&path, "cannot create the signature log", e))?;
        Ok(Log {
            dir: dir.to_owned(),
            file: Arc::new(file),
            state: LogState {
                generation,
                ..LogState::default()
            },
        })
    }

    /// The log of the committed `state` in `dir`: refused if its file is
    /// missing or shorter than committed; bytes past the committed length
    /// (a batch never committed) are cut off, and other generations' files
    /// deleted. `restore` is the fix named when it is refused.
    pub fn open(dir: &Path, state: LogState, restore: &str) -> Result<Log, ServiceError> {
        let path = log_path(dir, state.generation);
        let file = File::options()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| {
                ServiceError::Storage(format!(
                    "{}: the collection's signature log cannot be opened ({e}); {restore}",
                    path.display()
                ))
            })?;
        let on_disk = file
            .metadata()
            .map_err(|e| io_error(&path, "cannot read the signature log's size", e))?
            .len();
        if on_disk < state.len {
            return Err(ServiceError::Storage(format!(
                "{}: the signature log has {on_disk} bytes where {} were committed: it is \
                 damaged; {restore}",
                path.display(),
                state.len
            )));
        }
        if on_disk > state.len {
            file.set_len(state.len)
                .and_then(|()| file.sync_all())
                .map_err(|e| io_error(&path, "cannot cut off an uncommitted batch", e))?;
        }
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let g = entry.file_name().to_str().and_then(generation_of);
            if g.is_some_and(|g| g != state.generation) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(Log {
            dir: dir.to_owned(),
            file: Arc::new(file),
            state,
        })
    }

    pub fn state(&self) -> LogState {
        self.state
    }

    pub fn path(&self) -> PathBuf {
        log_path(&self.dir, self.state.generation)
    }

    /// The file, for reads (positioned: any number at once).
    pub fn file(&self) -> Arc<File> {
        Arc::clone(&self.file)
    }

    /// Writes a batch's records past the committed length and makes them
    /// durable; the committed state is unchanged until [`Log::committed`].
    pub fn append(&self, records: &[u8]) -> Result<(), ServiceError> {
        if records.is_empty() {
            return Ok(());
        }
        self.file
            .write_all_at(records, self.state.len)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| io_error(&self.path(), "cannot write the signature log", e))
    }

    /// The state once the transaction that records it is committed.
    pub fn committed(&mut self, state: LogState) {
        self.state = state;
    }

    /// Whether enough of the log is garbage to rewrite it.
    pub fn wants_compaction(&self, min: u64) -> bool {
        self.state.garbage >= min && self.state.garbage * 2 >= self.state.len
    }

    /// The next generation's writer, for a compaction.
    pub fn next(&self) -> Result<NextLog, ServiceError> {
        let generation = self.state.generation + 1;
        let log = Log::create(&self.dir, generation)?;
        Ok(NextLog {
            out: std::io::BufWriter::with_capacity(
                1 << 20,
                log.file
                    .as_ref()
                    .try_clone()
                    .map_err(|e| io_error(&log.path(), "cannot write the signature log", e))?,
            ),
            log,
        })
    }

    /// Switches to a compaction's log, whose state is committed, and deletes
    /// this one's file.
    pub fn replace(&mut self, next: Log) {
        let old = self.path();
        *self = next;
        let _ = std::fs::remove_file(old);
    }
}

/// A compaction's new log being written.
#[derive(Debug)]
pub struct NextLog {
    log: Log,
    out: std::io::BufWriter<File>,
}

impl NextLog {
    /// Appends a record; returns its offset.
    pub fn push(&mut self, record: &[u8]) -> Result<u64, ServiceError> {
        let at = self.log.state.len;
        self.out
            .write_all(record)
            .map_err(|e| io_error(&self.log.path(), "cannot write the signature log", e))?;
        self.log.state.len += record.len() as u64;
        Ok(at)
    }

    /// The new log, its records durable, and its state to commit.
    pub fn finish(self) -> Result<(Log, LogState), ServiceError> {
        let path = self.log.path();
        let file = self
            .out
            .into_inner()
            .map_err(|e| io_error(&path, "cannot write the signature log", e.into_error()))?;
        file.sync_all()
            .map_err(|e| io_error(&path, "cannot write the signature log", e))?;
        let state = self.log.state;
        Ok((self.log, state))
    }

    /// Gives up: the new file is deleted.
    pub fn abandon(self) {
        let path = self.log.path();
        drop(self);
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_pointers_read_back_and_damage_is_refused() {
        let s = LogState {
            generation: 3,
            len: 1 << 40,
            garbage: 12345,
        };
        assert_eq!(LogState::parse(&s.text()), Some(s));
        let text = s.text();
        for i in 0..text.len() {
            let mut b = text.clone().into_bytes();
            b[i] = if b[i] == b'7' { b'8' } else { b'7' };
            if let Ok(t) = String::from_utf8(b)
                && t != text
            {
                assert_eq!(LogState::parse(&t), None, "{t}");
            }
        }
        assert_eq!(
            read_pointer(&pointer(u64::MAX - 5, 77)),
            Some((u64::MAX - 5, 77))
        );
        assert_eq!(read_pointer(&[0; 11]), None);
        assert_eq!(generation_of("signatures-12.log"), Some(12));
        assert_eq!(generation_of("signatures-12.log.tmp"), None);
    }

    #[test]
    fn an_uncommitted_tail_is_cut_and_a_short_log_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::create(dir.path(), 0).unwrap();
        log.append(b"abcdef").unwrap();
        log.committed(LogState {
            generation: 0,
            len: 6,
            garbage: 0,
        });
        log.append(b"never committed").unwrap();
        let state = log.state();
        drop(log);
        std::fs::write(log_path(dir.path(), 1), b"a compaction cut short").unwrap();
        let log = Log::open(dir.path(), state, "restore").unwrap();
        assert_eq!(std::fs::read(log.path()).unwrap(), b"abcdef");
        assert!(!log_path(dir.path(), 1).exists());
        drop(log);
        let e = Log::open(dir.path(), LogState { len: 7, ..state }, "restore it")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("signatures-0.log") && e.contains("restore it"),
            "{e}"
        );
    }
}
