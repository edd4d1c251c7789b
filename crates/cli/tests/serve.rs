//! The real `neardup serve` binary: killed with SIGKILL at random moments while
//! several clients write, restarted, and checked: every acknowledged document
//! is there and searchable, and no batch is half there. Then a graceful stop.
//! Loopback only; every loop is bounded.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod util;

/// One request's documents: (id, hex fingerprint).
type Batch = Vec<(String, String)>;

/// Starts the server on a free loopback port; returns it and its address.
fn start(dir: &std::path::Path) -> (Child, SocketAddr) {
    start_with(dir, &[])
}

/// [`start`] with more flags.
fn start_with(dir: &std::path::Path, extra: &[&str]) -> (Child, SocketAddr) {
    let mut child = util::bin()
        .args([
            "serve",
            "--data",
            dir.to_str().unwrap(),
            "--addr",
            "127.0.0.1:0",
        ])
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    let addr = loop {
        assert!(Instant::now() < deadline, "the server did not start");
        let line = lines.next().expect("server output").unwrap();
        if let Some(a) = line.strip_prefix("neardup: listening on http://") {
            break a.parse().unwrap();
        }
    };
    // Keep draining stderr so that the server never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    (child, addr)
}

/// One HTTP/1.1 request; `None` if the connection fails (the server is gone).
fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> Option<(u16, Value)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).ok()?;
    let text = String::from_utf8_lossy(&resp);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    // Acknowledged documents (id -> hex), and every batch sent (acked or not).
    let acked: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let batches: Arc<Mutex<Vec<Batch>>> = Arc::default();
    let mut seed = 0x5eed_u64;
    for round in 0..4 {
        let (mut server, addr) = start(dir.path());
        // Everything acknowledged before is there, and no batch is half there.
        verify(addr, &acked.lock().unwrap(), &batches.lock().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..4)
            .map(|c| {
                let (stop, acked, batches) = (stop.clone(), acked.clone(), batches.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    // Bounded: at most 10,000 batches per client per round.
                    while !stop.load(Ordering::Relaxed) && n < 10_000 {
                        let docs: Vec<(String, String)> = (0..5)
                            .map(|j| {
                                let id = format!("r{round}-c{c}-b{n}-{j}");
                                let fp = (n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((c as u64) << 56) ^ (j << 48) ^ round)
                                    .wrapping_mul(0xff51_afd7_ed55_8ccd);
                                // 128 bits, as the default collection holds.
                                (id, format!("{fp:016x}{:016x}", fp.rotate_left(29) ^ 0x5a5a))
                            })
                            .collect();
                        n += 1;
                        batches.lock().unwrap().push(docs.clone());
                        let body = json!({"documents": docs.iter().map(|(id, h)| json!({"id": id, "simhash": h})).collect::<Vec<_>>(), "mode": "insert"});
                        match http(addr, "POST", "/v1/documents", Some(&body)) {
                            Some((200, _)) => acked.lock().unwrap().extend(docs),
                            Some((status, b)) => panic!("write refused: {status} {b}"),
                            None => break,
                        }
                    }
                })
            })
            .collect();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(300 + seed % 700));
        server.kill().unwrap(); // SIGKILL
        server.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.join().unwrap();
        }
    }
    let (mut server, addr) = start(dir.path());
    let acked = acked.lock().unwrap();
    assert!(
        acked.len() > 100,
        "the clients wrote too little: {}",
        acked.len()
    );
    eprintln!(
        "crash test: {} acknowledged documents over 4 SIGKILLs, all recovered",
        acked.len()
    );
    verify(addr, &acked, &batches.lock().unwrap());
    // Graceful stop: SIGTERM, exit status 0.
    let status = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = server.try_wait().unwrap() {
            assert!(s.success(), "{s:?}");
            break;
        }
        assert!(Instant::now() < deadline, "no graceful stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn verify(addr: SocketAddr, acked: &HashMap<String, String>, batches: &[Batch]) {
    let (_, stats) = http(addr, "GET", "/v1/stats", None).unwrap();
    let stored = stats["documents"].as_u64().unwrap() as usize;
    assert!(
        stored >= acked.len(),
        "{stored} stored, {} acknowledged",
        acked.len()
    );
    for (id, hex) in acked {
        let (status, b) = http(addr, "GET", &format!("/v1/documents/{id}"), None).unwrap();
        assert_eq!(status, 200, "acknowledged {id} lost: {b}");
        assert_eq!(b["simhash"], *hex);
    }
    // Searchable, not just stored.
    for (id, hex) in acked.iter().take(50) {
        let (_, b) = http(
            addr,
            "POST",
            "/v1/query",
            Some(&json!({"simhash": hex, "k": 0})),
        )
        .unwrap();
        assert!(
            b["matches"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["id"] == *id),
            "{id} not found by its fingerprint"
        );
    }
    // Each batch is all there or not at all (one transaction).
    let mut present_total = 0;
    for batch in batches {
        let present = batch
            .iter()
            .filter(|(id, _)| {
                acked.contains_key(id)
                    || http(addr, "GET", &format!("/v1/documents/{id}"), None)
                        .unwrap()
                        .0
                        == 200
            })
            .count();
        assert!(
            present == 0 || present == batch.len(),
            "a batch is half there: {batch:?}"
        );
        present_total += present;
    }
    assert_eq!(
        present_total, stored,
        "stored documents that no batch wrote"
    );
}

