//! Source NAT (masquerade) of pod traffic leaving the node: the connection-tracking /
//! NAT tables, their configuration and counters.
//!
//! Two hashes hold every translated flow, one per direction, with the same value:
//! - `NAT_OUT`: [`NatKey`] (pod side) -> [`NatEntry`], used on the uplink's egress;
//! - `NAT_IN`: [`NatReverseKey`] (node side) -> [`NatEntry`], used on its ingress.
//!
//! Ports and ICMP echo identifiers are kept in host byte order.

/// A pod's flow as it leaves the pod.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NatKey {
    pub pod_addr: [u8; 4],
    pub remote_addr: [u8; 4],
    /// TCP/UDP source port, or the ICMP echo identifier.
    pub pod_port: u16,
    /// TCP/UDP destination port; 0 for ICMP.
    pub remote_port: u16,
    /// IP protocol number ([`crate::ip_proto`]).
    pub proto: u8,
    pub pad: [u8; 3],
}

/// The same flow as the outside sees it: replies are addressed to the node's port.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NatReverseKey {
    pub remote_addr: [u8; 4],
    /// The node port (or ICMP identifier) the flow was translated to.
    pub node_port: u16,
    pub remote_port: u16,
    pub proto: u8,
    pub pad: [u8; 3],
}

/// One translated flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatEntry {
    /// `bpf_ktime_get_coarse_ns` (CLOCK_MONOTONIC as of the last tick) at the last
    /// packet, either way.
    pub last_seen_ns: u64,
    pub pod_addr: [u8; 4],
    pub pod_port: u16,
    pub node_port: u16,
    /// [`tcp_state`](crate::tcp_state) for TCP; 0 for ICMP;
    /// [`udp_state`](crate::udp_state) otherwise (see [`crate::flow`]).
    pub state: u8,
    /// TCP: which sides' sequence numbers [`seq`](Self::seq) holds, bits
    /// [`seq_seen`](crate::flow::seq_seen). 0 for other protocols.
    pub seq_seen: u8,
    pub pad: [u8; 2],
    /// The address the flow leaves with (its uplink's when the flow began or last left
    /// after an address change); the pod's own in a note of a connection to it.
    pub node_addr: [u8; 4],
    /// TCP: the highest sequence number seen from the side that opened the flow
    /// (`[0]`, [`Way::Out`](crate::Way::Out)) and from the other (`[1]`), which RST
    /// and FIN must fall near to move the state ([`crate::flow::follow_seq`]). Each
    /// table's entry follows the side whose packets look it up; its twin's copy of
    /// that side is refreshed with the state.
    pub seq: [u32; 2],
}

impl NatEntry {
    /// The note of `flow`, a flow a host outside opened to the pod's own address
    /// (`NAT_INBOUND`), in `state` at `now_ns`: the pod "translated" to itself, its own
    /// address and port on the node side.
    #[inline(always)]
    #[must_use]
    pub const fn from_outside(flow: &NatKey, state: u8, now_ns: u64) -> Self {
        Self {
            last_seen_ns: now_ns,
            pod_addr: flow.pod_addr,
            pod_port: flow.pod_port,
            node_port: flow.pod_port,
            state,
            seq_seen: 0,
            pad: [0; 2],
            node_addr: flow.pod_addr,
            seq: [0; 2],
        }
    }
}

impl NatKey {
    /// The flow between `pod` and `remote` (address and port each; 0 for protocols
    /// without ports) over `proto`.
    #[inline(always)]
    #[must_use]
    pub const fn new(pod: ([u8; 4], u16), remote: ([u8; 4], u16), proto: u8) -> Self {
        Self {
            pod_addr: pod.0,
            remote_addr: remote.0,
            pod_port: pod.1,
            remote_port: remote.1,
            proto,
            pad: [0, 0, 0],
        }
    }

    /// The `NAT_IN` key of this flow once translated to `node_port`.
    #[inline(always)]
    #[must_use]
    pub const fn reverse(&self, node_port: u16) -> NatReverseKey {
        NatReverseKey {
            remote_addr: self.remote_addr,
            node_port,
            remote_port: self.remote_port,
            proto: self.proto,
            pad: [0, 0, 0],
        }
    }

