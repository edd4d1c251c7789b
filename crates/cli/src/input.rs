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
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, ValueEnum};
use neardup_core::centre::BitShares;
use neardup_core::jaccard::SetFeature;
use neardup_core::record;
use neardup_core::record::Id;
use neardup_core::{Fingerprint, FingerprintConfig, Input, InputKind, SimHasher};

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
    /// NumPy `.npy`: a C-ordered float32 or float64 array of shape (n, d), one
    /// dense vector per row; ids from --ids FILE or the row numbers from 0.
    Npy,
    /// Parquet: one document per row, text in the --text-field column (strings),
    /// id in the --id-field column (strings or integers; else the row number).
    Parquet,
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

    /// Documents are dense vectors (embeddings) in this JSON field, an array of
    /// numbers (`--vector-field` alone: the field "vector"). `.npy` inputs are
    /// read as vectors without it.
    #[arg(long, value_name = "NAME", num_args = 0..=1, default_missing_value = "vector",
          conflicts_with = "features_field")]
    pub vector_field: Option<String>,

    /// Documents are weighted features in this JSON field, an object of
    /// feature -> weight (`--features-field` alone: the field "features").
    #[arg(long, value_name = "NAME", num_args = 0..=1, default_missing_value = "features")]
    pub features_field: Option<String>,

    /// For `.npy` inputs: the rows' ids, one per line, in row order (all `.npy`
    /// inputs together); without it, the row number from 0 is the id.
    #[arg(long, value_name = "FILE")]
    pub ids: Option<PathBuf>,

    /// What each document is, as the configuration says (set by the command).
    #[arg(skip)]
    pub kind: InputKind,

    /// The dimension every vector must have, when the configuration fixes it.
    #[arg(skip)]
    pub dim: Option<usize>,
}

impl InputArgs {
    /// What the flags and inputs say the documents are, if they say.
    pub fn hint(&self) -> Option<InputKind> {
        let npy = self.format == Format::Npy
            || (self.format == Format::Auto && self.inputs.iter().any(|p| is_npy(p)));
        if self.vector_field.is_some() || npy {
            Some(InputKind::Vector)
        } else if self.features_field.is_some() {
            Some(InputKind::Features)
        } else {
            None
        }
    }

    /// Reads documents of `config`'s kind from now on.
    pub fn read_as(&mut self, config: &FingerprintConfig) {
        self.kind = config.input;
        self.dim = config.dim;
    }

    pub fn vector_field(&self) -> &str {
        self.vector_field.as_deref().unwrap_or("vector")
    }

    fn features_field(&self) -> &str {
        self.features_field.as_deref().unwrap_or("features")
    }

    /// The JSON field that holds each document's body.
    fn body_field(&self) -> &str {
        match self.kind {
            InputKind::Text => &self.text_field,
            InputKind::Vector => self.vector_field(),
            InputKind::Features => self.features_field(),
        }
    }
}

fn is_npy(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "npy")
}

/// What a document holds.
#[derive(Debug, Clone)]
pub enum Body {
    Text(String),
    Vector(Vec<f32>),
    Features(Vec<(String, f64)>),
}

/// One document.
#[derive(Debug)]
pub struct Doc {
    pub id: Id,
    pub body: Body,
    /// The input record, unchanged (kept only when asked, for --keep/--drop).
    pub raw: Option<Vec<u8>>,
    /// Where it is, as `file:line` (`file:row` for arrays).
    pub place: Place,
}

/// Where a document is: its source and 1-based line (or 0-based array row).
#[derive(Debug, Clone)]
pub struct Place {
    source: Arc<str>,
    line: u64,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source, self.line)
    }
}

impl Doc {
    /// The text; empty for vectors and features (commands that need text
    /// refuse those inputs first).
    pub fn text(&self) -> &str {
        match &self.body {
            Body::Text(t) => t,
            _ => "",
        }
    }

