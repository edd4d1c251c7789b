//! `neardup bench index`: the index against a brute-force scan, measured in the
//! same run, on uniformly random fingerprints with 1% planted near-duplicates.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use neardup_core::dedup::Dedup;
use neardup_core::index::{Index, plan, plan_join};
use neardup_core::rng::SplitMix64;

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  neardup bench index                          # N = 10 million, k = 3
  neardup bench index --n 1000000 --queries 20000
  neardup bench index --batch-n 100000000      # also 1M queries against 100M stored (needs ~14 GB)")]
pub struct IndexArgs {
    /// Stored fingerprints.
    #[arg(long, default_value_t = 10_000_000)]
    pub n: usize,

    /// Online queries timed one by one (half near a stored fingerprint, half random).
    #[arg(long, default_value_t = 200_000)]
    pub queries: usize,

    /// Largest distance searched.
    #[arg(long, default_value_t = 3)]
    pub k: u32,

    /// Also time a batch of 1 million queries against this many stored fingerprints.
    #[arg(long)]
    pub batch_n: Option<usize>,

    /// Skip the whole-process self-join (which writes a fingerprint file and runs
    /// `neardup dedup --fingerprints` on it).
    #[arg(long)]
    pub no_join: bool,
}

/// Reproducible random fingerprints.
struct Rng(SplitMix64);
impl Rng {
    fn new(seed: u64) -> Self {
        Rng(SplitMix64(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next()
    }
    fn flip(&mut self, x: u64) -> u64 {
        let flips = 1 + self.next() % 3;
        let mut y = x;
        for _ in 0..flips {
            y ^= 1 << (self.next() % 64);
        }
        y
    }
}

/// `n` uniformly random fingerprints, 1% of them near copies (1 to 3 bits
/// flipped) of earlier ones.
pub fn corpus(n: usize, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        if i > 0 && rng.next().is_multiple_of(100) {
            let j = (rng.next() % i as u64) as usize;
            let x = rng.flip(v[j]);
            v.push(x);
        } else {
            v.push(rng.next());
        }
    }
    v
}

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    Ok(rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub fn run(args: IndexArgs) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let (n, k) = (args.n, args.k);
    if n < 2 {
        bail!("--n must be at least 2");
    }
    let fps = corpus(n, 1);
    let p = plan(64, k, n as f64, None)?;
    let design = p.options[p.chosen].design.clone();
    writeln!(
        out,
        "# index: N = {n} random 64-bit fingerprints (1% planted near-duplicates), k = {k}"
    )?;
    writeln!(out, "  design: {}", design.describe())?;

    // Build, 1 and 2 threads.
    let mut index = None;
    for threads in [1, 2] {
        let t = Instant::now();
        let built = pool(threads)?.install(|| {
            Index::build(
                design.clone(),
                fps.iter().enumerate().map(|(i, &f)| (i as u64, f)),
            )
        })?;
        writeln!(
            out,
            "  build: {:.2} s with {threads} thread(s)",
            t.elapsed().as_secs_f64()
        )?;
        index = Some(built);
    }
    let index = index.expect("built");
    writeln!(
        out,
        "  memory: {:.0} MB ({:.0} bytes per fingerprint)",
        index.memory() as f64 / 1e6,
        index.memory() as f64 / n as f64
    )?;

    // Online queries, one thread, each timed.
    let mut rng = Rng::new(7);
    let queries: Vec<u64> = (0..args.queries)
        .map(|i| {
            if i % 2 == 0 {
                {
                    let j = (rng.next() % n as u64) as usize;
                    rng.flip(fps[j])
                }
            } else {
                rng.next()
            }
        })
        .collect();
    let mut lat = Vec::with_capacity(queries.len());
    let mut found = 0usize;
    for &q in &queries {
        let t = Instant::now();
        let r = index.query(q, k)?;
        lat.push(t.elapsed().as_nanos() as f64);
        found += r.len();
    }
    lat.sort_by(f64::total_cmp);
    // Brute force: a popcount scan of every stored fingerprint.
    let brute_q = 20.min(queries.len());
    let t = Instant::now();
    let mut brute_found = 0usize;
    for &q in &queries[..brute_q] {
        brute_found += fps.iter().filter(|&&f| (f ^ q).count_ones() <= k).count();
    }
    let brute = t.elapsed().as_secs_f64() / brute_q as f64 * 1e9;
    let index_found: usize = queries[..brute_q]
        .iter()
        .map(|&q| index.query(q, k).map(|r| r.len()))
        .sum::<Result<usize, _>>()?;
    if brute_found != index_found {
        bail!("the index found {index_found} matches where brute force found {brute_found}");
    }
    writeln!(
        out,
        "  online query, 1 thread ({} queries, {found} matches): p50 {:.2} µs, p99 {:.2} µs, mean {:.2} µs; brute-force scan {:.0} µs per query ({:.0}x slower than p50)",
        queries.len(),
        percentile(&lat, 0.5) / 1e3,
        percentile(&lat, 0.99) / 1e3,
        lat.iter().sum::<f64>() / lat.len() as f64 / 1e3,
        brute / 1e3,
        brute / percentile(&lat, 0.5)
    )?;

    // Batch queries.
    let mut plain_batch = Vec::new();
    for threads in [1, 2] {
        let t = Instant::now();
        let r = pool(threads)?.install(|| index.query_batch(&queries, k))?;
        let s = t.elapsed().as_secs_f64();
        plain_batch.push((threads, s));
        writeln!(
            out,
            "  batch of {} queries, {threads} thread(s): {:.3} s ({:.2} M queries/s, {} matches)",
            queries.len(),
            s,
            queries.len() as f64 / s / 1e6,
            r.iter().map(Vec::len).sum::<usize>()
        )?;
    }

    // Compressed tables: bits per key and query time against the plain tables.
    let bound = 64.0 - (n as f64).log2();
    // Both codings: Elias–Fano (the default) and the paper's codes of highest
    // differing bits, at the paper's 1 KiB blocks and smaller ones.
    use neardup_core::index::Coding;
    for (coding, block) in [
        (Coding::EliasFano, 1024usize),
        (Coding::EliasFano, 512),
        (Coding::Gaps, 1024),
        (Coding::Gaps, 256),
    ] {
        let t = Instant::now();
        let c = neardup_core::index::CompressedIndex::build(
            design.clone(),
            fps.iter().enumerate().map(|(i, &f)| (i as u64, f)),
            block,
            coding,
        )?;
        let build_s = t.elapsed().as_secs_f64();
        let (stream, with_dir) = c.bits_per_key();
        // Timed alone, as the plain index was above; then each query on both
        // indexes in turn (which first alternates), so that the ratio compares
        // the two under the same load on this shared machine, though each then
        // finds its caches cooler than alone.
        let mut alone = Vec::with_capacity(queries.len());
        for &q in &queries {
            let t = Instant::now();
            std::hint::black_box(c.query(q, k)?);
            alone.push(t.elapsed().as_nanos() as f64);
        }
        alone.sort_by(f64::total_cmp);
        let mut clat = Vec::with_capacity(queries.len());
        let mut plat = Vec::with_capacity(queries.len());
        for (i, &q) in queries.iter().enumerate() {
            for compressed in [i % 2 == 0, i % 2 == 1] {
                let t = Instant::now();
                if compressed {
                    std::hint::black_box(c.query(q, k)?);
                    clat.push(t.elapsed().as_nanos() as f64);
                } else {
                    std::hint::black_box(index.query(q, k)?);
                    plat.push(t.elapsed().as_nanos() as f64);
                }
            }
        }
        clat.sort_by(f64::total_cmp);
        plat.sort_by(f64::total_cmp);
        for &q in queries.iter().take(200) {
            if c.query(q, k)? != index.query(q, k)? {
                bail!("compressed and plain tables disagree");
            }
        }
        writeln!(
            out,
            "  compressed tables, {} coding, {block}-byte blocks: {:.1} bits per key per table ({:.1} with block keys) vs bound 64 - log2 N + 4 = {:.1}; memory {:.0} MB; query timed alone p50 {:.2} µs ({:.2}x plain alone above), p99 {:.2} µs; timed in turn with plain p50 {:.2} µs ({:.2}x plain in turn); build {build_s:.1} s; {} keys per block",
            coding.name(),
            stream,
            with_dir,
            bound + 4.0,
            c.memory() as f64 / 1e6,
            percentile(&alone, 0.5) / 1e3,
            percentile(&alone, 0.5) / percentile(&lat, 0.5),
            percentile(&alone, 0.99) / 1e3,
            percentile(&clat, 0.5) / 1e3,
            percentile(&clat, 0.5) / percentile(&plat, 0.5),
            c.block_keys(),
        )?;
        // The same batch as above, answered by walking each table once.
        let mut walked = Vec::new();
        for &(threads, plain_s) in &plain_batch {
            let t = Instant::now();
            let r = pool(threads)?.install(|| c.query_batch(&queries, k))?;
            let s = t.elapsed().as_secs_f64();
            if r.iter().map(Vec::len).sum::<usize>() != found {
                bail!("the compressed batch found other matches than the plain queries");
            }
            walked.push(format!(
                "{threads} thread(s) {s:.3} s ({:.2}x plain)",
                s / plain_s
            ));
        }
        writeln!(
            out,
            "    batch of {} queries: {}",
            queries.len(),
            walked.join(", ")
        )?;
    }

    drop(index);

    // Self-join in memory, 1 and 2 threads.
    let join_design = plan_join(64, k, n as f64)?;
    for threads in [1, 2] {
        let t = Instant::now();
        let d = pool(threads)?.install(|| Dedup::new(&fps, k, &join_design))?;
        writeln!(
            out,
            "  self-join in memory ({}), {threads} thread(s): {:.2} s, {} pairs",
            join_design.describe(),
            t.elapsed().as_secs_f64(),
            d.pair_count()
        )?;
    }

    if !args.no_join {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("fps.jsonl");
        {
            let mut w = std::io::BufWriter::new(std::fs::File::create(&path)?);
            for (i, f) in fps.iter().enumerate() {
                writeln!(w, "{{\"id\":{i},\"simhash\":\"{f:016x}\"}}")?;
            }
            w.flush()?;
        }
        let exe: PathBuf = std::env::current_exe().context("cannot find the neardup executable")?;
        let t = Instant::now();
        let o = std::process::Command::new(exe)
            .args(["dedup", "--fingerprints"])
            .arg(&path)
            .args(["--k", &k.to_string(), "--pairs"])
            .arg(dir.path().join("pairs.jsonl"))
            .output()?;
        let s = t.elapsed().as_secs_f64();
        let err = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            bail!("neardup dedup failed: {err}");
        }
        let peak = err
            .split("peak memory ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or("?");
        writeln!(
            out,
            "  self-join from a {:.0} MB file, whole process (`neardup dedup --fingerprints --pairs`): {s:.2} s, peak memory {peak} MB",
            std::fs::metadata(&path)?.len() as f64 / 1e6
        )?;
    }

    if let Some(big) = args.batch_n {
        let fps = corpus(big, 3);
        let p = plan(64, k, big as f64, None)?;
        let design = p.options[p.chosen].design.clone();
        let t = Instant::now();
        let index = Index::build(
            design.clone(),
            fps.iter().enumerate().map(|(i, &f)| (i as u64, f)),
        )?;
        writeln!(
            out,
            "# batch: N = {big}, {}; build {:.1} s, {:.1} GB",
            design.describe(),
            t.elapsed().as_secs_f64(),
            index.memory() as f64 / 1e9
        )?;
        let mut rng = Rng::new(11);
        let qs: Vec<u64> = (0..1_000_000)
            .map(|i| {
                if i % 2 == 0 {
                    {
                        let j = (rng.next() % big as u64) as usize;
                        rng.flip(fps[j])
                    }
                } else {
                    rng.next()
                }
            })
            .collect();
        for threads in [1, 2] {
            let t = Instant::now();
            let r = pool(threads)?.install(|| index.query_batch(&qs, k))?;
            writeln!(
                out,
                "  1M queries, {threads} thread(s): {:.2} s ({} matches)",
                t.elapsed().as_secs_f64(),
                r.iter().map(Vec::len).sum::<usize>()
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
