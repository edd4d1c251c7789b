//! The self-join (every pair within k in one set, each pair once) over the
//! permuted tables: fingerprints collapsed by value, then each table's
//! fingerprints grouped by its prefix and compared within groups, a pair
//! reported only by the first table in which the two share the prefix.
//! (A distributed runtime, which groups rows itself, uses
//! [`super::Pigeonhole`].)

use rayon::prelude::*;

use super::bits::Bits;
use super::design::{self, Table, TableDesign, reported_by};
use super::{mem, radix, table};
use crate::error::Error;

/// Fingerprints grouped by value: the distinct ones in ascending order, and the
/// documents holding each.
#[derive(Clone, Debug)]
pub struct Collapsed<B: Bits> {
    /// Distinct fingerprints, ascending.
    pub distinct: Vec<B>,
    /// Documents sorted by (fingerprint, document).
    pub order: Vec<u32>,
    /// `order[starts[g]..starts[g + 1]]` are the documents of `distinct[g]`, ascending.
    pub starts: Vec<u32>,
    /// The distinct index of each document.
    pub group_of: Vec<u32>,
}

/// Large buffers one stage of a self-join hands to the next, so that each does not
/// fault in fresh pages (the kernel zeroing them was a fifth of a 100-million join).
#[derive(Debug, Default)]
pub struct JoinScratch<B> {
    bufs: Vec<Vec<B>>,
}

impl<B: Bits> JoinScratch<B> {
    /// The largest of the buffers (empty if there are none).
    pub(crate) fn into_largest(self) -> Vec<B> {
        self.bufs
            .into_iter()
            .max_by_key(Vec::capacity)
            .unwrap_or_default()
    }
}

impl<B: Bits> Collapsed<B> {
    /// Groups `fps` (document i has `fps[i]`) by value: one parallel sort.
    pub fn new(fps: &[B]) -> Self {
        Self::with_scratch(fps).0
    }

    /// [`Collapsed::new`], and its sort's buffers for [`join_sorted_unique_with`].
    pub fn with_scratch(fps: &[B]) -> (Self, JoinScratch<B>) {
        Self::sorted(Self::pairs_of(fps), mem::with_huge_capacity(fps.len()))
    }

    /// [`Collapsed::with_scratch`] that takes the fingerprints' own allocation
    /// for the distinct list, rather than faulting in fresh memory for it.
    pub fn from_vec(mut fps: Vec<B>) -> (Self, JoinScratch<B>) {
        let pairs = Self::pairs_of(&fps);
        fps.clear();
        Self::sorted(pairs, fps)
    }

    /// (fingerprint, document) for every document.
    fn pairs_of(fps: &[B]) -> Vec<(B, u32)> {
        // Written in parallel, so that both cores fault in the fresh pages.
        let mut pairs: Vec<(B, u32)> = mem::with_huge_capacity(fps.len());
        pairs.par_extend(fps.par_iter().enumerate().map(|(i, &f)| (f, i as u32)));
        pairs
    }

    /// Sorts `pairs` and groups them, writing the distinct fingerprints into
    /// `distinct` (empty).
    fn sorted(mut pairs: Vec<(B, u32)>, mut distinct: Vec<B>) -> (Self, JoinScratch<B>) {
        let n = pairs.len();
        // Radix by the top bits, then the (small) groups of equal top bits.
        let d = table::dir_bits_for(pairs.len(), B::BITS).min(26);
        let mut tmp = Vec::new();
        radix::sort_by_top(&mut pairs, &mut tmp, d);
        let mut lo = 0;
        while lo < pairs.len() {
            let top = pairs[lo].0.top(d);
            let mut hi = lo + 1;
            while hi < pairs.len() && pairs[hi].0.top(d) == top {
                hi += 1;
            }
            if hi - lo > 1 {
                pairs[lo..hi].sort_unstable();
            }
            lo = hi;
        }
        debug_assert!(distinct.is_empty());
        // Fresh pages faulted in by both cores (see `mem::filled_huge`).
        let mut starts = mem::filled_huge(n + 1, 0u32);
        let mut group_of = mem::filled_huge(n, 0u32);
        let mut groups = 0;
        for (pos, &(f, doc)) in pairs.iter().enumerate() {
            if pos == 0 || pairs[pos - 1].0 != f {
                distinct.push(f);
                starts[groups] = pos as u32;
                groups += 1;
            }
            group_of[doc as usize] = groups as u32 - 1;
        }
        starts[groups] = n as u32;
        starts.truncate(groups + 1);
        let mut order = mem::with_huge_capacity(n);
        order.par_extend(pairs.par_iter().map(|&(_, d)| d));
        let collapsed = Collapsed {
            distinct,
            order,
            starts,
            group_of,
        };
        let scratch = JoinScratch {
            bufs: vec![mem::recycle(pairs), mem::recycle(tmp)],
        };
        (collapsed, scratch)
    }

