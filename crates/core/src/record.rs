//! JSON Lines records: a document's body (text, vector or weighted
//! features), its id and the `--keep-by` field, pulled out of one JSON
//! object in one pass, every other field skipped unparsed. The CLI's reader
//! and the Spark job parse records here, so that both accept and refuse the
//! same lines with the same messages.

use std::borrow::Cow;
use std::fmt;

use serde::Deserializer;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use crate::config::Input as InputKind;
use crate::keep_by::SortKey;

/// A document id: a string or an integer, written back as it came.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Id {
    /// An integer id.
    Int(i64),
    /// A string id.
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

    /// The id as JSON text.
    pub fn to_json(&self) -> String {
        let mut out = Vec::new();
        self.write_json(&mut out);
        String::from_utf8(out).expect("JSON is UTF-8")
    }

    /// The id a JSON value holds: a string, or an integer that fits in 64
    /// signed bits.
    pub fn from_json(v: serde_json::Value) -> Result<Id, String> {
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

/// What a record's body field holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Body<'a> {
    /// A text, borrowed from the line where it has no escapes.
    Text(Cow<'a, str>),
    /// A dense vector.
    Vector(Vec<f32>),
    /// Weighted features, by name.
    Features(Vec<(String, f64)>),
}

/// The fields a reader wants from each record.
#[derive(Clone, Copy, Debug)]
pub struct Fields<'f> {
    /// The field holding the body.
    pub body: &'f str,
    /// What the body is.
    pub kind: InputKind,
    /// The field holding the id.
    pub id: &'f str,
    /// The `--keep-by field:NAME` field, if one is read.
    pub key: Option<&'f str>,
}

impl Fields<'_> {
    /// The flag that chooses the body field, for messages.
    pub fn body_flag(&self) -> &'static str {
        match self.kind {
            InputKind::Text => "--text-field",
            InputKind::Vector => "--vector-field",
            InputKind::Features => "--features-field",
        }
    }
}

/// One record's body, id (if it has one) and keep-by key
/// ([`SortKey::Missing`] when the field is absent, null or not asked for).
#[derive(Debug, Clone, PartialEq)]
pub struct Record<'a> {
    /// The body.
    pub body: Body<'a>,
    /// The id, when the record has the id field.
    pub id: Option<Id>,
    /// The keep-by key.
    pub key: SortKey,
}

/// Parses one JSON Lines record: `Ok(None)` for a blank line (allowed
/// between records); an error message (without the place) for a line that
/// is not a JSON object, lacks the body field, or holds a field of the
/// wrong type.
pub fn parse_record<'a>(line: &'a str, fields: Fields<'_>) -> Result<Option<Record<'a>>, String> {
    if line.bytes().all(|b| b.is_ascii_whitespace()) {
        return Ok(None);
    }
    let mut de = serde_json::Deserializer::from_str(line);
    let (body, id, key) = fields
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| format!("malformed JSON line: {e}"))?;
    let body = body.ok_or_else(|| {
        format!(
            "no {:?} field (choose the field with {})",
            fields.body,
            fields.body_flag()
        )
    })?;
    let id = id.map(Id::from_json).transpose()?;
    Ok(Some(Record { body, id, key }))
}

