//! Reading fingerprint files: the JSON Lines `{"id", "simhash"}` that
//! `neardup fingerprint` writes, or its `--tsv` form. Parsed in parallel.

use std::borrow::Cow;
use std::path::Path;

use anyhow::{Context, Result, bail};
use neardup_core::{Fingerprint, FingerprintConfig, Width};
use rayon::prelude::*;
use serde::Deserialize;

use crate::input::Id;

/// Fingerprints with their ids, in file order.
pub struct FingerprintFile {
    pub ids: Vec<Id>,
    pub values: Vec<u128>,
    pub width: Width,
    /// The configuration saved beside the file, if any.
    pub config: Option<FingerprintConfig>,
    /// Byte range of each record's line, for writing records back unchanged.
    pub lines: Vec<(usize, usize)>,
    pub bytes: Vec<u8>,
}

#[derive(Deserialize)]
struct Row<'a> {
    #[serde(default)]
    id: Option<Id>,
    #[serde(borrow)]
    simhash: Cow<'a, str>,
}

/// Reads `path`; blank lines are skipped; any other bad line stops with its number.
pub fn read(path: &Path) -> Result<FingerprintFile> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let name = path.display().to_string();
    let mut lines = Vec::new();
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', &bytes).chain(std::iter::once(bytes.len())) {
        if end > start || end < bytes.len() {
            let mut e = end;
            if e > start && bytes[e - 1] == b'\r' {
                e -= 1;
            }
            lines.push((start, e));
        }
        start = end + 1;
    }
    let parsed: Vec<Result<Option<(Id, Fingerprint)>>> = lines
        .par_iter()
        .enumerate()
        .map(|(i, &(s, e))| {
            parse_line(&bytes[s..e], i as i64 + 1).with_context(|| format!("{name}:{}", i + 1))
        })
        .collect();
    let mut ids = Vec::with_capacity(lines.len());
    let mut values = Vec::with_capacity(lines.len());
    let mut kept_lines = Vec::with_capacity(lines.len());
    let mut width = None;
    for (i, p) in parsed.into_iter().enumerate() {
        let Some((id, fp)) = p? else { continue };
        match width {
            None => width = Some(fp.width()),
            Some(w) if w != fp.width() => bail!(
                "{name}:{}: a {}-bit fingerprint after {}-bit ones; a file holds one width \
                 (fingerprint everything with the same --bits)",
                i + 1,
                fp.width(),
                w
            ),
            Some(_) => {}
        }
        ids.push(id);
        values.push(fp.value());
        kept_lines.push(lines[i]);
    }
    let config_path = crate::cmd::fingerprint::config_path_for(path);
    let config = if config_path.exists() {
        Some(crate::pipeline_args::read_config(&config_path)?)
    } else {
        None
    };
    let width = match (width, &config) {
        (Some(w), Some(c)) if w != c.bits && w == Width::W64 && c.bits == Width::W128 => {
            Width::W128
        }
        (Some(w), Some(c)) if w != c.bits => bail!(
            "{name}: {w}-bit fingerprints, but {} says {} bits",
            config_path.display(),
            c.bits
        ),
        (Some(w), _) => w,
        (None, Some(c)) => c.bits,
        (None, None) => Width::W64,
    };
    Ok(FingerprintFile {
        ids,
        values,
        width,
        config,
        lines: kept_lines,
        bytes,
    })
}

fn parse_line(line: &[u8], lineno: i64) -> Result<Option<(Id, Fingerprint)>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if line.first() == Some(&b'{') {
        let row: Row = serde_json::from_slice(line).map_err(|e| {
            anyhow::anyhow!("not a fingerprint line ({e}); expected {{\"id\": ..., \"simhash\": \"<hex>\"}} as `neardup fingerprint` writes")
        })?;
        let fp = Fingerprint::parse_hex(&row.simhash)?;
        return Ok(Some((row.id.unwrap_or(Id::Int(lineno)), fp)));
    }
    let text = std::str::from_utf8(line).context("invalid UTF-8")?;
    let Some((id, hex)) = text.rsplit_once('\t') else {
        bail!("expected JSON Lines {{\"id\", \"simhash\"}} or TSV id<TAB>simhash");
    };
    let id = id
        .parse::<i64>()
        .map(Id::Int)
        .unwrap_or_else(|_| Id::Str(id.to_owned()));
    Ok(Some((id, Fingerprint::parse_hex(hex.trim())?)))
}