/// Idle and half-sent connections are closed after the header timeout; a
/// half-sent body gets 408 after the body timeout; SIGTERM with a half-sent
/// request open exits within the shutdown deadline.
#[test]
fn slow_clients_are_timed_out_and_sigterm_completes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, addr) = start_with(
        dir.path(),
        &[
            "--header-timeout",
            "1",
            "--body-timeout",
            "1",
            "--shutdown-deadline",
            "2",
        ],
    );
    let closed_within = |mut s: TcpStream, secs: u64| {
        s.set_read_timeout(Some(Duration::from_secs(secs))).unwrap();
        let mut buf = Vec::new();
        // A close reads as end of stream (after any answer); a timeout is an error.
        s.read_to_end(&mut buf)
            .map(|_| String::from_utf8_lossy(&buf).into_owned())
    };
    let idle = TcpStream::connect(addr).unwrap();
    let mut half_head = TcpStream::connect(addr).unwrap();
    half_head
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut half_body = TcpStream::connect(addr).unwrap();
    half_body
        .write_all(b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"simhash\":")
        .unwrap();
    let started = Instant::now();
    assert!(
        closed_within(idle, 10).is_ok(),
        "an idle connection stays open"
    );
    assert!(
        closed_within(half_head, 10).is_ok(),
        "a half-sent header stays open"
    );
    let answer = closed_within(half_body, 10).expect("a half-sent body stays open");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(8));
    // The service still answers.
    assert_eq!(http(addr, "GET", "/healthz", None).map(|r| r.0), Some(200));
    let sigterm = |server: &mut Child| {
        // SAFETY: signals the child this test started, by its id.
        unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = server.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "SIGTERM did not complete");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert!(sigterm(&mut server).success());
    // SIGTERM while a client holds a half-sent request (timeouts far off).
    let (mut server, addr) = start_with(
        dir.path(),
        &[
            "--header-timeout",
            "60",
            "--body-timeout",
            "60",
            "--shutdown-deadline",
            "2",
        ],
    );
    let mut held = TcpStream::connect(addr).unwrap();
    held.write_all(b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{")
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let term = Instant::now();
    let status = sigterm(&mut server);
    assert!(status.success(), "{status:?}");
    assert!(
        term.elapsed() < Duration::from_secs(6),
        "{:?}",
        term.elapsed()
    );
    drop(held);
}

/// An address already in use fails the start with the address named, before
/// any collection is created in the data folder.
#[test]
fn an_address_in_use_creates_no_collection() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("collection");
    let mut child = util::bin()
        .args(["serve", "--data", data.to_str().unwrap(), "--addr", &addr])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("neardup serve kept running on an address in use");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains(&addr) && err.contains("--addr"), "{err}");
    assert!(!data.exists(), "the collection was created: {err}");
}

/// `serve` on an existing collection with a pipeline flag that differs from
/// its creation settings exits with an error, whichever flag it is; the same
/// flags as at creation start it.
#[test]
fn restarting_with_other_pipeline_flags_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, addr) = start_with(dir.path(), &["--hash", "fnv1a"]);
    let doc = json!({"documents": [{"id": "a", "text": "the harbour master opened the gates"}]});
    let (status, _) = http(addr, "POST", "/v1/documents", Some(&doc)).expect("the server answers");
    assert!((200..300).contains(&status), "{status}");
    server.kill().unwrap();
    server.wait().unwrap();
    // Runs `serve` with `flags` until it exits or starts listening (then it
    // is stopped): its stderr, and whether it started.
    let run = |flags: &[&str]| -> (String, bool) {
        let mut child = util::bin()
            .args([
                "serve",
                "--data",
                dir.path().to_str().unwrap(),
                "--addr",
                "127.0.0.1:0",
            ])
            .args(flags)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut err = String::new();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut started = false;
        for line in lines.by_ref().take(50) {
            let line = line.unwrap();
            started |= line.starts_with("neardup: listening on");
            err.push_str(&line);
            err.push('\n');
            if started {
                break;
            }
        }
        child.kill().ok();
        child.wait().unwrap();
        (err, started)
    };
    for flags in [
        &["--hash", "md5"][..],
        &["--seed", "7"],
        &["--stopwords"],
        &["--html"],
        &["--top", "50"],
        &["--bits", "128"],
    ] {
        let (err, started) = run(flags);
        assert!(!started, "{flags:?} was accepted");
        assert!(
            err.contains("created with other settings"),
            "{flags:?}: {err}"
        );
    }
    let (err, started) = run(&["--hash", "fnv1a"]);
    assert!(started, "{err}");
}

