//! Who may talk to whom: Kubernetes NetworkPolicies checked and translated
//! ([`translate::policy`] into a [`Policy`]), label selectors as Kubernetes evaluates them
//! ([`Selector`]), and the policies in force compiled for a node's pods ([`compile`]):
//! an identity for every address, the class of addresses the policies treat alike, and
//! each local pod's ways through, by identity, protocol and port prefix. The prefixes
//! are those the datapath's longest-prefix-match maps take: the ipBlocks an address is
//! in ([`Blocks`]) and port ranges as aligned blocks ([`ports::prefixes`]).
//!
//! What the policies are compiled from: Pods and Namespaces as policies see them
//! ([`objects`]), read from a file of objects ([`parse::parse_objects`]), as [`Objects`]
//! from one of two sources: the policy file, polled ([`watch_file`]), or the cluster's
//! Namespaces, Pods and NetworkPolicies, watched ([`watch_cluster`]).
//!
//! Family-neutral throughout: addresses are `IpAddr` and `IpNet`, so IPv6 needs no
//! change here.

mod blocks;
pub mod cluster;
pub mod compile;
pub mod file;
pub mod objects;
pub mod parse;
mod policy;
pub mod ports;
mod selector;
pub mod translate;

pub use blocks::{Blocks, PeerId};
pub use cluster::watch_cluster;
pub use cni_nodes::FileError;
pub use compile::{
    Cluster, Compiled, Endpoint, Entry, Identities, Identity, NamedPort, Pod, compile,
};
pub use file::watch_file;
pub use parse::{Objects, Refused};
pub use policy::{Direction, Namespaces, Peer, Policy, PortRule, Ports, Rule};
pub use selector::{Labels, Requirement, Selector, SelectorError};
pub use translate::{PolicyError, Problem};
