//! An index file as its users see it, opened the same way by every edge (the
//! CLI, the Python package): the tables in whichever width and kind the file
//! holds, chosen once here ([`AnyIndex`]), the document ids, and the
//! fingerprint configuration the entries were made with ([`Bundle`]).

use std::path::Path;
use std::sync::Arc;

use super::bits::word_of;
use super::compressed::CompressedIndex;
use super::design::TableDesign;
use super::file::IndexFile;
use super::ids::IdTable;
use super::slab::SharedBytes;
use super::{Index, Match};
use crate::config::FingerprintConfig;
use crate::error::Error;
use crate::fingerprint::{Fingerprint, Width};

/// An index of either width, with plain (changeable) or compressed
/// (read-only) tables. Queries take [`Fingerprint`]s and refuse another width.
#[derive(Debug)]
pub enum AnyIndex {
    /// 64-bit plain tables.
    Plain64(Index<u64>),
    /// 128-bit plain tables.
    Plain128(Index<u128>),
    /// 64-bit compressed tables.
    Compressed64(CompressedIndex<u64>),
    /// 128-bit compressed tables.
    Compressed128(CompressedIndex<u128>),
}

/// `$body` with `$i` bound to the index, whatever its type.
macro_rules! each {
    ($index:expr, $i:ident => $body:expr) => {
        match $index {
            AnyIndex::Plain64($i) => $body,
            AnyIndex::Plain128($i) => $body,
            AnyIndex::Compressed64($i) => $body,
            AnyIndex::Compressed128($i) => $body,
        }
    };
}

/// `$body` with `$i` bound to a plain index; `$else` for compressed tables.
macro_rules! plain {
    ($index:expr, $i:ident => $body:expr, $else:expr) => {
        match $index {
            AnyIndex::Plain64($i) => $body,
            AnyIndex::Plain128($i) => $body,
            AnyIndex::Compressed64(_) | AnyIndex::Compressed128(_) => $else,
        }
    };
}

fn read_only() -> Error {
    Error::ReadOnly(
        "this index's tables are compressed, which makes it read-only: query it, or rebuild \
         it without --compressed to add or delete entries"
            .into(),
    )
}

impl AnyIndex {
    /// The tables of `file`, using its bytes in place.
    pub fn of_file(file: &IndexFile) -> Result<AnyIndex, Error> {
        let width = Width::from_bits(file.bits())?;
        Ok(match (width, file.is_compressed()) {
            (Width::W64, false) => AnyIndex::Plain64(file.index()?),
            (Width::W128, false) => AnyIndex::Plain128(file.index()?),
            (Width::W64, true) => AnyIndex::Compressed64(file.compressed_index()?),
            (Width::W128, true) => AnyIndex::Compressed128(file.compressed_index()?),
        })
    }

    /// Plain tables of `design` over `(id, fingerprint)` entries, all of the
    /// design's width.
    pub fn build(
        design: TableDesign,
        entries: impl IntoIterator<Item = (u64, Fingerprint)>,
    ) -> Result<AnyIndex, Error> {
        fn words<B: super::Bits>(
            entries: impl IntoIterator<Item = (u64, Fingerprint)>,
        ) -> Result<Vec<(u64, B)>, Error> {
            entries
                .into_iter()
                .map(|(id, fp)| Ok((id, word_of(fp)?)))
                .collect()
        }
        Ok(match Width::from_bits(design.bits)? {
            Width::W64 => AnyIndex::Plain64(Index::build(design, words(entries)?)?),
            Width::W128 => AnyIndex::Plain128(Index::build(design, words(entries)?)?),
        })
    }

    /// The fingerprints' width.
    pub fn width(&self) -> Width {
        match self {
            AnyIndex::Plain64(_) | AnyIndex::Compressed64(_) => Width::W64,
            AnyIndex::Plain128(_) | AnyIndex::Compressed128(_) => Width::W128,
        }
    }

    /// The table design (its k is the largest distance the tables find).
    pub fn design(&self) -> &TableDesign {
        each!(self, i => i.design())
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        each!(self, i => i.len())
    }

    /// Whether no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the tables are compressed (read-only).
    pub fn is_compressed(&self) -> bool {
        matches!(self, AnyIndex::Compressed64(_) | AnyIndex::Compressed128(_))
    }

    /// Every entry within `k` of `fp`, nearest first.
    pub fn query(&self, fp: Fingerprint, k: u32) -> Result<Vec<Match>, Error> {
        each!(self, i => i.query(word_of(fp)?, k))
    }

    /// [`AnyIndex::query`] of many fingerprints, in parallel.
    pub fn query_batch(&self, fps: &[Fingerprint], k: u32) -> Result<Vec<Vec<Match>>, Error> {
        each!(self, i => {
            let words = fps.iter().map(|&f| word_of(f)).collect::<Result<Vec<_>, _>>()?;
            i.query_batch(&words, k)
        })
    }