impl<'de> DeserializeSeed<'de> for Fields<'_> {
    type Value = (Option<Body<'de>>, Option<serde_json::Value>, SortKey);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Fields<'_> {
    type Value = (Option<Body<'de>>, Option<serde_json::Value>, SortKey);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut body, mut id, mut key) = (None, None, SortKey::Missing);
        let names = KeySeed(self);
        while let Some(name) = map.next_key_seed(names)? {
            match name {
                Key::Body => {
                    body = Some(match self.kind {
                        InputKind::Text => Body::Text(map.next_value::<CowStr<'de>>()?.0),
                        InputKind::Vector => Body::Vector(map.next_value_seed(VectorSeed)?),
                        InputKind::Features => Body::Features(
                            map.next_value::<std::collections::BTreeMap<String, f64>>()?
                                .into_iter()
                                .collect(),
                        ),
                    })
                }
                Key::Id => id = Some(map.next_value::<serde_json::Value>()?),
                Key::Sort => {
                    let name = self.key.unwrap_or_default();
                    key = SortKey::from_json(map.next_value()?, name)
                        .map_err(serde::de::Error::custom)?;
                }
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((body, id, key))
    }
}

/// Which of the wanted fields an object key names.
enum Key {
    Body,
    Id,
    Sort,
    Other,
}

/// Classifies an object key without allocating it.
#[derive(Clone, Copy)]
struct KeySeed<'f>(Fields<'f>);

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
        Ok(if key == self.0.body {
            Key::Body
        } else if key == self.0.id {
            Key::Id
        } else if Some(key) == self.0.key {
            Key::Sort
        } else {
            Key::Other
        })
    }
}

/// A string borrowed from the line when it has no escapes.
struct CowStr<'de>(Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for CowStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CowStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// A JSON array of numbers as a single-precision vector; a number beyond
/// single precision's range is refused (it would become infinite).
struct VectorSeed;

impl<'de> DeserializeSeed<'de> for VectorSeed {
    type Value = Vec<f32>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for VectorSeed {
    type Value = Vec<f32>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of numbers (the vector)")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<f32>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(256));
        while let Some(x) = seq.next_element::<f64>()? {
            let y = x as f32;
            if !y.is_finite() {
                return Err(serde::de::Error::custom(format!(
                    "entry {} of the vector, {x}, is beyond single precision's range",
                    out.len()
                )));
            }
            out.push(y);
        }
        Ok(out)
    }
}

/// The fields `--annotate` adds to a record, in the order it adds them.
pub const ANNOTATIONS: [&str; 3] = ["cluster", "duplicate_of", "similarity"];

/// Record `record` (a JSON object, as read) with the fields `--annotate`
/// adds, and a newline, into `out`: `cluster` and `duplicate_of` (ids as
/// JSON text; `duplicate_of` null when `None`) and `similarity` to four
/// places (null when `None` or NaN). The CLI and the Spark job annotate with
/// it, so that both write the same bytes. An error (naming the document as
/// `doc`) when the record is not a JSON object or already has one of the
/// fields.
pub fn annotate(
    record: &[u8],
    cluster: &[u8],
    duplicate_of: Option<&[u8]>,
    similarity: Option<f64>,
    doc: &dyn fmt::Display,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    use std::io::Write as _;
    let body = record.trim_ascii();
    let (Some(b'{'), Some(b'}')) = (body.first(), body.last()) else {
        return Err(format!(
            "--annotate adds fields to JSON records, and document {doc} is not a JSON object \
             (plain text lines or files): write --clusters and join them by id"
        ));
    };
    // A field of the same name would be given twice: refused, by name.
    for name in ANNOTATIONS {
        let quoted = format!("\"{name}\"");
        if memchr::memmem::find(body, quoted.as_bytes()).is_some() {
            let v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body)
                .map_err(|e| format!("document {doc}: malformed JSON record: {e}"))?;
            if v.contains_key(name) {
                return Err(format!(
                    "document {doc} already has a field {name:?}, which --annotate adds: rename \
                     it in the input, or write --clusters and join them by id"
                ));
            }
        }
    }
    let inner = body[1..body.len() - 1].trim_ascii();
    out.push(b'{');
    out.extend_from_slice(inner);
    if !inner.is_empty() {
        out.push(b',');
    }
    out.extend_from_slice(b"\"cluster\":");
    out.extend_from_slice(cluster);
    out.extend_from_slice(b",\"duplicate_of\":");
    out.extend_from_slice(duplicate_of.unwrap_or(b"null"));
    match similarity.filter(|s| !s.is_nan()) {
        None => out.extend_from_slice(b",\"similarity\":null"),
        Some(s) => write!(out, ",\"similarity\":{s:.4}").expect("writing to a Vec"),
    }
    out.extend_from_slice(b"}\n");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_fields<'f>(key: Option<&'f str>) -> Fields<'f> {
        Fields {
            body: "text",
            kind: InputKind::Text,
            id: "id",
            key,
        }
    }

    #[test]
    fn a_record_gives_its_text_id_and_key_and_skips_the_rest() {
        let line = r#"{"meta": {"a": [1, 2]}, "id": 7, "q": 0.5, "text": "plain"}"#;
        let r = parse_record(line, text_fields(Some("q"))).unwrap().unwrap();
        assert_eq!(r.body, Body::Text(Cow::Borrowed("plain")));
        assert!(matches!(r.body, Body::Text(Cow::Borrowed(_))));
        assert_eq!(r.id, Some(Id::Int(7)));
        assert_eq!(r.key, SortKey::Num(0.5));
        let line = r#"{"id": "a\"b", "text": "x\ny"}"#;
        let r = parse_record(line, text_fields(None)).unwrap().unwrap();
        assert_eq!(r.body, Body::Text(Cow::Owned("x\ny".into())));
        assert_eq!(r.id, Some(Id::Str("a\"b".into())));
        assert_eq!(r.id.unwrap().to_json(), r#""a\"b""#);
        assert_eq!(r.key, SortKey::Missing);
    }

    #[test]
    fn blank_lines_are_no_record_and_bad_lines_say_why() {
        assert_eq!(parse_record(" \t\r", text_fields(None)), Ok(None));
        let err = |line: &str, key| parse_record(line, text_fields(key)).unwrap_err();
        assert!(err("{\"text\": 1}", None).starts_with("malformed JSON line"));
        assert!(err("[1]", None).starts_with("malformed JSON line"));
        assert!(err("{\"text\": \"a\"} x", None).starts_with("malformed JSON line"));
        assert_eq!(
            err("{\"body\": \"a\"}", None),
            "no \"text\" field (choose the field with --text-field)"
        );
        assert_eq!(
            err(r#"{"text": "a", "id": 1.5}"#, None),
            "id 1.5 is not an integer that fits in 64 bits"
        );
        assert_eq!(
            err(r#"{"text": "a", "id": [1]}"#, None),
            "id [1] is neither a string nor an integer"
        );
        assert!(
            err(r#"{"text": "a", "q": [1]}"#, Some("q")).contains("must be a number or a string")
        );
    }

    #[test]
    fn vectors_and_features_are_read_by_kind() {
        let fields = Fields {
            body: "v",
            kind: InputKind::Vector,
            id: "id",
            key: None,
        };
        let r = parse_record(r#"{"v": [1, -2.5, 0]}"#, fields)
            .unwrap()
            .unwrap();
        assert_eq!(r.body, Body::Vector(vec![1.0, -2.5, 0.0]));
        assert!(
            parse_record(r#"{"v": [1e300]}"#, fields)
                .unwrap_err()
                .contains("single precision")
        );
        let fields = Fields {
            kind: InputKind::Features,
            ..fields
        };
        let r = parse_record(r#"{"v": {"b": 2, "a": 0.5}}"#, fields)
            .unwrap()
            .unwrap();
        assert_eq!(
            r.body,
            Body::Features(vec![("a".into(), 0.5), ("b".into(), 2.0)])
        );
    }

    #[test]
    fn annotate_appends_the_three_fields_and_refuses_what_it_cannot_annotate() {
        let mut out = Vec::new();
        annotate(
            b" {\"id\": 3, \"text\": \"x\"}\n",
            b"1",
            Some(b"1"),
            Some(0.91236),
            &3,
            &mut out,
        )
        .unwrap();
        assert_eq!(
            out,
            b"{\"id\": 3, \"text\": \"x\",\"cluster\":1,\"duplicate_of\":1,\"similarity\":0.9124}\n"
        );
        out.clear();
        annotate(b"{}", b"\"a\"", None, Some(f64::NAN), &"a", &mut out).unwrap();
        assert_eq!(
            out,
            b"{\"cluster\":\"a\",\"duplicate_of\":null,\"similarity\":null}\n"
        );
        let e = annotate(b"plain text", b"1", None, None, &1, &mut out).unwrap_err();
        assert!(e.contains("not a JSON object"), "{e}");
        let e = annotate(br#"{"cluster": 2}"#, b"1", None, None, &1, &mut out).unwrap_err();
        assert!(e.contains("already has a field \"cluster\""), "{e}");
        // A value that merely contains the name is not the field.
        annotate(br#"{"t": "\"cluster\""}"#, b"1", None, None, &1, &mut out).unwrap();
    }
}
