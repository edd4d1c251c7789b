//! Batch deduplication: near-duplicate pairs, clusters, and which documents to keep.
//!
//! Identical fingerprints are collapsed first, so a million copies of one page
//! (the "big bucket") cost one entry in the join and work linear in the output.

use crate::error::Error;
use crate::index::{Bits, Collapsed, JoinScratch, SelfJoin};

/// Documents are numbered with u32, one value kept free.
fn check_documents(n: usize) -> Result<(), Error> {
    if n >= u32::MAX as usize {
        return Err(Error::InvalidConfig(
            "more than 4,294,967,294 documents in one run: split the input".into(),
        ));
    }
    Ok(())
}

/// Calls `f(a, b, distance)` for every document pair of `fps` within `k`
/// (a < b), as [`Dedup::for_each_pair`] lists them (pairs of identical
/// fingerprints first, then the others), joining a table at a time:
/// the candidate pairs are never all in memory, only one table's. For callers
/// that keep few of the pairs (screening them as they come).
pub fn for_each_pair_streamed<B: Bits>(
    fps: Vec<B>,
    k: u32,
    design: &impl SelfJoin,
    mut f: impl FnMut(u32, u32, u32),
) -> Result<(), Error> {
    check_documents(fps.len())?;
    let (c, scratch) = Collapsed::from_vec(fps);
    let (groups, distinct) = Groups::split(c);
    for g in 0..groups.len() as u32 {
        let m = groups.members(g);
        for (x, &a) in m.iter().enumerate() {
            for &b in &m[x + 1..] {
                f(a, b, 0);
            }
        }
    }
    design.join_each(&distinct, k, scratch, |round| {
        for (u, v, d) in round {
            for &a in groups.members(u) {
                for &b in groups.members(v) {
                    f(a.min(b), a.max(b), d);
                }
            }
        }
    })
}

/// How near-duplicates are resolved into kept and dropped documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Clusters are the connected components of the pair graph; each keeps its
    /// first document. Chains (a~b~c with a, c far apart) join one cluster.
    Components,
    /// In input order, keep a document unless it is within k of one already
    /// kept; clusters never chain.
    Incremental,
}

/// The default candidate distance of a dedup: with verification wide enough
/// that nearly every pair at Jaccard 0.8 is a candidate, without it the
/// paper's choice (docs/quality.md). The CLI, Python and Spark all use this.
pub fn default_k(width: crate::Width, verify: bool) -> u32 {
    match (width, verify) {
        (crate::Width::W64, true) => 7,
        (crate::Width::W128, true) => 15,
        (crate::Width::W64, false) => 3,
        (crate::Width::W128, false) => 6,
    }
}

/// The default candidate distance of a verified dedup whose fingerprints are
/// centred on the corpus ([`crate::centre`]): centring spreads unrelated
/// documents and moves near duplicates a little further apart too, so k
/// is wider than [`default_k`]'s for the same recall (docs/quality.md).
pub fn centred_k(width: crate::Width) -> u32 {
    match width {
        crate::Width::W64 => 10,
        crate::Width::W128 => 19,
    }
}

/// The result of a self-join of documents' fingerprints.
#[derive(Debug)]
pub struct Dedup {
    /// Documents grouped by identical fingerprint (the values are not kept).
    groups: Groups,
    /// Pairs of distinct fingerprints within k: `(u, v, distance)`, u < v.
    distinct_pairs: Vec<(u32, u32, u32)>,
    /// After [`Dedup::verify`] or [`Dedup::verify_by`]: each pair's similarity.
    scores: Option<Vec<f64>>,
}

#[derive(Debug)]
struct Groups {
    order: Vec<u32>,
    starts: Vec<u32>,
    group_of: Vec<u32>,
}

impl Groups {
    /// The documents of each distinct fingerprint, and the distinct
    /// fingerprints themselves.
    fn split<B: Bits>(c: Collapsed<B>) -> (Groups, Vec<B>) {
        let groups = Groups {
            order: c.order,
            starts: c.starts,
            group_of: c.group_of,
        };
        (groups, c.distinct)
    }

    fn members(&self, g: u32) -> &[u32] {
        &self.order[self.starts[g as usize] as usize..self.starts[g as usize + 1] as usize]
    }
    fn len(&self) -> usize {
        self.starts.len() - 1
    }
    /// The first document (in input order) of group `g`.
    fn first(&self, g: u32) -> u32 {
        self.order[self.starts[g as usize] as usize]
    }
}