    /// The documents of group `g`, ascending.
    pub fn members(&self, g: u32) -> &[u32] {
        &self.order[self.starts[g as usize] as usize..self.starts[g as usize + 1] as usize]
    }
}

/// Every pair `(i, j, distance)` with `i < j` and `fps[i]`, `fps[j]` within `k`,
/// each pair once, sorted. Identical fingerprints are collapsed first and their
/// pairs listed from the groups (see [`join_sorted_unique`]).
pub fn self_join<B: Bits>(
    fps: &[B],
    k: u32,
    design: &TableDesign,
) -> Result<Vec<(u32, u32, u32)>, Error> {
    let (c, scratch) = Collapsed::with_scratch(fps);
    let mut out = Vec::new();
    for g in 0..c.distinct.len() as u32 {
        let m = c.members(g);
        for (x, &a) in m.iter().enumerate() {
            for &b in &m[x + 1..] {
                out.push((a, b, 0));
            }
        }
    }
    for (u, v, d) in join_sorted_unique_with(&c.distinct, k, design, scratch)? {
        for &a in c.members(u) {
            for &b in c.members(v) {
                out.push((a.min(b), a.max(b), d));
            }
        }
    }
    out.par_sort_unstable();
    Ok(out)
}

/// Every pair `(i, j, distance)`, `i < j`, of `sorted` (distinct fingerprints in
/// ascending order) within `k`, each pair once, sorted.
///
/// Per table (tables in parallel): the permuted keys alone are radix-sorted by
/// their top bits (8 or 16 bytes per fingerprint, twice, while sorting), and each
/// group of equal top bits is compared pairwise. A pair is reported only by the
/// first table whose prefix it shares, checked in O(tables) per pair without any
/// set of pairs. Reported keys are un-permuted and found again in `sorted` by
/// binary search.
pub fn join_sorted_unique<B: Bits>(
    sorted: &[B],
    k: u32,
    design: &TableDesign,
) -> Result<Vec<(u32, u32, u32)>, Error> {
    join_sorted_unique_with(sorted, k, design, JoinScratch::default())
}

/// [`join_sorted_unique`], sorting in the buffers of `scratch` where they are
/// large enough.
pub fn join_sorted_unique_with<B: Bits>(
    sorted: &[B],
    k: u32,
    design: &TableDesign,
    scratch: JoinScratch<B>,
) -> Result<Vec<(u32, u32, u32)>, Error> {
    check_join(sorted, k, design)?;
    let first = design.first_table::<B>();
    // One chunk of tables per thread, each with its scratch reused from table to
    // table (`map_init` would make new scratch per split: fresh pages each time).
    let tables: Vec<(usize, &Table)> = design.tables.iter().enumerate().collect();
    let per_thread = tables.len().div_ceil(rayon::current_num_threads().max(1));
    let chunks: Vec<&[(usize, &Table)]> = tables.chunks(per_thread.max(1)).collect();
    let mut bufs = scratch.bufs;
    bufs.resize_with(chunks.len(), Vec::new);
    let n = sorted.len();
    // Pairs as positions (12 bytes each, not two fingerprints) from the start.
    let pair = located_pairs(sorted);
    let per_table: Vec<Vec<(u32, u32, u32)>> = chunks
        .into_par_iter()
        .zip(bufs)
        .flat_map_iter(|(chunk, mut buf)| {
            // Keys and radix scratch, n words each, reused from table to table.
            if buf.capacity() < 2 * n {
                buf = mem::with_huge_capacity(2 * n);
            }
            buf.clear();
            buf.resize(2 * n, B::zero());
            let (keys, tmp) = buf.split_at_mut(n);
            chunk
                .iter()
                .map(|&(ti, t)| {
                    let mut out = Vec::new();
                    join_table(sorted, t, first.of(ti), k, (keys, tmp), &pair, &mut out);
                    out
                })
                .collect::<Vec<_>>()
        })
        .collect();
    // Each table's pairs freed as soon as they are moved.
    let mut pairs = Vec::with_capacity(per_table.iter().map(Vec::len).sum());
    for table in per_table {
        pairs.extend(table);
    }
    pairs.par_sort_unstable();
    Ok(pairs)
}

