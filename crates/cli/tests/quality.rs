//! Detection quality on the evaluation kit's sample corpus (evalkit/data), and
//! the commands that measure it: truth, eval, dedup's verification, query's.

use std::collections::BTreeSet;

use serde_json::Value;

mod util;
use util::*;

fn kit(lang: &str, file: &str) -> String {
    repo_file("evalkit/data")
        .join(lang)
        .join(file)
        .to_str()
        .unwrap()
        .to_owned()
}

fn eval(found: &str, truth: &str) -> Value {
    let o = ok(run(&["eval", "--found", found, "--truth", truth, "--json"]));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn pairs(path: &std::path::Path) -> BTreeSet<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let (a, b) = (v["a"].to_string(), v["b"].to_string());
            if a < b { (a, b) } else { (b, a) }
        })
        .collect()
}

/// The acceptance test: plain `neardup dedup INPUT --pairs OUT`, no
/// other option, F1 >= 0.95 and precision >= 0.98 per language.
#[test]
fn default_dedup_meets_the_quality_targets() {
    let dir = tempfile::tempdir().unwrap();
    for lang in ["en", "zh"] {
        let found = dir.path().join(format!("{lang}.jsonl"));
        let found_s = found.to_str().unwrap();
        ok(run(&[
            "dedup",
            &kit(lang, "corpus.jsonl"),
            "--pairs",
            found_s,
            "-q",
        ]));
        let r = eval(found_s, &kit(lang, "truth.jsonl"));
        let (p, f1) = (r["precision"].as_f64().unwrap(), r["f1"].as_f64().unwrap());
        assert!(p >= 0.98, "{lang}: precision {p}");
        assert!(f1 >= 0.95, "{lang}: F1 {f1}");
        // Without verification the same candidates are far less precise or
        // complete: the figures must differ (and both are reported in docs).
        let plain = dir.path().join(format!("{lang}-plain.jsonl"));
        ok(run(&[
            "dedup",
            &kit(lang, "corpus.jsonl"),
            "--no-verify",
            "--pairs",
            plain.to_str().unwrap(),
            "-q",
        ]));
        let r2 = eval(plain.to_str().unwrap(), &kit(lang, "truth.jsonl"));
        assert!(r2["f1"].as_f64().unwrap() < f1, "{lang}: {r2}");
    }
}

/// Chinese text typeset anew (re-wrapped at a fixed width, inside Latin words
/// too; lines joined without a space; punctuation of the other width and CRLF
/// line ends) keeps every character: its verification similarity is 1 and
/// plain dedup reports every such pair.
#[test]
fn retypeset_chinese_is_the_same_text() {
    let dir = tempfile::tempdir().unwrap();
    let found = dir.path().join("zh.jsonl");
    ok(run(&[
        "dedup",
        &kit("zh", "corpus.jsonl"),
        "--pairs",
        found.to_str().unwrap(),
        "-q",
    ]));
    let found = pairs(&found);
    let mut checked = BTreeSet::new();
    for line in std::fs::read_to_string(kit("zh", "truth.jsonl"))
        .unwrap()
        .lines()
    {
        let v: Value = serde_json::from_str(line).unwrap();
        let edit = v["edit"].as_str().unwrap_or("");
        if !["rewrap", "join_lines", "widths"].contains(&edit) {
            continue;
        }
        assert_eq!(v["jaccard"].as_f64(), Some(1.0), "{v}");
        let (a, b) = (v["a"].to_string(), v["b"].to_string());
        let key = if a < b { (a, b) } else { (b, a) };
        if edit != "widths" {
            assert!(found.contains(&key), "not found: {v}");
        }
        checked.insert(edit.to_owned());
    }
    assert_eq!(checked.len(), 3, "{checked:?}");
}

/// The committed truth is what `neardup truth` computes from the committed
/// corpus and labels (so it is never edited by hand).
#[test]
fn committed_truth_is_reproduced() {
    let dir = tempfile::tempdir().unwrap();
    for lang in ["en", "zh"] {
        let out = dir.path().join("truth.jsonl");
        ok(run(&[
            "truth",
            &kit(lang, "corpus.jsonl"),
            "--edits",
            &kit(lang, "edits.jsonl"),
            "-o",
            out.to_str().unwrap(),
            "-q",
        ]));
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            std::fs::read_to_string(kit(lang, "truth.jsonl")).unwrap(),
            "{lang}: rebuild with evalkit/run.sh --sample"
        );
    }
}

/// Verified pairs are exactly the candidates at or above the threshold, by the
/// truth's own (independently computed) similarity. (Plain fingerprints on
/// both sides: unverified runs are not centred.)
#[test]
fn verification_keeps_exactly_the_candidates_above_the_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = kit("en", "corpus.jsonl");
    let (cand, ver) = (dir.path().join("c.jsonl"), dir.path().join("v.jsonl"));
    let common = ["--bits", "128", "--features", "tokens", "--k", "13", "-q"];
    let mut a = vec!["dedup", corpus.as_str(), "--no-verify", "--pairs"];
    a.push(cand.to_str().unwrap());
    a.extend(common);
    ok(run(&a));
    let mut b = vec![
        "dedup",
        corpus.as_str(),
        "--verify",
        "jaccard:0.9",
        "--no-centre",
        "--pairs",
    ];
    b.push(ver.to_str().unwrap());
    b.extend(common);
    ok(run(&b));
    let truth: std::collections::HashMap<(String, String), f64> =
        std::fs::read_to_string(kit("en", "truth.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                let (a, b) = (v["a"].to_string(), v["b"].to_string());
                let k = if a < b { (a, b) } else { (b, a) };
                (k, v["jaccard"].as_f64().unwrap())
            })
            .collect();
    let expected: BTreeSet<_> = pairs(&cand)
        .into_iter()
        .filter(|k| truth.get(k).is_some_and(|&j| j >= 0.9))
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(pairs(&ver), expected);
}

