//! What the integration tests share: running the real `neardup` binary,
//! reading what it printed, the repository's sample files, and small files
//! written into a test's own temporary folder. Each test file takes it with
//! `mod util;` and uses what it needs.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// The binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_neardup"))
}

/// A file of the repository, by its path from the root.
pub fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// The shipped sample corpus (`examples/sample.jsonl`).
pub fn sample() -> PathBuf {
    repo_file("examples/sample.jsonl")
}

/// Runs the binary with `args` and waits for it.
pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("binary runs")
}

/// Runs the binary with `args`, `input` on its standard input.
pub fn run_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = bin()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `o`, after checking that the run succeeded (its standard error otherwise).
pub fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", stderr(&o));
    o
}

/// Every line of `s` as JSON.
pub fn json_lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Writes `bytes` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}
