//! `neardup bench serve`: the service as a user runs it, under load on
//! loopback. A collection of N documents of real text (about 4 KB each, made
//! of runs of sentences of the given corpora) is created with `neardup serve`'s
//! defaults and bulk-loaded through the store; the real `neardup serve`
//! process then opens it (the restart time, every record's checksum
//! checked) and keep-alive HTTP clients in this process drive it for a
//! bounded time: verified `check`s of texts (near copies of stored
//! documents and new ones), `check`s by fingerprint, and durable
//! `insert_if_new` of new texts. The server's resident memory is read from
//! /proc before and after, against an empty collection's.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use neardup_core::centre::Centre;
use neardup_core::rng::SplitMix64;
use neardup_core::sketch::Signature;
use neardup_core::{Input, SimHasher};
use neardup_server::store::{Centring, Signatures, Store, Write as StoreWrite};
use rayon::prelude::*;

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

    /// Client connections for the check phases.
    #[arg(long, default_value_t = 8)]
    pub query_connections: usize,

    /// Client connections for the insert phase (each sends one document per
    /// request; the server commits them in groups).
    #[arg(long, default_value_t = 64)]
    pub insert_connections: usize,

    /// JSON Lines corpora (a "text" field) whose sentences make the
    /// documents (default: the evaluation sample in evalkit/data).
    #[arg(long = "texts", value_name = "FILE")]
    pub texts: Vec<PathBuf>,

    /// Bytes of text per document, about.
    #[arg(long, default_value_t = 4096)]
    pub document_bytes: usize,

    /// Where to build the collections (default: a temporary folder).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Measure the paper's regime instead of the default collection: one
    /// created with `neardup serve --no-verify` (64-bit fingerprints, k = 3,
    /// answers by Hamming distance alone, no sketch stored).
    #[arg(long)]
    pub no_verify: bool,

    /// Keep each collection in --dir, and measure one an earlier run kept
    /// there instead of loading it again (for comparing builds: the inserts
    /// of the earlier runs stay in it).
    #[arg(long, requires = "dir")]
    pub reuse: bool,
}

/// Documents made of real ones: each stored document joins a few source
/// documents of the given corpora ([`Sentences::picks`]), until it has
/// about the asked bytes (a page about a few topics, in one or two
/// languages). A document is its list of sentence numbers, so that a near
/// copy (one sentence in twenty replaced by another) is cheap to make.
struct Sentences {
    pool: Vec<String>,
    /// Each source document's sentences in `pool`.
    sources: Vec<std::ops::Range<usize>>,
    document_bytes: usize,
}

impl Sentences {
    fn read(files: &[PathBuf], document_bytes: usize) -> Result<Sentences> {
        let (mut pool, mut sources) = (Vec::new(), Vec::new());
        for f in files {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read {} (give --texts FILE)", f.display()))?;
            for (n, line) in text.lines().enumerate() {
                let v: serde_json::Value = serde_json::from_str(line)
                    .with_context(|| format!("{}:{}: not a JSON line", f.display(), n + 1))?;
                let Some(t) = v["text"].as_str() else {
                    continue;
                };
                let first = pool.len();
                for s in t.split_inclusive(['.', '。', '\n', '！', '？', '!', '?']) {
                    let s = s.trim();
                    if s.chars().count() >= 8 {
                        pool.push(s.to_owned());
                    }
                }
                if pool.len() > first {
                    sources.push(first..pool.len());
                }
            }
        }
        if sources.len() < 100 {
            bail!(
                "the texts hold {} documents: give corpora with at least 100 (--texts FILE.jsonl)",
                sources.len()
            );
        }
        Ok(Sentences {
            pool,
            sources,
            document_bytes,
        })
    }

