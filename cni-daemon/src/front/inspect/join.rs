//! Joining what the daemon answers (endpoints, their port mappings, its status) with
//! what was read from the pinned maps, into the views the commands show.

use std::{collections::BTreeMap, net::Ipv4Addr};

use cni_ebpf_common::{EndpointCounters, NatEntry, NatKey};
use serde::Serialize;

use cni_api::{Endpoint, LinkCounters, Status};

use super::read::HostPortConnections;
use crate::model::hostports;

/// An endpoint with its counters, as `ebpf-cnid endpoints` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointView {
    #[serde(flatten)]
    pub endpoint: Endpoint,
    pub counters: CountersView,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CountersView {
    pub from_pod_packets: u64,
    pub from_pod_bytes: u64,
    pub to_pod_packets: u64,
    pub to_pod_bytes: u64,
}

impl From<EndpointCounters> for CountersView {
    fn from(c: EndpointCounters) -> Self {
        Self {
            from_pod_packets: c.from_pod_packets,
            from_pod_bytes: c.from_pod_bytes,
            to_pod_packets: c.to_pod_packets,
            to_pod_bytes: c.to_pod_bytes,
        }
    }
}

/// Joins the daemon's endpoints with the pinned counters; "to pod" adds what went
/// through the host veths' transmit (`stack_sent`, their kernel TX counters) to what the
/// datapath handed straight in, or is those counters alone for a pod whose host veth is
/// `queued` (its frames all leave through that veth's qdisc, see
/// `endpoint_flags::SHAPED`, which the datapath counts as well).
pub fn endpoint_views(
    endpoints: Vec<Endpoint>,
    counters: &BTreeMap<u32, EndpointCounters>,
    stack_sent: &[LinkCounters],
    queued: &[u32],
) -> Vec<EndpointView> {
    endpoints
        .into_iter()
        .map(|endpoint| {
            let mut view = counters
                .get(&endpoint.host_ifindex)
                .copied()
                .map(CountersView::from)
                .unwrap_or_default();
            let sent = stack_sent
                .iter()
                .find(|sent| sent.ifindex == endpoint.host_ifindex);
            match sent {
                // The TX counters hold the datapath's deliveries too, those the qdisc
                // let through.
                Some(sent) if queued.contains(&endpoint.host_ifindex) => {
                    view.to_pod_packets = sent.packets;
                    view.to_pod_bytes = sent.bytes;
                }
                Some(sent) => {
                    view.to_pod_packets += sent.packets;
                    view.to_pod_bytes += sent.bytes;
                }
                None => {}
            }
            EndpointView {
                counters: view,
                endpoint,
            }
        })
        .collect()
}

/// `ebpf-cnid nodes`: the daemon's view of the cluster, each node with what this node's
/// pods sent it.
#[derive(Debug, Clone, Serialize)]
pub struct NodesTable {
    pub node_name: Option<String>,
    pub node_source: Option<String>,
    pub routing: Option<String>,
    pub nodes: Vec<NodeRow>,
    /// What is refused of the other nodes, with why.
    pub refused: Vec<cni_api::RefusedInfo>,
}

/// One node of [`NodesTable`].
#[derive(Debug, Clone, Serialize)]
pub struct NodeRow {
    pub name: String,
    pub address: Ipv4Addr,
    pub pod_cidrs: Vec<ipnet::Ipv4Net>,
    /// This node.
    pub this: bool,
    /// Packets and bytes this node's pods sent to that node's pods.
    pub sent_packets: u64,
    pub sent_bytes: u64,
}

/// Joins the daemon's `view` with the pinned per-node counters.
pub fn nodes_table(
    view: cni_api::NodesView,
    counters: &BTreeMap<Ipv4Addr, cni_ebpf_common::TrafficCounters>,
) -> NodesTable {
    let nodes = view
        .nodes
        .into_iter()
        .map(|node| {
            let sent = counters.get(&node.address).copied().unwrap_or_default();
            NodeRow {
                this: view.node_name.as_deref() == Some(node.name.as_str()),
                name: node.name,
                address: node.address,
                pod_cidrs: node.pod_cidrs,
                sent_packets: sent.packets,
                sent_bytes: sent.bytes,
            }
        })
        .collect();
    NodesTable {
        node_name: view.node_name,
        node_source: view.node_source,
        routing: view.routing,
        nodes,
        refused: view.refused,
    }
}

