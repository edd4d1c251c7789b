//! The in-memory search structure, derived from the store.
//!
//! Three levels, as in a log-structured merge tree: a large `main` index, a
//! smaller `mid` index, and the `recent` additions, scanned linearly. Writers
//! append to `recent` under a brief write lock; a background merger rebuilds
//! `mid` (with `recent`) or `main` (with both) from a snapshot, outside any
//! lock, and swaps the result in under another brief write lock. Queries take
//! the read lock for the microseconds a lookup lasts, so they never wait on a
//! write batch or a merge. Deleted and replaced entries are tombstoned until a
//! rebuild drops them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use neardup_core::TableDesign;
use neardup_core::index::{Bits, Index};

/// Recent additions scanned linearly before a merge is asked for.
const RECENT_MAX: usize = 8192;

/// A document found near a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub id: Arc<str>,
    pub distance: u32,
}

struct State<B: Bits> {
    main: Arc<Index<B>>,
    mid: Arc<Index<B>>,
    recent: Vec<(u64, B)>,
    tombstones: HashSet<u64>,
    /// Entry number -> document id (None once deleted or replaced).
    names: Vec<Option<Arc<str>>>,
    by_id: HashMap<Arc<str>, u64>,
}

pub struct Collection<B: Bits> {
    design: TableDesign,
    state: RwLock<State<B>>,
    merge_wanted: Mutex<bool>,
    wake: Condvar,
}

impl<B: Bits> std::fmt::Debug for Collection<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collection")
            .field("design", &self.design)
            .finish_non_exhaustive()
    }
}

/// Sizes of the levels, for statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Levels {
    pub documents: usize,
    pub main: usize,
    pub mid: usize,
    pub recent: usize,
    pub tombstones: usize,
    pub index_bytes: usize,
}

impl<B: Bits> Collection<B> {
    /// A collection over `docs` (id, fingerprint), built as one main index.
    pub fn new(design: TableDesign, docs: Vec<(Arc<str>, B)>) -> Result<Self, neardup_core::Error> {
        let mut names = Vec::with_capacity(docs.len());
        let mut by_id = HashMap::with_capacity(docs.len());
        let mut entries = Vec::with_capacity(docs.len());
        for (i, (id, fp)) in docs.into_iter().enumerate() {
            by_id.insert(Arc::clone(&id), i as u64);
            names.push(Some(id));
            entries.push((i as u64, fp));
        }
        let main = Index::build(design.clone(), entries)?;
        let mid = Index::build(design.clone(), std::iter::empty())?;
        Ok(Collection {
            design,
            state: RwLock::new(State {
                main: Arc::new(main),
                mid: Arc::new(mid),
                recent: Vec::new(),
                tombstones: HashSet::new(),
                names,
                by_id,
            }),
            merge_wanted: Mutex::new(false),
            wake: Condvar::new(),
        })
    }

    pub fn design(&self) -> &TableDesign {
        &self.design
    }

    /// Every live document within `k` of `fp`, nearest first (ties by id).
    pub fn query(&self, fp: B, k: u32) -> Vec<Found> {
        let s = self.state.read().expect("collection lock");
        let mut found: Vec<Found> = Vec::new();
        let mut push = |entry: u64, distance: u32| {
            if s.tombstones.contains(&entry) {
                return;
            }
            if let Some(Some(id)) = s.names.get(entry as usize) {
                found.push(Found {
                    id: Arc::clone(id),
                    distance,
                });
            }
        };
        for level in [&s.main, &s.mid] {
            if level.is_empty() {
                continue;
            }
            for m in level.query(fp, k).expect("k checked by the caller") {
                push(m.id, m.distance);
            }
        }
        for &(entry, other) in &s.recent {
            let d = fp.distance(other);
            if d <= k {
                push(entry, d);
            }
        }
        drop(s);
        found.sort_unstable_by(|a, b| a.distance.cmp(&b.distance).then(a.id.cmp(&b.id)));
        found
    }

