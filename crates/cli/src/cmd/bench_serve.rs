//! `neardup bench serve`: the service under load on loopback. A collection of
//! N documents is bulk-loaded, reopened (the restart time), served in-process,
//! and driven by keep-alive HTTP clients for a bounded time: fingerprint
//! `check` queries, then durable `insert_if_new` of texts.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use neardup_core::FingerprintConfig;
use neardup_core::index::plan;
use neardup_core::rng::SplitMix64;
use neardup_server::store::{Store, Write as StoreWrite};
use neardup_server::{App, Options, Settings};

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  neardup bench serve                          # 1 million, then 10 million documents
  neardup bench serve --documents 1e6 --seconds 5")]
pub struct ServeArgs {
    /// Collection sizes to measure (repeatable).
    #[arg(long = "documents", value_name = "N", default_values_t = [1e6, 1e7])]
    pub documents: Vec<f64>,

    /// Seconds of load per phase (bounded).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,

    /// Client connections for the query phase.
    #[arg(long, default_value_t = 8)]
    pub query_connections: usize,

    /// Client connections for the insert phase (each sends one document per
    /// request; the server commits them in groups).
    #[arg(long, default_value_t = 64)]
    pub insert_connections: usize,

    /// Where to build the collections (default: a temporary folder).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<std::path::PathBuf>,
}

const WORDS: &[&str] = &[
    "harbour",
    "master",
    "gates",
    "dawn",
    "boats",
    "sea",
    "morning",
    "grey",
    "crawler",
    "page",
    "index",
    "table",
    "fingerprint",
    "query",
    "network",
    "storage",
    "engine",
    "commit",
    "disk",
    "memory",
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "with",
    "as",
    "by",
    "river",
    "bridge",
    "market",
    "city",
    "train",
    "station",
    "letter",
    "window",
    "garden",
];

fn text(rng: &mut SplitMix64, words: usize) -> String {
    let mut s = String::with_capacity(words * 7);
    for i in 0..words {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[(rng.next() % WORDS.len() as u64) as usize]);
        if rng.next().is_multiple_of(5) {
            s.push_str(&(rng.next() % 1000).to_string());
        }
    }
    s
}

