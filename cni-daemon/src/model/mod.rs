//! The node's model, synchronous: [`node`] keeps the rest in step per request:
//! [`endpoints`] (the pods' records, of the type [`record`] defines), [`nat`] (source NAT's user-space side),
//! [`hostports`], [`rate_limits`], [`node_addrs`] (the node's addresses for hostPorts),
//! [`policy`] (NetworkPolicy compiled for the node's pods)
//! and [`cluster`] (this node in its cluster). It uses the datapath below it, never the
//! front above.

pub mod cluster;
pub mod endpoints;
pub mod hostports;
pub mod nat;
pub mod node;
pub mod node_addrs;
pub mod policy;
pub mod rate_limits;
pub mod record;
