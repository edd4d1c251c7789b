//! The single writer: group commit.
//!
//! Every write (store, delete) goes through one thread. It takes whatever
//! requests are waiting (up to a batch limit), decides each document in order
//! (so `insert_if_new` is atomic: of two near-identical submissions, the second
//! sees the first), commits them all in one durable transaction, applies them
//! to the in-memory collection, and only then answers. One fsync serves every
//! request of the batch.
//!
//! The costly part of a decision, the index search and the verification
//! that reads stored signatures, is done ahead of the writer ([`predecide`],
//! on the service's search threads) against the collection as it stood; the
//! writer holds the writes it applied last (`Recent`) and completes each
//! such search with those applied since, so that its one thread decides as
//! if it had searched itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};

use neardup_core::index::Bits;
use neardup_core::sketch::Signature;
use neardup_core::vector::cosine;
use tokio::sync::oneshot;

use crate::collection::{Collection, Found, centred, keep_nearest};
use crate::error::ServiceError;
use crate::store::{Centring, Settings, Store, Write};

/// Most documents decided and committed in one transaction.
const MAX_BATCH_DOCS: usize = 20_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Always store.
    Insert,
    /// Store only when nothing is within k.
    InsertIfNew,
    /// Store nothing.
    Check,
}

/// A document to decide.
#[derive(Debug)]
pub struct NewDoc<B> {
    pub id: String,
    pub fp: B,
    /// The metadata, as JSON text.
    pub meta: Option<Vec<u8>>,
    /// What the document is verified by: its text's signature or its
    /// vector (None when a fingerprint was given).
    pub evidence: Option<Evidence>,
    /// The dimension of the vector it was given as, if it was.
    pub dim: Option<usize>,
    /// Where each bit of a text's plain fingerprint `fp` leans, in a
    /// collection that centres texts' fingerprints: the writer decides the
    /// fingerprint from them once the centre is learned, and keeps them
    /// until then.
    pub shares: Option<Box<[u8]>>,
    /// The document's matches found ahead of the writer ([`predecide`]).
    pub pre: Option<Pre<B>>,
}

/// A document's search done ahead of the writer, off its thread: every
/// match in the collection as it stood after `applied` changes, verified.
/// The writer completes it with the writes applied since (which it keeps
/// in memory) instead of searching the index and reading
/// stored signatures itself.
#[derive(Debug)]
pub struct Pre<B> {
    /// [`Collection::applied`] when the search ran.
    pub applied: u64,
    /// The fingerprint searched for (centred as the collection was then).
    pub fp: B,
    /// Every match then, each verified when the request verifies (with its
    /// similarity), in no particular order.
    pub found: Vec<Found>,
}

/// Most writes [`Recent`] keeps: a document searched before them is
/// searched again by the writer.
const RECENT_WRITES: usize = 2048;

/// What the writer knows that a document decided ahead of it did not see:
/// the writes of the batches applied last, each batch under the
/// collection's count of changes after it.
#[derive(Debug)]
struct Recent<B> {
    batches: std::collections::VecDeque<(u64, Vec<Pending<B>>)>,
    writes: usize,
    /// Most writes held.
    max: usize,
    /// Every change after this count is held in `batches`.
    floor: u64,
    /// The latest write of each id held: (its batch's count, its place).
    last: HashMap<String, (u64, usize)>,
}

impl<B: Bits> Recent<B> {
    /// Nothing held: every change after `applied` will be.
    fn new(applied: u64) -> Self {
        Self::holding(applied, RECENT_WRITES)
    }

    /// Nothing held, at most `max` writes from now on.
    fn holding(applied: u64, max: usize) -> Self {
        Recent {
            batches: std::collections::VecDeque::new(),
            writes: 0,
            max,
            floor: applied,
            last: HashMap::new(),
        }
    }

    /// Forgets everything when the collection changed otherwise than by
    /// the batches held (a centre learned): `applied` is its count now.
    fn sync(&mut self, applied: u64) {
        if self.floor + self.batches.len() as u64 != applied {
            *self = Recent::holding(applied, self.max);
        }
    }

    /// Holds a batch just applied as the collection's change `applied`,
    /// dropping the oldest batches past its most writes.
    fn push(&mut self, applied: u64, writes: Vec<Pending<B>>) {
        self.sync(applied - 1);
        for (i, (id, _)) in writes.iter().enumerate() {
            self.last.insert(id.clone(), (applied, i));
        }
        self.writes += writes.len();
        self.batches.push_back((applied, writes));
        while self.writes > self.max {
            let (old, writes) = self.batches.pop_front().expect("writes are held");
            self.writes -= writes.len();
            self.floor = old;
            for (id, _) in &writes {
                if self.last.get(id).is_some_and(|&(at, _)| at == old) {
                    self.last.remove(id);
                }
            }
        }
    }

    /// The writes applied after change `applied`, if every one is held.
    fn since(&self, applied: u64) -> Option<impl Iterator<Item = (u64, usize, &Pending<B>)>> {
        (applied >= self.floor).then(|| {
            self.batches
                .iter()
                .filter(move |(at, _)| *at > applied)
                .flat_map(|(at, w)| w.iter().enumerate().map(move |(i, w)| (*at, i, w)))
        })
    }

    /// Whether `id` was written after change `applied`.
    fn written_after(&self, id: &str, applied: u64) -> bool {
        self.last.get(id).is_some_and(|&(at, _)| at > applied)
    }
}

