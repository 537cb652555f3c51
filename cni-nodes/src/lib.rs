//! Where the cluster's nodes come from: each node's name, InternalIP and pod ranges, as a
//! [`NodeSet`] behind a `tokio::sync::watch::Receiver` that changes when they do.
//!
//! The nodes file ([`watch_file`], the `NodeList` or `kubectl get nodes` output, JSON or
//! YAML, polled for changes) is read as Kubernetes' own `Node` objects, and those by one
//! set of rules ([`Node`]): IPv6 is left out, a node without an IPv4 InternalIP is
//! skipped, and a value that does not parse is skipped with a warning naming the node,
//! never a panic.

mod file;
mod node;
mod parse;
mod report;
mod translate;

pub use file::{FileError, POLL_INTERVAL, read_nodes_file, watch_file};
pub use node::{Node, NodeSet};
pub use parse::{MAX_DOCUMENT_BYTES, ParseError, parse_nodes};
