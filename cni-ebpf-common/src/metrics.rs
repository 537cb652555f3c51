//! Per-endpoint counters and drop reasons, shared by the datapath, the CLI and metrics.

/// Traffic of one endpoint, keyed in the map by its host veth's ifindex (`u32`).
/// "from pod" is what the pod sent, "to pod" what was delivered to it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointCounters {
    pub from_pod_packets: u64,
    pub from_pod_bytes: u64,
    pub to_pod_packets: u64,
    pub to_pod_bytes: u64,
}

impl EndpointCounters {
    /// Sum of two counters (used to fold per-CPU values).
    #[must_use]
    pub const fn plus(self, other: Self) -> Self {
        Self {
            from_pod_packets: self.from_pod_packets.wrapping_add(other.from_pod_packets),
            from_pod_bytes: self.from_pod_bytes.wrapping_add(other.from_pod_bytes),
            to_pod_packets: self.to_pod_packets.wrapping_add(other.to_pod_packets),
            to_pod_bytes: self.to_pod_bytes.wrapping_add(other.to_pod_bytes),
        }
    }
}

/// Why the datapath dropped a packet: the index into the per-CPU drop counter array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Shorter than the headers its EtherType announces.
    TruncatedFrame = 0,
    /// An IPv4 header whose version or header length is invalid.
    MalformedIpv4 = 1,
    /// An ARP packet that is not Ethernet/IPv4.
    MalformedArp = 2,
    /// A new flow to translate found every node port of its destination taken (for SCTP,
    /// whose port is kept, and protocols without ports: the one it can have).
    NatPortsExhausted = 3,
    /// A non-first IPv4 fragment of masqueraded traffic: it has no ports to translate,
    /// and sending it untranslated would leak the pod's address.
    NatFragment = 4,
    /// Masqueraded traffic while the uplink has no IPv4 address (`NatConfig::NO_ADDRESS`).
    NatNoAddress = 5,
    /// A frame from a pod with an 802.1Q or 802.1ad tag (in the frame or already taken
    /// into the skb by the kernel): pods have no VLANs, and a tag would hop into one.
    VlanTagged = 6,
    /// A frame from a pod whose Ethernet source is not the pod's MAC.
    SpoofedMac = 7,
    /// IPv4 from a pod whose source is not one of that pod's addresses.
    SpoofedIpv4Source = 8,
    /// ARP from a pod whose sender address or MAC is not the pod's own.
    SpoofedArp = 9,
    /// A new flow of a pod that holds its budget of entries in the flow table
    /// (`cni_ebpf_common::budget`).
    NatFlowBudget = 10,
    /// A new translated flow of a pod that holds its budget of node ports toward that
    /// destination.
    NatPortBudget = 11,
    /// A new flow whose flow table is full: established flows are never evicted for it.
    NatTableFull = 12,
    /// A packet out of the overlay whose inner source is neither a pod range nor the
    /// address of the node that sent it (its outer source).
    OverlaySpoofedSource = 13,
    /// A packet out of the overlay with a VNI other than the cluster's.
    OverlayForeignVni = 14,
    /// A packet out of the overlay for neither a pod of this node nor the node itself
    /// (the overlay relays nothing); one into it for no other node's pod range; or
    /// anything but well-formed IPv4 on the overlay device.
    OverlayNotLocal = 15,
    /// A packet or an ARP request from outside the node (an uplink, the overlay) for a
    /// pods' gateway: the node answers at that address for its pods only.
    GatewayFromOutside = 16,
    /// A pod's packet the pod program had grown to encapsulate it for another node
    /// (`--routing vxlan`) whose outer headers the kernel then refused to take.
    OverlayEncapFailed = 17,
    /// A frame from a pod of an EtherType the datapath does not handle (IPv6 among
    /// them, until it is a supported family): nothing but IPv4 and ARP reaches the node
    /// from a pod, so a pod's Router Advertisement never configures it.
    PodEtherType = 18,
    /// A pod's tunnel packet for a node: IP-in-IP, IPv6-in-IPv4, GRE, or UDP to the
    /// overlay's or VXLAN's port. Another node would take it out of the tunnel as if it
    /// came from a node.
    PodTunnel = 19,
    /// A masqueraded pod's packet whose layer-4 header source NAT cannot read (a UDP or
    /// TCP header cut short): it would leave with the pod's own address.
    NatUnparsable = 20,
    /// A VXLAN packet claiming another node's address (the outer source) whose frame
    /// comes from another neighbour than the one the node's FIB reaches that node by
    /// (or by another device): a host on the underlay forging a node.
    UnderlaySpoofed = 21,
    /// A pod's packet past its egress rate limit (its token bucket empty), however it
    /// was sent: a raw socket that skips the pod's own qdisc included.
    PodRateLimited = 22,
    /// A new Service connection whose party (the pod, or the outside address) holds its
    /// budget of a Service table (see `cni_ebpf_common::services`).
    ServiceBudget = 23,
    /// A new Service connection meeting a full Service table.
    ServiceTableFull = 24,
    /// A packet of a new flow no NetworkPolicy lets out of its pod or into its pod
    /// (counted by policy in `POLICY_STATS` as well).
    PolicyDenied = 25,
}

