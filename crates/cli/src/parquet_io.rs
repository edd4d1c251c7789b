//! Parquet corpora: documents from a text column (or a vector column: a list
//! of floats per row) and an id column, read in batches of rows (a row group is never held whole: the reader decodes page
//! by page), and kept or dropped rows written back with every column.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, BooleanArray, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::ArrowWriter;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use crate::output::Output;
use neardup_core::record::Id;

/// An input file: its path and its name in messages.
pub type Shard = (std::path::PathBuf, Arc<str>);

/// Rows per batch read.
const BATCH_ROWS: usize = 1024;

/// Is `path` named as a Parquet file?
pub fn is_parquet(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e == "parquet" || e == "pq")
}

/// One document of a Parquet file: its text (`None` for a null; a vector's
/// entries as little-endian float32, a null entry as NaN), its id (if the file
/// has the id column) and its 1-based row number.
pub struct Row {
    pub text: Option<Vec<u8>>,
    pub id: Option<Id>,
    pub row: u64,
}

/// The rows of one Parquet file, a batch at a time.
pub struct ParquetRows {
    name: Arc<str>,
    reader: ParquetRecordBatchReader,
    batch: Option<RecordBatch>,
    at: usize,
    rows: u64,
    /// The text's and the id's columns in the projected batches.
    text: usize,
    id: Option<usize>,
    /// The text column holds vectors.
    vectors: bool,
}

fn open_builder(path: &Path, name: &str) -> Result<ParquetRecordBatchReaderBuilder<File>> {
    let file = File::open(path).with_context(|| format!("cannot open {name}"))?;
    ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| {
        anyhow!(
            "{name}: not a readable Parquet file ({e}); it is damaged or truncated: \
             rewrite or re-download it"
        )
    })
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// A list (fixed-size or not) of float32 or float64 entries.
fn is_vector(t: &DataType) -> bool {
    match t {
        DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f) => {
            matches!(f.data_type(), DataType::Float32 | DataType::Float64)
        }
        _ => false,
    }
}

fn is_integer(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt32
            | DataType::UInt64
    )
}

impl ParquetRows {
    /// Opens `path`, reading only the `text_field` and `id_field` columns
    /// (the id is optional: without it rows are numbered); with `vectors`,
    /// `text_field` names a column of float lists.
    pub fn open(
        path: &Path,
        name: Arc<str>,
        text_field: &str,
        id_field: &str,
        vectors: bool,
    ) -> Result<Self> {
        let builder = open_builder(path, &name)?;
        let schema = Arc::clone(builder.schema());
        let columns = || {
            schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let flag = if vectors {
            "--vector-field"
        } else {
            "--text-field"
        };
        let text = schema.index_of(text_field).map_err(|_| {
            anyhow!(
                "{name}: no column {text_field:?} (the columns are: {}); name the {} \
                 column with {flag}",
                columns(),
                if vectors { "vector" } else { "text" }
            )
        })?;
        let text_type = schema.field(text).data_type();
        if vectors && !is_vector(text_type) {
            bail!(
                "{name}: the vector column {text_field:?} holds {text_type}, not lists of \
                 float32 or float64; name a vector column with --vector-field"
            );
        }
        if !vectors && !is_text(text_type) {
            bail!(
                "{name}: the text column {text_field:?} holds {text_type}, not strings; \
                 name a string column with --text-field"
            );
        }
        let id = schema.index_of(id_field).ok();
        if let Some(i) = id {
            let t = schema.field(i).data_type();
            if !is_text(t) && !is_integer(t) {
                bail!(
                    "{name}: the id column {id_field:?} holds {t}; ids must be strings or \
                     integers: name another column with --id-field"
                );
            }
        }
        let mut roots: Vec<usize> = [Some(text), id].into_iter().flatten().collect();
        roots.sort_unstable();
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
        let position = |col: usize| roots.iter().position(|&r| r == col).expect("projected");
        let reader = builder
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|e| anyhow!("{name}: cannot read ({e})"))?;
        Ok(ParquetRows {
            text: position(text),
            id: id.map(position),
            vectors,
            name,
            reader,
            batch: None,
            at: 0,
            rows: 0,
        })
    }

    /// The next row, or `None` at the end of the file.
    pub fn next_row(&mut self) -> Result<Option<Row>> {
        loop {
            if let Some(b) = &self.batch
                && self.at < b.num_rows()
            {
                break;
            }
            match self.reader.next() {
                None => return Ok(None),
                Some(Ok(b)) => {
                    self.batch = Some(b);
                    self.at = 0;
                }
                Some(Err(e)) => bail!(
                    "{}: cannot read the rows after row {} ({e}); the file is damaged or \
                     truncated: rewrite or re-download it",
                    self.name,
                    self.rows
                ),
            }
        }
        let b = self.batch.as_ref().expect("a batch");
        let i = self.at;
        self.at += 1;
        self.rows += 1;
        let col = b.column(self.text).as_ref();
        let text = if self.vectors {
            vector_at(col, i)
        } else {
            string_at(col, i).map(|s| s.as_bytes().to_vec())
        };
        let id = self.id.and_then(|c| id_at(b.column(c).as_ref(), i));
        Ok(Some(Row {
            text,
            id,
            row: self.rows,
        }))
    }
}