    /// Whether a document with this id is stored.
    pub fn contains(&self, id: &str) -> bool {
        self.state
            .read()
            .expect("collection lock")
            .by_id
            .contains_key(id)
    }

    /// Applies committed writes: `Some(fp)` stores (replacing a document of the
    /// same id), `None` deletes.
    pub fn apply<'a>(&self, writes: impl IntoIterator<Item = (&'a str, Option<B>)>) {
        let mut s = self.state.write().expect("collection lock");
        for (id, fp) in writes {
            if let Some(old) = s.by_id.remove(id) {
                s.tombstones.insert(old);
                s.names[old as usize] = None;
            }
            if let Some(fp) = fp {
                let entry = s.names.len() as u64;
                let id: Arc<str> = Arc::from(id);
                s.names.push(Some(Arc::clone(&id)));
                s.by_id.insert(id, entry);
                s.recent.push((entry, fp));
            }
        }
        let want = s.recent.len() > RECENT_MAX || s.tombstones.len() > RECENT_MAX;
        drop(s);
        if want {
            *self.merge_wanted.lock().expect("merge flag") = true;
            self.wake.notify_one();
        }
    }

    pub fn levels(&self) -> Levels {
        let s = self.state.read().expect("collection lock");
        Levels {
            documents: s.by_id.len(),
            main: s.main.len(),
            mid: s.mid.len(),
            recent: s.recent.len(),
            tombstones: s.tombstones.len(),
            index_bytes: s.main.memory()
                + s.mid.memory()
                + s.recent.len() * (8 + std::mem::size_of::<B>())
                + s.names.len() * 16
                + s.by_id.len() * 40,
        }
    }

    /// Runs merges until `stop` is set; call on a thread of its own.
    pub fn merge_loop(&self, stop: &std::sync::atomic::AtomicBool) {
        use std::sync::atomic::Ordering;
        loop {
            {
                let mut wanted = self.merge_wanted.lock().expect("merge flag");
                while !*wanted && !stop.load(Ordering::Relaxed) {
                    wanted = self
                        .wake
                        .wait_timeout(wanted, std::time::Duration::from_millis(200))
                        .expect("merge flag")
                        .0;
                }
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                *wanted = false;
            }
            self.merge_once();
        }
    }

    /// Wakes the merge loop so that it sees its stop flag.
    pub fn stop_merging(&self) {
        self.wake.notify_all();
    }

    /// One merge: `recent` into `mid`, or everything into `main` once `mid`
    /// would exceed an eighth of it. Exposed for tests.
    pub fn merge_once(&self) {
        let (main, mid, recent, tombstones) = {
            let s = self.state.read().expect("collection lock");
            (
                Arc::clone(&s.main),
                Arc::clone(&s.mid),
                s.recent.clone(),
                s.tombstones.clone(),
            )
        };
        let into_main = mid.len() + recent.len() > (main.len() / 8).max(RECENT_MAX);
        let mut dropped: Vec<u64> = Vec::new();
        let mut live = |(e, fp): (u64, B)| {
            if tombstones.contains(&e) {
                dropped.push(e);
                None
            } else {
                Some((e, fp))
            }
        };
        let sources: Vec<(u64, B)> = if into_main {
            main.entries()
                .chain(mid.entries())
                .chain(recent.iter().copied())
                .filter_map(&mut live)
                .collect()
        } else {
            mid.entries()
                .chain(recent.iter().copied())
                .filter_map(&mut live)
                .collect()
        };
        let built = Arc::new(
            Index::build(self.design.clone(), sources).expect("the design fits its width"),
        );
        let empty = Arc::new(
            Index::build(self.design.clone(), std::iter::empty()).expect("an empty index"),
        );
        let mut s = self.state.write().expect("collection lock");
        if into_main {
            s.main = built;
            s.mid = empty;
        } else {
            s.mid = built;
        }
        // Additions made during the merge stay in `recent`.
        s.recent.drain(..recent.len());
        for e in dropped {
            s.tombstones.remove(&e);
        }
    }
}