    /// Document `seed`'s sentences: runs of 4 to 16 consecutive sentences
    /// of source documents picked at random (a page about a few topics),
    /// until it has the asked bytes. Whole source documents would repeat:
    /// a thousand sources make a million documents of a few hundred
    /// thousand distinct combinations, and a source longer than a page,
    /// picked alone, the same page a thousand times.
    fn picks(&self, seed: u64) -> Vec<usize> {
        let mut r = SplitMix64(seed ^ 0x0b5e_55ed);
        let (mut picks, mut bytes) = (Vec::new(), 0);
        while bytes < self.document_bytes {
            let source = &self.sources[(r.next() % self.sources.len() as u64) as usize];
            let start = source.start + (r.next() % source.len() as u64) as usize;
            let end = (start + 4 + (r.next() % 13) as usize).min(source.end);
            for p in start..end {
                bytes += self.pool[p].len() + 1;
                picks.push(p);
            }
        }
        picks
    }

    fn join(&self, picks: &[usize]) -> String {
        let mut s = String::new();
        for &p in picks {
            s.push_str(&self.pool[p]);
            s.push(' ');
        }
        s
    }

    /// Document number `i`.
    fn document(&self, i: u64) -> String {
        self.join(&self.picks(i))
    }

    /// A near copy of document `i`: one sentence in twenty replaced.
    fn near_copy(&self, i: u64, variant: u64) -> String {
        let mut p = self.picks(i);
        let mut r = SplitMix64(variant ^ i.rotate_left(17));
        for _ in 0..(p.len() / 20).max(1) {
            let at = (r.next() % p.len() as u64) as usize;
            p[at] = (r.next() % self.pool.len() as u64) as usize;
        }
        self.join(&p)
    }
}

/// A JSON string literal.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