impl DropReason {
    /// Every reason, in index order.
    pub const ALL: [DropReason; 26] = [
        DropReason::TruncatedFrame,
        DropReason::MalformedIpv4,
        DropReason::MalformedArp,
        DropReason::NatPortsExhausted,
        DropReason::NatFragment,
        DropReason::NatNoAddress,
        DropReason::VlanTagged,
        DropReason::SpoofedMac,
        DropReason::SpoofedIpv4Source,
        DropReason::SpoofedArp,
        DropReason::NatFlowBudget,
        DropReason::NatPortBudget,
        DropReason::NatTableFull,
        DropReason::OverlaySpoofedSource,
        DropReason::OverlayForeignVni,
        DropReason::OverlayNotLocal,
        DropReason::GatewayFromOutside,
        DropReason::OverlayEncapFailed,
        DropReason::PodEtherType,
        DropReason::PodTunnel,
        DropReason::NatUnparsable,
        DropReason::UnderlaySpoofed,
        DropReason::PodRateLimited,
        DropReason::ServiceBudget,
        DropReason::ServiceTableFull,
        DropReason::PolicyDenied,
    ];

    /// Size of the drop counter array (room for reasons added later).
    pub const SLOTS: u32 = 32;

    /// Stable name for tables, JSON and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            DropReason::TruncatedFrame => "truncated_frame",
            DropReason::MalformedIpv4 => "malformed_ipv4",
            DropReason::MalformedArp => "malformed_arp",
            DropReason::NatPortsExhausted => "nat_ports_exhausted",
            DropReason::NatFragment => "nat_fragment",
            DropReason::NatNoAddress => "nat_no_address",
            DropReason::VlanTagged => "vlan_tagged",
            DropReason::SpoofedMac => "spoofed_mac",
            DropReason::SpoofedIpv4Source => "spoofed_ipv4_source",
            DropReason::SpoofedArp => "spoofed_arp",
            DropReason::NatFlowBudget => "nat_flow_budget",
            DropReason::NatPortBudget => "nat_port_budget",
            DropReason::NatTableFull => "nat_table_full",
            DropReason::OverlaySpoofedSource => "overlay_spoofed_source",
            DropReason::OverlayForeignVni => "overlay_foreign_vni",
            DropReason::OverlayNotLocal => "overlay_not_local",
            DropReason::GatewayFromOutside => "gateway_from_outside",
            DropReason::OverlayEncapFailed => "overlay_encap_failed",
            DropReason::PodEtherType => "pod_ethertype",
            DropReason::PodTunnel => "pod_tunnel",
            DropReason::NatUnparsable => "nat_unparsable",
            DropReason::UnderlaySpoofed => "underlay_spoofed",
            DropReason::PodRateLimited => "pod_rate_limited",
            DropReason::ServiceBudget => "service_budget",
            DropReason::ServiceTableFull => "service_table_full",
            DropReason::PolicyDenied => "policy_denied",
        }
    }
}

const _: () = assert!(core::mem::size_of::<EndpointCounters>() == 32);
const _: () = assert!((DropReason::ALL.len() as u32) <= DropReason::SLOTS);

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], four u64 fields, no padding (size asserted above).
unsafe impl aya::Pod for EndpointCounters {}
