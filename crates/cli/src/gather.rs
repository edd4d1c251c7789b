//! The first step of `dedup` and `index build/add`: documents (fingerprinted
//! here) or a ready fingerprint file, into ids and fingerprint values.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use neardup_core::centre::{BitShares, Centre};
use neardup_core::jaccard::{SetFeature, is_short};
use neardup_core::spill::{Spill, SpillWriter, Summary};
use neardup_core::{Fingerprint, FingerprintConfig, InputKind, Width};
use rayon::prelude::*;

use crate::fpfile::{self, IdList, Values};
use crate::input::Body;
use crate::pipeline_args::hasher_for;
use crate::run::{for_each_batch, summary};
use crate::source::SourceArgs;
use crate::vector_store::VectorStore;
use neardup_core::keep_by::{KeepBy, SortKey};

/// What the first pass gathered.
pub struct Gathered {
    pub ids: IdList,
    pub values: Values,
    pub width: Width,
    /// How the fingerprints were made, when known.
    pub config: Option<FingerprintConfig>,
    /// Input records, kept when they cannot be read again (standard input).
    pub raw: Option<Vec<Vec<u8>>>,
    /// For a fingerprint file: its records, when asked for.
    pub file: Option<fpfile::FingerprintFile>,
    pub bytes: u64,
    /// Each document's verification features, on disk, when asked for.
    pub spill: Option<Spill>,
    /// Documents too short for SimHash to be reliable.
    pub short: u64,
    /// Documents without verification features (empty, or only spaces and
    /// punctuation): never paired.
    pub blank: u64,
    /// Every document's vector, when asked for (`verify` with vectors).
    pub vectors: Option<VectorStore>,
    /// The documents in the order `--keep-by` prefers them, unless it is
    /// input order.
    pub preference: Option<Vec<u32>>,
    /// With [`Keep::centre`]: each document's [`BitShares`], one byte per
    /// fingerprint bit, in place of fingerprints (`values` is empty until
    /// [`centre_fingerprints`] decides them).
    pub shares: Option<Vec<u8>>,
}

/// What the first pass keeps besides ids and fingerprints.
#[derive(Debug, Default, Clone)]
pub struct Keep {
    /// A fingerprint file's records.
    pub records: bool,
    /// The documents' raw records, in memory (for standard input, which
    /// cannot be read twice).
    pub raw: bool,
    /// Each document's verification features (texts, spilled to disk under
    /// `tmp_dir`) or its vector (vectors, in memory).
    pub verify: bool,
    /// Where verification features are spilled (default: the system's
    /// temporary folder).
    pub tmp_dir: Option<PathBuf>,
    /// Which copy survives: the keys it needs are gathered.
    pub keep_by: KeepBy,
    /// Texts' fingerprints are centred on the corpus: gather their shares
    /// (with `verify`; [`centre_fingerprints`] makes the fingerprints).
    pub centre: bool,
}

/// What a worker made of a document: its fingerprint, or where the bits of
/// a fingerprint to be centred lean.
enum Made {
    Fingerprint(Fingerprint),
    Shares(BitShares),
}

/// Decides the centred fingerprints of documents gathered with
/// [`Keep::centre`], on the mean of all of them (old and new alike): each
/// part's `values` are filled and its shares dropped.
pub fn centre_fingerprints(parts: &mut [&mut Gathered]) {
    let Some(width) = parts.first().map(|g| g.width) else {
        return;
    };
    let bits = width.bits() as usize;
    let mut centre = Centre::new(width);
    for g in parts.iter() {
        for shares in g.shares.iter().flat_map(|s| s.chunks_exact(bits)) {
            centre.add(shares);
        }
    }
    for g in parts.iter_mut() {
        let Some(shares) = g.shares.take() else {
            continue;
        };
        let mut values = Values::with_width(width, shares.len() / bits);
        for fp in shares
            .par_chunks_exact(bits)
            .map(|s| centre.fingerprint(s))
            .collect::<Vec<_>>()
        {
            values.push(fp);
        }
        g.values = values;
    }
}

