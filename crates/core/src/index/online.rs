//! [`OnlineIndex`]: one type for an online index on either design the
//! online planner ([`super::plan_online`]) chooses: permuted tables
//! ([`Index`], for a small k) or multi-index blocks ([`MultiIndex`], for a
//! large k). Both answer every stored fingerprint within k exactly, each
//! once, nearest first, and take additions and deletions.

use super::bits::Bits;
use super::multi::MultiIndex;
use super::plan::OnlineDesign;
use super::{Index, Match};
use crate::error::Error;

/// An online index on permuted tables or on multi-index blocks.
#[derive(Clone, Debug)]
pub enum OnlineIndex<B: Bits> {
    /// Permuted tables.
    Tables(Index<B>),
    /// Multi-index blocks.
    Blocks(MultiIndex<B>),
}

/// `$body` with `$i` bound to the index, whatever its kind.
macro_rules! each {
    ($index:expr, $i:ident => $body:expr) => {
        match $index {
            OnlineIndex::Tables($i) => $body,
            OnlineIndex::Blocks($i) => $body,
        }
    };
}

impl<B: Bits> OnlineIndex<B> {
    /// The index of `design` over `(id, fingerprint)` entries.
    pub fn build(
        design: OnlineDesign,
        entries: impl IntoIterator<Item = (u64, B)>,
    ) -> Result<Self, Error> {
        Ok(match design {
            OnlineDesign::Tables(d) => OnlineIndex::Tables(Index::build(d, entries)?),
            OnlineDesign::Blocks(d) => OnlineIndex::Blocks(MultiIndex::build(d, entries)?),
        })
    }

    /// The design.
    pub fn design(&self) -> OnlineDesign {
        match self {
            OnlineIndex::Tables(i) => OnlineDesign::Tables(i.design().clone()),
            OnlineIndex::Blocks(i) => OnlineDesign::Blocks(i.design().clone()),
        }
    }

    /// The largest k a query may ask.
    pub fn max_k(&self) -> u32 {
        match self {
            OnlineIndex::Tables(i) => i.design().k,
            OnlineIndex::Blocks(i) => i.design().k,
        }
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        each!(self, i => i.len())
    }

    /// Whether no live entry is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory held by the index and its entries.
    pub fn memory(&self) -> usize {
        each!(self, i => i.memory())
    }

    /// Live entries, in storage order.
    pub fn entries(&self) -> Box<dyn Iterator<Item = (u64, B)> + '_> {
        each!(self, i => Box::new(i.entries()))
    }

    /// Every live entry within `k` of `query`, each once, nearest first (ties by id).
    pub fn query(&self, query: B, k: u32) -> Result<Vec<Match>, Error> {
        each!(self, i => i.query(query, k))
    }

    /// [`OnlineIndex::query`] with its work bounded: at most `scan` entries
    /// of each bucket examined, no further table or block searched once
    /// `enough` matches are in hand; `true` when a bound cut the search short.
    pub fn query_capped(
        &self,
        query: B,
        k: u32,
        scan: usize,
        enough: usize,
    ) -> Result<(Vec<Match>, bool), Error> {
        each!(self, i => i.query_capped(query, k, scan, enough))
    }

    /// [`OnlineIndex::query`] for many queries, in parallel; answers in query order.
    pub fn query_batch(&self, queries: &[B], k: u32) -> Result<Vec<Vec<Match>>, Error> {
        each!(self, i => i.query_batch(queries, k))
    }

    /// Adds an entry, searchable at once.
    pub fn add(&mut self, id: u64, fp: B) -> Result<(), Error> {
        each!(self, i => i.add(id, fp))
    }

    /// Deletes every entry whose id satisfies `remove`; returns how many.
    pub fn delete(&mut self, remove: impl FnMut(u64) -> bool) -> usize {
        each!(self, i => i.delete(remove))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::multi::tests::{near, random, scan};
    use crate::index::plan::{ONLINE_BYTES_PER_DOCUMENT, plan_online};
    use crate::rng::SplitMix64;

    /// The planned design for every k from 0 to 20 (and a quarter of the
    /// bits), at both widths, answers as a scan does: after building, adding
    /// and deleting, with planted neighbours around k.
    fn planned_designs_are_exact<B: Bits>() {
        for k in (0..=20).filter(|&k| k <= B::BITS / 4) {
            let mut rng = SplitMix64(u64::from(k) + u64::from(B::BITS));
            let plan = plan_online::<B>(k, 1e6, &[], ONLINE_BYTES_PER_DOCUMENT * 4.0).unwrap();
            let mut live: Vec<(u64, B)> = Vec::new();
            for i in 0..3000u64 {
                let fp = match live.len() {
                    0 => random(&mut rng),
                    len if i % 2 == 0 => {
                        let base = live[(rng.next() % len as u64) as usize].1;
                        near(
                            base,
                            k + 2 - (rng.next() % 5).min(u64::from(k + 2)) as u32,
                            &mut rng,
                        )
                    }
                    _ => random(&mut rng),
                };
                live.push((i, fp));
            }
            let mut index =
                OnlineIndex::build(plan.design().clone(), live[..1000].to_vec()).unwrap();
            for &(id, fp) in &live[1000..] {
                index.add(id, fp).unwrap();
            }
            let doomed = live.iter().filter(|(id, _)| id % 7 == 3).count();
            assert_eq!(index.delete(|id| id % 7 == 3), doomed);
            live.retain(|(id, _)| id % 7 != 3);
            assert_eq!(index.len(), live.len());
            let queries: Vec<B> = (0..60)
                .map(|i| {
                    let x = live[(rng.next() % live.len() as u64) as usize].1;
                    if i % 4 == 0 {
                        random(&mut rng)
                    } else {
                        near(x, (i % (k + 3) as usize) as u32, &mut rng)
                    }
                })
                .collect();
            let batch = index.query_batch(&queries, k).unwrap();
            for (q, got) in queries.iter().zip(batch) {
                let want = scan(&live, *q, k);
                assert_eq!(got, want, "k = {k}: {}", plan.design().describe());
                assert_eq!(index.query(*q, k).unwrap(), want);
            }
            assert!(index.query(queries[0], index.max_k() + 1).is_err());
            assert_eq!(index.design(), *plan.design());
        }
    }

    #[test]
    fn planned_designs_are_exact_at_64_bits() {
        planned_designs_are_exact::<u64>();
    }

    #[test]
    fn planned_designs_are_exact_at_128_bits() {
        planned_designs_are_exact::<u128>();
    }
}