    /// The document as the core fingerprints it.
    pub fn input(&self) -> Input<'_> {
        match &self.body {
            Body::Text(t) => Input::Text(t),
            Body::Vector(v) => Input::Vector(v),
            Body::Features(f) => Input::Features(f),
        }
    }

    /// Its fingerprint. The checks that could refuse it (finite entries, not
    /// all zeros, the configured dimension, the kind) were made when it was read.
    pub fn fingerprint(&self, hasher: &SimHasher) -> Fingerprint {
        hasher
            .fingerprint_input(self.input())
            .expect("checked when the record was parsed")
    }

    /// Its fingerprint and, into `set`, its verification features
    /// ([`SimHasher::fingerprint_and_set`]); documents other than text
    /// have none.
    pub fn fingerprint_and_set(
        &self,
        hasher: &SimHasher,
        set: &mut Vec<SetFeature>,
    ) -> Fingerprint {
        match &self.body {
            Body::Text(t) => hasher.fingerprint_and_set(t, set),
            _ => {
                set.clear();
                self.fingerprint(hasher)
            }
        }
    }

    /// Where each bit of its fingerprint leans and, into `set`, its
    /// verification features ([`SimHasher::shares_and_set`]), for
    /// fingerprints centred on the corpus. Only texts are centred.
    pub fn shares_and_set(&self, hasher: &SimHasher, set: &mut Vec<SetFeature>) -> BitShares {
        let Body::Text(t) = &self.body else {
            unreachable!("only texts' fingerprints are centred")
        };
        hasher.shares_and_set(t, set)
    }

    /// The vector's dimension, for vectors.
    pub fn dim(&self) -> Option<usize> {
        match &self.body {
            Body::Vector(v) => Some(v.len()),
            _ => None,
        }
    }
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
    /// The first vector's dimension, which every other must have.
    pub dim: Option<usize>,
}

