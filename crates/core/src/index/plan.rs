//! The planner: which design answers a Hamming search or a self-join at
//! the least estimated cost (paper §3.1), for an index's queries from `n`
//! and a memory budget, and for a self-join from a sample of its own
//! fingerprints ([`plan_join_for`]: permuted tables or multi-index blocks).

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::bits::Bits;
use super::design::{MAX_TABLES, Table, TableDesign, directory_bits};
use super::near;
use super::radius::{self, RadiusDesign};
use super::self_join::JoinDesign;
use crate::error::Error;

/// One design the planner considered, with its estimated costs.
#[derive(Clone, Debug)]
pub struct PlanOption {
    /// The design.
    pub design: TableDesign,
    /// Expected candidates per query, over all tables.
    pub candidates: f64,
    /// Bytes of memory per stored fingerprint (all tables, directories included).
    pub bytes_per_fingerprint: f64,
    /// Estimated nanoseconds per query (probes plus candidate checks).
    pub query_ns: f64,
    /// Estimated pair comparisons in a self-join of `n` fingerprints.
    pub join_comparisons: f64,
}

/// The planner's answer: the chosen design and every design it considered.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Index of the chosen option in `options`.
    pub chosen: usize,
    /// Why: a sentence.
    pub reason: String,
    /// Every design considered, by increasing table count.
    pub options: Vec<PlanOption>,
}

/// Cost model: a table probe costs about two cache misses; a candidate check is
/// a sequential popcount. Measured orders of magnitude, not exact.
const PROBE_NS: f64 = 80.0;
const CANDIDATE_NS: f64 = 1.5;

/// Bytes one table spends per fingerprint: the key and a 4-byte item number.
pub fn entry_bytes(bits: u32) -> f64 {
    bits as f64 / 8.0 + 4.0
}

/// Considers one- and two-level designs for `bits`, `k` and `n` stored
/// fingerprints, and picks the fastest for queries that fits in `memory` bytes
/// (or the smallest if none fits).
pub fn plan(bits: u32, k: u32, n: f64, memory: Option<f64>) -> Result<Plan, Error> {
    plan_up_to(bits, k, bits / 8, n, memory)
}

/// The widest k a self-join plans for: 3/16 of the bits. A join's pairs are
/// found once, not per query, and fingerprints centred on their corpus
/// ([`crate::centre`]) put unrelated documents about half the bits apart,
/// so a join can afford a wider k than an index's queries.
pub fn join_max_k(bits: u32) -> u32 {
    bits * 3 / 16
}

/// [`plan`] for a k of at most `max_k`.
fn plan_up_to(bits: u32, k: u32, max_k: u32, n: f64, memory: Option<f64>) -> Result<Plan, Error> {
    if bits != 64 && bits != 128 {
        return Err(Error::InvalidConfig(format!(
            "fingerprint width {bits}: use 64 or 128"
        )));
    }
    if k > max_k {
        return Err(Error::InvalidConfig(format!(
            "k = {k} is too large for {bits}-bit fingerprints: use k <= {max_k} \
             (tables would share too few bits to narrow the search)"
        )));
    }
    let mut options = Vec::new();
    let mut seen = Vec::new();
    let max_b = (k + 12).min(bits);
    let mut try_levels = |levels: &[u32]| {
        if let Ok(d) = TableDesign::new(bits, k, levels) {
            let key = (d.tables.len(), d.prefix_range());
            if seen.contains(&key) {
                return;
            }
            seen.push(key);
            let candidates = d.expected_candidates(n);
            let tables = d.tables.len() as f64;
            let dir = 4.0 * 2f64.powi(directory_bits(d.prefix_range().0, n) as i32) / n.max(1.0);
            options.push(PlanOption {
                bytes_per_fingerprint: tables * (entry_bytes(bits) + dir),
                query_ns: tables * PROBE_NS + candidates * CANDIDATE_NS,
                join_comparisons: d
                    .tables
                    .iter()
                    .map(|t| n * n / 2f64.powi(t.prefix_bits() as i32 + 1))
                    .sum(),
                candidates,
                design: d,
            });
        }
    };
    for b in k + 1..=max_b {
        try_levels(&[b]);
    }
    for b1 in k + 1..=max_b {
        for b2 in k + 1..=max_b {
            try_levels(&[b1, b2]);
        }
    }
    if options.is_empty() {
        return Err(Error::InvalidConfig(format!(
            "no design with at most {MAX_TABLES} tables finds distance {k} at {bits} bits"
        )));
    }
    options.sort_by(|a, b| {
        a.design
            .tables
            .len()
            .cmp(&b.design.tables.len())
            .then(b.design.prefix_range().0.cmp(&a.design.prefix_range().0))
    });
    let fits = |o: &PlanOption| memory.is_none_or(|m| o.bytes_per_fingerprint * n <= m);
    let chosen = match (0..options.len())
        .filter(|&i| fits(&options[i]))
        .min_by(|&a, &b| options[a].query_ns.total_cmp(&options[b].query_ns))
    {
        Some(i) => i,
        None => (0..options.len())
            .min_by(|&a, &b| {
                options[a]
                    .bytes_per_fingerprint
                    .total_cmp(&options[b].bytes_per_fingerprint)
            })
            .expect("options is not empty"),
    };
    let reason = if fits(&options[chosen]) {
        "the fastest estimated query among the designs that fit in memory".to_owned()
    } else {
        "no design fits in the memory given: the smallest one".to_owned()
    };
    Ok(Plan {
        chosen,
        reason,
        options,
    })
}

