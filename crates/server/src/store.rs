//! The durable store: one redb database file, the source of truth.
//!
//! Table `docs`: document id -> record (fingerprint, little-endian, 8 or 16
//! bytes; one byte, 1 if the document has a sketch; the metadata as JSON
//! text, possibly empty; an 8-byte checksum). Table `sketches`: id ->
//! verification signature and its checksum or, in the collections store
//! version 9 creates, where the signature is in the signature log beside the
//! database ([`crate::signature_log`]) and that pointer's checksum.
//! Table `meta`: the collection's settings, fixed at creation, the count
//! and combined checksum of the `docs` records, and the signature log's
//! committed state.
//!
//! Every write batch is one redb transaction committed with immediate
//! durability (fsync) before any of its writes is acknowledged, its
//! signatures made durable in the log before it: after a crash the
//! collection holds every acknowledged batch whole and nothing of a batch
//! that was not committed.
//!
//! Damage is refused, never served: each record's checksum covers its id and
//! value, so a changed byte in a record is found when it is read (every
//! `docs` record at open, a sketch when a request reads it); the combined
//! checksum finds records lost or duplicated by damage to the tree; a panic of
//! the storage engine on a damaged page becomes a storage error. A damaged
//! collection does not open: restore its folder from a backup (a copy of
//! the folder taken while the service is stopped).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

use neardup_core::centre::Centre;
use neardup_core::index::OnlineDesign;
use neardup_core::sketch::Signature;
use neardup_core::{FingerprintConfig, TableDesign};

use crate::error::ServiceError;
use crate::signature_log::{Log, LogState, files_bytes, pointer, read_pointer};

const DOCS: TableDefinition<&str, &[u8]> = TableDefinition::new("docs");
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
/// Document id -> verification signature ([`Signature`]: a 512-byte sketch,
/// then the text's features), for documents stored with their text (version
/// 2 on; the features from version 5).
const SKETCHES: TableDefinition<&str, &[u8]> = TableDefinition::new("sketches");
/// Document id -> where each bit of its plain fingerprint leans (a byte per
/// bit, [`neardup_core::centre::BitShares`]), for the documents stored by
/// text while a collection is learning its centre (version 6 on); emptied
/// when the centre is learned from them.
const SHARES: TableDefinition<&str, &[u8]> = TableDefinition::new("shares");
/// Document id -> its vector (little-endian f32s), for the documents of a
/// verified collection of vectors (version 6 on): matches are kept by the
/// exact cosine of the vectors.
const VECTORS: TableDefinition<&str, &[u8]> = TableDefinition::new("vectors");

/// The store format this build writes: 2 keeps a verification sketch per
/// document stored by text; 3 adds the records' checksums; 4 the settings';
/// 5 stores the index design as permuted tables or multi-index blocks
/// (`{"tables": ...}` or `{"blocks": ...}`; before, a bare table design); 6
/// the centring of texts' fingerprints ([`Centring`]) and the vectors of a
/// verified collection of vectors; 7 stores the signatures of the collections
/// it creates in their compact form ([`Signature::write_compact`]: the
/// features alone, Rice-coded, about half the bytes), marked by
/// the `signatures` key of `meta` (stores upgraded from an earlier version keep the form
/// they have); 8 makes the signatures of the collections it creates of the
/// shingles their fingerprints read ([`Signatures::CompactOfWords`]), so that a text
/// is read once for both; 9 keeps the signatures of the collections it
/// creates in the signature log ([`crate::signature_log`]), marked by the
/// `signature_log` key of `meta` (stores upgraded from an earlier version
/// keep theirs in the `sketches` table). Older stores are upgraded
/// when opened (one transaction: all of it or none). Version 1 documents have
/// no sketch: they are matched by distance alone until stored again with their
/// text, which writes the sketch.
pub const STORE_VERSION: u32 = 9;
const SETTINGS_KEY: &str = "settings";
/// Which [`Signatures`] a store's `sketches` records are: `compact-words`
/// ([`Signatures::CompactOfWords`], the collections version 8 creates),
/// `compact` ([`Signatures::Compact`], version 7's); absent, [`Signatures::Full`].
const SIGNATURES_KEY: &str = "signatures";
const COMPACT: &str = "compact";
const COMPACT_OF_WORDS: &str = "compact-words";
/// The signature log's committed state ([`LogState::text`]), in the
/// collections whose signatures are in one.
const LOG_KEY: &str = "signature_log";
/// The checksum tag of a signature in the log.
const LOG_TAG: u8 = 7;

/// The form of a collection's stored text signatures, and the shingles they
/// are made of: fixed when the collection is created, as only signatures
/// made alike compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signatures {
    /// [`Signature::write`]'s form, of shingles hashed by
    /// [`neardup_core::jaccard::ShingleKey::STORED`] (the collections of
    /// store versions 2 to 6).
    Full,
    /// [`Signature::write_compact`]'s form, of shingles hashed by
    /// [`neardup_core::jaccard::ShingleKey::STORED`] (the collections
    /// version 7 created).
    Compact,
    /// [`Signature::write_compact`]'s form, of the shingles the collection's
    /// fingerprints read ([`neardup_core::SimHasher::shingle_key`]): one
    /// reading of a text makes both (the collections created now).
    CompactOfWords,
}

/// The settings' checksum (version 4 on): the settings are checked before
/// they are used, like every other byte read.
const SETTINGS_CHECK_KEY: &str = "settings_check";
const SETTINGS_TAG: u8 = 3;
/// A collection of vectors without a configured dimension: the dimension of
/// its first vector, fixed with it ("dim checksum").
const DIMENSION_KEY: &str = "vector_dim";
const DIMENSION_TAG: u8 = 4;
const SHARES_TAG: u8 = 5;
const VECTORS_TAG: u8 = 6;
/// `count xor` of the `docs` records' checksums (hexadecimal).
const DIGEST_KEY: &str = "docs_digest";
/// Bytes of checksum at the end of every record.
const CHECK: usize = 8;

/// The checksum of one record: its table, id and value.
fn checksum(table: u8, id: &str, value: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&[table]);
    h.update(&(id.len() as u64).to_le_bytes());
    h.update(id.as_bytes());
    h.update(value);
    h.digest()
}
const DOCS_TAG: u8 = 1;
const SKETCHES_TAG: u8 = 2;

/// `value` with its checksum appended.
fn sealed(table: u8, id: &str, value: &[u8], out: &mut Vec<u8>) -> u64 {
    let c = checksum(table, id, value);
    out.clear();
    out.extend_from_slice(value);
    out.extend_from_slice(&c.to_le_bytes());
    c
}

/// The value of a sealed record and its checksum, if they agree.
fn unsealed<'v>(table: u8, id: &str, stored: &'v [u8]) -> Option<(&'v [u8], u64)> {
    let (value, check) = stored.split_at(stored.len().checked_sub(CHECK)?);
    let c = u64::from_le_bytes(check.try_into().ok()?);
    (checksum(table, id, value) == c).then_some((value, c))
}

/// The stored checksum of a sealed record, whatever its state (to take it
/// out of the combined checksum when the record is replaced).
fn stored_check(stored: &[u8]) -> u64 {
    stored.len().checked_sub(CHECK).map_or(0, |at| {
        u64::from_le_bytes(stored[at..].try_into().expect("8 bytes"))
    })
}

/// Count and XOR of the checksums of the `docs` records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Digest {
    count: u64,
    xor: u64,
}

impl Digest {
    fn add(&mut self, c: u64) {
        self.count += 1;
        self.xor ^= c;
    }

    fn remove(&mut self, c: u64) {
        self.count = self.count.wrapping_sub(1);
        self.xor ^= c;
    }

    fn text(&self) -> String {
        format!("{} {:016x}", self.count, self.xor)
    }

    fn parse(text: &str) -> Option<Digest> {
        let (count, xor) = text.split_once(' ')?;
        Some(Digest {
            count: count.parse().ok()?,
            xor: u64::from_str_radix(xor, 16).ok()?,
        })
    }
}

thread_local! {
    /// Set while a storage call runs under [`guarded`]: a panic there is
    /// turned into an error, so its message is kept for the log, not printed.
    static GUARDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static CAUGHT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Installs (once) a panic hook that stays quiet for panics [`guarded`]
/// catches, and leaves every other panic to the hook before it.
fn quiet_guarded_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if GUARDED.with(std::cell::Cell::get) {
                CAUGHT.with(|c| *c.borrow_mut() = Some(info.to_string()));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs a storage call, turning a panic of the engine (on a damaged page)
/// into an error (the panic's own message goes to the log at debug level).
fn guarded<T>(path: &Path, f: impl FnOnce() -> Result<T, ServiceError>) -> Result<T, ServiceError> {
    quiet_guarded_panics();
    let outer = GUARDED.with(|g| g.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(outer));
    result.unwrap_or_else(|_| {
        if let Some(m) = CAUGHT.with(|c| c.borrow_mut().take()) {
            tracing::debug!("{}: the storage engine panicked: {m}", path.display());
        }
        Err(ServiceError::Storage(format!(
            "{}: the storage engine failed reading it: the file is damaged; {RESTORE}",
            path.display()
        )))
    })
}

const RESTORE: &str = "restore the data folder from a backup (a copy of the folder taken while the service was stopped)";

/// File name of the database inside the data folder.
pub const DB_FILE: &str = "neardup.redb";

/// What a collection is, fixed when it is created.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// How texts become fingerprints.
    pub config: FingerprintConfig,
    /// The largest k a request may ask for.
    pub max_k: u32,
    /// The design of the in-memory index: permuted tables for a small k,
    /// multi-index blocks for a large one.
    #[serde(deserialize_with = "design_of_any_version")]
    pub design: OnlineDesign,
    /// Format version of the store.
    pub version: u32,
    /// The verification a request gets when it asks for none: keep a match
    /// when the Jaccard similarity of the texts (the cosine of the vectors,
    /// in a collection of vectors) reaches this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<f64>,
    /// Whether texts' fingerprints are centred on the collection's corpus,
    /// and on what centre (None: plain fingerprints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub centring: Option<Centring>,
    /// About how many documents the design was planned for; a collection
    /// that learns its centre plans its design again then, from its own
    /// centred fingerprints (None: the design stays as created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_for: Option<f64>,
}

/// Texts' fingerprints centred on the collection's corpus
/// ([`neardup_core::centre`]): each bit set where the document leans further
/// than the corpus's mean, not further than one half, so that unrelated
/// documents' bits are independent and a wide k finds few candidates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Centring {
    /// Plain fingerprints until `from` documents have been stored by text;
    /// then the centre is learned from them (their fingerprints are
    /// rewritten, in one transaction).
    Learning { from: u64 },
    /// The centre: [`Centre::to_bytes`] as words (the number of documents it
    /// was learned from, then one sum of shares per bit).
    Learned { sums: Vec<u64> },
}