/// `ebpf-cnid policy`: the daemon's view of the NetworkPolicies in force, each policy
/// with its counters.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyTable {
    pub source: Option<String>,
    pub answered: bool,
    pub mode: String,
    pub generation: u32,
    pub policies: Vec<PolicyRow>,
    pub pods: Vec<cni_api::PolicyPodInfo>,
    pub refused: Vec<cni_api::RefusedObject>,
}

/// One policy of [`PolicyTable`].
#[derive(Debug, Clone, Serialize)]
pub struct PolicyRow {
    #[serde(flatten)]
    pub policy: cni_api::PolicyInfo,
    /// Flows a way of this policy let through.
    pub allowed: u64,
    /// Packets dropped at a pod it isolates (what no way let through).
    pub denied: u64,
    /// Flows that would have been dropped, let through in audit mode (counted at their
    /// first packet).
    pub audited: u64,
}

/// Joins the daemon's `view` with the pinned per-policy counters, by slot.
pub fn policy_table(
    view: cni_api::PoliciesView,
    counters: &BTreeMap<u32, cni_ebpf_common::PolicyCounters>,
) -> PolicyTable {
    let policies = view
        .policies
        .into_iter()
        .map(|policy| {
            let counted = counters.get(&policy.slot).copied().unwrap_or_default();
            PolicyRow {
                policy,
                allowed: counted.allowed,
                denied: counted.denied,
                audited: counted.audited,
            }
        })
        .collect();
    PolicyTable {
        source: view.source,
        answered: view.answered,
        mode: view.mode,
        generation: view.generation,
        policies,
        pods: view.pods,
        refused: view.refused,
    }
}

/// `ebpf-cnid status`: the daemon's answer, the drop and the NAT counters.
#[derive(Debug, Clone, Serialize)]
pub struct StatusView {
    #[serde(flatten)]
    pub status: Status,
    pub drops: BTreeMap<&'static str, u64>,
    pub nat_counters: BTreeMap<&'static str, u64>,
}

/// One hostPort mapping, as `ebpf-cnid ports` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PortRow {
    pub protocol: cni_api::Protocol,
    /// `None`: every node address.
    pub host_ip: Option<std::net::IpAddr>,
    pub host_port: u16,
    pub pod_ip: Option<std::net::IpAddr>,
    pub container_port: u16,
    pub container_id: String,
    pub ifname: String,
    /// Connections through the mapping the datapath follows (see [`live_connections`]).
    pub connections: usize,
}

/// The connections through hostPort mappings but those idle past their timeout, which
/// the next sweep removes. While the daemon wrote no timeouts (NAT off) nothing expires
/// them: all of them.
pub fn live_connections(read: HostPortConnections) -> Vec<(NatKey, NatEntry)> {
    let HostPortConnections {
        connections,
        timeouts,
        now_ns,
    } = read;
    let mut live = Vec::new();
    for (key, connection) in connections {
        let expired = timeouts
            .as_ref()
            .is_some_and(|timeouts| timeouts.expired(&connection, key.proto, now_ns));
        if !expired {
            live.push((key, connection));
        }
    }
    live
}

/// Whether `connection` (keyed by `key`) goes through the mapping `row`.
fn through(row: &PortRow, key: &NatKey, connection: &NatEntry) -> bool {
    let Some(proto) = hostports::ip_proto(row.protocol) else {
        return false;
    };
    let host_matches = match row.host_ip {
        None => true,
        Some(std::net::IpAddr::V4(ip)) => ip.octets() == connection.node_addr,
        Some(std::net::IpAddr::V6(_)) => false,
    };
    key.proto == proto
        && connection.node_port == row.host_port
        && host_matches
        && row.pod_ip == Some(std::net::IpAddr::V4(Ipv4Addr::from(key.pod_addr)))
        && key.pod_port == row.container_port
}

