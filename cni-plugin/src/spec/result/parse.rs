//! Reading a result of any supported version into the one model, with Go's rules
//! (`spec::go_json`): results come from Go plugins and runtimes.

use serde::Deserialize;
use serde_json::Value;

use super::{CniResult, ResultError};
use crate::spec::go_json;
use crate::spec::version::{VersionError, parse_version};

/// The parts of a result that say which version's shape it has.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Shape {
    #[serde(default)]
    cni_version: Option<Value>,
    #[serde(default)]
    ip4: Option<Value>,
    #[serde(default)]
    ip6: Option<Value>,
    #[serde(default)]
    ips: Vec<IpShape>,
}

#[derive(Deserialize)]
struct IpShape {
    #[serde(default)]
    version: Option<Value>,
}

pub(super) fn parse(value: &Value) -> Result<CniResult, ResultError> {
    if !value.is_object() {
        return Err(ResultError::Invalid("not a JSON object".to_owned()));
    }
    let invalid = |err: serde_json::Error| ResultError::Invalid(err.to_string());
    let shape: Shape = go_json::from_value(value.clone()).map_err(invalid)?;
    check_version(&shape)?;
    let result: CniResult = go_json::from_value(value.clone()).map_err(invalid)?;
    check_ip_versions(&shape, &result)?;
    Ok(result)
}

/// A present `cniVersion` must be one this plugin speaks. The 0.1.0/0.2.0 shape
/// (`ip4`/`ip6` instead of `ips`) is refused even without one: read as a newer version it
/// would silently come out with no addresses.
fn check_version(shape: &Shape) -> Result<(), ResultError> {
    match &shape.cni_version {
        None => {}
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
    if shape.ip4.is_some() || shape.ip6.is_some() {
        return Err(VersionError("0.2.0 (ip4/ip6 result)".to_owned()).into());
    }
    Ok(())
}

/// Below 1.0.0 each IP carries `"version": "4"|"6"`. The model derives it from the
/// address, so a present one must agree; a missing one is accepted.
fn check_ip_versions(shape: &Shape, result: &CniResult) -> Result<(), ResultError> {
    for (i, (raw, ip)) in shape.ips.iter().zip(&result.ips).enumerate() {
        let Some(version) = &raw.version else {
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