impl Centring {
    /// The centre, once learned (checked: a centre of the collection's width).
    pub fn centre(&self, width: neardup_core::Width) -> Result<Option<Centre>, ServiceError> {
        match self {
            Centring::Learning { .. } => Ok(None),
            Centring::Learned { sums } => {
                let bytes: Vec<u8> = sums.iter().flat_map(|w| w.to_le_bytes()).collect();
                match Centre::from_bytes(&bytes) {
                    Some(c) if c.width() == width => Ok(Some(c)),
                    _ => Err(ServiceError::Storage(format!(
                        "the collection's centre has {} sums, not one per bit of its \
                         {}-bit fingerprints plus a count",
                        sums.len(),
                        width.bits()
                    ))),
                }
            }
        }
    }

    /// The settings' record of a learned centre.
    pub fn learned(centre: &Centre) -> Centring {
        Centring::Learned {
            sums: centre
                .to_bytes()
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                .collect(),
        }
    }
}

impl Settings {
    /// The design planned again for [`Settings::planned_for`] documents,
    /// with `sample` (fingerprints as stored, little-endian) as the guide to
    /// how crowded they are: text crowds, and a centred sample predicts a
    /// query's candidates better than uniform bits do. The design as it is
    /// when the settings name no size or the sample is too small to guide.
    pub fn replanned<'a>(&self, sample: impl Iterator<Item = &'a [u8]>) -> OnlineDesign {
        use neardup_core::index::{
            Bits, ONLINE_BYTES_PER_DOCUMENT, ONLINE_MIN_SAMPLE, plan_online,
        };
        fn plan<'a, B: Bits>(
            s: &Settings,
            n: f64,
            sample: impl Iterator<Item = &'a [u8]>,
        ) -> OnlineDesign {
            let fps: Vec<B> = sample.map(B::read_le).collect();
            match plan_online::<B>(s.max_k, n, &fps, ONLINE_BYTES_PER_DOCUMENT) {
                Ok(p) if fps.len() >= ONLINE_MIN_SAMPLE => p.design().clone(),
                _ => s.design.clone(),
            }
        }
        match (self.planned_for, self.config.bits) {
            (None, _) => self.design.clone(),
            (Some(n), neardup_core::Width::W64) => plan::<u64>(self, n, sample),
            (Some(n), neardup_core::Width::W128) => plan::<u128>(self, n, sample),
        }
    }

    /// Whether texts' matches are verified by default (a stored sketch per
    /// document), rather than decided by Hamming distance alone.
    pub fn verified(&self) -> bool {
        self.verify.is_some()
    }

    /// What matches are verified by, as the API names it: `"cosine"` (of
    /// the stored vectors) in a collection of vectors, else `"jaccard"` (of
    /// the texts' features).
    pub fn similarity(&self) -> &'static str {
        match self.config.input {
            neardup_core::InputKind::Vector => "cosine",
            _ => "jaccard",
        }
    }

    /// One line for logs: what the collection decides by, and its design.
    pub fn summary(&self) -> String {
        let decide = match (self.verify, self.similarity()) {
            (Some(t), "cosine") => {
                format!("verified (exact cosine >= {t} among candidates within k)")
            }
            (Some(t), _) => format!("verified (Jaccard >= {t} among candidates within k)"),
            (None, _) => "Hamming distance alone (not verified)".into(),
        };
        let centring = match &self.centring {
            None => String::new(),
            Some(Centring::Learning { from }) => format!(
                "; fingerprints centred on the corpus's mean, learned from the first {from} \
                 documents"
            ),
            Some(Centring::Learned { sums }) => format!(
                "; fingerprints centred on the mean of {} documents",
                sums.first().copied().unwrap_or(0)
            ),
        };
        format!(
            "{decide}; max k = {}, {}{centring}",
            self.max_k,
            self.design.describe()
        )
    }
}

/// Settings before store version 5 held a bare table design.
fn design_of_any_version<'de, D: serde::Deserializer<'de>>(d: D) -> Result<OnlineDesign, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Any {
        Online(OnlineDesign),
        Tables(TableDesign),
    }
    Ok(match Any::deserialize(d)? {
        Any::Online(o) => o,
        Any::Tables(t) => OnlineDesign::Tables(t),
    })
}

/// One write of a batch.
#[derive(Debug)]
pub enum Write<'a> {
    Put {
        id: &'a str,
        fingerprint: &'a [u8],
        meta: Option<&'a [u8]>,
        /// The text's sketch; None (a fingerprint given) removes a stale one.
        sketch: Option<&'a Signature>,
        /// The text's shares (the `shares` table), kept while the collection learns
        /// its centre; None removes stale ones.
        shares: Option<&'a [u8]>,
        /// The vector, in a verified collection of vectors; None removes a
        /// stale one.
        vector: Option<&'a [f32]>,
    },
    Delete {
        id: &'a str,
    },
    /// Fixes the dimension of a collection of vectors (with its first one).
    Dimension(usize),
}

/// A stored document.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub fingerprint: Vec<u8>,
    pub meta: Option<Vec<u8>>,
}

pub struct Store {
    /// Closed (None) after a failed commit; the next call reopens it.
    db: RwLock<Db>,
    path: PathBuf,
    fp_bytes: usize,
    /// The form of the stored signatures.
    signatures: Signatures,
    opener: Opener,
    /// Why the last commit failed, until one succeeds.
    failing: Mutex<Option<String>>,
    /// The signature log, in the collections that keep one (the `sketches`
    /// table then holds pointers into it): its writer, locked by a commit
    /// after it begins its transaction.
    log: Option<Mutex<Log>>,
    /// The log's file for readers, which begin their transaction under this
    /// lock: a compaction switches file and pointers under its write lock,
    /// so that a reader's snapshot and file agree.
    log_file: RwLock<Option<Arc<std::fs::File>>>,
    /// Garbage in the log below this many bytes is never compacted (raised
    /// after a compaction fails, so that it is not tried at every commit).
    compact_min: AtomicU64,
    /// Set by a whole scan ([`Store::for_each`]) that found no document
    /// with metadata; with `meta_written` unset, [`Store::metas`] answers
    /// without reading the database.
    scanned_without_meta: AtomicBool,
    /// Set before the first commit that stores a document's metadata.
    meta_written: AtomicBool,
}

/// The database's page cache. Small on purpose: the in-memory index holds
/// what a lookup needs, the store is read for a request's few candidates'
/// sketches and metadata, and the operating system's page cache (which is
/// not the process's memory) keeps the file's hot pages. redb's default (a
/// gigabyte) would make the process grow with the collection. The open
/// scan of every record fills it: each of its megabytes is a byte a
/// document of a million-document collection's resident memory.
const CACHE_BYTES: usize = 16 << 20;

/// Opens the database file: [`Opener::default`] with redb's file backend;
/// tests give one whose disk fills up on demand.
#[derive(Clone)]
pub struct Opener(pub Arc<OpenFn>);

/// What an [`Opener`] calls.
pub type OpenFn = dyn Fn(&Path) -> Result<Database, redb::DatabaseError> + Send + Sync;

impl Default for Opener {
    fn default() -> Self {
        Opener(Arc::new(|path: &Path| {
            Database::builder().set_cache_size(CACHE_BYTES).create(path)
        }))
    }
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Opener")
    }
}

/// The database, closed without a panic escaping when its file is damaged.
struct Db(Option<Database>);

impl std::ops::Deref for Db {
    type Target = Database;
    fn deref(&self) -> &Database {
        self.0
            .as_ref()
            .expect("the database is open while its guard is held")
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Some(db) = self.0.take() {
            let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(db)));
            if closed.is_err() {
                tracing::error!("closing the store failed: its file is damaged");
            }
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

fn storage(e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Storage(e.to_string())
}

impl Store {
    /// Opens the collection in `dir`, or creates it there with `create()`'s
    /// settings when the folder holds none. Returns the store and its settings.
    pub fn open_or_create(
        dir: &Path,
        create: impl FnOnce() -> Result<Settings, ServiceError>,
    ) -> Result<(Store, Settings), ServiceError> {
        Self::open_with(dir, create, Opener::default())
    }

    /// [`Store::open_or_create`] with the database opened by `opener`.
    pub fn open_with(
        dir: &Path,
        create: impl FnOnce() -> Result<Settings, ServiceError>,
        opener: Opener,
    ) -> Result<(Store, Settings), ServiceError> {
        let new_dir = !dir.exists();
        std::fs::create_dir_all(dir).map_err(|e| {
            ServiceError::Storage(format!(
                "cannot create the data folder {}: {e}",
                dir.display()
            ))
        })?;
        let path = dir.join(DB_FILE);
        let opened = guarded(&path.clone(), || Self::open_at(path, create, opener));
        if opened.is_err() && new_dir {
            // A refused creation leaves no folder behind (one still empty).
            let _ = std::fs::remove_dir(dir);
        }
        opened
    }

