//! The streaming, parallel, order-preserving document pipeline: a reader thread
//! fills bounded batches; each batch is cut into chunks that rayon's workers
//! map as they come free; results are handed to the sink, on a thread of its
//! own, batch by batch in input order. Memory is bounded by a few batches.

use std::io::IsTerminal;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::input::{Doc, DocReader, InputArgs, ReadStats, Record, RecordError};

/// Batches waiting between the reader and the workers.
const QUEUE: usize = 2;

/// Batches given to the workers and not yet through the sink: while the
/// last documents of one batch are fingerprinted, an idle worker starts on
/// the next, so the pool never waits at a batch's end.
const IN_FLIGHT: usize = 3;

/// Bytes of records read and not yet through the sink, beyond one batch a
/// worker: batches of ordinary records (4 MB each) never reach it, but a
/// batch is at least one record, and records of hundreds of MB would
/// otherwise be read ahead as many batches deep as ordinary ones.
const IN_FLIGHT_BYTES: u64 = 32 << 20;

/// The records between the reader and the sink: the reader waits before
/// handing on a batch that would take them past [`IN_FLIGHT_BYTES`], unless
/// fewer batches than workers are in flight (so that each worker has a
/// document, however long); the sink lets each batch go once it has taken
/// it, in input order.
struct Budget {
    state: std::sync::Mutex<InFlight>,
    freed: std::sync::Condvar,
    workers: usize,
}

#[derive(Default)]
struct InFlight {
    /// Each batch's bytes, oldest first.
    batches: std::collections::VecDeque<u64>,
    bytes: u64,
    /// The run is ending (the sink stopped): nothing waits any more.
    closed: bool,
}

impl Budget {
    fn new(workers: usize) -> Budget {
        Budget {
            state: Default::default(),
            freed: std::sync::Condvar::new(),
            workers: workers.max(1),
        }
    }

    /// Waits for room for a batch of `bytes`; false once the run is ending.
    fn admit(&self, bytes: u64) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while !s.closed && s.batches.len() >= self.workers && s.bytes + bytes > IN_FLIGHT_BYTES {
            s = self.freed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.closed {
            return false;
        }
        s.batches.push_back(bytes);
        s.bytes += bytes;
        true
    }

    /// The oldest batch is through the sink.
    fn release(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bytes) = s.batches.pop_front() {
            s.bytes -= bytes;
        }
        self.freed.notify_all();
    }

    /// No batch will be released any more: the reader stops waiting.
    fn close(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        self.freed.notify_all();
    }
}

