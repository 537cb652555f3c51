//! Node objects are input: what a node source says of the other nodes becomes routes,
//! tunnels and ranges source NAT leaves alone, so each node's address and pod ranges are
//! checked first ([`vet`]) against what this node knows ([`Bounds`]). What is refused is
//! kept with its reason ([`Refusal`]): logged once, counted in `/metrics`, listed by
//! `ebpf-cnid nodes`.
//!
//! Linear in the nodes but for one sort: a cluster of 5,000 nodes is vetted in
//! milliseconds (overlaps between nodes are found by sweeping the ranges in address
//! order, not pair by pair).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use ipnet::Ipv4Net;

use cni_nodes::NodeSet;

/// The shortest pod range taken from a node source, as the plugin's checks of IPAM
/// answers (`checks::MIN_PREFIX` in the plugin).
pub const MIN_PREFIX: u8 = 8;

/// IPv4 link-local: the node's hairpin source, cloud metadata services.
const LINK_LOCAL: &str = "169.254.0.0/16";

/// What the node knows that no other node's range may take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bounds {
    /// `--cluster-cidr`: every node's pod ranges lie inside one of these; empty when
    /// the operator gave none.
    pub cluster_cidrs: Vec<Ipv4Net>,
    /// Ranges no node's pod range may overlap, each with what it is: the Service
    /// ranges, the host-firewall ranges, the networks the node reaches directly.
    /// Link-local is always among them.
    pub reserved: Vec<(Ipv4Net, String)>,
    /// This node's own addresses.
    pub local: BTreeSet<Ipv4Addr>,
}

impl Bounds {
    /// `reserved` with link-local added.
    pub fn new(
        cluster_cidrs: Vec<Ipv4Net>,
        mut reserved: Vec<(Ipv4Net, String)>,
        local: BTreeSet<Ipv4Addr>,
    ) -> Self {
        let link_local: Ipv4Net = LINK_LOCAL.parse().expect("a range");
        reserved.push((link_local, "the link-local range".to_owned()));
        Self {
            cluster_cidrs,
            reserved,
            local,
        }
    }
}

/// Something of a node that is not taken, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Refusal {
    pub node: String,
    /// The range, or the node's address when the whole node is refused.
    pub item: String,
    /// A short stable name, the metrics' label.
    pub kind: &'static str,
    /// What an operator reads.
    pub reason: String,
}

/// What is taken of the other nodes: each pod range with its node's address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vetted {
    pub ranges: BTreeMap<Ipv4Net, Ipv4Addr>,
    pub refused: Vec<Refusal>,
}