/// The design for a self-join of `n` fingerprints: the least estimated work,
/// sorting every table plus comparing within equal prefixes.
pub fn plan_join(bits: u32, k: u32, n: f64) -> Result<TableDesign, Error> {
    let p = plan_up_to(bits, k, join_max_k(bits), n, None)?;
    let sort_ns_per_entry = 12.0;
    let best = p
        .options
        .iter()
        .min_by(|a, b| {
            let cost = |o: &PlanOption| {
                o.design.tables.len() as f64 * n * sort_ns_per_entry
                    + o.join_comparisons * CANDIDATE_NS
            };
            cost(a).total_cmp(&cost(b))
        })
        .expect("options is not empty");
    Ok(best.design.clone())
}

/// Pairs sampled to estimate how many comparisons a design makes.
const SAMPLED_PAIRS: usize = 40_000;
/// Pairs sampled to find pairs within k (rare: a few in ten thousand of
/// crowded text's pairs) and how many tables each is found in.
const SAMPLED_NEAR: usize = 2_000_000;
/// Pairs within k that are enough to estimate from.
const NEAR_ENOUGH: usize = 10_000;
/// Join costs in nanoseconds of one core, fitted to joins of 0.16, 0.7 and
/// 1.85 million 128-bit fingerprints of crowded text (docs/dedup.md): per
/// fingerprint and table (sorting it, finding its bucket and run, starting
/// its comparisons) and per pair within k found by a table (the first-table
/// rule and the pair's hand-off); per comparison, [`near::compare_ns`].
const JOIN_ENTRY_NS: f64 = 40.0;
const JOIN_HIT_NS: f64 = 6.5;

/// The self-join's design for these fingerprints: the work of each design
/// is estimated from the fingerprints themselves rather than from uniformly
/// random bits. Text's fingerprints crowd (documents of one language and
/// domain share words), so that a prefix narrows far less than its length
/// says, and pairs within k, each found by several tables, cost more with
/// more tables; which design is fastest depends on how they crowd. A
/// sample of random pairs gives, per design, the pairs sharing a table's
/// prefix or lying within a block's radius (the comparisons) and the pairs
/// within k it finds (each once per table that finds it). Both families are
/// weighed: the permuted tables of [`plan_join`] and the multi-index blocks
/// of [`RadiusDesign`]. Deterministic: a fixed seed.
pub fn plan_join_for<B: Bits>(k: u32, fps: &[B]) -> Result<JoinDesign, Error> {
    plan_join_sampled(k, fps, SAMPLED_PAIRS, SAMPLED_NEAR)
}

