//! `neardup bench dedup`: corpus-scale dedup, verified and not, with 1 and 2
//! threads, on a generated corpus of real text with planted near-duplicates.
//!
//! Each run is a child `neardup dedup --clusters FILE --keep FILE` process (what
//! a corpus cleaner asks for; `--pairs` lists every pair of a heavy cluster,
//! quadratic in its size), so that its wall time and peak resident memory
//! (`wait4`'s `ru_maxrss`) are its own.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use neardup_core::normalize::{is_han, strip_html};
use neardup_core::rng::SplitMix64;

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  neardup bench dedup --gb 1                 # mixed English and Chinese, 1 and 2 threads
  neardup bench dedup --gb 0.2 --lang en --save-corpus /tmp/en.jsonl
  neardup bench dedup --corpus shards/ --threads 2")]
pub struct DedupArgs {
    /// Size of the generated corpus in GB (10^9 bytes of JSON Lines).
    #[arg(long, default_value_t = 1.0, value_name = "N")]
    pub gb: f64,

    /// Which text: mixed (about 85% English and 15% Chinese documents), en or zh.
    #[arg(long, default_value = "mixed", value_parser = ["mixed", "en", "zh"])]
    pub lang: String,

    /// English HTML or text to take paragraphs from (default: the Rust
    /// toolchain's HTML documentation).
    #[arg(long, value_name = "PATH")]
    pub en_source: Option<PathBuf>,

    /// Chinese HTML or text (default: Debian's Chinese documentation packages).
    #[arg(long, value_name = "PATH")]
    pub zh_source: Option<PathBuf>,

    /// Deduplicate this corpus (files or a folder of shards) instead of
    /// generating one.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["gb", "lang"])]
    pub corpus: Option<PathBuf>,

    /// Thread counts to run with, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2",
        value_name = "N,..."
    )]
    pub threads: Vec<usize>,

    /// Keep the generated corpus at this path (JSON Lines).
    #[arg(long, value_name = "FILE")]
    pub save_corpus: Option<PathBuf>,

    /// Where the corpus, the outputs and dedup's spill files go (default: the
    /// system's temporary folder).
    #[arg(long, value_name = "DIR")]
    pub tmp_dir: Option<PathBuf>,

    /// Seed of the generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

pub fn run(args: DedupArgs) -> Result<ExitCode> {
    let tmp = tempfile::Builder::new()
        .prefix("neardup-bench-dedup")
        .tempdir_in(args.tmp_dir.clone().unwrap_or_else(std::env::temp_dir))?;
    let corpus = match &args.corpus {
        Some(c) => c.clone(),
        None => {
            let path = args
                .save_corpus
                .clone()
                .unwrap_or_else(|| tmp.path().join("corpus.jsonl"));
            let started = Instant::now();
            let stats = generate(&args, &path)?;
            println!(
                "# corpus: {} documents, {:.1} MB ({} English, {} Chinese; {} planted copies: \
                 {} exact, {} edited, {} truncated, {} re-wrapped), generated in {:.1} s",
                stats.documents,
                stats.bytes as f64 / 1e6,
                stats.en,
                stats.zh,
                stats.copies(),
                stats.exact,
                stats.edited,
                stats.truncated,
                stats.rewrapped,
                started.elapsed().as_secs_f64()
            );
            path
        }
    };
    let bytes = input_bytes(&corpus)?;
    let exe = std::env::current_exe().context("cannot find the neardup executable")?;
    println!(
        "{:<11} {:>7} {:>8} {:>8} {:>10} {:>8} {:>9}  phases",
        "mode", "threads", "wall s", "MB/s", "MB/s/core", "peak MB", "removed"
    );
    let mut walls = std::collections::HashMap::new();
    for &threads in &args.threads {
        for verified in [true, false] {
            let r = run_dedup(&exe, &corpus, tmp.path(), threads, verified)?;
            let mbs = bytes as f64 / 1e6 / r.wall;
            println!(
                "{:<11} {:>7} {:>8.2} {:>8.1} {:>10.1} {:>8.0} {:>9}  {}",
                if verified { "verified" } else { "unverified" },
                threads,
                r.wall,
                mbs,
                mbs / threads.max(1) as f64,
                r.peak_mb,
                r.removed,
                r.phases
            );
            walls.insert((threads, verified), r.wall);
        }
    }
    for &threads in &args.threads {
        if let (Some(v), Some(u)) = (walls.get(&(threads, true)), walls.get(&(threads, false))) {
            println!(
                "# {threads} thread(s): verified takes {:.2}x the unverified time",
                v / u
            );
        }
    }
    if let (Some(one), Some(two)) = (walls.get(&(1, true)), walls.get(&(2, true))) {
        println!("# verified, 1 -> 2 threads: {:.2}x faster", one / two);
    }
    Ok(ExitCode::SUCCESS)
}

/// Bytes of the input files.
fn input_bytes(path: &Path) -> Result<u64> {
    if path.is_file() {
        return Ok(std::fs::metadata(path)?.len());
    }
    let mut total = 0;
    for entry in
        std::fs::read_dir(path).with_context(|| format!("cannot list {}", path.display()))?
    {
        let p = entry?.path();
        total += input_bytes(&p)?;
    }
    Ok(total)
}