    fn open_at(
        path: PathBuf,
        create: impl FnOnce() -> Result<Settings, ServiceError>,
        opener: Opener,
    ) -> Result<(Store, Settings), ServiceError> {
        let dir = &path.parent().map(Path::to_path_buf).unwrap_or_default();
        let exists = path.exists();
        // The settings of a new collection first: refused, they leave no file.
        let new_settings = match exists {
            true => None,
            false => Some(create()?),
        };
        let db = Db(Some((opener.0)(&path).map_err(|e| {
            let text = e.to_string();
            let hint = if text.contains("lock") || text.contains("already open") {
                "is another neardup serve using this folder?"
            } else {
                "it is not a readable neardup collection: give an empty folder to create one"
            };
            ServiceError::Storage(format!("cannot open {}: {text} ({hint})", path.display()))
        })?));
        let settings = if exists {
            let tx = db.begin_read().map_err(storage)?;
            let table = tx.open_table(META).map_err(|e| {
                ServiceError::Storage(format!(
                    "{} is not a neardup collection ({e}): give an empty folder to create one",
                    path.display()
                ))
            })?;
            let text = table
                .get(SETTINGS_KEY)
                .map_err(storage)?
                .ok_or_else(|| {
                    ServiceError::Storage(format!("{} has no settings", path.display()))
                })?
                .value()
                .to_owned();
            let check = table
                .get(SETTINGS_CHECK_KEY)
                .map_err(storage)?
                .map(|v| v.value().to_owned());
            let damaged = || {
                ServiceError::Storage(format!(
                    "{}: the collection's settings are damaged (their checksum disagrees); \
                     {RESTORE}",
                    path.display()
                ))
            };
            if let Some(check) = &check
                && u64::from_str_radix(check, 16).ok() != Some(settings_check(&text))
            {
                return Err(damaged());
            }
            let s: Settings = serde_json::from_str(&text).map_err(|e| {
                ServiceError::Storage(format!("{}: unreadable settings: {e}", path.display()))
            })?;
            if check.is_none() && s.version >= 4 {
                return Err(damaged());
            }
            s.config
                .validate()
                .map_err(|e| ServiceError::Storage(e.to_string()))?;
            if s.version > STORE_VERSION {
                return Err(ServiceError::Storage(format!(
                    "{} is a version {} collection, newer than this neardup reads ({}): \
                     upgrade neardup",
                    path.display(),
                    s.version,
                    STORE_VERSION
                )));
            }
            drop(table);
            drop(tx);
            if s.version < STORE_VERSION {
                upgrade(&db, &path, s)?
            } else {
                s
            }
        } else {
            let mut s = new_settings.expect("made above for a new collection");
            s.version = STORE_VERSION;
            let created = (|| {
                let tx = db.begin_write().map_err(storage)?;
                {
                    let mut table = tx.open_table(META).map_err(storage)?;
                    write_settings(&mut table, &s)?;
                    table
                        .insert(DIGEST_KEY, Digest::default().text().as_str())
                        .map_err(storage)?;
                    table
                        .insert(SIGNATURES_KEY, COMPACT_OF_WORDS)
                        .map_err(storage)?;
                    table
                        .insert(LOG_KEY, LogState::default().text().as_str())
                        .map_err(storage)?;
                    tx.open_table(DOCS).map_err(storage)?;
                    tx.open_table(SKETCHES).map_err(storage)?;
                }
                Log::create(dir, 0)?;
                tx.commit().map_err(storage)
            })();
            if let Err(e) = created {
                // Half made, it would not open: no file rather than that one.
                drop(db);
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_file(crate::signature_log::log_path(dir, 0));
                return Err(e);
            }
            s
        };
        let fp_bytes = settings.config.bits.bits() as usize / 8;
        let (signatures, log) = (|| {
            let tx = db.begin_read().map_err(storage)?;
            let meta = tx.open_table(META).map_err(storage)?;
            let form = match meta.get(SIGNATURES_KEY).map_err(storage)? {
                None => Signatures::Full,
                Some(v) if v.value() == COMPACT => Signatures::Compact,
                Some(v) if v.value() == COMPACT_OF_WORDS => Signatures::CompactOfWords,
                Some(_) => {
                    return Err(ServiceError::Storage(format!(
                        "{}: the form of the collection's signatures is unreadable; {RESTORE}",
                        path.display()
                    )));
                }
            };
            let log = match meta.get(LOG_KEY).map_err(storage)? {
                None => None,
                Some(v) => {
                    let state = LogState::parse(v.value()).ok_or_else(|| {
                        ServiceError::Storage(format!(
                            "{}: the signature log's committed state is damaged; {RESTORE}",
                            path.display()
                        ))
                    })?;
                    Some(Log::open(dir, state, RESTORE)?)
                }
            };
            Ok((form, log))
        })()?;
        let store = Store {
            db: RwLock::new(db),
            path,
            fp_bytes,
            signatures,
            opener,
            failing: Mutex::new(None),
            log_file: RwLock::new(log.as_ref().map(Log::file)),
            log: log.map(Mutex::new),
            compact_min: Log::COMPACT_MIN.into(),
            scanned_without_meta: AtomicBool::new(false),
            meta_written: AtomicBool::new(false),
        };
        Ok((store, settings))
    }

    /// The open database, reopened first if a failed commit closed it.
    fn handle(&self) -> Result<RwLockReadGuard<'_, Db>, ServiceError> {
        {
            let db = self.db.read().expect("store lock");
            if db.0.is_some() {
                return Ok(db);
            }
        }
        {
            let mut db = self.db.write().expect("store lock");
            if db.0.is_none() {
                let opened = (self.opener.0)(&self.path).map_err(|e| {
                    ServiceError::Storage(format!("cannot reopen {}: {e}", self.path.display()))
                })?;
                db.0 = Some(opened);
                tracing::info!("{}: reopened", self.path.display());
            }
        }
        let db = self.db.read().expect("store lock");
        match db.0 {
            Some(_) => Ok(db),
            None => Err(ServiceError::Storage(format!(
                "{} is closed",
                self.path.display()
            ))),
        }
    }

    /// Closes the database after a failed commit: redb refuses every later
    /// operation after an I/O error until it is opened again (the next call
    /// does), which recovers once the disk has room again.
    fn close_after_failure(&self) {
        let mut db = self.db.write().expect("store lock");
        drop(Db(db.0.take()));
    }

    /// Why writes are failing: the last commit's error, until one succeeds.
    pub fn write_failure(&self) -> Option<String> {
        self.failing.lock().expect("store lock").clone()
    }

    pub(crate) fn damaged(&self, what: String) -> ServiceError {
        ServiceError::Storage(format!("{}: {what}; {RESTORE}", self.path.display()))
    }

