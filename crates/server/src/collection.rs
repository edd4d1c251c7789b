//! The in-memory search structure, derived from the store.
//!
//! Each level is an [`OnlineIndex`] on the collection's design: permuted
//! tables for a small k, multi-index blocks for the wide k of a verified
//! collection. Three levels, as in a log-structured merge tree: a large `main` index, a
//! smaller `mid` index, and the `recent` additions, scanned linearly. Writers
//! append to `recent` under a brief write lock; a background merger rebuilds
//! `mid` (with `recent`) or `main` (with both) from a snapshot, outside any
//! lock, and swaps the result in under another brief write lock. Queries take
//! the read lock for the microseconds a lookup lasts, so they never wait on a
//! write batch or a merge. Deleted and replaced entries are tombstoned until a
//! rebuild drops them.

use std::collections::HashSet;
use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use neardup_core::centre::Centre;
use neardup_core::index::{Bits, OnlineDesign, OnlineIndex};

/// Recent additions scanned linearly before a merge is asked for.
const RECENT_MAX: usize = 8192;

/// Most entries of one table bucket a lookup examines: the bound on a lookup's work when many documents share a
/// fingerprint. Ordinary buckets hold a few entries.
pub const BUCKET_CAP: usize = 4096;

/// Keeps the `cap` smallest of `items`, sorted; `true` if any were dropped.
/// Linear in `items` (a selection, then a sort of what is kept).
pub fn keep_nearest<T: Ord>(items: &mut Vec<T>, cap: usize) -> bool {
    let more = items.len() > cap;
    if more {
        if cap == 0 {
            items.clear();
            return true;
        }
        items.select_nth_unstable(cap - 1);
        items.truncate(cap);
    }
    items.sort_unstable();
    more
}

/// The fingerprint of a text whose plain fingerprint is `plain`: decided
/// from its `shares` by the centre when there is one (and the shares).
pub fn centred<B: Bits>(centre: Option<&Centre>, plain: B, shares: Option<&[u8]>) -> B {
    match (centre, shares) {
        (Some(c), Some(sh)) => B::from_u128(c.fingerprint(sh).value()),
        _ => plain,
    }
}

/// A document found near a query.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub id: Arc<str>,
    pub distance: u32,
    /// The Jaccard similarity of the texts, when verified.
    pub similarity: Option<f64>,
}

impl Found {
    /// A document found at `distance`, not verified.
    pub fn at(distance: u32, id: &str) -> Found {
        Found {
            id: Arc::from(id),
            distance,
            similarity: None,
        }
    }
}

struct State<B: Bits> {
    /// The levels' design (planned again when a centre is learned).
    design: OnlineDesign,
    /// The centre texts' fingerprints are decided by, once learned.
    centre: Option<Arc<Centre>>,
    /// Counts the times every fingerprint was rewritten (a centre learned):
    /// a merge built from an older snapshot is dropped.
    generation: u64,
    /// Counts the changes of content (batches of writes applied, centres
    /// learned): a search reports the count it saw, so that what changed
    /// since can be found.
    applied: u64,
    main: Arc<OnlineIndex<B>>,
    mid: Arc<OnlineIndex<B>>,
    recent: Vec<(u64, B)>,
    tombstones: HashSet<u64>,
    ids: Ids,
}

/// Document ids without an allocation each: entry number -> id, as spans of
/// one byte arena, and id -> live entry through a hash table of entry numbers.
/// (About 45 bytes per document beyond the id itself, where a map of
/// reference-counted strings took over 100.) The bytes of deleted and
/// replaced ids are reclaimed once they outweigh the live ones (the arena is
/// rewritten: amortised constant work per write); what stays of a dead entry
/// until restart is its 16-byte span.
#[derive(Default)]
struct Ids {
    bytes: Vec<u8>,
    /// Bytes of `bytes` that belong to dead entries.
    dead_bytes: usize,
    /// (start, length) in `bytes`; length `DEAD` once deleted or replaced.
    spans: Vec<(u64, u32)>,
    live: HashTable<u64>,
    hasher: DefaultHashBuilder,
    count: usize,
}

const DEAD: u32 = u32::MAX;

impl Ids {
    fn with_capacity(n: usize, bytes: usize) -> Self {
        Ids {
            bytes: Vec::with_capacity(bytes),
            dead_bytes: 0,
            spans: Vec::with_capacity(n),
            live: HashTable::with_capacity(n),
            hasher: DefaultHashBuilder::default(),
            count: 0,
        }
    }

    fn bytes_of(&self, entry: u64) -> Option<&[u8]> {
        let &(start, len) = self.spans.get(entry as usize)?;
        (len != DEAD).then(|| &self.bytes[start as usize..start as usize + len as usize])
    }

