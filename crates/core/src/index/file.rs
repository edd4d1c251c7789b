//! The index file: tables ready to be memory-mapped and used in place.
//!
//! ```text
//! header (64 bytes)  magic "NDUPIDX\0", format version u32, fingerprint bits u32,
//!                    entries u64, zero padding
//! sections           each 64-byte aligned. Version 1 (plain tables): "fps", "ids",
//!                    and per table i "t{i}.keys", "t{i}.items", "t{i}.dir".
//!                    Versions 2 and 3 (compressed tables, read-only; 2 in the
//!                    paper's codes, 3 in Elias–Fano codes): "fps" (distinct,
//!                    ascending), "fps.dir", "starts", "ids", and per table i
//!                    "t{i}.heads", "t{i}.bases", "t{i}.dir", "t{i}.data". Then the
//!                    caller's own (document ids, ...)
//! metadata           JSON: design, section table (offset, length, xxh3-64), the
//!                    caller's "extra" value (the FingerprintConfig, ...), and for
//!                    versions 2 and 3 the tables' directory sizes, keys per
//!                    block, Huffman code lengths (version 2) and coding (3)
//! footer (32 bytes)  metadata offset u64, metadata length u64, xxh3-64 of header
//!                    and metadata u64, magic "NDUPEND\0"
//! ```
//! All integers little-endian. [`IndexFile::open`] checks the header, the footer,
//! the metadata checksum and every section's bounds, alignment and directory
//! (monotone, ending at the entry count): work proportional to the directories,
//! an eighth of the entries, never to the data. Queries treat an out-of-range item
//! number as absent, so a damaged file never makes them panic or read out of
//! bounds. [`IndexFile::verify`] checks every byte against the checksums.

use std::io::Write;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use super::Index;
use super::bits::Bits;
use super::design::TableDesign;
use super::slab::{SharedBytes, Slab};
use super::table::SortedTable;
use crate::error::Error;

const MAGIC: &[u8; 8] = b"NDUPIDX\0";
const END_MAGIC: &[u8; 8] = b"NDUPEND\0";
/// The format version of files with plain tables.
pub const FORMAT_VERSION: u32 = 1;
/// The format version of files with compressed tables in the paper's codes.
pub const COMPRESSED_FORMAT_VERSION: u32 = 2;
/// The format version of files with compressed tables in Elias–Fano codes.
pub const EF_FORMAT_VERSION: u32 = 3;
const HEADER: usize = 64;
const FOOTER: usize = 32;
const ALIGN: usize = 64;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Section {
    name: String,
    offset: u64,
    len: u64,
    xxh3: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Meta {
    design: TableDesign,
    dir_bits: Vec<u32>,
    sections: Vec<Section>,
    extra: serde_json::Value,
    /// The compressed tables' own metadata (versions 2 and 3), which only
    /// they read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compressed: Option<serde_json::Value>,
}

pub(super) fn corrupt(reason: impl Into<String>) -> Error {
    Error::CorruptIndex(reason.into())
}

/// Whether a directory starts at 0, never decreases and ends at `total`.
pub(super) fn directory_is_sound(dir: &[u32], total: u64) -> bool {
    dir.first() == Some(&0)
        && dir.last().map(|&l| u64::from(l)) == Some(total)
        && dir.windows(2).all(|w| w[0] <= w[1])
}

/// Writes `index` (live entries only, pending additions merged) with the caller's
/// `extra` metadata and `sections`; returns the bytes written.
pub fn write<B: Bits, W: Write>(
    index: &Index<B>,
    extra: &serde_json::Value,
    sections: &[(&str, &[u8])],
    w: W,
) -> Result<u64, Error> {
    let clean;
    let index = if index.deleted_count > 0 || index.indexed < index.fps.len() {
        let mut c = index.clone();
        c.compact();
        clean = c;
        &clean
    } else {
        index
    };
    let mut own: Vec<(String, &[u8])> = vec![
        ("fps".into(), bytemuck::cast_slice(&index.fps)),
        ("ids".into(), bytemuck::cast_slice(&index.ids)),
    ];
    for (i, t) in index.tables.iter().enumerate() {
        own.push((format!("t{i}.keys"), bytemuck::cast_slice(&t.keys)));
        own.push((format!("t{i}.items"), bytemuck::cast_slice(&t.items)));
        own.push((format!("t{i}.dir"), bytemuck::cast_slice(&t.dir)));
    }
    let head = Head {
        version: FORMAT_VERSION,
        bits: B::BITS,
        entries: index.fps.len() as u64,
        design: &index.design,
        dir_bits: index.tables.iter().map(|t| t.dir_bits).collect(),
        compressed: None,
    };
    write_file(head, own, extra, sections, w)
}

/// What the header and metadata say besides the sections.
pub(super) struct Head<'a> {
    pub(super) version: u32,
    pub(super) bits: u32,
    pub(super) entries: u64,
    pub(super) design: &'a TableDesign,
    pub(super) dir_bits: Vec<u32>,
    pub(super) compressed: Option<serde_json::Value>,
}

