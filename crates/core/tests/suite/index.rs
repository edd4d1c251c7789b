//! The index, the self-join and dedup against brute force, on random and
//! adversarial sets, at 64 and 128 bits.

use neardup_core::dedup::{
    Dedup, Policy, clusters, for_each_pair_streamed, representatives_of_pairs,
};
use neardup_core::index::radius::radius_options;
use neardup_core::index::{
    Bits, Index, JoinDesign, Match, RadiusDesign, SelfJoin, TableDesign, plan, plan_join_sampled,
    self_join,
};
use neardup_core::jaccard::jaccard;
use proptest::prelude::*;
use std::sync::atomic::AtomicUsize;

/// Fingerprint sets that stress the index: uniform, planted near-duplicates,
/// many identical copies, and everything crowded into a few prefixes.
fn fingerprints<B: Bits>(bits: u32) -> impl Strategy<Value = Vec<B>> {
    let word = move |hi: u64, lo: u64| {
        B::from_u128(
            ((hi as u128) << 64 | lo as u128)
                & if bits == 64 {
                    u64::MAX as u128
                } else {
                    u128::MAX
                },
        )
    };
    (
        prop::collection::vec((any::<u64>(), any::<u64>()), 1..60),
        prop::collection::vec((0usize..60, prop::collection::vec(0u32..128, 0..5)), 0..80),
        0usize..4,
        any::<u64>(),
    )
        .prop_map(move |(bases, variants, mode, crowd)| {
            let mut v: Vec<B> = bases.iter().map(|&(h, l)| word(h, l)).collect();
            for (i, flips) in variants {
                let mut x = v[i % v.len()];
                for f in flips {
                    x = x.xor(B::mask(f % bits, 1));
                }
                v.push(x);
            }
            match mode {
                1 => {
                    let x = v[0];
                    v.extend(std::iter::repeat_n(x, 50));
                }
                2 => {
                    // Crowd: the top 40 bits equal for all.
                    let top = B::mask(bits - 40, 40);
                    let c = word(crowd, crowd.rotate_left(17)).and(top);
                    v = v
                        .into_iter()
                        .map(|x| x.and(top.xor(B::mask(0, bits))).or(c))
                        .collect();
                }
                _ => {}
            }
            v
        })
}

fn brute_query<B: Bits>(entries: &[(u64, B)], q: B, k: u32) -> Vec<Match> {
    let mut out: Vec<Match> = entries
        .iter()
        .filter(|(_, f)| f.distance(q) <= k)
        .map(|&(id, f)| Match {
            distance: f.distance(q),
            id,
        })
        .collect();
    out.sort_unstable();
    out
}

fn brute_pairs<B: Bits>(fps: &[B], k: u32) -> Vec<(u32, u32, u32)> {
    let mut out = Vec::new();
    for i in 0..fps.len() {
        for j in i + 1..fps.len() {
            let d = fps[i].distance(fps[j]);
            if d <= k {
                out.push((i as u32, j as u32, d));
            }
        }
    }
    out
}

/// The streamed join's pairs of `fps` come in the same order with 1 and 3
/// threads, and are brute force's.
fn streamed_pairs_match<B: Bits>(
    fps: &[B],
    k: u32,
    d: &impl SelfJoin,
) -> Result<(), TestCaseError> {
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut got = Vec::new();
        pool.install(|| {
            for_each_pair_streamed(fps.to_vec(), k, d, |a, b, dist| got.push((a, b, dist))).unwrap()
        });
        got
    };
    let one = run(1);
    prop_assert_eq!(&run(3), &one);
    let mut sorted = one;
    sorted.sort_unstable();
    prop_assert_eq!(sorted, brute_pairs(fps, k));
    Ok(())
}

fn design(bits: u32, k: u32, choice: usize) -> TableDesign {
    let options: Vec<Vec<u32>> = vec![
        vec![k + 1],
        vec![k + 2],
        vec![k + 3],
        vec![k + 1, k + 1],
        vec![k + 2, k + 1],
    ];
    // A nested design may not exist for small k (nothing left to cut): then one level.
    TableDesign::new(bits, k, &options[choice % options.len()])
        .unwrap_or_else(|_| TableDesign::new(bits, k, &[k + 1]).unwrap())
}

