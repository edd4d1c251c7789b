//! Verification features on disk: each document's sorted features
//! ([`SetFeature`], 4 bytes each), written once in input order (a set
//! already written, by its digest, not again) and read back by document with
//! positioned reads into small per-thread buffers, so that verifying a corpus
//! holds 152 bytes per document in memory (an offset, a 128-bit digest, and
//! its feature count and a 124-byte MinHash sketch, which rule out most
//! candidate pairs unread, in two cache lines), not its features.
//!
//! The file is an unnamed temporary file (removed by the system when the
//! process ends, however it ends), read with `pread`: its pages live in the
//! operating system's page cache, not in the process's resident memory, and a
//! spill larger than the free memory costs disk reads, never an out-of-memory
//! kill.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::xxh3_128;

use crate::jaccard::{SetFeature, jaccard_at_least};

/// The content digest of a feature set: equal sets, equal digests; documents of
/// one fingerprint and one digest are verified once (see [`crate::Dedup::verify_by`]).
pub fn set_digest(set: &[SetFeature]) -> u128 {
    xxh3_128(bytemuck::cast_slice(set))
}

/// Bytes of a feature in the spill.
const FEATURE_BYTES: u64 = std::mem::size_of::<SetFeature>() as u64;

/// Bins of a [`Sketch`].
pub const SKETCH_BINS: usize = 496;
/// Bytes of a [`Sketch`]: two bits a bin.
pub const SKETCH_BYTES: usize = SKETCH_BINS / 4;

/// A one-permutation MinHash of a feature set (Li, Owen & Zhang 2012) in
/// [`SKETCH_BYTES`] bytes: the features fall into [`SKETCH_BINS`]
/// bins by value (⌊h · bins / 2³²⌋), each bin keeps the smallest, and two
/// bits of it are kept (b-bit MinHash, Li & König 2010): 1, 2 or 3 (which
/// third of the range its low 24 bits fall in), 0 marking an empty bin.
/// Two sets agree in a bin that both fill with probability about 1/3 + 2/3
/// of their Jaccard similarity, which lets verification rule out most
/// candidate pairs without reading their features. Many small bins estimate the similarity
/// better than few wide ones in the same bytes (at J = 0.8, a standard
/// deviation of about 0.023 rather than 0.036 with 124 bins of a byte), and
/// most pairs a 10 GB corpus's join finds are near misses at J = 0.55-0.75:
/// with these 496 bins its verification reads 9.5 GB of the spill, where
/// the 240 bins that fit one cache line read 22.3 GB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sketch(pub [u8; SKETCH_BYTES]);

/// A filled bin's two bits for its least feature `h`: 1, 2 or 3, which third
/// of the range its low 24 bits fall in.
#[inline(always)]
fn two_bits(h: SetFeature) -> u8 {
    1 + ((u64::from(h & 0xFF_FFFF) * 3) >> 24) as u8
}

/// The bin of a feature, ⌊h · bins / 2³²⌋: ascending features fill the
/// bins in order.
#[inline(always)]
fn bin_of(h: SetFeature) -> usize {
    ((u64::from(h) * SKETCH_BINS as u64) >> 32) as usize
}

impl Sketch {
    /// The sketch of a set of (uniformly distributed) features.
    ///
    /// In a sorted set (the spill's sets are) each bin's minimum is its first
    /// feature: a pass from the end stores each feature's two bits in its
    /// bin (a byte each), the first one last, with neither a branch nor a
    /// comparison (a bin changes every few features, too often to branch
    /// on), and the bytes are packed four to a byte. An unsorted set is
    /// found out by the same pass and looked at again, keeping each bin's
    /// minimum.
    pub fn of(set: &[SetFeature]) -> Sketch {
        // Each bin's two bits, a byte each while they are found.
        let mut values = [0u8; SKETCH_BINS];
        let mut next = SetFeature::MAX;
        let mut sorted = true;
        for &h in set.iter().rev() {
            sorted &= h <= next;
            next = h;
            values[bin_of(h)] = two_bits(h);
        }
        if !sorted {
            let mut mins = [SetFeature::MAX; SKETCH_BINS];
            let mut filled = [false; SKETCH_BINS];
            for &h in set {
                let bin = bin_of(h);
                mins[bin] = mins[bin].min(h);
                filled[bin] = true;
            }
            for ((v, &m), &f) in values.iter_mut().zip(&mins).zip(&filled) {
                *v = u8::from(f) * two_bits(m);
            }
        }
        let mut out = [0u8; SKETCH_BYTES];
        for (o, four) in out.iter_mut().zip(values.chunks_exact(4)) {
            *o = four[0] | four[1] << 2 | four[2] << 4 | four[3] << 6;
        }
        Sketch(out)
    }

