//! Compressed tables (Manku, Jain & Das Sarma §3.2).
//!
//! In a sorted table successive keys share their top bits. Keys are stored in
//! blocks of about `block_bytes`, each with one key whole, and every other key
//! as the position h of the highest bit where it differs from its neighbour,
//! Huffman-coded with one code per table, followed by its h bits below it. The
//! paper keeps a block's first key whole and codes the others forwards; here a
//! block keeps its middle key whole (its anchor) and codes the keys above it
//! forwards and those below it backwards, with the same bits. The anchors are
//! kept apart for the search, and a query decodes the keys between two anchors
//! from whichever end is nearer its prefix: a quarter of a block on average
//! instead of a half. Tables store keys only: an entry's ids are found once,
//! from its fingerprint, in a primary array sorted by fingerprint.
//!
//! [`CompressedIndex`] holds its tables in one of two codings ([`Coding`]):
//! these codes (`Gaps`), or the same blocks with Elias–Fano codes
//! (`EliasFano`, the command line's default), which take fewer
//! bits and are read in place instead of decoded in order.

use rayon::prelude::*;

use self::blocks::{GROUP_SHIFT, MAX_BLOCK_KEYS, TableParts};
use self::ef::{EfHead, EfTable};
use self::gaps::{CompressedTable, Head, MAX_TABLES, probe};
use self::huffman::Huffman;
use crate::error::Error;
use crate::index::Match;
use crate::index::bits::Bits;
use crate::index::design::{Table, TableDesign};
use crate::index::file::{
    COMPRESSED_FORMAT_VERSION, EF_FORMAT_VERSION, IndexFile, corrupt, directory_is_sound,
};
use crate::index::radix;
use crate::index::slab::Slab;

mod bitio;
mod blocks;
pub(crate) mod ef;
mod gaps;
mod huffman;

/// Batches from this size, and with at least [`SCAN_PER_BLOCK`] queries per
/// block, are answered by walking the tables (see
/// [`CompressedIndex::query_batch`]); others query by query. A walk decodes
/// every block it reaches whole, a query a quarter of one on average, plus its
/// cache misses: on random fingerprints the two cost the same at about two
/// queries per block.
const SCAN_FROM: usize = 4096;
const SCAN_PER_BLOCK: usize = 2;
/// [`SCAN_PER_BLOCK`] for Elias–Fano coded blocks.
const EF_SCAN_PER_BLOCK: usize = 8;

/// How a compressed index codes the keys of its blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Coding {
    /// The paper's §3.2: each key as its highest bit differing from its
    /// neighbour, Huffman-coded, and the bits below it (this module).
    #[default]
    Gaps,
    /// Each key's difference from its block's first key, Elias–Fano coded
    /// (module `ef`): fewer bits, and no decoding in order.
    EliasFano,
}

impl Coding {
    /// The format version of index files in this coding.
    pub fn format_version(self) -> u32 {
        match self {
            Coding::Gaps => COMPRESSED_FORMAT_VERSION,
            Coding::EliasFano => EF_FORMAT_VERSION,
        }
    }

    /// The name the command line and `index info` use.
    pub fn name(self) -> &'static str {
        match self {
            Coding::Gaps => "gaps",
            Coding::EliasFano => "elias-fano",
        }
    }
}

/// What a compressed index needs beside its sections.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct CompressedMeta {
    /// Distinct fingerprints, and the bits of their directory.
    distinct: u64,
    fps_dir_bits: u32,
    /// Per table: blocks, keys per block, and the Huffman code length of every
    /// symbol.
    blocks: Vec<u64>,
    block_keys: Vec<u32>,
    code_lengths: Vec<Vec<u8>>,
    /// How the keys are coded (absent in version-2 files: the paper's codes).
    #[serde(default)]
    coding: Coding,
}

/// A compressed index's tables, in one coding.
#[derive(Clone, Debug)]
enum Tables<B: Bits> {
    Gaps(Vec<CompressedTable<B>>),
    Ef(Vec<EfTable<B>>),
}