impl ReadStats {
    /// Counts one document (documents come in input order): refuses a vector
    /// whose dimension is not the first vector's.
    pub fn count(&mut self, doc: &Doc) -> Result<()> {
        self.documents += 1;
        match (doc.dim(), self.dim) {
            (Some(d), Some(first)) if d != first => bail!(
                "{}: the vector has {d} dimensions, but the first vector had {first}; \
                 every vector of a run must have the same dimension",
                doc.place
            ),
            (Some(d), None) => self.dim = Some(d),
            _ => {}
        }
        if matches!(&doc.body, Body::Text(t) if t.trim().is_empty()) {
            self.empty += 1;
        }
        Ok(())
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
    /// The id given beside the data (`--ids` for arrays).
    id: Option<Id>,
    /// For `.npy` rows: float64 entries (else float32).
    npy_f64: bool,
    /// For Parquet rows: the text is null.
    null: bool,
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
    /// The record's size in bytes, as read.
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// Where the record is, as `file:line`.
    pub fn place(&self) -> String {
        self.doc_place().to_string()
    }

    fn doc_place(&self) -> Place {
        Place {
            source: Arc::clone(&self.source),
            line: self.line,
        }
    }

    /// A row of floats (a `.npy` row; a Parquet vector, as float32 bytes) as
    /// a document, checked.
    fn vector_doc(
        &self,
        args: &InputArgs,
        id: Id,
        raw: Option<Vec<u8>>,
        place: Place,
    ) -> Result<Option<Doc>, RecordError> {
        let vector = crate::npy::decode_row(&self.bytes, self.npy_f64);
        check_vector(&vector, args.dim)
            .map_err(|e| RecordError::Invalid(format!("{place} (row {}): {e}", self.line)))?;
        Ok(Some(Doc {
            id,
            raw,
            body: Body::Vector(vector),
            place,
        }))
    }

    /// The bytes of this record, unparsed, if it is a document (as
    /// [`Record::parse`] keeps them): `None` for a blank line between JSON
    /// records. For a second read of an input whose records were all parsed
    /// once (of text sources only: [`DocReader::text_records_only`]).
    pub fn into_document_bytes(self) -> Option<Vec<u8>> {
        debug_assert!(matches!(
            self.format,
            Format::Text | Format::Lines | Format::Jsonl
        ));
        let blank = self.format == Format::Jsonl && self.bytes.iter().all(u8::is_ascii_whitespace);
        (!blank).then_some(self.bytes)
    }

    /// The document in this record; `None` for a blank line between JSON records.
    pub fn parse(self, args: &InputArgs, keep_raw: bool) -> Result<Option<Doc>, RecordError> {
        let name = &*self.source;
        let place = self.doc_place();
        let default_id = || {
            if self.qualified_id {
                Id::Str(format!("{name}:{}", self.line))
            } else {
                Id::Int(self.line as i64)
            }
        };
        match self.format {
            Format::Text | Format::Lines => {
                if args.kind != InputKind::Text {
                    return Err(RecordError::Fatal(anyhow!(
                        "{name}: {} are read from JSON Lines, .npy or Parquet files, \
                         not from plain text",
                        args.kind.plural()
                    )));
                }
                let line = (self.format == Format::Lines).then_some(self.line);
                let id = if line.is_some() {
                    default_id()
                } else {
                    Id::Str(name.to_owned())
                };
                let raw = keep_raw.then(|| self.bytes.clone());
                let text = decode(self.bytes, args.lossy, name, line, self.offset)
                    .map_err(RecordError::Fatal)?;
                Ok(Some(Doc {
                    id,
                    body: Body::Text(text),
                    raw,
                    place,
                }))
            }
            Format::Jsonl => {
                if self.bytes.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None); // blank lines between records are allowed
                }
                match parse_json_line(&self.bytes, args, args.lossy) {
                    Ok((body, id)) => Ok(Some(Doc {
                        id: id.unwrap_or_else(default_id),
                        body,
                        raw: keep_raw.then_some(self.bytes),
                        place,
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
            Format::Npy => {
                let raw = keep_raw.then(|| self.bytes.clone());
                let id = self.id.clone().unwrap_or_else(default_id);
                self.vector_doc(args, id, raw, place)
            }
            Format::Parquet if args.kind == InputKind::Vector => {
                if self.null {
                    return Err(RecordError::Invalid(format!(
                        "{place}: the vector (column {:?}) is null",
                        args.vector_field()
                    )));
                }
                let id = self.id.clone().unwrap_or_else(default_id);
                self.vector_doc(args, id, None, place)
            }
            Format::Parquet => {
                if args.kind != InputKind::Text {
                    return Err(RecordError::Fatal(anyhow!(
                        "{name}: {} are read from JSON Lines or .npy files; Parquet inputs \
                         hold texts or vectors",
                        args.kind.plural()
                    )));
                }
                if self.null {
                    return Err(RecordError::Invalid(format!(
                        "{place}: the text (column {:?}) is null",
                        args.text_field
                    )));
                }
                let id = self.id.clone().unwrap_or_else(default_id);
                let text = decode(self.bytes, args.lossy, name, Some(self.line), 0)
                    .map_err(RecordError::Fatal)?;
                Ok(Some(Doc {
                    id,
                    body: Body::Text(text),
                    raw: None,
                    place,
                }))
            }
            Format::Auto => unreachable!("resolved when the source is opened"),
        }
    }
}

/// A vector's entries are finite and not all zero, and it has the configured
/// dimension.
fn check_vector(v: &[f32], dim: Option<usize>) -> Result<(), String> {
    if let Some(d) = dim
        && v.len() != d
    {
        return Err(format!(
            "the vector has {} dimensions, but the configuration's vectors have {d}",
            v.len()
        ));
    }
    neardup_core::vector::check_vector(v).map_err(|e| e.to_string())
}

/// The input files in reading order (directories walked in name order) with
/// their formats; fails early if an input does not exist.
fn sources(args: &InputArgs) -> Result<Vec<Source>> {
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
                format: match resolve_format(format, &p) {
                    // A folder's `.json` files may be ordinary JSON documents
                    // (a configuration, an API schema): one text each, unless
                    // their first line is a JSON object, as in JSON Lines.
                    Format::Jsonl
                        if format == Format::Auto
                            && p.extension().is_some_and(|e| e == "json")
                            && !first_line_is_object(&p) =>
                    {
                        Format::Text
                    }
                    f => f,
                },
                path: Some(p),
            }));
        } else {
            sources.push(Source {
                format: resolve_format(format, input),
                path: Some(input.clone()),
            });
        }
    }
    Ok(sources)
}

/// Each input file (`None`: standard input) and its format, in the order
/// [`DocReader`] reads them.
pub(crate) fn source_paths(args: &InputArgs) -> Result<Vec<(Option<PathBuf>, Format)>> {
    Ok(sources(args)?
        .into_iter()
        .map(|s| (s.path, s.format))
        .collect())
}

