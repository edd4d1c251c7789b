//! The lines of one byte range of a JSON Lines file, read by the executor
//! that reads it: handed to the fingerprint pass as one buffer
//! ([`range_lines`]), or copied, the kept ones, by the Spark job's local
//! writer of `deduped/` (`neardup.spark.writing`) with no record turned
//! into a Python or Arrow value ([`write_kept_lines`]).
//!
//! A range holds the lines whose first byte lies in it (the line holding
//! the byte before the range belongs to the range before). A line is named
//! by its position, `base | byte offset` (`base` = the file's rank << 40);
//! at the start of a file a UTF-8 byte-order mark is not part of the first
//! line, whose position is the byte after it. Blank lines (only spaces,
//! tabs, form feeds and line ends) are not records. A kept line is written
//! without its line end (`\n`, and a `\r` before it) and with `\n`, as the
//! Python readers (`neardup.spark.read`) cut lines.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

use neardup_core::lines::{Line, LineCutter};
use neardup_core::output::Output;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::{err, i64s};

/// Bytes read at a time.
const BLOCK: usize = 8 << 20;

fn blank(line: &[u8]) -> bool {
    line.iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0c))
}

/// A line's text (without its `\n`) without a final `\r`.
fn without_end(text: &[u8]) -> &[u8] {
    text.strip_suffix(b"\r").unwrap_or(text)
}

/// Why a copy stopped: reading the input or writing the output.
#[derive(Debug)]
pub(crate) enum CopyError {
    Read(io::Error),
    Write(io::Error),
}

/// Visits the lines of `input` whose first byte lies in `start..end`, in
/// order, while `visit` returns true: each as core's [`LineCutter`] cuts it
/// (past a byte-order mark at the start of the file). The first read is
/// about `first` bytes. Returns the offset of the first line not visited,
/// or `end` when every one was.
fn each_line(
    input: &mut (impl Read + Seek),
    start: u64,
    end: u64,
    first: usize,
    mut visit: impl FnMut(Line<'_>) -> Result<bool, CopyError>,
) -> Result<u64, CopyError> {
    let from = start.saturating_sub(1);
    input.seek(SeekFrom::Start(from)).map_err(CopyError::Read)?;
    // With start > 0, the first line from byte start - 1 is the range before's.
    let mut skipping = start > 0;
    let mut next = end;
    let mut on_line = |line: Line<'_>| -> Result<bool, CopyError> {
        if skipping {
            skipping = false;
            return Ok(true);
        }
        if line.start >= end {
            return Ok(false);
        }
        if !visit(line)? {
            next = line.start;
            return Ok(false);
        }
        Ok(true)
    };
    let mut cutter = LineCutter::new();
    let mut buf = vec![0u8; first.max(1)];
    let mut at = from;
    loop {
        let n = read_full(input, &mut buf).map_err(CopyError::Read)?;
        if !cutter.feed(at, &buf[..n], &mut on_line)? {
            break;
        }
        if n < buf.len() {
            cutter.finish(&mut on_line)?;
            break;
        }
        at += n as u64;
        buf.resize(BLOCK, 0);
    }
    Ok(next)
}

