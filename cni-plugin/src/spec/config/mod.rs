//! The network configuration on stdin: typed fields this plugin reads, everything else
//! kept, and the original JSON kept whole for delegation to the IPAM plugin.

mod runtime;
mod validate;

use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use runtime::{Bandwidth, PortMapping, Protocol, RuntimeConfig, parse_unicast_mac};

use super::env::Command;
use super::error::CniError;
use super::version::{CniVersion, VersionError};

/// Why a configuration was rejected. Codes: 6 for `Syntax`/`NotAnObject`, 1 for the
/// version variants, 7 for the rest (see `error.rs`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("network configuration on stdin is not valid JSON: {0}")]
    Syntax(String),
    #[error("network configuration on stdin is not a JSON object")]
    NotAnObject,
    #[error("network configuration is missing required field `{0}`")]
    MissingField(&'static str),
    #[error("network configuration field `{field}` is invalid: {reason}")]
    InvalidField { field: String, reason: String },
    #[error(transparent)]
    Version(#[from] VersionError),
    #[error("{command} needs cniVersion {needs} or later; the configuration says {has}")]
    CommandTooNew {
        command: Command,
        needs: CniVersion,
        has: CniVersion,
    },
    #[error("{command} needs `{field}` in the network configuration")]
    CommandNeeds {
        command: Command,
        field: &'static str,
    },
}

impl ConfigError {
    fn invalid(field: impl Into<String>, reason: impl ToString) -> Self {
        Self::InvalidField {
            field: field.into(),
            reason: reason.to_string(),
        }
    }
}

/// The `ipam` section. Only `type` is read here; the IPAM plugin reads the rest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IpamConf {
    /// Missing reads as "" so that the error can name `ipam.type` rather than `type`.
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One still-valid attachment in a GC request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// The key the spec names (since July 2024) and libcni has always sent.
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";
/// The key spec 1.1.0 itself printed; libcni sends both for that reason.
pub const LEGACY_ATTACHMENTS_KEY: &str = "cni.dev/attachments";

/// The plugin's configuration as the runtime sent it on stdin.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// Kept as given so an unsupported version can still be echoed in the error result;
    /// [`NetConf::version`] parses it.
    pub cni_version: String,
    pub name: String,
    pub plugin_type: String,
    pub ipam: Option<IpamConf>,
    pub mtu: Option<u32>,
    pub ip_masq: bool,
    /// Our own key `clusterCIDRs`: destinations that keep the pod's address under
    /// `ipMasq` (the cluster's pod ranges). Empty means "the pod's own subnet".
    pub cluster_cidrs: Vec<ipnet::Ipv4Net>,
    /// Our own key: where the node daemon listens, when not the default.
    pub daemon_socket: Option<PathBuf>,
    pub runtime_config: RuntimeConfig,
    pub prev_result: Option<Value>,
    /// The GC list: the union of both attachment keys, `None` when neither was sent.
    /// Private so that code cannot mistake "not sent" for "nothing is valid".
    valid_attachments: Option<Vec<Attachment>>,
    /// Every top-level key not read above (`dns`, `args`, `capabilities`...), unchanged.
    pub extra: Map<String, Value>,
    raw: Value,
}

impl NetConf {
    /// Parses stdin. Malformed JSON or a non-object is code 6; a missing `cniVersion`,
    /// `name` or `type`, or a field of the wrong type, is code 7 naming the field.
    /// Whether the configuration suits a command is [`NetConf::validate_for`]'s job.
    pub fn parse(stdin: &[u8]) -> Result<Self, CniError> {
        let raw: Value =
            serde_json::from_slice(stdin).map_err(|err| ConfigError::Syntax(err.to_string()))?;
        Ok(Self::from_raw(raw)?)
    }

