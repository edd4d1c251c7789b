//! `neardup bench dedup`: corpus-scale dedup, verified and not, with 1 and 2
//! threads, on a generated corpus of real text with planted near-duplicates.
//!
//! Each run is a child `neardup dedup --clusters FILE --keep FILE` process (what
//! a corpus cleaner asks for; `--pairs` lists every pair of a heavy cluster,
//! quadratic in its size), so that its wall time and peak resident memory
//! (the child's VmHWM, as its summary prints it) are its own. A run with N
//! threads is held to N of the machine's CPUs (its affinity set, unless
//! `--no-pin`), so that its reader, sink and writer threads share the cores
//! its workers have: MB/s per core is per core the run could use.

use std::io::{BufWriter, Write};
use std::os::unix::process::CommandExt;
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

    /// English HTML or text to take pages from (repeatable; default: the Rust
    /// toolchain's HTML documentation, all of it).
    #[arg(long, value_name = "PATH")]
    pub en_source: Vec<PathBuf>,

    /// Chinese HTML or text (repeatable; default: every installed one of
    /// Debian's Chinese documentation packages: debian-reference-zh-cn,
    /// debian-edu-doc-zh-cn, gimp-help-zh-cn, lilypond-doc-html-zh,
    /// maint-guide-zh-cn, debian-faq-zh-cn).
    #[arg(long, value_name = "PATH")]
    pub zh_source: Vec<PathBuf>,

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

    /// Rounds of runs: each round runs every thread count, verified then
    /// unverified, and the summary gives each ratio's range over the rounds'
    /// pairs (on a shared machine, one run's time may be off by a third).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,

    /// Verified runs before the measured ones, with the most threads, not
    /// counted: the first run after the corpus is made pays for reading it
    /// into the page cache and, on a virtual machine, for memory the host
    /// has not backed yet (a verified 10 GB run's fingerprint phase takes a
    /// quarter longer), which would count against whichever run came first.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub warmup: u32,

    /// Let every run use all of the machine's CPUs, whatever its thread count
    /// (by default a run with N threads is held to N CPUs).
    #[arg(long)]
    pub no_pin: bool,

    /// Keep the generated corpus at this path (JSON Lines).
    #[arg(long, value_name = "FILE")]
    pub save_corpus: Option<PathBuf>,

    /// Where the corpus, the outputs and dedup's spill files go (default: the
    /// system's temporary folder).
    #[arg(long, value_name = "DIR")]
    pub tmp_dir: Option<PathBuf>,

    /// Only generate the corpus (at --save-corpus), for other tools to time
    /// (e.g. `python python/bench.py spark`).
    #[arg(long, requires = "save_corpus", conflicts_with = "corpus")]
    pub generate_only: bool,

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
                "# corpus: {} documents, {:.1} MB ({} English, {} Chinese originals, {} of them \
                 remixed; {} planted copies: {} exact, {} edited, {} truncated, {} re-wrapped), \
                 generated in {:.1} s",
                stats.documents,
                stats.bytes as f64 / 1e6,
                stats.en,
                stats.zh,
                stats.remixed,
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
    if args.generate_only {
        return Ok(ExitCode::SUCCESS);
    }
    let bytes = input_bytes(&corpus)?;
    let exe = std::env::current_exe().context("cannot find the neardup executable")?;
    println!(
        "{:<11} {:>7} {:>5} {:>8} {:>8} {:>10} {:>5} {:>8} {:>9}  phases",
        "mode", "threads", "cpus", "wall s", "MB/s", "MB/s/core", "cpu%", "peak MB", "removed"
    );
    let most = args.threads.iter().copied().max().unwrap_or(0);
    if args.warmup > 0 {
        println!("# warm-up: not counted in the summary");
    }
    let cpus = pinned(&args, most);
    for _ in 0..args.warmup {
        let r = run_dedup(&exe, &corpus, tmp.path(), most, cpus, true)?;
        print_run("warm-up", most, cpus, &r, bytes);
    }
    let mut walls = Walls::new();
    for round in 1..=args.repeat {
        if args.repeat > 1 {
            println!("# round {round} of {}", args.repeat);
        }
        run_round(&args, (&exe, &corpus, tmp.path()), bytes, &mut walls)?;
    }
    for line in summary(&args.threads, &walls, bytes) {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Each run's wall time and whether it was held to as many CPUs as it had
/// threads, by thread count and verification, in the order they ran.
type Walls = std::collections::HashMap<(usize, bool), Vec<(f64, bool)>>;

/// One round: every thread count, verified then unverified, each run's line
/// printed as it ends.
fn run_round(
    args: &DedupArgs,
    (exe, corpus, tmp): (&Path, &Path, &Path),
    bytes: u64,
    walls: &mut Walls,
) -> Result<()> {
    for &threads in &args.threads {
        let cpus = pinned(args, threads);
        for verified in [true, false] {
            let r = run_dedup(exe, corpus, tmp, threads, cpus, verified)?;
            let mode = if verified { "verified" } else { "unverified" };
            print_run(mode, threads, cpus, &r, bytes);
            walls
                .entry((threads, verified))
                .or_default()
                .push((r.wall, cpus.is_some()));
        }
    }
    Ok(())
}

/// The CPUs a run of `threads` threads is held to (`None`: all of them;
/// `--threads 0` is all of them too).
fn pinned(args: &DedupArgs, threads: usize) -> Option<Cpus> {
    match args.no_pin || threads == 0 {
        true => None,
        false => first_cpus(threads),
    }
}

/// A run's line of the table.
fn print_run(mode: &str, threads: usize, cpus: Option<Cpus>, r: &Measured, bytes: u64) {
    println!(
        "{:<11} {:>7} {:>5} {:>8.2} {:>8.1} {:>10.1} {:>5.0} {:>8.0} {:>9}  {}",
        mode,
        threads,
        cpus.map_or_else(|| "all".to_owned(), |c| c.count.to_string()),
        r.wall,
        bytes as f64 / 1e6 / r.wall,
        per_core(bytes, r.wall, threads),
        100.0 * r.cpu / r.wall,
        r.peak_mb,
        r.removed,
        r.phases
    );
}

/// The ratios the runs give, as lines: per thread count, the verified
/// time over the unverified, and the verified 1 -> 2 threads speed-up,
/// each from the runs of one round (which ran close together), their
/// range over the rounds; over several rounds, each thread count's
/// verified MB/s per core (of `bytes` of input) too.
fn summary(threads: &[usize], walls: &Walls, bytes: u64) -> Vec<String> {
    let mut lines = Vec::new();
    for &t in threads {
        if let Some(v) = walls.get(&(t, true))
            && v.len() > 1
        {
            let mut per_core: Vec<f64> = v
                .iter()
                .map(|&(wall, _)| per_core(bytes, wall, t))
                .collect();
            per_core.sort_by(f64::total_cmp);
            lines.push(format!(
                "# {t} thread(s): verified {:.1}-{:.1} MB/s per core over {} rounds",
                per_core[0],
                per_core[per_core.len() - 1],
                per_core.len()
            ));
        }
    }
    let ratios = |a: &[(f64, bool)], b: &[(f64, bool)]| -> Vec<f64> {
        a.iter().zip(b).map(|(x, y)| x.0 / y.0).collect()
    };
    for &t in threads {
        if let (Some(v), Some(u)) = (walls.get(&(t, true)), walls.get(&(t, false))) {
            lines.push(format!(
                "# {t} thread(s): verified takes {} the unverified time",
                spread(&ratios(v, u))
            ));
        }
    }
    if let (Some(one), Some(two)) = (walls.get(&(1, true)), walls.get(&(2, true))) {
        let on = match (one[0].1, two[0].1) {
            (true, true) => "on 1 and 2 CPUs",
            (false, false) => "every run on all CPUs",
            // Fewer than two CPUs to hold the 2-thread run to.
            _ => "1 thread on 1 CPU, 2 on all",
        };
        lines.push(format!(
            "# verified, 1 -> 2 threads ({on}): {} faster",
            spread(&ratios(one, two))
        ));
    }
    lines
}

/// MB/s per core of a run of `threads` threads through `bytes` in `wall`
/// seconds (`--threads 0`, all CPUs, is divided by one).
fn per_core(bytes: u64, wall: f64, threads: usize) -> f64 {
    bytes as f64 / 1e6 / wall / threads.max(1) as f64
}

/// `1.37x`, or over several rounds `1.30x-1.45x (median 1.37x; by round:
/// 1.45x, 1.30x, 1.37x)`: the range, the median and each round's, in order.
/// `ratios` holds one a round (at least one: every run is recorded).
fn spread(ratios: &[f64]) -> String {
    let mut sorted = ratios.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let (lo, hi) = (sorted[0], sorted[n - 1]);
    if n == 1 {
        return format!("{lo:.2}x");
    }
    let median = match n % 2 {
        1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    };
    let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}x")).collect();
    format!(
        "{lo:.2}x-{hi:.2}x (median {median:.2}x; by round: {})",
        each.join(", ")
    )
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
    /// CPU time, user and system, in seconds.
    cpu: f64,
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
    cpus: Option<Cpus>,
    verified: bool,
) -> Result<Measured> {
    let (keep, clusters) = (tmp.join("keep.jsonl"), tmp.join("clusters.jsonl"));
    // The previous run's outputs go first, so that every run finds the same
    // free memory (an output replaces the old file only once it is whole, so
    // the old one's pages would otherwise still be held while it is written).
    for old in [&keep, &clusters] {
        match std::fs::remove_file(old) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot remove {}", old.display()));
            }
            _ => {}
        }
    }
    let mut cmd = Command::new(exe);
    cmd.arg("dedup")
        .arg(corpus)
        .arg("--keep")
        .arg(&keep)
        .arg("--clusters")
        .arg(&clusters)
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
    if let Some(cpus) = cpus {
        hold_to(&mut cmd, cpus);
    }
    let started = Instant::now();
    let mut child = cmd.spawn().context("cannot start neardup dedup")?;
    let stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let (status, peak_kb, cpu) = wait_with_rusage(child.id())?;
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
    // The child's own peak ("peak memory N MB" in its summary, from VmHWM,
    // which starts afresh at exec; wait4's figure would include this process's
    // memory from before it).
    let peak_mb = log
        .split("peak memory ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse::<f64>().ok())
        .unwrap_or(peak_kb as f64 / 1024.0);
    // "..., N removed, ..." in the summary.
    let removed = log
        .split(", ")
        .find_map(|part| part.strip_suffix(" removed")?.parse().ok())
        .unwrap_or(0);
    Ok(Measured {
        wall,
        cpu,
        peak_mb,
        removed,
        phases,
    })
}

