//! Pod endpoints as the datapath sees them: keyed by pod IPv4 address.

/// Entries of `GATEWAYS`: the pods' gateways the node answers at, one per pod range (a
/// node has a few).
pub const MAX_GATEWAYS: u32 = 256;

/// Key of the endpoints map: the pod's IPv4 address in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EndpointKey {
    pub addr: [u8; 4],
}

/// Where a pod address lives on this node.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// Index of the pod's host-side veth in the node's network namespace.
    pub host_ifindex: u32,
    /// MAC of the pod's interface (destination MAC when delivering to the pod).
    pub pod_mac: [u8; 6],
    /// MAC of the host-side veth: what the pod's ARP requests are answered with, and the
    /// source MAC of frames delivered to the pod.
    pub host_mac: [u8; 6],
    /// [`endpoint_flags`] bits.
    pub flags: u16,
    /// Explicit padding to the 4-byte alignment; always zero.
    pub pad: [u8; 2],
}

/// Bits of [`EndpointInfo::flags`].
pub mod endpoint_flags {
    /// Traffic from this pod to outside the cluster ranges is source-NATed.
    pub const MASQUERADE: u16 = 1 << 0;
    /// The pod's host veth has a root qdisc: a rate limit's `tbf` (the plugin's, or the
    /// reference `bandwidth` plugin's after it in a chain) or an operator's. Frames for
    /// the pod are redirected to that veth's egress, through the qdisc, instead of
    /// straight into the pod with `bpf_redirect_peer`, which skips every qdisc.
    pub const SHAPED: u16 = 1 << 1;
    /// The pod has an egress rate limit: `from_pod` polices what it sends against its
    /// token bucket in `RATE_LIMITS` ([`super::RateBucket`]), which the pod cannot skip
    /// as it can its own qdisc (`PACKET_QDISC_BYPASS`).
    pub const LIMITED: u16 = 1 << 2;
}

/// Value of `RATE_LIMITS` (keyed by the pod's host-side ifindex, `u32`): a pod's egress
/// token bucket. The daemon writes the rate and the burst (and a full bucket); the
/// datapath refills and spends it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateBucket {
    /// Bytes per second.
    pub rate: u64,
    /// The most the bucket holds, in bytes.
    pub burst: u64,
    /// What it holds now, in bytes.
    pub tokens: u64,
    /// When it was last refilled (`CLOCK_MONOTONIC`, ns).
    pub refilled_ns: u64,
}

/// Endpoints `RATE_LIMITS` holds, as many as the endpoints map.
pub const MAX_RATE_LIMITS: u32 = 4096;

const _: () = assert!(core::mem::size_of::<RateBucket>() == 32);

const _: () = assert!(core::mem::size_of::<EndpointKey>() == 4);
const _: () = assert!(core::mem::size_of::<EndpointInfo>() == 20);

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], four u64 fields, no padding (size asserted above).
unsafe impl aya::Pod for RateBucket {}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], fixed-width fields, no padding (sizes asserted above).
unsafe impl aya::Pod for EndpointKey {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for EndpointInfo {}
