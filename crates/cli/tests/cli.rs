//! Integration tests: the real `neardup` binary, good and bad input.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

mod util;
use util::*;

fn fp(v: &Value) -> u64 {
    u64::from_str_radix(v["simhash"].as_str().unwrap(), 16).unwrap()
}

#[test]
fn fingerprints_the_sample_in_order_with_ids() {
    let o = ok(run(&["fingerprint", sample().to_str().unwrap(), "-q"]));
    let rows = json_lines(&stdout(&o));
    let input = std::fs::read_to_string(sample()).unwrap();
    let ids: Vec<Value> = json_lines(&input).iter().map(|v| v["id"].clone()).collect();
    assert_eq!(
        rows.iter().map(|r| r["id"].clone()).collect::<Vec<_>>(),
        ids
    );
    for r in &rows {
        assert_eq!(r["simhash"].as_str().unwrap().len(), 16);
        assert_eq!(r.as_object().unwrap().len(), 2, "only id and simhash: {r}");
    }
    let by_id = |id: &str| rows.iter().find(|r| r["id"] == id).map(fp).unwrap();
    // A planted near-duplicate is much closer than an unrelated document.
    let near = (by_id("harbour") ^ by_id("harbour-copy")).count_ones();
    let far = (by_id("harbour") ^ by_id("bread")).count_ones();
    assert!(near < far, "near {near}, far {far}");
    let zh_near = (by_id("zh-tea") ^ by_id("zh-tea-wrapped")).count_ones();
    assert_eq!(
        zh_near, 0,
        "re-wrapped Chinese must fingerprint like the original"
    );
}

#[test]
fn same_output_whatever_the_thread_count() {
    let a = run(&[
        "fingerprint",
        sample().to_str().unwrap(),
        "-q",
        "--threads",
        "1",
    ]);
    let b = run(&[
        "fingerprint",
        sample().to_str().unwrap(),
        "-q",
        "--threads",
        "2",
    ]);
    assert!(a.status.success() && b.status.success());
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn tsv_lines_stdin_and_128_bits() {
    let o = ok(run_stdin(
        &["fingerprint", "--lines", "--tsv", "--bits", "128", "-q"],
        b"first doc\nsecond doc\n\nfourth\n",
    ));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4);
    for (i, l) in lines.iter().enumerate() {
        let (id, hex) = l.split_once('\t').unwrap();
        assert_eq!(id, (i + 1).to_string());
        assert_eq!(hex.len(), 32);
    }
    // The empty third line has the all-zero fingerprint.
    assert_eq!(lines[2], format!("3\t{}", "0".repeat(32)));
}

#[test]
fn stdin_text_and_json_lines_are_recognised() {
    let text = run_stdin(&["fingerprint", "-q"], b"just some text\non two lines\n");
    assert_eq!(json_lines(&stdout(&text)).len(), 1);
    let jsonl = run_stdin(
        &["fingerprint", "-q"],
        b"{\"text\": \"a b c\"}\n{\"text\": \"d e f\", \"id\": 9}\n",
    );
    let rows = json_lines(&stdout(&jsonl));
    assert_eq!(rows[0]["id"], 1);
    assert_eq!(rows[1]["id"], 9);
}

#[test]
fn directories_are_read_recursively_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    write(dir.path(), "b.txt", b"second file");
    write(dir.path(), "a.txt", b"first file");
    write(&dir.path().join("sub"), "c.txt", b"third file");
    let o = ok(run(&["fingerprint", dir.path().to_str().unwrap(), "-q"]));
    let ids: Vec<String> = json_lines(&stdout(&o))
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(
        ids[0].ends_with("a.txt") && ids[1].ends_with("b.txt") && ids[2].ends_with("sub/c.txt"),
        "{ids:?}"
    );
}

#[test]
fn output_file_is_atomic_and_carries_its_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fps.jsonl");
    ok(run(&[
        "fingerprint",
        sample().to_str().unwrap(),
        "-q",
        "--features",
        "ngrams:4",
        "-o",
        out.to_str().unwrap(),
    ]));
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 23);
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("fps.jsonl.config.json")).unwrap())
            .unwrap();
    assert_eq!(config["features"], "ngrams:4");
    // The saved configuration reproduces the fingerprints.
    let again = run(&[
        "fingerprint",
        sample().to_str().unwrap(),
        "-q",
        "--config",
        dir.path().join("fps.jsonl.config.json").to_str().unwrap(),
    ]);
    assert_eq!(stdout(&again), std::fs::read_to_string(&out).unwrap());
    // No temporary files left behind.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn failed_run_leaves_no_output_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(
        dir.path(),
        "in.jsonl",
        b"{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{not json\n",
    );
    let out = dir.path().join("out.jsonl");
    let o = run(&[
        "fingerprint",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!out.exists(), "half-written output left behind");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "temporary file left behind"
    );
}

#[test]
fn invalid_utf8_names_file_and_offset_and_lossy_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(
        dir.path(),
        "bad.jsonl",
        b"{\"text\": \"fine\"}\n{\"text\": \"caf\xe9\"}\n",
    );
    let o = run(&["fingerprint", input.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("bad.jsonl")
            && err.contains("byte offset 30")
            && err.contains("line 2")
            && err.contains("--lossy"),
        "{err}"
    );
    let o = run(&["fingerprint", input.to_str().unwrap(), "--lossy", "-q"]);
    assert!(o.status.success());
    assert_eq!(json_lines(&stdout(&o)).len(), 2);
    // Whole-file text too.
    let txt = write(dir.path(), "bad.txt", b"abc\xff");
    let err = stderr(&run(&["fingerprint", txt.to_str().unwrap()]));
    assert!(
        err.contains("bad.txt") && err.contains("byte offset 3"),
        "{err}"
    );
}

#[test]
fn malformed_json_names_the_line_and_skip_invalid_counts() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "in.jsonl", b"{\"text\": \"a\"}\n{\"text\": \"b\",}\n{\"body\": \"c\"}\n{\"text\": 5}\n{\"text\": \"e\"}\n");
    let o = run(&["fingerprint", input.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("in.jsonl:2") && err.contains("--skip-invalid"),
        "{err}"
    );
    let o = ok(run(&[
        "fingerprint",
        input.to_str().unwrap(),
        "--skip-invalid",
    ]));
    assert_eq!(json_lines(&stdout(&o)).len(), 2);
    let err = stderr(&o);
    assert!(err.contains("3 invalid lines skipped"), "{err}");
    assert!(
        err.contains("in.jsonl:3") && err.contains("--text-field"),
        "{err}"
    );
    // The text field can be renamed.
    let o = run(&[
        "fingerprint",
        input.to_str().unwrap(),
        "--skip-invalid",
        "--text-field",
        "body",
        "-q",
    ]);
    assert_eq!(json_lines(&stdout(&o)).len(), 1);
}

