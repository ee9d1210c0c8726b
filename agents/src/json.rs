//! Reading JSON that a person, a peer or a model wrote, refusing an object
//! with the same key twice.
//!
//! `serde_json` keeps the last of two equal keys without a word, so
//! `{"role": "task", "role": "kernel"}` reads as whichever came last, and
//! two readers of one text may disagree on what it says. Config files,
//! request bodies and tool arguments go through [`parse`] instead: the
//! first repeated key is an error naming it and where it is.

use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// `text` as a JSON value, refusing repeated keys; the error says what is
/// wrong and where (`duplicate key "role" in agents[0] at line 3 column 9`).
pub fn parse(text: &str) -> Result<Value, serde_json::Error> {
    let mut reader = serde_json::Deserializer::from_str(text);
    let value = Unique(&Path::Root).deserialize(&mut reader)?;
    reader.end()?;
    Ok(value)
}

/// [`parse`] for bytes.
pub fn parse_slice(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    let value = Unique(&Path::Root).deserialize(&mut reader)?;
    reader.end()?;
    Ok(value)
}

/// Where a value sits, built on the stack as the reader descends.
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

struct Unique<'a>(&'a Path<'a>);

impl<'de> DeserializeSeed<'de> for Unique<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, reader: D) -> Result<Value, D::Error> {
        reader.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Unique<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Value, A::Error> {
        let mut list = Vec::new();
        loop {
            let path = Path::Index(self.0, list.len());
            match items.next_element_seed(Unique(&path))? {
                Some(item) => list.push(item),
                None => return Ok(Value::Array(list)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = entries.next_key::<String>()? {
            if map.contains_key(&key) {
                let shown = crate::text::shown(&key);
                return Err(match self.0 {
                    Path::Root => de::Error::custom(format!("duplicate key {shown}")),
                    path => de::Error::custom(format!("duplicate key {shown} in {path}")),
                });
            }
            let path = Path::Key(self.0, &key);
            let value = entries.next_value_seed(Unique(&path))?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn values_read_as_serde_json_reads_them() {
        let text = r#"{"a": [1, -2, 3.5, "x", null, true, {"b": {}}], "c": "é"}"#;
        assert_eq!(
            parse(text).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        assert_eq!(parse_slice(b" [] ").unwrap(), Value::Array(vec![]));
    }

    #[test]
    fn a_repeated_key_is_refused_with_where_it_is() {
        let err = parse(r#"{"kernel": {"listen": "a", "listen": "b"}}"#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(r#"duplicate key "listen" in kernel at line 1"#),
            "{err}"
        );
        let err = parse(r#"{"agents": [{"name": "a"}, {"role": "task", "role": "kernel"}]}"#)
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with(r#"duplicate key "role" in agents[1] at"#),
            "{err}"
        );
        let err = parse(r#"{"a": 1, "a": 1}"#).unwrap_err();
        assert!(
            err.to_string().starts_with(r#"duplicate key "a" at"#),
            "{err}"
        );
        // The same key in two objects is no repeat.
        assert!(parse(r#"[{"a": 1}, {"a": 2}]"#).is_ok());
    }

    #[test]
    fn trailing_text_and_bad_json_are_refused() {
        assert!(parse("{} x").is_err());
        assert!(parse("{").is_err());
    }
}
