//! Reading JSON the way Go's `encoding/json` reads it into a struct, since every runtime
//! and delegate that writes to us is a Go program (libcni, containerd's go-cni, podman,
//! CRI-O, the reference plugins). Two of Go's habits matter:
//!
//! - **Keys match fields case-insensitively.** An exact match wins; otherwise a key whose
//!   case-folded form equals a field's is that field. containerd builds
//!   `runtimeConfig.portMappings` from a struct without JSON tags, so it sends `HostPort`,
//!   `ContainerPort`, `Protocol`, `HostIP`: Go plugins read them as `hostPort`...
//! - **`null` leaves a field unset.** A Go nil slice marshals as `null`; decoding `null`
//!   into a field is a no-op, so it reads as the field's default (or "missing", for a field
//!   that has none).
//!
//! [`from_value`] applies both to every struct, however deeply nested, of any type that
//! derives `Deserialize`: the field names are the ones serde passes to
//! `deserialize_struct` (after `rename`, with aliases). Unknown keys are ignored, as in Go,
//! unless the type says otherwise. Maps (`Map<String, Value>`, `HashMap`) keep their keys
//! as given, as Go's maps do. A type read this way must not use `#[serde(flatten)]`: serde
//! then reads the struct as a map, without field names to match against.
//!
//! Written by hand: no crate applies Go's matching rule to nested serde structs (the
//! ones found lower-case every key of one struct, which breaks `hostIP` and exact-match
//! precedence).

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess,
    Visitor,
};
use serde_json::{Error, Map, Value};

/// Deserializes `value` into `T` with Go's key matching and `null` handling.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, Error> {
    T::deserialize(GoValue(value))
}

/// Renames the keys of `object` that name one of `fields` under Go's rule to that field's
/// spelling, and drops those whose value is `null`. Keys naming no field are kept as they
/// are. When several keys name the same field, the exactly spelled one wins, else the last
/// in the object's order.
pub(crate) fn match_fields(object: Map<String, Value>, fields: &[&str]) -> Map<String, Value> {
    let mut matched = Map::new();
    let mut exact = Vec::new();
    for (key, value) in object {
        if fields.contains(&key.as_str()) {
            exact.push((key, value));
            continue;
        }
        match fields.iter().find(|field| same_name(&key, field)) {
            Some(_) if value.is_null() => {}
            Some(field) => {
                matched.insert((*field).to_owned(), value);
            }
            None => {
                matched.insert(key, value);
            }
        }
    }
    for (key, value) in exact {
        if value.is_null() {
            matched.remove(&key);
        } else {
            matched.insert(key, value);
        }
    }
    matched
}

/// Go's `foldName` equality: ASCII letters compare without case, and so do the two
/// non-ASCII letters that Unicode simple case folding maps onto ASCII ones (KELVIN SIGN to
/// `k`, LATIN SMALL LETTER LONG S to `s`). Field names here are ASCII, so no other folding
/// can make a key match one.
pub(crate) fn same_name(key: &str, field: &str) -> bool {
    key.chars().map(fold).eq(field.chars().map(fold))
}

fn fold(c: char) -> char {
    match c {
        '\u{212A}' => 'K',
        '\u{017F}' => 'S',
        c => c.to_ascii_uppercase(),
    }
}

/// A JSON value that hands Go's rules down to everything nested in it.
struct GoValue(Value);

impl<'de> Deserializer<'de> for GoValue {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(items) => visitor.visit_seq(GoSeq(items.into_iter())),
            Value::Object(object) => visitor.visit_map(GoMap::new(object)),
            scalar => scalar.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            value => visitor.visit_some(GoValue(value)),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(object) => visitor.visit_map(GoMap::new(match_fields(object, fields))),
            // serde_json would read a struct from an array of its fields; Go would not.
            Value::Array(_) => Err(de::Error::invalid_type(de::Unexpected::Seq, &visitor)),
            other => other.deserialize_struct(name, fields, visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(items) => visitor.visit_seq(GoSeq(items.into_iter())),
            other => other.deserialize_seq(visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(object) => visitor.visit_map(GoMap::new(object)),
            other => other.deserialize_map(visitor),
        }
    }

    /// Go has no enums; the string enums here (a protocol name) read as serde_json reads
    /// them.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct identifier ignored_any
    }
}

struct GoSeq(std::vec::IntoIter<Value>);

impl<'de> SeqAccess<'de> for GoSeq {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0
            .next()
            .map(|item| seed.deserialize(GoValue(item)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct GoMap {
    entries: serde_json::map::IntoIter,
    value: Option<Value>,
}

impl GoMap {
    fn new(object: Map<String, Value>) -> Self {
        Self {
            entries: object.into_iter(),
            value: None,
        }
    }
}

impl<'de> MapAccess<'de> for GoMap {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(value);
        seed.deserialize(IntoDeserializer::<'de, Error>::into_deserializer(key))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let value = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a map value was asked for before its key"))?;
        seed.deserialize(GoValue(value))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}