/// Slices of whole buckets a table's keys are cut into: many more than
/// threads, so that threads take them as they come free (tables and
/// buckets differ in work; a round of one table per thread left a thread
/// idle for a fifth of a crowded join), and a fixed number, so that the
/// pairs come out in the same order with any number of threads.
const SLICES: usize = 256;
/// Slices joined at once: their pairs are what the join holds in memory.
const ROUND: usize = 16;

/// [`join_sorted_unique_with`] a table at a time, a round of slices at a
/// time: `sink` gets each slice's pairs once its round is joined (while the
/// threads join the next round), so that memory holds two rounds' pairs (a
/// sixteenth of a table's each), not all of them. A table's keys are sorted
/// (while the previous table is joined), then cut into `SLICES` (256) slices of
/// whole buckets that the threads join `ROUND` (16) at a time. Every pair
/// `(i, j, distance)`, `i < j`, reaches `sink` exactly once, in an order
/// fixed by the design (not by the thread count or timing).
pub fn join_sorted_unique_each<B: Bits>(
    sorted: &[B],
    k: u32,
    design: &TableDesign,
    scratch: JoinScratch<B>,
    sink: impl FnMut(Vec<(u32, u32, u32)>),
) -> Result<(), Error> {
    join_tables(sorted, k, design, scratch, &|_, _| true, sink)
}

/// [`join_sorted_unique_each`] without the pairs `keep` rules out
/// ([`SelfJoin::join_each_where`]).
pub(super) fn join_tables<B: Bits>(
    sorted: &[B],
    k: u32,
    design: &TableDesign,
    scratch: JoinScratch<B>,
    keep: &(impl Fn(u32, u32) -> bool + Sync),
    mut sink: impl FnMut(Vec<(u32, u32, u32)>),
) -> Result<(), Error> {
    check_join(sorted, k, design)?;
    let rule = design.first_table::<B>();
    let n = sorted.len();
    let pair = located_pairs(sorted);
    // Two buffers of keys and radix scratch: the next table is sorted in
    // one while the threads join the current one's buckets in the other.
    let mut bufs = scratch.bufs;
    bufs.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
    bufs.resize_with(2, Vec::new);
    bufs.truncate(2);
    for buf in &mut bufs {
        if buf.capacity() < 2 * n {
            *buf = mem::with_huge_capacity(2 * n);
        }
        buf.clear();
        buf.resize(2 * n, B::zero());
    }
    let [mut current, mut next]: [Vec<B>; 2] = bufs.try_into().expect("two buffers");
    let tables = &design.tables;
    let Some(first) = tables.first() else {
        return Ok(());
    };
    let mut top = {
        let (keys, tmp) = current.split_at_mut(n);
        sort_table(sorted, first, keys, tmp)
    };
    let mut pending: Vec<Vec<(u32, u32, u32)>> = Vec::new();
    for (ti, t) in tables.iter().enumerate() {
        let prefix = t.prefix_mask::<B>();
        let (keys, _) = current.split_at_mut(n);
        let mut next_top = None;
        // The sink need not be `Send`: the scope runs its body on this thread.
        rayon::in_place_scope(|scope| {
            if let Some(t) = tables.get(ti + 1) {
                let (next_top, next) = (&mut next_top, &mut next);
                scope.spawn(move |_| {
                    let (keys, tmp) = next.split_at_mut(n);
                    *next_top = Some(sort_table(sorted, t, keys, tmp));
                });
            }
            let mut slices = split_at_buckets(keys, &top, SLICES);
            for round in slices.chunks_mut(ROUND) {
                // The previous round's pairs go to the sink while the
                // threads join this one.
                let (top, pair, rule) = (&top, &pair, &rule);
                join_beside_sink(&mut pending, &mut sink, move || {
                    round
                        .par_iter_mut()
                        .map(|slice| {
                            let mut out = Vec::new();
                            join_buckets(slice, top, prefix, rule.of(ti), k, pair, &mut out);
                            out.retain(|&(i, j, _)| keep(i, j));
                            out
                        })
                        .collect()
                });
            }
        });
        if let Some(next_top) = next_top {
            top = next_top;
            std::mem::swap(&mut current, &mut next);
        }
    }
    pending.into_iter().for_each(&mut sink);
    Ok(())
}

