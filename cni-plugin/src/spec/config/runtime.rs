//! `runtimeConfig`: the per-pod capability arguments the runtime fills in (CONVENTIONS.md:
//! `portMappings`, `bandwidth`, `ips`, `mac`).

use std::fmt;
use std::net::IpAddr;

use crate::spec::serde_helpers::empty_as_none;
use serde::{Deserialize, Serialize};

/// Read with Go's rules (`spec::go_json`): containerd spells the mappings' keys
/// `HostPort`, `ContainerPort`, `Protocol`, `HostIP`. Capabilities this plugin does not use
/// (`aliases`, `io.kubernetes.cri.pod-annotations`...) are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeConfig {
    #[serde(default)]
    pub port_mappings: Vec<PortMapping>,
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
    /// Requested pod IPs, each an address or a CIDR; checked by `validate_for`.
    #[serde(default)]
    pub ips: Vec<String>,
    /// Requested MAC of the pod interface; checked by `validate_for`.
    #[serde(default)]
    pub mac: Option<String>,
}

/// One hostPort mapping. Port 0 is rejected by `validate_for`; above 65535 by parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    #[serde(default)]
    pub protocol: Protocol,
    /// Absent or "" means every host address.
    #[serde(
        rename = "hostIP",
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub host_ip: Option<IpAddr>,
}

/// Lower-case on the wire, as Kubernetes sends it; anything else (e.g. "sctp", "TCP") is
/// rejected rather than guessed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

impl Protocol {
    /// The wire spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

impl From<Protocol> for cni_api::Protocol {
    fn from(protocol: Protocol) -> Self {
        match protocol {
            Protocol::Tcp => Self::Tcp,
            Protocol::Udp => Self::Udp,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Rates in bits per second, bursts in bits (CONVENTIONS.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bandwidth {
    pub ingress_rate: Option<u64>,
    pub ingress_burst: Option<u64>,
    pub egress_rate: Option<u64>,
    pub egress_burst: Option<u64>,
}

/// Parses `aa:bb:cc:dd:ee:ff` (either case) and requires a unicast, non-zero address: a
/// multicast source MAC is invalid on Ethernet and the kernel refuses it.
pub fn parse_unicast_mac(text: &str) -> Result<[u8; 6], String> {
    let mac: cni_api::MacAddr = text
        .parse()
        .map_err(|error: cni_api::MacError| error.to_string())?;
    if mac.is_multicast() {
        return Err("is a multicast address".to_owned());
    }
    if mac.is_zero() {
        return Err("is the all-zero address".to_owned());
    }
    Ok(mac.octets())
}
