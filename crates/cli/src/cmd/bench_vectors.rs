//! `neardup bench vectors`: dense-vector fingerprinting throughput against a
//! plain matrix product of the same size, and the whole `dedup` of a `.npy`
//! file of embeddings-like vectors with planted near-duplicates.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use neardup_core::rng::SplitMix64;
use neardup_core::{FingerprintConfig, SimHasher, Width};

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  neardup bench vectors                          # 384 and 768 dimensions, then dedup of 1M x 768
  neardup bench vectors --dedup-n 0              # throughput only")]
pub struct VectorsArgs {
    /// Vectors fingerprinted per measurement.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub n: usize,

    /// Dimensions to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "384,768",
        value_name = "D,..."
    )]
    pub dims: Vec<usize>,

    /// Vectors (768 dimensions) in the `.npy` file deduplicated end to end
    /// with 1 and 2 threads; 0 skips it.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pub dedup_n: usize,

    /// Where the `.npy` file is written (default: the system's temporary folder).
    #[arg(long, value_name = "DIR")]
    pub tmp_dir: Option<PathBuf>,
}

/// Standard normal entries, as embeddings' coordinates roughly are.
fn random_vectors(n: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    let mut out = Vec::with_capacity(n * dim);
    while out.len() < n * dim {
        let r = (-2.0 * rng.unit().ln()).sqrt();
        let t = std::f64::consts::TAU * rng.unit();
        out.push((r * t.cos()) as f32);
        out.push((r * t.sin()) as f32);
    }
    out.truncate(n * dim);
    out
}

/// The baseline: the same projections as a plain triple loop (n x d times
/// d x 64), as a straightforward matrix product compiles.
fn plain_product(vectors: &[f32], planes: &[f32], dim: usize) -> u64 {
    let mut check = 0u64;
    let mut acc = [0f32; 64];
    for v in vectors.chunks_exact(dim) {
        acc.fill(0.0);
        for (j, &x) in v.iter().enumerate() {
            for (i, a) in acc.iter_mut().enumerate() {
                *a += x * planes[j * 64 + i];
            }
        }
        let mut bits = 0u64;
        for (i, &a) in acc.iter().enumerate() {
            bits |= u64::from(a > 0.0) << i;
        }
        check ^= bits;
    }
    check
}

pub fn run(args: VectorsArgs) -> Result<ExitCode> {
    println!(
        "dense vectors, 64 bits, 1 thread, {} vectors per run",
        args.n
    );
    for &dim in &args.dims {
        if dim == 0 {
            bail!("--dims: a dimension must be at least 1");
        }
        let vectors = random_vectors(args.n, dim, dim as u64);
        let hasher = SimHasher::new(FingerprintConfig::vectors(Width::W64, Some(dim), 0))?;
        hasher.fingerprint_dense(&vectors[..dim])?; // draws the hyperplanes
        let planes = random_vectors(dim, 64, 1);
        let mut best = (f64::MAX, f64::MAX);
        for _ in 0..3 {
            let t = Instant::now();
            let mut check = 0u64;
            for v in vectors.chunks_exact(dim) {
                check ^= hasher.fingerprint_dense(v)?.as_u64();
            }
            std::hint::black_box(check);
            let ours = t.elapsed().as_secs_f64();
            let t = Instant::now();
            std::hint::black_box(plain_product(&vectors, &planes, dim));
            let plain = t.elapsed().as_secs_f64();
            best = (best.0.min(ours), best.1.min(plain));
        }
        let rate = |s: f64| args.n as f64 / s;
        println!(
            "  d = {dim:4}: {:>9.0} vectors/s ({:.2} us each); plain matrix product {:>9.0} vectors/s; ratio {:.2}x",
            rate(best.0),
            best.0 / args.n as f64 * 1e6,
            rate(best.1),
            best.1 / best.0,
        );
    }
    if args.dedup_n > 0 {
        bench_dedup(&args)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `n` 768-dimension vectors, a tenth of them noisy copies of others
/// (cosine about 0.99), and times `neardup dedup` on them.
fn bench_dedup(args: &VectorsArgs) -> Result<()> {
    const DIM: usize = 768;
    let dir = tempfile::Builder::new()
        .prefix("neardup-bench-vectors")
        .tempdir_in(args.tmp_dir.clone().unwrap_or_else(std::env::temp_dir))?;
    let path = dir.path().join("vectors.npy");
    let n = args.dedup_n;
    let started = Instant::now();
    {
        let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(&path)?);
        let mut all = Vec::with_capacity(n * DIM);
        let mut rng = SplitMix64(42);
        let chunk = 10_000;
        for start in (0..n).step_by(chunk) {
            let rows = chunk.min(n - start);
            let mut block = random_vectors(rows, DIM, start as u64 + 7);
            for r in 0..rows {
                // One row in ten copies an earlier row, with noise of a tenth.
                if start + r >= 10 && rng.next().is_multiple_of(10) {
                    let src = (rng.next() % (start + r) as u64) as usize;
                    for j in 0..DIM {
                        let x = if src >= start {
                            block[(src - start) * DIM + j]
                        } else {
                            all_row(&all, src, DIM)[j]
                        };
                        block[r * DIM + j] = x + 0.1 * block[r * DIM + j];
                    }
                }
            }
            all.extend_from_slice(&block);
        }
        crate::npy::write_f32(&mut out, DIM, &all)?;
        out.flush()?;
    }
    let size = std::fs::metadata(&path)?.len();
    println!(
        "\ndedup of {n} vectors of {DIM} dimensions from a .npy file ({:.1} GB, written in {:.1} s), \
         a tenth of them noisy copies:",
        size as f64 / 1e9,
        started.elapsed().as_secs_f64()
    );
    let exe = std::env::current_exe().context("cannot find the neardup binary")?;
    for threads in [1, 2] {
        let t = Instant::now();
        let output = Command::new(&exe)
            .args(["dedup", "--threads", &threads.to_string(), "--pairs"])
            .arg(dir.path().join("pairs.jsonl"))
            .arg(&path)
            .stdin(Stdio::null())
            .output()?;
        let secs = t.elapsed().as_secs_f64();
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            bail!("neardup dedup failed: {stderr}");
        }
        println!("  {threads} thread(s): {secs:.2} s wall");
        for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
            println!("    {line}");
        }
    }
    Ok(())
}

fn all_row(all: &[f32], row: usize, dim: usize) -> &[f32] {
    &all[row * dim..(row + 1) * dim]
}
