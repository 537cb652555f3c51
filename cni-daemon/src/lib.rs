//! ebpf-cnid, the node daemon: loads the eBPF object once, pins its maps under a bpffs
//! folder, attaches programs, keeps the pods' endpoint records and serves the plugin over
//! a root-only unix socket.
//!
//! Its modules are in three layers, a folder each, each using only those below it:
//! - [`front`], async where it waits on I/O: the daemon's lifecycle, the plugin's
//!   socket, the watchers of the node and the cluster, the CLI's views, metrics and
//!   health, install and uninstall;
//! - [`model`], synchronous: the node's model (pods, source NAT, hostPorts, rate limits,
//!   the node's addresses, the cluster), kept in step per request;
//! - [`datapath`]: the eBPF object loaded, its programs attached, its maps pinned and
//!   handed out;
//! - helpers for every layer: [`clock`], [`files`], `maps`, `ranges`.
//!
//! The protocol it serves is the `cni-api` crate, which the plugin links instead of this
//! one.

pub mod clock;
pub mod datapath;
pub mod files;
pub mod front;
mod maps;
pub mod model;
mod ranges;
