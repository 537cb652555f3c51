//! `ebpf-cnid nat`: source NAT's configuration and every flow of its tables, each
//! translated flow joined with its pair, with the state, idle time and time left the
//! sweeper sees.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddrV4},
};

use cni_ebpf_common::{
    FlowCounts, NatConfig, NatEntry, NatKey, RefusedFlows,
    flow::idle_ns,
    ip_proto::{ESP, GRE, ICMP, IPIP, SCTP, TCP, UDP},
    tcp_state, udp_state,
};
use serde::Serialize;

use super::read::NatTables;
use crate::model::nat::{PortRange, Timeouts, expiry};

/// The NAT configuration in force, the counters, and every entry of `NAT_OUT` (one per
/// translated flow).
#[derive(Debug, Clone, Serialize)]
pub struct NatView {
    /// The datapath translates (the configured node address is not 0.0.0.0).
    pub enabled: bool,
    /// The source of packets translated out of the first uplink; `None` when NAT is off
    /// or that uplink has no IPv4 address (traffic to translate is then dropped, see
    /// `NatConfig::NO_ADDRESS`).
    pub node_addr: Option<Ipv4Addr>,
    /// The first uplink.
    pub uplink_ifindex: u32,
    /// Every uplink, in order.
    pub uplinks: Vec<UplinkView>,
    pub port_range: PortRange,
    pub timeouts: Timeouts,
    /// Flows each table holds at most (`--nat-max-flows`).
    pub max_flows: u32,
    /// Each pod's share of the tables (0: no budget).
    pub budgets: Budgets,
    pub counters: BTreeMap<&'static str, u64>,
    pub entries: Vec<FlowView>,
    /// Flows a host outside opened to a pod's own address (a routed pod network), whose
    /// answers leave untranslated: `node` is the pod's own address and port.
    pub from_outside: Vec<FlowView>,
    /// Per pod address: its translated flows, its entries as its budget counts them
    /// and its new flows refused, for every pod with any.
    pub endpoints: Vec<EndpointNatView>,
}

/// One pod's share of source NAT: which pod holds the flows, which is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndpointNatView {
    pub pod: Ipv4Addr,
    /// Its flows in `NAT_OUT` (expired ones the sweep has not removed yet included).
    pub flows: u64,
    /// Its entries in each flow table as its budget counts them (`FLOW_COUNTS`).
    pub counted: FlowCounts,
    /// Its new flows refused, whatever the reason, since the count began (the
    /// daemon's first start on this node, or the pod's first refusal).
    pub refused: u64,
    /// The same by reason: no node port free, its flow budget, its budget of ports
    /// toward the destination, a full table.
    pub refused_by: RefusedFlows,
}

/// Each pod's share of the flow tables, as `NAT_CONFIG` holds it (0: no budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Budgets {
    /// Entries per pod in each flow table.
    pub pod_flows: u32,
    /// Node ports per pod toward one destination.
    pub ports_per_destination: u32,
}

/// A device source NAT translates on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UplinkView {
    pub ifindex: u32,
    /// Its name now; `None` when no device has that ifindex any more.
    pub name: Option<String>,
    /// The source of what is translated out of it; `None` while it has no address.
    pub node_addr: Option<Ipv4Addr>,
}

/// One translated flow. For ICMP echo the "ports" are the echo identifiers. State, idle
/// time and expiry come from the latest of the flow's two entries, as the sweeper sees
/// them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlowView {
    pub proto: String,
    pub pod: SocketAddrV4,
    pub node: SocketAddrV4,
    pub remote: SocketAddrV4,
    /// TCP state name; `-` for other protocols.
    pub state: &'static str,
    pub idle_secs: u64,
    /// 0 once expired: the sweeper removes it at its next pass.
    pub expires_in_secs: u64,
}

