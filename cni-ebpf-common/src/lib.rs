//! What the kernel and user space must agree on: every BPF map key and value, the
//! constants of the wire (protocol numbers, TCP flags), and the flow state machine with
//! its idle-timeout rule, which the datapath and the daemon's sweep both apply.
//!
//! Rules: `#[repr(C)]`, fixed-width integers only, no implicit padding, and a
//! compile-time size assert per type so the kernel and user space cannot drift apart;
//! functions both sides call are `const fn`s the eBPF programs can inline, with host
//! unit tests.
#![no_std]

pub mod budget;
pub mod endpoint;
pub mod flow;
pub mod hostport;
pub mod metrics;
pub mod nat;
pub mod overlay;
pub mod policy;
pub mod protocol;
pub mod services;
pub mod stats;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;

pub use budget::{FlowCounts, FlowTable, Refusal, RefusedFlows};
pub use endpoint::{
    EndpointInfo, EndpointKey, MAX_GATEWAYS, MAX_RATE_LIMITS, RateBucket, endpoint_flags,
};
pub use flow::{Segment, Timeouts, Way, tcp_state, udp_state};
pub use hostport::{
    HAIRPIN_ADDR, HostPortFlow, NODE_ADDRS_MAX, PortKey, PortTarget, SockConfig, SockRevKey,
    TARGET_COUNT, TARGET_WORDS,
};
pub use metrics::{DropReason, EndpointCounters};
pub use nat::{
    CidrKey, FragmentKey, FragmentTarget, MAX_UPLINKS, NatConfig, NatCounter, NatEntry, NatKey,
    NatReverseKey, SweepItem, Uplinks, sweep,
};
pub use overlay::{MAX_NODES, MAX_REMOTE_RANGES, OverlayConfig, RemoteNode, underlay_trust};
pub use policy::{
    AddrKey, FlowKey, FlowVerdict, PolicyConfig, PolicyCounters, PolicyEndpoint, RuleKey, RuleValue,
};
pub use protocol::{ip_proto, tcp_flags};
pub use services::{
    DEFAULT_PARTY_BUDGET, MAX_SERVICE_CIDRS, MAX_SERVICE_FLOWS, MAX_SERVICE_PARTIES,
    MAX_SERVICE_SOCKETS, ServiceClient, ServiceConfig, ServiceCounts, ServiceTable,
};
pub use stats::{SourceKey, TrafficCounters};

/// The layout of the pinned state: every map's type, size rules, key and value, and the
/// pin names. A daemon reuses pins only of its own layout (written into [`map_names::LAYOUT`]
/// at load); it starts fresh over any other, unless a migration from that released layout
/// exists (`cni-daemon/src/datapath/upgrade`). Raise it with every change to a pinned map
/// (a new map alone needs no raise: the load creates it), and say so in CHANGELOG.md.
pub const LAYOUT_VERSION: u32 = 1;