impl Dedup {
    /// Joins `fps` (document i has `fps[i]`) at distance `k` with `design`.
    pub fn new<B: Bits>(fps: &[B], k: u32, design: &impl SelfJoin) -> Result<Dedup, Error> {
        check_documents(fps.len())?;
        Self::joined(Collapsed::with_scratch(fps), k, design)
    }

    /// [`Dedup::new`] that reuses the fingerprints' allocation (a large run's
    /// fingerprints are not needed after the first sort).
    pub fn from_vec<B: Bits>(fps: Vec<B>, k: u32, design: &impl SelfJoin) -> Result<Dedup, Error> {
        check_documents(fps.len())?;
        Self::joined(Collapsed::from_vec(fps), k, design)
    }

    fn joined<B: Bits>(
        (c, scratch): (Collapsed<B>, JoinScratch<B>),
        k: u32,
        design: &impl SelfJoin,
    ) -> Result<Dedup, Error> {
        let distinct_pairs = design.join_all(&c.distinct, k, scratch)?;
        Ok(Dedup {
            groups: Groups::split(c).0,
            distinct_pairs,
            scores: None,
        })
    }

    /// Keeps only the pairs whose documents' sets (`set(doc)`: sorted, distinct
    /// features, as [`crate::jaccard::narrow`] makes) have Jaccard
    /// similarity at least `threshold`.
    ///
    /// Documents with the same fingerprint and the same set are identical for
    /// this purpose and stay collapsed, so a million copies of a page cost one
    /// comparison per neighbouring set, not half a trillion.
    ///
    /// A document without features (empty, or only spaces and punctuation) is
    /// similar to nothing: it is never paired, not even with another such one.
    pub fn verify<'s>(
        self,
        threshold: f64,
        set: impl Fn(u32) -> &'s [crate::jaccard::SetFeature] + Sync,
    ) -> Dedup {
        self.verify_by(
            threshold,
            |doc| {
                let s = set(doc);
                (!s.is_empty()).then(|| crate::spill::set_digest(s))
            },
            |a, b| crate::jaccard::jaccard_at_least(set(a), set(b), threshold),
        )
    }

    /// Keeps only the pairs whose similarity `score(a, b)` is at least
    /// `threshold`. `digest(doc)` must be equal for documents that score 1
    /// against each other and against everything alike (their content's hash):
    /// documents of one fingerprint and one digest stay collapsed and are scored
    /// once. `None` marks a document with nothing to compare (an empty text):
    /// it is paired with nothing, without a call to `score`. Called only for
    /// the documents [`Dedup::candidate_documents`] lists.
    pub fn verify_by(
        self,
        threshold: f64,
        digest: impl Fn(u32) -> Option<u128>,
        score: impl PairScore,
    ) -> Dedup {
        self.verify_with(threshold, digest, score, false)
    }

    /// [`Dedup::verify_by`] for when only the connected components are wanted
    /// ([`Policy::Components`], clusters, kept documents): a candidate pair
    /// whose documents are already connected by verified pairs is not scored.
    /// The components, hence [`Dedup::representatives`] with
    /// [`Policy::Components`], are those of full verification; the pairs kept
    /// are a spanning subset of the verified pairs (a heavy cluster of m
    /// distinct documents costs about m scores instead of m²/2), so
    /// [`Policy::Incremental`] and pair listings need [`Dedup::verify_by`].
    pub fn verify_spanning_by(
        self,
        threshold: f64,
        digest: impl Fn(u32) -> Option<u128>,
        score: impl PairScore,
    ) -> Dedup {
        self.verify_with(threshold, digest, score, true)
    }

    fn verify_with(
        self,
        threshold: f64,
        digest: impl Fn(u32) -> Option<u128>,
        score: impl PairScore,
        spanning: bool,
    ) -> Dedup {
        let nodes = Nodes::split(&self.groups, digest);
        let mut verifier = Verifier::new(&nodes, threshold, &score, spanning);
        verifier.within_nodes();
        verifier.across(&self.distinct_pairs);
        drop(self.distinct_pairs);
        let kept = verifier.finish();
        Dedup::of_nodes(nodes, kept)
    }

    /// Joins `fps` (document i has `fps[i]`) at distance `k` with `design` and
    /// verifies the candidates as [`Dedup::verify_by`] (or, if `spanning`,
    /// [`Dedup::verify_spanning_by`]) does, a table at a time: the
    /// candidate pairs are never all in memory, only those of one table and
    /// the verified ones (a spanning set of them, if `spanning`). The same
    /// pairs and components as joining and verifying one after the other.
    #[allow(clippy::too_many_arguments)]
    pub fn verified<B: Bits>(
        fps: Vec<B>,
        k: u32,
        design: &impl SelfJoin,
        threshold: f64,
        digest: impl Fn(u32) -> Option<u128>,
        score: impl PairScore,
        spanning: bool,
    ) -> Result<Dedup, Error> {
        check_documents(fps.len())?;
        let (c, scratch) = Collapsed::from_vec(fps);
        let (groups, distinct) = Groups::split(c);
        let nodes = Nodes::split(&groups, digest);
        drop(groups);
        let mut verifier = Verifier::new(&nodes, threshold, &score, spanning);
        verifier.within_nodes();
        // Pairs whose sizes rule them out never leave the join's threads.
        let sizes = group_sizes(&nodes, &score);
        let keep = |i: u32, j: u32| {
            sizes
                .as_ref()
                .is_none_or(|s| sizes_may_reach(s[i as usize], s[j as usize], threshold))
        };
        let sink = |pairs: Vec<(u32, u32, u32)>| verifier.across(&pairs);
        design.join_each_where(&distinct, k, scratch, &keep, sink)?;
        let kept = verifier.finish();
        Ok(Dedup::of_nodes(nodes, kept))
    }

    /// The documents verification reads, in input order: every member of a
    /// fingerprint shared by several documents or within k of another.
    pub fn candidate_documents(&self) -> Vec<u32> {
        let mut wanted: Vec<bool> = (0..self.groups.len() as u32)
            .map(|g| self.groups.members(g).len() > 1)
            .collect();
        for &(u, v, _) in &self.distinct_pairs {
            wanted[u as usize] = true;
            wanted[v as usize] = true;
        }
        (0..self.documents() as u32)
            .filter(|&d| wanted[self.groups.group_of[d as usize] as usize])
            .collect()
    }

    /// Documents.
    pub fn documents(&self) -> usize {
        self.groups.group_of.len()
    }

    /// Distinct fingerprints.
    pub fn distinct(&self) -> usize {
        self.groups.len()
    }

    /// Document pairs within k (identical fingerprints included), counted without
    /// listing them.
    pub fn pair_count(&self) -> u64 {
        let within: u64 = (0..self.groups.len() as u32)
            .map(|g| {
                let m = self.groups.members(g).len() as u64;
                m * (m - 1) / 2
            })
            .sum();
        let across: u64 = self
            .distinct_pairs
            .iter()
            .map(|&(u, v, _)| {
                self.groups.members(u).len() as u64 * self.groups.members(v).len() as u64
            })
            .sum();
        within + across
    }

    /// Calls `f(a, b, distance)` for every document pair within k, a < b: pairs of
    /// identical fingerprints first, then the others by distinct pair.
    pub fn for_each_pair<E>(
        &self,
        mut f: impl FnMut(u32, u32, u32) -> Result<(), E>,
    ) -> Result<(), E> {
        self.for_each_scored_pair(|a, b, d, _| f(a, b, d))
    }

    /// As [`Dedup::for_each_pair`], with each pair's similarity after
    /// [`Dedup::verify`] or [`Dedup::verify_by`] (1.0 for documents of one
    /// digest), else `None`.
    pub fn for_each_scored_pair<E>(
        &self,
        mut f: impl FnMut(u32, u32, u32, Option<f64>) -> Result<(), E>,
    ) -> Result<(), E> {
        let same = self.scores.as_ref().map(|_| 1.0);
        for g in 0..self.groups.len() as u32 {
            let m = self.groups.members(g);
            for (x, &a) in m.iter().enumerate() {
                for &b in &m[x + 1..] {
                    f(a, b, 0, same)?;
                }
            }
        }
        for (i, &(u, v, d)) in self.distinct_pairs.iter().enumerate() {
            let j = self.scores.as_ref().map(|js| js[i]);
            for &a in self.groups.members(u) {
                for &b in self.groups.members(v) {
                    f(a.min(b), a.max(b), d, j)?;
                }
            }
        }
        Ok(())
    }

    /// For each document, the document representing its cluster (itself if
    /// kept); the first document in input order is preferred.
    pub fn representatives(&self, policy: Policy) -> Vec<u32> {
        match policy {
            Policy::Components => self.components(None),
            Policy::Incremental => self.incremental(None),
        }
    }

    /// [`Dedup::representatives`] preferring documents in the order of
    /// `preference` (every document once, the one to keep first): a component
    /// keeps its most preferred member; the incremental policy considers the
    /// documents in this order.
    pub fn representatives_by(&self, policy: Policy, preference: &[u32]) -> Vec<u32> {
        assert_eq!(preference.len(), self.documents(), "one place per document");
        let mut rank = vec![0u32; preference.len()];
        for (r, &doc) in preference.iter().enumerate() {
            rank[doc as usize] = r as u32;
        }
        match policy {
            Policy::Components => self.components(Some(&rank)),
            Policy::Incremental => self.incremental(Some((&rank, preference))),
        }
    }

    fn components(&self, rank: Option<&[u32]>) -> Vec<u32> {
        let n = self.groups.len();
        let r = |doc: u32| rank.map_or(doc, |r| r[doc as usize]);
        // Each group's preferred member (its first, in input order, by default).
        let best = |g: u32| -> u32 {
            match rank {
                None => self.groups.first(g),
                Some(_) => *self
                    .groups
                    .members(g)
                    .iter()
                    .min_by_key(|&&d| r(d))
                    .expect("groups are not empty"),
            }
        };
        let mut parent: Vec<u32> = (0..n as u32).collect();
        // The root of each set is its group with the preferred member.
        for &(u, v, _) in &self.distinct_pairs {
            let (a, b) = (find(&mut parent, u), find(&mut parent, v));
            if a != b {
                let (keep, join) = if r(best(a)) < r(best(b)) {
                    (a, b)
                } else {
                    (b, a)
                };
                parent[join as usize] = keep;
            }
        }
        // Group by group, so that the reads are sequential (most groups are their
        // own root); only the writes land at random.
        let mut rep = crate::index::mem::with_huge_capacity(self.documents());
        rep.resize(self.documents(), 0u32);
        for g in 0..n as u32 {
            let root = find(&mut parent, g);
            let kept = best(root);
            for &doc in self.groups.members(g) {
                rep[doc as usize] = kept;
            }
        }
        rep
    }

    /// `order`: each document's rank and the documents by rank.
    fn incremental(&self, order: Option<(&[u32], &[u32])>) -> Vec<u32> {
        let n = self.groups.len();
        // Adjacency of distinct fingerprints (compressed rows).
        let mut degree = vec![0u32; n + 1];
        for &(u, v, _) in &self.distinct_pairs {
            degree[u as usize + 1] += 1;
            degree[v as usize + 1] += 1;
        }
        for i in 0..n {
            degree[i + 1] += degree[i];
        }
        let mut fill = degree[..n].to_vec();
        let mut adj = vec![0u32; degree[n] as usize];
        for &(u, v, _) in &self.distinct_pairs {
            adj[fill[u as usize] as usize] = v;
            fill[u as usize] += 1;
            adj[fill[v as usize] as usize] = u;
            fill[v as usize] += 1;
        }
        // The rank of the first kept document of each distinct fingerprint, if any.
        let mut kept: Vec<u32> = vec![u32::MAX; n];
        let mut rep = vec![0u32; self.documents()];
        let docs = self.documents() as u32;
        for r in 0..docs {
            let doc = order.map_or(r, |(_, by_rank)| by_rank[r as usize]);
            let g = self.groups.group_of[doc as usize];
            let neighbours = &adj[degree[g as usize] as usize..degree[g as usize + 1] as usize];
            let best = std::iter::once(g)
                .chain(neighbours.iter().copied())
                .map(|u| kept[u as usize])
                .min()
                .unwrap_or(u32::MAX);
            if best == u32::MAX {
                kept[g as usize] = r;
                rep[doc as usize] = doc;
            } else {
                rep[doc as usize] = order.map_or(best, |(_, by_rank)| by_rank[best as usize]);
            }
        }
        rep
    }
}

