//! Where the cluster's nodes come from: each node's name, InternalIP and pod ranges, as a
//! [`NodeSet`] behind a `tokio::sync::watch::Receiver` that changes when they do.
//!
//! Two sources fill it: a nodes file ([`watch_file`], the `NodeList` or `kubectl get nodes`
//! output, JSON or YAML, polled for changes) and the Kubernetes API ([`connect`] then
//! [`watch_cluster`], a list and watch of every `Node`). Both read Kubernetes' own `Node`
//! object and apply the same rules ([`Node`]): IPv6 is left out, a node without an IPv4
//! InternalIP is skipped, and a value that does not parse is skipped with a warning naming
//! the node, never a panic.
//!
//! What other sources of Kubernetes objects share with these (cni-policy's): the polled
//! file ([`Poller`]), the watch of one kind of object ([`watch_events`]), the reader of
//! object documents ([`documents`]) and warnings logged once per object ([`Reporter`]).

mod cluster;
mod file;
mod node;
mod parse;
mod report;
mod translate;

pub use cluster::{ClusterAccess, ClusterError, Watched, connect, watch_cluster, watch_events};
pub use file::{FileError, FileKind, POLL_INTERVAL, Poller, read_nodes_file, watch_file};
pub use node::{Node, NodeSet};
pub use parse::{MAX_DOCUMENT_BYTES, ParseError, documents, json_text, json_type, parse_nodes};
pub use report::Reporter;