    /// Every pair of entries within `k`: `(id_a, id_b, distance)`.
    pub fn self_join(&self, k: u32) -> Result<Vec<(u64, u64, u32)>, Error> {
        each!(self, i => i.self_join(k))
    }

    /// Adds an entry (plain tables only).
    pub fn add(&mut self, id: u64, fp: Fingerprint) -> Result<(), Error> {
        plain!(self, i => i.add(id, word_of(fp)?), Err(read_only()))
    }

    /// Deletes the entries whose id `remove` accepts (plain tables only);
    /// returns how many.
    pub fn delete(&mut self, remove: impl FnMut(u64) -> bool) -> Result<usize, Error> {
        plain!(self, i => Ok(i.delete(remove)), Err(read_only()))
    }

    /// Writes the index file with the caller's `extra` metadata and named
    /// `sections`; returns the bytes written.
    pub fn write_to<W: std::io::Write>(
        &self,
        extra: &serde_json::Value,
        sections: &[(&str, &[u8])],
        w: W,
    ) -> Result<u64, Error> {
        each!(self, i => i.write_to(extra, sections, w))
    }
}

/// What `neardup index build` writes and every edge reads: the tables, the
/// document id of each entry number, and the configuration the fingerprints
/// were made with (none when built from bare fingerprints).
#[derive(Debug)]
pub struct Bundle {
    /// The tables.
    pub index: AnyIndex,
    /// Entry number to document id.
    pub ids: IdTable,
    /// The fingerprints' configuration.
    pub config: Option<FingerprintConfig>,
}

/// A read-only memory map as index bytes.
struct Mapped(memmap2::Mmap);

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Memory-maps the index file at `path` and checks its structure (see
/// [`IndexFile::open`]). Errors name the path.
pub fn map_file(path: &Path) -> Result<IndexFile, Error> {
    let named = |e: Error| match e {
        Error::Io(io) => Error::Io(std::io::Error::new(
            io.kind(),
            format!("{}: {io}", path.display()),
        )),
        Error::CorruptIndex(m) => Error::CorruptIndex(format!("{}: {m}", path.display())),
        other => other,
    };
    let f = std::fs::File::open(path).map_err(|e| named(e.into()))?;
    // SAFETY (of the map): the file is opened read-only; neardup replaces index
    // files by rename, never in place, so the mapped bytes do not change under
    // us. (Another program truncating the file while it is mapped could still
    // fault.)
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| named(e.into()))?;
    let data: SharedBytes = Arc::new(Mapped(map));
    IndexFile::open(data).map_err(named)
}

impl Bundle {
    /// Opens the index file at `path`, memory-mapped: its tables are used in
    /// place, not read into memory.
    pub fn open(path: &Path) -> Result<Bundle, Error> {
        Bundle::of_file(&map_file(path)?)
    }

    /// The bundle of an opened index file.
    pub fn of_file(file: &IndexFile) -> Result<Bundle, Error> {
        Ok(Bundle {
            index: AnyIndex::of_file(file)?,
            ids: IdTable::read(file)?,
            config: config_of(file)?,
        })
    }

    /// Writes the index file; returns the bytes written.
    pub fn write_to<W: std::io::Write>(&self, w: W) -> Result<u64, Error> {
        write_bundle(&self.index, &self.ids, self.config.as_ref(), w)
    }

    /// Writes the index file at `path` atomically (see
    /// [`crate::output::Output`]: synced, then renamed into place).
    pub fn save(&self, path: &Path) -> Result<u64, Error> {
        let mut out = crate::output::Output::create(Some(path))?;
        let n = self.write_to(&mut out)?;
        out.finish()?;
        Ok(n)
    }
}

/// The configuration an index file records, if any.
pub fn config_of(file: &IndexFile) -> Result<Option<FingerprintConfig>, Error> {
    match file.extra().get("config") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(c) => serde_json::from_value(c.clone())
            .map(Some)
            .map_err(|e| Error::CorruptIndex(format!("its configuration is unreadable: {e}"))),
    }
}

/// Writes an index file of `index` (either kind) with its ids and
/// configuration, as [`Bundle::open`] reads it.
pub fn write_bundle<W: std::io::Write>(
    index: &AnyIndex,
    ids: &IdTable,
    config: Option<&FingerprintConfig>,
    w: W,
) -> Result<u64, Error> {
    write_with(ids, config, |extra, sections| {
        index.write_to(extra, sections, w)
    })
}

/// Calls `write(extra, sections)` with the metadata and sections that carry
/// `ids` and `config` in an index file: for callers holding tables of one
/// width (`Index::write_to`, `CompressedIndex::write_to`).
pub fn write_with(
    ids: &IdTable,
    config: Option<&FingerprintConfig>,
    write: impl FnOnce(&serde_json::Value, &[(&str, &[u8])]) -> Result<u64, Error>,
) -> Result<u64, Error> {
    let (kind, sections) = ids.sections();
    let extra = serde_json::json!({"config": config, "ids": kind, "format": "neardup index"});
    let refs: Vec<(&str, &[u8])> = sections.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    write(&extra, &refs)
}