/// A set of CPUs to hold a run to.
#[derive(Clone, Copy)]
struct Cpus {
    set: libc::cpu_set_t,
    count: usize,
}

/// The first `n` of the CPUs this process may run on, or `None` if it may
/// run on fewer (or its set cannot be read).
fn first_cpus(n: usize) -> Option<Cpus> {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: cpu_set_t is plain data, which sched_getaffinity fills for this
    // process and the CPU_* functions read and write within its bounds.
    unsafe {
        let mut all: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut all) != 0 {
            return None;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let mut count = 0;
        for cpu in 0..8 * size {
            if count < n && libc::CPU_ISSET(cpu, &all) {
                libc::CPU_SET(cpu, &mut set);
                count += 1;
            }
        }
        (count == n).then_some(Cpus { set, count })
    }
}

/// Has the child that `cmd` starts run on `cpus` only.
fn hold_to(cmd: &mut Command, cpus: Cpus) {
    let set = cpus.set;
    // SAFETY: the closure only makes one system call, which is safe between
    // fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let size = std::mem::size_of::<libc::cpu_set_t>();
            match libc::sched_setaffinity(0, size, &set) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
}

/// Waits for process `pid`: its exit status, peak resident memory in KiB
/// and CPU time (user and system) in seconds.
fn wait_with_rusage(pid: u32) -> Result<(i32, i64, f64)> {
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
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((
        code,
        usage.ru_maxrss,
        secs(usage.ru_utime) + secs(usage.ru_stime),
    ))
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
    remixed: u64,
}

