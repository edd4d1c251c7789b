//! The single writer: group commit.
//!
//! Every write (store, delete) goes through one thread. It takes whatever
//! requests are waiting (up to a batch limit), decides each document in order
//! (so `insert_if_new` is atomic: of two near-identical submissions, the second
//! sees the first), commits them all in one durable transaction, applies them
//! to the in-memory collection, and only then answers. One fsync serves every
//! request of the batch.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};

use neardup_core::index::Bits;
use neardup_core::sketch::Sketch;
use tokio::sync::oneshot;

use crate::collection::{Collection, Found};
use crate::error::ServiceError;
use crate::store::{Store, Write};

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
    /// The text's verification sketch (None when a fingerprint was given).
    pub sketch: Option<Sketch>,
}

/// What happened to one document.
#[derive(Debug)]
pub struct Outcome {
    pub stored: bool,
    pub duplicates: Vec<Found>,
}

#[derive(Debug)]
pub enum Job<B> {
    Upsert {
        docs: Vec<NewDoc<B>>,
        mode: Mode,
        k: u32,
        /// Keep a match only when its estimated Jaccard similarity reaches this.
        verify: Option<f64>,
        reply: oneshot::Sender<Result<Vec<Outcome>, ServiceError>>,
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

/// Runs until every sender is dropped, then returns (everything received has
/// been committed and answered).
pub fn run<B: Bits>(store: Arc<Store>, collection: Arc<Collection<B>>, rx: Receiver<Job<B>>) {
    let mut jobs: Vec<Job<B>> = Vec::new();
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
        process(&store, &collection, &mut jobs);
    }
}

/// The matches whose estimated Jaccard similarity to `sketch` reaches
/// `threshold`, each with its similarity, in their order. A match whose own
/// sketch is unknown (stored by fingerprint, or before sketches were kept) is
/// kept by distance alone, without a similarity. `in_batch` gives the sketch
/// of a document decided earlier in the same write batch (Some), or says to
/// read it from the store (None).
pub fn verify_found(
    store: &Store,
    found: Vec<Found>,
    sketch: &Sketch,
    threshold: f64,
    in_batch: impl Fn(&str) -> Option<Option<Sketch>>,
) -> Result<Vec<Found>, ServiceError> {
    let from_store: Vec<&str> = found
        .iter()
        .filter(|f| in_batch(&f.id).is_none())
        .map(|f| &*f.id)
        .collect();
    let mut stored = store.sketches(&from_store)?.into_iter();
    let mut out = Vec::with_capacity(found.len());
    for mut f in found {
        let other = match in_batch(&f.id) {
            Some(s) => s,
            None => stored.next().expect("one sketch per id read"),
        };
        match other {
            Some(o) => {
                let j = sketch.jaccard(&o);
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

/// A write decided in this batch: the id, its fingerprint and sketch (None
/// for a delete).
type Pending<B> = (String, Option<(B, Option<Sketch>)>);

/// How an upsert asks its documents to be decided.
#[derive(Clone, Copy)]
struct Ask {
    mode: Mode,
    k: u32,
    verify: Option<f64>,
}

/// Decides one upsert's documents against the collection, the batch's earlier
/// decisions (`pending`) and its own, in order; its writes go to `mine`.
fn decide<B: Bits>(
    (store, collection): (&Store, &Collection<B>),
    pending: &[Pending<B>],
    docs: &[NewDoc<B>],
    Ask { mode, k, verify }: Ask,
    mine: &mut Vec<Pending<B>>,
) -> Result<Vec<Outcome>, ServiceError> {
    let mut out = Vec::with_capacity(docs.len());
    for d in docs {
        let earlier = || pending.iter().chain(mine.iter());
        let mut dups = collection.query(d.fp, k);
        // Later decisions of this batch override the collection.
        dups.retain(|f| !earlier().any(|(id, _)| **id == *f.id));
        for (id, w) in earlier() {
            if let Some((fp, _)) = w {
                let dist = d.fp.distance(*fp);
                if dist <= k {
                    dups.push(Found {
                        id: Arc::from(id.as_str()),
                        distance: dist,
                        similarity: None,
                    });
                }
            }
        }
        dups.sort_unstable_by(|a, b| a.distance.cmp(&b.distance).then(a.id.cmp(&b.id)));
        dups.dedup_by(|a, b| a.id == b.id);
        if let (Some(t), Some(sketch)) = (verify, &d.sketch) {
            let in_batch = |id: &str| {
                earlier()
                    .filter(|(p, _)| p == id)
                    .last()
                    .map(|(_, w)| w.as_ref().and_then(|(_, s)| s.clone()))
            };
            dups = verify_found(store, dups, sketch, t, in_batch)?;
        }
        let stored = match mode {
            Mode::Insert => true,
            Mode::InsertIfNew => dups.is_empty(),
            Mode::Check => false,
        };
        if stored {
            mine.push((d.id.clone(), Some((d.fp, d.sketch.clone()))));
        }
        out.push(Outcome {
            stored,
            duplicates: dups,
        });
    }
    Ok(out)
}

fn process<B: Bits>(store: &Store, collection: &Collection<B>, jobs: &mut Vec<Job<B>>) {
    // Decide every document against the collection and this batch's earlier
    // decisions, in arrival order. A request whose verification cannot read
    // the store fails whole, and none of its documents is written.
    let mut pending: Vec<Pending<B>> = Vec::new();
    let mut outcomes: Vec<Option<Result<Vec<Outcome>, ServiceError>>> =
        Vec::with_capacity(jobs.len());
    let mut deleted: Vec<Option<bool>> = Vec::with_capacity(jobs.len());
    for job in jobs.iter() {
        match job {
            Job::Upsert {
                docs,
                mode,
                k,
                verify,
                ..
            } => {
                let mut mine = Vec::new();
                let ask = Ask {
                    mode: *mode,
                    k: *k,
                    verify: *verify,
                };
                let out = decide((store, collection), &pending, docs, ask, &mut mine);
                if out.is_ok() {
                    pending.append(&mut mine);
                }
                outcomes.push(Some(out));
                deleted.push(None);
            }
            Job::Delete { id, .. } => {
                let exists = match pending.iter().rev().find(|(p, _)| p == id) {
                    Some((_, w)) => w.is_some(),
                    None => collection.contains(id),
                };
                if exists {
                    pending.push((id.clone(), None));
                }
                outcomes.push(None);
                deleted.push(Some(exists));
            }
        }
    }
    // One transaction for the whole batch.
    let mut fp_bytes: Vec<Vec<u8>> = Vec::new();
    let mut writes: Vec<Write<'_>> = Vec::new();
    {
        for (job, out) in jobs.iter().zip(&outcomes) {
            if let (Job::Upsert { docs, .. }, Some(Ok(out))) = (job, out) {
                for (d, o) in docs.iter().zip(out) {
                    if o.stored {
                        let mut b = Vec::with_capacity(16);
                        d.fp.write_le(&mut b);
                        fp_bytes.push(b);
                    }
                }
            }
        }
        let mut fi = 0;
        for (job, out) in jobs.iter().zip(&outcomes) {
            match (job, out) {
                (Job::Upsert { docs, .. }, Some(Ok(out))) => {
                    for (d, o) in docs.iter().zip(out) {
                        if o.stored {
                            writes.push(Write::Put {
                                id: &d.id,
                                fingerprint: &fp_bytes[fi],
                                meta: d.meta.as_deref(),
                                sketch: d.sketch.as_ref(),
                            });
                            fi += 1;
                        }
                    }
                }
                (Job::Delete { id, .. }, _) => writes.push(Write::Delete { id }),
                _ => {}
            }
        }
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
        collection.apply(
            pending
                .iter()
                .map(|(id, w)| (id.as_str(), w.as_ref().map(|(fp, _)| *fp))),
        );
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
                let _ = reply.send(match &committed {
                    Ok(()) => Ok(del.expect("a delete's outcome")),
                    Err(e) => Err(ServiceError::Storage(e.to_string())),
                });
            }
        }
    }
}
