//! Every map of the object, declared once: pinned by the daemon under its bpffs folder,
//! named as `cni_ebpf_common::map_names` lists them, with their key and value types in
//! `cni_ebpf_common`. The features hold the logic that reads and writes them; the reads
//! several of them share are here. Sizes are the defaults: the daemon gives the flow
//! tables theirs at load (`--nat-max-flows`).

use aya_ebpf::{
    macros::map,
    maps::{
        Array, HashMap, LpmTrie, LruHashMap, LruPerCpuHashMap, PerCpuArray, PerCpuHashMap,
        lpm_trie::Key,
    },
};
use cni_ebpf_common::{
    DropReason, EndpointCounters, EndpointInfo, EndpointKey, FlowCounts, FragmentKey,
    FragmentTarget, HostPortFlow, MAX_GATEWAYS, MAX_NODES, MAX_RATE_LIMITS, MAX_REMOTE_RANGES,
    MAX_SERVICE_CIDRS, MAX_SERVICE_FLOWS, MAX_SERVICE_PARTIES, MAX_SERVICE_SOCKETS, NODE_ADDRS_MAX,
    NatConfig, NatCounter, NatEntry, NatKey, NatReverseKey, OverlayConfig, PortKey, PortTarget,
    RateBucket, RefusedFlows, RemoteNode, ServiceClient, ServiceConfig, ServiceCounts, SockConfig,
    SockRevKey, SourceKey, TARGET_WORDS, TrafficCounters, Uplinks,
    policy::{
        AddrKey, FlowKey, FlowVerdict, MAX_POLICY_ADDRS, MAX_POLICY_FLOWS, MAX_POLICY_RULES,
        MAX_POLICY_SLOTS, PolicyConfig, PolicyCounters, PolicyEndpoint, RuleKey, RuleValue,
    },
};

/// The layout version of the pins (`cni_ebpf_common::LAYOUT_VERSION`): no program reads
/// it; the daemon writes it and checks it at the next start.
#[map(name = "LAYOUT")]
static LAYOUT: Array<u32> = Array::pinned(1, 0);

// Endpoints and counters.

/// Pods per node; Kubernetes' default maximum is 110, this leaves room for churn.
const MAX_ENDPOINTS: u32 = 4096;
/// Distinct sources counted; a full map stops counting new sources.
const MAX_SOURCES: u32 = 4096;

/// A limited pod's host-side ifindex -> its egress token bucket.
#[map(name = "RATE_LIMITS")]
pub static RATE_LIMITS: HashMap<u32, RateBucket> = HashMap::pinned(MAX_RATE_LIMITS, 0);

/// Pod IPv4 -> host veth, pod MAC and host MAC, written by the daemon.
#[map(name = "ENDPOINTS")]
static ENDPOINTS: HashMap<EndpointKey, EndpointInfo> = HashMap::pinned(MAX_ENDPOINTS, 0);

/// The pods' gateways the daemon made addresses of the node, refused from outside it.
#[map(name = "GATEWAYS")]
static GATEWAYS: HashMap<[u8; 4], u8> = HashMap::pinned(MAX_GATEWAYS, 0);

#[map(name = "ENDPOINT_COUNTERS")]
pub static ENDPOINT_COUNTERS: PerCpuHashMap<u32, EndpointCounters> =
    PerCpuHashMap::pinned(MAX_ENDPOINTS, 0);

#[map(name = "DROPS")]
pub static DROPS: PerCpuArray<u64> = PerCpuArray::pinned(DropReason::SLOTS, 0);

#[map(name = "SOURCE_STATS")]
pub static SOURCE_STATS: PerCpuHashMap<SourceKey, TrafficCounters> =
    PerCpuHashMap::pinned(MAX_SOURCES, 0);

// Source NAT and connection tracking.

/// Flows tracked at once in each flow table. The tables are plain hashes: nothing is
/// evicted to make room, a new flow meeting a full table is refused, and the daemon's
/// sweep makes room (see `cni_ebpf_common::budget`).
const MAX_FLOWS: u32 = 262_144;
/// Fragmented datagrams tracked at once (each record is 28 bytes of key and value).
const MAX_DATAGRAMS: u32 = 16384;

#[map(name = "NAT_OUT")]
pub static NAT_OUT: HashMap<NatKey, NatEntry> = HashMap::pinned(MAX_FLOWS, 0);

#[map(name = "NAT_IN")]
pub static NAT_IN: HashMap<NatReverseKey, NatEntry> = HashMap::pinned(MAX_FLOWS, 0);