/// Fingerprint groups split into nodes of documents with identical sets (one
/// digest): the units verification compares.
struct Nodes {
    /// The nodes' members, as groups.
    groups: Groups,
    /// `group_nodes[g]..group_nodes[g + 1]`: the nodes of fingerprint group g.
    group_nodes: Vec<u32>,
    /// Nodes of documents with nothing to compare, paired with nothing.
    is_void: Vec<bool>,
    /// Each node's first document, the one scored for all (one look-up
    /// where a candidate pair costs a few).
    first: Vec<u32>,
}

impl Nodes {
    fn split(groups: &Groups, digest: impl Fn(u32) -> Option<u128>) -> Nodes {
        let n_groups = groups.len();
        let mut node_of_doc = vec![0u32; groups.group_of.len()];
        let mut group_nodes: Vec<u32> = Vec::with_capacity(n_groups + 1);
        let mut next = 0u32;
        let mut void: Vec<u32> = Vec::new();
        let mut keyed: Vec<(Option<u128>, u32)> = Vec::new();
        for g in 0..n_groups as u32 {
            group_nodes.push(next);
            let m = groups.members(g);
            keyed.clear();
            keyed.extend(
                m.iter()
                    .map(|&d| (if m.len() > 1 { digest(d) } else { Some(0) }, d)),
            );
            keyed.sort_unstable();
            for (i, &(h, d)) in keyed.iter().enumerate() {
                if i > 0 && (h.is_none() || keyed[i - 1].0 != h) {
                    next += 1;
                }
                if h.is_none() {
                    void.push(next);
                }
                node_of_doc[d as usize] = next;
            }
            next += 1;
        }
        group_nodes.push(next);
        let n_nodes = next as usize;
        let mut is_void = vec![false; n_nodes];
        for &v in &void {
            is_void[v as usize] = true;
        }
        // Members of each node, in input order.
        let mut starts = vec![0u32; n_nodes + 1];
        for &node in &node_of_doc {
            starts[node as usize + 1] += 1;
        }
        for i in 0..n_nodes {
            starts[i + 1] += starts[i];
        }
        let mut fill = starts[..n_nodes].to_vec();
        let mut order = vec![0u32; node_of_doc.len()];
        for (doc, &node) in node_of_doc.iter().enumerate() {
            order[fill[node as usize] as usize] = doc as u32;
            fill[node as usize] += 1;
        }
        let first = starts[..n_nodes]
            .iter()
            .map(|&s| order[s as usize])
            .collect();
        Nodes {
            groups: Groups {
                order,
                starts,
                group_of: node_of_doc,
            },
            group_nodes,
            is_void,
            first,
        }
    }

