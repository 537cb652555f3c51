//! The overlay between nodes (`ebpf-cnid run --routing vxlan`): which node holds which
//! pod range, and the tunnel device pods' traffic for other nodes leaves by.

/// Nodes the tables are sized for: Kubernetes tests clusters of 5,000 nodes; these
/// leave room beyond.
pub const MAX_NODES: u32 = 8_192;

/// Pod ranges of other nodes `REMOTE_NODES` holds at most, and cluster ranges
/// `CLUSTER_CIDRS` holds, and node addresses `CLUSTER_NODES` holds: two per node.
pub const MAX_REMOTE_RANGES: u32 = 2 * MAX_NODES;

/// Value of `REMOTE_NODES`, an LPM trie keyed by (prefix length, IPv4 in network
/// order): the node another node's pod range belongs to. Kept with either routing: the
/// pods' traffic to each node is counted by it (`NODE_STATS`), and the overlay sends
/// by it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteNode {
    /// The node's address on the underlay: the outer destination of what goes to it,
    /// and the only outer source what comes from it may have.
    pub addr: [u8; 4],
    /// Reserved (0).
    pub pad: u32,
}

/// `OVERLAY_CONFIG[0]`: the tunnel device, its VNI and UDP port; `ifindex` 0 is no
/// overlay (native routing: pods' traffic for other nodes follows the node's routes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OverlayConfig {
    /// The daemon's collect-metadata VXLAN device.
    pub ifindex: u32,
    /// The VXLAN network identifier every node of the cluster uses.
    pub vni: u32,
    /// The UDP port every node's device listens on (host byte order): the outer
    /// destination port of what the pod program encapsulates itself.
    pub port: u16,
    /// How far packets from other nodes' pods are trusted ([`underlay_trust`]); kept
    /// with either routing (`ifindex` 0).
    pub underlay_trust: u8,
    /// Reserved (0).
    pub pad: [u8; 5],
}

/// `OverlayConfig::underlay_trust` (`ebpf-cnid run --underlay-trust`).
pub mod underlay_trust {
    /// Packets from other nodes' pods go straight into pods when the frame can be tied
    /// to that node (the FIB reaches it by the device the frame came in by, through
    /// the neighbour that sent the frame); else to the node's stack.
    pub const RELAXED: u8 = 0;
    /// They always go through the node's stack (its netfilter and rp_filter apply).
    pub const STRICT: u8 = 1;
}

const _: () = assert!(core::mem::size_of::<RemoteNode>() == 8);
const _: () = assert!(core::mem::size_of::<OverlayConfig>() == 16);

#[cfg(feature = "user")]
mod pod_impls {
    // SAFETY (all): #[repr(C)], fixed-width fields, explicit padding, sizes asserted.
    unsafe impl aya::Pod for super::RemoteNode {}
    unsafe impl aya::Pod for super::OverlayConfig {}
}
