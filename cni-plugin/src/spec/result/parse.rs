//! Reading a result of any supported version into the one model.

use serde_json::{Map, Value};

use super::{CniResult, ResultError};
use crate::spec::version::{VersionError, parse_version};

pub(super) fn parse(value: &Value) -> Result<CniResult, ResultError> {
    let Value::Object(map) = value else {
        return Err(ResultError::Invalid("not a JSON object".to_owned()));
    };
    check_version(map)?;
    let result: CniResult = serde_json::from_value(value.clone())
        .map_err(|err| ResultError::Invalid(err.to_string()))?;
    check_ip_versions(map, &result)?;
    Ok(result)
}

/// A present `cniVersion` must be one this plugin speaks. The 0.1.0/0.2.0 shape
/// (`ip4`/`ip6` instead of `ips`) is refused even without one: read as a newer version it
/// would silently come out with no addresses.
fn check_version(map: &Map<String, Value>) -> Result<(), ResultError> {
    match map.get("cniVersion") {
        None | Some(Value::Null) => {}
        Some(Value::String(version)) if version.is_empty() => {}
        Some(Value::String(version)) => {
            parse_version(version)?;
        }
        Some(other) => {
            return Err(ResultError::Invalid(format!(
                "cniVersion {other} is not a string"
            )));
        }
    }
    if map.contains_key("ip4") || map.contains_key("ip6") {
        return Err(VersionError("0.2.0 (ip4/ip6 result)".to_owned()).into());
    }
    Ok(())
}

/// Below 1.0.0 each IP carries `"version": "4"|"6"`. The model derives it from the
/// address, so a present one must agree; a missing one is accepted.
fn check_ip_versions(map: &Map<String, Value>, result: &CniResult) -> Result<(), ResultError> {
    let Some(Value::Array(raw_ips)) = map.get("ips") else {
        return Ok(());
    };
    for (i, (raw, ip)) in raw_ips.iter().zip(&result.ips).enumerate() {
        let Some(version) = raw.get("version") else {
            continue;
        };
        let family = if ip.address.addr().is_ipv4() {
            "4"
        } else {
            "6"
        };
        if version.as_str() != Some(family) {
            return Err(ResultError::Invalid(format!(
                "ips[{i}].version is {version} but address {} is IPv{family}",
                ip.address
            )));
        }
    }
    Ok(())
}