/// Whether a file starting with `head` (its first 4 bytes, or all of a
/// shorter file) is read through a decompressor.
pub(crate) fn is_compressed(head: &[u8]) -> bool {
    Compression::sniff(head) != Compression::None
}

/// The Parquet inputs (path and name), when every input is Parquet; `None`
/// when none is; an error when some are.
pub fn parquet_files(args: &InputArgs) -> Result<Option<Vec<crate::parquet_io::Shard>>> {
    let sources = sources(args)?;
    let parquet = sources
        .iter()
        .filter(|s| s.format == Format::Parquet)
        .count();
    if parquet == 0 {
        return Ok(None);
    }
    if parquet < sources.len() {
        bail!(
            "--keep and --drop copy records in their own format, and the inputs mix Parquet \
             with other formats: deduplicate shards of one format"
        );
    }
    Ok(Some(
        sources
            .into_iter()
            .map(|s| {
                let name: Arc<str> = s.name().into();
                (s.path.expect("a Parquet file has a path"), name)
            })
            .collect(),
    ))
}

/// Splits the inputs into records, in batches.
pub struct DocReader {
    sources: std::vec::IntoIter<Source>,
    current: Option<Open>,
    multiple: bool,
    /// Bytes read so far.
    pub bytes: u64,
    /// Called with the number of bytes consumed, for progress bars.
    progress: Progress,
    /// `--ids`: the ids of `.npy` rows, read in step with them.
    ids: Option<IdsFile>,
    /// The text (or vector) and id fields (columns of Parquet inputs), and
    /// whether the documents are vectors.
    fields: (String, String, bool),
}

struct Open {
    format: Format,
    name: Arc<str>,
    reader: Box<dyn BufRead + Send>,
    line: u64,
    offset: u64,
    done: bool,
    /// For `.npy`: the array's shape and type.
    npy: Option<crate::npy::Header>,
    /// Read through a decompressor: progress counts the compressed bytes.
    compressed: bool,
    /// For Parquet: the rows.
    parquet: Option<crate::parquet_io::ParquetRows>,
}

/// The `--ids` file: one id per line.
struct IdsFile {
    name: String,
    reader: BufReader<File>,
    line: u64,
}

