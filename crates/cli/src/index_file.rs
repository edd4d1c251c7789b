//! An index file as the commands open it: core's [`Bundle`] (memory-mapped
//! tables, ids, configuration) and the file itself, with the conversions
//! between the command line's ids and the index's.

use std::path::Path;

use anyhow::{Context, Result};
use neardup_core::FingerprintConfig;
use neardup_core::index::{Bundle, IdRef, IdTable, IndexFile, bundle};

use crate::fpfile::IdList;
use neardup_core::record::Id;

/// An opened index file: its tables, ids and configuration (core's
/// [`Bundle`]), and the file itself for its checks and facts.
pub struct Opened {
    pub file: IndexFile,
    pub bundle: Bundle,
}

/// Conversions between the command line's ids and an index file's.
pub trait IdTableExt {
    fn from_list(list: &IdList) -> IdTable;
    fn get_id(&self, entry: u64) -> Option<Id>;
    fn push_id(&mut self, id: Id);
}

impl IdTableExt for IdTable {
    fn from_list(list: &IdList) -> IdTable {
        match list {
            IdList::Ints(v) => IdTable::Ints(v.clone()),
            IdList::Any(v) => {
                let mut t = IdTable::default();
                v.iter().cloned().for_each(|id| t.push_id(id));
                t
            }
        }
    }

    fn get_id(&self, entry: u64) -> Option<Id> {
        match self.get(entry)? {
            IdRef::Int(n) => Some(Id::Int(n)),
            IdRef::Json(b) => serde_json::from_slice(b).ok(),
        }
    }

    fn push_id(&mut self, id: Id) {
        match id {
            Id::Int(n) => self.push_int(n),
            id => {
                let mut b = Vec::new();
                id.write_json(&mut b);
                self.push_json(&b);
            }
        }
    }
}

/// Opens (memory-maps) an index file.
pub fn open(path: &Path) -> Result<Opened> {
    let file =
        bundle::map_file(path).with_context(|| format!("cannot open index {}", path.display()))?;
    let bundle = Bundle::of_file(&file).with_context(|| format!("{}", path.display()))?;
    Ok(Opened { file, bundle })
}

impl Opened {
    pub fn id(&self, entry: u64) -> Option<Id> {
        self.bundle.ids.get_id(entry)
    }

    /// The largest distance the tables find.
    pub fn k(&self) -> u32 {
        self.bundle.index.design().k
    }

    pub fn config(&self) -> Option<&FingerprintConfig> {
        self.bundle.config.as_ref()
    }
}