    /// Commits `writes` as one durable transaction.
    pub fn commit(&self, writes: &[Write<'_>]) -> Result<(), ServiceError> {
        // Before any reader can see the metadata.
        if writes
            .iter()
            .any(|w| matches!(w, Write::Put { meta: Some(m), .. } if !m.is_empty()))
        {
            self.meta_written.store(true, Ordering::SeqCst);
        }
        let done = guarded(&self.path, || self.commit_inner(writes));
        let mut failing = self.failing.lock().expect("store lock");
        match &done {
            Ok(()) => *failing = None,
            Err(e) => {
                *failing = Some(e.to_string());
                drop(failing);
                self.close_after_failure();
                return done;
            }
        }
        drop(failing);
        self.compact_log_when_due();
        done
    }

    /// Rewrites the signature log without its garbage once at least half of
    /// it is garbage (and no less than the minimum): writes wait meanwhile,
    /// reads go on in the old file until the switch. A compaction
    /// that fails leaves the log as it was, and is tried again once the
    /// garbage has doubled.
    fn compact_log_when_due(&self) {
        let Some(log) = &self.log else { return };
        let min = self.compact_min.load(Ordering::Relaxed);
        let state = {
            let log = log.lock().expect("log lock");
            if !log.wants_compaction(min) {
                return;
            }
            log.state()
        };
        let started = std::time::Instant::now();
        match guarded(&self.path, || self.compact_log()) {
            Ok(after) => tracing::info!(
                "{}: signature log compacted from {} to {} bytes in {:.1} s",
                self.path.display(),
                state.len,
                after.len,
                started.elapsed().as_secs_f64()
            ),
            Err(e) => {
                self.compact_min
                    .store(state.garbage.saturating_mul(2).max(min), Ordering::Relaxed);
                tracing::error!(
                    "{}: compacting the signature log failed, it is kept as it was: {e}",
                    self.path.display()
                );
            }
        }
    }

    /// [`Store::compact_log_when_due`]'s rewrite: the live signatures copied
    /// (each checked) into the next generation's file, made durable, then
    /// the pointers and the committed state switched in one transaction.
    fn compact_log(&self) -> Result<LogState, ServiceError> {
        const CHUNK: usize = 10_000;
        let db = self.handle()?;
        // The write transaction first, as a commit takes it: the only writer.
        let tx = db.begin_write().map_err(storage)?;
        let mut log = self.log.as_ref().expect("a log").lock().expect("log lock");
        let before = log.state();
        let old = log.file();
        let mut next = log.next()?;
        let copied = (|| {
            let mut sketches = tx.open_table(SKETCHES).map_err(storage)?;
            let (mut buf, mut out) = (Vec::new(), Vec::new());
            let mut after: Option<String> = None;
            loop {
                let chunk = records_after(&sketches, after.as_deref(), CHUNK)?;
                let Some((last, _)) = chunk.last() else {
                    return Ok(());
                };
                after = Some(last.clone());
                for (id, v) in &chunk {
                    let damaged = || self.damaged(format!("document {id:?} has a damaged sketch"));
                    let (p, _) = unsealed(SKETCHES_TAG, id, v).ok_or_else(damaged)?;
                    let (at, len) = read_pointer(p).ok_or_else(damaged)?;
                    if at.saturating_add(u64::from(len)) > before.len {
                        return Err(damaged());
                    }
                    buf.resize(len as usize, 0);
                    old.read_exact_at(&mut buf, at).map_err(|e| {
                        self.damaged(format!("the signature log cannot be read ({e})"))
                    })?;
                    unsealed(LOG_TAG, id, &buf).ok_or_else(damaged)?;
                    let now = next.push(&buf)?;
                    sealed(SKETCHES_TAG, id, &pointer(now, len), &mut out);
                    sketches
                        .insert(id.as_str(), out.as_slice())
                        .map_err(storage)?;
                }
            }
        })();
        if let Err(e) = copied {
            next.abandon();
            return Err(e);
        }
        let (new_log, state) = match next.finish() {
            Ok(done) => done,
            Err(e) => {
                let _ = std::fs::remove_file(crate::signature_log::log_path(
                    self.path.parent().unwrap_or(Path::new(".")),
                    before.generation + 1,
                ));
                return Err(e);
            }
        };
        // Readers begin no transaction from here until they have the file
        // that goes with it.
        let mut files = self.log_file.write().expect("log lock");
        let committed = (|| {
            let mut meta = tx.open_table(META).map_err(storage)?;
            meta.insert(LOG_KEY, state.text().as_str())
                .map_err(storage)?;
            drop(meta);
            tx.commit().map_err(storage)
        })();
        if let Err(e) = committed {
            let path = new_log.path();
            drop(new_log);
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        *files = Some(new_log.file());
        log.replace(new_log);
        Ok(state)
    }

    fn commit_inner(&self, writes: &[Write<'_>]) -> Result<(), ServiceError> {
        let db = self.handle()?;
        let tx = db.begin_write().map_err(storage)?;
        let mut log = self.log.as_ref().map(|l| l.lock().expect("log lock"));
        // The batch's signatures for the log, and its state once committed.
        let mut appended = Vec::new();
        let mut state = log.as_ref().map(|l| l.state());
        // Bytes of the log a replaced pointer leaves behind (none counted
        // for a damaged one).
        let dropped = |id: &str, old: Option<redb::AccessGuard<'_, &[u8]>>| {
            old.and_then(|v| {
                let (p, _) = unsealed(SKETCHES_TAG, id, v.value())?;
                read_pointer(p).map(|(_, len)| u64::from(len))
            })
            .unwrap_or(0)
        };
        {
            let mut meta = tx.open_table(META).map_err(storage)?;
            let mut digest = match meta.get(DIGEST_KEY).map_err(storage)? {
                Some(v) => Digest::parse(v.value())
                    .ok_or_else(|| self.damaged("the records' checksum is unreadable".into()))?,
                None => return Err(self.damaged("the records' checksum is missing".into())),
            };
            let mut table = tx.open_table(DOCS).map_err(storage)?;
            let mut sketches = tx.open_table(SKETCHES).map_err(storage)?;
            let mut shares_table = tx.open_table(SHARES).map_err(storage)?;
            let mut vectors = tx.open_table(VECTORS).map_err(storage)?;
            let (mut value, mut out, mut signature) = (Vec::new(), Vec::new(), Vec::new());
            for w in writes {
                match w {
                    Write::Put {
                        id,
                        fingerprint,
                        meta,
                        sketch,
                        shares,
                        vector,
                    } => {
                        value.clear();
                        value.extend_from_slice(fingerprint);
                        // Whether the document has what it is verified by.
                        value.push(u8::from(sketch.is_some() || vector.is_some()));
                        value.extend_from_slice(meta.unwrap_or_default());
                        let c = sealed(DOCS_TAG, id, &value, &mut out);
                        if let Some(old) = table.insert(*id, out.as_slice()).map_err(storage)? {
                            digest.remove(stored_check(old.value()));
                        }
                        digest.add(c);
                        if let Some(s) = sketch {
                            signature.clear();
                            if self.signatures != Signatures::Full {
                                s.write_compact(&mut signature);
                            } else {
                                s.write(&mut signature);
                            }
                        }
                        let old = match (sketch, &mut state) {
                            (Some(_), Some(state)) => {
                                sealed(LOG_TAG, id, &signature, &mut out);
                                let at = state.len + appended.len() as u64;
                                appended.extend_from_slice(&out);
                                let p = pointer(at, out.len() as u32);
                                sealed(SKETCHES_TAG, id, &p, &mut out);
                                sketches.insert(*id, out.as_slice())
                            }
                            (Some(_), None) => {
                                sealed(SKETCHES_TAG, id, &signature, &mut out);
                                sketches.insert(*id, out.as_slice())
                            }
                            (None, _) => sketches.remove(*id),
                        }
                        .map_err(storage)?;
                        if let Some(state) = &mut state {
                            state.garbage += dropped(id, old);
                        }
                        match shares {
                            Some(s) => {
                                sealed(SHARES_TAG, id, s, &mut out);
                                shares_table.insert(*id, out.as_slice()).map(drop)
                            }
                            None => shares_table.remove(*id).map(drop),
                        }
                        .map_err(storage)?;
                        match vector {
                            Some(v) => {
                                signature.clear();
                                signature.extend(v.iter().flat_map(|x| x.to_le_bytes()));
                                sealed(VECTORS_TAG, id, &signature, &mut out);
                                vectors.insert(*id, out.as_slice()).map(drop)
                            }
                            None => vectors.remove(*id).map(drop),
                        }
                        .map_err(storage)?;
                    }
                    Write::Delete { id } => {
                        if let Some(old) = table.remove(*id).map_err(storage)? {
                            digest.remove(stored_check(old.value()));
                        }
                        let old = sketches.remove(*id).map_err(storage)?;
                        if let Some(state) = &mut state {
                            state.garbage += dropped(id, old);
                        }
                        shares_table.remove(*id).map_err(storage)?;
                        vectors.remove(*id).map_err(storage)?;
                    }
                    Write::Dimension(dim) => {
                        let text = format!("{dim} {:016x}", dimension_check(*dim));
                        meta.insert(DIMENSION_KEY, text.as_str()).map_err(storage)?;
                    }
                }
            }
            meta.insert(DIGEST_KEY, digest.text().as_str())
                .map_err(storage)?;
            if let (Some(state), Some(log)) = (&mut state, &log) {
                // Durable before the transaction that points to them.
                log.append(&appended)?;
                state.len += appended.len() as u64;
                state.garbage = state.garbage.min(state.len);
                meta.insert(LOG_KEY, state.text().as_str())
                    .map_err(storage)?;
            }
        }
        tx.commit().map_err(storage)?;
        if let (Some(state), Some(log)) = (state, &mut log) {
            log.committed(state);
        }
        Ok(())
    }

    /// One document.
    pub fn get(&self, id: &str) -> Result<Option<Record>, ServiceError> {
        guarded(&self.path, || {
            let db = self.handle()?;
            let tx = db.begin_read().map_err(storage)?;
            let table = tx.open_table(DOCS).map_err(storage)?;
            match table.get(id).map_err(storage)? {
                Some(v) => self.record(id, v.value()).map(Some),
                None => Ok(None),
            }
        })
    }

    /// Several documents' metadata, in one read transaction.
    pub fn metas(&self, ids: &[&str]) -> Result<Vec<Option<Vec<u8>>>, ServiceError> {
        if self.scanned_without_meta.load(Ordering::SeqCst)
            && !self.meta_written.load(Ordering::SeqCst)
        {
            // No document has any.
            return Ok(vec![None; ids.len()]);
        }
        guarded(&self.path, || {
            let db = self.handle()?;
            let tx = db.begin_read().map_err(storage)?;
            let table = tx.open_table(DOCS).map_err(storage)?;
            ids.iter()
                .map(|id| match table.get(*id).map_err(storage)? {
                    Some(v) => Ok(self.record(id, v.value())?.meta),
                    None => Ok(None),
                })
                .collect()
        })
    }

    /// Several documents' stored verification signatures, in one read
    /// transaction, checked whole: None for a document stored without its
    /// text (or before sketches were kept). A signature whose checksum
    /// disagrees, or that is not one, is damage, refused.
    pub fn sketches(&self, ids: &[&str]) -> Result<Vec<Option<Vec<u8>>>, ServiceError> {
        self.signatures_with(ids, |id, stored| match stored {
            None => Ok(None),
            Some(bytes) => {
                let valid = if self.signatures != Signatures::Full {
                    Signature::compact_is_valid(bytes)
                } else {
                    Signature::from_bytes(bytes).is_some()
                };
                valid
                    .then(|| Some(bytes.to_vec()))
                    .ok_or_else(|| self.damaged(format!("document {id:?} has a damaged sketch")))
            }
        })
    }

    /// The form of this store's text signatures, fixed at its creation.
    pub fn signatures(&self) -> Signatures {
        self.signatures
    }

    /// [`Signature::jaccard_stored`] (or [`Signature::jaccard_compact`], as
    /// this store keeps its signatures) of `probe` and a stored signature.
    pub fn similarity(&self, probe: &Signature, stored: &[u8], threshold: f64) -> Option<f64> {
        if self.signatures != Signatures::Full {
            probe.jaccard_compact(stored, threshold)
        } else {
            probe.jaccard_stored(stored, threshold)
        }
    }

    /// `f(id, stored signature)` for several documents, in one read
    /// transaction, with each signature's stored bytes read in place
    /// ([`Signature::write`]; None for a document stored without its text).
    /// A record whose checksum disagrees is damage, refused before `f` sees
    /// it.
    pub fn signatures_with<R>(
        &self,
        ids: &[&str],
        f: impl FnMut(&str, Option<&[u8]>) -> Result<R, ServiceError>,
    ) -> Result<Vec<R>, ServiceError> {
        self.evidence_with(
            (SKETCHES, SKETCHES_TAG, "sketch"),
            self.log.is_some(),
            ids,
            f,
        )
    }

    /// `f(id, stored vector)` for several documents, in one read
    /// transaction, with each vector's little-endian bytes read in place
    /// (None for a document stored without one: by fingerprint, or in a
    /// collection that does not verify). A record whose checksum disagrees,
    /// or a document that says it has a vector and has none, is damage.
    pub fn vectors_with<R>(
        &self,
        ids: &[&str],
        f: impl FnMut(&str, Option<&[u8]>) -> Result<R, ServiceError>,
    ) -> Result<Vec<R>, ServiceError> {
        self.evidence_with((VECTORS, VECTORS_TAG, "vector"), false, ids, f)
    }

    /// `f(id, record)` of a table of what documents are verified by (their
    /// sketches or their vectors), checked: a record whose checksum
    /// disagrees, or a document whose `docs` record says it has one and has
    /// none, is damage. `in_log`: the table holds pointers into the
    /// signature log, where the records are.
    fn evidence_with<R>(
        &self,
        (def, tag, what): (TableDefinition<&str, &[u8]>, u8, &str),
        in_log: bool,
        ids: &[&str],
        mut f: impl FnMut(&str, Option<&[u8]>) -> Result<R, ServiceError>,
    ) -> Result<Vec<R>, ServiceError> {
        guarded(&self.path, || {
            let db = self.handle()?;
            let files = self.log_file.read().expect("log lock");
            let tx = db.begin_read().map_err(storage)?;
            let log = files.clone().filter(|_| in_log);
            drop(files);
            let mut buf = Vec::new();
            let table = match tx.open_table(def) {
                Ok(t) => Some(t),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(storage(e)),
            };
            let docs = tx.open_table(DOCS).map_err(storage)?;
            ids.iter()
                .map(|id| {
                    let found = match &table {
                        Some(t) => t.get(*id).map_err(storage)?,
                        None => None,
                    };
                    match found {
                        // None: the document must say it has none.
                        None => match docs.get(*id).map_err(storage)? {
                            Some(d) if self.checked(id, d.value())?[self.fp_bytes] == 1 => {
                                Err(self.damaged(format!("document {id:?} has lost its {what}")))
                            }
                            _ => f(id, None),
                        },
                        Some(v) => {
                            let damaged =
                                || self.damaged(format!("document {id:?} has a damaged {what}"));
                            let (bytes, _) = unsealed(tag, id, v.value()).ok_or_else(damaged)?;
                            match &log {
                                None => f(id, Some(bytes)),
                                Some(file) => {
                                    // (A pointer past the end fails to read.)
                                    let (at, len) = read_pointer(bytes).ok_or_else(damaged)?;
                                    buf.resize(len as usize, 0);
                                    file.read_exact_at(&mut buf, at).map_err(|e| {
                                        self.damaged(format!(
                                            "document {id:?}'s {what} cannot be read from the \
                                             signature log ({e})"
                                        ))
                                    })?;
                                    let (bytes, _) =
                                        unsealed(LOG_TAG, id, &buf).ok_or_else(damaged)?;
                                    f(id, Some(bytes))
                                }
                            }
                        }
                    }
                })
                .collect()
        })
    }

    /// A `docs` record, checked.
    fn record(&self, id: &str, stored: &[u8]) -> Result<Record, ServiceError> {
        let value = self.checked(id, stored)?;
        let (fp, rest) = value.split_at(self.fp_bytes);
        let meta = &rest[1..];
        Ok(Record {
            fingerprint: fp.to_vec(),
            meta: (!meta.is_empty()).then(|| meta.to_vec()),
        })
    }

    /// The value of a `docs` record whose checksum and shape are right.
    fn checked<'v>(&self, id: &str, stored: &'v [u8]) -> Result<&'v [u8], ServiceError> {
        unsealed(DOCS_TAG, id, stored)
            .map(|(v, _)| v)
            .filter(|v| v.len() > self.fp_bytes && v[self.fp_bytes] <= 1)
            .ok_or_else(|| self.damaged(format!("document {id:?} has a damaged record")))
    }

