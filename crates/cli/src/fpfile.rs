//! Fingerprint files: the JSON Lines `{"id", "simhash"}` that `neardup
//! fingerprint` writes, or its `--tsv` form, with the configuration saved
//! beside them; written line by line, read back in parallel.

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use neardup_core::index::mem::with_huge_capacity;
use neardup_core::{Fingerprint, FingerprintConfig, Width};
use rayon::prelude::*;
use serde::Deserialize;

use neardup_core::record::Id;

/// Each record's line (byte range) and the file's bytes.
pub type Records = (Vec<(usize, usize)>, Vec<u8>);

/// Fingerprints with their ids, in file order.
pub struct FingerprintFile {
    pub ids: IdList,
    pub values: Values,
    pub width: Width,
    /// The configuration saved beside the file, if any.
    pub config: Option<FingerprintConfig>,
    /// Each record's line (byte range) and the file's bytes, when asked for
    /// (to write records back unchanged).
    pub records: Option<Records>,
}

/// Fingerprint values in their own width: 64-bit ones take 8 bytes, not 16.
#[derive(Debug)]
pub enum Values {
    W64(Vec<u64>),
    W128(Vec<u128>),
}

impl Default for Values {
    fn default() -> Self {
        Values::W64(Vec::new())
    }
}

impl Values {
    /// Empty, for fingerprints of `width`.
    pub fn with_width(width: Width, capacity: usize) -> Self {
        match width {
            Width::W64 => Values::W64(Vec::with_capacity(capacity)),
            Width::W128 => Values::W128(Vec::with_capacity(capacity)),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Values::W64(v) => v.len(),
            Values::W128(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Room for `more` fingerprints beyond those held.
    pub fn reserve(&mut self, more: usize) {
        match self {
            Values::W64(v) => v.reserve(more),
            Values::W128(v) => v.reserve(more),
        }
    }

    /// The value of fingerprint `i`.
    pub fn get(&self, i: usize) -> u128 {
        match self {
            Values::W64(v) => v[i] as u128,
            Values::W128(v) => v[i],
        }
    }

    /// Appends `fp`; an empty 64-bit list becomes a 128-bit one for a 128-bit
    /// fingerprint (callers refuse mixed widths).
    pub fn push(&mut self, fp: Fingerprint) {
        if fp.width() == Width::W128
            && let Values::W64(v) = self
        {
            *self = Values::W128(v.iter().map(|&x| x as u128).collect());
        }
        match self {
            Values::W64(v) => v.push(fp.as_u64()),
            Values::W128(v) => v.push(fp.value()),
        }
    }

    /// Appends `other`. Widths are checked by the caller; an empty list takes
    /// `other`'s width.
    pub fn append(&mut self, other: Values) {
        match (&mut *self, other) {
            (Values::W64(a), Values::W64(b)) => a.extend(b),
            (Values::W128(a), Values::W128(b)) => a.extend(b),
            (this, other) if this.is_empty() => *this = other,
            (this, other) => {
                for i in 0..other.len() {
                    this.push(Fingerprint::new(other.get(i), Width::W128));
                }
            }
        }
    }

    /// The values as words of an index's width, without a copy when they are
    /// already that width.
    pub fn into_words<B: neardup_core::index::Bits>(self) -> Vec<B> {
        match self {
            Values::W64(v) => bytemuck::allocation::try_cast_vec::<u64, B>(v)
                .unwrap_or_else(|(_, v)| v.into_iter().map(|x| B::from_u128(x as u128)).collect()),
            Values::W128(v) => bytemuck::allocation::try_cast_vec::<u128, B>(v)
                .unwrap_or_else(|(_, v)| v.into_iter().map(B::from_u128).collect()),
        }
    }
}

/// Document ids, compact when they are all integers (the common case).
pub enum IdList {
    Ints(Vec<i64>),
    Any(Vec<Id>),
}

impl IdList {
    /// The id of document `i`.
    pub fn get(&self, i: usize) -> Id {
        match self {
            IdList::Ints(v) => Id::Int(v[i]),
            IdList::Any(v) => v[i].clone(),
        }
    }

    pub fn write_json(&self, i: usize, out: &mut Vec<u8>) {
        match self {
            IdList::Ints(v) => Id::Int(v[i]).write_json(out),
            IdList::Any(v) => v[i].write_json(out),
        }
    }

    fn push(&mut self, id: Id) {
        match (self, id) {
            (IdList::Ints(v), Id::Int(n)) => v.push(n),
            (IdList::Any(v), id) => v.push(id),
            (this, id) => {
                let IdList::Ints(ints) = this else {
                    unreachable!()
                };
                let mut any: Vec<Id> = ints.drain(..).map(Id::Int).collect();
                any.push(id);
                *this = IdList::Any(any);
            }
        }
    }

    /// Appends `other`'s ids.
    pub fn append(&mut self, other: IdList) {
        match (&mut *self, other) {
            (IdList::Ints(a), IdList::Ints(b)) => a.extend(b),
            (IdList::Any(a), IdList::Any(b)) => a.extend(b),
            (this, other) if this.len() == 0 => *this = other,
            (_, IdList::Ints(b)) => b.into_iter().for_each(|n| self.push(Id::Int(n))),
            (_, IdList::Any(b)) => b.into_iter().for_each(|id| self.push(id)),
        }
    }

    fn len(&self) -> usize {
        match self {
            IdList::Ints(v) => v.len(),
            IdList::Any(v) => v.len(),
        }
    }
}

impl Default for IdList {
    fn default() -> Self {
        IdList::Ints(Vec::new())
    }
}

impl From<Vec<Id>> for IdList {
    fn from(ids: Vec<Id>) -> IdList {
        let mut list = IdList::Ints(Vec::with_capacity(ids.len()));
        for id in ids {
            list.push(id);
        }
        list
    }
}

#[derive(Deserialize)]
struct Row<'a> {
    #[serde(default)]
    id: Option<Id>,
    #[serde(borrow)]
    simhash: Cow<'a, str>,
}

/// Lines parsed per parallel chunk.
const CHUNK_LINES: usize = 1 << 16;

/// Reads `path`; blank lines are skipped; any other bad line stops with its
/// number. With `keep_records`, the bytes stay available to copy records out.
pub fn read(path: &Path, keep_records: bool) -> Result<FingerprintFile> {
    let name = path.display().to_string();
    if keep_records {
        let bytes = std::fs::read(path).with_context(|| format!("cannot read {name}"))?;
        let mut parsed = Parsed::default();
        parse_block(&bytes, 0, &name, true, &mut parsed)?;
        return finish(path, parsed, Some(bytes));
    }
    // Streamed in blocks, so memory holds the parsed values, not the file; a
    // reader thread fills the next block while the workers parse this one.
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot read {name}"))?;
    let file_len = file.metadata().map_or(0, |m| m.len());
    let (tx, rx) = crossbeam_channel::bounded::<Result<(Vec<u8>, usize)>>(2);
    // Parsed blocks come back to the reader, so that a large file costs a few
    // blocks of fresh memory, not its whole size in page faults.
    let (spare_tx, spare_rx) = crossbeam_channel::unbounded::<Vec<u8>>();
    let mut parsed = Parsed::default();
    let mut bytes_seen = 0u64;
    std::thread::scope(|scope| -> Result<()> {
        scope.spawn(move || {
            let mut carry: Vec<u8> = Vec::new();
            let mut first_line = 0usize;
            loop {
                let mut buf = spare_rx.try_recv().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(&carry);
                let start = buf.len();
                buf.resize(start + BLOCK, 0);
                let mut filled = start;
                let mut eof = false;
                while filled < buf.len() {
                    match std::io::Read::read(&mut file, &mut buf[filled..]) {
                        Ok(0) => {
                            eof = true;
                            break;
                        }
                        Ok(n) => filled += n,
                        Err(e) => {
                            let _ = tx.send(Err(anyhow::Error::from(e)
                                .context(format!("cannot read {}", path.display()))));
                            return;
                        }
                    }
                }
                buf.truncate(filled);
                // Whole lines go out; the last partial line waits for the next block.
                let cut = if eof {
                    buf.len()
                } else {
                    memchr::memrchr(b'\n', &buf).map_or(0, |i| i + 1)
                };
                carry.clear();
                carry.extend_from_slice(&buf[cut..]);
                buf.truncate(cut);
                let lines = memchr::memchr_iter(b'\n', &buf).count();
                if !buf.is_empty() && tx.send(Ok((buf, first_line))).is_err() {
                    return;
                }
                first_line += lines;
                if eof {
                    return;
                }
            }
        });
        for block in rx.iter() {
            let (buf, first_line) = block?;
            let first = bytes_seen == 0;
            parse_block(&buf, first_line, &name, false, &mut parsed)?;
            bytes_seen += buf.len() as u64;
            if first && bytes_seen < file_len {
                // Room for the whole file at the first block's density, so that
                // the lists are not copied as they grow.
                let estimate = file_len as f64 / bytes_seen as f64 * parsed.values.len() as f64;
                let want = (estimate * 1.02) as usize;
                parsed.reserve(want.saturating_sub(parsed.values.len()));
            }
            let _ = spare_tx.send(buf);
        }
        Ok(())
    })?;
    finish(path, parsed, None)
}

/// Bytes read per block when streaming.
const BLOCK: usize = 8 << 20;

/// Records parsed from a stretch of the file, in file order.
#[derive(Default)]
struct Parsed {
    ids: IdList,
    values: Values,
    /// The width of the first fingerprint, and its line.
    width: Option<(Width, usize)>,
    /// Each record's byte range (when records are kept).
    kept: Vec<(usize, usize)>,
}

impl Parsed {
    /// Checks that a fingerprint of `width` at `line` may join these: one width
    /// per file.
    fn check_width(&mut self, width: Width, line: usize, name: &str) -> Result<()> {
        match self.width {
            None => self.width = Some((width, line)),
            Some((w, _)) if w != width => bail!(
                "{name}:{line}: a {width}-bit fingerprint after {w}-bit ones; a file holds one \
                 width (fingerprint everything with the same --bits)"
            ),
            Some(_) => {}
        }
        Ok(())
    }

    /// Room for `additional` more records.
    /// The lists move to memory advised for huge pages: fewer page faults.
    fn reserve(&mut self, additional: usize) {
        fn grow<T: Clone>(v: &mut Vec<T>, additional: usize) {
            let mut new = with_huge_capacity(v.len() + additional);
            new.extend_from_slice(v);
            *v = new;
        }
        match &mut self.ids {
            IdList::Ints(v) => grow(v, additional),
            IdList::Any(v) => v.reserve(additional),
        }
        match &mut self.values {
            Values::W64(v) => grow(v, additional),
            Values::W128(v) => grow(v, additional),
        }
    }

    /// Appends the records of the stretch that follows.
    fn append(&mut self, other: Parsed, name: &str) -> Result<()> {
        if let Some((w, line)) = other.width {
            self.check_width(w, line, name)?;
        }
        self.ids.append(other.ids);
        self.values.append(other.values);
        self.kept.extend(other.kept);
        Ok(())
    }
}

/// Parses the lines of `bytes` (line numbers counted from `first_line` + 1) in
/// parallel chunks, appending them to `parsed`.
fn parse_block(
    bytes: &[u8],
    first_line: usize,
    name: &str,
    keep_records: bool,
    parsed: &mut Parsed,
) -> Result<()> {
    let mut lines = Vec::new();
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', bytes).chain(std::iter::once(bytes.len())) {
        if end > start || end < bytes.len() {
            let mut e = end;
            if e > start && bytes[e - 1] == b'\r' {
                e -= 1;
            }
            lines.push((start, e));
        }
        start = end + 1;
    }
    let chunks: Vec<Result<Parsed>> = lines
        .par_chunks(CHUNK_LINES)
        .enumerate()
        .map(|(c, chunk)| {
            let mut out = Parsed::default();
            for (j, &(s, e)) in chunk.iter().enumerate() {
                let lineno = first_line + c * CHUNK_LINES + j + 1;
                let Some((id, fp)) = parse_line(&bytes[s..e], lineno as i64)
                    .with_context(|| format!("{name}:{lineno}"))?
                else {
                    continue;
                };
                out.check_width(fp.width(), lineno, name)?;
                out.ids.push(id);
                out.values.push(fp);
                if keep_records {
                    out.kept.push((s, e));
                }
            }
            Ok(out)
        })
        .collect();
    for chunk in chunks {
        parsed.append(chunk?, name)?;
    }
    Ok(())
}

fn finish(path: &Path, parsed: Parsed, bytes: Option<Vec<u8>>) -> Result<FingerprintFile> {
    let Parsed {
        ids,
        values,
        width,
        kept,
    } = parsed;
    let records = bytes.map(|b| (kept, b));
    let name = path.display().to_string();
    let width = width.map(|(w, _)| w);
    let config_path = config_path_for(path);
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
        records,
    })
}

