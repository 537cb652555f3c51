//! hostPort mappings: the `HOSTPORTS` map kept equal to the endpoint records' port
//! mappings, the `HOSTPORT_TARGETS` bitmap equal to the container ports they lead to
//! (and its last slot to how many there are),
//! and the conflict rule (one (protocol, host address, host port) per node), and the
//! ports no mapping may take ([`refused_port`]): the node's ephemeral range, whose
//! ports its own connections leave from, and the ports the node's services listen on.

use std::{
    collections::{BTreeMap, HashSet},
    net::{IpAddr, Ipv4Addr},
};

use aya::maps::{Array, HashMap, MapData, MapError};
use cni_ebpf_common::{
    PortKey, PortTarget, TARGET_COUNT,
    ip_proto::{TCP, UDP},
};

use cni_api::Protocol;

use crate::model::record::{EndpointRecord, HostPortMapping};

#[derive(Debug, thiserror::Error)]
pub enum HostPortError {
    #[error("{0}")]
    Conflict(String),
    #[error("hostPort mapping {0}: {1}")]
    Invalid(String, &'static str),
    #[error("hostPorts map: {0}")]
    Map(#[from] MapError),
}

pub struct HostPorts {
    map: HashMap<MapData, PortKey, PortTarget>,
    targets: Array<MapData, u32>,
    /// Mappings per container port (whatever the protocol): a port's bit is set while
    /// its count is above zero.
    target_counts: BTreeMap<u16, usize>,
}

impl HostPorts {
    /// Makes the maps hold exactly the mappings of `endpoints`. The wanted mappings go
    /// in (over equal ones) before stale ones go, and the bitmap is rewritten word by
    /// word: a restart never leaves a moment without a live mapping, in which a
    /// connection through it would meet the node's stack and be reset (found by
    /// `deploy_end_to_end`'s hostPort stream across an upgrade).
    pub fn open<'a>(
        map: HashMap<MapData, PortKey, PortTarget>,
        targets: Array<MapData, u32>,
        endpoints: impl Iterator<Item = &'a EndpointRecord>,
    ) -> Result<Self, HostPortError> {
        let before: Vec<PortKey> = map.keys().collect::<Result<_, _>>()?;
        let mut host_ports = Self {
            map,
            targets,
            target_counts: BTreeMap::new(),
        };
        let mut wanted: HashSet<PortKey> = HashSet::new();
        for endpoint in endpoints {
            host_ports.add(endpoint)?;
            wanted.extend(entries(endpoint)?.into_iter().map(|(key, _)| key));
        }
        for key in before.iter().filter(|key| !wanted.contains(*key)) {
            crate::maps::removed(host_ports.map.remove(key))?;
        }
        for word in 0..TARGET_COUNT {
            let first = u16::try_from(word * 32).unwrap_or(u16::MAX);
            let bits = host_ports
                .target_counts
                .range(first..=first.saturating_add(31))
                .fold(0u32, |bits, (port, _)| bits | 1 << (port % 32));
            if host_ports.targets.get(&word, 0)? != bits {
                host_ports.targets.set(word, bits, 0)?;
            }
        }
        let ports = u32::try_from(host_ports.target_counts.len()).unwrap_or(u32::MAX);
        host_ports.targets.set(TARGET_COUNT, ports, 0)?;
        Ok(host_ports)
    }

    /// Adds `endpoint`'s mappings: all of them, or none when one fails.
    pub fn add(&mut self, endpoint: &EndpointRecord) -> Result<(), HostPortError> {
        let entries = entries(endpoint)?;
        for (done, (key, target)) in entries.iter().enumerate() {
            let added = self
                .map
                .insert(key, target, 0)
                .map_err(HostPortError::from)
                .and_then(|()| self.count_target(target.pod_port, true));
            if let Err(error) = added {
                let _ = crate::maps::removed(self.map.remove(key));
                for (key, target) in &entries[..done] {
                    let _ = crate::maps::removed(self.map.remove(key));
                    let _ = self.count_target(target.pod_port, false);
                }
                return Err(error);
            }
        }
        Ok(())
    }

    pub fn remove(&mut self, endpoint: &EndpointRecord) -> Result<(), HostPortError> {
        for (key, target) in entries(endpoint)? {
            crate::maps::removed(self.map.remove(&key))?;
            self.count_target(target.pod_port, false)?;
        }
        Ok(())
    }

    /// One mapping more (`more`) or less leads to `port`; its bit follows.
    fn count_target(&mut self, port: u16, more: bool) -> Result<(), HostPortError> {
        let count = self.target_counts.entry(port).or_default();
        *count = if more {
            *count + 1
        } else {
            count.saturating_sub(1)
        };
        if *count == 0 {
            self.target_counts.remove(&port);
        }
        let word = u32::from(port) / 32;
        let first = u16::try_from(word * 32).unwrap_or(u16::MAX);
        let bits = self
            .target_counts
            .range(first..=first.saturating_add(31))
            .fold(0u32, |bits, (port, _)| bits | 1 << (port % 32));
        self.targets.set(word, bits, 0)?;
        let ports = u32::try_from(self.target_counts.len()).unwrap_or(u32::MAX);
        self.targets.set(TARGET_COUNT, ports, 0)?;
        Ok(())
    }
}

/// The IP protocol number of a mapping's `protocol`, for those hostPorts support (TCP
/// and UDP).
pub fn ip_proto(protocol: Protocol) -> Option<u8> {
    match protocol {
        Protocol::Tcp => Some(TCP),
        Protocol::Udp => Some(UDP),
        Protocol::Sctp => None,
    }
}

/// The map entries of an endpoint's mappings (IPv4 only: the datapath is IPv4).
pub fn entries(endpoint: &EndpointRecord) -> Result<Vec<(PortKey, PortTarget)>, HostPortError> {
    if endpoint.port_mappings.is_empty() {
        return Ok(Vec::new());
    }
    let pod_addr = endpoint
        .ipv4_addrs()
        .next()
        .ok_or_else(|| HostPortError::Invalid("(all)".into(), "the pod has no IPv4 address"))?;
    endpoint
        .port_mappings
        .iter()
        .map(|mapping| {
            let Some(proto) = ip_proto(mapping.protocol) else {
                return Err(HostPortError::Invalid(
                    describe(mapping),
                    "protocol is not tcp or udp",
                ));
            };
            let host_addr = match host_ip(mapping) {
                None => Ipv4Addr::UNSPECIFIED,
                Some(IpAddr::V4(addr)) => addr,
                Some(IpAddr::V6(_)) => {
                    return Err(HostPortError::Invalid(
                        describe(mapping),
                        "an IPv6 hostIP is not supported",
                    ));
                }
            };
            Ok((
                PortKey {
                    host_addr: host_addr.octets(),
                    host_port: mapping.host_port,
                    proto,
                    pad: 0,
                },
                PortTarget {
                    pod_addr: pod_addr.octets(),
                    pod_port: mapping.container_port,
                    pad: [0; 2],
                },
            ))
        })
        .collect()
}

/// The first mapping of `candidate` that another endpoint already holds: same protocol
/// and host port, and the same host address or either one meaning "every address".
pub fn conflict<'a>(
    existing: impl Iterator<Item = &'a EndpointRecord>,
    candidate: &EndpointRecord,
) -> Option<String> {
    for other in existing.filter(|other| other.id != candidate.id) {
        for theirs in &other.port_mappings {
            for ours in &candidate.port_mappings {
                let same_port =
                    ours.protocol == theirs.protocol && ours.host_port == theirs.host_port;
                let same_addr = match (host_ip(ours), host_ip(theirs)) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                };
                if same_port && same_addr {
                    return Some(format!(
                        "host port {} is already mapped to {}/{}",
                        describe(ours),
                        other.id.container_id,
                        other.id.ifname
                    ));
                }
            }
        }
    }
    None
}

