//! The second read of `dedup`'s write phase for plain line files: records
//! split between the kept and dropped outputs in large blocks, with no
//! record parsed, allocated or copied on its own. A reader thread reads the
//! next block while this one is split, and runs of consecutive records bound
//! for one output unchanged go out as one write.
//!
//! What a record is, and what is written for it, is what [`DocReader`](crate::input::DocReader)
//! (`crate::input`) and the write phase make of it: a line without its line
//! end (`\n` or `\r\n`) and, at the start of a file, without a byte-order
//! mark, written with `\n`; blank lines between JSON Lines records are not
//! documents.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use neardup_core::lines::{Line, LineCutter};

use crate::input::{Format, InputArgs, advise};
use crate::output::NamedOutput;

/// Bytes read at a time.
const BLOCK: usize = 4 << 20;

/// An uncompressed file of lines or JSON Lines records.
#[derive(Debug)]
pub struct PlainFile {
    path: PathBuf,
    jsonl: bool,
}

/// The inputs as [`DocReader`](crate::input::DocReader) would read them, if
/// every one is an uncompressed file of lines or JSON Lines (not standard
/// input, not a whole-file document, not compressed, Parquet or `.npy`).
pub fn plain_line_files(args: &InputArgs) -> Result<Option<Vec<PlainFile>>> {
    let mut files = Vec::new();
    for (path, format) in crate::input::source_paths(args)? {
        let (Some(path), Format::Jsonl | Format::Lines) = (path, format) else {
            return Ok(None);
        };
        let mut head = [0u8; 4];
        let mut file =
            File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
        let n = read_up_to(&mut file, &mut head)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if crate::input::is_compressed(&head[..n]) {
            return Ok(None);
        }
        files.push(PlainFile {
            path,
            jsonl: format == Format::Jsonl,
        });
    }
    Ok(Some(files))
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            m => n += m,
        }
    }
    Ok(n)
}

/// Where the records go: document `doc` (counted from 0 over all files) to
/// `keep` if `kept(doc)`, else to `drop`; an output that is `None` gets
/// nothing. Returns the number of documents.
pub fn split_records(
    files: &[PlainFile],
    kept: impl Fn(usize) -> bool,
    keep: Option<&mut NamedOutput>,
    drop: Option<&mut NamedOutput>,
) -> Result<usize> {
    split_records_in(BLOCK, files, kept, keep, drop)
}

/// [`split_records`], reading `block` bytes at a time.
fn split_records_in(
    block: usize,
    files: &[PlainFile],
    kept: impl Fn(usize) -> bool,
    keep: Option<&mut NamedOutput>,
    drop: Option<&mut NamedOutput>,
) -> Result<usize> {
    std::thread::scope(|s| {
        let (full_tx, full_rx) = crossbeam_channel::bounded::<io::Result<Block>>(2);
        let (empty_tx, empty_rx) = crossbeam_channel::bounded::<Vec<u8>>(3);
        for _ in 0..3 {
            empty_tx.send(Vec::new()).expect("room for three");
        }
        s.spawn(move || read_blocks(files, block, &empty_rx, &full_tx));
        let mut splitter = Splitter {
            kept: &kept,
            doc: 0,
            run: None,
        };
        let mut cutter = LineCutter::new();
        let mut outs = [keep, drop];
        let mut split = || -> Result<()> {
            for read in &full_rx {
                let read = read?;
                let file = &files[read.file];
                splitter.block(&mut cutter, file, &read, &mut outs)?;
                if read.last {
                    splitter.end_of_file(&mut cutter, file, &mut outs)?;
                }
                // The reader has stopped if this fails; its error comes first.
                let _ = empty_tx.send(read.bytes);
            }
            Ok(())
        };
        let result = split();
        // On an error (a full disk), the reader stops at its next send or
        // receive: it is not left waiting while the scope waits for it.
        std::mem::drop((full_rx, empty_tx));
        result.map(|()| splitter.doc)
    })
}

/// A block of one file's bytes.
struct Block {
    file: usize,
    /// Offset of the block in its file.
    at: u64,
    bytes: Vec<u8>,
    /// Whether the file ends with this block.
    last: bool,
}

/// Reads the files in blocks into `full`, in buffers from `empty`; the
/// first error goes to `full` and ends the reading, as does either channel's
/// other end going away.
fn read_blocks(
    files: &[PlainFile],
    size: usize,
    empty: &crossbeam_channel::Receiver<Vec<u8>>,
    full: &crossbeam_channel::Sender<io::Result<Block>>,
) {
    if let Err(e) = send_blocks(files, size, empty, full) {
        let _ = full.send(Err(e));
    }
}