/// What a document is verified by.
#[derive(Clone, Debug)]
pub enum Evidence {
    /// Its text's signature: matches by the Jaccard similarity of texts.
    Text(Box<Signature>),
    /// Its vector: matches by the exact cosine of vectors.
    Vector(Arc<[f32]>),
}

impl Evidence {
    /// The similarity of two documents by their evidence: the Jaccard
    /// similarity of texts, the cosine of vectors; None across kinds.
    pub fn similarity(&self, other: &Evidence) -> Option<f64> {
        match (self, other) {
            (Evidence::Text(a), Evidence::Text(b)) => Some(a.jaccard(b)),
            (Evidence::Vector(a), Evidence::Vector(b)) if a.len() == b.len() => Some(cosine(a, b)),
            _ => None,
        }
    }
}

/// The cosine of `v` and a stored vector's little-endian bytes, or None
/// when they are not a vector of `v`'s dimension.
fn stored_cosine(v: &[f32], bytes: &[u8]) -> Option<f64> {
    if bytes.len() != 4 * v.len() {
        return None;
    }
    let other: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    Some(cosine(v, &other))
}

/// What happened to one document.
#[derive(Debug)]
pub struct Outcome<B> {
    /// The fingerprint the document was decided by (centred, for a text of a
    /// collection with a centre).
    pub fp: B,
    pub stored: bool,
    /// The nearest matches, at most the request's limit.
    pub duplicates: Vec<Found>,
    /// More matches were found than are listed (or a bucket was too large to
    /// examine whole).
    pub truncated: bool,
}

#[derive(Debug)]
pub enum Job<B> {
    Upsert {
        docs: Vec<NewDoc<B>>,
        mode: Mode,
        k: u32,
        /// Keep a match only when its Jaccard similarity reaches this.
        verify: Option<f64>,
        /// Matches kept per document: the nearest.
        limit: usize,
        reply: oneshot::Sender<Result<Vec<Outcome<B>>, ServiceError>>,
    },
    Delete {
        id: String,
        reply: oneshot::Sender<Result<bool, ServiceError>>,
    },
}

impl<B> Job<B> {
    fn size(&self) -> usize {
        match self {
            Job::Upsert { docs, .. } => docs.len().max(1),
            Job::Delete { .. } => 1,
        }
    }
}

pub type JobSender<B> = SyncSender<Job<B>>;

/// What the service and its writer thread share.
#[derive(Debug, Default)]
pub struct Control {
    /// Set when the service closes: the writer refuses every document it has
    /// not yet decided (nothing of them is written), so that closing waits
    /// for one commit at most.
    pub closing: AtomicBool,
    /// Set when the writer thread stopped without being asked to (a panic):
    /// writes can no longer succeed, and health checks say so.
    pub dead: AtomicBool,
    /// The dimension of the collection's vectors once fixed (by the settings
    /// or by the first vector stored); 0 until then.
    pub dim: AtomicUsize,
    /// Called with each document's id before it is decided; tests use it to
    /// make the writer fail.
    #[doc(hidden)]
    pub fault: Option<fn(&str)>,
}

/// Marks the writer dead if its thread unwinds.
struct Watch<'a>(&'a Control);

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.dead.store(true, Ordering::SeqCst);
            tracing::error!(
                "the writer thread failed: writes are refused and /healthz and /readyz \
                 answer 503 until the service is restarted"
            );
        }
    }
}