    /// Whether two sets can still have Jaccard similarity `threshold` or more:
    /// false only when the bins that agree are so few that a pair at the
    /// threshold would show that many or fewer with probability at most
    /// 10⁻⁵ (the exact binomial tail, for independent bins, which
    /// one-permutation bins nearly are). Never false for sets that reach it
    /// but by that chance.
    ///
    /// Of the bins either set fills (n), a pair at J matches the minimum in
    /// about J·n (one-permutation MinHash is unbiased given n); a bin that
    /// both fill and whose minima differ agrees by chance one time in three;
    /// a bin only one fills never agrees. So at J >= t the agreeing bins
    /// number at least t·n·(2/3) + (bins both fill)/3 on average; bins of
    /// unequal rates with that mean fall as far below it no more often than
    /// bins of one rate do (Hoeffding 1956), so the binomial tail at that
    /// least rate bounds the chance.
    pub fn may_reach(&self, other: &Sketch, threshold: f64) -> bool {
        const LOW: u32 = 0x5555_5555;
        let (mut agree, mut either, mut both) = (0u32, 0u32, 0u32);
        for (a, b) in self.0.chunks_exact(4).zip(other.0.chunks_exact(4)) {
            let a = u32::from_le_bytes(a.try_into().expect("4 bytes"));
            let b = u32::from_le_bytes(b.try_into().expect("4 bytes"));
            // One bit a bin: equal values, and filled bins.
            let x = a ^ b;
            let (fa, fb) = ((a | a >> 1) & LOW, (b | b >> 1) & LOW);
            agree += (!(x | x >> 1) & fa).count_ones();
            either += (fa | fb).count_ones();
            both += (fa & fb).count_ones();
        }
        if either == 0 {
            // Nothing to compare: not ruled out.
            return true;
        }
        CUTS.with(|cell| {
            let mut cuts = cell.borrow_mut();
            if cuts.threshold != threshold.to_bits() {
                *cuts = Cuts::new(threshold);
            }
            agree >= cuts.get(either, both)
        })
    }
}

/// The least agreement rate of a pair at Jaccard similarity `threshold` whose
/// sketches fill `n` bins between them, `both` of them both ([`Sketch::may_reach`]).
fn least_rate(threshold: f64, n: u32, both: u32) -> f64 {
    let n = f64::from(n);
    ((2.0 * threshold * n + f64::from(both)) / (3.0 * n)).min(1.0)
}

/// The chance a sketch screen may miss a pair at the threshold.
const SCREEN_ERROR: f64 = 1e-5;

/// The largest `c` such that fewer than `c` successes of `n` independent
/// trials at rate `q` are no likelier than [`SCREEN_ERROR`] together
/// (`P(X < c) <= SCREEN_ERROR`): counts below it are ruled out. The terms
/// far below the error (together less than 10⁻³⁰ of it), which rise with
/// their count up to the mode, are skipped by a binary search for the
/// first that is not; the rest are summed from there.
fn binomial_cut(n: u32, q: f64) -> u32 {
    if q <= 0.0 {
        // No agreement is expected (a threshold of 0): nothing is ruled out.
        return 0;
    }
    if q >= 1.0 {
        // Every trial succeeds: one failure is enough.
        return n;
    }
    let ln_factorial = ln_factorials();
    let (ln_q, ln_p) = (q.ln(), (1.0 - q).ln());
    let ln_term = |k: u32| {
        ln_factorial[n as usize] - ln_factorial[k as usize] - ln_factorial[(n - k) as usize]
            + f64::from(k) * ln_q
            + f64::from(n - k) * ln_p
    };
    // Below this, n terms add up to less than 10⁻³⁰ of the error.
    let floor = SCREEN_ERROR.ln() - f64::from(n + 1).ln() - 30.0 * 10f64.ln();
    // The terms rise up to the mode, ⌊(n + 1) q⌋.
    let mode = ((f64::from(n + 1) * q) as u32).min(n);
    let (mut lo, mut hi) = (0, mode);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if ln_term(mid) < floor {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let mut tail = 0.0f64;
    for k in lo..n {
        tail += ln_term(k).exp();
        if tail > SCREEN_ERROR {
            return k;
        }
    }
    n
}

/// ln k! for k up to [`SKETCH_BINS`] (the most bins two sketches fill).
fn ln_factorials() -> &'static [f64; SKETCH_BINS + 1] {
    static TABLE: std::sync::OnceLock<[f64; SKETCH_BINS + 1]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [0.0; SKETCH_BINS + 1];
        for k in 1..=SKETCH_BINS {
            t[k] = t[k - 1] + (k as f64).ln();
        }
        t
    })
}