/// Reads the fingerprint file if one is given, else fingerprints the documents,
/// keeping what `keep` asks for.
pub fn gather(source: &SourceArgs, keep: &Keep, quiet: bool) -> Result<Gathered> {
    let (records, keep_raw, verify) = (keep.records, keep.raw, keep.verify);
    let (input, pipeline) = (&source.input, &source.pipeline);
    let started = Instant::now();
    if let Some(path) = source.fingerprints.as_deref() {
        let mut f = fpfile::read(path, records)?;
        if let Some(file_config) = &f.config
            && pipeline.config.is_some()
        {
            let (config, _) = pipeline.resolve()?;
            config.check_compatible(file_config)?;
        }
        return Ok(Gathered {
            ids: std::mem::replace(&mut f.ids, IdList::Ints(Vec::new())),
            values: std::mem::take(&mut f.values),
            width: f.width,
            config: f.config.clone(),
            raw: None,
            bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            file: Some(f),
            spill: None,
            short: 0,
            blank: 0,
            vectors: None,
            preference: None,
            shares: None,
        });
    }
    let mut input = input.clone();
    let hasher = hasher_for(pipeline, &mut input)?;
    // Where the input and the spill (about 0.45 bytes per byte of English
    // text, 1.1 of Chinese, several per byte of compressed input) are more
    // than the page cache can hold, the input's pages past what fits beside
    // the spill go as they are read, so that the spill's stay for
    // verification: decided as the spill grows, on the share of the input (as
    // stored) read so far.
    let stored = crate::input::DocReader::total_bytes(&input).unwrap_or(0);
    let cache = available_memory().unwrap_or(u64::MAX);
    let read_before = crate::input::file_bytes_read();
    crate::input::keep_read_pages(u64::MAX);
    let mut kept_input = u64::MAX;
    let mut ids = Vec::new();
    let mut values = Values::with_width(hasher.width(), 0);
    let mut raw = keep_raw.then(Vec::new);
    let vector_input = input.kind == InputKind::Vector;
    let mut spill = match verify && !vector_input {
        true => Some(SpillWriter::new(keep.tmp_dir.as_deref()).with_context(|| {
            format!(
                "cannot create the verification features' spill file in {}; \
                 give a writable folder with --tmp-dir",
                keep.tmp_dir
                    .clone()
                    .unwrap_or_else(std::env::temp_dir)
                    .display()
            )
        })?),
        false => None,
    };
    let mut blank = 0u64;
    let mut vectors = (verify && vector_input).then(|| VectorStore::new(0));
    let mut short = 0u64;
    let by_key = keep.keep_by != KeepBy::First;
    let mut keys: Vec<SortKey> = Vec::new();
    let centre = verify && keep.centre && input.kind == InputKind::Text;
    let mut shares = centre.then(Vec::new);
    let sets = SetPool::default();
    // The per-document lists are reserved once the first batch is in
    // ([`documents_to_reserve`]).
    let (mut reserved, mut first_text) = (stored == 0, 0u64);
    let stats = for_each_batch(
        &input,
        keep_raw || keep.keep_by.field().is_some(),
        quiet,
        |doc| {
            let key = by_key.then(|| {
                keep.keep_by
                    .key(doc.text(), doc.raw.as_deref())
                    .map_err(|e| format!("{}: {e}", doc.place))
            });
            let short = matches!(doc.body, Body::Text(_)) && is_short(doc.text());
            if !verify || vector_input {
                let fingerprint = Made::Fingerprint(doc.fingerprint(&hasher));
                return (fingerprint, short, None, key);
            }
            // The verification features, from the fingerprint's own where the
            // two coincide (hashed with the hasher's key, the same for all).
            let mut set = sets.take();
            let made = match centre {
                true => Made::Shares(doc.shares_and_set(&hasher, &mut set)),
                false => Made::Fingerprint(doc.fingerprint_and_set(&hasher, &mut set)),
            };
            let summary = Summary::of(&set);
            (made, short, Some((set, summary)), key)
        },
        |docs, fps| {
            for (doc, (fp, is_short, set, key)) in docs.into_iter().zip(fps) {
                if let Some(key) = key {
                    keys.push(key.map_err(anyhow::Error::msg)?);
                }
                if let (Some(store), Body::Vector(v)) = (vectors.as_mut(), &doc.body) {
                    store.insert(ids.len(), v);
                }
                if !reserved {
                    first_text += doc.text().len() as u64;
                }
                ids.push(doc.id);
                match (fp, shares.as_mut()) {
                    (Made::Fingerprint(fp), _) => values.push(fp),
                    (Made::Shares(s), Some(all)) => all.extend_from_slice(s.as_bytes()),
                    (Made::Shares(_), None) => unreachable!("shares only when centring"),
                }
                short += u64::from(is_short);
                if let (Some(r), Some(bytes)) = (raw.as_mut(), doc.raw) {
                    r.push(bytes);
                }
                if let (Some(w), Some((set, summary))) = (spill.as_mut(), set) {
                    blank += u64::from(set.is_empty());
                    w.push(&set, summary)
                        .context("cannot write the verification features' spill file")?;
                    sets.give(set);
                }
            }
            if !reserved && first_text > 0 {
                reserved = true;
                let total = documents_to_reserve(stored, first_text, ids.len(), cache);
                let more = total.saturating_sub(ids.len());
                ids.reserve(more);
                values.reserve(more);
                if let Some(all) = shares.as_mut() {
                    // (A byte per bit of the fingerprint, 128 at most.)
                    all.reserve(more * 128);
                }
                if let Some(w) = spill.as_mut() {
                    w.reserve(more);
                }
            }
            if let Some(w) = spill.as_ref() {
                let read = crate::input::file_bytes_read() - read_before;
                let spill_at_end = (u128::from(w.bytes()) * u128::from(stored))
                    .checked_div(u128::from(read))
                    .unwrap_or(0);
                // The input that fits in the cache beside the spill (a fifth
                // to spare: the process's own memory, the system's, and a
                // projection made early), only ever lowered.
                let fits = (u128::from(cache) * 4 / 5).saturating_sub(spill_at_end);
                let fits = u64::try_from(fits).unwrap_or(u64::MAX);
                if fits < stored && fits < kept_input {
                    kept_input = fits;
                    crate::input::keep_read_pages(read_before + fits);
                }
            }
            Ok(())
        },
    )?;
    if !quiet {
        eprintln!(
            "neardup: fingerprinted {}",
            summary(&stats, started.elapsed())
        );
    }
    Ok(Gathered {
        ids: ids.into(),
        values,
        width: hasher.width(),
        config: Some(hasher.config().clone()),
        raw,
        file: None,
        bytes: stats.bytes,
        spill: spill
            .map(SpillWriter::finish)
            .transpose()
            .context("cannot write the verification features' spill file")?,
        short,
        blank,
        vectors,
        preference: keep.keep_by.preference(&keys),
        shares,
    })
}