    /// Calls `f(id, fingerprint bytes)` for every document, in id order,
    /// checking every record and, at the end, that none was lost or added.
    pub fn for_each(&self, mut f: impl FnMut(&str, &[u8])) -> Result<(), ServiceError> {
        guarded(&self.path, || {
            let db = self.handle()?;
            let tx = db.begin_read().map_err(storage)?;
            let meta = tx.open_table(META).map_err(storage)?;
            let want = meta
                .get(DIGEST_KEY)
                .map_err(storage)?
                .and_then(|v| Digest::parse(v.value()))
                .ok_or_else(|| {
                    self.damaged("the records' checksum is missing or unreadable".into())
                })?;
            let table = tx.open_table(DOCS).map_err(storage)?;
            let mut got = Digest::default();
            let mut previous: Option<String> = None;
            let mut any_meta = false;
            std::thread::scope(|scope| {
                // Every document looked up by its own key, on the other core
                // beside the scan: the scan reads the leaves in order, a
                // lookup goes through the branch pages, and both must agree,
                // or a stored document would be missed by a lookup (404, a
                // second copy stored, a delete undone).
                let lookups = scope.spawn(|| -> Result<(), ServiceError> {
                    let tx = db.begin_read().map_err(storage)?;
                    let table = tx.open_table(DOCS).map_err(storage)?;
                    for entry in table.iter().map_err(storage)? {
                        let (k, v) = entry.map_err(storage)?;
                        let id = k.value();
                        let found = table.get(id).map_err(storage)?;
                        if found.as_ref().map(|g| g.value()) != Some(v.value()) {
                            return Err(self.damaged(format!(
                                "document {id:?} is not found by its own key: the document \
                                 table's index is damaged"
                            )));
                        }
                    }
                    Ok(())
                });
                let scanned = (|| -> Result<(), ServiceError> {
                    for entry in table.iter().map_err(storage)? {
                        let (k, v) = entry.map_err(storage)?;
                        let id = k.value();
                        let value = self.checked(id, v.value())?;
                        // Strictly ascending: each id once.
                        if previous.as_deref().is_some_and(|p| p >= id) {
                            return Err(self.damaged(format!(
                                "the document table's keys are out of order or repeated at {id:?}"
                            )));
                        }
                        got.add(stored_check(v.value()));
                        // The fingerprint, the byte saying whether it has a
                        // sketch, then the metadata.
                        any_meta |= value.len() > self.fp_bytes + 1;
                        f(id, &value[..self.fp_bytes]);
                        match &mut previous {
                            Some(p) => {
                                p.clear();
                                p.push_str(id);
                            }
                            None => previous = Some(id.to_owned()),
                        }
                    }
                    Ok(())
                })();
                let looked_up = lookups.join().unwrap_or_else(|_| {
                    Err(self.damaged("the key check stopped unexpectedly".into()))
                });
                scanned.and(looked_up)
            })?;
            if got != want {
                return Err(self.damaged(format!(
                    "records were lost or changed ({} found where {} were written)",
                    got.count, want.count
                )));
            }
            if !any_meta {
                self.scanned_without_meta.store(true, Ordering::SeqCst);
            }
            Ok(())
        })
    }

    /// The dimension the collection's vectors have, once its first vector is
    /// stored (when its settings fix none), checked.
    pub fn dimension(&self) -> Result<Option<usize>, ServiceError> {
        guarded(&self.path, || {
            let db = self.handle()?;
            let tx = db.begin_read().map_err(storage)?;
            let meta = tx.open_table(META).map_err(storage)?;
            let Some(v) = meta.get(DIMENSION_KEY).map_err(storage)? else {
                return Ok(None);
            };
            v.value()
                .split_once(' ')
                .and_then(|(d, c)| {
                    let d: usize = d.parse().ok()?;
                    (u64::from_str_radix(c, 16).ok()? == dimension_check(d)).then_some(d)
                })
                .map(Some)
                .ok_or_else(|| self.damaged("the collection's vector dimension is damaged".into()))
        })
    }

    /// Documents stored.
    pub fn document_count(&self) -> Result<u64, ServiceError> {
        guarded(&self.path, || {
            let db = self.handle()?;
            let tx = db.begin_read().map_err(storage)?;
            let table = tx.open_table(DOCS).map_err(storage)?;
            table.len().map_err(storage)
        })
    }

    /// Documents stored with their shares (while the centre is learned).
    pub fn shares_count(&self) -> Result<u64, ServiceError> {
        guarded(&self.path, || {
            let db = self.handle()?;
            let tx = db.begin_read().map_err(storage)?;
            match tx.open_table(SHARES) {
                Ok(t) => t.len().map_err(storage),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
                Err(e) => Err(storage(e)),
            }
        })
    }

    /// Learns the collection's centre from the shares of the documents
    /// stored by text, in one durable transaction: the centre goes into the
    /// settings (`settings`, returned updated), every such document's
    /// fingerprint is rewritten centred, and the shares are let go. Returns
    /// the centre and the rewritten documents' ids and fingerprints (little
    /// endian). A record whose checksum disagrees is damage: nothing is
    /// written.
    #[allow(clippy::type_complexity)]
    pub fn learn_centre(
        &self,
        settings: &Settings,
    ) -> Result<(Settings, Centre, Vec<(String, Vec<u8>)>), ServiceError> {
        guarded(&self.path, || {
            let db = self.handle()?;
            let tx = db.begin_write().map_err(storage)?;
            let width = settings.config.bits;
            let mut centre = Centre::new(width);
            let mut rewritten = Vec::new();
            let mut learned = settings.clone();
            {
                let mut shares = tx.open_table(SHARES).map_err(storage)?;
                let mut all: Vec<(String, Vec<u8>)> = Vec::new();
                for entry in shares.iter().map_err(storage)? {
                    let (k, v) = entry.map_err(storage)?;
                    let id = k.value();
                    let bytes = unsealed(SHARES_TAG, id, v.value())
                        .map(|(b, _)| b)
                        .filter(|b| b.len() == width.bits() as usize)
                        .ok_or_else(|| {
                            self.damaged(format!("document {id:?} has damaged shares"))
                        })?;
                    centre.add(bytes);
                    all.push((id.to_owned(), bytes.to_vec()));
                }
                let mut meta = tx.open_table(META).map_err(storage)?;
                let mut digest = match meta.get(DIGEST_KEY).map_err(storage)? {
                    Some(v) => Digest::parse(v.value()).ok_or_else(|| {
                        self.damaged("the records' checksum is unreadable".into())
                    })?,
                    None => return Err(self.damaged("the records' checksum is missing".into())),
                };
                let mut docs = tx.open_table(DOCS).map_err(storage)?;
                let (mut value, mut out) = (Vec::new(), Vec::new());
                for (id, bytes) in &all {
                    let Some(old) = docs.get(id.as_str()).map_err(storage)? else {
                        // Shares outlive no document: a delete removes both.
                        return Err(self.damaged(format!("document {id:?} has lost its record")));
                    };
                    value.clear();
                    value.extend_from_slice(self.checked(id, old.value())?);
                    let old_check = stored_check(old.value());
                    drop(old);
                    let fp = centre.fingerprint(bytes).value().to_le_bytes();
                    value[..self.fp_bytes].copy_from_slice(&fp[..self.fp_bytes]);
                    let c = sealed(DOCS_TAG, id, &value, &mut out);
                    docs.insert(id.as_str(), out.as_slice()).map_err(storage)?;
                    digest.remove(old_check);
                    digest.add(c);
                    rewritten.push((id.clone(), fp[..self.fp_bytes].to_vec()));
                }
                shares.retain(|_, _| false).map_err(storage)?;
                meta.insert(DIGEST_KEY, digest.text().as_str())
                    .map_err(storage)?;
                learned.centring = Some(Centring::learned(&centre));
                learned.design = learned.replanned(rewritten.iter().map(|(_, fp)| fp.as_slice()));
                write_settings(&mut meta, &learned)?;
            }
            tx.commit().map_err(storage)?;
            Ok((learned, centre, rewritten))
        })
    }

