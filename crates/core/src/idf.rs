//! Inverse document frequencies learned from a corpus (`neardup idf build`).
//!
//! File format (UTF-8 text, so it can be read and diffed):
//! ```text
//! # neardup-idf 1 {"documents":1000,"config":"<config digest>","default_idf":7.9}
//! <idf>\t<feature>
//! ...
//! ```
//! Features are sorted, so the same corpus always gives the same bytes.

use std::collections::HashMap;
use std::io::{self, BufRead, Write};

use serde::{Deserialize, Serialize};

use crate::error::Error;

const MAGIC: &str = "# neardup-idf";
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    documents: u64,
    config: String,
    default_idf: f64,
}

/// An IDF table: feature -> smoothed inverse document frequency
/// `ln((N + 1) / (df + 1)) + 1`. Features not in the table get the IDF of a
/// feature seen in no document, the largest there is: an unseen feature is rare.
#[derive(Clone, Debug)]
pub struct IdfTable {
    /// Keyed by the xxh3 of the feature's bytes.
    idf: HashMap<u64, f32>,
    documents: u64,
    config_digest: String,
    default_idf: f64,
    digest: String,
}

/// Counts document frequencies, then makes an [`IdfTable`].
#[derive(Debug, Default)]
pub struct IdfBuilder {
    df: HashMap<String, u64>,
    documents: u64,
}

impl IdfBuilder {
    /// A builder with no documents.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one document given as its distinct features.
    pub fn add_document<'a>(&mut self, distinct_features: impl IntoIterator<Item = &'a str>) {
        self.documents += 1;
        for f in distinct_features {
            match self.df.get_mut(f) {
                Some(n) => *n += 1,
                None => {
                    self.df.insert(f.to_owned(), 1);
                }
            }
        }
    }

    /// Merges another builder's counts (for parallel building).
    pub fn merge(&mut self, other: IdfBuilder) {
        self.documents += other.documents;
        for (f, n) in other.df {
            *self.df.entry(f).or_insert(0) += n;
        }
    }

    /// Documents seen so far.
    pub fn documents(&self) -> u64 {
        self.documents
    }

    /// Writes the table, keeping features seen in at least `min_df` documents.
    /// `config_digest` names the configuration whose features were counted.
    pub fn write<W: Write>(&self, min_df: u64, config_digest: &str, mut out: W) -> io::Result<()> {
        let n = self.documents as f64;
        let header = Header {
            documents: self.documents,
            config: config_digest.to_owned(),
            default_idf: idf_of(n, 0.0),
        };
        writeln!(
            out,
            "{MAGIC} {VERSION} {}",
            serde_json::to_string(&header).expect("header serialises")
        )?;
        let mut rows: Vec<(&str, u64)> = self
            .df
            .iter()
            .filter(|&(_, &df)| df >= min_df)
            .map(|(f, &df)| (f.as_str(), df))
            .collect();
        rows.sort_unstable();
        for (f, df) in rows {
            writeln!(out, "{:.6}\t{f}", idf_of(n, df as f64))?;
        }
        out.flush()
    }
}

fn idf_of(documents: f64, df: f64) -> f64 {
    ((documents + 1.0) / (df + 1.0)).ln() + 1.0
}

