//! A free-form JSON value from an untrusted file, with a node budget: the `.cflow` metadata's
//! `provenance` is any JSON, and a `serde_json::Value` costs 32+ bytes per node, so an array of
//! `0,` (two bytes per element) took ~22× the metadata's size. [`deserialize`] builds the value
//! node by node and fails once [`MAX_NODES`] nodes or [`MAX_DEPTH`] levels are reached, before
//! the memory is spent.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::cell::Cell;
use std::fmt;

/// Nodes (scalars, arrays, objects) a bounded value may hold. Provenance records are a few
/// dozen.
pub const MAX_NODES: usize = 1 << 16;
/// Nesting depth a bounded value may have.
pub const MAX_DEPTH: usize = 64;

struct Bounded<'a> {
    nodes: &'a Cell<usize>,
    depth: usize,
}

impl Bounded<'_> {
    fn count<E: de::Error>(&self) -> Result<(), E> {
        let n = self.nodes.get() + 1;
        self.nodes.set(n);
        if n > MAX_NODES {
            return Err(E::custom(format!("more than {MAX_NODES} JSON values")));
        }
        if self.depth > MAX_DEPTH {
            return Err(E::custom(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(())
    }
    fn child(&self) -> Bounded<'_> {
        Bounded {
            nodes: self.nodes,
            depth: self.depth + 1,
        }
    }
}

impl<'de> de::DeserializeSeed<'de> for Bounded<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.count()?;
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.count()?;
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.count()?;
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.count()?;
        let mut v = Vec::new();
        while let Some(x) = seq.next_element_seed(self.child())? {
            v.push(x);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.count()?;
        let mut m = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value_seed(self.child())?;
            m.insert(k, v);
        }
        Ok(Value::Object(m))
    }
}

/// `#[serde(deserialize_with = "…")]` for a `serde_json::Value` field from an untrusted file.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    let nodes = Cell::new(0);
    de::DeserializeSeed::deserialize(
        Bounded {
            nodes: &nodes,
            depth: 0,
        },
        d,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Value, serde_json::Error> {
        deserialize(&mut serde_json::Deserializer::from_str(s))
    }

    #[test]
    fn small_values_parse_as_usual() {
        let s = r#"{"source": "m.gguf", "sha256": "ab", "n": [1, -2, 3.5, null, true], "o": {}}"#;
        assert_eq!(parse(s).unwrap(), serde_json::from_str::<Value>(s).unwrap());
    }

    #[test]
    fn huge_or_deep_values_are_refused() {
        let big = format!("[{}0]", "0,".repeat(MAX_NODES));
        assert!(parse(&big).unwrap_err().to_string().contains("JSON values"));
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 2), "]".repeat(MAX_DEPTH + 2));
        assert!(parse(&deep).unwrap_err().to_string().contains("nested"));
    }
}