    fn from_raw(raw: Value) -> Result<Self, ConfigError> {
        let Value::Object(mut map) = raw.clone() else {
            return Err(ConfigError::NotAnObject);
        };
        let cni_version = required_string(&mut map, "cniVersion")?;
        let name = required_string(&mut map, "name")?;
        let plugin_type = required_string(&mut map, "type")?;
        let valid = optional::<Vec<Attachment>>(&mut map, VALID_ATTACHMENTS_KEY)?;
        let legacy = optional::<Vec<Attachment>>(&mut map, LEGACY_ATTACHMENTS_KEY)?;
        Ok(Self {
            cni_version,
            name,
            plugin_type,
            ipam: optional(&mut map, "ipam")?,
            mtu: optional(&mut map, "mtu")?,
            ip_masq: optional(&mut map, "ipMasq")?.unwrap_or(false),
            cluster_cidrs: optional(&mut map, "clusterCIDRs")?.unwrap_or_default(),
            daemon_socket: optional(&mut map, "daemonSocket")?,
            runtime_config: optional(&mut map, "runtimeConfig")?.unwrap_or_default(),
            prev_result: map.remove("prevResult").filter(|v| !v.is_null()),
            valid_attachments: union(valid, legacy),
            extra: map,
            raw,
        })
    }

    /// The parsed `cniVersion`; code 1 when this plugin does not speak it.
    pub fn version(&self) -> Result<CniVersion, CniError> {
        self.cni_version.parse()
    }

    /// The still-valid attachments of a GC request. Empty when the runtime sent no list,
    /// which [`NetConf::validate_for`] refuses for GC, so after validation an empty slice
    /// really means "nothing is valid".
    pub fn valid_attachments(&self) -> &[Attachment] {
        self.valid_attachments.as_deref().unwrap_or_default()
    }

    /// `ipam.type`, checked to be present and a plain file name (code 7), since it is
    /// looked up as a file in `CNI_PATH`.
    pub fn ipam_type(&self) -> Result<&str, CniError> {
        Ok(self.checked_ipam_type()?)
    }

    /// `runtimeConfig.mac` as bytes, checked to be a unicast address (code 7).
    pub fn runtime_mac(&self) -> Result<Option<[u8; 6]>, CniError> {
        Ok(self.checked_runtime_mac()?)
    }

    /// The configuration exactly as received (all keys), e.g. to pass to a delegate.
    pub fn raw(&self) -> &Value {
        &self.raw
    }

    /// [`NetConf::raw`] as bytes for a delegate's stdin: the spec gives the delegate "the
    /// same configuration that it received".
    pub fn raw_bytes(&self) -> Vec<u8> {
        self.raw.to_string().into_bytes()
    }
}

fn required_string(map: &mut Map<String, Value>, key: &'static str) -> Result<String, ConfigError> {
    match map.remove(key) {
        None | Some(Value::Null) => Err(ConfigError::MissingField(key)),
        Some(Value::String(s)) if s.is_empty() => {
            Err(ConfigError::invalid(key, "must not be empty"))
        }
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(ConfigError::invalid(
            key,
            format!("expected a string, found {other}"),
        )),
    }
}

/// Takes `key` out of `map`; absent or `null` is `None`, a value of the wrong shape is
/// code 7 naming the key.
fn optional<T: DeserializeOwned>(
    map: &mut Map<String, Value>,
    key: &str,
) -> Result<Option<T>, ConfigError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => serde_json::from_value(value)
            .map(Some)
            .map_err(|err| ConfigError::invalid(key, err)),
    }
}

/// Both GC keys together. A GC frees what is *not* listed, so when they disagree the
/// union is the safe reading: it can only keep more.
fn union(
    valid: Option<Vec<Attachment>>,
    legacy: Option<Vec<Attachment>>,
) -> Option<Vec<Attachment>> {
    match (valid, legacy) {
        (None, None) => None,
        (Some(list), None) | (None, Some(list)) => Some(list),
        (Some(mut list), Some(legacy)) => {
            for attachment in legacy {
                if !list.contains(&attachment) {
                    list.push(attachment);
                }
            }
            Some(list)
        }
    }
}
