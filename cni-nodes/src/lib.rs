//! Where the cluster's nodes come from: each node's name, InternalIP and pod ranges, as a
//! [`NodeSet`] behind a `tokio::sync::watch::Receiver` that changes when they do.
//!
//! Two sources fill it: a nodes file ([`watch_file`], the `NodeList` or `kubectl get nodes`
//! output, JSON or YAML, polled for changes) and the Kubernetes API ([`connect`] then
//! [`watch_cluster`], a list and watch of every `Node`). Both read Kubernetes' own `Node`
//! object and apply the same rules ([`Node`]): IPv6 is left out, a node without an IPv4
//! InternalIP is skipped, and a value that does not parse is skipped with a warning naming
//! the node, never a panic.

mod cluster;
mod file;
mod node;
mod parse;
mod report;
mod translate;

pub use cluster::{ClusterAccess, ClusterError, connect, watch_cluster};
pub use file::{FileError, POLL_INTERVAL, read_nodes_file, watch_file};
pub use node::{Node, NodeSet};
pub use parse::{MAX_DOCUMENT_BYTES, ParseError, documents, json_type, parse_nodes};
