//! What the source NAT tests share: the ports the external host serves on, the node's
//! translated flows as `ebpf-cnid nat` prints them, and the notes of flows opened from
//! outside.

use std::{collections::BTreeSet, net::SocketAddr};

use cni_ebpf_common::{NatEntry, NatKey, map_names};
use serde_json::Value;

use crate::node::{EXTERNAL_ADDR, Node};

/// Where the external host's TCP server listens.
pub const TCP_PORT: u16 = 8080;
/// Where the external host's UDP echo listens.
pub const UDP_PORT: u16 = 9000;

/// The external host's `port`.
pub fn external(port: u16) -> SocketAddr {
    format!("{EXTERNAL_ADDR}:{port}").parse().expect("address")
}

/// The addresses `peers` came from, as the external host saw them.
pub fn node_ips(peers: &[SocketAddr]) -> BTreeSet<String> {
    peers.iter().map(|peer| peer.ip().to_string()).collect()
}

/// The node's translated flows and NAT counters, as `ebpf-cnid nat --output json` prints them.
pub fn nat_table(node: &Node) -> Value {
    node.instance.cli_json(&["nat"])
}

/// The notes of `NAT_INBOUND` (flows a host outside opened to a pod's own address).
pub fn notes(node: &Node) -> Vec<(NatKey, NatEntry)> {
    node.flow_table::<NatKey>(map_names::NAT_INBOUND)
        .iter()
        .map(|note| note.expect("a readable note"))
        .collect()
}
