//! The daemon's record of a pod's interface: what `Attach` asked, checked, kept in
//! memory and written as the endpoint's state file (`endpoints`). Built once from the
//! request ([`EndpointRecord::from_request`]) and turned back into the wire type only
//! for the answers that carry endpoints ([`EndpointRecord::to_wire`]), so that a field
//! the protocol gains is no disk change, and a disk change no protocol change.
//!
//! The file is JSON with the field names the first records had; [`RECORD_VERSION`]
//! says which layout wrote it (absent: 0, written from the wire type itself, which
//! reads as version 1). A file of a later version is read for the fields this daemon
//! knows.
//!
//! Addresses are kept in both families as the plugin gave them; the methods that
//! feed the IPv4 datapath pick IPv4 in one place each.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
};

use cni_api::{Bandwidth, Endpoint, EndpointId, MacAddr, PodRef, PortMapping, Protocol};
use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};

/// The layout this daemon writes its records in.
pub const RECORD_VERSION: u32 = 1;

/// A pod's interface as the daemon keeps it (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointRecord {
    /// The layout the record was written in (0: before records had one).
    #[serde(default)]
    pub version: u32,
    pub id: EndpointId,
    /// The CNI network name (GC works per network).
    pub network: String,
    pub netns: PathBuf,
    pub host_veth: String,
    pub host_ifindex: u32,
    /// The host-side veth's MAC: the pod's ARP requests are answered with it.
    pub host_mac: MacAddr,
    pub mac: MacAddr,
    pub ips: Vec<IpNet>,
    /// Source-NAT this pod's traffic to destinations outside `cluster_cidrs`.
    pub masquerade: bool,
    /// Destinations that keep the pod's address (the cluster's pod ranges).
    #[serde(default)]
    pub cluster_cidrs: Vec<IpNet>,
    #[serde(default)]
    pub port_mappings: Vec<HostPortMapping>,
    #[serde(default)]
    pub bandwidth: Option<Limits>,
    /// The pod's default gateway, which the node answers at as one of its addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// The Kubernetes pod this interface belongs to, when the runtime said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodName>,
}

/// A hostPort mapping as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPortMapping {
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: Protocol,
    pub host_ip: Option<IpAddr>,
}

/// A pod's rate limits as recorded: bits per second, bursts in bits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub ingress_rate: Option<u64>,
    pub ingress_burst: Option<u64>,
    pub egress_rate: Option<u64>,
    pub egress_burst: Option<u64>,
}

/// The Kubernetes pod as the runtime named it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodName {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl EndpointRecord {
    /// The record of an `Attach` request's endpoint, at this daemon's version.
    pub fn from_request(endpoint: Endpoint) -> Self {
        Self {
            version: RECORD_VERSION,
            id: endpoint.id,
            network: endpoint.network,
            netns: endpoint.netns,
            host_veth: endpoint.host_veth,
            host_ifindex: endpoint.host_ifindex,
            host_mac: endpoint.host_mac,
            mac: endpoint.mac,
            ips: endpoint.ips,
            masquerade: endpoint.masquerade,
            cluster_cidrs: endpoint.cluster_cidrs,
            port_mappings: endpoint
                .port_mappings
                .into_iter()
                .map(|mapping| HostPortMapping {
                    host_port: mapping.host_port,
                    container_port: mapping.container_port,
                    protocol: mapping.protocol,
                    host_ip: mapping.host_ip,
                })
                .collect(),
            bandwidth: endpoint.bandwidth.map(|limits| Limits {
                ingress_rate: limits.ingress_rate,
                ingress_burst: limits.ingress_burst,
                egress_rate: limits.egress_rate,
                egress_burst: limits.egress_burst,
            }),
            gateway: endpoint.gateway,
            pod: endpoint.pod.map(|pod| PodName {
                namespace: pod.namespace,
                name: pod.name,
                uid: pod.uid,
            }),
        }
    }

    /// The endpoint as the protocol carries it (Get, List, Gc's answers).
    pub fn to_wire(&self) -> Endpoint {
        Endpoint {
            id: self.id.clone(),
            network: self.network.clone(),
            netns: self.netns.clone(),
            host_veth: self.host_veth.clone(),
            host_ifindex: self.host_ifindex,
            host_mac: self.host_mac,
            mac: self.mac,
            ips: self.ips.clone(),
            masquerade: self.masquerade,
            cluster_cidrs: self.cluster_cidrs.clone(),
            port_mappings: self
                .port_mappings
                .iter()
                .map(|mapping| PortMapping {
                    host_port: mapping.host_port,
                    container_port: mapping.container_port,
                    protocol: mapping.protocol,
                    host_ip: mapping.host_ip,
                })
                .collect(),
            bandwidth: self.bandwidth.as_ref().map(|limits| Bandwidth {
                ingress_rate: limits.ingress_rate,
                ingress_burst: limits.ingress_burst,
                egress_rate: limits.egress_rate,
                egress_burst: limits.egress_burst,
            }),
            gateway: self.gateway,
            pod: self.pod.as_ref().map(|pod| PodRef {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
            }),
        }
    }

    /// The pod's IPv4 addresses, for the IPv4 datapath.
    pub fn ipv4_addrs(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.ips.iter().filter_map(|net| match net.addr() {
            IpAddr::V4(addr) => Some(addr),
            IpAddr::V6(_) => None,
        })
    }

    /// The pod's IPv4 gateway, if it has one.
    pub fn ipv4_gateway(&self) -> Option<Ipv4Addr> {
        match self.gateway {
            Some(IpAddr::V4(gateway)) => Some(gateway),
            _ => None,
        }
    }

    /// The IPv4 ranges that keep the pod's address.
    pub fn ipv4_cluster_cidrs(&self) -> impl Iterator<Item = Ipv4Net> + '_ {
        self.cluster_cidrs.iter().filter_map(|net| match net {
            IpNet::V4(net) => Some(*net),
            IpNet::V6(_) => None,
        })
    }
}

