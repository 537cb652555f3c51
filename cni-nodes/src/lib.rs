//! Where the cluster's nodes come from: each node's name, InternalIP and pod ranges, as a
//! [`NodeSet`].
//!
//! Kubernetes' own `Node` object is read by one set of rules ([`Node`]): IPv6 is left out,
//! a node without an IPv4 InternalIP is skipped, and a value that does not parse is
//! skipped with a warning naming the node, never a panic.

mod node;
mod translate;

pub use node::{Node, NodeSet};
