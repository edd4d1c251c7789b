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

fn process<B: Bits>(store: &Store, collection: &Collection<B>, jobs: &mut Vec<Job<B>>) {
    // Decide every document against the collection and this batch's earlier
    // decisions, in arrival order.
    let mut pending: Vec<(String, Option<B>)> = Vec::new();
    let mut outcomes: Vec<Option<Vec<Outcome>>> = Vec::with_capacity(jobs.len());
    let mut deleted: Vec<Option<bool>> = Vec::with_capacity(jobs.len());
    for job in jobs.iter() {
        match job {
            Job::Upsert { docs, mode, k, .. } => {
                let mut out = Vec::with_capacity(docs.len());
                for d in docs {
                    let mut dups = collection.query(d.fp, *k);
                    // Later decisions of this batch override the collection.
                    dups.retain(|f| !pending.iter().any(|(id, _)| **id == *f.id));
                    for (id, fp) in &pending {
                        if let Some(fp) = fp {
                            let dist = d.fp.distance(*fp);
                            if dist <= *k {
                                dups.push(Found {
                                    id: Arc::from(id.as_str()),
                                    distance: dist,
                                });
                            }
                        }
                    }
                    dups.sort_unstable_by(|a, b| a.distance.cmp(&b.distance).then(a.id.cmp(&b.id)));
                    dups.dedup_by(|a, b| a.id == b.id);
                    let stored = match mode {
                        Mode::Insert => true,
                        Mode::InsertIfNew => dups.is_empty(),
                        Mode::Check => false,
                    };
                    if stored {
                        pending.push((d.id.clone(), Some(d.fp)));
                    }
                    out.push(Outcome {
                        stored,
                        duplicates: dups,
                    });
                }
                outcomes.push(Some(out));
                deleted.push(None);
            }
            Job::Delete { id, .. } => {
                let exists = match pending.iter().rev().find(|(p, _)| p == id) {
                    Some((_, fp)) => fp.is_some(),
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
        let mut metas: Vec<Option<&[u8]>> = Vec::new();
        for (job, out) in jobs.iter().zip(&outcomes) {
            if let (Job::Upsert { docs, .. }, Some(out)) = (job, out) {
                for (d, o) in docs.iter().zip(out) {
                    if o.stored {
                        let mut b = Vec::with_capacity(16);
                        d.fp.write_le(&mut b);
                        fp_bytes.push(b);
                        metas.push(d.meta.as_deref());
                    }
                }
            }
        }
        let mut fi = 0;
        for (job, out) in jobs.iter().zip(&outcomes) {
            match (job, out) {
                (Job::Upsert { docs, .. }, Some(out)) => {
                    for (d, o) in docs.iter().zip(out) {
                        if o.stored {
                            writes.push(Write::Put {
                                id: &d.id,
                                fingerprint: &fp_bytes[fi],
                                meta: metas[fi],
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
        collection.apply(pending.iter().map(|(id, fp)| (id.as_str(), *fp)));
    }
    for ((job, out), del) in jobs.drain(..).zip(outcomes).zip(deleted) {
        match job {
            Job::Upsert { reply, .. } => {
                let _ = reply.send(match &committed {
                    Ok(()) => Ok(out.expect("an upsert's outcomes")),
                    Err(e) => Err(ServiceError::Storage(e.to_string())),
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