    /// The key of this flow's pod and destination in `DEST_PORTS`: the pod port 0.
    #[inline(always)]
    #[must_use]
    pub const fn destination(&self) -> NatKey {
        NatKey {
            pod_port: 0,
            ..*self
        }
    }
}

impl NatReverseKey {
    /// The `NAT_OUT` key of the flow whose `NAT_IN` entry is (`self`, `entry`).
    #[inline(always)]
    #[must_use]
    pub const fn forward(&self, entry: &NatEntry) -> NatKey {
        NatKey {
            pod_addr: entry.pod_addr,
            remote_addr: self.remote_addr,
            pod_port: entry.pod_port,
            remote_port: self.remote_port,
            proto: self.proto,
            pad: [0, 0, 0],
        }
    }
}

/// Uplinks source NAT translates on at most.
pub const MAX_UPLINKS: usize = 16;

/// The devices source NAT translates on (`UPLINKS`, an array of one), each with the
/// address what leaves by it is translated to.
///
/// Decision: one array value scanned in order rather than a hash keyed by ifindex. The
/// programs read it for every packet, and an array lookup is a few inlined instructions
/// where a hash lookup is a helper call and a bucket walk; a node has one uplink or a
/// few, and the first is found at once.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Uplinks {
    /// Entries in use, from the first.
    pub count: u32,
    pub ifindex: [u32; MAX_UPLINKS],
    /// Each uplink's address, or [`NatConfig::NO_ADDRESS`] while it has none.
    pub addr: [[u8; 4]; MAX_UPLINKS],
}

impl Uplinks {
    /// The address of the uplink `ifindex`, or `None` when it is no uplink.
    #[inline(always)]
    pub fn find(&self, ifindex: u32) -> Option<[u8; 4]> {
        for i in 0..MAX_UPLINKS {
            if i as u32 >= self.count {
                return None;
            }
            if self.ifindex[i] == ifindex {
                return Some(self.addr[i]);
            }
        }
        None
    }

    /// Appends an uplink; `false` when full.
    pub fn push(&mut self, ifindex: u32, addr: [u8; 4]) -> bool {
        let at = self.count as usize;
        if at >= MAX_UPLINKS {
            return false;
        }
        self.ifindex[at] = ifindex;
        self.addr[at] = addr;
        self.count += 1;
        true
    }

    /// The uplinks in order, as (ifindex, address).
    pub fn iter(&self) -> impl Iterator<Item = (u32, [u8; 4])> + '_ {
        let count = (self.count as usize).min(MAX_UPLINKS);
        self.ifindex[..count]
            .iter()
            .copied()
            .zip(self.addr[..count].iter().copied())
    }
}

/// What the daemon tells the datapath (`NAT_CONFIG`, an array of one).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatConfig {
    /// 0.0.0.0 disables NAT. Otherwise the first uplink's address, or
    /// [`NatConfig::NO_ADDRESS`] while it has none; each uplink's own address, the
    /// source of what leaves by it, is in `UPLINKS`, which the programs read.
    pub node_addr: [u8; 4],
    /// Node ports handed out, inclusive.
    pub port_min: u16,
    pub port_max: u16,
    pub tcp_established_secs: u32,
    /// SYN sent, or FIN/RST seen.
    pub tcp_transitory_secs: u32,
    pub udp_secs: u32,
    pub icmp_secs: u32,
    /// ifindex of the first uplink (every uplink is in `UPLINKS`).
    pub uplink_ifindex: u32,
    /// A closed TCP flow (FIN both ways, or RST) keeps its port this long.
    pub tcp_closed_secs: u32,
    /// A UDP flow that is a stream ([`crate::udp_state::STREAM`]); `udp_secs` is for
    /// the others.
    pub udp_stream_secs: u32,
    /// Entries one pod may hold in each flow table (see [`crate::budget`]); 0: no
    /// budget (the daemon wrote none: NAT off).
    pub pod_flow_budget: u32,
    /// Node ports one pod may hold toward one destination (remote address, port and
    /// protocol); 0: no budget.
    pub dest_port_budget: u32,
}

