//! Lenient readers for values other CNI implementations write: Go marshals a nil slice as
//! `null` and an unset `net.IP` or string as `""`, both of which mean "absent".

use std::fmt::Display;
use std::str::FromStr;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

/// `null` (or a missing key, with `#[serde(default)]`) reads as the type's default.
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

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