struct Measured {
    wall: f64,
    peak_mb: f64,
    removed: u64,
    phases: String,
}

/// Runs `neardup dedup` on `corpus` as a child process.
fn run_dedup(
    exe: &Path,
    corpus: &Path,
    tmp: &Path,
    threads: usize,
    verified: bool,
) -> Result<Measured> {
    let keep = tmp.join("keep.jsonl");
    let mut cmd = Command::new(exe);
    cmd.arg("dedup")
        .arg(corpus)
        .arg("--keep")
        .arg(&keep)
        .arg("--clusters")
        .arg(tmp.join("clusters.jsonl"))
        .arg("--threads")
        .arg(threads.to_string())
        .arg("--tmp-dir")
        .arg(tmp);
    if !verified {
        cmd.arg("--no-verify");
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().context("cannot start neardup dedup")?;
    let stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let (status, peak_kb) = wait_with_rusage(child.id())?;
    let wall = started.elapsed().as_secs_f64();
    let log = reader.join().unwrap_or_default();
    if status != 0 {
        bail!("neardup dedup failed (status {status}):\n{log}");
    }
    let phases = log
        .lines()
        .find_map(|l| l.strip_prefix("neardup: phases: "))
        .unwrap_or("")
        .to_owned();
    // "..., N removed, ..." in the summary.
    let removed = log
        .split(", ")
        .find_map(|part| part.strip_suffix(" removed")?.parse().ok())
        .unwrap_or(0);
    Ok(Measured {
        wall,
        peak_mb: peak_kb as f64 / 1024.0,
        removed,
        phases,
    })
}

/// Waits for process `pid`: its exit status and peak resident memory in KiB.
fn wait_with_rusage(pid: u32) -> Result<(i32, i64)> {
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our own child `pid`.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("cannot wait for neardup dedup");
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    Ok((code, usage.ru_maxrss))
}

#[derive(Default)]
struct GenStats {
    documents: u64,
    bytes: u64,
    en: u64,
    zh: u64,
    exact: u64,
    edited: u64,
    truncated: u64,
    rewrapped: u64,
}

impl GenStats {
    fn copies(&self) -> u64 {
        self.exact + self.edited + self.truncated + self.rewrapped
    }
}

/// Pages of scraped text, as their paragraphs (whitespace as the page had it).
fn pages(source: &Path, zh: bool) -> Result<Vec<Vec<String>>> {
    let mut files = Vec::new();
    super::bench::collect_files(source, &mut files)?;
    files.sort();
    let mut out = Vec::new();
    // Each paragraph once: documentation repeats itself (a book's pages and its
    // print-all page), and repeats would plant near-duplicates by accident.
    // (Hashes of a paragraph's start and end share one set.)
    let mut seen = std::collections::HashSet::new();
    let mut stripped = String::new();
    for f in files {
        let Ok(raw) = std::fs::read_to_string(&f) else {
            continue;
        };
        let text = if f.extension().is_some_and(|e| e == "html" || e == "htm") {
            strip_html(&raw, &mut stripped);
            stripped.as_str()
        } else {
            raw.as_str()
        };
        // Paragraphs: runs of lines that are not blank (pages converted from
        // HTML separate blocks by lines of spaces), each line as it was.
        let mut blocks = Vec::new();
        let mut block = String::new();
        for line in text.lines().chain([""]) {
            if line.trim().is_empty() {
                if !block.is_empty() {
                    blocks.push(std::mem::take(&mut block));
                }
                continue;
            }
            if !block.is_empty() {
                block.push('\n');
            }
            block.push_str(line.trim_end());
        }
        let mut page = Vec::new();
        for p in &blocks {
            let p = p.trim();
            let useful = if zh {
                p.chars().filter(|c| is_han(*c)).count() > 20
            } else {
                p.split_whitespace().count() > 8
            };
            // Also one paragraph per beginning and per ending: templated pages
            // (redirect stubs, navigation) differ only in a title.
            let head: String = p.chars().take(60).collect();
            let tail: String = p.chars().rev().take(60).collect();
            if useful
                && p.len() < 16 << 10
                && seen.insert(hash_of(&head))
                && seen.insert(hash_of(&tail))
            {
                page.push(p.to_owned());
            }
        }
        if !page.is_empty() {
            out.push(page);
        }
        if out.len() > 2_000_000 {
            break;
        }
    }
    if out.is_empty() {
        bail!("no usable text under {}", source.display());
    }
    Ok(out)
}

fn hash_of(s: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// Writes a corpus of about `args.gb` GB: new documents built from random
/// paragraphs, and copies of earlier documents (exact, with character edits,
/// cut short, or re-wrapped), a few of them copied thousands of times.
fn generate(args: &DedupArgs, path: &Path) -> Result<GenStats> {
    let en = if args.lang != "zh" {
        let src = match &args.en_source {
            Some(s) => s.clone(),
            None => super::bench::default_source("en")?,
        };
        pages(&src, false)?
    } else {
        Vec::new()
    };
    let zh = if args.lang != "en" {
        let src = match &args.zh_source {
            Some(s) => s.clone(),
            None => super::bench::default_source("zh")?,
        };
        pages(&src, true)?
    } else {
        Vec::new()
    };
    let target = (args.gb * 1e9) as u64;
    let mut rng = SplitMix64(args.seed);
    let mut out = BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
    );
    let mut stats = GenStats::default();
    // Recent originals (bounded), and a few "hot" ones copied very often.
    let mut recent: Vec<String> = Vec::new();
    let mut hot: Vec<String> = Vec::new();
    let mut line = Vec::with_capacity(1 << 16);
    while stats.bytes < target {
        let r = rng.unit();
        let text = if r < 0.3 && !recent.is_empty() {
            let base = if rng.unit() < 0.05 && !hot.is_empty() {
                &hot[(rng.next() % hot.len() as u64) as usize]
            } else {
                &recent[(rng.next() % recent.len() as u64) as usize]
            };
            let kind = rng.unit();
            if kind < 0.25 {
                stats.exact += 1;
                base.clone()
            } else if kind < 0.65 {
                stats.edited += 1;
                edit(base, &mut rng)
            } else if kind < 0.85 {
                stats.truncated += 1;
                truncate(base, &mut rng)
            } else {
                stats.rewrapped += 1;
                rewrap(base, &mut rng)
            }
        } else {
            let chinese = zh.is_empty() || en.is_empty() || rng.unit() < 0.15;
            let pool = if (chinese && !zh.is_empty()) || en.is_empty() {
                stats.zh += 1;
                &zh
            } else {
                stats.en += 1;
                &en
            };
            // Stretches of consecutive paragraphs from two or more pages: as
            // coherent as a page, and unlike any other document.
            let want = 1000 + (rng.next() % 7000) as usize;
            let mut doc = String::with_capacity(want + 1024);
            while doc.len() < want {
                let page = &pool[(rng.next() % pool.len() as u64) as usize];
                let stop = (doc.len() + want / 2 + 1).min(want);
                let mut i = (rng.next() % page.len() as u64) as usize;
                while i < page.len() && doc.len() < stop {
                    if !doc.is_empty() {
                        doc.push_str("\n\n");
                    }
                    doc.push_str(&page[i]);
                    i += 1;
                }
            }
            if hot.len() < 16 {
                hot.push(doc.clone());
            }
            if recent.len() < 50_000 {
                recent.push(doc.clone());
            } else {
                let i = (rng.next() % recent.len() as u64) as usize;
                recent[i] = doc.clone();
            }
            doc
        };
        line.clear();
        serde_json::to_writer(
            &mut line,
            &serde_json::json!({
                "id": format!("doc-{:08}", stats.documents),
                "text": text,
                "quality": rng.next() % 1000,
            }),
        )?;
        line.push(b'\n');
        out.write_all(&line)?;
        stats.documents += 1;
        stats.bytes += line.len() as u64;
    }
    out.flush()?;
    Ok(stats)
}

/// Random character-level edits: 1-4% of the characters deleted, replaced or
/// inserted, in runs of 1-6.
fn edit(base: &str, rng: &mut SplitMix64) -> String {
    let chars: Vec<char> = base.chars().collect();
    let rate = 0.01 + 0.03 * rng.unit();
    let mut out = String::with_capacity(base.len() + 64);
    let mut i = 0;
    while i < chars.len() {
        if rng.unit() < rate / 3.5 {
            let run = 1 + (rng.next() % 6) as usize;
            match rng.next() % 3 {
                0 => i += run, // delete
                1 => {
                    for _ in 0..run {
                        out.push(chars[(rng.next() % chars.len() as u64) as usize]);
                    }
                    i += run; // replace
                }
                _ => {
                    for _ in 0..run {
                        out.push(chars[(rng.next() % chars.len() as u64) as usize]);
                    }
                }
            }
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// The first 85-97% of the text (or the last).
fn truncate(base: &str, rng: &mut SplitMix64) -> String {
    let keep = 0.85 + 0.12 * rng.unit();
    let n = base.chars().count();
    let k = (n as f64 * keep) as usize;
    if rng.unit() < 0.5 {
        base.chars().take(k).collect()
    } else {
        base.chars().skip(n - k).collect()
    }
}

/// The same text with its line breaks and spacing changed, as a re-scrape or
/// another template would: paragraphs joined, runs of spaces, CRLF line ends.
fn rewrap(base: &str, rng: &mut SplitMix64) -> String {
    let mut out = String::with_capacity(base.len() + base.len() / 8);
    let width = 60 + (rng.next() % 40) as usize;
    let mut col = 0;
    for word in base.split_whitespace() {
        if col > 0 {
            if col + word.len() > width {
                out.push_str("\r\n");
                col = 0;
            } else {
                out.push_str(if rng.unit() < 0.1 { "   " } else { " " });
                col += 1;
            }
        }
        out.push_str(word);
        col += word.len();
    }
    out
}
