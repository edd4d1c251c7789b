//! A batch run that fails leaves none of its outputs, and refuses a bad
//! output name before any work.

use std::path::Path;
use std::process::{Command, Output};

fn dedup(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_neardup"))
        .arg("dedup")
        .args(args)
        .output()
        .unwrap()
}

fn corpus(path: &Path) {
    let text = "the harbour master opened the gates at dawn and the boats went out";
    let lines: String = (0..20)
        .map(|i| {
            let t = if i % 2 == 0 {
                text.to_owned()
            } else {
                format!("{text} {i}")
            };
            format!("{{\"id\": \"d{i}\", \"text\": \"{t}\"}}\n")
        })
        .collect();
    std::fs::write(path, lines).unwrap();
}

/// --clusters is written, then --keep fails (its folder does not exist):
/// the run fails and leaves no --clusters behind, and a --clusters file that
/// was there before is left as it was.
#[test]
fn a_failed_run_leaves_none_of_its_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    corpus(&input);
    let clusters = dir.path().join("clusters.jsonl");
    let keep = dir.path().join("missing").join("kept.jsonl");
    let out = dedup(&[
        input.to_str().unwrap(),
        "--clusters",
        clusters.to_str().unwrap(),
        "--keep",
        keep.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("kept.jsonl"), "the error names no path: {err}");
    assert!(!clusters.exists(), "the failed run left --clusters: {err}");
    std::fs::write(&clusters, "before\n").unwrap();
    let out = dedup(&[
        input.to_str().unwrap(),
        "--clusters",
        clusters.to_str().unwrap(),
        "--keep",
        keep.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert_eq!(std::fs::read_to_string(&clusters).unwrap(), "before\n");
    // No temporary file is left beside the outputs.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // The same run with a good --keep writes both.
    let keep = dir.path().join("kept.jsonl");
    let out = dedup(&[
        input.to_str().unwrap(),
        "--clusters",
        clusters.to_str().unwrap(),
        "--keep",
        keep.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(std::fs::read_to_string(&clusters).unwrap(), "before\n");
    assert!(std::fs::read_to_string(&keep).unwrap().lines().count() >= 1);
}

/// Parquet input with a --keep that does not name a Parquet file is refused
/// before any work: no --clusters written.
#[test]
fn a_bad_keep_name_is_refused_before_any_work() {
    use arrow_array::{RecordBatch, StringArray};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.parquet");
    let schema = Arc::new(arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("id", arrow_schema::DataType::Utf8, false),
        arrow_schema::Field::new("text", arrow_schema::DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from_iter_values(["a", "b"])),
            Arc::new(StringArray::from_iter_values([
                "one text about harbours and boats",
                "one text about harbours and boats",
            ])),
        ],
    )
    .unwrap();
    let file = std::fs::File::create(&input).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let clusters = dir.path().join("clusters.jsonl");
    let out = dedup(&[
        input.to_str().unwrap(),
        "--clusters",
        clusters.to_str().unwrap(),
        "--keep",
        dir.path().join("kept.jsonl").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("kept.parquet"), "{err}");
    assert!(
        !clusters.exists(),
        "--clusters was written before the refusal"
    );
    // No summary line: the refusal came before the work.
    assert!(!err.contains("documents ("), "{err}");
}

/// A full disk is reported with the file it happened to.
#[test]
fn a_full_disk_names_the_file() {
    if !Path::new("/dev/full").exists() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    corpus(&input);
    let out = dedup(&[input.to_str().unwrap(), "--clusters", "/dev/full"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("/dev/full"), "{err}");
}