/// The canonical line `{"id":<integer or plain string>,"simhash":"<hex>"}`, as
/// `neardup fingerprint` writes it, without a JSON parser: the id and the hex
/// digits (unchecked); None for anything else.
fn parse_canonical(line: &[u8]) -> Option<(Id, &[u8])> {
    let rest = line.strip_prefix(b"{\"id\":")?;
    let (id, rest) = if let Some(r) = rest.strip_prefix(b"\"") {
        let end = memchr::memchr2(b'"', b'\\', r)?;
        if r[end] != b'"' {
            return None;
        }
        (
            Id::Str(std::str::from_utf8(&r[..end]).ok()?.to_owned()),
            &r[end + 1..],
        )
    } else {
        let end = rest.iter().position(|&b| b == b',')?;
        (Id::Int(fast_int(&rest[..end])?), &rest[end..])
    };
    let hex = rest
        .strip_prefix(b",\"simhash\":\"")?
        .strip_suffix(b"\"}")?;
    Some((id, hex))
}

/// 16 or 32 lower- or upper-case hex digits, the width `neardup fingerprint`
/// writes; anything else is left to [`Fingerprint::parse_hex`] and its messages.
fn fast_hex(hex: &[u8]) -> Option<Fingerprint> {
    /// Hex digit values; 0x80 marks a byte that is not one.
    static HEX: [u8; 256] = {
        let mut t = [0x80u8; 256];
        let mut i = 0;
        while i < 10 {
            t[b'0' as usize + i] = i as u8;
            i += 1;
        }
        let mut i = 0;
        while i < 6 {
            t[b'a' as usize + i] = 10 + i as u8;
            t[b'A' as usize + i] = 10 + i as u8;
            i += 1;
        }
        t
    };
    /// Without a branch per digit: random hex digits defeat branch prediction.
    fn half(digits: &[u8]) -> Option<u64> {
        let mut v = 0u64;
        let mut bad = 0u8;
        for &c in digits {
            let d = HEX[c as usize];
            bad |= d;
            v = v << 4 | u64::from(d & 0xF);
        }
        (bad & 0x80 == 0).then_some(v)
    }
    match hex.len() {
        16 => Some(Fingerprint::from_u64(half(hex)?)),
        32 => Some(Fingerprint::new(
            (half(&hex[..16])? as u128) << 64 | half(&hex[16..])? as u128,
            Width::W128,
        )),
        _ => None,
    }
}