impl IdsFile {
    fn next(&mut self) -> Result<Option<Id>> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .with_context(|| format!("cannot read {}", self.name))?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        let id = line.trim_end_matches(['\n', '\r']);
        if id.is_empty() {
            bail!(
                "{}:{}: an empty id; give one id per line",
                self.name,
                self.line
            );
        }
        Ok(Some(Id::Str(id.to_owned())))
    }
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
        let sources = sources(args)?;
        let ids = match &args.ids {
            Some(path) => Some(IdsFile {
                name: path.display().to_string(),
                reader: BufReader::new(
                    File::open(path)
                        .with_context(|| format!("cannot open the ids file {}", path.display()))?,
                ),
                line: 0,
            }),
            None => None,
        };
        if ids.is_some() && !sources.iter().any(|s| s.format == Format::Npy) {
            bail!("--ids names the rows of .npy inputs, and there is none");
        }
        Ok(DocReader {
            multiple: sources.len() > 1,
            sources: sources.into_iter(),
            current: None,
            bytes: 0,
            progress: Arc::new(|_| {}),
            ids,
            fields: (
                args.body_field().to_owned(),
                args.id_field.clone(),
                args.kind == InputKind::Vector,
            ),
        })
    }

    /// Whether every input is read line by line or whole as text (JSON
    /// Lines, lines, text files), so that [`Record::into_document_bytes`]
    /// tells its documents without parsing them.
    pub fn text_records_only(&self) -> bool {
        self.sources
            .as_slice()
            .iter()
            .all(|s| matches!(s.format, Format::Text | Format::Lines | Format::Jsonl))
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
    pub fn on_progress(&mut self, f: impl Fn(u64) + Send + Sync + 'static) {
        self.progress = Arc::new(f);
    }

    /// The next batch of records, or None at the end of all inputs.
    pub fn next_batch(&mut self) -> Result<Option<Vec<Record>>> {
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while batch.len() < BATCH_RECORDS && bytes < BATCH_BYTES {
            if self.current.as_ref().is_none_or(|c| c.done) {
                match self.sources.next() {
                    Some(source) => {
                        self.current = Some(open(source, &self.progress, &self.fields)?)
                    }
                    None => break,
                }
            }
            if let Some(record) = self.next_record()? {
                bytes += record.bytes.len() + 64;
                batch.push(record);
            }
        }
        if batch.is_empty()
            && let Some(ids) = &mut self.ids
            && ids.next()?.is_some()
        {
            bail!(
                "{}:{}: the ids file has more lines than the .npy inputs have rows",
                ids.name,
                ids.line
            );
        }
        Ok((!batch.is_empty()).then_some(batch))
    }

    /// The next row of an open Parquet file.
    fn next_parquet_row(&mut self) -> Result<Option<Record>> {
        let open = self.current.as_mut().expect("a source is open");
        let rows = open.parquet.as_mut().expect("a Parquet file");
        let Some(row) = rows.next_row()? else {
            open.done = true;
            (self.progress)(open.offset);
            return Ok(None);
        };
        let bytes = row.text.clone().unwrap_or_default();
        self.bytes += bytes.len() as u64;
        Ok(Some(Record {
            null: row.text.is_none(),
            bytes,
            format: Format::Parquet,
            source: Arc::clone(&open.name),
            line: row.row,
            offset: 0,
            qualified_id: self.multiple,
            id: row.id,
            npy_f64: false,
        }))
    }

    /// The next row of an open `.npy` array.
    fn next_row(&mut self) -> Result<Option<Record>> {
        let open = self.current.as_mut().expect("a source is open");
        let header = open.npy.expect("an array");
        if open.line == header.rows {
            open.done = true;
            let mut rest = [0u8; 1];
            if open.reader.read(&mut rest)? != 0 {
                bail!(
                    "{}: bytes after the last of the {} rows the header announces; \
                     the file is damaged",
                    open.name,
                    header.rows
                );
            }
            return Ok(None);
        }
        let mut bytes = vec![0u8; header.row_bytes()];
        open.reader.read_exact(&mut bytes).map_err(|_| {
            anyhow!(
                "{}: the file ends inside row {} of the {} its header announces; \
                 the file is truncated",
                open.name,
                open.line,
                header.rows
            )
        })?;
        let id = match &mut self.ids {
            Some(ids) => Some(ids.next()?.ok_or_else(|| {
                anyhow!(
                    "{}: the ids file has fewer lines than the .npy inputs have rows \
                     (none for row {} of {})",
                    ids.name,
                    open.line,
                    open.name
                )
            })?),
            None => None,
        };
        let offset = open.offset;
        open.offset += bytes.len() as u64;
        self.bytes += bytes.len() as u64;
        (self.progress)(bytes.len() as u64);
        let line = open.line;
        open.line += 1;
        Ok(Some(Record {
            bytes,
            format: Format::Npy,
            source: Arc::clone(&open.name),
            line,
            offset,
            qualified_id: self.multiple,
            id,
            npy_f64: header.f64,
            null: false,
        }))
    }

    fn next_record(&mut self) -> Result<Option<Record>> {
        if self.current.as_ref().is_some_and(|c| c.npy.is_some()) {
            return self.next_row();
        }
        if self.current.as_ref().is_some_and(|c| c.parquet.is_some()) {
            return self.next_parquet_row();
        }
        let open = self.current.as_mut().expect("a source is open");
        let mut bytes = Vec::new();
        let n = if open.format == Format::Text {
            open.done = true;
            open.reader.read_to_end(&mut bytes)
        } else {
            open.reader.read_until(b'\n', &mut bytes)
        }
        .map_err(|e| {
            if open.compressed {
                anyhow!(
                    "{}: the compressed data is damaged after line {} (uncompressed byte \
                     offset {}): {e}; the file is corrupt or truncated: recompress or \
                     re-download it",
                    open.name,
                    open.line,
                    open.offset + bytes.len() as u64
                )
            } else {
                anyhow!("cannot read {}: {e}", open.name)
            }
        })?;
        if n == 0 && open.format != Format::Text {
            open.done = true;
            return Ok(None);
        }
        let offset = open.offset;
        open.offset += n as u64;
        self.bytes += n as u64;
        if !open.compressed {
            (self.progress)(n as u64);
        }
        // A byte-order mark before the first line (editors on Windows write
        // one) is not part of the record.
        if offset == 0 && open.format != Format::Text && bytes.starts_with(BOM) {
            bytes.drain(..BOM.len());
        }
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
            id: None,
            npy_f64: false,
            null: false,
        }))
    }
}