impl NatConfig {
    /// `node_addr` while the uplink has no IPv4 address (taken away, or a DHCP lease
    /// lost): traffic to translate is dropped and counted, as iptables MASQUERADE drops
    /// it, instead of leaving with the pod's address or one the node no longer owns.
    /// Decision: a reserved value (the limited broadcast address, never a source) rather
    /// than a new field, so that `NAT_CONFIG`, pinned across daemon upgrades, keeps its
    /// layout.
    pub const NO_ADDRESS: [u8; 4] = [255, 255, 255, 255];

    /// Whether the daemon wrote timeouts (it writes none, all zeros, with NAT off): until
    /// it has, hostPort connections never expire and nothing sweeps them.
    #[inline(always)]
    pub fn has_timeouts(&self) -> bool {
        self.tcp_established_secs != 0
    }

    /// Whether there is a node address to translate to.
    pub fn has_address(&self) -> bool {
        Self::is_address(self.node_addr)
    }

    /// Whether `addr` (`node_addr`, or an uplink's in `UPLINKS`) is an address to
    /// translate to.
    #[inline(always)]
    pub fn is_address(addr: [u8; 4]) -> bool {
        addr != Self::NO_ADDRESS && addr != [0; 4]
    }
}

/// Key of `CLUSTER_CIDRS`, an LPM trie of destinations that keep the pod's address
/// (the pod ranges): the prefix length and the address in network order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CidrKey {
    pub prefix_len: u32,
    pub addr: [u8; 4],
}

/// Indexes of the per-CPU `NAT_STATS` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NatCounter {
    /// Packets whose source was rewritten on the way out.
    TranslatedOut = 0,
    /// Replies rewritten back and delivered to a pod.
    TranslatedIn = 1,
    /// ICMP errors about a translated flow, delivered to the pod.
    IcmpErrorsIn = 2,
    /// New flows that got a node port.
    NewFlows = 3,
    /// New flows that found no free node port (dropped).
    AllocationFailures = 4,
    /// Node ports tried for new flows after their first choice was held: how crowded
    /// the port range is towards busy destinations.
    PortProbes = 5,
    /// Fragments after the first of a translated datagram, given its source on the way
    /// out (see [`FragmentKey`]).
    FragmentsOut = 6,
    /// The same on the way in: given the pod's address back.
    FragmentsIn = 7,
    /// New flows refused because their table was full (of every kind: translated,
    /// from outside, hostPort; per pod in `NAT_REFUSED`).
    TableFull = 8,
    /// New flows refused because their pod held its budget (flows, or node ports
    /// toward their destination).
    OverBudget = 9,
    /// New flows that found no free node port and took over the port of a closing flow
    /// of their own pod (see `tcp_state::POD_CLOSED_RECLAIM_MS`).
    ClosingReclaimed = 10,
    /// Packets from another node's pods (natively routed, or out of the overlay) handed
    /// to the node's stack instead of straight to the pod: `--underlay-trust strict`,
    /// or a frame the checks could not tie to that node (see `underlay_trust`).
    UnderlayToStack = 11,
    /// New Service connections not recorded, and dropped: their party held its budget of
    /// a Service table, or the table was full (see [`crate::services`]). A sweep follows
    /// within a second.
    ServiceRefused = 12,
}

impl NatCounter {
    pub const ALL: [NatCounter; 13] = [
        NatCounter::TranslatedOut,
        NatCounter::TranslatedIn,
        NatCounter::IcmpErrorsIn,
        NatCounter::NewFlows,
        NatCounter::AllocationFailures,
        NatCounter::PortProbes,
        NatCounter::FragmentsOut,
        NatCounter::FragmentsIn,
        NatCounter::TableFull,
        NatCounter::OverBudget,
        NatCounter::ClosingReclaimed,
        NatCounter::UnderlayToStack,
        NatCounter::ServiceRefused,
    ];
    /// Size of the counter array (room for counters added later; a pin of another
    /// size is created anew at start).
    pub const SLOTS: u32 = 16;