/// A read-only index with compressed tables: the same answers as [`super::Index`]
/// in a fraction of the memory.
#[derive(Clone, Debug)]
pub struct CompressedIndex<B: Bits> {
    design: TableDesign,
    /// Distinct fingerprints, ascending, and the entries of each.
    fps: Slab<B>,
    /// `fps_dir[v]`: the first fingerprint whose top `fps_dir_bits` bits are >= v.
    fps_dir: Slab<u32>,
    fps_dir_bits: u32,
    starts: Slab<u32>,
    ids: Slab<u64>,
    tables: Tables<B>,
}

impl<B: Bits> CompressedIndex<B> {
    /// Builds the compressed tables of `design` over `entries`, in blocks of about
    /// `block_bytes` (the paper uses 1024; smaller blocks decode faster), with
    /// keys coded as `coding` says.
    pub fn build(
        design: TableDesign,
        entries: impl IntoIterator<Item = (u64, B)>,
        block_bytes: usize,
        coding: Coding,
    ) -> Result<Self, Error> {
        if design.bits != B::BITS {
            return Err(Error::WidthMismatch {
                expected: design.bits,
                got: B::BITS,
            });
        }
        let mut pairs: Vec<(B, u64)> = entries.into_iter().map(|(id, f)| (f, id)).collect();
        pairs.par_sort_unstable();
        let mut fps = crate::index::mem::with_huge_capacity(pairs.len());
        let mut starts = crate::index::mem::with_huge_capacity(pairs.len() + 1);
        for (i, &(f, _)) in pairs.iter().enumerate() {
            if i == 0 || pairs[i - 1].0 != f {
                fps.push(f);
                starts.push(i as u32);
            }
        }
        starts.push(pairs.len() as u32);
        let mut ids: Vec<u64> = crate::index::mem::with_huge_capacity(pairs.len());
        ids.extend(pairs.into_iter().map(|(_, id)| id));
        let sorted = |t: &Table| {
            let mut keys: Vec<B> = fps.iter().map(|&f| t.permute(f)).collect();
            let d = crate::index::table::dir_bits_for(keys.len(), t.prefix_bits()).min(26);
            radix::sort_by_top(&mut keys, &mut Vec::new(), d);
            keys.par_sort_unstable();
            keys
        };
        let tables = match coding {
            Coding::Gaps => Tables::Gaps(
                design
                    .tables
                    .par_iter()
                    .map(|t| CompressedTable::build(t, &sorted(t), block_bytes))
                    .collect(),
            ),
            Coding::EliasFano => Tables::Ef(
                design
                    .tables
                    .par_iter()
                    .map(|t| EfTable::build(t, &sorted(t), block_bytes))
                    .collect(),
            ),
        };
        let fps_dir_bits = crate::index::table::dir_bits_for(fps.len(), B::BITS);
        let fps_dir = crate::index::table::directory(fps.iter().copied(), fps_dir_bits);
        Ok(CompressedIndex {
            design,
            fps: fps.into(),
            fps_dir: fps_dir.into(),
            fps_dir_bits,
            starts: starts.into(),
            ids: ids.into(),
            tables,
        })
    }

    /// How the tables code their keys.
    pub fn coding(&self) -> Coding {
        match self.tables {
            Tables::Gaps(_) => Coding::Gaps,
            Tables::Ef(_) => Coding::EliasFano,
        }
    }

    /// Number of tables.
    pub fn table_count(&self) -> usize {
        match &self.tables {
            Tables::Gaps(t) => t.len(),
            Tables::Ef(t) => t.len(),
        }
    }

    /// Keys per block (the last block of a table may hold fewer).
    pub fn block_keys(&self) -> usize {
        match &self.tables {
            Tables::Gaps(t) => t.first().map_or(0, |t| t.block_keys),
            Tables::Ef(t) => t.first().map_or(0, |t| t.block_keys),
        }
    }

