//! This node in its cluster: its name, where the cluster's nodes come from
//! ([`NodeSource`]: a nodes file or the Kubernetes API, read by `cni-nodes`), and what
//! the node keeps of them ([`Cluster`]): this node's pod ranges (`ebpf-cnid status`, what
//! a `usePodCidr` IPAM range becomes) and every node's, which source NAT leaves
//! untranslated, and the other nodes' pod ranges the routes and the tunnel lead to,
//! once checked ([`vet`]). `cluster_watch` applies each change of the nodes to the
//! running node.

mod args;
pub mod vet;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use ipnet::Ipv4Net;

use cni_api::{NodeInfo, NodesView, RefusedInfo};
use cni_nodes::NodeSet;

pub use args::{ClusterArgs, NodeSource, Routing, in_cluster};
use vet::{Bounds, MIN_PREFIX, Refusal, Vetted};

/// The cluster as this node knows it.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// This node's name.
    name: String,
    /// `None`: no node source, a node on its own (its pod ranges come from the conflist).
    source: Option<NodeSource>,
    routing: Routing,
    nodes: NodeSet,
    /// The source has given its first set of nodes (always, without a source).
    known: bool,
    /// What the other nodes' ranges are checked against.
    bounds: Bounds,
    /// The other nodes as checked, after every change of the nodes or the bounds.
    vetted: Vetted,
}

impl Cluster {
    /// `cluster_cidrs`: `--cluster-cidr`, inside which every node's pod ranges lie
    /// (empty: not configured, see [`vet`]).
    pub fn new(
        name: String,
        source: Option<NodeSource>,
        routing: Routing,
        cluster_cidrs: Vec<Ipv4Net>,
    ) -> Self {
        Self {
            name,
            known: source.is_none(),
            source,
            routing,
            nodes: NodeSet::new(),
            bounds: Bounds::new(cluster_cidrs, Vec::new(), BTreeSet::new()),
            vetted: Vetted::default(),
        }
    }

    /// `--cluster-cidr`.
    pub fn cluster_cidrs(&self) -> &[Ipv4Net] {
        &self.bounds.cluster_cidrs
    }

    pub fn routing(&self) -> Routing {
        self.routing
    }