/// The first mapping of `candidate` onto the overlay's UDP `port` (`--routing vxlan`),
/// on any address: the node's tunnel socket listens there on every address, and the
/// uplink's program takes what other nodes send there for the overlay, so such a
/// mapping could never be served, while the part of the tunnel's traffic it caught
/// would be cut off from the cluster.
pub fn overlays(candidate: &EndpointRecord, port: u16) -> Option<String> {
    candidate
        .port_mappings
        .iter()
        .find(|mapping| ip_proto(mapping.protocol) == Some(UDP) && mapping.host_port == port)
        .map(|mapping| {
            format!(
                "host port {} is the overlay's (--routing vxlan): every node's tunnel \
                 packets arrive there",
                describe(mapping)
            )
        })
}

/// Ports of the node's own services no hostPort may take, with what they are: the
/// kubelet's, kube-proxy's, and the daemon's own listeners (added by the caller).
pub const NODE_SERVICE_PORTS: [(u16, &str); 4] = [
    (10248, "the kubelet's health port"),
    (10249, "kube-proxy's metrics port"),
    (10250, "the kubelet's API port"),
    (10256, "kube-proxy's health port"),
];

/// Where the kernel keeps the ephemeral range (`net.ipv4.ip_local_port_range`) and the
/// ports taken out of it (`net.ipv4.ip_local_reserved_ports`), in the caller's
/// namespace.
const LOCAL_PORT_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
const LOCAL_RESERVED_PORTS: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";

/// Why a mapping of `candidate` may not have its host port, if one may not: a port of
/// the node's ephemeral range (the node's own connections leave from those ports, and
/// their answers would be the mapping's) unless reserved out of it, or one of `denied`.
pub fn refused_port(candidate: &EndpointRecord, denied: &[(u16, String)]) -> Option<String> {
    if candidate.port_mappings.is_empty() {
        return None;
    }
    let ephemeral = std::fs::read_to_string(LOCAL_PORT_RANGE)
        .ok()
        .and_then(|text| {
            let mut bounds = text.split_whitespace().map(str::parse::<u16>);
            Some((bounds.next()?.ok()?, bounds.next()?.ok()?))
        });
    let reserved = std::fs::read_to_string(LOCAL_RESERVED_PORTS).unwrap_or_default();
    candidate.port_mappings.iter().find_map(|mapping| {
        let port = mapping.host_port;
        if let Some((_, what)) = denied.iter().find(|(denied, _)| *denied == port) {
            return Some(format!("host port {} is {what}", describe(mapping)));
        }
        let (low, high) = ephemeral?;
        ((low..=high).contains(&port) && !in_port_list(&reserved, port)).then(|| {
            format!(
                "host port {} is in the node's ephemeral range {low}-{high} \
                 (net.ipv4.ip_local_port_range), which its own connections leave from: \
                 choose a port outside it, or reserve it (net.ipv4.ip_local_reserved_ports)",
                describe(mapping)
            )
        })
    })
}