    /// The nodes of fingerprint group `g` with something to compare.
    fn live(&self, g: u32) -> impl Iterator<Item = u32> + '_ {
        (self.group_nodes[g as usize]..self.group_nodes[g as usize + 1])
            .filter(|&u| !self.is_void[u as usize])
    }
}

/// How verification scores a candidate pair of documents: any
/// `Fn(a, b) -> similarity` does, and a score that reads its documents'
/// data from memory scattered over the corpus can also be told which
/// document comes next.
pub trait PairScore: Sync {
    /// The similarity of documents `a` and `b` (see [`Dedup::verify_by`]).
    fn score(&self, a: u32, b: u32) -> f64;

    /// Document `doc` will be scored soon: a hint to start loading what
    /// [`PairScore::score`] reads of it. Does nothing unless implemented.
    fn prefetch(&self, _doc: u32) {}

    /// The size of document `doc`'s feature set, where the score is the
    /// Jaccard similarity of such sets (no more than the smaller size over
    /// the larger), so that the join screens candidates by size as it finds
    /// them. `None` (the default): no screen.
    fn size(&self, _doc: u32) -> Option<u32> {
        None
    }
}

/// Each fingerprint group's least and greatest feature-set size over its
/// live nodes (`(u32::MAX, 0)` for a group without any), if `score` has
/// sizes.
fn group_sizes(nodes: &Nodes, score: &impl PairScore) -> Option<Vec<(u32, u32)>> {
    use rayon::prelude::*;
    let groups = nodes.group_nodes.len() - 1;
    (0..groups as u32)
        .into_par_iter()
        .with_min_len(1 << 12)
        .map(|g| {
            nodes.live(g).try_fold((u32::MAX, 0), |(lo, hi), u| {
                let size = score.size(nodes.first[u as usize])?;
                Some((lo.min(size), hi.max(size)))
            })
        })
        .collect()
}