/// One thread's cut table for one threshold: the least agreeing bins of a
/// pair whose sketches fill `n` bins, `both` of them both, made as asked.
struct Cuts {
    threshold: u64,
    /// At `n (n + 1) / 2 + both`; [`Cuts::UNKNOWN`] until asked for.
    cut: Vec<u16>,
}

impl Cuts {
    const UNKNOWN: u16 = u16::MAX;

    fn new(threshold: f64) -> Cuts {
        const _: () = assert!(SKETCH_BINS < Cuts::UNKNOWN as usize);
        let n = SKETCH_BINS + 1;
        Cuts {
            threshold: threshold.to_bits(),
            cut: vec![Cuts::UNKNOWN; n * (n + 1) / 2],
        }
    }

    fn get(&mut self, n: u32, both: u32) -> u32 {
        let at = (n * (n + 1) / 2 + both) as usize;
        if self.cut[at] == Cuts::UNKNOWN {
            let q = least_rate(f64::from_bits(self.threshold), n, both);
            self.cut[at] = binomial_cut(n, q) as u16;
        }
        u32::from(self.cut[at])
    }
}

thread_local! {
    static CUTS: RefCell<Cuts> = RefCell::new(Cuts::new(f64::NAN));
}

/// What stays in memory of a document's set: its digest and sketch.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub digest: u128,
    pub sketch: Sketch,
}

impl Summary {
    pub fn of(set: &[SetFeature]) -> Summary {
        Summary {
            digest: set_digest(set),
            sketch: Sketch::of(set),
        }
    }
}

/// What verification looks at first of a document, in two cache lines: its
/// feature count and sketch (a candidate pair costs them per document
/// until it must be read).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Screen {
    len: u32,
    sketch: Sketch,
}

const _: () = assert!(std::mem::size_of::<Screen>() == 128);

/// Writes documents' feature sets, in document order, to a temporary file;
/// a set equal to one written before (by its 128-bit digest, which also
/// makes verification treat the two as one) is not written again.
#[derive(Debug)]
pub struct SpillWriter {
    out: BufWriter<File>,
    starts: Vec<u64>,
    digests: Vec<u128>,
    screens: Vec<Screen>,
    written: u64,
    /// The first document of each digest written (by its low 64 bits; the
    /// whole digest is checked): 20 to 40 bytes a distinct set with the
    /// table's spare room, until [`SpillWriter::finish`].
    first: HashMap<u64, u32>,
}

impl SpillWriter {
    /// A new spill in `dir` (the system's temporary folder when `None`).
    pub fn new(dir: Option<&Path>) -> io::Result<SpillWriter> {
        let file = match dir {
            Some(d) => tempfile::tempfile_in(d),
            None => tempfile::tempfile(),
        }?;
        Ok(SpillWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            starts: Vec::new(),
            digests: Vec::new(),
            screens: Vec::new(),
            written: 0,
            first: HashMap::new(),
        })
    }

    /// Appends the next document's set (sorted, distinct) with its summary
    /// ([`Summary::of`], computed by the caller, often on another thread).
    pub fn push(&mut self, set: &[SetFeature], summary: Summary) -> io::Result<()> {
        let len = u32::try_from(set.len()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a document of {} features, more than the {} one can have",
                    set.len(),
                    u32::MAX
                ),
            )
        })?;
        let doc = u32::try_from(self.starts.len()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("more than {} documents in one spill", u32::MAX),
            )
        })?;
        let key = summary.digest as u64;
        let same = self.first.get(&key).copied().filter(|&d| {
            let d = d as usize;
            self.digests[d] == summary.digest && self.screens[d].len == len
        });
        match same {
            Some(d) if len > 0 => self.starts.push(self.starts[d as usize]),
            _ => {
                self.out.write_all(bytemuck::cast_slice(set))?;
                self.starts.push(self.written);
                self.written += set.len() as u64;
                self.first.entry(key).or_insert(doc);
            }
        }
        self.digests.push(summary.digest);
        self.screens.push(Screen {
            len,
            sketch: summary.sketch,
        });
        Ok(())
    }

    /// Room for `more` documents' offsets, digests and screens beyond those
    /// written.
    pub fn reserve(&mut self, more: usize) {
        self.starts.reserve(more);
        self.digests.reserve(more);
        self.screens.reserve(more);
    }

    /// Bytes of features written so far.
    pub fn bytes(&self) -> u64 {
        self.written * FEATURE_BYTES
    }

    /// Documents written so far.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Whether no document was written.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Flushes the file and opens it for reading.
    pub fn finish(self) -> io::Result<Spill> {
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Ok(Spill {
            file,
            starts: self.starts,
            written: self.written,
            digests: self.digests,
            screens: self.screens,
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            error: Mutex::new(None),
        })
    }
}

