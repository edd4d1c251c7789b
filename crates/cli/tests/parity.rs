//! The command line agrees with the other entry points and with what its
//! output names promise: compressed outputs by name, `index add` replacing
//! by id as the service does, a refused collection leaving its folder as it
//! was, a saved configuration moving with its IDF table, and `--verify` taking
//! a bare threshold as the Python package does.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_neardup"))
}

fn sample() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/sample.jsonl")
}

fn run(dir: &Path, args: &[&str]) -> Output {
    bin()
        .current_dir(dir)
        .args(args)
        .output()
        .expect("binary runs")
}

fn ok(o: &Output) {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A corpus with copies: the sample, and each of its first five documents
/// again with one word changed.
fn corpus(dir: &Path) -> PathBuf {
    let mut text = std::fs::read_to_string(sample()).unwrap();
    for (i, line) in text.clone().lines().take(5).enumerate() {
        let mut v: Value = serde_json::from_str(line).unwrap();
        v["id"] = format!("copy-{i}").into();
        let t = v["text"].as_str().unwrap().replacen("the", "a", 1);
        v["text"] = t.into();
        text.push_str(&v.to_string());
        text.push('\n');
    }
    let p = dir.join("corpus.jsonl");
    std::fs::write(&p, text).unwrap();
    p
}

/// `--keep`, `--drop`, `--pairs` and `--clusters` named `.gz` or `.zst`
/// are compressed so, holding what the plain names hold.
#[test]
fn outputs_are_compressed_as_their_names_say() {
    let dir = tempfile::tempdir().unwrap();
    let c = corpus(dir.path());
    let names = ["keep", "drop", "pairs", "clusters"];
    let mut plain = vec!["dedup", c.to_str().unwrap(), "-q"];
    let args: Vec<String> = names
        .iter()
        .flat_map(|n| [format!("--{n}"), format!("{n}.jsonl")])
        .collect();
    plain.extend(args.iter().map(String::as_str));
    ok(&run(dir.path(), &plain));
    for ext in ["gz", "zst"] {
        let mut packed = vec!["dedup", c.to_str().unwrap(), "-q"];
        let args: Vec<String> = names
            .iter()
            .flat_map(|n| [format!("--{n}"), format!("{n}.jsonl.{ext}")])
            .collect();
        packed.extend(args.iter().map(String::as_str));
        ok(&run(dir.path(), &packed));
        for n in names {
            let want = std::fs::read(dir.path().join(format!("{n}.jsonl"))).unwrap();
            assert!(!want.is_empty(), "{n} is empty");
            let file = std::fs::File::open(dir.path().join(format!("{n}.jsonl.{ext}"))).unwrap();
            let mut got = Vec::new();
            match ext {
                "gz" => flate2::read::GzDecoder::new(file)
                    .read_to_end(&mut got)
                    .expect("a gzip stream"),
                _ => zstd::stream::read::Decoder::new(file)
                    .unwrap()
                    .read_to_end(&mut got)
                    .expect("a zstd stream"),
            };
            assert_eq!(got, want, "{n}.jsonl.{ext}");
        }
    }
}

/// `index add` of an id already in the index replaces its entry, as the
/// service does: a query finds the id once, with its new fingerprint.
#[test]
fn index_add_replaces_an_entry_of_the_same_id() {
    let dir = tempfile::tempdir().unwrap();
    ok(&run(
        dir.path(),
        &[
            "index",
            "build",
            sample().to_str().unwrap(),
            "-o",
            "i.ndx",
            "-q",
        ],
    ));
    let first: Value = serde_json::from_str(
        std::fs::read_to_string(sample())
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let id = first["id"].as_str().unwrap().to_owned();
    let text = first["text"].as_str().unwrap();
    // The same id, twice in one batch, the last with the text again.
    let batch = format!(
        "{}\n{}\n",
        serde_json::json!({"id": id, "text": "something else entirely, about trains and maps"}),
        serde_json::json!({"id": id, "text": text}),
    );
    std::fs::write(dir.path().join("add.jsonl"), batch).unwrap();
    ok(&run(
        dir.path(),
        &["index", "add", "i.ndx", "add.jsonl", "-q"],
    ));
    let o = run(dir.path(), &["query", "i.ndx", "--text", text]);
    ok(&o);
    let hits: Vec<Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let found = hits
        .iter()
        .flat_map(|h| {
            h.get("matches")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_else(|| vec![h.clone()])
        })
        .filter(|m| m["id"] == id.as_str())
        .count();
    assert_eq!(found, 1, "{hits:?}");
    let o = run(dir.path(), &["index", "info", "i.ndx"]);
    ok(&o);
    let lines = std::fs::read_to_string(sample()).unwrap().lines().count();
    let info = String::from_utf8_lossy(&o.stdout);
    assert!(
        info.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["entries", &lines.to_string()]),
        "{info}"
    );
}

/// A collection `serve` refuses to create (verification over a k too narrow
/// for it, with an IDF table to copy in) leaves nothing in its folder: a
/// later start there is not told the folder is no collection.
#[test]
fn a_refused_collection_leaves_its_folder_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    ok(&run(
        dir.path(),
        &[
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
        ],
    ));
    for data in ["new", "empty"] {
        if data == "empty" {
            std::fs::create_dir(dir.path().join(data)).unwrap();
        }
        let o = run(
            dir.path(),
            &[
                "serve",
                "--data",
                data,
                "--addr",
                "127.0.0.1:0",
                "--features",
                "tokens",
                "--idf",
                "t.idf",
                "--bits",
                "64",
                "--max-k",
                "3",
            ],
        );
        assert_eq!(o.status.code(), Some(2));
        let folder = dir.path().join(data);
        match data {
            "new" => assert!(!folder.exists(), "the folder was left behind"),
            _ => assert_eq!(
                std::fs::read_dir(&folder).unwrap().count(),
                0,
                "a file was left in the folder"
            ),
        }
    }
}