impl GenStats {
    fn copies(&self) -> u64 {
        self.exact + self.edited + self.truncated + self.rewrapped
    }
}

/// Pages of scraped text, as their paragraphs (whitespace as the page had it).
/// The Rust toolchain's HTML documentation.
fn english_docs() -> Result<PathBuf> {
    let book = super::bench_text::default_source("en")?;
    Ok(book.parent().map(Path::to_path_buf).unwrap_or(book))
}

/// Every installed Chinese documentation package.
fn chinese_docs() -> Result<Vec<PathBuf>> {
    let found: Vec<PathBuf> = [
        "/usr/share/debian-reference",
        "/usr/share/doc/debian-edu-doc-zh-cn",
        "/usr/share/gimp/2.0/help/zh_CN",
        "/usr/share/doc/lilypond/html",
        "/usr/share/doc/maint-guide-zh-cn",
        "/usr/share/doc/debian/FAQ/zh-cn",
    ]
    .iter()
    .map(PathBuf::from)
    .filter(|p| p.is_dir())
    .collect();
    if found.is_empty() {
        bail!(
            "no Chinese documentation found: `apt-get install debian-reference-zh-cn \
             debian-edu-doc-zh-cn gimp-help-zh-cn lilypond-doc-html-zh`, or pass --zh-source DIR"
        );
    }
    Ok(found)
}

