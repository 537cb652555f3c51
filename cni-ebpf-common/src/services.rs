//! Kubernetes Services implemented by the node's netfilter (kube-proxy in iptables or
//! nftables mode): the datapath hands pods' Service traffic, and the replies of those
//! connections, to the node's stack, where the Service's DNAT and its undoing happen.
//!
//! - `SERVICE_CIDRS`: LPM trie ([`crate::CidrKey`] -> `u8`) of the Service ranges;
//! - `SERVICE_RANGES`: array of one `u32`, how many ranges there are (0: none, and the
//!   datapath spends nothing on Services);
//! - `SERVICE_CLIENTS`: LRU hash [`ServiceClient`] -> `u8`, the pod sockets that opened a
//!   connection to a Service;
//! - `SERVICE_FLOWS`: LRU hash [`crate::NatKey`] -> `u8`, the connections of those sockets
//!   as the stack translated them (the pod's socket, the backend's; 1), seen leaving the
//!   node after the stack forwarded them: their replies, from whichever way they arrive,
//!   go back through the stack; and the TCP connections those sockets open directly to
//!   a pod of the node (2), whose replies keep the datapath's way;
//! - `SERVICE_PEERS`: LRU hash [`ServiceClient`] -> `u8`, the sockets of clients outside
//!   the node whose connections arrived on an uplink for a Service (a NodePort, a
//!   LoadBalancer or external IP) and went to the stack, which DNATs them to a pod.

/// A socket (address, port, protocol): a pod's that opened a connection to a Service, or
/// an outside client's of a Service.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServiceClient {
    pub addr: [u8; 4],
    /// Host byte order.
    pub port: u16,
    pub proto: u8,
    pub pad: u8,
}

/// Service ranges at most.
pub const MAX_SERVICE_CIDRS: u32 = 64;

/// Translated Service connections `SERVICE_FLOWS` holds at once: kube-proxy's smallest
/// conntrack table (`--conntrack-min`), so the table holds every connection the node's
/// conntrack does under kube-proxy's defaults.
pub const MAX_SERVICE_FLOWS: u32 = 131_072;

const _: () = assert!(core::mem::size_of::<ServiceClient>() == 8);

#[cfg(feature = "user")]
mod user {
    // SAFETY: #[repr(C)], fixed-width fields, explicit padding, size asserted.
    unsafe impl aya::Pod for super::ServiceClient {}
}
