//! hostPort: connections to a node address and port handed to a pod's port.
//!
//! - `HOSTPORTS`: [`PortKey`] -> [`PortTarget`], written by the daemon (a `host_addr` of
//!   0.0.0.0 means every node address);
//! - `HOSTPORT_FLOWS`: the connections going through a mapping, keyed like a NAT flow
//!   from the pod's side ([`crate::NatKey`]: pod address and port, client address and
//!   port), so the pod's replies get the host address and port back;
//! - `NODE_ADDRS`: the node's own IPv4 addresses (key `[u8; 4]`, value 1), which a
//!   mapping without hostIP covers, kept current by the daemon;
//! - `HOSTPORT_TARGETS`: a bitmap of the container ports some mapping leads to, so the
//!   pod-to-pod fast path looks for a hostPort flow only on replies from such a port;
//! - `SOCK_CONFIG` and `SOCK_REV`: the socket-level hooks (cgroup connect4, sendmsg4,
//!   recvmsg4, getpeername4) that give the node's own processes their hostPorts: the
//!   network namespace they act in, and per socket the address it really dialled.

/// Entries of `NODE_ADDRS`. With kube-proxy in IPVS mode every ClusterIP is an address
/// of the node (on `kube-ipvs0`), so the map holds thousands: 16,384 covers the largest
/// clusters' Service counts for a preallocated cost of about 1 MiB (a hash element of
/// a 4-byte key and 1-byte value is ~64 bytes in the kernel). See docs/decisions.md.
pub const NODE_ADDRS_MAX: u32 = 16_384;

/// A host port: protocol, node address (0.0.0.0: any) and port (host byte order).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortKey {
    pub host_addr: [u8; 4],
    pub host_port: u16,
    pub proto: u8,
    pub pad: u8,
}

/// Where a host port leads.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortTarget {
    pub pod_addr: [u8; 4],
    pub pod_port: u16,
    pub pad: [u8; 2],
}

/// The host side of a connection through a mapping.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostPortFlow {
    pub host_addr: [u8; 4],
    pub host_port: u16,
    pub pad: [u8; 2],
}

/// Where a pod's connection to its own hostPort (hairpin) appears to come from, inside
/// the pod: a link-local address that is never a pod's or the node's (the address
/// Cilium uses for the same purpose). Without it the pod would see a packet from its
/// own address, which its kernel drops as martian.
pub const HAIRPIN_ADDR: [u8; 4] = [169, 254, 42, 1];

/// Words of [`HOSTPORT_TARGETS`](crate::map_names::HOSTPORT_TARGETS): one bit per port.
pub const TARGET_WORDS: u32 = 65536 / 32;
/// The slot of `HOSTPORT_TARGETS` after the bitmap: how many container ports mappings
/// lead to. Zero lets the pod program skip hostPort work for every packet.
pub const TARGET_COUNT: u32 = TARGET_WORDS;

/// The socket hooks' configuration.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockConfig {
    /// Cookie of the daemon's network namespace (`SO_NETNS_COOKIE`); sockets of other
    /// namespaces are left alone. 0: the hooks do nothing.
    pub netns_cookie: u64,
}

/// A socket whose destination a hook rewrote, and the pod address it now talks to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockRevKey {
    pub socket_cookie: u64,
    pub pod_addr: [u8; 4],
    pub pod_port: u16,
    pub pad: [u8; 2],
}

const _: () = assert!(core::mem::size_of::<PortKey>() == 8);
const _: () = assert!(core::mem::size_of::<SockConfig>() == 8);
const _: () = assert!(core::mem::size_of::<SockRevKey>() == 16);
const _: () = assert!(core::mem::size_of::<PortTarget>() == 8);
const _: () = assert!(core::mem::size_of::<HostPortFlow>() == 8);

#[cfg(feature = "user")]
mod pod_impls {
    // SAFETY (all): #[repr(C)], fixed-width fields, explicit padding, sizes asserted.
    unsafe impl aya::Pod for super::PortKey {}
    unsafe impl aya::Pod for super::PortTarget {}
    unsafe impl aya::Pod for super::HostPortFlow {}
    unsafe impl aya::Pod for super::SockConfig {}
    unsafe impl aya::Pod for super::SockRevKey {}
}