/// Runs `join` (a round of the join, on the threads) while `sink` takes the
/// previous round's pairs, waiting in `pending`, on this thread; leaves the
/// new round's pairs in `pending`. What the sink does alone (a verifier's
/// union-find) then overlaps the join instead of leaving a core idle, and the
/// pairs reach it in the same order. The sink need not be `Send`: the scope
/// runs its body on this thread.
pub(super) fn join_beside_sink(
    pending: &mut Vec<Vec<(u32, u32, u32)>>,
    sink: &mut impl FnMut(Vec<(u32, u32, u32)>),
    join: impl FnOnce() -> Vec<Vec<(u32, u32, u32)>> + Send,
) {
    let mut pairs = Vec::new();
    rayon::in_place_scope(|scope| {
        let out = &mut pairs;
        scope.spawn(move |_| *out = join());
        std::mem::take(pending).into_iter().for_each(&mut *sink);
    });
    *pending = pairs;
}

/// A pair of fingerprints of `sorted` (distinct, ascending) as their
/// positions there, the smaller first, with its distance: a directory on the
/// top bits narrows each search to a few entries (two cache misses, not a
/// binary search's twenty-odd over gigabytes).
fn located_pairs<B: Bits>(sorted: &[B]) -> impl Fn(B, B, u32) -> (u32, u32, u32) + Sync + '_ {
    let dir_bits = table::dir_bits_for(sorted.len(), B::BITS);
    let dir = table::directory(sorted.iter().copied(), dir_bits);
    let position = move |f: B| {
        let b = f.top(dir_bits) as usize;
        let (from, to) = (dir[b] as usize, dir[b + 1] as usize);
        let i = from + sorted[from..to].partition_point(|&x| x < f);
        debug_assert_eq!(sorted[i], f, "a stored fingerprint");
        i as u32
    };
    move |a, b, d| {
        let (ia, ib) = (position(a), position(b));
        (ia.min(ib), ia.max(ib), d)
    }
}

fn check_join<B: Bits>(sorted: &[B], k: u32, design: &TableDesign) -> Result<(), Error> {
    check_join_of(sorted, k, design.bits, design.k)
}

/// A self-join's arguments against a design of width `bits` that finds up
/// to `max_k`.
pub(super) fn check_join_of<B: Bits>(
    sorted: &[B],
    k: u32,
    bits: u32,
    max_k: u32,
) -> Result<(), Error> {
    if bits != B::BITS {
        return Err(Error::WidthMismatch {
            expected: bits,
            got: B::BITS,
        });
    }
    if k > max_k {
        return Err(Error::KTooLarge { k, max: max_k });
    }
    debug_assert!(
        sorted.windows(2).all(|w| w[0] < w[1]),
        "input must be sorted and distinct"
    );
    Ok(())
}

/// One table's pairs, each made by `pair(a, b, distance)` (fingerprint
/// values) and pushed onto `out`.
/// `keys` and `tmp`, as long as `fps`, are scratch reused from table to table.
///
/// The fingerprints are grouped by the table's prefix but never permuted:
/// distances do not depend on the bit order, so only the few bits that pick
/// a bucket are gathered (at 128 bits and large k a design cuts 18 blocks,
/// and a whole permutation per fingerprint and table dominated the join).
fn join_table<B: Bits, P: Send>(
    fps: &[B],
    t: &Table,
    first: &[B],
    k: u32,
    (keys, tmp): (&mut [B], &mut [B]),
    pair: impl Fn(B, B, u32) -> P + Sync,
    out: &mut Vec<P>,
) {
    let top = sort_table(fps, t, keys, tmp);
    join_buckets(keys, &top, t.prefix_mask::<B>(), first, k, pair, out);
}

/// Sorts `fps` into `keys` by table `t`'s top prefix bits (a directory's
/// worth); returns what gives a key its bucket.
fn sort_table<B: Bits>(fps: &[B], t: &Table, keys: &mut [B], tmp: &mut [B]) -> BucketOf {
    let d = table::dir_bits_for(fps.len(), t.prefix_bits());
    let top = BucketOf(t.top_pieces(d));
    radix::sort_by_key_into(fps, |x| top.of(*x), keys, tmp, d);
    top
}

/// A key's bucket in a table: its top prefix bits.
struct BucketOf(Vec<(u32, u32)>);

impl BucketOf {
    fn of<B: Bits>(&self, x: B) -> u64 {
        design::top_of(&self.0, x)
    }
}

