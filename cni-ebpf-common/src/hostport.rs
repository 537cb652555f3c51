//! hostPort: connections to a node address and port handed to a pod's port.
//!
//! - `HOSTPORTS`: [`PortKey`] -> [`PortTarget`], written by the daemon (a `host_addr` of
//!   0.0.0.0 means every node address);
//! - `HOSTPORT_FLOWS`: the connections going through a mapping, keyed like a NAT flow
//!   from the pod's side ([`crate::NatKey`]: pod address and port, client address and
//!   port), so the pod's replies get the host address and port back.

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

const _: () = assert!(core::mem::size_of::<PortKey>() == 8);
const _: () = assert!(core::mem::size_of::<PortTarget>() == 8);
const _: () = assert!(core::mem::size_of::<HostPortFlow>() == 8);

#[cfg(feature = "user")]
mod pod_impls {
    // SAFETY (all): #[repr(C)], fixed-width fields, explicit padding, sizes asserted.
    unsafe impl aya::Pod for super::PortKey {}
    unsafe impl aya::Pod for super::PortTarget {}
    unsafe impl aya::Pod for super::HostPortFlow {}
}
