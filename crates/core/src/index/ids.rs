//! Document ids of an index file: entry ids are positions in this table. All
//! integers: an array of i64; otherwise each id's JSON text (so integers stay
//! integers among strings), one after another with their offsets.

use super::file::IndexFile;
use crate::error::Error;

/// The ids of an index's entries, as stored in its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdTable {
    Ints(Vec<i64>),
    Json { offsets: Vec<u64>, bytes: Vec<u8> },
}

/// One id: an integer, or the JSON text of any other value (a string).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdRef<'a> {
    Int(i64),
    Json(&'a [u8]),
}

impl Default for IdTable {
    fn default() -> Self {
        IdTable::Ints(Vec::new())
    }
}

impl IdTable {
    pub fn len(&self) -> usize {
        match self {
            IdTable::Ints(v) => v.len(),
            IdTable::Json { offsets, .. } => offsets.len() - 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The id of entry `i`.
    pub fn get(&self, i: u64) -> Option<IdRef<'_>> {
        let i = usize::try_from(i).ok()?;
        match self {
            IdTable::Ints(v) => v.get(i).map(|&n| IdRef::Int(n)),
            IdTable::Json { offsets, bytes } => {
                let (s, e) = (*offsets.get(i)? as usize, *offsets.get(i + 1)? as usize);
                bytes.get(s..e).map(IdRef::Json)
            }
        }
    }

    pub fn push_int(&mut self, n: i64) {
        match self {
            IdTable::Ints(v) => v.push(n),
            IdTable::Json { .. } => self.push_json(n.to_string().as_bytes()),
        }
    }

    /// Appends an id given as JSON text (a string, or any value but an integer).
    pub fn push_json(&mut self, json: &[u8]) {
        if let IdTable::Ints(v) = self {
            let mut offsets = vec![0u64];
            let mut bytes = Vec::new();
            for n in std::mem::take(v) {
                bytes.extend_from_slice(n.to_string().as_bytes());
                offsets.push(bytes.len() as u64);
            }
            *self = IdTable::Json { offsets, bytes };
        }
        let IdTable::Json { offsets, bytes } = self else {
            unreachable!("converted above")
        };
        bytes.extend_from_slice(json);
        offsets.push(bytes.len() as u64);
    }

    /// The file sections holding the table, and the kind named in the
    /// metadata's `"ids"`.
    pub fn sections(&self) -> (&'static str, Vec<(&'static str, Vec<u8>)>) {
        match self {
            IdTable::Ints(v) => ("int", vec![("doc_ids", bytemuck::cast_slice(v).to_vec())]),
            IdTable::Json { offsets, bytes } => (
                "json",
                vec![
                    ("doc_ids.offsets", bytemuck::cast_slice(offsets).to_vec()),
                    ("doc_ids.bytes", bytes.clone()),
                ],
            ),
        }
    }

    /// Reads the table of an index file (its metadata names the kind).
    pub fn read(file: &IndexFile) -> Result<IdTable, Error> {
        let bad = || {
            Error::CorruptIndex("the document id table is damaged; rebuild the index".to_owned())
        };
        let kind = file
            .extra()
            .get("ids")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        Ok(match kind {
            "int" => {
                let b = file.section("doc_ids").ok_or_else(bad)?;
                IdTable::Ints(
                    b.chunks_exact(8)
                        .map(|c| i64::from_le_bytes(c.try_into().expect("8")))
                        .collect(),
                )
            }
            "json" => {
                let o = file.section("doc_ids.offsets").ok_or_else(bad)?;
                let offsets: Vec<u64> = o
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
                    .collect();
                let bytes = file.section("doc_ids.bytes").ok_or_else(bad)?.to_vec();
                if offsets.first() != Some(&0)
                    || offsets.windows(2).any(|w| w[0] > w[1])
                    || offsets.last().is_some_and(|&l| l as usize != bytes.len())
                {
                    return Err(bad());
                }
                IdTable::Json { offsets, bytes }
            }
            _ => return Err(bad()),
        })
    }
}
