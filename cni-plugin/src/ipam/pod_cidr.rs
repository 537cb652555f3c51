//! Calico's `usePodCidr` convention: an IPAM range whose `subnet` is the string
//! `usePodCidr` stands for this node's pod ranges (the Node's `spec.podCIDRs`, which the
//! daemon learns from its node source). Every config handed to the IPAM plugin has the
//! placeholder replaced first ([`fill`]); a config without one goes unchanged, and nobody
//! is asked for the node's ranges.
//!
//! Where the placeholder may be (keys matched as Go's decoder matches them, since
//! host-local reads them so: see `spec::go_json`):
//! - in a range set of `ipam.ranges`: that range becomes one copy per pod range, its
//!   `subnet` set to the pod range and its other keys (`gateway`, `rangeStart`...) kept as
//!   given, for the IPAM plugin to validate;
//! - `ipam.subnet`, host-local's single-range form: it becomes `ipam.ranges`, one range
//!   set with a range per pod range, and the top-level `rangeStart`, `rangeEnd` and
//!   `gateway` move into each of them (host-local reads them only beside a subnet). With
//!   `ipam.ranges` present as well, where the node's ranges go is unclear: code 7.
//!
//! The value matches without regard to case, as Calico's `strings.EqualFold` does, so a
//! conflist written for Calico works unchanged. Calico's `usePodCidrIPv6` is refused
//! (code 2): the daemon knows IPv4 pod ranges only.
//!
//! Where the ranges come from is the caller's (`commands::Invocation::ipam_config`): the
//! daemon's status ([`from_status`]), or, when the daemon does not answer a DEL, CHECK or
//! GC, the file it keeps beside its socket ([`from_file`], `cni_api::NODE_POD_CIDRS_FILE`).
//! ADD and STATUS need the daemon anyway and never read the file. With neither source, or
//! with the node having no pod range, the verb fails with code 11 (try again later; STATUS
//! says 50), DEL included: IPAM cannot release without a valid config, the runtime
//! retries a failed DEL, and the release succeeds once the daemon answers. A range made up
//! to let the DEL through could make another IPAM plugin release the wrong addresses; the
//! price is that a node whose pod range is gone for good keeps such DELs failing until it
//! is given one again.
//!
//! Both sources cross a trust boundary, so the ranges are checked ([`PodCidrs::new`]): 1
//! to [`MAX_POD_CIDRS`] of them, each a network address (host bits clear), /8 or longer
//! (`checks::MIN_PREFIX`), and clear of the blocks no pod address may come from (0/8,
//! 127/8, 169.254/16, 224/3). A daemon that answers with ranges failing this is a bug:
//! code 100. A file that is missing, unreadable or failing this is code 11, like the
//! daemon not answering: the runtime's retry finds the daemon back.

mod source;
#[cfg(test)]
mod tests;

use serde_json::{Map, Value};

use crate::spec::{CniError, ConfigError, ErrorCode, go_json::same_name};

pub use source::{MAX_POD_CIDRS, PodCidrs, PodCidrsError, from_file, from_status};

/// The `subnet` value that stands for this node's IPv4 pod ranges.
pub const PLACEHOLDER: &str = "usePodCidr";
/// Calico's IPv6 counterpart, refused.
const PLACEHOLDER_V6: &str = "usePodCidrIPv6";

/// The range keys of host-local's single-range form, moved into each range.
const RANGE_KEYS: [&str; 4] = ["subnet", "rangeStart", "rangeEnd", "gateway"];

/// What a `subnet` value stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placeholder {
    V4,
    V6,
}

/// The placeholder in the `subnet` of `range` (a range object, or `ipam` itself).
fn subnet_placeholder(range: &Map<String, Value>) -> Option<Placeholder> {
    field(range, "subnet").and_then(|(_, subnet)| placeholder(subnet))
}

fn placeholder(subnet: &Value) -> Option<Placeholder> {
    let subnet = subnet.as_str()?;
    if subnet.eq_ignore_ascii_case(PLACEHOLDER) {
        Some(Placeholder::V4)
    } else if subnet.eq_ignore_ascii_case(PLACEHOLDER_V6) {
        Some(Placeholder::V6)
    } else {
        None
    }
}