/// The UTF-8 byte-order mark.
const BOM: &[u8] = b"\xef\xbb\xbf";

/// How an input file is compressed, known from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    fn sniff(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }

    /// The compression a file name announces (`.gz`, `.zst`).
    fn of_name(path: &Path) -> Compression {
        match path.extension().and_then(|e| e.to_str()) {
            Some("gz" | "gzip") => Compression::Gzip,
            Some("zst" | "zstd") => Compression::Zstd,
            _ => Compression::None,
        }
    }
}

/// Input bytes (as stored, in reading order, counted by [`FILE_BYTES_READ`])
/// whose pages may stay in the page cache ([`keep_read_pages`]).
static KEEP_READ_PAGES: AtomicU64 = AtomicU64::new(u64::MAX);

/// Bytes read from input files so far, as stored (compressed ones
/// compressed), by this process.
static FILE_BYTES_READ: AtomicU64 = AtomicU64::new(0);

/// Asks that input files give their pages back to the operating system's
/// page cache once read (`POSIX_FADV_DONTNEED`, 64 MB at a time) from
/// position `upto` of the input on (in bytes as stored, counted in reading
/// order as [`file_bytes_read`] counts them; `u64::MAX` keeps every page).
/// Stretches of the file being read that are already past `upto` go at the
/// next read; `upto` is only ever lowered while a file is read. For a
/// verified dedup whose input and spill are more than the cache holds: the
/// cache then keeps the spill, which verification reads at random, and as
/// much of the input as fits beside it, which the write phase reads again
/// in order.
pub fn keep_read_pages(upto: u64) {
    KEEP_READ_PAGES.store(upto, Ordering::Relaxed);
}

/// Bytes read from input files so far, as stored on disk.
pub fn file_bytes_read() -> u64 {
    FILE_BYTES_READ.load(Ordering::Relaxed)
}

/// A file whose pages are dropped from the page cache behind the reader,
/// `every` bytes at a time, beyond the input position `keep` says.
struct DropBehind {
    file: File,
    /// Where the file starts in the input's reading order.
    start: u64,
    read: u64,
    /// The stretch of the file given back so far, `[from, to)` (empty
    /// while `from == to`).
    dropped: (u64, u64),
    /// Bytes given back.
    given_back: u64,
    every: u64,
    keep: &'static AtomicU64,
}

impl DropBehind {
    fn new(file: File, start: u64, every: u64, keep: &'static AtomicU64) -> DropBehind {
        DropBehind {
            file,
            start,
            read: 0,
            dropped: (0, 0),
            given_back: 0,
            every,
            keep,
        }
    }
}

impl Read for DropBehind {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf)?;
        self.read += n as u64;
        FILE_BYTES_READ.fetch_add(n as u64, Ordering::Relaxed);
        let (from, to) = self.dropped;
        if self.read - to >= self.every {
            // The file's pages from here on may go: those read since the
            // stretch given back so far, and those before it if the point
            // was lowered since.
            let keep = self.keep.load(Ordering::Relaxed).saturating_sub(self.start);
            if keep < self.read {
                let parts = match from == to {
                    true => [(keep, self.read), (0, 0)],
                    false => [(keep, from), (to.max(keep), self.read)],
                };
                for (a, b) in parts.into_iter().filter(|(a, b)| a < b) {
                    advise(&self.file, a, b - a, libc::POSIX_FADV_DONTNEED);
                    self.given_back += b - a;
                }
                let start = if from == to { keep } else { keep.min(from) };
                self.dropped = (start, self.read);
            }
        }
        Ok(n)
    }
}

/// Advice to the kernel on how `file`'s bytes `[from, from + len)` (to its
/// end if `len` is 0) will be read. Only advice: reading goes on whatever
/// it returns.
pub(crate) fn advise(file: &File, from: u64, len: u64, advice: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: advice on an open descriptor's range; it reads no memory.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            from as libc::off_t,
            len as libc::off_t,
            advice,
        )
    };
}