/// Runs until every sender is dropped, then returns (everything received has
/// been committed and answered, or refused once `control.closing` is set).
pub fn run<B: Bits>(
    store: Arc<Store>,
    collection: Arc<Collection<B>>,
    rx: Receiver<Job<B>>,
    control: Arc<Control>,
    mut settings: Settings,
) {
    let mut jobs: Vec<Job<B>> = Vec::new();
    // Dropped before `jobs` on a panic: the writer is marked dead before
    // the requests it held learn that it failed.
    let _watch = Watch(&control);
    // A service stopped between the commit that completed the centre's
    // sample and the centre's own transaction learns it now.
    learn_when_due(&store, &collection, &mut settings);
    let mut recent = Recent::new(collection.applied());
    while let Ok(first) = rx.recv() {
        let mut size = first.size();
        jobs.push(first);
        while size < MAX_BATCH_DOCS {
            match rx.try_recv() {
                Ok(job) => {
                    size += job.size();
                    jobs.push(job);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        let learning = learning(&settings, &collection);
        process(
            (&store, &collection, &mut recent),
            &mut jobs,
            &control,
            learning,
        );
        if learning {
            learn_when_due(&store, &collection, &mut settings);
        }
    }
}

/// Whether the collection is learning its centre (texts keep their shares).
fn learning<B: Bits>(settings: &Settings, collection: &Collection<B>) -> bool {
    matches!(settings.centring, Some(Centring::Learning { .. })) && collection.centre().is_none()
}

/// Learns the centre once the documents stored by text reach the number the
/// settings ask for: one transaction rewrites their fingerprints and stores
/// the centre, then the collection is rebuilt on it. A failure is logged and
/// tried again after the next write (the collection stays plain meanwhile).
fn learn_when_due<B: Bits>(store: &Store, collection: &Collection<B>, settings: &mut Settings) {
    let Some(Centring::Learning { from }) = settings.centring else {
        return;
    };
    match store.shares_count() {
        Ok(n) if n >= from.max(1) => {}
        Ok(_) => return,
        Err(e) => {
            tracing::error!("cannot count the documents the centre is learned from: {e}");
            return;
        }
    }
    match store.learn_centre(settings) {
        Ok((learned, centre, rewritten)) => {
            let n = rewritten.len();
            collection.recentre(
                centre,
                learned.design.clone(),
                rewritten.into_iter().map(|(id, le)| (id, B::read_le(&le))),
            );
            *settings = learned;
            tracing::info!(
                "the collection's centre is learned from its first {n} documents: texts' \
                 fingerprints are centred from now on"
            );
        }
        Err(e) => tracing::error!("the collection's centre was not learned: {e}"),
    }
}

/// The matches whose similarity to `probe` (texts: the Jaccard similarity
/// of their signatures, exact where both keep their features, else the
/// sketches' estimate; vectors: their exact cosine) reaches `threshold`,
/// each with its similarity, in their order. A match whose own evidence is
/// unknown (stored by fingerprint, or before sketches were kept) is kept by
/// distance alone, without a similarity. `in_batch` gives the similarity to
/// a document decided earlier in the same write batch (Some, None inside
/// when it has no evidence), or says to read it from the store (None).
pub fn verify_found(
    store: &Store,
    found: Vec<Found>,
    probe: &Evidence,
    threshold: f64,
    in_batch: impl Fn(&str) -> Option<Option<f64>>,
) -> Result<Vec<Found>, ServiceError> {
    let from_store: Vec<&str> = found
        .iter()
        .filter(|f| in_batch(&f.id).is_none())
        .map(|f| &*f.id)
        .collect();
    let mut stored = match probe {
        // Each stored signature read in place: the sketches' estimate
        // screens out the clearly dissimilar before any feature is decoded.
        Evidence::Text(sketch) => store.signatures_with(&from_store, |id, bytes| match bytes {
            None => Ok(None),
            Some(b) => store
                .similarity(sketch, b, threshold)
                .map(Some)
                .ok_or_else(|| store.damaged(format!("document {id:?} has a damaged sketch"))),
        })?,
        Evidence::Vector(v) => store.vectors_with(&from_store, |id, bytes| match bytes {
            None => Ok(None),
            Some(b) => stored_cosine(v, b)
                .map(Some)
                .ok_or_else(|| store.damaged(format!("document {id:?} has a damaged vector"))),
        })?,
    }
    .into_iter();
    let mut out = Vec::with_capacity(found.len());
    for mut f in found {
        let similarity = match in_batch(&f.id) {
            Some(s) => s,
            None => stored.next().expect("one record per id read"),
        };
        match similarity {
            Some(j) => {
                if j >= threshold {
                    f.similarity = Some(j);
                    out.push(f);
                }
            }
            None => out.push(f),
        }
    }
    Ok(out)
}

/// A write decided in this batch: the id, its fingerprint and evidence
/// (None for a delete).
type Pending<B> = (String, Option<(B, Option<Evidence>)>);

/// The writes decided so far in one write batch, in order, with the latest
/// of each id found by a hash lookup: later decisions of the batch override
/// the collection, and a document is compared with the batch's live puts
/// once each (linear in the batch, never in what it matched before).
struct Batch<B> {
    writes: Vec<Pending<B>>,
    /// Whether each write is still the latest of its id.
    live: Vec<bool>,
    last: HashMap<String, usize>,
    /// The vector dimension this batch fixes, if it stores the collection's
    /// first vector.
    dim: Option<usize>,
}

impl<B: Bits> Batch<B> {
    fn new() -> Self {
        Batch {
            writes: Vec::new(),
            live: Vec::new(),
            last: HashMap::new(),
            dim: None,
        }
    }

    fn push(&mut self, w: Pending<B>) {
        let at = self.writes.len();
        if let Some(old) = self.last.insert(w.0.clone(), at) {
            self.live[old] = false;
        }
        self.writes.push(w);
        self.live.push(true);
    }

    /// The writes still the latest of their id.
    fn live_writes(&self) -> impl Iterator<Item = &Pending<B>> {
        self.writes
            .iter()
            .zip(&self.live)
            .filter(|(_, l)| **l)
            .map(|(w, _)| w)
    }

    /// The latest write of `id` in this batch: Some(None) for a delete.
    fn latest(&self, id: &str) -> Option<&Option<(B, Option<Evidence>)>> {
        self.last.get(id).map(|&i| &self.writes[i].1)
    }

    /// Drops the writes from `len` on (a request that failed whole).
    fn truncate(&mut self, len: usize) {
        if len == self.writes.len() {
            return;
        }
        self.writes.truncate(len);
        self.live.truncate(len);
        self.last.clear();
        self.live.iter_mut().for_each(|l| *l = false);
        for (i, (id, _)) in self.writes.iter().enumerate() {
            if let Some(old) = self.last.insert(id.clone(), i) {
                self.live[old] = false;
            }
            self.live[i] = true;
        }
    }
}

/// How an upsert asks its documents to be decided.
#[derive(Clone, Copy)]
struct Ask {
    mode: Mode,
    k: u32,
    verify: Option<f64>,
    limit: usize,
}

/// The most matches one document or query answers with (`limit`), so that a
/// request against a large cluster of copies is bounded in work and reply.
pub const MAX_MATCHES: usize = 1000;

/// Candidates a verified document examines beyond its `limit`: verification
/// drops some, and the nearest that pass are reported.
const VERIFY_CANDIDATES: usize = MAX_MATCHES;

/// Candidates a lookup examines for `limit` matches: more when
/// verification will drop some.
pub fn candidates(limit: usize, verified: bool) -> usize {
    if verified {
        limit.max(VERIFY_CANDIDATES)
    } else {
        limit
    }
}

/// Searches ahead of the writer ([`Pre`]) for each of `docs` that has no
/// search yet, with the request's `k` and `verify`, on the calling thread
/// (the service's search threads), so that the writer's one thread is left
/// the writes applied since. A document whose matches in the collection
/// are more than it examines, or whose verification cannot read the store,
/// is left to the writer.
pub fn predecide<B: Bits>(
    store: &Store,
    collection: &Collection<B>,
    docs: &mut [NewDoc<B>],
    k: u32,
    verify: Option<f64>,
) {
    for d in docs.iter_mut().filter(|d| d.pre.is_none()) {
        // Every match is wanted: the writer adds those written since.
        let cap = VERIFY_CANDIDATES;
        let (fp, found, more, applied) =
            collection.nearest_text(d.fp, d.shares.as_deref(), k, cap, |_| false);
        if more {
            continue;
        }
        let found = match (verify, &d.evidence) {
            (Some(t), Some(probe)) => match verify_found(store, found, probe, t, |_| None) {
                Ok(found) => found,
                Err(_) => continue,
            },
            _ => found,
        };
        d.pre = Some(Pre { applied, fp, found });
    }
}

/// Writes near a document: (distance, id, place in `evidence`) each.
struct Within<'a> {
    near: Vec<(u32, &'a str, usize)>,
    evidence: Vec<Option<&'a Evidence>>,
    /// The scan stopped early: there were more.
    cut: bool,
}

/// The `writes` within `k` of `fp`; as in the collection, past four times
/// `cap` matches (at least 256) the scan stops.
fn within<'a, B: Bits>(
    writes: impl Iterator<Item = &'a Pending<B>>,
    fp: B,
    k: u32,
    cap: usize,
) -> Within<'a> {
    let enough = cap.saturating_mul(4).max(256);
    let mut out = Within {
        near: Vec::new(),
        evidence: Vec::new(),
        cut: false,
    };
    for (id, w) in writes {
        if let Some((other, e)) = w {
            let dist = fp.distance(*other);
            if dist <= k {
                if out.near.len() >= enough {
                    out.cut = true;
                    break;
                }
                out.near.push((dist, id.as_str(), out.evidence.len()));
                out.evidence.push(e.as_ref());
            }
        }
    }
    out
}

/// The writer's own search for a document: the collection's `cap` nearest
/// within `k` of `fp` and this batch's live writes, verified when asked
/// (reading stored signatures); `true` when there were more.
fn search<B: Bits>(
    store: &Store,
    collection: &Collection<B>,
    batch: &Batch<B>,
    (fp, k, cap): (B, u32, usize),
    verify: Option<f64>,
    d: &NewDoc<B>,
) -> Result<(Vec<Found>, bool), ServiceError> {
    // Later decisions of this batch override the collection.
    let (dups, mut more) = collection.nearest(fp, k, cap, |id| batch.last.contains_key(id));
    let mut near: Vec<(u32, &str)> = dups.iter().map(|f| (f.distance, &*f.id)).collect();
    let batched = within(batch.live_writes(), fp, k, cap);
    near.extend(batched.near.into_iter().map(|(d, id, _)| (d, id)));
    more |= batched.cut | keep_nearest(&mut near, cap);
    let mut dups: Vec<Found> = near.into_iter().map(|(d, id)| Found::at(d, id)).collect();
    if let (Some(t), Some(probe)) = (verify, &d.evidence) {
        let in_batch = |id: &str| {
            batch.latest(id).map(|w| {
                w.as_ref()
                    .and_then(|(_, e)| e.as_ref())
                    .and_then(|e| probe.similarity(e))
            })
        };
        dups = verify_found(store, dups, probe, t, in_batch)?;
    }
    Ok((dups, more))
}

/// A search done ahead of the writer ([`Pre`]) completed as the writer
/// would have searched: the matches it found that were not written since,
/// verified already, and the writes `since` (held by `recent`) and of this
/// batch as [`search`] takes the batch's; the `cap` nearest, and `true`
/// when there were more.
fn complete<'a, B: Bits>(
    pre: &Pre<B>,
    since: impl Iterator<Item = (u64, usize, &'a Pending<B>)>,
    recent: &Recent<B>,
    batch: &Batch<B>,
    (k, cap, verify): (u32, usize, Option<f64>),
    d: &NewDoc<B>,
) -> (B, Vec<Found>, bool) {
    let fp = pre.fp;
    let fresh = |id: &str| !batch.last.contains_key(id) && !recent.written_after(id, pre.applied);
    // Matches among the writes since, as in `search`; at most `cap`
    // verified.
    let held = since.filter(|&(at, i, (id, _))| {
        // The latest write of its id, not overridden by this batch.
        recent.last.get(id) == Some(&(at, i)) && !batch.last.contains_key(id)
    });
    let Within {
        mut near,
        evidence,
        cut,
    } = within(
        held.map(|(_, _, w)| w).chain(batch.live_writes()),
        fp,
        k,
        cap,
    );
    let mut more = cut | keep_nearest(&mut near, cap);
    let mut dups: Vec<Found> = pre.found.iter().filter(|f| fresh(&f.id)).cloned().collect();
    let verifying = verify.zip(d.evidence.as_ref());
    for (distance, id, e) in near {
        let similarity = match verifying {
            Some((t, probe)) => match evidence[e].and_then(|e| probe.similarity(e)) {
                Some(j) if j < t => continue,
                j => j,
            },
            None => None,
        };
        dups.push(Found {
            id: Arc::from(id),
            distance,
            similarity,
        });
    }
    dups.sort_unstable_by(|a, b| (a.distance, &a.id).cmp(&(b.distance, &b.id)));
    more |= dups.len() > cap;
    dups.truncate(cap);
    (fp, dups, more)
}

/// Decides one upsert's documents against the collection and the batch's
/// earlier decisions (its own included), in order, adding its writes to
/// `batch`. Each document keeps at most its limit of matches (the nearest),
/// and examines at most [`crate::collection::BUCKET_CAP`] entries of a
/// bucket: the work is bounded by the batch's size, whatever is stored.
fn decide<B: Bits>(
    (store, collection, recent): (&Store, &Collection<B>, &Recent<B>),
    batch: &mut Batch<B>,
    docs: &[NewDoc<B>],
    Ask {
        mode,
        k,
        verify,
        limit,
    }: Ask,
    control: &Control,
) -> Result<Vec<Outcome<B>>, ServiceError> {
    let mut out = Vec::with_capacity(docs.len());
    // Only this thread learns a centre, between batches: one for the batch.
    let centre = collection.centre();
    for d in docs {
        let k = match d.shares {
            Some(_) => collection.text_k(centre.as_deref(), k),
            None => k,
        };
        if control.closing.load(Ordering::Relaxed) {
            return Err(ServiceError::ShuttingDown);
        }
        if let Some(fault) = control.fault {
            fault(&d.id);
        }
        if let Some(dim) = d.dim {
            let fixed = match control.dim.load(Ordering::SeqCst) {
                0 => batch.dim,
                d => Some(d),
            };
            match fixed {
                Some(f) if f != dim => {
                    return Err(ServiceError::Invalid(format!(
                        "document {:?}: a vector of {dim} dimensions, but this collection's \
                         vectors have {f}",
                        d.id
                    )));
                }
                Some(_) => {}
                None if mode == Mode::Check => {}
                None => batch.dim = Some(dim),
            }
        }
        let cap = candidates(limit, verify.is_some() && d.evidence.is_some()).max(1);
        // A search done ahead of the writer, completed with the writes
        // applied since (when every one is still held): the matches it
        // found that were not written since, verified already, and the
        // writes since as this batch's are.
        let ahead = d
            .pre
            .as_ref()
            .and_then(|p| Some((p, recent.since(p.applied)?)));
        let (fp, mut dups, mut more) = match ahead {
            Some((pre, since)) => complete(pre, since, recent, batch, (k, cap, verify), d),
            None => {
                let fp = centred(centre.as_deref(), d.fp, d.shares.as_deref());
                let (dups, more) = search(store, collection, batch, (fp, k, cap), verify, d)?;
                (fp, dups, more)
            }
        };
        let stored = match mode {
            Mode::Insert => true,
            Mode::InsertIfNew => dups.is_empty(),
            Mode::Check => false,
        };
        if dups.len() > limit {
            dups.truncate(limit);
            more = true;
        }
        if stored {
            batch.push((d.id.clone(), Some((fp, d.evidence.clone()))));
        }
        out.push(Outcome {
            fp,
            stored,
            duplicates: dups,
            truncated: more,
        });
    }
    Ok(out)
}

fn process<B: Bits>(
    (store, collection, recent): (&Store, &Collection<B>, &mut Recent<B>),
    jobs: &mut Vec<Job<B>>,
    control: &Control,
    learning: bool,
) {
    recent.sync(collection.applied());
    // Decide every document against the collection and this batch's earlier
    // decisions, in arrival order. A request whose verification cannot read
    // the store fails whole, and none of its documents is written.
    let mut batch: Batch<B> = Batch::new();
    let mut outcomes: Vec<Option<Result<Vec<Outcome<B>>, ServiceError>>> =
        Vec::with_capacity(jobs.len());
    let mut deleted: Vec<Option<bool>> = Vec::with_capacity(jobs.len());
    for job in jobs.iter() {
        match job {
            Job::Upsert {
                docs,
                mode,
                k,
                verify,
                limit,
                ..
            } => {
                let ask = Ask {
                    mode: *mode,
                    k: *k,
                    verify: *verify,
                    limit: *limit,
                };
                let before = (batch.writes.len(), batch.dim);
                let out = decide((store, collection, recent), &mut batch, docs, ask, control);
                if out.is_err() {
                    batch.truncate(before.0);
                    batch.dim = before.1;
                }
                outcomes.push(Some(out));
                deleted.push(None);
            }
            Job::Delete { id, .. } => {
                let exists = if control.closing.load(Ordering::Relaxed) {
                    None
                } else {
                    Some(match batch.latest(id) {
                        Some(w) => w.is_some(),
                        None => collection.contains(id),
                    })
                };
                if exists == Some(true) {
                    batch.push((id.clone(), None));
                }
                outcomes.push(None);
                deleted.push(exists);
            }
        }
    }
    // One transaction for the whole batch.
    let mut fp_bytes: Vec<Vec<u8>> = Vec::new();
    let mut writes: Vec<Write<'_>> = Vec::new();
    {
        for (job, out) in jobs.iter().zip(&outcomes) {
            if let (Job::Upsert { .. }, Some(Ok(out))) = (job, out) {
                for o in out {
                    if o.stored {
                        let mut b = Vec::with_capacity(16);
                        o.fp.write_le(&mut b);
                        fp_bytes.push(b);
                    }
                }
            }
        }
        let mut fi = 0;
        for ((job, out), del) in jobs.iter().zip(&outcomes).zip(&deleted) {
            match (job, out) {
                (Job::Upsert { docs, .. }, Some(Ok(out))) => {
                    for (d, o) in docs.iter().zip(out) {
                        if o.stored {
                            writes.push(Write::Put {
                                id: &d.id,
                                fingerprint: &fp_bytes[fi],
                                meta: d.meta.as_deref(),
                                sketch: match &d.evidence {
                                    Some(Evidence::Text(s)) => Some(&**s),
                                    _ => None,
                                },
                                shares: d.shares.as_deref().filter(|_| learning),
                                vector: match &d.evidence {
                                    Some(Evidence::Vector(v)) => Some(v),
                                    _ => None,
                                },
                            });
                            fi += 1;
                        }
                    }
                }
                (Job::Delete { id, .. }, _) if *del == Some(true) => {
                    writes.push(Write::Delete { id })
                }
                _ => {}
            }
        }
    }
    if let Some(dim) = batch.dim {
        writes.push(Write::Dimension(dim));
    }
    let committed = if writes.is_empty() {
        Ok(())
    } else {
        store.commit(&writes)
    };
    if let Err(e) = &committed {
        tracing::error!("a batch of {} writes was not committed: {e}", writes.len());
    }
    drop(writes);
    if committed.is_ok() {
        if let Some(dim) = batch.dim {
            control.dim.store(dim, Ordering::SeqCst);
        }
        collection.apply(
            batch
                .writes
                .iter()
                .map(|(id, w)| (id.as_str(), w.as_ref().map(|(fp, _)| *fp))),
        );
        recent.push(collection.applied(), std::mem::take(&mut batch.writes));
    }
    for ((job, out), del) in jobs.drain(..).zip(outcomes).zip(deleted) {
        match job {
            Job::Upsert { reply, .. } => {
                let _ = reply.send(match (&committed, out.expect("an upsert's outcomes")) {
                    (_, Err(e)) => Err(e),
                    (Ok(()), Ok(out)) => Ok(out),
                    (Err(e), Ok(_)) => Err(ServiceError::Storage(e.to_string())),
                });
            }
            Job::Delete { reply, .. } => {
                let _ = reply.send(match (&committed, del) {
                    (_, None) => Err(ServiceError::ShuttingDown),
                    (Ok(()), Some(existed)) => Ok(existed),
                    (Err(e), Some(_)) => Err(ServiceError::Storage(e.to_string())),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Settings;
    use neardup_core::index::plan;
    use neardup_core::{FingerprintConfig, Width};
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    fn open(dir: &std::path::Path) -> (Arc<Store>, Arc<Collection<u64>>) {
        let p = plan(64, 3, 1e4, None).unwrap();
        let design = neardup_core::index::OnlineDesign::Tables(p.options[p.chosen].design.clone());
        let settings = Settings {
            config: FingerprintConfig {
                bits: Width::W64,
                ..FingerprintConfig::default()
            },
            max_k: 3,
            design: design.clone(),
            version: crate::store::STORE_VERSION,
            verify: None,
            centring: None,
            planned_for: None,
        };
        let (store, _) = Store::open_or_create(dir, || Ok(settings)).unwrap();
        let c = Collection::new(design, |_| Ok(()), 0).unwrap();
        (Arc::new(store), Arc::new(c))
    }

    type Reply = oneshot::Receiver<Result<Vec<Outcome<u64>>, ServiceError>>;

    fn upsert(docs: &[(String, u64)], mode: Mode, k: u32, limit: usize) -> (Job<u64>, Reply) {
        let (tx, rx) = oneshot::channel();
        let docs = docs
            .iter()
            .map(|(id, fp)| NewDoc {
                id: id.clone(),
                fp: *fp,
                meta: None,
                evidence: None,
                dim: None,
                shares: None,
                pre: None,
            })
            .collect();
        let job = Job::Upsert {
            docs,
            mode,
            k,
            verify: None,
            limit,
            reply: tx,
        };
        (job, rx)
    }

    /// Ten thousand documents of one fingerprint in one request, against a
    /// thousand already stored: each keeps at most its limit of matches, the
    /// nearest (ties by id), and says there were more.
    #[test]
    fn same_fingerprint_batches_keep_at_most_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let (store, collection) = open(dir.path());
        let control = Control::default();
        let stored: Vec<(String, u64)> = (0..1000).map(|i| (format!("old{i:04}"), 7)).collect();
        let (job, _) = upsert(&stored, Mode::Insert, 0, 10);
        process(
            (&store, &collection, &mut Recent::new(collection.applied())),
            &mut vec![job],
            &control,
            false,
        );
        let docs: Vec<(String, u64)> = (0..10_000).map(|i| (format!("x{i:05}"), 7)).collect();
        let (job, mut rx) = upsert(&docs, Mode::Insert, 3, 5);
        process(
            (&store, &collection, &mut Recent::new(collection.applied())),
            &mut vec![job],
            &control,
            false,
        );
        let out = rx.try_recv().unwrap().unwrap();
        assert_eq!(out.len(), 10_000);
        for o in &out {
            assert!(o.stored);
            assert!(o.truncated);
            let ids: Vec<&str> = o.duplicates.iter().map(|f| &*f.id).collect();
            // All at distance 0: by id, the first stored ones (of those
            // examined: the search stops after a few hundred matches).
            assert_eq!(ids.len(), 5);
            assert!(ids.iter().all(|i| i.starts_with("old")), "{ids:?}");
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        }
        assert_eq!(collection.levels().documents, 11_000);
    }

    /// A service closing refuses what the writer has not decided: nothing of
    /// it is written, and every request is answered.
    #[test]
    fn closing_refuses_what_is_not_decided() {
        let dir = tempfile::tempdir().unwrap();
        let (store, collection) = open(dir.path());
        let control = Control::default();
        control.closing.store(true, Ordering::SeqCst);
        let docs: Vec<(String, u64)> = (0..100).map(|i| (format!("d{i}"), i)).collect();
        let (job, mut rx) = upsert(&docs, Mode::Insert, 0, 5);
        let (tx, mut del) = oneshot::channel();
        let delete = Job::Delete {
            id: "d1".into(),
            reply: tx,
        };
        process(
            (&store, &collection, &mut Recent::new(collection.applied())),
            &mut vec![job, delete],
            &control,
            false,
        );
        assert!(matches!(
            rx.try_recv().unwrap(),
            Err(ServiceError::ShuttingDown)
        ));
        assert!(matches!(
            del.try_recv().unwrap(),
            Err(ServiceError::ShuttingDown)
        ));
        assert_eq!(store.document_count().unwrap(), 0);
        assert_eq!(collection.levels().documents, 0);
    }

    /// One write job of the oracle: documents (id, fp) and how, or a delete.
    #[derive(Clone, Debug)]
    enum Op {
        Upsert(Vec<(String, u64)>, Mode, u32, usize),
        Delete(String),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few ids and fingerprints close together: replacements, deletes of
        // what a batch stored, ties and clusters.
        let doc = (0..12u32, 0..6u64, 0..64u32).prop_map(|(id, base, bit)| {
            (
                format!("d{id}"),
                (base << 60) | ((1u64 << bit) * u64::from(bit % 3 == 0)),
            )
        });
        let mode = prop_oneof![Just(Mode::Insert), Just(Mode::InsertIfNew)];
        prop_oneof![
            4 => (proptest::collection::vec(doc, 1..6), mode, 0..4u32, 0..4usize).prop_map(
                |(mut docs, m, k, l)| {
                    // One request names each id once (the API refuses more).
                    let mut seen = std::collections::HashSet::new();
                    docs.retain(|(id, _)| seen.insert(id.clone()));
                    Op::Upsert(docs, m, k, l)
                }
            ),
            1 => (0..12u32).prop_map(|i| Op::Delete(format!("d{i}"))),
        ]
    }

    /// The features of a test document: one of six pages (the top bits of
    /// its fingerprint), with up to seven of its twenty words replaced (by
    /// the fingerprint's low bit), so that documents of one page are at
    /// Jaccard 0.48 to 1 of one another, and of two pages at 0.
    fn features(fp: u64) -> Vec<u64> {
        let (page, low) = (fp >> 60, fp & ((1 << 60) - 1));
        let b = if low == 0 {
            0
        } else {
            u64::from(low.trailing_zeros())
        };
        let mut set: Vec<u64> = (0..20u64)
            .map(|x| {
                if x < b % 8 {
                    1_000_000 + b * 100 + x
                } else {
                    x + page * 100
                }
            })
            .map(|x| x.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        set.sort_unstable();
        set
    }

    /// Decides `rounds` by the writer, a round a batch, and checks every
    /// answer against deciding each document in order against everything
    /// stored before it; with `verify`, texts' signatures are stored and a
    /// match must also reach that Jaccard similarity (reported exactly).
    ///
    /// `ahead`: (lag, held) searches most requests ahead of the writer
    /// ([`predecide`]), `lag` rounds before their own is decided, with the
    /// writer holding at most `held` writes since (fewer than the lag's:
    /// those searches are done again by the writer).
    fn against_oracle(
        rounds: Vec<Vec<Op>>,
        verify: Option<f64>,
        ahead: Option<(usize, usize)>,
    ) -> Result<(), TestCaseError> {
        let dir = tempfile::tempdir().unwrap();
        let (store, collection) = open(dir.path());
        let control = Control::default();
        let mut recent = Recent::holding(collection.applied(), ahead.map_or(0, |a| a.1));
        let mut live: Vec<(String, u64)> = Vec::new();
        let mut made = Vec::new();
        for round in &rounds {
            let mut jobs = Vec::new();
            let mut replies = Vec::new();
            let mut dels = Vec::new();
            for op in round {
                match op {
                    Op::Upsert(docs, mode, k, limit) => {
                        let (mut job, rx) = upsert(docs, *mode, *k, *limit);
                        if let (
                            Some(t),
                            Job::Upsert {
                                docs,
                                verify: asked,
                                ..
                            },
                        ) = (verify, &mut job)
                        {
                            *asked = Some(t);
                            for d in docs.iter_mut() {
                                d.evidence =
                                    Some(Evidence::Text(Box::new(Signature::of(&features(d.fp)))));
                            }
                        }
                        jobs.push(job);
                        replies.push(rx);
                    }
                    Op::Delete(id) => {
                        let (tx, rx) = oneshot::channel();
                        jobs.push(Job::Delete {
                            id: id.clone(),
                            reply: tx,
                        });
                        dels.push(rx);
                    }
                }
            }
            made.push(Some((jobs, replies, dels)));
        }
        let search_ahead = |jobs: &mut Vec<Job<u64>>, round: usize| {
            for (i, job) in jobs.iter_mut().enumerate() {
                if let Job::Upsert {
                    docs, k, verify, ..
                } = job
                    && !(i + round).is_multiple_of(3)
                {
                    predecide(&store, &collection, docs, *k, *verify);
                }
            }
        };
        for (r, round) in rounds.iter().enumerate() {
            if let Some((lag, _)) = ahead {
                // Round r + lag now (the first rounds all at the start).
                let (from, n) = if r == 0 { (0, lag + 1) } else { (r + lag, 1) };
                for (later, jobs) in made.iter_mut().enumerate().skip(from).take(n) {
                    let (jobs, _, _) = jobs.as_mut().expect("not decided yet");
                    search_ahead(jobs, later);
                }
            }
            let (mut jobs, replies, dels) = made[r].take().expect("made");
            process(
                (&store, &collection, &mut recent),
                &mut jobs,
                &control,
                false,
            );
            let (mut replies, mut dels) = (replies.into_iter(), dels.into_iter());
            for op in round {
                match op {
                    Op::Upsert(docs, mode, k, limit) => {
                        let got = replies.next().unwrap().try_recv().unwrap().unwrap();
                        for ((id, fp), o) in docs.iter().zip(got) {
                            let probe = Signature::of(&features(*fp));
                            let mut want: Vec<(u32, &str, Option<f64>)> = live
                                .iter()
                                .map(|(i, f)| {
                                    let j = verify
                                        .map(|_| probe.jaccard(&Signature::of(&features(*f))));
                                    (fp.distance(*f), i.as_str(), j)
                                })
                                .filter(|(d, _, j)| {
                                    d <= k && verify.is_none_or(|t| j.is_some_and(|j| j >= t))
                                })
                                .collect();
                            want.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
                            let stored = *mode == Mode::Insert || want.is_empty();
                            prop_assert_eq!(o.stored, stored);
                            prop_assert_eq!(o.truncated, want.len() > *limit);
                            want.truncate(*limit);
                            prop_assert_eq!(o.duplicates.len(), want.len());
                            for (f, w) in o.duplicates.iter().zip(&want) {
                                prop_assert_eq!((f.distance, &*f.id), (w.0, w.1));
                                match (f.similarity, w.2) {
                                    (None, None) => {}
                                    (Some(a), Some(b)) => {
                                        prop_assert!((a - b).abs() < 1e-9, "{} {}", a, b)
                                    }
                                    (a, b) => {
                                        prop_assert!(false, "similarity {:?}, want {:?}", a, b)
                                    }
                                }
                            }
                            if stored {
                                live.retain(|(i, _)| i != id);
                                live.push((id.clone(), *fp));
                            }
                        }
                    }
                    Op::Delete(id) => {
                        let existed = dels.next().unwrap().try_recv().unwrap().unwrap();
                        prop_assert_eq!(existed, live.iter().any(|(i, _)| i == id));
                        live.retain(|(i, _)| i != id);
                    }
                }
            }
            let mut stored = Vec::new();
            store
                .for_each(|id, fp| stored.push((id.to_owned(), u64::read_le(fp))))
                .unwrap();
            let mut want = live.clone();
            want.sort();
            prop_assert_eq!(stored, want);
            prop_assert_eq!(collection.levels().documents, live.len());
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Batches of requests decided by the writer give what deciding
        /// every document in order against everything stored before gives:
        /// the same decisions, the nearest `limit` matches, `truncated` when
        /// there were more; and the store and collection hold the result.
        #[test]
        fn the_writer_matches_a_brute_force_oracle(
            rounds in proptest::collection::vec(proptest::collection::vec(op(), 1..6), 1..5)
        ) {
            against_oracle(rounds, None, None)?;
        }

        /// The same with most requests searched ahead of the writer, up to
        /// two batches before their own, against a writer that holds the
        /// writes applied since or (holding fewer) searches again.
        #[test]
        fn the_writer_completes_searches_done_ahead_of_it(
            rounds in proptest::collection::vec(proptest::collection::vec(op(), 1..6), 1..6),
            lag in 0..3usize,
            held in prop_oneof![Just(4usize), Just(RECENT_WRITES)],
            verify in proptest::option::of(Just(0.6)),
        ) {
            against_oracle(rounds, verify, Some((lag, held)))?;
        }

        /// The same with texts' signatures, verified at Jaccard 0.6: a
        /// match must also reach it, by the stored signature or by the one
        /// an earlier decision of the batch holds, with its exact
        /// similarity.
        #[test]
        fn the_verifying_writer_matches_a_brute_force_oracle(
            rounds in proptest::collection::vec(proptest::collection::vec(op(), 1..6), 1..5)
        ) {
            against_oracle(rounds, Some(0.6), None)?;
        }
    }
}
