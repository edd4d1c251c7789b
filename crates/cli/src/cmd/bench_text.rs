//! The benchmarks' real text: English from the Rust book's HTML, Chinese
//! from Debian's documentation (or any folder given), cut into documents of
//! about 4 KB and written as JSON Lines.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use neardup_core::normalize::strip_html;

/// Where the benchmarks find text of `lang` (`en` or `zh`) when no folder is given.
pub(super) fn default_source(lang: &str) -> Result<PathBuf> {
    if lang == "en" {
        let out = std::process::Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()
            .context("cannot run `rustc --print sysroot` to find the Rust documentation; pass --source DIR")?;
        let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let book = Path::new(&sysroot).join("share/doc/rust/html/book");
        if book.is_dir() {
            return Ok(book);
        }
        bail!(
            "no Rust documentation at {}: install it with `rustup component add rust-docs`, or pass --source DIR",
            book.display()
        );
    }
    for candidate in [
        "/usr/share/doc/debian-reference-zh-cn",
        "/usr/share/doc/debian-edu-doc-zh-cn",
    ] {
        if Path::new(candidate).is_dir() {
            return Ok(PathBuf::from(candidate));
        }
    }
    bail!(
        "no Chinese text found: `apt-get install debian-reference-zh-cn debian-edu-doc-zh-cn`, or pass --source DIR"
    )
}

/// Documents of about 4 KB cut at paragraph boundaries from the HTML and text
/// files under `source`, repeated until `target` bytes.
pub(super) fn collect_docs(source: &Path, lang: &str, target: usize) -> Result<Vec<String>> {
    let mut files = Vec::new();
    collect_files(source, &mut files)?;
    files.sort();
    let mut paragraphs = Vec::new();
    let mut stripped = String::new();
    for f in files {
        let Ok(raw) = std::fs::read_to_string(&f) else {
            continue; // binary or not UTF-8
        };
        let text = if f.extension().is_some_and(|e| e == "html" || e == "htm") {
            strip_html(&raw, &mut stripped);
            stripped.as_str()
        } else {
            raw.as_str()
        };
        for p in text.split("\n\n").chain(text.split("  \n")) {
            let p = p.split_whitespace().collect::<Vec<_>>().join(" ");
            let useful = if lang == "zh" {
                p.chars()
                    .filter(|c| neardup_core::normalize::is_han(*c))
                    .count()
                    > 20
            } else {
                p.split(' ').count() > 8
            };
            if useful {
                paragraphs.push(p);
            }
        }
    }
    if paragraphs.is_empty() {
        bail!("no usable {lang} text under {}", source.display());
    }
    let mut docs = Vec::new();
    let mut total = 0;
    let mut doc = String::new();
    'outer: loop {
        for p in &paragraphs {
            doc.push_str(p);
            doc.push('\n');
            if doc.len() >= 4096 {
                total += doc.len();
                docs.push(std::mem::take(&mut doc));
                if total >= target {
                    break 'outer;
                }
            }
        }
    }
    Ok(docs)
}

pub(super) fn collect_files(path: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    if path.is_file() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    for entry in
        std::fs::read_dir(path).with_context(|| format!("cannot list {}", path.display()))?
    {
        let p = entry?.path();
        if p.is_dir() {
            collect_files(&p, out)?;
        } else if p
            .extension()
            .is_some_and(|e| e == "html" || e == "htm" || e == "txt" || e == "md")
        {
            out.push(p);
        }
    }
    Ok(())
}

pub(super) fn write_jsonl(path: &Path, docs: &[String]) -> Result<u64> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (i, d) in docs.iter().enumerate() {
        serde_json::to_writer(&mut out, &serde_json::json!({"id": i, "text": d}))?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(std::fs::metadata(path)?.len())
}
