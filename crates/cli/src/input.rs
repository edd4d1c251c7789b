//! Reading documents: files, directories, standard input; whole files, lines, JSON Lines.
//!
//! Documents come in batches of bounded size, so memory stays flat on inputs far
//! larger than RAM. Every error names the file, the line (or byte offset) and the fix.

use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use clap::{Args, ValueEnum};
use serde::Deserializer;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};

/// How input files are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// By file name: .jsonl, .ndjson and .json are JSON Lines, anything else one
    /// document per file; standard input is JSON Lines if it starts with `{`.
    Auto,
    /// Each file (or standard input) is one document.
    Text,
    /// One document per line.
    Lines,
    /// JSON Lines: one object per line, text in --text-field, id in --id-field.
    Jsonl,
}

/// Where documents come from.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Input")]
pub struct InputArgs {
    /// Files or directories (read recursively, in name order); `-` or nothing
    /// reads standard input.
    #[arg(value_name = "INPUT")]
    pub inputs: Vec<PathBuf>,

    /// Input format.
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    pub format: Format,

    /// One document per line (same as --format lines).
    #[arg(long, conflicts_with = "format")]
    pub lines: bool,

    /// The JSON field holding the text.
    #[arg(long, value_name = "NAME", default_value = "text")]
    pub text_field: String,

    /// The JSON field holding the id (a string or an integer); without it, the
    /// line number is the id.
    #[arg(long, value_name = "NAME", default_value = "id")]
    pub id_field: String,

    /// Replace invalid UTF-8 with U+FFFD instead of stopping with an error.
    #[arg(long)]
    pub lossy: bool,

    /// Skip malformed JSON lines and lines without the text field, count them and
    /// report them at the end, instead of stopping at the first.
    #[arg(long)]
    pub skip_invalid: bool,
}