#[test]
fn empty_documents_are_counted() {
    let o = run_stdin(&["fingerprint", "--lines"], b"one\n\n   \ntwo\n");
    assert!(o.status.success());
    assert!(
        stderr(&o).contains("4 documents") && stderr(&o).contains("2 empty"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn impossible_parameters_are_refused_with_what_is_allowed() {
    for (args, hint) in [
        (
            vec!["fingerprint", "--features", "shingles:0"],
            "shingles:W",
        ),
        (vec!["fingerprint", "--bits", "32"], "64"),
        (vec!["fingerprint", "--tokenizer", "spaces"], "jieba"),
        (vec!["fingerprint", "--frobnicate"], "--frobnicate"),
        (
            vec![
                "fingerprint",
                "--profile",
                "python-simhash",
                "--bits",
                "128",
            ],
            "cannot be used",
        ),
        (
            vec![
                "fingerprint",
                "--weights",
                "textrank",
                "--features",
                "shingles:2",
            ],
            "--features tokens",
        ),
        // The keyword extractor cuts the text itself: a tokenizer would be
        // ignored, so it is refused (and no --idf advice for textrank).
        (
            vec![
                "fingerprint",
                "--weights",
                "textrank",
                "--tokenizer",
                "words",
            ],
            "--tokenizer words is not used by --weights textrank",
        ),
        (
            vec!["fingerprint", "--weights", "tfidf", "--tokenizer", "chars"],
            "neardup idf build --tokenizer chars",
        ),
        (vec!["fingerprint", "/no/such/file"], "/no/such/file"),
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(hint), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn textrank_advice_does_not_name_a_refused_flag() {
    let o = run(&[
        "fingerprint",
        "--weights",
        "textrank",
        "--features",
        "shingles:2",
    ]);
    assert_eq!(o.status.code(), Some(2));
    // The advice is one that works: --idf only together with --weights tfidf
    // (textrank with a table is refused).
    let e = stderr(&o);
    assert!(e.contains("--features tokens"), "{e}");
    assert!(!e.contains("--idf") || e.contains("--weights tfidf"), "{e}");
    let o = run(&["fingerprint", "--weights", "textrank", "--idf", "table.idf"]);
    assert_eq!(o.status.code(), Some(2));
    // With jieba named, the tokenizer is the extractor's own: accepted.
    ok(run_stdin(
        &[
            "fingerprint",
            "--weights",
            "textrank",
            "--tokenizer",
            "jieba",
            "--features",
            "tokens",
        ],
        "重复数据删除是数据处理的重要步骤".as_bytes(),
    ));
}

#[test]
fn query_batch_summarises_unless_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let idx = dir.path().join("i.ndx");
    let idx_s = idx.to_str().unwrap();
    let sample = sample();
    let sample_s = sample.to_str().unwrap();
    assert!(
        run(&["index", "build", sample_s, "-o", idx_s, "-q"])
            .status
            .success()
    );
    let o = ok(run(&["query", idx_s, "--batch", sample_s]));
    let n = json_lines(&stdout(&o)).len();
    assert!(n > 0);
    assert!(
        stderr(&o).contains(&format!("neardup: {n} queries, {n} with matches")),
        "{}",
        stderr(&o)
    );
    let o = run(&["query", idx_s, "--batch", sample_s, "-q"]);
    assert!(o.status.success());
    assert_eq!(json_lines(&stdout(&o)).len(), n);
    assert_eq!(stderr(&o), "");
    ok(run(&["query", idx_s, "--text", "a lone text", "--quiet"]));
}

#[test]
fn python_simhash_profile_matches_the_golden_values() {
    // Golden values written by the independent Python reference (see the core crate's tests).
    let golden = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../core/tests/data/python_simhash_golden.jsonl"),
    )
    .unwrap();
    let mut input = String::new();
    let mut expected = Vec::new();
    for line in golden.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        if let Some(t) = row["case"]["text"].as_str() {
            input.push_str(&serde_json::json!({"text": t}).to_string());
            input.push('\n');
            expected.push(row["simhash"].as_str().unwrap().to_owned());
        }
    }
    let o = ok(run_stdin(
        &[
            "fingerprint",
            "--profile",
            "python-simhash",
            "--format",
            "jsonl",
            "-q",
        ],
        input.as_bytes(),
    ));
    let got: Vec<String> = json_lines(&stdout(&o))
        .iter()
        .map(|r| r["simhash"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn compare_reports_distance_verdict_and_explanation() {
    let o = run(&[
        "compare",
        "--text",
        "--json",
        "--features",
        "tokens",
        "--explain",
        "the quick brown fox jumps over the lazy dog",
        "the quick brown fox jumped over the lazy dog",
    ]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let d = v["distance"].as_u64().unwrap();
    assert_eq!(v["near_duplicate"], d <= 3);
    assert_eq!(o.status.code(), Some(if d <= 3 { 0 } else { 1 }));
    let expected_sim = (std::f64::consts::PI * d as f64 / 64.0).cos();
    assert!((v["similarity"].as_f64().unwrap() - expected_sim).abs() < 1e-9);
    let explained: Vec<&str> = v["explain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["feature"].as_str().unwrap())
        .collect();
    if d > 0 {
        assert!(
            explained.iter().all(|f| *f == "jumps" || *f == "jumped"),
            "{explained:?}"
        );
        assert!(!explained.is_empty());
    }
    let same = run(&["compare", "--text", "same words here", "same words here"]);
    assert_eq!(same.status.code(), Some(0));
    assert!(stdout(&same).contains("distance    0 of 64 bits"));
    let fps = run(&["compare", "--simhash", "ff", "f0", "-k", "3"]);
    assert_eq!(fps.status.code(), Some(1));
    assert!(stdout(&fps).contains("distance    4 of 64 bits"));
    let bad = run(&["compare", "--simhash", "xyz", "f0"]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn idf_tables_are_built_used_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("sample.idf");
    ok(run(&[
        "idf",
        "build",
        sample().to_str().unwrap(),
        "--features",
        "tokens",
        "--min-df",
        "1",
        "-o",
        table.to_str().unwrap(),
        "-q",
    ]));
    let text = std::fs::read_to_string(&table).unwrap();
    assert!(
        text.starts_with("# neardup-idf 1 {\"documents\":23"),
        "{}",
        &text[..80]
    );
    let with = run(&[
        "fingerprint",
        sample().to_str().unwrap(),
        "--features",
        "tokens",
        "--idf",
        table.to_str().unwrap(),
        "-q",
    ]);
    assert!(with.status.success(), "{}", stderr(&with));
    let without = run(&[
        "fingerprint",
        sample().to_str().unwrap(),
        "--features",
        "tokens",
        "-q",
    ]);
    assert_ne!(
        with.stdout, without.stdout,
        "IDF weights must change some fingerprints"
    );
    // A table learned from other features is refused; one learned with
    // another tokenizer (auto, `idf build`'s default, where dedup's verified
    // candidates cut UAX #29 words) is refused naming both.
    let (corpus, learned) = (sample(), table.to_str().unwrap());
    let corpus = corpus.to_str().unwrap();
    for (args, hint) in [
        (
            [
                "fingerprint",
                corpus,
                "--features",
                "shingles:2",
                "--idf",
                learned,
            ],
            "learned from features made with another configuration (",
        ),
        (
            ["dedup", corpus, "--weights", "tfidf", "--idf", learned],
            "--tokenizer auto, where these flags cut them with --tokenizer words",
        ),
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(hint), "{args:?}: {}", stderr(&o));
    }
    // A corrupt table is refused with its line.
    let bad = write(
        dir.path(),
        "bad.idf",
        b"# neardup-idf 1 {\"documents\":1,\"config\":\"x\",\"default_idf\":1.0}\nnot a row\n",
    );
    let o = run(&[
        "fingerprint",
        sample().to_str().unwrap(),
        "--idf",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("line 2"), "{}", stderr(&o));
}

#[test]
fn large_single_document_works() {
    // 32 MB on one JSON line: streamed into one document, fingerprinted.
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::with_capacity(32 << 20);
    let words = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
    ];
    let mut i = 0usize;
    while text.len() < 32 << 20 {
        text.push_str(words[i * 7 % 8]);
        text.push(' ');
        i += 1;
    }
    let line = serde_json::json!({"id": "big", "text": text}).to_string();
    let input = write(dir.path(), "big.jsonl", line.as_bytes());
    let o = ok(run(&["fingerprint", input.to_str().unwrap(), "-q"]));
    assert_eq!(json_lines(&stdout(&o))[0]["id"], "big");
}

#[test]
fn broken_pipe_is_not_an_error() {
    let mut input = String::new();
    for i in 0..50_000 {
        input.push_str(&format!("document number {i} with some words\n"));
    }
    let mut child = bin()
        .args(["fingerprint", "--lines", "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // stdout is dropped here: the next writes fail with a broken pipe.
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(first.contains("simhash"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn plan_lists_the_papers_designs() {
    let o = ok(run(&["plan", "--n", "2^34", "--k", "3"]));
    let out = stdout(&o);
    for (tables, prefix) in [("4", "16"), ("10", "25-26"), ("16", "28"), ("20", "31-33")] {
        assert!(
            out.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 2 && f[0] == tables && f[1] == prefix
            }),
            "no {tables}-table design with prefix {prefix}:\n{out}"
        );
    }
    let o = run(&["plan", "--n", "1e9", "--k", "3", "--memory", "64G"]);
    assert!(stdout(&o).contains("chosen:"));
    let o = run(&["plan", "--n", "1e9", "--k", "9"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["plan", "--n", "lots"]);
    assert_eq!(o.status.code(), Some(2));
}

/// Fingerprints with distances known by construction: a=0, b=a^0b111 (3 from a),
/// c=b^0b1000 (1 from b, 4 from a), d=a (identical), e far from all.
fn dedup_fixture(dir: &Path) -> PathBuf {
    write(
        dir,
        "fps.jsonl",
        b"{\"id\":\"a\",\"simhash\":\"0000000000000000\"}\n\
          {\"id\":\"b\",\"simhash\":\"0000000000000007\"}\n\
          {\"id\":\"c\",\"simhash\":\"000000000000000f\"}\n\
          {\"id\":\"d\",\"simhash\":\"0000000000000000\"}\n\
          {\"id\":\"e\",\"simhash\":\"ffffffffffff0000\"}\n",
    )
}

#[test]
fn dedup_from_fingerprints_components_and_incremental() {
    let dir = tempfile::tempdir().unwrap();
    let fps = dedup_fixture(dir.path());
    let p = |n: &str| dir.path().join(n);
    let o = ok(run(&[
        "dedup",
        "--fingerprints",
        fps.to_str().unwrap(),
        "--k",
        "3",
        "--pairs",
        p("pairs").to_str().unwrap(),
        "--clusters",
        p("clusters").to_str().unwrap(),
        "--keep",
        p("keep").to_str().unwrap(),
        "--drop",
        p("drop").to_str().unwrap(),
    ]));
    let mut pairs: Vec<(String, String, u64)> =
        json_lines(&std::fs::read_to_string(p("pairs")).unwrap())
            .iter()
            .map(|v| {
                (
                    v["a"].as_str().unwrap().into(),
                    v["b"].as_str().unwrap().into(),
                    v["distance"].as_u64().unwrap(),
                )
            })
            .collect();
    pairs.sort();
    let expected: Vec<(String, String, u64)> =
        [("a", "b", 3), ("a", "d", 0), ("b", "c", 1), ("b", "d", 3)]
            .iter()
            .map(|&(a, b, d)| (a.into(), b.into(), d))
            .collect();
    assert_eq!(pairs, expected);
    // Components: a-b-c-d chain into one cluster, represented by a.
    let clusters = json_lines(&std::fs::read_to_string(p("clusters")).unwrap());
    assert_eq!(clusters.len(), 1);
    assert_eq!(clusters[0]["representative"], "a");
    assert_eq!(clusters[0]["size"], 4);
    let input = std::fs::read_to_string(&fps).unwrap();
    let lines: Vec<&str> = input.lines().collect();
    assert_eq!(
        std::fs::read_to_string(p("keep")).unwrap(),
        format!("{}\n{}\n", lines[0], lines[4])
    );
    assert_eq!(
        std::fs::read_to_string(p("drop")).unwrap().lines().count(),
        3
    );
    assert!(
        stderr(&o).contains("5 documents (4 distinct), 4 pairs"),
        "{}",
        stderr(&o)
    );

    // Incremental: a kept; b near a dropped; c near only b (dropped) kept; d dropped.
    ok(run(&[
        "dedup",
        "--fingerprints",
        fps.to_str().unwrap(),
        "--k",
        "3",
        "--policy",
        "incremental",
        "--keep",
        p("keep2").to_str().unwrap(),
        "--clusters",
        p("clusters2").to_str().unwrap(),
        "-q",
    ]));
    let kept: Vec<String> = json_lines(&std::fs::read_to_string(p("keep2")).unwrap())
        .iter()
        .map(|v| v["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kept, ["a", "c", "e"]);
    let clusters = json_lines(&std::fs::read_to_string(p("clusters2")).unwrap());
    assert_eq!(clusters[0]["members"], serde_json::json!(["a", "b", "d"]));
}

#[test]
fn dedup_documents_keeps_records_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("keep.jsonl");
    let drop = dir.path().join("drop.jsonl");
    ok(run(&[
        "dedup",
        sample().to_str().unwrap(),
        "--keep",
        keep.to_str().unwrap(),
        "--drop",
        drop.to_str().unwrap(),
        "-q",
    ]));
    let input = std::fs::read_to_string(sample()).unwrap();
    let kept = std::fs::read_to_string(&keep).unwrap();
    let dropped = std::fs::read_to_string(&drop).unwrap();
    // Every input line lands in exactly one of the two, unchanged.
    assert_eq!(
        kept.lines().count() + dropped.lines().count(),
        input.lines().count()
    );
    for l in kept.lines().chain(dropped.lines()) {
        assert!(input.lines().any(|i| i == l));
    }
    // The re-wrapped copies are dropped: they normalise to their originals.
    assert!(
        dropped.contains("\"bread-wrapped\"") && dropped.contains("\"zh-tea-wrapped\""),
        "{dropped}"
    );
    // The same from standard input (records kept in memory).
    let o = ok(run_stdin(&["dedup", "--drop", "-", "-q"], input.as_bytes()));
    assert_eq!(stdout(&o), dropped);
}

#[test]
fn dedup_refuses_bad_fingerprint_files_and_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(
        dir.path(),
        "bad.jsonl",
        b"{\"id\":1,\"simhash\":\"00ff\"}\n{\"id\":2,\"simhash\":\"zz\"}\n",
    );
    let o = run(&["dedup", "--fingerprints", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("bad.jsonl:2"), "{}", stderr(&o));
    let mixed = write(
        dir.path(),
        "mixed.jsonl",
        format!(
            "{{\"simhash\":\"ff\"}}\n{{\"simhash\":\"{}\"}}\n",
            "f".repeat(32)
        )
        .as_bytes(),
    );
    let o = run(&["dedup", "--fingerprints", mixed.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("mixed.jsonl:2") && stderr(&o).contains("one width"),
        "{}",
        stderr(&o)
    );
    let fps = dedup_fixture(dir.path());
    let o = run(&["dedup", "--fingerprints", fps.to_str().unwrap(), "--k", "9"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("at most 8"), "{}", stderr(&o));
}

#[test]
fn index_build_query_add_delete_verify() {
    let dir = tempfile::tempdir().unwrap();
    let idx = dir.path().join("s.ndx");
    let idx_s = idx.to_str().unwrap();
    ok(run(&[
        "index",
        "build",
        sample().to_str().unwrap(),
        "-o",
        idx_s,
        "-q",
    ]));
    assert!(stdout(&run(&["index", "verify", idx_s])).contains("ok (23 entries"));
    assert!(stdout(&run(&["index", "info", idx_s])).contains("entries      23"));
    // Every sample document finds itself at distance 0 (and its exact copies).
    let o = ok(run(&[
        "query",
        idx_s,
        "--batch",
        sample().to_str().unwrap(),
    ]));
    for row in json_lines(&stdout(&o)) {
        let m = row["matches"].as_array().unwrap();
        assert!(
            m.iter().any(|x| x["id"] == row["id"] && x["distance"] == 0),
            "{row}"
        );
    }
    // The same answers as fingerprinting and comparing by hand.
    let fps = json_lines(&stdout(&run(&[
        "fingerprint",
        sample().to_str().unwrap(),
        "-q",
    ])));
    let bread = fps.iter().find(|r| r["id"] == "bread").unwrap()["simhash"]
        .as_str()
        .unwrap()
        .to_owned();
    let o = run(&["query", idx_s, "--simhash", &bread]);
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let mut expected: Vec<(String, u32)> = fps
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_owned(),
                (fp(r) ^ u64::from_str_radix(&bread, 16).unwrap()).count_ones(),
            )
        })
        .filter(|(_, d)| *d <= 3)
        .collect();
    expected.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    let got: Vec<(String, u32)> = v["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_owned(),
                m["distance"].as_u64().unwrap() as u32,
            )
        })
        .collect();
    let mut got_sorted = got.clone();
    got_sorted.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    assert_eq!(got_sorted, expected);
    // Delete, then it is gone; add, then it is back.
    assert!(
        run(&["index", "delete", idx_s, "bread", "bread-wrapped"])
            .status
            .success()
    );
    let v: Value =
        serde_json::from_str(stdout(&run(&["query", idx_s, "--simhash", &bread])).trim()).unwrap();
    assert!(
        v["matches"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["id"] != "bread"),
        "{v}"
    );
    let extra = write(dir.path(), "more.jsonl", b"{\"id\":\"bread-again\",\"text\":\"To bake a simple loaf, mix five hundred grams of flour with ten grams of salt, seven grams of dried yeast and three hundred and fifty millilitres of warm water. Knead the dough for ten minutes, let it rise for an hour, shape it, let it rise again, and bake it in a hot oven for about thirty five minutes.\"}\n");
    assert!(
        run(&["index", "add", idx_s, extra.to_str().unwrap(), "-q"])
            .status
            .success()
    );
    let v: Value =
        serde_json::from_str(stdout(&run(&["query", idx_s, "--simhash", &bread])).trim()).unwrap();
    assert!(
        v["matches"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "bread-again" && m["distance"] == 0),
        "{v}"
    );
    assert!(stdout(&run(&["index", "verify", idx_s])).contains("ok (22 entries"));
}

/// A compressed index, in either coding, answers as the plain one does, and
/// refuses changes.
#[test]
fn compressed_index_answers_like_the_plain_one_and_is_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("p.ndx");
    let packed = dir.path().join("c.ndx");
    let gaps = dir.path().join("g.ndx");
    let sample_s = sample().to_str().unwrap().to_owned();
    for (path, extra) in [
        (&plain, vec![]),
        (&packed, vec!["--compressed", "--block-bytes", "32"]),
        (
            &gaps,
            vec!["--compressed", "--block-bytes", "32", "--coding", "gaps"],
        ),
    ] {
        let mut args = vec![
            "index",
            "build",
            &sample_s,
            "-o",
            path.to_str().unwrap(),
            "-q",
        ];
        args.extend(extra);
        ok(run(&args));
    }
    let fps = json_lines(&stdout(&run(&["fingerprint", &sample_s, "-q"])));
    for (file, coding) in [(&packed, "elias-fano"), (&gaps, "gaps")] {
        let packed_s = file.to_str().unwrap();
        assert!(stdout(&run(&["index", "verify", packed_s])).contains("ok (23 entries"));
        let info = stdout(&run(&["index", "info", packed_s]));
        assert!(
            info.contains(&format!(
                "tables       compressed ({coding} coding), read-only"
            )),
            "{info}"
        );
        // Every document's fingerprint, and a near copy of it, as queries.
        for r in &fps {
            for q in [fp(r), fp(r) ^ 0b1001] {
                let q = format!("{q:016x}");
                let answer = |path: &Path| {
                    let o = ok(run(&["query", path.to_str().unwrap(), "--simhash", &q]));
                    stdout(&o)
                };
                assert_eq!(answer(file), answer(&plain), "query {q}");
            }
        }
        let o = ok(run(&["query", packed_s, "--batch", &sample_s]));
        assert_eq!(
            stdout(&o),
            stdout(&run(&[
                "query",
                plain.to_str().unwrap(),
                "--batch",
                &sample_s
            ]))
        );
        for args in [
            vec!["index", "delete", packed_s, "bread"],
            vec!["index", "add", packed_s, &sample_s],
        ] {
            let o = run(&args);
            assert_eq!(o.status.code(), Some(2));
            assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));
        }
    }
    let packed_s = packed.to_str().unwrap();
    for extra in [["--block-bytes", "64"], ["--coding", "gaps"]] {
        let mut args = vec!["index", "build", &sample_s, "-o", packed_s];
        args.extend(extra);
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{extra:?} needs --compressed");
    }
}

#[test]
fn damaged_index_files_and_mismatched_queries_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let idx = dir.path().join("s.ndx");
    let idx_s = idx.to_str().unwrap();
    assert!(
        run(&[
            "index",
            "build",
            sample().to_str().unwrap(),
            "-o",
            idx_s,
            "-q"
        ])
        .status
        .success()
    );
    let bytes = std::fs::read(&idx).unwrap();
    let truncated = write(dir.path(), "t.ndx", &bytes[..bytes.len() / 2]);
    let o = run(&["query", truncated.to_str().unwrap(), "--simhash", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("t.ndx") && stderr(&o).contains("corrupt"),
        "{}",
        stderr(&o)
    );
    let mut damaged = bytes.clone();
    damaged[200] ^= 1; // inside the first section
    let damaged = write(dir.path(), "d.ndx", &damaged);
    let o = run(&["index", "verify", damaged.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("checksum"), "{}", stderr(&o));
    // A query with --check refuses it; the sound file passes the check.
    let o = run(&[
        "query",
        damaged.to_str().unwrap(),
        "--simhash",
        "0",
        "--check",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("d.ndx is damaged") && stderr(&o).contains("checksum"),
        "{}",
        stderr(&o)
    );
    let o = run(&["query", idx_s, "--simhash", "0", "--check"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(&["query", idx_s, "--text", "hello", "--features", "ngrams:5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("differ from the index"),
        "{}",
        stderr(&o)
    );
    let o = run(&[
        "index",
        "add",
        idx_s,
        sample().to_str().unwrap(),
        "--features",
        "ngrams:5",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot add to"), "{}", stderr(&o));
    let o = run(&["query", idx_s, "--simhash", "0", "--k", "5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("maximum k = 3"), "{}", stderr(&o));
    let o = run(&["query", idx_s, "--simhash", &"f".repeat(32)]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn dedup_128_bit_fingerprint_file_equals_dedup_from_documents() {
    let dir = tempfile::tempdir().unwrap();
    let fps = dir.path().join("fps.jsonl");
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    let flags = [
        "--bits",
        "128",
        "--features",
        "tokens",
        "--k",
        "12",
        "--no-verify",
    ];
    ok(run(&[
        "fingerprint",
        sample().to_str().unwrap(),
        "--bits",
        "128",
        "--features",
        "tokens",
        "-o",
        fps.to_str().unwrap(),
        "-q",
    ]));
    let sample_path = sample();
    let mut from_docs = vec!["dedup", sample_path.to_str().unwrap(), "--pairs"];
    let docs_pairs = p("docs_pairs");
    from_docs.push(&docs_pairs);
    from_docs.extend(flags);
    from_docs.push("-q");
    assert!(run(&from_docs).status.success());
    let fps_pairs = p("fps_pairs");
    ok(run(&[
        "dedup",
        "--fingerprints",
        fps.to_str().unwrap(),
        "--k",
        "12",
        "--pairs",
        &fps_pairs,
        "-q",
    ]));
    let a = std::fs::read_to_string(&docs_pairs).unwrap();
    let b = std::fs::read_to_string(&fps_pairs).unwrap();
    assert_eq!(a, b);
    assert!(!a.is_empty(), "k = 12 at 128 bits finds the planted copies");
    // And an index of those 128-bit fingerprints answers the same pairs.
    let idx = p("i.ndx");
    assert!(
        run(&[
            "index",
            "build",
            "--fingerprints",
            fps.to_str().unwrap(),
            "--k",
            "12",
            "-o",
            &idx,
            "-q"
        ])
        .status
        .success()
    );
    let first: Value = serde_json::from_str(a.lines().next().unwrap()).unwrap();
    let fp_of = |id: &Value| {
        json_lines(&std::fs::read_to_string(&fps).unwrap())
            .into_iter()
            .find(|r| &r["id"] == id)
            .unwrap()["simhash"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let o = run(&["query", &idx, "--simhash", &fp_of(&first["a"]), "--k", "12"]);
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert!(
        v["matches"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == first["b"]),
        "{v}"
    );
}

#[test]
fn index_keeps_integer_and_string_ids_apart() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(
        dir.path(),
        "mixed.jsonl",
        b"{\"id\": 5, \"text\": \"the harbour master opened the gates at dawn\"}\n\
          {\"id\": \"5\", \"text\": \"the harbour master opened the gates at dawn\"}\n",
    );
    let idx = dir.path().join("m.ndx");
    let idx_s = idx.to_str().unwrap();
    assert!(
        run(&["index", "build", input.to_str().unwrap(), "-o", idx_s, "-q"])
            .status
            .success()
    );
    let o = run(&[
        "query",
        idx_s,
        "--text",
        "the harbour master opened the gates at dawn",
    ]);
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let mut ids: Vec<String> = v["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].to_string())
        .collect();
    ids.sort();
    assert_eq!(ids, ["\"5\"", "5"], "{v}");
    // Adding an integer id to a table that holds strings keeps it an integer.
    let more = write(
        dir.path(),
        "more.jsonl",
        b"{\"id\": 7, \"text\": \"the harbour master opened the gates at dawn\"}\n",
    );
    assert!(
        run(&["index", "add", idx_s, more.to_str().unwrap(), "-q"])
            .status
            .success()
    );
    let o = run(&[
        "query",
        idx_s,
        "--text",
        "the harbour master opened the gates at dawn",
    ]);
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert!(
        v["matches"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == 7),
        "{v}"
    );
}

/// A float32 `.npy` file written from the format's description (magic,
/// version 1.0, header length, dict, padding to 64 bytes), not by the code
/// under test.
fn npy_f32(dir: &Path, name: &str, rows: &[Vec<f32>]) -> PathBuf {
    let dim = rows.first().map_or(0, Vec::len);
    let mut dict = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {dim}), }}",
        rows.len()
    );
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    bytes.extend_from_slice(dict.as_bytes());
    for r in rows {
        for x in r {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
    write(dir, name, &bytes)
}

fn planted_vectors() -> Vec<Vec<f32>> {
    let mut rng = neardup_core::rng::SplitMix64(8);
    let mut rows: Vec<Vec<f32>> = (0..300)
        .map(|_| (0..24).map(|_| rng.unit() as f32 * 2.0 - 1.0).collect())
        .collect();
    for i in 0..30 {
        rows[270 + i] = rows[i]
            .iter()
            .map(|x| x + (rng.unit() as f32 - 0.5) * 0.05)
            .collect();
    }
    rows
}

#[test]
fn vectors_from_npy_and_json_lines_fingerprint_alike() {
    let dir = tempfile::tempdir().unwrap();
    let rows = planted_vectors();
    let npy = npy_f32(dir.path(), "v.npy", &rows);
    let mut jsonl = String::new();
    let mut ids = String::new();
    for (i, r) in rows.iter().enumerate() {
        jsonl.push_str(&serde_json::json!({"id": format!("r{i}"), "emb": r}).to_string());
        jsonl.push('\n');
        ids.push_str(&format!("r{i}\n"));
    }
    let jsonl = write(dir.path(), "v.jsonl", jsonl.as_bytes());
    let ids = write(dir.path(), "ids.txt", ids.as_bytes());
    let a = run(&[
        "fingerprint",
        npy.to_str().unwrap(),
        "--ids",
        ids.to_str().unwrap(),
    ]);
    let b = run(&[
        "fingerprint",
        jsonl.to_str().unwrap(),
        "--vector-field",
        "emb",
    ]);
    assert!(a.status.success(), "{}", stderr(&a));
    assert!(b.status.success(), "{}", stderr(&b));
    assert_eq!(stdout(&a), stdout(&b));
    assert_eq!(json_lines(&stdout(&a))[5]["id"], "r5");
    // Without --ids, the row number from 0 is the id.
    let c = run(&["fingerprint", npy.to_str().unwrap()]);
    let c = json_lines(&stdout(&c));
    assert_eq!(c[0]["id"], 0);
    assert_eq!(c.len(), 300);
    // Dedup finds exactly the planted pairs, each with its cosine.
    let pairs = dir.path().join("p.jsonl");
    ok(run(&[
        "dedup",
        npy.to_str().unwrap(),
        "--ids",
        ids.to_str().unwrap(),
        "--min-similarity",
        "0.98",
        "--pairs",
        pairs.to_str().unwrap(),
        "-q",
    ]));
    let found = json_lines(&std::fs::read_to_string(&pairs).unwrap());
    let cos = |a: &[f32], b: &[f32]| {
        let dot = |x: &[f32], y: &[f32]| {
            x.iter()
                .zip(y)
                .map(|(p, q)| f64::from(*p) * f64::from(*q))
                .sum::<f64>()
        };
        dot(a, b) / (dot(a, a) * dot(b, b)).sqrt()
    };
    let mut truth = Vec::new();
    for i in 0..rows.len() {
        for j in i + 1..rows.len() {
            if cos(&rows[i], &rows[j]) >= 0.98 {
                truth.push((format!("r{i}"), format!("r{j}")));
            }
        }
    }
    let mut got: Vec<(String, String)> = found
        .iter()
        .map(|p| {
            (
                p["a"].as_str().unwrap().to_owned(),
                p["b"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    got.sort();
    truth.sort();
    assert_eq!(got, truth);
    assert!(found.iter().all(|p| p["cosine"].as_f64().unwrap() >= 0.98));

    // Parquet: a fixed-size list of float32 and a list of float64 per row
    // fingerprint as the .npy rows do, and --keep writes the rows kept.
    for (name, fixed) in [("fixed.parquet", true), ("list.parquet", false)] {
        let path = dir.path().join(name);
        write_vector_parquet(&path, &rows, fixed);
        let p = run(&[
            "fingerprint",
            path.to_str().unwrap(),
            "--vector-field",
            "emb",
        ]);
        assert!(p.status.success(), "{}", stderr(&p));
        assert_eq!(stdout(&p), stdout(&a), "{name}");
    }
    let kept = dir.path().join("kept.parquet");
    ok(run(&[
        "dedup",
        dir.path().join("fixed.parquet").to_str().unwrap(),
        "--vector-field",
        "emb",
        "--min-similarity",
        "0.98",
        "--keep",
        kept.to_str().unwrap(),
        "-q",
    ]));
    let dropped: std::collections::HashSet<&str> = truth.iter().map(|p| p.1.as_str()).collect();
    let want: Vec<String> = (0..rows.len())
        .map(|i| format!("r{i}"))
        .filter(|id| !dropped.contains(id.as_str()))
        .collect();
    assert_eq!(parquet_ids_of(&kept, 2), want);
}

/// `rows` as Parquet: an id column and an "emb" column of fixed-size float32
/// lists, or of float64 lists.
fn write_vector_parquet(path: &Path, rows: &[Vec<f32>], fixed: bool) {
    use arrow_array::{ArrayRef, FixedSizeListArray, Float32Array, ListArray};
    use arrow_array::{RecordBatch, StringArray};
    use std::sync::Arc;
    let dim = rows[0].len();
    let ids: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..rows.len()).map(|i| format!("r{i}")),
    ));
    let emb: ArrayRef = if fixed {
        let values = Float32Array::from_iter_values(rows.iter().flatten().copied());
        let item = Arc::new(arrow_schema::Field::new(
            "item",
            arrow_schema::DataType::Float32,
            true,
        ));
        Arc::new(FixedSizeListArray::new(
            item,
            dim as i32,
            Arc::new(values),
            None,
        ))
    } else {
        Arc::new(ListArray::from_iter_primitive::<
            arrow_array::types::Float64Type,
            _,
            _,
        >(rows.iter().map(|r| {
            Some(r.iter().map(|&x| Some(f64::from(x))).collect::<Vec<_>>())
        })))
    };
    let batch = RecordBatch::try_from_iter([("id", ids), ("emb", emb)]).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn bad_vectors_are_refused_with_their_place() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str)] = &[
        (
            "{\"vector\": [1, 2]}\n{\"vector\": [1, 2, 3]}\n",
            "v.jsonl:2: the vector has 3 dimensions",
        ),
        (
            "{\"vector\": [1, 2]}\n{\"vector\": [0, 0]}\n",
            "v.jsonl:2: invalid vector: the vector is all zeros",
        ),
        (
            "{\"vector\": [1, 1e39]}\n",
            "v.jsonl:1: malformed JSON line: entry 1 of the vector",
        ),
        (
            "{\"vector\": [1, \"x\"]}\n",
            "v.jsonl:1: malformed JSON line",
        ),
        (
            "{\"text\": \"no vector\"}\n",
            "v.jsonl:1: no \"vector\" field",
        ),
    ];
    for (body, message) in cases {
        let p = write(dir.path(), "v.jsonl", body.as_bytes());
        let o = run(&["fingerprint", p.to_str().unwrap(), "--vector-field"]);
        assert_eq!(o.status.code(), Some(2), "{body}");
        assert!(stderr(&o).contains(message), "{body}: {}", stderr(&o));
    }
    let p = write(dir.path(), "v.jsonl", b"{\"vector\": [1, 2]}\n");
    let o = run(&[
        "fingerprint",
        p.to_str().unwrap(),
        "--vector-field",
        "--dim",
        "3",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("the configuration's vectors have 3"),
        "{}",
        stderr(&o)
    );
    // A truncated array, too few ids, a type that is not float.
    let rows = vec![vec![1.0f32, 2.0], vec![3.0, 4.0]];
    let npy = npy_f32(dir.path(), "t.npy", &rows);
    let bytes = std::fs::read(&npy).unwrap();
    std::fs::write(&npy, &bytes[..bytes.len() - 3]).unwrap();
    let o = run(&["fingerprint", npy.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("truncated"), "{}", stderr(&o));
    let npy = npy_f32(dir.path(), "u.npy", &rows);
    let ids = write(dir.path(), "ids.txt", b"only-one\n");
    let o = run(&[
        "fingerprint",
        npy.to_str().unwrap(),
        "--ids",
        ids.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("fewer lines than the .npy inputs have rows"),
        "{}",
        stderr(&o)
    );
    let mut ints = std::fs::read(&npy).unwrap();
    let at = ints.windows(3).position(|w| w == b"<f4").unwrap();
    ints[at + 1] = b'i';
    let npy = write(dir.path(), "i.npy", &ints);
    let o = run(&["fingerprint", npy.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("astype(numpy.float32)"),
        "{}",
        stderr(&o)
    );
    // Text settings do not apply to vectors.
    let o = run(&[
        "fingerprint",
        p.to_str().unwrap(),
        "--vector-field",
        "--tokenizer",
        "jieba",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("do not apply to dense vectors"),
        "{}",
        stderr(&o)
    );
}

/// A corpus of lower-case words (so that its shingles are plain word
/// trigrams): originals, edited copies, and blank records.
fn planted_corpus() -> (String, Vec<Vec<String>>) {
    let mut state = 7u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let vocab: Vec<String> = (0..400)
        .map(|i| format!("w{}x{}", i, ["al", "be", "ko", "ru"][i % 4]))
        .collect();
    let mut docs: Vec<Vec<String>> = Vec::new();
    for d in 0..60 {
        if d % 3 == 2 {
            // A copy of an earlier document with a few words replaced.
            let mut copy = docs[(next() % docs.len() as u64) as usize].clone();
            for _ in 0..(next() % 4) {
                let at = (next() % copy.len() as u64) as usize;
                copy[at] = vocab[(next() % 400) as usize].clone();
            }
            docs.push(copy);
        } else {
            let len = 40 + (next() % 60) as usize;
            docs.push(
                (0..len)
                    .map(|_| vocab[(next() % 400) as usize].clone())
                    .collect(),
            );
        }
    }
    let mut text = String::new();
    for (i, d) in docs.iter().enumerate() {
        text.push_str(&format!(
            "{{\"id\":\"d{i}\",\"text\":\"{}\"}}\n",
            d.join(" ")
        ));
    }
    for (i, blank) in ["", "   ", "!!! ...", ""].iter().enumerate() {
        text.push_str(&format!("{{\"id\":\"blank{i}\",\"text\":\"{blank}\"}}\n"));
        docs.push(Vec::new());
    }
    (text, docs)
}

fn trigram_jaccard(a: &[String], b: &[String]) -> f64 {
    let set = |d: &[String]| -> std::collections::BTreeSet<String> {
        d.windows(3).map(|w| w.join(" ")).collect()
    };
    let (x, y) = (set(a), set(b));
    x.intersection(&y).count() as f64 / x.union(&y).count() as f64
}

#[test]
fn dedup_is_the_same_from_every_format_and_thread_count_and_verified_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (text, docs) = planted_corpus();
    let plain = write(dir.path(), "c.jsonl", text.as_bytes());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(text.as_bytes()).unwrap();
    let gz = write(dir.path(), "c.jsonl.gz", &gz.finish().unwrap());
    let zst = write(
        dir.path(),
        "c.jsonl.zst",
        &zstd::encode_all(text.as_bytes(), 3).unwrap(),
    );
    let mut results = Vec::new();
    for (input, threads) in [(&plain, "1"), (&plain, "2"), (&gz, "2"), (&zst, "1")] {
        let out = |n: &str| dir.path().join(format!("{n}-{threads}-{}", results.len()));
        let (pairs, clusters, keep) = (out("pairs"), out("clusters"), out("keep"));
        let o = ok(run(&[
            "dedup",
            input.to_str().unwrap(),
            "--threads",
            threads,
            "--pairs",
            pairs.to_str().unwrap(),
            "--clusters",
            clusters.to_str().unwrap(),
            "--keep",
            keep.to_str().unwrap(),
            "--tmp-dir",
            dir.path().to_str().unwrap(),
        ]));
        assert!(
            stderr(&o).contains("4 documents have no words"),
            "{}",
            stderr(&o)
        );
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        results.push((read(&pairs), read(&clusters), read(&keep)));
    }
    for r in &results[1..] {
        assert_eq!(r, &results[0]);
    }
    let pairs = json_lines(&results[0].0);
    assert!(pairs.len() >= 10, "planted copies are found: {pairs:?}");
    let index = |v: &Value| -> usize {
        let id = v.as_str().unwrap();
        assert!(!id.starts_with("blank"), "a blank record was paired: {id}");
        id[1..].parse().unwrap()
    };
    for p in &pairs {
        let (a, b) = (index(&p["a"]), index(&p["b"]));
        let exact = trigram_jaccard(&docs[a], &docs[b]);
        let reported = p["jaccard"].as_f64().unwrap();
        assert!(exact >= 0.8, "{p}: exact {exact}");
        assert!((reported - exact).abs() < 1e-4, "{p}: exact {exact}");
    }
    // Blank records are kept, each once.
    assert_eq!(results[0].2.matches("\"blank").count(), 4);
}

#[test]
fn damaged_compressed_input_is_named_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (text, _) = planted_corpus();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(text.repeat(20).as_bytes()).unwrap();
    let bytes = gz.finish().unwrap();
    let cut = write(dir.path(), "cut.jsonl.gz", &bytes[..bytes.len() / 2]);
    let pairs = dir.path().join("pairs.jsonl");
    let o = run(&[
        "dedup",
        cut.to_str().unwrap(),
        "--pairs",
        pairs.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("cut.jsonl.gz") && e.contains("damaged") && e.contains("line"),
        "{e}"
    );
    assert!(!pairs.exists(), "no output from a failed run");
}

#[test]
fn keep_by_picks_each_clusters_survivor() {
    let dir = tempfile::tempdir().unwrap();
    let (text, _) = planted_corpus();
    // Every record gains a field "q" that is not in input order.
    let mut records: Vec<Value> = json_lines(&text);
    for (i, r) in records.iter_mut().enumerate() {
        r["q"] = Value::from((i * 37) % 101);
    }
    let body: String = records.iter().map(|r| format!("{r}\n")).collect();
    let input = write(dir.path(), "q.jsonl", body.as_bytes());
    let by_id: std::collections::HashMap<String, &Value> = records
        .iter()
        .map(|r| (r["id"].as_str().unwrap().to_owned(), r))
        .collect();
    for (rule, policy) in [
        ("longest", "components"),
        ("field:q:desc", "components"),
        ("field:q", "incremental"),
    ] {
        let clusters = dir.path().join("clusters.jsonl");
        let keep = dir.path().join("keep.jsonl");
        ok(run(&[
            "dedup",
            input.to_str().unwrap(),
            "--keep-by",
            rule,
            "--policy",
            policy,
            "--clusters",
            clusters.to_str().unwrap(),
            "--keep",
            keep.to_str().unwrap(),
            "-q",
        ]));
        let value = |id: &Value| -> i64 {
            let r = by_id[id.as_str().unwrap()];
            match rule {
                "longest" => r["text"].as_str().unwrap().len() as i64,
                "field:q:desc" => r["q"].as_i64().unwrap(),
                _ => -r["q"].as_i64().unwrap(),
            }
        };
        let kept = std::fs::read_to_string(&keep).unwrap();
        let clusters = json_lines(&std::fs::read_to_string(&clusters).unwrap());
        assert!(clusters.len() >= 5, "{rule}: {clusters:?}");
        for c in &clusters {
            let rep = &c["representative"];
            assert!(
                kept.contains(&format!("\"id\":{rep}")),
                "{rule}: {rep} is kept"
            );
            let members = c["members"].as_array().unwrap();
            if policy == "components" {
                // The best member; ties to the first in input order.
                let best = members
                    .iter()
                    .max_by_key(|m| {
                        (
                            value(m),
                            std::cmp::Reverse(m.as_str().unwrap()[1..].parse::<u32>().unwrap()),
                        )
                    })
                    .unwrap();
                assert_eq!(rep, best, "{rule}: {c}");
            } else {
                // Incremental: nothing in the cluster is preferred to its representative.
                assert!(
                    members.iter().all(|m| value(m) <= value(rep)),
                    "{rule}: {c}"
                );
            }
        }
    }
    let o = run(&["dedup", input.to_str().unwrap(), "--keep-by", "oldest"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("field:NAME"), "{}", stderr(&o));
}

#[test]
fn a_bad_keep_by_value_stops_the_run_with_its_line_and_writes_nothing() {
    // The keep-by key is checked where each batch's results are collected
    // (a thread of its own): its error must still stop the run, name the
    // line, and leave no output behind, with records before and after it.
    let dir = tempfile::tempdir().unwrap();
    let mut body = String::new();
    for i in 0..3000 {
        let q = if i == 2500 {
            "[1]".to_owned()
        } else {
            i.to_string()
        };
        body.push_str(&format!(
            "{{\"id\":\"d{i}\",\"text\":\"record {i} of the keep-by corpus\",\"q\":{q}}}\n"
        ));
    }
    let input = write(dir.path(), "bad_q.jsonl", body.as_bytes());
    let keep = dir.path().join("kept.jsonl");
    let o = run(&[
        "dedup",
        input.to_str().unwrap(),
        "--keep-by",
        "field:q",
        "--keep",
        keep.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("bad_q.jsonl:2501"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("must be a number or a string"),
        "{}",
        stderr(&o)
    );
    assert!(!keep.exists());
}

#[test]
fn against_drops_only_new_documents() {
    let dir = tempfile::tempdir().unwrap();
    let (text, _) = planted_corpus();
    let lines: Vec<&str> = text.lines().collect();
    // Old: the first half. New: the second half, and renamed copies of five
    // old records (exact copies of what is already clean).
    let old_lines = &lines[..lines.len() / 2];
    let mut new_body: String = lines[lines.len() / 2..]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    for l in old_lines.iter().filter(|l| l.contains("\"d")).take(5) {
        new_body.push_str(&l.replacen("\"id\":\"d", "\"id\":\"copy-of-d", 1));
        new_body.push('\n');
    }
    let old_body: String = old_lines.iter().map(|l| format!("{l}\n")).collect();
    let old = write(dir.path(), "old.jsonl", old_body.as_bytes());
    let new = write(dir.path(), "new.jsonl", new_body.as_bytes());
    let p = |n: &str| dir.path().join(n);
    ok(run(&[
        "dedup",
        new.to_str().unwrap(),
        "--against",
        old.to_str().unwrap(),
        "--pairs",
        p("pairs").to_str().unwrap(),
        "--keep",
        p("keep").to_str().unwrap(),
        "--drop",
        p("drop").to_str().unwrap(),
        "--keep-by",
        "longest",
    ]));
    let ids = |f: &str| -> Vec<String> {
        json_lines(&std::fs::read_to_string(p(f)).unwrap())
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (kept, dropped) = (ids("keep"), ids("drop"));
    let new_ids: Vec<String> = json_lines(&new_body)
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    // Keep and drop partition the new records; no old record appears.
    let mut both: Vec<String> = kept.iter().chain(&dropped).cloned().collect();
    both.sort();
    let mut expected = new_ids.clone();
    expected.sort();
    assert_eq!(both, expected);
    // The copies of old records are dropped, whatever --keep-by says.
    for i in dropped.iter().filter(|i| i.starts_with("copy-of")) {
        assert!(dropped.contains(i));
    }
    assert_eq!(
        dropped.iter().filter(|i| i.starts_with("copy-of")).count(),
        5
    );
    // Every pair involves a new document.
    let old_ids: Vec<String> = json_lines(&old_body)
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    let pairs = json_lines(&std::fs::read_to_string(p("pairs")).unwrap());
    assert!(!pairs.is_empty());
    for pair in &pairs {
        let (a, b) = (pair["a"].as_str().unwrap(), pair["b"].as_str().unwrap());
        let is_old = |x: &str| old_ids.iter().any(|o| o == x);
        assert!(!(is_old(a) && is_old(b)), "{pair}");
    }
}

/// Writes `records` (id, text, a numeric column; `None` text is null) as Parquet
/// in row groups of `group` rows.
fn write_parquet(path: &Path, records: &[(String, Option<String>)], group: usize) {
    use arrow_array::{Int64Array, RecordBatch, StringArray};
    use std::sync::Arc;
    let schema = Arc::new(arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("id", arrow_schema::DataType::Utf8, false),
        arrow_schema::Field::new("text", arrow_schema::DataType::Utf8, true),
        arrow_schema::Field::new("extra", arrow_schema::DataType::Int64, false),
    ]));
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_size(group)
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema.clone(), Some(props)).unwrap();
    for chunk in records.chunks(group) {
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(
                    chunk.iter().map(|r| r.0.clone()),
                )),
                Arc::new(StringArray::from(
                    chunk.iter().map(|r| r.1.clone()).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from_iter_values(0..chunk.len() as i64)),
            ],
        )
        .unwrap();
        w.write(&batch).unwrap();
    }
    w.close().unwrap();
}

fn parquet_ids(path: &Path) -> Vec<String> {
    parquet_ids_of(path, 3)
}

/// The first (string) column of a Parquet file of `columns` columns.
fn parquet_ids_of(path: &Path, columns: usize) -> Vec<String> {
    use arrow_array::cast::AsArray;
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut ids = Vec::new();
    for b in reader {
        let b = b.unwrap();
        assert_eq!(b.num_columns(), columns, "every column is kept");
        ids.extend(
            b.column(0)
                .as_string::<i32>()
                .iter()
                .map(|s| s.unwrap().to_owned()),
        );
    }
    ids
}

#[test]
fn parquet_input_gives_the_json_lines_answers_and_parquet_records() {
    let dir = tempfile::tempdir().unwrap();
    let (text, _) = planted_corpus();
    let records: Vec<(String, Option<String>)> = json_lines(&text)
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_owned(),
                Some(r["text"].as_str().unwrap().to_owned()),
            )
        })
        .collect();
    let jsonl = write(dir.path(), "c.jsonl", text.as_bytes());
    let pq = dir.path().join("c.parquet");
    // A null text among them: skipped with --skip-invalid, in neither output.
    let mut with_null = records.clone();
    with_null.insert(7, ("null-text".into(), None));
    write_parquet(&pq, &with_null, 5);
    let p = |n: &str| dir.path().join(n);
    let run_on = |input: &Path, tag: &str, keep: &str, drop: &str| {
        ok(run(&[
            "dedup",
            input.to_str().unwrap(),
            "--clusters",
            p(&format!("clusters-{tag}")).to_str().unwrap(),
            "--keep",
            p(keep).to_str().unwrap(),
            "--drop",
            p(drop).to_str().unwrap(),
            "--skip-invalid",
            "-q",
        ]));
        std::fs::read_to_string(p(&format!("clusters-{tag}"))).unwrap()
    };
    let from_jsonl = run_on(&jsonl, "jsonl", "keep.jsonl", "drop.jsonl");
    let from_parquet = run_on(&pq, "parquet", "keep.parquet", "drop.parquet");
    assert_eq!(from_parquet, from_jsonl);
    let ids_of = |f: &str| -> Vec<String> {
        json_lines(&std::fs::read_to_string(p(f)).unwrap())
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(parquet_ids(&p("keep.parquet")), ids_of("keep.jsonl"));
    assert_eq!(parquet_ids(&p("drop.parquet")), ids_of("drop.jsonl"));
    // Without --skip-invalid the null text stops the run, named.
    let o = run(&["dedup", pq.to_str().unwrap(), "-q"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("c.parquet:8") && stderr(&o).contains("null"),
        "{}",
        stderr(&o)
    );
    // A missing text column, and a truncated file.
    let o = run(&["dedup", pq.to_str().unwrap(), "--text-field", "body"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no column \"body\""), "{}", stderr(&o));
    let bytes = std::fs::read(&pq).unwrap();
    let cut = write(dir.path(), "cut.parquet", &bytes[..bytes.len() / 2]);
    let o = run(&[
        "dedup",
        cut.to_str().unwrap(),
        "--pairs",
        p("x").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("cut.parquet") && stderr(&o).contains("damaged"),
        "{}",
        stderr(&o)
    );
    assert!(!p("x").exists());
}

#[test]
fn a_byte_order_mark_before_the_first_json_line_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let body =
        "{\"id\":\"a\",\"text\":\"the quick brown fox\"}\n{\"id\":\"b\",\"text\":\"jumps\"}\n";
    let plain = write(dir.path(), "plain.jsonl", body.as_bytes());
    let bom = write(
        dir.path(),
        "bom.jsonl",
        format!("\u{feff}{body}").as_bytes(),
    );
    let a = run(&["fingerprint", plain.to_str().unwrap(), "-q"]);
    let b = run(&["fingerprint", bom.to_str().unwrap(), "-q"]);
    assert!(b.status.success(), "{}", stderr(&b));
    assert_eq!(stdout(&a), stdout(&b));
    // From standard input too (where the format is sniffed).
    let c = run_stdin(&["fingerprint", "-q"], format!("\u{feff}{body}").as_bytes());
    assert!(c.status.success(), "{}", stderr(&c));
    assert_eq!(stdout(&a), stdout(&c));
}

#[test]
fn a_quadratic_pair_listing_is_announced() {
    let dir = tempfile::tempdir().unwrap();
    // 1,500 copies of one fingerprint: 1,124,250 pairs, 750 per document.
    let fps: String = (0..1500)
        .map(|i| format!("{{\"id\":{i},\"simhash\":\"00000000000000ff\"}}\n"))
        .collect();
    let input = write(dir.path(), "fps.jsonl", fps.as_bytes());
    let pairs = dir.path().join("pairs.jsonl");
    let o = ok(run(&[
        "dedup",
        "--fingerprints",
        input.to_str().unwrap(),
        "--pairs",
        pairs.to_str().unwrap(),
    ]));
    assert!(
        stderr(&o).contains("writing 1124250 pairs") && stderr(&o).contains("--clusters"),
        "{}",
        stderr(&o)
    );
    // A few copies: no warning.
    let small = write(
        dir.path(),
        "small.jsonl",
        fps.lines()
            .take(40)
            .collect::<Vec<_>>()
            .join("\n")
            .as_bytes(),
    );
    let o = ok(run(&[
        "dedup",
        "--fingerprints",
        small.to_str().unwrap(),
        "--pairs",
        pairs.to_str().unwrap(),
    ]));
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
}

/// Output to a FIFO is written through it (a shell redirection's behaviour),
/// and the FIFO stays a FIFO; a new file gets the umask's mode, a replaced
/// one keeps its own.
#[cfg(unix)]
#[test]
fn outputs_write_through_special_files_and_keep_modes() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let sample = sample();
    ok(run(&[
        "fingerprint",
        sample.to_str().unwrap(),
        "-o",
        fifo.to_str().unwrap(),
    ]));
    let through = reader.join().unwrap();
    let direct = stdout(&run(&["fingerprint", sample.to_str().unwrap()]));
    assert_eq!(through, direct);
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    // A new file under umask 027: 0640.
    let out = dir.path().join("fps.jsonl");
    let o = Command::new("sh")
        .arg("-c")
        .arg("umask 027; exec \"$0\" fingerprint \"$1\" -o \"$2\"")
        .arg(env!("CARGO_BIN_EXE_neardup"))
        .arg(&sample)
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&out), 0o640);
    // An index made 0644 stays 0644 through index add.
    let idx = dir.path().join("i.ndx");
    let idx_s = idx.to_str().unwrap();
    assert!(
        run(&[
            "index",
            "build",
            sample.to_str().unwrap(),
            "-o",
            idx_s,
            "-q"
        ])
        .status
        .success()
    );
    std::fs::set_permissions(&idx, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(
        run(&["index", "add", idx_s, sample.to_str().unwrap(), "-q"])
            .status
            .success()
    );
    assert_eq!(mode(&idx), 0o644);
}

/// Concurrent `index add` runs lose no update (the file is locked while it is
/// rewritten), and a damaged index is refused, not rewritten.
#[test]
fn index_add_locks_and_refuses_damage() {
    let dir = tempfile::tempdir().unwrap();
    let base = write(dir.path(), "base.jsonl", b"{\"id\":\"base\",\"text\":\"the index starts with this one document about bread and water\"}\n");
    let idx = dir.path().join("i.ndx");
    let idx_s = idx.to_str().unwrap().to_string();
    assert!(
        run(&["index", "build", base.to_str().unwrap(), "-o", &idx_s, "-q"])
            .status
            .success()
    );
    let adders: Vec<_> = (0..6)
        .map(|i| {
            let doc = write(
                dir.path(),
                &format!("add{i}.jsonl"),
                format!("{{\"id\":\"doc{i}\",\"text\":\"document number {i} of the concurrent writers, all different {}\"}}\n", "word ".repeat(i + 1)).as_bytes(),
            );
            bin()
                .args(["index", "add", &idx_s, doc.to_str().unwrap(), "-q"])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for a in adders {
        ok(a.wait_with_output().unwrap());
    }
    let info = stdout(&run(&["index", "info", &idx_s]));
    assert!(
        info.lines()
            .any(|l| l.starts_with("entries") && l.trim_end().ends_with(" 7")),
        "every add kept: {info}"
    );
    // One flipped byte anywhere (header, tables, ids): add refuses, and the
    // file is left as it was, its damage still visible to verify.
    let sound = std::fs::read(&idx).unwrap();
    for at in [sound.len() / 5, sound.len() / 2, sound.len() * 4 / 5] {
        let mut bytes = sound.clone();
        bytes[at] ^= 0x40;
        std::fs::write(&idx, &bytes).unwrap();
        let o = run(&["index", "add", &idx_s, base.to_str().unwrap(), "-q"]);
        assert_eq!(o.status.code(), Some(2), "byte {at}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains("damaged") || e.contains("corrupt"), "{e}");
        assert_eq!(std::fs::read(&idx).unwrap(), bytes);
        assert!(!run(&["index", "verify", &idx_s]).status.success());
    }
}

/// An empty token would silently turn authentication off: refused, as is
/// --protect all without a token.
#[test]
fn serve_refuses_an_empty_token() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let o = bin()
        .args(["serve", "--data", data, "--addr", "127.0.0.1:0"])
        .env("NEARDUP_TOKEN", "")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("token is empty"), "{}", stderr(&o));
    let o = bin()
        .args([
            "serve",
            "--data",
            data,
            "--addr",
            "127.0.0.1:0",
            "--protect",
            "all",
        ])
        .env_remove("NEARDUP_TOKEN")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--protect all needs a token"),
        "{}",
        stderr(&o)
    );
}

/// Flags whose collection could not do what they ask are refused at
/// creation, with the fix, and leave the folder as it was: verification
/// (the default) over a k too narrow for its candidates, --verify on
/// weighted features, --verify with --no-verify, a k beyond any online
/// design.
#[test]
fn serve_refuses_flags_that_make_no_sense_together() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--bits", "64", "--max-k", "3"],
            "--max-k 3 is too narrow to verify at 64 bits",
        ),
        (
            &["--max-k", "9"],
            "--max-k 9 is too narrow to verify at 128 bits",
        ),
        (
            &["--verify", "jaccard:0.8", "--kind", "features"],
            "--verify compares texts or vectors",
        ),
        (
            &["--verify", "jaccard:0.8", "--no-verify"],
            "cannot be used with",
        ),
        (
            &["--no-verify", "--bits", "64", "--max-k", "20"],
            "too large for an online index",
        ),
    ];
    for (i, (flags, said)) in cases.iter().enumerate() {
        let data = dir.path().join(format!("new-{i}"));
        let o = bin()
            .args([
                "serve",
                "--data",
                data.to_str().unwrap(),
                "--addr",
                "127.0.0.1:0",
            ])
            .args(*flags)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(said), "{flags:?}: {}", stderr(&o));
        assert!(!data.exists(), "{flags:?}: the folder was left behind");
    }
}

/// A configuration saved beside fingerprints names its IDF table relative to
/// its own folder, so that the two move together.
#[test]
fn saved_configuration_names_the_idf_table_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    ok(bin()
        .current_dir(dir.path())
        .args([
            "idf",
            "build",
            sample().to_str().unwrap(),
            "--features",
            "tokens",
            "--min-df",
            "1",
            "-o",
            "t.idf",
            "-q",
        ])
        .output()
        .unwrap());
    ok(bin()
        .current_dir(dir.path())
        .args([
            "fingerprint",
            sample().to_str().unwrap(),
            "--features",
            "tokens",
            "--idf",
            "t.idf",
            "-o",
            "fps.jsonl",
            "-q",
        ])
        .output()
        .unwrap());
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("fps.jsonl.config.json")).unwrap(),
    )
    .unwrap();
    let path = PathBuf::from(config["idf"]["path"].as_str().unwrap());
    assert!(path.is_relative(), "{path:?}");
    assert_eq!(
        std::fs::canonicalize(dir.path().join(path)).unwrap(),
        std::fs::canonicalize(dir.path().join("t.idf")).unwrap()
    );
}

/// A folder's ordinary `.json` files (a schema, a configuration) are read as
/// one text document each; a `.json` file of JSON Lines is still JSON Lines.
#[test]
fn folders_with_ordinary_json_files_are_fingerprinted() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.txt", b"a plain text document about bread\n");
    write(
        dir.path(),
        "b.json",
        b"{\n  \"openapi\": \"3.1.0\",\n  \"info\": {\"title\": \"x\"}\n}\n",
    );
    write(
        dir.path(),
        "c.json",
        b"{\"id\":\"c1\",\"text\":\"one record\"}\n{\"id\":\"c2\",\"text\":\"another record\"}\n",
    );
    let o = ok(run(&["fingerprint", dir.path().to_str().unwrap()]));
    let lines = json_lines(&stdout(&o));
    assert_eq!(lines.len(), 4, "{}", stdout(&o));
    let ids: Vec<&str> = lines.iter().filter_map(|v| v["id"].as_str()).collect();
    assert!(ids.contains(&"c1") && ids.contains(&"c2"), "{ids:?}");
}

/// Every row of a Parquet file as JSON values, columns by name (ids as strings
/// or integers, lists of them, numbers).
fn parquet_rows(path: &Path) -> Vec<serde_json::Map<String, Value>> {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type, UInt32Type, UInt64Type};
    use arrow_schema::DataType;
    fn cell(col: &dyn Array, i: usize) -> Value {
        match col.data_type() {
            DataType::Utf8 => json!(col.as_string::<i32>().value(i)),
            DataType::Int64 => json!(col.as_primitive::<Int64Type>().value(i)),
            DataType::UInt32 => json!(col.as_primitive::<UInt32Type>().value(i)),
            DataType::UInt64 => json!(col.as_primitive::<UInt64Type>().value(i)),
            // JSON Lines writes similarities to 4 decimals.
            DataType::Float64 => {
                json!((col.as_primitive::<Float64Type>().value(i) * 1e4).round() / 1e4)
            }
            DataType::List(_) => {
                let list = col.as_list::<i32>().value(i);
                Value::Array((0..list.len()).map(|j| cell(list.as_ref(), j)).collect())
            }
            t => panic!("unexpected column type {t}"),
        }
    }
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut rows = Vec::new();
    for b in reader {
        let b = b.unwrap();
        for i in 0..b.num_rows() {
            let mut row = serde_json::Map::new();
            for (f, col) in b.schema().fields().iter().zip(b.columns()) {
                row.insert(f.name().clone(), cell(col.as_ref(), i));
            }
            rows.push(row);
        }
    }
    rows
}

#[test]
fn pairs_and_clusters_as_parquet_hold_the_json_lines_rows() {
    let dir = tempfile::tempdir().unwrap();
    let sample = sample();
    let p = |name: &str| dir.path().join(name);
    let s = |name: &str| p(name).to_str().unwrap().to_owned();
    for (input, extra) in [
        (sample.clone(), vec![]),
        (sample.clone(), vec!["--no-verify"]),
    ] {
        let mut args = vec![
            "dedup".to_owned(),
            input.to_str().unwrap().to_owned(),
            "-q".into(),
        ];
        args.extend(extra.iter().map(|e| e.to_string()));
        let run_with = |more: &[String]| {
            let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
            a.extend(more.iter().map(String::as_str));
            ok(run(&a));
        };
        run_with(&[
            "--pairs".into(),
            s("p.jsonl"),
            "--clusters".into(),
            s("c.jsonl"),
        ]);
        // By extension, and by --output-format whatever the name.
        run_with(&[
            "--pairs".into(),
            s("p.parquet"),
            "--clusters".into(),
            s("c.parquet"),
        ]);
        run_with(&[
            "--pairs".into(),
            s("p.out"),
            "--clusters".into(),
            s("c.out"),
            "--output-format".into(),
            "parquet".into(),
        ]);
        for (jsonl, parquets) in [
            ("p.jsonl", ["p.parquet", "p.out"]),
            ("c.jsonl", ["c.parquet", "c.out"]),
        ] {
            let want: Vec<serde_json::Map<String, Value>> =
                json_lines(&std::fs::read_to_string(p(jsonl)).unwrap())
                    .into_iter()
                    .map(|v| v.as_object().unwrap().clone())
                    .collect();
            assert!(!want.is_empty(), "{jsonl} {extra:?}");
            for pq in parquets {
                assert_eq!(parquet_rows(&p(pq)), want, "{pq} {extra:?}");
            }
        }
    }
    // Integer ids become an Int64 column.
    let ints = write(
        dir.path(),
        "ints.jsonl",
        b"{\"id\": 7, \"text\": \"one two three four five six seven eight\"}\n{\"id\": 9, \"text\": \"one two three four five six seven eight\"}\n",
    );
    ok(run(&[
        "dedup",
        ints.to_str().unwrap(),
        "-q",
        "--pairs",
        &s("i.parquet"),
    ]));
    let rows = parquet_rows(&p("i.parquet"));
    assert_eq!(rows.len(), 1);
    assert_eq!((&rows[0]["a"], &rows[0]["b"]), (&json!(7), &json!(9)));
}

#[test]
fn dedup_help_states_the_default_k_the_run_uses() {
    use neardup_core::{
        Width,
        dedup::{centred_k, default_k},
    };
    let help = stdout(&run(&["dedup", "--help"]));
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let verified = format!(
        "Default with verification {} for 128 bits, {} for 64, on centred candidates ({} and {} with --no-centre",
        centred_k(Width::W128),
        centred_k(Width::W64),
        default_k(Width::W128, true),
        default_k(Width::W64, true)
    );
    let unverified = format!(
        "without, {} for 64 bits, {} for 128",
        default_k(Width::W64, false),
        default_k(Width::W128, false)
    );
    assert!(help.contains(&verified), "{help}");
    assert!(help.contains(&unverified), "{help}");
    // And the run says so.
    let sample = sample();
    for (flags, k) in [
        (&[][..], centred_k(Width::W128)),
        (&["--no-centre"][..], default_k(Width::W128, true)),
        (&["--bits", "64"][..], centred_k(Width::W64)),
    ] {
        let mut args = vec!["dedup", sample.to_str().unwrap()];
        args.extend(flags);
        let out = run(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("within k = {k}")),
            "{flags:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn keep_and_drop_split_the_input_records_whichever_way_they_are_read_again() {
    // Two shards: one with a byte-order mark, CRLF line ends, blank and
    // whitespace-only lines between records and no final newline; one
    // gzipped. Copies of one record in each, so some are dropped.
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let rec = |id: &str, text: &str| json!({"id": id, "text": text}).to_string();
    let same = "the quick brown fox jumps over the lazy dog near the river bank today";
    let a = format!(
        "\u{feff}{}\r\n\r\n{}\r\n   \r\n{}\r\n{}",
        rec("a1", same),
        rec(
            "a2",
            "an unrelated record about compilers and their intermediate forms"
        ),
        rec("a3", same),
        rec(
            "a4",
            "one more record, the last line of its file, with no newline after it"
        ),
    );
    std::fs::write(p("a.jsonl"), &a).unwrap();
    let b = format!(
        "{}\n\n{}\n",
        rec("b1", same),
        rec(
            "b2",
            "yet another text, of trains and timetables across the northern lines"
        )
    );
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b.as_bytes()).unwrap();
    std::fs::write(p("b.jsonl.gz"), gz.finish().unwrap()).unwrap();
    // Every record (not blank lines), as the outputs write it: no mark, LF.
    let records: Vec<String> = a
        .trim_start_matches('\u{feff}')
        .split('\n')
        .chain(b.split('\n'))
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect();
    assert_eq!(records.len(), 6);
    let mut outputs = Vec::new();
    for extra in [&[][..], &["--skip-invalid"][..]] {
        let (keep, drop) = (p("keep.jsonl"), p("drop.jsonl"));
        let (sa, sb) = (p("a.jsonl"), p("b.jsonl.gz"));
        let mut args = vec!["dedup", sa.to_str().unwrap(), sb.to_str().unwrap()];
        args.extend([
            "--keep",
            keep.to_str().unwrap(),
            "--drop",
            drop.to_str().unwrap(),
            "-q",
        ]);
        args.extend_from_slice(extra);
        ok(run(&args));
        let kept = std::fs::read_to_string(&keep).unwrap();
        let dropped = std::fs::read_to_string(&drop).unwrap();
        let ids = |s: &str| -> Vec<String> {
            json_lines(s)
                .iter()
                .map(|v| v["id"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(ids(&kept), ["a1", "a2", "a4", "b2"]);
        assert_eq!(ids(&dropped), ["a3", "b1"]);
        // Together, every record once, unchanged, in input order.
        let mut both: Vec<&str> = kept.lines().chain(dropped.lines()).collect();
        both.sort_by_key(|l| {
            records
                .iter()
                .position(|r| r == l)
                .expect("an input record")
        });
        assert_eq!(both, records);
        outputs.push((kept, dropped));
    }
    // Unparsed (no --skip-invalid) and parsed again: the same bytes.
    assert_eq!(outputs[0], outputs[1]);
}

/// The definition of centred candidates, computed apart from the pipeline:
/// each document's features and weights (`SimHasher::features`), the share
/// of its weight on each bit rounded to 1/510 from 1/4 (exact rationals),
/// the mean over every document read, and a bit set where a document's
/// share exceeds the mean.
fn centred_by_definition(texts: &[String]) -> Vec<u128> {
    use neardup_core::{FingerprintConfig, SimHasher};
    let hasher = SimHasher::new(FingerprintConfig::candidates()).unwrap();
    let shares: Vec<Vec<i128>> = texts
        .iter()
        .map(|t| {
            let features = hasher.features(t);
            let total: f64 = features.iter().map(|f| f.weight).sum();
            (0..128)
                .map(|i| {
                    if total == 0.0 {
                        return 0;
                    }
                    let on: f64 = features
                        .iter()
                        .filter(|f| f.hash >> i & 1 == 1)
                        .map(|f| f.weight)
                        .sum();
                    // Term frequencies are whole numbers: round(510 (on/total
                    // - 1/4)), halves up, clamped to [0, 255].
                    let (on, total) = (on as i128, total as i128);
                    (2040 * on - 508 * total)
                        .div_euclid(4 * total)
                        .clamp(0, 255)
                })
                .collect()
        })
        .collect();
    let n = shares.len() as i128;
    let sums: Vec<i128> = (0..128)
        .map(|i| shares.iter().map(|s| s[i]).sum())
        .collect();
    shares
        .iter()
        .map(|s| {
            (0..128)
                .filter(|&i| s[i] * n > sums[i])
                .fold(0u128, |fp, i| fp | 1 << i)
        })
        .collect()
}

#[test]
fn centred_candidates_are_found_exactly_and_verified() {
    use neardup_core::{Width, dedup::centred_k};
    use std::collections::BTreeSet;
    let dir = tempfile::tempdir().unwrap();
    let (text, docs) = planted_corpus();
    let texts: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let fps = centred_by_definition(&texts);
    let k = centred_k(Width::W128);
    // Unrelated documents lie about half the bits apart once centred.
    let unrelated: Vec<u32> = (0..60)
        .step_by(3)
        .flat_map(|a| (a + 3..60).step_by(3).map(move |b| (a, b)))
        .map(|(a, b)| (fps[a] ^ fps[b]).count_ones())
        .collect();
    let mean = unrelated.iter().sum::<u32>() as f64 / unrelated.len() as f64;
    assert!((54.0..74.0).contains(&mean), "mean distance {mean}");
    // Brute force: every pair within k whose word 3-shingles reach 0.8.
    let mut expected = BTreeSet::new();
    for a in 0..docs.len() {
        for b in a + 1..docs.len() {
            let d = (fps[a] ^ fps[b]).count_ones();
            if d <= k && !docs[a].is_empty() && trigram_jaccard(&docs[a], &docs[b]) >= 0.8 {
                expected.insert((format!("d{a}"), format!("d{b}"), d));
            }
        }
    }
    assert!(expected.len() >= 10, "{expected:?}");
    let found = |out: &Path| -> BTreeSet<(String, String, u32)> {
        json_lines(&std::fs::read_to_string(out).unwrap())
            .iter()
            .map(|p| {
                let (a, b) = (p["a"].as_str().unwrap(), p["b"].as_str().unwrap());
                let order = |x: &str| x[1..].parse::<usize>().unwrap();
                let (a, b) = if order(a) < order(b) { (a, b) } else { (b, a) };
                (
                    a.to_owned(),
                    b.to_owned(),
                    p["distance"].as_u64().unwrap() as u32,
                )
            })
            .collect()
    };
    let plain = write(dir.path(), "c.jsonl", text.as_bytes());
    let out = dir.path().join("pairs.jsonl");
    ok(run(&[
        "dedup",
        plain.to_str().unwrap(),
        "--pairs",
        out.to_str().unwrap(),
    ]));
    assert_eq!(found(&out), expected);
    // With --against, centred on old and new documents alike: the pairs
    // that are not both old.
    let lines: Vec<&str> = text.lines().collect();
    let half = 30;
    let old = write(
        dir.path(),
        "old.jsonl",
        (lines[..half].join("\n") + "\n").as_bytes(),
    );
    let new = write(
        dir.path(),
        "new.jsonl",
        (lines[half..].join("\n") + "\n").as_bytes(),
    );
    ok(run(&[
        "dedup",
        new.to_str().unwrap(),
        "--against",
        old.to_str().unwrap(),
        "--pairs",
        out.to_str().unwrap(),
    ]));
    let across: BTreeSet<_> = expected
        .iter()
        .filter(|(_, b, _)| b[1..].parse::<usize>().unwrap() >= half)
        .cloned()
        .collect();
    assert_eq!(found(&out), across);
}
