//! `neardup index build|add|delete|info|verify`: the on-disk index.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use neardup_core::index::{Bits, Coding, CompressedIndex, IdTable, Index, bundle, plan};
use neardup_core::{Fingerprint, FingerprintConfig, Width, with_bits};

use crate::gather::{Keep, gather};
use crate::index_file::{IdTableExt, Opened, open};
use crate::output::Output;
use crate::run::{RunArgs, init_threads, with_spinner};
use crate::source::SourceArgs;
use neardup_core::record::Id;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Build an index file from documents or from a fingerprint file.
    #[command(after_help = "Examples:
  neardup index build corpus.jsonl -o corpus.ndx
  neardup index build --fingerprints fps.jsonl --k 4 -o fps.ndx
  neardup index build corpus.jsonl --compressed -o corpus.ndx   # read-only, ~5.4 bytes per key per table
  neardup index build corpus.jsonl --compressed --coding gaps -o corpus.ndx   # the paper's own codes")]
    Build(Box<BuildArgs>),
    /// Add documents (or fingerprints) to an index file; it is rewritten atomically.
    #[command(after_help = "Example:
  neardup index add corpus.ndx more.jsonl")]
    Add(Box<AddArgs>),
    /// Delete documents by id from an index file; it is rewritten atomically.
    #[command(after_help = "Example:
  neardup index delete corpus.ndx doc-17 doc-42")]
    Delete(DeleteArgs),
    /// What an index file holds: entries, width, k, design, configuration, size.
    Info(PathArg),
    /// Check every byte of an index file against its checksums.
    Verify(PathArg),
}

#[derive(clap::Args, Debug)]
pub struct BuildArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The largest distance queries may ask for (up to 8 for 64-bit
    /// fingerprints, 16 for 128-bit).
    #[arg(short, long, visible_alias = "max-k", default_value_t = 3, value_parser = clap::value_parser!(u32).range(0..=16))]
    pub k: u32,
    /// Memory budget for the tables (e.g. 8G); without it, the fastest design.
    #[arg(long, value_parser = crate::units::parse_bytes)]
    pub memory: Option<f64>,
    /// The index file to write.
    #[arg(short, long, value_name = "PATH")]
    pub output: PathBuf,
    /// Compressed tables (the paper's §3.2: blocks of about 1 KiB, each with
    /// one key whole): about 43 bits per key and table instead of 96, queries
    /// under twice as slow, and read-only (no `index add` or `index delete`).
    #[arg(long)]
    pub compressed: bool,
    /// How compressed blocks code their keys: `elias-fano` (each key's
    /// difference from the block's first key, Elias–Fano coded: fewer bits,
    /// and a query reads its keys in place) or `gaps` (the paper's own codes:
    /// each key's highest bit differing from the previous key, Huffman-coded,
    /// and the bits below it; decoded in order, so queries are 3-4x slower).
    #[arg(long, value_enum, default_value_t = CodingArg::EliasFano, requires = "compressed")]
    pub coding: CodingArg,
    /// About how many bytes of coded keys per block of the compressed tables
    /// (each block holds a fixed number of keys, chosen from this and the
    /// table's mean bits per key): smaller blocks decode faster and cost more
    /// bits per key.
    #[arg(long, value_name = "BYTES", default_value_t = 1024, requires = "compressed",
          value_parser = clap::value_parser!(u32).range(16..=65536))]
    pub block_bytes: u32,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Args, Debug)]