    /// Bits per distinct key and table, averaged over the tables: the coded
    /// keys alone, and with the block headers and directories.
    pub fn bits_per_key(&self) -> (f64, f64) {
        let n = self.fps.len();
        let per: Vec<(f64, f64)> = match &self.tables {
            Tables::Gaps(t) => t.iter().map(|t| t.bits_per_key(n)).collect(),
            Tables::Ef(t) => t.iter().map(|t| t.bits_per_key(n)).collect(),
        };
        let tables = per.len().max(1) as f64;
        let (a, b) = per
            .iter()
            .fold((0.0, 0.0), |acc, x| (acc.0 + x.0, acc.1 + x.1));
        (a / tables, b / tables)
    }

    /// Blocks per table.
    fn blocks(&self) -> usize {
        match &self.tables {
            Tables::Gaps(t) => t.first().map_or(0, |t| t.heads.len()),
            Tables::Ef(t) => t.first().map_or(0, |t| t.heads.len()),
        }
    }

    /// Distinct fingerprints stored.
    pub fn distinct(&self) -> usize {
        self.fps.len()
    }

    /// The table design.
    pub fn design(&self) -> &TableDesign {
        &self.design
    }

    /// Entries stored.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether it stores no entry.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Every entry as `(id, fingerprint)`, by fingerprint. A damaged file's
    /// out-of-range entry numbers are skipped.
    pub fn entries(&self) -> impl Iterator<Item = (u64, B)> + '_ {
        (0..self.fps.len()).flat_map(move |g| {
            let (from, to) = (self.starts[g] as usize, self.starts[g + 1] as usize);
            let ids = self.ids.get(from..to.min(self.ids.len())).unwrap_or(&[]);
            ids.iter().map(move |&id| (id, self.fps[g]))
        })
    }

    /// Every pair of entries within `k`, each once: `(id_a, id_b, distance)`.
    pub fn self_join(&self, k: u32) -> Result<Vec<(u64, u64, u32)>, Error> {
        self.design.check_k(k)?;
        let (ids, fps): (Vec<u64>, Vec<B>) = self.entries().unzip();
        let pairs = super::self_join(&fps, k, &self.design)?;
        Ok(pairs
            .into_iter()
            .map(|(a, b, d)| (ids[a as usize], ids[b as usize], d))
            .collect())
    }

    /// Bytes held.
    pub fn memory(&self) -> usize {
        let tables: usize = match &self.tables {
            Tables::Gaps(t) => t.iter().map(CompressedTable::memory).sum(),
            Tables::Ef(t) => t.iter().map(EfTable::memory).sum(),
        };
        tables
            + self.fps.len() * (std::mem::size_of::<B>() + 4)
            + self.fps_dir.len() * 4
            + self.ids.len() * 8
    }

    /// Every entry within `k` of `query`, each once, nearest first (ties by id).
    pub fn query(&self, query: B, k: u32) -> Result<Vec<Match>, Error> {
        self.design.check_k(k)?;
        let mut found = Vec::new();
        match &self.tables {
            Tables::Gaps(t) => {
                for tables in t.chunks(MAX_TABLES) {
                    probe(tables, query, k, &mut found);
                }
            }
            Tables::Ef(t) => {
                for tables in t.chunks(ef::MAX_TABLES) {
                    ef::probe(tables, query, k, &mut found);
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        let mut out = Vec::new();
        for (fp, distance) in found {
            if let Some(g) = self.find(fp) {
                for &id in self.ids_of(g) {
                    out.push(Match { distance, id });
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// The position of `fp` among the distinct fingerprints.
    #[inline]
    fn find(&self, fp: B) -> Option<usize> {
        let fps: &[B] = &self.fps;
        let b = fp.top(self.fps_dir_bits) as usize;
        let (from, to) = (self.fps_dir[b] as usize, self.fps_dir[b + 1] as usize);
        let i = from + fps[from..to].partition_point(|&f| f < fp);
        (fps.get(i) == Some(&fp)).then_some(i)
    }

    /// The ids of distinct fingerprint `g` (none if a damaged file says so).
    #[inline]
    fn ids_of(&self, g: usize) -> &[u64] {
        // Entry g's ids start at starts[g] >= g, which is g itself until some
        // fingerprint has several ids: fetch that line while starts[g] loads.
        if let Some(id) = self.ids.get(g) {
            crate::index::table::prefetch(id);
        }
        match (self.starts.get(g), self.starts.get(g + 1)) {
            (Some(&a), Some(&b)) => self.ids.get(a as usize..b as usize).unwrap_or_default(),
            _ => &[],
        }
    }

    /// [`CompressedIndex::query`] for many queries, in parallel; answers in
    /// query order. A large batch is sorted by each table's key and answered in
    /// one walk along each table, as the paper's batch mode does: every block is
    /// decoded at most once per walk, however many queries it serves.
    pub fn query_batch(&self, queries: &[B], k: u32) -> Result<Vec<Vec<Match>>, Error> {
        self.design.check_k(k)?;
        // The paper's codes walk a table by decoding each block it reaches
        // whole. Elias–Fano blocks are read in place by both ways, and a walk
        // only pays for its sorting from about 8 queries per block (measured
        // at N = 10 million: 1.3x faster than query by query at 19 per block,
        // 1.2x slower at 4).
        let per_block = match self.tables {
            Tables::Gaps(_) => SCAN_PER_BLOCK,
            Tables::Ef(_) => EF_SCAN_PER_BLOCK,
        };
        if queries.len() < SCAN_FROM.max(per_block * self.blocks()) {
            return queries.par_iter().map(|&q| self.query(q, k)).collect();
        }
        if queries.len() > u32::MAX as usize {
            return Err(Error::Full(
                "a batch holds fewer than 4,294,967,296 queries: split it".into(),
            ));
        }
        // Each table's sorted queries are cut into pieces walked in parallel.
        let piece = queries
            .len()
            .div_ceil(4 * rayon::current_num_threads())
            .max(SCAN_FROM / 4);
        let sorted = |t: &Table| {
            let mut keys: Vec<(B, u32)> = queries
                .iter()
                .zip(0u32..)
                .map(|(&q, i)| (t.permute(q), i))
                .collect();
            keys.par_sort_unstable();
            keys
        };
        // One table's walk, in pieces: its sorted queries, and how it scans a piece.
        type Scan<'s, B> = dyn Fn(&[(B, u32)]) -> Vec<(u32, B, u32)> + Sync + 's;
        let walk = |t: &Table, scan: &Scan<'_, B>| {
            sorted(t)
                .par_chunks(piece)
                .flat_map_iter(scan)
                .collect::<Vec<_>>()
        };
        let mut found: Vec<(u32, B, u32)> = match &self.tables {
            Tables::Gaps(tables) => tables
                .par_iter()
                .flat_map(|t| walk(&t.table, &|part| t.view().scan(part, k)))
                .collect(),
            Tables::Ef(tables) => tables
                .par_iter()
                .flat_map(|t| walk(&t.table, &|part| t.view().scan(part, k)))
                .collect(),
        };
        found.par_sort_unstable();
        found.dedup();
        // Each query's answers, built in parallel (the id lookups are cache
        // misses), then moved to their places.
        let answers: Vec<(u32, Vec<Match>)> = found
            .par_chunk_by(|a, b| a.0 == b.0)
            .map(|group| {
                let mut m = Vec::new();
                for &(_, fp, distance) in group {
                    if let Some(g) = self.find(fp) {
                        for &id in self.ids_of(g) {
                            m.push(Match { distance, id });
                        }
                    }
                }
                m.sort_unstable();
                (group[0].0, m)
            })
            .collect();
        let mut out = vec![Vec::new(); queries.len()];
        for (q, m) in answers {
            out[q as usize] = m;
        }
        Ok(out)
    }
}

impl<B: Bits> CompressedIndex<B> {
    /// Writes the index file (format version 2 for the paper's codes, 3 for
    /// Elias–Fano codes, see [`IndexFile`]) with the caller's `extra` metadata
    /// and named `sections`. Returns the bytes written.
    pub fn write_to<W: std::io::Write>(
        &self,
        extra: &serde_json::Value,
        sections: &[(&str, &[u8])],
        w: W,
    ) -> Result<u64, Error> {
        let mut own: Vec<(String, &[u8])> = vec![
            ("fps".into(), bytemuck::cast_slice(&self.fps)),
            ("fps.dir".into(), bytemuck::cast_slice(&self.fps_dir)),
            ("starts".into(), bytemuck::cast_slice(&self.starts)),
            ("ids".into(), bytemuck::cast_slice(&self.ids)),
        ];
        let parts: Vec<TableParts<'_>> = match &self.tables {
            Tables::Gaps(t) => t.iter().map(CompressedTable::parts).collect(),
            Tables::Ef(t) => t.iter().map(EfTable::parts).collect(),
        };
        for (i, t) in parts.iter().enumerate() {
            own.push((format!("t{i}.heads"), t.heads));
            own.push((format!("t{i}.bases"), bytemuck::cast_slice(t.bases)));
            own.push((format!("t{i}.dir"), bytemuck::cast_slice(t.block_dir)));
            own.push((format!("t{i}.data"), t.data));
        }
        let coding = self.coding();
        let head = crate::index::file::Head {
            version: coding.format_version(),
            bits: B::BITS,
            entries: self.ids.len() as u64,
            design: &self.design,
            dir_bits: parts.iter().map(|p| p.dir_bits).collect(),
            compressed: Some(
                serde_json::to_value(CompressedMeta {
                    distinct: self.fps.len() as u64,
                    fps_dir_bits: self.fps_dir_bits,
                    blocks: parts.iter().map(|p| p.blocks as u64).collect(),
                    block_keys: parts.iter().map(|p| p.block_keys as u32).collect(),
                    code_lengths: parts.into_iter().map(|p| p.code_lengths).collect(),
                    coding,
                })
                .map_err(|e| Error::Io(e.into()))?,
            ),
        };
        crate::index::file::write_file(head, own, extra, sections, w)
    }
}

impl IndexFile {
    /// The compressed index of a version-2 or 3 file, using the file's bytes in place.
    /// Checks the structure (directories, block headers, codes: work in
    /// proportion to the blocks, not the keys), so that a damaged file gives an
    /// error or, past these checks, wrong bits in answers, never a crash;
    /// [`IndexFile::verify`] checks every byte.
    pub fn compressed_index<B: Bits>(&self) -> Result<CompressedIndex<B>, Error> {
        let Some(meta) = self.compressed_meta() else {
            return Err(Error::InvalidConfig(
                "this index file holds plain tables, not compressed ones".into(),
            ));
        };
        let meta: CompressedMeta = serde_json::from_value(meta.clone())
            .map_err(|e| corrupt(format!("metadata of the compressed tables: {e}")))?;
        if meta.coding.format_version() != self.version() {
            return Err(corrupt(
                "the metadata does not match the format version (compressed tables)",
            ));
        }
        if B::BITS != self.bits() {
            return Err(Error::WidthMismatch {
                expected: B::BITS,
                got: self.bits(),
            });
        }
        let design = self.design().clone();
        let tables = design.tables.len();
        let dir_bits = self.dir_bits();
        if design.bits != B::BITS
            || dir_bits.len() != tables
            || meta.blocks.len() != tables
            || meta.code_lengths.len() != tables
            || meta.block_keys.len() != tables
        {
            return Err(corrupt("the design does not match the header"));
        }
        let (n, distinct) = (self.entries(), meta.distinct);
        if n >= u64::from(u32::MAX) || distinct > n {
            return Err(corrupt(format!("{distinct} distinct of {n} entries")));
        }
        if !(1..=26).contains(&meta.fps_dir_bits) {
            return Err(corrupt("the fingerprint directory's size"));
        }
        let fps: Slab<B> = self.slab("fps", distinct)?;
        let fps_dir: Slab<u32> = self.slab("fps.dir", (1u64 << meta.fps_dir_bits) + 1)?;
        let starts: Slab<u32> = self.slab("starts", distinct + 1)?;
        let ids: Slab<u64> = self.slab("ids", n)?;
        if !directory_is_sound(&fps_dir, distinct)
            || starts.first() != Some(&0)
            || starts.last().map(|&s| u64::from(s)) != Some(n)
        {
            return Err(corrupt("the fingerprint directory is damaged"));
        }
        let mut out = Vec::with_capacity(tables);
        let mut efs = Vec::with_capacity(tables);
        for (i, t) in design.tables.iter().enumerate() {
            let (bits, blocks) = (dir_bits[i], meta.blocks[i]);
            let p = t.prefix_bits();
            if !(1..=26).contains(&bits) || bits > p || blocks >= u64::from(u32::MAX) {
                return Err(corrupt(format!("table {i}'s directory or block count")));
            }
            let block_keys = meta.block_keys[i] as usize;
            if !(1..=MAX_BLOCK_KEYS).contains(&block_keys)
                || blocks != (distinct as usize).div_ceil(block_keys) as u64
            {
                return Err(corrupt(format!("table {i}'s block size")));
            }
            let groups = blocks.div_ceil(1 << GROUP_SHIFT);
            let bases: Slab<u64> = self.slab(&format!("t{i}.bases"), groups)?;
            let block_dir: Slab<u32> = self.slab(&format!("t{i}.dir"), (1u64 << bits) + 1)?;
            let data_len = self.section(&format!("t{i}.data")).map_or(0, <[u8]>::len);
            let data: Slab<u8> = self.slab(&format!("t{i}.data"), data_len as u64)?;
            if meta.coding == Coding::EliasFano {
                let heads: Slab<EfHead<B>> = self.slab(&format!("t{i}.heads"), blocks)?;
                efs.push(EfTable::from_parts(
                    i,
                    t,
                    distinct as usize,
                    block_keys,
                    heads,
                    bases,
                    block_dir,
                    bits,
                    data,
                )?);
                continue;
            }
            let heads: Slab<Head<B>> = self.slab(&format!("t{i}.heads"), blocks)?;
            let code = (meta.code_lengths[i].len() == B::BITS as usize)
                .then(|| Huffman::from_lengths(&meta.code_lengths[i]))
                .flatten()
                .ok_or_else(|| corrupt(format!("table {i}'s code")))?;
            if data_len < 16 {
                return Err(corrupt(format!("table {i}'s stream is cut short")));
            }
            // Meeting points in order, inside the stream's padding.
            let mut last = 8u64;
            for (b, h) in heads.iter().enumerate() {
                let meet = bases[b >> GROUP_SHIFT].checked_add(u64::from(h.at));
                match meet {
                    Some(m) if m >= last && m <= data_len as u64 - 8 => last = m,
                    _ => return Err(corrupt(format!("table {i}'s block headers are damaged"))),
                }
            }
            if !directory_is_sound(&block_dir, blocks) {
                return Err(corrupt(format!("table {i}'s blocks are damaged")));
            }
            let (prefix, rest) = t.prefix_masks();
            out.push(CompressedTable {
                table: t.clone(),
                prefix,
                rest,
                block_keys,
                keys: distinct as usize,
                heads,
                bases,
                block_dir,
                dir_bits: bits,
                data,
                code,
            });
        }
        Ok(CompressedIndex {
            design,
            fps,
            fps_dir,
            fps_dir_bits: meta.fps_dir_bits,
            starts,
            ids,
            tables: match meta.coding {
                Coding::Gaps => Tables::Gaps(out),
                Coding::EliasFano => Tables::Ef(efs),
            },
        })
    }
}
