//! Micro-benchmarks of the index: one online query against plain and compressed
//! tables and a brute-force popcount scan, a batch, and the self-join, on
//! uniformly random 64-bit fingerprints with 1% planted near-duplicates, k = 3.
//! `cargo bench -p neardup-core --bench index`; `NEARDUP_BENCH_N` sets how many
//! are stored (default 1 million). The figures at 10 and 100 million come from
//! `neardup bench index`.

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use neardup_core::dedup::Dedup;
use neardup_core::index::{Coding, CompressedIndex, Index, plan, plan_join};
use neardup_core::rng::SplitMix64;

const K: u32 = 3;

/// `n` random fingerprints, 1% of them 1 to 3 bits from an earlier one.
fn corpus(n: usize, rng: &mut SplitMix64) -> Vec<u64> {
    let mut v: Vec<u64> = Vec::with_capacity(n);
    for i in 0..n {
        if i > 0 && rng.next().is_multiple_of(100) {
            let mut x = v[(rng.next() % i as u64) as usize];
            for _ in 0..1 + rng.next() % 3 {
                x ^= 1 << (rng.next() % 64);
            }
            v.push(x);
        } else {
            v.push(rng.next());
        }
    }
    v
}

/// Queries: half 1 to 3 bits from a stored fingerprint, half random.
fn queries(fps: &[u64], count: usize, rng: &mut SplitMix64) -> Vec<u64> {
    (0..count)
        .map(|i| {
            if i % 2 == 0 {
                let mut x = fps[(rng.next() % fps.len() as u64) as usize];
                for _ in 0..1 + rng.next() % 3 {
                    x ^= 1 << (rng.next() % 64);
                }
                x
            } else {
                rng.next()
            }
        })
        .collect()
}

fn index(c: &mut Criterion) {
    let n: usize = std::env::var("NEARDUP_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let mut rng = SplitMix64(7);
    let fps = corpus(n, &mut rng);
    let qs = queries(&fps, 200_000, &mut rng);
    let chosen = plan(64, K, n as f64, None).expect("a design");
    let design = chosen.options[chosen.chosen].design.clone();
    let entries = || fps.iter().enumerate().map(|(i, &f)| (i as u64, f));
    let plain = Index::build(design.clone(), entries()).expect("built");
    let compressed =
        CompressedIndex::build(design.clone(), entries(), 1024, Coding::EliasFano).expect("built");
    let gaps =
        CompressedIndex::build(design.clone(), entries(), 1024, Coding::Gaps).expect("built");

    let mut g = c.benchmark_group(format!("query N={n}"));
    let mut i = 0;
    g.bench_function("brute-force scan", |b| {
        b.iter(|| {
            i = (i + 1) % qs.len();
            let q = qs[i];
            fps.iter().filter(|&&f| (f ^ q).count_ones() <= K).count()
        })
    });
    g.bench_function("plain tables", |b| {
        b.iter(|| {
            i = (i + 1) % qs.len();
            plain.query(qs[i], K).expect("query")
        })
    });
    g.bench_function("compressed tables", |b| {
        b.iter(|| {
            i = (i + 1) % qs.len();
            compressed.query(qs[i], K).expect("query")
        })
    });
    g.bench_function("compressed tables, paper's codes", |b| {
        b.iter(|| {
            i = (i + 1) % qs.len();
            gaps.query(qs[i], K).expect("query")
        })
    });
    g.finish();

    // 10,000 queries are answered one by one; 60,000, about ten per block,
    // by walking the tables.
    for count in [10_000, 60_000, 200_000] {
        let batch = &qs[..count];
        let mut g = c.benchmark_group(format!("batch of {count}, N={n}"));
        g.sample_size(10);
        g.bench_function("plain tables", |b| {
            b.iter(|| plain.query_batch(batch, K).expect("batch"))
        });
        g.bench_function("compressed tables", |b| {
            b.iter(|| compressed.query_batch(batch, K).expect("batch"))
        });
        g.finish();
    }

    let join = plan_join(64, K, n as f64).expect("a join design");
    let mut g = c.benchmark_group(format!("self-join N={n}"));
    g.sample_size(10);
    g.bench_function("dedup", |b| {
        b.iter_batched(
            || fps.clone(),
            |v| Dedup::from_vec(v, K, &join).expect("join"),
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, index);
criterion_main!(benches);
