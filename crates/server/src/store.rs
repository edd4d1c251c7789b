//! The durable store: one redb database file, the source of truth.
//!
//! Table `docs`: document id -> record (fingerprint, little-endian, 8 or 16
//! bytes; then the metadata as JSON text, possibly empty). Table `meta`: the
//! collection's settings, fixed at creation. Every write batch is one redb
//! transaction committed with immediate durability (fsync) before any of its
//! writes is acknowledged: after a crash the database holds every acknowledged
//! batch whole and nothing of a batch that was not committed.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

use neardup_core::sketch::Sketch;
use neardup_core::{FingerprintConfig, TableDesign};

use crate::error::ServiceError;

const DOCS: TableDefinition<&str, &[u8]> = TableDefinition::new("docs");
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
/// Document id -> verification sketch ([`Sketch`], 256 bytes), for documents
/// stored with their text (version 2 on).
const SKETCHES: TableDefinition<&str, &[u8]> = TableDefinition::new("sketches");

/// The store format this build writes: 2 keeps a verification sketch per
/// document stored by text. Version 1 stores (no sketches) open as they are:
/// their documents are matched by distance alone until stored again with their
/// text, which writes the sketch.
pub const STORE_VERSION: u32 = 2;
const SETTINGS_KEY: &str = "settings";

/// File name of the database inside the data folder.
pub const DB_FILE: &str = "neardup.redb";

/// What a collection is, fixed when it is created.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// How texts become fingerprints.
    pub config: FingerprintConfig,
    /// The largest k a request may ask for.
    pub max_k: u32,
    /// The table design of the in-memory index.
    pub design: TableDesign,
    /// Format version of the store.
    pub version: u32,
    /// The verification a request gets when it asks for none: keep a match
    /// when the estimated Jaccard similarity of the texts reaches this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<f64>,
}

/// One write of a batch.
#[derive(Debug)]
pub enum Write<'a> {
    Put {
        id: &'a str,
        fingerprint: &'a [u8],
        meta: Option<&'a [u8]>,
        /// The text's sketch; None (a fingerprint given) removes a stale one.
        sketch: Option<&'a Sketch>,
    },
    Delete {
        id: &'a str,
    },
}

/// A stored document.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub fingerprint: Vec<u8>,
    pub meta: Option<Vec<u8>>,
}