/// [`plan_join_for`] from `sampled` random pairs (for the comparisons) and
/// up to `sampled_near` more (for the pairs within k).
pub fn plan_join_sampled<B: Bits>(
    k: u32,
    fps: &[B],
    sampled: usize,
    sampled_near: usize,
) -> Result<JoinDesign, Error> {
    // The work is done by this crate's own copies for each width: a generic
    // copy made in the caller's crate would be built with the caller's
    // optimisation (none in debug builds, where this crate is optimised).
    match B::WIDTH {
        crate::Width::W64 => {
            plan_join_sampled_u64(k, bytemuck::cast_slice(fps), sampled, sampled_near)
        }
        crate::Width::W128 => {
            plan_join_sampled_u128(k, bytemuck::cast_slice(fps), sampled, sampled_near)
        }
    }
}

#[inline(never)]
fn plan_join_sampled_u64(
    k: u32,
    fps: &[u64],
    sampled: usize,
    sampled_near: usize,
) -> Result<JoinDesign, Error> {
    plan_join_sampled_of(k, fps, sampled, sampled_near)
}

#[inline(never)]
fn plan_join_sampled_u128(
    k: u32,
    fps: &[u128],
    sampled: usize,
    sampled_near: usize,
) -> Result<JoinDesign, Error> {
    plan_join_sampled_of(k, fps, sampled, sampled_near)
}

fn plan_join_sampled_of<B: Bits>(
    k: u32,
    fps: &[B],
    sampled: usize,
    sampled_near: usize,
) -> Result<JoinDesign, Error> {
    let n = fps.len();
    if n < 1000 {
        return Ok(JoinDesign::Tables(plan_join(B::BITS, k, n as f64)?));
    }
    let p = plan_up_to(B::BITS, k, join_max_k(B::BITS), n as f64, None)?;
    let pairs = (n as f64) * (n as f64 - 1.0) / 2.0;
    let mut rng = crate::rng::SplitMix64(0x6a6f_696e);
    let mut diff = || {
        let a = (rng.next() % n as u64) as usize;
        let b = (rng.next() % n as u64) as usize;
        fps[a].xor(fps[b])
    };
    // Identical fingerprints are collapsed before the join: no work.
    let sample: Vec<B> = (0..sampled)
        .map(|_| diff())
        .filter(|d| *d != B::zero())
        .collect();
    // Pairs within k, until enough are found to count (heavy clusters of
    // near copies make them common).
    let mut near = Vec::new();
    let mut drawn = 0;
    while drawn < sampled_near && near.len() < NEAR_ENOUGH {
        let d = diff();
        drawn += 1;
        if d != B::zero() && d.distance(B::zero()) <= k {
            near.push(d);
        }
    }
    let (sampled, drawn) = (sampled.max(1) as f64, drawn.max(1) as f64);
    let cost = |d: &TableDesign| {
        let masks: Vec<B> = d.tables.iter().map(Table::prefix_mask::<B>).collect();
        let shared = |diffs: &[B]| -> f64 {
            let count = diffs
                .iter()
                .map(|&x| masks.iter().filter(|&&m| x.and(m) == B::zero()).count())
                .sum::<usize>();
            count as f64
        };
        let compares = shared(&sample) * pairs / sampled;
        let hits = shared(&near) * pairs / drawn;
        let compare_ns = near::compare_ns();
        d.tables.len() as f64 * n as f64 * JOIN_ENTRY_NS
            + compares * compare_ns
            + hits * JOIN_HIT_NS
    };
    let costs: Vec<f64> = p.options.par_iter().map(|o| cost(&o.design)).collect();
    let best = (0..costs.len())
        .min_by(|&a, &b| costs[a].total_cmp(&costs[b]))
        .expect("options is not empty");
    let radius_cost = |d: &RadiusDesign| {
        let compared = radius::compared_by(d, &sample) as f64 / sampled;
        let found = radius::compared_by(d, &near) as f64 * pairs / drawn;
        radius::radius_cost(d, n as f64, compared, found)
    };
    let options = radius::radius_options(B::BITS, k);
    let costs_radius: Vec<f64> = options.par_iter().map(radius_cost).collect();
    // The first of equal costs, whatever the threads.
    let radius = options
        .into_iter()
        .zip(costs_radius)
        .map(|(d, c)| (c, d))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    Ok(match radius {
        Some((c, d)) if c < costs[best] => JoinDesign::Radius(d),
        _ => JoinDesign::Tables(p.options[best].design.clone()),
    })
}