/// Whether two ranges share an address.
pub fn overlap(a: &Ipv4Net, b: &Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Whether a node's address can be a next hop or a tunnel's end: a unicast address
/// off this host.
fn usable_address(addr: Ipv4Addr) -> bool {
    !(addr.is_unspecified()
        || addr.is_loopback()
        || addr.is_multicast()
        || addr.is_broadcast()
        || addr.is_link_local())
}

/// Checks the nodes of `nodes` but `this` (whose ranges are `own`) against `bounds`:
/// - a node whose address is unusable, is this node's (one of `bounds.local`, or the
///   address `this` has in the set), or lies in a pod range is refused whole;
/// - a range shorter than /8, outside the cluster CIDRs (when there are), covering an
///   address of this node, overlapping a reserved range, this node's ranges or another
///   node's is refused (both of two nodes claiming one range are).
pub fn vet(nodes: &NodeSet, this: &str, bounds: &Bounds) -> Vetted {
    let own: Vec<Ipv4Net> = nodes
        .get(this)
        .map(|node| node.pod_cidrs.clone())
        .unwrap_or_default();
    let this_addr = nodes.get(this).map(|node| node.address);
    let mut refused = Vec::new();
    let mut refuse = |node: &str, item: String, kind: &'static str, reason: String| {
        refused.push(Refusal {
            node: node.to_owned(),
            item,
            kind,
            reason,
        });
    };

    // Each node's address and each range on its own.
    let mut candidates: Vec<(Ipv4Net, Ipv4Addr, &str)> = Vec::new();
    for node in nodes.iter().filter(|node| node.name != this) {
        let addr = node.address;
        if !usable_address(addr) {
            let reason = "its address is no unicast address another host can have".to_owned();
            refuse(
                &node.name,
                addr.to_string(),
                "node_address_unusable",
                reason,
            );
            continue;
        }
        if Some(addr) == this_addr || bounds.local.contains(&addr) {
            let reason = "its address is an address of this node".to_owned();
            refuse(&node.name, addr.to_string(), "node_address_local", reason);
            continue;
        }
        for net in &node.pod_cidrs {
            match range_problem(net, &own, bounds) {
                Some((kind, reason)) => refuse(&node.name, net.to_string(), kind, reason),
                None => candidates.push((*net, addr, node.name.as_str())),
            }
        }
    }

    // Overlaps between nodes, by a sweep in address order: a group of ranges that
    // overlap one after the other, from more than one node, is refused whole.
    candidates.sort_by_key(|(net, _, _)| (u32::from(net.network()), net.prefix_len()));
    let mut ranges = BTreeMap::new();
    let mut group: Vec<(Ipv4Net, Ipv4Addr, &str)> = Vec::new();
    let mut group_end = 0u32;
    let close = |group: &mut Vec<(Ipv4Net, Ipv4Addr, &str)>,
                 ranges: &mut BTreeMap<Ipv4Net, Ipv4Addr>,
                 refuse: &mut dyn FnMut(&str, String, &'static str, String)| {
        let first_node = group.first().map(|(_, _, name)| *name);
        if group.iter().all(|(_, _, name)| Some(*name) == first_node) {
            ranges.extend(group.iter().map(|(net, addr, _)| (*net, *addr)));
        } else {
            for (net, _, name) in group.iter() {
                let others: BTreeSet<&str> = group
                    .iter()
                    .map(|(_, _, other)| *other)
                    .filter(|other| other != name)
                    .collect();
                let reason = format!(
                    "it overlaps the pod range of {}",
                    others.into_iter().collect::<Vec<_>>().join(", ")
                );
                refuse(name, net.to_string(), "range_overlaps_other", reason);
            }
        }
        group.clear();
    };
    for candidate in candidates {
        let (start, end) = (
            u32::from(candidate.0.network()),
            u32::from(candidate.0.broadcast()),
        );
        if !group.is_empty() && start > group_end {
            close(&mut group, &mut ranges, &mut refuse);
        }
        group_end = if group.is_empty() {
            end
        } else {
            group_end.max(end)
        };
        group.push(candidate);
    }
    close(&mut group, &mut ranges, &mut refuse);

    // A node whose address is a pod's (inside a range taken, this node's, or the
    // cluster CIDRs) would have pods' traffic to that pod tunnelled or routed to it.
    let by_start: BTreeMap<u32, Ipv4Net> = ranges
        .keys()
        .chain(&own)
        .map(|net| (u32::from(net.network()), *net))
        .collect();
    let in_pods = |addr: Ipv4Addr| {
        by_start
            .range(..=u32::from(addr))
            .next_back()
            .is_some_and(|(_, net)| net.contains(&addr))
            || bounds.cluster_cidrs.iter().any(|net| net.contains(&addr))
    };
    let inside: BTreeSet<Ipv4Addr> = ranges
        .values()
        .copied()
        .filter(|addr| in_pods(*addr))
        .collect();
    if !inside.is_empty() {
        for node in nodes.iter().filter(|node| inside.contains(&node.address)) {
            let reason = "its address lies in the pods' ranges".to_owned();
            refuse(
                &node.name,
                node.address.to_string(),
                "node_address_in_pods",
                reason,
            );
        }
        ranges.retain(|_, addr| !inside.contains(addr));
    }
    refused.sort();
    Vetted { ranges, refused }
}