pub struct Store {
    db: Database,
    path: PathBuf,
    fp_bytes: usize,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

fn storage(e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Storage(e.to_string())
}

impl Store {
    /// Opens the collection in `dir`, or creates it there with `create()`'s
    /// settings when the folder holds none. Returns the store and its settings.
    pub fn open_or_create(
        dir: &Path,
        create: impl FnOnce() -> Result<Settings, ServiceError>,
    ) -> Result<(Store, Settings), ServiceError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            ServiceError::Storage(format!(
                "cannot create the data folder {}: {e}",
                dir.display()
            ))
        })?;
        let path = dir.join(DB_FILE);
        let exists = path.exists();
        let db = Database::create(&path).map_err(|e| {
            let text = e.to_string();
            let hint = if text.contains("lock") || text.contains("already open") {
                "is another neardup serve using this folder?"
            } else {
                "it is not a readable neardup collection: give an empty folder to create one"
            };
            ServiceError::Storage(format!("cannot open {}: {text} ({hint})", path.display()))
        })?;
        let settings = if exists {
            let tx = db.begin_read().map_err(storage)?;
            let table = tx.open_table(META).map_err(|e| {
                ServiceError::Storage(format!(
                    "{} is not a neardup collection ({e}): give an empty folder to create one",
                    path.display()
                ))
            })?;
            let text = table
                .get(SETTINGS_KEY)
                .map_err(storage)?
                .ok_or_else(|| {
                    ServiceError::Storage(format!("{} has no settings", path.display()))
                })?
                .value()
                .to_owned();
            let s: Settings = serde_json::from_str(&text).map_err(|e| {
                ServiceError::Storage(format!("{}: unreadable settings: {e}", path.display()))
            })?;
            s.config
                .validate()
                .map_err(|e| ServiceError::Storage(e.to_string()))?;
            if s.version > STORE_VERSION {
                return Err(ServiceError::Storage(format!(
                    "{} is a version {} collection, newer than this neardup reads ({}): \
                     upgrade neardup",
                    path.display(),
                    s.version,
                    STORE_VERSION
                )));
            }
            s
        } else {
            let s = create()?;
            let tx = db.begin_write().map_err(storage)?;
            {
                let mut table = tx.open_table(META).map_err(storage)?;
                let text = serde_json::to_string(&s).expect("settings serialise");
                table.insert(SETTINGS_KEY, text.as_str()).map_err(storage)?;
                tx.open_table(DOCS).map_err(storage)?;
                tx.open_table(SKETCHES).map_err(storage)?;
            }
            tx.commit().map_err(storage)?;
            s
        };
        let fp_bytes = settings.config.bits.bits() as usize / 8;
        Ok((Store { db, path, fp_bytes }, settings))
    }

    /// Commits `writes` as one durable transaction.
    pub fn commit(&self, writes: &[Write<'_>]) -> Result<(), ServiceError> {
        let tx = self.db.begin_write().map_err(storage)?;
        {
            let mut table = tx.open_table(DOCS).map_err(storage)?;
            let mut sketches = tx.open_table(SKETCHES).map_err(storage)?;
            let mut value = Vec::new();
            for w in writes {
                match w {
                    Write::Put {
                        id,
                        fingerprint,
                        meta,
                        sketch,
                    } => {
                        value.clear();
                        value.extend_from_slice(fingerprint);
                        value.extend_from_slice(meta.unwrap_or_default());
                        table.insert(*id, value.as_slice()).map_err(storage)?;
                        match sketch {
                            Some(s) => sketches.insert(*id, s.0.as_slice()).map(drop),
                            None => sketches.remove(*id).map(drop),
                        }
                        .map_err(storage)?;
                    }
                    Write::Delete { id } => {
                        table.remove(*id).map_err(storage)?;
                        sketches.remove(*id).map_err(storage)?;
                    }
                }
            }
        }
        tx.commit().map_err(storage)
    }

    /// One document.
    pub fn get(&self, id: &str) -> Result<Option<Record>, ServiceError> {
        let tx = self.db.begin_read().map_err(storage)?;
        let table = tx.open_table(DOCS).map_err(storage)?;
        Ok(table
            .get(id)
            .map_err(storage)?
            .map(|v| self.record(v.value())))
    }

    /// Several documents' metadata, in one read transaction.
    pub fn metas(&self, ids: &[&str]) -> Result<Vec<Option<Vec<u8>>>, ServiceError> {
        let tx = self.db.begin_read().map_err(storage)?;
        let table = tx.open_table(DOCS).map_err(storage)?;
        ids.iter()
            .map(|id| {
                Ok(table
                    .get(*id)
                    .map_err(storage)?
                    .and_then(|v| self.record(v.value()).meta))
            })
            .collect()
    }

    /// Several documents' verification sketches, in one read transaction:
    /// None for a document stored without its text (or before sketches were
    /// kept). A sketch of the wrong size is damage, refused.
    pub fn sketches(&self, ids: &[&str]) -> Result<Vec<Option<Sketch>>, ServiceError> {
        let tx = self.db.begin_read().map_err(storage)?;
        let table = match tx.open_table(SKETCHES) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(vec![None; ids.len()]),
            Err(e) => return Err(storage(e)),
        };
        ids.iter()
            .map(|id| match table.get(*id).map_err(storage)? {
                None => Ok(None),
                Some(v) => Sketch::from_bytes(v.value()).map(Some).ok_or_else(|| {
                    ServiceError::Storage(format!(
                        "{}: document {id:?} has a damaged sketch",
                        self.path.display()
                    ))
                }),
            })
            .collect()
    }

    fn record(&self, bytes: &[u8]) -> Record {
        let (fp, meta) = bytes.split_at(self.fp_bytes.min(bytes.len()));
        Record {
            fingerprint: fp.to_vec(),
            meta: (!meta.is_empty()).then(|| meta.to_vec()),
        }
    }

    /// Calls `f(id, fingerprint bytes)` for every document, in id order.
    pub fn for_each(&self, mut f: impl FnMut(&str, &[u8])) -> Result<(), ServiceError> {
        let tx = self.db.begin_read().map_err(storage)?;
        let table = tx.open_table(DOCS).map_err(storage)?;
        for entry in table.iter().map_err(storage)? {
            let (k, v) = entry.map_err(storage)?;
            let v = v.value();
            if v.len() < self.fp_bytes {
                return Err(ServiceError::Storage(format!(
                    "{}: document {:?} has a truncated record",
                    self.path.display(),
                    k.value()
                )));
            }
            f(k.value(), &v[..self.fp_bytes]);
        }
        Ok(())
    }

    /// Documents stored.
    pub fn document_count(&self) -> Result<u64, ServiceError> {
        let tx = self.db.begin_read().map_err(storage)?;
        let table = tx.open_table(DOCS).map_err(storage)?;
        table.len().map_err(storage)
    }

    /// Size of the database file in bytes.
    pub fn disk_bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }
}