/// A design an online index is built on: permuted tables ([`super::Index`])
/// or multi-index blocks ([`super::MultiIndex`]). Stored with a collection
/// as JSON: `{"tables": {...}}` or `{"blocks": {...}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnlineDesign {
    /// Permuted tables, for a small k.
    Tables(TableDesign),
    /// Multi-index blocks searched within radii, for a large k.
    Blocks(RadiusDesign),
}

impl OnlineDesign {
    /// Fingerprint width.
    pub fn bits(&self) -> u32 {
        match self {
            OnlineDesign::Tables(d) => d.bits,
            OnlineDesign::Blocks(d) => d.bits,
        }
    }

    /// The largest distance the design finds exactly.
    pub fn k(&self) -> u32 {
        match self {
            OnlineDesign::Tables(d) => d.k,
            OnlineDesign::Blocks(d) => d.k,
        }
    }

    /// A one-line description.
    pub fn describe(&self) -> String {
        match self {
            OnlineDesign::Tables(d) => format!("permuted tables: {}", d.describe()),
            OnlineDesign::Blocks(d) => d.describe(),
        }
    }
}

/// One online design the planner weighed, with its estimates at the
/// expected size.
#[derive(Clone, Debug)]
pub struct OnlineOption {
    /// The design.
    pub design: OnlineDesign,
    /// Buckets a query looks up.
    pub probes: f64,
    /// Stored fingerprints a query measures.
    pub candidates: f64,
    /// Bytes of index memory per stored fingerprint: the fingerprint, its
    /// 8-byte id and deletion mark, and every table's or block's share.
    pub bytes_per_document: f64,
    /// Estimated nanoseconds of one core per query.
    pub query_ns: f64,
}

/// The online planner's answer: the chosen design and every design weighed.
#[derive(Clone, Debug)]
pub struct OnlinePlan {
    /// Index of the chosen option in `options`.
    pub chosen: usize,
    /// Why: a sentence.
    pub reason: String,
    /// Every design weighed: permuted tables, then blocks.
    pub options: Vec<OnlineOption>,
}

impl OnlinePlan {
    /// The chosen design.
    pub fn design(&self) -> &OnlineDesign {
        &self.options[self.chosen].design
    }

    /// The chosen design's estimates.
    pub fn option(&self) -> &OnlineOption {
        &self.options[self.chosen]
    }
}

/// Fingerprints a sample must hold for [`plan_online`] to estimate
/// candidates from it (fewer: from uniformly random bits).
pub const ONLINE_MIN_SAMPLE: usize = 1000;

/// Index memory per stored fingerprint an online design may take by
/// default: the service's whole budget is about 300 bytes per document,
/// which its ids, store and verification data share.
pub const ONLINE_BYTES_PER_DOCUMENT: f64 = 128.0;

/// Costs of an online query in nanoseconds of one core: per bucket of a
/// block looked up (every block's look-ups are requested together, so their
/// misses overlap) and per stored fingerprint measured from a block (64 of
/// its bits kept beside the bucket's slots, read in sequence), of the order
/// measured on a million clustered 128-bit fingerprints with the scalar
/// `popcnt` (`examples/online_index.rs`, whose `blocks=M` measures each
/// design). Permuted tables cost [`PROBE_NS`] per table and
/// [`CANDIDATE_NS`] per candidate (their keys are read in sequence, which
/// makes them the faster design where few tables find k).
const BLOCK_PROBE_NS: f64 = 35.0;
const BLOCK_CANDIDATE_NS: f64 = 2.5;
/// Bytes per stored fingerprint and block: its slot (4) and the 64 bits of
/// it outside the block (8).
const BLOCK_ENTRY_BYTES: f64 = 12.0;