/// Reads every document of `args`, maps each with `map` in parallel, and gives
/// each batch and its results to `sink`, in input order. Records are decoded and
/// parsed on the worker threads; a malformed one stops the run with its place
/// named, or is counted and skipped with `--skip-invalid`.
pub fn for_each_batch<T, M, S>(
    args: &InputArgs,
    keep_raw: bool,
    quiet: bool,
    map: M,
    mut sink: S,
) -> Result<ReadStats>
where
    T: Send,
    M: Fn(&Doc) -> T + Sync,
    S: FnMut(Vec<Doc>, Vec<T>) -> Result<()> + Send,
{
    let mut reader = DocReader::new(args)?;
    let bar = progress_bar(DocReader::total_bytes(args), quiet);
    {
        let bar = Arc::clone(&bar);
        reader.on_progress(move |n| bar.inc(n));
    }
    let (tx, rx) = crossbeam_channel::bounded::<Result<Vec<Record>>>(QUEUE);
    let budget = Budget::new(rayon::current_num_threads());
    let result = std::thread::scope(|scope| -> Result<(ReadStats, u64)> {
        let budget = &budget;
        let producer = scope.spawn(move || {
            loop {
                match reader.next_batch() {
                    Ok(Some(batch)) => {
                        let bytes = batch.iter().map(|r| r.byte_len() as u64).sum();
                        // Either fails only when the sink stopped on an error.
                        if !budget.admit(bytes) || tx.send(Ok(batch)).is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        break;
                    }
                }
            }
            reader.bytes
        });
        // Each batch is cut into chunks of a few records, each mapped by a
        // task of the pool; up to IN_FLIGHT batches at a time (a permit
        // each, handed back once the sink has taken the batch). The tasks
        // are flat (no task waits for another), so a worker that finishes
        // one chunk takes the next, of this batch or the next one. The sink
        // runs on its own thread and takes the batches in input order,
        // whatever order their chunks finish in: what it does serially
        // (counting, writing the spill, freeing the batch) overlaps with
        // the next batches' fingerprints rather than idling the pool.
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<Chunk<T>>();
        let (permit_tx, permit_rx) = crossbeam_channel::bounded::<()>(IN_FLIGHT);
        let sinker = scope.spawn(move || -> Result<ReadStats> {
            let mut stats = ReadStats::default();
            let mut batches = Reassembly::default();
            let take = || -> Result<()> {
                for chunk in done_rx {
                    batches.add(chunk);
                    while let Some(parsed) = batches.next_whole() {
                        let (docs, outs) = sort_parsed(parsed?, args.skip_invalid, &mut stats)?;
                        sink(docs, outs)?;
                        budget.release();
                        // The main thread has stopped if this fails.
                        let _ = permit_rx.try_recv();
                    }
                }
                Ok(())
            };
            let taken = take();
            budget.close();
            taken.map(|()| stats)
        });
        rayon::in_place_scope(|pool| {
            for (batch, read) in rx.iter().enumerate() {
                // Fails only when the sink stopped on an error, which its
                // join below returns.
                if permit_tx.send(()).is_err() {
                    break;
                }
                let records = match read {
                    Ok(records) => records,
                    Err(e) => {
                        let _ = done_tx.send(Chunk::whole(batch, Err(e)));
                        break;
                    }
                };
                let chunks = cut(records);
                let of = chunks.len();
                for (index, records) in chunks.into_iter().enumerate() {
                    let (done_tx, map) = (done_tx.clone(), &map);
                    pool.spawn(move |_| {
                        let parsed = map_chunk(records, args, keep_raw, map);
                        let _ = done_tx.send(Chunk {
                            batch,
                            index,
                            of,
                            parsed,
                        });
                    });
                }
            }
            drop(rx);
            drop(done_tx);
        });
        let stats = sinker.join().expect("sink thread panicked")?;
        let bytes = producer.join().expect("reader thread panicked");
        Ok((stats, bytes))
    });
    bar.finish_and_clear();
    let (mut stats, bytes) = result?;
    stats.bytes = bytes;
    Ok(stats)
}

/// Records as the workers parsed and mapped them.
type Parsed<T> = Vec<Result<Option<(Doc, T)>, RecordError>>;

/// Parses a chunk's records and maps each document. A panic becomes the
/// chunk's error: the sink, which waits for every chunk of a batch, stops
/// on it rather than waiting for ever.
fn map_chunk<T>(
    records: Vec<Record>,
    args: &InputArgs,
    keep_raw: bool,
    map: &impl Fn(&Doc) -> T,
) -> Result<Parsed<T>> {
    let parse = |r: Record| {
        let doc = r.parse(args, keep_raw)?;
        Ok(doc.map(|doc| {
            let t = map(&doc);
            (doc, t)
        }))
    };
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        records.into_iter().map(parse).collect()
    }))
    .map_err(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        anyhow::anyhow!("internal error: a worker thread panicked ({what}); please report it")
    })
}

/// A chunk of a batch holds at most this many records...
const CHUNK_RECORDS: usize = 32;
/// ...and stops at the first record that takes it to this many bytes.
const CHUNK_BYTES: usize = 128 << 10;

/// Cuts a batch into chunks of a few records (at least one).
fn cut(records: Vec<Record>) -> Vec<Vec<Record>> {
    let mut chunks = Vec::new();
    let (mut chunk, mut bytes) = (Vec::new(), 0);
    for r in records {
        bytes += r.byte_len();
        chunk.push(r);
        if chunk.len() == CHUNK_RECORDS || bytes >= CHUNK_BYTES {
            chunks.push(std::mem::take(&mut chunk));
            bytes = 0;
        }
    }
    if !chunk.is_empty() || chunks.is_empty() {
        chunks.push(chunk);
    }
    chunks
}

/// Chunk `index` of `of` of batch `batch`, mapped (or the reader's error,
/// as a batch of one chunk).
struct Chunk<T> {
    batch: usize,
    index: usize,
    of: usize,
    parsed: Result<Parsed<T>>,
}

