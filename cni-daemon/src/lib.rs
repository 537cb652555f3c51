//! ebpf-cnid, the node daemon: loads the eBPF object once, pins its maps under a bpffs
//! folder, attaches programs, keeps the pods' endpoint records and serves the plugin over
//! a root-only unix socket.
//!
//! Its modules are in layers, each using only those below it:
//! - the front, async where it waits on I/O: [`run`] (signals, lifecycle, the NAT
//!   sweeper), [`server`] (the unix socket; requests are answered on blocking threads),
//!   [`address_watch`] and [`cluster_watch`] (the node's addresses and the cluster's
//!   nodes, followed), [`link_stats`] and [`big_tcp`] (netlink reads for the answers),
//!   [`inspect`] (the CLI's views of the pinned maps), [`metrics`] (health and
//!   Prometheus metrics over HTTP, never taking the node's lock) and [`install`] (the
//!   CNI configuration written for the runtime once the daemon serves);
//! - the node's model, synchronous: [`node`] (what follows keeps in step per request),
//!   [`endpoints`], [`nat`], [`hostports`], [`rate_limits`], [`node_addrs`],
//!   [`cluster`];
//! - the datapath: [`datapath`] (load, attach, the maps handed out), [`bpffs`];
//! - helpers for every layer: [`clock`], [`files`], `maps`, `ranges`.
//!
//! The protocol it serves is the `cni-api` crate, which the plugin links instead of this
//! one.

pub mod address_watch;
pub mod big_tcp;
pub mod bpffs;
pub mod clock;
pub mod cluster;
pub mod cluster_watch;
pub mod datapath;
pub mod endpoints;
pub mod files;
pub mod hostports;
pub mod inspect;
pub mod install;
pub mod link_stats;
mod maps;
pub mod metrics;
pub mod nat;
pub mod node;
pub mod node_addrs;
mod ranges;
pub mod rate_limits;
pub mod run;
pub mod server;