fn send_blocks(
    files: &[PlainFile],
    size: usize,
    empty: &crossbeam_channel::Receiver<Vec<u8>>,
    full: &crossbeam_channel::Sender<io::Result<Block>>,
) -> io::Result<()> {
    let named = |what: &str, f: &PlainFile, e: io::Error| {
        io::Error::new(e.kind(), format!("cannot {what} {}: {e}", f.path.display()))
    };
    for (i, f) in files.iter().enumerate() {
        let mut file = File::open(&f.path).map_err(|e| named("open", f, e))?;
        // Read in order: the kernel reads ahead further, and the next
        // blocks are asked for while this one is split (the input may have
        // left the page cache to make room for the spill).
        advise(&file, 0, 0, libc::POSIX_FADV_SEQUENTIAL);
        let mut at = 0u64;
        loop {
            let Ok(mut bytes) = empty.recv() else {
                return Ok(());
            };
            advise(
                &file,
                at + size as u64,
                4 * size as u64,
                libc::POSIX_FADV_WILLNEED,
            );
            bytes.resize(size, 0);
            let n = read_up_to(&mut file, &mut bytes).map_err(|e| named("read", f, e))?;
            bytes.truncate(n);
            let last = n < size;
            let block = Block {
                file: i,
                at,
                bytes,
                last,
            };
            if full.send(Ok(block)).is_err() {
                return Ok(());
            }
            at += n as u64;
            if last {
                break;
            }
        }
    }
    Ok(())
}

/// Splits blocks into records and writes them.
struct Splitter<'a, K> {
    kept: &'a K,
    /// Documents so far.
    doc: usize,
    /// Consecutive records of the current block bound for one output
    /// unchanged, line ends included: (output, start, end) in the block.
    run: Option<(usize, usize, usize)>,
}