/// How many documents a run's per-document lists are reserved for, once
/// the first `documents` of an input of `stored` bytes (as stored) held
/// `text` bytes of text: the input's size over their mean text, a tenth to
/// spare (too many for records that hold more than their text, too few for
/// compressed input, where the lists then grow as they must), instead of
/// growing by doubling from the start. Each doubling copies a list into
/// memory the system must first clear (about 300 bytes a document while
/// verifying; at 10 GB the peak was 1.22-1.26 GB reserved, 1.47-1.48 GB
/// doubling), and room reserved but never used is never touched, so costs
/// no resident memory. At most 256 bytes a document in a quarter of the
/// `memory` the system can give, so that a wrong guess never asks for
/// more than it would allow.
fn documents_to_reserve(stored: u64, text: u64, documents: usize, memory: u64) -> usize {
    if text == 0 || documents == 0 {
        return documents;
    }
    let per_document = text as f64 / documents as f64;
    let at_most = memory.min(1 << 50) / 4 / 256;
    (stored as f64 / per_document * 1.1).min(at_most as f64) as usize
}

/// Feature-set buffers handed back by the sink once a set is written, for
/// the workers to fill again: a document's set costs no allocation unless it
/// outgrows the buffer it is given, and no free on the sink's thread of
/// memory another thread allocated.
#[derive(Default)]
struct SetPool(std::sync::Mutex<Pooled>);

