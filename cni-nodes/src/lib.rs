//! Where the cluster's nodes come from: each node's name, InternalIP and pod ranges, as a
//! [`NodeSet`].
//!
//! A node list document ([`parse_nodes`]: the `NodeList` or `kubectl get nodes` output,
//! JSON or YAML) is read as Kubernetes' own `Node` objects, and those by one set of rules
//! ([`Node`]): IPv6 is left out, a node without an IPv4 InternalIP is skipped, and a value
//! that does not parse is skipped with a warning naming the node, never a panic.

mod node;
mod parse;
mod report;
mod translate;

pub use node::{Node, NodeSet};
pub use parse::{MAX_DOCUMENT_BYTES, ParseError, parse_nodes};