/// Writes a file: header, the index's `own` sections and the caller's, metadata,
/// footer. Returns the bytes written.
pub(super) fn write_file<W: Write>(
    head: Head<'_>,
    own: Vec<(String, &[u8])>,
    extra: &serde_json::Value,
    sections: &[(&str, &[u8])],
    mut w: W,
) -> Result<u64, Error> {
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&head.version.to_le_bytes());
    header.extend_from_slice(&head.bits.to_le_bytes());
    header.extend_from_slice(&head.entries.to_le_bytes());
    header.resize(HEADER, 0);
    w.write_all(&header)?;
    let mut pos = HEADER as u64;
    let mut table: Vec<Section> = Vec::new();
    let mut put = |name: String, bytes: &[u8], w: &mut W| -> Result<(), Error> {
        let pad = (ALIGN as u64 - pos % ALIGN as u64) % ALIGN as u64;
        w.write_all(&vec![0u8; pad as usize])?;
        pos += pad;
        w.write_all(bytes)?;
        table.push(Section {
            name,
            offset: pos,
            len: bytes.len() as u64,
            xxh3: format!("{:016x}", xxh3_64(bytes)),
        });
        pos += bytes.len() as u64;
        Ok(())
    };
    for (name, bytes) in own {
        put(name, bytes, &mut w)?;
    }
    for (name, bytes) in sections {
        put((*name).to_owned(), bytes, &mut w)?;
    }
    let meta = Meta {
        design: head.design.clone(),
        dir_bits: head.dir_bits,
        sections: table,
        extra: extra.clone(),
        compressed: head.compressed,
    };
    let meta_bytes = serde_json::to_vec(&meta).map_err(|e| Error::Io(e.into()))?;
    w.write_all(&meta_bytes)?;
    let mut footer = Vec::with_capacity(FOOTER);
    footer.extend_from_slice(&pos.to_le_bytes());
    footer.extend_from_slice(&(meta_bytes.len() as u64).to_le_bytes());
    footer.extend_from_slice(&head_checksum(&header, &meta_bytes).to_le_bytes());
    footer.extend_from_slice(END_MAGIC);
    w.write_all(&footer)?;
    w.flush()?;
    Ok(pos + meta_bytes.len() as u64 + FOOTER as u64)
}

fn head_checksum(header: &[u8], meta: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(header);
    h.update(meta);
    h.digest()
}

/// An index file, opened (typically memory-mapped).
#[derive(Clone)]
pub struct IndexFile {
    data: SharedBytes,
    version: u32,
    bits: u32,
    entries: u64,
    meta: Meta,
}