fn string_at(col: &dyn Array, i: usize) -> Option<&str> {
    if col.is_null(i) {
        return None;
    }
    Some(match col.data_type() {
        DataType::Utf8 => col.as_string::<i32>().value(i),
        DataType::LargeUtf8 => col.as_string::<i64>().value(i),
        DataType::Utf8View => col.as_string_view().value(i),
        _ => unreachable!("checked when the file was opened"),
    })
}

/// Row `i` of a vector column as little-endian float32 bytes (a null entry
/// becomes NaN, which the reader refuses with the row's place).
fn vector_at(col: &dyn Array, i: usize) -> Option<Vec<u8>> {
    if col.is_null(i) {
        return None;
    }
    let entries = match col.data_type() {
        DataType::FixedSizeList(..) => col.as_fixed_size_list().value(i),
        DataType::List(_) => col.as_list::<i32>().value(i),
        DataType::LargeList(_) => col.as_list::<i64>().value(i),
        _ => unreachable!("checked when the file was opened"),
    };
    let mut out = Vec::with_capacity(entries.len() * 4);
    let mut push = |v: Option<f32>| out.extend_from_slice(&v.unwrap_or(f32::NAN).to_le_bytes());
    match entries.data_type() {
        DataType::Float32 => entries
            .as_primitive::<Float32Type>()
            .iter()
            .for_each(&mut push),
        DataType::Float64 => entries
            .as_primitive::<Float64Type>()
            .iter()
            .for_each(|v| push(v.map(|v| v as f32))),
        _ => unreachable!("checked when the file was opened"),
    }
    Some(out)
}

fn id_at(col: &dyn Array, i: usize) -> Option<Id> {
    if col.is_null(i) {
        return None;
    }
    Some(match col.data_type() {
        DataType::Int8 => Id::Int(col.as_primitive::<Int8Type>().value(i).into()),
        DataType::Int16 => Id::Int(col.as_primitive::<Int16Type>().value(i).into()),
        DataType::Int32 => Id::Int(col.as_primitive::<Int32Type>().value(i).into()),
        DataType::Int64 => Id::Int(col.as_primitive::<Int64Type>().value(i)),
        DataType::UInt32 => Id::Int(col.as_primitive::<UInt32Type>().value(i).into()),
        DataType::UInt64 => {
            let v = col.as_primitive::<UInt64Type>().value(i);
            i64::try_from(v).map_or_else(|_| Id::Str(v.to_string()), Id::Int)
        }
        _ => Id::Str(string_at(col, i)?.to_owned()),
    })
}

/// Writes the rows of `files` (Parquet, in input order) that `keep(doc)`
/// selects to `keep_out`, the others to `drop_out`, with every column
/// unchanged. Documents are numbered from `first` over the rows whose text
/// (or vector) in `text_field` is not null (rows skipped as invalid go to
/// neither output).
pub fn split_rows(
    files: &[Shard],
    text_field: &str,
    first: usize,
    keep: impl Fn(usize) -> bool,
    keep_out: Option<&Path>,
    drop_out: Option<&Path>,
) -> Result<usize> {
    let mut writers: [Option<(ArrowWriter<Output>, &Path)>; 2] = [None, None];
    let mut schema = None;
    let mut doc = first;
    for (path, name) in files {
        let reader = open_builder(path, name)?
            .with_batch_size(BATCH_ROWS * 8)
            .build()
            .map_err(|e| anyhow!("{name}: cannot read ({e})"))?;
        for batch in reader {
            let batch = batch.map_err(|e| anyhow!("{name}: cannot read the rows again ({e})"))?;
            let text = batch
                .schema()
                .index_of(text_field)
                .map_err(|_| anyhow!("{name}: the column {text_field:?} disappeared"))?;
            let texts = batch.column(text);
            let mut kept = Vec::with_capacity(batch.num_rows());
            let mut dropped = Vec::with_capacity(batch.num_rows());
            for i in 0..batch.num_rows() {
                let valid = !texts.is_null(i);
                let k = valid && keep(doc);
                kept.push(k);
                dropped.push(valid && !k);
                doc += usize::from(valid);
            }
            for (slot, (mask, out)) in writers
                .iter_mut()
                .zip([(kept, keep_out), (dropped, drop_out)])
            {
                let Some(out) = out else { continue };
                let rows =
                    arrow_select::filter::filter_record_batch(&batch, &BooleanArray::from(mask))?;
                if slot.is_none() {
                    let writer =
                        ArrowWriter::try_new(Output::create(Some(out))?, batch.schema(), None)?;
                    *slot = Some((writer, out));
                }
                let (writer, out) = slot.as_mut().expect("created");
                let out: &Path = out;
                let first_schema = schema.get_or_insert_with(|| rows.schema());
                if rows.schema() != *first_schema {
                    bail!(
                        "{name}: its columns differ from the first Parquet input's, so its rows \
                         cannot go into one {} file: give shards of one schema",
                        out.display()
                    );
                }
                writer.write(&rows)?;
            }
        }
    }
    for (writer, _) in writers.into_iter().flatten() {
        writer.into_inner()?.finish()?;
    }
    Ok(doc - first)
}