/// The design for an online index of about `n` fingerprints of `B`'s width
/// searched within `k`: the least estimated query time among the permuted
/// tables of [`plan`] and the multi-index blocks of
/// [`radius_options`](radius::radius_options) whose memory fits in
/// `bytes_per_document` (see [`ONLINE_BYTES_PER_DOCUMENT`]). Candidates per
/// query are estimated from random pairs of `sample` (fingerprints like
/// those to be stored, e.g. the first documents, centred as they will be)
/// when it holds at least 1,000, else for uniformly random bits; text
/// crowds, so a sample is the better guide. Refused, with the fix, when k
/// exceeds a quarter of the bits or no design fits in the memory given.
/// Deterministic: a fixed seed.
pub fn plan_online<B: Bits>(
    k: u32,
    n: f64,
    sample: &[B],
    bytes_per_document: f64,
) -> Result<OnlinePlan, Error> {
    let bits = B::BITS;
    if k > bits / 4 {
        return Err(Error::InvalidConfig(format!(
            "k = {k} is too large for an online index of {bits}-bit fingerprints: use k <= {} \
             (beyond it a query measures a large share of the index)",
            bits / 4
        )));
    }
    let n = n.max(1.0);
    let diffs: Vec<B> = if sample.len() >= ONLINE_MIN_SAMPLE {
        let mut rng = crate::rng::SplitMix64(0x6f6e_6c69);
        let len = sample.len() as u64;
        (0..SAMPLED_PAIRS)
            .map(|_| {
                let a = (rng.next() % len) as usize;
                let b = (rng.next() % len) as usize;
                (a, b)
            })
            .filter(|(a, b)| a != b)
            .map(|(a, b)| sample[a].xor(sample[b]))
            .collect()
    } else {
        Vec::new()
    };
    let share = |count: usize| count as f64 / diffs.len().max(1) as f64;
    let entry = bits as f64 / 8.0 + 8.0;
    let mut options = Vec::new();
    // Permuted tables, where any design finds k.
    if let Ok(p) = plan_up_to(bits, k, join_max_k(bits), n, None) {
        for o in p.options {
            let tables = o.design.tables.len() as f64;
            let candidates = if diffs.is_empty() {
                o.candidates
            } else {
                let masks: Vec<B> = o
                    .design
                    .tables
                    .iter()
                    .map(Table::prefix_mask::<B>)
                    .collect();
                let shared = diffs
                    .iter()
                    .map(|&x| masks.iter().filter(|&&m| x.and(m) == B::zero()).count())
                    .sum();
                share(shared) * n
            };
            options.push(OnlineOption {
                probes: tables,
                candidates,
                bytes_per_document: o.bytes_per_fingerprint + entry + 1.0,
                query_ns: tables * PROBE_NS + candidates * CANDIDATE_NS,
                design: OnlineDesign::Tables(o.design),
            });
        }
    }
    // Multi-index blocks, with the directories they would have at n.
    for d in radius::radius_options(bits, k) {
        let widths: Vec<u32> = d
            .blocks
            .iter()
            .map(|b| super::multi::dir_bits_for(n as usize, b.len))
            .collect();
        let probes_of = |b: &radius::Block, w: u32| {
            let narrowed = radius::Block { len: w, ..*b };
            RadiusDesign::neighbours(&narrowed) as f64 + 1.0
        };
        let probes: f64 = d
            .blocks
            .iter()
            .zip(&widths)
            .map(|(b, &w)| probes_of(b, w))
            .sum();
        let candidates = if diffs.is_empty() {
            d.blocks
                .iter()
                .zip(&widths)
                .map(|(b, &w)| probes_of(b, w) * n / 2f64.powi(w as i32))
                .sum()
        } else {
            // A stored fingerprint is measured by a block when its
            // difference on the directory's bits is within the radius.
            let within = d
                .blocks
                .iter()
                .zip(&widths)
                .map(|(b, &w)| {
                    let m = B::mask(b.start + b.len - w, w);
                    diffs
                        .iter()
                        .filter(|&&x| x.and(m).distance(B::zero()) <= b.radius)
                        .count()
                })
                .sum();
            share(within) * n
        };
        let directories: f64 = widths
            .iter()
            .map(|&w| 4.0 * (2f64.powi(w as i32) + 1.0))
            .sum();
        options.push(OnlineOption {
            probes,
            candidates,
            bytes_per_document: entry
                + 0.125
                + BLOCK_ENTRY_BYTES * d.blocks.len() as f64
                + directories / n,
            query_ns: probes * BLOCK_PROBE_NS + candidates * BLOCK_CANDIDATE_NS,
            design: OnlineDesign::Blocks(d),
        });
    }
    if options.is_empty() {
        return Err(Error::InvalidConfig(format!(
            "no online design finds distance {k} at {bits} bits"
        )));
    }
    let fits = |o: &OnlineOption| o.bytes_per_document <= bytes_per_document;
    let Some(chosen) = (0..options.len())
        .filter(|&i| fits(&options[i]))
        .min_by(|&a, &b| options[a].query_ns.total_cmp(&options[b].query_ns))
    else {
        let least = options
            .iter()
            .map(|o| o.bytes_per_document)
            .fold(f64::INFINITY, f64::min);
        return Err(Error::InvalidConfig(format!(
            "every online design for k = {k} at {bits} bits needs more than {bytes_per_document:.0} \
             bytes per document (the smallest needs {least:.0}): allow that much memory, or \
             lower k"
        )));
    };
    let reason = format!(
        "the fastest estimated query ({:.1} µs, {:.0} candidates) among the designs within \
         {bytes_per_document:.0} bytes per document",
        options[chosen].query_ns / 1000.0,
        options[chosen].candidates
    );
    Ok(OnlinePlan {
        chosen,
        reason,
        options,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_designs_for_64_bits_k_3() {
        let n = 2f64.powi(34);
        let p = plan(64, 3, n, None).unwrap();
        let find = |tables: usize, lo: u32, hi: u32| {
            p.options
                .iter()
                .find(|o| o.design.tables.len() == tables && o.design.prefix_range() == (lo, hi))
                .unwrap_or_else(|| panic!("no {tables}-table design with prefix {lo}-{hi}"))
        };
        // Paper §3.1: 4 tables of 16-bit prefix, ~2^18 candidates per table; 10
        // tables, 25-26 bits, <= 512; 16 tables, 28 bits, ~64; 20 tables, 31-33 bits, <= 8.
        let o = find(4, 16, 16);
        assert_eq!(o.candidates / 4.0, 2f64.powi(18));
        let o = find(10, 25, 26);
        assert!(o.candidates / 10.0 <= 512.0);
        let o = find(16, 28, 28);
        assert_eq!(o.design.levels, vec![4, 4]);
        assert_eq!(o.candidates / 16.0, 64.0);
        let o = find(20, 31, 33);
        assert!(o.candidates / 20.0 <= 8.0);
    }

    #[test]
    fn memory_budget_is_respected() {
        let n = 1e9;
        let p = plan(64, 3, n, Some(64e9)).unwrap();
        let o = &p.options[p.chosen];
        assert!(o.bytes_per_fingerprint * n <= 64e9);
        let roomy = plan(64, 3, n, None).unwrap();
        assert!(roomy.options[roomy.chosen].query_ns <= o.query_ns);
    }

    #[test]
    fn impossible_plans_are_refused() {
        assert!(plan(64, 9, 1e6, None).is_err());
        assert!(plan(128, 16, 1e6, None).is_ok());
    }

    #[test]
    fn online_plans_blocks_for_a_large_k_and_tables_for_a_small_one() {
        for n in [1e5, 1e6, 1e7] {
            let p = plan_online::<u128>(19, n, &[], ONLINE_BYTES_PER_DOCUMENT).unwrap();
            assert!(
                matches!(p.design(), OnlineDesign::Blocks(_)),
                "{n}: {}",
                p.design().describe()
            );
            let p = plan_online::<u128>(15, n, &[], ONLINE_BYTES_PER_DOCUMENT).unwrap();
            assert!(
                matches!(p.design(), OnlineDesign::Blocks(_)),
                "{n}: {}",
                p.design().describe()
            );
        }
        // The paper's regime: whatever is chosen is no slower (estimated)
        // than the paper's four tables of 16-bit prefixes, and fits.
        for n in [1e6, 1e9] {
            let p = plan_online::<u64>(3, n, &[], ONLINE_BYTES_PER_DOCUMENT).unwrap();
            let four = p
                .options
                .iter()
                .find(|o| matches!(&o.design, OnlineDesign::Tables(d) if d.tables.len() == 4))
                .expect("four tables are weighed");
            assert!(p.option().query_ns <= four.query_ns, "{n}");
            assert!(p.option().bytes_per_document <= ONLINE_BYTES_PER_DOCUMENT);
        }
        // From a sample of crowded fingerprints (clusters around a few
        // centres): still blocks at k = 19.
        let mut rng = crate::rng::SplitMix64(5);
        let centres: Vec<u128> = (0..50)
            .map(|_| u128::from(rng.next()) << 64 | u128::from(rng.next()))
            .collect();
        let sample: Vec<u128> = (0..5000)
            .map(|i| {
                let mut x = centres[i % centres.len()];
                for _ in 0..30 {
                    x ^= 1 << (rng.next() % 128);
                }
                x
            })
            .collect();
        let p = plan_online(19, 1e6, &sample, ONLINE_BYTES_PER_DOCUMENT).unwrap();
        assert!(
            matches!(p.design(), OnlineDesign::Blocks(_)),
            "{}",
            p.design().describe()
        );
        let uniform = plan_online::<u128>(19, 1e6, &[], ONLINE_BYTES_PER_DOCUMENT).unwrap();
        assert!(p.option().candidates > uniform.option().candidates);
    }

    #[test]
    fn online_plans_within_the_memory_given_or_refused() {
        for budget in [40.0, 60.0, 128.0, 1e4] {
            if let Ok(p) = plan_online::<u128>(19, 1e6, &[], budget) {
                assert!(p.option().bytes_per_document <= budget);
            }
        }
        // 16 + 8 bytes of entry alone exceed 20.
        let e = plan_online::<u128>(19, 1e6, &[], 20.0).unwrap_err();
        assert!(e.to_string().contains("allow that much memory"), "{e}");
        // Permuted tables for k = 19 at 128 bits take 210 tables: refused at
        // the default, weighed when memory is plentiful.
        let roomy = plan_online::<u128>(19, 1e6, &[], 1e5).unwrap();
        assert!(roomy.options.iter().any(|o| {
            matches!(&o.design, OnlineDesign::Tables(d) if d.tables.len() == 210)
                && o.bytes_per_document > ONLINE_BYTES_PER_DOCUMENT
        }));
        assert!(plan_online::<u64>(17, 1e6, &[], 1e5).is_err());
        assert!(plan_online::<u64>(16, 1e6, &[], 1e5).is_ok());
    }

    #[test]
    fn block_memory_is_estimated_as_built() {
        let n = 1usize << 17;
        let p = plan_online::<u128>(19, n as f64, &[], ONLINE_BYTES_PER_DOCUMENT).unwrap();
        let OnlineDesign::Blocks(d) = p.design() else {
            panic!("{}", p.design().describe())
        };
        let mut rng = crate::rng::SplitMix64(9);
        let entries =
            (0..n as u64).map(|i| (i, u128::from(rng.next()) << 64 | u128::from(rng.next())));
        let built = super::super::MultiIndex::build(d.clone(), entries).unwrap();
        let per = built.memory() as f64 / n as f64;
        let estimated = p.option().bytes_per_document;
        assert!(
            (per - estimated).abs() < 2.0,
            "built {per}, estimated {estimated}"
        );
    }

    #[test]
    fn online_designs_round_trip_through_json() {
        // Every design weighed, of both kinds.
        let mut kinds = (0, 0);
        for p in [
            plan_online::<u128>(19, 1e6, &[], 1e5).unwrap(),
            plan_online::<u64>(3, 1e6, &[], ONLINE_BYTES_PER_DOCUMENT).unwrap(),
        ] {
            for o in &p.options {
                let json = serde_json::to_string(&o.design).unwrap();
                match &o.design {
                    OnlineDesign::Blocks(_) => {
                        kinds.0 += 1;
                        assert!(json.starts_with("{\"blocks\""), "{json}");
                    }
                    OnlineDesign::Tables(_) => {
                        kinds.1 += 1;
                        assert!(json.starts_with("{\"tables\""), "{json}");
                    }
                }
                let back: OnlineDesign = serde_json::from_str(&json).unwrap();
                assert_eq!(back, o.design);
            }
        }
        assert!(kinds.0 > 0 && kinds.1 > 0, "{kinds:?}");
    }
}
