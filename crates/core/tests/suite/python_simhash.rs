//! The `python-simhash` profile against an independent reference: the Python
//! script beside this file (standard library only) and, when it is installed,
//! PyPI `simhash` itself. Without Python, against the golden file that script
//! wrote (`NEARDUP_WRITE_GOLDEN=1 cargo test --test suite python_simhash` rewrites it).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use neardup_core::{FingerprintConfig, SimHasher};
use serde_json::{Value, json};

/// Fragments chosen for what they test: case mapping (İ, final sigma, ß),
/// Python's `\w` (marks, other-script digits, superscripts, underscores,
/// symbols), CJK inside and outside U+4E00..U+9FCC, full-width forms.
const FRAGMENTS: &[&str] = &[
    "How are you",
    "I am fine",
    "Thanks",
    ", ",
    ". ",
    "!",
    " ",
    "\n",
    "İstanbul",
    "ΟΔΟΣ",
    "Straße",
    "naïve café",
    "e\u{301}",
    "हिन्दी",
    "٣٤٥",
    "x²",
    "½",
    "snake_case",
    "€100",
    "😀",
    "中华人民共和国",
    "成立",
    "𠀋",
    "ＡＢＣ１",
    "한국어",
    "日本語のテキスト",
    "-",
    "'",
    "Ⅻ",
    "ǅ",
    "ʰ",
    "a",
    "ab",
    "",
];

fn cases() -> Vec<Value> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut out = Vec::new();
    for _ in 0..300 {
        let parts = next(12);
        let text: String = (0..parts)
            .map(|_| FRAGMENTS[next(FRAGMENTS.len())])
            .collect();
        out.push(json!({ "text": text }));
    }
    for _ in 0..40 {
        let n = next(8);
        let feats: Vec<&str> = (0..n).map(|_| FRAGMENTS[next(FRAGMENTS.len())]).collect();
        out.push(json!({ "features": feats }));
    }
    for _ in 0..40 {
        let n = next(8);
        let pairs: Vec<Value> = (0..n)
            .map(|_| json!([FRAGMENTS[next(FRAGMENTS.len())], next(5) + 1]))
            .collect();
        out.push(json!({ "weighted": pairs }));
    }
    out
}

fn ours(h: &SimHasher, case: &Value) -> String {
    if let Some(t) = case["text"].as_str() {
        return h.fingerprint(t).to_string();
    }
    if let Some(fs) = case["features"].as_array() {
        return h
            .fingerprint_tokens(fs.iter().map(|f| f.as_str().unwrap()))
            .to_string();
    }
    let pairs = case["weighted"].as_array().unwrap();
    h.fingerprint_weighted(
        pairs
            .iter()
            .map(|p| (p[0].as_str().unwrap(), p[1].as_f64().unwrap())),
    )
    .unwrap()
    .to_string()
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn golden_path() -> PathBuf {
    dir().join("data/python_simhash_golden.jsonl")
}

/// Runs the Python reference on the cases, or None if there is no python3.
fn python(cases: &[Value]) -> Option<Vec<Value>> {
    let mut child = Command::new("python3")
        .arg(dir().join("suite/python_simhash_ref.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    let mut input = String::new();
    for c in cases {
        input.push_str(&c.to_string());
        input.push('\n');
    }
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the reference script failed");
    Some(
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
    )
}

#[test]
fn matches_the_python_reference_and_library() {
    let h = SimHasher::new(FingerprintConfig::python_simhash()).unwrap();
    let cases = cases();
    let Some(answers) = python(&cases) else {
        eprintln!("python3 not found: checked against the golden file only");
        return;
    };
    assert_eq!(answers.len(), cases.len());
    let mut library_checked = 0;
    for (case, answer) in cases.iter().zip(&answers) {
        let mine = ours(&h, case);
        assert_eq!(mine, answer["reference"].as_str().unwrap(), "case {case}");
        if let Some(lib) = answer["library"].as_str() {
            assert_eq!(mine, lib, "PyPI simhash disagrees on case {case}");
            library_checked += 1;
        }
    }
    eprintln!(
        "{} cases, {library_checked} also against PyPI simhash",
        cases.len()
    );
    if std::env::var_os("NEARDUP_WRITE_GOLDEN").is_some() {
        let mut f = std::fs::File::create(golden_path()).unwrap();
        for (case, answer) in cases.iter().zip(&answers) {
            writeln!(
                f,
                "{}",
                json!({"case": case, "simhash": answer["reference"]})
            )
            .unwrap();
        }
    }
}

#[test]
fn matches_the_golden_file() {
    let h = SimHasher::new(FingerprintConfig::python_simhash()).unwrap();
    let golden = std::fs::read_to_string(golden_path()).expect("golden file is committed");
    let mut n = 0;
    for line in golden.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            ours(&h, &row["case"]),
            row["simhash"].as_str().unwrap(),
            "{row}"
        );
        n += 1;
    }
    assert!(n >= 300, "golden file has only {n} cases");
}
