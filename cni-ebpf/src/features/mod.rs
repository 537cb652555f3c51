//! What the datapath does, one module per feature, each with its logic over the
//! primitives (the maps it reads and writes are declared in `primitives::maps`):
//! - [`arp`]: answering the pods' ARP requests;
//! - [`route`]: a pod's packet for outside the node, straight to its uplink;
//! - [`overlay`]: a pod's packet for another node's pod, through the tunnel device, and
//!   what comes out of it, checked and delivered;
//! - [`snat`] and [`rev_nat`]: source NAT on the uplink's egress, and its replies (and
//!   ICMP errors) back to the pods on its ingress;
//! - [`services`]: Service traffic handed to the node's stack, where kube-proxy's DNAT
//!   is;
//! - [`underlay`]: whether a frame from another node can be tied to it;
//! - [`pod_tunnel`]: no tunnel packets from a pod to a node;
//! - [`rate`]: a pod's egress rate limit, held on the host side;
//! - [`hostport`]: connections to host ports, to the pods behind them;
//! - [`conntrack`]: the flows' entries, refreshed and aged as their packets pass;
//! - [`fragments`]: the fragments after a datagram's first one, following it;
//! - [`sweep`]: the removals the daemon's NAT sweep decided;
//! - [`service_tables`]: the Service tables' entries, within each party's budget;
//! - [`pod_source`]: what a pod may send as (its MAC, its addresses, no VLAN tags);
//! - [`budget`]: each pod's share of the flow tables, and the flows it was refused.
//!
//! A feature uses only features listed after it, never one before: no two import each
//! other.

pub mod arp;
pub mod budget;
pub mod conntrack;
pub mod fragments;
pub mod hostport;
pub mod overlay;
pub mod pod_source;
pub mod pod_tunnel;
pub mod rate;
pub mod rev_nat;
pub mod route;
pub mod service_tables;
pub mod services;
pub mod snat;
pub mod sweep;
pub mod underlay;