    pub const fn name(self) -> &'static str {
        match self {
            NatCounter::TranslatedOut => "translated_out",
            NatCounter::TranslatedIn => "translated_in",
            NatCounter::IcmpErrorsIn => "icmp_errors_in",
            NatCounter::NewFlows => "new_flows",
            NatCounter::AllocationFailures => "allocation_failures",
            NatCounter::PortProbes => "port_probes",
            NatCounter::FragmentsOut => "fragments_out",
            NatCounter::FragmentsIn => "fragments_in",
            NatCounter::TableFull => "table_full",
            NatCounter::OverBudget => "over_budget",
            NatCounter::ClosingReclaimed => "closing_reclaimed",
            NatCounter::UnderlayToStack => "underlay_to_stack",
            NatCounter::ServiceRefused => "service_refused",
        }
    }
}

/// A fragmented IPv4 datagram crossing an uplink: the key of `NAT_FRAGMENTS`, which
/// holds what the translation of its first fragment did ([`FragmentTarget`]) for the
/// fragments after it, which carry no ports to find the flow by. The addresses are the
/// packet's before translation.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentKey {
    pub src_addr: [u8; 4],
    pub dst_addr: [u8; 4],
    /// The IPv4 identification field, as on the wire.
    pub id: [u8; 2],
    pub proto: u8,
    /// [`FragmentKey::LEAVING`], [`FragmentKey::ARRIVING`], [`FragmentKey::TO_STACK`] or
    /// [`FragmentKey::POLICY`].
    pub way: u8,
}

impl FragmentKey {
    /// A pod's datagram leaving by an uplink (its source is rewritten).
    pub const LEAVING: u8 = 0;
    /// A datagram arriving on an uplink for a pod (its destination is rewritten).
    pub const ARRIVING: u8 = 1;
    /// A pod's datagram for a pod of the node, handed to the node's stack (a Service
    /// backend's reply, whose DNAT the stack undoes); nothing is rewritten.
    pub const TO_STACK: u8 = 2;
    /// A datagram a NetworkPolicy check admitted at a pod: the record's `addr` holds the
    /// source and destination ports (or ICMP echo identifiers) of the flow its first
    /// fragment was judged as, big-endian, by which the fragments after it are judged.
    pub const POLICY: u8 = 3;
}

/// The value of `NAT_FRAGMENTS` (see [`FragmentKey`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentTarget {
    /// When the first fragment passed (CLOCK_MONOTONIC, coarse).
    pub seen_ns: u64,
    /// The address the first fragment was given: its new source leaving, its new
    /// destination (the pod's) arriving.
    pub addr: [u8; 4],
    /// Arriving: 1 when the first fragment was handed straight into the pod, 0 when it
    /// was left to the node's stack; the fragments after it go the same way.
    pub deliver: u8,
    pub pad: [u8; 3],
}

/// One removal the daemon's NAT sweep hands the `nat_sweep` program (see [`sweep`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SweepItem {
    /// The flow's `NAT_OUT` key ([`sweep::FLOW`]).
    pub out: NatKey,
    /// Its `NAT_IN` key ([`sweep::PAIR`], [`sweep::ORPHAN`]).
    pub inbound: NatReverseKey,
    /// [`sweep`] flags.
    pub kind: u8,
    pub pad: [u8; 3],
    /// The `last_seen_ns` the sweep decided on: an entry stamped later has seen a packet
    /// since (or was rewritten for another flow) and stays.
    pub decided_ns: u64,
}