/// Word 3-shingles of a text of lowercase ASCII words, as a set: computed
/// here, independently of the library.
fn word_shingles(text: &str) -> std::collections::HashSet<String> {
    let words: Vec<&str> = text.split(' ').collect();
    words.windows(3).map(|w| w.join(" ")).collect()
}

fn jaccard(a: &str, b: &str) -> f64 {
    let (a, b) = (word_shingles(a), word_shingles(b));
    a.intersection(&b).count() as f64 / a.union(&b).count() as f64
}

/// A collection created with no flags verifies, as `neardup dedup` does: a
/// copy at Jaccard 0.85 whose fingerprint is more than 3 bits away (beyond
/// the paper's Hamming-only reach) is found, with its exact similarity; one at
/// Jaccard 0.6 is not. Stats and health say so.
#[test]
fn the_default_collection_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, addr) = start(dir.path());
    let mut x = 0x9e37_79b9_u64;
    let mut word = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        format!("w{}", x % 5000)
    };
    let base: Vec<String> = (0..400).map(|_| word()).collect();
    // Every `step`-th word replaced by a fresh one.
    let mut edited = |step: usize| -> String {
        let mut w = base.clone();
        for i in (step / 2..w.len()).step_by(step) {
            w[i] = format!("{}x", word());
        }
        w.join(" ")
    };
    let (near, far) = (edited(37), edited(11));
    let original = base.join(" ");
    let (j_near, j_far) = (jaccard(&original, &near), jaccard(&original, &far));
    assert!((0.82..0.88).contains(&j_near), "near copy at {j_near}");
    assert!((0.55..0.65).contains(&j_far), "far copy at {j_far}");

    let body = json!({"documents": [{"id": "original", "text": original}], "mode": "insert"});
    assert_eq!(
        http(addr, "POST", "/v1/documents", Some(&body)).unwrap().0,
        200
    );
    let check = |text: &str| {
        let body = json!({"documents": [{"id": "q", "text": text}], "mode": "check"});
        let (status, b) = http(addr, "POST", "/v1/documents", Some(&body)).unwrap();
        assert_eq!(status, 200, "{b}");
        b["results"][0]["duplicates"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let found = check(&near);
    assert_eq!(
        found.len(),
        1,
        "the near copy at Jaccard {j_near} is not found: {found:?}"
    );
    assert_eq!(found[0]["id"], "original");
    let distance = found[0]["distance"].as_u64().unwrap();
    assert!(
        distance > 3,
        "the pair is within the paper's k = 3 ({distance}): no test of verification"
    );
    let similarity = found[0]["similarity"].as_f64().unwrap();
    assert!(
        (similarity - j_near).abs() < 0.001,
        "similarity {similarity}, Jaccard {j_near}"
    );
    assert_eq!(
        check(&far),
        Vec::<Value>::new(),
        "the copy at Jaccard {j_far} is kept"
    );
    // The answer is verification's: asked for more similarity than the near
    // copy has, the same candidate is dropped.
    let body = json!({"text": near, "verify": {"jaccard": 0.95}});
    let (_, b) = http(addr, "POST", "/v1/query", Some(&body)).unwrap();
    assert_eq!(b["matches"].as_array().map(Vec::len), Some(0), "{b}");

    let (_, stats) = http(addr, "GET", "/v1/stats", None).unwrap();
    assert_eq!(
        stats["verification"],
        json!({"mode": "verified", "jaccard": 0.8})
    );
    assert_eq!(stats["design"]["kind"], "blocks");
    assert_eq!(stats["design"]["bits"], 128);
    let (_, health) = http(addr, "GET", "/healthz", None).unwrap();
    assert_eq!(health["verification"]["mode"], "verified");
    server.kill().unwrap();
    server.wait().unwrap();
}

/// The service answers as `neardup dedup` does, option set by option set:
/// the evaluation sample (real English and Chinese text with planted near
/// copies) sent in order with `insert_if_new` stores exactly the documents
/// `neardup dedup --policy incremental` keeps with the same settings (the
/// service's fingerprints are not centred: `--no-centre`), defaults given
/// and not given, a learned IDF table included (copied into the collection,
/// checked when it reopens).
#[test]
fn the_service_keeps_what_dedup_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines: Vec<String> = Vec::new();
    for (lang, n) in [("en", 240), ("zh", 120)] {
        let text = std::fs::read_to_string(util::repo_file(&format!(
            "evalkit/data/{lang}/corpus.jsonl"
        )))
        .unwrap();
        lines.extend(text.lines().take(n).map(str::to_owned));
    }
    let corpus = util::write(
        dir.path(),
        "corpus.jsonl",
        (lines.join("\n") + "\n").as_bytes(),
    );
    let docs: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let idf = dir.path().join("t.idf");
    util::ok(util::run(&[
        "idf",
        "build",
        corpus.to_str().unwrap(),
        "--features",
        "tokens",
        "--tokenizer",
        "words",
        "--min-df",
        "1",
        "-o",
        idf.to_str().unwrap(),
        "-q",
    ]));
    let idf = idf.to_str().unwrap();
    // (serve's flags, dedup's flags for the same settings)
    // The default collection fingerprints plainly, within the plain k of 15,
    // until it has learned its centre (after 1,000 documents; this corpus
    // has fewer): it keeps what dedup keeps without centring.
    let sets: &[(&[&str], &[&str])] = &[
        (&[], &["--no-centre"]),
        (&["--no-centre"], &["--no-centre"]),
        (
            &["--verify", "jaccard:0.8", "--max-k", "15", "--bits", "128"],
            &["--no-centre", "--k", "15", "--verify", "jaccard:0.8"],
        ),
        (
            &["--verify", "jaccard:0.9"],
            &["--no-centre", "--verify", "jaccard:0.9"],
        ),
        (
            &["--bits", "64", "--max-k", "7"],
            &["--no-centre", "--bits", "64", "--k", "7"],
        ),
        (
            &["--features", "tokens", "--idf", idf],
            &["--no-centre", "--features", "tokens", "--idf", idf],
        ),
        (&["--no-verify"], &["--no-verify"]),
        (
            &["--no-verify", "--max-k", "3", "--bits", "64"],
            &["--no-verify", "--k", "3", "--bits", "64"],
        ),
    ];
    for (i, (serve_flags, dedup_flags)) in sets.iter().enumerate() {
        let keep = dir.path().join(format!("keep-{i}.jsonl"));
        let mut args = vec![
            "dedup",
            corpus.to_str().unwrap(),
            "--policy",
            "incremental",
            "--keep",
            keep.to_str().unwrap(),
            "-q",
        ];
        args.extend_from_slice(dedup_flags);
        util::ok(util::run(&args));
        let want: Vec<String> = std::fs::read_to_string(&keep)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert!(
            want.len() < docs.len() && want.len() > docs.len() / 2,
            "{serve_flags:?}: {} kept",
            want.len()
        );

        let data = dir.path().join(format!("collection-{i}"));
        let (mut server, addr) = start_with(&data, serve_flags);
        let mut got = Vec::new();
        for chunk in docs.chunks(50) {
            let body = json!({"documents": chunk.iter().map(|d| json!({"id": d["id"], "text": d["text"]})).collect::<Vec<_>>(), "mode": "insert_if_new"});
            let (status, b) = http(addr, "POST", "/v1/documents", Some(&body)).unwrap();
            assert_eq!(status, 200, "{b}");
            for r in b["results"].as_array().unwrap() {
                if r["stored"] == true {
                    got.push(r["id"].as_str().unwrap().to_owned());
                }
            }
        }
        assert_eq!(got, want, "{serve_flags:?}");
        server.kill().unwrap();
        server.wait().unwrap();
        if serve_flags.contains(&"--idf") {
            // The collection holds its table: it reopens without the flag,
            // and refuses a damaged copy.
            assert!(data.join("idf.tsv").exists());
            let (mut again, addr) = start_with(&data, &[]);
            let (_, b) = http(addr, "GET", "/v1/stats", None).unwrap();
            assert_eq!(b["documents"].as_u64(), Some(want.len() as u64), "{b}");
            again.kill().unwrap();
            again.wait().unwrap();
            let table = std::fs::read_to_string(data.join("idf.tsv")).unwrap();
            let damaged = table.replacen('1', "2", 1);
            assert_ne!(damaged, table);
            std::fs::write(data.join("idf.tsv"), damaged).unwrap();
            let o = util::bin()
                .args([
                    "serve",
                    "--data",
                    data.to_str().unwrap(),
                    "--addr",
                    "127.0.0.1:0",
                ])
                .output()
                .unwrap();
            assert!(!o.status.success());
            assert!(
                util::stderr(&o).contains("IDF table is missing or damaged"),
                "{}",
                util::stderr(&o)
            );
        }
    }
}