fn check_all<B: Bits>(
    fps: Vec<B>,
    bits: u32,
    k: u32,
    choice: usize,
    queries: Vec<B>,
) -> Result<(), TestCaseError> {
    let d = design(bits, k, choice);
    let entries: Vec<(u64, B)> = fps
        .iter()
        .enumerate()
        .map(|(i, &f)| (i as u64 * 7 + 3, f))
        .collect();
    let index = Index::build(d.clone(), entries.clone()).unwrap();
    // Queries: every stored fingerprint, near variants, and random ones.
    let mut qs: Vec<B> = fps.iter().take(20).copied().collect();
    qs.extend(queries);
    for &q in &qs {
        for qk in [0, k / 2, k] {
            prop_assert_eq!(index.query(q, qk).unwrap(), brute_query(&entries, q, qk));
        }
    }
    let batch = index.query_batch(&qs, k).unwrap();
    for (q, got) in qs.iter().zip(batch) {
        prop_assert_eq!(got, brute_query(&entries, *q, k));
    }
    // Self-join.
    prop_assert_eq!(self_join(&fps, k, &d).unwrap(), brute_pairs(&fps, k));
    let by_id: Vec<(u64, u64, u32)> = brute_pairs(&fps, k)
        .into_iter()
        .map(|(a, b, dd)| (entries[a as usize].0, entries[b as usize].0, dd))
        .collect();
    prop_assert_eq!(index.self_join(k).unwrap(), by_id);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    #[test]
    fn index_64_is_exact(fps in fingerprints::<u64>(64), k in 0u32..8, choice in 0usize..5, qs in prop::collection::vec(any::<u64>(), 0..5)) {
        check_all(fps, 64, k, choice, qs)?;
    }

    #[test]
    fn index_128_is_exact(fps in fingerprints::<u128>(128), k in 0u32..16, choice in 0usize..5, qs in prop::collection::vec(any::<u128>(), 0..5)) {
        check_all(fps, 128, k, choice, qs)?;
    }

    /// Additions (past the merge threshold) and deletions keep the index exact.
    #[test]
    fn add_and_delete_stay_exact(fps in fingerprints::<u64>(64), more in prop::collection::vec(any::<u64>(), 0..200), k in 1u32..5, drop_mod in 2u64..7) {
        let d = design(64, k, 0);
        let mut live: Vec<(u64, u64)> = fps.iter().enumerate().map(|(i, &f)| (i as u64, f)).collect();
        let mut index = Index::build(d, live.clone()).unwrap();
        for (j, &f) in more.iter().enumerate() {
            let id = 10_000 + j as u64;
            // Near copies of stored ones, so that new entries have neighbours.
            let f = if j % 2 == 0 { fps[j % fps.len()] ^ (1 << (j % 64)) } else { f };
            index.add(id, f).unwrap();
            live.push((id, f));
        }
        let removed = index.delete(|id| id % drop_mod == 0);
        let before = live.len();
        live.retain(|(id, _)| id % drop_mod != 0);
        prop_assert_eq!(removed, before - live.len());
        prop_assert_eq!(index.len(), live.len());
        for &(_, q) in live.iter().take(30) {
            prop_assert_eq!(index.query(q, k).unwrap(), brute_query(&live, q, k));
        }
        let fps_live: Vec<u64> = live.iter().map(|e| e.1).collect();
        let expected: Vec<(u64, u64, u32)> = brute_pairs(&fps_live, k).into_iter().map(|(a, b, dd)| (live[a as usize].0, live[b as usize].0, dd)).collect();
        prop_assert_eq!(index.self_join(k).unwrap(), expected);
    }

    /// Dedup: pairs, components and the incremental policy against brute force.
    #[test]
    fn dedup_matches_brute_force(fps in fingerprints::<u64>(64), k in 0u32..5) {
        let d = design(64, k, 1);
        let dd = Dedup::new(&fps, k, &d).unwrap();
        let mut pairs = Vec::new();
        dd.for_each_pair(|a, b, dist| { pairs.push((a, b, dist)); Ok::<(), ()>(()) }).unwrap();
        pairs.sort_unstable();
        let expected = brute_pairs(&fps, k);
        prop_assert_eq!(dd.pair_count(), expected.len() as u64);
        prop_assert_eq!(&pairs, &expected);
        // The same from the fingerprints' own allocation.
        let owned = Dedup::from_vec(fps.clone(), k, &d).unwrap();
        let mut owned_pairs = Vec::new();
        owned.for_each_pair(|a, b, dist| { owned_pairs.push((a, b, dist)); Ok::<(), ()>(()) }).unwrap();
        owned_pairs.sort_unstable();
        prop_assert_eq!(&owned_pairs, &expected);

        // Components: brute-force union-find; representative = first document.
        let n = fps.len();
        let mut comp: Vec<usize> = (0..n).collect();
        fn root(c: &mut [usize], mut x: usize) -> usize { while c[x] != x { x = c[x]; } x }
        for &(a, b, _) in &expected {
            let (ra, rb) = (root(&mut comp, a as usize), root(&mut comp, b as usize));
            if ra != rb { comp[ra.max(rb)] = ra.min(rb); }
        }
        let reps: Vec<u32> = (0..n).map(|i| root(&mut comp, i) as u32).collect();
        let first_of: Vec<u32> = reps.iter().map(|&r| (0..n).find(|&j| reps[j] == r).unwrap() as u32).collect();
        prop_assert_eq!(dd.representatives(Policy::Components), first_of);

        // Incremental: keep unless within k of an earlier kept document; a
        // dropped document's representative is the earliest kept one within k.
        let mut rep = vec![0u32; n];
        let mut kept: Vec<usize> = Vec::new();
        for i in 0..n {
            match kept.iter().find(|&&j| fps[j].distance(fps[i]) <= k) {
                Some(&j) => rep[i] = j as u32,
                None => { kept.push(i); rep[i] = i as u32; }
            }
        }
        let got = dd.representatives(Policy::Incremental);
        prop_assert_eq!(&got, &rep);
        // Clusters never chain under the incremental policy.
        for (r, members) in clusters(&got) {
            for m in members {
                prop_assert!(fps[m as usize].distance(fps[r as usize]) <= k);
            }
        }
    }

    /// Verified dedup: exactly the pairs within k whose sets reach the
    /// threshold, with their similarity; copies (same fingerprint, same set)
    /// stay collapsed; kept documents follow from the verified pairs.
    #[test]
    fn verified_dedup_matches_brute_force(
        docs in prop::collection::vec((0u64..6, prop::collection::btree_set(0u32..10, 0..6)), 0..60),
        k in 0u32..4,
        t in prop::sample::select(vec![0.3, 0.5, 0.8, 1.0]),
    ) {
        // Few distinct fingerprints (small values), so groups and near pairs abound.
        let fps: Vec<u64> = docs.iter().map(|d| d.0 * 0x9 ).collect();
        let sets: Vec<Vec<u32>> = docs.iter().map(|d| d.1.iter().copied().collect()).collect();
        let d = design(64, k, 1);
        let dd = Dedup::new(&fps, k, &d).unwrap().verify(t, |i| sets[i as usize].as_slice());
        let mut got = Vec::new();
        dd.for_each_scored_pair(|a, b, dist, j| { got.push((a, b, dist, j.unwrap())); Ok::<(), ()>(()) }).unwrap();
        got.sort_unstable_by(|x, y| x.partial_cmp(y).unwrap());
        let mut expected = Vec::new();
        for (a, b, dist) in brute_pairs(&fps, k) {
            // A document without features is similar to nothing.
            let (x, y) = (&sets[a as usize], &sets[b as usize]);
            let j = jaccard(x, y);
            if !x.is_empty() && !y.is_empty() && j >= t {
                expected.push((a, b, dist, j));
            }
        }
        prop_assert_eq!(dd.pair_count(), expected.len() as u64);
        prop_assert_eq!(&got, &expected);
        let n = fps.len();
        let mut comp: Vec<usize> = (0..n).collect();
        fn root(c: &mut [usize], mut x: usize) -> usize { while c[x] != x { x = c[x]; } x }
        for &(a, b, ..) in &expected {
            let (ra, rb) = (root(&mut comp, a as usize), root(&mut comp, b as usize));
            if ra != rb { comp[ra.max(rb)] = ra.min(rb); }
        }
        let reps: Vec<u32> = (0..n).map(|i| root(&mut comp, i) as u32).collect();
        prop_assert_eq!(&dd.representatives(Policy::Components), &reps);
        // Verification that skips pairs already connected: the same components.
        let spanning = Dedup::new(&fps, k, &d).unwrap().verify_spanning_by(
            t,
            |i| { let s = &sets[i as usize]; (!s.is_empty()).then(|| neardup_core::spill::set_digest(s)) },
            |a, b| neardup_core::jaccard::jaccard_at_least(&sets[a as usize], &sets[b as usize], t),
        );
        prop_assert_eq!(spanning.representatives(Policy::Components), reps.clone());
        prop_assert!(spanning.pair_count() <= dd.pair_count());
        // Joined and verified a table at a time: the same pairs, or
        // (spanning) the same components.
        let digest = |i: u32| { let s = &sets[i as usize]; (!s.is_empty()).then(|| neardup_core::spill::set_digest(s)) };
        let score = |a: u32, b: u32| neardup_core::jaccard::jaccard_at_least(&sets[a as usize], &sets[b as usize], t);
        let streamed = Dedup::verified(fps.clone(), k, &d, t, digest, score, false).unwrap();
        let mut got2 = Vec::new();
        streamed.for_each_scored_pair(|a, b, dist, j| { got2.push((a, b, dist, j.unwrap())); Ok::<(), ()>(()) }).unwrap();
        got2.sort_unstable_by(|x, y| x.partial_cmp(y).unwrap());
        prop_assert_eq!(&got2, &expected);
        let streamed = Dedup::verified(fps.clone(), k, &d, t, digest, score, true).unwrap();
        prop_assert_eq!(streamed.representatives(Policy::Components), reps.clone());
        // A score that tells sets' sizes, so that the join screens pairs by
        // them: the same pairs and components.
        let sized = SizedJaccard { sets: &sets, threshold: t, scored: AtomicUsize::new(0) };
        let screened = Dedup::verified(fps.clone(), k, &d, t, digest, &sized, false).unwrap();
        let mut got3 = Vec::new();
        screened.for_each_scored_pair(|a, b, dist, j| { got3.push((a, b, dist, j.unwrap())); Ok::<(), ()>(()) }).unwrap();
        got3.sort_unstable_by(|x, y| x.partial_cmp(y).unwrap());
        prop_assert_eq!(&got3, &expected);
        let screened = Dedup::verified(fps.clone(), k, &d, t, digest, &sized, true).unwrap();
        prop_assert_eq!(screened.representatives(Policy::Components), reps);
    }
}