/// `keys` (sorted by bucket) cut into about `pieces` slices, each of whole
/// buckets, for threads to join apart.
fn split_at_buckets<'k, B: Bits>(
    mut keys: &'k mut [B],
    top: &BucketOf,
    pieces: usize,
) -> Vec<&'k mut [B]> {
    let target = keys.len().div_ceil(pieces.max(1)).max(1);
    let mut out = Vec::with_capacity(pieces + 1);
    while !keys.is_empty() {
        let mut end = target.min(keys.len());
        while end < keys.len() && top.of(keys[end]) == top.of(keys[end - 1]) {
            end += 1;
        }
        let (head, rest) = std::mem::take(&mut keys).split_at_mut(end);
        out.push(head);
        keys = rest;
    }
    out
}

/// The pairs of `keys` (whole buckets of one table, sorted by bucket), as
/// [`join_table`] gives them.
fn join_buckets<B: Bits, P: Send>(
    keys: &mut [B],
    top: &BucketOf,
    prefix: B,
    first: &[B],
    k: u32,
    pair: impl Fn(B, B, u32) -> P + Sync,
    out: &mut Vec<P>,
) {
    let top = |x: &B| top.of(*x);
    // Prefixes can be longer than 64 bits at f = 128: compare masked words.
    let same_prefix = |a: B, b: B| a.xor(b).and(prefix) == B::zero();
    let mut hits: Vec<u32> = Vec::new();
    let mut lo = 0;
    while lo < keys.len() {
        let bucket_top = top(&keys[lo]);
        let hi = lo
            + keys[lo..]
                .iter()
                .take_while(|x| top(x) == bucket_top)
                .count();
        let bucket = &mut keys[lo..hi];
        lo = hi;
        if bucket.len() < 2 {
            continue;
        }
        // Large buckets are sorted so that equal prefixes form runs; small ones
        // are compared whole, checking the prefix per pair.
        let small = bucket.len() <= 32;
        if !small {
            bucket.sort_unstable_by_key(|&x| x.and(prefix));
        }
        let mut run_start = 0;
        while run_start < bucket.len() {
            let run_end = if small {
                bucket.len()
            } else {
                let first = bucket[run_start];
                run_start
                    + bucket[run_start..]
                        .iter()
                        .take_while(|&&e| same_prefix(e, first))
                        .count()
            };
            let run = &bucket[run_start..run_end];
            run_start = run_end;
            let check_prefix = small.then_some(prefix);
            if run.len() < PARALLEL_RUN {
                for x in 0..run.len() {
                    compare_one(run, x, k, check_prefix, first, &mut hits, &mut |a, b, d| {
                        out.push(pair(a, b, d))
                    });
                }
                continue;
            }
            // A crowded run (thousands of fingerprints sharing the prefix)
            // can be most of a table's work: its rows are shared among the
            // threads, and their pairs emitted in order.
            let rows: Vec<Vec<P>> = (0..run.len())
                .into_par_iter()
                .with_min_len(64)
                .fold(
                    || (Vec::new(), Vec::new()),
                    |(mut rows, mut hits), x| {
                        compare_one(run, x, k, check_prefix, first, &mut hits, &mut |a, b, d| {
                            rows.push(pair(a, b, d))
                        });
                        (rows, hits)
                    },
                )
                .map(|(rows, _)| rows)
                .collect();
            rows.into_iter().for_each(|mut rows| out.append(&mut rows));
        }
    }
}

/// Runs at least this long are compared by all threads.
const PARALLEL_RUN: usize = 2048;

/// The pairs of `run[x]` with the fingerprints after it, within `k`, that
/// this table reports (`first`, and, where the run was not sorted by
/// prefix, sharing `check_prefix`).
#[inline]
fn compare_one<B: Bits>(
    run: &[B],
    x: usize,
    k: u32,
    check_prefix: Option<B>,
    first: &[B],
    hits: &mut Vec<u32>,
    emit: &mut impl FnMut(B, B, u32),
) {
    let a = run[x];
    hits.clear();
    a.within(&run[x + 1..], k, hits);
    for &i in hits.iter() {
        let b = run[x + 1 + i as usize];
        let diff = a.xor(b);
        if check_prefix.is_some_and(|p| diff.and(p) != B::zero()) {
            continue;
        }
        if !reported_by(first, diff) {
            continue; // an earlier table reports it
        }
        emit(a, b, diff.distance(B::zero()));
    }
}