/// Copies the kept lines of bytes `start..end` of `input` to `out`: those
/// whose position is not in `gone` (ascending) and that are not blank.
/// Returns the number of lines written.
pub(crate) fn copy_kept(
    input: &mut (impl Read + Seek),
    start: u64,
    end: u64,
    base: i64,
    gone: &[i64],
    out: &mut impl Write,
) -> Result<u64, CopyError> {
    // A small range's first read is about its size.
    let first = BLOCK.min(
        usize::try_from(end.saturating_sub(start.saturating_sub(1)))
            .unwrap_or(BLOCK)
            .saturating_add(64 << 10),
    );
    let mut g = 0usize;
    let mut rows = 0u64;
    each_line(input, start, end, first, |line| {
        let pos = base | line.text_at as i64;
        while g < gone.len() && gone[g] < pos {
            g += 1;
        }
        if gone.get(g) != Some(&pos) && !blank(line.text) {
            out.write_all(without_end(line.text))
                .map_err(CopyError::Write)?;
            out.write_all(b"\n").map_err(CopyError::Write)?;
            rows += 1;
        }
        Ok(true)
    })?;
    Ok(rows)
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(m) => n += m,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Writes to file `out` the kept lines of bytes `start..end` of file
/// `path` (lines whose position, `base | byte offset`, is not among
/// `gone`, little-endian i64 in any order, and that are not blank), each
/// ending in `\n`. Returns the number of lines written.
#[pyfunction]
#[pyo3(signature = (path, start, end, base, gone, out))]
pub fn write_kept_lines(
    py: Python<'_>,
    path: &str,
    start: u64,
    end: u64,
    base: i64,
    gone: &[u8],
    out: &str,
) -> PyResult<u64> {
    let mut gone = i64s(gone);
    py.detach(|| {
        gone.sort_unstable();
        let mut input = File::open(path).map_err(|e| {
            err(format!(
                "{path}: cannot read it ({e}); check the path and its permissions"
            ))
        })?;
        // Core's output file: whole blocks written by direct I/O where the
        // file system takes it, so that the kept records neither fill the
        // page cache nor cost the kernel fresh pages, as `neardup dedup`
        // writes its own; renamed into place once whole.
        // Its errors name the file already.
        let mut w = Output::create(Some(Path::new(out))).map_err(err)?;
        let rows = copy_kept(&mut input, start, end, base, &gone, &mut w).map_err(|e| match e {
            CopyError::Read(e) => err(format!("{path}: cannot read it ({e})")),
            CopyError::Write(e) => err(e),
        })?;
        w.finish().map_err(err)?;
        Ok(rows)
    })
}

/// Lines read from a byte range ([`read_lines`]).
pub(crate) struct Lines {
    /// Their bytes, line ends kept, one after another.
    pub data: Vec<u8>,
    /// Where each begins in `data`, and the end of the last.
    pub starts: Vec<i64>,
    /// Their positions, `base | byte offset`.
    pub positions: Vec<i64>,
    /// The offset of the next line to read (`end` when none is left).
    pub next: u64,
}

/// The lines of `input` that begin in bytes `start..end` and before
/// `start + limit` (at least one line when one begins in the range).
pub(crate) fn read_lines(
    input: &mut (impl Read + Seek),
    start: u64,
    end: u64,
    base: i64,
    limit: u64,
) -> io::Result<Lines> {
    let cut = end.min(start.saturating_add(limit.max(1)));
    let first = usize::try_from(cut.saturating_sub(start.saturating_sub(1)))
        .unwrap_or(BLOCK)
        .saturating_add(64 << 10);
    let mut data: Vec<u8> = Vec::new();
    let mut starts: Vec<i64> = Vec::new();
    let mut positions: Vec<i64> = Vec::new();
    let next = each_line(input, start, end, first, |line| {
        if line.start >= cut {
            return Ok(false);
        }
        starts.push(data.len() as i64);
        positions.push(base | line.text_at as i64);
        data.extend_from_slice(line.text);
        if line.ended {
            data.push(b'\n');
        }
        Ok(true)
    })
    .map_err(|e| match e {
        CopyError::Read(e) | CopyError::Write(e) => e,
    })?;
    starts.push(data.len() as i64);
    Ok(Lines {
        data,
        starts,
        positions,
        next,
    })
}

/// `range_lines`' answer: bytes, starts, positions, the offset to go on from.
type LinesBytes<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    u64,
);

/// The lines of file `path` that begin in bytes `start..end`, about `limit`
/// bytes of them: (their bytes, line ends kept; where each begins in them
/// and the end of the last, little-endian i64; their positions, `base |
/// byte offset`, little-endian i64; the offset to read on from, `end` when
/// the range is done). A UTF-8 byte-order mark at the start of the file is
/// not part of its first line.
#[pyfunction]
#[pyo3(signature = (path, start, end, base, limit))]
pub fn range_lines<'py>(
    py: Python<'py>,
    path: &str,
    start: u64,
    end: u64,
    base: i64,
    limit: u64,
) -> PyResult<LinesBytes<'py>> {
    let lines = py
        .detach(|| {
            let mut input = File::open(path)?;
            read_lines(&mut input, start, end, base, limit)
        })
        .map_err(|e| {
            err(format!(
                "{path}: cannot read it ({e}); check the path and its permissions"
            ))
        })?;
    let bytes = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    Ok((
        PyBytes::new(py, &lines.data),
        PyBytes::new(py, &bytes(&lines.starts)),
        PyBytes::new(py, &bytes(&lines.positions)),
        lines.next,
    ))
}
