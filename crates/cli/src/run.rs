//! The streaming, parallel, order-preserving document pipeline: a reader thread
//! fills bounded batches; each batch is processed by rayon; results are handed
//! to the sink, on a thread of its own, in input order. Memory is bounded by a
//! few batches.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;

use crate::input::{Doc, DocReader, InputArgs, ReadStats, Record, RecordError};

/// Batches waiting between the reader and the workers.
const QUEUE: usize = 2;

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
    let mut stats = ReadStats::default();
    let result = std::thread::scope(|scope| -> Result<u64> {
        let producer = scope.spawn(move || {
            loop {
                match reader.next_batch() {
                    Ok(Some(batch)) => {
                        if tx.send(Ok(batch)).is_err() {
                            break; // the consumer stopped on an error
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
        // The sink runs on its own thread, a batch behind the workers: what
        // it does serially (writing the spill, freeing the batch) overlaps
        // with the next batch's fingerprints rather than idling the pool.
        let (sink_tx, sink_rx) = crossbeam_channel::bounded::<(Vec<Doc>, Vec<T>)>(1);
        let sinker = scope.spawn(move || -> Result<()> {
            for (docs, outs) in sink_rx {
                sink(docs, outs)?;
            }
            Ok(())
        });
        let mut result = Ok(());
        for batch in rx.iter() {
            let step = batch.and_then(|records| {
                let parsed: Vec<Result<Option<(Doc, T)>, RecordError>> = records
                    .into_par_iter()
                    .map(|r| {
                        r.parse(args, keep_raw).map(|d| {
                            d.map(|doc| {
                                let t = map(&doc);
                                (doc, t)
                            })
                        })
                    })
                    .collect();
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
                        Err(RecordError::Invalid(msg)) if args.skip_invalid => stats.skip(msg),
                        Err(RecordError::Invalid(msg)) => bail!(
                            "{msg}; fix the line, or pass --skip-invalid to skip such lines and count them"
                        ),
                        Err(RecordError::Fatal(e)) => return Err(e),
                    }
                }
                // A send fails only when the sink stopped on an error,
                // which its join below returns in place of this one.
                sink_tx
                    .send((docs, outs))
                    .map_err(|_| anyhow::anyhow!("the sink stopped"))
            });
            if let Err(e) = step {
                result = Err(e);
                break;
            }
        }
        drop(rx);
        drop(sink_tx);
        let sunk = sinker.join().expect("sink thread panicked");
        let bytes = producer.join().expect("reader thread panicked");
        sunk.and(result).map(|()| bytes)
    });
    bar.finish_and_clear();
    stats.bytes = result?;
    Ok(stats)
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