/// Documents' feature sets on disk, read back by document.
#[derive(Debug)]
pub struct Spill {
    file: File,
    /// Where each document's set starts in the file, in features.
    starts: Vec<u64>,
    /// Features in the file.
    written: u64,
    digests: Vec<u128>,
    screens: Vec<Screen>,
    /// Tells this spill's cached reads from another's on the same thread.
    id: u64,
    /// The first read error, kept for [`Spill::check`].
    error: Mutex<Option<io::Error>>,
}

/// One thread's most recently read sets, by spill and place in it. A pair's
/// first document is read once for the run of pairs that start with it
/// (they come grouped so); its second documents are scattered, but the
/// pairs a spanning forest of a cluster of near copies scores meet each
/// copy two or three times, close together: on the 1 GB benchmark corpus,
/// half the reads of sets not cached this way are of one of the last 64
/// read on the thread.
#[derive(Default)]
struct SetCache {
    /// (spill, document) of each entry; [`SetCache::NONE`] for an entry
    /// whose read failed or whose buffer was let go.
    keys: Vec<(u64, u64)>,
    /// When each entry was last looked up (the least recent is replaced).
    used: Vec<u64>,
    sets: Vec<Vec<SetFeature>>,
    clock: u64,
}

impl SetCache {
    /// Sets kept at most.
    const ENTRIES: usize = 64;
    /// Features the buffers hold at most beyond the two a pair needs (4 MB
    /// a thread).
    const ROOM: usize = (4 << 20) / FEATURE_BYTES as usize;
    /// The key of no set (no spill has this id).
    const NONE: (u64, u64) = (u64::MAX, u64::MAX);

    /// The entry that holds `doc`'s set of `spill`, read into the least
    /// recently used entry (but `keep`) when not held.
    fn get(&mut self, spill: &Spill, doc: u32, keep: Option<usize>) -> io::Result<usize> {
        self.clock += 1;
        // By document, not by where its set lies in the spill: a look-up
        // that finds it costs no read of the spill's offsets, scattered over
        // the corpus (documents that share a set mostly share a node too,
        // scored once).
        let key = (spill.id, u64::from(doc));
        if let Some(i) = self.keys.iter().position(|&k| k == key) {
            self.used[i] = self.clock;
            return Ok(i);
        }
        let i = if self.keys.len() < Self::ENTRIES {
            self.keys.push(Self::NONE);
            self.used.push(0);
            self.sets.push(Vec::new());
            self.keys.len() - 1
        } else {
            self.least_used(keep)
        };
        self.keys[i] = Self::NONE;
        spill.read_into(doc, &mut self.sets[i])?;
        self.keys[i] = key;
        self.used[i] = self.clock;
        self.trim(i, keep);
        Ok(i)
    }

    /// The least recently used entry but `keep`.
    fn least_used(&self, keep: Option<usize>) -> usize {
        (0..self.used.len())
            .filter(|&i| Some(i) != keep)
            .min_by_key(|&i| self.used[i])
            .expect("a cache of more than one entry")
    }

    /// Lets go of the least recently used buffers (but entries `now` and
    /// `keep`) while the others hold more than [`SetCache::ROOM`].
    fn trim(&mut self, now: usize, keep: Option<usize>) {
        let spare = |i: usize| i != now && Some(i) != keep;
        let room = |sets: &[Vec<SetFeature>]| {
            (0..sets.len())
                .filter(|&i| spare(i))
                .map(|i| sets[i].capacity())
                .sum::<usize>()
        };
        while room(&self.sets) > Self::ROOM {
            let Some(i) = (0..self.sets.len())
                .filter(|&i| spare(i) && self.sets[i].capacity() > 0)
                .min_by_key(|&i| self.used[i])
            else {
                return;
            };
            self.keys[i] = Self::NONE;
            self.sets[i] = Vec::new();
        }
    }
}

thread_local! {
    static CACHE: RefCell<SetCache> = RefCell::default();
}

impl Spill {
    /// Documents.
    pub fn documents(&self) -> usize {
        self.starts.len()
    }

    /// Features of document `doc`.
    pub fn set_len(&self, doc: u32) -> usize {
        self.screens[doc as usize].len as usize
    }

    fn span(&self, doc: u32) -> (u64, u64) {
        let d = doc as usize;
        let s = self.starts[d];
        (s, s + u64::from(self.screens[d].len))
    }