#[cfg(test)]
impl EndpointRecord {
    /// A record for unit tests: container `container_id`, `eth0`, at 10.244.1.2/24,
    /// masqueraded, nothing else.
    pub fn for_tests(container_id: &str) -> Self {
        Self {
            version: RECORD_VERSION,
            id: EndpointId {
                container_id: container_id.to_owned(),
                ifname: "eth0".to_owned(),
            },
            network: "pods".to_owned(),
            netns: format!("/run/netns/{container_id}").into(),
            host_veth: format!("veb{container_id}"),
            host_ifindex: 7,
            host_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            mac: MacAddr([2, 0, 0, 0, 0, 2]),
            ips: vec!["10.244.1.2/24".parse().expect("a prefix")],
            masquerade: true,
            cluster_cidrs: Vec::new(),
            port_mappings: Vec::new(),
            bandwidth: None,
            gateway: None,
            pod: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire() -> Endpoint {
        Endpoint {
            id: EndpointId {
                container_id: "c1".into(),
                ifname: "eth0".into(),
            },
            network: "pods".into(),
            netns: "/run/netns/p".into(),
            host_veth: "veb000000000001".into(),
            host_ifindex: 7,
            host_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            mac: MacAddr([2, 0, 0, 0, 0, 2]),
            ips: vec![
                "10.244.1.2/24".parse().expect("a prefix"),
                "fd00::2/64".parse().expect("a prefix"),
            ],
            masquerade: true,
            cluster_cidrs: vec!["10.244.0.0/16".parse().expect("a prefix")],
            port_mappings: vec![PortMapping {
                host_port: 30080,
                container_port: 80,
                protocol: Protocol::Tcp,
                host_ip: None,
            }],
            bandwidth: Some(Bandwidth {
                egress_rate: Some(8_000_000),
                egress_burst: Some(800_000),
                ..Bandwidth::default()
            }),
            gateway: Some("10.244.1.1".parse().expect("an address")),
            pod: Some(PodRef {
                namespace: Some("default".into()),
                name: Some("web".into()),
                uid: None,
            }),
        }
    }

    #[test]
    fn a_record_gives_back_the_endpoint_it_was_made_from() {
        let record = EndpointRecord::from_request(wire());
        assert_eq!(record.version, RECORD_VERSION);
        assert_eq!(record.to_wire(), wire());
        assert_eq!(
            record.ipv4_addrs().collect::<Vec<_>>(),
            [Ipv4Addr::new(10, 244, 1, 2)]
        );
        assert_eq!(record.ipv4_gateway(), Some(Ipv4Addr::new(10, 244, 1, 1)));
    }

    #[test]
    fn a_file_written_before_records_had_a_version_reads_and_the_next_write_adds_it() {
        // A record file as the daemon wrote it from the wire type itself (0.1.0's
        // development before records had a version).
        let before = r#"{
          "id": {"container_id": "c1", "ifname": "eth0"},
          "network": "pods",
          "netns": "/run/netns/p",
          "host_veth": "veb000000000001",
          "host_ifindex": 7,
          "host_mac": "02:00:00:00:00:01",
          "mac": "02:00:00:00:00:02",
          "ips": ["10.244.1.2/24", "fd00::2/64"],
          "masquerade": true,
          "cluster_cidrs": ["10.244.0.0/16"],
          "port_mappings": [
            {"host_port": 30080, "container_port": 80, "protocol": "tcp", "host_ip": null}
          ],
          "bandwidth": {
            "ingress_rate": null, "ingress_burst": null,
            "egress_rate": 8000000, "egress_burst": 800000
          },
          "gateway": "10.244.1.1",
          "pod": {"namespace": "default", "name": "web"}
        }"#;
        let record: EndpointRecord = serde_json::from_str(before).expect("read");
        assert_eq!(record.version, 0);
        assert_eq!(record.to_wire(), wire());
        let written = serde_json::to_value(&record).expect("JSON");
        let mut expected = serde_json::to_value(wire()).expect("JSON");
        expected["version"] = serde_json::json!(0);
        assert_eq!(written, expected, "the same fields, and the version");
    }

    #[test]
    fn a_later_versions_record_is_read_for_the_fields_this_daemon_knows() {
        let mut later = serde_json::to_value(EndpointRecord::from_request(wire())).expect("JSON");
        later["version"] = serde_json::json!(RECORD_VERSION + 1);
        later["something_new"] = serde_json::json!({"a": 1});
        let record: EndpointRecord = serde_json::from_value(later).expect("read");
        assert_eq!(record.to_wire(), wire());
    }
}
