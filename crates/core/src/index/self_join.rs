//! The self-join's designs behind one trait: [`SelfJoin`] over the permuted
//! tables ([`TableDesign`], joined in [`super::join`]) and the multi-index
//! blocks ([`RadiusDesign`]), and [`JoinDesign`], the one a planner chose.

use rayon::prelude::*;

use super::bits::Bits;
use super::design::TableDesign;
use super::join::{JoinScratch, join_sorted_unique_with, join_tables};
use super::radius::RadiusDesign;
use crate::error::Error;

/// A design the self-join runs on.
pub trait SelfJoin: Sync {
    /// Every pair `(i, j, distance)`, `i < j`, of `sorted` (distinct
    /// fingerprints in ascending order) within `k`, each exactly once, handed
    /// to `sink` in rounds, in an order fixed by the design (not by the
    /// thread count or timing): memory holds two rounds' pairs at most (one
    /// being joined, one in the sink), not all of them.
    fn join_each<B: Bits>(
        &self,
        sorted: &[B],
        k: u32,
        scratch: JoinScratch<B>,
        sink: impl FnMut(Vec<(u32, u32, u32)>),
    ) -> Result<(), Error> {
        self.join_each_where(sorted, k, scratch, &|_, _| true, sink)
    }

    /// [`SelfJoin::join_each`] without the pairs `(i, j)` for which
    /// `keep(i, j)` is false: a screen run by the threads that find the
    /// pairs, before any reaches `sink`.
    fn join_each_where<B: Bits>(
        &self,
        sorted: &[B],
        k: u32,
        scratch: JoinScratch<B>,
        keep: &(impl Fn(u32, u32) -> bool + Sync),
        sink: impl FnMut(Vec<(u32, u32, u32)>),
    ) -> Result<(), Error>;

    /// The pairs of [`SelfJoin::join_each`], all at once and sorted.
    fn join_all<B: Bits>(
        &self,
        sorted: &[B],
        k: u32,
        scratch: JoinScratch<B>,
    ) -> Result<Vec<(u32, u32, u32)>, Error> {
        let mut pairs = Vec::new();
        self.join_each(sorted, k, scratch, |round| pairs.extend(round))?;
        pairs.par_sort_unstable();
        Ok(pairs)
    }

    /// A one-line description.
    fn describe(&self) -> String;
}

impl SelfJoin for TableDesign {
    fn join_each_where<B: Bits>(
        &self,
        sorted: &[B],
        k: u32,
        scratch: JoinScratch<B>,
        keep: &(impl Fn(u32, u32) -> bool + Sync),
        sink: impl FnMut(Vec<(u32, u32, u32)>),
    ) -> Result<(), Error> {
        join_tables(sorted, k, self, scratch, keep, sink)
    }

    fn join_all<B: Bits>(
        &self,
        sorted: &[B],
        k: u32,
        scratch: JoinScratch<B>,
    ) -> Result<Vec<(u32, u32, u32)>, Error> {
        join_sorted_unique_with(sorted, k, self, scratch)
    }

    fn describe(&self) -> String {
        TableDesign::describe(self)
    }
}

impl SelfJoin for RadiusDesign {
    fn join_each_where<B: Bits>(
        &self,
        sorted: &[B],
        k: u32,
        scratch: JoinScratch<B>,
        keep: &(impl Fn(u32, u32) -> bool + Sync),
        sink: impl FnMut(Vec<(u32, u32, u32)>),
    ) -> Result<(), Error> {
        RadiusDesign::join_each_where(self, sorted, k, scratch, keep, sink)
    }

    fn describe(&self) -> String {
        RadiusDesign::describe(self)
    }
}

/// The self-join's design: permuted tables, or multi-index blocks
/// ([`plan_join_for`](super::plan_join_for) picks the cheaper for the data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinDesign {
    /// Tables of prefixes compared exactly.
    Tables(TableDesign),
    /// Blocks searched within a radius.
    Radius(RadiusDesign),
}

impl SelfJoin for JoinDesign {
    fn join_each_where<B: Bits>(
        &self,
        sorted: &[B],
        k: u32,
        scratch: JoinScratch<B>,
        keep: &(impl Fn(u32, u32) -> bool + Sync),
        sink: impl FnMut(Vec<(u32, u32, u32)>),
    ) -> Result<(), Error> {
        match self {
            JoinDesign::Tables(d) => d.join_each_where(sorted, k, scratch, keep, sink),
            JoinDesign::Radius(d) => d.join_each_where(sorted, k, scratch, keep, sink),
        }
    }

    fn join_all<B: Bits>(
        &self,
        sorted: &[B],
        k: u32,
        scratch: JoinScratch<B>,
    ) -> Result<Vec<(u32, u32, u32)>, Error> {
        match self {
            JoinDesign::Tables(d) => d.join_all(sorted, k, scratch),
            JoinDesign::Radius(d) => d.join_all(sorted, k, scratch),
        }
    }

    fn describe(&self) -> String {
        match self {
            JoinDesign::Tables(d) => SelfJoin::describe(d),
            JoinDesign::Radius(d) => SelfJoin::describe(d),
        }
    }
}