/// Whether some pair of nodes of two groups of these sizes (see
/// [`group_sizes`]) can score `threshold` or more: the least set of one
/// over the greatest of the other, where the sizes do not overlap, as the
/// score's own bound computes it for that pair (any other pair's is no
/// greater).
fn sizes_may_reach((lo_a, hi_a): (u32, u32), (lo_b, hi_b): (u32, u32), threshold: f64) -> bool {
    if lo_a > hi_a || lo_b > hi_b {
        return false;
    }
    let (small, large) = if hi_a < lo_b {
        (hi_a, lo_b)
    } else if hi_b < lo_a {
        (hi_b, lo_a)
    } else {
        return true;
    };
    f64::from(small) / f64::from(large) >= threshold
}

impl<F: Fn(u32, u32) -> f64 + Sync> PairScore for F {
    fn score(&self, a: u32, b: u32) -> f64 {
        self(a, b)
    }
}

/// Scores candidate node pairs in stretches, keeping those at the threshold.
struct Verifier<'a, S> {
    nodes: &'a Nodes,
    threshold: f64,
    score: &'a S,
    /// With a spanning set: the union-find forest of the verified pairs.
    parent: Option<Vec<u32>>,
    /// With a spanning set: a pass's forest of the clusters it would join
    /// (see [`Verifier::flush`]), the identity between passes.
    forest: Vec<u32>,
    /// With a spanning set: one bit per node, set while the pass's forest
    /// joins it under another (cleared with its entry at the pass's end).
    joined: Vec<u64>,
    /// Candidates not yet scored.
    todo: Vec<(u32, u32, u32)>,
    kept: Vec<(u32, u32, u32, f64)>,
}