/// Names of the maps in the eBPF object, used by the loader and for pin file names.
pub mod map_names {
    /// Array of one `u32`: the [`crate::LAYOUT_VERSION`] of the pins beside it, written
    /// by the daemon once the object is loaded.
    pub const LAYOUT: &str = "LAYOUT";
    /// Per-CPU hash: [`crate::SourceKey`] -> [`crate::TrafficCounters`].
    pub const SOURCE_STATS: &str = "SOURCE_STATS";
    /// Hash: [`crate::EndpointKey`] -> [`crate::EndpointInfo`], one entry per pod IPv4.
    pub const ENDPOINTS: &str = "ENDPOINTS";
    /// Per-CPU hash: host veth ifindex (`u32`) -> [`crate::EndpointCounters`].
    pub const ENDPOINT_COUNTERS: &str = "ENDPOINT_COUNTERS";
    /// Per-CPU array of `u64`, indexed by [`crate::DropReason`].
    pub const DROPS: &str = "DROPS";
    /// Hash: [`crate::NatKey`] -> [`crate::NatEntry`] (pod side of each flow).
    pub const NAT_OUT: &str = "NAT_OUT";
    /// Hash: [`crate::NatReverseKey`] -> [`crate::NatEntry`] (node side).
    pub const NAT_IN: &str = "NAT_IN";
    /// Array of one [`crate::NatConfig`].
    pub const NAT_CONFIG: &str = "NAT_CONFIG";
    /// LRU per-CPU hash: a pod's address (`[u8; 4]`) -> [`crate::RefusedFlows`], its
    /// new flows refused, by reason.
    pub const NAT_REFUSED: &str = "NAT_REFUSED";
    /// Hash: a pod's address (`[u8; 4]`) -> [`crate::FlowCounts`], its entries in each
    /// flow table (see [`crate::budget`]).
    pub const FLOW_COUNTS: &str = "FLOW_COUNTS";
    /// Hash: [`crate::NatKey`] with pod port 0 (a pod and a destination) -> `u32`, the
    /// node ports that pod holds toward that destination.
    pub const DEST_PORTS: &str = "DEST_PORTS";
    /// Array of one [`crate::Uplinks`]: the devices source NAT translates on.
    pub const UPLINKS: &str = "UPLINKS";
    /// LPM trie: [`crate::CidrKey`] -> `u8`, destinations that are not translated.
    pub const CLUSTER_CIDRS: &str = "CLUSTER_CIDRS";
    /// LPM trie: [`crate::CidrKey`] -> `u8`, the Service ranges (see [`crate::services`]).
    pub const SERVICE_CIDRS: &str = "SERVICE_CIDRS";
    /// Array of one `u32`: how many Service ranges there are.
    pub const SERVICE_RANGES: &str = "SERVICE_RANGES";
    /// Array of one [`crate::ServiceConfig`]: the NodePort range and each party's budget.
    pub const SERVICE_CONFIG: &str = "SERVICE_CONFIG";
    /// Hash: [`crate::ServiceClient`] -> [`crate::NatEntry`], pod sockets with Service
    /// connections.
    pub const SERVICE_CLIENTS: &str = "SERVICE_CLIENTS";
    /// Hash: [`crate::ServiceClient`] -> [`crate::NatEntry`], outside clients of Services
    /// whose connections the stack DNATs to pods.
    pub const SERVICE_PEERS: &str = "SERVICE_PEERS";
    /// Hash: [`crate::NatKey`] -> [`crate::NatEntry`], pods' Service connections as the
    /// stack translated them (whose replies go back through the stack) or opened
    /// directly to a local pod.
    pub const SERVICE_FLOWS: &str = "SERVICE_FLOWS";
    /// Hash: an address (`[u8; 4]`) -> [`crate::ServiceCounts`], a party's entries in
    /// the Service tables.
    pub const SERVICE_COUNTS: &str = "SERVICE_COUNTS";
    /// Per-CPU array of `u64`, indexed by [`crate::NatCounter`].
    pub const NAT_STATS: &str = "NAT_STATS";
    /// Per-CPU array of `u32`, indexed by a hash of a flow's destination: the offset in
    /// the port range of the next node port to hand out there, plus one (0: unused).
    pub const NAT_CURSORS: &str = "NAT_CURSORS";
    /// LRU hash: [`crate::FragmentKey`] -> [`crate::FragmentTarget`], what the first
    /// fragment of a translated datagram was given, for the fragments after it.
    pub const NAT_FRAGMENTS: &str = "NAT_FRAGMENTS";
    /// Hash: [`crate::NatKey`] (pod side) -> [`crate::NatEntry`] (the pod "translated"
    /// to itself): flows a host outside opened to a pod's own address, whose answers keep
    /// it.
    pub const NAT_INBOUND: &str = "NAT_INBOUND";
    /// Hash: [`crate::PortKey`] -> [`crate::PortTarget`], the hostPort mappings.
    pub const HOSTPORTS: &str = "HOSTPORTS";
    /// Hash: [`crate::NatKey`] (pod side) -> [`crate::NatEntry`] (its node address
    /// and port: the host address and port the client reached).
    pub const HOSTPORT_FLOWS: &str = "HOSTPORT_FLOWS";
    /// Hash: node IPv4 address (`[u8; 4]`) -> `u8` (1).
    pub const NODE_ADDRS: &str = "NODE_ADDRS";
    /// Hash: a pods' gateway the daemon made an address of the node (`[u8; 4]`) -> `u8`
    /// (1), at most [`crate::MAX_GATEWAYS`]: refused from outside the node.
    pub const GATEWAYS: &str = "GATEWAYS";
    /// LPM trie: (prefix, IPv4) -> [`crate::RemoteNode`], other nodes' pod ranges and
    /// addresses (`--routing vxlan`).
    pub const REMOTE_NODES: &str = "REMOTE_NODES";
    /// Hash: a pod's host-side ifindex (`u32`) -> [`crate::RateBucket`], its egress
    /// token bucket.
    pub const RATE_LIMITS: &str = "RATE_LIMITS";
    /// LPM trie: (32, IPv4) -> `u8` (1), the cluster's nodes' addresses on the
    /// underlay: pods' tunnel packets to them are dropped.
    pub const CLUSTER_NODES: &str = "CLUSTER_NODES";
    /// Array of one [`crate::OverlayConfig`]: the tunnel device and VNI.
    pub const OVERLAY_CONFIG: &str = "OVERLAY_CONFIG";
    /// Per-CPU hash: a node's address ([u8; 4]) -> [`crate::TrafficCounters`], what the
    /// pods of this node sent to that node's pods.
    pub const NODE_STATS: &str = "NODE_STATS";
    /// Array of [`crate::TARGET_WORDS`] + 1 `u32`: bit `port % 32` of word `port / 32` is set
    /// when a mapping leads to that container port.
    pub const HOSTPORT_TARGETS: &str = "HOSTPORT_TARGETS";
    /// Array of one [`crate::SockConfig`].
    pub const SOCK_CONFIG: &str = "SOCK_CONFIG";
    /// LRU hash: [`crate::SockRevKey`] -> [`crate::HostPortFlow`], the address a
    /// translated socket really dialled.
    pub const SOCK_REV: &str = "SOCK_REV";
    /// LPM trie: (prefix, [`crate::AddrKey`]) -> `u32`, the identity of the addresses
    /// under each prefix (see [`crate::policy`]).
    pub const POLICY_IDS: &str = "POLICY_IDS";
    /// LPM trie: (prefix, [`crate::RuleKey`]) -> [`crate::RuleValue`], each isolated
    /// pod's ways through.
    pub const POLICY_RULES: &str = "POLICY_RULES";
    /// Hash: a pod's host-side ifindex (`u32`) -> [`crate::PolicyEndpoint`], the
    /// directions it is isolated in.
    pub const POLICY_ENDPOINTS: &str = "POLICY_ENDPOINTS";
    /// Array of one [`crate::PolicyConfig`].
    pub const POLICY_CONFIG: &str = "POLICY_CONFIG";
    /// LRU hash: [`crate::FlowKey`] -> [`crate::FlowVerdict`], the verdicts given to
    /// flows at isolated pods.
    pub const POLICY_FLOWS: &str = "POLICY_FLOWS";
    /// Per-CPU hash: a policy's slot (`u32`) -> [`crate::PolicyCounters`].
    pub const POLICY_STATS: &str = "POLICY_STATS";
}