    fn name(&self, entry: u64) -> Option<&str> {
        self.bytes_of(entry)
            .map(|b| std::str::from_utf8(b).expect("ids are stored as UTF-8"))
    }

    fn find(&self, id: &str) -> Option<u64> {
        let h = self.hasher.hash_one(id.as_bytes());
        self.live
            .find(h, |&e| self.bytes_of(e) == Some(id.as_bytes()))
            .copied()
    }

    /// Adds `id` as a new entry (the caller has removed any live one).
    fn push(&mut self, id: &str) -> u64 {
        let entry = self.spans.len() as u64;
        self.spans.push((self.bytes.len() as u64, id.len() as u32));
        self.bytes.extend_from_slice(id.as_bytes());
        let h = self.hasher.hash_one(id.as_bytes());
        let (spans, bytes, hasher) = (&self.spans, &self.bytes, &self.hasher);
        self.live.insert_unique(h, entry, |&e| {
            let (s, l) = spans[e as usize];
            hasher.hash_one(&bytes[s as usize..s as usize + l as usize])
        });
        self.count += 1;
        entry
    }

    /// Removes the live entry of `id`, if any; returns it.
    fn remove(&mut self, id: &str) -> Option<u64> {
        let h = self.hasher.hash_one(id.as_bytes());
        let (spans, bytes) = (&self.spans, &self.bytes);
        let found = self.live.find_entry(h, |&e| {
            let (s, l) = spans[e as usize];
            l != DEAD && &bytes[s as usize..s as usize + l as usize] == id.as_bytes()
        });
        let entry = match found {
            Ok(occupied) => occupied.remove().0,
            Err(_) => return None,
        };
        let len = std::mem::replace(&mut self.spans[entry as usize].1, DEAD);
        self.dead_bytes += len as usize;
        self.count -= 1;
        self.compact_if_wasteful();
        Some(entry)
    }

    /// Rewrites the arena without the dead ids' bytes once they are more than
    /// the live ones (and more than a megabyte).
    fn compact_if_wasteful(&mut self) {
        let live = self.bytes.len() - self.dead_bytes;
        if self.dead_bytes <= live.max(1 << 20) {
            return;
        }
        let mut bytes = Vec::with_capacity(live + live / 2);
        for span in self.spans.iter_mut().filter(|s| s.1 != DEAD) {
            let (start, len) = (span.0 as usize, span.1 as usize);
            span.0 = bytes.len() as u64;
            bytes.extend_from_slice(&self.bytes[start..start + len]);
        }
        self.bytes = bytes;
        self.dead_bytes = 0;
    }

    fn memory(&self) -> usize {
        self.bytes.capacity() + self.spans.capacity() * 16 + self.live.capacity() * 9
    }
}

pub struct Collection<B: Bits> {
    /// The k texts' plain fingerprints are searched within at most, in a
    /// collection learning its centre.
    plain_k: Option<u32>,
    state: RwLock<State<B>>,
    merge_wanted: Mutex<bool>,
    wake: Condvar,
}