/// Flows a host outside opened to a pod's own address (a routed pod network), keyed
/// from the pod's side as `NAT_OUT` is: their TCP state (or whether the pod answered)
/// and when a packet of theirs last passed, in a [`NatEntry`] that "translates" the pod
/// to itself (see `conntrack::opened_from_outside`). Swept with the NAT tables.
#[map(name = "NAT_INBOUND")]
pub static NAT_INBOUND: HashMap<NatKey, NatEntry> = HashMap::pinned(MAX_FLOWS, 0);

/// log2 of the number of per-destination port cursors (see `snat::ports`).
pub const CURSOR_BITS: u32 = 10;

/// Per destination hash, shared by the CPUs: the next node port's offset in the range,
/// plus one (0: not used yet).
#[map(name = "NAT_CURSORS")]
pub static NAT_CURSORS: Array<u32> = Array::pinned(1 << CURSOR_BITS, 0);

/// Per CPU, the port search's closing port to fall back on (see `snat::ports`): kept
/// in a map value, not on the stack, so that verifiers before Linux 6.7, which check a
/// `bpf_loop` callback once with the values its caller left, cannot take it for the
/// caller's 0 on every iteration. Scratch for one program run: not pinned. A run that
/// interrupted another on the same CPU (only under PREEMPT_RT) could leave the other a
/// wrong port, which `reclaim` checks again before it takes it.
#[map(name = "PORT_SEARCH")]
pub static PORT_SEARCH: PerCpuArray<u16> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "NAT_CONFIG")]
static NAT_CONFIG: Array<NatConfig> = Array::pinned(1, 0);

#[map(name = "UPLINKS")]
static UPLINKS: Array<Uplinks> = Array::pinned(1, 0);

/// The cluster's pod ranges, collapsed by the daemon (as many as `REMOTE_NODES`: two
/// ranges for each node of the largest cluster the tables are sized for).
#[map(name = "CLUSTER_CIDRS")]
static CLUSTER_CIDRS: LpmTrie<[u8; 4], u8> = LpmTrie::pinned(MAX_REMOTE_RANGES, 0);

/// Other nodes' pod ranges, each with its node (`--routing vxlan`).
#[map(name = "REMOTE_NODES")]
static REMOTE_NODES: LpmTrie<[u8; 4], RemoteNode> = LpmTrie::pinned(MAX_REMOTE_RANGES, 0);

/// The cluster's nodes' addresses on the underlay, each a /32 (with either routing).
#[map(name = "CLUSTER_NODES")]
static CLUSTER_NODES: LpmTrie<[u8; 4], u8> = LpmTrie::pinned(MAX_REMOTE_RANGES, 0);

#[map(name = "OVERLAY_CONFIG")]
static OVERLAY_CONFIG: Array<OverlayConfig> = Array::pinned(1, 0);

/// What this node's pods sent to each other node (by its address).
#[map(name = "NODE_STATS")]
pub static NODE_STATS: PerCpuHashMap<[u8; 4], TrafficCounters> =
    PerCpuHashMap::pinned(MAX_NODES, 0);

/// New flows refused per pod address, by reason (see `budget::refuse`); the least
/// recently counted pods go first when it is full.
#[map(name = "NAT_REFUSED")]
pub static NAT_REFUSED: LruPerCpuHashMap<[u8; 4], RefusedFlows> =
    LruPerCpuHashMap::pinned(MAX_ENDPOINTS, 0);

/// Each pod's entries in the flow tables (see `budget`).
#[map(name = "FLOW_COUNTS")]
pub static FLOW_COUNTS: HashMap<[u8; 4], FlowCounts> = HashMap::pinned(MAX_ENDPOINTS, 0);

/// The node ports each pod holds toward each destination (see `budget`): at most one
/// key per translated flow, so as many as a flow table holds.
#[map(name = "DEST_PORTS")]
pub static DEST_PORTS: HashMap<NatKey, u32> = HashMap::pinned(MAX_FLOWS, 0);

#[map(name = "NAT_STATS")]
pub static NAT_STATS: PerCpuArray<u64> = PerCpuArray::pinned(NatCounter::SLOTS, 0);

/// How long the fragments of a datagram follow its first one (a record of
/// `NAT_FRAGMENTS` holds): Linux's reassembly timeout (`net.ipv4.ipfrag_time`), after
/// which the receiver gives the datagram up.
pub const FRAGMENT_SECS: u64 = 30;

/// The first fragments of datagrams, for the fragments after them: what the source NAT
/// gave them (`features::fragments`) and the flow a policy check judged them as
/// (`policy`).
#[map(name = "NAT_FRAGMENTS")]
pub static NAT_FRAGMENTS: LruHashMap<FragmentKey, FragmentTarget> =
    LruHashMap::pinned(MAX_DATAGRAMS, 0);