impl<'a, S: PairScore> Verifier<'a, S> {
    const STRETCH: usize = 1 << 14;

    fn new(nodes: &'a Nodes, threshold: f64, score: &'a S, spanning: bool) -> Self {
        Verifier {
            nodes,
            threshold,
            score,
            parent: spanning.then(|| (0..nodes.is_void.len() as u32).collect()),
            forest: match spanning {
                true => (0..nodes.is_void.len() as u32).collect(),
                false => Vec::new(),
            },
            joined: match spanning {
                true => vec![0; nodes.is_void.len().div_ceil(64)],
                false => Vec::new(),
            },
            todo: Vec::with_capacity(Self::STRETCH),
            kept: Vec::new(),
        }
    }

    /// Candidates of one fingerprint: its nodes pairwise.
    fn within_nodes(&mut self) {
        let nodes = self.nodes;
        for g in 0..nodes.group_nodes.len() as u32 - 1 {
            for u in nodes.live(g) {
                for v in nodes.live(g).filter(|&v| v > u) {
                    self.push((u, v, 0));
                }
            }
        }
        self.flush();
    }

    /// Candidates of pairs of distinct fingerprints `(gu, gv, distance)`.
    fn across(&mut self, group_pairs: &[(u32, u32, u32)]) {
        use crate::index::table::prefetch;
        let nodes = self.nodes;
        // The groups' node ranges are asked for AHEAD pairs early, and the
        // first node's void mark half as early (once its number is there):
        // the look-ups of consecutive pairs, scattered over the corpus,
        // overlap instead of each waiting for memory.
        for (i, &(gu, gv, d)) in group_pairs.iter().enumerate() {
            if let Some(&(a, b, _)) = group_pairs.get(i + AHEAD) {
                prefetch(&nodes.group_nodes[a as usize]);
                prefetch(&nodes.group_nodes[b as usize]);
            }
            if let Some(&(a, b, _)) = group_pairs.get(i + AHEAD / 2) {
                prefetch(&nodes.is_void[nodes.group_nodes[a as usize] as usize]);
                prefetch(&nodes.is_void[nodes.group_nodes[b as usize] as usize]);
            }
            for u in nodes.live(gu) {
                for v in nodes.live(gv) {
                    self.push((u.min(v), u.max(v), d));
                }
            }
        }
        // Flushed a stretch at a time (and at the end), wherever the join's
        // rounds end: which pairs a spanning set skips depends on the
        // candidates' order alone, not on how the join hands them over.
    }

    fn push(&mut self, pair: (u32, u32, u32)) {
        self.todo.push(pair);
        if self.todo.len() >= Self::STRETCH {
            self.flush();
        }
    }