impl<B: Bits> std::fmt::Debug for Collection<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collection")
            .field("design", &self.design())
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
    /// A collection over the documents `for_each` gives (id, fingerprint),
    /// each id once (as [`crate::store::Store::for_each`] does: it checks
    /// that its ids ascend strictly), built as one main index; `expected`:
    /// about how many.
    pub fn new(
        design: OnlineDesign,
        for_each: impl FnOnce(&mut dyn FnMut(&str, B)) -> Result<(), crate::ServiceError>,
        expected: usize,
    ) -> Result<Self, crate::ServiceError> {
        let mut ids = Ids::with_capacity(expected, expected * 24);
        let mut entries: Vec<(u64, B)> = Vec::with_capacity(expected);
        for_each(&mut |id, fp| {
            debug_assert!(ids.find(id).is_none(), "{id:?} given twice");
            let e = ids.push(id);
            entries.push((e, fp));
        })?;
        let config = |e: neardup_core::Error| crate::ServiceError::Config(e.to_string());
        let main = OnlineIndex::build(design.clone(), entries).map_err(config)?;
        let mid = OnlineIndex::build(design.clone(), std::iter::empty()).map_err(config)?;
        Ok(Collection {
            plain_k: None,
            state: RwLock::new(State {
                design,
                centre: None,
                generation: 0,
                applied: 0,
                main: Arc::new(main),
                mid: Arc::new(mid),
                recent: Vec::new(),
                tombstones: HashSet::new(),
                ids,
            }),
            merge_wanted: Mutex::new(false),
            wake: Condvar::new(),
        })
    }

    /// The levels' design.
    pub fn design(&self) -> OnlineDesign {
        self.state.read().expect("collection lock").design.clone()
    }

    /// This collection with texts' fingerprints decided by `centre`, and,
    /// while a collection that centres has not learned its centre, texts'
    /// plain fingerprints searched within at most `plain_k` (the k plain
    /// fingerprints are verified at, as `neardup dedup --no-centre`).
    pub fn with_centre(mut self, centre: Option<Centre>, plain_k: Option<u32>) -> Self {
        self.state.write().expect("collection lock").centre = centre.map(Arc::new);
        self.plain_k = plain_k;
        self
    }

    /// The k a text is searched within: `k`, or at most the plain k while
    /// the centre is not learned.
    pub fn text_k(&self, centre: Option<&Centre>, k: u32) -> u32 {
        match (centre, self.plain_k) {
            (None, Some(plain)) => k.min(plain),
            _ => k,
        }
    }

    /// The centre texts' fingerprints are decided by, once learned.
    pub fn centre(&self) -> Option<Arc<Centre>> {
        self.state.read().expect("collection lock").centre.clone()
    }

    /// Every document's fingerprint rewritten for a centre just learned:
    /// `rewritten` gives the new fingerprints (the others stay), and the
    /// whole collection becomes one main index on `design`, at once for
    /// every query.
    pub fn recentre(
        &self,
        centre: Centre,
        design: OnlineDesign,
        rewritten: impl IntoIterator<Item = (String, B)>,
    ) {
        let mut s = self.state.write().expect("collection lock");
        let mut new: std::collections::HashMap<u64, B> = std::collections::HashMap::new();
        for (id, fp) in rewritten {
            if let Some(e) = s.ids.find(&id) {
                new.insert(e, fp);
            }
        }
        let entries: Vec<(u64, B)> = s
            .main
            .entries()
            .chain(s.mid.entries())
            .chain(s.recent.iter().copied())
            .filter(|(e, _)| !s.tombstones.contains(e))
            .map(|(e, fp)| (e, new.get(&e).copied().unwrap_or(fp)))
            .collect();
        let build = |entries: Vec<(u64, B)>| {
            Arc::new(OnlineIndex::build(design.clone(), entries).expect("the design fits"))
        };
        s.main = build(entries);
        s.mid = build(Vec::new());
        s.design = design;
        s.recent.clear();
        s.tombstones.clear();
        s.centre = Some(Arc::new(centre));
        s.generation += 1;
        s.applied += 1;
    }

    /// [`Collection::nearest`] of a text: its fingerprint is `plain`, or
    /// decided from its `shares` once the collection has a centre (under the
    /// same lock as the search, so that a centre learned meanwhile never
    /// mixes the two). Returns the fingerprint searched for too, and the
    /// count of changes applied ([`Collection::applied`]) when it ran.
    pub fn nearest_text(
        &self,
        plain: B,
        shares: Option<&[u8]>,
        k: u32,
        cap: usize,
        skip: impl Fn(&str) -> bool,
    ) -> (B, Vec<Found>, bool, u64) {
        let s = self.state.read().expect("collection lock");
        let fp = centred(s.centre.as_deref(), plain, shares);
        let k = match shares {
            Some(_) => self.text_k(s.centre.as_deref(), k),
            None => k,
        };
        let (found, more) = Self::nearest_in(&s, fp, k, cap, skip);
        (fp, found, more, s.applied)
    }

    /// How many changes of content (batches of writes, centres learned)
    /// the collection has applied.
    pub fn applied(&self) -> u64 {
        self.state.read().expect("collection lock").applied
    }

    /// Every live document within `k` of `fp`, nearest first (ties by id),
    /// for collections without large clusters (tests); requests use
    /// [`Collection::nearest`].
    pub fn query(&self, fp: B, k: u32) -> Vec<Found> {
        self.nearest(fp, k, usize::MAX / 4, |_| false).0
    }

    /// The `cap` live documents within `k` of `fp` nearest to it, nearest
    /// first (ties by id), leaving out those `skip` names; `true` when there
    /// were more. Work and memory are bounded whatever the stored data: once
    /// four times `cap` matches (at least 256) are in hand, or a table bucket
    /// holds more than [`BUCKET_CAP`] entries, the search stops and answers
    /// the nearest of the matches it examined (with `true`): a cluster of a
    /// million copies costs what a few hundred do.
    pub fn nearest(
        &self,
        fp: B,
        k: u32,
        cap: usize,
        skip: impl Fn(&str) -> bool,
    ) -> (Vec<Found>, bool) {
        let s = self.state.read().expect("collection lock");
        Self::nearest_in(&s, fp, k, cap, skip)
    }

    fn nearest_in(
        s: &State<B>,
        fp: B,
        k: u32,
        cap: usize,
        skip: impl Fn(&str) -> bool,
    ) -> (Vec<Found>, bool) {
        // Matches examined for `cap`: beyond these, the nearest of those
        // examined are answered (and `true` says the list is cut short).
        let enough = cap.saturating_mul(4).max(256);
        let mut near: Vec<(u32, &str)> = Vec::new();
        let mut more = false;
        let mut push = |entry: u64, distance: u32| {
            if s.tombstones.contains(&entry) {
                return;
            }
            if let Some(id) = s.ids.name(entry)
                && !skip(id)
            {
                near.push((distance, id));
            }
        };
        for level in [&s.main, &s.mid] {
            if level.is_empty() {
                continue;
            }
            let (matches, capped) = level
                .query_capped(fp, k, BUCKET_CAP, enough)
                .expect("k checked by the caller");
            more |= capped;
            for m in matches {
                push(m.id, m.distance);
            }
        }
        // The recent additions are few (a merge is asked for past
        // RECENT_MAX): scanned whole.
        for &(entry, other) in &s.recent {
            let d = fp.distance(other);
            if d <= k {
                push(entry, d);
            }
        }
        more |= keep_nearest(&mut near, cap);
        let found = near.into_iter().map(|(d, id)| Found::at(d, id)).collect();
        (found, more)
    }

    /// Whether a document with this id is stored.
    pub fn contains(&self, id: &str) -> bool {
        self.state
            .read()
            .expect("collection lock")
            .ids
            .find(id)
            .is_some()
    }

    /// Applies committed writes: `Some(fp)` stores (replacing a document of the
    /// same id), `None` deletes.
    pub fn apply<'a>(&self, writes: impl IntoIterator<Item = (&'a str, Option<B>)>) {
        let mut s = self.state.write().expect("collection lock");
        s.applied += 1;
        for (id, fp) in writes {
            if let Some(old) = s.ids.remove(id) {
                s.tombstones.insert(old);
            }
            if let Some(fp) = fp {
                let entry = s.ids.push(id);
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
            documents: s.ids.count,
            main: s.main.len(),
            mid: s.mid.len(),
            recent: s.recent.len(),
            tombstones: s.tombstones.len(),
            index_bytes: s.main.memory()
                + s.mid.memory()
                + s.recent.len() * (8 + std::mem::size_of::<B>())
                + s.ids.memory(),
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
        let (design, generation, main, mid, recent, tombstones) = {
            let s = self.state.read().expect("collection lock");
            (
                s.design.clone(),
                s.generation,
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
            OnlineIndex::build(design.clone(), sources).expect("the design fits its width"),
        );
        let empty =
            Arc::new(OnlineIndex::build(design, std::iter::empty()).expect("an empty index"));
        let mut s = self.state.write().expect("collection lock");
        if s.generation != generation {
            // Every fingerprint was rewritten meanwhile: this merge is stale.
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Replacing one long id over and over keeps its bytes once, not once per
    /// replacement: the arena stays within a few megabytes, the spans grow by
    /// 16 bytes a write.
    #[test]
    fn replaced_ids_bytes_are_reclaimed() {
        let design = OnlineDesign::Tables(neardup_core::TableDesign::new(64, 3, &[5]).unwrap());
        let c: Collection<u64> = Collection::new(design, |_| Ok(()), 0).unwrap();
        let long = "x".repeat(1000);
        let other = "y".repeat(1000);
        for i in 0..20_000u64 {
            c.apply([(long.as_str(), Some(i)), (other.as_str(), Some(!i))]);
            if i % 5000 == 0 {
                c.merge_once();
            }
        }
        c.apply([(other.as_str(), None)]);
        let s = c.state.read().unwrap();
        assert_eq!(s.ids.count, 1);
        assert_eq!(s.ids.find(&long), Some(39_998));
        assert_eq!(s.ids.name(39_998), Some(long.as_str()));
        assert_eq!(s.ids.name(39_999), None);
        // 40,000 ids of 1,000 bytes were written: 40 MB without reclaiming.
        assert!(
            s.ids.bytes.capacity() <= 4 << 20,
            "arena of {} bytes",
            s.ids.bytes.capacity()
        );
        drop(s);
        let found = c.query(19_999, 0);
        assert_eq!(found.len(), 1);
        assert_eq!(&*found[0].id, long.as_str());
    }
}
