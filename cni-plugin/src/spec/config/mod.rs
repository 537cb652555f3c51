//! The network configuration on stdin: typed fields this plugin reads, everything else
//! kept, and the original JSON kept whole for delegation to the IPAM plugin.

mod bandwidth;
mod runtime;
mod validate;

use std::path::PathBuf;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

pub use bandwidth::{DEFAULT_MTU, Limit, Shaping};
pub use runtime::{Bandwidth, PortMapping, Protocol, RuntimeConfig, parse_unicast_mac};

use super::env::Command;
use super::error::CniError;
use super::go_json;
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

/// The `ipam` section. Only `type` is read here; the IPAM plugin reads the rest from the
/// configuration it is given whole ([`NetConf::raw`], with a `usePodCidr` range filled
/// with the node's pod ranges: `ipam::pod_cidr`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct IpamConf {
    /// Missing reads as "" so that the error can name `ipam.type` rather than `type`.
    #[serde(rename = "type", default)]
    pub plugin_type: String,
}

/// Our own key `podDevice`: the kind of device pair that joins a pod to the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodDevice {
    /// A veth pair, bound to the pods' TC block: every kernel the daemon runs on.
    #[default]
    Veth,
    /// A netkit pair (Linux 6.7 with `CONFIG_NETKIT`), the pod program on its own hook:
    /// what a pod sends is forwarded from within its own transmit, without the veth's
    /// second pass through the node's backlog queue.
    Netkit,
}

/// One still-valid attachment in a GC request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
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
    /// Our own key `ipamTimeout`: seconds one run of the IPAM plugin may take (1 to 600;
    /// default: `ipam::DEFAULT_TIMEOUT`).
    pub ipam_timeout: Option<u64>,
    /// Our own key `podDevice`: `veth` (the default) or `netkit`.
    pub pod_device: PodDevice,
    /// The bandwidth plugin's keys at the top level (`ingressRate`...), `None` when
    /// none is there; [`NetConf::shaping`] reads them with `runtimeConfig.bandwidth`.
    pub bandwidth: Option<Bandwidth>,
    pub runtime_config: RuntimeConfig,
    pub prev_result: Option<Value>,
    /// The GC list: the union of both attachment keys, `None` when neither was sent.
    /// Private so that code cannot mistake "not sent" for "nothing is valid".
    valid_attachments: Option<Vec<Attachment>>,
    /// Every top-level key not read above (`dns`, `args`, `capabilities`...), unchanged.
    pub extra: Map<String, Value>,
    /// Values of keys the command does not act on that could not be read (see
    /// [`NetConf::parse_for`]); they read as absent.
    set_aside: Vec<ConfigError>,
    raw: Value,
}

/// The top-level keys this plugin reads; a key equal to one of them under Go's case-
/// insensitive rule (`spec::go_json`) is that key.
const KEYS: [&str; 18] = [
    "cniVersion",
    "name",
    "type",
    "ipam",
    "mtu",
    "ipMasq",
    "clusterCIDRs",
    "daemonSocket",
    "ipamTimeout",
    "podDevice",
    BANDWIDTH_KEYS[0],
    BANDWIDTH_KEYS[1],
    BANDWIDTH_KEYS[2],
    BANDWIDTH_KEYS[3],
    "runtimeConfig",
    "prevResult",
    VALID_ATTACHMENTS_KEY,
    LEGACY_ATTACHMENTS_KEY,
];

/// The bandwidth plugin's top-level keys.
const BANDWIDTH_KEYS: [&str; 4] = ["ingressRate", "ingressBurst", "egressRate", "egressBurst"];

/// Whether `command` acts on the top-level `key`. Only ADD reads the pod's settings
/// (`mtu`, `ipMasq`, `clusterCIDRs`, `podDevice`, the bandwidth keys, `runtimeConfig`)
/// strictly, and `ipamTimeout` (the
/// other verbs fall back to the default when it is unreadable), and only GC the
/// attachment lists;
/// everything else is needed by every verb (`daemonSocket` and `ipam` to find the daemon
/// and the IPAM plugin; `cniVersion`, `name` and `type` are the spec's required keys).
fn acts_on(command: Command, key: &str) -> bool {
    match key {
        "mtu" | "ipMasq" | "clusterCIDRs" | "runtimeConfig" | "ipamTimeout" | "podDevice" => {
            command == Command::Add
        }
        key if BANDWIDTH_KEYS.contains(&key) => command == Command::Add,
        VALID_ATTACHMENTS_KEY | LEGACY_ATTACHMENTS_KEY => command == Command::Gc,
        _ => true,
    }
}