/// Whether `port` is in `list`, as the kernel prints a port list: `a,b-c,...`.
fn in_port_list(list: &str, port: u16) -> bool {
    list.trim().split(',').any(|item| {
        let mut bounds = item.split('-').map(|bound| bound.trim().parse::<u16>());
        match (bounds.next(), bounds.next()) {
            (Some(Ok(low)), Some(Ok(high))) => (low..=high).contains(&port),
            (Some(Ok(single)), None) => single == port,
            _ => false,
        }
    })
}

/// The mapping's host address; `None` (or 0.0.0.0) means every node address.
fn host_ip(mapping: &HostPortMapping) -> Option<IpAddr> {
    mapping.host_ip.filter(|ip| !ip.is_unspecified())
}

fn describe(mapping: &HostPortMapping) -> String {
    match host_ip(mapping) {
        Some(ip) => format!("{ip}:{}/{}", mapping.host_port, mapping.protocol),
        None => format!("{}/{}", mapping.host_port, mapping.protocol),
    }
}

#[cfg(test)]
mod port_list_tests {
    use super::in_port_list;

    #[test]
    fn a_port_list_reads_as_the_kernel_prints_it() {
        assert!(in_port_list("8080,40000-40010\n", 40005));
        assert!(in_port_list("8080,40000-40010", 8080));
        assert!(!in_port_list("8080,40000-40010", 40011));
        assert!(!in_port_list("", 40000));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(id: &str, mappings: &[(u16, &str, Option<&str>)]) -> EndpointRecord {
        EndpointRecord {
            port_mappings: mappings
                .iter()
                .map(|(port, proto, ip)| HostPortMapping {
                    host_port: *port,
                    container_port: 80,
                    protocol: proto.parse().expect("a protocol"),
                    host_ip: ip.map(|ip| ip.parse().expect("ip")),
                })
                .collect(),
            ..EndpointRecord::for_tests(id)
        }
    }

    #[test]
    fn the_same_port_and_protocol_conflict_when_addresses_overlap() {
        let any = endpoint("a", &[(8080, "tcp", None)]);
        let specific = endpoint("b", &[(8080, "tcp", Some("198.18.0.1"))]);
        assert!(
            conflict([&any].into_iter(), &specific).is_some(),
            "any vs specific"
        );
        assert!(
            conflict([&specific].into_iter(), &any).is_some(),
            "specific vs any"
        );
        let other_addr = endpoint("c", &[(8080, "tcp", Some("198.18.0.3"))]);
        assert!(
            conflict([&specific].into_iter(), &other_addr).is_none(),
            "two addresses"
        );
        let udp = endpoint("d", &[(8080, "udp", None)]);
        assert!(conflict([&any].into_iter(), &udp).is_none(), "tcp and udp");
        assert!(
            conflict([&any].into_iter(), &endpoint("a", &[(8080, "tcp", None)])).is_none(),
            "a retried ADD"
        );
    }

    #[test]
    fn the_overlays_udp_port_is_no_host_port() {
        let on_it = endpoint("a", &[(80, "tcp", None), (8472, "udp", Some("198.18.0.1"))]);
        assert_eq!(
            overlays(&on_it, 8472).as_deref(),
            Some(
                "host port 198.18.0.1:8472/udp is the overlay's (--routing vxlan): every \
                 node's tunnel packets arrive there"
            )
        );
        let tcp = endpoint("b", &[(8472, "tcp", None)]);
        assert_eq!(overlays(&tcp, 8472), None, "TCP has the port free");
        assert_eq!(overlays(&on_it, 4789), None, "another overlay port");
    }

    #[test]
    fn entries_point_at_the_pods_ipv4_and_refuse_ipv6_host_ips() {
        let entries = entries(&endpoint(
            "a",
            &[(8080, "tcp", None), (53, "udp", Some("198.18.0.1"))],
        ))
        .expect("valid");
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0].0,
            PortKey {
                host_addr: [0; 4],
                host_port: 8080,
                proto: 6,
                pad: 0
            }
        );
        assert_eq!(entries[1].0.host_addr, [198, 18, 0, 1]);
        assert_eq!(
            entries[1].1,
            PortTarget {
                pod_addr: [10, 244, 1, 2],
                pod_port: 80,
                pad: [0; 2]
            }
        );
        assert!(super::entries(&endpoint("b", &[(80, "tcp", Some("fd00::1"))])).is_err());
        assert!(super::entries(&endpoint("c", &[(80, "sctp", None)])).is_err());
    }
}
