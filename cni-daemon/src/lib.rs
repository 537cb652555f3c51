//! ebpf-cnid, the node daemon: loads the eBPF object once, pins its maps under a bpffs
//! folder, attaches programs, keeps the pods' endpoint records and serves the plugin over
//! a root-only unix socket.
//!
//! A synchronous core (maps, attachments, records: [`datapath`], [`endpoints`], [`nat`],
//! [`bpffs`], [`inspect`]) sits behind an async front ([`server`], [`run`], [`address_watch`]). The protocol
//! it serves is the `cni-api` crate, which the plugin links instead of this one.

pub mod address_watch;
pub mod big_tcp;
pub mod bpffs;
pub mod clock;
pub mod datapath;
pub mod endpoints;
pub mod files;
pub mod hostports;
pub mod inspect;
pub mod link_stats;
mod maps;
pub mod nat;
pub mod node;
pub mod node_addrs;
mod ranges;
pub mod run;
pub mod server;