#[test]
fn eval_scores_labelled_pairs_and_names_bad_lines() {
    let dir = tempfile::tempdir().unwrap();
    let truth = dir.path().join("t.jsonl");
    let found = dir.path().join("f.jsonl");
    std::fs::write(
        &truth,
        concat!(
            "{\"a\":1,\"b\":2,\"duplicate\":true,\"edit\":\"x\"}\n",
            "{\"a\":3,\"b\":4,\"duplicate\":true}\n",
            "{\"a\":5,\"b\":6,\"duplicate\":false}\n",
        ),
    )
    .unwrap();
    // One true positive (given in reverse order), one false positive outside
    // the truth, one labelled negative found; one false negative.
    std::fs::write(
        &found,
        "{\"a\":2,\"b\":1}\n{\"a\":7,\"b\":8}\n{\"a\":5,\"b\":6}\n",
    )
    .unwrap();
    let r = eval(found.to_str().unwrap(), truth.to_str().unwrap());
    assert_eq!(r["tp"], 1);
    assert_eq!(r["fp"], 2);
    assert_eq!(r["fn"], 1);
    assert!((r["precision"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-12);
    assert!((r["recall"].as_f64().unwrap() - 0.5).abs() < 1e-12);
    assert!((r["f1"].as_f64().unwrap() - 0.4).abs() < 1e-12);
    assert_eq!(r["by_edit"]["x"]["found_positives"], 1);
    std::fs::write(&found, "{\"a\":1,\"b\":2}\n{\"a\":1}\n").unwrap();
    let o = run(&[
        "eval",
        "--found",
        found.to_str().unwrap(),
        "--truth",
        truth.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("f.jsonl:2"), "{}", stderr(&o));
}

#[test]
fn verification_needs_texts_and_min_similarity_bounds_k() {
    let dir = tempfile::tempdir().unwrap();
    let fps = dir.path().join("fps.jsonl");
    let corpus = kit("en", "corpus.jsonl");
    ok(run(&[
        "fingerprint",
        &corpus,
        "-o",
        fps.to_str().unwrap(),
        "-q",
    ]));
    let o = run(&[
        "dedup",
        "--fingerprints",
        fps.to_str().unwrap(),
        "--verify",
        "jaccard:0.8",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--min-similarity"), "{}", stderr(&o));
    // cos(pi * 3 / 64) = 0.9892 and cos(pi * 4 / 64) = 0.9808: 0.985 means k = 3.
    let p = dir.path().join("p.jsonl");
    let o = ok(run(&[
        "dedup",
        "--fingerprints",
        fps.to_str().unwrap(),
        "--min-similarity",
        "0.985",
        "--pairs",
        p.to_str().unwrap(),
    ]));
    assert!(
        stderr(&o).contains("within k = 3, not verified"),
        "{}",
        stderr(&o)
    );
    for line in std::fs::read_to_string(&p).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert!(v["distance"].as_u64().unwrap() <= 3);
    }
    let o = run(&["dedup", &corpus, "--verify", "cosine:0.8"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("jaccard:0.8"), "{}", stderr(&o));
}

#[test]
fn short_texts_are_counted_and_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("short.jsonl");
    std::fs::write(
        &input,
        "{\"id\":1,\"text\":\"buy cheap shoes now\"}\n{\"id\":2,\"text\":\"buy cheap shoes today\"}\n\
         {\"id\":3,\"text\":\"一二三四五六七八九十一二三四五六七八九十一二三四五六七八九十\"}\n",
    )
    .unwrap();
    let o = ok(run(&["dedup", input.to_str().unwrap()]));
    assert!(
        stderr(&o).contains("warning: 2 of 3 documents have fewer than 25 words"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn query_verifies_against_the_indexed_texts() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = kit("en", "corpus.jsonl");
    let idx = dir.path().join("i.ndx");
    ok(run(&[
        "index",
        "build",
        &corpus,
        "-o",
        idx.to_str().unwrap(),
        "--bits",
        "128",
        "--features",
        "tokens",
        "--k",
        "13",
        "-q",
    ]));
    let batch = dir.path().join("q.jsonl");
    let text = std::fs::read_to_string(&corpus).unwrap();
    std::fs::write(&batch, text.lines().take(40).collect::<Vec<_>>().join("\n")).unwrap();
    let q = |extra: &[&str]| -> Vec<Value> {
        let mut a = vec![
            "query",
            idx.to_str().unwrap(),
            "--batch",
            batch.to_str().unwrap(),
        ];
        a.extend(extra);
        let o = ok(run(&a));
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let plain = q(&[]);
    let verified = q(&["--verify", "jaccard:0.8", "--corpus", &corpus]);
    assert_eq!(plain.len(), verified.len());
    let mut dropped = 0;
    for (p, v) in plain.iter().zip(&verified) {
        let vm = v["matches"].as_array().unwrap();
        // Each query finds itself, identical.
        assert!(vm.iter().any(|m| m["id"] == p["id"] && m["jaccard"] == 1.0));
        for m in vm {
            assert!(m["jaccard"].as_f64().unwrap() >= 0.8);
        }
        dropped += p["matches"].as_array().unwrap().len() - vm.len();
    }
    assert!(dropped > 0, "verification removes some candidates");
}