pub struct AddArgs {
    /// The index file.
    #[arg(value_name = "INDEX")]
    pub index: PathBuf,
    /// Documents (fingerprinted with the index's configuration; pipeline flags
    /// given must agree with it) or fingerprints.
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Args, Debug)]
pub struct DeleteArgs {
    /// The index file.
    #[arg(value_name = "INDEX")]
    pub index: PathBuf,
    /// Ids to delete (integers or strings, as the documents had them).
    #[arg(value_name = "ID", required = true)]
    pub ids: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct PathArg {
    /// The index file.
    pub path: PathBuf,
}

/// An index of either kind, for writing.
enum Built<'a, B: Bits> {
    Plain(&'a Index<B>),
    Compressed(&'a CompressedIndex<B>),
}

fn write_index<B: Bits>(
    path: &Path,
    index: Built<'_, B>,
    config: Option<&FingerprintConfig>,
    ids: &IdTable,
) -> Result<u64> {
    let mut out = Output::create(Some(path))?;
    let n = bundle::write_with(ids, config, |extra, sections| match index {
        Built::Plain(i) => i.write_to(extra, sections, &mut out),
        Built::Compressed(i) => i.write_to(extra, sections, &mut out),
    })?;
    out.finish()?;
    Ok(n)
}

/// Builds the index of `design` over entries `0..n` (fingerprint `fp(i)`) and
/// writes it.
fn build_and_write<B: Bits>(
    a: &BuildArgs,
    design: &neardup_core::TableDesign,
    n: usize,
    fp: impl Fn(usize) -> B,
    config: Option<&FingerprintConfig>,
    ids: &IdTable,
) -> Result<u64> {
    let entries = (0..n).map(|i| (i as u64, fp(i)));
    if a.compressed {
        let c = CompressedIndex::build(
            design.clone(),
            entries,
            a.block_bytes as usize,
            a.coding.into(),
        )?;
        write_index(&a.output, Built::Compressed(&c), config, ids)
    } else {
        let index = Index::build(design.clone(), entries)?;
        write_index(&a.output, Built::Plain(&index), config, ids)
    }
}

/// Add and delete rewrite plain tables; compressed ones are built whole.
fn refuse_compressed(opened: &Opened, path: &Path) -> Result<()> {
    if opened.file.is_compressed() {
        bail!(
            "{}: its tables are compressed, which makes it read-only: rebuild it with \
             `neardup index build --compressed` over all the documents, or build it without \
             --compressed to add and delete",
            path.display()
        );
    }
    Ok(())
}

pub fn run(cmd: Command) -> Result<ExitCode> {
    match cmd {
        Command::Build(a) => build(*a),
        Command::Add(a) => add(*a),
        Command::Delete(a) => delete(a),
        Command::Info(a) => info(&a.path),
        Command::Verify(a) => {
            let o = open(&a.path)?;
            o.file
                .verify()
                .with_context(|| format!("{}", a.path.display()))?;
            println!(
                "{}: ok ({} entries, {} bytes, every byte checked)",
                a.path.display(),
                o.file.entries(),
                o.file.len()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn build(a: BuildArgs) -> Result<ExitCode> {
    init_threads(a.run.threads)?;
    let started = Instant::now();
    let g = gather(&a.source, &Keep::default(), a.run.quiet)?;
    let n = g.values.len();
    let bits = g.width.bits();
    if a.k > bits / 8 {
        bail!(
            "--k {} is too large for {bits}-bit fingerprints: use at most {}",
            a.k,
            bits / 8
        );
    }
    let p = plan(bits, a.k, n.max(1) as f64, a.memory)?;
    let design = p.options[p.chosen].design.clone();
    let ids = IdTable::from_list(&g.ids);
    let message = format!(
        "building {} tables over {n} fingerprints",
        design.tables.len()
    );
    let bytes = with_spinner(&message, a.run.quiet, || -> Result<u64> {
        let config = g.config.as_ref();
        with_bits!(g.width, B => build_and_write(
            &a,
            &design,
            n,
            |i| B::from_u128(g.values.get(i)),
            config,
            &ids
        ))
    })?;
    if !a.run.quiet {
        eprintln!(
            "neardup: indexed {n} fingerprints ({}{}), k <= {}: {} bytes in {:.2} s -> {}",
            design.describe(),
            if a.compressed {
                format!(
                    ", compressed in {}-byte blocks, {} coding",
                    a.block_bytes,
                    Coding::from(a.coding).name()
                )
            } else {
                String::new()
            },
            a.k,
            bytes,
            started.elapsed().as_secs_f64(),
            a.output.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens an index to rewrite it: an exclusive advisory lock on the file
/// (held by the returned handle until the rewrite is renamed into place; a
/// second writer waits), then every checksum checked, so that damage is never
/// rewritten under fresh checksums.
fn open_for_update(path: &Path) -> Result<(File, Opened)> {
    let mut said = false;
    let lock = loop {
        let f =
            File::open(path).with_context(|| format!("cannot open index {}", path.display()))?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()));
            }
            if !said {
                eprintln!(
                    "neardup: {} is being changed by another neardup: waiting for it",
                    path.display()
                );
                said = true;
            }
            // SAFETY: as above; blocks until the other writer is done.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("cannot lock {}", path.display()));
            }
        }
        // The writer before us replaced the file by rename: lock the new one.
        use std::os::unix::fs::MetadataExt;
        let (held, now) = (f.metadata()?, std::fs::metadata(path)?);
        if (held.dev(), held.ino()) == (now.dev(), now.ino()) {
            break f;
        }
    };
    let opened = open(path)?;
    opened.file.verify().with_context(|| {
        format!(
            "{} is damaged, and changing it would rewrite the damage under new checksums: \
             rebuild it with `neardup index build`, or restore it from a copy",
            path.display()
        )
    })?;
    Ok((lock, opened))
}

fn add(mut a: AddArgs) -> Result<ExitCode> {
    init_threads(a.run.threads)?;
    let (_lock, opened) = open_for_update(&a.index)?;
    refuse_compressed(&opened, &a.index)?;
    match opened.config() {
        Some(c) => a.source.pipeline.preset = Some(c.clone()),
        None if a.source.fingerprints.is_none() => bail!(
            "{}: the index was built from fingerprints without a configuration; add fingerprints with --fingerprints",
            a.index.display()
        ),
        None => {}
    }
    let g = gather(&a.source, &Keep::default(), a.run.quiet)?;
    if let (Some(mine), Some(theirs)) = (opened.config(), &g.config) {
        mine.check_compatible(theirs)
            .with_context(|| format!("cannot add to {}", a.index.display()))?;
    }
    let mut b = opened.bundle;
    if g.width != b.index.width() && !g.values.is_empty() {
        bail!(
            "{}-bit fingerprints cannot go into a {}-bit index",
            g.width.bits(),
            b.index.width().bits()
        );
    }
    // An id already in the index is replaced, as the service replaces it,
    // and of one id added twice the last stays: every id once.
    let json_of = |id: Id| {
        let mut b = Vec::new();
        id.write_json(&mut b);
        b
    };
    let mut last: HashMap<Vec<u8>, usize> = HashMap::with_capacity(g.values.len());
    for i in 0..g.values.len() {
        last.insert(json_of(g.ids.get(i)), i);
    }
    let ids = &b.ids;
    let replaced = b.index.delete(|entry| {
        ids.get_id(entry)
            .is_some_and(|id| last.contains_key(&json_of(id)))
    })?;
    let mut start = b.ids.len() as u64;
    for i in 0..g.values.len() {
        if last.get(&json_of(g.ids.get(i))) != Some(&i) {
            continue;
        }
        b.ids.push_id(g.ids.get(i));
        b.index
            .add(start, Fingerprint::new(g.values.get(i), g.width))?;
        start += 1;
    }
    b.save(&a.index)?;
    if !a.run.quiet {
        eprintln!(
            "neardup: added {} entries to {} ({replaced} replaced an entry of the same id)",
            last.len(),
            a.index.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn delete(a: DeleteArgs) -> Result<ExitCode> {
    let (_lock, opened) = open_for_update(&a.index)?;
    refuse_compressed(&opened, &a.index)?;
    let wanted: HashSet<&str> = a.ids.iter().map(String::as_str).collect();
    let mut b = opened.bundle;
    let ids = &b.ids;
    let remove = |entry: u64| {
        ids.get_id(entry)
            .is_some_and(|id| wanted.contains(id.to_string().as_str()))
    };
    let removed = b.index.delete(remove)?;
    b.save(&a.index)?;
    eprintln!(
        "neardup: deleted {removed} entries from {}",
        a.index.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Bits per distinct key per table with the block headers, averaged; the
/// table count; the coding.
fn compressed_bits<B: Bits>(c: &CompressedIndex<B>) -> (f64, usize, Coding) {
    (c.bits_per_key().1, c.table_count(), c.coding())
}

/// `--coding`: how compressed blocks code their keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CodingArg {
    /// Differences from the block's first key, Elias–Fano coded.
    EliasFano,
    /// The paper's codes: highest differing bit (Huffman) and the bits below.
    Gaps,
}

impl From<CodingArg> for Coding {
    fn from(c: CodingArg) -> Coding {
        match c {
            CodingArg::EliasFano => Coding::EliasFano,
            CodingArg::Gaps => Coding::Gaps,
        }
    }
}

fn info(path: &Path) -> Result<ExitCode> {
    let o = open(path)?;
    let mut out = std::io::stdout().lock();
    let f = &o.file;
    writeln!(out, "file         {}", path.display())?;
    writeln!(out, "entries      {}", f.entries())?;
    writeln!(out, "bits         {}", f.bits())?;
    writeln!(out, "max k        {}", o.k())?;
    writeln!(out, "design       {}", f.design().describe())?;
    if f.is_compressed() {
        let (bits, tables, coding) = with_bits!(
            Width::from_bits(f.bits())?,
            B => compressed_bits(&f.compressed_index::<B>()?)
        );
        writeln!(
            out,
            "tables       compressed ({} coding), read-only: {bits:.1} bits per key per table ({tables} tables, with block headers)",
            coding.name()
        )?;
    } else {
        writeln!(out, "tables       plain")?;
    }
    writeln!(
        out,
        "size         {} bytes ({:.1} bytes per entry)",
        f.len(),
        f.len() as f64 / f.entries().max(1) as f64
    )?;
    match o.config() {
        Some(c) => writeln!(out, "config       {} (digest {})", c.summary(), c.digest())?,
        None => writeln!(
            out,
            "config       unknown (built from fingerprints without a configuration)"
        )?,
    }
    Ok(ExitCode::SUCCESS)
}