pub fn run(args: ServeArgs) -> Result<ExitCode> {
    let texts = if args.texts.is_empty() {
        vec![
            PathBuf::from("evalkit/data/en/corpus.jsonl"),
            PathBuf::from("evalkit/data/zh/corpus.jsonl"),
        ]
    } else {
        args.texts.clone()
    };
    let sentences = Arc::new(Sentences::read(&texts, args.document_bytes)?);
    let tmp = tempfile::tempdir()?;
    let base = args.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "neardup bench serve: {} cores; {} s per phase; loopback only; documents of about {} \
         bytes, each runs of sentences of a few of the {} documents of {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        args.seconds,
        args.document_bytes,
        sentences.sources.len(),
        texts
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    // An empty collection's server: the memory every collection starts from.
    let empty = base.join("collection-empty");
    let _ = std::fs::remove_dir_all(&empty);
    let (mut server, _, _) = Server::start(&empty)?;
    let rss_empty = server.rss()?;
    server.stop()?;
    std::fs::remove_dir_all(&empty).ok();
    writeln!(
        out,
        "an empty collection's server: {:.1} MB resident",
        mb(rss_empty)
    )?;
    for &n in &args.documents {
        let n = n as u64;
        let dir = base.join(format!("collection-{n}"));
        let reused = args.reuse && dir.exists();
        if dir.exists() && !reused {
            std::fs::remove_dir_all(&dir)?;
        }
        let settings = super::serve::default_settings(n as f64, args.no_verify)?;
        let config = settings.config.clone();
        let started = Instant::now();
        let (settings, centre) = plan(settings, &sentences, n)?;
        if !reused {
            load(&dir, &settings, centre.as_ref(), &sentences, n)?;
        }
        writeln!(out, "\n{n} documents; {}", settings.summary())?;
        let load_secs = started.elapsed().as_secs_f64();
        // A kept collection holds the earlier runs' inserts too: the
        // figures per document are per document it holds.
        let stored = if reused {
            let kept = settings.clone();
            Store::open_or_create(&dir, move || Ok(kept))?
                .0
                .document_count()?
        } else {
            n
        };
        let disk = neardup_server::store::folder_bytes(&dir);
        let (mut server, addr, open_secs) = Server::start(&dir)?;
        let rss_open = server.rss()?;
        let loaded = if reused {
            format!("kept by an earlier run, {stored} documents")
        } else {
            format!("bulk load {load_secs:.1} s")
        };
        writeln!(
            out,
            "  {loaded} ({:.0} bytes of store per document); restart: ready in {open_secs:.2} s, \
             every record's checksum checked",
            disk as f64 / stored as f64
        )?;
        let per_doc = |rss: u64| rss.saturating_sub(rss_empty) as f64 / stored as f64;
        writeln!(
            out,
            "  server resident memory {:.1} MB: {:.0} bytes per stored document over the empty \
             collection's",
            mb(rss_open),
            per_doc(rss_open)
        )?;
        let duration = Duration::from_secs_f64(args.seconds);
        // Checks of texts, alternately a near copy of a stored document (a
        // hit when found) and a document not stored (a miss), made before
        // the clock starts.
        let bodies: Vec<(String, bool)> = (0..4096u64)
            .into_par_iter()
            .map(|q| {
                let mut r = SplitMix64(q ^ 0xc4ec);
                let (text, hit) = if q % 2 == 0 {
                    (sentences.near_copy(r.next() % n, q), true)
                } else {
                    (sentences.document(n + (1 << 40) + q), false)
                };
                (text, hit)
            })
            .collect();
        let hasher = SimHasher::new(config)?;
        // The fingerprints the collection stores: centred when it centres.
        let fps: Vec<String> = bodies
            .par_iter()
            .map(|(t, _)| match &centre {
                Some(c) => Ok(c.fingerprint(hasher.shares(t).as_bytes()).to_string()),
                None => hasher
                    .fingerprint_input(Input::Text(t))
                    .map(|f| f.to_string()),
            })
            .collect::<Result<_, neardup_core::Error>>()?;
        let text_bodies: Arc<Vec<(String, bool)>> = Arc::new(
            bodies
                .iter()
                .map(|(t, hit)| {
                    (
                        format!(
                            "{{\"documents\":[{{\"id\":\"q\",\"text\":{}}}],\"mode\":\"check\"}}",
                            quoted(t)
                        ),
                        *hit,
                    )
                })
                .collect(),
        );
        let found = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let (count, lat) = drive(addr, args.query_connections, duration, {
            let (bodies, found) = (Arc::clone(&text_bodies), Arc::clone(&found));
            move |c, i, reply: Option<&[u8]>| {
                let (body, _) = &bodies[((c as u64 * 7919 + i) % bodies.len() as u64) as usize];
                // The reply to this connection's last request: a near copy's
                // when `i - 1` was one.
                let last = (c as u64 * 7919).wrapping_add(i.wrapping_sub(1)) % bodies.len() as u64;
                if let Some(reply) = reply
                    && bodies[last as usize].1
                {
                    found.1.fetch_add(1, Ordering::Relaxed);
                    let found_one = b"\"duplicates\":[{";
                    if reply.windows(found_one.len()).any(|w| w == found_one) {
                        found.0.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Some(("/v1/documents", body.clone()))
            }
        })?;
        let what = if settings.verified() {
            "check (text, verified)"
        } else {
            "check (text, by distance)"
        };
        report(&mut out, what, count, &lat, duration)?;
        let (hits, near) = (
            found.0.load(Ordering::Relaxed),
            found.1.load(Ordering::Relaxed),
        );
        writeln!(
            out,
            "    near copies (one sentence in twenty replaced) found: {hits} of {near}"
        )?;
        let fp_bodies: Arc<Vec<String>> = Arc::new(
            fps.iter()
                .map(|h| {
                    format!("{{\"documents\":[{{\"id\":\"q\",\"simhash\":\"{h}\"}}],\"mode\":\"check\"}}")
                })
                .collect(),
        );
        let (count, lat) = drive(addr, args.query_connections, duration, move |c, i, _| {
            let b = &fp_bodies[((c as u64 * 7919 + i) % fp_bodies.len() as u64) as usize];
            Some(("/v1/documents", b.clone()))
        })?;
        report(&mut out, "check (fingerprint)", count, &lat, duration)?;
        // New documents, made as they are sent (a text each; the clients'
        // work shares the machine with the server's).
        let (count, lat) = drive(addr, args.insert_connections, duration, {
            let sentences = Arc::clone(&sentences);
            move |c, i, _| {
                let doc = (2 << 40) + ((c as u64) << 32) + i;
                Some((
                    "/v1/documents",
                    format!(
                        "{{\"documents\":[{{\"id\":\"new-{c}-{i}\",\"text\":{}}}],\"mode\":\"insert_if_new\"}}",
                        quoted(&sentences.document(doc))
                    ),
                ))
            }
        })?;
        report(
            &mut out,
            "insert_if_new (text, durable)",
            count,
            &lat,
            duration,
        )?;
        let rss_end = server.rss()?;
        writeln!(
            out,
            "  server resident memory after the load {:.1} MB ({:.0} bytes per document); peak {:.1} MB",
            mb(rss_end),
            per_doc(rss_end),
            mb(server.peak()?)
        )?;
        server.stop()?;
        if !args.reuse {
            std::fs::remove_dir_all(&dir).ok();
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// The settings a new collection of `n` documents stores, and its centre: a
/// collection that learns its centre has learned it from its first
/// documents, as the service does.
fn plan(
    mut settings: neardup_server::Settings,
    sentences: &Sentences,
    n: u64,
) -> Result<(neardup_server::Settings, Option<Centre>)> {
    let hasher = SimHasher::new(settings.config.clone())?;
    let centre = match settings.centring {
        Some(Centring::Learning { from }) => {
            let mut centre = Centre::new(settings.config.bits);
            let shares: Vec<_> = (0..from.min(n))
                .map(|i| hasher.shares(&sentences.document(i)))
                .collect();
            for s in &shares {
                centre.add(s.as_bytes());
            }
            // The design planned again from the centred fingerprints, as
            // the service does when it learns its centre.
            let centred: Vec<Vec<u8>> = shares
                .iter()
                .map(|s| {
                    let fp = centre.fingerprint(s.as_bytes());
                    fp.value().to_le_bytes()[..fp.width().bits() as usize / 8].to_vec()
                })
                .collect();
            settings.centring = Some(Centring::learned(&centre));
            settings.design = settings.replanned(centred.iter().map(Vec::as_slice));
            Some(centre)
        }
        Some(Centring::Learned { .. }) => bail!("a new collection has not learned a centre"),
        None => None,
    };
    Ok((settings, centre))
}

/// Fills a new collection in `dir` with `n` documents, by the store (as a
/// long-running service would have them): each text's fingerprint and
/// sketch made as the service makes them, in parallel.
fn load(
    dir: &Path,
    settings: &neardup_server::Settings,
    centre: Option<&Centre>,
    sentences: &Sentences,
    n: u64,
) -> Result<()> {
    let hasher = SimHasher::new(settings.config.clone())?;
    let verified = settings.verified();
    let stored = settings.clone();
    let (store, _) = Store::open_or_create(dir, move || Ok(stored))?;
    // A new collection's signatures are of the words its fingerprints read.
    ensure!(
        store.signatures() == Signatures::CompactOfWords,
        "a new collection keeps signatures of another form"
    );
    const CHUNK: u64 = 100_000;
    let mut done = 0;
    while done < n {
        let m = (n - done).min(CHUNK);
        let docs: Vec<(String, Vec<u8>, Option<Signature>)> = (done..done + m)
            .into_par_iter()
            .map(|i| {
                let text = sentences.document(i);
                // As the service reads a text: once, for the fingerprint
                // and (verified) the signature.
                let (fp, shares, sketch) = if verified {
                    let mut shingles = Vec::new();
                    let (fp, shares) = hasher.fingerprint_shares_and_shingles(&text, &mut shingles);
                    (fp, shares, Some(Signature::of(&shingles)))
                } else {
                    let (fp, shares) = hasher.fingerprint_and_shares(&text);
                    (fp, shares, None)
                };
                let fp = centre.map_or(fp, |c| c.fingerprint(shares.as_bytes()));
                let bytes = fp.width().bits() as usize / 8;
                let le = fp.value().to_le_bytes()[..bytes].to_vec();
                Ok((format!("https://example.com/{i}"), le, sketch))
            })
            .collect::<Result<_, neardup_core::Error>>()?;
        let writes: Vec<StoreWrite<'_>> = docs
            .iter()
            .map(|(id, fp, sketch)| StoreWrite::Put {
                id,
                fingerprint: fp,
                meta: None,
                sketch: sketch.as_ref(),
                shares: None,
                vector: None,
            })
            .collect();
        store.commit(&writes)?;
        done += m;
    }
    Ok(())
}

/// A `neardup serve` process of this executable on a loopback port.
struct Server {
    child: Child,
}

impl Server {
    /// Starts it on `dir` and waits until it serves; returns it, its address
    /// and the seconds it took to open the collection.
    fn start(dir: &Path) -> Result<(Server, SocketAddr, f64)> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["serve", "--data"])
            .arg(dir)
            .args(["--addr", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start neardup serve")?;
        let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
        let mut server = Server { child };
        let mut open_secs = None;
        let addr = loop {
            let Some(line) = lines.next() else {
                server.stop()?;
                bail!("neardup serve stopped before it served");
            };
            let line = line?;
            // "neardup: N documents loaded from D in X s; ..."
            if let Some(rest) = line.split(" in ").nth(1)
                && line.contains("documents loaded from")
            {
                open_secs = rest.split(' ').next().and_then(|x| x.parse().ok());
            }
            if let Some(a) = line.strip_prefix("neardup: listening on http://") {
                break a.parse()?;
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Ok((server, addr, open_secs.unwrap_or(f64::NAN)))
    }

    fn status(&self, field: &str) -> Result<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        s.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .with_context(|| format!("no {field} in /proc/PID/status"))
    }

    /// Resident memory now.
    fn rss(&self) -> Result<u64> {
        self.status("VmRSS:")
    }

    /// Resident memory at its highest.
    fn peak(&self) -> Result<u64> {
        self.status("VmHWM:")
    }

    /// SIGTERM, and wait (bounded) for it to exit.
    fn stop(&mut self) -> Result<()> {
        // SAFETY: kill(2) on the id of the child this process started.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                self.child.kill()?;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
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

/// `connections` keep-alive connections, each sending `make(connection, i)`
/// requests one after another until `duration` has passed. They are driven
/// by one thread polling every socket (as wrk does), so that the clients'
/// own work and context switches take as little as they can of the cores
/// the server shares.
fn drive(
    addr: SocketAddr,
    connections: usize,
    duration: Duration,
    make: impl Fn(usize, u64, Option<&[u8]>) -> Option<(&'static str, String)> + Send + Sync + 'static,
) -> Result<(u64, Vec<Duration>)> {
    let make = Arc::new(make);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let deadline = Instant::now() + duration;
    runtime.block_on(async move {
        let tasks: Vec<_> = (0..connections)
            .map(|c| {
                let make = Arc::clone(&make);
                tokio::spawn(async move { connection(addr, c, deadline, &*make).await })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.context("a client task failed")??);
        }
        Ok((all.len() as u64, all))
    })
}

/// One client connection of [`drive`]: its requests' latencies.
async fn connection(
    addr: SocketAddr,
    c: usize,
    deadline: Instant,
    make: &(impl Fn(usize, u64, Option<&[u8]>) -> Option<(&'static str, String)> + ?Sized),
) -> Result<Vec<Duration>> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (read, mut writer) = stream.into_split();
    let mut reader = tokio::io::BufReader::new(read);
    let mut lat = Vec::new();
    let mut i = 0u64;
    let mut line = String::new();
    let mut request = Vec::new();
    let mut body = Vec::new();
    let mut reply: Option<Vec<u8>> = None;
    while Instant::now() < deadline {
        // `make` sees the reply to the request it made last.
        let Some((path, payload)) = make(c, i, reply.as_deref()) else {
            bail!(
                "a reply was not what the bench expects: {}",
                String::from_utf8_lossy(reply.as_deref().unwrap_or_default())
            );
        };
        i += 1;
        request.clear();
        write!(
            request,
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
            payload.len()
        )?;
        let t = Instant::now();
        writer.write_all(&request).await?;
        let mut length = 0usize;
        line.clear();
        reader.read_line(&mut line).await?;
        let status = line.split_whitespace().nth(1).unwrap_or("").to_owned();
        loop {
            line.clear();
            reader.read_line(&mut line).await?;
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
        reader.read_exact(&mut body).await?;
        if status != "200" {
            bail!("status {status}: {}", String::from_utf8_lossy(&body));
        }
        lat.push(t.elapsed());
        reply = Some(std::mem::take(&mut body));
    }
    Ok(lat)
}