/// A document id: a string or an integer, written back as it came.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Id {
    Int(i64),
    Str(String),
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Int(n) => write!(f, "{n}"),
            Id::Str(s) => f.write_str(s),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Id, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Id;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an integer id")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Id, E> {
                Ok(Id::Int(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Id, E> {
                i64::try_from(v)
                    .map(Id::Int)
                    .map_err(|_| E::custom(format!("id {v} does not fit in 64 signed bits")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Id, E> {
                Ok(Id::Str(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Id, E> {
                Ok(Id::Str(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl Id {
    /// Writes the id as a JSON value.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Id::Int(n) => {
                use std::io::Write as _;
                write!(out, "{n}").expect("writing to a Vec");
            }
            Id::Str(s) => serde_json::to_writer(&mut *out, s).expect("writing to a Vec"),
        }
    }

    fn from_json(v: serde_json::Value) -> Result<Id, String> {
        match v {
            serde_json::Value::String(s) => Ok(Id::Str(s)),
            serde_json::Value::Number(n) => n
                .as_i64()
                .map(Id::Int)
                .ok_or_else(|| format!("id {n} is not an integer that fits in 64 bits")),
            other => Err(format!("id {other} is neither a string nor an integer")),
        }
    }
}

/// One document.
#[derive(Debug)]
pub struct Doc {
    pub id: Id,
    pub text: String,
    /// The input record, unchanged (kept only when asked, for --keep/--drop).
    pub raw: Option<Vec<u8>>,
}

/// Counts kept while reading.
#[derive(Debug, Default, Clone)]
pub struct ReadStats {
    pub documents: u64,
    pub bytes: u64,
    pub empty: u64,
    pub skipped: u64,
    /// The first few skipped lines, for the report.
    pub skipped_examples: Vec<String>,
}

impl ReadStats {
    /// Counts one document.
    pub fn count(&mut self, doc: &Doc) {
        self.documents += 1;
        if doc.text.trim().is_empty() {
            self.empty += 1;
        }
    }

    /// Counts one skipped record.
    pub fn skip(&mut self, what: String) {
        self.skipped += 1;
        if self.skipped_examples.len() < 5 {
            self.skipped_examples.push(what);
        }
    }
}

/// Records at most this large in total make one batch.
const BATCH_BYTES: usize = 4 << 20;
const BATCH_RECORDS: usize = 4096;

struct Source {
    /// None for standard input.
    path: Option<PathBuf>,
    format: Format,
}

impl Source {
    fn name(&self) -> String {
        self.path
            .as_ref()
            .map_or_else(|| "<stdin>".to_owned(), |p| p.display().to_string())
    }
}

/// One unparsed input record: a whole file, a line, or a JSON line. Decoding and
/// parsing happen in [`Record::parse`], on the worker threads.
#[derive(Debug)]
pub struct Record {
    bytes: Vec<u8>,
    format: Format,
    source: Arc<str>,
    /// 1-based line number (0 for a whole file).
    line: u64,
    /// Byte offset of the record in its source.
    offset: u64,
    /// Name the line as `file:line` (several inputs) rather than by its number.
    qualified_id: bool,
}

/// Why a record could not be read.
#[derive(Debug)]
pub enum RecordError {
    /// Stops the run (invalid UTF-8 without --lossy).
    Fatal(anyhow::Error),
    /// A malformed record: stops the run, or is skipped with --skip-invalid.
    Invalid(String),
}

impl Record {
    /// Where the record is, as `file:line`.
    pub fn place(&self) -> String {
        format!("{}:{}", self.source, self.line)
    }

    /// The document in this record; `None` for a blank line between JSON records.
    pub fn parse(self, args: &InputArgs, keep_raw: bool) -> Result<Option<Doc>, RecordError> {
        let name = &*self.source;
        let default_id = || {
            if self.qualified_id {
                Id::Str(format!("{name}:{}", self.line))
            } else {
                Id::Int(self.line as i64)
            }
        };
        match self.format {
            Format::Text | Format::Lines => {
                let line = (self.format == Format::Lines).then_some(self.line);
                let id = if line.is_some() {
                    default_id()
                } else {
                    Id::Str(name.to_owned())
                };
                let raw = keep_raw.then(|| self.bytes.clone());
                let text = decode(self.bytes, args.lossy, name, line, self.offset)
                    .map_err(RecordError::Fatal)?;
                Ok(Some(Doc { id, text, raw }))
            }
            Format::Jsonl => {
                if self.bytes.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None); // blank lines between records are allowed
                }
                match parse_json_line(&self.bytes, args, args.lossy) {
                    Ok((text, id)) => Ok(Some(Doc {
                        id: id.unwrap_or_else(default_id),
                        text,
                        raw: keep_raw.then_some(self.bytes),
                    })),
                    Err(LineError::Utf8(valid_up_to)) => Err(RecordError::Fatal(anyhow!(
                        "{name}: invalid UTF-8 at byte offset {} (line {}); \
                         fix the encoding or pass --lossy to replace invalid bytes",
                        self.offset + valid_up_to as u64,
                        self.line
                    ))),
                    Err(LineError::Invalid(msg)) => {
                        Err(RecordError::Invalid(format!("{}: {msg}", self.place())))
                    }
                }
            }
            Format::Auto => unreachable!("resolved when the source is opened"),
        }
    }
}

/// Splits the inputs into records, in batches.
pub struct DocReader {
    sources: std::vec::IntoIter<Source>,
    current: Option<Open>,
    multiple: bool,
    /// Bytes read so far.
    pub bytes: u64,
    /// Called with the number of bytes consumed, for progress bars.
    progress: Box<dyn Fn(u64) + Send>,
}

struct Open {
    format: Format,
    name: Arc<str>,
    reader: Box<dyn BufRead + Send>,
    line: u64,
    offset: u64,
    done: bool,
}

impl fmt::Debug for DocReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocReader")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl DocReader {
    /// A reader over `args.inputs`; fails early if an input does not exist.
    pub fn new(args: &InputArgs) -> Result<DocReader> {
        let format = if args.lines {
            Format::Lines
        } else {
            args.format
        };
        let mut sources = Vec::new();
        let inputs: Vec<PathBuf> = if args.inputs.is_empty() {
            vec![PathBuf::from("-")]
        } else {
            args.inputs.clone()
        };
        for input in &inputs {
            if input.as_os_str() == "-" {
                sources.push(Source { path: None, format });
                continue;
            }
            let meta = std::fs::metadata(input)
                .with_context(|| format!("cannot read input {}", input.display()))?;
            if meta.is_dir() {
                let mut files = Vec::new();
                walk(input, &mut files)
                    .with_context(|| format!("cannot list directory {}", input.display()))?;
                files.sort();
                sources.extend(files.into_iter().map(|p| Source {
                    format: resolve_format(format, &p),
                    path: Some(p),
                }));
            } else {
                sources.push(Source {
                    format: resolve_format(format, input),
                    path: Some(input.clone()),
                });
            }
        }
        Ok(DocReader {
            multiple: sources.len() > 1,
            sources: sources.into_iter(),
            current: None,
            bytes: 0,
            progress: Box::new(|_| {}),
        })
    }

    /// Total size of the input files, if known (for progress bars).
    pub fn total_bytes(args: &InputArgs) -> Option<u64> {
        let mut files = Vec::new();
        for input in &args.inputs {
            if input.as_os_str() == "-" {
                return None;
            }
            if input.is_dir() {
                walk(input, &mut files).ok()?;
            } else {
                files.push(input.clone());
            }
        }
        let mut total = 0;
        for f in files {
            total += std::fs::metadata(f).ok()?.len();
        }
        (!args.inputs.is_empty()).then_some(total)
    }

    /// Reports consumed bytes to `f`.
    pub fn on_progress(&mut self, f: impl Fn(u64) + Send + 'static) {
        self.progress = Box::new(f);
    }

    /// The next batch of records, or None at the end of all inputs.
    pub fn next_batch(&mut self) -> Result<Option<Vec<Record>>> {
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while batch.len() < BATCH_RECORDS && bytes < BATCH_BYTES {
            if self.current.as_ref().is_none_or(|c| c.done) {
                match self.sources.next() {
                    Some(source) => self.current = Some(open(source)?),
                    None => break,
                }
            }
            if let Some(record) = self.next_record()? {
                bytes += record.bytes.len() + 64;
                batch.push(record);
            }
        }
        Ok((!batch.is_empty()).then_some(batch))
    }

    fn next_record(&mut self) -> Result<Option<Record>> {
        let open = self.current.as_mut().expect("a source is open");
        let mut bytes = Vec::new();
        let n = if open.format == Format::Text {
            open.done = true;
            open.reader.read_to_end(&mut bytes)
        } else {
            open.reader.read_until(b'\n', &mut bytes)
        }
        .with_context(|| format!("cannot read {}", open.name))?;
        if n == 0 && open.format != Format::Text {
            open.done = true;
            return Ok(None);
        }
        let offset = open.offset;
        open.offset += n as u64;
        self.bytes += n as u64;
        (self.progress)(n as u64);
        if open.format != Format::Text {
            open.line += 1;
            if bytes.ends_with(b"\n") {
                bytes.pop();
                if bytes.ends_with(b"\r") {
                    bytes.pop();
                }
            }
        }
        Ok(Some(Record {
            bytes,
            format: open.format,
            source: Arc::clone(&open.name),
            line: open.line,
            offset,
            qualified_id: self.multiple,
        }))
    }
}

fn open(source: Source) -> Result<Open> {
    let name: Arc<str> = source.name().into();
    let mut reader: Box<dyn BufRead + Send> = match &source.path {
        None => Box::new(BufReader::with_capacity(1 << 16, io::stdin())),
        Some(p) => Box::new(BufReader::with_capacity(
            1 << 16,
            File::open(p).with_context(|| format!("cannot open {}", p.display()))?,
        )),
    };
    let mut format = source.format;
    if format == Format::Auto {
        // Standard input: JSON Lines if the first non-blank byte is `{`.
        let buf = reader.fill_buf()?;
        let first = buf.iter().find(|b| !b.is_ascii_whitespace());
        format = if first == Some(&b'{') {
            Format::Jsonl
        } else {
            Format::Text
        };
    }
    Ok(Open {
        format,
        name,
        reader,
        line: 0,
        offset: 0,
        done: false,
    })
}

fn resolve_format(format: Format, path: &Path) -> Format {
    if format != Format::Auto {
        return format;
    }
    match path.extension().and_then(|e| e.to_str()) {
        Some("jsonl" | "ndjson" | "json") => Format::Jsonl,
        _ => Format::Text,
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let ty = entry.file_type()?;
        if ty.is_dir() {
            walk(&path, out)?;
        } else if ty.is_file() || (ty.is_symlink() && path.is_file()) {
            out.push(path);
        }
    }
    Ok(())
}

/// UTF-8 decoding with an error that names the place and the fix.
fn decode(
    bytes: Vec<u8>,
    lossy: bool,
    name: &str,
    line: Option<u64>,
    offset: u64,
) -> Result<String> {
    match simdutf8::compat::from_utf8(&bytes) {
        // SAFETY: simdutf8 has just validated these bytes as UTF-8.
        Ok(_) => Ok(unsafe { String::from_utf8_unchecked(bytes) }),
        Err(_) if lossy => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(e) => {
            let at = offset + e.valid_up_to() as u64;
            let line = line.map(|l| format!(" (line {l})")).unwrap_or_default();
            Err(anyhow!(
                "{name}: invalid UTF-8 at byte offset {at}{line}; fix the encoding or pass \
                 --lossy to replace invalid bytes"
            ))
        }
    }
}

enum LineError {
    Utf8(usize),
    Invalid(String),
}

fn parse_json_line(
    line: &[u8],
    args: &InputArgs,
    lossy: bool,
) -> Result<(String, Option<Id>), LineError> {
    // simdutf8 validates non-ASCII text (Chinese) several times faster than std.
    let text: Cow<str> = match simdutf8::compat::from_utf8(line) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) if lossy => String::from_utf8_lossy(line),
        Err(e) => return Err(LineError::Utf8(e.valid_up_to())),
    };
    let seed = FieldsSeed {
        text_field: &args.text_field,
        id_field: &args.id_field,
    };
    let mut de = serde_json::Deserializer::from_str(&text);
    let (doc_text, id) = seed
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| LineError::Invalid(format!("malformed JSON line: {e}")))?;
    let doc_text = doc_text.ok_or_else(|| {
        LineError::Invalid(format!(
            "no {:?} field (choose the text field with --text-field)",
            args.text_field
        ))
    })?;
    let id = id
        .map(|v| Id::from_json(v).map_err(LineError::Invalid))
        .transpose()?;
    Ok((doc_text, id))
}

/// Pulls the text and id fields out of a JSON object, skipping the rest unparsed.
struct FieldsSeed<'f> {
    text_field: &'f str,
    id_field: &'f str,
}

impl<'de> DeserializeSeed<'de> for FieldsSeed<'_> {
    type Value = (Option<String>, Option<serde_json::Value>);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FieldsSeed<'_> {
    type Value = (Option<String>, Option<serde_json::Value>);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut text, mut id) = (None, None);
        let keys = KeySeed {
            text_field: self.text_field,
            id_field: self.id_field,
        };
        while let Some(key) = map.next_key_seed(keys)? {
            match key {
                Key::Text => text = Some(map.next_value::<String>()?),
                Key::Id => id = Some(map.next_value::<serde_json::Value>()?),
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((text, id))
    }
}

enum Key {
    Text,
    Id,
    Other,
}

/// Classifies an object key without allocating it.
#[derive(Clone, Copy)]
struct KeySeed<'f> {
    text_field: &'f str,
    id_field: &'f str,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Key;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Key, E> {
        Ok(if key == self.text_field {
            Key::Text
        } else if key == self.id_field {
            Key::Id
        } else {
            Key::Other
        })
    }
}
