//! Batch deduplication: near-duplicate pairs, clusters, and which documents to keep.
//!
//! Identical fingerprints are collapsed first, so a million copies of one page
//! (the "big bucket") cost one entry in the join and work linear in the output.

use rayon::prelude::*;

use crate::error::Error;
use crate::index::{Bits, TableDesign, self_join};

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

/// The result of a self-join of documents' fingerprints.
#[derive(Debug)]
pub struct Dedup {
    /// Distinct index of each document.
    group: Vec<u32>,
    /// Documents of each distinct fingerprint, in input order.
    members: Vec<Vec<u32>>,
    /// Pairs of distinct fingerprints within k: `(u, v, distance)`, u < v.
    distinct_pairs: Vec<(u32, u32, u32)>,
}

impl Dedup {
    /// Joins `fps` (document i has `fps[i]`) at distance `k` with `design`.
    pub fn new<B: Bits>(fps: &[B], k: u32, design: &TableDesign) -> Result<Dedup, Error> {
        if fps.len() >= u32::MAX as usize {
            return Err(Error::InvalidConfig(
                "more than 4,294,967,294 documents in one run: split the input".into(),
            ));
        }
        // Collapse identical fingerprints, distinct ones numbered by first occurrence.
        let mut order: Vec<u32> = (0..fps.len() as u32).collect();
        order.par_sort_unstable_by_key(|&i| (fps[i as usize], i));
        let mut group = vec![0u32; fps.len()];
        let mut firsts: Vec<u32> = Vec::new(); // first document of each run, in fp order
        let mut run_of = vec![0u32; fps.len()];
        for (pos, &i) in order.iter().enumerate() {
            if pos == 0 || fps[order[pos - 1] as usize] != fps[i as usize] {
                firsts.push(i);
            }
            run_of[i as usize] = firsts.len() as u32 - 1;
        }
        // Renumber runs by first occurrence in input order.
        let mut by_first: Vec<u32> = (0..firsts.len() as u32).collect();
        by_first.sort_unstable_by_key(|&r| firsts[r as usize]);
        let mut renumber = vec![0u32; firsts.len()];
        for (new, &r) in by_first.iter().enumerate() {
            renumber[r as usize] = new as u32;
        }
        let mut members: Vec<Vec<u32>> = vec![Vec::new(); firsts.len()];
        for i in 0..fps.len() {
            let g = renumber[run_of[i] as usize];
            group[i] = g;
            members[g as usize].push(i as u32);
        }
        let distinct: Vec<B> = members.iter().map(|m| fps[m[0] as usize]).collect();
        let distinct_pairs = self_join(&distinct, k, design)?;
        Ok(Dedup {
            group,
            members,
            distinct_pairs,
        })
    }

    /// Documents.
    pub fn documents(&self) -> usize {
        self.group.len()
    }

    /// Distinct fingerprints.
    pub fn distinct(&self) -> usize {
        self.members.len()
    }

    /// Document pairs within k (identical fingerprints included), counted without
    /// listing them.
    pub fn pair_count(&self) -> u64 {
        let within: u64 = self
            .members
            .iter()
            .map(|m| (m.len() as u64) * (m.len() as u64 - 1) / 2)
            .sum();
        let across: u64 = self
            .distinct_pairs
            .iter()
            .map(|&(u, v, _)| {
                self.members[u as usize].len() as u64 * self.members[v as usize].len() as u64
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
        for m in &self.members {
            for (x, &a) in m.iter().enumerate() {
                for &b in &m[x + 1..] {
                    f(a, b, 0)?;
                }
            }
        }
        for &(u, v, d) in &self.distinct_pairs {
            for &a in &self.members[u as usize] {
                for &b in &self.members[v as usize] {
                    f(a.min(b), a.max(b), d)?;
                }
            }
        }
        Ok(())
    }

    /// For each document, the document representing its cluster (itself if kept).
    pub fn representatives(&self, policy: Policy) -> Vec<u32> {
        match policy {
            Policy::Components => self.components(),
            Policy::Incremental => self.incremental(),
        }
    }

    fn components(&self) -> Vec<u32> {
        let n = self.members.len();
        let mut parent: Vec<u32> = (0..n as u32).collect();
        fn find(parent: &mut [u32], mut x: u32) -> u32 {
            while parent[x as usize] != x {
                let p = parent[x as usize];
                parent[x as usize] = parent[p as usize];
                x = p;
            }
            x
        }
        for &(u, v, _) in &self.distinct_pairs {
            let (a, b) = (find(&mut parent, u), find(&mut parent, v));
            if a != b {
                // The root is the smaller distinct index: the earlier first document.
                let (lo, hi) = (a.min(b), a.max(b));
                parent[hi as usize] = lo;
            }
        }
        self.group
            .iter()
            .map(|&g| {
                let root = find(&mut parent, g);
                self.members[root as usize][0]
            })
            .collect()
    }

    fn incremental(&self) -> Vec<u32> {
        let n = self.members.len();
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
        // The first kept document of each distinct fingerprint, if any.
        let mut kept: Vec<u32> = vec![u32::MAX; n];
        let mut rep = vec![0u32; self.group.len()];
        for (doc, &g) in self.group.iter().enumerate() {
            let neighbours = &adj[degree[g as usize] as usize..degree[g as usize + 1] as usize];
            let best = std::iter::once(g)
                .chain(neighbours.iter().copied())
                .map(|u| kept[u as usize])
                .min()
                .unwrap_or(u32::MAX);
            if best == u32::MAX {
                kept[g as usize] = doc as u32;
                rep[doc] = doc as u32;
            } else {
                rep[doc] = best;
            }
        }
        rep
    }
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