#[derive(Default)]
struct Pooled {
    free: Vec<Vec<SetFeature>>,
    /// Features of room in `free`.
    room: usize,
}

impl SetPool {
    /// Room the pool holds at most, in features (32 MB): about the sets of
    /// the batches in flight.
    const ROOM: usize = (32 << 20) / std::mem::size_of::<SetFeature>();

    fn take(&self) -> Vec<SetFeature> {
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let set = pool.free.pop().unwrap_or_default();
        pool.room -= set.capacity();
        set
    }

    fn give(&self, mut set: Vec<SetFeature>) {
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if pool.room + set.capacity() <= Self::ROOM {
            set.clear();
            pool.room += set.capacity();
            pool.free.push(set);
        }
    }
}

/// Memory the system can give without swapping (`MemAvailable`, Linux), in bytes.
fn available_memory() -> Option<u64> {
    Some(proc_kib("/proc/meminfo", "MemAvailable:")? * 1024)
}

/// A figure in kibibytes from a Linux `/proc` file of `Key: value kB` lines.
pub(crate) fn proc_kib(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::{SetPool, documents_to_reserve};

    #[test]
    fn documents_are_reserved_from_the_first_texts_within_the_memory() {
        // 1,000 documents of 5,000 bytes of text read of a 1 GB input:
        // 200,000 documents, a tenth more.
        let gb = 1_000_000_000;
        assert_eq!(documents_to_reserve(gb, 5_000_000, 1_000, 64 * gb), 220_000);
        // Tiny texts would ask for a billion; a quarter of 1 GB holds
        // 976,562 documents of 256 bytes.
        assert_eq!(documents_to_reserve(gb, 1_000, 1_000, gb), 976_562);
        // No text yet (vectors), or nothing read: no guess.
        assert_eq!(documents_to_reserve(gb, 0, 10, gb), 10);
        assert_eq!(documents_to_reserve(gb, 0, 0, gb), 0);
    }

    #[test]
    fn set_pool_hands_back_empty_buffers_and_keeps_at_most_its_room() {
        let pool = SetPool::default();
        assert_eq!(
            pool.take().capacity(),
            0,
            "an empty pool makes a new buffer"
        );
        let mut set = Vec::with_capacity(1000);
        set.extend(0..1000u32);
        pool.give(set);
        let again = pool.take();
        assert!(again.is_empty(), "a buffer comes back cleared");
        assert!(again.capacity() >= 1000, "with its room");
        assert_eq!(pool.take().capacity(), 0, "a buffer is handed out once");
        // Buffers past the pool's room are let go.
        let (half, n) = (SetPool::ROOM / 2, 3);
        for _ in 0..n {
            pool.give(Vec::with_capacity(half));
        }
        let kept = std::iter::from_fn(|| Some(pool.take()))
            .take_while(|s| s.capacity() > 0)
            .count();
        assert_eq!(kept, 2, "two halves fill the room; the third is dropped");
        let room = pool.0.lock().unwrap().room;
        assert_eq!(room, 0, "nothing is counted once everything is taken");
    }
}
