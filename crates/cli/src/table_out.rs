//! `dedup`'s pairs and clusters as Parquet: typed columns written in row
//! groups of [`ROWS`], through an [`Output`] (atomic, or straight into a pipe).
//! Ids are Int64 when every id is an integer, else Utf8 (integers as their
//! decimal text).

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use arrow_array::builder::{Int64Builder, ListBuilder, StringBuilder};
use arrow_array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::fpfile::IdList;
use crate::output::Output;

/// Rows per row group.
const ROWS: usize = 1 << 16;

/// The format of a `--pairs` or `--clusters` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// JSON Lines, one object per pair or cluster.
    Jsonl,
    /// Parquet, one row per pair or cluster (zstd).
    Parquet,
}

impl Format {
    /// `flag` if given, else Parquet for a `.parquet` path, else JSON Lines.
    pub fn of(path: &Path, flag: Option<Format>) -> Format {
        flag.unwrap_or(if crate::parquet_io::is_parquet(path) {
            Format::Parquet
        } else {
            Format::Jsonl
        })
    }
}

fn id_type(ids: &IdList) -> DataType {
    match ids {
        IdList::Ints(_) => DataType::Int64,
        IdList::Any(_) => DataType::Utf8,
    }
}

/// A column of ids being filled.
enum IdColumn {
    Int(Vec<i64>),
    Str(Vec<String>),
}

impl IdColumn {
    fn new(ids: &IdList) -> Self {
        match ids {
            IdList::Ints(_) => IdColumn::Int(Vec::new()),
            IdList::Any(_) => IdColumn::Str(Vec::new()),
        }
    }

    fn push(&mut self, ids: &IdList, i: usize) {
        match (self, ids) {
            (IdColumn::Int(v), IdList::Ints(all)) => v.push(all[i]),
            (IdColumn::Str(v), ids) => v.push(ids.get(i).to_string()),
            (IdColumn::Int(_), IdList::Any(_)) => unreachable!("the column follows the ids"),
        }
    }

    fn take(&mut self) -> ArrayRef {
        match self {
            IdColumn::Int(v) => Arc::new(Int64Array::from(std::mem::take(v))),
            IdColumn::Str(v) => Arc::new(StringArray::from(std::mem::take(v))),
        }
    }
}

fn writer(path: &Path, schema: Arc<Schema>) -> Result<ArrowWriter<Output>> {
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    Ok(ArrowWriter::try_new(
        Output::create(Some(path))?,
        schema,
        Some(props),
    )?)
}

fn finish(w: ArrowWriter<Output>) -> Result<()> {
    Ok(w.into_inner()?.finish()?)
}

/// Pairs: columns `a`, `b` (ids), `distance` (uint32) and, when scored,
/// `score_field` (float64).
pub struct PairsWriter<'a> {
    ids: &'a IdList,
    schema: Arc<Schema>,
    writer: ArrowWriter<Output>,
    a: IdColumn,
    b: IdColumn,
    distance: Vec<u32>,
    score: Option<Vec<f64>>,
}

impl<'a> PairsWriter<'a> {
    pub fn create(path: &Path, ids: &'a IdList, score_field: Option<&str>) -> Result<Self> {
        let t = id_type(ids);
        let mut fields = vec![
            Field::new("a", t.clone(), false),
            Field::new("b", t, false),
            Field::new("distance", DataType::UInt32, false),
        ];
        if let Some(f) = score_field {
            fields.push(Field::new(f, DataType::Float64, false));
        }
        let schema = Arc::new(Schema::new(fields));
        Ok(PairsWriter {
            ids,
            writer: writer(path, schema.clone())?,
            schema,
            a: IdColumn::new(ids),
            b: IdColumn::new(ids),
            distance: Vec::new(),
            score: score_field.map(|_| Vec::new()),
        })
    }

    pub fn push(&mut self, a: usize, b: usize, distance: u32, score: Option<f64>) -> Result<()> {
        self.a.push(self.ids, a);
        self.b.push(self.ids, b);
        self.distance.push(distance);
        if let Some(s) = &mut self.score {
            s.push(score.unwrap_or(f64::NAN));
        }
        if self.distance.len() >= ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.distance.is_empty() {
            return Ok(());
        }
        let mut cols: Vec<ArrayRef> = vec![
            self.a.take(),
            self.b.take(),
            Arc::new(UInt32Array::from(std::mem::take(&mut self.distance))),
        ];
        if let Some(s) = &mut self.score {
            cols.push(Arc::new(Float64Array::from(std::mem::take(s))));
        }
        self.writer
            .write(&RecordBatch::try_new(self.schema.clone(), cols)?)?;
        Ok(())
    }

    pub fn finish(mut self) -> Result<()> {
        self.flush()?;
        finish(self.writer)
    }
}

/// Clusters: columns `representative` (id), `size` (uint64) and `members`
/// (a list of ids).
pub struct ClustersWriter<'a> {
    ids: &'a IdList,
    schema: Arc<Schema>,
    writer: ArrowWriter<Output>,
    rep: IdColumn,
    size: Vec<u64>,
    members: Members,
    rows: usize,
}

enum Members {
    Int(ListBuilder<Int64Builder>),
    Str(ListBuilder<StringBuilder>),
}

impl<'a> ClustersWriter<'a> {
    pub fn create(path: &Path, ids: &'a IdList) -> Result<Self> {
        let t = id_type(ids);
        let schema = Arc::new(Schema::new(vec![
            Field::new("representative", t.clone(), false),
            Field::new("size", DataType::UInt64, false),
            Field::new(
                "members",
                DataType::List(Arc::new(Field::new("item", t, true))),
                false,
            ),
        ]));
        Ok(ClustersWriter {
            ids,
            writer: writer(path, schema.clone())?,
            schema,
            rep: IdColumn::new(ids),
            size: Vec::new(),
            members: match ids {
                IdList::Ints(_) => Members::Int(ListBuilder::new(Int64Builder::new())),
                IdList::Any(_) => Members::Str(ListBuilder::new(StringBuilder::new())),
            },
            rows: 0,
        })
    }

    pub fn push(&mut self, rep: usize, members: &[u32]) -> Result<()> {
        self.rep.push(self.ids, rep);
        self.size.push(members.len() as u64);
        match (&mut self.members, self.ids) {
            (Members::Int(b), IdList::Ints(all)) => {
                for &m in members {
                    b.values().append_value(all[m as usize]);
                }
                b.append(true);
            }
            (Members::Str(b), ids) => {
                for &m in members {
                    b.values().append_value(ids.get(m as usize).to_string());
                }
                b.append(true);
            }
            (Members::Int(_), IdList::Any(_)) => unreachable!("the column follows the ids"),
        }
        self.rows += members.len() + 1;
        if self.rows >= ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.size.is_empty() {
            return Ok(());
        }
        let members: ArrayRef = match &mut self.members {
            Members::Int(b) => Arc::new(b.finish()),
            Members::Str(b) => Arc::new(b.finish()),
        };
        let cols: Vec<ArrayRef> = vec![
            self.rep.take(),
            Arc::new(UInt64Array::from(std::mem::take(&mut self.size))),
            members,
        ];
        self.writer
            .write(&RecordBatch::try_new(self.schema.clone(), cols)?)?;
        self.rows = 0;
        Ok(())
    }

    pub fn finish(mut self) -> Result<()> {
        self.flush()?;
        finish(self.writer)
    }
}