    /// Whether the source has given its first set of nodes (always, without a source).
    pub fn known(&self) -> bool {
        self.known
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn source(&self) -> Option<&NodeSource> {
        self.source.as_ref()
    }

    /// Replaces the nodes; whether anything changed (the first set always does).
    pub fn set_nodes(&mut self, nodes: NodeSet) -> bool {
        if self.known && self.nodes == nodes {
            return false;
        }
        self.nodes = nodes;
        self.known = true;
        self.revet();
        true
    }

    /// Replaces what the other nodes are checked against besides the cluster CIDRs:
    /// the `reserved` ranges (each with what it is) and this node's `local` addresses.
    /// Whether what is taken of the other nodes changed.
    pub fn set_bounds(
        &mut self,
        reserved: Vec<(Ipv4Net, String)>,
        local: BTreeSet<Ipv4Addr>,
    ) -> bool {
        let bounds = Bounds::new(self.bounds.cluster_cidrs.clone(), reserved, local);
        if self.bounds == bounds {
            return false;
        }
        self.bounds = bounds;
        let before = self.vetted.ranges.clone();
        self.revet();
        self.vetted.ranges != before
    }

    /// Checks the nodes again; each refusal not refused before is logged.
    fn revet(&mut self) {
        let vetted = vet::vet(&self.nodes, &self.name, &self.bounds);
        for refusal in &vetted.refused {
            if !self.vetted.refused.contains(refusal) {
                tracing::warn!(
                    node = %refusal.node,
                    refused = %refusal.item,
                    kind = refusal.kind,
                    "another node's {} is refused: {}",
                    if refusal.kind.starts_with("node_") { "address" } else { "pod range" },
                    refusal.reason
                );
            }
        }
        self.vetted = vetted;
    }

    /// What is refused of the other nodes, with why.
    pub fn refused(&self) -> &[Refusal] {
        &self.vetted.refused
    }

    /// Every node's address (this node's among them): pods may send them no tunnel
    /// packet. Nodes refused for their address are left out.
    pub fn node_addresses(&self) -> BTreeSet<Ipv4Addr> {
        let refused: BTreeSet<&str> = self
            .vetted
            .refused
            .iter()
            .filter(|refusal| refusal.kind.starts_with("node_"))
            .map(|refusal| refusal.node.as_str())
            .collect();
        self.nodes
            .iter()
            .filter(|node| !refused.contains(node.name.as_str()))
            .map(|node| node.address)
            .collect()
    }

    /// This node's pod ranges; empty while the source has not named this node, or gave
    /// it none.
    pub fn pod_cidrs(&self) -> Vec<Ipv4Net> {
        self.nodes
            .get(&self.name)
            .map(|node| node.pod_cidrs.clone())
            .unwrap_or_default()
    }

    /// Every node's pod ranges this node takes (see [`Self::remote_ranges`]), this
    /// node's included, and the cluster CIDRs: the cluster's pods, whose addresses pods'
    /// traffic keeps. `None` until the source has given its first set of nodes (see
    /// `Nat::sync_cluster_cidrs`).
    pub fn all_pod_cidrs(&self) -> Option<BTreeSet<Ipv4Net>> {
        self.known.then(|| {
            self.own_ranges()
                .into_iter()
                .chain(self.vetted.ranges.keys().copied())
                .chain(self.bounds.cluster_cidrs.iter().copied())
                .collect()
        })
    }

    /// This node's pod ranges as a cluster range: those no shorter than /8.
    fn own_ranges(&self) -> BTreeSet<Ipv4Net> {
        self.pod_cidrs()
            .into_iter()
            .filter(|net| net.prefix_len() >= MIN_PREFIX)
            .collect()
    }

    /// The other nodes' pod ranges, each with that node's address: where the routes
    /// (native) or the tunnel (vxlan) send them. What a node source says is checked
    /// first ([`vet::vet`]), since a route or a tunnel is made of it.
    pub fn remote_ranges(&self) -> BTreeMap<Ipv4Net, Ipv4Addr> {
        self.vetted.ranges.clone()
    }

    /// The address the node's own traffic to other nodes' pods leaves from through the
    /// overlay: the network address of this node's first pod range (no pod has it), as
    /// flannel gives its `flannel.1`. `None` while this node has no range.
    pub fn overlay_address(&self) -> Option<Ipv4Addr> {
        self.pod_cidrs().first().map(Ipv4Net::network)
    }

    /// What `ebpf-cnid nodes` shows.
    pub fn view(&self) -> NodesView {
        NodesView {
            node_name: Some(self.name.clone()),
            node_source: self.source.as_ref().map(ToString::to_string),
            routing: Some(self.routing.to_string()),
            nodes: self
                .nodes
                .iter()
                .map(|node| NodeInfo {
                    name: node.name.clone(),
                    address: node.address,
                    pod_cidrs: node.pod_cidrs.clone(),
                })
                .collect(),
            refused: self
                .vetted
                .refused
                .iter()
                .map(|refusal| RefusedInfo {
                    node: refusal.node.clone(),
                    item: refusal.item.clone(),
                    reason: refusal.reason.clone(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_nodes::Node as ClusterNode;

    fn node(name: &str, address: &str, cidrs: &[&str]) -> ClusterNode {
        ClusterNode {
            name: name.to_owned(),
            address: address.parse().expect("an address"),
            pod_cidrs: cidrs.iter().map(|c| c.parse().expect("a range")).collect(),
        }
    }

    fn cluster(nodes: &[ClusterNode]) -> Cluster {
        let mut cluster = Cluster::new("node-a".to_owned(), None, Routing::Native, Vec::new());
        let mut set = NodeSet::new();
        for node in nodes {
            set.insert(node.clone());
        }
        cluster.set_nodes(set);
        cluster
    }

    #[test]
    fn this_nodes_ranges_and_every_nodes() {
        let cluster = cluster(&[
            node("node-a", "192.0.2.1", &["10.244.1.0/24"]),
            node("node-b", "192.0.2.2", &["10.244.2.0/24", "10.245.2.0/24"]),
        ]);
        assert_eq!(
            cluster.pod_cidrs(),
            ["10.244.1.0/24".parse().expect("a range")]
        );
        let all: Vec<String> = cluster
            .all_pod_cidrs()
            .expect("known")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(all, ["10.244.1.0/24", "10.244.2.0/24", "10.245.2.0/24"]);
        let view = cluster.view();
        assert_eq!(view.node_name.as_deref(), Some("node-a"));
        assert_eq!(view.nodes.len(), 2);
    }

    #[test]
    fn other_nodes_ranges_are_routed_via_their_address_and_this_nodes_are_not() {
        let cluster = cluster(&[
            node("node-a", "192.0.2.1", &["10.244.1.0/24"]),
            node("node-b", "192.0.2.2", &["10.244.2.0/24", "10.245.2.0/24"]),
            node("node-c", "192.0.2.3", &[]),
            // A stale entry at this node's address, and one claiming this node's range.
            node("node-a-old", "192.0.2.1", &["10.244.9.0/24"]),
            node("node-d", "192.0.2.4", &["10.244.1.0/24"]),
        ]);
        let routes: Vec<String> = cluster
            .remote_ranges()
            .iter()
            .map(|(net, via)| format!("{net} via {via}"))
            .collect();
        assert_eq!(
            routes,
            ["10.244.2.0/24 via 192.0.2.2", "10.245.2.0/24 via 192.0.2.2"]
        );
    }

    #[test]
    fn ranges_a_node_source_should_not_give_are_left_out_of_routes_and_cluster_ranges() {
        let cluster = cluster(&[
            node("node-a", "192.0.2.1", &["10.244.1.0/24"]),
            node("node-b", "192.0.2.2", &["10.244.2.0/24"]),
            // The whole Internet, a range around this node's, two claiming one range,
            // and a node at an address no packet can be sent to.
            node("wide", "192.0.2.3", &["0.0.0.0/0", "10.0.0.0/7"]),
            node("around", "192.0.2.4", &["10.244.0.0/16"]),
            node("twin-1", "192.0.2.5", &["10.250.0.0/24"]),
            node("twin-2", "192.0.2.6", &["10.250.0.0/25"]),
            node("nowhere", "127.0.0.1", &["10.251.0.0/24"]),
        ]);
        let routes: Vec<String> = cluster
            .remote_ranges()
            .iter()
            .map(|(net, via)| format!("{net} via {via}"))
            .collect();
        assert_eq!(routes, ["10.244.2.0/24 via 192.0.2.2"]);
        let all: Vec<String> = cluster
            .all_pod_cidrs()
            .expect("known")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(all, ["10.244.1.0/24", "10.244.2.0/24"]);
    }

    #[test]
    fn a_node_the_source_does_not_name_has_no_ranges() {
        let cluster = cluster(&[node("node-b", "192.0.2.2", &["10.244.2.0/24"])]);
        assert!(cluster.pod_cidrs().is_empty());
        assert_eq!(cluster.all_pod_cidrs().map(|all| all.len()), Some(1));
    }

    #[test]
    fn the_nodes_are_unknown_until_the_source_gives_the_first_set() {
        let source = NodeSource::File("/etc/nodes.yaml".into());
        let mut cluster = Cluster::new(
            "node-a".to_owned(),
            Some(source),
            Routing::Native,
            Vec::new(),
        );
        assert_eq!(cluster.all_pod_cidrs(), None);
        assert!(
            cluster.set_nodes(NodeSet::new()),
            "the first set, even empty"
        );
        assert_eq!(cluster.all_pod_cidrs(), Some(BTreeSet::new()));
        let alone = Cluster::new("node-a".to_owned(), None, Routing::Native, Vec::new());
        assert_eq!(
            alone.all_pod_cidrs(),
            Some(BTreeSet::new()),
            "no source: none"
        );
    }

    #[test]
    fn setting_the_same_nodes_again_changes_nothing() {
        let mut cluster = cluster(&[node("node-a", "192.0.2.1", &["10.244.1.0/24"])]);
        let same = {
            let mut set = NodeSet::new();
            set.insert(node("node-a", "192.0.2.1", &["10.244.1.0/24"]));
            set
        };
        assert!(!cluster.set_nodes(same));
        assert!(cluster.set_nodes(NodeSet::new()));
        assert!(cluster.pod_cidrs().is_empty());
    }
}