impl std::fmt::Debug for IndexFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexFile")
            .field("bits", &self.bits)
            .field("entries", &self.entries)
            .finish()
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl IndexFile {
    /// Opens the container: checks header, footer, metadata and the bounds of
    /// every section; [`IndexFile::open`] then checks the tables' structure.
    pub(super) fn open_container(data: SharedBytes) -> Result<IndexFile, Error> {
        let b = (*data).as_ref();
        if b.len() < HEADER + FOOTER {
            return Err(corrupt(format!(
                "{} bytes is too short for an index file (truncated?)",
                b.len()
            )));
        }
        if &b[..8] != MAGIC {
            return Err(corrupt("not a neardup index file (wrong magic number)"));
        }
        let version = u32_at(b, 8);
        if ![FORMAT_VERSION, COMPRESSED_FORMAT_VERSION, EF_FORMAT_VERSION].contains(&version) {
            return Err(Error::IndexVersion {
                expected: EF_FORMAT_VERSION,
                got: version,
            });
        }
        let bits = u32_at(b, 12);
        let entries = u64_at(b, 16);
        if bits != 64 && bits != 128 {
            return Err(corrupt(format!("fingerprint width {bits} in the header")));
        }
        let foot = &b[b.len() - FOOTER..];
        if &foot[24..32] != END_MAGIC {
            return Err(corrupt(
                "the end marker is missing: the file is truncated or damaged",
            ));
        }
        let (meta_at, meta_len) = (u64_at(foot, 0) as usize, u64_at(foot, 8) as usize);
        let meta_end = meta_at
            .checked_add(meta_len)
            .filter(|&e| e == b.len() - FOOTER);
        if meta_end.is_none() || meta_at < HEADER {
            return Err(corrupt(
                "the metadata location is out of the file: truncated or damaged",
            ));
        }
        let meta_bytes = &b[meta_at..meta_at + meta_len];
        if head_checksum(&b[..HEADER], meta_bytes) != u64_at(foot, 16) {
            return Err(corrupt("header or metadata checksum mismatch"));
        }
        let meta: Meta =
            serde_json::from_slice(meta_bytes).map_err(|e| corrupt(format!("metadata: {e}")))?;
        for s in &meta.sections {
            let end = s.offset.checked_add(s.len);
            if !(s.offset as usize).is_multiple_of(ALIGN)
                || end.is_none_or(|e| e as usize > meta_at)
            {
                return Err(corrupt(format!("section {} lies outside the data", s.name)));
            }
        }
        if (version == FORMAT_VERSION) != meta.compressed.is_none() {
            return Err(corrupt(
                "the metadata does not match the format version (compressed tables)",
            ));
        }
        Ok(IndexFile {
            data: data.clone(),
            version,
            bits,
            entries,
            meta,
        })
    }

    /// The format version (see the module's documentation).
    pub(super) fn version(&self) -> u32 {
        self.version
    }

    /// Checks every byte: each section against its checksum, and the padding
    /// between sections (zeros). The header, metadata and footer were checked by
    /// [`IndexFile::open`].
    pub fn verify(&self) -> Result<(), Error> {
        let b = (*self.data).as_ref();
        let mut sections: Vec<&Section> = self.meta.sections.iter().collect();
        sections.sort_by_key(|s| s.offset);
        let mut covered = HEADER;
        for s in sections {
            let (start, end) = (s.offset as usize, (s.offset + s.len) as usize);
            if start < covered || b[covered..start].iter().any(|&x| x != 0) {
                return Err(corrupt(format!(
                    "the bytes before section {} are damaged",
                    s.name
                )));
            }
            if format!("{:016x}", xxh3_64(&b[start..end])) != s.xxh3 {
                return Err(corrupt(format!("section {} fails its checksum", s.name)));
            }
            covered = end;
        }
        let meta_at = u64_at(&b[b.len() - FOOTER..], 0) as usize;
        if covered != meta_at {
            return Err(corrupt("unaccounted bytes before the metadata"));
        }
        Ok(())
    }

    /// Fingerprint width.
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// Entries stored.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Whether the tables are compressed (format versions 2 and 3: read-only).
    pub fn is_compressed(&self) -> bool {
        self.meta.compressed.is_some()
    }

    /// The table design.
    pub fn design(&self) -> &TableDesign {
        &self.meta.design
    }

    /// The caller's metadata written with the index.
    pub fn extra(&self) -> &serde_json::Value {
        &self.meta.extra
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        (*self.data).as_ref().len()
    }

    /// Whether the file is empty (never, once opened).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A named section's bytes.
    pub fn section(&self, name: &str) -> Option<&[u8]> {
        let s = self.meta.sections.iter().find(|s| s.name == name)?;
        Some(&(*self.data).as_ref()[s.offset as usize..(s.offset + s.len) as usize])
    }

    pub(super) fn dir_bits(&self) -> &[u32] {
        &self.meta.dir_bits
    }

    pub(super) fn compressed_meta(&self) -> Option<&serde_json::Value> {
        self.meta.compressed.as_ref()
    }

    pub(super) fn slab<T: bytemuck::Pod>(&self, name: &str, count: u64) -> Result<Slab<T>, Error> {
        let s = self
            .meta
            .sections
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| corrupt(format!("section {name} is missing")))?;
        if s.len != count * std::mem::size_of::<T>() as u64 {
            return Err(corrupt(format!(
                "section {name} has {} bytes, expected {}",
                s.len,
                count * std::mem::size_of::<T>() as u64
            )));
        }
        Slab::mapped(
            self.data.clone(),
            s.offset as usize..(s.offset + s.len) as usize,
        )
        .ok_or_else(|| corrupt(format!("section {name} is misaligned")))
    }

    /// The index, using the file's bytes in place (no copy).
    pub fn index<B: Bits>(&self) -> Result<Index<B>, Error> {
        if self.is_compressed() {
            return Err(Error::ReadOnly(
                "this index file holds compressed tables, which are read-only: query it, or \
                 rebuild it without --compressed to add or delete entries"
                    .into(),
            ));
        }
        if B::BITS != self.bits {
            return Err(Error::WidthMismatch {
                expected: B::BITS,
                got: self.bits,
            });
        }
        let n = self.entries;
        if n >= u32::MAX as u64 {
            return Err(corrupt(format!("{n} entries is more than an index holds")));
        }
        let design = self.meta.design.clone();
        if design.bits != self.bits || self.meta.dir_bits.len() != design.tables.len() {
            return Err(corrupt("the design does not match the header"));
        }
        let mut tables = Vec::with_capacity(design.tables.len());
        for (i, t) in design.tables.iter().enumerate() {
            let dir_bits = self.meta.dir_bits[i];
            let prefix_bits = t.prefix_bits();
            if !(1..=26).contains(&dir_bits) || dir_bits > prefix_bits {
                return Err(corrupt(format!(
                    "table {i} has a directory of {dir_bits} bits"
                )));
            }
            let keys: Slab<B> = self.slab(&format!("t{i}.keys"), n)?;
            let items: Slab<u32> = self.slab(&format!("t{i}.items"), n)?;
            let dir: Slab<u32> = self.slab(&format!("t{i}.dir"), (1u64 << dir_bits) + 1)?;
            if !directory_is_sound(&dir, n) {
                return Err(corrupt(format!("table {i}'s directory is damaged")));
            }
            tables.push(SortedTable {
                table: t.clone(),
                prefix_bits,
                keys,
                items,
                dir_bits,
                dir,
            });
        }
        Ok(Index {
            design,
            fps: self.slab("fps", n)?,
            ids: self.slab("ids", n)?,
            tables,
            indexed: n as usize,
            deleted: vec![false; n as usize],
            deleted_count: 0,
        })
    }
}