impl<T> Chunk<T> {
    fn whole(batch: usize, parsed: Result<Parsed<T>>) -> Chunk<T> {
        Chunk {
            batch,
            index: 0,
            of: 1,
            parsed,
        }
    }
}

/// The chunks that have come, until their batches are whole and the
/// batches before them gone.
struct Reassembly<T> {
    /// The batch to give next.
    next: usize,
    /// Per batch: its chunks by index, and how many are still to come.
    waiting: std::collections::HashMap<usize, (Slots<T>, usize)>,
}

/// A batch's chunks by index, those that have come.
type Slots<T> = Vec<Option<Result<Parsed<T>>>>;

impl<T> Default for Reassembly<T> {
    fn default() -> Self {
        Reassembly {
            next: 0,
            waiting: Default::default(),
        }
    }
}

impl<T> Reassembly<T> {
    fn add(&mut self, chunk: Chunk<T>) {
        let (slots, missing) = self
            .waiting
            .entry(chunk.batch)
            .or_insert_with(|| ((0..chunk.of).map(|_| None).collect(), chunk.of));
        slots[chunk.index] = Some(chunk.parsed);
        *missing -= 1;
    }

    /// The next batch in input order, if all its chunks have come: its
    /// records in order, or the first error among its chunks.
    fn next_whole(&mut self) -> Option<Result<Parsed<T>>> {
        if self.waiting.get(&self.next)?.1 > 0 {
            return None;
        }
        let (slots, _) = self.waiting.remove(&self.next)?;
        self.next += 1;
        // Sized once: growing it by doubling would take fresh pages from
        // the system (zeroed by the kernel) for each of a run's batches.
        let len = slots
            .iter()
            .flatten()
            .map(|p| p.as_ref().map_or(0, Vec::len))
            .sum();
        let mut whole = Vec::with_capacity(len);
        for parsed in slots.into_iter().flatten() {
            match parsed {
                Ok(mut p) => whole.append(&mut p),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(whole))
    }
}

/// Splits a parsed batch into its documents and their results, counting
/// them in `stats`; an invalid record is skipped and counted with
/// `--skip-invalid`, else it ends the run.
fn sort_parsed<T>(
    parsed: Parsed<T>,
    skip_invalid: bool,
    stats: &mut ReadStats,
) -> Result<(Vec<Doc>, Vec<T>)> {
    let mut docs = Vec::with_capacity(parsed.len());
    let mut outs = Vec::with_capacity(parsed.len());
    for item in parsed {
        match item {
            Ok(Some((doc, t))) => {
                stats.count(&doc)?;
                docs.push(doc);
                outs.push(t);
            }
            Ok(None) => {}
            Err(RecordError::Invalid(msg)) if skip_invalid => stats.skip(msg),
            Err(RecordError::Invalid(msg)) => bail!(
                "{msg}; fix the line, or pass --skip-invalid to skip such lines and count them"
            ),
            Err(RecordError::Fatal(e)) => return Err(e),
        }
    }
    Ok((docs, outs))
}

fn progress_bar(total: Option<u64>, quiet: bool) -> Arc<ProgressBar> {
    if quiet || !std::io::stderr().is_terminal() {
        return Arc::new(ProgressBar::hidden());
    }
    let bar = match total {
        Some(t) => ProgressBar::new(t).with_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("valid template"),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bytes} {bytes_per_sec}")
                .expect("valid template"),
        ),
    };
    bar.set_draw_target(ProgressDrawTarget::stderr_with_hz(4));
    bar.enable_steady_tick(Duration::from_millis(250));
    Arc::new(bar)
}

/// A spinner with a message on standard error while `f` runs, when it is a
/// terminal and not `quiet`; cleared afterwards.
pub fn with_spinner<T>(message: &str, quiet: bool, f: impl FnOnce() -> T) -> T {
    if quiet || !std::io::stderr().is_terminal() {
        return f();
    }
    let bar = ProgressBar::new_spinner().with_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
            .expect("valid template"),
    );
    bar.set_message(message.to_owned());
    bar.enable_steady_tick(Duration::from_millis(200));
    let out = f();
    bar.finish_and_clear();
    out
}

/// Flags every long-running command takes.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct RunArgs {
    /// Worker threads (default: all cores).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub threads: usize,

    /// No progress bar and no summary.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Sets the number of worker threads (0: all cores).
