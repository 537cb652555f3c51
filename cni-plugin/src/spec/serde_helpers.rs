//! Lenient readers for values other CNI implementations write: Go marshals an unset
//! `net.IP` or string as `""`, which means "absent". (Its `null` for a nil slice is
//! handled for every field by `go_json`.)

use std::fmt::Display;
use std::str::FromStr;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

/// A string parsed with `FromStr`; `null` and `""` read as `None`.
pub(crate) fn empty_as_none<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: Display,
{
    match Option::<String>::deserialize(deserializer)?.as_deref() {
        None | Some("") => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|err| D::Error::custom(format!("{text:?}: {err}"))),
    }
}