impl<K: Fn(usize) -> bool> Splitter<'_, K> {
    fn block(
        &mut self,
        cutter: &mut LineCutter,
        file: &PlainFile,
        block: &Block,
        outs: &mut [Option<&mut NamedOutput>; 2],
    ) -> Result<()> {
        let bytes = &block.bytes[..];
        cutter.feed(block.at, bytes, |line| {
            self.record(file, line, bytes, outs).map(|()| true)
        })?;
        self.flush_run(bytes, outs)
    }

    /// A file's last line, if it has no line end.
    fn end_of_file(
        &mut self,
        cutter: &mut LineCutter,
        file: &PlainFile,
        outs: &mut [Option<&mut NamedOutput>; 2],
    ) -> Result<()> {
        cutter.finish(|line| self.record(file, line, &[], outs).map(|()| true))?;
        Ok(())
    }

    /// One line of `bytes`, the block just fed (if it lies there whole, it
    /// may join a run).
    fn record(
        &mut self,
        file: &PlainFile,
        line: Line<'_>,
        bytes: &[u8],
        outs: &mut [Option<&mut NamedOutput>; 2],
    ) -> Result<()> {
        let mut text = line.text;
        if line.ended {
            text = text.strip_suffix(b"\r").unwrap_or(text);
        }
        if file.jsonl && text.iter().all(u8::is_ascii_whitespace) {
            // Not a document: nothing is written for it.
            return self.flush_run(bytes, outs);
        }
        let target = usize::from(!(self.kept)(self.doc));
        self.doc += 1;
        match line.in_block {
            Some(start) if line.whole_in_block() && text.len() == line.text.len() => {
                let end = start + text.len() + 1;
                match &mut self.run {
                    Some((t, _, e)) if *t == target && *e == start => *e = end,
                    _ => {
                        self.flush_run(bytes, outs)?;
                        self.run = Some((target, start, end));
                    }
                }
            }
            _ => {
                self.flush_run(bytes, outs)?;
                if let Some(out) = outs[target].as_deref_mut() {
                    out.write_all(text)?;
                    out.write_all(b"\n")?;
                }
            }
        }
        Ok(())
    }

    fn flush_run(&mut self, bytes: &[u8], outs: &mut [Option<&mut NamedOutput>; 2]) -> Result<()> {
        if let Some((t, s, e)) = self.run.take()
            && let Some(out) = outs[t].as_deref_mut()
        {
            out.write_all(&bytes[s..e])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use neardup_core::lines::BOM;
    use neardup_core::rng::SplitMix64;

    use super::*;
    use crate::input::{DocReader, Record, parse_input_args};

    /// A random file of lines: JSON objects, blank and whitespace lines,
    /// `\r\n` or `\n` line ends, a byte-order mark or not, a last line
    /// with or without its line end.
    fn random_file(rng: &mut SplitMix64) -> Vec<u8> {
        let mut out = Vec::new();
        if rng.next().is_multiple_of(3) {
            out.extend_from_slice(BOM);
        }
        let lines = rng.next() % 12;
        for i in 0..lines {
            match rng.next() % 6 {
                0 => {}
                1 => out.extend_from_slice(b" \t "),
                2 => out.extend_from_slice("{\"text\": \"caf\u{e9} \u{4e2d}\u{6587}\"}".as_bytes()),
                _ => {
                    let n = rng.next() % 40;
                    out.extend_from_slice(
                        format!("{{\"text\": \"{}\"}}", "w".repeat(n as usize)).as_bytes(),
                    );
                }
            }
            if i + 1 < lines || rng.next().is_multiple_of(2) {
                out.extend_from_slice(if rng.next().is_multiple_of(3) {
                    b"\r\n"
                } else {
                    b"\n"
                });
            }
        }
        out
    }

    fn read_out(path: &std::path::Path) -> Vec<u8> {
        std::fs::read(path).unwrap_or_default()
    }

    /// The records and where they go, as the write phase's reader path
    /// (records read by `DocReader`) makes them.
    fn oracle(args: &InputArgs, kept: impl Fn(usize) -> bool) -> (Vec<u8>, Vec<u8>, usize) {
        let mut reader = DocReader::new(args).unwrap();
        let (mut keep, mut drop, mut doc) = (Vec::new(), Vec::new(), 0);
        while let Some(batch) = reader.next_batch().unwrap() {
            for bytes in batch.into_iter().filter_map(Record::into_document_bytes) {
                let out = if kept(doc) { &mut keep } else { &mut drop };
                out.extend_from_slice(&bytes);
                out.push(b'\n');
                doc += 1;
            }
        }
        (keep, drop, doc)
    }

    #[test]
    fn splits_records_as_the_document_reader_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = SplitMix64(7);
        for case in 0..300 {
            let lines_format = case % 4 == 3;
            let ext = if lines_format { "txt" } else { "jsonl" };
            let mut paths = Vec::new();
            for f in 0..1 + rng.next() % 3 {
                let p = dir.path().join(format!("c{case}-{f}.{ext}"));
                std::fs::write(&p, random_file(&mut rng)).unwrap();
                paths.push(p.display().to_string());
            }
            let mut argv = Vec::new();
            if lines_format {
                argv.push("--lines".to_owned());
            }
            argv.extend(paths);
            let args = parse_input_args(argv);
            let seed = rng.next();
            let kept = |d: usize| !SplitMix64(seed ^ d as u64).next().is_multiple_of(3);
            let (want_keep, want_drop, want_docs) = oracle(&args, kept);

            let files = plain_line_files(&args).unwrap().expect("plain line files");
            let (kp, dp) = (dir.path().join("keep"), dir.path().join("drop"));
            let mut keep = NamedOutput::create(&kp).unwrap();
            let mut drop = NamedOutput::create(&dp).unwrap();
            let block = 1 + (rng.next() % 64) as usize;
            let docs =
                split_records_in(block, &files, kept, Some(&mut keep), Some(&mut drop)).unwrap();
            keep.finish().unwrap();
            drop.finish().unwrap();
            assert_eq!(docs, want_docs, "case {case}, block {block}");
            assert_eq!(read_out(&kp), want_keep, "case {case}, block {block}");
            assert_eq!(read_out(&dp), want_drop, "case {case}, block {block}");
        }
    }

    /// A failed write (a full disk) ends the split with its error while the
    /// reader still has blocks to give: nothing waits for ever.
    #[test]
    fn a_failed_write_stops_the_reader_too() {
        if !std::path::Path::new("/dev/full").exists() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.jsonl");
        let line = format!("{{\"text\": \"{}\"}}\n", "w".repeat(1000));
        std::fs::write(&path, line.repeat(2000)).unwrap();
        let args = parse_input_args([path.to_str().unwrap()]);
        let files = plain_line_files(&args).unwrap().expect("a plain file");
        let mut full = NamedOutput::create(std::path::Path::new("/dev/full")).unwrap();
        let result = split_records_in(4096, &files, |_| true, Some(&mut full), None);
        let err = result.expect_err("the writes fail");
        assert!(format!("{err:#}").contains("No space"), "{err:#}");
    }

    #[test]
    fn compressed_inputs_and_standard_input_are_not_plain() {
        let dir = tempfile::tempdir().unwrap();
        let gz = dir.path().join("a.jsonl.gz");
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(b"{\"text\": \"a\"}\n").unwrap();
        std::fs::write(&gz, e.finish().unwrap()).unwrap();
        let plain = dir.path().join("b.jsonl");
        std::fs::write(&plain, b"{\"text\": \"b\"}\n").unwrap();
        let args = |v: &[&str]| parse_input_args(v.iter().copied());
        let p = plain.to_str().unwrap();
        assert!(plain_line_files(&args(&[p])).unwrap().is_some());
        assert!(
            plain_line_files(&args(&[p, gz.to_str().unwrap()]))
                .unwrap()
                .is_none()
        );
        assert!(plain_line_files(&args(&["-"])).unwrap().is_none());
    }
}