// hostPort.

/// Mappings per node: 5,000 must fit with room to spare.
const MAX_MAPPINGS: u32 = 16384;
/// Sockets of the node's own processes remembered at once; the LRU forgets the oldest.
const MAX_SOCKETS: u32 = 65536;

#[map(name = "HOSTPORTS")]
pub static HOSTPORTS: HashMap<PortKey, PortTarget> = HashMap::pinned(MAX_MAPPINGS, 0);

/// The connections through a mapping, keyed from the pod's side: a [`NatEntry`] whose
/// node address and port are the host address and port the client reached, its state
/// following TCP (or whether the pod answered) as the notes of `NAT_INBOUND` do, and
/// swept by the daemon as they are (idle past their timeout, closed, or their pod gone);
/// as many as the NAT tables hold (see docs/decisions.md, "hostPort connections").
#[map(name = "HOSTPORT_FLOWS")]
pub static HOSTPORT_FLOWS: HashMap<NatKey, NatEntry> = HashMap::pinned(MAX_FLOWS, 0);

#[map(name = "NODE_ADDRS")]
static NODE_ADDRS: HashMap<[u8; 4], u8> = HashMap::pinned(NODE_ADDRS_MAX, 0);

#[map(name = "HOSTPORT_TARGETS")]
pub static HOSTPORT_TARGETS: Array<u32> = Array::pinned(TARGET_WORDS + 1, 0);

#[map(name = "SOCK_CONFIG")]
pub static SOCK_CONFIG: Array<SockConfig> = Array::pinned(1, 0);

#[map(name = "SOCK_REV")]
pub static SOCK_REV: LruHashMap<SockRevKey, HostPortFlow> = LruHashMap::pinned(MAX_SOCKETS, 0);

// Services.

#[map(name = "SERVICE_CIDRS")]
pub static SERVICE_CIDRS: LpmTrie<[u8; 4], u8> = LpmTrie::pinned(MAX_SERVICE_CIDRS, 0);

/// Whether `addr` is in a Service range: kube-proxy's DNAT in the stack decides where
/// a packet for it goes.
#[inline(always)]
pub fn in_service_range(addr: [u8; 4]) -> bool {
    SERVICE_CIDRS.get(Key::new(32, addr)).is_some()
}

#[map(name = "SERVICE_RANGES")]
pub static SERVICE_RANGES: Array<u32> = Array::pinned(1, 0);

#[map(name = "SERVICE_CONFIG")]
pub static SERVICE_CONFIG: Array<ServiceConfig> = Array::pinned(1, 0);

/// The Service tables (see `cni_ebpf_common::services`): plain hashes, swept by the
/// daemon, each party within its budget.
#[map(name = "SERVICE_CLIENTS")]
pub static SERVICE_CLIENTS: HashMap<ServiceClient, NatEntry> =
    HashMap::pinned(MAX_SERVICE_SOCKETS, 0);

#[map(name = "SERVICE_PEERS")]
pub static SERVICE_PEERS: HashMap<ServiceClient, NatEntry> =
    HashMap::pinned(MAX_SERVICE_SOCKETS, 0);

#[map(name = "SERVICE_FLOWS")]
pub static SERVICE_FLOWS: HashMap<NatKey, NatEntry> = HashMap::pinned(MAX_SERVICE_FLOWS, 0);

#[map(name = "SERVICE_COUNTS")]
pub static SERVICE_COUNTS: HashMap<[u8; 4], ServiceCounts> =
    HashMap::pinned(MAX_SERVICE_PARTIES, 0);

// NetworkPolicy (see `cni_ebpf_common::policy`).

/// `BPF_F_NO_PREALLOC`: per-CPU values made as policies are counted, not for every
/// slot up front (65,536 slots on every CPU).
const NO_PREALLOC: u32 = 1;

#[map(name = "POLICY_IDS")]
pub static POLICY_IDS: LpmTrie<AddrKey, u32> = LpmTrie::pinned(MAX_POLICY_ADDRS, 0);

#[map(name = "POLICY_RULES")]
pub static POLICY_RULES: LpmTrie<RuleKey, RuleValue> = LpmTrie::pinned(MAX_POLICY_RULES, 0);

#[map(name = "POLICY_ENDPOINTS")]
pub static POLICY_ENDPOINTS: HashMap<u32, PolicyEndpoint> = HashMap::pinned(MAX_ENDPOINTS, 0);

#[map(name = "POLICY_CONFIG")]
pub static POLICY_CONFIG: Array<PolicyConfig> = Array::pinned(1, 0);

#[map(name = "POLICY_FLOWS")]
pub static POLICY_FLOWS: LruHashMap<FlowKey, FlowVerdict> = LruHashMap::pinned(MAX_POLICY_FLOWS, 0);