pub fn run(args: ServeArgs) -> Result<ExitCode> {
    let tmp = tempfile::tempdir()?;
    let base = args.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "neardup bench serve: {} cores; {} s per phase; loopback only",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        args.seconds
    )?;
    let (bare, sketched) = (store_bytes(&base, false)?, store_bytes(&base, true)?);
    writeln!(
        out,
        "store: {bare:.0} bytes per document stored by fingerprint, {sketched:.0} stored by text \
         (with its {}-byte verification sketch); {STORE_SAMPLE} documents each",
        neardup_core::sketch::BINS
    )?;
    for &n in &args.documents {
        let n = n as u64;
        let dir = base.join(format!("collection-{n}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        let config = FingerprintConfig::default();
        let p = plan(64, 3, n.max(1) as f64, None)?;
        let settings = Settings {
            config,
            max_k: 3,
            design: neardup_core::index::OnlineDesign::Tables(p.options[p.chosen].design.clone()),
            version: neardup_server::store::STORE_VERSION,
            verify: None,
        };
        // Bulk load through the store, as a long-running service would have.
        let started = Instant::now();
        let mut rng = SplitMix64(n);
        let mut sample: Vec<u64> = Vec::new();
        {
            let s2 = settings.clone();
            let (store, _) = Store::open_or_create(&dir, move || Ok(s2))?;
            let mut done = 0u64;
            while done < n {
                let m = (n - done).min(200_000);
                let docs: Vec<(String, [u8; 8])> = (0..m)
                    .map(|i| {
                        let fp = rng.next();
                        if (done + i).is_multiple_of((n / 1000).max(1)) {
                            sample.push(fp);
                        }
                        (
                            format!("https://example.com/{}", done + i),
                            fp.to_le_bytes(),
                        )
                    })
                    .collect();
                let writes: Vec<StoreWrite<'_>> = docs
                    .iter()
                    .map(|(id, fp)| StoreWrite::Put {
                        id,
                        fingerprint: fp,
                        meta: None,
                        sketch: None,
                    })
                    .collect();
                store.commit(&writes)?;
                done += m;
            }
        }
        let load_secs = started.elapsed().as_secs_f64();
        let app = App::open(&dir, already_created, Options::default())?;
        writeln!(
            out,
            "\n{n} documents: bulk load {load_secs:.1} s; restart ready to serve in {:.2} s (read the store {:.2} s, build the index {:.2} s)",
            app.open_seconds, app.read_seconds, app.build_seconds
        )?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let server = std::thread::spawn(move || {
            runtime.block_on(neardup_server::serve(
                app,
                listener,
                neardup_server::Limits::default(),
                async {
                    let _ = stop_rx.await;
                },
                move |a| {
                    let _ = addr_tx.send(a);
                },
            ))
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(60))
            .context("the server did not start")?;
        let duration = Duration::from_secs_f64(args.seconds);
        // Queries: near copies of stored fingerprints (a hit each) and random
        // ones (misses), alternately.
        let sample = Arc::new(sample);
        let (count, lat) = drive(addr, args.query_connections, duration, {
            let sample = Arc::clone(&sample);
            move |c, i| {
                let mut r = SplitMix64(((c as u64) << 40) ^ i);
                let fp = if i % 2 == 0 {
                    sample[(r.next() % sample.len() as u64) as usize] ^ (1 << (r.next() % 64))
                } else {
                    r.next()
                };
                (
                    "/v1/documents",
                    format!(
                        "{{\"documents\":[{{\"id\":\"q\",\"simhash\":\"{fp:016x}\"}}],\"mode\":\"check\"}}"
                    ),
                )
            }
        })?;
        report(&mut out, "check (fingerprint)", count, &lat, duration)?;
        let (count, lat) = drive(addr, args.insert_connections, duration, move |c, i| {
            let mut r = SplitMix64(((c as u64) << 40) ^ i ^ 0xabcdef);
            let body = format!(
                "{{\"documents\":[{{\"id\":\"new-{c}-{i}\",\"text\":\"{}\"}}],\"mode\":\"insert_if_new\"}}",
                text(&mut r, 60)
            );
            ("/v1/documents", body)
        })?;
        report(
            &mut out,
            "insert_if_new (text, durable)",
            count,
            &lat,
            duration,
        )?;
        // The same with verification: candidates' sketches read and compared.
        let (count, lat) = drive(addr, args.insert_connections, duration, move |c, i| {
            let mut r = SplitMix64(((c as u64) << 40) ^ i ^ 0x5eed);
            let body = format!(
                "{{\"documents\":[{{\"id\":\"v-{c}-{i}\",\"text\":\"{}\"}}],\"mode\":\"insert_if_new\",\"verify\":{{\"jaccard\":0.8}}}}",
                text(&mut r, 60)
            );
            ("/v1/documents", body)
        })?;
        report(
            &mut out,
            "insert_if_new (text, verified)",
            count,
            &lat,
            duration,
        )?;
        let _ = stop_tx.send(());
        server
            .join()
            .map_err(|_| anyhow::anyhow!("the server thread failed"))??;
        std::fs::remove_dir_all(&dir).ok();
    }
    Ok(ExitCode::SUCCESS)
}

/// Documents of the store size measurement.
const STORE_SAMPLE: u64 = 100_000;

/// Bytes of store file per document, for [`STORE_SAMPLE`] documents with ids
/// like the bench's, stored by fingerprint or with a text's sketch too.
fn store_bytes(base: &std::path::Path, sketches: bool) -> Result<f64> {
    let dir = base.join(format!("store-size-{sketches}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    let p = plan(64, 3, STORE_SAMPLE as f64, None)?;
    let settings = Settings {
        config: FingerprintConfig::default(),
        max_k: 3,
        design: neardup_core::index::OnlineDesign::Tables(p.options[p.chosen].design.clone()),
        version: neardup_server::store::STORE_VERSION,
        verify: None,
    };
    let normalize = settings.config.normalize;
    {
        let (store, _) = Store::open_or_create(&dir, move || Ok(settings))?;
        let mut rng = SplitMix64(7);
        let mut done = 0;
        while done < STORE_SAMPLE {
            let m = (STORE_SAMPLE - done).min(20_000);
            let docs: Vec<(String, [u8; 8], Option<neardup_core::sketch::Sketch>)> = (done..done
                + m)
                .map(|i| {
                    let sketch = sketches.then(|| {
                        let t = text(&mut rng, 60);
                        neardup_core::sketch::Sketch::of(&neardup_core::jaccard::shingles_for(
                            &t, &normalize,
                        ))
                    });
                    (
                        format!("https://example.com/{i}"),
                        rng.next().to_le_bytes(),
                        sketch,
                    )
                })
                .collect();
            let writes: Vec<StoreWrite<'_>> = docs
                .iter()
                .map(|(id, fp, sketch)| StoreWrite::Put {
                    id,
                    fingerprint: fp,
                    meta: None,
                    sketch: sketch.as_ref(),
                })
                .collect();
            store.commit(&writes)?;
            done += m;
        }
    }
    let bytes = std::fs::metadata(dir.join(neardup_server::store::DB_FILE))?.len();
    std::fs::remove_dir_all(&dir).ok();
    Ok(bytes as f64 / STORE_SAMPLE as f64)
}

fn already_created() -> Result<Settings, neardup_server::ServiceError> {
    Err(neardup_server::ServiceError::Config(
        "the collection was just created".into(),
    ))
}

fn report(
    out: &mut impl Write,
    what: &str,
    count: u64,
    lat: &[Duration],
    duration: Duration,
) -> Result<()> {
    let mut l: Vec<f64> = lat.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    l.sort_by(f64::total_cmp);
    let q = |p: f64| {
        l.get(((l.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    writeln!(
        out,
        "  {what:<32} {:>9.0} requests/s   p50 {:.3} ms   p99 {:.3} ms   ({count} requests)",
        count as f64 / duration.as_secs_f64(),
        q(0.5),
        q(0.99)
    )?;
    Ok(())
}

/// `connections` threads, each with one keep-alive connection, sending
/// `make(connection, i)` requests until `duration` has passed.
fn drive(
    addr: SocketAddr,
    connections: usize,
    duration: Duration,
    make: impl Fn(usize, u64) -> (&'static str, String) + Send + Sync + 'static,
) -> Result<(u64, Vec<Duration>)> {
    let make = Arc::new(make);
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..connections)
        .map(|c| {
            let (make, stop) = (Arc::clone(&make), Arc::clone(&stop));
            std::thread::spawn(move || -> Result<Vec<Duration>> {
                let stream = TcpStream::connect(addr)?;
                stream.set_nodelay(true)?;
                let mut reader = BufReader::new(stream.try_clone()?);
                let mut writer = stream;
                let mut lat = Vec::new();
                let mut i = 0u64;
                let mut line = String::new();
                let mut body = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let (path, payload) = make(c, i);
                    i += 1;
                    let t = Instant::now();
                    write!(
                        writer,
                        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
                        payload.len()
                    )?;
                    let mut length = 0usize;
                    line.clear();
                    reader.read_line(&mut line)?;
                    let status = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                    loop {
                        line.clear();
                        reader.read_line(&mut line)?;
                        let l = line.trim_end();
                        if l.is_empty() {
                            break;
                        }
                        if let Some(v) = l
                            .to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_owned())
                        {
                            length = v.parse()?;
                        }
                    }
                    body.resize(length, 0);
                    reader.read_exact(&mut body)?;
                    if status != "200" {
                        bail!("status {status}: {}", String::from_utf8_lossy(&body));
                    }
                    lat.push(t.elapsed());
                }
                Ok(lat)
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for h in handles {
        all.extend(
            h.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))??,
        );
    }
    Ok((all.len() as u64, all))
}