/// A decimal integer id, by hand (no UTF-8 check needed for ASCII digits).
fn fast_int(digits: &[u8]) -> Option<i64> {
    let (neg, digits) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut v = 0i64;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + (c - b'0') as i64;
    }
    Some(if neg { -v } else { v })
}

fn parse_line(line: &[u8], lineno: i64) -> Result<Option<(Id, Fingerprint)>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if let Some((id, hex)) = parse_canonical(line) {
        let fp = match fast_hex(hex) {
            Some(fp) => fp,
            None => Fingerprint::parse_hex(&String::from_utf8_lossy(hex))?,
        };
        return Ok(Some((id, fp)));
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
        .unwrap_or_else(|_| Id::Str(unescape_tsv(id)));
    Ok(Some((id, Fingerprint::parse_hex(hex.trim())?)))
}

/// A TSV id as [`write_line`] escapes it: `\t`, `\n`, `\r` and `\\` back
/// to the characters (any other backslash is kept).
fn unescape_tsv(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    let mut chars = id.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// Appends the line of document `id` with fingerprint `fp`: JSON
/// `{"id": ..., "simhash": "<hex>"}`, or `id<TAB>hex` with `tsv` (tabs,
/// newlines and backslashes in string ids escaped).
pub fn write_line(id: &Id, fp: Fingerprint, tsv: bool, out: &mut Vec<u8>) {
    if tsv {
        write_tsv_id(id, out);
        let _ = writeln!(out, "\t{fp}");
    } else {
        out.extend_from_slice(b"{\"id\":");
        id.write_json(out);
        let _ = writeln!(out, ",\"simhash\":\"{fp}\"}}");
    }
}

/// `FILE.config.json`, read back by commands that take fingerprint files.
pub fn config_path_for(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".config.json");
    PathBuf::from(name)
}