/// A configuration saved with `neardup config -o` names its IDF table
/// relative to itself: the pair moved elsewhere still works with --config,
/// and gives the fingerprints the table gives.
#[test]
fn a_saved_configuration_moves_with_its_idf_table() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("a")).unwrap();
    ok(&run(
        dir.path(),
        &[
            "idf",
            "build",
            sample().to_str().unwrap(),
            "--features",
            "tokens",
            "--min-df",
            "1",
            "-o",
            "a/t.idf",
            "-q",
        ],
    ));
    ok(&run(
        dir.path(),
        &[
            "config",
            "--features",
            "tokens",
            "--idf",
            "a/t.idf",
            "-o",
            "a/c.json",
        ],
    ));
    let want = run(
        dir.path(),
        &[
            "fingerprint",
            sample().to_str().unwrap(),
            "--features",
            "tokens",
            "--idf",
            "a/t.idf",
            "-q",
        ],
    );
    ok(&want);
    std::fs::rename(dir.path().join("a"), dir.path().join("b")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let got = run(
        elsewhere.path(),
        &[
            "fingerprint",
            sample().to_str().unwrap(),
            "--config",
            dir.path().join("b/c.json").to_str().unwrap(),
            "-q",
        ],
    );
    ok(&got);
    assert_eq!(got.stdout, want.stdout);
}

/// `--verify 0.8` is `--verify jaccard:0.8`, as the Python package's
/// `verify=0.8`; out of range is still refused.
#[test]
fn verify_takes_a_bare_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let c = corpus(dir.path());
    let c = c.to_str().unwrap();
    ok(&run(
        dir.path(),
        &[
            "dedup",
            c,
            "--verify",
            "jaccard:0.8",
            "--pairs",
            "a.jsonl",
            "-q",
        ],
    ));
    ok(&run(
        dir.path(),
        &["dedup", c, "--verify", "0.8", "--pairs", "b.jsonl", "-q"],
    ));
    let a = std::fs::read_to_string(dir.path().join("a.jsonl")).unwrap();
    assert!(!a.is_empty());
    assert_eq!(
        a,
        std::fs::read_to_string(dir.path().join("b.jsonl")).unwrap()
    );
    let o = run(dir.path(), &["dedup", c, "--verify", "1.5", "-q"]);
    assert_eq!(o.status.code(), Some(2));
}

/// `--annotate` keeps every record, in input order, with `cluster`,
/// `duplicate_of` and `similarity` added; a record that already has one of
/// those fields is refused by name, and nothing is written.
#[test]
fn annotate_keeps_every_record_with_its_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let c = corpus(dir.path());
    ok(&run(
        dir.path(),
        &["dedup", c.to_str().unwrap(), "--annotate", "a.jsonl", "-q"],
    ));
    let input: Vec<Value> = std::fs::read_to_string(&c)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let out: Vec<Value> = std::fs::read_to_string(dir.path().join("a.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(out.len(), input.len());
    let mut copies = 0;
    for (o, i) in out.iter().zip(&input) {
        assert_eq!(o["id"], i["id"]);
        assert_eq!(o["text"], i["text"]);
        if o["id"].as_str().unwrap().starts_with("copy-") {
            copies += 1;
            assert!(o["duplicate_of"].is_string(), "{o}");
        }
        if o["duplicate_of"].is_null() {
            assert!(o["cluster"].is_string(), "{o}");
        } else {
            assert_eq!(o["cluster"], o["duplicate_of"]);
            assert!(o["similarity"].as_f64().unwrap() >= 0.8, "{o}");
        }
    }
    assert_eq!(copies, 5);
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"id\": 1, \"text\": \"a b c\", \"cluster\": 4}\n").unwrap();
    let o = run(
        dir.path(),
        &[
            "dedup",
            bad.to_str().unwrap(),
            "--annotate",
            "b.jsonl",
            "-q",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("\"cluster\""));
    assert!(!dir.path().join("b.jsonl").exists());
}
