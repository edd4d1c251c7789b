//! Measures the online index: build time, bytes per stored fingerprint, and
//! single-threaded query latency and candidates, for the design the online
//! planner chooses (and, with `tables`, for the fastest permuted tables the
//! planner weighs at the same k within 4 KB per document).
//!
//! `cargo run --release -p neardup-core --example online_index -- N BITS K [tables | blocks=M] [file=PATH]`
//! (`blocks=M`: the weighed design of M blocks instead of the chosen one;
//! `file=PATH`: fingerprints read from a file of little-endian 8- or 16-byte
//! words, the first N stored and the next 10,000 queried as new documents)
//!
//! The fingerprints are clustered, as centred fingerprints of text are:
//! 2,000 random topic centres; each document is a centre with every bit
//! flipped with a probability drawn per topic from 0.20 to 0.45 (two
//! documents of one topic then differ in 41 to 63 bits of 128, unrelated
//! ones in 64), and one document in ten is a near copy of an earlier one,
//! 1 to k + 3 bits from it. Queries: half near copies of stored
//! fingerprints (0 to k + 3 bits away), half new documents of the topics.

use std::time::Instant;

use neardup_core::index::{
    Bits, Index, MultiIndex, ONLINE_BYTES_PER_DOCUMENT, OnlineDesign, OnlineOption, plan_online,
};
use neardup_core::rng::SplitMix64;

struct Topics<B> {
    centres: Vec<(B, f64)>,
}

impl<B: Bits> Topics<B> {
    fn new(rng: &mut SplitMix64) -> Self {
        let centres = (0..2000)
            .map(|_| {
                let c = B::from_u128(u128::from(rng.next()) << 64 | u128::from(rng.next()));
                let p = 0.20 + 0.25 * (rng.next() % 1000) as f64 / 1000.0;
                (c, p)
            })
            .collect();
        Topics { centres }
    }

    fn document(&self, rng: &mut SplitMix64) -> B {
        let (c, p) = self.centres[(rng.next() % self.centres.len() as u64) as usize];
        let threshold = (p * u64::MAX as f64) as u64;
        (0..B::BITS).fold(c, |x, b| {
            if rng.next() < threshold {
                x.xor(B::mask(b, 1))
            } else {
                x
            }
        })
    }
}

