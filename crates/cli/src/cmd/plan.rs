//! `neardup plan`: choose a table design and explain it.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Result, bail};
use neardup_core::index::plan;

use crate::units::{parse_bytes, parse_count};

#[derive(clap::Args, Debug)]
#[command(after_help = "Example:
  neardup plan --n 1e9 --k 3 --memory 64G")]
pub struct Args {
    /// Expected number of stored fingerprints (e.g. 1e9, 2^34, 500000000).
    #[arg(long, value_parser = parse_count)]
    pub n: f64,

    /// Largest Hamming distance to find.
    #[arg(long, default_value_t = 3)]
    pub k: u32,

    /// Fingerprint width.
    #[arg(long, default_value_t = 64, value_parser = parse_bits)]
    pub bits: u32,

    /// Memory budget for the tables (e.g. 64G, 512M); without it, the fastest design.
    #[arg(long, value_parser = parse_bytes)]
    pub memory: Option<f64>,
}

fn parse_bits(s: &str) -> Result<u32, String> {
    match s {
        "64" => Ok(64),
        "128" => Ok(128),
        _ => Err(format!("{s}: use 64 or 128")),
    }
}

fn human(bytes: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes;
    let mut u = 0;
    while v >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

pub fn run(args: Args) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if args.k > args.bits / 8 {
        bail!(
            "k = {} is too large for {}-bit fingerprints: use k <= {}",
            args.k,
            args.bits,
            args.bits / 8
        );
    }
    let p = plan(args.bits, args.k, args.n, args.memory)?;
    let chosen = &p.options[p.chosen];
    writeln!(
        out,
        "N = {:.3e} fingerprints of {} bits, k = {}{}",
        args.n,
        args.bits,
        args.k,
        args.memory
            .map(|m| format!(", memory budget {}", human(m)))
            .unwrap_or_default()
    )?;
    writeln!(out, "chosen: {}", chosen.design.describe())?;
    writeln!(out, "  why: {}", p.reason)?;
    writeln!(
        out,
        "  expected candidates per query {:.1}, about {:.2} µs per query, {:.0} bytes per fingerprint, {} in all",
        chosen.candidates,
        chosen.query_ns / 1000.0,
        chosen.bytes_per_fingerprint,
        human(chosen.bytes_per_fingerprint * args.n)
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:>7} {:>9} {:>14} {:>12} {:>12}  design",
        "tables", "prefix", "cand/query", "bytes/fp", "memory"
    )?;
    // The designs up to twice the chosen one's table count (at least a dozen).
    let shown = p
        .options
        .iter()
        .enumerate()
        .filter(|(i, o)| *i < 12 || o.design.tables.len() <= 2 * chosen.design.tables.len());
    for (i, o) in shown {
        let (lo, hi) = o.design.prefix_range();
        let prefix = if lo == hi {
            format!("{lo}")
        } else {
            format!("{lo}-{hi}")
        };
        writeln!(
            out,
            "{:>7} {:>9} {:>14.3e} {:>12.0} {:>12}  {}{}",
            o.design.tables.len(),
            prefix,
            o.candidates,
            o.bytes_per_fingerprint,
            human(o.bytes_per_fingerprint * args.n),
            o.design
                .levels
                .iter()
                .map(|b| format!("{b}/{}", b - args.k))
                .collect::<Vec<_>>()
                .join(" then "),
            if i == p.chosen { "   <= chosen" } else { "" }
        )?;
    }
    writeln!(
        out,
        "\n(design \"B/P\": cut into B blocks, each table keys on P of them; \"then\": nested)"
    )?;
    Ok(ExitCode::SUCCESS)
}