/// Everything `ebpf-cnid nat` shows, from `tables` as of `now_ns` (CLOCK_MONOTONIC).
pub fn nat_view(tables: NatTables, now_ns: u64) -> NatView {
    let NatTables {
        config,
        uplinks,
        max_flows,
        counters,
        flows_out,
        flows_in,
        from_outside: notes,
        refused,
        counts,
    } = tables;
    let node_addr = config
        .has_address()
        .then(|| Ipv4Addr::from(config.node_addr));
    let uplinks = uplinks
        .iter()
        .map(|(ifindex, addr)| UplinkView {
            ifindex,
            name: nix::net::if_::if_indextoname(ifindex)
                .ok()
                .map(|name| name.to_string_lossy().into_owned()),
            node_addr: NatConfig::is_address(addr).then(|| Ipv4Addr::from(addr)),
        })
        .collect();
    let timeouts = Timeouts::from_config(&config);
    let endpoints = endpoint_views(flows_out.keys(), &counts, &refused);
    let mut entries = Vec::new();
    for (key, out) in flows_out {
        let inbound = flows_in
            .get(&key.reverse(out.node_port))
            .filter(|e| e.pod_addr == key.pod_addr && e.pod_port == key.pod_port);
        entries.push(flow_view(&key, &out, inbound, now_ns, &timeouts));
    }
    entries.sort_by(by_pod);
    let mut from_outside = Vec::new();
    for (key, note) in notes {
        from_outside.push(flow_view(&key, &note, None, now_ns, &timeouts));
    }
    from_outside.sort_by(by_pod);
    NatView {
        enabled: config.node_addr != [0; 4],
        node_addr,
        uplink_ifindex: config.uplink_ifindex,
        uplinks,
        port_range: PortRange {
            min: config.port_min,
            max: config.port_max,
        },
        timeouts,
        max_flows,
        budgets: Budgets {
            pod_flows: config.pod_flow_budget,
            ports_per_destination: config.dest_port_budget,
        },
        counters,
        entries,
        from_outside,
        endpoints,
    }
}

/// Per pod address, the flows of `flows` (keys of `NAT_OUT`), the `counted` entries
/// and the `refused` counts, in address order; pods with none of them are left out.
fn endpoint_views<'a>(
    flows: impl Iterator<Item = &'a NatKey>,
    counted: &BTreeMap<[u8; 4], FlowCounts>,
    refused: &BTreeMap<[u8; 4], RefusedFlows>,
) -> Vec<EndpointNatView> {
    let mut by_pod: BTreeMap<[u8; 4], (u64, FlowCounts, RefusedFlows)> = BTreeMap::new();
    for key in flows {
        by_pod.entry(key.pod_addr).or_default().0 += 1;
    }
    for (pod, counts) in counted {
        if *counts != FlowCounts::default() {
            by_pod.entry(*pod).or_default().1 = *counts;
        }
    }
    for (pod, by_reason) in refused {
        by_pod.entry(*pod).or_default().2 = *by_reason;
    }
    by_pod
        .into_iter()
        .map(|(pod, (flows, counted, refused_by))| EndpointNatView {
            pod: Ipv4Addr::from(pod),
            flows,
            counted,
            refused: refused_by.total(),
            refused_by,
        })
        .collect()
}

/// The order flows are listed in: by pod, then remote, then protocol.
fn by_pod(a: &FlowView, b: &FlowView) -> std::cmp::Ordering {
    (a.pod, a.remote, &a.proto).cmp(&(b.pod, b.remote, &b.proto))
}

/// The view of the flow `key` -> `out`, whose `NAT_IN` pair is `inbound`.
pub fn flow_view(
    key: &NatKey,
    out: &NatEntry,
    inbound: Option<&NatEntry>,
    now_ns: u64,
    timeouts: &Timeouts,
) -> FlowView {
    let entry = expiry::latest(out, inbound);
    let node_addr = Ipv4Addr::from(out.node_addr);
    FlowView {
        proto: proto_name(key.proto),
        pod: SocketAddrV4::new(key.pod_addr.into(), key.pod_port),
        node: SocketAddrV4::new(node_addr, out.node_port),
        remote: SocketAddrV4::new(key.remote_addr.into(), key.remote_port),
        state: state_name(key.proto, entry.state),
        idle_secs: idle_ns(entry.last_seen_ns, now_ns) / 1_000_000_000,
        expires_in_secs: expiry::expires_in_secs(entry, key.proto, now_ns, timeouts),
    }
}

