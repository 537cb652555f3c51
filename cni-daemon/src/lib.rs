//! ebpf-cnid, the node daemon: loads the eBPF object once, pins its maps under a bpffs
//! folder, attaches programs, keeps the pods' endpoint records and serves the plugin over
//! a root-only unix socket.
//!
//! A synchronous core (maps, attachments, records: [`datapath`], [`endpoints`], [`nat`],
//! [`bpffs`], [`inspect`]) sits behind an async front ([`server`], [`run`]). Only [`api`]
//! is built without the `daemon` feature: it is what the plugin links.

pub mod api;
#[cfg(feature = "daemon")]
pub mod big_tcp;
#[cfg(feature = "daemon")]
pub mod bpffs;
#[cfg(feature = "daemon")]
pub mod datapath;
#[cfg(feature = "daemon")]
pub mod endpoints;
#[cfg(feature = "daemon")]
pub mod hostports;
#[cfg(feature = "daemon")]
pub mod inspect;
#[cfg(feature = "daemon")]
pub mod link_stats;
#[cfg(feature = "daemon")]
mod maps;
#[cfg(feature = "daemon")]
pub mod nat;
#[cfg(feature = "daemon")]
pub mod node;
#[cfg(feature = "daemon")]
pub mod node_addrs;
#[cfg(feature = "daemon")]
pub mod run;
#[cfg(feature = "daemon")]
pub mod server;