pub fn save_config_beside(path: &Path, config: &FingerprintConfig) -> Result<()> {
    if path.as_os_str() == "-" {
        return Ok(());
    }
    crate::pipeline_args::save_config(&config_path_for(path), config)
}

fn write_tsv_id(id: &Id, out: &mut Vec<u8>) {
    match id {
        Id::Int(n) => {
            let _ = write!(out, "{n}");
        }
        Id::Str(s) => {
            for c in s.chars() {
                match c {
                    '\t' => out.extend_from_slice(b"\\t"),
                    '\n' => out.extend_from_slice(b"\\n"),
                    '\r' => out.extend_from_slice(b"\\r"),
                    '\\' => out.extend_from_slice(b"\\\\"),
                    c => {
                        let mut buf = [0; 4];
                        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte at every position of a 16- and a 32-digit value: accepted
    /// exactly when it is a hex digit, and then with the value the standard
    /// library parses.
    #[test]
    fn fast_hex_equals_the_standard_parse() {
        let base = b"0123456789abcdefFEDCBA9876543210";
        for len in [16usize, 32] {
            for pos in 0..len {
                for byte in 0..=255u8 {
                    let mut s = base[..len].to_vec();
                    s[pos] = byte;
                    let want = std::str::from_utf8(&s)
                        .ok()
                        .filter(|t| t.bytes().all(|c| c.is_ascii_hexdigit()))
                        .map(|t| u128::from_str_radix(t, 16).unwrap());
                    assert_eq!(fast_hex(&s).map(|f| f.value()), want, "{s:?}");
                }
            }
        }
        assert_eq!(fast_hex(b"0123"), None);
    }

    /// What write_line writes, parse_line reads back: every id and
    /// fingerprint in JSON Lines; in TSV every id but strings that look like
    /// integers (TSV has no quotes), tabs, newlines and backslashes included.
    #[test]
    fn written_lines_read_back() {
        let ids = [
            Id::Int(0),
            Id::Int(-42),
            Id::Str("plain".into()),
            Id::Str("tab\there".into()),
            Id::Str("new\nline\r".into()),
            Id::Str("back\\slash \\t not a tab".into()),
            Id::Str("quote \" and é 中文".into()),
            Id::Str("".into()),
        ];
        let fps = [
            Fingerprint::from_u64(0x0123_4567_89ab_cdef),
            Fingerprint::new(u128::MAX - 5, Width::W128),
        ];
        for tsv in [false, true] {
            for id in &ids {
                for &fp in &fps {
                    let mut line = Vec::new();
                    write_line(id, fp, tsv, &mut line);
                    assert_eq!(line.last(), Some(&b'\n'));
                    let body = &line[..line.len() - 1];
                    assert!(!body.contains(&b'\n'), "{line:?}");
                    let (got_id, got_fp) = parse_line(body, 7).unwrap().unwrap();
                    assert_eq!(got_fp, fp, "{id:?} tsv={tsv}");
                    assert_eq!(got_id.to_string(), id.to_string(), "tsv={tsv}");
                }
            }
        }
    }
}