/// The `nat_sweep` program's input, a BPF_PROG_TEST_RUN frame: [`HEADER`] bytes, then
/// up to [`MAX_ITEMS`] [`SweepItem`]s; its return value counts what went.
///
/// [`HEADER`]: sweep::HEADER
/// [`MAX_ITEMS`]: sweep::MAX_ITEMS
pub mod sweep {
    /// Bytes before the first item: room for the Ethernet header the kernel parses in a
    /// test run's frame (contents ignored).
    pub const HEADER: usize = 16;
    /// Items per run: the frame stays within a test run's one page.
    pub const MAX_ITEMS: usize = 64;
    /// A flow: its `NAT_OUT` entry goes unless refreshed since the decision.
    pub const FLOW: u8 = 1;
    /// With [`FLOW`]: once the `NAT_OUT` entry is gone, its `NAT_IN` pair goes too
    /// (unless refreshed).
    pub const PAIR: u8 = 2;
    /// A `NAT_IN` entry whose `NAT_OUT` pair is gone: it goes unless refreshed.
    pub const ORPHAN: u8 = 4;
    /// A note of `NAT_INBOUND` (a flow opened from outside to a pod's own address,
    /// keyed as `out` is): it goes unless refreshed.
    pub const FROM_OUTSIDE: u8 = 8;
    /// A connection of `HOSTPORT_FLOWS` (through a hostPort mapping, keyed as `out` is):
    /// it goes unless refreshed.
    pub const HOSTPORT: u8 = 16;
    /// An entry of `SERVICE_CLIENTS` (its socket as `out`'s pod address, port and
    /// protocol): it goes unless refreshed. Service items come in chunks of their own,
    /// whose return value counts them in its low bits.
    pub const SERVICE_CLIENT: u8 = 32;
    /// An entry of `SERVICE_PEERS`, as [`SERVICE_CLIENT`].
    pub const SERVICE_PEER: u8 = 64;
    /// An entry of `SERVICE_FLOWS` (keyed as `out` is), as [`SERVICE_CLIENT`].
    pub const SERVICE_FLOW: u8 = 128;
    /// Any of the Service kinds.
    pub const SERVICE: u8 = SERVICE_CLIENT | SERVICE_PEER | SERVICE_FLOW;
    /// All three Service kinds at once: a party's `SERVICE_COUNTS` entry (its address
    /// as `out`'s pod address), which goes if it counts nothing.
    pub const SERVICE_PARTY: u8 = SERVICE;
    /// The return value: flows gone in the low bits, orphans above this shift, notes
    /// above [`FROM_OUTSIDE_SHIFT`], hostPort connections above [`HOSTPORT_SHIFT`] (at
    /// most [`MAX_ITEMS`] each).
    pub const ORPHAN_SHIFT: u32 = 8;
    /// See [`ORPHAN_SHIFT`].
    pub const FROM_OUTSIDE_SHIFT: u32 = 16;
    /// See [`ORPHAN_SHIFT`].
    pub const HOSTPORT_SHIFT: u32 = 24;
    /// The mask of one count of the return value, once shifted down.
    pub const COUNT_MASK: u32 = (1 << ORPHAN_SHIFT) - 1;
}

const _: () = assert!(core::mem::size_of::<NatKey>() == 16);
const _: () = assert!(core::mem::size_of::<NatReverseKey>() == 12);
const _: () = assert!(core::mem::size_of::<NatEntry>() == 32);
const _: () = assert!(core::mem::size_of::<SweepItem>() == 40);
const _: () = assert!(sweep::MAX_ITEMS as u32 <= sweep::COUNT_MASK);
// The last count fits below the return value's sign bit.
const _: () = assert!((sweep::MAX_ITEMS as u64) << sweep::HOSTPORT_SHIFT < 1 << 31);
const _: () = assert!(core::mem::size_of::<NatConfig>() == 44);
const _: () = assert!(core::mem::size_of::<CidrKey>() == 8);
const _: () = assert!(core::mem::size_of::<FragmentKey>() == 12);
const _: () = assert!(core::mem::size_of::<FragmentTarget>() == 16);
const _: () = assert!(core::mem::size_of::<Uplinks>() == 4 + 8 * MAX_UPLINKS);
const _: () = assert!((NatCounter::ALL.len() as u32) <= NatCounter::SLOTS);

#[cfg(feature = "user")]
mod pod_impls {
    // SAFETY (all): #[repr(C)], fixed-width fields, explicit padding, sizes asserted.
    unsafe impl aya::Pod for super::NatKey {}
    unsafe impl aya::Pod for super::NatReverseKey {}
    unsafe impl aya::Pod for super::NatEntry {}
    unsafe impl aya::Pod for super::SweepItem {}
    unsafe impl aya::Pod for super::NatConfig {}
    unsafe impl aya::Pod for super::CidrKey {}
    unsafe impl aya::Pod for super::Uplinks {}
    unsafe impl aya::Pod for super::FragmentKey {}
    unsafe impl aya::Pod for super::FragmentTarget {}
}