fn near<B: Bits>(x: B, flips: u32, rng: &mut SplitMix64) -> B {
    (0..flips).fold(x, |x, _| {
        x.xor(B::mask((rng.next() % u64::from(B::BITS)) as u32, 1))
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Times `query` over `queries` one at a time: (p50 µs, p99 µs, queries/s, mean matches).
fn time_queries<B: Bits>(queries: &[B], mut query: impl FnMut(B) -> usize) -> (f64, f64, f64, f64) {
    let mut lat = Vec::with_capacity(queries.len());
    let mut matches = 0usize;
    let all = Instant::now();
    for &q in queries {
        let t = Instant::now();
        matches += query(q);
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let total = all.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    (
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        queries.len() as f64 / total,
        matches as f64 / queries.len() as f64,
    )
}

fn run<B: Bits>(n: usize, k: u32, tables: bool, blocks: Option<u32>, file: Option<&str>) {
    let mut rng = SplitMix64(42);
    let topics = Topics::<B>::new(&mut rng);
    let t = Instant::now();
    // From a file: its first n fingerprints are stored, the next 10,000
    // are the new documents queried.
    let read: Option<Vec<B>> = file.map(|path| {
        let bytes = std::fs::read(path).expect("a readable file of fingerprints");
        let width = B::BITS as usize / 8;
        assert!(
            bytes.len() >= (n + 10_000) * width,
            "{path}: fewer than N + 10,000 fingerprints"
        );
        bytes
            .chunks_exact(width)
            .take(n + 10_000)
            .map(|c| {
                let mut v = [0u8; 16];
                v[..width].copy_from_slice(c);
                B::from_u128(u128::from_le_bytes(v))
            })
            .collect()
    });
    let mut fps: Vec<B> = Vec::with_capacity(n);
    for i in 0..n {
        if let Some(r) = &read {
            fps.push(r[i]);
        } else if i > 0 && rng.next().is_multiple_of(10) {
            let base = fps[(rng.next() % i as u64) as usize];
            let d = 1 + (rng.next() % u64::from(k + 3)) as u32;
            fps.push(near(base, d, &mut rng));
        } else {
            fps.push(topics.document(&mut rng));
        }
    }
    let queries: Vec<B> = (0..20_000)
        .map(|i| {
            if i % 2 == 0 {
                let x = fps[(rng.next() % n as u64) as usize];
                near(x, (rng.next() % u64::from(k + 4)) as u32, &mut rng)
            } else if let Some(r) = &read {
                r[n + (i / 2) % 10_000]
            } else {
                topics.document(&mut rng)
            }
        })
        .collect();
    println!(
        "{n} {} {}-bit fingerprints and {} queries made in {:.1} s",
        if read.is_some() { "read" } else { "clustered" },
        B::BITS,
        queries.len(),
        t.elapsed().as_secs_f64()
    );
    // The planner sees the first documents, as the service's would.
    let sample = &fps[..fps.len().min(10_000)];
    let plan = plan_online(k, n as f64, sample, ONLINE_BYTES_PER_DOCUMENT).expect("a plan");
    let show = |o: &OnlineOption| {
        format!(
            "{}: est. {:.0} probes, {:.0} candidates, {:.1} B/doc, {:.1} µs",
            o.design.describe(),
            o.probes,
            o.candidates,
            o.bytes_per_document,
            o.query_ns / 1000.0
        )
    };
    println!("k = {k}: planner chose {}", show(plan.option()));
    let design = match blocks {
        Some(m) => {
            let o = plan
                .options
                .iter()
                .find(|o| matches!(&o.design, OnlineDesign::Blocks(d) if d.blocks.len() == m as usize))
                .expect("a design of that many blocks");
            println!("  measuring instead {}", show(o));
            &o.design
        }
        None => plan.design(),
    };
    let entries = || fps.iter().enumerate().map(|(i, &f)| (i as u64, f));
    match design {
        OnlineDesign::Blocks(d) => {
            let t = Instant::now();
            let index = MultiIndex::build(d.clone(), entries()).expect("built");
            let build = t.elapsed().as_secs_f64();
            let mut work: Vec<f64> = queries
                .iter()
                .map(|&q| index.work(q).candidates as f64)
                .collect();
            let cands = work.iter().sum::<f64>() / queries.len() as f64;
            work.sort_by(f64::total_cmp);
            let cands_p99 = percentile(&work, 0.99);
            let probes = index.work(queries[0]).probes;
            let (p50, p99, qps, m) =
                time_queries(&queries, |q| index.query(q, k).expect("k").len());
            println!(
                "  blocks: build {build:.2} s, {:.1} bytes/doc, {probes} probes, {cands:.0} \
                 candidates/query (p99 {cands_p99:.0}), p50 {p50:.1} µs, p99 {p99:.1} µs, {qps:.0} queries/s on one \
                 thread, {m:.2} matches/query",
                index.memory() as f64 / n as f64
            );
            let t = Instant::now();
            let answers = index.query_batch(&queries, k).expect("k");
            println!(
                "  blocks, batch on {} threads: {:.0} queries/s ({} matches)",
                rayon::current_num_threads(),
                queries.len() as f64 / t.elapsed().as_secs_f64(),
                answers.iter().map(Vec::len).sum::<usize>()
            );
        }
        OnlineDesign::Tables(_) => {}
    }
    let table_design = match design {
        OnlineDesign::Tables(d) => Some(d.clone()),
        _ if tables => {
            // The fastest permuted tables the planner weighed within 4 KB
            // per document.
            let roomy = plan_online(k, n as f64, sample, 4096.0).expect("a plan");
            roomy
                .options
                .iter()
                .filter(|o| matches!(o.design, OnlineDesign::Tables(_)))
                .min_by(|a, b| a.query_ns.total_cmp(&b.query_ns))
                .map(|o| {
                    println!("  tables weighed: {}", show(o));
                    match &o.design {
                        OnlineDesign::Tables(d) => d.clone(),
                        OnlineDesign::Blocks(_) => unreachable!("filtered"),
                    }
                })
        }
        _ => None,
    };
    if let Some(d) = table_design {
        let t = Instant::now();
        let index = Index::build(d, entries()).expect("built");
        let build = t.elapsed().as_secs_f64();
        let (p50, p99, qps, m) = time_queries(&queries, |q| index.query(q, k).expect("k").len());
        println!(
            "  tables ({}): build {build:.2} s, {:.1} bytes/doc, p50 {p50:.1} µs, p99 {p99:.1} \
             µs, {qps:.0} queries/s on one thread, {m:.2} matches/query",
            index.design().tables.len(),
            index.memory() as f64 / n as f64
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: online_index N BITS K [tables | blocks=M] [file=PATH]";
    let n: usize = args.first().and_then(|s| s.parse().ok()).expect(usage);
    let bits: u32 = args.get(1).and_then(|s| s.parse().ok()).expect(usage);
    let k: u32 = args.get(2).and_then(|s| s.parse().ok()).expect(usage);
    let tables = args.iter().skip(3).any(|s| s == "tables");
    let option = |name: &str| args.iter().skip(3).find_map(|s| s.strip_prefix(name));
    let blocks = option("blocks=").map(|m| m.parse().expect(usage));
    let file = option("file=");
    match bits {
        64 => run::<u64>(n, k, tables, blocks, file),
        128 => run::<u128>(n, k, tables, blocks, file),
        _ => panic!("{usage}: BITS is 64 or 128"),
    }
}