fn pages(sources: &[PathBuf], zh: bool) -> Result<Vec<Vec<String>>> {
    let mut files = Vec::new();
    for source in sources {
        super::bench_text::collect_files(source, &mut files)?;
    }
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
        bail!("no usable text under {sources:?}");
    }
    Ok(out)
}

fn hash_of(s: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// Writes a corpus of about `args.gb` GB: new documents built from real pages
/// (or remixed from them, once the pages would repeat more than about 20
/// times), and copies of earlier documents (exact, with character edits, cut
/// short, or re-wrapped), a few of them copied very often.
fn generate(args: &DedupArgs, path: &Path) -> Result<GenStats> {
    let en = if args.lang != "zh" {
        let sources = match args.en_source.is_empty() {
            true => vec![english_docs()?],
            false => args.en_source.clone(),
        };
        pages(&sources, false)?
    } else {
        Vec::new()
    };
    let zh = if args.lang != "en" {
        let sources = match args.zh_source.is_empty() {
            true => chinese_docs()?,
            false => args.zh_source.clone(),
        };
        pages(&sources, true)?
    } else {
        Vec::new()
    };
    let bytes_of = |pool: &[Vec<String>]| -> usize { pool.iter().flatten().map(String::len).sum() };
    let (en_bytes, zh_bytes) = (bytes_of(&en), bytes_of(&zh));
    println!(
        "# sources: {:.1} MB of distinct English paragraphs, {:.1} MB of Chinese",
        en_bytes as f64 / 1e6,
        zh_bytes as f64 / 1e6
    );
    // Contexts of 8 characters for English (about two words), 3 for Chinese.
    let en_remix = Remix::new(&en, 8, 4 << 20);
    let zh_remix = Remix::new(&zh, 3, 4 << 20);
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
        let text = if rng.unit() < 0.3 && !recent.is_empty() {
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
            let chinese = en.is_empty() || (!zh.is_empty() && rng.unit() < 0.15);
            let (pool, remix, pool_bytes, share) = if chinese {
                stats.zh += 1;
                (
                    &zh,
                    &zh_remix,
                    zh_bytes,
                    if en.is_empty() { 1.0 } else { 0.15 },
                )
            } else {
                stats.en += 1;
                (
                    &en,
                    &en_remix,
                    en_bytes,
                    if zh.is_empty() { 1.0 } else { 0.85 },
                )
            };
            let want = 1000 + (rng.next() % 7000) as usize;
            // Real pages while they are repeated at most about 20 times over
            // the whole corpus (70% of which is new documents); beyond that,
            // new text remixed from them (a small source repeated hundreds of
            // times would make every document a near-copy of many others).
            let real = (20.0 * pool_bytes as f64 / (share * 0.7 * target as f64)).min(1.0);
            let doc = if rng.unit() >= real {
                stats.remixed += 1;
                let seed = rng.next();
                own_vocabulary(&remix.generate(want, &mut rng), seed)
            } else {
                // Stretches of consecutive paragraphs from two or more pages:
                // as coherent as a page, and unlike any other document.
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
                doc
            };
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
    // On disk before the first run starts, so that no run shares the disk
    // and the CPUs with the corpus's write-back.
    out.into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(stats)
}

/// The text with a fifth of its word types (Han characters, for Chinese)
/// replaced, each by one made-up word chosen by `seed`: remixes of one source
/// would otherwise share its word frequencies, and documents that share their
/// word frequencies look alike to fingerprints of single tokens, as real
/// documents on different topics do not.
fn own_vocabulary(text: &str, seed: u64) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    let pick = |piece: &str| -> Option<u64> {
        let h = SplitMix64(seed ^ hash_of(piece)).next();
        h.is_multiple_of(5).then_some(h)
    };
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.is_empty() {
            return;
        }
        match pick(word) {
            Some(h) => {
                let mut h = h;
                for _ in 0..word.chars().count().clamp(3, 10) {
                    out.push((b'a' + (h % 26) as u8) as char);
                    h /= 26;
                }
            }
            None => out.push_str(word),
        }
        word.clear();
    };
    for c in text.chars() {
        if is_han(c) {
            flush(&mut word, &mut out);
            let mut buf = [0u8; 4];
            match pick(c.encode_utf8(&mut buf)) {
                Some(h) => out.push(char::from_u32(0x4E00 + (h % 0x5000) as u32).unwrap_or(c)),
                None => out.push(c),
            }
        } else if c.is_alphanumeric() {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// New text with the local statistics of real text: a character-level Markov
/// chain over a source, cut up in runs. After the last `order` characters
/// written, a random place of the source that has them comes next, and a run
/// of 4-40 characters is copied from there. Two remixed documents share
/// n-grams about as often as two real documents do.
struct Remix {
    text: Vec<char>,
    /// (hash of `order` characters, the place after them), sorted.
    index: Vec<(u64, u32)>,
    order: usize,
}

impl Remix {
    /// From the first `limit` bytes of the pages' text.
    fn new(pages: &[Vec<String>], order: usize, limit: usize) -> Remix {
        let mut text = Vec::new();
        let mut bytes = 0;
        'outer: for page in pages {
            for p in page {
                text.extend(p.chars());
                text.extend("\n\n".chars());
                bytes += p.len() + 2;
                if bytes >= limit {
                    break 'outer;
                }
            }
        }
        let mut index: Vec<(u64, u32)> = (0..text.len().saturating_sub(order))
            .map(|i| (Self::key(&text[i..i + order]), (i + order) as u32))
            .collect();
        index.sort_unstable();
        Remix { text, index, order }
    }

    fn key(chars: &[char]) -> u64 {
        chars.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| {
            (h ^ c as u64).wrapping_mul(0x0100_0000_01b3)
        })
    }

    fn generate(&self, want: usize, rng: &mut SplitMix64) -> String {
        let mut out: Vec<char> = Vec::with_capacity(want);
        let mut bytes = 0;
        if self.index.is_empty() {
            return String::new();
        }
        let mut at = self.index[(rng.next() % self.index.len() as u64) as usize].1 as usize;
        while bytes < want {
            let run = 4 + (rng.next() % 37) as usize;
            for &c in self.text[at..].iter().take(run) {
                out.push(c);
                bytes += c.len_utf8();
            }
            // Jump to another place that follows the same characters.
            let tail = &out[out.len().saturating_sub(self.order)..];
            let key = Self::key(tail);
            let lo = self.index.partition_point(|&(h, _)| h < key);
            let hi = self.index.partition_point(|&(h, _)| h <= key);
            at = if tail.len() == self.order && hi > lo {
                self.index[lo + (rng.next() % (hi - lo) as u64) as usize].1 as usize
            } else {
                self.index[(rng.next() % self.index.len() as u64) as usize].1 as usize
            };
        }
        out.into_iter().collect()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Ratios pair the runs of a round; over several rounds, their range,
    /// median and each round's (values worked by hand).
    #[test]
    fn the_summary_pairs_each_rounds_runs() {
        let mut walls = Walls::new();
        // Two rounds: verified 12 and 10 s on 1 thread, 6 and 5 on 2;
        // unverified 10 and 8 on 1 thread, 5 and 4 on 2.
        walls.insert((1, true), vec![(12.0, true), (10.0, true)]);
        walls.insert((1, false), vec![(10.0, true), (8.0, true)]);
        walls.insert((2, true), vec![(6.0, true), (5.0, true)]);
        walls.insert((2, false), vec![(5.0, true), (4.0, true)]);
        let lines = summary(&[1, 2], &walls, 1_000_000_000);
        assert_eq!(
            lines,
            [
                // 1000 MB over 12 and 10 s; over 6 and 5 s, per core.
                "# 1 thread(s): verified 83.3-100.0 MB/s per core over 2 rounds",
                "# 2 thread(s): verified 83.3-100.0 MB/s per core over 2 rounds",
                // 12/10 = 1.2, 10/8 = 1.25; 6/5 = 1.2, 5/4 = 1.25.
                "# 1 thread(s): verified takes 1.20x-1.25x (median 1.23x; by round: 1.20x, \
                 1.25x) the unverified time",
                "# 2 thread(s): verified takes 1.20x-1.25x (median 1.23x; by round: 1.20x, \
                 1.25x) the unverified time",
                // 12/6 = 2, 10/5 = 2.
                "# verified, 1 -> 2 threads (on 1 and 2 CPUs): 2.00x-2.00x (median 2.00x; by \
                 round: 2.00x, 2.00x) faster",
            ]
        );
        // One round: the ratios alone, as before.
        let one: Walls = walls.iter().map(|(&k, v)| (k, v[..1].to_vec())).collect();
        assert_eq!(
            summary(&[1, 2], &one, 1_000_000_000),
            [
                "# 1 thread(s): verified takes 1.20x the unverified time",
                "# 2 thread(s): verified takes 1.20x the unverified time",
                "# verified, 1 -> 2 threads (on 1 and 2 CPUs): 2.00x faster",
            ]
        );
        // Three rounds: the median is the middle one, not the mean.
        assert_eq!(
            spread(&[1.5, 1.1, 1.2]),
            "1.10x-1.50x (median 1.20x; by round: 1.50x, 1.10x, 1.20x)"
        );
    }

    /// One CPU is always there to hold a run to, and a child held to it
    /// runs on it alone; more CPUs than the process may use are refused.
    #[test]
    fn a_run_is_held_to_the_cpus_it_is_given() {
        let one = first_cpus(1).expect("this process runs on some CPU");
        assert_eq!(one.count, 1);
        assert!(first_cpus(usize::MAX).is_none());
        let mut cmd = Command::new("grep");
        cmd.args(["Cpus_allowed_list", "/proc/self/status"]);
        hold_to(&mut cmd, one);
        let out = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
        let list = out.split(':').nth(1).unwrap().trim();
        assert!(list.parse::<usize>().is_ok(), "one CPU, not {list:?}");
    }
}