impl NetConf {
    /// Parses stdin, every key strictly. Malformed JSON or a non-object is code 6; a
    /// missing `cniVersion`, `name` or `type`, or a field of the wrong type, is code 7
    /// naming the field. Keys are matched as Go matches them (`spec::go_json`), since the
    /// runtimes are Go programs. Whether the configuration suits a command is
    /// [`NetConf::validate_for`]'s job.
    pub fn parse(stdin: &[u8]) -> Result<Self, CniError> {
        Ok(Self::from_raw(syntax(stdin)?, |_| true)?)
    }

    /// Parses stdin for `command`: like [`NetConf::parse`], except that a key the command
    /// does not act on (`runtimeConfig` for DEL, say) and cannot be read is set aside
    /// ([`NetConf::set_aside`]) and reads as absent. The spec asks DEL to clean up as far
    /// as it can, and a runtime retries a failed DEL forever (containerd keeps the
    /// sandbox), so a value DEL has no use for must not stop it.
    pub fn parse_for(stdin: &[u8], command: Command) -> Result<Self, CniError> {
        Ok(Self::from_raw(syntax(stdin)?, |key| acts_on(command, key))?)
    }

    fn from_raw(raw: Value, strict: impl Fn(&str) -> bool) -> Result<Self, ConfigError> {
        let Value::Object(map) = raw.clone() else {
            return Err(ConfigError::NotAnObject);
        };
        let mut fields = Fields {
            map: go_json::match_fields(map, &KEYS),
            strict,
            set_aside: Vec::new(),
        };
        let cni_version = fields.required_string("cniVersion")?;
        let name = fields.required_string("name")?;
        let plugin_type = fields.required_string("type")?;
        let valid = fields.optional::<Vec<Attachment>>(VALID_ATTACHMENTS_KEY)?;
        let legacy = fields.optional::<Vec<Attachment>>(LEGACY_ATTACHMENTS_KEY)?;
        Ok(Self {
            cni_version,
            name,
            plugin_type,
            ipam: fields.optional("ipam")?,
            mtu: fields.optional("mtu")?,
            ip_masq: fields.optional("ipMasq")?.unwrap_or(false),
            cluster_cidrs: fields.optional("clusterCIDRs")?.unwrap_or_default(),
            daemon_socket: fields.optional("daemonSocket")?,
            ipam_timeout: fields.optional("ipamTimeout")?,
            pod_device: fields.optional("podDevice")?.unwrap_or_default(),
            bandwidth: fields.bandwidth()?,
            runtime_config: fields.optional("runtimeConfig")?.unwrap_or_default(),
            prev_result: fields.map.remove("prevResult"),
            valid_attachments: union(valid, legacy),
            extra: fields.map,
            set_aside: fields.set_aside,
            raw,
        })
    }

    /// What [`NetConf::parse_for`] could not read and the command does not need, for the
    /// log.
    pub fn set_aside(&self) -> &[ConfigError] {
        &self.set_aside
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

fn syntax(stdin: &[u8]) -> Result<Value, ConfigError> {
    serde_json::from_slice(stdin).map_err(|err| ConfigError::Syntax(err.to_string()))
}

/// The top-level keys, their spelling matched to [`KEYS`] and `null`s dropped, taken out
/// one by one.
struct Fields<S> {
    map: Map<String, Value>,
    /// Whether a bad value of a key is an error (else it is set aside).
    strict: S,
    set_aside: Vec<ConfigError>,
}

impl<S: Fn(&str) -> bool> Fields<S> {
    fn required_string(&mut self, key: &'static str) -> Result<String, ConfigError> {
        match self.map.remove(key) {
            None => Err(ConfigError::MissingField(key)),
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

    /// Takes `key` out, read with Go's rules; absent is `None`, and so is a value of the
    /// wrong shape when the key is not strict. A strict key's bad value is code 7 naming
    /// the key.
    fn optional<T: DeserializeOwned>(&mut self, key: &str) -> Result<Option<T>, ConfigError> {
        let Some(value) = self.map.remove(key) else {
            return Ok(None);
        };
        match go_json::from_value(value) {
            Ok(typed) => Ok(Some(typed)),
            Err(err) if (self.strict)(key) => Err(ConfigError::invalid(key, err)),
            Err(err) => {
                self.set_aside.push(ConfigError::invalid(key, err));
                Ok(None)
            }
        }
    }
}

impl<S: Fn(&str) -> bool> Fields<S> {
    /// The bandwidth plugin's keys, `None` when none is there.
    fn bandwidth(&mut self) -> Result<Option<Bandwidth>, ConfigError> {
        let [ingress_rate, ingress_burst, egress_rate, egress_burst] = BANDWIDTH_KEYS;
        let bandwidth = Bandwidth {
            ingress_rate: self.optional(ingress_rate)?,
            ingress_burst: self.optional(ingress_burst)?,
            egress_rate: self.optional(egress_rate)?,
            egress_burst: self.optional(egress_burst)?,
        };
        Ok((bandwidth != Bandwidth::default()).then_some(bandwidth))
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