    /// Bytes of the collection's files: the database and the signature log.
    pub fn disk_bytes(&self) -> u64 {
        self.path.parent().map_or(0, folder_bytes)
    }
}

/// Up to `n` records of `table` after the key `after` (from the first
/// without one), owned: a table is rewritten in chunks while it is read.
fn records_after(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    after: Option<&str>,
    n: usize,
) -> Result<Vec<(String, Vec<u8>)>, ServiceError> {
    let range = match after {
        Some(a) => table.range::<&str>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
        None => table.range::<&str>(..),
    }
    .map_err(storage)?;
    range
        .take(n)
        .map(|e| {
            e.map(|(k, v)| (k.value().to_owned(), v.value().to_vec()))
                .map_err(storage)
        })
        .collect()
}

/// Bytes of the collection's files in `dir`: the database and the
/// signature log.
pub fn folder_bytes(dir: &Path) -> u64 {
    std::fs::metadata(dir.join(DB_FILE)).map_or(0, |m| m.len()) + files_bytes(dir)
}

/// The dimension's checksum.
fn dimension_check(dim: usize) -> u64 {
    checksum(DIMENSION_TAG, DIMENSION_KEY, &(dim as u64).to_le_bytes())
}

/// The settings' checksum.
fn settings_check(text: &str) -> u64 {
    checksum(SETTINGS_TAG, SETTINGS_KEY, text.as_bytes())
}

/// Writes the settings and their checksum.
fn write_settings(
    meta: &mut redb::Table<'_, &str, &str>,
    settings: &Settings,
) -> Result<(), ServiceError> {
    let text = serde_json::to_string(settings).expect("settings serialise");
    meta.insert(SETTINGS_KEY, text.as_str()).map_err(storage)?;
    let check = format!("{:016x}", settings_check(&text));
    meta.insert(SETTINGS_CHECK_KEY, check.as_str())
        .map_err(storage)?;
    Ok(())
}