/// Jaccard similarity of sets of `u32`, with their sizes; counts its scores.
struct SizedJaccard<'a> {
    sets: &'a [Vec<u32>],
    threshold: f64,
    scored: AtomicUsize,
}

impl neardup_core::PairScore for &SizedJaccard<'_> {
    fn score(&self, a: u32, b: u32) -> f64 {
        self.scored
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (x, y) = (&self.sets[a as usize], &self.sets[b as usize]);
        neardup_core::jaccard::jaccard_at_least(x, y, self.threshold)
    }
    fn size(&self, doc: u32) -> Option<u32> {
        Some(self.sets[doc as usize].len() as u32)
    }
}

/// Multi-index blocks with a score that tells sets' sizes: the join screens
/// the candidates by size (fewer are scored), and the pairs and components
/// are those of the plain score.
#[test]
fn a_size_screen_in_the_join_changes_nothing_but_the_work() {
    let seeds: Vec<u128> = {
        let mut rng = neardup_core::rng::SplitMix64(11);
        (0..40)
            .map(|_| u128::from(rng.next()) << 64 | u128::from(rng.next()))
            .collect()
    };
    let (n, k) = (2000, 8);
    // Near copies of the seeds (up to k + 2 bits flipped), each with a set
    // of 1 to 60 values from its seed's range: a seed's copies have sets of
    // every size, so sizes rule out many candidates.
    let mut rng = neardup_core::rng::SplitMix64(3);
    let (fps, sets): (Vec<u128>, Vec<Vec<u32>>) = (0..n)
        .map(|_| {
            let s = (rng.next() % seeds.len() as u64) as usize;
            let flips = rng.next() % u64::from(k + 3);
            let f = (0..flips).fold(seeds[s], |f, _| f ^ (1u128 << (rng.next() % 128)));
            let (base, len) = (s as u32 * 100, 1 + (rng.next() % 60) as u32);
            let set = (base..base + len)
                .filter(|_| !rng.next().is_multiple_of(10))
                .collect();
            (f, set)
        })
        .unzip();
    let t = 0.7;
    let design = neardup_core::index::radius::RadiusDesign::new(128, k, 9).unwrap();
    let digest = |i: u32| Some(neardup_core::spill::set_digest(&sets[i as usize]));
    let plain_count = AtomicUsize::new(0);
    let plain = |a: u32, b: u32| {
        plain_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        neardup_core::jaccard::jaccard_at_least(&sets[a as usize], &sets[b as usize], t)
    };
    let sized = SizedJaccard {
        sets: &sets,
        threshold: t,
        scored: AtomicUsize::new(0),
    };
    let pairs = |d: &Dedup| {
        let mut v = Vec::new();
        d.for_each_scored_pair(|a, b, dist, j| {
            v.push((a, b, dist, j.unwrap().to_bits()));
            Ok::<(), ()>(())
        })
        .unwrap();
        v.sort_unstable();
        v
    };
    let want = Dedup::verified(fps.clone(), k, &design, t, digest, plain, false).unwrap();
    let got = Dedup::verified(fps.clone(), k, &design, t, digest, &sized, false).unwrap();
    assert!(want.pair_count() > 1000, "{} pairs", want.pair_count());
    assert_eq!(pairs(&got), pairs(&want));
    let (plain_scores, sized_scores) = (
        plain_count.load(std::sync::atomic::Ordering::Relaxed),
        sized.scored.load(std::sync::atomic::Ordering::Relaxed),
    );
    assert!(
        2 * sized_scores < plain_scores,
        "{sized_scores} scores with the screen, {plain_scores} without"
    );
    let want = Dedup::verified(fps.clone(), k, &design, t, digest, plain, true).unwrap();
    let got = Dedup::verified(fps, k, &design, t, digest, &sized, true).unwrap();
    assert_eq!(
        got.representatives(Policy::Components),
        want.representatives(Policy::Components)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// The streamed pair enumeration (a table at a time) lists
    /// every pair within k once: brute force's pairs, with their distances.
    #[test]
    fn streamed_pairs_match_brute_force(
        raw in prop::collection::vec(0u64..12, 0..60),
        k in 0u32..4,
    ) {
        let fps: Vec<u64> = raw.iter().map(|v| v.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58).collect();
        let mut got = Vec::new();
        for_each_pair_streamed(fps.clone(), k, &design(64, k, 0), |a, b, d| got.push((a, b, d))).unwrap();
        got.sort_unstable();
        let mut want: Vec<(u32, u32, u32)> = brute_pairs(&fps, k);
        want.sort_unstable();
        prop_assert_eq!(got, want);
    }

    /// The streamed join's pairs, and the order they come in, are the same
    /// with 1 and 3 threads (buckets joined in parallel), and brute force's.
    /// Up to 1,500 fingerprints, 128 bits wide, many sharing their top bits
    /// (crowded buckets).
    #[test]
    fn streamed_pairs_do_not_depend_on_the_threads(
        raw in prop::collection::vec(any::<u128>(), 0..1500),
        k in 1u32..8,
        crowd in 0u32..100,
        choice in 0usize..5,
    ) {
        let keep = u128::MAX >> crowd;
        let fps: Vec<u128> = raw.iter().map(|&v| v & keep).collect();
        streamed_pairs_match(&fps, k, &design(128, k, choice))?;
    }

    /// Keeping by preference (--keep-by): a component keeps its most preferred
    /// member; the incremental policy, in preference order, keeps a document
    /// unless one already kept is within k, and then points to the most
    /// preferred such one. Checked against brute force over every pair.
    #[test]
    fn representatives_by_preference_match_brute_force(
        raw in prop::collection::vec(0u64..8, 0..50),
        k in 0u32..3,
        seed in any::<u64>(),
    ) {
        let fps: Vec<u64> = raw.iter().map(|v| v * 0x5).collect();
        let n = fps.len();
        // A preference order: a seeded shuffle of the documents.
        let mut preference: Vec<u32> = (0..n as u32).collect();
        let mut state = seed | 1;
        for i in (1..n).rev() {
            state ^= state << 13; state ^= state >> 7; state ^= state << 17;
            preference.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let mut rank = vec![0usize; n];
        for (r, &d) in preference.iter().enumerate() { rank[d as usize] = r; }
        let near = |a: usize, b: usize| fps[a].distance(fps[b]) <= k;
        let dd = Dedup::new(&fps, k, &design(64, k, 0)).unwrap();
        // Components: the most preferred member of each connected component.
        let mut comp: Vec<usize> = (0..n).collect();
        fn root(c: &mut [usize], mut x: usize) -> usize { while c[x] != x { x = c[x]; } x }
        for (a, b, _) in brute_pairs(&fps, k) {
            let (ra, rb) = (root(&mut comp, a as usize), root(&mut comp, b as usize));
            if ra != rb { comp[ra.max(rb)] = ra.min(rb); }
        }
        let mut best: Vec<Option<usize>> = vec![None; n];
        for d in 0..n {
            let r = root(&mut comp, d);
            if best[r].is_none_or(|b| rank[d] < rank[b]) { best[r] = Some(d); }
        }
        let by_components: Vec<u32> = (0..n).map(|d| best[root(&mut comp, d)].unwrap() as u32).collect();
        prop_assert_eq!(&dd.representatives_by(Policy::Components, &preference), &by_components);
        // Incremental, in preference order.
        let mut kept: Vec<usize> = Vec::new();
        let mut by_incremental = vec![0u32; n];
        for &d in &preference {
            let d = d as usize;
            match kept.iter().filter(|&&x| near(x, d)).min_by_key(|&&x| rank[x]) {
                Some(&x) => by_incremental[d] = x as u32,
                None => { kept.push(d); by_incremental[d] = d as u32; }
            }
        }
        prop_assert_eq!(&dd.representatives_by(Policy::Incremental, &preference), &by_incremental);
        // The identity preference is the default.
        let identity: Vec<u32> = (0..n as u32).collect();
        for policy in [Policy::Components, Policy::Incremental] {
            prop_assert_eq!(dd.representatives_by(policy, &identity), dd.representatives(policy));
        }
        // The same answers from the list of pairs alone (as the Spark job
        // resolves them), in a shuffled order.
        let mut listed: Vec<(u32, u32)> = brute_pairs(&fps, k).into_iter().map(|(a, b, _)| (b, a)).collect();
        listed.reverse();
        for (policy, expected) in [(Policy::Components, &by_components), (Policy::Incremental, &by_incremental)] {
            prop_assert_eq!(
                &representatives_of_pairs(n, &listed, policy, Some(&preference)).unwrap(),
                expected
            );
            prop_assert_eq!(
                representatives_of_pairs(n, &listed, policy, None).unwrap(),
                dd.representatives(policy)
            );
        }
    }
}

#[test]
fn a_million_identical_fingerprints_are_one_cluster_quickly() {
    // The big bucket: linear in the output (the clusters), not quadratic.
    let mut fps = vec![0xdead_beef_u64; 1_000_000];
    fps.extend((0..1000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    let d = TableDesign::new(64, 3, &[5]).unwrap();
    let dd = Dedup::new(&fps, 3, &d).unwrap();
    assert_eq!(dd.distinct(), 1001);
    assert_eq!(dd.pair_count(), 1_000_000 * 999_999 / 2);
    let reps = dd.representatives(Policy::Components);
    assert!(reps[..1_000_000].iter().all(|&r| r == 0));
    let reps = dd.representatives(Policy::Incremental);
    assert!(reps[..1_000_000].iter().all(|&r| r == 0));
}

/// Both codings of compressed tables.
fn codings() -> impl Strategy<Value = neardup_core::index::Coding> {
    prop::sample::select(vec![
        neardup_core::index::Coding::Gaps,
        neardup_core::index::Coding::EliasFano,
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(80))]

    /// Compressed tables (either coding) answer exactly like brute force, whatever the block size.
    #[test]
    fn compressed_index_is_exact(fps in fingerprints::<u64>(64), k in 0u32..6, choice in 0usize..5, block in prop::sample::select(vec![1usize, 12, 16, 64, 512, 1024]), coding in codings(), qs in prop::collection::vec(any::<u64>(), 0..5)) {
        let d = design(64, k, choice);
        let entries: Vec<(u64, u64)> = fps.iter().enumerate().map(|(i, &f)| (i as u64, f)).collect();
        let c = neardup_core::index::CompressedIndex::build(d, entries.clone(), block, coding).unwrap();
        for &q in fps.iter().take(20).chain(&qs) {
            prop_assert_eq!(c.query(q, k).unwrap(), brute_query(&entries, q, k));
        }
    }

    /// A large batch on compressed tables, answered by walking each table,
    /// equals brute force query by query: near and far queries, in any order,
    /// with repeats.
    #[test]
    fn compressed_batch_is_exact(fps in fingerprints::<u64>(64), k in 0u32..6, choice in 0usize..5, block in prop::sample::select(vec![1usize, 16, 64, 1024]), coding in codings(), seed in any::<u64>()) {
        let d = design(64, k, choice);
        let entries: Vec<(u64, u64)> = fps.iter().enumerate().map(|(i, &f)| (i as u64, f)).collect();
        let c = neardup_core::index::CompressedIndex::build(d, entries.clone(), block, coding).unwrap();
        let mut rng = neardup_core::rng::SplitMix64(seed);
        let queries: Vec<u64> = (0..5000)
            .map(|i| match rng.next() % 3 {
                0 => rng.next(),
                _ => {
                    let mut q = fps[i % fps.len()];
                    for _ in 0..rng.next() % 5 {
                        q ^= 1 << (rng.next() % 64);
                    }
                    q
                }
            })
            .collect();
        let got = c.query_batch(&queries, k).unwrap();
        prop_assert_eq!(got.len(), queries.len());
        for (q, g) in queries.iter().zip(&got) {
            prop_assert_eq!(g, &brute_query(&entries, *q, k));
        }
    }

    #[test]
    fn compressed_index_128_is_exact(fps in fingerprints::<u128>(128), k in 0u32..10, block in prop::sample::select(vec![1usize, 16, 256]), coding in codings()) {
        let d = design(128, k, 0);
        let entries: Vec<(u64, u128)> = fps.iter().enumerate().map(|(i, &f)| (i as u64, f)).collect();
        let c = neardup_core::index::CompressedIndex::build(d, entries.clone(), block, coding).unwrap();
        for &q in fps.iter().take(20) {
            prop_assert_eq!(c.query(q, k).unwrap(), brute_query(&entries, q, k));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Runs of thousands of fingerprints sharing a prefix are compared by
    /// all threads: the same pairs as brute force, in the same order with 1
    /// and 3 threads.
    #[test]
    fn crowded_runs_shared_among_threads_give_the_same_pairs(
        raw in prop::collection::vec(any::<u128>(), 2100..2600),
        k in 1u32..6,
        crowd in 100u32..110,
        choice in 0usize..5,
    ) {
        let keep = u128::MAX >> crowd;
        let fps: Vec<u128> = raw.iter().map(|&v| v & keep).collect();
        streamed_pairs_match(&fps, k, &design(128, k, choice))?;
    }

    /// The design planned from the fingerprints themselves is one of the
    /// planner's options, the same on every call, and finds every pair
    /// within k (brute force), on crowded sets large enough to be sampled.
    #[test]
    fn a_design_planned_from_the_data_finds_every_pair(
        seeds in prop::collection::vec(any::<u128>(), 1..40),
        n in 1000usize..1500,
        k in 3u32..16,
        crowd in 0u32..60,
        seed: u64,
    ) {
        // Copies of a few seeds with up to k + 2 bits flipped, the top bits
        // cleared to crowd them.
        let mut rng = neardup_core::rng::SplitMix64(seed);
        let keep = u128::MAX >> crowd;
        let fps: Vec<u128> = (0..n)
            .map(|_| {
                let s = seeds[(rng.next() % seeds.len() as u64) as usize];
                let flips = rng.next() % u64::from(k + 3);
                (0..flips).fold(s, |f, _| f ^ (1u128 << (rng.next() % 128))) & keep
            })
            .collect();
        // Smaller samples than a run's (a debug build is slow to draw them).
        let chosen = plan_join_sampled(k, &fps, 4000, 100_000).unwrap();
        prop_assert_eq!(&plan_join_sampled(k, &fps, 4000, 100_000).unwrap(), &chosen);
        match &chosen {
            JoinDesign::Tables(d) => {
                let options = plan(128, k, n as f64, None).unwrap().options;
                prop_assert!(options.iter().any(|o| &o.design == d));
            }
            JoinDesign::Radius(d) => prop_assert!(radius_options(128, k).contains(d)),
        }
        streamed_pairs_match(&fps, k, &chosen)?;
    }
}

/// Without a list of pairs, a cluster of m near copies whose candidates all
/// verify costs about m scores, not one per candidate pair (m²/2).
#[test]
fn a_spanning_set_scores_a_cluster_of_copies_once_per_copy() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let m = 50u64;
    // Distinct fingerprints, all within k = 6 of each other.
    let fps: Vec<u64> = (0..m).collect();
    let k = 6;
    let scored = AtomicUsize::new(0);
    let score = |_: u32, _: u32| {
        scored.fetch_add(1, Ordering::Relaxed);
        1.0
    };
    let digest = |i: u32| Some(i as u128); // copies with their own features
    let d = design(64, k, 1);
    let spanning = Dedup::verified(fps.clone(), k, &d, 0.8, digest, score, true).unwrap();
    assert_eq!(
        spanning.representatives(Policy::Components),
        vec![0; m as usize]
    );
    assert_eq!(scored.load(Ordering::Relaxed), m as usize - 1);
    // Listing every pair scores them all.
    scored.store(0, Ordering::Relaxed);
    let all = Dedup::verified(fps, k, &d, 0.8, digest, score, false).unwrap();
    assert_eq!(all.pair_count(), m * (m - 1) / 2);
    assert_eq!(scored.load(Ordering::Relaxed), (m * (m - 1) / 2) as usize);
}

/// A score that can be told which documents come next hears of each
/// pair's second document before scoring the pair, and verification keeps
/// the pairs that a plain score keeps.
#[test]
fn a_score_hears_of_each_second_document_before_scoring_it() {
    use neardup_core::PairScore;
    use std::sync::Mutex;
    /// Scores by Jaccard similarity, logging (prefetch?, document).
    struct Logged<'a> {
        sets: &'a [Vec<u64>],
        log: &'a Mutex<Vec<(bool, u32)>>,
    }
    impl PairScore for Logged<'_> {
        fn score(&self, a: u32, b: u32) -> f64 {
            self.log.lock().unwrap().push((false, b));
            jaccard(&self.sets[a as usize], &self.sets[b as usize])
        }
        fn prefetch(&self, doc: u32) {
            self.log.lock().unwrap().push((true, doc));
        }
    }
    // 300 documents on 24 fingerprints, all within k = 8 of each other, and
    // sets on four ranges of values, overlapping more or less: tens of
    // thousands of candidate pairs, some verifying.
    let mut rng = neardup_core::rng::SplitMix64(7);
    let n = 300;
    let fps: Vec<u64> = (0..n).map(|i| (i % 3) << 60 | (rng.next() & 0x7)).collect();
    let sets: Vec<Vec<u64>> = (0..n)
        .map(|_| {
            let base = rng.next() % 4 * 100;
            (base..base + 40)
                .filter(|_| !rng.next().is_multiple_of(8))
                .collect()
        })
        .collect();
    let k = 8;
    let d = design(64, k, 1);
    let digest = |i: u32| Some(i as u128);
    let log = Mutex::new(Vec::new());
    let logged = Logged {
        sets: &sets,
        log: &log,
    };
    let heard = Dedup::verified(fps.clone(), k, &d, 0.7, digest, logged, false).unwrap();
    let plain = |a: u32, b: u32| jaccard(&sets[a as usize], &sets[b as usize]);
    let want = Dedup::verified(fps, k, &d, 0.7, digest, plain, false).unwrap();
    assert!(want.pair_count() > 100, "{} pairs", want.pair_count());
    assert_eq!(heard.pair_count(), want.pair_count());
    assert_eq!(
        heard.representatives(Policy::Components),
        want.representatives(Policy::Components)
    );
    let log = log.into_inner().unwrap();
    let mut prefetched = vec![false; n as usize];
    let mut scored = 0;
    for (is_prefetch, doc) in log {
        if is_prefetch {
            prefetched[doc as usize] = true;
        } else {
            assert!(
                prefetched[doc as usize],
                "document {doc} scored unannounced"
            );
            scored += 1;
        }
    }
    assert!(scored >= want.pair_count(), "{scored} scores");
}

/// Copies of a few seeds with up to `k + 2` bits flipped, the top `crowd`
/// bits cleared: crowded buckets and many pairs within k.
fn crowded<B: Bits>(seeds: &[u128], n: usize, k: u32, crowd: u32, seed: u64) -> Vec<B> {
    let mut rng = neardup_core::rng::SplitMix64(seed);
    let keep = (u128::MAX >> (128 - B::BITS)) >> crowd.min(B::BITS - 1);
    (0..n)
        .map(|_| {
            let s = seeds[(rng.next() % seeds.len() as u64) as usize];
            let flips = rng.next() % u64::from(k + 3);
            let f = (0..flips).fold(s, |f, _| f ^ (1u128 << (rng.next() % u64::from(B::BITS))));
            B::from_u128(f & keep)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every multi-index design finds each pair within k exactly once, in
    /// the same order with any number of threads (brute force), at both
    /// widths, from k = 0 to the join's largest.
    #[test]
    fn radius_designs_find_every_pair_once(
        seeds in prop::collection::vec(any::<u128>(), 1..30),
        n in 1usize..400,
        k in 0u32..25,
        crowd in 0u32..100,
        choice: usize,
        seed: u64,
    ) {
        let fps: Vec<u128> = crowded(&seeds, n, k, crowd, seed);
        // Blocks are at most 22 bits: 6 of them for 128 bits, 3 for 64, and
        // no more than k + 1.
        let options = radius_options(128, k);
        prop_assert_eq!(options.len() as u32, (k + 1).saturating_sub(5));
        if !options.is_empty() {
            streamed_pairs_match(&fps, k, &options[choice % options.len()])?;
        }
        let k = k.min(12);
        let narrow: Vec<u64> = crowded(&seeds, n, k, crowd / 2, seed);
        let options = radius_options(64, k);
        prop_assert_eq!(options.len() as u32, (k + 1).saturating_sub(2));
        if !options.is_empty() {
            streamed_pairs_match(&narrow, k, &options[choice % options.len()])?;
        }
    }
}

/// A design's blocks cover every bit once, and their radii add up to
/// exactly what k needs: one block within its radius for any pair within k.
#[test]
fn radius_designs_cover_the_bits_with_just_enough_radius() {
    for bits in [64u32, 128] {
        for k in 0..=24 {
            for d in radius_options(bits, k) {
                let mut next = 0;
                for b in &d.blocks {
                    assert_eq!(b.start, next, "{}", d.describe());
                    assert!(b.len >= 1 && b.len <= neardup_core::index::radius::MAX_BLOCK_BITS);
                    next += b.len;
                }
                assert_eq!(next, bits);
                let need: u32 = d.blocks.iter().map(|b| b.radius + 1).sum();
                assert_eq!(need, k + 1, "{}", d.describe());
            }
        }
    }
    assert!(
        RadiusDesign::new(128, 3, 5).is_err(),
        "more blocks than k + 1"
    );
    assert!(
        RadiusDesign::new(128, 19, 5).is_err(),
        "blocks wider than the directory"
    );
    assert!(RadiusDesign::new(96, 3, 4).is_err(), "no such width");
}

/// A bucket holding thousands of fingerprints (all of one block's value)
/// is shared among the threads and still gives each pair once.
#[test]
fn a_crowded_radius_bucket_is_joined_by_all_threads() {
    let mut rng = neardup_core::rng::SplitMix64(11);
    // Only the low 20 bits vary: the blocks above are one bucket.
    let mut fps: Vec<u64> = (0..4000).map(|_| rng.next() & 0xf_ffff).collect();
    fps.sort_unstable();
    fps.dedup();
    let d = RadiusDesign::new(64, 6, 7).unwrap();
    let got = Dedup::new(&fps, 6, &d).unwrap();
    let mut pairs = Vec::new();
    got.for_each_pair(|a, b, dist| {
        pairs.push((a, b, dist));
        Ok::<(), ()>(())
    })
    .unwrap();
    pairs.sort_unstable();
    assert_eq!(pairs, brute_pairs(&fps, 6));
    streamed_pairs_match(&fps, 6, &d).unwrap();
}