/// Counts the bytes read from a compressed file, for the progress bar (which
/// measures the files' sizes on disk).
struct Counted<R> {
    inner: R,
    progress: Progress,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        (self.progress)(n as u64);
        Ok(n)
    }
}

/// Called with the number of input bytes consumed.
type Progress = Arc<dyn Fn(u64) + Send + Sync>;

fn open(source: Source, progress: &Progress, fields: &(String, String, bool)) -> Result<Open> {
    let name: Arc<str> = source.name().into();
    if source.format == Format::Parquet {
        let Some(path) = &source.path else {
            bail!("Parquet is not read from standard input: give the file's path");
        };
        let rows = crate::parquet_io::ParquetRows::open(
            path,
            Arc::clone(&name),
            &fields.0,
            &fields.1,
            fields.2,
        )?;
        return Ok(Open {
            format: Format::Parquet,
            name,
            reader: Box::new(io::empty()),
            line: 0,
            // Progress: the file's size, counted when it is done.
            offset: std::fs::metadata(path).map_or(0, |m| m.len()),
            done: false,
            npy: None,
            compressed: false,
            parquet: Some(rows),
        });
    }
    let raw: Box<dyn Read + Send> = match &source.path {
        None => Box::new(io::stdin()),
        Some(p) => {
            let file = File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
            Box::new(DropBehind::new(
                file,
                file_bytes_read(),
                64 << 20,
                &KEEP_READ_PAGES,
            ))
        }
    };
    let mut peek = BufReader::with_capacity(1 << 16, raw);
    let compression = Compression::sniff(
        peek.fill_buf()
            .with_context(|| format!("cannot read {name}"))?,
    );
    let mut reader: Box<dyn BufRead + Send> = match compression {
        Compression::None => Box::new(peek),
        Compression::Gzip => {
            let counted = Counted {
                inner: peek,
                progress: Arc::clone(progress),
            };
            Box::new(BufReader::with_capacity(
                1 << 16,
                flate2::bufread::MultiGzDecoder::new(BufReader::new(counted)),
            ))
        }
        Compression::Zstd => {
            let counted = Counted {
                inner: peek,
                progress: Arc::clone(progress),
            };
            Box::new(BufReader::with_capacity(
                1 << 16,
                zstd::stream::read::Decoder::with_buffer(BufReader::new(counted))
                    .with_context(|| format!("cannot read {name}: not a zstd stream"))?,
            ))
        }
    };
    let mut format = source.format;
    let mut npy = None;
    if format == Format::Npy {
        let header = crate::npy::read_header(&mut reader, &name)?;
        npy = Some(header);
    }
    if format == Format::Auto {
        // Standard input: JSON Lines if the first non-blank byte is `{`.
        let buf = reader.fill_buf()?;
        let buf = buf.strip_prefix(BOM).unwrap_or(buf);
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
        npy,
        compressed: compression != Compression::None,
        parquet: None,
    })
}

fn resolve_format(format: Format, path: &Path) -> Format {
    if format != Format::Auto {
        return format;
    }
    // `corpus.jsonl.gz` is read as `corpus.jsonl`.
    let path = match Compression::of_name(path) {
        Compression::None => path,
        _ => Path::new(path.file_stem().unwrap_or_default()),
    };
    match path.extension().and_then(|e| e.to_str()) {
        Some("jsonl" | "ndjson" | "json") => Format::Jsonl,
        Some("npy") => Format::Npy,
        Some("parquet" | "pq") => Format::Parquet,
        _ => Format::Text,
    }
}