/// Rewrites a store of an older version with this version's checksums, in one
/// transaction, and returns its settings at this version.
fn upgrade(db: &Database, path: &Path, mut settings: Settings) -> Result<Settings, ServiceError> {
    const CHUNK: usize = 10_000;
    let from = settings.version;
    let fp_bytes = settings.config.bits.bits() as usize / 8;
    let tx = db.begin_write().map_err(storage)?;
    let mut digest = Digest::default();
    {
        let mut out = Vec::new();
        // Sketches first, then the documents, each told whether it has one.
        let mut value = Vec::new();
        // Version 3 on: the records are sealed already.
        let tables: &[_] = if from < 3 {
            &[(SKETCHES, SKETCHES_TAG), (DOCS, DOCS_TAG)]
        } else {
            &[]
        };
        for &(def, tag) in tables {
            let sketches = (tag == DOCS_TAG)
                .then(|| tx.open_table(SKETCHES))
                .transpose()
                .map_err(storage)?;
            let mut table = tx.open_table(def).map_err(storage)?;
            let mut after: Option<String> = None;
            loop {
                let chunk = records_after(&table, after.as_deref(), CHUNK)?;
                let Some((last, _)) = chunk.last() else { break };
                after = Some(last.clone());
                for (id, old) in &chunk {
                    value.clear();
                    match &sketches {
                        Some(sk) if old.len() >= fp_bytes => {
                            let has = sk.get(id.as_str()).map_err(storage)?.is_some();
                            value.extend_from_slice(&old[..fp_bytes]);
                            value.push(u8::from(has));
                            value.extend_from_slice(&old[fp_bytes..]);
                        }
                        Some(_) => {
                            return Err(ServiceError::Storage(format!(
                                "{}: document {id:?} has a truncated record; {RESTORE}",
                                path.display()
                            )));
                        }
                        None => value.extend_from_slice(old),
                    }
                    let c = sealed(tag, id, &value, &mut out);
                    if tag == DOCS_TAG {
                        digest.add(c);
                    }
                    table.insert(id.as_str(), out.as_slice()).map_err(storage)?;
                }
            }
        }
        settings.version = STORE_VERSION;
        let mut meta = tx.open_table(META).map_err(storage)?;
        write_settings(&mut meta, &settings)?;
        if from < 3 {
            meta.insert(DIGEST_KEY, digest.text().as_str())
                .map_err(storage)?;
        }
    }
    tx.commit().map_err(storage)?;
    tracing::info!(
        "{}: upgraded from store version {from} to {STORE_VERSION} ({} documents)",
        path.display(),
        digest.count
    );
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use neardup_core::index::plan;

    fn settings(version: u32) -> Settings {
        let config = FingerprintConfig {
            bits: neardup_core::Width::W128,
            ..FingerprintConfig::default()
        };
        let p = plan(128, 15, 1e6, None).unwrap();
        Settings {
            config,
            max_k: 15,
            design: OnlineDesign::Tables(p.options[p.chosen].design.clone()),
            version,
            verify: Some(0.8),
            centring: None,
            planned_for: None,
        }
    }

    /// The design planned again from a crowded sample is the planner's for
    /// that sample (not the uniform bits' it was created with); without a
    /// planned size, or from fewer than 1,000 fingerprints, it stays.
    #[test]
    fn a_design_is_planned_again_from_its_own_fingerprints() {
        use neardup_core::index::{ONLINE_BYTES_PER_DOCUMENT, plan_online};
        let uniform = plan_online::<u128>(19, 1e6, &[], ONLINE_BYTES_PER_DOCUMENT).unwrap();
        let mut s = settings(STORE_VERSION);
        s.max_k = 19;
        s.design = uniform.design().clone();
        // Clusters of fingerprints around a few centres, as text's are.
        let mut rng = neardup_core::rng::SplitMix64(11);
        let centres: Vec<u128> = (0..20)
            .map(|_| u128::from(rng.next()) << 64 | u128::from(rng.next()))
            .collect();
        let sample: Vec<u128> = (0..3000)
            .map(|i| {
                (0..24).fold(centres[i % centres.len()], |x, _| {
                    x ^ 1 << (rng.next() % 128)
                })
            })
            .collect();
        let bytes: Vec<[u8; 16]> = sample.iter().map(|x| x.to_le_bytes()).collect();
        let slices = || bytes.iter().map(|b| b.as_slice());
        assert_eq!(s.replanned(slices()), s.design, "no planned size");
        s.planned_for = Some(1e6);
        let want = plan_online::<u128>(19, 1e6, &sample, ONLINE_BYTES_PER_DOCUMENT).unwrap();
        assert_eq!(&s.replanned(slices()), want.design());
        assert_ne!(
            want.design(),
            uniform.design(),
            "the sample changes the plan"
        );
        assert_eq!(
            s.replanned(slices().take(999)),
            s.design,
            "too small a sample"
        );
    }

    fn refuse() -> Result<Settings, ServiceError> {
        Err(ServiceError::Config(
            "an existing store is not created anew".into(),
        ))
    }

    type Dump = (
        Vec<(String, Vec<u8>)>,
        Vec<Option<Record>>,
        Vec<Option<Vec<u8>>>,
    );

    /// Everything a service reads: the fingerprints scanned at open, each
    /// record and each sketch.
    fn dump(store: &Store, ids: &[String]) -> Result<Dump, ServiceError> {
        let mut fps = Vec::new();
        store.for_each(|id, fp| fps.push((id.to_owned(), fp.to_vec())))?;
        let records = ids
            .iter()
            .map(|id| store.get(id))
            .collect::<Result<_, _>>()?;
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let sketches = store.sketches(&refs)?;
        Ok((fps, records, sketches))
    }

    fn fingerprint(i: u64) -> [u8; 16] {
        let h = xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes());
        h.to_le_bytes()
    }

    fn sketch(i: usize) -> Signature {
        let mut set: Vec<u64> = (0..i as u64 % 50)
            .map(|x| (x + i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        set.sort_unstable();
        Signature::of(&set)
    }

    /// 300 documents written in batches, 40 replaced and 20 deleted; the ids
    /// to read back (with one never stored).
    fn fill(dir: &Path) -> Vec<String> {
        let (store, _) = Store::open_or_create(dir, || Ok(settings(STORE_VERSION))).unwrap();
        let ids: Vec<String> = (0..300).map(|i| format!("doc-{i:04}")).collect();
        let metas: Vec<String> = (0..300).map(|i| format!(r#"{{"n":{i}}}"#)).collect();
        let fps: Vec<[u8; 16]> = (0..300).map(fingerprint).collect();
        let sketches: Vec<Signature> = (0..300).map(sketch).collect();
        for batch in (0..300).collect::<Vec<usize>>().chunks(50) {
            let writes: Vec<Write> = batch
                .iter()
                .map(|&i| Write::Put {
                    id: &ids[i],
                    fingerprint: &fps[i],
                    meta: (i % 2 == 0).then(|| metas[i].as_bytes()),
                    sketch: (i % 3 != 0).then_some(&sketches[i]),
                    shares: None,
                    vector: None,
                })
                .collect();
            store.commit(&writes).unwrap();
        }
        let again: Vec<[u8; 16]> = (1000..1040).map(fingerprint).collect();
        let mut writes: Vec<Write> = (0..40)
            .map(|i| Write::Put {
                id: &ids[i],
                fingerprint: &again[i],
                meta: None,
                sketch: None,
                shares: None,
                vector: None,
            })
            .collect();
        writes.extend((40..60).map(|i| Write::Delete { id: &ids[i] }));
        store.commit(&writes).unwrap();
        let mut all = ids.clone();
        all.push("never-stored".into());
        all
    }

    /// A folder [`fill`]ed, its ids, and what the store reads of it.
    fn filled() -> (tempfile::TempDir, Vec<String>, Dump) {
        let dir = tempfile::tempdir().unwrap();
        let ids = fill(dir.path());
        let (store, _) = Store::open_or_create(dir.path(), refuse).unwrap();
        let want = dump(&store, &ids).unwrap();
        (dir, ids, want)
    }

    #[test]
    fn every_flipped_byte_is_refused_or_harmless() {
        let (dir, ids, want) = filled();
        assert_eq!(want.0.len(), 280);
        let log = crate::signature_log::log_path(dir.path(), 0);
        let log_bytes = std::fs::read(&log).unwrap();
        assert!(!log_bytes.is_empty());
        for file in [dir.path().join(DB_FILE), log] {
            let bytes = std::fs::read(&file).unwrap();
            let name = file.file_name().unwrap().to_owned();
            // Every byte of the first page (headers), then a stride over the rest.
            let stride = (bytes.len() / 300).max(1);
            let positions: Vec<usize> = (0..bytes.len().min(4096))
                .step_by(13)
                .chain((4096..bytes.len()).step_by(stride))
                .collect();
            let (mut refused, mut harmless) = (0, 0);
            let scratch = tempfile::tempdir().unwrap();
            for (n, &p) in positions.iter().enumerate() {
                let mut damaged = bytes.clone();
                damaged[p] ^= 1 << (n % 8);
                let copy = scratch.path().join(n.to_string());
                std::fs::create_dir(&copy).unwrap();
                for other in std::fs::read_dir(dir.path()).unwrap() {
                    let other = other.unwrap().path();
                    std::fs::copy(&other, copy.join(other.file_name().unwrap())).unwrap();
                }
                std::fs::write(copy.join(&name), &damaged).unwrap();
                let read = Store::open_or_create(&copy, refuse).and_then(|(s, _)| dump(&s, &ids));
                match read {
                    Err(e) => {
                        let text = e.to_string();
                        assert!(!text.is_empty());
                        refused += 1;
                    }
                    Ok(got) => {
                        assert!(
                            got == want,
                            "a flip at byte {p} of {name:?} was served as data: scan {}, records \
                             {}, sketches {}",
                            got.0 == want.0,
                            got.1 == want.1,
                            got.2 == want.2
                        );
                        harmless += 1;
                    }
                }
                std::fs::remove_dir_all(&copy).unwrap();
            }
            eprintln!(
                "{name:?}: {} positions: {refused} refused, {harmless} harmless",
                positions.len()
            );
            if name == DB_FILE {
                // Both outcomes happen: damage to live pages is found, flips
                // in free space change nothing.
                assert!(refused > 20, "{refused} refused, {harmless} harmless");
                assert!(harmless > 0, "{refused} refused, {harmless} harmless");
            } else {
                // Garbage (the replaced signatures) is never read; every
                // live record is checked when it is.
                assert!(refused > 100, "{refused} refused, {harmless} harmless");
            }
        }
    }

    /// The signature log against a map of what was written: random batches
    /// of puts (with and without a signature), replacements and deletes,
    /// reopenings, and compactions whenever a quarter of a kilobyte is
    /// garbage; every signature reads back as written, and a compaction
    /// leaves one file holding the live signatures alone.
    #[test]
    fn the_signature_log_reads_back_what_was_written() {
        use proptest::prelude::*;
        use std::collections::BTreeMap;

        static COMPACTIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let ops = proptest::collection::vec(
            proptest::collection::vec((0usize..40, 0u8..4), 1..12),
            1..25,
        );
        proptest!(ProptestConfig::with_cases(24), |(batches in ops)| {
            let dir = tempfile::tempdir().unwrap();
            let open = || {
                let (s, _) = Store::open_or_create(dir.path(), || Ok(settings(STORE_VERSION))).unwrap();
                s.compact_min.store(256, Ordering::Relaxed);
                s
            };
            let mut store = open();
            let mut want: BTreeMap<String, Option<Vec<u8>>> = BTreeMap::new();
            let ids: Vec<String> = (0..40).map(|i| format!("id-{i}")).collect();
            let signature = |i: usize, v: u8| sketch(i * 7 + v as usize + 3);
            let mut compacted = false;
            for (b, batch) in batches.iter().enumerate() {
                let sigs: Vec<Signature> = batch.iter().map(|&(i, v)| signature(i, v)).collect();
                let fp = fingerprint(b as u64);
                let writes: Vec<Write> = batch
                    .iter()
                    .zip(&sigs)
                    .map(|(&(i, v), sig)| match v {
                        0 => Write::Delete { id: &ids[i] },
                        1 => Write::Put { id: &ids[i], fingerprint: &fp, meta: None, sketch: None, shares: None, vector: None },
                        _ => Write::Put { id: &ids[i], fingerprint: &fp, meta: None, sketch: Some(sig), shares: None, vector: None },
                    })
                    .collect();
                let generation = store.log.as_ref().unwrap().lock().unwrap().state().generation;
                store.commit(&writes).unwrap();
                compacted |= store.log.as_ref().unwrap().lock().unwrap().state().generation != generation;
                for (&(i, v), sig) in batch.iter().zip(&sigs) {
                    match v {
                        0 => { want.remove(&ids[i]); }
                        1 => { want.insert(ids[i].clone(), None); }
                        _ => {
                            let mut bytes = Vec::new();
                            sig.write_compact(&mut bytes);
                            want.insert(ids[i].clone(), Some(bytes));
                        }
                    }
                }
                if b % 5 == 4 {
                    drop(store);
                    store = open();
                }
                let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
                let got = store.sketches(&keys).unwrap();
                for (id, got) in ids.iter().zip(got) {
                    prop_assert_eq!(&got, want.get(id).unwrap_or(&None), "{}", id);
                }
            }
            let state = store.log.as_ref().unwrap().lock().unwrap().state();
            let logs = std::fs::read_dir(dir.path()).unwrap().filter(|e| {
                e.as_ref().unwrap().file_name().to_str().unwrap().starts_with("signatures-")
            }).count();
            prop_assert_eq!(logs, 1);
            prop_assert_eq!(
                std::fs::metadata(crate::signature_log::log_path(dir.path(), state.generation)).unwrap().len(),
                state.len
            );
            if compacted {
                COMPACTIONS.fetch_add(1, Ordering::Relaxed);
                prop_assert!(state.garbage * 2 < state.len.max(1) || state.garbage < 256, "{:?}", state);
            }
        });
        assert!(
            COMPACTIONS.load(Ordering::Relaxed) > 5,
            "the cases compacted the log"
        );
    }

    /// A store whose open scan found no metadata answers `metas` without
    /// reading; metadata written later, or found by the scan at the next
    /// open, is answered all the same.
    #[test]
    fn metadata_is_answered_after_a_scan_that_found_none() {
        let dir = tempfile::tempdir().unwrap();
        let ids = ["a", "b"];
        let fp = fingerprint(1);
        let put = |id, meta| Write::Put {
            id,
            fingerprint: &fp,
            meta,
            sketch: None,
            shares: None,
            vector: None,
        };
        let open = || {
            Store::open_or_create(dir.path(), || Ok(settings(STORE_VERSION)))
                .unwrap()
                .0
        };
        let store = open();
        store.commit(&[put("a", None)]).unwrap();
        store.for_each(|_, _| {}).unwrap();
        assert_eq!(store.metas(&ids).unwrap(), vec![None, None]);
        store
            .commit(&[put("b", Some(br#"{"x":1}"#.as_slice()))])
            .unwrap();
        let want = vec![None, Some(br#"{"x":1}"#.to_vec())];
        assert_eq!(store.metas(&ids).unwrap(), want);
        drop(store);
        let store = open();
        store.for_each(|_, _| {}).unwrap();
        assert_eq!(store.metas(&ids).unwrap(), want);
        // Without the scan, the database is read.
        drop(store);
        assert_eq!(open().metas(&ids).unwrap(), want);
    }

    /// Readers go on while the log is compacted under them: every read of a
    /// signature, from another thread through many compactions, is the one
    /// written (or none yet), never an error.
    #[test]
    fn reads_go_on_through_compactions() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open_or_create(dir.path(), || Ok(settings(STORE_VERSION))).unwrap();
        store.compact_min.store(4096, Ordering::Relaxed);
        let ids: Vec<String> = (0..20).map(|i| format!("r-{i}")).collect();
        let sigs: Vec<Signature> = (0..20).map(|i| sketch(i + 30)).collect();
        let want: Vec<Vec<u8>> = sigs
            .iter()
            .map(|s| {
                let mut b = Vec::new();
                s.write_compact(&mut b);
                b
            })
            .collect();
        let done = AtomicBool::new(false);
        let reads = std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
                let mut reads = 0;
                while !done.load(Ordering::Relaxed) {
                    let got = store.sketches(&keys).unwrap();
                    for (g, w) in got.iter().zip(&want) {
                        assert!(g.as_ref().is_none_or(|g| g == w));
                    }
                    reads += 1;
                }
                reads
            });
            let fp = fingerprint(7);
            for _ in 0..300 {
                let writes: Vec<Write> = ids
                    .iter()
                    .zip(&sigs)
                    .map(|(id, s)| Write::Put {
                        id,
                        fingerprint: &fp,
                        meta: None,
                        sketch: Some(s),
                        shares: None,
                        vector: None,
                    })
                    .collect();
                store.commit(&writes).unwrap();
            }
            done.store(true, Ordering::Relaxed);
            reader.join().unwrap()
        });
        let state = store.log.as_ref().unwrap().lock().unwrap().state();
        assert!(state.generation > 10, "{state:?}");
        assert!(reads > 10, "{reads} reads");
    }

    /// A batch whose signatures reached the log but whose transaction was
    /// not committed (a crash between the two) is cut off at open; a
    /// compaction's file left behind is deleted; a log shorter than
    /// committed is refused, naming the file and the fix.
    #[test]
    fn the_signature_log_recovers_from_a_crash_and_refuses_damage() {
        let (dir, ids, want) = filled();
        let log = crate::signature_log::log_path(dir.path(), 0);
        let committed = std::fs::read(&log).unwrap();
        let mut torn = committed.clone();
        torn.extend_from_slice(&[0xa5; 3000]);
        std::fs::write(&log, &torn).unwrap();
        std::fs::write(crate::signature_log::log_path(dir.path(), 1), b"cut short").unwrap();
        let (store, _) = Store::open_or_create(dir.path(), refuse).unwrap();
        assert!(dump(&store, &ids).unwrap() == want);
        assert_eq!(std::fs::read(&log).unwrap(), committed);
        assert!(!crate::signature_log::log_path(dir.path(), 1).exists());
        drop(store);
        // A log shorter than committed, then none at all: refused.
        let short = |log: &Path| std::fs::write(log, &committed[..committed.len() - 1]).unwrap();
        let gone = |log: &Path| std::fs::remove_file(log).unwrap();
        for damage in [&short as &dyn Fn(&Path), &gone] {
            damage(&log);
            let e = Store::open_or_create(dir.path(), refuse)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("signatures-0.log") && e.contains("restore"),
                "{e}"
            );
        }
    }

    /// Keys damaged where they are used to find records (the separator keys
    /// of the `docs` table's branch pages, which no record checksum covers)
    /// or in the records themselves: the store is refused at open, or reads
    /// exactly as it was. Every copy of a key in the file is damaged in turn,
    /// in an order-keeping way (a digit moved by one), as well as random bits.
    #[test]
    fn damaged_keys_are_refused_or_harmless() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<String> = (0..2000).map(|i| format!("key-{i:05}")).collect();
        {
            let (store, _) =
                Store::open_or_create(dir.path(), || Ok(settings(STORE_VERSION))).unwrap();
            let fps: Vec<[u8; 16]> = (0..2000).map(fingerprint).collect();
            let writes: Vec<Write> = ids
                .iter()
                .zip(&fps)
                .map(|(id, fp)| Write::Put {
                    id,
                    fingerprint: fp,
                    meta: None,
                    sketch: None,
                    shares: None,
                    vector: None,
                })
                .collect();
            store.commit(&writes).unwrap();
        }
        let (store, _) = Store::open_or_create(dir.path(), refuse).unwrap();
        let want = dump(&store, &ids).unwrap();
        drop(store);
        let bytes = std::fs::read(dir.path().join(DB_FILE)).unwrap();
        // The last digit of every copy of a key held more than once (in a
        // leaf and as a separator in a branch page) and of every 50th key;
        // then random bits.
        let mut copies: std::collections::HashMap<&[u8], Vec<usize>> = Default::default();
        for (at, w) in bytes.windows(9).enumerate() {
            if w.starts_with(b"key-") && w[4..].iter().all(u8::is_ascii_digit) {
                copies.entry(w).or_default().push(at + 8);
            }
        }
        let separators = copies.values().filter(|c| c.len() > 1).count();
        let mut flips: Vec<(usize, u8)> = copies
            .iter()
            .filter(|(k, c)| c.len() > 1 || (k[8] == b'0' && k[7] % 5 == 0))
            .flat_map(|(_, c)| c.iter().map(|&at| (at, 1)))
            .collect();
        flips.sort_unstable();
        let keys = flips.len();
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..200 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            flips.push(((x >> 8) as usize % bytes.len(), 1 << (x % 8)));
        }
        let scratch = tempfile::tempdir().unwrap();
        let (mut refused, mut harmless) = (0, 0);
        for (n, &(at, bit)) in flips.iter().enumerate() {
            let mut damaged = bytes.clone();
            damaged[at] ^= bit;
            let d = scratch.path().join(n.to_string());
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join(DB_FILE), &damaged).unwrap();
            match Store::open_or_create(&d, refuse).and_then(|(s, _)| dump(&s, &ids)) {
                Err(_) => refused += 1,
                Ok(got) => {
                    assert!(got == want, "a flip at byte {at} was served as data");
                    harmless += 1;
                }
            }
            std::fs::remove_dir_all(&d).unwrap();
        }
        eprintln!(
            "{keys} key copies ({separators} keys held twice) and 200 random bits: \
             {refused} refused, {harmless} harmless"
        );
        assert!(
            separators > 5,
            "{separators} keys held twice: no branch pages?"
        );
        assert!(refused >= keys / 2, "{refused} refused");
    }

    /// A collection created now keeps its signatures compact, of its
    /// fingerprints' words; one made by version 7 (`compact`) keeps the
    /// compact form of the stored key's shingles, one made before (no
    /// `signatures` key) the older form; all give the exact similarity of
    /// the features.
    #[test]
    fn signatures_keep_the_form_of_their_collection() {
        let dir = tempfile::tempdir().unwrap();
        let mut set: Vec<u64> = (0..700u64)
            .map(|x| x.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        set.sort_unstable();
        let stored = Signature::of(&set);
        let mut probe_set = set[..650].to_vec();
        probe_set.extend((0..50u64).map(|x| (x + 1) << 40));
        probe_set.sort_unstable();
        let probe = Signature::of(&probe_set);
        let exact = probe.jaccard(&stored);
        assert!((exact - 650.0 / 750.0).abs() < 1e-9, "{exact}");
        let put = |store: &Store| {
            let fp = fingerprint(1);
            store
                .commit(&[Write::Put {
                    id: "a",
                    fingerprint: &fp,
                    meta: None,
                    sketch: Some(&stored),
                    shares: None,
                    vector: None,
                }])
                .unwrap();
            let bytes = store.sketches(&["a"]).unwrap().remove(0).unwrap();
            assert_eq!(store.similarity(&probe, &bytes, 0.8), Some(exact));
            bytes
        };
        let (store, _) = Store::open_or_create(dir.path(), || Ok(settings(STORE_VERSION))).unwrap();
        assert_eq!(store.signatures(), Signatures::CompactOfWords);
        let compact = put(&store);
        drop(store);
        let set_form = |form: Option<&str>| {
            let db = Database::create(dir.path().join(DB_FILE)).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut meta = tx.open_table(META).unwrap();
                match form {
                    Some(f) => meta.insert(SIGNATURES_KEY, f).map(drop).unwrap(),
                    None => meta.remove(SIGNATURES_KEY).map(drop).unwrap(),
                }
            }
            tx.commit().unwrap();
        };
        set_form(Some("compact"));
        let (store, _) = Store::open_or_create(dir.path(), refuse).unwrap();
        assert_eq!(store.signatures(), Signatures::Compact);
        assert_eq!(put(&store), compact);
        let mut legacy = Vec::new();
        stored.write(&mut legacy);
        assert_eq!(compact[0], 1);
        // 700 features in 2^24: about 17.3 bits each, against 3 bytes and
        // the 512-byte sketch.
        assert!(compact.len() < 700 * 18 / 8 + 8, "{}", compact.len());
        assert!(legacy.len() > 512 + 700 * 2);
        drop(store);
        set_form(None);
        let (store, _) = Store::open_or_create(dir.path(), refuse).unwrap();
        assert_eq!(store.signatures(), Signatures::Full);
        assert_eq!(put(&store), legacy);
        drop(store);
        set_form(Some("compacted"));
        let e = Store::open_or_create(dir.path(), refuse)
            .unwrap_err()
            .to_string();
        assert!(e.contains("signatures") && e.contains("restore"), "{e}");
    }

    #[test]
    fn a_damaged_record_names_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let ids = fill(dir.path());
        // Rewrite one record's value behind the store's back (its checksum
        // left as it was), as damage would.
        {
            let db = Database::create(dir.path().join(DB_FILE)).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut t = tx.open_table(DOCS).unwrap();
                let mut v = t.get(ids[100].as_str()).unwrap().unwrap().value().to_vec();
                v[3] ^= 0x10;
                t.insert(ids[100].as_str(), v.as_slice()).unwrap();
            }
            tx.commit().unwrap();
        }
        let (store, _) = Store::open_or_create(dir.path(), refuse).unwrap();
        let e = store.for_each(|_, _| {}).unwrap_err().to_string();
        assert!(e.contains("doc-0100") && e.contains("restore"), "{e}");
        let e = store.get(&ids[100]).unwrap_err().to_string();
        assert!(e.contains("damaged record"), "{e}");
        assert!(store.get(&ids[101]).unwrap().is_some());
    }

    #[test]
    fn older_stores_are_upgraded_with_their_data() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<String> = (0..25_000).map(|i| format!("d{i}")).collect();
        {
            // A version 2 store as the previous release wrote it.
            let db = Database::create(dir.path().join(DB_FILE)).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut meta = tx.open_table(META).unwrap();
                let text = serde_json::to_string(&settings(2)).unwrap();
                meta.insert(SETTINGS_KEY, text.as_str()).unwrap();
                let mut docs = tx.open_table(DOCS).unwrap();
                let mut sketches = tx.open_table(SKETCHES).unwrap();
                for (i, id) in ids.iter().enumerate() {
                    let mut v = fingerprint(i as u64).to_vec();
                    if i % 2 == 0 {
                        v.extend_from_slice(b"{\"x\":1}");
                    }
                    docs.insert(id.as_str(), v.as_slice()).unwrap();
                    if i % 5 == 0 {
                        sketches
                            .insert(id.as_str(), sketch(i).sketch.0.as_slice())
                            .unwrap();
                    }
                }
            }
            tx.commit().unwrap();
        }
        let (store, s) = Store::open_or_create(dir.path(), refuse).unwrap();
        assert_eq!(s.version, STORE_VERSION);
        assert_eq!(s.verify, Some(0.8));
        let got = dump(&store, &ids).unwrap();
        assert_eq!(got.0.len(), ids.len());
        for (i, id) in ids.iter().enumerate() {
            let r = got.1[i].as_ref().unwrap();
            assert_eq!(r.fingerprint, fingerprint(i as u64), "{id}");
            assert_eq!(r.meta.is_some(), i % 2 == 0, "{id}");
            // A sketch alone, as version 2 kept it: read back without features.
            assert_eq!(
                got.2[i],
                (i % 5 == 0).then(|| sketch(i).sketch.0.to_vec()),
                "{id}"
            );
        }
        drop(store);
        // Opened again: already at this version, the same data.
        let (store, s) = Store::open_or_create(dir.path(), refuse).unwrap();
        assert_eq!(s.version, STORE_VERSION);
        assert!(dump(&store, &ids).unwrap() == got);
    }
}