    /// Document `doc`'s digest, or `None` for a document without features
    /// (empty, or only spaces and punctuation), which is similar to nothing.
    pub fn digest(&self, doc: u32) -> Option<u128> {
        (self.set_len(doc) > 0).then(|| self.digests[doc as usize])
    }

    /// Bytes held in memory per document (offset, digest and sketch).
    pub const BYTES_PER_DOCUMENT: usize = 8 + 16 + std::mem::size_of::<Screen>();

    /// Bytes of the file on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.written * FEATURE_BYTES
    }

    /// Starts loading what [`Spill::jaccard_with`] looks at first of document
    /// `doc` (its feature count and sketch, two cache lines) into the cache.
    #[inline]
    pub fn prefetch(&self, doc: u32) {
        #[cfg(target_arch = "x86_64")]
        if let Some(screen) = self.screens.get(doc as usize) {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            // SAFETY: a prefetch reads nothing the program sees and never
            // faults; the address is a live element besides.
            unsafe {
                let line = std::ptr::from_ref(screen).cast::<i8>();
                _mm_prefetch::<_MM_HINT_T0>(line);
                _mm_prefetch::<_MM_HINT_T0>(line.add(64));
            }
        }
    }

    /// Reads document `doc`'s set into `buf`.
    pub fn read_into(&self, doc: u32, buf: &mut Vec<SetFeature>) -> io::Result<()> {
        let (s, e) = self.span(doc);
        buf.clear();
        buf.resize((e - s) as usize, 0);
        self.file.read_exact_at(
            bytemuck::cast_slice_mut(buf.as_mut_slice()),
            s * FEATURE_BYTES,
        )
    }

    /// The exact Jaccard similarity of documents `a` and `b`'s sets, or an
    /// upper bound on it below `threshold` when their sizes alone rule the pair
    /// out (|A ∩ B| / |A ∪ B| <= min / max). A document without features
    /// scores 0 against every other. A read error counts as 0 and is kept for
    /// [`Spill::check`].
    pub fn jaccard(&self, a: u32, b: u32, threshold: f64) -> f64 {
        self.jaccard_with(a, self, b, threshold)
    }

    /// [`Spill::jaccard`] of this spill's document `a` and `other`'s `b`.
    pub fn jaccard_with(&self, a: u32, other: &Spill, b: u32, threshold: f64) -> f64 {
        let (sa, sb) = (&self.screens[a as usize], &other.screens[b as usize]);
        if let Some(score) = screen(sa.len, &sa.sketch, sb.len, &sb.sketch, threshold) {
            return score;
        }
        CACHE.with(|cell| {
            let cache = &mut *cell.borrow_mut();
            let read = (|| -> io::Result<(usize, usize)> {
                let i = cache.get(self, a, None)?;
                Ok((i, cache.get(other, b, Some(i))?))
            })();
            match read {
                Ok((i, j)) => jaccard_at_least(&cache.sets[i], &cache.sets[j], threshold),
                Err(e) => {
                    // Kept where `check` looks: on the spill that `jaccard` was called on.
                    let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
                    slot.get_or_insert(e);
                    0.0
                }
            }
        })
    }

    /// The first read error since the spill was opened, if any: a verification
    /// that met one is incomplete and must not be reported.
    pub fn check(&self) -> io::Result<()> {
        match self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// What two sets' sizes and sketches say of their Jaccard similarity
/// against `threshold`, before any feature is read: `Some(0.0)` when either
/// set is empty (such a document pairs with none), `Some(bound)` when the
/// sizes alone keep the pair below the threshold (|A ∩ B| / |A ∪ B| <=
/// min / max), `Some` of a value just below the threshold when the sketches
/// rule the pair out beyond reasonable doubt, `None` when only the features
/// can decide. The one screen of `neardup dedup`'s verification and of the
/// Spark job's.
pub fn screen(la: u32, a: &Sketch, lb: u32, b: &Sketch, threshold: f64) -> Option<f64> {
    if la == 0 || lb == 0 {
        return Some(0.0);
    }
    let bound = la.min(lb) as f64 / la.max(lb) as f64;
    if bound < threshold {
        return Some(bound);
    }
    // Any value below the threshold will do for a pair the sketches rule out.
    (!a.may_reach(b, threshold)).then_some(threshold * (1.0 - 1e-9) - 1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jaccard::{jaccard, narrow, shingles};
    use proptest::prelude::*;

    proptest! {
        /// The sketch of a set, sorted or not, is each bin's minimum, found
        /// here by looking at every hash.
        #[test]
        fn sketch_keeps_each_bins_minimum(
            mut set in prop_oneof![
                prop::collection::vec(any::<u32>(), 0..2000),
                prop::collection::vec(any::<u32>().prop_map(|h| h & !(0xF << 26)), 0..300),
                prop::collection::vec(any::<u32>().prop_map(|h| h | (0xF << 28)), 0..300),
                // At and beside the bins' edges.
                prop::collection::vec(
                    (0u64..SKETCH_BINS as u64, -2i64..2).prop_map(|(i, d)| {
                        ((((i << 32).div_ceil(SKETCH_BINS as u64)) as i64 + d)
                            .clamp(0, u32::MAX as i64)) as u32
                    }),
                    0..300
                ),
                prop::collection::vec(0u32..8, 0..50),
                prop::collection::vec(prop_oneof![Just(u32::MAX), any::<u32>()], 0..50),
            ],
            sort: bool,
        ) {
            if sort {
                set.sort_unstable();
            }
            // Bin i holds the features from ⌈i · 2³² / bins⌉ on.
            let starts: Vec<u64> = (0..SKETCH_BINS as u64)
                .map(|i| (i << 32).div_ceil(SKETCH_BINS as u64))
                .collect();
            let mut mins: Vec<Option<u32>> = vec![None; SKETCH_BINS];
            for &h in &set {
                let bin = starts.partition_point(|&s| s <= u64::from(h)) - 1;
                mins[bin] = Some(mins[bin].map_or(h, |m| m.min(h)));
            }
            let sketch = Sketch::of(&set);
            for (bin, &m) in mins.iter().enumerate() {
                let want = match m {
                    None => 0,
                    // Which third of the 24-bit range the low 24 bits are in.
                    Some(m) => match m & 0xFF_FFFF {
                        x if x * 3 < 1 << 24 => 1,
                        x if x * 3 < 2 << 24 => 2,
                        _ => 3,
                    },
                };
                prop_assert_eq!((sketch.0[bin / 4] >> (2 * (bin % 4))) & 3, want, "bin {}", bin);
            }
        }
    }

    /// The cut, checked against the binomial tail summed here from the
    /// distribution's factorials: for every number of bins and least
    /// agreement rate, the counts it rules out have probability at most
    /// 10⁻⁵ together, and one count more would pass that.
    #[test]
    fn ruled_out_counts_are_rare_at_the_threshold() {
        let ln_fact: Vec<f64> = (0..=SKETCH_BINS)
            .scan(0.0, |acc, i| {
                *acc += (i.max(1) as f64).ln();
                Some(*acc)
            })
            .collect();
        let tail = |n: u32, q: f64, below: u32| -> f64 {
            (0..below)
                .map(|k| {
                    let (n, k) = (n as usize, k as usize);
                    let ln = ln_fact[n] - ln_fact[k] - ln_fact[n - k]
                        + k as f64 * q.ln()
                        + (n - k) as f64 * (1.0 - q).ln();
                    ln.exp()
                })
                .sum()
        };
        for n in 1..=SKETCH_BINS as u32 {
            for step in 0..40 {
                let q = 1.0 / 3.0 + f64::from(step) / 60.0;
                let cut = binomial_cut(n, q);
                assert!(cut <= n);
                let ruled_out = tail(n, q, cut);
                assert!(
                    ruled_out <= 1e-5,
                    "n {n} q {q}: cut {cut}, tail {ruled_out:e}"
                );
                if cut < n {
                    let more = tail(n, q, cut + 1);
                    assert!(more > 1e-5, "n {n} q {q}: cut {cut} could be {}", cut + 1);
                }
            }
            // At rate 1, any bin that disagrees rules the pair out; at rate
            // 0 (a threshold of 0), nothing is.
            assert_eq!(binomial_cut(n, 1.0), n);
            assert_eq!(binomial_cut(n, 0.0), 0);
        }
        // The table gives the cut of the pair's least rate.
        let mut cuts = Cuts::new(0.8);
        for (n, both) in [(1, 0), (1, 1), (200, 150), (240, 240), (17, 3)] {
            assert_eq!(cuts.get(n, both), binomial_cut(n, least_rate(0.8, n, both)));
        }
    }

    #[test]
    fn reads_back_what_was_written_and_scores_exactly() {
        let texts = [
            "the quick brown fox jumps over the lazy dog",
            "the quick brown fox jumps over the lazy cat",
            "",
            "a completely different sentence about spilling features to disk",
            "the quick brown fox jumps over the lazy dog",
        ];
        let sets: Vec<Vec<SetFeature>> = texts
            .iter()
            .map(|t| {
                let mut set = Vec::new();
                narrow(&shingles(t), &mut set);
                set
            })
            .collect();
        let mut w = SpillWriter::new(None).unwrap();
        for s in &sets {
            w.push(s, Summary::of(s)).unwrap();
        }
        let spill = w.finish().unwrap();
        assert_eq!(spill.documents(), texts.len());
        let mut buf = Vec::new();
        for (i, s) in sets.iter().enumerate() {
            spill.read_into(i as u32, &mut buf).unwrap();
            assert_eq!(&buf, s);
        }
        assert_eq!(spill.digest(0), spill.digest(4));
        assert_ne!(spill.digest(0), spill.digest(1));
        assert_eq!(spill.digest(2), None, "an empty document has no digest");
        for a in 0..sets.len() {
            for b in 0..sets.len() {
                let exact = if sets[a].is_empty() || sets[b].is_empty() {
                    0.0
                } else {
                    jaccard(&sets[a], &sets[b])
                };
                let got = spill.jaccard(a as u32, b as u32, 0.5);
                if exact >= 0.5 {
                    assert_eq!(got, exact, "pair {a} {b}");
                } else {
                    assert!(got < 0.5, "pair {a} {b}: {got}");
                }
            }
        }
        spill.check().unwrap();
        // The repeated set is on disk once.
        let distinct: std::collections::HashSet<&Vec<SetFeature>> = sets.iter().collect();
        assert_eq!(distinct.len(), sets.len() - 1);
        assert_eq!(
            spill.disk_bytes(),
            4 * distinct.iter().map(|s| s.len()).sum::<usize>() as u64
        );
    }

    proptest! {
        /// Sets drawn from a few, so that most repeat (empty ones too), each
        /// read back as written, and the file holds each distinct set once.
        #[test]
        fn repeated_sets_are_written_once_and_read_back(
            pool in prop::collection::vec(prop::collection::btree_set(any::<u32>(), 0..40), 1..6),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
        ) {
            let sets: Vec<Vec<SetFeature>> = picks
                .iter()
                .map(|i| pool[i.index(pool.len())].iter().copied().collect())
                .collect();
            let mut w = SpillWriter::new(None).unwrap();
            for s in &sets {
                w.push(s, Summary::of(s)).unwrap();
            }
            let spill = w.finish().unwrap();
            let mut buf = Vec::new();
            for (i, s) in sets.iter().enumerate() {
                spill.read_into(i as u32, &mut buf).unwrap();
                prop_assert_eq!(&buf, s);
                prop_assert_eq!(spill.set_len(i as u32), s.len());
            }
            let distinct: std::collections::HashSet<&Vec<SetFeature>> = sets.iter().collect();
            prop_assert_eq!(
                spill.disk_bytes(),
                4 * distinct.iter().map(|s| s.len()).sum::<usize>() as u64
            );
        }
    }

    /// A spill of `sets`.
    fn spill_of(sets: &[Vec<SetFeature>]) -> Spill {
        let mut w = SpillWriter::new(None).unwrap();
        for s in sets {
            w.push(s, Summary::of(s)).unwrap();
        }
        w.finish().unwrap()
    }

    /// What `jaccard_with` must give for sets `a` and `b` at `threshold`:
    /// the exact similarity where it reaches the threshold, else anything
    /// below it.
    fn scores_as_exact(got: f64, a: &[SetFeature], b: &[SetFeature], threshold: f64) -> bool {
        let exact = match a.is_empty() || b.is_empty() {
            true => 0.0,
            false => jaccard(a, b),
        };
        if exact >= threshold {
            got == exact
        } else {
            got < threshold
        }
    }

    proptest! {
        /// Pairs within and across two spills (which number their documents
        /// alike), in any order and more documents than the thread keeps
        /// read, score as the sets do: the sets kept from earlier reads, of
        /// this spill or another, are the ones asked for.
        #[test]
        fn cached_reads_score_the_sets_asked_for(
            seed in any::<u64>(),
            sizes in prop::collection::vec(0usize..300, 2..150),
            pairs in prop::collection::vec(
                (any::<bool>(), any::<prop::sample::Index>(), any::<bool>(), any::<prop::sample::Index>()),
                1..400,
            ),
        ) {
            // Neighbours share most features, so that many pairs are read.
            let family = |salt: u64| -> Vec<Vec<SetFeature>> {
                sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| pair_of_sets(n, n * 9 / 10, seed ^ (i as u64 / 3) ^ salt).0)
                    .collect()
            };
            let (ours, theirs) = (family(0), family(1 << 40));
            let spills = [spill_of(&ours), spill_of(&theirs)];
            let sets = [&ours, &theirs];
            for &(x, a, y, b) in &pairs {
                let (a, b) = (a.index(sizes.len()), b.index(sizes.len()));
                let (x, y) = (usize::from(x), usize::from(y));
                let got = spills[x].jaccard_with(a as u32, &spills[y], b as u32, 0.7);
                prop_assert!(
                    scores_as_exact(got, &sets[x][a], &sets[y][b], 0.7),
                    "spill {} doc {} against spill {} doc {}: {}", x, a, y, b, got
                );
            }
            for s in &spills {
                s.check().unwrap();
            }
        }
    }

    /// Sets larger than the room the thread keeps them in are read, scored
    /// and let go, the two a pair needs kept whatever their size.
    #[test]
    fn cached_reads_keep_no_more_than_their_room() {
        let big = SetCache::ROOM / 3;
        let sets: Vec<Vec<SetFeature>> = (0..4)
            .flat_map(|i| {
                let (a, b) = pair_of_sets(big, big * 9 / 10, i);
                [a, b]
            })
            .collect();
        let spill = spill_of(&sets);
        for (a, b) in [
            (0, 1),
            (2, 3),
            (4, 5),
            (6, 7),
            (1, 0),
            (7, 6),
            (3, 5),
            (0, 7),
        ] {
            let got = spill.jaccard(a as u32, b as u32, 0.5);
            assert!(
                scores_as_exact(got, &sets[a], &sets[b], 0.5),
                "{a} {b}: {got}"
            );
            CACHE.with(|cell| {
                let cache = cell.borrow();
                let held: usize = cache.sets.iter().map(Vec::capacity).sum();
                // The pair's two sets, and at most ROOM besides.
                assert!(
                    held <= SetCache::ROOM + sets[a].len() + sets[b].len() + 64,
                    "{held} features held after {a} {b}"
                );
            });
        }
        spill.check().unwrap();
    }

    /// Random sets of `n` features sharing a `j`-ish fraction.
    fn pair_of_sets(n: usize, shared: usize, seed: u64) -> (Vec<SetFeature>, Vec<SetFeature>) {
        let mut rng = crate::rng::SplitMix64(seed);
        let mut next = || (rng.next() >> 32) as SetFeature;
        let common: Vec<SetFeature> = (0..shared).map(|_| next()).collect();
        let mut a: Vec<SetFeature> = common.clone();
        a.extend((shared..n).map(|_| next()));
        let mut b: Vec<SetFeature> = common;
        b.extend((shared..n).map(|_| next()));
        for s in [&mut a, &mut b] {
            s.sort_unstable();
            s.dedup();
        }
        (a, b)
    }

    #[test]
    fn sketches_never_rule_out_pairs_at_the_threshold_and_rule_out_most_below() {
        let mut ruled_out_below = 0;
        let trials = 400;
        for seed in 0..trials {
            for (n, t) in [(40usize, 0.8), (300, 0.8), (2000, 0.8), (600, 0.5)] {
                // At the threshold exactly (or just above): never ruled out.
                let shared = ((2.0 * t * n as f64) / (1.0 + t)).ceil() as usize;
                let (a, b) = pair_of_sets(n, shared, seed * 7 + n as u64);
                let j = crate::jaccard::jaccard(&a, &b);
                assert!(j >= t, "{j} {t}");
                assert!(
                    Sketch::of(&a).may_reach(&Sketch::of(&b), t),
                    "n {n} t {t} seed {seed}"
                );
            }
            // Far below (J about 0.33): almost always ruled out.
            let (a, b) = pair_of_sets(1000, 500, seed);
            ruled_out_below += u32::from(!Sketch::of(&a).may_reach(&Sketch::of(&b), 0.8));
        }
        assert!(
            ruled_out_below > trials as u32 * 99 / 100,
            "{ruled_out_below}"
        );
        // At a threshold of 0 every pair may reach it, even disjoint sets,
        // and sets filling no bin in common (a least rate of 0).
        let (a, b) = pair_of_sets(500, 0, 2);
        assert!(Sketch::of(&a).may_reach(&Sketch::of(&b), 0.0));
        assert!(Sketch::of(&[5]).may_reach(&Sketch::of(&[1 << 31]), 0.0));
        // Identical sets agree everywhere; empty bins agree with nothing.
        let (a, _) = pair_of_sets(500, 0, 1);
        assert!(Sketch::of(&a).may_reach(&Sketch::of(&a), 1.0));
        assert!(
            Sketch::of(&[]).may_reach(&Sketch::of(&[]), 1.0),
            "nothing to compare: not ruled out"
        );
    }
}