/// Whether the file's first non-blank line (a byte-order mark skipped) is a
/// JSON object; reads at most 1 MiB.
fn first_line_is_object(path: &Path) -> bool {
    use std::io::{BufRead, Read};
    let Ok(f) = std::fs::File::open(path) else {
        return true; // the reader will name the error
    };
    let mut r = io::BufReader::new(f).take(1 << 20);
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => return true, // empty: nothing to misread
            Ok(_) => {
                let t = line.trim_start_matches('\u{feff}').trim();
                if !t.is_empty() {
                    return t.starts_with('{')
                        && serde_json::from_str::<serde_json::Value>(t)
                            .is_ok_and(|v| v.is_object());
                }
            }
            Err(_) => return true,
        }
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    let named = |e: io::Error, p: &Path| io::Error::new(e.kind(), format!("{}: {e}", p.display()));
    for entry in std::fs::read_dir(dir).map_err(|e| named(e, dir))? {
        let entry = entry.map_err(|e| named(e, dir))?;
        let path = entry.path();
        let ty = entry.file_type().map_err(|e| named(e, &path))?;
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
) -> Result<(Body, Option<Id>), LineError> {
    // simdutf8 validates non-ASCII text (Chinese) several times faster than std.
    let text: Cow<str> = match simdutf8::compat::from_utf8(line) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) if lossy => String::from_utf8_lossy(line),
        Err(e) => return Err(LineError::Utf8(e.valid_up_to())),
    };
    let fields = record::Fields {
        body: args.body_field(),
        kind: args.kind,
        id: &args.id_field,
        key: None,
    };
    let parsed = record::parse_record(&text, fields)
        .map_err(LineError::Invalid)?
        .ok_or_else(|| LineError::Invalid("a blank line is no record".to_owned()))?;
    let body = match parsed.body {
        record::Body::Text(t) => Body::Text(t.into_owned()),
        record::Body::Vector(v) => {
            check_vector(&v, args.dim).map_err(LineError::Invalid)?;
            Body::Vector(v)
        }
        record::Body::Features(f) => Body::Features(f),
    };
    Ok((body, parsed.id))
}

/// The input flags of a command line (without the program's name), for
/// tests.
#[cfg(test)]
pub(crate) fn parse_input_args<S: Into<std::ffi::OsString> + Clone>(
    args: impl IntoIterator<Item = S>,
) -> InputArgs {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        input: InputArgs,
    }
    let program = std::ffi::OsString::from("neardup");
    Cli::parse_from(std::iter::once(program).chain(args.into_iter().map(Into::into))).input
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::DropBehind;

    /// Dropping the pages behind the reader changes none of the bytes read,
    /// whatever the reads' sizes against the stretches dropped; nothing is
    /// given back while every page may stay, and once a position is set (and
    /// lowered), everything read past it (but the last stretch) once and
    /// nothing before it.
    #[test]
    fn dropping_pages_behind_the_reader_keeps_every_byte() {
        static KEEP: AtomicU64 = AtomicU64::new(u64::MAX);
        let mut rng = neardup_core::rng::SplitMix64(5);
        let bytes: Vec<u8> = (0..300_000).map(|_| rng.next() as u8).collect();
        let len = bytes.len() as u64;
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&bytes).unwrap();
        let start = 1_000_000u64;
        for (every, chunk) in [(4096u64, 1000usize), (10_000, 65_536), (1, 7)] {
            // Where the kept input ends: before the file, at its start, inside
            // it (before and after where the position is set), past its end.
            for upto in [10, start, start + 40_000, start + 200_000, start + len + 1] {
                let mut f = file.try_clone().unwrap();
                std::io::Seek::rewind(&mut f).unwrap();
                KEEP.store(u64::MAX, Ordering::Relaxed);
                let mut reader = DropBehind::new(f, start, every, &KEEP);
                let (mut got, mut buf) = (Vec::new(), vec![0u8; chunk]);
                loop {
                    // Lowered twice: a third of the way in, then half way.
                    if got.len() >= bytes.len() / 2 {
                        KEEP.store(upto, Ordering::Relaxed);
                    } else if got.len() >= bytes.len() / 3 {
                        KEEP.store(upto + 60_000, Ordering::Relaxed);
                    } else {
                        assert_eq!(reader.given_back, 0, "nothing given back while kept");
                    }
                    let n = reader.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                assert_eq!(got, bytes, "every {every}, reads of {chunk}");
                assert_eq!(reader.read, len);
                let kept = upto.saturating_sub(start).min(len);
                if kept == len {
                    assert_eq!(reader.given_back, 0, "every {every} upto {upto}");
                    continue;
                }
                // From the kept part's end on, all but the last stretch, each
                // byte once.
                let (from, to) = reader.dropped;
                assert_eq!(from, kept, "every {every} upto {upto}");
                assert!(to > kept, "every {every} upto {upto}");
                assert_eq!(reader.given_back, to - kept, "every {every} upto {upto}");
                assert!(len - to < every, "every {every} upto {upto}");
            }
        }
    }
}
