//! Which copy of a cluster survives: `neardup dedup --keep-by` and the Spark
//! job's `--keep-by`.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::Deserializer;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};

/// The rule that picks the surviving document of each cluster; ties go to the
/// first in input order.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum KeepBy {
    /// The first document in input order.
    #[default]
    First,
    /// The longest text (in bytes).
    Longest,
    /// The smallest (`asc`, the default) or largest (`desc`) value of a JSON
    /// field: numbers before strings, documents without it last.
    Field { name: String, descending: bool },
}

impl FromStr for KeepBy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "invalid --keep-by {s:?}: use first, longest, or field:NAME[:asc|desc] \
                 (e.g. field:quality:desc)"
            )
        };
        match s {
            "first" => return Ok(KeepBy::First),
            "longest" => return Ok(KeepBy::Longest),
            _ => {}
        }
        let rest = s.strip_prefix("field:").ok_or_else(bad)?;
        let (name, descending) = match rest.rsplit_once(':') {
            Some((name, "desc")) => (name, true),
            Some((name, "asc")) => (name, false),
            _ => (rest, false),
        };
        if name.is_empty() {
            return Err(bad());
        }
        Ok(KeepBy::Field {
            name: name.to_owned(),
            descending,
        })
    }
}

impl fmt::Display for KeepBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeepBy::First => f.write_str("first"),
            KeepBy::Longest => f.write_str("longest"),
            KeepBy::Field { name, descending } => write!(
                f,
                "field:{name}:{}",
                if *descending { "desc" } else { "asc" }
            ),
        }
    }
}

/// A document's value under a [`KeepBy`] rule.
#[derive(Clone, Debug, PartialEq)]
pub enum SortKey {
    Num(f64),
    Str(Box<str>),
    /// The field is absent or null.
    Missing,
}

impl SortKey {
    /// The key a JSON value gives under `--keep-by field:NAME`: a number or a
    /// string; null is missing.
    pub fn from_json(value: serde_json::Value, name: &str) -> Result<SortKey, String> {
        match value {
            serde_json::Value::Null => Ok(SortKey::Missing),
            serde_json::Value::Number(n) => Ok(SortKey::Num(n.as_f64().unwrap_or(f64::NAN))),
            serde_json::Value::String(s) => Ok(SortKey::Str(s.into())),
            _ => Err(format!(
                "the --keep-by field {name:?} must be a number or a string"
            )),
        }
    }

    /// Orders two keys, `descending` or not; missing values last either way.
    fn cmp(&self, other: &SortKey, descending: bool) -> Ordering {
        use SortKey::*;
        let o = match (self, other) {
            (Missing, Missing) => return Ordering::Equal,
            (Missing, _) => return Ordering::Greater,
            (_, Missing) => return Ordering::Less,
            (Num(a), Num(b)) => a.total_cmp(b),
            (Str(a), Str(b)) => a.cmp(b),
            (Num(_), Str(_)) => Ordering::Less,
            (Str(_), Num(_)) => Ordering::Greater,
        };
        if descending { o.reverse() } else { o }
    }
}

impl KeepBy {
    /// Whether the rule reads a field of the records.
    pub fn field(&self) -> Option<&str> {
        match self {
            KeepBy::Field { name, .. } => Some(name),
            _ => None,
        }
    }

    /// The key of a document: its text and its JSON record (when the rule
    /// reads a field).
    pub fn key(&self, text: &str, record: Option<&[u8]>) -> Result<SortKey, String> {
        match self {
            KeepBy::First => Ok(SortKey::Missing),
            KeepBy::Longest => Ok(SortKey::Num(text.len() as f64)),
            KeepBy::Field { name, .. } => match record {
                Some(r) => json_field(r, name),
                None => Ok(SortKey::Missing),
            },
        }
    }

    /// The documents, most preferred first (ties in input order), from their
    /// keys; `None` for `first` (input order).
    pub fn preference(&self, keys: &[SortKey]) -> Option<Vec<u32>> {
        let descending = match self {
            KeepBy::First => return None,
            KeepBy::Longest => true,
            KeepBy::Field { descending, .. } => *descending,
        };
        let mut order: Vec<u32> = (0..keys.len() as u32).collect();
        // A stable sort: equal keys keep input order.
        order.sort_by(|&a, &b| keys[a as usize].cmp(&keys[b as usize], descending));
        Some(order)
    }
}

/// The value of field `name` in a JSON object record.
fn json_field(record: &[u8], name: &str) -> Result<SortKey, String> {
    struct Seed<'n>(&'n str);
    impl<'de> DeserializeSeed<'de> for Seed<'_> {
        type Value = SortKey;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<SortKey, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Seed<'_> {
        type Value = SortKey;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SortKey, A::Error> {
            let mut found = SortKey::Missing;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == self.0 {
                    found = SortKey::from_json(map.next_value()?, self.0)
                        .map_err(serde::de::Error::custom)?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(record);
    Seed(name).deserialize(&mut de).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_orders() {
        assert_eq!("first".parse::<KeepBy>(), Ok(KeepBy::First));
        assert_eq!(
            "field:a:b:desc".parse::<KeepBy>(),
            Ok(KeepBy::Field {
                name: "a:b".into(),
                descending: true
            })
        );
        assert!("field:".parse::<KeepBy>().is_err());
        assert!("oldest".parse::<KeepBy>().is_err());
        let rule: KeepBy = "field:q:desc".parse().unwrap();
        let keys: Vec<SortKey> = [
            r#"{"q": 1, "text": "x"}"#,
            r#"{"text": "y"}"#,
            r#"{"q": 7}"#,
            r#"{"q": "z"}"#,
            r#"{"q": 7, "other": [1, {"q": 100}]}"#,
        ]
        .iter()
        .map(|r| rule.key("", Some(r.as_bytes())).unwrap())
        .collect();
        // Descending: the string "z" sorts after numbers ascending, so first
        // descending; 7 twice (input order), 1, then the missing one.
        assert_eq!(rule.preference(&keys).unwrap(), vec![3, 2, 4, 0, 1]);
        assert!(rule.key("", Some(br#"{"q": [1]}"#)).is_err());
    }
}