impl IdfTable {
    /// Reads a table written by [`IdfBuilder::write`].
    pub fn read<R: BufRead>(mut input: R) -> Result<IdfTable, Error> {
        let mut line = String::new();
        input.read_line(&mut line)?;
        let bad = |line: usize, reason: String| Error::InvalidIdf { line, reason };
        let rest = line.trim_end().strip_prefix(MAGIC).ok_or_else(|| {
            bad(
                1,
                "not a neardup IDF table (no '# neardup-idf' header); make one with `neardup idf build`"
                    .into(),
            )
        })?;
        let (version, json) = rest
            .trim_start()
            .split_once(' ')
            .ok_or_else(|| bad(1, "header has no version".into()))?;
        if version != VERSION.to_string() {
            return Err(bad(
                1,
                format!("format version {version} is not supported (this neardup reads {VERSION})"),
            ));
        }
        let header: Header =
            serde_json::from_str(json).map_err(|e| bad(1, format!("bad header: {e}")))?;
        let mut digest = xxhash_rust::xxh3::Xxh3::new();
        digest.update(line.as_bytes());
        let mut idf = HashMap::new();
        let mut lineno = 1;
        loop {
            line.clear();
            if input.read_line(&mut line)? == 0 {
                break;
            }
            lineno += 1;
            digest.update(line.as_bytes());
            let row = line.strip_suffix('\n').unwrap_or(&line);
            let (value, feature) = row
                .split_once('\t')
                .ok_or_else(|| bad(lineno, "expected '<idf><TAB><feature>'".into()))?;
            let value: f32 = value
                .parse()
                .ok()
                .filter(|v: &f32| v.is_finite())
                .ok_or_else(|| bad(lineno, format!("{value:?} is not a number")))?;
            idf.insert(feature_key(feature), value);
        }
        Ok(IdfTable {
            idf,
            documents: header.documents,
            config_digest: header.config,
            default_idf: header.default_idf,
            digest: format!("{:016x}", digest.digest()),
        })
    }

    /// The IDF of `feature`.
    #[inline]
    pub fn idf(&self, feature: &str) -> f64 {
        self.idf
            .get(&feature_key(feature))
            .map_or(self.default_idf, |&v| v as f64)
    }

    /// Documents the table was learned from.
    pub fn documents(&self) -> u64 {
        self.documents
    }

    /// Distinct features in the table.
    pub fn len(&self) -> usize {
        self.idf.len()
    }

    /// Whether the table holds no feature.
    pub fn is_empty(&self) -> bool {
        self.idf.is_empty()
    }

    /// The digest of the configuration whose features the table counts.
    pub fn config_digest(&self) -> &str {
        &self.config_digest
    }

    /// The digest of the table's bytes; configurations record it.
    pub fn digest(&self) -> &str {
        &self.digest
    }
}

#[inline]
fn feature_key(feature: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(feature.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_values() {
        let mut b = IdfBuilder::new();
        b.add_document(["the", "cat"]);
        b.add_document(["the", "dog"]);
        b.add_document(["the", "cat", "sat"]);
        let mut bytes = Vec::new();
        b.write(1, "abc", &mut bytes).unwrap();
        let t = IdfTable::read(&bytes[..]).unwrap();
        assert_eq!(t.documents(), 3);
        assert_eq!(t.len(), 4);
        // ln(4/4)+1 = 1 for a feature in every document.
        assert!((t.idf("the") - 1.0).abs() < 1e-6);
        assert!((t.idf("cat") - ((4.0f64 / 3.0).ln() + 1.0)).abs() < 1e-6);
        // Unseen: ln(4/1)+1, larger than any seen feature.
        assert!((t.idf("zebra") - (4.0f64.ln() + 1.0)).abs() < 1e-9);
        assert!(t.idf("zebra") > t.idf("sat"));
        // Same input, same bytes, same digest.
        let mut again = Vec::new();
        b.write(1, "abc", &mut again).unwrap();
        assert_eq!(bytes, again);
    }

    #[test]
    fn min_df_prunes() {
        let mut b = IdfBuilder::new();
        b.add_document(["a", "b"]);
        b.add_document(["a"]);
        let mut bytes = Vec::new();
        b.write(2, "x", &mut bytes).unwrap();
        assert_eq!(IdfTable::read(&bytes[..]).unwrap().len(), 1);
    }

    #[test]
    fn malformed_tables_name_the_line() {
        let err = IdfTable::read(&b"hello\n"[..]).unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
        let good = "# neardup-idf 1 {\"documents\":1,\"config\":\"x\",\"default_idf\":1.0}\n";
        let err = IdfTable::read(format!("{good}1.0\ta\nnope\n").as_bytes())
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3"), "{err}");
        let err = IdfTable::read(format!("{good}abc\ta\n").as_bytes())
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
        let v2 = good.replace("idf 1", "idf 2");
        assert!(IdfTable::read(v2.as_bytes()).is_err());
    }
}