/// Why `net`, another node's range, is refused on its own, if it is.
fn range_problem(
    net: &Ipv4Net,
    own: &[Ipv4Net],
    bounds: &Bounds,
) -> Option<(&'static str, String)> {
    if net.prefix_len() < MIN_PREFIX {
        return Some(("range_too_wide", format!("shorter than /{MIN_PREFIX}")));
    }
    if !bounds.cluster_cidrs.is_empty()
        && !bounds
            .cluster_cidrs
            .iter()
            .any(|cluster| cluster.contains(net))
    {
        return Some((
            "range_outside_cluster",
            "it lies outside the cluster CIDRs (--cluster-cidr)".to_owned(),
        ));
    }
    if let Some(addr) = bounds.local.range(net.network()..=net.broadcast()).next() {
        return Some((
            "range_covers_node_address",
            format!("it covers {addr}, an address of this node"),
        ));
    }
    if let Some((reserved, what)) = bounds
        .reserved
        .iter()
        .find(|(reserved, _)| overlap(reserved, net))
    {
        return Some(("range_reserved", format!("it overlaps {what} {reserved}")));
    }
    if own.iter().any(|mine| overlap(mine, net)) {
        return Some((
            "range_overlaps_own",
            "it overlaps this node's pod range".to_owned(),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_nodes::Node;

    fn set(nodes: &[(&str, &str, &[&str])]) -> NodeSet {
        let mut set = NodeSet::new();
        for (name, address, cidrs) in nodes {
            set.insert(Node {
                name: (*name).to_owned(),
                address: address.parse().expect("an address"),
                pod_cidrs: cidrs.iter().map(|c| c.parse().expect("a range")).collect(),
            });
        }
        set
    }

    fn bounds(cluster: &[&str]) -> Bounds {
        Bounds::new(
            cluster
                .iter()
                .map(|c| c.parse().expect("a range"))
                .collect(),
            vec![
                (
                    "10.96.0.0/12".parse().expect("a range"),
                    "the Service range".to_owned(),
                ),
                (
                    "192.0.2.0/24".parse().expect("a range"),
                    "uplink0's network".to_owned(),
                ),
            ],
            [
                "192.0.2.1".parse().expect("an address"),
                "198.51.100.7".parse().expect("an address"),
            ]
            .into_iter()
            .collect(),
        )
    }

    fn kinds(vetted: &Vetted) -> Vec<(String, String, &'static str)> {
        vetted
            .refused
            .iter()
            .map(|refusal| (refusal.node.clone(), refusal.item.clone(), refusal.kind))
            .collect()
    }

    #[test]
    fn hostile_ranges_and_addresses_are_refused_with_their_reason() {
        let nodes = set(&[
            ("a", "192.0.2.1", &["10.244.1.0/24"]),
            ("b", "192.0.2.2", &["10.244.2.0/24"]),
            ("metadata", "192.0.2.3", &["169.254.169.0/24"]),
            ("services", "192.0.2.4", &["10.96.0.0/24"]),
            ("uplink", "192.0.2.5", &["192.0.2.0/25"]),
            ("covers", "192.0.2.6", &["198.51.100.0/24"]),
            ("mine", "192.0.2.7", &["10.244.1.128/25"]),
            ("local", "198.51.100.7", &["10.244.7.0/24"]),
            ("podlike", "10.244.2.9", &["10.244.8.0/24"]),
            ("twin-1", "192.0.2.10", &["10.250.0.0/24"]),
            ("twin-2", "192.0.2.11", &["10.250.0.128/25"]),
            ("wide", "192.0.2.12", &["10.0.0.0/7"]),
        ]);
        let vetted = vet(&nodes, "a", &bounds(&[]));
        assert_eq!(
            vetted
                .ranges
                .keys()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["10.244.2.0/24"]
        );
        let expected = [
            ("covers", "198.51.100.0/24", "range_covers_node_address"),
            ("local", "198.51.100.7", "node_address_local"),
            ("metadata", "169.254.169.0/24", "range_reserved"),
            ("mine", "10.244.1.128/25", "range_overlaps_own"),
            ("podlike", "10.244.2.9", "node_address_in_pods"),
            ("services", "10.96.0.0/24", "range_reserved"),
            ("twin-1", "10.250.0.0/24", "range_overlaps_other"),
            ("twin-2", "10.250.0.128/25", "range_overlaps_other"),
            ("uplink", "192.0.2.0/25", "range_covers_node_address"),
            ("wide", "10.0.0.0/7", "range_too_wide"),
        ];
        let expected: Vec<_> = expected
            .iter()
            .map(|(node, item, kind)| ((*node).to_owned(), (*item).to_owned(), *kind))
            .collect();
        assert_eq!(kinds(&vetted), expected);
    }

    #[test]
    fn with_cluster_cidrs_only_ranges_inside_them_are_taken() {
        let nodes = set(&[
            ("a", "192.0.2.1", &["10.244.1.0/24"]),
            ("b", "192.0.2.2", &["10.244.2.0/24", "10.99.0.0/24"]),
        ]);
        let vetted = vet(&nodes, "a", &bounds(&["10.244.0.0/16"]));
        assert_eq!(
            vetted
                .ranges
                .keys()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["10.244.2.0/24"]
        );
        assert_eq!(
            kinds(&vetted),
            [(
                "b".to_owned(),
                "10.99.0.0/24".to_owned(),
                "range_outside_cluster"
            )]
        );
    }

    #[test]
    fn five_thousand_honest_nodes_are_all_taken() {
        let mut nodes = NodeSet::new();
        for n in 0..5000u32 {
            let [_, _, high, low] = n.to_be_bytes();
            nodes.insert(Node {
                name: format!("node-{n}"),
                address: Ipv4Addr::new(172, 16 + high, low, 1),
                pod_cidrs: vec![
                    Ipv4Net::new(Ipv4Addr::new(10, 128 + high, low, 0), 24).expect("a range"),
                ],
            });
        }
        let vetted = vet(&nodes, "node-0", &bounds(&["10.128.0.0/11"]));
        assert!(
            vetted.refused.is_empty(),
            "{:?}",
            &vetted.refused[..3.min(vetted.refused.len())]
        );
        assert_eq!(vetted.ranges.len(), 4999);
    }
}