/// Names of the programs in the eBPF object.
pub mod program_names {
    /// TC classifier that counts packets per source IPv4 address.
    pub const COUNT_BY_SOURCE: &str = "count_by_source";
    /// TC ingress of a pod's host-side veth: traffic leaving the pod.
    pub const FROM_POD: &str = "from_pod";
    /// TC egress of the uplink: source NAT of pod traffic leaving the node.
    pub const UPLINK_EGRESS: &str = "uplink_egress";
    /// TC ingress of the uplink: replies translated back and delivered to pods.
    pub const UPLINK_INGRESS: &str = "uplink_ingress";
    /// TC classifier never attached: the NAT sweep's removals, run by the daemon with
    /// BPF_PROG_TEST_RUN (see [`crate::sweep`]).
    pub const NAT_SWEEP: &str = "nat_sweep";
    /// cgroup connect4: a node socket connecting to a hostPort goes to the pod.
    pub const SOCK_CONNECT4: &str = "hostport_connect4";
    /// cgroup sendmsg4: the same for unconnected UDP.
    pub const SOCK_SENDMSG4: &str = "hostport_sendmsg4";
    /// cgroup recvmsg4: UDP replies seem to come from the address dialled.
    pub const SOCK_RECVMSG4: &str = "hostport_recvmsg4";
    /// cgroup getpeername4: the peer is the address dialled.
    pub const SOCK_GETPEERNAME4: &str = "hostport_getpeername4";
    /// TC egress of a pod's host-side veth (and a netkit pair's primary hook): what the
    /// node's stack delivers to the pod, checked against policies.
    pub const TO_POD: &str = "to_pod";
    /// TC ingress of the overlay device: decapsulated packets from other nodes, checked
    /// and delivered into the pod.
    pub const OVERLAY_INGRESS: &str = "overlay_ingress";
    /// TC egress of the overlay device: the tunnel key (the node the destination is on)
    /// of what leaves by it.
    pub const OVERLAY_EGRESS: &str = "overlay_egress";
    /// TC ingress of the node's other devices (neither a pod's, nor an uplink, nor the
    /// overlay): ARP and packets for the pods' gateways dropped, nothing else touched.
    pub const GATEWAY_GUARD: &str = "gateway_guard";
    /// The socket programs, in attach order.
    pub const SOCKET_PROGRAMS: [&str; 4] = [
        SOCK_CONNECT4,
        SOCK_SENDMSG4,
        SOCK_RECVMSG4,
        SOCK_GETPEERNAME4,
    ];
}