    /// Scores the waiting candidates in parallel and keeps the verified
    /// ones. With a spanning set, pairs already connected are skipped, and
    /// while most candidates verify, only pairs that would join two clusters
    /// are scored: a pass scores a spanning forest of the pairs still
    /// unconnected, as if every one of them verified, and the next takes
    /// the pairs its failures left apart. The m²/2 candidates of a cluster
    /// of m near copies sharing a bucket then cost about m scores, not
    /// m²/2. Once a pass finds most of its pairs below the threshold (near
    /// misses, which connect nothing), the rest are scored at once: more
    /// passes would score them all the same, a few at a time. Which pairs
    /// are scored depends on the candidates' order and scores alone, not on
    /// the threads.
    fn flush(&mut self) {
        let mut todo = std::mem::take(&mut self.todo);
        let Some(mut parent) = self.parent.take() else {
            let verified = self.score_all(&mut todo);
            self.kept.extend(verified);
            todo.clear();
            self.todo = todo;
            return;
        };
        let (mut now, mut later) = (Vec::new(), Vec::new());
        // Each pass's forest over the clusters' roots: the identity, but
        // where the pass joined two (`touched`, undone after the pass).
        let mut forest = std::mem::take(&mut self.forest);
        let mut touched = Vec::new();
        let mut by_forest = true;
        loop {
            if by_forest {
                for (i, &(u, v, d)) in todo.iter().enumerate() {
                    prefetch_pair(&parent, todo.get(i + AHEAD));
                    let (ru, rv) = (find(&mut parent, u), find(&mut parent, v));
                    if ru == rv {
                        continue;
                    }
                    // A root the pass has not joined is its own in the
                    // forest: one bit says so, without a look-up far away.
                    let in_forest = |x: u32| self.joined[x as usize / 64] >> (x % 64) & 1 == 1;
                    let a = if in_forest(ru) {
                        find(&mut forest, ru)
                    } else {
                        ru
                    };
                    let b = if in_forest(rv) {
                        find(&mut forest, rv)
                    } else {
                        rv
                    };
                    if a != b {
                        let (child, root) = (a.max(b), a.min(b));
                        forest[child as usize] = root;
                        self.joined[child as usize / 64] |= 1 << (child % 64);
                        touched.push(child);
                        now.push((u, v, d));
                    } else {
                        later.push((u, v, d));
                    }
                }
                for &t in &touched {
                    forest[t as usize] = t;
                    self.joined[t as usize / 64] = 0;
                }
                touched.clear();
            } else {
                for (i, &(u, v, d)) in todo.iter().enumerate() {
                    prefetch_pair(&parent, todo.get(i + AHEAD));
                    if find(&mut parent, u) != find(&mut parent, v) {
                        now.push((u, v, d));
                    }
                }
            }
            if now.is_empty() {
                break;
            }
            let verified = self.score_all(&mut now);
            by_forest = 2 * verified.len() >= now.len();
            now.clear();
            for &(u, v, ..) in &verified {
                let (a, b) = (find(&mut parent, u), find(&mut parent, v));
                if a != b {
                    parent[a.max(b) as usize] = a.min(b);
                }
            }
            self.kept.extend(verified);
            std::mem::swap(&mut todo, &mut later);
            later.clear();
        }
        todo.clear();
        self.parent = Some(parent);
        self.forest = forest;
        self.todo = todo;
    }

    /// The pairs of `pairs` that verify, scored in parallel.
    /// Sorted by first node: a thread scores a run of pairs with the same
    /// first node, whose features the score reads once for the run. (Which
    /// pairs verify, not their order, is what the callers use.)
    ///
    /// The second documents are scattered over the corpus: what the score
    /// reads of each is asked for `AHEAD` pairs early
    /// ([`PairScore::prefetch`]), so that its cache misses overlap.
    fn score_all(&self, pairs: &mut [(u32, u32, u32)]) -> Vec<(u32, u32, u32, f64)> {
        use rayon::prelude::*;
        /// Pairs between a prefetch and the score that reads it.
        const AHEAD: usize = 8;
        pairs.par_sort_unstable_by_key(|&(u, ..)| u);
        let first = |node: u32| self.nodes.first[node as usize];
        let (score, threshold) = (self.score, self.threshold);
        pairs
            .par_chunks(256)
            .flat_map_iter(|chunk| {
                for &(_, v, _) in chunk.iter().take(AHEAD) {
                    score.prefetch(first(v));
                }
                chunk.iter().enumerate().filter_map(move |(i, &(u, v, d))| {
                    if let Some(&(_, w, _)) = chunk.get(i + AHEAD) {
                        score.prefetch(first(w));
                    }
                    let j = score.score(first(u), first(v));
                    (j >= threshold).then_some((u, v, d, j))
                })
            })
            .collect()
    }

    /// The verified pairs `(u, v, distance, similarity)`, in ascending order.
    fn finish(mut self) -> Vec<(u32, u32, u32, f64)> {
        self.flush();
        let mut kept = self.kept;
        kept.sort_unstable_by_key(|&(u, v, ..)| (u, v));
        kept
    }
}

impl Dedup {
    /// The dedup of `nodes` and their verified pairs.
    fn of_nodes(nodes: Nodes, kept: Vec<(u32, u32, u32, f64)>) -> Dedup {
        Dedup {
            distinct_pairs: kept.iter().map(|&(u, v, d, _)| (u, v, d)).collect(),
            scores: Some(kept.iter().map(|&(.., j)| j).collect()),
            groups: nodes.groups,
        }
    }
}