pub fn init_threads(threads: usize) -> Result<()> {
    if threads > 0 {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()?;
    }
    Ok(())
}

/// The summary line printed on standard error at the end of a run.
pub fn summary(stats: &ReadStats, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let mut s = format!(
        "{} documents, {:.1} MB in {:.2} s ({:.1} MB/s, {:.0} docs/s)",
        stats.documents,
        stats.bytes as f64 / 1e6,
        secs,
        stats.bytes as f64 / 1e6 / secs,
        stats.documents as f64 / secs
    );
    if stats.empty > 0 {
        s.push_str(&format!("; {} empty", stats.empty));
    }
    if stats.skipped > 0 {
        s.push_str(&format!("; {} invalid lines skipped", stats.skipped));
        for e in &stats.skipped_examples {
            s.push_str(&format!("\n  skipped {e}"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::parse_input_args;
    use neardup_core::record::Id;

    /// A JSON Lines file of `n` documents with ids 0..n, the text of
    /// document `i` being `i` words long up to 50; the lines at `bad` are
    /// not JSON.
    fn corpus(dir: &std::path::Path, n: usize, bad: &[usize]) -> InputArgs {
        corpus_of(dir, n, bad, |i| i % 50)
    }

    /// [`corpus`] with document `i` `words(i)` words long.
    fn corpus_of(
        dir: &std::path::Path,
        n: usize,
        bad: &[usize],
        words: impl Fn(usize) -> usize,
    ) -> InputArgs {
        let mut text = String::new();
        for i in 0..n {
            match bad.contains(&i) {
                true => text.push_str("{not json\n"),
                false => text.push_str(&format!(
                    "{{\"id\": {i}, \"text\": \"{}\"}}\n",
                    "w ".repeat(words(i))
                )),
            }
        }
        let path = dir.join(format!("c{n}-{}.jsonl", bad.len()));
        std::fs::write(&path, text).unwrap();
        parse_input_args([path.to_str().unwrap()])
    }

    /// The first batch's document 7 is slow, so that the next batches
    /// finish before it: the sink still sees every batch in input order,
    /// with each document's own result.
    #[test]
    fn batches_reach_the_sink_in_input_order() {
        let dir = tempfile::tempdir().unwrap();
        let n = 5 * 4096 + 17;
        let args = corpus(dir.path(), n, &[]);
        let mut seen = Vec::new();
        // Two workers besides the thread the pool runs this on.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let stats = pool
            .install(|| {
                for_each_batch(
                    &args,
                    false,
                    true,
                    |doc| {
                        let Id::Int(i) = doc.id else {
                            panic!("integer ids")
                        };
                        if i == 7 {
                            std::thread::sleep(Duration::from_millis(300));
                        }
                        (i, doc.text().len())
                    },
                    |docs, outs| {
                        for (doc, (i, len)) in docs.iter().zip(outs) {
                            assert_eq!(doc.id, Id::Int(i));
                            assert_eq!(doc.text().len(), len);
                            seen.push(i);
                        }
                        Ok(())
                    },
                )
            })
            .unwrap();
        assert_eq!(seen, (0..n as i64).collect::<Vec<_>>());
        assert_eq!(stats.documents, n as u64);
    }

    /// The byte budget: ordinary batches pass without waiting; past it, a
    /// batch waits while as many batches as workers are in flight, goes
    /// once one is released, and a closed budget lets a waiting reader go.
    #[test]
    fn the_budget_holds_back_long_records_beyond_one_a_worker() {
        const MB: u64 = 1 << 20;
        let budget = Budget::new(1);
        for _ in 0..8 {
            assert!(budget.admit(4 * MB), "eight ordinary batches fit");
        }
        let budget = std::sync::Arc::new(Budget::new(2));
        assert!(
            budget.admit(40 * MB) && budget.admit(40 * MB),
            "one a worker"
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = {
            let (budget, tx) = (std::sync::Arc::clone(&budget), tx.clone());
            std::thread::spawn(move || tx.send(budget.admit(MB)).unwrap())
        };
        // Held back however long it is given: two batches are in flight.
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        budget.release();
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(true));
        waiting.join().unwrap();
        let waiting = {
            let budget = std::sync::Arc::clone(&budget);
            std::thread::spawn(move || tx.send(budget.admit(40 * MB)).unwrap())
        };
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        budget.close();
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(false));
        waiting.join().unwrap();
    }

    /// Chunks keep every record in order, none over its limits but by its
    /// last record, and an empty batch is one empty chunk. Some records are
    /// 50 KB, so that chunks end by their bytes as well as by their count.
    #[test]
    fn chunks_cut_a_batch_in_order_within_their_limits() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = neardup_core::rng::SplitMix64(5);
        let sizes: Vec<usize> = (0..3000)
            .map(|_| match rng.next() % 8 {
                0 => 25_000,
                _ => (rng.next() % 300) as usize,
            })
            .collect();
        let args = corpus_of(dir.path(), sizes.len(), &[], |i| sizes[i]);
        let mut reader = DocReader::new(&args).unwrap();
        let (mut batches, mut by_bytes, mut by_count) = (0, 0, 0);
        while let Some(batch) = reader.next_batch().unwrap() {
            batches += 1;
            let want: Vec<String> = batch.iter().map(Record::place).collect();
            let chunks = cut(batch);
            for (i, c) in chunks.iter().enumerate() {
                assert!(!c.is_empty() && c.len() <= CHUNK_RECORDS);
                let bytes: usize = c.iter().map(Record::byte_len).sum();
                let last = c.last().unwrap().byte_len();
                assert!(bytes - last < CHUNK_BYTES, "{bytes} - {last}");
                if i + 1 < chunks.len() {
                    by_bytes += usize::from(bytes >= CHUNK_BYTES);
                    by_count += usize::from(c.len() == CHUNK_RECORDS);
                }
            }
            let got: Vec<String> = chunks.iter().flatten().map(Record::place).collect();
            assert_eq!(got, want);
        }
        assert!(batches > 1 && by_bytes > 0 && by_count > 0);
        let empty = cut(Vec::new());
        assert_eq!(empty.len(), 1);
        assert!(empty[0].is_empty());
    }

    /// Of two malformed lines in different batches, the run stops on the
    /// first, after the sink has had every batch before it; with
    /// --skip-invalid both are counted, in order.
    #[test]
    fn the_first_malformed_line_in_input_order_stops_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let n = 4 * 4096;
        let bad = [4096 + 5, 3 * 4096 + 1];
        let mut args = corpus(dir.path(), n, &bad);
        let mut sunk = 0;
        let err = for_each_batch(
            &args,
            false,
            true,
            |_| (),
            |docs, _| {
                sunk += docs.len();
                Ok(())
            },
        )
        .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains(&format!(":{}", bad[0] + 1)), "{msg}");
        assert!(msg.contains("--skip-invalid"), "{msg}");
        assert_eq!(sunk, 4096);

        args.skip_invalid = true;
        let stats = for_each_batch(&args, false, true, |_| (), |_, _| Ok(())).unwrap();
        assert_eq!(stats.skipped, 2);
        assert_eq!(stats.documents, (n - 2) as u64);
        assert!(stats.skipped_examples[0].contains(&format!(":{}", bad[0] + 1)));
        assert!(stats.skipped_examples[1].contains(&format!(":{}", bad[1] + 1)));
    }

    /// A worker that panics stops the run with an error naming the panic,
    /// while the reader still has batches to give: nothing waits for ever.
    #[test]
    fn a_panicking_worker_stops_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let args = corpus(dir.path(), 10 * 4096, &[]);
        let err = for_each_batch(
            &args,
            false,
            true,
            |doc| assert_ne!(doc.id, Id::Int(5000), "document 5000"),
            |_, _| Ok(()),
        )
        .unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("panicked") && msg.contains("document 5000"),
            "{msg}"
        );
    }

    /// A sink that fails stops the run with its error, while the reader
    /// still has batches to give: nothing waits for ever.
    #[test]
    fn a_failing_sink_stops_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let args = corpus(dir.path(), 10 * 4096, &[]);
        let mut calls = 0;
        let err = for_each_batch(
            &args,
            false,
            true,
            |_| (),
            |_, _| {
                calls += 1;
                match calls {
                    2 => anyhow::bail!("the disk is full"),
                    _ => Ok(()),
                }
            },
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("the disk is full"));
        assert_eq!(calls, 2);
    }
}