/// Whether `config` has a `usePodCidr` range: then the IPAM plugin gets [`fill`]'s copy.
/// Code 2 for `usePodCidrIPv6`, code 7 for an `ipam.subnet` placeholder beside
/// `ipam.ranges`.
pub fn needs_pod_cidrs(config: &Value) -> Result<bool, CniError> {
    let Some(ipam) = ipam(config) else {
        return Ok(false);
    };
    let top_level = subnet_placeholder(ipam);
    let ranges = field(ipam, "ranges").map(|(_, ranges)| ranges);
    let in_ranges: Vec<Placeholder> = ranges
        .into_iter()
        .flat_map(range_objects)
        .filter_map(subnet_placeholder)
        .collect();
    let v6_at = if top_level == Some(Placeholder::V6) {
        Some("ipam.subnet")
    } else if in_ranges.contains(&Placeholder::V6) {
        Some("ipam.ranges[][].subnet")
    } else {
        None
    };
    if let Some(at) = v6_at {
        return Err(CniError::new(
            ErrorCode::UnsupportedField,
            format!(
                "network configuration field `{at}` = {PLACEHOLDER_V6:?} is not supported: \
                 this plugin knows the node's IPv4 pod ranges only"
            ),
        ));
    }
    if top_level == Some(Placeholder::V4) && ranges.is_some() {
        return Err(ConfigError::InvalidField {
            field: "ipam.subnet".to_owned(),
            reason: format!(
                "{PLACEHOLDER} beside `ipam.ranges` leaves unclear where the node's pod \
                 ranges go; put it in a range of `ipam.ranges` instead"
            ),
        }
        .into());
    }
    Ok(top_level.is_some() || !in_ranges.is_empty())
}

/// `config` with every `usePodCidr` range replaced by `cidrs` (see the module doc), or
/// unchanged when it has none.
pub fn fill(config: &Value, cidrs: &PodCidrs) -> Result<Value, CniError> {
    let mut config = config.clone();
    if !needs_pod_cidrs(&config)? {
        return Ok(config);
    }
    let Some(ipam) = ipam_mut(&mut config) else {
        return Ok(config);
    };
    if subnet_placeholder(ipam) == Some(Placeholder::V4) {
        let mut range = Map::new();
        for name in RANGE_KEYS {
            if let Some((key, value)) = field(ipam, name) {
                range.insert(key.clone(), value.clone());
            }
            // Every spelling goes, so that Go reads none of them beside `ranges`.
            ipam.retain(|key, _| !same_name(key, name));
        }
        ipam.insert(
            "ranges".to_owned(),
            Value::Array(vec![Value::Array(vec![Value::Object(range)])]),
        );
    }
    let ranges_key = field(ipam, "ranges").map(|(key, _)| key.clone());
    if let Some(Value::Array(sets)) = ranges_key.and_then(|key| ipam.get_mut(&key)) {
        for set in sets {
            if let Value::Array(ranges) = set {
                *ranges = std::mem::take(ranges)
                    .into_iter()
                    .flat_map(|range| expand(range, cidrs))
                    .collect();
            }
        }
    }
    Ok(config)
}

/// `range` as one copy per pod range when its subnet is the placeholder, else unchanged.
fn expand(range: Value, cidrs: &PodCidrs) -> Vec<Value> {
    let Value::Object(object) = range else {
        return vec![range];
    };
    let Some(key) = field(&object, "subnet")
        .filter(|(_, subnet)| placeholder(subnet) == Some(Placeholder::V4))
        .map(|(key, _)| key.clone())
    else {
        return vec![Value::Object(object)];
    };
    cidrs
        .as_slice()
        .iter()
        .map(|cidr| {
            let mut copy = object.clone();
            copy.insert(key.clone(), Value::String(cidr.to_string()));
            Value::Object(copy)
        })
        .collect()
}

/// The key and value of `object` that Go reads into the field `name`, as
/// `go_json::match_fields` finds it: the exact spelling, else the last key equal to it
/// without case; a `null` is no value.
fn field<'a>(object: &'a Map<String, Value>, name: &str) -> Option<(&'a String, &'a Value)> {
    match object.get_key_value(name) {
        Some((key, value)) => (!value.is_null()).then_some((key, value)),
        None => object
            .iter()
            .rev()
            .find(|(key, value)| !value.is_null() && same_name(key, name)),
    }
}

fn ipam(config: &Value) -> Option<&Map<String, Value>> {
    field(config.as_object()?, "ipam")?.1.as_object()
}

fn ipam_mut(config: &mut Value) -> Option<&mut Map<String, Value>> {
    let object = config.as_object_mut()?;
    let key = field(object, "ipam")?.0.clone();
    object.get_mut(&key)?.as_object_mut()
}

/// The range objects of every range set of an `ipam.ranges` value; other shapes are the
/// IPAM plugin's to refuse.
fn range_objects(ranges: &Value) -> impl Iterator<Item = &Map<String, Value>> {
    ranges
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_array)
        .flatten()
        .filter_map(Value::as_object)
}