/// Candidate pairs between a look-up's prefetch and the look-up.
const AHEAD: usize = 16;

/// Hints the CPU to fetch the union-find entries of `pair`'s nodes.
#[inline]
fn prefetch_pair(parent: &[u32], pair: Option<&(u32, u32, u32)>) {
    if let Some(&(u, v, _)) = pair {
        crate::index::table::prefetch(&parent[u as usize]);
        crate::index::table::prefetch(&parent[v as usize]);
    }
}

/// The root of `x` in a union-find forest, halving the path on the way.
fn find(parent: &mut [u32], mut x: u32) -> u32 {
    while parent[x as usize] != x {
        let p = parent[x as usize];
        parent[x as usize] = parent[p as usize];
        x = p;
    }
    x
}

/// [`Dedup::representatives_by`] from an explicit list of near-duplicate
/// pairs over documents `0..n` (every pair, identical fingerprints' too), for
/// when the pairs were found elsewhere (the Spark job collects them).
/// `preference` lists every document once, the one to keep first; `None` is
/// input order.
pub fn representatives_of_pairs(
    n: usize,
    pairs: &[(u32, u32)],
    policy: Policy,
    preference: Option<&[u32]>,
) -> Result<Vec<u32>, Error> {
    check_documents(n)?;
    if let Some(p) = preference {
        if p.len() != n {
            return Err(Error::InvalidConfig(format!(
                "a preference of {} documents for {n}",
                p.len()
            )));
        }
        let mut seen = vec![false; n];
        for &doc in p {
            if doc as usize >= n || std::mem::replace(&mut seen[doc as usize], true) {
                return Err(Error::InvalidConfig(
                    "a preference must list every document once".into(),
                ));
            }
        }
    }
    if let Some(&(a, b)) = pairs.iter().find(|&&(a, b)| a.max(b) as usize >= n) {
        return Err(Error::InvalidConfig(format!(
            "pair ({a}, {b}) names a document beyond the {n} given"
        )));
    }
    // Every document its own fingerprint group; the pairs join the groups.
    let dedup = Dedup {
        groups: Groups {
            order: (0..n as u32).collect(),
            starts: (0..=n as u32).collect(),
            group_of: (0..n as u32).collect(),
        },
        distinct_pairs: pairs
            .iter()
            .filter(|&&(a, b)| a != b)
            .map(|&(a, b)| (a.min(b), a.max(b), 0))
            .collect(),
        scores: None,
    };
    Ok(match preference {
        Some(p) => dedup.representatives_by(policy, p),
        None => dedup.representatives(policy),
    })
}

/// Clusters of two or more documents from representatives: `(representative,
/// members in input order)`, ordered by representative.
pub fn clusters(representatives: &[u32]) -> Vec<(u32, Vec<u32>)> {
    let mut by_rep: Vec<Vec<u32>> = vec![Vec::new(); representatives.len()];
    for (doc, &r) in representatives.iter().enumerate() {
        by_rep[r as usize].push(doc as u32);
    }
    by_rep
        .into_iter()
        .enumerate()
        .filter(|(_, m)| m.len() >= 2)
        .map(|(r, m)| (r as u32, m))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The size screen never rules out two groups with a pair of nodes
        /// whose sizes let them reach the threshold (brute force over the
        /// pairs, as the Jaccard score bounds them: 0 with an empty set),
        /// and for two single nodes of non-empty sets it is that bound.
        #[test]
        fn sizes_rule_out_only_pairs_that_cannot_reach(
            a in prop::collection::vec(0u32..40, 0..5),
            b in prop::collection::vec(0u32..40, 0..5),
            t in prop::sample::select(vec![0.0, 0.3, 0.5, 0.8, 0.95, 1.0]),
        ) {
            let range = |s: &[u32]| s.iter().fold((u32::MAX, 0), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            let bound = |x: u32, y: u32| {
                if x == 0 || y == 0 { 0.0 } else { f64::from(x.min(y)) / f64::from(x.max(y)) }
            };
            let reachable = a.iter().any(|&x| b.iter().any(|&y| bound(x, y) >= t));
            let screen = sizes_may_reach(range(&a), range(&b), t);
            prop_assert!(screen || !reachable);
            if a.len() == 1 && b.len() == 1 && a[0] > 0 && b[0] > 0 {
                prop_assert_eq!(screen, reachable);
            }
        }
    }
}