/// What a policy check builds (see `policy`): the flow's key and the keys it looks the
/// peer and the pod's ways up by.
#[repr(C)]
pub struct PolicyScratch {
    pub flow: FlowKey,
    /// What is read of the packet's headers.
    pub header: [u8; 20],
    pub addr: Key<AddrKey>,
    pub rule: Key<RuleKey>,
    /// A new flow's verdicts, as inserted.
    pub verdict: FlowVerdict,
    /// A policy's slot and its first counters, as inserted.
    pub counted: (u32, PolicyCounters),
    /// A fragmented datagram's key in `NAT_FRAGMENTS` (way `FragmentKey::POLICY`), and
    /// its record, as inserted.
    pub fragment: FragmentKey,
    pub fragment_record: FragmentTarget,
    /// 1 when the packet judged is the first fragment of a datagram, else 0.
    pub first_fragment: u8,
}

/// Per CPU, a policy check's [`PolicyScratch`]: kept in a map value, not on the stack
/// of the programs that call the check. Scratch for one program run: not pinned.
#[map(name = "POLICY_SCRATCH")]
pub static POLICY_SCRATCH: PerCpuArray<PolicyScratch> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "POLICY_STATS")]
pub static POLICY_STATS: PerCpuHashMap<u32, PolicyCounters> =
    PerCpuHashMap::pinned(MAX_POLICY_SLOTS, NO_PREALLOC);

/// The endpoint that owns `addr`, if it is a pod of this node.
#[inline(always)]
pub fn endpoint(addr: [u8; 4]) -> Option<EndpointInfo> {
    // SAFETY: the value is copied out at once, while the program's RCU read lock holds.
    unsafe { ENDPOINTS.get(&EndpointKey { addr }) }.copied()
}

/// The daemon's NAT configuration, when NAT is enabled.
#[inline(always)]
pub fn nat_config() -> Option<NatConfig> {
    NAT_CONFIG
        .get(0)
        .copied()
        .filter(|config| config.node_addr != [0; 4])
}

/// The timeouts the daemon wrote, whether or not NAT is on (hostPort connections expire
/// by them too); `None` while there are none (NAT off writes zeros, and then nothing
/// sweeps either).
#[inline(always)]
pub fn timeouts() -> Option<NatConfig> {
    NAT_CONFIG.get(0).copied().filter(NatConfig::has_timeouts)
}

/// The address of the uplink `ifindex` (`NatConfig::NO_ADDRESS` while it has none), or
/// `None` when `ifindex` is no uplink.
#[inline(always)]
pub fn uplink_addr(ifindex: u32) -> Option<[u8; 4]> {
    UPLINKS.get(0)?.find(ifindex)
}

/// Whether `addr` is inside the cluster's pod ranges (kept untranslated).
#[inline(always)]
pub fn in_cluster(addr: [u8; 4]) -> bool {
    CLUSTER_CIDRS.get(Key::new(32, addr)).is_some()
}

/// The node whose pod range holds `addr`, when it is another node's.
#[inline(always)]
pub fn remote_node(addr: [u8; 4]) -> Option<RemoteNode> {
    REMOTE_NODES.get(Key::new(32, addr)).copied()
}

/// The overlay device and VNI; `None` when there is no overlay (native routing).
#[inline(always)]
pub fn overlay_config() -> Option<OverlayConfig> {
    OVERLAY_CONFIG
        .get(0)
        .copied()
        .filter(|config| config.ifindex != 0)
}

/// `OverlayConfig::underlay_trust`, with either routing (0, `relaxed`, until the daemon
/// wrote it).
#[inline(always)]
pub fn underlay_trust() -> u8 {
    OVERLAY_CONFIG
        .get(0)
        .map_or(0, |config| config.underlay_trust)
}

/// Whether `addr` is a pods' gateway: an address of the node for its pods only.
#[inline(always)]
pub fn is_gateway(addr: [u8; 4]) -> bool {
    // SAFETY: only the presence is read.
    unsafe { GATEWAYS.get(&addr) }.is_some()
}

/// Whether `addr` is the address of a node of the cluster, this one or another.
#[inline(always)]
pub fn is_cluster_node(addr: [u8; 4]) -> bool {
    is_node_addr(addr) || CLUSTER_NODES.get(Key::new(32, addr)).is_some()
}

/// Whether `addr` is one of the node's own addresses.
#[inline(always)]
pub fn is_node_addr(addr: [u8; 4]) -> bool {
    // SAFETY: only the presence is read.
    unsafe { NODE_ADDRS.get(&addr) }.is_some()
}