pub fn proto_name(proto: u8) -> String {
    match proto {
        TCP => "tcp".to_owned(),
        UDP => "udp".to_owned(),
        ICMP => "icmp".to_owned(),
        IPIP => "ipip".to_owned(),
        GRE => "gre".to_owned(),
        ESP => "esp".to_owned(),
        SCTP => "sctp".to_owned(),
        other => other.to_string(),
    }
}

pub fn state_name(proto: u8, state: u8) -> &'static str {
    match proto {
        TCP => {}
        ICMP => return "-",
        _ if state == udp_state::REPLIED => return "replied",
        _ if state == udp_state::STREAM => return "stream",
        _ => return "-",
    }
    match state {
        tcp_state::SYN_SENT => "syn_sent",
        tcp_state::ESTABLISHED => "established",
        tcp_state::CLOSING => "closing",
        tcp_state::REMOTE_CLOSING => "remote_closing",
        tcp_state::CLOSED => "closed",
        tcp_state::POD_CLOSED => "pod_closed",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_shows_both_sides_its_state_and_its_clock() {
        let key = NatKey {
            pod_addr: [10, 244, 1, 2],
            remote_addr: [198, 18, 0, 9],
            pod_port: 40000,
            remote_port: 443,
            proto: TCP,
            pad: [0; 3],
        };
        let now = 5_000 * 1_000_000_000;
        // Left by a second uplink.
        let entry = NatEntry::translated(
            &key,
            ([192, 0, 2, 7], 61007),
            tcp_state::ESTABLISHED,
            now - 7 * 1_000_000_000,
        );
        let timeouts = cni_ebpf_common::test_support::TIMEOUTS;
        let view = flow_view(&key, &entry, None, now, &timeouts);
        assert_eq!(view.proto, "tcp");
        assert_eq!(view.pod.to_string(), "10.244.1.2:40000");
        assert_eq!(view.node.to_string(), "192.0.2.7:61007", "the flow's own");
        assert_eq!(view.remote.to_string(), "198.18.0.9:443");
        assert_eq!(view.state, "established");
        assert_eq!(view.idle_secs, 7);
        assert_eq!(view.expires_in_secs, 3593);
    }

    #[test]
    fn a_flow_is_as_fresh_as_its_latest_entry() {
        let key = NatKey {
            pod_addr: [10, 244, 1, 2],
            remote_addr: [198, 18, 0, 9],
            pod_port: 40000,
            remote_port: 5000,
            proto: UDP,
            pad: [0; 3],
        };
        let now = 5_000 * 1_000_000_000;
        let out =
            NatEntry::translated(&key, ([198, 18, 0, 1], 61007), 0, now - 100 * 1_000_000_000);
        let inbound = NatEntry {
            last_seen_ns: now - 1_000_000_000,
            ..out
        };
        let timeouts = cni_ebpf_common::test_support::TIMEOUTS;
        let view = flow_view(&key, &out, Some(&inbound), now, &timeouts);
        assert_eq!((view.idle_secs, view.expires_in_secs), (1, 29));
        let alone = flow_view(&key, &out, None, now, &timeouts);
        assert_eq!((alone.idle_secs, alone.expires_in_secs), (100, 0));
    }

    #[test]
    fn names_of_protocols_and_states() {
        assert_eq!(proto_name(17), "udp");
        assert_eq!(proto_name(1), "icmp");
        assert_eq!(proto_name(47), "gre");
        assert_eq!(proto_name(132), "sctp");
        assert_eq!(proto_name(253), "253");
        assert_eq!(state_name(6, tcp_state::SYN_SENT), "syn_sent");
        assert_eq!(state_name(6, tcp_state::CLOSING), "closing");
        assert_eq!(state_name(17, tcp_state::CLOSING), "-");
        assert_eq!(state_name(17, udp_state::REPLIED), "replied");
        assert_eq!(state_name(17, udp_state::STREAM), "stream");
        assert_eq!(state_name(17, 0), "-");
        assert_eq!(state_name(132, udp_state::REPLIED), "replied");
        assert_eq!(state_name(1, udp_state::REPLIED), "-");
    }
}