/// Every endpoint's mappings, sorted by protocol and host port, each with the number of
/// `connections` (see [`live_connections`]) through it.
pub fn port_rows(endpoints: &[Endpoint], connections: &[(NatKey, NatEntry)]) -> Vec<PortRow> {
    let mut rows: Vec<PortRow> = endpoints
        .iter()
        .flat_map(|endpoint| {
            let pod_ip = endpoint
                .ips
                .iter()
                .map(ipnet::IpNet::addr)
                .find(std::net::IpAddr::is_ipv4);
            endpoint.port_mappings.iter().map(move |mapping| PortRow {
                protocol: mapping.protocol,
                host_ip: mapping.host_ip.filter(|ip| !ip.is_unspecified()),
                host_port: mapping.host_port,
                pod_ip,
                container_port: mapping.container_port,
                container_id: endpoint.id.container_id.clone(),
                ifname: endpoint.id.ifname.clone(),
                connections: 0,
            })
        })
        .collect();
    for row in &mut rows {
        row.connections = connections
            .iter()
            .filter(|(key, connection)| through(row, key, connection))
            .count();
    }
    rows.sort_by(|a, b| (&a.protocol, a.host_port).cmp(&(&b.protocol, b.host_port)));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_counts_for_the_mapping_it_went_through_only() {
        let row = |protocol: &str, host_ip: Option<&str>| PortRow {
            protocol: protocol.parse().expect("a protocol"),
            host_ip: host_ip.map(|ip| ip.parse().expect("an address")),
            host_port: 30080,
            pod_ip: Some("10.244.0.2".parse().expect("an address")),
            container_port: 8080,
            container_id: "c".into(),
            ifname: "eth0".into(),
            connections: 0,
        };
        let key = NatKey::new(([10, 244, 0, 2], 8080), ([198, 18, 0, 2], 50000), 6);
        let connection = NatEntry {
            node_addr: [198, 18, 0, 1],
            node_port: 30080,
            ..NatEntry::from_outside(&key, 0, 0)
        };
        assert!(through(&row("tcp", None), &key, &connection));
        assert!(through(&row("tcp", Some("198.18.0.1")), &key, &connection));
        assert!(
            !through(&row("tcp", Some("198.18.0.9")), &key, &connection),
            "another host address"
        );
        assert!(
            !through(&row("udp", None), &key, &connection),
            "another protocol"
        );
        let other_port = NatEntry {
            node_port: 30081,
            ..connection
        };
        assert!(
            !through(&row("tcp", None), &key, &other_port),
            "another host port"
        );
        let other_pod = NatKey::new(([10, 244, 0, 3], 8080), ([198, 18, 0, 2], 50000), 6);
        assert!(
            !through(&row("tcp", None), &other_pod, &connection),
            "another pod"
        );
    }

    #[test]
    fn connections_idle_past_their_timeout_are_not_counted_unless_nothing_expires() {
        const SEC: u64 = 1_000_000_000;
        let key = |pod_port| NatKey::new(([10, 244, 0, 2], pod_port), ([198, 18, 0, 2], 50000), 6);
        let seen = |idle_secs: u64| NatEntry {
            last_seen_ns: 1_000 * SEC - idle_secs * SEC,
            ..NatEntry::from_outside(&key(0), cni_ebpf_common::tcp_state::ESTABLISHED, 0)
        };
        let read = |timeouts| HostPortConnections {
            connections: [(key(8080), seen(5)), (key(8081), seen(50))].into(),
            timeouts,
            now_ns: 1_000 * SEC,
        };
        let timeouts = crate::model::nat::Timeouts {
            tcp_established: 10,
            tcp_transitory: 10,
            tcp_closed: 10,
            udp: 10,
            udp_stream: 10,
            icmp: 10,
        };
        let live = live_connections(read(Some(timeouts)));
        assert_eq!(
            live.iter().map(|(key, _)| key.pod_port).collect::<Vec<_>>(),
            [8080]
        );
        assert_eq!(
            live_connections(read(None)).len(),
            2,
            "NAT off: nothing expires"
        );
    }
}
